//! The engine thread: between passes it takes in new requests and the lane's returned pieces, drops what is
//! gone or expired, and asks the scheduler for the next pass; then it runs the pass and delivers its steps.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use kev_contract::ResponseBody;
use kev_decide::Lane;

use super::lane::{self, ToLane, lane_pick, lane_work};
use super::stats::publish;
use super::{Answered, EXPIRED, Entry, LongLane, Returned, STARTED, Shared, WAITING, lock};
use crate::error::ApiError;
use crate::queue::PassRecord;
use crate::sched::{self, Candidate, Plan, Policy, Urgency};
use crate::share::LaneShare;
use crate::urgency::Recent;
use crate::{Decider, Need, Priority, Step};

/// Short-only passes older than this no longer set the time of a partial piece.
const SLICE_MEMORY: Duration = Duration::from_secs(2);

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
            priority: e.how.priority,
        })
        .collect();
    (needs, cands)
}

/// The engine thread's state from one round to the next.
struct Engine<D: Decider> {
    decider: Arc<D>,
    shared: Arc<Shared<D::Job>>,
    policy: Policy,
    jobs: Vec<Entry<D::Job>>,
    /// EWMA of short-only pass durations, and when one last ran.
    slice: Option<(Duration, Instant)>,
    lane: Option<ToLane<D::Job>>,
    /// The job on the lane: the tokens it will have left after its piece (for the gauge), and how long the
    /// short passes since it went out have kept it paused (not its own time: its speed is measured without).
    away: Option<usize>,
    paused: Duration,
    /// The lane's share of the machine: when short passes step aside for it.
    share: LaneShare,
    /// The last round could run nothing (only long work, the lane busy): wait for news.
    blocked: bool,
    /// The priorities seen lately, for the planner's share rule (`sched::Urgency`).
    recent: Recent,
}

/// A foreground pass as it ran: its steps (`Err`: a panic, or the wrong number of steps), when it started,
/// and how long it took.
struct Pass {
    results: Result<Vec<Step>, ()>,
    started: Instant,
    took: Duration,
}

pub(super) fn engine_loop<D: Decider>(decider: Arc<D>, shared: Arc<Shared<D::Job>>) {
    let policy = shared.config.policy;
    let lane = (shared.config.long_lane != LongLane::Off)
        .then(|| lane::spawn(Arc::clone(&decider), Arc::clone(&shared)));
    let share = LaneShare::new(shared.config.long_lane_share);
    Engine {
        decider,
        shared,
        policy,
        jobs: Vec::new(),
        slice: None,
        lane,
        away: None,
        paused: Duration::ZERO,
        share,
        blocked: false,
        recent: Recent::default(),
    }
    .run();
}

impl<D: Decider> Engine<D> {
    /// Rounds until stopped with nothing left here or on the lane, or aborted; then the lane is stopped.
    fn run(mut self) {
        loop {
            let returned = self.wait_for_news();
            self.blocked = false;
            if self.shared.aborted.load(Ordering::SeqCst) {
                self.drop_aborted();
                break;
            }
            self.take_back(returned);
            if self.jobs.is_empty() {
                if self.away.is_none() && self.shared.stopped.load(Ordering::SeqCst) {
                    break;
                }
                continue;
            }
            let now = Instant::now();
            prune(&self.shared, &mut self.jobs, now);
            publish(
                &self.shared,
                &*self.decider,
                &self.jobs,
                self.away.unwrap_or(0),
            );
            if self.jobs.is_empty() {
                continue;
            }

            let (mut needs, mut cands) = candidates(&*self.decider, &self.jobs);
            // The server's own decisions (a canary at high priority) do not make users' work "lower".
            let about = self
                .jobs
                .iter()
                .filter(|e| !e.how.internal)
                .map(|e| e.how.priority);
            let urgency = self.recent.see(about, now);
            let top = urgency.top(&cands);
            if self.send_to_lane(&cands, top, now) {
                (needs, cands) = candidates(&*self.decider, &self.jobs);
            }
            let plan = self.plan(&cands, top, urgency, now);
            let lane_starved = self.hold_for_lane(now);
            let granted = self.grant(&plan, lane_starved, now);
            if granted.iter().all(Option::is_none) {
                // Nothing could run (only long work with the lane busy, or everything planned expired
                // meanwhile): wait for news, then prune and plan again.
                self.blocked = true;
                continue;
            }

            let pass = self.run_pass(&granted);
            self.record_pass(&plan, &pass, now);
            self.deliver(pass, &granted, &plan, &needs);
        }
        self.stop_lane();
    }

    /// Wait until there is something to do (new requests, pieces back from the lane, jobs to plan, a stop or
    /// an abort); take in the new requests and return the lane's pieces.
    fn wait_for_news(&mut self) -> Vec<Returned<D::Job>> {
        let mut inbox = lock(&self.shared.inbox);
        // Plan again at the end of a hold at the latest.
        let nap = self
            .share
            .holding_until()
            .map_or(Duration::from_millis(100), |t| {
                t.saturating_duration_since(Instant::now())
                    .clamp(Duration::from_millis(1), Duration::from_millis(100))
            });
        loop {
            let news = !inbox.jobs.is_empty() || !inbox.returned.is_empty();
            let stopped = self.shared.stopped.load(Ordering::SeqCst);
            if self.shared.aborted.load(Ordering::SeqCst)
                || news
                || (!self.jobs.is_empty() && !self.blocked)
                || (stopped && self.jobs.is_empty() && self.away.is_none())
            {
                break;
            }
            let (guard, wait) = self
                .shared
                .wake
                .wait_timeout(inbox, nap)
                .unwrap_or_else(|p| p.into_inner());
            inbox = guard;
            if wait.timed_out() && self.blocked {
                break; // plan again: prune what expired meanwhile
            }
        }
        self.jobs.append(&mut inbox.jobs);
        std::mem::take(&mut inbox.returned)
    }

    /// Their handlers have answered 503 (`Queue::answer`): nothing left here runs.
    fn drop_aborted(&mut self) {
        self.shared
            .stats
            .cancelled
            .fetch_add(self.jobs.len() as u64, Ordering::Relaxed);
        self.jobs.clear();
    }

    /// Take back the pieces the lane ran: jobs still running rejoin the others, finished ones are answered.
    fn take_back(&mut self, returned: Vec<Returned<D::Job>>) {
        let stats = &self.shared.stats;
        for r in returned {
            self.away = None;
            let mut e = r.entry;
            e.compute += r.took;
            e.skipped = 0;
            e.rode(PassRecord {
                start: r.started,
                took: r.took,
                tokens: r.tokens,
                batch: 1,
                lane: true,
            });
            stats.passes.fetch_add(1, Ordering::Relaxed);
            stats.partial_pieces.fetch_add(1, Ordering::Relaxed);
            match r.step {
                Some(Step::Running) => {
                    let done = r.before.saturating_sub(self.decider.need(&e.job).remaining);
                    // Its speed over the time it ran, not the time short passes kept it paused: measured
                    // with the pauses, a piece under saturating short work looked ever slower, the next
                    // one was cut ever smaller, and long work crawled (a 15,000-word state took 138 s).
                    let ran = r.took.saturating_sub(self.paused).max(r.took / 10);
                    if ran > Duration::ZERO && done > 0 {
                        e.rate = Some(done as f64 / ran.as_secs_f64());
                    }
                    self.jobs.push(e);
                }
                Some(Step::Done(result)) => finish(&self.shared, e, answer_of(result)),
                None => finish(&self.shared, e, Err(ApiError::internal())),
            }
        }
    }

    /// Send the lane its next piece if it is free and has work ([`lane_pick`]); `true` if one went (the
    /// candidates are then out of date).
    fn send_to_lane(&mut self, cands: &[Candidate], top: Priority, now: Instant) -> bool {
        if let Some((tx, _)) = &self.lane
            && self.away.is_none()
            && let Some((i, tokens)) = lane_pick(cands, &self.policy, top)
            && start_part(&self.shared, &mut self.jobs[i], now)
        {
            let e = self.jobs.swap_remove(i);
            self.away = Some(cands[i].need.remaining.saturating_sub(tokens));
            self.paused = Duration::ZERO;
            tracing::debug!(seq = e.seq, tokens, "long piece to the lane");
            if let Err(std::sync::mpsc::SendError((e, _))) = tx.send((e, tokens)) {
                self.away = None;
                finish(&self.shared, e, Err(ApiError::internal()));
            }
            return true;
        }
        false
    }

    /// The scheduler's plan for the next pass.
    fn plan(&self, cands: &[Candidate], top: Priority, urgency: Urgency, now: Instant) -> Plan {
        let policy = self.policy;
        let target = self
            .slice
            .filter(|(_, at)| now.duration_since(*at) < SLICE_MEMORY)
            .map(|(d, _)| d);
        // With the lane, this pass takes short work only: long work waits for its turn there.
        if self.lane.is_some() {
            let short: Vec<usize> = (0..cands.len())
                .filter(|&i| !lane_work(&cands[i], &policy, top))
                .collect();
            let sub: Vec<Candidate> = short.iter().map(|&i| cands[i]).collect();
            let p = sched::plan_urgent(&sub, &policy, target, urgency);
            let mut grants: Vec<(usize, usize)> =
                p.grants.iter().map(|&(k, t)| (short[k], t)).collect();
            grants.sort_unstable();
            Plan {
                grants,
                partial: p.partial.map(|k| short[k]),
            }
        } else {
            sched::plan_urgent(cands, &policy, target, urgency)
        }
    }

    /// The lane's share: short passes step aside while the lane has the time it is owed (`true`: this round).
    fn hold_for_lane(&mut self, now: Instant) -> bool {
        let stats = &self.shared.stats;
        let lane_starved = self.lane.is_some() && self.share.hold(now, self.away.is_some());
        let (held, holds) = self.share.held();
        stats.lane_holds.store(holds, Ordering::Relaxed);
        stats
            .lane_held_ms
            .store(held.as_millis() as u64, Ordering::Relaxed);
        lane_starved
    }

    /// Each job's grant in this pass (`None`: it does not run), starting the parts that get their first.
    fn grant(&mut self, plan: &Plan, lane_starved: bool, now: Instant) -> Vec<Option<usize>> {
        let mut granted: Vec<Option<usize>> = vec![None; self.jobs.len()];
        for &(i, tokens) in plan.grants.iter().filter(|_| !lane_starved) {
            if start_part(&self.shared, &mut self.jobs[i], now) {
                granted[i] = Some(tokens);
            }
        }
        granted
    }

    /// Run the pass over the granted jobs, a panic in the decider caught.
    fn run_pass(&mut self, granted: &[Option<usize>]) -> Pass {
        let started = Instant::now();
        self.share.short_starts(started);
        let results = {
            let mut grants: Vec<(&mut D::Job, usize)> = self
                .jobs
                .iter_mut()
                .zip(granted)
                .filter_map(|(e, g)| g.map(|t| (&mut e.job, t)))
                .collect();
            let n = grants.len();
            // A foreground pass: lane passes step aside while it runs.
            let pass = || self.decider.pass(&mut grants, Lane::Foreground);
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
        if self.away.is_some() {
            self.paused += took;
        }
        self.share
            .short_ended(Instant::now(), took, self.away.is_some());
        Pass {
            results,
            started,
            took,
        }
    }

    /// Log and count the pass, and fold a short-only pass's time into the slice.
    fn record_pass(&mut self, plan: &Plan, pass: &Pass, now: Instant) {
        let (took, jobs, stats) = (pass.took, &self.jobs, &self.shared.stats);
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
            let ewma = match self.slice {
                Some((d, at)) if now.duration_since(at) < SLICE_MEMORY => {
                    d.mul_f64(0.7) + took.mul_f64(0.3)
                }
                _ => took,
            };
            self.slice = Some((ewma, Instant::now()));
        }
    }

    /// Deliver the pass's steps, in reverse index order so removals keep the other indices valid.
    fn deliver(&mut self, pass: Pass, granted: &[Option<usize>], plan: &Plan, needs: &[Need]) {
        let Pass {
            results,
            started,
            took,
        } = pass;
        let mut steps: Vec<Option<Step>> = match results {
            Ok(steps) => steps.into_iter().map(Some).collect(),
            Err(()) => granted.iter().flatten().map(|_| None).collect(),
        };
        let mut k = steps.len();
        for i in (0..self.jobs.len()).rev() {
            let Some(_) = granted[i] else {
                self.jobs[i].skipped += 1;
                continue;
            };
            k -= 1;
            let e = &mut self.jobs[i];
            e.skipped = 0;
            e.compute += took;
            e.rode(PassRecord {
                start: started,
                took,
                tokens: granted[i].unwrap_or(0),
                batch: plan.grants.len(),
                lane: false,
            });
            match steps[k].take() {
                Some(Step::Running) => {
                    if plan.partial == Some(i) {
                        let left = self.decider.need(&e.job).remaining;
                        let done = needs[i].remaining.saturating_sub(left);
                        if took > Duration::ZERO && done > 0 {
                            e.rate = Some(done as f64 / took.as_secs_f64());
                        }
                    }
                }
                Some(Step::Done(result)) => {
                    let e = self.jobs.swap_remove(i);
                    finish(&self.shared, e, answer_of(result));
                }
                None => {
                    let e = self.jobs.swap_remove(i);
                    finish(&self.shared, e, Err(ApiError::internal()));
                }
            }
        }
    }

    /// Close the lane and wait for its thread to end.
    fn stop_lane(self) {
        if let Some((tx, handle)) = self.lane {
            drop(tx);
            // Aborted, the lane's piece in flight is not waited for.
            if !self.shared.aborted.load(Ordering::SeqCst) {
                let _ = handle.join();
            }
        }
    }
}

/// Send a finished part's answer (a failure of the model logged here with its cause: the client's 500 names
/// only its request id).
fn finish<J>(shared: &Shared<J>, e: Entry<J>, result: Result<(ResponseBody, Duration), ApiError>) {
    shared.stats.running.fetch_sub(1, Ordering::Relaxed);
    let queued = e
        .started_at
        .map_or(Duration::ZERO, |s| s.duration_since(e.admitted));
    let (compute, started, passes) = (e.compute, e.started_at, e.passes);
    let reply = result.map(|(body, head)| Answered {
        body,
        compute,
        queued,
        head,
        started,
        passes,
    });
    let _ = e.reply.send((e.part, reply));
}

/// A step's answer as the server sends it, with the time its readout took.
fn answer_of(
    step: Result<kev_decide::Decision, kev_decide::DecideError>,
) -> Result<(ResponseBody, Duration), ApiError> {
    step.map(|d| (d.response, d.readout)).map_err(|e| {
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
        } else if let Some(d) = e.how.deadline.filter(|d| now >= d.at)
            && e.phase
                .compare_exchange(WAITING, EXPIRED, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        {
            // Its own deadline passed while it waited: answered 408 (unless its handler already did), never
            // run.
            shared.release_slot();
            stats.deadline_expired.fetch_add(1, Ordering::Relaxed);
            let e = jobs.swap_remove(i);
            let _ = e
                .reply
                .send((e.part, Err(ApiError::deadline_passed(d.ms, false))));
            continue;
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
