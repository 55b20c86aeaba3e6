//! The counters and gauges the metrics endpoint reads, and the gauges the engine thread sets each round.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::{Entry, Shared, WAITING};
use crate::{Decider, Priority};

/// Counters and gauges the metrics endpoint reads.
#[derive(Default)]
pub struct QueueStats {
    /// Jobs refused because the queue was full.
    pub rejected_full: AtomicU64,
    /// Requests refused before their body was read because every body-read permit was taken.
    pub rejected_bodies: AtomicU64,
    /// Jobs that waited past their deadline (529).
    pub expired: AtomicU64,
    /// Requests whose own deadline (`x_deadline_ms`) passed while they waited: answered 408, never run.
    pub deadline_expired: AtomicU64,
    /// Requests waiting (not started), by priority (low, normal, high), as of the last pass.
    pub waiting_by_priority: [AtomicUsize; 3],
    /// Waiting jobs dropped because their client left.
    pub abandoned: AtomicU64,
    /// Started jobs stopped between passes (client gone or request timeout).
    pub cancelled: AtomicU64,
    /// Engine passes run.
    pub passes: AtomicU64,
    /// Partial pieces run (long work cut between other requests' passes).
    pub partial_pieces: AtomicU64,
    /// Times short passes stepped aside for the long lane's share ([`crate::share`]).
    pub lane_holds: AtomicU64,
    /// Milliseconds short passes stepped aside for it.
    pub lane_held_ms: AtomicU64,
    /// Jobs started and not finished.
    pub running: AtomicUsize,
    /// Tokens left over every admitted job (waiting and started), as of the last pass.
    pub inflight_tokens: AtomicU64,
    /// When the oldest waiting job was admitted, in ms since the queue started (`u64::MAX`: none).
    pub(super) oldest_waiting_ms: AtomicU64,
}

/// Gauges: the oldest waiting job and the tokens left over all jobs.
pub(super) fn publish<D: Decider>(
    shared: &Shared<D::Job>,
    decider: &D,
    jobs: &[Entry<D::Job>],
    away: usize,
) {
    let waiting = || {
        jobs.iter()
            .filter(|e| e.phase.load(Ordering::SeqCst) == WAITING)
    };
    let oldest = waiting().map(|e| e.admitted).min();
    for (p, gauge) in Priority::ALL.iter().zip(&shared.stats.waiting_by_priority) {
        gauge.store(
            waiting().filter(|e| e.how.priority == *p).count(),
            Ordering::Relaxed,
        );
    }
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
