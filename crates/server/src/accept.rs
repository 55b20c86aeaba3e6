//! Accepting connections, and the drain at the end: at most `max_connections` open at once (further ones wait
//! in the listen backlog), at most `connections_per_ip` of them from one peer address (one more is answered
//! 429 and closed, so one address cannot take every slot), each served by hyper over a watched socket
//! ([`conn`]: closed when idle, or when what it sends does not move).
//!
//! The drain: on the stop signal every decision route answers new work 503 and open connections are shut
//! down gracefully; new connections are still accepted and answered 503 without keep-alive. At the drain
//! deadline the queue is aborted (every request still waiting or running is answered 503 at once, its work
//! stopped before its next pass), and [`DRAIN_GRACE`] later whatever is still open is closed: the server
//! returns within the deadline plus that grace, whatever is in flight.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;

use crate::error::ApiError;
use crate::{App, DRAIN_GRACE, Decider, conn, head, router};

/// Connections refused for their address that are being answered at once, at most; past this a refused
/// connection is closed without an answer.
const REFUSALS: usize = 64;

/// How long a refused connection (its address over its share, or the server draining) is served its answer.
const REFUSAL_TIME: Duration = Duration::from_secs(2);

/// Open connections by peer address.
#[derive(Default)]
struct Peers(Mutex<HashMap<IpAddr, usize>>);

/// One open connection counted under its address; uncounted when dropped.
struct PeerSlot {
    peers: Arc<Peers>,
    ip: IpAddr,
}

impl Peers {
    fn take(self: &Arc<Self>, ip: IpAddr, limit: usize) -> Option<PeerSlot> {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let n = map.entry(ip).or_default();
        if *n >= limit {
            return None;
        }
        *n += 1;
        Some(PeerSlot {
            peers: Arc::clone(self),
            ip,
        })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut map = self.peers.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = map.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.ip);
            }
        }
    }
}

/// The protocol settings every connection is served with.
fn builder<D: Decider>(app: &App<D>) -> Builder<TokioExecutor> {
    // HTTP/1.1, and HTTP/2 over cleartext with prior knowledge (a client that opens with the HTTP/2 preface,
    // as proxies and gRPC-style clients do): the same routes, guards and answers either way.
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(app.config.header_read_timeout)
        // Above our own limit (`head::check`), which answers with a JSON body where hyper's answer has none.
        .max_headers(head::HYPER_MAX_HEADERS)
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        // A stream each for at most this many requests at once per connection (the queue bounds the rest).
        .max_concurrent_streams(64)
        .keep_alive_interval(Some(app.config.header_read_timeout))
        .keep_alive_timeout(app.config.header_read_timeout);
    builder
}

/// Serve a connection that is refused as a whole (`error` to every request on it, no keep-alive) for at most
/// [`REFUSAL_TIME`], holding one of the [`REFUSALS`] permits meanwhile.
fn refuse(
    stream: tokio::net::TcpStream,
    builder: &Builder<TokioExecutor>,
    error: ApiError,
    permit: tokio::sync::OwnedSemaphorePermit,
) {
    let mut builder = builder.clone();
    builder.http1().keep_alive(false);
    let service = TowerToHyperService::new(tower::service_fn(move |_req| {
        let error = error.clone();
        async move {
            Ok::<_, std::convert::Infallible>(axum::response::IntoResponse::into_response(error))
        }
    }));
    tokio::spawn(async move {
        let conn = builder.serve_connection(TokioIo::new(stream), service);
        let _ = tokio::time::timeout(REFUSAL_TIME, conn).await;
        drop(permit);
    });
}

/// Accept connections until `stop`, then drain (see the module docs).
pub(crate) async fn accept_loop<D: Decider>(
    listener: tokio::net::TcpListener,
    app: Arc<App<D>>,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let router = router(Arc::clone(&app));
    let builder = builder(&app);
    // Each connection holds a permit while it is open, so all of them back means every connection closed.
    let max_connections = app.config.max_connections.max(1);
    let per_ip = app.config.connections_per_ip();
    let connections = Arc::new(tokio::sync::Semaphore::new(max_connections));
    let refusals = Arc::new(tokio::sync::Semaphore::new(REFUSALS));
    let peers = Arc::new(Peers::default());
    let (draining_tx, draining_rx) = tokio::sync::watch::channel(false);
    let (kill_tx, kill_rx) = tokio::sync::watch::channel(false);
    tokio::pin!(stop);
    loop {
        let permit = tokio::select! {
            p = Arc::clone(&connections).acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
            _ = &mut stop => break,
        };
        let (stream, addr) = tokio::select! {
            r = listener.accept() => match r {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut stop => break,
        };
        let ip = addr.ip().to_canonical();
        let Some(slot) = peers.take(ip, per_ip) else {
            drop(permit);
            metrics::counter!("kev_connections_refused_total", "reason" => "per_ip").increment(1);
            if let Ok(r) = Arc::clone(&refusals).try_acquire_owned() {
                refuse(
                    stream,
                    &builder,
                    ApiError::connections_per_peer(per_ip, 1),
                    r,
                );
            }
            continue;
        };
        let _ = stream.set_nodelay(true);
        let activity = Arc::new(conn::Activity::default());
        let service = TowerToHyperService::new(conn::Tracked {
            inner: router.clone(),
            activity: Arc::clone(&activity),
            peer: Some(ip),
        });
        let (builder, draining, kill) = (builder.clone(), draining_rx.clone(), kill_rx.clone());
        let idle = app.config.header_read_timeout;
        tokio::spawn(async move {
            // Telling HTTP/1 from HTTP/2 waits for the first bytes, before hyper's header clock starts: a
            // connection that sends nothing is closed after the header-read timeout here instead.
            let mut one = [0u8; 1];
            if matches!(
                tokio::time::timeout(idle, stream.peek(&mut one)).await,
                Ok(Ok(1..))
            ) {
                #[cfg(unix)]
                let fd = std::os::fd::AsRawFd::as_raw_fd(&stream);
                let io = conn::Watched::new(stream, Arc::clone(&activity));
                let conn = builder.serve_connection(TokioIo::new(io), service);
                tokio::pin!(conn);
                let ended = conn::serve(conn, &activity, idle, draining, kill, |c| {
                    c.graceful_shutdown()
                })
                .await;
                // Still open here (`conn` owns the stream until this block ends). A connection the server
                // gave up on (idle, stuck, lingering, killed) with answers still unread gets a reset, not a
                // FIN stuck behind them. One the client or the protocol closed keeps the plain close: its
                // last answer may simply not be acknowledged yet (a reset would destroy it in flight — a
                // 401 with `Connection: close` arrived as a broken pipe).
                #[cfg(unix)]
                if ended != conn::Ended::Closed && conn::reset_if_unread(fd) {
                    metrics::counter!("kev_connections_reset_unread_total").increment(1);
                }
                // An idle close that finished is the ordinary end of a quiet connection: not counted.
                if !matches!(ended, conn::Ended::Closed | conn::Ended::Idled) {
                    tracing::debug!(peer = %ip, ?ended, "connection closed by the server");
                    metrics::counter!("kev_connections_closed_total", "reason" => format!("{ended:?}").to_lowercase())
                        .increment(1);
                }
            }
            drop((slot, permit));
        });
    }
    drain(
        listener,
        &app,
        &builder,
        router,
        &connections,
        (draining_tx, kill_tx),
    )
    .await;
}

/// The drain (see the module docs): returns once every connection closed, or [`DRAIN_GRACE`] past the
/// deadline.
async fn drain<D: Decider>(
    listener: tokio::net::TcpListener,
    app: &Arc<App<D>>,
    builder: &Builder<TokioExecutor>,
    router: axum::Router,
    connections: &Arc<tokio::sync::Semaphore>,
    (draining, kill): (
        tokio::sync::watch::Sender<bool>,
        tokio::sync::watch::Sender<bool>,
    ),
) {
    app.start_draining();
    let _ = draining.send(true);
    // While open connections drain, new ones are still accepted and answered (503 `unavailable_error` from
    // every decision route, no keep-alive) rather than refused at TCP.
    let mut draining_builder = builder.clone();
    draining_builder.http1().keep_alive(false);
    let max_connections = app.config.max_connections.max(1);
    let mut deadline = Box::pin(tokio::time::sleep(app.config.drain_timeout));
    let mut past_deadline = false;
    let drained = connections.acquire_many(max_connections as u32);
    tokio::pin!(drained);
    loop {
        tokio::select! {
            _ = &mut drained => {
                tracing::info!("drained: every open connection closed");
                break;
            }
            _ = &mut deadline => {
                if past_deadline {
                    tracing::warn!("closing the connections still open");
                    break;
                }
                tracing::warn!(
                    drain_timeout_s = app.config.drain_timeout.as_secs_f64(),
                    "drain deadline passed: answering the requests still in flight 503"
                );
                app.queue.abort();
                past_deadline = true;
                deadline = Box::pin(tokio::time::sleep(DRAIN_GRACE));
            }
            r = listener.accept() => {
                if let Ok((stream, _)) = r {
                    let service = TowerToHyperService::new(router.clone());
                    let builder = draining_builder.clone();
                    tokio::spawn(async move {
                        let conn = builder.serve_connection(TokioIo::new(stream), service);
                        let _ = tokio::time::timeout(REFUSAL_TIME, conn).await;
                    });
                }
            }
        }
    }
    let _ = kill.send(true);
    drop(listener);
}
