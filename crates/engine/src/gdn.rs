//! Gated DeltaNet, fast path: the causal conv with carried history, L2-normalised q/k, the gates, the
//! chunked (64) delta rule as matrix products (qwen35-arch §4.7, in the order HF's
//! `torch_chunk_gated_delta_rule` computes it), and the gated per-head RMSNorm.
//!
//! Chunks start at the first token of each call, so a prefix that ends on a multiple of 64 leaves the
//! continuation with exactly the chunks of a one-pass run, and the same arithmetic.

use rayon::prelude::*;

use crate::config::Qwen35Config;
use crate::kernels::matmul::Mat;
use crate::kernels::{Kernels, Rows, RowsMut, math, wide};
use crate::model::linear::Linear;
use crate::pass::{Acts, Pass, Stack};
use crate::scratch::{GdnScratch, grow};
use crate::stages::Stage;
use crate::state::{GdnState, LayerState, advance_gdn};

mod delta;

use delta::{HeadInputs, delta_rule_head};

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
pub(crate) fn run(
    call: GdnCall<'_>,
    proj: Rows<'_>,
    st: &mut GdnState,
    core: RowsMut<'_>,
    ws: &mut GdnScratch,
) {
    let GdnCall { cfg, kern, .. } = call;
    let t = proj.m;
    let (nk, nv, dk, dv) = (
        cfg.linear_num_key_heads,
        cfg.linear_num_value_heads,
        cfg.linear_key_head_dim,
        cfg.linear_value_head_dim,
    );
    let (cd, kd) = (cfg.conv_dim(), cfg.key_dim());
    let ratio = nv / nk;
    let GdnScratch {
        conv,
        hist,
        qn,
        kn,
        beta,
        gl,
        heads_out,
    } = ws;
    let conv = conv_silu(call, proj, st, (grow(conv, t * cd), grow(hist, 3 * cd)));
    let (qn, kn) = qk_norms(call, conv, (grow(qn, nk * t * dk), grow(kn, nk * t * dk)));
    let (beta, gl) = gates(call, proj, (grow(beta, nv * t), grow(gl, nv * t)));

    // 4. The chunked delta rule, one task per value head, on the state in place.
    let heads_out = grow(heads_out, nv * t * dv);
    st.rec
        .par_chunks_mut(dk * dv)
        .zip(heads_out.par_chunks_mut(t * dv))
        .enumerate()
        .for_each(|(h, (s, o))| {
            let j = h / ratio;
            let v = Mat {
                data: &conv[2 * kd + h * dv..],
                rows: t,
                cols: dv,
                ld: cd,
            };
            let head = HeadInputs {
                q: &qn[j * t * dk..(j + 1) * t * dk],
                k: &kn[j * t * dk..(j + 1) * t * dk],
                v,
                beta: &beta[h * t..(h + 1) * t],
                g: &gl[h * t..(h + 1) * t],
                dk,
            };
            delta_rule_head(kern, head, s, o);
        });
    gated_norm(call, proj, heads_out, core);
}

/// The first step: causal depthwise conv + SiLU into `conv` (`[t, conv_dim]`). Row `i − 3 + j` feeds tap `j`; rows
/// before the call come from the carried history, which then takes the call's last three rows (through
/// `new_hist`).
fn conv_silu<'w>(
    call: GdnCall<'_>,
    proj: Rows<'_>,
    st: &mut GdnState,
    (conv, new_hist): (&'w mut [f32], &mut [f32]),
) -> &'w [f32] {
    let GdnCall {
        cfg,
        kern,
        weights: g,
    } = call;
    let (t, ldp) = (proj.m, proj.ld);
    let cd = cfg.conv_dim();
    let pre = |i: usize| &proj.data[i * ldp..i * ldp + cd];
    let hist = &st.conv;
    conv.par_chunks_mut(cd).enumerate().for_each(|(i, out)| {
        let src = |back: usize| -> &[f32] {
            if i >= back {
                pre(i - back)
            } else {
                let h = 3 - (back - i);
                &hist[h * cd..(h + 1) * cd]
            }
        };
        let (x0, x1, x2, x3) = (src(3), src(2), src(1), src(0));
        let w = &g.conv_t;
        let (w0, w1, w2, w3) = (&w[..cd], &w[cd..2 * cd], &w[2 * cd..3 * cd], &w[3 * cd..]);
        wide!(kern, || {
            for c in 0..cd {
                out[c] = w0[c] * x0[c] + w1[c] * x1[c] + w2[c] * x2[c] + w3[c] * x3[c];
            }
        });
        math::silu_inplace(kern, out);
    });
    for r in 0..3 {
        // Row r of the new history is token t − 3 + r (possibly from the old history).
        let src: &[f32] = if t + r >= 3 {
            pre(t + r - 3)
        } else {
            &st.conv[(t + r) * cd..(t + r + 1) * cd]
        };
        new_hist[r * cd..(r + 1) * cd].copy_from_slice(src);
    }
    st.conv.copy_from_slice(new_hist);
    conv
}

/// The second step: L2-normalised q (times dk^-1/2) and k, per key head, head-major `[nk][t][dk]`.
fn qk_norms<'w>(
    call: GdnCall<'_>,
    conv: &[f32],
    (qn, kn): (&'w mut [f32], &'w mut [f32]),
) -> (&'w [f32], &'w [f32]) {
    let GdnCall { cfg, kern, .. } = call;
    let (dk, cd, kd) = (cfg.linear_key_head_dim, cfg.conv_dim(), cfg.key_dim());
    let t = conv.len() / cd;
    let scale = (dk as f32).powf(-0.5);
    qn.par_chunks_mut(t * dk)
        .zip(kn.par_chunks_mut(t * dk))
        .enumerate()
        .for_each(|(j, (qh, kh))| {
            wide!(kern, || {
                for i in 0..t {
                    let row = &conv[i * cd..(i + 1) * cd];
                    l2norm(
                        &row[j * dk..(j + 1) * dk],
                        &mut qh[i * dk..(i + 1) * dk],
                        Some(scale),
                    );
                    l2norm(
                        &row[kd + j * dk..kd + (j + 1) * dk],
                        &mut kh[i * dk..(i + 1) * dk],
                        None,
                    );
                }
            });
        });
    (qn, kn)
}

/// The third step: gates per value head, `[nv][t]`: β = sigmoid(b), g = −exp(A_log)·softplus(a + dt_bias).
fn gates<'w>(
    call: GdnCall<'_>,
    proj: Rows<'_>,
    (beta, gl): (&'w mut [f32], &'w mut [f32]),
) -> (&'w [f32], &'w [f32]) {
    let GdnCall {
        cfg, weights: g, ..
    } = call;
    let (t, ldp) = (proj.m, proj.ld);
    let (cd, vd, nv) = (cfg.conv_dim(), cfg.value_dim(), cfg.linear_num_value_heads);
    for i in 0..t {
        let row = &proj.data[i * ldp..];
        for h in 0..nv {
            beta[h * t + i] = math::sigmoid(row[cd + vd + h]);
            gl[h * t + i] = g.neg_a[h] * math::softplus(row[cd + vd + nv + h] + g.dt_bias[h]);
        }
    }
    (beta, gl)
}

/// The last step: gated RMSNorm per value head into `core`: ((o / rms(o)) · w) · silu(z).
fn gated_norm(call: GdnCall<'_>, proj: Rows<'_>, heads_out: &[f32], core: RowsMut<'_>) {
    let GdnCall {
        cfg,
        kern,
        weights: g,
    } = call;
    let (t, ldp) = (proj.m, proj.ld);
    let (cd, vd, nv, dv) = (
        cfg.conv_dim(),
        cfg.value_dim(),
        cfg.linear_num_value_heads,
        cfg.linear_value_head_dim,
    );
    let eps = cfg.rms_norm_eps;
    let RowsMut {
        data: core,
        ld: ldc,
    } = core;
    core.par_chunks_mut(ldc)
        .take(t)
        .enumerate()
        .for_each(|(i, y)| {
            let y = &mut y[..vd];
            let z = &proj.data[i * ldp + cd..i * ldp + cd + vd];
            y.copy_from_slice(z);
            math::silu_inplace(kern, y);
            wide!(kern, || {
                for h in 0..nv {
                    let o = &heads_out[h * t * dv + i * dv..h * t * dv + (i + 1) * dv];
                    let inv = math::rms_inv(o, eps);
                    for ((yd, od), w) in
                        y[h * dv..(h + 1) * dv].iter_mut().zip(o).zip(&g.norm[..dv])
                    {
                        *yd *= (od * inv) * w;
                    }
                }
            });
        });
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
