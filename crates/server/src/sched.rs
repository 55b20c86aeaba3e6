//! Which requests the next engine pass advances, and by how many tokens: a plain function of what every
//! admitted request has left, unit-tested directly.
//!
//! With the long lane (`ServerConfig::long_lane`, the default) long work never reaches this planner: the
//! queue hands it to the lane one piece at a time and plans short passes from the rest; the partial pieces
//! below are the policy without the lane (`--long-lane off`).
//!
//! The policy (chunked prefill with shortest-remaining-first and aging):
//! - A pass has a token budget (`pass_tokens`). Requests are taken **shortest remaining work first**; each
//!   gets its whole current phase (its state prefix, or all its question rows) while that fits the budget.
//! - A phase that does not fit (a long state, or very many questions) advances by a **partial piece**:
//!   one per pass, and only in a pass that carries no short work, so short requests never wait behind it
//!   for more than one piece. A request once cut stays cut to its end (every later piece sized by time,
//!   the rows after its state too), even when what it has left fits the budget: tokens deep in a long
//!   state cost far more than the budget's count suggests. The decider cuts a state prefix at multiples of 64 tokens, so the answers
//!   stay bit-equal to an uninterrupted run.
//! - A piece is sized by **time**: about as long as the recent short-only passes took (the request's own
//!   measured tokens per second × that time), at least one unit (64 state tokens or one row), at most the
//!   budget; its first piece is one unit (to measure its speed). With no short work seen lately, a piece
//!   takes up to `solo_piece` (fewer, larger passes; and the first short request to arrive waits at most
//!   that long).
//! - **Aging**: a request skipped for `starve_passes` passes in a row goes first in the next pass, whatever
//!   its size (a stream of short requests cannot starve a long one; a long one gets at least one pass in
//!   `starve_passes + 1`).
//! - At most `long_in_flight` requests longer than one pass are started at once (each holds a state's
//!   key/value cache); a further long request waits in the queue, where its deadline still applies.
//!
//! **Priorities** (`x_priority`, capped by the API key's policy): higher first, lower never starved. The rule:
//! - a pass is filled starved requests first (oldest first), then **by priority** (`high`, `normal`, `low`), then
//!   shortest remaining first, then in admission order;
//! - a request is *starved* after `starve_passes` skipped passes in a row (`high`, `normal`), or
//!   [`LOW_AGING`] times as many (`low`): however much higher-priority work arrives, a low request runs within
//!   `LOW_AGING × starve_passes + 1` passes of reaching the head of its class, and every pass serves the
//!   starved first;
//! - while higher-priority work is about ([`Urgency::top`]: waiting now, or served within the last second),
//!   work below it rides a pass only within its share ([`lower_share`]: 1/32 of the token budget), a starved
//!   request excepted; with the long lane on (the default) larger lower work runs there instead, a piece at a
//!   time, paused whenever a short pass runs — so urgent work waits behind no lower work at all; without the
//!   lane it runs alone, in a pass with nothing more urgent in it.

use std::time::Duration;

use crate::{Need, Priority};

/// How many times `starve_passes` a low-priority request may be skipped before it goes first.
pub const LOW_AGING: u32 = 4;

/// The part of a pass's token budget that work below the most urgent priority about may take (1/32).
pub const LOWER_SHARE: usize = 32;

/// The tokens of a pass that work below the most urgent priority about may take: [`LOWER_SHARE`] of the
/// budget (128 of 4,096), at least one.
pub fn lower_share(policy: &Policy) -> usize {
    (policy.pass_tokens.max(1) / LOWER_SHARE).max(1)
}

/// What the planner knows of urgency beyond the candidates: the highest priority served lately.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Urgency {
    /// The highest priority of work waiting or served within the last second (`None`: nothing lately).
    pub recent: Option<Priority>,
}

impl Urgency {
    /// The most urgent priority about: the candidates' highest, or the recent one if higher.
    pub fn top(&self, cands: &[Candidate]) -> Priority {
        cands
            .iter()
            .map(|c| c.priority)
            .chain(self.recent)
            .max()
            .unwrap_or_default()
    }
}

/// One admitted request as the planner sees it.
#[derive(Debug, Clone, Copy)]
pub struct Candidate {
    /// What it has left.
    pub need: Need,
    /// Whether an earlier pass advanced it (it left the queue).
    pub started: bool,
    /// Passes in a row that did not advance it.
    pub skipped: u32,
    /// Admission order.
    pub seq: u64,
    /// Its tokens per second in its last partial piece, if it had one.
    pub rate: Option<f64>,
    /// Its priority (its request's, capped by its key's policy).
    pub priority: Priority,
}

impl Candidate {
    /// Whether it has been skipped long enough to go first: `starve_passes` passes in a row, [`LOW_AGING`]
    /// times as many for low priority.
    pub fn starved(&self, policy: &Policy) -> bool {
        let passes = match self.priority {
            Priority::Low => policy.starve_passes.saturating_mul(LOW_AGING),
            Priority::Normal | Priority::High => policy.starve_passes,
        };
        self.skipped >= passes
    }
}

/// The planner's settings.
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    /// Token budget of one pass.
    pub pass_tokens: usize,
    /// Skipped passes after which a request goes first.
    pub starve_passes: u32,
    /// Most started requests longer than one pass.
    pub long_in_flight: usize,
    /// How long a partial piece may take when no short work was seen lately (bounds the wait of the
    /// first short request to arrive).
    pub solo_piece: Duration,
}

/// The next pass: `(candidate index, token grant)` in candidate order, and which one (if any) got a
/// partial piece.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Grants, sorted by candidate index.
    pub grants: Vec<(usize, usize)>,
    /// The candidate cut into a partial piece.
    pub partial: Option<usize>,
}

/// A partial piece's tokens: about `target` at the candidate's measured rate (one unit while its speed is
/// unknown, which measures it), at most `budget` and its phase, at least one unit.
pub fn timed_grant(c: &Candidate, target: Duration, budget: usize) -> usize {
    let timed = match c.rate {
        Some(rate) => (rate * target.as_secs_f64()) as usize,
        None => c.need.unit,
    };
    timed
        .min(budget.max(c.need.unit))
        .min(c.need.phase)
        .max(c.need.unit)
}

/// Plan one pass. `slice` is the time a partial piece should take (the recent short passes' duration);
/// `None` when no short work was seen lately. Every candidate is taken as equally urgent beyond its own
/// priority ([`plan_urgent`] with nothing recent).
pub fn plan(cands: &[Candidate], policy: &Policy, slice: Option<Duration>) -> Plan {
    plan_urgent(cands, policy, slice, Urgency::default())
}

/// Plan one pass, knowing the priorities served lately (see the module docs).
pub fn plan_urgent(
    cands: &[Candidate],
    policy: &Policy,
    slice: Option<Duration>,
    urgency: Urgency,
) -> Plan {
    let budget0 = policy.pass_tokens.max(1);
    let is_long = |c: &Candidate| c.need.remaining > budget0;
    let starved = |c: &Candidate| c.starved(policy);
    let top = urgency.top(cands);
    // Tokens work below `top` may still take in this pass (starved work is not held to it).
    let mut lower_left = lower_share(policy);
    let mut long_started = cands.iter().filter(|c| c.started && is_long(c)).count();
    let mut order: Vec<usize> = (0..cands.len()).collect();
    order.sort_by_key(|&i| {
        let c = &cands[i];
        if starved(c) {
            (0, std::cmp::Reverse(Priority::High), 0, c.seq)
        } else {
            (1, std::cmp::Reverse(c.priority), c.need.remaining, c.seq)
        }
    });
    let mut budget = budget0;
    let mut out = Plan::default();
    let mut whole_any = false;
    for i in order {
        let c = &cands[i];
        let opens_long = !c.started && is_long(c);
        if opens_long && long_started >= policy.long_in_flight {
            continue;
        }
        // Work below the most urgent priority about: whole phases within its share of the pass, or alone
        // (a pass with nothing more urgent in it).
        let held = c.priority < top && !starved(c);
        if held && !(out.grants.is_empty() || (c.need.phase <= lower_left && c.rate.is_none())) {
            continue;
        }
        // A request already cut into pieces stays cut to its end, even once what is left fits the token
        // budget: its tokens lie deep in a long state, where each costs far more than a short request's
        // (attention over the whole prefix before it, one row with no batch to spread over), so a token
        // count says nothing about its time. Taking the last ~`pass_tokens` of a long state whole was
        // one multi-second pass that every short request arriving meanwhile waited for.
        let granted = if c.need.phase <= budget && c.rate.is_none() {
            out.grants.push((i, c.need.phase));
            budget -= c.need.phase;
            whole_any = true;
            c.need.phase
        } else {
            // A partial piece: one per pass, not beside short work unless this request is starved.
            if out.partial.is_some() || (whole_any && !starved(c)) {
                continue;
            }
            if !out.grants.is_empty() && budget < c.need.unit {
                continue;
            }
            // The piece's time: the recent short passes', or `solo_piece` with none about; a first
            // piece (speed unknown) is one unit, which measures it.
            let grant = timed_grant(c, slice.unwrap_or(policy.solo_piece), budget);
            out.grants.push((i, grant));
            out.partial = Some(i);
            budget = budget.saturating_sub(grant);
            grant
        };
        if held {
            // A request that ran alone past the share leaves nothing below `top` for this pass.
            lower_left = lower_left.saturating_sub(granted);
        }
        if opens_long {
            long_started += 1;
        }
    }
    out.grants.sort_unstable();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(phase: usize, remaining: usize, seq: u64) -> Candidate {
        Candidate {
            need: Need {
                phase,
                unit: phase.min(64),
                remaining,
            },
            started: false,
            skipped: 0,
            seq,
            rate: None,
            priority: Priority::Normal,
        }
    }

    fn at(priority: Priority, phase: usize, seq: u64) -> Candidate {
        Candidate {
            priority,
            ..c(phase, phase, seq)
        }
    }

    const P: Policy = Policy {
        pass_tokens: 1000,
        starve_passes: 3,
        long_in_flight: 1,
        solo_piece: Duration::from_millis(500),
    };

    #[test]
    fn short_work_first_and_whole() {
        let cands = [c(900, 60_000, 0), c(100, 300, 1), c(200, 200, 2)];
        let p = plan(&cands, &P, None);
        // The long state is left out while short work fills the pass.
        assert_eq!(p.grants, vec![(1, 100), (2, 200)]);
        assert_eq!(p.partial, None);
    }

    #[test]
    fn a_long_state_alone_gets_a_timed_piece() {
        let mut long = c(60_000, 60_100, 0);
        long.started = true;
        // Speed unknown: one unit; then up to `solo_piece` (capped by the budget) with no short work about.
        let p = plan(&[long], &P, None);
        assert_eq!(p.grants, vec![(0, 64)]);
        long.rate = Some(10_000.0);
        let p = plan(&[long], &P, None);
        assert_eq!(p.grants, vec![(0, 1000)]);
        long.rate = Some(1_000.0);
        let p = plan(&[long], &P, None);
        assert_eq!(p.grants, vec![(0, 500)]);
        // 10,000 tokens/s × 20 ms = 200 tokens.
        long.rate = Some(10_000.0);
        long.rate = Some(10_000.0);
        let p = plan(&[long], &P, Some(Duration::from_millis(20)));
        assert_eq!(p.grants, vec![(0, 200)]);
        assert_eq!(p.partial, Some(0));
        // Speed unknown while short work is about: one unit too.
        long.rate = None;
        let p = plan(&[long], &P, Some(Duration::from_millis(20)));
        assert_eq!(p.grants, vec![(0, 64)]);
        // Never below one unit.
        long.rate = Some(10.0);
        let p = plan(&[long], &P, Some(Duration::from_millis(20)));
        assert_eq!(p.grants, vec![(0, 64)]);
    }

    #[test]
    fn a_long_state_cut_into_pieces_stays_cut_when_the_rest_fits_the_budget() {
        // Started as a long state, measured at 10,000 tokens/s: its last 900 prefix tokens (and then its
        // question rows) fit the 1,000-token budget but still go in 20 ms pieces, never beside short work.
        let mut long = c(900, 950, 0);
        long.started = true;
        long.rate = Some(10_000.0);
        let slice = Some(Duration::from_millis(20));
        let p = plan(&[long], &P, slice);
        assert_eq!(p.grants, vec![(0, 200)]);
        assert_eq!(p.partial, Some(0));
        let p = plan(&[long, c(100, 100, 1)], &P, slice);
        assert_eq!(p.grants, vec![(1, 100)]);
        let mut rows = c(50, 50, 0);
        rows.started = true;
        rows.rate = Some(10_000.0);
        let p = plan(&[rows], &P, slice);
        assert_eq!(p.grants, vec![(0, 50)]);
        assert_eq!(p.partial, Some(0));
        // A request never cut (no rate) still goes whole when it fits.
        let p = plan(&[c(900, 950, 0)], &P, slice);
        assert_eq!(p.grants, vec![(0, 900)]);
        assert_eq!(p.partial, None);
    }

    #[test]
    fn a_starved_long_state_goes_first_beside_short_work() {
        let mut long = c(60_000, 60_100, 0);
        long.started = true;
        long.skipped = 3;
        long.rate = Some(10_000.0);
        let cands = [long, c(100, 300, 1), c(5000, 5000, 2)];
        let p = plan(&cands, &P, Some(Duration::from_millis(20)));
        assert_eq!(p.grants, vec![(0, 200), (1, 100)]);
        assert_eq!(p.partial, Some(0));
    }

    #[test]
    fn at_most_one_long_request_in_flight() {
        let mut a = c(60_000, 60_100, 0);
        a.started = true;
        a.skipped = 1;
        let b = c(60_000, 60_100, 1);
        let p = plan(&[a, b], &P, None);
        assert_eq!(p.grants, vec![(0, 64)]);
        // A new long request may start when none is in flight; a short one always may.
        let p = plan(&[b, c(10, 10, 2)], &P, None);
        assert_eq!(p.grants, vec![(1, 10)]);
        let p = plan(&[b], &P, None);
        assert_eq!(p.grants, vec![(0, 64)]);
    }

    #[test]
    fn a_row_over_the_budget_runs_alone() {
        let big = Candidate {
            need: Need {
                phase: 3000,
                unit: 3000,
                remaining: 3000,
            },
            ..c(0, 0, 0)
        };
        let p = plan(&[big], &P, None);
        assert_eq!(p.grants, vec![(0, 3000)]);
        // Beside short work it waits (unless starved).
        let p = plan(&[big, c(10, 10, 1)], &P, None);
        assert_eq!(p.grants, vec![(1, 10)]);
    }

    #[test]
    fn skipped_short_requests_age_into_fifo() {
        let mut old = c(600, 600, 0);
        old.skipped = 3;
        let cands = [old, c(500, 500, 1), c(300, 300, 2)];
        let p = plan(&cands, &P, None);
        // The starved one first, then the shortest that still fits.
        assert_eq!(p.grants, vec![(0, 600), (2, 300)]);
    }

    #[test]
    fn higher_priority_first_and_lower_work_within_its_share() {
        use Priority::{High, Low, Normal};
        // Budget 1000: the high request first whatever its size; then lower work only within its share
        // (1000 / 32 = 31 tokens): the 30-token normal fits, the 600-token low does not.
        let cands = [at(Low, 600, 0), at(Normal, 30, 1), at(High, 700, 2)];
        let p = plan(&cands, &P, None);
        assert_eq!(p.grants, vec![(1, 30), (2, 700)]);
        // Nothing more urgent waiting: lows go as usual (shortest first, the pass filled).
        let lows = [at(Low, 400, 0), at(Low, 300, 1), at(Low, 200, 2)];
        assert_eq!(
            plan(&lows, &P, None).grants,
            vec![(0, 400), (1, 300), (2, 200)]
        );
        // But with high work served within the last second, a pass takes lower work within its share, or one
        // request alone: a high request arriving waits behind a short pass.
        let recent = Urgency { recent: Some(High) };
        assert_eq!(plan_urgent(&lows, &P, None, recent).grants, vec![(2, 200)]);
        let small = [at(Low, 20, 0), at(Low, 10, 1), at(Low, 10, 2)];
        assert_eq!(
            plan_urgent(&small, &P, None, recent).grants,
            vec![(1, 10), (2, 10)]
        );
    }

    #[test]
    fn low_priority_ages_slower_but_goes_first_once_starved() {
        use Priority::{High, Low};
        let mut low = at(Low, 600, 0);
        // starve_passes 3: a normal or high request is starved after 3 skipped passes, a low one after 12.
        low.skipped = 3;
        assert!(!low.starved(&P));
        let cands = [low, at(High, 700, 1)];
        assert_eq!(plan(&cands, &P, None).grants, vec![(1, 700)]);
        low.skipped = LOW_AGING * 3;
        assert!(low.starved(&P));
        let cands = [low, at(High, 700, 1)];
        // Starved: first, whatever the priorities about.
        assert_eq!(plan(&cands, &P, None).grants, vec![(0, 600)]);
    }

    #[test]
    fn a_stream_of_high_work_starves_no_low_request() {
        use Priority::{High, Low};
        // Each pass: two fresh high requests of 500 tokens fill the 1000-token budget; one low request waits.
        // It must run within LOW_AGING × starve_passes + 1 passes.
        let mut low = at(Low, 100, 0);
        let mut seq = 1;
        for pass in 0..=(LOW_AGING * P.starve_passes) {
            let cands = [low, at(High, 500, seq), at(High, 500, seq + 1)];
            seq += 2;
            let p = plan(&cands, &P, Some(Duration::from_millis(20)));
            if p.grants.iter().any(|&(i, _)| i == 0) {
                assert_eq!(pass, LOW_AGING * P.starve_passes, "ran early: {p:?}");
                return;
            }
            low.skipped += 1;
        }
        panic!("the low request never ran");
    }
}
