//! The handlers' side of the queue: slots, submitting a request's parts, awaiting their answers, and
//! stopping the engine thread.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::engine::engine_loop;
use super::stats::QueueStats;
use super::{Answered, EXPIRED, Entry, Inbox, QueueConfig, Reply, Shared, WAITING, lock};
use crate::error::ApiError;
use crate::urgency::Submit;
use crate::{Decider, Priority};

/// A queue slot held by a request being admitted; released on drop unless [`Queue::submit`] took it.
pub struct Slot<J> {
    shared: Option<Arc<Shared<J>>>,
}

impl<J> Drop for Slot<J> {
    fn drop(&mut self) {
        if let Some(s) = self.shared.take() {
            s.release_slot();
        }
    }
}

/// A submitted request: its parts' answers arrive on `rx`, tagged with their place.
pub struct Ticket {
    rx: mpsc::UnboundedReceiver<(usize, Reply)>,
    parts: usize,
    phase: Arc<AtomicU8>,
    admitted: Instant,
    how: Arc<Submit>,
}

/// The queue handle shared by the HTTP handlers, plus the engine thread.
pub struct Queue<J: Send + 'static> {
    shared: Arc<Shared<J>>,
    worker: Mutex<Option<JoinHandle<()>>>,
    /// Says (by closing) that the engine thread has ended.
    ended: Mutex<Option<std::sync::mpsc::Receiver<()>>>,
    retry_after: u64,
}

/// The longest [`Queue::shutdown`] waits for the engine thread: its pass in flight (or its long lane's piece)
/// may take longer, and a process at the end of its drain does not wait for it.
pub const SHUTDOWN_WAIT: Duration = Duration::from_secs(1);

impl<J: Send + 'static> Queue<J> {
    /// Start the engine thread over `decider`.
    pub fn start<D: Decider<Job = J>>(decider: Arc<D>, config: QueueConfig) -> Self {
        let shared = Arc::new(Shared {
            inbox: Mutex::new(Inbox {
                jobs: Vec::new(),
                returned: Vec::new(),
                closed: false,
                seq: 0,
            }),
            wake: Condvar::new(),
            stats: QueueStats {
                oldest_waiting_ms: AtomicU64::new(u64::MAX),
                ..QueueStats::default()
            },
            waiting: AtomicUsize::new(0),
            stopped: AtomicBool::new(false),
            aborted: AtomicBool::new(false),
            abort: tokio::sync::Notify::new(),
            epoch: Instant::now(),
            config,
        });
        let s = Arc::clone(&shared);
        let (ended_tx, ended) = std::sync::mpsc::channel::<()>();
        let worker = std::thread::Builder::new()
            .name("kev-engine".into())
            .spawn(move || {
                // Dropped when the loop returns or unwinds: the receiver sees the channel close.
                let _ended = ended_tx;
                engine_loop(decider, s)
            })
            .expect("spawning the engine thread");
        Queue {
            shared,
            worker: Mutex::new(Some(worker)),
            ended: Mutex::new(Some(ended)),
            retry_after: 1,
        }
    }

    /// Whether a request of (at most) priority `p` could take a slot now: 429 when every slot it may use is
    /// taken (503 when draining), as [`Queue::reserve`] would answer; nothing is held.
    pub fn has_room(&self, p: Priority) -> Result<(), ApiError> {
        let depth = crate::urgency::slots_for(self.open_depth()?, p);
        if self.shared.waiting.load(Ordering::SeqCst) >= depth {
            return Err(self.refuse_full(self.shared.config.depth));
        }
        Ok(())
    }

    /// Take a queue slot for a request of (at most) priority `p` ([`crate::urgency::slots_for`]), or 429 at
    /// once when every slot it may use is taken (503 when draining).
    pub fn reserve(&self, p: Priority) -> Result<Slot<J>, ApiError> {
        let depth = crate::urgency::slots_for(self.open_depth()?, p);
        let taken = self
            .shared
            .waiting
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < depth).then_some(n + 1)
            });
        match taken {
            Ok(_) => Ok(Slot {
                shared: Some(Arc::clone(&self.shared)),
            }),
            Err(_) => Err(self.refuse_full(self.shared.config.depth)),
        }
    }

    /// The queue depth, or 503 once draining: the first check of [`Queue::has_room`] and
    /// [`Queue::reserve`].
    fn open_depth(&self) -> Result<usize, ApiError> {
        if lock(&self.shared.inbox).closed {
            return Err(ApiError::draining());
        }
        Ok(self.shared.config.depth)
    }

    /// The 429 of a full queue, counted.
    fn refuse_full(&self, depth: usize) -> ApiError {
        self.shared
            .stats
            .rejected_full
            .fetch_add(1, Ordering::Relaxed);
        ApiError::queue_full(depth, self.retry_after)
    }

    /// Hand a request's admitted parts (`(job, tokens)`, at least one) to the engine, all together, at its
    /// priority and with its deadline (`how`): the request's slot stays taken until its first part's first
    /// pass. 429 if its slot is beyond what its priority may use ([`Queue::reserve`] took it for the most the
    /// request could be); 408 at once if its deadline has already passed.
    pub fn submit(
        &self,
        mut slot: Slot<J>,
        parts: Vec<(J, usize)>,
        how: Submit,
    ) -> Result<Ticket, ApiError> {
        let (tx, rx) = mpsc::unbounded_channel();
        let phase = Arc::new(AtomicU8::new(WAITING));
        let admitted = Instant::now();
        let n = parts.len();
        if let Some(d) = how.deadline.filter(|d| d.at <= admitted) {
            self.shared
                .stats
                .deadline_expired
                .fetch_add(1, Ordering::Relaxed);
            return Err(ApiError::deadline_passed(d.ms, false));
        }
        let limit = crate::urgency::slots_for(self.shared.config.depth, how.priority);
        if self.shared.waiting.load(Ordering::SeqCst) > limit {
            return Err(self.refuse_full(self.shared.config.depth));
        }
        let how = Arc::new(how);
        let mut inbox = lock(&self.shared.inbox);
        if inbox.closed {
            return Err(ApiError::draining()); // the slot is released by its drop
        }
        if n == 0 {
            return Err(ApiError::internal());
        }
        slot.shared = None; // the entries own the slot now
        for (part, (job, tokens)) in parts.into_iter().enumerate() {
            inbox.seq += 1;
            let seq = inbox.seq;
            inbox.jobs.push(Entry {
                job,
                tokens,
                seq,
                admitted,
                started_at: None,
                compute: Duration::ZERO,
                reply: tx.clone(),
                part,
                phase: Arc::clone(&phase),
                skipped: 0,
                rate: None,
                how: Arc::clone(&how),
                passes: Vec::new(),
            });
        }
        drop(inbox);
        self.shared.wake.notify_one();
        Ok(Ticket {
            rx,
            parts: n,
            phase,
            admitted,
            how,
        })
    }

    /// Every part's answer, in order — or the first part's error (the others are then stopped before their next
    /// pass); 529 if no part has started at the queue deadline; 408 at the request's own deadline (never run
    /// if it had not started, else stopped before its next pass). Dropping this future (the client left, or the
    /// request timeout fired) stops every part before its next pass.
    pub async fn answer(
        &self,
        ticket: Ticket,
        request_id: &str,
    ) -> Result<Vec<Answered>, ApiError> {
        let Ticket {
            mut rx,
            parts,
            phase,
            admitted,
            how,
        } = ticket;
        let deadline = tokio::time::Instant::from_std(admitted + self.shared.config.deadline);
        // The request's own deadline, if it has one (a day away stands for none).
        let (own, own_ms) = match how.deadline {
            Some(d) => (d.at, d.ms),
            None => (admitted + Duration::from_secs(86_400), 0),
        };
        let own = tokio::time::Instant::from_std(own);
        let mut answers: Vec<Option<Answered>> = (0..parts).map(|_| None).collect();
        let mut left = parts;
        let mut waiting = true;
        let aborted = self.shared.abort.notified();
        tokio::pin!(aborted);
        aborted.as_mut().enable();
        while left > 0 {
            if self.shared.aborted.load(Ordering::SeqCst) {
                return Err(ApiError::drained());
            }
            tokio::select! {
                _ = &mut aborted => return Err(ApiError::drained()),
                m = rx.recv() => match m {
                    Some((part, Ok(a))) => {
                        if let Some(slot) = answers.get_mut(part) && slot.replace(a).is_none() {
                            left -= 1;
                        }
                    }
                    Some((_, Err(e))) => return Err(e),
                    // The engine dropped the parts: the drain deadline's abort, or a fault of ours.
                    None if self.shared.aborted.load(Ordering::SeqCst) => {
                        return Err(ApiError::drained());
                    }
                    None => return Err(ApiError::internal().for_request(request_id)),
                },
                _ = tokio::time::sleep_until(own), if how.deadline.is_some() => {
                    if phase
                        .compare_exchange(WAITING, EXPIRED, Ordering::SeqCst, Ordering::SeqCst)
                        .is_ok()
                    {
                        self.shared.release_slot();
                        self.shared.stats.deadline_expired.fetch_add(1, Ordering::Relaxed);
                        self.shared.wake.notify_one();
                        return Err(ApiError::deadline_passed(own_ms, false));
                    }
                    // Started: dropping the channel stops every part before its next pass.
                    return Err(ApiError::deadline_passed(own_ms, true));
                }
                _ = tokio::time::sleep_until(deadline), if waiting => {
                    waiting = false;
                    if phase
                        .compare_exchange(WAITING, EXPIRED, Ordering::SeqCst, Ordering::SeqCst)
                        .is_ok()
                    {
                        self.shared.release_slot();
                        self.shared.stats.expired.fetch_add(1, Ordering::Relaxed);
                        self.shared.wake.notify_one();
                        return Err(ApiError::overloaded(
                            admitted.elapsed().as_millis(),
                            self.retry_after,
                        ));
                    }
                }
            }
        }
        Ok(answers.into_iter().flatten().collect())
    }

    /// Slots taken now (reserved or waiting for a first pass).
    pub fn depth(&self) -> usize {
        self.shared.waiting.load(Ordering::SeqCst)
    }

    /// The queue's capacity.
    pub fn capacity(&self) -> usize {
        self.shared.config.depth
    }

    /// How long the oldest waiting job has waited.
    pub fn oldest_wait(&self) -> Duration {
        let ms = self.shared.stats.oldest_waiting_ms.load(Ordering::Relaxed);
        if ms == u64::MAX || self.depth() == 0 {
            return Duration::ZERO;
        }
        let since = self.shared.epoch.elapsed().as_millis() as u64;
        Duration::from_millis(since.saturating_sub(ms))
    }

    /// The queue deadline.
    pub fn deadline(&self) -> Duration {
        self.shared.config.deadline
    }

    /// Counters for `/metrics`.
    pub fn stats(&self) -> &QueueStats {
        &self.shared.stats
    }

    /// The drain deadline passed: stop admitting, answer every request still waiting or running 503 at once
    /// (each handler answers its own, [`Queue::answer`]), and let the engine drop them before its next pass.
    pub fn abort(&self) {
        lock(&self.shared.inbox).closed = true;
        self.shared.aborted.store(true, Ordering::SeqCst);
        self.shared.abort.notify_waiters();
        self.shared.wake.notify_all();
    }

    /// Stop admitting, let the engine finish what was accepted (everything, unless [`Queue::abort`] was
    /// called), and join its thread — waiting at most [`SHUTDOWN_WAIT`] for it once aborted: a pass in
    /// flight is not waited for.
    pub fn shutdown(&self) {
        lock(&self.shared.inbox).closed = true;
        self.shared.stopped.store(true, Ordering::SeqCst);
        self.shared.wake.notify_all();
        let handle = self.worker.lock().unwrap_or_else(|p| p.into_inner()).take();
        let ended = lock(&self.ended).take();
        let (Some(h), Some(ended)) = (handle, ended) else {
            return;
        };
        let wait = if self.shared.aborted.load(Ordering::SeqCst) {
            ended.recv_timeout(SHUTDOWN_WAIT)
        } else {
            ended
                .recv()
                .map_err(|_| std::sync::mpsc::RecvTimeoutError::Disconnected)
        };
        match wait {
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => tracing::warn!(
                wait_s = SHUTDOWN_WAIT.as_secs_f64(),
                "the engine's pass in flight did not end in time: exiting without it"
            ),
            _ => {
                let _ = h.join();
            }
        }
    }
}

impl<J: Send + 'static> Drop for Queue<J> {
    fn drop(&mut self) {
        self.shutdown();
    }
}
