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
//!
//! Here: the state the handlers and the engine thread share. The handlers' side is `admission` ([`Queue`]),
//! the engine thread's rounds `engine`, the long lane `lane`, the counters and gauges `stats`.

mod admission;
mod engine;
mod lane;
mod stats;

pub use admission::{Queue, SHUTDOWN_WAIT, Slot, Ticket};
pub use stats::QueueStats;

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use kev_contract::ResponseBody;
use tokio::sync::mpsc;

use crate::Step;
use crate::error::ApiError;
use crate::sched::Policy;
use crate::urgency::Submit;

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
    /// Of `compute`, the time its answers took to read out (the pointer head, shaping the answers).
    pub head: Duration,
    /// When its first pass started (`None`: it never waited for one).
    pub started: Option<Instant>,
    /// The passes that advanced it, recorded only for a traced request ([`Submit::span`]).
    pub passes: Vec<PassRecord>,
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
    /// Where long work's pieces run: on a lane of their own beside the short passes (see
    /// [`lane_loop`](lane::lane_loop)), or in turns with short passes on the one engine thread.
    pub long_lane: LongLane,
    /// The lane's share of a machine saturated with short requests ([`crate::share`]).
    pub long_lane_share: f64,
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
    /// Its request's priority and deadline, and the span its passes are traced under.
    how: Arc<Submit>,
    /// The passes it rode, when its request is traced.
    passes: Vec<PassRecord>,
}

impl<J> Entry<J> {
    /// Note a pass that advanced it (traced requests only).
    fn rode(&mut self, pass: PassRecord) {
        if self.how.span.is_some() && self.passes.len() < TRACED_PASSES {
            self.passes.push(pass);
        }
    }
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
    /// When the piece started.
    started: Instant,
    /// The tokens granted.
    tokens: usize,
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
    /// The drain deadline passed: every request still here is answered 503 now (`Queue::abort`).
    aborted: AtomicBool,
    abort: tokio::sync::Notify,
    epoch: Instant,
    config: QueueConfig,
}

impl<J> Shared<J> {
    fn release_slot(&self) {
        self.waiting.fetch_sub(1, Ordering::SeqCst);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic on the engine thread must not wedge the HTTP side: keep using the state.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One engine pass a traced request rode.
#[derive(Debug, Clone, Copy)]
pub struct PassRecord {
    /// When it started.
    pub start: Instant,
    /// How long it took.
    pub took: Duration,
    /// Tokens of this request it ran.
    pub tokens: usize,
    /// Requests (parts) it advanced together.
    pub batch: usize,
    /// Whether it ran on the long lane.
    pub lane: bool,
}

/// The most passes recorded for one traced part (a long state takes hundreds of pieces; its trace keeps the
/// first ones).
pub(crate) const TRACED_PASSES: usize = 256;
