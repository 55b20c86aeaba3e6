//! The int8 arm: W8A8 GEMM `C = A · Wᵀ` with exact integer accumulation.
//!
//! **Weights** ([`PackedInt8`]): per output channel `j`, symmetric, `s_w[j] = max_k |W[j,k]| / 127` and
//! `q_w = round(W / s_w)` in `[−127, 127]` (−128 never occurs). Panels of [`NR`] = 64 outputs as for the
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
//! - AVX2 (`vpmaddubsw` + `vpmaddwd`): `vpmaddubsw` adds two u8 × s8 products into an i16 *with
//!   saturation*. The activations are not shifted here: the unsigned operand is `|q_a| ≤ 127` (`vpabsb`)
//!   and the sign moves onto the weight (`vpsignb`, `q_w · sign(q_a)`, safe as `q_w ≠ −128`), so a pair
//!   is at most 2 · 127 · 127 = 32,258 < 32,767: it cannot saturate. `vpmaddwd` by ones widens the pairs
//!   to i32 exactly.
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

use std::cell::RefCell;

use rayon::prelude::*;

use super::buf::AlignedBuf;
use super::pack::{NR, PackedMatrix};
use super::{Isa, Kernels, SendPtr};

/// Inputs per group (one i32 lane of `vpdpbusd`).
pub const G: usize = 4;
/// Groups per input block: `64 · 64 · 4` bytes = 16 KiB of weights stay in L1 while all rows use them.
const KG_BLOCK: usize = 64;
/// Rows per pass over a panel (their i32 accumulators, `MC · 64 · 4` bytes = 66 KiB, stay in L2).
const MC: usize = 264;
/// Rows per microkernel call (VNNI: 6 × 4 vector accumulators; AVX2 and portable use 4).
pub(crate) const MR8: usize = 6;
/// Largest input width for which no i32 sum can overflow (255 · 127 · k < 2³¹).
const K_MAX: usize = 66_000;

/// A weight matrix `[n, k]` quantised to int8 per output channel, in panel layout.
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
}

impl std::fmt::Debug for PackedInt8 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PackedInt8 {{ n: {}, k: {} }}", self.n, self.k)
    }
}

/// Quantise one weight row: its scale and `q = round(w / s)` (zero scale for an all-zero row). With
/// `clip`, the range is the clip ratio `1 − t/100` (t = 0..=20) of `max|w|` with the least squared
/// rounding error (the first on ties), else `max|w|`.
fn quantize_weight_row(w: &[f32], q: &mut [i8], clip: bool) -> f32 {
    let amax = w.iter().fold(0f32, |m, x| m.max(x.abs()));
    if amax == 0.0 || !amax.is_finite() {
        q.fill(0);
        return if amax == 0.0 { 0.0 } else { f32::NAN };
    }
    let mut range = amax;
    if clip {
        let err = |r: f32| {
            let s = r / 127.0;
            w.iter()
                .map(|x| {
                    let d = (x / s).round_ties_even().clamp(-127.0, 127.0) * s - x;
                    d as f64 * d as f64
                })
                .sum::<f64>()
        };
        let mut best = err(amax);
        for t in 1..=20 {
            let r = amax * (1.0 - t as f32 / 100.0);
            let e = err(r);
            if e < best {
                (best, range) = (e, r);
            }
        }
    }
    let s = range / 127.0;
    for (d, x) in q.iter_mut().zip(w) {
        *d = (x / s).round_ties_even().clamp(-127.0, 127.0) as i8;
    }
    s
}

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
        Self::from_rows_opts(n, k, row, smooth, false)
    }

    /// As [`PackedInt8::from_rows_smoothed`], each row's scale chosen by the least rounding error over
    /// clip ratios when `clip` (see `quantize_weight_row`).
    pub fn from_rows_opts(
        n: usize,
        k: usize,
        row: impl Fn(usize, &mut [f32]) + Sync,
        smooth: Option<&[f32]>,
        clip: bool,
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
                    sc[j] = quantize_weight_row(&wrow, &mut qrow, clip);
                    ws[j] = qrow.iter().map(|&x| x as i32).sum();
                    for (kk, &q) in qrow.iter().enumerate() {
                        chunk[(kk / G) * NR * G + j * G + kk % G] = q;
                    }
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
        if q.contains(&i8::MIN) {
            return Err("int8 form: −128 is outside the symmetric range".into());
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
        let mut wsum = vec![0i32; panels * NR];
        data.par_chunks_mut(panel_len.max(1))
            .enumerate()
            .for_each(|(p, chunk)| {
                for j in 0..NR.min(n - p * NR) {
                    let row = &q[(p * NR + j) * k..(p * NR + j + 1) * k];
                    for (kk, &v) in row.iter().enumerate() {
                        chunk[(kk / G) * NR * G + j * G + kk % G] = v;
                    }
                }
            });
        for r in 0..n {
            sc[r] = scale[r];
            wsum[r] = q[r * k..(r + 1) * k].iter().map(|&x| x as i32).sum();
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
        assert_eq!(w.len(), n * k, "int8 pack: size does not match the shape");
        Self::from_rows(n, k, |r, out| out.copy_from_slice(&w[r * k..(r + 1) * k]))
    }

    /// Quantise a packed BF16/F32 matrix (what the loader built), optionally smoothed.
    pub fn from_packed(w: &PackedMatrix, smooth: Option<&[f32]>) -> Self {
        Self::from_packed_clipped(w, smooth, false)
    }

    /// As [`PackedInt8::from_packed`], with the clip search of `quantize_weight_row` when `clip`.
    pub fn from_packed_clipped(w: &PackedMatrix, smooth: Option<&[f32]>, clip: bool) -> Self {
        Self::from_rows_opts(
            w.n(),
            w.k(),
            |r, out| {
                for (c, o) in out.iter_mut().enumerate() {
                    *o = w.get(r, c);
                }
            },
            smooth,
            clip,
        )
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
/// (one multiplier per input), the row quantised is `x[k] · unsmooth[k]`.
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

/// Which integer product the kernels use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Path {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Vnni512,
}

impl Path {
    pub(crate) fn of(kern: Kernels) -> Path {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            match kern.isa() {
                Isa::Avx512 | Isa::Avx512Bf16
                    if has!("avx512vnni") && has!("avx512bw") && has!("avx512f") =>
                {
                    return Path::Vnni512;
                }
                Isa::Avx2 | Isa::Avx512 | Isa::Avx512Bf16 => return Path::Avx2,
                _ => {}
            }
        }
        let _ = (kern, Isa::Portable);
        Path::Portable
    }

    fn shift(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        if self == Path::Vnni512 {
            return true;
        }
        false
    }

    fn rows(self) -> usize {
        #[cfg(target_arch = "x86_64")]
        if self == Path::Vnni512 {
            return MR8;
        }
        4
    }
}

thread_local! {
    static SCRATCH: RefCell<(Vec<u8>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// `C[i, j] = Σ_k A[i, k] · W[j, k]` through int8, for `i < m`, `j < w.n()`; strides as in
/// [`super::gemm`].
pub fn gemm_int8(
    kern: Kernels,
    m: usize,
    a: &[f32],
    lda: usize,
    w: &PackedInt8,
    c: &mut [f32],
    ldc: usize,
) {
    let (n, k) = (w.n, w.k);
    if m == 0 || n == 0 {
        return;
    }
    assert!(
        lda >= k && a.len() >= (m - 1) * lda + k,
        "gemm_int8: A too short"
    );
    assert!(
        ldc >= n && c.len() >= (m - 1) * ldc + n,
        "gemm_int8: C too short"
    );
    let path = Path::of(kern);
    SCRATCH.with(|s| {
        let (mut qa, mut sa) = std::mem::take(&mut *s.borrow_mut());
        // Row stride: whole groups plus one cache line (no 4 KiB-multiple strides).
        let lq = w.kg * G + 64;
        qa.clear();
        qa.resize(m * lq, if path.shift() { 128 } else { 0 });
        sa.clear();
        sa.resize(m, 0.0);
        qa.par_chunks_mut(lq)
            .zip(sa.par_iter_mut())
            .enumerate()
            .for_each(|(i, (row, s))| {
                *s = super::wide(kern, || {
                    quantize_row(&a[i * lda..i * lda + k], w.unsmooth(), row, path.shift())
                });
            });
        let rows = QuantisedRows {
            m,
            q: &qa,
            stride: lq,
            scale: &sa,
        };
        run_panels(kern, path, &rows, w, c, ldc);
        *s.borrow_mut() = (qa, sa);
    });
}

/// The activations of one call, quantised: `m` rows of `stride` bytes and their scales `s_a`.
struct QuantisedRows<'a> {
    m: usize,
    q: &'a [u8],
    stride: usize,
    scale: &'a [f32],
}

fn run_panels(
    kern: Kernels,
    path: Path,
    rows_in: &QuantisedRows<'_>,
    w: &PackedInt8,
    c: &mut [f32],
    ldc: usize,
) {
    let (m, qa, lq, sa) = (rows_in.m, rows_in.q, rows_in.stride, rows_in.scale);
    let (n, kg) = (w.n, w.kg);
    let cp = SendPtr(c.as_mut_ptr());
    let mr = path.rows();
    let panels = n.div_ceil(NR);
    (0..panels).into_par_iter().for_each_init(
        || AlignedBuf::<i32>::zeroed(MC * NR),
        |acc, p| {
            let ncols = (n - p * NR).min(NR);
            let wp = &w.data[p * kg * NR * G..(p + 1) * kg * NR * G];
            let mut mc0 = 0;
            while mc0 < m {
                let mc1 = (mc0 + MC).min(m);
                if kg == 0 {
                    acc[..(mc1 - mc0) * NR].fill(0);
                }
                let mut kb = 0;
                while kb < kg {
                    let kgc = (kg - kb).min(KG_BLOCK);
                    let bblk = &wp[kb * NR * G..(kb + kgc) * NR * G];
                    let mut i0 = mc0;
                    while i0 < mc1 {
                        let rows = (mc1 - i0).min(mr);
                        let mut arows = [std::ptr::null::<u8>(); MR8];
                        for (r, x) in arows.iter_mut().enumerate() {
                            // Rows past the group repeat its last row (computed, never stored).
                            *x = qa[(i0 + r.min(rows - 1)) * lq + kb * G..].as_ptr();
                        }
                        let accp = acc[(i0 - mc0) * NR..(i0 - mc0 + rows) * NR].as_mut_ptr();
                        // SAFETY: each `arows[r]` addresses `kgc · G` bytes of a quantised row (`lq`
                        // covers `kg · G`), `bblk` is `kgc` groups of this panel, `accp` is `rows`
                        // rows of `NR` i32; the instruction set was checked by `Path::of`.
                        unsafe { ukr(path, kgc, &arows, bblk.as_ptr(), accp, rows, kb > 0) };
                        i0 += mr;
                    }
                    kb += kgc;
                }
                // Dequantise: exact integer → f32, times s_w, times s_a (this order everywhere).
                let shift = path.shift();
                super::wide(kern, || {
                    for i in mc0..mc1 {
                        let ar = &acc[(i - mc0) * NR..(i - mc0) * NR + ncols];
                        // SAFETY: panel `p` owns columns p·NR..p·NR+ncols of every row; rows < m.
                        let crow = unsafe {
                            std::slice::from_raw_parts_mut(cp.get().add(i * ldc + p * NR), ncols)
                        };
                        let sc = &w.scale[p * NR..p * NR + ncols];
                        let ws = &w.wsum[p * NR..p * NR + ncols];
                        let s = sa[i];
                        for j in 0..ncols {
                            let v = if shift { ar[j] - 128 * ws[j] } else { ar[j] };
                            crow[j] = (v as f32 * sc[j]) * s;
                        }
                    }
                });
                mc0 = mc1;
            }
        },
    );
}

/// `acc[r][0..NR] (+)= Σ_{g < kg} Σ_t a[r][4g+t] · b[g][j][t]` for `r < rows`.
///
/// # Safety
/// As documented at the call site in [`run_panels`]; the path's instruction set is present.
#[inline]
unsafe fn ukr(
    path: Path,
    kg: usize,
    a: &[*const u8; MR8],
    b: *const i8,
    acc: *mut i32,
    rows: usize,
    load: bool,
) {
    // SAFETY: forwarded from the caller.
    unsafe {
        match path {
            #[cfg(target_arch = "x86_64")]
            Path::Vnni512 => super::x86_int8::ukr_vnni(kg, a, b, acc, rows, load),
            #[cfg(target_arch = "x86_64")]
            Path::Avx2 => super::x86_int8::ukr_avx2(kg, a, b, acc, rows, load),
            Path::Portable => ukr_portable(kg, a, b, acc, rows, load),
        }
    }
}

/// The reference microkernel: i32 multiply-adds on signed activations.
///
/// # Safety
/// As [`ukr`].
unsafe fn ukr_portable(
    kg: usize,
    a: &[*const u8; MR8],
    b: *const i8,
    acc: *mut i32,
    rows: usize,
    load: bool,
) {
    // SAFETY: extents as documented at the call site.
    unsafe {
        for (r, ar) in a.iter().enumerate().take(rows) {
            let ar = std::slice::from_raw_parts(*ar as *const i8, kg * G);
            let out = std::slice::from_raw_parts_mut(acc.add(r * NR), NR);
            let bs = std::slice::from_raw_parts(b, kg * NR * G);
            for (j, o) in out.iter_mut().enumerate() {
                let mut s: i32 = if load { *o } else { 0 };
                for g in 0..kg {
                    let wg = &bs[g * NR * G + j * G..g * NR * G + j * G + G];
                    let xg = &ar[g * G..g * G + G];
                    for t in 0..G {
                        s += xg[t] as i32 * wg[t] as i32;
                    }
                }
                *o = s;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
    }

    /// The int8 arm from its definition: quantise rows and weights, integer dot products, dequantise.
    fn naive(m: usize, a: &[f32], lda: usize, w: &PackedInt8) -> Vec<f32> {
        let (n, k) = (w.n(), w.k());
        let mut out = vec![0f32; m * n];
        for i in 0..m {
            let mut q = vec![0u8; k];
            let s = quantize_row(&a[i * lda..i * lda + k], w.unsmooth(), &mut q, false);
            for j in 0..n {
                let v: i64 = (0..k).map(|c| q[c] as i8 as i64 * w.q(j, c) as i64).sum();
                out[i * n + j] = (v as i32 as f32 * w.scale(j)) * s;
            }
        }
        out
    }

    fn paths() -> Vec<(Kernels, Path)> {
        let v: Vec<(Kernels, Path)> = Kernels::available()
            .into_iter()
            .map(|k| (k, Path::of(k)))
            .collect();
        // The SIMD paths this CPU has must be among those tested.
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            if has!("avx2") && has!("fma") {
                assert!(v.iter().any(|(_, p)| *p == Path::Avx2));
            }
            if has!("avx512f") && has!("avx512bw") && has!("avx512vnni") {
                assert!(v.iter().any(|(_, p)| *p == Path::Vnni512));
            }
        }
        v
    }

    #[test]
    fn every_path_is_bit_equal_to_the_definition_on_odd_shapes() {
        let shapes = [
            (1, 1, 1),
            (5, 63, 7),
            (7, 65, 129),
            (13, 130, 300),
            (6, 64, 256),
            (20, 200, 515),
            (3, 70, 1030),
        ];
        for (kern, path) in paths() {
            for &(m, n, k) in &shapes {
                let mut seed = (m * 1000 + n * 10 + k) as u64;
                let lda = k + 3;
                let a: Vec<f32> = (0..m * lda).map(|_| lcg(&mut seed) * 4.0).collect();
                let wv: Vec<f32> = (0..n * k).map(|_| lcg(&mut seed)).collect();
                let w = PackedInt8::from_f32(n, k, &wv);
                let want = naive(m, &a, lda, &w);
                let ldc = n + 5;
                let mut c = vec![f32::NAN; m * ldc];
                gemm_int8(kern, m, &a, lda, &w, &mut c, ldc);
                for i in 0..m {
                    for j in 0..n {
                        assert_eq!(
                            c[i * ldc + j].to_bits(),
                            want[i * n + j].to_bits(),
                            "{kern:?} {path:?} {m}×{n}×{k} [{i},{j}]"
                        );
                    }
                    assert!(c[i * ldc + n..(i + 1) * ldc].iter().all(|x| x.is_nan()));
                }
            }
        }
    }

    /// Every quantised value at ±127 (the largest products): any saturation in `vpmaddubsw` or
    /// overflow would show against the i64 definition.
    #[test]
    fn extreme_values_do_not_saturate() {
        let (m, n, k) = (7, 66, 1027);
        let mut seed = 5u64;
        let a: Vec<f32> = (0..m * k)
            .map(|_| if lcg(&mut seed) < 0.0 { -2.0 } else { 2.0 })
            .collect();
        // Rows of one sign, and rows of random signs.
        let wv: Vec<f32> = (0..n * k)
            .map(|i| {
                let negative = match (i / k) % 3 {
                    0 => false,
                    1 => true,
                    _ => lcg(&mut seed) < 0.0,
                };
                if negative { -0.5 } else { 0.5 }
            })
            .collect();
        let w = PackedInt8::from_f32(n, k, &wv);
        assert!((0..n).all(|j| (0..k).all(|c| w.q(j, c).unsigned_abs() == 127)));
        let want = naive(m, &a, k, &w);
        for (kern, path) in paths() {
            let mut c = vec![0f32; m * n];
            gemm_int8(kern, m, &a, k, &w, &mut c, n);
            assert_eq!(
                c.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                "{kern:?} {path:?}"
            );
        }
    }

    #[test]
    fn rows_do_not_depend_on_their_batch() {
        let (m, n, k) = (29, 130, 300);
        let mut seed = 99;
        let a: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed)).collect();
        let wv: Vec<f32> = (0..n * k).map(|_| lcg(&mut seed)).collect();
        let w = PackedInt8::from_f32(n, k, &wv);
        for (kern, path) in paths() {
            let mut all = vec![0f32; m * n];
            gemm_int8(kern, m, &a, k, &w, &mut all, n);
            for start in [0, 1, 5, 17] {
                for len in [1, 2, 4, 6, 7] {
                    if start + len > m {
                        continue;
                    }
                    let mut part = vec![0f32; len * n];
                    gemm_int8(kern, len, &a[start * k..], k, &w, &mut part, n);
                    assert_eq!(
                        &part[..],
                        &all[start * n..(start + len) * n],
                        "{kern:?} {path:?} {start}+{len}"
                    );
                }
            }
        }
    }

    /// The arm approximates the f32 product within the quantisation error (a scale mistake or a
    /// transposed layout would be off by far more).
    #[test]
    fn close_to_the_f32_product() {
        let (m, n, k) = (9, 100, 640);
        let mut seed = 7;
        let a: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed)).collect();
        let wv: Vec<f32> = (0..n * k).map(|_| lcg(&mut seed)).collect();
        let w = PackedInt8::from_f32(n, k, &wv);
        let mut c = vec![0f32; m * n];
        gemm_int8(Kernels::detect(), m, &a, k, &w, &mut c, n);
        let (mut num, mut den) = (0f64, 0f64);
        for i in 0..m {
            for j in 0..n {
                let e: f64 = (0..k)
                    .map(|c| a[i * k + c] as f64 * wv[j * k + c] as f64)
                    .sum();
                num += (c[i * n + j] as f64 - e).powi(2);
                den += e * e;
            }
        }
        let rel = (num / den).sqrt();
        // Uniform values: each side's rounding error is ~1/(127·√12) of its range → ≈ 1 % combined.
        assert!(rel < 0.02, "relative error {rel}");
        assert!(rel > 1e-4, "int8 cannot be this exact: {rel}");
    }

    /// Smoothed weights: every path still bit-equal to the definition, and on activations with outlier
    /// channels (the case smoothing exists for) the error against the f32 product drops.
    #[test]
    fn smoothing_is_bit_equal_on_every_path_and_tames_outlier_channels() {
        let (m, n, k) = (11, 70, 130);
        let mut seed = 3;
        let a: Vec<f32> = (0..m * k)
            .map(|i| lcg(&mut seed) * if i % k % 17 == 3 { 60.0 } else { 1.0 })
            .collect();
        let wv: Vec<f32> = (0..n * k).map(|_| lcg(&mut seed)).collect();
        let act: Vec<f32> = (0..k)
            .map(|c| (0..m).fold(0f32, |mx, i| mx.max(a[i * k + c].abs())))
            .collect();
        let wmax: Vec<f32> = (0..k)
            .map(|c| (0..n).fold(0f32, |mx, j| mx.max(wv[j * k + c].abs())))
            .collect();
        let f = smoothing_factors(&act, &wmax, 0.5);
        let plain = PackedInt8::from_f32(n, k, &wv);
        let smooth = PackedInt8::from_rows_smoothed(
            n,
            k,
            |r, o| o.copy_from_slice(&wv[r * k..(r + 1) * k]),
            Some(&f),
        );
        let want = naive(m, &a, k, &smooth);
        let rel = |c: &[f32]| {
            let (mut num, mut den) = (0f64, 0f64);
            for i in 0..m {
                for j in 0..n {
                    let e: f64 = (0..k)
                        .map(|t| a[i * k + t] as f64 * wv[j * k + t] as f64)
                        .sum();
                    num += (c[i * n + j] as f64 - e).powi(2);
                    den += e * e;
                }
            }
            (num / den).sqrt()
        };
        for (kern, path) in paths() {
            let mut c = vec![0f32; m * n];
            gemm_int8(kern, m, &a, k, &smooth, &mut c, n);
            assert_eq!(
                c.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                "{kern:?} {path:?}"
            );
        }
        let mut c = vec![0f32; m * n];
        gemm_int8(Kernels::detect(), m, &a, k, &plain, &mut c, n);
        let (e_plain, e_smooth) = (rel(&c), rel(&want));
        assert!(
            e_smooth < 0.5 * e_plain,
            "smoothed {e_smooth:.4} vs plain {e_plain:.4}"
        );
        assert_eq!(
            smoothing_factors(&[0.0, 4.0], &[1.0, 0.0], 0.5),
            vec![1.0, 1.0]
        );
        assert_eq!(smoothing_factors(&[4.0], &[1.0], 0.5), vec![2.0]);
    }

    /// The clip search never rounds a row worse than `max|w|` does, and every path stays bit-equal to the
    /// definition with the scales it picks.
    #[test]
    fn clip_search_lowers_the_rounding_error_and_stays_bit_equal() {
        let (m, n, k) = (5, 70, 200);
        let mut seed = 11;
        let wv: Vec<f32> = (0..n * k)
            .map(|i| lcg(&mut seed) * if i % k == 7 { 6.0 } else { 1.0 })
            .collect();
        let plain = PackedInt8::from_f32(n, k, &wv);
        let clipped = PackedInt8::from_rows_opts(
            n,
            k,
            |r, o| o.copy_from_slice(&wv[r * k..(r + 1) * k]),
            None,
            true,
        );
        let sq = |w: &PackedInt8, j: usize| -> f64 {
            (0..k)
                .map(|c| (w.get(j, c) as f64 - wv[j * k + c] as f64).powi(2))
                .sum()
        };
        for j in 0..n {
            assert!(sq(&clipped, j) <= sq(&plain, j), "row {j}");
            assert!(clipped.scale(j) <= plain.scale(j));
        }
        let a: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed)).collect();
        let want = naive(m, &a, k, &clipped);
        for (kern, path) in paths() {
            let mut c = vec![0f32; m * n];
            gemm_int8(kern, m, &a, k, &clipped, &mut c, n);
            assert_eq!(
                c.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                "{kern:?} {path:?}"
            );
        }
    }

    #[test]
    fn packing_round_trips_the_quantised_values() {
        let (n, k) = (70, 9);
        let wv: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let w = PackedInt8::from_f32(n, k, &wv);
        for j in 0..n {
            let amax = wv[j * k..(j + 1) * k]
                .iter()
                .fold(0f32, |m, x| m.max(x.abs()));
            assert_eq!(w.scale(j), amax / 127.0);
            for c in 0..k {
                assert!((w.get(j, c) - wv[j * k + c]).abs() <= w.scale(j) / 2.0 * 1.0001);
            }
        }
        let zero = PackedInt8::from_f32(3, 5, &[0.0; 15]);
        let mut out = vec![f32::NAN; 3];
        gemm_int8(Kernels::portable(), 1, &[1.0; 5], 5, &zero, &mut out, 3);
        assert_eq!(out, vec![0.0; 3]);
    }
}
