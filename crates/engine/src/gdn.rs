//! Gated DeltaNet, fast path: the causal conv with carried history, L2-normalised q/k, the gates, the
//! chunked (64) delta rule as matrix products (qwen35-arch §4.7, in the order HF's
//! `torch_chunk_gated_delta_rule` computes it), and the gated per-head RMSNorm.
//!
//! Chunks start at the first token of each call, so a prefix that ends on a multiple of 64 leaves the
//! continuation with exactly the chunks of a one-pass run, and the same arithmetic.

use rayon::prelude::*;

use crate::config::Qwen35Config;
use crate::kernels::math::flush_tiny;
use crate::kernels::matmul::{Mat, matmul, transpose};
use crate::kernels::{Kernels, Rows, RowsMut, math, wide};
use crate::model::layer::Acts;
use crate::model::linear::Linear;
use crate::pass::{Pass, Stack};
use crate::scratch::{GdnScratch, grow, with_tls};
use crate::stages::Stage;
use crate::state::{GdnState, LayerState, advance_gdn};

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

/// 1. Causal depthwise conv + SiLU into `conv` (`[t, conv_dim]`). Row `i − 3 + j` feeds tap `j`; rows
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

/// 2. L2-normalised q (times dk^-1/2) and k, per key head, head-major `[nk][t][dk]`.
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

/// 3. Gates per value head, `[nv][t]`: β = sigmoid(b), g = −exp(A_log)·softplus(a + dt_bias).
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

/// 5. Gated RMSNorm per value head into `core`: ((o / rms(o)) · w) · silu(z).
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

/// One value head's inputs to the delta rule over `t` tokens: `q`, `k` `[t, dk]` (normalised, q
/// scaled), `v` `[t, dv]`, the gates `beta` and `g` `[t]`.
#[derive(Debug, Clone, Copy)]
struct HeadInputs<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: Mat<'a>,
    beta: &'a [f32],
    g: &'a [f32],
    dk: usize,
}

/// The scratch of one head's chunk loop, each sized for one chunk (see [`delta_rule_head`]).
struct ChunkBufs<'a> {
    /// `[β⊙K ; Q]`.
    kbq: &'a mut [f32],
    /// `Kᵀ`.
    kt: &'a mut [f32],
    /// `[A ; P]`.
    ap: &'a mut [f32],
    decay: &'a mut [f32],
    /// `U`, then `V'`.
    u: &'a mut [f32],
    /// `[W ; Q⊙e^γ]`.
    wq: &'a mut [f32],
    /// `[W·S ; (Q⊙e^γ)·S]`.
    ws: &'a mut [f32],
    /// `P·V'`.
    pv: &'a mut [f32],
    /// `(K⊙e^{γ_last−γ})ᵀ`.
    kdt: &'a mut [f32],
    supd: &'a mut [f32],
    cum: &'a mut [f32],
    ecum: &'a mut [f32],
    etail: &'a mut [f32],
}

/// The gated delta rule for one value head over `t` tokens, chunk by chunk: `s`, the `[dk, dv]` state, is
/// updated in place; `o` gets the `[t, dv]` output.
fn delta_rule_head(kern: Kernels, head: HeadInputs<'_>, s: &mut [f32], o: &mut [f32]) {
    let HeadInputs { v, dk, .. } = head;
    let dv = v.cols;
    let c = CHUNK;
    let sizes = [
        2 * c * dk, // kbq: [β⊙K ; Q]
        dk * c,     // kt: Kᵀ
        2 * c * c,  // ap: [A ; P]
        c * c,      // decay
        c * dv,     // u: U, then V'
        2 * c * dk, // wq: [W ; Q⊙e^γ]
        2 * c * dv, // ws: [W·S ; (Q⊙e^γ)·S]
        c * dv,     // pv: P·V'
        dk * c,     // kdt: (K⊙e^{γ_last−γ})ᵀ
        dk * dv,    // supd
        c,          // cum
        c,          // ecum
        c,          // etail
    ];
    with_tls(sizes.iter().sum(), |buf| {
        let mut rest = buf;
        let mut take = |n: usize| {
            let (a, b) = std::mem::take(&mut rest).split_at_mut(n);
            rest = b;
            a
        };
        let bufs = ChunkBufs {
            kbq: take(sizes[0]),
            kt: take(sizes[1]),
            ap: take(sizes[2]),
            decay: take(sizes[3]),
            u: take(sizes[4]),
            wq: take(sizes[5]),
            ws: take(sizes[6]),
            pv: take(sizes[7]),
            kdt: take(sizes[8]),
            supd: take(sizes[9]),
            cum: take(sizes[10]),
            ecum: take(sizes[11]),
            etail: take(sizes[12]),
        };
        chunks(kern, head, s, o, bufs);
    });
}

/// The chunk loop of [`delta_rule_head`] on caller-provided buffers. The element-wise loops inside
/// (scaling, forward substitution) vectorise to the kernels' instruction set (AVX2 or AVX-512); they are plain loops
/// without reassociation, so the results are the same either way.
fn chunks(kern: Kernels, head: HeadInputs<'_>, s: &mut [f32], o: &mut [f32], bufs: ChunkBufs<'_>) {
    #[cfg(target_arch = "x86_64")]
    {
        use crate::kernels::Isa;
        /// # Safety
        /// AVX-512F must be available.
        #[target_feature(enable = "avx512f,avx2,fma")]
        unsafe fn zmm(
            kern: Kernels,
            head: HeadInputs<'_>,
            s: &mut [f32],
            o: &mut [f32],
            bufs: ChunkBufs<'_>,
        ) {
            chunks_impl(kern, head, s, o, bufs)
        }
        /// # Safety
        /// AVX2 and FMA must be available.
        #[target_feature(enable = "avx2,fma")]
        unsafe fn ymm(
            kern: Kernels,
            head: HeadInputs<'_>,
            s: &mut [f32],
            o: &mut [f32],
            bufs: ChunkBufs<'_>,
        ) {
            chunks_impl(kern, head, s, o, bufs)
        }
        match kern.isa() {
            // SAFETY: the kernels' instruction set is one this CPU has.
            Isa::Avx512 | Isa::Avx512Bf16 | Isa::Amx => {
                return unsafe { zmm(kern, head, s, o, bufs) };
            }
            // SAFETY: as above.
            Isa::Avx2 | Isa::AvxVnni => return unsafe { ymm(kern, head, s, o, bufs) },
            _ => {}
        }
    }
    chunks_impl(kern, head, s, o, bufs)
}

/// Row `r` of `dst` = row `r` of `src` × `scale[r]`, rows `d` wide: slice loops without index arithmetic,
/// so they vectorise.
#[inline(always)]
fn scale_rows(dst: &mut [f32], src: &[f32], scale: &[f32], d: usize) {
    for ((dr, sr), s) in dst.chunks_exact_mut(d).zip(src.chunks_exact(d)).zip(scale) {
        for (x, y) in dr.iter_mut().zip(sr) {
            *x = y * s;
        }
    }
}

/// `dst += coefs[s] · rows[s]` for each `s` in order, rows `d` wide and dense: per element the same
/// products and sums in the same order as a loop over `s` outside and the columns inside, but with the
/// running row held in registers 64 columns at a time instead of loaded and stored once per term
/// (the forward substitution's rows inside a block: up to 15 terms).
#[inline(always)]
fn add_scaled_rows(dst: &mut [f32], rows: &[f32], coefs: &[f32], d: usize) {
    const W: usize = 64;
    let mut chunks = dst.chunks_exact_mut(W);
    for (ci, out) in (&mut chunks).enumerate() {
        let out: &mut [f32; W] = out.try_into().expect("W columns");
        let mut acc = *out;
        for (s, &coef) in coefs.iter().enumerate() {
            let src: &[f32; W] = rows[s * d + ci * W..s * d + (ci + 1) * W]
                .try_into()
                .expect("W columns");
            for (x, y) in acc.iter_mut().zip(src) {
                *x += coef * y;
            }
        }
        *out = acc;
    }
    let tail = chunks.into_remainder();
    let c0 = d - tail.len();
    for (s, &coef) in coefs.iter().enumerate() {
        for (x, y) in tail.iter_mut().zip(&rows[s * d + c0..(s + 1) * d]) {
            *x += coef * y;
        }
    }
}

/// Subnormal f32 are kept out of the chunk products (see [`math::TINY`]): with strong decays the
/// products of decayed terms fall there in bulk — the 0.8B synthetic release spent a quarter of its
/// AVX2 forward in these products, 4× their FLOP share. So every operand of a product is either zero or
/// at least `TINY` in magnitude: decays below e^−40 are taken as exactly 0 ([`cut`]) and the buffers
/// that feed a product are flushed once they are final.
const LOG_DECAY_CUT: f32 = -40.0;

#[inline(always)]
fn cut(log_decay: f32) -> f32 {
    if log_decay < LOG_DECAY_CUT {
        f32::NEG_INFINITY
    } else {
        log_decay
    }
}

#[inline(always)]
fn chunks_impl(
    kern: Kernels,
    head: HeadInputs<'_>,
    s: &mut [f32],
    o: &mut [f32],
    mut bufs: ChunkBufs<'_>,
) {
    let t = head.beta.len();
    let mut t0 = 0;
    while t0 < t {
        let l = (t - t0).min(CHUNK);
        let chunk = Chunk { t0, l };
        let chunk_decay = chunk_gates(kern, &head.g[t0..t0 + l], &mut bufs);
        scores(kern, head, chunk, s, &mut bufs);
        substitute(kern, head, chunk, &mut bufs);
        finish_chunk(kern, head, chunk, (s, o, chunk_decay), &mut bufs);
        t0 += l;
    }
}

/// The tokens `t0..t0 + l` of one chunk.
#[derive(Clone, Copy)]
struct Chunk {
    t0: usize,
    l: usize,
}

/// γ, the cumulative log-decay inside the chunk (`cum`), `e^γ` (`ecum`), `e^{γ_last − γ}` (`etail`);
/// returns `e^{γ_last}`.
#[inline(always)]
fn chunk_gates(kern: Kernels, g: &[f32], b: &mut ChunkBufs<'_>) -> f32 {
    let l = g.len();
    let mut acc = 0f32;
    for r in 0..l {
        acc += g[r];
        b.cum[r] = acc;
    }
    let last = b.cum[l - 1];
    for r in 0..l {
        b.ecum[r] = cut(b.cum[r]);
        b.etail[r] = cut(last - b.cum[r]);
    }
    math::exp_inplace(kern, &mut b.ecum[..l]);
    math::exp_inplace(kern, &mut b.etail[..l]);
    let mut chunk_decay = [cut(last)];
    math::exp_inplace(kern, &mut chunk_decay);
    chunk_decay[0]
}

/// `[β⊙K ; Q] · Kᵀ` with the pairwise decays: the UT system, negated (rows `0..l` of `ap`: −A, so the
/// solve adds matrix products), and the intra-chunk scores P (rows `l..2l`).
#[inline(always)]
fn scores(kern: Kernels, head: HeadInputs<'_>, c: Chunk, s: &mut [f32], b: &mut ChunkBufs<'_>) {
    let (Chunk { t0, l }, dk) = (c, head.dk);
    let kc = &head.k[t0 * dk..(t0 + l) * dk];
    let qc = &head.q[t0 * dk..(t0 + l) * dk];
    scale_rows(&mut b.kbq[..l * dk], kc, &head.beta[t0..t0 + l], dk);
    b.kbq[l * dk..2 * l * dk].copy_from_slice(qc);
    transpose(kc, l, dk, dk, b.kt);
    flush_tiny(&mut b.kbq[..2 * l * dk]);
    flush_tiny(&mut b.kt[..dk * l]);
    flush_tiny(s);
    matmul(
        kern,
        Mat::new(&b.kbq[..2 * l * dk], 2 * l, dk),
        Mat::new(&b.kt[..dk * l], dk, l),
        b.ap,
        l,
        false,
    );
    // Pairwise decays exp(γ_r − γ_s) on and below the diagonal, 0 above (masked before the exp).
    for r in 0..l {
        for s2 in 0..l {
            b.decay[r * l + s2] = if s2 <= r {
                cut(b.cum[r] - b.cum[s2])
            } else {
                f32::NEG_INFINITY
            };
        }
    }
    math::exp_inplace(kern, &mut b.decay[..l * l]);
    for x in 0..l * l {
        b.ap[x] = -(b.ap[x] * b.decay[x]);
        b.ap[l * l + x] *= b.decay[x];
    }
    flush_tiny(&mut b.ap[..2 * l * l]);
}

/// Forward substitution with the unit lower-triangular (I + strict(A)), held negated in `ap`:
/// U = solve(β⊙V), W = solve(β⊙K⊙e^γ) (W in the top half of `wq`). Blocks of SB rows: the part from
/// earlier blocks is one matrix product per block, the rest row by row.
#[inline(always)]
fn substitute(kern: Kernels, head: HeadInputs<'_>, c: Chunk, b: &mut ChunkBufs<'_>) {
    const SB: usize = 16;
    let (Chunk { t0, l }, dk, v) = (c, head.dk, head.v);
    let dv = v.cols;
    let (u, wq, ap) = (&mut *b.u, &mut *b.wq, &*b.ap);
    let mut r0 = 0;
    while r0 < l {
        let r1 = (r0 + SB).min(l);
        for r in r0..r1 {
            let bt = head.beta[t0 + r];
            let vrow = &v.data[(t0 + r) * v.ld..(t0 + r) * v.ld + dv];
            for (x, vv) in u[r * dv..(r + 1) * dv].iter_mut().zip(vrow) {
                *x = vv * bt;
            }
        }
        scale_rows(
            &mut wq[r0 * dk..r1 * dk],
            &b.kbq[r0 * dk..r1 * dk],
            &b.ecum[r0..r1],
            dk,
        );
        flush_tiny(&mut u[r0 * dv..r1 * dv]);
        flush_tiny(&mut wq[r0 * dk..r1 * dk]);
        if r0 > 0 {
            let m_blk = Mat {
                data: &ap[r0 * l..],
                rows: r1 - r0,
                cols: r0,
                ld: l,
            };
            let (done, cur) = u.split_at_mut(r0 * dv);
            let cur = &mut cur[..(r1 - r0) * dv];
            matmul(kern, m_blk, Mat::new(done, r0, dv), cur, dv, true);
            let (done, cur) = wq.split_at_mut(r0 * dk);
            let cur = &mut cur[..(r1 - r0) * dk];
            matmul(kern, m_blk, Mat::new(done, r0, dk), cur, dk, true);
        }
        // Each row is final (an operand of the rows after it) once its own sums are done.
        flush_tiny(&mut u[r0 * dv..(r0 + 1) * dv]);
        flush_tiny(&mut wq[r0 * dk..(r0 + 1) * dk]);
        for r in r0 + 1..r1 {
            let coefs = &ap[r * l + r0..r * l + r];
            let (done, cur) = u.split_at_mut(r * dv);
            let ur = &mut cur[..dv];
            add_scaled_rows(ur, &done[r0 * dv..], coefs, dv);
            let (wdone, wcur) = wq.split_at_mut(r * dk);
            let wr = &mut wcur[..dk];
            add_scaled_rows(wr, &wdone[r0 * dk..], coefs, dk);
            flush_tiny(ur);
            flush_tiny(wr);
        }
        r0 = r1;
    }
}

/// The chunk's output `O = (Q⊙e^γ)·S + P·V'` with `V' = U − W·S`, and the state carried to the next chunk:
/// `S ← e^{γ_last}·S + (K ⊙ e^{γ_last − γ})ᵀ · V'`.
#[inline(always)]
fn finish_chunk(
    kern: Kernels,
    head: HeadInputs<'_>,
    c: Chunk,
    (s, o, chunk_decay): (&mut [f32], &mut [f32], f32),
    b: &mut ChunkBufs<'_>,
) {
    let (Chunk { t0, l }, dk, dv) = (c, head.dk, head.v.cols);
    let qc = &head.q[t0 * dk..(t0 + l) * dk];
    // Bottom half of `wq`: Q ⊙ e^γ. Then [W ; Q⊙e^γ] · S.
    scale_rows(&mut b.wq[l * dk..2 * l * dk], qc, &b.ecum[..l], dk);
    flush_tiny(&mut b.wq[l * dk..2 * l * dk]);
    matmul(
        kern,
        Mat::new(&b.wq[..2 * l * dk], 2 * l, dk),
        Mat::new(s, dk, dv),
        b.ws,
        dv,
        false,
    );
    // V' = U − W·S (into u).
    for x in 0..l * dv {
        b.u[x] -= b.ws[x];
    }
    flush_tiny(&mut b.u[..l * dv]);
    matmul(
        kern,
        Mat::new(&b.ap[l * l..2 * l * l], l, l),
        Mat::new(&b.u[..l * dv], l, dv),
        b.pv,
        dv,
        false,
    );
    for ((dst, a), p) in o[t0 * dv..(t0 + l) * dv]
        .iter_mut()
        .zip(&b.ws[l * dv..2 * l * dv])
        .zip(&b.pv[..l * dv])
    {
        *dst = a + p;
    }
    // From `kt` (= Kᵀ, flushed): a value it flushed is below TINY, and so is its product with a
    // decay ≤ 1, which the flush below zeroes, so this is the same as scaling K's rows.
    for (dst, src) in b.kdt[..dk * l]
        .chunks_exact_mut(l)
        .zip(b.kt[..dk * l].chunks_exact(l))
    {
        for ((x, y), e) in dst.iter_mut().zip(src).zip(&b.etail[..l]) {
            *x = y * e;
        }
    }
    flush_tiny(&mut b.kdt[..dk * l]);
    matmul(
        kern,
        Mat::new(&b.kdt[..dk * l], dk, l),
        Mat::new(&b.u[..l * dv], l, dv),
        b.supd,
        dv,
        false,
    );
    for (x, y) in s.iter_mut().zip(b.supd.iter()) {
        *x = *x * chunk_decay + y;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The per-token recurrence of qwen35-arch §4.6 for one head.
    fn recurrent(head: HeadInputs<'_>, s: &mut [f32]) -> Vec<f32> {
        let HeadInputs {
            q,
            k,
            v,
            beta,
            g,
            dk,
        } = head;
        let (dv, v) = (v.cols, |i: usize, b: usize| v.data[i * v.ld + b]);
        let t = beta.len();
        let mut o = vec![0f32; t * dv];
        for i in 0..t {
            let al = g[i].exp();
            for x in s.iter_mut() {
                *x *= al;
            }
            let kk = &k[i * dk..(i + 1) * dk];
            let mut u = vec![0f32; dv];
            for b in 0..dv {
                let mut p = 0f32;
                for a in 0..dk {
                    p += s[a * dv + b] * kk[a];
                }
                u[b] = beta[i] * (v(i, b) - p);
            }
            for a in 0..dk {
                for b in 0..dv {
                    s[a * dv + b] += kk[a] * u[b];
                }
            }
            for b in 0..dv {
                let mut p = 0f32;
                for a in 0..dk {
                    p += s[a * dv + b] * q[i * dk + a];
                }
                o[i * dv + b] = p;
            }
        }
        o
    }

    /// The register-held substitution rows give the bits of the plain loop (terms outside, columns
    /// inside), whole 64-column chunks and tails alike.
    #[test]
    fn add_scaled_rows_is_the_plain_loop_bit_for_bit() {
        let mut seed = 11u64;
        for d in [1usize, 24, 64, 100, 128, 192] {
            for terms in [0usize, 1, 7, 15] {
                let rows = rand_vec(terms * d, &mut seed, 3.0);
                let coefs = rand_vec(terms, &mut seed, 1.0);
                let start = rand_vec(d, &mut seed, 1.0);
                let mut want = start.clone();
                for (s, &c) in coefs.iter().enumerate() {
                    for (x, y) in want.iter_mut().zip(&rows[s * d..(s + 1) * d]) {
                        *x += c * y;
                    }
                }
                let mut got = start.clone();
                add_scaled_rows(&mut got, &rows, &coefs, d);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "d {d}, {terms} terms");
            }
        }
    }

    fn rand_vec(n: usize, seed: &mut u64, scale: f32) -> Vec<f32> {
        (0..n)
            .map(|_| {
                *seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((*seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0 * scale
            })
            .collect()
    }

    fn unit_rows(x: &mut [f32], d: usize) {
        for row in x.chunks_mut(d) {
            let n = row.iter().map(|v| v * v).sum::<f32>().sqrt();
            row.iter_mut().for_each(|v| *v /= n);
        }
    }

    #[test]
    fn chunked_matches_recurrent() {
        // Mild decays, and strong ones (up to e^−10.5 a token, far past e^−87 across a chunk) whose
        // decayed products fall below the subnormal floor unless flushed (`TINY`).
        let cases = [
            (150, 16, 24, 0.3),
            (64, 8, 8, 0.3),
            (7, 32, 16, 0.3),
            (200, 128, 128, 0.3),
            (200, 128, 128, 8.0),
            (130, 16, 24, 8.0),
        ];
        for kern in Kernels::available() {
            for (t, dk, dv, strength) in cases {
                let mut seed = 7;
                let mut q = rand_vec(t * dk, &mut seed, 1.0);
                let mut k = rand_vec(t * dk, &mut seed, 1.0);
                unit_rows(&mut q, dk);
                unit_rows(&mut k, dk);
                let v = rand_vec(t * dv, &mut seed, 2.0);
                let beta: Vec<f32> = rand_vec(t, &mut seed, 4.0)
                    .iter()
                    .map(|x| math::sigmoid(*x))
                    .collect();
                let g: Vec<f32> = rand_vec(t, &mut seed, 1.0)
                    .iter()
                    .map(|x| -strength * math::softplus(*x))
                    .collect();
                let s0 = rand_vec(dk * dv, &mut seed, 0.5);
                let mut s_ref = s0.clone();
                let head = HeadInputs {
                    q: &q,
                    k: &k,
                    v: Mat::new(&v, t, dv),
                    beta: &beta,
                    g: &g,
                    dk,
                };
                let o_ref = recurrent(head, &mut s_ref);
                let mut s = s0.clone();
                let mut o = vec![0f32; t * dv];
                delta_rule_head(kern, head, &mut s, &mut o);
                let max_o = o_ref.iter().fold(0f32, |m, x| m.max(x.abs()));
                let err_o = o
                    .iter()
                    .zip(&o_ref)
                    .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
                let max_s = s_ref.iter().fold(0f32, |m, x| m.max(x.abs()));
                let err_s = s
                    .iter()
                    .zip(&s_ref)
                    .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
                assert!(
                    err_o <= 2e-5 * max_o,
                    "{t}×{dk}×{dv}: out {err_o} of {max_o}"
                );
                assert!(
                    err_s <= 2e-5 * max_s,
                    "{t}×{dk}×{dv}: state {err_s} of {max_s}"
                );
            }
        }
    }
}
