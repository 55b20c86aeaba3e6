//! One accepted connection's life: served by hyper until the client closes it, the server drains, it has
//! held no request for the idle timeout, or what it has to send has not moved for that long.
//!
//! Why the idle clock is ours: hyper closes an idle HTTP/1.1 keep-alive connection through its
//! header-read timer, but an HTTP/2 connection that answers pings stays open for ever, holding one of the
//! `max_connections` slots, so enough idle HTTP/2 clients would keep everyone else in the listen backlog.
//! Here a connection counts the requests it has open (from the moment one is routed until its response
//! body is finished or dropped); once none has been open for the timeout it is shut down gracefully
//! (HTTP/2: GOAWAY, streams in flight finish; HTTP/1.1: closed between requests), for either protocol — and
//! if that graceful close has not finished after another timeout (a response the client never reads keeps
//! it open), the connection is closed.
//!
//! Why sends are watched ([`Sends`]): a request stays open until its response is sent, so a client that
//! never reads its answers (an HTTP/2 stream window of 0, HTTP/1.1 requests pipelined and never read) would
//! hold its connection for ever, the idle clock never starting. A connection whose sending makes no
//! progress for the timeout is closed: a response body waiting for the protocol to take its next piece
//! (the stream's or the connection's flow-control window counts as no progress: HTTP/2 pings still flow,
//! but a body does not), or the socket refusing every write. Response bodies go out in pieces of at most
//! [`PIECE`] bytes, so a large answer to a slow but reading client keeps moving piece by piece.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use http_body::Frame;
use hyper::{Request, Response};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The largest piece of a response body handed to the protocol at once: an HTTP/2 frame's default size, so
/// a stream whose flow-control window stays shut stops its body between pieces, where [`Sends`] sees it.
pub(crate) const PIECE: usize = 16 << 10;

/// The peer address of a request's connection (a request extension; per-address limits read it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Peer(pub IpAddr);

/// The requests a connection has open, and a wake-up whenever that number changes.
#[derive(Default)]
pub(crate) struct Activity {
    open: AtomicUsize,
    changed: tokio::sync::Notify,
    sends: Sends,
}

impl Activity {
    fn begin(self: &Arc<Self>) -> Open {
        self.open.fetch_add(1, Ordering::SeqCst);
        self.changed.notify_waiters();
        Open(Arc::clone(self))
    }

    /// Resolves once no request has been open for `timeout` without a break.
    pub(crate) async fn idle_for(&self, timeout: Duration) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            // Registered before the count is read, so a change in between still wakes us.
            changed.as_mut().enable();
            if self.open.load(Ordering::SeqCst) == 0 {
                tokio::select! {
                    _ = tokio::time::sleep(timeout) => return,
                    _ = changed => {}
                }
            } else {
                changed.await;
            }
        }
    }
}

/// Whether a connection's sending moves: the response bodies waiting for the protocol to take their next
/// piece, and whether the socket refuses writes. Times are milliseconds since `epoch` (0: not set).
pub(crate) struct Sends {
    epoch: Instant,
    /// Response bodies ready to give their next piece that the protocol has not asked for.
    waiting: AtomicUsize,
    /// When a body last moved (a piece taken, a body finished) or the first began waiting.
    moved_ms: AtomicU64,
    /// Since when the socket has refused every write (0: it takes them).
    blocked_ms: AtomicU64,
}

impl Default for Sends {
    fn default() -> Self {
        Sends {
            epoch: Instant::now(),
            waiting: AtomicUsize::new(0),
            moved_ms: AtomicU64::new(0),
            blocked_ms: AtomicU64::new(0),
        }
    }
}

impl Sends {
    fn now_ms(&self) -> u64 {
        // Never 0, which means "not set".
        self.epoch.elapsed().as_millis() as u64 + 1
    }

    fn moved(&self) {
        self.moved_ms.store(self.now_ms(), Ordering::SeqCst);
    }

    /// A body is ready for its next piece.
    fn wait(&self) {
        if self.waiting.fetch_add(1, Ordering::SeqCst) == 0 {
            self.moved();
        }
    }

    /// A body was asked for a piece (it gave one, or finished).
    fn taken(&self) {
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        self.moved();
    }

    fn write_refused(&self) {
        let _ =
            self.blocked_ms
                .compare_exchange(0, self.now_ms(), Ordering::SeqCst, Ordering::SeqCst);
    }

    fn write_taken(&self) {
        self.blocked_ms.store(0, Ordering::SeqCst);
    }

    /// How long sending has been stuck: a body waiting with no body moving, or the socket refusing writes.
    fn stuck_for(&self) -> Duration {
        let now = self.now_ms();
        let mut since = None;
        if self.waiting.load(Ordering::SeqCst) > 0 {
            since = Some(self.moved_ms.load(Ordering::SeqCst));
        }
        let blocked = self.blocked_ms.load(Ordering::SeqCst);
        if blocked != 0 {
            since = Some(since.map_or(blocked, |s: u64| s.min(blocked)));
        }
        since.map_or(Duration::ZERO, |s| {
            Duration::from_millis(now.saturating_sub(s))
        })
    }

    /// Resolves once sending has been stuck for `limit` (checked a few times per `limit`).
    pub(crate) async fn stuck(&self, limit: Duration) {
        let every = (limit / 4).clamp(Duration::from_millis(25), Duration::from_secs(1));
        loop {
            tokio::time::sleep(every).await;
            if self.stuck_for() >= limit {
                return;
            }
        }
    }
}

/// One open request; closes it when dropped.
struct Open(Arc<Activity>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
        self.0.changed.notify_waiters();
    }
}

/// The router with each request counted open until its response body is done, and its peer's address put
/// in ([`Peer`]).
#[derive(Clone)]
pub(crate) struct Tracked<S> {
    pub inner: S,
    pub activity: Arc<Activity>,
    pub peer: Option<IpAddr>,
}

impl<S, B> tower::Service<Request<B>> for Tracked<S>
where
    S: tower::Service<Request<B>, Response = Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        if let Some(ip) = self.peer {
            req.extensions_mut().insert(Peer(ip));
        }
        // The guard lives in the future until a response exists, then in its body: a request whose
        // client went away (its future dropped) is closed as well.
        let open = self.activity.begin();
        let fut = self.inner.call(req);
        Box::pin(async move {
            let resp = fut.await?;
            Ok(resp.map(|body| Body::new(CountedBody::new(body, open))))
        })
    }
}

/// A response body that keeps its request open until it is finished or dropped, goes out in pieces of at
/// most [`PIECE`] bytes, and tells [`Sends`] whether the protocol takes them.
struct CountedBody {
    body: Body,
    /// The rest of a data frame larger than a piece.
    rest: Bytes,
    /// Counted in [`Sends::waiting`].
    waiting: bool,
    open: Open,
}

impl CountedBody {
    fn new(body: Body, open: Open) -> Self {
        open.0.sends.wait();
        CountedBody {
            body,
            rest: Bytes::new(),
            waiting: true,
            open,
        }
    }

    fn piece(&mut self, mut data: Bytes) -> Frame<Bytes> {
        if data.len() > PIECE {
            self.rest = data.split_off(PIECE);
        }
        Frame::data(data)
    }

    /// Asked for a piece: it moved (the body waits again unless it is done).
    fn asked(&mut self, done: bool) {
        let sends = &self.open.0.sends;
        if self.waiting {
            sends.taken();
        }
        self.waiting = !done;
        if self.waiting {
            sends.wait();
        }
    }
}

impl Drop for CountedBody {
    fn drop(&mut self) {
        if self.waiting {
            self.open.0.sends.taken();
        }
    }
}

impl http_body::Body for CountedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        if !this.rest.is_empty() {
            let rest = std::mem::take(&mut this.rest);
            let frame = this.piece(rest);
            let done = this.rest.is_empty() && this.body.is_end_stream();
            this.asked(done);
            return Poll::Ready(Some(Ok(frame)));
        }
        match Pin::new(&mut this.body).poll_frame(cx) {
            // Our bodies are in memory: a body not ready yet is nobody's stall.
            Poll::Pending => Poll::Pending,
            Poll::Ready(None) => {
                this.asked(true);
                Poll::Ready(None)
            }
            Poll::Ready(Some(Ok(frame))) => {
                let frame = match frame.into_data() {
                    Ok(data) => this.piece(data),
                    Err(frame) => frame,
                };
                let done = this.rest.is_empty() && this.body.is_end_stream();
                this.asked(done);
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                this.asked(true);
                Poll::Ready(Some(Err(e)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty() && self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        let inner = self.body.size_hint();
        let rest = self.rest.len() as u64;
        let mut hint = http_body::SizeHint::new();
        hint.set_lower(inner.lower() + rest);
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper + rest);
        }
        hint
    }
}

/// A connection's socket, telling [`Sends`] whether it takes writes.
pub(crate) struct Watched<T> {
    io: T,
    activity: Arc<Activity>,
}

impl<T> Watched<T> {
    pub(crate) fn new(io: T, activity: Arc<Activity>) -> Self {
        Watched { io, activity }
    }

    fn note(&self, poll: &Poll<io::Result<usize>>) {
        match poll {
            Poll::Pending => self.activity.sends.write_refused(),
            Poll::Ready(Ok(n)) if *n > 0 => self.activity.sends.write_taken(),
            _ => {}
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.io).poll_write(cx, buf);
        self.note(&poll);
        poll
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.note(&poll);
        poll
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// How a connection's service ended (for the log).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// The client or the protocol closed it, or a drain closed it gracefully.
    Closed,
    /// A graceful close begun because it was idle finished.
    Idled,
    /// Its sending made no progress for the timeout.
    Stuck,
    /// A graceful close (idle) did not finish within the timeout.
    Lingered,
    /// The server closed it at the end of its drain.
    Killed,
}

/// Serve `conn` until it ends; shut it down gracefully once `activity` has been idle for `idle`, or when
/// `draining` turns true; close it when its sending has been stuck for `idle` ([`Sends`]), when a graceful
/// close begun for idleness has not finished `idle` later, or when `kill` turns true.
pub(crate) async fn serve<C, E>(
    conn: Pin<&mut C>,
    activity: &Activity,
    idle: Duration,
    mut draining: tokio::sync::watch::Receiver<bool>,
    kill: tokio::sync::watch::Receiver<bool>,
    shutdown: impl Fn(Pin<&mut C>),
) -> Ended
where
    C: Future<Output = Result<(), E>>,
{
    let mut conn = conn;
    let mut closing = false;
    let linger = tokio::time::sleep(Duration::MAX / 4);
    tokio::pin!(linger);
    let mut lingering = false;
    // Killed when `kill` turns true; a server gone without a kill leaves open what is open.
    let killed = async move {
        let mut kill = kill;
        if kill.wait_for(|k| *k).await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    tokio::pin!(killed);
    loop {
        tokio::select! {
            _ = conn.as_mut() => return if lingering { Ended::Idled } else { Ended::Closed },
            _ = activity.sends.stuck(idle) => return Ended::Stuck,
            _ = &mut linger, if lingering => return Ended::Lingered,
            _ = &mut killed => return Ended::Killed,
            _ = activity.idle_for(idle), if !closing => {
                closing = true;
                lingering = true;
                linger.as_mut().reset(tokio::time::Instant::now() + idle);
                shutdown(conn.as_mut());
            }
            r = draining.wait_for(|d| *d), if !closing => {
                closing = true;
                if r.is_ok() {
                    shutdown(conn.as_mut());
                }
            }
        }
    }
}

/// Make closing `fd` reset the connection if the peer has not taken everything sent to it: a client that
/// stops reading leaves answers in the kernel's send queue, and a plain close would queue the FIN behind
/// them (never delivered while the client's window stays shut, the socket lingering in the kernel). A peer
/// that read everything still gets the ordinary FIN. Call it while `fd` is open, before the stream drops.
#[cfg(target_os = "linux")]
pub(crate) fn reset_if_unread(fd: std::os::fd::RawFd) -> bool {
    let mut queued: libc::c_int = 0;
    // SAFETY: `fd` is an open socket owned by the caller's stream; TIOCOUTQ (SIOCOUTQ) writes one c_int.
    let ok = unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut queued) } == 0;
    if !ok || queued <= 0 {
        return false;
    }
    let abort = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: as above; SO_LINGER reads one `linger` of the size given.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&abort as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        ) == 0
    }
}

/// Elsewhere the kernel's queue is not asked: the close is the ordinary one.
#[cfg(not(target_os = "linux"))]
pub(crate) fn reset_if_unread(_fd: i32) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::{Instant, sleep};

    #[tokio::test]
    async fn idle_waits_for_every_open_request_then_the_whole_timeout() {
        let ms = Duration::from_millis;
        let a = Arc::new(Activity::default());
        let first = a.begin();
        let second = a.begin();
        let idle = {
            let a = Arc::clone(&a);
            tokio::spawn(async move {
                a.idle_for(ms(300)).await;
                Instant::now()
            })
        };
        sleep(ms(400)).await;
        drop(first);
        sleep(ms(400)).await;
        assert!(!idle.is_finished(), "one request is still open");
        drop(second);
        // A request 100 ms into the quiet restarts the clock when it closes.
        sleep(ms(100)).await;
        let third = a.begin();
        sleep(ms(400)).await;
        assert!(!idle.is_finished(), "a request is open again");
        drop(third);
        let closed = Instant::now();
        let at = idle.await.unwrap();
        assert!(
            at - closed >= ms(300),
            "idle {:?} after the last request",
            at - closed
        );
    }

    #[tokio::test]
    async fn a_body_nobody_takes_is_stuck_and_one_taken_piece_by_piece_is_not() {
        use http_body_util::BodyExt;
        let ms = Duration::from_millis;
        let a = Arc::new(Activity::default());
        assert_eq!(a.sends.stuck_for(), Duration::ZERO, "nothing to send");
        // Three and a half pieces, taken one every 100 ms: never stuck 300 ms.
        let data = vec![7u8; PIECE * 7 / 2];
        let mut body = CountedBody::new(Body::from(data.clone()), a.begin());
        assert_eq!(
            http_body::Body::size_hint(&body).exact(),
            Some(data.len() as u64)
        );
        let mut got = Vec::new();
        while let Some(frame) = body.frame().await {
            let piece = frame.unwrap().into_data().unwrap();
            assert!(piece.len() <= PIECE);
            got.extend_from_slice(&piece);
            sleep(ms(100)).await;
            assert!(a.sends.stuck_for() < ms(300), "{:?}", a.sends.stuck_for());
        }
        assert_eq!(got, data);
        drop(body);
        assert_eq!(a.sends.waiting.load(Ordering::SeqCst), 0);
        // A body the protocol never asks for is stuck from the moment it is ready.
        let body = CountedBody::new(Body::from("answer"), a.begin());
        sleep(ms(300)).await;
        assert!(a.sends.stuck_for() >= ms(290), "{:?}", a.sends.stuck_for());
        drop(body);
        assert_eq!(
            a.sends.stuck_for(),
            Duration::ZERO,
            "dropped: nothing to send"
        );
        // A socket refusing writes is stuck; one write taken clears it.
        a.sends.write_refused();
        sleep(ms(100)).await;
        assert!(a.sends.stuck_for() >= ms(90));
        a.sends.write_taken();
        assert_eq!(a.sends.stuck_for(), Duration::ZERO);
    }
}
