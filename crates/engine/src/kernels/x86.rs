//! AVX-512 kernels. Every function here is `unsafe` for two reasons: it must only run on a CPU with the
//! target features it is compiled for (callers check through [`super::Kernels`]), and it reads and writes
//! through raw pointers whose extents the safe drivers in `gemm.rs`, `matmul.rs` and `math.rs` check.

use std::arch::x86_64::*;

use super::gemm::MR;
use super::pack::NR;

/// Lane mask for the first `n` of 16 lanes.
#[inline(always)]
fn lanes(n: usize) -> __mmask16 {
    if n >= 16 {
        0xffff
    } else {
        ((1u32 << n) - 1) as __mmask16
    }
}

/// The four lane masks of a 64-wide column block holding `ncols` valid columns.
#[inline(always)]
fn col_masks(ncols: usize) -> [__mmask16; 4] {
    [
        lanes(ncols),
        lanes(ncols.saturating_sub(16)),
        lanes(ncols.saturating_sub(32)),
        lanes(ncols.saturating_sub(48)),
    ]
}

/// GEMM microkernel, fp32 arm: `C[0..rows, 0..ncols] (+)= Σ_k A[k][r] · B[k][j]` over `kc` steps.
///
/// # Safety
/// AVX-512F; each `a[r]` addresses `kc` f32 of one activation row, `b` holds `kc · NR` f32 (`[k][NR]`), `c` addresses
/// `rows` rows of stride `ldc` with `ncols ≤ 64` writable columns.
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn ukr_f32(
    kc: usize,
    a: &[*const f32; MR],
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    rows: usize,
    ncols: usize,
    load: bool,
) {
    // SAFETY: the caller guarantees the extents documented above.
    unsafe {
        let m = col_masks(ncols);
        let mut acc = [[_mm512_setzero_ps(); 4]; MR];
        if load {
            for (r, row) in acc.iter_mut().enumerate() {
                if r < rows {
                    for (v, x) in row.iter_mut().enumerate() {
                        *x = _mm512_maskz_loadu_ps(m[v], c.add(r * ldc + 16 * v));
                    }
                }
            }
        }
        for kk in 0..kc {
            let bp = b.add(kk * NR);
            let bv = [
                _mm512_loadu_ps(bp),
                _mm512_loadu_ps(bp.add(16)),
                _mm512_loadu_ps(bp.add(32)),
                _mm512_loadu_ps(bp.add(48)),
            ];
            for (r, row) in acc.iter_mut().enumerate() {
                let ar = _mm512_set1_ps(*a[r].add(kk));
                for (v, x) in row.iter_mut().enumerate() {
                    *x = _mm512_fmadd_ps(ar, bv[v], *x);
                }
            }
        }
        for (r, row) in acc.iter().enumerate() {
            if r < rows {
                for (v, x) in row.iter().enumerate() {
                    _mm512_mask_storeu_ps(c.add(r * ldc + 16 * v), m[v], *x);
                }
            }
        }
    }
}

/// GEMM microkernel, bf16 arm: `kp` steps of `vdpbf16ps` over input pairs.
///
/// # Safety
/// AVX-512F + AVX512_BF16; each `a[r]` addresses `kp` u32 bf16 pairs of one activation row, `b` holds `kp · NR · 2` bf16
/// (`[kp][NR][2]`), `c` as in [`ukr_f32`].
#[target_feature(enable = "avx512f,avx512bf16")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn ukr_bf16(
    kp: usize,
    a: &[*const u32; MR],
    b: *const u16,
    c: *mut f32,
    ldc: usize,
    rows: usize,
    ncols: usize,
    load: bool,
) {
    // SAFETY: the caller guarantees the extents documented above; the transmutes reinterpret 512-bit
    // integer vectors as vectors of 32 bf16, which have the same size and no invalid bit patterns.
    unsafe {
        let m = col_masks(ncols);
        let mut acc = [[_mm512_setzero_ps(); 4]; MR];
        if load {
            for (r, row) in acc.iter_mut().enumerate() {
                if r < rows {
                    for (v, x) in row.iter_mut().enumerate() {
                        *x = _mm512_maskz_loadu_ps(m[v], c.add(r * ldc + 16 * v));
                    }
                }
            }
        }
        for kk in 0..kp {
            let bp = b.add(kk * NR * 2) as *const __m512i;
            let bv: [__m512bh; 4] = [
                std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(bp)),
                std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(bp.add(1))),
                std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(bp.add(2))),
                std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(bp.add(3))),
            ];
            for (r, row) in acc.iter_mut().enumerate() {
                let ar = std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(
                    *a[r].add(kk) as i32
                ));
                for (v, x) in row.iter_mut().enumerate() {
                    *x = _mm512_dpbf16_ps(*x, ar, bv[v]);
                }
            }
        }
        for (r, row) in acc.iter().enumerate() {
            if r < rows {
                for (v, x) in row.iter().enumerate() {
                    _mm512_mask_storeu_ps(c.add(r * ldc + 16 * v), m[v], *x);
                }
            }
        }
    }
}

/// Widen a BF16 panel chunk `[kp][NR][2]` into f32 `[2·kp][NR]` (exact: a shift or a mask per vector).
///
/// # Safety
/// AVX-512F; `src` holds `kp · NR · 2` u16, `dst` has room for `2 · kp · NR` f32.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn widen_chunk(kp: usize, src: *const u16, dst: *mut f32) {
    // SAFETY: extents as documented.
    unsafe {
        let hi = _mm512_set1_epi32(0xffff_0000u32 as i32);
        for kk in 0..kp {
            let s = src.add(kk * NR * 2) as *const __m512i;
            let d = dst.add(2 * kk * NR);
            for v in 0..4 {
                let x = _mm512_loadu_si512(s.add(v));
                _mm512_storeu_ps(
                    d.add(16 * v),
                    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(x)),
                );
                _mm512_storeu_ps(
                    d.add(NR + 16 * v),
                    _mm512_castsi512_ps(_mm512_and_si512(x, hi)),
                );
            }
        }
    }
}

/// Round `n` f32 to bf16 (nearest-even) and store them as pairs: `dst[i] = bf16(src[2i]) | bf16(src[2i+1]) << 16`.
/// An odd tail pairs with zero.
///
/// # Safety
/// AVX-512F + AVX512_BF16; `src` holds `n` f32, `dst` has room for `n.div_ceil(2)` u32.
#[target_feature(enable = "avx512f,avx512bf16")]
pub(crate) unsafe fn round_pairs_bf16(n: usize, src: *const f32, dst: *mut u32) {
    // SAFETY: extents as documented.
    unsafe {
        let mut i = 0;
        while i + 32 <= n {
            let lo = _mm512_loadu_ps(src.add(i));
            let hi = _mm512_loadu_ps(src.add(i + 16));
            // vcvtne2ps2bf16 puts the second operand in the low half.
            let v = _mm512_cvtne2ps_pbh(hi, lo);
            _mm512_storeu_si512(
                dst.add(i / 2) as *mut __m512i,
                std::mem::transmute::<__m512bh, __m512i>(v),
            );
            i += 32;
        }
        while i < n {
            let a = super::bf16_bits(*src.add(i)) as u32;
            let b = if i + 1 < n {
                super::bf16_bits(*src.add(i + 1)) as u32
            } else {
                0
            };
            *dst.add(i / 2) = a | (b << 16);
            i += 2;
        }
    }
}

/// One register block of the small matrix product: `MRB` rows × `NV` vectors of 16 columns.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn mm_block<const MRB: usize, const NV: usize>(
    k: usize,
    arows: [*const f32; MRB],
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    rows: usize,
    ncols: usize,
    accumulate: bool,
) {
    // SAFETY: the caller (`matmul_f32`) passes in-bounds row pointers and column counts.
    unsafe {
        let m = col_masks(ncols);
        let mut acc = [[_mm512_setzero_ps(); NV]; MRB];
        if accumulate {
            for (r, row) in acc.iter_mut().enumerate() {
                if r < rows {
                    for (v, x) in row.iter_mut().enumerate() {
                        *x = _mm512_maskz_loadu_ps(m[v], c.add(r * ldc + 16 * v));
                    }
                }
            }
        }
        for kk in 0..k {
            let bp = b.add(kk * ldb);
            let mut bv = [_mm512_setzero_ps(); NV];
            for (v, x) in bv.iter_mut().enumerate() {
                *x = _mm512_maskz_loadu_ps(m[v], bp.add(16 * v));
            }
            for (r, row) in acc.iter_mut().enumerate() {
                let ar = _mm512_set1_ps(*arows[r].add(kk));
                for (v, x) in row.iter_mut().enumerate() {
                    *x = _mm512_fmadd_ps(ar, bv[v], *x);
                }
            }
        }
        for (r, row) in acc.iter().enumerate() {
            if r < rows {
                for (v, x) in row.iter().enumerate() {
                    _mm512_mask_storeu_ps(c.add(r * ldc + 16 * v), m[v], *x);
                }
            }
        }
    }
}

/// `C[m×n] (+)= A[m×k] · B[k×n]`, all row-major with the given strides.
///
/// # Safety
/// AVX-512F; the three matrices lie within their slices at the given strides (checked by the caller).
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn matmul_f32(
    m: usize,
    n: usize,
    k: usize,
    a: *const f32,
    lda: usize,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
) {
    // SAFETY: extents as documented; rows past `m` in a register block reuse the last valid row's
    // pointer and are never stored.
    unsafe {
        let mut j0 = 0;
        while j0 < n {
            let nc = (n - j0).min(64);
            let nv = nc.div_ceil(16);
            // Narrow column blocks have few accumulators per row, so take more rows per block.
            if nv == 1 {
                run_rows::<12, 1>(m, k, a, lda, b.add(j0), ldb, c.add(j0), ldc, nc, accumulate);
            } else if nv == 2 {
                run_rows::<12, 2>(m, k, a, lda, b.add(j0), ldb, c.add(j0), ldc, nc, accumulate);
            } else if nv == 3 {
                run_rows::<8, 3>(m, k, a, lda, b.add(j0), ldb, c.add(j0), ldc, nc, accumulate);
            } else {
                run_rows::<6, 4>(m, k, a, lda, b.add(j0), ldb, c.add(j0), ldc, nc, accumulate);
            }
            j0 += 64;
        }
    }
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn run_rows<const MRB: usize, const NV: usize>(
    m: usize,
    k: usize,
    a: *const f32,
    lda: usize,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    nc: usize,
    accumulate: bool,
) {
    // SAFETY: see `matmul_f32`.
    unsafe {
        let mut i0 = 0;
        while i0 < m {
            let rows = (m - i0).min(MRB);
            let mut arows = [a; MRB];
            for (r, p) in arows.iter_mut().enumerate() {
                *p = a.add((i0 + r.min(rows - 1)) * lda);
            }
            mm_block::<MRB, NV>(k, arows, b, ldb, c.add(i0 * ldc), ldc, rows, nc, accumulate);
            i0 += MRB;
        }
    }
}

const LOG2E: f32 = std::f32::consts::LOG2_E;
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;

/// e^x for 16 lanes: range reduction by ln 2, degree-7 Taylor polynomial, `vscalefps`. About 1 ulp;
/// inputs below −87.3 give 0 (the true value is subnormal), above 88.72 (overflow) +∞.
#[inline(always)]
pub(crate) unsafe fn exp512(x: __m512) -> __m512 {
    // SAFETY: pure register arithmetic (the caller's target features include AVX-512F).
    unsafe {
        let under = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_set1_ps(-87.3));
        let over = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, _mm512_set1_ps(88.722_83));
        let xc = _mm512_min_ps(x, _mm512_set1_ps(88.722_83));
        let xc = _mm512_max_ps(xc, _mm512_set1_ps(-87.3));
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm512_mul_ps(xc, _mm512_set1_ps(LOG2E)),
        );
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), xc);
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), r);
        let mut p = _mm512_set1_ps(1.0 / 5040.0);
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0 / 720.0));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0 / 120.0));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0 / 24.0));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0 / 6.0));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0));
        let y = _mm512_scalef_ps(p, n);
        // NaN in, NaN out (min/max above would have replaced it).
        let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x);
        let y = _mm512_mask_mov_ps(y, nan, x);
        let y = _mm512_mask_mov_ps(y, over, _mm512_set1_ps(f32::INFINITY));
        _mm512_mask_mov_ps(y, under, _mm512_setzero_ps())
    }
}

/// Apply a 16-lane function to a slice in place (masked tail).
#[inline(always)]
unsafe fn map_inplace(x: &mut [f32], f: impl Fn(__m512) -> __m512) {
    // SAFETY: loads and stores stay within `x` (masked tail).
    unsafe {
        let n = x.len();
        let p = x.as_mut_ptr();
        let mut i = 0;
        while i < n {
            let m = lanes(n - i);
            let v = _mm512_maskz_loadu_ps(m, p.add(i));
            _mm512_mask_storeu_ps(p.add(i), m, f(v));
            i += 16;
        }
    }
}

/// `x ← e^x`.
///
/// # Safety
/// AVX-512F.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn exp_inplace(x: &mut [f32]) {
    // SAFETY: AVX-512F is enabled for this function.
    unsafe { map_inplace(x, |v| exp512(v)) }
}

/// `x ← x · sigmoid(x)` computed as `x / (1 + e^−x)`.
///
/// # Safety
/// AVX-512F.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn silu_inplace(x: &mut [f32]) {
    // SAFETY: AVX-512F is enabled for this function.
    unsafe {
        map_inplace(x, |v| {
            let e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), v));
            _mm512_div_ps(v, _mm512_add_ps(_mm512_set1_ps(1.0), e))
        })
    }
}

/// `x ← 1 / (1 + e^−x)`.
///
/// # Safety
/// AVX-512F.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn sigmoid_inplace(x: &mut [f32]) {
    // SAFETY: AVX-512F is enabled for this function.
    unsafe {
        map_inplace(x, |v| {
            let e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), v));
            _mm512_div_ps(_mm512_set1_ps(1.0), _mm512_add_ps(_mm512_set1_ps(1.0), e))
        })
    }
}

/// `out[i] = silu(g[i]) · u[i]`.
///
/// # Safety
/// AVX-512F; the three slices have equal length.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn swiglu(g: &[f32], u: &[f32], out: &mut [f32]) {
    // SAFETY: masked loads/stores within the common length.
    unsafe {
        let n = out.len().min(g.len()).min(u.len());
        let mut i = 0;
        while i < n {
            let m = lanes(n - i);
            let gv = _mm512_maskz_loadu_ps(m, g.as_ptr().add(i));
            let uv = _mm512_maskz_loadu_ps(m, u.as_ptr().add(i));
            let e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), gv));
            let s = _mm512_div_ps(gv, _mm512_add_ps(_mm512_set1_ps(1.0), e));
            _mm512_mask_storeu_ps(out.as_mut_ptr().add(i), m, _mm512_mul_ps(s, uv));
            i += 16;
        }
    }
}

/// Peak loop: `iters` rounds of 12 independent f32 FMAs; returns a value that depends on all of them.
///
/// # Safety
/// AVX-512F.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn peak_fma(iters: u64) -> f32 {
    let x = _mm512_set1_ps(1.000_000_1);
    let y = _mm512_set1_ps(0.999_999_9);
    let mut a = [_mm512_setzero_ps(); 12];
    for (i, v) in a.iter_mut().enumerate() {
        *v = _mm512_set1_ps(i as f32);
    }
    for _ in 0..iters {
        for v in a.iter_mut() {
            *v = _mm512_fmadd_ps(*v, x, y);
        }
    }
    let mut s = a[0];
    for v in &a[1..] {
        s = _mm512_add_ps(s, *v);
    }
    _mm512_reduce_add_ps(s)
}

/// Peak loop: `iters` rounds of 12 independent `vdpbf16ps`.
///
/// # Safety
/// AVX-512F + AVX512_BF16.
#[target_feature(enable = "avx512f,avx512bf16")]
pub(crate) unsafe fn peak_bf16(iters: u64) -> f32 {
    // SAFETY: the transmute reinterprets an integer vector as 32 bf16 (same size, all patterns valid).
    let x = unsafe { std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi16(0x3f80)) };
    let mut a = [_mm512_setzero_ps(); 12];
    for _ in 0..iters {
        for v in a.iter_mut() {
            *v = _mm512_dpbf16_ps(*v, x, x);
        }
    }
    let mut s = a[0];
    for v in &a[1..] {
        s = _mm512_add_ps(s, *v);
    }
    _mm512_reduce_add_ps(s)
}

/// Ask for the cache lines of `bytes[from..to]` to be brought into L2 (a hint: no fault, no effect on
/// values).
#[inline]
pub(crate) fn prefetch_l2(bytes: &[u8], from: usize, to: usize) {
    let to = to.min(bytes.len());
    let mut i = from;
    while i < to {
        // SAFETY: prefetching is a hint that cannot fault; the address lies inside `bytes`.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(bytes.as_ptr().add(i) as *const i8) };
        i += 64;
    }
}
