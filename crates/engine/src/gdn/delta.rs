//! The chunked gated delta rule of one value head (qwen35-arch §4.7, in the order HF's
//! `torch_chunk_gated_delta_rule` computes it): per chunk of 64 tokens the UT system and intra-chunk scores,
//! a forward substitution, the chunk's output and the state carried to the next chunk, all as matrix
//! products on the kernels' instruction set.

use crate::kernels::math::flush_tiny;
use crate::kernels::matmul::{Mat, matmul, transpose};
use crate::kernels::{Kernels, math};
use crate::scratch::with_tls;

use super::CHUNK;

#[cfg(test)]
mod tests;

/// One value head's inputs to the delta rule over `t` tokens: `q`, `k` `[t, dk]` (normalised, q
/// scaled), `v` `[t, dv]`, the gates `beta` and `g` `[t]`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HeadInputs<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: Mat<'a>,
    pub beta: &'a [f32],
    pub g: &'a [f32],
    pub dk: usize,
}

/// The scratch of one key head's chunk loop, each sized for one chunk (see [`delta_rule_heads`]).
struct ChunkBufs<'a> {
    /// `β⊙K`.
    kb: &'a mut [f32],
    /// `Kᵀ`, shared by the value heads of one key head.
    kt: &'a mut [f32],
    /// `Q` (flushed), shared.
    qf: &'a mut [f32],
    /// `Q·Kᵀ`, shared.
    qk: &'a mut [f32],
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
#[cfg(test)]
pub(crate) fn delta_rule_head(kern: Kernels, head: HeadInputs<'_>, s: &mut [f32], o: &mut [f32]) {
    delta_rule_heads(kern, &[head], s, o);
}

/// The gated delta rule for the value heads of one key head (the same `q` and `k`) over `t` tokens, chunk
/// by chunk and head by head inside each chunk, so the chunk's `Kᵀ` and `Q·Kᵀ` are made once: `states`
/// holds their `[dk, dv]` states one after another (updated in place), `outs` gets their `[t, dv]` outputs.
/// Each head's bits are those it gets run alone: every element of a product is its own FMA chain, whichever
/// product it is in.
pub(crate) fn delta_rule_heads(
    kern: Kernels,
    heads: &[HeadInputs<'_>],
    states: &mut [f32],
    outs: &mut [f32],
) {
    let Some(&HeadInputs { v, dk, .. }) = heads.first() else {
        return;
    };
    assert!(
        heads
            .iter()
            .all(|h| std::ptr::eq(h.q, heads[0].q) && std::ptr::eq(h.k, heads[0].k)),
        "delta rule: heads of one key head share q and k"
    );
    let (t, dv) = (heads[0].beta.len(), v.cols);
    assert!(
        heads
            .iter()
            .all(|h| h.beta.len() == t && h.g.len() == t && h.v.rows == t),
        "delta rule: heads of one call cover the same tokens"
    );
    assert!(
        states.len() == heads.len() * dk * dv && outs.len() == heads.len() * t * dv,
        "delta rule: one state and one output per head"
    );
    let c = CHUNK;
    let sizes = [
        c * dk,     // kb: β⊙K
        dk * c,     // kt: Kᵀ
        c * dk,     // qf: Q
        c * c,      // qk: Q·Kᵀ
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
            kb: take(sizes[0]),
            kt: take(sizes[1]),
            qf: take(sizes[2]),
            qk: take(sizes[3]),
            ap: take(sizes[4]),
            decay: take(sizes[5]),
            u: take(sizes[6]),
            wq: take(sizes[7]),
            ws: take(sizes[8]),
            pv: take(sizes[9]),
            kdt: take(sizes[10]),
            supd: take(sizes[11]),
            cum: take(sizes[12]),
            ecum: take(sizes[13]),
            etail: take(sizes[14]),
        };
        chunks(kern, heads, states, outs, bufs);
    });
}

/// The chunk loop of [`delta_rule_heads`] on caller-provided buffers. The element-wise loops inside
/// (scaling, forward substitution) vectorise to the kernels' instruction set (AVX2 or AVX-512); they are plain loops
/// without reassociation, so the results are the same either way.
fn chunks(
    kern: Kernels,
    heads: &[HeadInputs<'_>],
    s: &mut [f32],
    o: &mut [f32],
    bufs: ChunkBufs<'_>,
) {
    #[cfg(target_arch = "x86_64")]
    {
        use crate::kernels::Isa;
        /// # Safety
        /// AVX-512F must be available.
        #[target_feature(enable = "avx512f,avx2,fma")]
        unsafe fn zmm(
            kern: Kernels,
            heads: &[HeadInputs<'_>],
            s: &mut [f32],
            o: &mut [f32],
            bufs: ChunkBufs<'_>,
        ) {
            chunks_impl(kern, heads, s, o, bufs)
        }
        /// # Safety
        /// AVX2 and FMA must be available.
        #[target_feature(enable = "avx2,fma")]
        unsafe fn ymm(
            kern: Kernels,
            heads: &[HeadInputs<'_>],
            s: &mut [f32],
            o: &mut [f32],
            bufs: ChunkBufs<'_>,
        ) {
            chunks_impl(kern, heads, s, o, bufs)
        }
        match kern.isa() {
            // SAFETY: the kernels' instruction set is one this CPU has.
            Isa::Avx512 | Isa::Avx512Bf16 | Isa::Amx => {
                return unsafe { zmm(kern, heads, s, o, bufs) };
            }
            // SAFETY: as above.
            Isa::Avx2 | Isa::AvxVnni => return unsafe { ymm(kern, heads, s, o, bufs) },
            _ => {}
        }
    }
    chunks_impl(kern, heads, s, o, bufs)
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
    heads: &[HeadInputs<'_>],
    states: &mut [f32],
    outs: &mut [f32],
    mut bufs: ChunkBufs<'_>,
) {
    let (t, dk, dv) = (heads[0].beta.len(), heads[0].dk, heads[0].v.cols);
    let mut t0 = 0;
    while t0 < t {
        let l = (t - t0).min(CHUNK);
        let chunk = Chunk { t0, l };
        shared_scores(kern, heads[0], chunk, &mut bufs);
        for (head, (s, o)) in heads
            .iter()
            .zip(states.chunks_mut(dk * dv).zip(outs.chunks_mut(t * dv)))
        {
            let chunk_decay = chunk_gates(kern, &head.g[t0..t0 + l], &mut bufs);
            scores(kern, *head, chunk, s, &mut bufs);
            substitute(kern, *head, chunk, &mut bufs);
            finish_chunk(kern, *head, chunk, (s, o, chunk_decay), &mut bufs);
        }
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
    for (c, gr) in b.cum[..l].iter_mut().zip(g) {
        acc += gr;
        *c = acc;
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

/// What the value heads of one key head share in a chunk: `Kᵀ` and `Q·Kᵀ` (both from flushed operands).
#[inline(always)]
fn shared_scores(kern: Kernels, head: HeadInputs<'_>, c: Chunk, b: &mut ChunkBufs<'_>) {
    let (Chunk { t0, l }, dk) = (c, head.dk);
    let kc = &head.k[t0 * dk..(t0 + l) * dk];
    b.qf[..l * dk].copy_from_slice(&head.q[t0 * dk..(t0 + l) * dk]);
    transpose(kc, l, dk, dk, b.kt);
    flush_tiny(&mut b.qf[..l * dk]);
    flush_tiny(&mut b.kt[..dk * l]);
    matmul(
        kern,
        Mat::new(&b.qf[..l * dk], l, dk),
        Mat::new(&b.kt[..dk * l], dk, l),
        b.qk,
        l,
        false,
    );
}

/// `[β⊙K ; Q] · Kᵀ` with the pairwise decays: the UT system, negated (rows `0..l` of `ap`: −A, so the
/// solve adds matrix products), and the intra-chunk scores P (rows `l..2l`, from the shared `Q·Kᵀ`).
#[inline(always)]
fn scores(kern: Kernels, head: HeadInputs<'_>, c: Chunk, s: &mut [f32], b: &mut ChunkBufs<'_>) {
    let (Chunk { t0, l }, dk) = (c, head.dk);
    let kc = &head.k[t0 * dk..(t0 + l) * dk];
    scale_rows(&mut b.kb[..l * dk], kc, &head.beta[t0..t0 + l], dk);
    flush_tiny(&mut b.kb[..l * dk]);
    flush_tiny(s);
    matmul(
        kern,
        Mat::new(&b.kb[..l * dk], l, dk),
        Mat::new(&b.kt[..dk * l], dk, l),
        b.ap,
        l,
        false,
    );
    b.ap[l * l..2 * l * l].copy_from_slice(&b.qk[..l * l]);
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
            &b.kb[r0 * dk..r1 * dk],
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
