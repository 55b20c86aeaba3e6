//! What one forward pass runs with, and its rows stacked.
//!
//! Rows are stacked: every projection and MLP GEMM runs once over all rows' tokens (one pass over the
//! weights), while the GDN recurrence and attention run per row against that row's own state. The GEMMs
//! and element-wise steps compute each token independently of the others in the stack, and the mixers
//! never look across rows, so a row's result does not depend on what it was batched with.

use rayon::prelude::*;

use crate::adapter::{Adapter, RowLoras};
use crate::config::Qwen35Config;
use crate::error::EngineError;
use crate::kernels::{Arm, Kernels, Run, SafePoint, math, wide};
use crate::model::observe::Observe;
use crate::scratch::{AttnScratch, GdnScratch};
use crate::stages::{Clock, Stage};
use crate::state::{LayerState, State};

/// One row of a batched forward: a state to continue (advanced in place), its new tokens, the indices (into
/// `tokens`) whose final-norm hidden states to return, and the adapter it runs under. Generic over the
/// state and adapter types so other backends reuse it (see [`crate::backend::Backend`]).
#[derive(Debug)]
pub struct BatchRow<'a, S = State, A = Adapter> {
    /// The row's state; on success it has consumed `tokens`.
    pub state: &'a mut S,
    /// Token ids of this call.
    pub tokens: &'a [u32],
    /// Indices into `tokens`, in the order the hidden rows are wanted.
    pub wanted: &'a [usize],
    /// The LoRA adapter the row runs under, unmerged; `None`: the weights as loaded (with the adapter
    /// they were loaded with in the `exact` form, if any). A row's state must have been made under the
    /// same adapter.
    pub adapter: Option<&'a A>,
}

/// Check one row's inputs against the model (before anything is computed).
pub(crate) fn check_row(
    cfg: &Qwen35Config,
    state: &State,
    tokens: &[u32],
    wanted: &[usize],
) -> Result<(), EngineError> {
    if !state.fits(cfg) {
        return Err(EngineError::Input(
            "the state was made for a model with another layout".into(),
        ));
    }
    if let Some(t) = tokens.iter().find(|&&t| t as usize >= cfg.vocab_size) {
        return Err(EngineError::Input(format!(
            "token id {t} is outside the vocabulary (0..{})",
            cfg.vocab_size
        )));
    }
    if let Some(w) = wanted.iter().find(|&&w| w >= tokens.len()) {
        return Err(EngineError::Input(format!(
            "wanted index {w} is outside the row's {} new tokens",
            tokens.len()
        )));
    }
    Ok(())
}

/// What every step of one forward pass runs with.
pub(crate) struct Pass<'a> {
    pub cfg: &'a Qwen35Config,
    pub kern: Kernels,
    /// The arm of the model's float weights (an int8 model's products are int8 or its islands').
    pub arm: Arm,
    /// RoPE inverse frequencies in f32, as HF computes them.
    pub inv_freq: &'a [f32],
    /// Records every projection's input (an int8 calibration's forwards).
    pub observer: Observe<'a>,
    /// Where the pass may pause (a background pass stepping aside for foreground work).
    pub pause: SafePoint<'a>,
    /// Where the time goes, when timed.
    pub clock: &'a Clock,
}

impl Pass<'_> {
    /// A product in `arm` on the pass's kernels, pausing where the pass may.
    pub fn run(&self, arm: Arm) -> Run<'_> {
        Run {
            kern: self.kern,
            arm,
            pause: self.pause,
        }
    }

    /// The time since the last mark was spent in `stage`.
    pub fn mark(&self, stage: Stage) {
        self.clock.mark(stage);
    }
}

/// The rows of a pass, stacked: each row's token span, and which adapter each stacked row's projections add.
pub(crate) struct Stack<'r, 'a> {
    pub rows: &'r mut [BatchRow<'a>],
    /// Row `i`'s tokens are stacked rows `offs[i]..offs[i + 1]`.
    pub offs: Vec<usize>,
    /// Stacked rows now: every token, then (past the last mixer) the wanted ones.
    pub m: usize,
    pub loras: RowLoras<'r>,
    /// The adapter of rows that name none (the model's own, if any).
    default: Option<&'r Adapter>,
}

impl<'r, 'a> Stack<'r, 'a> {
    /// Stack `rows`; a row naming no adapter runs under `default` (the model's own, if any).
    pub fn new(rows: &'r mut [BatchRow<'a>], default: Option<&'r Adapter>) -> Self {
        let mut offs = Vec::with_capacity(rows.len() + 1);
        offs.push(0usize);
        for r in rows.iter() {
            offs.push(offs[offs.len() - 1] + r.tokens.len());
        }
        let m = offs[rows.len()];
        let loras = RowLoras::new(
            rows.iter()
                .flat_map(|r| std::iter::repeat_n(r.adapter.or(default), r.tokens.len())),
        );
        Stack {
            rows,
            offs,
            m,
            loras,
            default,
        }
    }

    /// The stacked rows the last layer finishes: each row's wanted positions, in order.
    pub fn wanted(&self) -> impl Iterator<Item = usize> + '_ {
        let offs = &self.offs;
        self.rows
            .iter()
            .enumerate()
            .flat_map(move |(ri, r)| r.wanted.iter().map(move |&w| offs[ri] + w))
    }

    /// Keep only the wanted rows (past the last mixer every step is per token): their adapters, and `m`.
    /// The caller moves their activations.
    pub fn narrow_to_wanted(&mut self) {
        let default = self.default;
        self.m = self.rows.iter().map(|r| r.wanted.len()).sum();
        self.loras = RowLoras::new(
            self.rows
                .iter()
                .flat_map(|r| std::iter::repeat_n(r.adapter.or(default), r.wanted.len())),
        );
    }

    /// Run `one` on every row with tokens, with the row's state of layer `li`, its position before the
    /// pass, its token span in the stack and its own rows of `core` (`ld` apart): side by side with a
    /// scratch of their own when [`rows_in_parallel`], else one after the other with `scratch`. A row's
    /// values do not depend on which thread runs it.
    pub fn each_row<W: Default + Send>(
        &mut self,
        li: usize,
        (core, ld): (&mut [f32], usize),
        scratch: &mut W,
        one: impl Fn(&mut LayerState, RowSpan, &mut [f32], &mut W) + Sync + Send,
    ) {
        let mut work = Vec::with_capacity(self.rows.len());
        let mut rest = core;
        for (ri, r) in self.rows.iter_mut().enumerate() {
            let (a, b) = (self.offs[ri], self.offs[ri + 1]);
            let (mine, tail) = std::mem::take(&mut rest).split_at_mut((b - a) * ld);
            rest = tail;
            if a < b {
                let span = RowSpan {
                    from: a,
                    to: b,
                    pos0: r.state.pos,
                };
                work.push((&mut r.state.layers[li], span, mine));
            }
        }
        let parallel = work.len() > 1
            && work
                .iter()
                .all(|(_, s, _)| s.to - s.from <= PARALLEL_ROW_TOKENS);
        if parallel {
            work.into_par_iter()
                .for_each_init(W::default, |ws, (st, span, c)| one(st, span, c, ws));
        } else {
            for (st, span, c) in work {
                one(st, span, c, scratch);
            }
        }
    }

    /// Every row has consumed its tokens.
    pub fn advance(&mut self) {
        for r in self.rows.iter_mut() {
            r.state.pos += r.tokens.len();
        }
    }
}

/// A row's tokens in the stack (`from..to`) and its position before the pass.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RowSpan {
    pub from: usize,
    pub to: usize,
    pub pos0: usize,
}

/// Rows at most this long run their mixers side by side, one row per task: for many short rows (a batch of
/// small requests) the per-row hand-offs between threads cost more than the rows' arithmetic.
const PARALLEL_ROW_TOKENS: usize = 256;

/// `y = (x / sqrt(mean(x²) + eps)) · w1p` per row of `x` (`w1p` = `1 + w`).
pub(crate) fn rms_norm_rows(kern: Kernels, x: &[f32], w1p: &[f32], eps: f32, y: &mut [f32]) {
    let h = w1p.len();
    y.par_chunks_mut(h)
        .zip(x.par_chunks(h))
        .for_each(|(yr, xr)| wide!(kern, || math::rms_norm(xr, w1p, eps, yr)));
}

/// `x += d`, element by element.
pub(crate) fn add_rows(x: &mut [f32], d: &[f32]) {
    x.par_chunks_mut(4096)
        .zip(d.par_chunks(4096))
        .for_each(|(a, b)| {
            for (u, v) in a.iter_mut().zip(b) {
                *u += v;
            }
        });
}

/// A pass's activation buffers, each with room for the pass's rows.
pub(crate) struct Acts<'w> {
    /// The residual stream, `[rows, hidden]`.
    pub x: &'w mut [f32],
    /// A normed copy of `x`.
    pub hn: &'w mut [f32],
    /// The mixer's input projection (and, past the last mixer, the wanted rows of its output).
    pub proj: &'w mut [f32],
    /// The mixer's output, the input of its out projection, `ldc` apart.
    pub core: &'w mut [f32],
    pub ldc: usize,
    /// An out projection's rows, `[rows, hidden]`.
    pub out: &'w mut [f32],
    /// The MLP's fused gate/up output and activation, [`MLP_ROWS`] rows at most.
    pub gu: &'w mut [f32],
    pub act: &'w mut [f32],
    pub gdn: &'w mut GdnScratch,
    pub attn: &'w mut AttnScratch,
}

/// Rows per pass of the MLP half: four of the GEMM's 264-row passes, 176 whole 6-row groups, so a pass
/// boundary splits no group (and costs no partial pass) on any kernel. The gate/up output and the
/// activation are the widest buffers of a forward (7.2× and 3.6× the hidden width on the 4B): filled this
/// many rows at a time, an 8,192-token row needs 0.9 GB less, and every row's values are the same bits.
pub(crate) const MLP_ROWS: usize = 1056;
