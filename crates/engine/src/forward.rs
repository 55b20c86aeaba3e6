//! The forward pass: the rows stacked, embedded, every layer in turn, the final norm at the wanted
//! positions (qwen35-arch §2–§3, in the order of the math).

use rayon::prelude::*;

use crate::error::EngineError;
use crate::kernels::{Arm, SafePoint};
use crate::model::observe::Observe;
use crate::model::{ActivationObserver, Backbone};
use crate::pass::{Acts, BatchRow, MLP_ROWS, Pass, Stack, check_row, rms_norm_rows};
use crate::pause::Lanes;
use crate::scratch::{Workspace, grow};
use crate::stages::{Clock, Stage, StageTimes};
use crate::state::State;

/// How a pass runs beside other work.
#[derive(Debug, Clone, Copy, Default)]
pub struct PassOptions<'a> {
    /// Shown every projection's input before it is multiplied (an int8 calibration's forwards:
    /// [`Backbone::activation_observer`]).
    pub observer: Option<&'a ActivationObserver>,
    /// A background pass: it steps aside at its safe points while these lanes' foreground work runs.
    pub background: Option<&'a Lanes>,
}

impl Backbone {
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
        self.one_row(arm, state, (tokens, wanted), &Clock::new(false))
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
        let clock = Clock::new(true);
        let hidden = self.one_row(arm, state, (tokens, wanted), &clock)?;
        times.add(&clock.times());
        Ok(hidden)
    }

    fn one_row(
        &self,
        arm: Arm,
        state: &mut State,
        (tokens, wanted): (&[u32], &[usize]),
        clock: &Clock,
    ) -> Result<Vec<f32>, EngineError> {
        let mut rows = [BatchRow {
            state,
            tokens,
            wanted,
            adapter: None,
        }];
        let hidden = self.run_batch(arm, &mut rows, PassOptions::default(), clock)?;
        Ok(hidden.into_iter().next().unwrap_or_default())
    }

    /// Run several rows at once (each from its own state) and return each row's wanted hidden states.
    /// Inputs are checked first; on error no state is changed.
    pub fn forward_batch(
        &self,
        arm: Arm,
        rows: &mut [BatchRow<'_>],
    ) -> Result<Vec<Vec<f32>>, EngineError> {
        self.forward_batch_with(arm, rows, PassOptions::default())
    }

    /// [`Backbone::forward_batch`] with an observer or as background work.
    pub fn forward_batch_with(
        &self,
        arm: Arm,
        rows: &mut [BatchRow<'_>],
        opts: PassOptions<'_>,
    ) -> Result<Vec<Vec<f32>>, EngineError> {
        self.run_batch(arm, rows, opts, &Clock::new(false))
    }

    fn run_batch(
        &self,
        arm: Arm,
        rows: &mut [BatchRow<'_>],
        opts: PassOptions<'_>,
        clock: &Clock,
    ) -> Result<Vec<Vec<f32>>, EngineError> {
        self.check(arm, rows)?;
        let wait = opts.background.map(|lanes| move || lanes.step_aside());
        let pass = Pass {
            cfg: &self.cfg,
            kern: self.kern,
            arm,
            inv_freq: &self.inv_freq,
            observer: opts.observer as Observe<'_>,
            pause: wait.as_ref().map_or(SafePoint::NONE, |w| SafePoint::new(w)),
            clock,
        };
        let mut stack = Stack::new(rows, self.adapter.as_ref());
        if stack.m == 0 {
            return Ok(stack.rows.iter().map(|_| Vec::new()).collect());
        }
        let mut ws = self.pool.take();
        let hidden = {
            let mut acts = self.acts(&mut ws, &stack);
            self.embed(&stack, acts.x);
            pass.mark(Stage::Other);
            let last = self.layers.len() - 1;
            for (li, layer) in self.layers.iter().enumerate() {
                pass.pause.reach();
                layer.forward(li, li == last, &pass, &mut stack, &mut acts);
            }
            self.final_norm(&mut stack, acts.x)
        };
        pass.mark(Stage::Norms);
        self.pool.put(ws);
        pass.mark(Stage::Other);
        Ok(hidden)
    }

    /// Every row's inputs against the model, and the arm against its weights (before anything runs).
    fn check(&self, arm: Arm, rows: &[BatchRow<'_>]) -> Result<(), EngineError> {
        if !self.arms.runs(arm) {
            return Err(EngineError::Arm(format!(
                "the {} arm cannot run this model: its weights were built for the {} arm{}",
                arm.name(),
                if self.int8_only() {
                    "int8"
                } else {
                    "fp32 and bf16"
                },
                if self.int8_only() { "" } else { "s" }
            )));
        }
        for r in rows {
            check_row(&self.cfg, r.state, r.tokens, r.wanted)?;
            if r.adapter.is_some_and(|a| a.model != self.id) {
                return Err(EngineError::Adapter(
                    "a row's adapter was laid out for another loaded model".into(),
                ));
            }
        }
        Ok(())
    }

    /// The pass's activation buffers from `ws`, sized for `stack` (the last layer finishes only the wanted
    /// rows, which may repeat a token: room for both).
    fn acts<'w>(&self, ws: &'w mut Workspace, stack: &Stack<'_, '_>) -> Acts<'w> {
        let cfg = &self.cfg;
        let (h, tot) = (cfg.hidden_size, stack.m);
        let (cd, vd, nv) = (cfg.conv_dim(), cfg.value_dim(), cfg.linear_num_value_heads);
        let qd = cfg.num_attention_heads * cfg.head_dim;
        let kvd = cfg.num_key_value_heads * cfg.head_dim;
        let im = cfg.intermediate_size;
        // Row strides of the projection inputs are padded by one cache line: a stride that is a multiple
        // of 4 KiB (4096 or 9216 f32) puts the microkernel's six rows in the same L1 sets.
        let ldc = vd.max(qd) + 16;
        let (ldg, lda) = (2 * im + 16, im + 16);
        let proj_w = (cd + vd + 2 * nv).max(2 * qd + 2 * kvd).max(ldc);
        let cap = tot.max(stack.rows.iter().map(|r| r.wanted.len()).sum());
        let Workspace {
            x,
            hn,
            proj,
            core,
            out,
            gu,
            act,
            gdn,
            attn,
        } = ws;
        Acts {
            x: grow(x, cap * h),
            hn: grow(hn, cap * h),
            proj: grow(proj, cap * proj_w),
            core: grow(core, tot * ldc),
            ldc,
            out: grow(out, cap * h),
            gu: grow(gu, cap.min(MLP_ROWS) * ldg),
            act: grow(act, cap.min(MLP_ROWS) * lda),
            gdn,
            attn,
        }
    }

    /// Each stacked token's embedding row into `x`.
    fn embed(&self, stack: &Stack<'_, '_>, x: &mut [f32]) {
        let h = self.cfg.hidden_size;
        let ids: Vec<u32> = stack
            .rows
            .iter()
            .flat_map(|r| r.tokens.iter().copied())
            .collect();
        x.par_chunks_mut(h)
            .zip(ids.par_iter())
            .for_each(|(row, &id)| self.embed.row(id as usize, h, row));
    }

    /// The final norm of each row's wanted positions (the first rows of `x`, in order), as the rows'
    /// results; every state has then consumed its tokens.
    fn final_norm(&self, stack: &mut Stack<'_, '_>, x: &[f32]) -> Vec<Vec<f32>> {
        let (h, eps) = (self.cfg.hidden_size, self.cfg.rms_norm_eps);
        stack.advance();
        let mut next = 0;
        stack
            .rows
            .iter()
            .map(|r| {
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
                o
            })
            .collect()
    }
}
