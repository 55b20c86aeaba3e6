//! The long lane: the thread that runs pieces of long work beside the engine thread's short passes, and
//! which work the engine sends it.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kev_decide::Lane;

use super::{Entry, LongLane, Returned, Shared, lock};
use crate::sched::{self, Candidate, Policy};
use crate::{Decider, Priority};

/// The longest a lane piece is planned to take: the lane runs beside short passes, so nobody waits for
/// it, but a shorter piece returns the job to the planner sooner (a hang-up stops it, a second long
/// request takes its turn).
const LANE_PIECE: Duration = Duration::from_millis(250);

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
            started: t,
            tokens,
            before,
        });
        shared.wake.notify_all();
    }
}

/// The long lane's end on the engine thread: where its pieces go, and its thread.
pub(super) type ToLane<J> = (std::sync::mpsc::Sender<(Entry<J>, usize)>, JoinHandle<()>);

/// Start the lane's thread ([`lane_loop`]).
pub(super) fn spawn<D: Decider>(decider: Arc<D>, shared: Arc<Shared<D::Job>>) -> ToLane<D::Job> {
    let (tx, rx) = std::sync::mpsc::channel();
    let handle = std::thread::Builder::new()
        .name("kev-long".into())
        .spawn(move || lane_loop(decider, shared, rx))
        .expect("spawning the long lane");
    (tx, handle)
}

/// Whether a candidate is long work: already cut into pieces, or a phase larger than a whole pass.
fn is_long_work(c: &Candidate, policy: &Policy) -> bool {
    c.rate.is_some() || c.need.phase > policy.pass_tokens.max(1)
}

/// Whether a candidate runs on the lane: long work, or — while more urgent work is about (`top`) — work of a
/// lower priority larger than its share of a short pass (`sched::lower_share`): the lane pauses while a
/// short pass runs, so urgent requests never wait for it, and it keeps moving (at the lane's priority).
pub(super) fn lane_work(c: &Candidate, policy: &Policy, top: Priority) -> bool {
    is_long_work(c, policy) || (c.priority < top && c.need.phase > sched::lower_share(policy))
}

/// The lane work the lane takes next and its grant: the one skipped most (so two long requests take
/// turns), then the most urgent, then the oldest; a request not yet started only while fewer than
/// `long_in_flight` long ones are. Its first piece is one unit (its speed unknown), later ones about
/// [`LANE_PIECE`].
pub(super) fn lane_pick(
    cands: &[Candidate],
    policy: &Policy,
    top: Priority,
) -> Option<(usize, usize)> {
    let budget = policy.pass_tokens.max(1);
    let long_started = cands
        .iter()
        .filter(|c| c.started && c.need.remaining > budget)
        .count();
    let i = (0..cands.len())
        .filter(|&i| {
            let c = &cands[i];
            lane_work(c, policy, top) && (c.started || long_started < policy.long_in_flight)
        })
        .min_by_key(|&i| {
            let c = &cands[i];
            (
                std::cmp::Reverse(c.skipped),
                std::cmp::Reverse(c.priority),
                c.seq,
            )
        })?;
    let target = policy.solo_piece.min(LANE_PIECE);
    Some((i, sched::timed_grant(&cands[i], target, budget)))
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
