//! Gated full attention, fast path: per-head q/k RMSNorm (`x·(1+w)`), partial NeoX RoPE, the key/value
//! cache, causal softmax in f32 and the sigmoid output gate (qwen35-arch §5).
//!
//! Tiled ("flash") attention: for a block of 64 queries of one head, key tiles of 64 positions go through
//! a score product, an online softmax (running max and sum per query) and a weighted-sum product, so
//! memory per task stays a few tiles whatever the state length, and every product runs on the vector
//! kernels. Tasks are (head, query block) pairs on all threads. A query's softmax runs only over the
//! keys it may see; the masked part of its tile is zero, and adding `0·v` leaves an f32 sum unchanged, so
//! a query's result does not depend on which other queries share its block: a continuation from a cached
//! prefix reproduces the one-pass result bit for bit.

use std::sync::Arc;

use rayon::prelude::*;

use crate::config::Qwen35Config;
use crate::kernels::matmul::{Mat, matmul};
use crate::kernels::{Kernels, Rows, RowsMut, SafePoint, SendPtr, math, wide};
use crate::model::linear::Linear;
use crate::pass::{Acts, Pass, Stack};
use crate::scratch::{AttnScratch, Buf, grow, with_tls};
use crate::stages::Stage;
use crate::state::{KvCache, KvSeg, LayerState};

/// Queries per score block.
const QB: usize = 64;

/// `x·(1+w)` RMSNorm of one head vector (`w1p` = `1 + w`), then RoPE with the given cos/sin rows.
#[inline(always)]
fn norm_rope(src: &[f32], w1p: &[f32], eps: f32, cos: &[f32], sin: &[f32], dst: &mut [f32]) {
    math::rms_norm(src, w1p, eps, dst);
    let half = cos.len();
    for i in 0..half {
        let (a, b) = (dst[i], dst[i + half]);
        // x·cos + rotate_half(x)·sin, two products then the sum, as HF does.
        dst[i] = a * cos[i] + (-b) * sin[i];
        dst[i + half] = b * cos[i] + a * sin[i];
    }
}

/// cos/sin of `pos · inv_freq[i]` (angle rounded to f32 as torch computes it; cos/sin evaluated exactly).
pub(crate) fn rope_table(inv_freq: &[f32], pos0: usize, t: usize) -> (Vec<f32>, Vec<f32>) {
    let half = inv_freq.len();
    let mut cos = vec![0f32; t * half];
    let mut sin = vec![0f32; t * half];
    for i in 0..t {
        for (j, f) in inv_freq.iter().enumerate() {
            let ang = (pos0 + i) as f32 * f;
            cos[i * half + j] = (ang as f64).cos() as f32;
            sin[i * half + j] = (ang as f64).sin() as f32;
        }
    }
    (cos, sin)
}

/// A gated attention mixer's weights (`self_attn`).
#[derive(Debug)]
pub(crate) struct Attention {
    /// Fused `[q_proj (query+gate interleaved per head); k_proj; v_proj]`.
    pub qkv: Linear,
    /// `1 + q_norm.weight`.
    pub q_norm: Vec<f32>,
    /// `1 + k_norm.weight`.
    pub k_norm: Vec<f32>,
    pub o_proj: Linear,
}

impl Attention {
    /// The mixer over the stacked rows' normed inputs (`a.hn`): the fused q/k/v projection for every token,
    /// then per row the attention over its key/value cache of layer `li` (this call's keys and values
    /// appended), the gated output to `a.core` (the input of `o_proj`).
    pub fn forward(&self, li: usize, pass: &Pass<'_>, stack: &mut Stack<'_, '_>, a: &mut Acts<'_>) {
        let (m, h) = (stack.m, pass.cfg.hidden_size);
        let ldp = self.qkv.n();
        self.qkv.apply(
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
        let (cfg, kern, inv_freq, pause, ldc) =
            (pass.cfg, pass.kern, pass.inv_freq, pass.pause, a.ldc);
        let proj: &[f32] = a.proj;
        stack.each_row(
            li,
            (&mut a.core[..m * ldc], ldc),
            a.attn,
            |st, span, core, ws| {
                let LayerState::Attn(kv) = st else {
                    unreachable!("state layout checked")
                };
                let call = AttnCall {
                    cfg,
                    kern,
                    inv_freq,
                    weights: self,
                    pos0: span.pos0,
                    pause,
                };
                let rows = Rows {
                    m: span.to - span.from,
                    data: &proj[span.from * ldp..span.to * ldp],
                    ld: ldp,
                };
                run(
                    call,
                    rows,
                    kv,
                    RowsMut {
                        data: core,
                        ld: ldc,
                    },
                    ws,
                );
            },
        );
        pass.mark(Stage::Attention);
    }
}

/// What one attention call runs with: the model, its kernels and RoPE frequencies, the layer's weights,
/// the row's position before the call, and where it may pause.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AttnCall<'a> {
    pub cfg: &'a Qwen35Config,
    pub kern: Kernels,
    pub inv_freq: &'a [f32],
    pub weights: &'a Attention,
    pub pos0: usize,
    pub pause: SafePoint<'a>,
}

/// [`grow`] with room for the state to grow by half again: a long state advances piece by piece, and
/// replacing its panels at every piece unmapped and faulted in tens of megabytes per call (time of its
/// own, and the address-space lock every other thread's page faults wait on).
fn grow_ahead(v: &mut crate::scratch::Buf, n: usize) -> &mut [f32] {
    if v.len() < n {
        *v = crate::scratch::Buf::zeroed(n + n / 2);
    }
    &mut v[..n]
}

/// Run one attention mixer over the `proj.m` tokens of one row at positions `pos0..pos0 + proj.m`.
///
/// `proj` holds the fused projection rows (`[q+gate interleaved per head | k | v]`); the gated attention
/// output (the input of `o_proj`) goes to `core` (one row of `heads·head_dim` per token). This call's keys
/// and values are appended to `kv` as a new shared segment.
pub(crate) fn run(
    call: AttnCall<'_>,
    proj: Rows<'_>,
    kv: &mut KvCache,
    core: RowsMut<'_>,
    ws: &mut AttnScratch,
) {
    let q = queries_and_keys(call, proj, kv, &mut ws.q);
    kv_panels(call.cfg, kv, &mut ws.kv);
    attend(call, (proj, q), kv.len, &ws.kv, core);
}

/// Normalised, rotated queries `[t, nh, hd]` (into `q`), and this call's keys/values `[t, nkv, hd]`
/// appended to `kv` as a new segment.
fn queries_and_keys<'w>(
    call: AttnCall<'_>,
    proj: Rows<'_>,
    kv: &mut KvCache,
    q: &'w mut crate::scratch::Buf,
) -> &'w [f32] {
    let AttnCall {
        cfg,
        kern,
        inv_freq,
        weights: a,
        pos0,
        ..
    } = call;
    let (t, ldp) = (proj.m, proj.ld);
    let (nh, nkv, hd) = (
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.head_dim,
    );
    let qd = nh * hd;
    let eps = cfg.rms_norm_eps;
    let half = inv_freq.len();
    let (cos, sin) = rope_table(inv_freq, pos0, t);
    let q = grow(q, t * qd);
    let mut seg_k = crate::state::buffer(t * nkv * hd, None);
    let mut seg_v = crate::state::buffer(t * nkv * hd, None);
    q.par_chunks_mut(qd)
        .zip(seg_k.par_chunks_mut(nkv * hd))
        .zip(seg_v.par_chunks_mut(nkv * hd))
        .enumerate()
        .for_each(|(i, ((qrow, krow), vrow))| {
            let row = &proj.data[i * ldp..];
            let (c, s) = (
                &cos[i * half..(i + 1) * half],
                &sin[i * half..(i + 1) * half],
            );
            wide!(kern, || {
                for h in 0..nh {
                    let src = &row[2 * hd * h..2 * hd * h + hd];
                    norm_rope(src, &a.q_norm, eps, c, s, &mut qrow[h * hd..(h + 1) * hd]);
                }
                for g in 0..nkv {
                    let src = &row[2 * qd + g * hd..2 * qd + (g + 1) * hd];
                    norm_rope(src, &a.k_norm, eps, c, s, &mut krow[g * hd..(g + 1) * hd]);
                }
            });
            vrow.copy_from_slice(&row[2 * qd + nkv * hd..2 * qd + 2 * nkv * hd]);
        });
    kv.segs.push(Arc::new(KvSeg {
        len: t,
        k: seg_k,
        v: seg_v,
    }));
    kv.len += t;
    q
}

/// Per kv head, every position so far, laid out as the products of [`attend`] read them: Kᵀ in panels of
/// 64 positions (`[n/64][hd][64]`) and V in panels of 64 dims (`[hd/64][n][64]`), both dense, so the
/// score and weighted-sum products stream them without copies. One task per (kv head, 64 positions).
fn kv_panels(cfg: &Qwen35Config, cache: &KvCache, panels_of: &mut Vec<(Buf, Buf)>) {
    let (nkv, hd, n) = (cfg.num_key_value_heads, cfg.head_dim, cache.len);
    if panels_of.len() < nkv {
        panels_of.resize_with(nkv, Default::default);
    }
    let (kpan, vpan) = (n.div_ceil(64), hd.div_ceil(64));
    // Where each segment starts, so a panel finds its positions without walking the list.
    let mut starts = Vec::with_capacity(cache.segs.len());
    let mut acc = 0;
    for seg in &cache.segs {
        starts.push(acc);
        acc += seg.len;
    }
    let panels: Vec<(SendPtr<f32>, SendPtr<f32>)> = panels_of[..nkv]
        .iter_mut()
        .map(|(kt, vt)| {
            let kt = grow_ahead(kt, kpan * hd * 64);
            let vt = grow_ahead(vt, vpan * n * 64);
            (SendPtr(kt.as_mut_ptr()), SendPtr(vt.as_mut_ptr()))
        })
        .collect();
    (0..nkv * kpan).into_par_iter().for_each(|task| {
        let (g, p) = (task / kpan, task % kpan);
        let (kt, vt) = (panels[g].0, panels[g].1);
        let mut si = starts.partition_point(|s| *s <= 64 * p) - 1;
        for pos in 64 * p..(64 * p + 64).min(n) {
            while pos >= starts[si] + cache.segs[si].len {
                si += 1;
            }
            let (seg, i) = (&cache.segs[si], pos - starts[si]);
            let src = (i * nkv + g) * hd;
            let (kr, vr) = (&seg.k[src..src + hd], &seg.v[src..src + hd]);
            let kbase = p * hd * 64 + pos % 64;
            // SAFETY: panel p of head g owns Kᵀ columns 64p.. of its panel and V rows 64p..64p+64 of
            // every dim block: disjoint across tasks, inside the buffers grown above.
            unsafe {
                for (d, x) in kr.iter().enumerate() {
                    *kt.get().add(kbase + d * 64) = *x;
                }
                for (d, x) in vr.iter().enumerate() {
                    *vt.get().add(((d / 64) * n + pos) * 64 + d % 64) = *x;
                }
            }
        }
    });
}

/// Flash-style attention of the `t` queries over the `n` positions' panels: per (head, block of 64
/// queries), key tiles of 64 positions with an online softmax (running max and sum, output rescaled when
/// the max grows), then the sigmoid gate, into `core`. Tiles are cut at absolute key positions and a query
/// skips the tiles it cannot see, so a query's arithmetic does not depend on which queries share its block,
/// nor on a prefix having been cached: continuations stay bit-equal.
fn attend(
    call: AttnCall<'_>,
    (proj, q): (Rows<'_>, &[f32]),
    n: usize,
    per: &[(Buf, Buf)],
    core: RowsMut<'_>,
) {
    let AttnCall {
        cfg,
        kern,
        pos0,
        pause,
        ..
    } = call;
    let (t, ldp) = (proj.m, proj.ld);
    let RowsMut {
        data: core,
        ld: ldc,
    } = core;
    let (nh, nkv, hd) = (
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.head_dim,
    );
    let (qd, vpan) = (nh * hd, hd.div_ceil(64));
    let scale = (hd as f32).powf(-0.5);
    let group = nh / nkv;
    let blocks = t.div_ceil(QB);
    let cp = SendPtr(core.as_mut_ptr());
    let clen = core.len();
    (0..nh * blocks).into_par_iter().for_each(|task| {
        let (h, b) = (task / blocks, task % blocks);
        let (kt, vt) = &per[h / group];
        let i0 = b * QB;
        let rows = (t - i0).min(QB);
        let nb = pos0 + i0 + rows; // keys visible to the block's last query
        with_tls(rows * 64 + rows * hd + hd + 2 * rows, |buf| {
            let (sc, rest) = buf.split_at_mut(rows * 64);
            let (o, rest) = rest.split_at_mut(rows * hd);
            let (gate, rest) = rest.split_at_mut(hd);
            let (mx, sum) = rest.split_at_mut(rows);
            o.fill(0.0);
            mx.fill(f32::NEG_INFINITY);
            sum.fill(0.0);
            for p in 0..nb.div_ceil(64) {
                pause.reach();
                let cols = (nb - p * 64).min(64);
                let tile = Tile {
                    kern,
                    rows,
                    cols,
                    first: pos0 + i0,
                    p,
                    scale,
                };
                scores_softmax(
                    tile,
                    (&q[i0 * qd + h * hd..], qd, hd),
                    &kt[p * hd * 64..(p + 1) * hd * 64],
                    (sc, o, mx, sum),
                );
                for cb in 0..vpan {
                    matmul(
                        kern,
                        Mat {
                            data: sc,
                            rows,
                            cols,
                            ld: 64,
                        },
                        Mat {
                            data: &vt[(cb * n + p * 64) * 64..(cb * n + p * 64 + cols) * 64],
                            rows: cols,
                            cols: (hd - cb * 64).min(64),
                            ld: 64,
                        },
                        &mut o[cb * 64..],
                        hd,
                        true,
                    );
                }
            }
            for r in 0..rows {
                let i = i0 + r;
                let inv = 1.0 / sum[r];
                gate.copy_from_slice(
                    &proj.data[i * ldp + 2 * hd * h + hd..i * ldp + 2 * hd * (h + 1)],
                );
                math::sigmoid_inplace(kern, gate);
                let off = i * ldc + h * hd;
                debug_assert!(off + hd <= clen);
                // SAFETY: task (h, b) writes rows i0..i0+rows, columns h·hd..(h+1)·hd of `core`:
                // disjoint across tasks and inside `core` (t rows of stride ldc ≥ qd).
                let dst = unsafe { std::slice::from_raw_parts_mut(cp.get().add(off), hd) };
                for ((d, x), gt) in dst
                    .iter_mut()
                    .zip(&o[r * hd..(r + 1) * hd])
                    .zip(gate.iter())
                {
                    *d = (x * inv) * gt;
                }
            }
        });
    });
}

/// One key tile of a query block: `rows` queries from absolute position `first`, keys `64p..64p + cols`.
#[derive(Clone, Copy)]
struct Tile {
    kern: Kernels,
    rows: usize,
    cols: usize,
    first: usize,
    p: usize,
    scale: f32,
}

/// The tile's scores `Q·Kᵀ` into `sc`, then the online softmax: each query's visible keys exponentiated
/// against its running max (the rest of its row zero: no weight, no rescale), its output and sum rescaled
/// when the max grows.
#[inline]
fn scores_softmax(
    tile: Tile,
    (q, qd, hd): (&[f32], usize, usize),
    kt: &[f32],
    (sc, o, mx, sum): (&mut [f32], &mut [f32], &mut [f32], &mut [f32]),
) {
    let Tile {
        kern,
        rows,
        cols,
        first,
        p,
        scale,
    } = tile;
    matmul(
        kern,
        Mat {
            data: q,
            rows,
            cols: hd,
            ld: qd,
        },
        Mat {
            data: kt,
            rows: hd,
            cols,
            ld: 64,
        },
        sc,
        64,
        false,
    );
    for r in 0..rows {
        let valid = (first + r + 1).saturating_sub(p * 64).min(cols);
        let srow = &mut sc[r * 64..r * 64 + cols];
        if valid == 0 {
            // Keys this query cannot see: no weight, no rescale.
            srow.fill(0.0);
            continue;
        }
        let m_new = math::scaled_max(kern, &srow[..valid], scale).max(mx[r]);
        let l = math::exp_scaled_shifted(kern, &mut srow[..valid], scale, m_new);
        srow[valid..].fill(0.0);
        if m_new > mx[r] {
            let alpha = if mx[r] == f32::NEG_INFINITY {
                0.0
            } else {
                (mx[r] - m_new).exp()
            };
            sum[r] *= alpha;
            for x in o[r * hd..(r + 1) * hd].iter_mut() {
                *x *= alpha;
            }
            mx[r] = m_new;
        }
        sum[r] += l;
    }
}
