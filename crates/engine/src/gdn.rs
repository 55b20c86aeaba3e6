//! Gated DeltaNet, fast path: the causal conv with carried history, L2-normalised q/k, the gates, the
//! chunked (64) delta rule as matrix products (qwen35-arch §4.7, in the order HF's
//! `torch_chunk_gated_delta_rule` computes it), and the gated per-head RMSNorm.
//!
//! Chunks start at the first token of each call, so a prefix that ends on a multiple of 64 leaves the
//! continuation with exactly the chunks of a one-pass run, and the same arithmetic.

use rayon::prelude::*;

use crate::config::Qwen35Config;
use crate::kernels::cache::prefetch;
use crate::kernels::matmul::Mat;
use crate::kernels::{Kernels, Rows, RowsMut, SendPtr, math, wide};
use crate::model::linear::Linear;
use crate::pass::{Acts, Pass, Stack};
use crate::scratch::{GdnScratch, grow};
use crate::stages::Stage;
use crate::state::{GdnState, LayerState, advance_gdn};

mod delta;

use delta::{HeadInputs, delta_rule_heads};

/// Chunk length of the delta rule.
pub const CHUNK: usize = 64;

/// A Gated DeltaNet mixer's weights (`linear_attn`).
#[derive(Debug)]
pub(crate) struct Gdn {
    /// Fused `[in_proj_qkv; in_proj_z; in_proj_b; in_proj_a]`.
    pub in_proj: Linear,
    /// Conv taps transposed, `[4][conv_dim]` (tap 3 multiplies the current token).
    pub conv_t: Vec<f32>,
    pub dt_bias: Vec<f32>,
    /// `−exp(A_log)` in f32, as HF computes it each call.
    pub neg_a: Vec<f32>,
    /// Gated RMSNorm weight (`x·w`, shared by all value heads).
    pub norm: Vec<f32>,
    pub out_proj: Linear,
}

impl Gdn {
    /// The mixer over the stacked rows' normed inputs (`a.hn`): the fused input projection for every
    /// token, then per row the conv, gates and delta rule from its state of layer `li` (advanced), the
    /// gated-norm output to `a.core` (the input of `out_proj`).
    pub fn forward(&self, li: usize, pass: &Pass<'_>, stack: &mut Stack<'_, '_>, a: &mut Acts<'_>) {
        let (m, h) = (stack.m, pass.cfg.hidden_size);
        let ldp = self.in_proj.n();
        self.in_proj.apply(
            pass,
            &stack.loras,
            Rows {
                m,
                data: a.hn,
                ld: h,
            },
            RowsMut {
                data: a.proj,
                ld: ldp,
            },
        );
        pass.mark(Stage::Projections);
        let (cfg, kern, ldc) = (pass.cfg, pass.kern, a.ldc);
        let proj: &[f32] = a.proj;
        stack.each_row(
            li,
            (&mut a.core[..m * ldc], ldc),
            a.gdn,
            |st, span, core, ws| {
                let LayerState::Gdn(slot) = st else {
                    unreachable!("state layout checked")
                };
                let rows = Rows {
                    m: span.to - span.from,
                    data: &proj[span.from * ldp..span.to * ldp],
                    ld: ldp,
                };
                advance_gdn(slot, cfg, |own| {
                    run(
                        GdnCall {
                            cfg,
                            kern,
                            weights: self,
                        },
                        rows,
                        own,
                        RowsMut {
                            data: core,
                            ld: ldc,
                        },
                        ws,
                    )
                });
            },
        );
        pass.mark(Stage::Gdn);
    }
}

/// What one GDN call runs with: the model, its kernels and the layer's weights.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GdnCall<'a> {
    pub cfg: &'a Qwen35Config,
    pub kern: Kernels,
    pub weights: &'a Gdn,
}

/// Run one GDN mixer over the `proj.m` tokens of one row.
///
/// `proj` holds the fused input projection rows (`[qkv | z | b | a]`); the gated-norm output (the input
/// of `out_proj`) goes to `core` (one row of `value_dim` per token); `st` is advanced in place.
///
/// One task per key head does everything its channels need, start to end: the conv and SiLU of its q, k
/// and value-head channels, the norms, the gates, the delta rule of its value heads and their gated norm
/// into `core`'s columns. A task's working set (≈ 200 KB at 94 tokens) stays in L2, where whole-width passes
/// (conv, then norms, then heads, then the norm) each went through memory. Every element is computed by the
/// same operations in the same order as whole-width passes would, so the bits do not depend on the split.
pub(crate) fn run(
    call: GdnCall<'_>,
    proj: Rows<'_>,
    st: &mut GdnState,
    core: RowsMut<'_>,
    ws: &mut GdnScratch,
) {
    let GdnCall { cfg, .. } = call;
    let t = proj.m;
    let (nk, nv, dk, dv) = (
        cfg.linear_num_key_heads,
        cfg.linear_num_value_heads,
        cfg.linear_key_head_dim,
        cfg.linear_value_head_dim,
    );
    let cd = cfg.conv_dim();
    let ratio = nv / nk;
    let GdnScratch {
        hist,
        qn,
        kn,
        v,
        beta,
        gl,
        heads_out,
        row,
    } = ws;
    let (qn, kn) = (grow(qn, nk * t * dk), grow(kn, nk * t * dk));
    let v = grow(v, nv * t * dv);
    let (beta, gl) = (grow(beta, nv * t), grow(gl, nv * t));
    let heads_out = grow(heads_out, nv * t * dv);
    let row = grow(row, nk * dk);
    let RowsMut {
        data: core,
        ld: ldc,
    } = core;
    assert!(
        t == 0 || core.len() >= (t - 1) * ldc + cfg.value_dim(),
        "gdn: core too short"
    );
    let out = SendPtr(core.as_mut_ptr());
    let hist_old: &[f32] = &st.conv;
    st.rec
        .par_chunks_mut(ratio * dk * dv)
        .zip(qn.par_chunks_mut(t * dk))
        .zip(kn.par_chunks_mut(t * dk))
        .zip(v.par_chunks_mut(ratio * t * dv))
        .zip(beta.par_chunks_mut(ratio * t))
        .zip(gl.par_chunks_mut(ratio * t))
        .zip(heads_out.par_chunks_mut(ratio * t * dv))
        .zip(row.par_chunks_mut(dk))
        .enumerate()
        .for_each(|(j, (((((((rec, qh), kh), vh), bh), gh), oh), tmp))| {
            let task = KeyHead {
                call,
                proj,
                hist: hist_old,
                j,
                t,
            };
            task.inputs(qh, kh, vh, tmp);
            task.gates(bh, gh);
            let (qh, kh, bh, gh) = (&*qh, &*kh, &*bh, &*gh);
            let heads: Vec<HeadInputs<'_>> = vh
                .chunks(t * dv)
                .enumerate()
                .map(|(r, vr)| HeadInputs {
                    q: qh,
                    k: kh,
                    v: Mat::new(vr, t, dv),
                    beta: &bh[r * t..(r + 1) * t],
                    g: &gh[r * t..(r + 1) * t],
                    dk,
                })
                .collect();
            delta_rule_heads(call.kern, &heads, rec, oh);
            for (r, o) in oh.chunks(t * dv).enumerate() {
                // SAFETY: value head `j·ratio + r` owns columns h·dv..(h+1)·dv of each of the `t` rows
                // of `core` (extent asserted above); no other task writes them.
                unsafe { task.gated_norm(j * ratio + r, o, out, ldc) };
            }
        });
    // The carried history takes the call's last three rows (some possibly from the old history).
    let pre = |i: usize| &proj.data[i * proj.ld..i * proj.ld + cd];
    let new_hist = grow(hist, 3 * cd);
    for r in 0..3 {
        let src: &[f32] = if t + r >= 3 {
            pre(t + r - 3)
        } else {
            &st.conv[(t + r) * cd..(t + r + 1) * cd]
        };
        new_hist[r * cd..(r + 1) * cd].copy_from_slice(src);
    }
    st.conv.copy_from_slice(new_hist);
}

/// How many tokens ahead the per-head loops ask for their next rows of `proj`: each reads a few hundred
/// bytes of a row ~50 KB long, a stride the hardware prefetchers do not follow.
const AHEAD: usize = 4;

/// One key head's share of a GDN call: its q and k channels, and its `ratio` value heads.
#[derive(Clone, Copy)]
struct KeyHead<'a> {
    call: GdnCall<'a>,
    proj: Rows<'a>,
    /// The conv history carried from before the call, `[3][conv_dim]`.
    hist: &'a [f32],
    j: usize,
    t: usize,
}

impl KeyHead<'_> {
    /// Causal depthwise conv + SiLU of channels `c0..c0 + out.len()` for token `i` into `out`: row
    /// `i − 3 + tap` feeds `tap`, rows before the call come from the carried history.
    #[inline(always)]
    fn conv_silu(&self, c0: usize, i: usize, out: &mut [f32]) {
        let (cfg, g) = (self.call.cfg, self.call.weights);
        let (cd, n, ldp) = (cfg.conv_dim(), out.len(), self.proj.ld);
        let src = |back: usize| -> &[f32] {
            if i >= back {
                &self.proj.data[(i - back) * ldp + c0..(i - back) * ldp + c0 + n]
            } else {
                let h = 3 - (back - i);
                &self.hist[h * cd + c0..h * cd + c0 + n]
            }
        };
        let (x0, x1, x2, x3) = (src(3), src(2), src(1), src(0));
        let w = &g.conv_t;
        let (w0, w1, w2, w3) = (
            &w[c0..c0 + n],
            &w[cd + c0..cd + c0 + n],
            &w[2 * cd + c0..2 * cd + c0 + n],
            &w[3 * cd + c0..3 * cd + c0 + n],
        );
        for c in 0..n {
            out[c] = w0[c] * x0[c] + w1[c] * x1[c] + w2[c] * x2[c] + w3[c] * x3[c];
        }
        math::silu_inplace(self.call.kern, out);
    }

    /// The conv of the head's channels, then L2-normalised q (times dk^-1/2) and k `[t][dk]`, and its
    /// value heads' v `[ratio][t][dv]`.
    fn inputs(&self, qh: &mut [f32], kh: &mut [f32], vh: &mut [f32], tmp: &mut [f32]) {
        let cfg = self.call.cfg;
        let (dk, dv, kd, t, j) = (
            cfg.linear_key_head_dim,
            cfg.linear_value_head_dim,
            cfg.key_dim(),
            self.t,
            self.j,
        );
        let ratio = cfg.linear_num_value_heads / cfg.linear_num_key_heads;
        let scale = (dk as f32).powf(-0.5);
        let ldp = self.proj.ld;
        wide!(self.call.kern, || {
            for i in 0..t {
                if i + AHEAD < t {
                    let next = &self.proj.data[(i + AHEAD) * ldp..];
                    prefetch(&next[j * dk..(j + 1) * dk]);
                    prefetch(&next[kd + j * dk..kd + (j + 1) * dk]);
                    prefetch(&next[2 * kd + j * ratio * dv..2 * kd + (j + 1) * ratio * dv]);
                }
                self.conv_silu(j * dk, i, tmp);
                l2norm(tmp, &mut qh[i * dk..(i + 1) * dk], Some(scale));
                self.conv_silu(kd + j * dk, i, tmp);
                l2norm(tmp, &mut kh[i * dk..(i + 1) * dk], None);
                for r in 0..ratio {
                    let h = j * ratio + r;
                    let dst = &mut vh[r * t * dv + i * dv..r * t * dv + (i + 1) * dv];
                    self.conv_silu(2 * kd + h * dv, i, dst);
                }
            }
        });
    }

    /// The gates of the head's value heads, `[ratio][t]`: β = sigmoid(b), g = −exp(A_log)·softplus(a + dt_bias).
    fn gates(&self, beta: &mut [f32], gl: &mut [f32]) {
        let (cfg, g) = (self.call.cfg, self.call.weights);
        let (cd, vd, nv) = (cfg.conv_dim(), cfg.value_dim(), cfg.linear_num_value_heads);
        let ratio = nv / cfg.linear_num_key_heads;
        let t = self.t;
        for r in 0..ratio {
            let h = self.j * ratio + r;
            for i in 0..t {
                let row = &self.proj.data[i * self.proj.ld..];
                beta[r * t + i] = math::sigmoid(row[cd + vd + h]);
                gl[r * t + i] = g.neg_a[h] * math::softplus(row[cd + vd + nv + h] + g.dt_bias[h]);
            }
        }
    }

    /// Gated RMSNorm of value head `h`'s output `o` (`[t][dv]`) into columns `h·dv..(h+1)·dv` of `core`'s
    /// rows: ((o / rms(o)) · w) · silu(z).
    ///
    /// # Safety
    /// `core` points at `t` rows of stride `ldc`, each at least `value_dim` long, and no other thread
    /// touches these columns meanwhile.
    unsafe fn gated_norm(&self, h: usize, o: &[f32], core: SendPtr<f32>, ldc: usize) {
        let (cfg, g) = (self.call.cfg, self.call.weights);
        let (cd, dv, eps) = (cfg.conv_dim(), cfg.linear_value_head_dim, cfg.rms_norm_eps);
        let ldp = self.proj.ld;
        wide!(self.call.kern, || {
            for i in 0..self.t {
                if i + AHEAD < self.t {
                    let z = (i + AHEAD) * ldp + cd + h * dv;
                    prefetch(&self.proj.data[z..z + dv]);
                }
                // SAFETY: inside row i's first value_dim columns, owned by this head (see above).
                let y =
                    unsafe { std::slice::from_raw_parts_mut(core.get().add(i * ldc + h * dv), dv) };
                let z = &self.proj.data[i * ldp + cd + h * dv..i * ldp + cd + (h + 1) * dv];
                y.copy_from_slice(z);
                math::silu_inplace(self.call.kern, y);
                let o = &o[i * dv..(i + 1) * dv];
                let inv = math::rms_inv(o, eps);
                for ((yd, od), w) in y.iter_mut().zip(o).zip(&g.norm[..dv]) {
                    *yd *= (od * inv) * w;
                }
            }
        });
    }
}

/// `dst = src / sqrt(Σ src² + 1e-6)` (times `scale` if given), the FLA-style L2 norm HF uses.
#[inline(always)]
fn l2norm(src: &[f32], dst: &mut [f32], scale: Option<f32>) {
    let ss = math::sum_squares(src);
    let inv = 1.0 / (ss as f32 + 1e-6).sqrt();
    for (d, x) in dst.iter_mut().zip(src) {
        *d = x * inv;
        if let Some(s) = scale {
            *d *= s;
        }
    }
}
