//! Where a forward pass's wall time goes, by kind of work.
//!
//! A forward runs its steps one after another (each spread over the cores), so the wall time between two
//! steps is that step's time, and the stages add up to the whole forward (a background forward's pauses
//! for foreground work count in the stage they interrupt). [`crate::Backbone::forward_timed`]
//! fills a [`StageTimes`]; `kev bench backbone` reports it per arm. It is what bounds one arm against another:
//! the projections are the only stage whose arithmetic the compute arms change (the mixers, norms and the rest
//! are f32 in every arm), so an arm whose projections took no time at all would still take the other stages'
//! time — on CPUs whose float projections are already fast (AMX tiles) that, not the int8 GEMM, caps the int8
//! arm's gain.

use std::time::Instant;

/// A kind of work in a forward pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// The weight products (GEMMs) with what they fuse: the int8 arm's activation quantisation and
    /// dequantisation, the islands' float products, the unmerged LoRA updates.
    Projections,
    /// The Gated DeltaNet mixers: causal conv, q/k norms, gates, the chunked recurrence.
    Gdn,
    /// The gated attention mixers: q/k norms, rotary embeddings, the causal softmax products, the gate.
    Attention,
    /// The RMSNorms before each mixer and MLP, and the final norm.
    Norms,
    /// The rest: embeddings, SwiGLU, residual adds, buffers and copies.
    Other,
}

impl Stage {
    /// Every stage, in the order reports list them.
    pub const ALL: [Stage; 5] = [
        Stage::Projections,
        Stage::Gdn,
        Stage::Attention,
        Stage::Norms,
        Stage::Other,
    ];

    /// Its name in reports (`projections`, `gdn`, `attention`, `norms`, `other`).
    pub fn name(self) -> &'static str {
        match self {
            Stage::Projections => "projections",
            Stage::Gdn => "gdn",
            Stage::Attention => "attention",
            Stage::Norms => "norms",
            Stage::Other => "other",
        }
    }
}

/// Seconds of wall time per [`Stage`], summed over the forward passes that filled it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StageTimes {
    secs: [f64; 5],
}

impl StageTimes {
    /// Seconds spent in `stage`.
    pub fn get(&self, stage: Stage) -> f64 {
        self.secs[stage as usize]
    }

    /// Every stage's seconds together.
    pub fn total(&self) -> f64 {
        self.secs.iter().sum()
    }

    /// Seconds outside the projections: what every compute arm spends alike.
    pub fn outside_projections(&self) -> f64 {
        self.total() - self.get(Stage::Projections)
    }

    /// `stage`'s share of the total (0 when nothing was timed).
    pub fn share(&self, stage: Stage) -> f64 {
        let t = self.total();
        if t > 0.0 { self.get(stage) / t } else { 0.0 }
    }

    /// Add `other`'s seconds to these.
    pub fn add(&mut self, other: &StageTimes) {
        for (a, b) in self.secs.iter_mut().zip(other.secs) {
            *a += b;
        }
    }

    /// These seconds divided by `n` (the mean of `n` passes summed here).
    pub fn mean_of(&self, n: usize) -> StageTimes {
        let k = 1.0 / n.max(1) as f64;
        StageTimes {
            secs: self.secs.map(|s| s * k),
        }
    }
}

/// Attributes the wall time since its last mark to the stage that just ended; does nothing when off, so
/// the untimed forward pays for no clock reads. Marked through a shared reference: a pass's steps mark it
/// one after another from the thread that runs the pass.
pub(crate) struct Clock {
    /// The times so far and the last mark, when on.
    on: Option<std::cell::RefCell<(StageTimes, Instant)>>,
}

impl Clock {
    /// A clock that times, or one that does nothing.
    pub(crate) fn new(on: bool) -> Self {
        Clock {
            on: on.then(|| std::cell::RefCell::new((StageTimes::default(), Instant::now()))),
        }
    }

    /// The time since the last mark was spent in `stage`.
    pub(crate) fn mark(&self, stage: Stage) {
        if let Some(on) = &self.on {
            let (t, last) = &mut *on.borrow_mut();
            let now = Instant::now();
            t.secs[stage as usize] += now.duration_since(*last).as_secs_f64();
            *last = now;
        }
    }

    /// What it timed (nothing when off).
    pub(crate) fn times(self) -> StageTimes {
        self.on.map(|c| c.into_inner().0).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clock_gives_each_stage_the_time_since_the_last_mark() {
        let ms = |n| std::thread::sleep(std::time::Duration::from_millis(n));
        let c = Clock::new(true);
        ms(200);
        c.mark(Stage::Gdn);
        ms(10);
        c.mark(Stage::Norms);
        c.mark(Stage::Projections);
        let t = c.times();
        assert!(t.get(Stage::Gdn) >= 0.2, "{t:?}");
        // The norms had their 10 ms, not the GDN's 200 ms too.
        assert!((0.010..0.2).contains(&t.get(Stage::Norms)), "{t:?}");
        assert!(t.get(Stage::Projections) < 0.2, "{t:?}");
        assert_eq!(t.get(Stage::Attention), 0.0);
        assert_eq!(
            t.outside_projections(),
            t.total() - t.get(Stage::Projections)
        );
        let mut two = t;
        two.add(&t);
        assert_eq!(two.mean_of(2), t);
        assert!((two.share(Stage::Gdn) - t.share(Stage::Gdn)).abs() < 1e-12);
    }
}
