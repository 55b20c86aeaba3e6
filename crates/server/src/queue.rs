//! Admission and the engine thread: a bounded queue of admitted requests, and one owned OS thread that
//! runs engine passes over them (compute never runs on the async runtime).
//!
//! - **Slots before work**: a request takes a queue slot ([`Queue::reserve`]) once its body has arrived and
//!   before it is parsed or tokenized; a full queue answers 429 at once, before the body is read
//!   ([`Queue::has_room`]), and again after it if the queue filled meanwhile. A client slow to send its body
//!   holds no slot.
//! - **Long work on a lane**: pieces of long work run on a thread pool of their own beside the engine thread's
//!   short passes ([`QueueConfig::long_lane`], `lane_loop`).
//! - **Deadline**: a request still waiting (not started) at its queue deadline is answered 529 by its own
//!   handler ([`Queue::answer`]) — on time, however long the engine's current pass takes.
//! - **Between passes** the engine thread drops requests whose client hung up or whose request timeout
//!   fired (their handler future was dropped), so their remaining pieces never run; it then asks the
//!   scheduler ([`crate::sched`]) for the next pass.
//!
//! A request is submitted as one or more **parts** ([`Queue::submit`]: a fan-out route's parts together, all or
//! none), each its own job for the scheduler, all holding the request's one slot. The request's phase (waiting →
//! started, or waiting → expired) is one atomic its parts share, so the handler's deadline and the engine's
//! start cannot both win; the slot is freed when the first part starts. Every part answers on the request's one
//! channel: when the handler is dropped (hang-up, request timeout) or gives up on the first failed part, every
//! part still in the engine is stopped before its next pass.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kev_contract::ResponseBody;
use tokio::sync::mpsc;

use crate::error::ApiError;
use crate::sched::{self, Candidate, Policy};
use kev_decide::Lane;

use crate::{Decider, Need, Step};

/// What the engine thread sends back for one part of a request.
pub type Reply = Result<Answered, ApiError>;

/// A successful answer: the response body and where its time went.
#[derive(Debug)]
pub struct Answered {
    /// The response (`{model, answers, usage, …}`).
    pub body: ResponseBody,
    /// Wall time of the engine passes that advanced it.
    pub compute: Duration,
    /// Time spent waiting in the queue before its first pass.
    pub queued: Duration,
}

const WAITING: u8 = 0;
const STARTED: u8 = 1;
const EXPIRED: u8 = 2;

/// Queue settings.
#[derive(Debug, Clone, Copy)]
pub struct QueueConfig {
    /// Jobs allowed to wait (slots).
    pub depth: usize,
    /// Longest a job may wait before its first pass.
    pub deadline: Duration,
    /// The scheduler's policy.
    pub policy: Policy,
    /// Where long work's pieces run: on a lane of their own beside the short passes (see [`lane_loop`]),
    /// or in turns with short passes on the one engine thread.
    pub long_lane: LongLane,
}

/// Where long work runs (`--long-lane`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LongLane {
    /// In turns with short passes on the one engine thread.
    Off,
    /// On a lane of its own beside the short passes, its threads at the lowest OS priority
    /// (`SCHED_IDLE`): short requests beside long work are fastest this way, but long work stops for as
    /// long as anything else in its scheduling group keeps every core busy.
    #[default]
    On,
    /// As [`LongLane::On`], its threads at nice 10: below kev's own threads and anything else at the
    /// default priority, but keeping a share of a busy host (a tenth of a busy thread's), for a host kev
    /// shares with other work.
    Low,
}

/// Counters and gauges the metrics endpoint reads.
#[derive(Default)]
pub struct QueueStats {
    /// Jobs refused because the queue was full.
    pub rejected_full: AtomicU64,
    /// Requests refused before their body was read because every body-read permit was taken.
    pub rejected_bodies: AtomicU64,
    /// Jobs that waited past their deadline (529).
    pub expired: AtomicU64,
    /// Waiting jobs dropped because their client left.
    pub abandoned: AtomicU64,
    /// Started jobs stopped between passes (client gone or request timeout).
    pub cancelled: AtomicU64,
    /// Engine passes run.
    pub passes: AtomicU64,
    /// Partial pieces run (long work cut between other requests' passes).
    pub partial_pieces: AtomicU64,
    /// Times short passes were held for a starved lane piece for [`LANE_HOLD`] and let go again because it
    /// was still not back (the host's other work holding the lane's cores).
    pub lane_holds_released: AtomicU64,
    /// Jobs started and not finished.
    pub running: AtomicUsize,
    /// Tokens left over every admitted job (waiting and started), as of the last pass.
    pub inflight_tokens: AtomicU64,
    /// When the oldest waiting job was admitted, in ms since the queue started (`u64::MAX`: none).
    oldest_waiting_ms: AtomicU64,
}

struct Entry<J> {
    job: J,
    tokens: usize,
    seq: u64,
    admitted: Instant,
    started_at: Option<Instant>,
    compute: Duration,
    /// Its request's channel, and its place among the request's parts.
    reply: mpsc::UnboundedSender<(usize, Reply)>,
    part: usize,
    /// Its request's phase (shared by the parts).
    phase: Arc<AtomicU8>,
    skipped: u32,
    rate: Option<f64>,
}

struct Inbox<J> {
    jobs: Vec<Entry<J>>,
    /// Pieces of long work back from the lane.
    returned: Vec<Returned<J>>,
    closed: bool,
    seq: u64,
}

/// A piece of long work the lane ran, and what it gave.
struct Returned<J> {
    entry: Entry<J>,
    /// `None`: the pass failed (a panic, or the wrong number of steps).
    step: Option<Step>,
    took: Duration,
    /// Tokens the job had left before the piece.
    before: usize,
}

struct Shared<J> {
    inbox: Mutex<Inbox<J>>,
    wake: Condvar,
    stats: QueueStats,
    /// Slots taken: reserved, or waiting for their first pass.
    waiting: AtomicUsize,
    stopped: AtomicBool,
    epoch: Instant,
    config: QueueConfig,
}

impl<J> Shared<J> {
    fn release_slot(&self) {
        self.waiting.fetch_sub(1, Ordering::SeqCst);
    }
}

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
}

/// The queue handle shared by the HTTP handlers, plus the engine thread.
pub struct Queue<J: Send + 'static> {
    shared: Arc<Shared<J>>,
    worker: Mutex<Option<JoinHandle<()>>>,
    retry_after: u64,
}

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
            epoch: Instant::now(),
            config,
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

    /// Whether a request could take a slot now: 429 when every slot is taken (503 when draining), as
    /// [`Queue::reserve`] would answer; nothing is held.
    pub fn has_room(&self) -> Result<(), ApiError> {
        let depth = self.open_depth()?;
        if self.shared.waiting.load(Ordering::SeqCst) >= depth {
            return Err(self.refuse_full(depth));
        }
        Ok(())
    }

    /// Take a queue slot, or 429 at once when every slot is taken (503 when draining).
    pub fn reserve(&self) -> Result<Slot<J>, ApiError> {
        let depth = self.open_depth()?;
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
            Err(_) => Err(self.refuse_full(depth)),
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

    /// Hand a request's admitted parts (`(job, tokens)`, at least one) to the engine, all together: the
    /// request's slot stays taken until its first part's first pass.
    pub fn submit(&self, mut slot: Slot<J>, parts: Vec<(J, usize)>) -> Result<Ticket, ApiError> {
        let (tx, rx) = mpsc::unbounded_channel();
        let phase = Arc::new(AtomicU8::new(WAITING));
        let admitted = Instant::now();
        let n = parts.len();
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
            });
        }
        drop(inbox);
        self.shared.wake.notify_one();
        Ok(Ticket {
            rx,
            parts: n,
            phase,
            admitted,
        })
    }

    /// Every part's answer, in order — or the first part's error (the others are then stopped before their next
    /// pass); 529 if no part has started at the queue deadline. Dropping this future (the client left, or the
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
        } = ticket;
        let deadline = tokio::time::Instant::from_std(admitted + self.shared.config.deadline);
        let mut answers: Vec<Option<Answered>> = (0..parts).map(|_| None).collect();
        let mut left = parts;
        let mut waiting = true;
        while left > 0 {
            tokio::select! {
                m = rx.recv() => match m {
                    Some((part, Ok(a))) => {
                        if let Some(slot) = answers.get_mut(part) && slot.replace(a).is_none() {
                            left -= 1;
                        }
                    }
                    Some((_, Err(e))) => return Err(e),
                    None => return Err(ApiError::internal().for_request(request_id)),
                },
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

    /// Stop admitting, let the engine finish what was accepted, and join its thread.
    pub fn shutdown(&self) {
        lock(&self.shared.inbox).closed = true;
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

/// Short-only passes older than this no longer set the time of a partial piece.
const SLICE_MEMORY: Duration = Duration::from_secs(2);

/// The longest a lane piece is planned to take: the lane runs beside short passes, so nobody waits for
/// it, but a shorter piece returns the job to the planner sooner (a hang-up stops it, a second long
/// request takes its turn).
const LANE_PIECE: Duration = Duration::from_millis(250);

/// The most short-pass time a lane piece may spend paused before it gets the machine: under a saturating
/// stream of short requests long work still gets about a fifth of it (a 250 ms piece every ~1.25 s),
/// enough to finish a 60,000-token state inside the request timeout. Counted in the passes' own time, not
/// the time since the piece went out: a piece that is simply long (a first piece of unknown speed) is not
/// starved, and the short requests arriving meanwhile still run beside it.
const LANE_STARVE: Duration = Duration::from_secs(1);

/// The longest short passes are held for a starved lane piece ([`LANE_STARVE`]). A piece that is not back
/// after this long with kev's cores to itself is held by something outside kev (the lane's low OS
/// priority yields to every busy thread of its scheduling group, not only to kev's own), and holding
/// short requests longer would not bring it back sooner: they run again, and the guard may hold them once
/// more after another [`LANE_STARVE`] of their passes.
const LANE_HOLD: Duration = Duration::from_secs(2);

/// Make the calling thread a lane thread: the OS runs it below kev's other threads ([`LongLane`]); its
/// passes are background passes ([`Lane::Background`]), which the engine pauses at safe points while a
/// short pass runs.
///
/// Measured on 2 cores beside a 62,000-token state (docs/results/server.md): the pauses do most of the
/// work, the OS priority the rest (the lane would otherwise take a core whenever a short request's thread
/// waits a moment): short requests' p99 8.6–9.5 ms with `SCHED_IDLE`, 13–19 ms at nice 10. But with three
/// CPU-bound processes beside the server a 5,900-token state made no progress in 80 s at `SCHED_IDLE`,
/// and took 8–10 s at nice 10.
fn lower_priority(lane: LongLane) {
    #[cfg(not(target_os = "linux"))]
    let _ = lane;
    #[cfg(target_os = "linux")]
    // SAFETY: scheduling calls on the calling thread (id 0 / its own id); `param` outlives the call.
    unsafe {
        let tid = libc::gettid() as libc::id_t;
        match lane {
            LongLane::Low => {
                libc::setpriority(libc::PRIO_PROCESS, tid, LOW_LANE_NICE);
            }
            LongLane::On | LongLane::Off => {
                let param = libc::sched_param { sched_priority: 0 };
                if libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) != 0 {
                    libc::setpriority(libc::PRIO_PROCESS, tid, 19);
                }
            }
        }
    }
}

/// The lane's nice value under [`LongLane::Low`]: a tenth of a default-priority thread's weight.
#[cfg(target_os = "linux")]
const LOW_LANE_NICE: libc::c_int = 10;

/// The long lane: one piece of long work at a time, on a thread pool of its own at a low priority, while
/// the engine thread keeps running short passes. A short request then never waits for a long piece to
/// end, however deep in its state the piece lies (a piece 60,000 tokens into a state costs ten times one
/// at its start). Results do not change: a piece runs the same pass as it would on the engine thread, with
/// as many threads.
fn lane_loop<D: Decider>(
    decider: Arc<D>,
    shared: Arc<Shared<D::Job>>,
    rx: std::sync::mpsc::Receiver<(Entry<D::Job>, usize)>,
) {
    let priority = shared.config.long_lane;
    lower_priority(priority);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(rayon::current_num_threads())
        .thread_name(|i| format!("kev-long-{i}"))
        .start_handler(move |_| lower_priority(priority))
        .build();
    if let Err(e) = &pool {
        tracing::warn!(error = %e, "the long lane runs on the engine's threads");
    }
    while let Ok((mut entry, tokens)) = rx.recv() {
        let before = decider.need(&entry.job).remaining;
        let t = Instant::now();
        let step = std::panic::catch_unwind(AssertUnwindSafe(|| {
            let mut grants = [(&mut entry.job, tokens)];
            match &pool {
                Ok(pool) => pool.install(|| decider.pass(&mut grants, Lane::Background)),
                Err(_) => decider.pass(&mut grants, Lane::Background),
            }
        }));
        let took = t.elapsed();
        let step = match step {
            Ok(mut steps) if steps.len() == 1 => steps.pop(),
            Ok(steps) => {
                tracing::error!(
                    got = steps.len(),
                    "decider returned the wrong number of steps"
                );
                None
            }
            Err(_) => {
                tracing::error!("the engine panicked during a long piece");
                None
            }
        };
        lock(&shared.inbox).returned.push(Returned {
            entry,
            step,
            took,
            before,
        });
        shared.wake.notify_all();
    }
}

/// Whether a candidate is long work: already cut into pieces, or a phase larger than a whole pass.
fn is_long_work(c: &Candidate, policy: &Policy) -> bool {
    c.rate.is_some() || c.need.phase > policy.pass_tokens.max(1)
}

/// The long work the lane takes next and its grant: the one skipped most (so two long requests take
/// turns), then the oldest; a request not yet started only while fewer than `long_in_flight` long ones
/// are. Its first piece is one unit (its speed unknown), later ones about [`LANE_PIECE`].
fn lane_pick(cands: &[Candidate], policy: &Policy) -> Option<(usize, usize)> {
    let budget = policy.pass_tokens.max(1);
    let long_started = cands
        .iter()
        .filter(|c| c.started && c.need.remaining > budget)
        .count();
    let i = (0..cands.len())
        .filter(|&i| {
            let c = &cands[i];
            is_long_work(c, policy) && (c.started || long_started < policy.long_in_flight)
        })
        .min_by_key(|&i| (std::cmp::Reverse(cands[i].skipped), cands[i].seq))?;
    let target = policy.solo_piece.min(LANE_PIECE);
    Some((i, sched::timed_grant(&cands[i], target, budget)))
}

/// Mark a part started as it gets its first grant (the request's first part to start frees its slot);
/// `false` if its request expired meanwhile.
fn start_part<J>(shared: &Shared<J>, e: &mut Entry<J>, now: Instant) -> bool {
    if e.started_at.is_some() {
        return true;
    }
    match e
        .phase
        .compare_exchange(WAITING, STARTED, Ordering::SeqCst, Ordering::SeqCst)
    {
        Ok(_) => shared.release_slot(),
        Err(STARTED) => {}      // a part before it started the request
        Err(_) => return false, // expired just now; pruned next round
    }
    e.started_at = Some(now);
    shared.stats.running.fetch_add(1, Ordering::Relaxed);
    true
}

fn candidates<D: Decider>(decider: &D, jobs: &[Entry<D::Job>]) -> (Vec<Need>, Vec<Candidate>) {
    let needs: Vec<Need> = jobs.iter().map(|e| decider.need(&e.job)).collect();
    let cands = jobs
        .iter()
        .zip(&needs)
        .map(|(e, n)| Candidate {
            need: *n,
            started: e.started_at.is_some(),
            skipped: e.skipped,
            seq: e.seq,
            rate: e.rate,
        })
        .collect();
    (needs, cands)
}

fn engine_loop<D: Decider>(decider: Arc<D>, shared: Arc<Shared<D::Job>>) {
    let mut jobs: Vec<Entry<D::Job>> = Vec::new();
    // EWMA of short-only pass durations, and when one last ran.
    let mut slice: Option<(Duration, Instant)> = None;
    let stats = &shared.stats;
    let policy = shared.config.policy;
    let lane = (shared.config.long_lane != LongLane::Off).then(|| {
        let (tx, rx) = std::sync::mpsc::channel();
        let (d, s) = (Arc::clone(&decider), Arc::clone(&shared));
        let handle = std::thread::Builder::new()
            .name("kev-long".into())
            .spawn(move || lane_loop(d, s, rx))
            .expect("spawning the long lane");
        (tx, handle)
    });
    // The job on the lane: the tokens it will have left after its piece (for the gauge), and how long the
    // short passes since it went out have kept it paused.
    let mut away: Option<usize> = None;
    let mut paused = Duration::ZERO;
    // Since when short passes have been held for it (the guard below).
    let mut held_since: Option<Instant> = None;
    // The last round could run nothing (only long work, the lane busy): wait for news.
    let mut blocked = false;
    loop {
        let returned = {
            let mut inbox = lock(&shared.inbox);
            loop {
                let news = !inbox.jobs.is_empty() || !inbox.returned.is_empty();
                let stopped = shared.stopped.load(Ordering::SeqCst);
                if news
                    || (!jobs.is_empty() && !blocked)
                    || (stopped && jobs.is_empty() && away.is_none())
                {
                    break;
                }
                let (guard, wait) = shared
                    .wake
                    .wait_timeout(inbox, Duration::from_millis(100))
                    .unwrap_or_else(|p| p.into_inner());
                inbox = guard;
                if wait.timed_out() && blocked {
                    break; // plan again: prune what expired meanwhile
                }
            }
            jobs.append(&mut inbox.jobs);
            std::mem::take(&mut inbox.returned)
        };
        blocked = false;
        for r in returned {
            away = None;
            let mut e = r.entry;
            e.compute += r.took;
            e.skipped = 0;
            stats.passes.fetch_add(1, Ordering::Relaxed);
            stats.partial_pieces.fetch_add(1, Ordering::Relaxed);
            match r.step {
                Some(Step::Running) => {
                    let done = r.before.saturating_sub(decider.need(&e.job).remaining);
                    if r.took > Duration::ZERO && done > 0 {
                        e.rate = Some(done as f64 / r.took.as_secs_f64());
                    }
                    jobs.push(e);
                }
                Some(Step::Done(result)) => finish(&shared, e, answer_of(result)),
                None => finish(&shared, e, Err(ApiError::internal())),
            }
        }
        if jobs.is_empty() {
            if away.is_none() && shared.stopped.load(Ordering::SeqCst) {
                break;
            }
            continue;
        }
        let now = Instant::now();
        prune(&shared, &mut jobs, now);
        publish(&shared, &*decider, &jobs, away.unwrap_or(0));
        if jobs.is_empty() {
            continue;
        }

        let (mut needs, mut cands) = candidates(&*decider, &jobs);
        if let Some((tx, _)) = &lane
            && away.is_none()
            && let Some((i, tokens)) = lane_pick(&cands, &policy)
            && start_part(&shared, &mut jobs[i], now)
        {
            let e = jobs.swap_remove(i);
            away = Some(cands[i].need.remaining.saturating_sub(tokens));
            paused = Duration::ZERO;
            tracing::debug!(seq = e.seq, tokens, "long piece to the lane");
            if let Err(std::sync::mpsc::SendError((e, _))) = tx.send((e, tokens)) {
                away = None;
                finish(&shared, e, Err(ApiError::internal()));
            }
            (needs, cands) = candidates(&*decider, &jobs);
        }
        let target = slice
            .filter(|(_, at)| now.duration_since(*at) < SLICE_MEMORY)
            .map(|(d, _)| d);
        // With the lane, this pass takes short work only: long work waits for its turn there.
        let plan = if lane.is_some() {
            let short: Vec<usize> = (0..cands.len())
                .filter(|&i| !is_long_work(&cands[i], &policy))
                .collect();
            let sub: Vec<Candidate> = short.iter().map(|&i| cands[i]).collect();
            let p = sched::plan(&sub, &policy, target);
            let mut grants: Vec<(usize, usize)> =
                p.grants.iter().map(|&(k, t)| (short[k], t)).collect();
            grants.sort_unstable();
            sched::Plan {
                grants,
                partial: p.partial.map(|k| short[k]),
            }
        } else {
            sched::plan(&cands, &policy, target)
        };
        // A lane piece that short passes have kept paused for longer than `LANE_STARVE` (or `solo_piece`,
        // if shorter) gets the machine: no short pass starts until it is back (or `LANE_HOLD` has passed),
        // so long work never starves behind kev's own short requests.
        let mut lane_starved = away.is_some() && paused > policy.solo_piece.min(LANE_STARVE);
        if !lane_starved {
            held_since = None;
        } else if now.duration_since(*held_since.get_or_insert(now)) > LANE_HOLD {
            tracing::info!(
                "a long piece was not back {} s after short requests stepped aside for it: the host's \
                 other work holds the long lane's cores (see --long-lane low)",
                LANE_HOLD.as_secs()
            );
            stats.lane_holds_released.fetch_add(1, Ordering::Relaxed);
            (lane_starved, paused, held_since) = (false, Duration::ZERO, None);
        }
        let mut granted: Vec<Option<usize>> = vec![None; jobs.len()];
        for &(i, tokens) in plan.grants.iter().filter(|_| !lane_starved) {
            if start_part(&shared, &mut jobs[i], now) {
                granted[i] = Some(tokens);
            }
        }
        if granted.iter().all(Option::is_none) {
            // Nothing could run (only long work with the lane busy, or everything planned expired
            // meanwhile): wait for news, then prune and plan again.
            blocked = true;
            continue;
        }

        let started = Instant::now();
        let results = {
            let mut grants: Vec<(&mut D::Job, usize)> = jobs
                .iter_mut()
                .zip(&granted)
                .filter_map(|(e, g)| g.map(|t| (&mut e.job, t)))
                .collect();
            let n = grants.len();
            // A foreground pass: lane passes step aside while it runs.
            let pass = || decider.pass(&mut grants, Lane::Foreground);
            match std::panic::catch_unwind(AssertUnwindSafe(pass)) {
                Ok(steps) if steps.len() == n => Ok(steps),
                Ok(steps) => {
                    tracing::error!(
                        expected = n,
                        got = steps.len(),
                        "decider returned the wrong number of steps"
                    );
                    Err(())
                }
                Err(_) => {
                    tracing::error!("the engine panicked during a pass");
                    Err(())
                }
            }
        };
        let took = started.elapsed();
        if away.is_some() {
            paused += took;
        }
        // Per pass, at debug level: what ran and how long it took (`KEV_LOG=kev_server=debug`), the
        // first thing to read when a short request's latency beside long work is off.
        tracing::debug!(
            took_ms = took.as_secs_f64() * 1e3,
            grants = ?plan.grants.iter().map(|&(i, t)| (jobs[i].seq, t)).collect::<Vec<_>>(),
            partial = ?plan.partial.map(|i| jobs[i].seq),
            waiting = jobs.len() - plan.grants.len(),
            "pass"
        );
        stats.passes.fetch_add(1, Ordering::Relaxed);
        if plan.partial.is_some() {
            stats.partial_pieces.fetch_add(1, Ordering::Relaxed);
        } else {
            let ewma = match slice {
                Some((d, at)) if now.duration_since(at) < SLICE_MEMORY => {
                    d.mul_f64(0.7) + took.mul_f64(0.3)
                }
                _ => took,
            };
            slice = Some((ewma, Instant::now()));
        }

        // Deliver, in reverse index order so removals keep the other indices valid.
        let mut steps: Vec<Option<Step>> = match results {
            Ok(steps) => steps.into_iter().map(Some).collect(),
            Err(()) => granted.iter().flatten().map(|_| None).collect(),
        };
        let mut k = steps.len();
        for i in (0..jobs.len()).rev() {
            let Some(_) = granted[i] else {
                jobs[i].skipped += 1;
                continue;
            };
            k -= 1;
            let e = &mut jobs[i];
            e.skipped = 0;
            e.compute += took;
            match steps[k].take() {
                Some(Step::Running) => {
                    if plan.partial == Some(i) {
                        let left = decider.need(&e.job).remaining;
                        let done = needs[i].remaining.saturating_sub(left);
                        if took > Duration::ZERO && done > 0 {
                            e.rate = Some(done as f64 / took.as_secs_f64());
                        }
                    }
                }
                Some(Step::Done(result)) => {
                    let e = jobs.swap_remove(i);
                    finish(&shared, e, answer_of(result));
                }
                None => {
                    let e = jobs.swap_remove(i);
                    finish(&shared, e, Err(ApiError::internal()));
                }
            }
        }
    }
    if let Some((tx, handle)) = lane {
        drop(tx);
        let _ = handle.join();
    }
}

/// Send a finished part's answer (a failure of the model logged here with its cause: the client's 500 names
/// only its request id).
fn finish<J>(shared: &Shared<J>, e: Entry<J>, result: Result<ResponseBody, ApiError>) {
    shared.stats.running.fetch_sub(1, Ordering::Relaxed);
    let queued = e
        .started_at
        .map_or(Duration::ZERO, |s| s.duration_since(e.admitted));
    let reply = result.map(|body| Answered {
        body,
        compute: e.compute,
        queued,
    });
    let _ = e.reply.send((e.part, reply));
}

/// A step's answer as the server sends it.
fn answer_of(
    step: Result<kev_decide::Decision, kev_decide::DecideError>,
) -> Result<ResponseBody, ApiError> {
    step.map(|d| d.response).map_err(|e| {
        tracing::error!(error = %e, "decision failed");
        ApiError::from_wire(&e)
    })
}

/// Drop parts whose clients left, answer 529 to requests waiting past their deadline (if their handler has not
/// already), and drop started requests' parts whose handler is gone (client left, request timeout, or a part
/// failed): counted as cancelled, each part.
fn prune<J>(shared: &Shared<J>, jobs: &mut Vec<Entry<J>>, now: Instant) {
    let stats = &shared.stats;
    let deadline = shared.config.deadline;
    let mut i = 0;
    while i < jobs.len() {
        let e = &jobs[i];
        let phase = e.phase.load(Ordering::SeqCst);
        let gone = e.reply.is_closed();
        let keep = if phase == EXPIRED {
            false // its handler answered 529 and freed the slot
        } else if phase == STARTED {
            // This part or another of its request has run: the slot is free, the deadline past its use.
            if gone {
                stats.cancelled.fetch_add(1, Ordering::Relaxed);
                if e.started_at.is_some() {
                    stats.running.fetch_sub(1, Ordering::Relaxed);
                }
                false
            } else {
                true
            }
        } else {
            let late = now.duration_since(e.admitted) > deadline;
            if (gone || late)
                && e.phase
                    .compare_exchange(WAITING, EXPIRED, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok()
            {
                shared.release_slot();
                if gone {
                    stats.abandoned.fetch_add(1, Ordering::Relaxed);
                } else {
                    stats.expired.fetch_add(1, Ordering::Relaxed);
                    let waited = now.duration_since(e.admitted).as_millis();
                    let e = jobs.swap_remove(i);
                    let _ = e.reply.send((e.part, Err(ApiError::overloaded(waited, 1))));
                    continue;
                }
                false
            } else {
                true
            }
        };
        if keep {
            i += 1;
        } else {
            jobs.swap_remove(i);
        }
    }
}

/// Gauges: the oldest waiting job and the tokens left over all jobs.
fn publish<D: Decider>(shared: &Shared<D::Job>, decider: &D, jobs: &[Entry<D::Job>], away: usize) {
    let oldest = jobs
        .iter()
        .filter(|e| e.phase.load(Ordering::SeqCst) == WAITING)
        .map(|e| e.admitted)
        .min();
    let ms = oldest.map_or(u64::MAX, |t| {
        t.saturating_duration_since(shared.epoch).as_millis() as u64
    });
    shared.stats.oldest_waiting_ms.store(ms, Ordering::Relaxed);
    let tokens: usize = jobs
        .iter()
        .map(|e| {
            if e.started_at.is_some() {
                decider.need(&e.job).remaining
            } else {
                e.tokens
            }
        })
        .sum();
    shared
        .stats
        .inflight_tokens
        .store((tokens + away) as u64, Ordering::Relaxed);
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// The scheduling policy and nice value of a fresh thread after `lower_priority(lane)`.
    fn lowered(lane: LongLane) -> (libc::c_int, libc::c_int) {
        std::thread::spawn(move || {
            lower_priority(lane);
            // SAFETY: queries of the calling thread.
            unsafe {
                (
                    libc::sched_getscheduler(0),
                    libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t),
                )
            }
        })
        .join()
        .unwrap()
    }

    #[test]
    fn the_lane_runs_at_sched_idle_by_default_and_at_nice_10_when_asked() {
        assert_eq!(LongLane::default(), LongLane::On);
        let (policy, nice) = lowered(LongLane::On);
        // SCHED_IDLE, or nice 19 where the OS refuses it.
        assert!(
            policy == libc::SCHED_IDLE || nice == 19,
            "default lane: policy {policy}, nice {nice}"
        );
        let (policy, nice) = lowered(LongLane::Low);
        assert_eq!(policy, libc::SCHED_OTHER, "the low lane left SCHED_OTHER");
        assert_eq!(nice, LOW_LANE_NICE);
    }
}
