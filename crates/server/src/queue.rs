//! Admission: a bounded queue in front of the engine, and the engine thread that drains it.
//!
//! Policy lives in [`QueueState`], a plain value with no channels or threads, so it is unit-tested
//! directly. [`Queue`] wraps it in a mutex + condvar and runs the decider on one owned OS thread
//! (compute never runs on the async runtime). Each job carries a oneshot reply; a job whose HTTP
//! client has gone (receiver dropped) is discarded before it costs any compute.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::oneshot;

use crate::Decider;
use crate::error::ApiError;

/// What the engine thread sends back for one job.
pub type Reply = Result<Answered, ApiError>;

/// A successful answer: the response body and the compute time of the batch it ran in.
#[derive(Debug)]
pub struct Answered {
    /// The response body (`{model, answers, usage, …}`).
    pub body: Value,
    /// Wall time of the engine pass that answered it.
    pub compute: Duration,
    /// Time spent waiting in the queue.
    pub queued: Duration,
}

/// A job waiting for the engine.
pub struct Queued<J> {
    /// The compiled request.
    pub job: J,
    /// Its token count, for the per-pass budget.
    pub tokens: usize,
    /// When it was admitted.
    pub admitted: Instant,
    /// The reply channel.
    pub reply: oneshot::Sender<Reply>,
}

/// Why a push was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum PushError {
    /// The queue holds `depth` jobs already.
    Full(usize),
    /// The server is draining.
    Closed,
}

/// The queue's policy: bounded depth, per-job deadline, token budget per engine pass.
pub struct QueueState<J> {
    jobs: VecDeque<Queued<J>>,
    depth: usize,
    deadline: Duration,
    pass_tokens: usize,
    closed: bool,
}

/// What [`QueueState::next_batch`] hands out.
pub struct Batch<J> {
    /// Jobs to run now, in arrival order.
    pub run: Vec<Queued<J>>,
    /// Jobs that waited past the deadline: answer 529.
    pub expired: Vec<Queued<J>>,
    /// Jobs whose clients went away: dropped without an answer.
    pub abandoned: usize,
}

impl<J> QueueState<J> {
    /// A queue holding at most `depth` jobs, each allowed to wait `deadline`, passes of at most
    /// `pass_tokens` tokens (a single larger job still runs alone).
    pub fn new(depth: usize, deadline: Duration, pass_tokens: usize) -> Self {
        QueueState {
            jobs: VecDeque::new(),
            depth,
            deadline,
            pass_tokens: pass_tokens.max(1),
            closed: false,
        }
    }

    /// Jobs waiting now.
    pub fn len(&self) -> usize {
        self.jobs.len()
    }

    /// Whether no job waits.
    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }

    /// Admit a job, or refuse it at once.
    pub fn push(&mut self, q: Queued<J>) -> Result<(), (PushError, Queued<J>)> {
        if self.closed {
            return Err((PushError::Closed, q));
        }
        if self.jobs.len() >= self.depth {
            return Err((PushError::Full(self.depth), q));
        }
        self.jobs.push_back(q);
        Ok(())
    }

    /// Stop admitting; jobs already queued still run.
    pub fn close(&mut self) {
        self.closed = true;
    }

    /// Whether [`QueueState::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Take the next pass: jobs in arrival order while they fit the token budget (at least one),
    /// after removing jobs past their deadline or whose clients left.
    pub fn next_batch(&mut self, now: Instant) -> Batch<J> {
        let mut batch = Batch {
            run: Vec::new(),
            expired: Vec::new(),
            abandoned: 0,
        };
        let mut tokens = 0usize;
        while let Some(front) = self.jobs.front() {
            if front.reply.is_closed() {
                self.jobs.pop_front();
                batch.abandoned += 1;
                continue;
            }
            if now.duration_since(front.admitted) > self.deadline {
                if let Some(q) = self.jobs.pop_front() {
                    batch.expired.push(q);
                }
                continue;
            }
            if !batch.run.is_empty() && tokens + front.tokens > self.pass_tokens {
                break;
            }
            tokens += front.tokens;
            if let Some(q) = self.jobs.pop_front() {
                batch.run.push(q);
            }
        }
        batch
    }
}

/// Engine-side counters the metrics endpoint reads.
#[derive(Default)]
pub struct QueueStats {
    /// Jobs refused because the queue was full.
    pub rejected_full: AtomicU64,
    /// Jobs that expired in the queue.
    pub expired: AtomicU64,
    /// Jobs dropped because their client left.
    pub abandoned: AtomicU64,
    /// Engine passes run.
    pub passes: AtomicU64,
}

struct Shared<J> {
    state: Mutex<QueueState<J>>,
    wake: Condvar,
    stats: QueueStats,
    stopped: AtomicBool,
}

/// The queue handle shared by the HTTP handlers, plus the engine thread.
pub struct Queue<J: Send + 'static> {
    shared: Arc<Shared<J>>,
    worker: Mutex<Option<JoinHandle<()>>>,
    retry_after: u64,
}

impl<J: Send + 'static> Queue<J> {
    /// Start the engine thread over `decider`.
    pub fn start<D: Decider<Job = J>>(decider: Arc<D>, state: QueueState<J>) -> Self {
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            wake: Condvar::new(),
            stats: QueueStats::default(),
            stopped: AtomicBool::new(false),
        });
        let s = Arc::clone(&shared);
        let worker = std::thread::Builder::new()
            .name("kev-engine".into())
            .spawn(move || engine_loop(decider, s))
            .expect("spawning the engine thread");
        Queue {
            shared,
            worker: Mutex::new(Some(worker)),
            retry_after: 1,
        }
    }

    /// Admit a job; the returned receiver yields its answer.
    pub fn submit(&self, job: J, tokens: usize) -> Result<oneshot::Receiver<Reply>, ApiError> {
        let (tx, rx) = oneshot::channel();
        let q = Queued {
            job,
            tokens,
            admitted: Instant::now(),
            reply: tx,
        };
        let mut st = lock(&self.shared.state);
        match st.push(q) {
            Ok(()) => {
                drop(st);
                self.shared.wake.notify_one();
                Ok(rx)
            }
            Err((PushError::Full(depth), _)) => {
                self.shared
                    .stats
                    .rejected_full
                    .fetch_add(1, Ordering::Relaxed);
                Err(ApiError::queue_full(depth, self.retry_after))
            }
            Err((PushError::Closed, _)) => Err(ApiError::draining()),
        }
    }

    /// Jobs waiting now.
    pub fn depth(&self) -> usize {
        lock(&self.shared.state).len()
    }

    /// Counters for `/metrics`.
    pub fn stats(&self) -> &QueueStats {
        &self.shared.stats
    }

    /// Stop admitting, let the engine finish what was accepted, and join its thread.
    pub fn shutdown(&self) {
        lock(&self.shared.state).close();
        self.shared.stopped.store(true, Ordering::SeqCst);
        self.shared.wake.notify_all();
        let handle = self.worker.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(h) = handle {
            let _ = h.join();
        }
    }
}

impl<J: Send + 'static> Drop for Queue<J> {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic on the engine thread must not wedge the HTTP side: keep using the state.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn engine_loop<D: Decider>(decider: Arc<D>, shared: Arc<Shared<D::Job>>) {
    loop {
        let batch = {
            let mut st = lock(&shared.state);
            while st.is_empty() && !shared.stopped.load(Ordering::SeqCst) {
                st = shared.wake.wait(st).unwrap_or_else(|p| p.into_inner());
            }
            if st.is_empty() {
                return;
            }
            st.next_batch(Instant::now())
        };
        let stats = &shared.stats;
        stats
            .abandoned
            .fetch_add(batch.abandoned as u64, Ordering::Relaxed);
        for q in batch.expired {
            stats.expired.fetch_add(1, Ordering::Relaxed);
            let waited = q.admitted.elapsed().as_millis();
            let _ = q.reply.send(Err(ApiError::overloaded(waited, 1)));
        }
        if batch.run.is_empty() {
            continue;
        }
        stats.passes.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        let mut jobs = Vec::with_capacity(batch.run.len());
        let mut replies = Vec::with_capacity(batch.run.len());
        for q in batch.run {
            jobs.push(q.job);
            replies.push((q.reply, started.duration_since(q.admitted)));
        }
        let n = jobs.len();
        let results = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| decider.run(jobs)));
        let compute = started.elapsed();
        match results {
            Ok(results) if results.len() == n => {
                for ((tx, queued), r) in replies.into_iter().zip(results) {
                    let _ = tx.send(r.map(|body| Answered {
                        body,
                        compute,
                        queued,
                    }));
                }
            }
            Ok(results) => {
                tracing::error!(
                    expected = n,
                    got = results.len(),
                    "decider returned the wrong number of results"
                );
                for (tx, _) in replies {
                    let _ = tx.send(Err(ApiError::internal("engine")));
                }
            }
            Err(_) => {
                tracing::error!("the engine panicked while answering a batch");
                for (tx, _) in replies {
                    let _ = tx.send(Err(ApiError::internal("engine")));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(tokens: usize, admitted: Instant) -> (Queued<usize>, oneshot::Receiver<Reply>) {
        let (tx, rx) = oneshot::channel();
        (
            Queued {
                job: tokens,
                tokens,
                admitted,
                reply: tx,
            },
            rx,
        )
    }

    #[test]
    fn refuses_when_full_and_after_close() {
        let now = Instant::now();
        let mut st = QueueState::new(2, Duration::from_secs(10), 100);
        let (a, _ra) = job(1, now);
        let (b, _rb) = job(1, now);
        let (c, _rc) = job(1, now);
        assert!(st.push(a).is_ok());
        assert!(st.push(b).is_ok());
        assert_eq!(st.push(c).err().map(|e| e.0), Some(PushError::Full(2)));
        st.close();
        let _ = st.next_batch(now);
        let (d, _rd) = job(1, now);
        assert_eq!(st.push(d).err().map(|e| e.0), Some(PushError::Closed));
    }

    #[test]
    fn batches_by_token_budget_in_arrival_order() {
        let now = Instant::now();
        let mut st = QueueState::new(10, Duration::from_secs(10), 100);
        let mut keep = Vec::new();
        for t in [60, 30, 20, 200] {
            let (q, r) = job(t, now);
            keep.push(r);
            assert!(st.push(q).is_ok());
        }
        let b = st.next_batch(now);
        assert_eq!(
            b.run.iter().map(|q| q.job).collect::<Vec<_>>(),
            vec![60, 30]
        );
        let b = st.next_batch(now);
        assert_eq!(b.run.iter().map(|q| q.job).collect::<Vec<_>>(), vec![20]);
        // A job larger than the budget still runs, alone.
        let b = st.next_batch(now);
        assert_eq!(b.run.iter().map(|q| q.job).collect::<Vec<_>>(), vec![200]);
        assert!(st.is_empty());
    }

    #[test]
    fn drops_abandoned_and_expires_late_jobs() {
        let start = Instant::now();
        let mut st = QueueState::new(10, Duration::from_millis(50), 100);
        let (gone, rx_gone) = job(1, start);
        drop(rx_gone);
        let (late, _r1) = job(2, start);
        let (fresh, _r2) = job(3, start + Duration::from_millis(40));
        assert!(st.push(gone).is_ok());
        assert!(st.push(late).is_ok());
        assert!(st.push(fresh).is_ok());
        let b = st.next_batch(start + Duration::from_millis(80));
        assert_eq!(b.abandoned, 1);
        assert_eq!(b.expired.iter().map(|q| q.job).collect::<Vec<_>>(), vec![2]);
        assert_eq!(b.run.iter().map(|q| q.job).collect::<Vec<_>>(), vec![3]);
    }
}
