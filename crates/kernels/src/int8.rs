//! The int8 arm: W8A8 (or W7A8) GEMM `C = A · Wᵀ` with exact integer accumulation.
//!
//! **Weights** ([`PackedInt8`]): per output channel `j`, symmetric, `s_w[j] = max_k |W[j,k]| / 127` and
//! `q_w = round(W / s_w)` in `[−127, 127]` (−128 never occurs); or, [`WeightQuant::narrow`] (the
//! rule's 7-bit weights), `/ 63` and `[−63, 63]`. Panels of [`NR`] = 64 outputs as for the
//! other arms; inside a panel the inputs go in groups of [`G`] = 4, `[k/4][64][4]` bytes: one 512-bit load
//! is 16 outputs × 4 inputs, exactly the operand of `vpdpbusd`, and a 256-bit load is 8 × 4 for AVX2.
//! Each panel also keeps `Σ_k q_w[j,k]` (for the VNNI zero-point correction) and the f32 scales.
//!
//! **Activations**: quantised per row (token) when the GEMM is called: `s_a[i] = max_k |A[i,k]| / 127`,
//! `q_a = round(A · (127 / max))` in `[−127, 127]`. The quantisation is plain f32 arithmetic (no fused
//! operations), so it gives the same bytes on every instruction set.
//!
//! **Products**, exact in i32 on every path, so every path gives the same integers:
//! - VNNI (`vpdpbusd`, u8 × s8): activations shifted to `q_a + 128` in `[1, 255]`; the kernel computes
//!   `Σ (q_a + 128)·q_w`, and `128 · Σ q_w` is subtracted per output afterwards. `vpdpbusd` does not
//!   saturate; |sum| ≤ 255 · 127 · k < 2³¹ for k < 66,000 (asserted).
//! - AVX2, 8-bit weights (`vpmaddwd`): activations and weights sign-extended to i16 (the weights per
//!   block, into L1), `vpmaddwd` adds two i16 products into an i32 (each at most 127², no overflow).
//! - AVX2, narrow weights (`vpmaddubsw` + `vpmaddwd` by ones): the VNNI operands (`q_a + 128`, s8
//!   weights); `vpmaddubsw` adds two u8 × s8 products into an i16 *with saturation*, which cannot occur
//!   when `|q_w| ≤ 63`: a pair is at most 2 · 255 · 63 = 32,130 < 32,767. The same `128 · Σ q_w`
//!   correction as VNNI. On 8-bit weights a pair could reach 64,770, so those stay on `vpmaddwd`.
//! - aarch64 (`sdot`, DotProd; `smmla`, I8MM): s8 × s8 into i32, no shift and no correction. `smmla`
//!   takes two rows' and two outputs' eight inputs at once, so its activations are stored by pairs of
//!   input groups and each weight block is interleaved the same way into L1 before its rows run.
//! - Portable: plain i32 multiply-adds (the reference).
//!
//! **Smoothing** (optional, SmoothQuant): a per-input-channel factor `f[k]` moves the range of outlier
//! activation channels into the weights: the weights are quantised from `W[j,k] · f[k]` and the
//! activations from `x[k] / f[k]` (as `x[k] · (1 / f[k])`), so the product is unchanged in exact arithmetic.
//! The division is done where the activations are quantised rather than folded into the preceding RMSNorm
//! weight, because the compute arm is chosen per call and the norm weight is shared by every arm; it costs
//! `k` multiplies per row against the GEMM's `n · k`. [`smoothing_factors`] computes `f` from calibration
//! statistics.
//!
//! **Dequantisation**: `C[i,j] = (f32(v) · s_w[j]) · s_a[i]` with `v` the exact integer dot product, two
//! f32 roundings in that order on every path. Integer sums are associative, so the input blocking and
//! the row grouping cannot change a bit: every path is bit-equal to the portable one, and a row never
//! depends on the other rows of its batch.

use rayon::prelude::*;

use super::Kernels;
use super::buf::AlignedBuf;
use super::layout::{G, NR, interleave};
use super::simd::{Kernel, Simd};

/// Largest input width for which no i32 sum can overflow (255 · 127 · k < 2³¹).
const K_MAX: usize = 66_000;

/// A weight matrix `[n, k]` quantised to int8 per output channel, in panel layout.
#[derive(Clone)]
pub struct PackedInt8 {
    n: usize,
    k: usize,
    kg: usize,
    /// `panels · kg · NR · G` bytes.
    data: AlignedBuf<i8>,
    /// `s_w` per output, padded with zeros to whole panels.
    scale: Vec<f32>,
    /// `Σ_k q_w` per output, padded.
    wsum: Vec<i32>,
    /// `1 / f[k]` per input when the weights were smoothed (the activations are multiplied by it).
    unsmooth: Option<Vec<f32>>,
    /// The factors `f[k]` themselves (for the stored form).
    factors: Option<Vec<f32>>,
    /// Every `|q_w| ≤` [`NARROW`] (see [`PackedInt8::narrow`]).
    narrow: bool,
}

impl std::fmt::Debug for PackedInt8 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PackedInt8 {{ n: {}, k: {} }}", self.n, self.k)
    }
}

/// Quantise one weight row: its scale and `q = round(w / s)` (zero scale for an all-zero row). With
/// `clip`, the range is the clip ratio `1 − t/100` (t = 0..=20) of `max|w|` with the least squared
/// rounding error (the first on ties), else `max|w|`. Each candidate's error is its own f64 sum in
/// input order, so the result does not depend on `kern`: the instruction set only decides how many
/// candidates are evaluated at once.
fn quantize_weight_row(kern: Kernels, w: &[f32], q: &mut [i8], quant: WeightQuant) -> f32 {
    super::dispatch::dispatch(kern, QuantizeRow { w, q, quant })
}

/// Clip candidates of [`quantize_weight_row`], padded to a whole number of vectors (the padding's
/// errors are computed on `max|w|` again and never chosen: ties go to the first).
const CLIPS: usize = 21;
const CLIP_LANES: usize = 24;

/// The clip search's ranges: `max|w| · (1 − t/100)`, padded with `max|w|`.
fn clip_ranges(amax: f32) -> [f32; CLIP_LANES] {
    let mut ranges = [amax; CLIP_LANES];
    for (t, r) in ranges.iter_mut().enumerate().take(CLIPS).skip(1) {
        *r = amax * (1.0 - t as f32 / 100.0);
    }
    ranges
}

/// The squared rounding error of `w` on each clip range, `Σ (round(x / s)·s − x)²` in f64 in input
/// order, `s = range / qmax`.
struct ClipErrors<'a> {
    w: &'a [f32],
    ranges: [f32; CLIP_LANES],
    qmax: f32,
}

impl Kernel for ClipErrors<'_> {
    type Out = [f64; CLIP_LANES];

    #[inline(always)]
    fn run<S: Simd>(self) -> [f64; CLIP_LANES] {
        let ClipErrors { w, ranges, qmax } = self;
        let steps = ranges.map(|r| r / qmax);
        // One pass over the row for every candidate: independent f64 chains, where one candidate at a
        // time is a single chain of dependent adds (21 passes over the row, each at the adder's latency).
        let mut err = [0f64; CLIP_LANES];
        for &x in w {
            for (e, s) in err.iter_mut().zip(&steps) {
                let d = (x / s).round_ties_even().clamp(-qmax, qmax) * s - x;
                *e += d as f64 * d as f64;
            }
        }
        err
    }
}

struct QuantizeRow<'a> {
    w: &'a [f32],
    q: &'a mut [i8],
    quant: WeightQuant,
}

impl Kernel for QuantizeRow<'_> {
    type Out = f32;

    #[inline(always)]
    fn run<S: Simd>(self) -> f32 {
        let QuantizeRow { w, q, quant } = self;
        let qmax = quant.qmax();
        let amax = w.iter().fold(0f32, |m, x| m.max(x.abs()));
        if amax == 0.0 || !amax.is_finite() {
            q.fill(0);
            return if amax == 0.0 { 0.0 } else { f32::NAN };
        }
        let mut range = amax;
        if quant.clip {
            let ranges = clip_ranges(amax);
            let err = ClipErrors { w, ranges, qmax }.run::<S>();
            let mut best = err[0];
            for t in 1..CLIPS {
                if err[t] < best {
                    (best, range) = (err[t], ranges[t]);
                }
            }
        }
        let s = range / qmax;
        for (d, x) in q.iter_mut().zip(w) {
            let v = (x / s).round_ties_even().clamp(-qmax, qmax);
            // A NaN weight (which `max` skips when finding the range) gives 0, as the saturating cast
            // `v as i8` does; that cast goes lane by lane, this one vectorises.
            let v = if v.is_nan() { 0.0 } else { v };
            // SAFETY: `v` is a whole number in [−127, 127] (clamped, not NaN).
            *d = unsafe { v.to_int_unchecked::<i32>() } as i8;
        }
        s
    }
}

/// `Σ q` and `max |q|` of a row of int8 weights (the sum the GEMM corrects with; the range checks).
struct RowStats<'a> {
    q: &'a [i8],
}

impl Kernel for RowStats<'_> {
    type Out = (i32, u8);

    #[inline(always)]
    fn run<S: Simd>(self) -> (i32, u8) {
        const L: usize = 64;
        // 64 i16 lanes, each widened after 128 of its values (|Σ| ≤ 128 · 128): widening every i8 to
        // i32 was a fifth of the stored form's load.
        let (mut sum, mut amax) = (0i32, [0u8; L]);
        let mut chunks = self.q.chunks_exact(L);
        loop {
            let mut acc = [0i16; L];
            let mut any = false;
            for c in chunks.by_ref().take(128) {
                let c: &[i8; L] = c.try_into().expect("a whole chunk");
                for l in 0..L {
                    acc[l] += c[l] as i16;
                    amax[l] = amax[l].max(c[l].unsigned_abs());
                }
                any = true;
            }
            sum += acc.iter().map(|&a| a as i32).sum::<i32>();
            if !any {
                break;
            }
        }
        let mut m = amax.into_iter().max().unwrap_or(0);
        for &v in chunks.remainder() {
            sum += v as i32;
            m = m.max(v.unsigned_abs());
        }
        (sum, m)
    }
}

fn row_stats(kern: Kernels, q: &[i8]) -> (i32, u8) {
    super::dispatch::dispatch(kern, RowStats { q })
}

/// How weight rows are quantised.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WeightQuant {
    /// Each row's range chosen by the least squared rounding error over clip ratios (see
    /// `quantize_weight_row`) instead of `max|w|`.
    pub clip: bool,
    /// 7-bit weights: `s_w = max|w| / 63`, `q_w` in `[−63, 63]`. Such a matrix is [`PackedInt8::narrow`],
    /// which lets AVX2 use `vpmaddubsw` on it exactly (a third fewer vector operations per product).
    pub narrow: bool,
}

impl WeightQuant {
    /// The largest `|q_w|` (the symmetric range's end).
    fn qmax(self) -> f32 {
        if self.narrow { NARROW as f32 } else { 127.0 }
    }
}

/// The largest `|q_w|` of a narrow matrix: `2 · 255 · 63 = 32,130` fits the i16 of a `vpmaddubsw` pair
/// on shifted activations (`q_a + 128 ≤ 255`).
pub const NARROW: i8 = 63;

impl PackedInt8 {
    /// Quantise and pack `[n, k]` whose row `r` `row(r, buf)` writes into `buf` (`k` f32).
    pub fn from_rows(n: usize, k: usize, row: impl Fn(usize, &mut [f32]) + Sync) -> Self {
        Self::from_rows_smoothed(n, k, row, None)
    }

    /// As [`PackedInt8::from_rows`], with the weights smoothed by `smooth` (`f[k]`, `k` positive finite
    /// factors; see the module documentation).
    pub fn from_rows_smoothed(
        n: usize,
        k: usize,
        row: impl Fn(usize, &mut [f32]) + Sync,
        smooth: Option<&[f32]>,
    ) -> Self {
        Self::from_rows_opts(n, k, row, smooth, WeightQuant::default())
    }

    /// As [`PackedInt8::from_rows_smoothed`], the rows quantised as `quant` says.
    pub fn from_rows_opts(
        n: usize,
        k: usize,
        row: impl Fn(usize, &mut [f32]) + Sync,
        smooth: Option<&[f32]>,
        quant: WeightQuant,
    ) -> Self {
        if let Some(f) = smooth {
            assert_eq!(f.len(), k, "int8 smoothing: one factor per input");
            assert!(
                f.iter().all(|x| x.is_finite() && *x > 0.0),
                "int8 smoothing: factors must be positive and finite"
            );
        }
        assert!(
            k < K_MAX,
            "int8 GEMM: {k} inputs could overflow the i32 sums"
        );
        let kg = k.div_ceil(G);
        let panels = n.div_ceil(NR);
        let panel_len = kg * NR * G;
        let mut data = AlignedBuf::<i8>::zeroed(panels * panel_len);
        let mut scale = vec![0f32; panels * NR];
        let mut wsum = vec![0i32; panels * NR];
        // The same bytes on every instruction set (see `quantize_weight_row`); the best one is fastest.
        let kern = Kernels::best();
        data.par_chunks_mut(panel_len.max(1))
            .zip(scale.par_chunks_mut(NR))
            .zip(wsum.par_chunks_mut(NR))
            .enumerate()
            .for_each(|(p, ((chunk, sc), ws))| {
                let mut wrow = vec![0f32; k];
                let mut qrow = vec![0i8; k];
                for j in 0..NR {
                    let r = p * NR + j;
                    if r >= n {
                        break;
                    }
                    row(r, &mut wrow);
                    if let Some(f) = smooth {
                        for (w, f) in wrow.iter_mut().zip(f) {
                            *w *= f;
                        }
                    }
                    sc[j] = quantize_weight_row(kern, &wrow, &mut qrow, quant);
                    ws[j] = row_stats(kern, &qrow).0;
                    interleave(
                        bytemuck::cast_slice_mut(chunk),
                        &[(j, bytemuck::cast_slice(&qrow))],
                    );
                }
            });
        PackedInt8 {
            n,
            k,
            kg,
            data,
            scale,
            wsum,
            unsmooth: smooth.map(|f| f.iter().map(|x| 1.0 / x).collect()),
            factors: smooth.map(<[f32]>::to_vec),
            narrow: quant.narrow,
        }
    }

    /// Pack already quantised weights: `q` row-major `[n, k]` in `[−127, 127]`, one scale per output,
    /// and the smoothing factors `f[k]` they were quantised with, if any (the stored int8 form).
    pub fn from_quantised(
        n: usize,
        k: usize,
        q: &[i8],
        scale: &[f32],
        smooth: Option<&[f32]>,
    ) -> Result<Self, String> {
        if q.len() != n * k || scale.len() != n || smooth.is_some_and(|f| f.len() != k) {
            return Err(format!("int8 form: sizes do not match [{n}, {k}]"));
        }
        if !scale.iter().all(|s| s.is_finite() && *s >= 0.0) {
            return Err("int8 form: a scale is negative or not finite".into());
        }
        if smooth.is_some_and(|f| !f.iter().all(|x| x.is_finite() && *x > 0.0)) {
            return Err("int8 form: a smoothing factor is not positive and finite".into());
        }
        if k >= K_MAX {
            return Err(format!("int8 form: {k} inputs could overflow the i32 sums"));
        }
        let kg = k.div_ceil(G);
        let panels = n.div_ceil(NR);
        let panel_len = kg * NR * G;
        let mut data = AlignedBuf::<i8>::zeroed(panels * panel_len);
        let mut sc = vec![0f32; panels * NR];
        sc[..n].copy_from_slice(scale);
        let mut wsum = vec![0i32; panels * NR];
        let kern = Kernels::best();
        // One pass over the (mapped) weights: summed, checked and packed panel by panel in parallel (the
        // sums first: they read each row in order, leaving the panel's rows in cache for the interleave).
        let amax = data
            .par_chunks_mut(panel_len.max(1))
            .zip(wsum.par_chunks_mut(NR))
            .enumerate()
            .map(|(p, (chunk, ws))| {
                let rows: Vec<(usize, &[u8])> = (0..NR.min(n - p * NR))
                    .map(|j| {
                        (
                            j,
                            bytemuck::cast_slice(&q[(p * NR + j) * k..(p * NR + j + 1) * k]),
                        )
                    })
                    .collect();
                let mut amax = 0u8;
                for (&(_, row), sum) in rows.iter().zip(ws.iter_mut()) {
                    let (s, m) = row_stats(kern, bytemuck::cast_slice(row));
                    *sum = s;
                    amax = amax.max(m);
                }
                interleave(bytemuck::cast_slice_mut(chunk), &rows);
                amax
            })
            .max()
            .unwrap_or(0);
        let (has_min, wide) = (amax > i8::MAX as u8, amax > NARROW as u8);
        if has_min {
            return Err("int8 form: −128 is outside the symmetric range".into());
        }
        Ok(PackedInt8 {
            n,
            k,
            kg,
            data,
            scale: sc,
            wsum,
            unsmooth: smooth.map(|f| f.iter().map(|x| 1.0 / x).collect()),
            factors: smooth.map(<[f32]>::to_vec),
            narrow: !wide,
        })
    }

    /// The quantised weights row-major `[n, k]` (the stored int8 form).
    pub fn q_rows(&self) -> Vec<i8> {
        let mut out = vec![0i8; self.n * self.k];
        for (r, row) in out.chunks_mut(self.k.max(1)).enumerate().take(self.n) {
            for (c, v) in row.iter_mut().enumerate() {
                *v = self.q(r, c);
            }
        }
        out
    }

    /// The scales `s_w`, one per output.
    pub fn scales(&self) -> &[f32] {
        &self.scale[..self.n]
    }

    /// The smoothing factors `f[k]` the weights were quantised with, if any.
    pub fn smooth_factors(&self) -> Option<&[f32]> {
        self.factors.as_deref()
    }

    /// Quantise a row-major `[n, k]` f32 matrix.
    pub fn from_f32(n: usize, k: usize, w: &[f32]) -> Self {
        Self::from_f32_with(n, k, w, WeightQuant::default())
    }

    /// As [`PackedInt8::from_f32`], the rows quantised as `quant` says.
    pub fn from_f32_with(n: usize, k: usize, w: &[f32], quant: WeightQuant) -> Self {
        assert_eq!(w.len(), n * k, "int8 pack: size does not match the shape");
        let row = |r: usize, out: &mut [f32]| out.copy_from_slice(&w[r * k..(r + 1) * k]);
        Self::from_rows_opts(n, k, row, None, quant)
    }

    /// Every weight is in `[−63, 63]` ([`NARROW`]): quantised with [`WeightQuant::narrow`], or a stored
    /// form whose values happen to be. AVX2 then runs `vpmaddubsw`, which is exact on such weights.
    pub fn narrow(&self) -> bool {
        self.narrow
    }

    /// The activation multipliers `1 / f[k]`, if the weights were smoothed.
    pub fn unsmooth(&self) -> Option<&[f32]> {
        self.unsmooth.as_deref()
    }

    /// Output rows.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Input columns.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Bytes of storage (weights, scales, sums, smoothing).
    pub fn bytes(&self) -> usize {
        self.data.len()
            + 4 * (self.scale.len()
                + self.wsum.len()
                + 2 * self.unsmooth.as_ref().map_or(0, Vec::len))
    }

    /// The quantised weight `q_w[row, col]`.
    pub fn q(&self, row: usize, col: usize) -> i8 {
        let (p, j) = (row / NR, row % NR);
        self.data[p * self.kg * NR * G + (col / G) * NR * G + j * G + col % G]
    }

    /// The scale `s_w[row]`.
    pub fn scale(&self, row: usize) -> f32 {
        self.scale[row]
    }

    /// `W[row, col]` as the int8 arm sees it, `q_w · s_w`.
    pub fn get(&self, row: usize, col: usize) -> f32 {
        self.q(row, col) as f32 * self.scale[row]
    }
}

/// Quantise one activation row (`x.len()` inputs) into `q` (at least that long): returns `s_a`. With
/// `shift`, stores `q_a + 128` as u8 bits (the VNNI operand), else `q_a` as i8 bits. With `unsmooth`
/// (one multiplier per input), the row quantised is `x[k] · unsmooth[k]`. This is the definition; the x86
/// paths run a vectorised copy of it (`x86_int8::quantize_avx2`, tested bit-equal).
pub fn quantize_row(x: &[f32], unsmooth: Option<&[f32]>, q: &mut [u8], shift: bool) -> f32 {
    let at = |k: usize| match unsmooth {
        Some(u) => x[k] * u[k],
        None => x[k],
    };
    let amax = (0..x.len()).fold(0f32, |m, k| m.max(at(k).abs()));
    let off = if shift { 128i32 } else { 0 };
    if amax == 0.0 || !amax.is_finite() {
        q[..x.len()].fill(off as u8);
        return if amax == 0.0 { 0.0 } else { f32::NAN };
    }
    let inv = 127.0 / amax;
    for (k, d) in q[..x.len()].iter_mut().enumerate() {
        let qi = (at(k) * inv).round_ties_even().clamp(-127.0, 127.0) as i32;
        *d = (qi + off) as u8;
    }
    amax / 127.0
}

/// SmoothQuant's per-input factors `f[k] = amax_x[k]^α / amax_w[k]^(1−α)`: with `α = 0.5` the largest
/// magnitudes of activation column `k` and weight column `k` become equal, so an outlier channel no longer
/// sets the scale of every other channel of its token. `act_amax` is the largest `|x[k]|` seen on the
/// calibration rows, `weight_amax` the largest `|W[j,k]|` over outputs `j`. A channel with no signal on
/// either side (zero, or not finite) keeps `f = 1`.
pub fn smoothing_factors(act_amax: &[f32], weight_amax: &[f32], alpha: f32) -> Vec<f32> {
    assert_eq!(act_amax.len(), weight_amax.len(), "one statistic per input");
    act_amax
        .iter()
        .zip(weight_amax)
        .map(|(&a, &w)| {
            let f = a.powf(alpha) / w.powf(1.0 - alpha);
            if a > 0.0 && w > 0.0 && f.is_finite() && f > 0.0 {
                f
            } else {
                1.0
            }
        })
        .collect()
}

mod dequant;
mod drive;
#[cfg(target_arch = "x86_64")]
pub(crate) use dequant::Dequantised;
#[cfg(all(any(target_arch = "x86_64", target_arch = "aarch64"), feature = "peak"))]
pub(crate) use drive::Path;
#[cfg(feature = "peak")]
pub use drive::ceiling_chain;
pub use drive::gemm_int8;
pub use drive::narrow_is_faster;

#[cfg(test)]
mod tests;
