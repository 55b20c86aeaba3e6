//! The long lane's share of a machine saturated with short requests (`--long-lane-share`, default a fifth).
//!
//! The lane runs long work at the lowest OS priority and pauses at the engine's safe points while a short
//! pass runs, so under a stream of short requests it would get almost nothing. The engine thread keeps an
//! account instead, while a long piece is out on the lane: each short pass puts `took × share / (1 − share)`
//! of lane time owed, and each stretch without a short pass (when the lane runs) pays it back. Once a
//! [`QUANTUM`] is owed, short passes step aside (no new one starts) until the lane has had it. So long work
//! gets at least `share` of the machine's time under saturation, in turns of about a quantum (a short
//! request waits at most about one), and a long request's wait is bounded by its solo time over the share,
//! plus the queue ahead of it. Where short requests leave gaps the lane runs in them and nothing is held;
//! without long work nothing is owed. A hold is the owed time, whatever the lane does with it: a lane kept
//! from its cores by the host's other work does not hold short requests longer.

use std::time::{Duration, Instant};

/// The default share (about what long work got before the share was a setting).
pub const DEFAULT_SHARE: f64 = 0.2;

/// Lane time owed before short passes step aside; also about the longest they step aside at once.
pub const QUANTUM: Duration = Duration::from_millis(250);

/// The most lane time owed at once (one very long short pass cannot hold short requests longer).
const MOST_OWED: Duration = Duration::from_secs(2);

/// The narrowest and widest shares accepted.
pub const SHARE_RANGE: (f64, f64) = (0.05, 0.9);

/// The account of the lane's time.
#[derive(Debug, Clone)]
pub struct LaneShare {
    share: f64,
    /// Owed as of `since`.
    owed: Duration,
    /// When the last short pass ended (the lane has run since), if none runs now.
    since: Option<Instant>,
    /// Since when short passes have been stepping aside.
    holding: Option<Instant>,
    /// Time short passes stepped aside, and how often (for `/metrics`).
    held: Duration,
    holds: u64,
}

impl LaneShare {
    /// An account for `share` (clamped to [`SHARE_RANGE`]).
    pub fn new(share: f64) -> Self {
        let share = if share.is_finite() {
            share.clamp(SHARE_RANGE.0, SHARE_RANGE.1)
        } else {
            DEFAULT_SHARE
        };
        LaneShare {
            share,
            owed: Duration::ZERO,
            since: None,
            holding: None,
            held: Duration::ZERO,
            holds: 0,
        }
    }

    /// The share.
    pub fn share(&self) -> f64 {
        self.share
    }

    /// What is owed at `now`: what short passes put in, less the lane's time since the last one.
    fn owed_at(&self, now: Instant) -> Duration {
        let ran = self
            .since
            .map_or(Duration::ZERO, |t| now.saturating_duration_since(t));
        self.owed.saturating_sub(ran)
    }

    /// A short pass starts at `now`.
    pub fn short_starts(&mut self, now: Instant) {
        self.owed = self.owed_at(now);
        self.since = None;
    }

    /// A short pass of `took` ended at `now`; `lane_busy`: a long piece is out on the lane.
    pub fn short_ended(&mut self, now: Instant, took: Duration, lane_busy: bool) {
        if lane_busy {
            let owed = self.owed + took.mul_f64(self.share / (1.0 - self.share));
            self.owed = owed.min(MOST_OWED);
        } else {
            self.owed = Duration::ZERO;
        }
        self.since = Some(now);
    }

    /// Whether short passes step aside now; `lane_busy`: a long piece is out on the lane.
    pub fn hold(&mut self, now: Instant, lane_busy: bool) -> bool {
        let owed = if lane_busy {
            self.owed_at(now)
        } else {
            Duration::ZERO
        };
        if let Some(since) = self.holding {
            if !owed.is_zero() {
                return true;
            }
            self.holding = None;
            self.held += now.saturating_duration_since(since);
            return false;
        }
        if owed >= QUANTUM {
            self.holding = Some(now);
            self.holds += 1;
            return true;
        }
        false
    }

    /// When the current hold ends, if short passes are stepping aside.
    pub fn holding_until(&self) -> Option<Instant> {
        self.holding?;
        Some(self.since? + self.owed)
    }

    /// Time short passes have stepped aside for the lane, and how many times.
    pub fn held(&self) -> (Duration, u64) {
        (self.held, self.holds)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Short passes of `pass` with `gap` between them for `total` beside a lane that always has work: the
    /// fraction of the time the lane had (the gaps and the holds).
    fn lane_fraction(share: f64, pass: Duration, gap: Duration, total: Duration) -> f64 {
        let mut s = LaneShare::new(share);
        let t0 = Instant::now();
        let mut now = t0;
        s.short_ended(now, Duration::ZERO, true);
        let (mut short, mut lane) = (Duration::ZERO, Duration::ZERO);
        while now - t0 < total {
            if s.hold(now, true) {
                let until = s.holding_until().unwrap();
                lane += until - now;
                now = until;
                continue;
            }
            s.short_starts(now);
            short += pass;
            now += pass;
            s.short_ended(now, pass, true);
            lane += gap;
            now += gap;
        }
        lane.as_secs_f64() / (lane + short).as_secs_f64()
    }

    #[test]
    fn the_lane_gets_its_share_of_a_saturated_machine() {
        for share in [0.1, 0.2, 0.5] {
            for pass in [Duration::from_millis(3), Duration::from_millis(40)] {
                let got = lane_fraction(share, pass, Duration::ZERO, Duration::from_secs(60));
                assert!(
                    (got - share).abs() < 0.02,
                    "share {share}, passes of {pass:?}: the lane got {got:.3}"
                );
            }
        }
    }

    #[test]
    fn gaps_between_short_passes_pay_the_lane_and_nothing_is_held() {
        // 10 ms passes with 5 ms gaps: the lane has a third of the time already, more than its fifth.
        let mut s = LaneShare::new(0.2);
        let t0 = Instant::now();
        let mut now = t0;
        for _ in 0..1000 {
            assert!(!s.hold(now, true), "held at {:?}", now - t0);
            s.short_starts(now);
            now += Duration::from_millis(10);
            s.short_ended(now, Duration::from_millis(10), true);
            now += Duration::from_millis(5);
        }
        assert_eq!(s.held(), (Duration::ZERO, 0));
        // 10 ms gaps after 10 ms passes at share 0.5: still never owed a quantum.
        assert!(
            lane_fraction(
                0.5,
                Duration::from_millis(10),
                Duration::from_millis(10),
                Duration::from_secs(10)
            ) >= 0.5
        );
    }

    #[test]
    fn holds_are_about_a_quantum_and_nothing_is_owed_without_long_work() {
        let mut s = LaneShare::new(0.2);
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        // Short passes with nothing on the lane owe nothing.
        for _ in 0..100 {
            s.short_starts(t0);
            s.short_ended(t0, ms(50), false);
        }
        assert!(!s.hold(t0, true));
        // With a piece out, 1 s of short passes back to back owes 250 ms: the next short pass waits that long.
        for _ in 0..20 {
            s.short_starts(t0);
            s.short_ended(t0, ms(50), true);
        }
        assert!(s.hold(t0, true));
        assert_eq!(s.holding_until(), Some(t0 + ms(250)));
        assert!(s.hold(t0 + ms(200), true));
        assert!(!s.hold(t0 + ms(260), true));
        assert_eq!(s.held(), (ms(260), 1));
        // Long work gone: a hold ends at once.
        s.short_starts(t0 + ms(260));
        for _ in 0..20 {
            s.short_ended(t0 + ms(260), ms(50), true);
            s.short_starts(t0 + ms(260));
        }
        s.short_ended(t0 + ms(260), ms(50), true);
        assert!(s.hold(t0 + ms(260), true));
        assert!(!s.hold(t0 + ms(270), false));
        // One enormous pass owes at most MOST_OWED.
        s.short_starts(t0 + ms(300));
        s.short_ended(t0 + ms(300), Duration::from_secs(60), true);
        assert!(s.hold(t0 + ms(300), true));
        assert_eq!(s.holding_until(), Some(t0 + ms(300) + MOST_OWED));
    }

    #[test]
    fn a_share_out_of_range_is_clamped() {
        assert_eq!(LaneShare::new(0.0).share(), SHARE_RANGE.0);
        assert_eq!(LaneShare::new(1.0).share(), SHARE_RANGE.1);
        assert_eq!(LaneShare::new(f64::NAN).share(), DEFAULT_SHARE);
    }
}
