//! The fast forward pass over a batch of rows.
//!
//! Rows are stacked: every projection and MLP GEMM runs once over all rows' tokens (one pass over the
//! weights), while the GDN recurrence and attention run per row against that row's own state. The GEMMs
//! and element-wise steps compute each token independently of the others in the stack, and the mixers
//! never look across rows, so a row's result does not depend on what it was batched with.

use std::sync::Arc;

use rayon::prelude::*;

use crate::attention::{self, AttnCall};
use crate::config::Qwen35Config;
use crate::error::EngineError;
use crate::gdn::{self, GdnCall};
use crate::kernels::{Arm, Kernels, Rows, RowsMut, Run, math, wide};
use crate::model::Observe;
use crate::model::{Backbone, Mixer};
use crate::scratch::{Workspace, grow};
use crate::stages::{Clock, Stage, StageTimes};
use crate::state::{GdnState, LayerState, State};

/// One row of a batched forward: a state to continue (advanced in place), its new tokens, and the
/// indices (into `tokens`) whose final-norm hidden states to return.
/// Generic over the state type so other backends reuse it (see [`crate::backend::Backend`]).
#[derive(Debug)]
pub struct BatchRow<'a, S = State> {
    /// The row's state; on success it has consumed `tokens`.
    pub state: &'a mut S,
    /// Token ids of this call.
    pub tokens: &'a [u32],
    /// Indices into `tokens`, in the order the hidden rows are wanted.
    pub wanted: &'a [usize],
    /// The adapter slot the row runs under (0: the one the model was loaded with; see
    /// [`Backbone::add_adapter`]). A row's state must have been made under the same slot.
    pub adapter: usize,
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

/// `y = (x / sqrt(mean(x²) + eps)) · w1p` per row of `x` (`w1p` = `1 + w`).
pub(crate) fn rms_norm_rows(kern: Kernels, x: &[f32], w1p: &[f32], eps: f32, y: &mut [f32]) {
    let h = w1p.len();
    y.par_chunks_mut(h)
        .zip(x.par_chunks(h))
        .for_each(|(yr, xr)| wide!(kern, || math::rms_norm(xr, w1p, eps, yr)));
}

/// The buffers of a layer's MLP half, shared by every layer of a forward pass: the normed input, the
/// fused gate/up output, the activation and the down projection's output.
struct MlpBufs<'a> {
    hn: &'a mut [f32],
    gu: &'a mut [f32],
    act: &'a mut [f32],
    out: &'a mut [f32],
}

/// Rows per pass of the MLP half: four of the GEMM's 264-row passes, 176 whole 6-row groups, so a pass
/// boundary splits no group (and costs no partial pass) on any kernel.
const MLP_ROWS: usize = 1056;

/// Rows at most this long run their mixers side by side, one row per task ([`rows_in_parallel`]).
const PARALLEL_ROW_TOKENS: usize = 256;

/// Each row with tokens, its token span in the stack and its own rows of `core` (`ld` apart).
#[allow(clippy::type_complexity)]
fn row_work<'r, 'a, 'c>(
    rows: &'r mut [BatchRow<'a>],
    offs: &[usize],
    core: &'c mut [f32],
    ld: usize,
) -> Vec<(&'r mut BatchRow<'a>, (usize, usize), &'c mut [f32])> {
    let mut out = Vec::with_capacity(rows.len());
    let mut rest = core;
    for (ri, r) in rows.iter_mut().enumerate() {
        let (a, b) = (offs[ri], offs[ri + 1]);
        let (mine, tail) = std::mem::take(&mut rest).split_at_mut((b - a) * ld);
        rest = tail;
        if a < b {
            out.push((r, (a, b), mine));
        }
    }
    out
}

/// Whether a pass's rows run their recurrence and attention side by side (one row per task, each row's own
/// scratch) instead of one after the other with each row's work spread over the cores: for many short rows
/// (a batch of small requests) the per-row hand-offs between threads cost more than the rows' arithmetic. A
/// row's values do not depend on which thread runs it.
fn rows_in_parallel<T>(work: &[(T, (usize, usize), &mut [f32])]) -> bool {
    work.len() > 1
        && work
            .iter()
            .all(|(_, (a, b), _)| b - a <= PARALLEL_ROW_TOKENS)
}

/// Run `one` on every row of `work`: side by side with a scratch of their own when [`rows_in_parallel`],
/// else one after the other with the pass's `scratch`.
#[allow(clippy::type_complexity)]
fn each_row<'r, 'a, 'c, W: Default + Send>(
    work: Vec<(&'r mut BatchRow<'a>, (usize, usize), &'c mut [f32])>,
    scratch: &mut W,
    one: impl Fn(&mut BatchRow<'a>, (usize, usize), &mut [f32], &mut W) + Sync + Send,
) {
    if rows_in_parallel(&work) {
        work.into_par_iter()
            .for_each_init(W::default, |ws, (r, span, c)| one(r, span, c, ws));
    } else {
        for (r, span, c) in work {
            one(r, span, c, scratch);
        }
    }
}

fn add_rows(x: &mut [f32], d: &[f32]) {
    x.par_chunks_mut(4096)
        .zip(d.par_chunks(4096))
        .for_each(|(a, b)| {
            for (u, v) in a.iter_mut().zip(b) {
                *u += v;
            }
        });
}

impl Backbone {
    /// The post-attention half of layer `li` on the first `m` rows of `x`: `x += down(silu(gate(h)) · up(h))`
    /// with `h = RMSNorm1p(x)`. The gate/up output and the activation are the widest buffers of a
    /// forward (7.2× and 3.6× the hidden width on the 4B), so they are filled [`MLP_ROWS`] rows at a
    /// time: an 8,192-token row needs 0.9 GB less, and every row's values are the same bits (each step is
    /// per row; the GEMMs do not depend on the batch).
    fn mlp(
        &self,
        (arm, observer, slots): (Arm, Observe<'_>, &[u16]),
        li: usize,
        m: usize,
        x: &mut [f32],
        bufs: MlpBufs<'_>,
        clock: &mut Clock<'_>,
    ) {
        let MlpBufs { hn, gu, act, out } = bufs;
        let (kern, h, im) = (self.kern, self.cfg.hidden_size, self.cfg.intermediate_size);
        let run = Run { kern, arm };
        let (ldg, lda) = (2 * im + 16, im + 16);
        let layer = &self.layers[li];
        let (x, hn) = (&mut x[..m * h], &mut hn[..m * h]);
        rms_norm_rows(kern, x, &layer.post_norm, self.cfg.rms_norm_eps, hn);
        clock.mark(Stage::Norms);
        let mut r0 = 0;
        while r0 < m {
            let rows = (m - r0).min(MLP_ROWS);
            let row_slots = slots.get(r0..r0 + rows).unwrap_or(&[]);
            layer.gate_up.apply(
                run,
                observer,
                row_slots,
                Rows {
                    m: rows,
                    data: &hn[r0 * h..(r0 + rows) * h],
                    ld: h,
                },
                RowsMut {
                    data: &mut *gu,
                    ld: ldg,
                },
            );
            clock.mark(Stage::Projections);
            act[..rows * lda]
                .par_chunks_mut(lda)
                .zip(gu.par_chunks(ldg))
                .for_each(|(a, g)| {
                    crate::kernels::math::swiglu(kern, &g[..im], &g[im..2 * im], &mut a[..im]);
                });
            clock.mark(Stage::Other);
            layer.down.apply(
                run,
                observer,
                row_slots,
                Rows {
                    m: rows,
                    data: act,
                    ld: lda,
                },
                RowsMut {
                    data: &mut out[r0 * h..(r0 + rows) * h],
                    ld: h,
                },
            );
            clock.mark(Stage::Projections);
            r0 += rows;
        }
        add_rows(x, &out[..m * h]);
        clock.mark(Stage::Other);
    }

    /// A fresh state (position 0) for this model.
    pub fn new_state(&self) -> State {
        State::new(&self.cfg)
    }

    /// Run `tokens` from `state` (advancing it) and return the final-norm hidden states at the `wanted`
    /// indices of `tokens`: `[wanted.len(), hidden]`, flattened.
    pub fn forward(
        &self,
        arm: Arm,
        state: &mut State,
        tokens: &[u32],
        wanted: &[usize],
    ) -> Result<Vec<f32>, EngineError> {
        self.one_row(arm, state, (tokens, wanted), Clock::new(None))
    }

    /// [`Backbone::forward`], its wall time added to `times` stage by stage (the stages add up to the
    /// whole call; the results are the same bits).
    pub fn forward_timed(
        &self,
        arm: Arm,
        state: &mut State,
        tokens: &[u32],
        wanted: &[usize],
        times: &mut StageTimes,
    ) -> Result<Vec<f32>, EngineError> {
        self.one_row(arm, state, (tokens, wanted), Clock::new(Some(times)))
    }

    fn one_row(
        &self,
        arm: Arm,
        state: &mut State,
        (tokens, wanted): (&[u32], &[usize]),
        clock: Clock<'_>,
    ) -> Result<Vec<f32>, EngineError> {
        let mut rows = [BatchRow {
            state,
            tokens,
            wanted,
            adapter: 0,
        }];
        Ok(self
            .run_batch(arm, &mut rows, None, clock)?
            .pop()
            .unwrap_or_default())
    }

    /// Run several rows at once (each from its own state) and return each row's wanted hidden states.
    /// Inputs are checked first; on error no state is changed.
    pub fn forward_batch(
        &self,
        arm: Arm,
        rows: &mut [BatchRow<'_>],
    ) -> Result<Vec<Vec<f32>>, EngineError> {
        self.forward_batch_observed(arm, rows, None)
    }

    /// [`Backbone::forward_batch`], every projection's input shown to `observer` (int8 calibration:
    /// [`Backbone::activation_observer`]) before it is multiplied.
    pub fn forward_batch_observed(
        &self,
        arm: Arm,
        rows: &mut [BatchRow<'_>],
        observer: Observe<'_>,
    ) -> Result<Vec<Vec<f32>>, EngineError> {
        self.run_batch(arm, rows, observer, Clock::new(None))
    }

    fn run_batch(
        &self,
        arm: Arm,
        rows: &mut [BatchRow<'_>],
        observer: Observe<'_>,
        mut clock: Clock<'_>,
    ) -> Result<Vec<Vec<f32>>, EngineError> {
        let cfg = &self.cfg;
        for r in rows.iter() {
            check_row(cfg, r.state, r.tokens, r.wanted)?;
            if r.adapter >= self.slots {
                return Err(EngineError::Input(format!(
                    "adapter slot {} is not loaded ({} slots)",
                    r.adapter, self.slots
                )));
            }
        }
        let kern: Kernels = self.kern;
        let run = Run { kern, arm };
        let h = cfg.hidden_size;
        let mut offs = Vec::with_capacity(rows.len() + 1);
        offs.push(0usize);
        for r in rows.iter() {
            offs.push(offs[offs.len() - 1] + r.tokens.len());
        }
        let tot = offs[rows.len()];
        if tot == 0 {
            return Ok(rows.iter().map(|_| Vec::new()).collect());
        }

        let mut ws = self.pool.take();
        let (cd, vd, nv) = (cfg.conv_dim(), cfg.value_dim(), cfg.linear_num_value_heads);
        let (qd, kvd) = (
            cfg.num_attention_heads * cfg.head_dim,
            cfg.num_key_value_heads * cfg.head_dim,
        );
        let im = cfg.intermediate_size;
        // Row strides of the projection inputs are padded by one cache line: a stride that is a multiple
        // of 4 KiB (4096 or 9216 f32) puts the microkernel's six rows in the same L1 sets.
        let ldc = vd.max(qd) + 16;
        let ldg = 2 * im + 16;
        let lda = im + 16;
        let proj_w = (cd + vd + 2 * nv).max(2 * qd + 2 * kvd).max(ldc);
        let eps = cfg.rms_norm_eps;
        let Workspace {
            x,
            hn,
            proj,
            core,
            out,
            gu,
            act,
            gdn: gdn_ws,
            attn: attn_ws,
        } = &mut ws;
        // The last layer finishes only the wanted rows, which may repeat a token: room for both.
        let cap = tot.max(rows.iter().map(|r| r.wanted.len()).sum());
        let x = grow(x, cap * h);
        let hn = grow(hn, cap * h);
        let proj = grow(proj, cap * proj_w);
        let core = grow(core, tot * ldc);
        let out = grow(out, cap * h);
        let gu = grow(gu, cap.min(MLP_ROWS) * ldg);
        let act = grow(act, cap.min(MLP_ROWS) * lda);

        let ids: Vec<u32> = rows.iter().flat_map(|r| r.tokens.iter().copied()).collect();
        // Each token's adapter slot, for the projections' low-rank updates (empty: all slot 0).
        let slots: Vec<u16> = if rows.iter().any(|r| r.adapter != 0) {
            rows.iter()
                .flat_map(|r| std::iter::repeat_n(r.adapter as u16, r.tokens.len()))
                .collect()
        } else {
            Vec::new()
        };
        x.par_chunks_mut(h)
            .zip(ids.par_iter())
            .for_each(|(row, &id)| {
                self.embed.row(id as usize, h, row);
            });
        clock.mark(Stage::Other);

        for (li, layer) in self.layers.iter().enumerate() {
            crate::background::yield_point();
            rms_norm_rows(
                kern,
                &x[..tot * h],
                &layer.input_norm,
                eps,
                &mut hn[..tot * h],
            );
            clock.mark(Stage::Norms);
            let (oproj, cw) = match &layer.mixer {
                Mixer::Gdn(g) => {
                    let ldp = g.in_proj.w.n();
                    g.in_proj.apply(
                        run,
                        observer,
                        &slots,
                        Rows {
                            m: tot,
                            data: hn,
                            ld: h,
                        },
                        RowsMut {
                            data: proj,
                            ld: ldp,
                        },
                    );
                    clock.mark(Stage::Projections);
                    let proj: &[f32] = proj;
                    let one = |r: &mut BatchRow<'_>,
                               (a, b): (usize, usize),
                               core: &mut [f32],
                               ws: &mut crate::scratch::GdnScratch| {
                        let LayerState::Gdn(st) = &mut r.state.layers[li] else {
                            unreachable!("state layout checked")
                        };
                        // Advance in place when no snapshot shares this state, else on a copy.
                        let mut own = match st.take() {
                            Some(arc) => {
                                Arc::try_unwrap(arc).unwrap_or_else(|shared| (*shared).clone())
                            }
                            None => GdnState::zeros(cfg),
                        };
                        gdn::run(
                            GdnCall {
                                cfg,
                                kern,
                                weights: g,
                            },
                            Rows {
                                m: b - a,
                                data: &proj[a * ldp..b * ldp],
                                ld: ldp,
                            },
                            &mut own,
                            RowsMut {
                                data: core,
                                ld: ldc,
                            },
                            ws,
                        );
                        *st = Some(Arc::new(own));
                    };
                    each_row(
                        row_work(rows, &offs, &mut core[..tot * ldc], ldc),
                        gdn_ws,
                        one,
                    );
                    clock.mark(Stage::Gdn);
                    (&g.out_proj, vd)
                }
                Mixer::Attn(at) => {
                    let ldp = at.qkv.w.n();
                    at.qkv.apply(
                        run,
                        observer,
                        &slots,
                        Rows {
                            m: tot,
                            data: hn,
                            ld: h,
                        },
                        RowsMut {
                            data: proj,
                            ld: ldp,
                        },
                    );
                    clock.mark(Stage::Projections);
                    let proj: &[f32] = proj;
                    let inv_freq = &self.inv_freq;
                    let one = |r: &mut BatchRow<'_>,
                               (a, b): (usize, usize),
                               core: &mut [f32],
                               ws: &mut crate::scratch::AttnScratch| {
                        let pos0 = r.state.pos;
                        let LayerState::Attn(kv) = &mut r.state.layers[li] else {
                            unreachable!("state layout checked")
                        };
                        attention::run(
                            AttnCall {
                                cfg,
                                kern,
                                inv_freq,
                                weights: at,
                                pos0,
                            },
                            Rows {
                                m: b - a,
                                data: &proj[a * ldp..b * ldp],
                                ld: ldp,
                            },
                            kv,
                            RowsMut {
                                data: core,
                                ld: ldc,
                            },
                            ws,
                        );
                    };
                    each_row(
                        row_work(rows, &offs, &mut core[..tot * ldc], ldc),
                        attn_ws,
                        one,
                    );
                    clock.mark(Stage::Attention);
                    (&at.o_proj, qd)
                }
            };
            if li + 1 < self.layers.len() {
                oproj.apply(
                    run,
                    observer,
                    &slots,
                    Rows {
                        m: tot,
                        data: core,
                        ld: ldc,
                    },
                    RowsMut { data: out, ld: h },
                );
                clock.mark(Stage::Projections);
                add_rows(&mut x[..tot * h], &out[..tot * h]);
                clock.mark(Stage::Other);
                self.mlp(
                    (arm, observer, &slots),
                    li,
                    tot,
                    x,
                    MlpBufs { hn, gu, act, out },
                    &mut clock,
                );
            } else {
                // Past the last mixer only the wanted positions matter: finish those rows alone
                // (every step from here is per token, so the values are the same bits).
                let mut ms = 0;
                let mut last_slots: Vec<u16> = Vec::new();
                for (ri, r) in rows.iter().enumerate() {
                    if !slots.is_empty() {
                        last_slots.extend(std::iter::repeat_n(r.adapter as u16, r.wanted.len()));
                    }
                    for &w in r.wanted {
                        let t = offs[ri] + w;
                        proj[ms * ldc..ms * ldc + cw].copy_from_slice(&core[t * ldc..t * ldc + cw]);
                        hn[ms * h..(ms + 1) * h].copy_from_slice(&x[t * h..(t + 1) * h]);
                        ms += 1;
                    }
                }
                x[..ms * h].copy_from_slice(&hn[..ms * h]);
                clock.mark(Stage::Other);
                oproj.apply(
                    run,
                    observer,
                    &last_slots,
                    Rows {
                        m: ms,
                        data: proj,
                        ld: ldc,
                    },
                    RowsMut { data: out, ld: h },
                );
                clock.mark(Stage::Projections);
                add_rows(&mut x[..ms * h], &out[..ms * h]);
                clock.mark(Stage::Other);
                self.mlp(
                    (arm, observer, &last_slots),
                    li,
                    ms,
                    x,
                    MlpBufs { hn, gu, act, out },
                    &mut clock,
                );
            }
        }

        let x: &[f32] = x;
        let mut result = Vec::with_capacity(rows.len());
        let mut next = 0;
        for r in rows.iter_mut() {
            r.state.pos += r.tokens.len();
            let n = r.wanted.len();
            let mut o = vec![0f32; n * h];
            rms_norm_rows(
                self.kern,
                &x[next * h..(next + n) * h],
                &self.final_norm,
                eps,
                &mut o,
            );
            next += n;
            result.push(o);
        }
        clock.mark(Stage::Norms);
        self.pool.put(ws);
        clock.mark(Stage::Other);
        Ok(result)
    }
}
