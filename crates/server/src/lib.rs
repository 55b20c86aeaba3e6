//! `kev serve`: the SystemOne HTTP API (`POST /v1/systemone`) in front of a Kev model.
//!
//! The server talks to the model through [`Decider`], which [`kev_decide::Kev`] implements ([`served`]); the
//! scheduling records it speaks in ([`Need`], [`Step`], [`Stats`]) are kev-decide's own, so the executor's
//! words reach the scheduler unchanged. Tests put stand-ins behind the same trait.
//!
//! Every decision route answers through one admission pipeline (`pipeline.rs`): a queue slot, the body
//! (with a timeout), its decoding, an admission permit, `Decider::admit_parts` on a blocking worker, the
//! request's parts submitted together to the bounded queue ([`queue`]: a full queue answers 429 at once, a
//! request that waits past its deadline gets 529, one whose client left or whose time ran out is stopped
//! before its next pass), and the answer. A route only says what its body asks the model (its parts) and how
//! their answers make its response (`pipeline::Route`).
//!
//! Layers come from tower-http (request ids, CORS, timeouts, zstd/gzip request decompression, body
//! limits, bearer auth); error bodies follow kev-contract §8.5 and are built in one place
//! ([`error::ApiError`]), their statuses taken from the contract's status table
//! ([`kev_contract::ErrorKind`]). [`openapi`] derives the API document from the wire types and the routes'
//! own declarations.
#![deny(missing_docs)]

mod batch;
mod conn;
pub mod error;
pub mod head;
mod http;
pub mod keys;
mod metrics_setup;
pub mod openapi;
mod pipeline;
pub mod pyrandom;
pub mod queue;
pub mod sched;
pub mod schemas;
pub mod served;
mod state_ref;
mod states;
mod tools;
mod wire;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::Value;

pub use error::ApiError;
pub use http::router;
pub use kev_decide::{Need, Stats, Step};
pub use pipeline::decode_request_body;
pub use queue::LongLane;
pub use state_ref::STATE_ID_FIELD;
pub use wire::REQUEST_ID;

/// A job the decider accepted, with the token count the queue budgets passes by.
pub struct Admission<J> {
    /// The compiled request.
    pub job: J,
    /// Tokens it will run (`usage.input_tokens` is a fine measure).
    pub tokens: usize,
}

/// What the server needs from a model.
///
/// The engine thread calls [`Decider::pass`] over and over, each time with the requests the scheduler
/// ([`sched`]) chose and the tokens each may run, so a long request advances piece by piece between other
/// requests' passes, and a request whose client left or whose time ran out is dropped between pieces.
pub trait Decider: Send + Sync + 'static {
    /// A validated, compiled request, and its progress once it runs.
    type Job: Send + 'static;

    /// Validate and compile a request body. Errors are the client's (validation, limits, work caps) or, rarely,
    /// ours (a tokenizer fault); [`ApiError::from_wire`] answers any layer's typed error.
    fn admit(&self, body: &[u8]) -> Result<Admission<Self::Job>, ApiError>;

    /// Validate and compile the parts of one request (a fan-out route's: `/permute`, `/separate`), all or
    /// nothing, the per-request work caps held for the parts together. The default admits each part as a
    /// request of its own (a stand-in with no caps).
    fn admit_parts(&self, bodies: &[Vec<u8>]) -> Result<Vec<Admission<Self::Job>>, ApiError> {
        bodies.iter().map(|b| self.admit(b)).collect()
    }

    /// Admit the independent requests of one batch (`/v1/systemone/batch`): each on its own (a refused one is
    /// its own `Err`, answered in its place), the outer `Err` for a batch over its own caps (nothing runs).
    /// The default admits each as a request of its own (a stand-in with no batch caps).
    #[allow(clippy::type_complexity)]
    fn admit_batch(
        &self,
        bodies: &[Vec<u8>],
    ) -> Result<Vec<Result<Admission<Self::Job>, ApiError>>, ApiError> {
        Ok(bodies.iter().map(|b| self.admit(b)).collect())
    }

    /// Admit a state to pin under `id` for `owner` (`POST /v1/systemone/states`; body `{model?, state}`),
    /// kept for `ttl` once its prefix has run. The default: pinning is not offered (404).
    fn admit_pin(
        &self,
        _body: &[u8],
        _id: &str,
        _owner: Option<&str>,
        _ttl: std::time::Duration,
    ) -> Result<Admission<Self::Job>, ApiError> {
        Err(ApiError::not_found())
    }

    /// Pin `id` as `owner` sees it: `{id, tokens, bytes, expires_at, ready}`; `None` if there is none (or it is
    /// another owner's).
    fn pin_info(&self, _id: &str, _owner: Option<&str>) -> Option<Value> {
        None
    }

    /// Why pin `id` was dropped when its prefix ran (the budget), if it was; asked once.
    fn pin_refusal(&self, _id: &str) -> Option<ApiError> {
        None
    }

    /// The state of pin `id` for `owner`, to put in a request that names it (`x_state_id`).
    fn pinned_state(&self, _id: &str, _owner: Option<&str>) -> Option<Value> {
        None
    }

    /// Unpin `id` (its owner only); whether it was there.
    fn unpin(&self, _id: &str, _owner: Option<&str>) -> bool {
        false
    }

    /// One `(name, card)` per adapter served over the backbone, the default first (`/v1/models` lists each
    /// under its own name). The default: none beyond [`Decider::model_card`].
    fn adapter_cards(&self) -> Vec<(String, Value)> {
        Vec::new()
    }

    /// What the job has left.
    fn need(&self, job: &Self::Job) -> Need;

    /// One engine pass in `lane`: advance each job by at most its grant of tokens, and by at least one
    /// unit. One [`Step`] per grant, in order; a failure is logged by the server with its cause. A
    /// background pass (the long lane's) steps aside at the engine's safe points while a foreground pass
    /// runs.
    fn pass(&self, grants: &mut [(&mut Self::Job, usize)], lane: kev_decide::Lane) -> Vec<Step>;

    /// Anything to do before the warm-up request, on a blocking worker (default: nothing).
    fn warm_up(&self) -> Result<(), String> {
        Ok(())
    }

    /// A request body the server answers through its own pipeline (admission, queue, engine passes) before
    /// `/ready` turns 200, so that readiness proves the path requests take; `None`: no warm-up decision.
    fn warm_up_request(&self) -> Option<Vec<u8>> {
        None
    }

    /// The model card fields (everything but `name`): `description`, `release_date`, `x_…` extras.
    fn model_card(&self) -> Value;

    /// `usage.output_tokens` of an answers object (`/v1/systemone/separate` counts its merged answers);
    /// `None`: the parts' counts are summed instead.
    fn output_tokens(&self, _answers: &Value) -> Option<usize> {
        None
    }

    /// Engine counters for `/metrics`.
    fn stats(&self) -> Stats {
        Stats::default()
    }
}

/// Server settings (flags and environment twins are defined by the CLI).
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Address to listen on.
    pub addr: SocketAddr,
    /// The unnamed bearer key for `/v1/*` (`KEV_API_KEY`); with neither it nor `api_keys` the API is open.
    pub api_key: Option<String>,
    /// Named keys with their own limits (`--api-keys FILE`, [`keys::Keys`]), beside the unnamed one.
    pub api_keys: Option<Arc<keys::Keys>>,
    /// Jobs allowed to wait for the engine.
    pub queue_depth: usize,
    /// Longest a job may wait in the queue before it is answered 529.
    pub queue_deadline: Duration,
    /// Token budget of one engine pass across requests.
    pub pass_tokens: usize,
    /// Passes a request may be skipped in a row before it goes first (aging; see [`sched`]).
    pub starve_passes: u32,
    /// Requests longer than one pass that may be in flight at once (each holds a state's cache).
    pub long_in_flight: usize,
    /// Longest piece of long work when no short work was seen lately (see [`sched`]).
    pub solo_piece: Duration,
    /// Long work runs on a lane of its own at a low priority, beside the short passes (a short request
    /// never waits for a long piece, however deep in its state; [`LongLane::On`], the default, or
    /// [`LongLane::Low`] on a shared host); [`LongLane::Off`] makes them take turns on the one engine
    /// thread.
    pub long_lane: LongLane,
    /// Requests parsed and tokenized at once (admission permits; about the number of cores).
    pub admit_permits: usize,
    /// Open connections at most; further connections wait in the listen backlog.
    pub max_connections: usize,
    /// Longest a client may take to send a request's headers (slow clients are closed); also the idle
    /// timeout: a connection, HTTP/1.1 or HTTP/2, with no request open for this long is closed.
    pub header_read_timeout: Duration,
    /// Longest a decision request's body may take to arrive once its headers did (408); never less than
    /// `header_read_timeout`.
    pub body_read_timeout: Duration,
    /// Largest accepted request body, after decompression.
    pub max_body: usize,
    /// Longest a whole request may take.
    pub request_timeout: Duration,
    /// Model names listed by `/v1/models` (the first is the default, `kev-latest`).
    pub model_names: Vec<String>,
    /// Longest the drain after SIGTERM may take: connections still open then (a client that never finishes
    /// its body, a long request) are closed and the process exits, before the usual 30 s grace of a process
    /// manager runs out.
    pub drain_timeout: Duration,
    /// A bearer key `/metrics` asks for (`None`: open, as `/health` is).
    pub metrics_key: Option<String>,
    /// The slowest a decision request's body may arrive once `body_grace` has passed, in bytes per second
    /// on average (0: no floor, only `body_read_timeout`): a client dribbling its body holds its queue slot
    /// about `body_grace`, not the whole body timeout.
    pub min_body_rate: usize,
    /// How long a body may take before the rate floor applies.
    pub body_grace: Duration,
    /// Put before every pinned-state id this server makes (empty for `kev serve`). A fleet front end names
    /// the replica here, so that an id says which replica holds its pin (`kev.serve` routes by it); a
    /// replica that does not hold the id answers the usual 404.
    pub pin_id_prefix: String,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            addr: SocketAddr::from(([127, 0, 0, 1], 8009)),
            api_key: None,
            api_keys: None,
            queue_depth: 64,
            queue_deadline: Duration::from_secs(60),
            pass_tokens: 8192,
            starve_passes: 4,
            long_in_flight: 2,
            solo_piece: Duration::from_secs(2),
            long_lane: LongLane::On,
            admit_permits: std::thread::available_parallelism().map_or(2, |n| n.get()),
            max_connections: 1024,
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(30),
            max_body: 8 << 20,
            request_timeout: Duration::from_secs(300),
            model_names: vec!["kev-latest".into(), "jev-latest".into()],
            drain_timeout: Duration::from_secs(25),
            metrics_key: None,
            min_body_rate: 16 << 10,
            body_grace: Duration::from_secs(1),
            pin_id_prefix: String::new(),
        }
    }
}

/// Request bodies read at once for a queue of `queue_depth`: twice the depth, so a full queue's worth of
/// bodies can arrive while as many requests wait, and slow senders cannot hold more.
pub(crate) fn body_permits(queue_depth: usize) -> usize {
    2 * queue_depth.max(1)
}

/// Shared state of a running server.
pub struct App<D: Decider> {
    decider: Arc<D>,
    keys: Option<Arc<keys::Keys>>,
    queue: queue::Queue<D::Job>,
    permits: tokio::sync::Semaphore,
    /// Bodies being read at once: [`body_permits`] (see `pipeline::before_the_body`).
    bodies: tokio::sync::Semaphore,
    config: ServerConfig,
    ready: AtomicBool,
    draining: AtomicBool,
    metrics: metrics_exporter_prometheus::PrometheusHandle,
    /// The API document `GET /openapi.json` serves ([`openapi::json`]), given to the router here: the
    /// document lists every route, its own included.
    document: fn() -> &'static str,
}

impl<D: Decider> App<D> {
    /// Start the engine thread; the app is not ready until [`App::warm_up`] succeeds.
    pub fn new(config: ServerConfig, decider: Arc<D>) -> Arc<Self> {
        let queue = queue::Queue::start(
            Arc::clone(&decider),
            queue::QueueConfig {
                depth: config.queue_depth.max(1),
                deadline: config.queue_deadline,
                policy: sched::Policy {
                    pass_tokens: config.pass_tokens.max(1),
                    starve_passes: config.starve_passes.max(1),
                    long_in_flight: config.long_in_flight.max(1),
                    // A solo piece never outlasts half the queue deadline: short requests that arrive
                    // during one still start before theirs.
                    solo_piece: config.solo_piece.min(config.queue_deadline / 2),
                },
                long_lane: config.long_lane,
            },
        );
        let permits = tokio::sync::Semaphore::new(config.admit_permits.max(1));
        let bodies = tokio::sync::Semaphore::new(body_permits(config.queue_depth));
        let unnamed = config.api_key.clone().filter(|k| !k.is_empty());
        let keys = match (config.api_keys.clone(), unnamed) {
            (Some(keys), None) => Some(keys),
            (Some(keys), Some(secret)) => {
                keys.add_unnamed(&secret);
                Some(keys)
            }
            (None, Some(secret)) => Some(Arc::new(keys::Keys::single(&secret))),
            (None, None) => None,
        };
        Arc::new(App {
            decider,
            keys,
            queue,
            permits,
            bodies,
            config,
            ready: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            metrics: metrics_setup::handle(),
            document: openapi::json,
        })
    }

    /// Run the decider's warm-up, then its warm-up request through the served path (admission, the queue,
    /// engine passes: `pipeline::answer_body`), and mark the server ready if both succeed.
    pub async fn warm_up(self: &Arc<Self>) -> Result<(), String> {
        let decider = Arc::clone(&self.decider);
        tokio::task::spawn_blocking(move || decider.warm_up())
            .await
            .map_err(|e| format!("warm-up: {e}"))??;
        if let Some(body) = self.decider.warm_up_request() {
            pipeline::answer_body(self, body, "warm-up")
                .await
                .map_err(|e| e.error_body().to_value().to_string())?;
        }
        self.ready.store(true, Ordering::SeqCst);
        tracing::info!("warm-up decision succeeded; ready");
        Ok(())
    }

    /// Whether `/ready` answers 200.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst) && !self.draining.load(Ordering::SeqCst)
    }

    /// Stop taking new work (503), let accepted work finish.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    /// Finish accepted jobs and stop the engine thread.
    pub fn stop(&self) {
        self.start_draining();
        self.queue.shutdown();
    }
}

/// Errors that stop the server.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// Binding or serving failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The warm-up decision failed: the model cannot answer.
    #[error("warm-up decision failed: {0}")]
    WarmUp(String),
}

/// Serve until SIGINT/SIGTERM, then drain: refuse new work with 503, finish what was accepted, return.
/// If the warm-up decision fails the server stops too, with [`ServerError::WarmUp`]. On SIGHUP the keys file
/// (`ServerConfig::api_keys`) is read again ([`keys::Keys::reload`]) without dropping a request.
pub async fn serve<D: Decider>(config: ServerConfig, decider: Arc<D>) -> Result<(), ServerError> {
    let listener = tokio::net::TcpListener::bind(config.addr).await?;
    #[cfg(unix)]
    if let Some(keys) = config.api_keys.clone() {
        tokio::spawn(reload_keys_on_sighup(keys));
    }
    serve_on(listener, config, decider, shutdown_signal()).await
}

/// [`serve`] on a bound listener, stopping when `stop` resolves (tests and embedders).
pub async fn serve_on<D: Decider>(
    listener: tokio::net::TcpListener,
    config: ServerConfig,
    decider: Arc<D>,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    tracing::info!(addr = %listener.local_addr()?, "listening");
    let app = App::new(config, decider);
    let (failed_tx, mut failed_rx) = tokio::sync::watch::channel(None::<String>);
    let warm = Arc::clone(&app);
    tokio::spawn(async move {
        if let Err(e) = warm.warm_up().await {
            tracing::error!(error = %e, "warm-up decision failed; stopping");
            let _ = failed_tx.send(Some(e));
        }
    });
    let mut failed_watch = failed_rx.clone();
    let stop = async move {
        tokio::select! {
            _ = stop => tracing::info!("shutting down: draining accepted requests"),
            // The sender is dropped after a successful warm-up: that is no reason to stop.
            Ok(_) = failed_watch.wait_for(Option::is_some) => {},
        }
    };
    accept_loop(listener, Arc::clone(&app), stop).await;
    let stop_app = Arc::clone(&app);
    let _ = tokio::task::spawn_blocking(move || stop_app.stop()).await;
    if let Some(e) = failed_rx.borrow_and_update().clone() {
        return Err(ServerError::WarmUp(e));
    }
    Ok(())
}

/// Accept connections until `stop`, each served by hyper with the configured header-read timeout, and
/// closed once it has held no request that long (HTTP/1.1 and HTTP/2 alike, see [`conn`]), at most
/// `max_connections` at once (further ones wait in the listen backlog); then drain: refuse new work with
/// 503, finish open requests.
async fn accept_loop<D: Decider>(
    listener: tokio::net::TcpListener,
    app: Arc<App<D>>,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) {
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    use hyper_util::service::TowerToHyperService;

    let router = router(Arc::clone(&app));
    // HTTP/1.1, and HTTP/2 over cleartext with prior knowledge (a client that opens with the HTTP/2 preface,
    // as proxies and gRPC-style clients do): the same routes, guards and answers either way.
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
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
    // Each connection holds a permit while it is open, so all of them back means every connection closed.
    let max_connections = app.config.max_connections.max(1);
    let connections = Arc::new(tokio::sync::Semaphore::new(max_connections));
    let (draining_tx, draining_rx) = tokio::sync::watch::channel(false);
    tokio::pin!(stop);
    loop {
        let permit = tokio::select! {
            p = Arc::clone(&connections).acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
            _ = &mut stop => break,
        };
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut stop => break,
        };
        let _ = stream.set_nodelay(true);
        let activity = Arc::new(conn::Activity::default());
        let service = TowerToHyperService::new(conn::Tracked {
            inner: router.clone(),
            activity: Arc::clone(&activity),
        });
        let (builder, draining) = (builder.clone(), draining_rx.clone());
        let idle = app.config.header_read_timeout;
        tokio::spawn(async move {
            // Telling HTTP/1 from HTTP/2 waits for the first bytes, before hyper's header clock starts: a
            // connection that sends nothing is closed after the header-read timeout here instead.
            let mut one = [0u8; 1];
            if !matches!(
                tokio::time::timeout(idle, stream.peek(&mut one)).await,
                Ok(Ok(1..))
            ) {
                drop(permit);
                return;
            }
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            conn::serve(conn, &activity, idle, draining, |c| c.graceful_shutdown()).await;
            drop(permit);
        });
    }
    app.start_draining();
    let _ = draining_tx.send(true);
    // While open connections drain, new ones are still accepted and answered (503 `unavailable_error` from
    // every decision route, no keep-alive) rather than refused at TCP; past the drain deadline whatever is
    // still open is closed.
    let mut draining_builder = builder.clone();
    draining_builder.http1().keep_alive(false);
    let deadline = tokio::time::sleep(app.config.drain_timeout);
    let drained = connections.acquire_many(max_connections as u32);
    tokio::pin!(deadline, drained);
    loop {
        tokio::select! {
            _ = &mut drained => {
                tracing::info!("drained: every accepted request was answered");
                break;
            }
            _ = &mut deadline => {
                tracing::warn!(
                    drain_timeout_s = app.config.drain_timeout.as_secs_f64(),
                    "drain deadline passed: closing the connections still open"
                );
                break;
            }
            r = listener.accept() => {
                if let Ok((stream, _)) = r {
                    let service = TowerToHyperService::new(router.clone());
                    let builder = draining_builder.clone();
                    tokio::spawn(async move {
                        let conn = builder.serve_connection(TokioIo::new(stream), service);
                        let _ = tokio::time::timeout(Duration::from_secs(5), conn).await;
                    });
                }
            }
        }
    }
    drop(listener);
}

#[cfg(unix)]
async fn reload_keys_on_sighup(keys: Arc<keys::Keys>) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut hup) = signal(SignalKind::hangup()) else {
        tracing::warn!("cannot listen for SIGHUP: the keys file is read once");
        return;
    };
    while hup.recv().await.is_some() {
        match keys.reload() {
            Ok(n) => {
                tracing::info!(keys = n, names = ?keys.names(), "SIGHUP: keys file read again")
            }
            Err(e) => {
                tracing::error!(error = %e, "SIGHUP: the keys file does not read; the keys in force stay")
            }
        }
    }
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
