//! One accepted connection's life: served by hyper until the client closes it, the server drains, or it
//! has held no request for the idle timeout.
//!
//! Why the idle clock is ours: hyper closes an idle HTTP/1.1 keep-alive connection through its
//! header-read timer, but an HTTP/2 connection that answers pings stays open for ever, holding one of the
//! `max_connections` slots, so enough idle HTTP/2 clients would keep everyone else in the listen backlog.
//! Here a connection counts the requests it has open (from the moment one is routed until its response
//! body is finished or dropped); once none has been open for the timeout it is shut down gracefully
//! (HTTP/2: GOAWAY, streams in flight finish; HTTP/1.1: closed between requests), for either protocol.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use http_body::Frame;
use hyper::{Request, Response};

/// The requests a connection has open, and a wake-up whenever that number changes.
#[derive(Default)]
pub(crate) struct Activity {
    open: AtomicUsize,
    changed: tokio::sync::Notify,
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

/// One open request; closes it when dropped.
struct Open(Arc<Activity>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
        self.0.changed.notify_waiters();
    }
}

/// The router with each request counted open until its response body is done.
#[derive(Clone)]
pub(crate) struct Tracked<S> {
    pub inner: S,
    pub activity: Arc<Activity>,
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

    fn call(&mut self, req: Request<B>) -> Self::Future {
        // The guard lives in the future until a response exists, then in its body: a request whose
        // client went away (its future dropped) is closed as well.
        let open = self.activity.begin();
        let fut = self.inner.call(req);
        Box::pin(async move {
            let resp = fut.await?;
            Ok(resp.map(|body| Body::new(CountedBody { body, _open: open })))
        })
    }
}

/// A response body that keeps its request open until it is finished or dropped.
struct CountedBody {
    body: Body,
    _open: Open,
}

impl http_body::Body for CountedBody {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// Serve `conn` until it ends; shut it down gracefully once `activity` has been idle for `idle`, or when
/// `draining` turns true.
pub(crate) async fn serve<C, E>(
    conn: Pin<&mut C>,
    activity: &Activity,
    idle: Duration,
    mut draining: tokio::sync::watch::Receiver<bool>,
    shutdown: impl Fn(Pin<&mut C>),
) where
    C: Future<Output = Result<(), E>>,
{
    let mut conn = conn;
    let mut closing = false;
    loop {
        tokio::select! {
            _ = conn.as_mut() => return,
            _ = activity.idle_for(idle), if !closing => {
                closing = true;
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
}
