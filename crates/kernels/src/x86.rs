//! x86-64 instruction sets: [`Avx2`] (AVX2 + FMA, 8 lanes) and [`Avx512`] (AVX-512F, 16 lanes) implement
//! [`Simd`], entered through [`on_avx2`] / [`on_avx512`]; beside them the parts that exist on one
//! instruction set only: the AVX512_BF16 dot-product microkernel and rounding, its peak loop, and L2
//! prefetch hints.
//!
//! Every function here is `unsafe` for two reasons: it must only run on a CPU with the target features
//! it is compiled for (callers check through [`super::Kernels`]), and it reads and writes through raw
//! pointers whose extents the safe drivers in `gemm.rs`, `matmul.rs` and `math.rs` check.

use std::arch::x86_64::*;

use super::Isa;
use super::layout::{MR, NR, Tile};
use super::simd::{Kernel, Simd};

/// Run `k` compiled for AVX2 + FMA.
///
/// # Safety
/// The CPU has AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn on_avx2<K: Kernel>(k: K) -> K::Out {
    k.run::<Avx2>()
}

/// Run `k` compiled for AVX-512F.
///
/// # Safety
/// The CPU has AVX-512F (which implies AVX2 and FMA).
#[target_feature(enable = "avx512f,avx2,fma")]
pub(crate) unsafe fn on_avx512<K: Kernel>(k: K) -> K::Out {
    k.run::<Avx512>()
}

/// AVX2 + FMA: 8 f32 lanes, 16 vector registers.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Avx2;

/// A lane mask for the first `n` of 8 lanes (sign bit set where active).
#[inline(always)]
unsafe fn mask8(n: usize) -> __m256i {
    // SAFETY: register arithmetic (AVX2 in the caller).
    unsafe {
        _mm256_cmpgt_epi32(
            _mm256_set1_epi32(n.min(8) as i32),
            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
        )
    }
}

impl Simd for Avx2 {
    type V = __m256;
    type M = __m256;
    const LANES: usize = 8;
    const WIDE_TILE: usize = 2;
    const ISA: Isa = Isa::Avx2;

    #[inline(always)]
    unsafe fn zero() -> __m256 {
        unsafe { _mm256_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> __m256 {
        unsafe { _mm256_set1_ps(x) }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m256 {
        unsafe { _mm256_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m256) {
        unsafe { _mm256_storeu_ps(p, v) }
    }
    #[inline(always)]
    unsafe fn load_part(p: *const f32, n: usize) -> __m256 {
        // SAFETY: a masked load touches only the active lanes.
        unsafe {
            if n >= 8 {
                _mm256_loadu_ps(p)
            } else {
                _mm256_maskload_ps(p, mask8(n))
            }
        }
    }
    #[inline(always)]
    unsafe fn store_part(p: *mut f32, n: usize, v: __m256) {
        // SAFETY: a masked store touches only the active lanes.
        unsafe {
            if n >= 8 {
                _mm256_storeu_ps(p, v)
            } else {
                _mm256_maskstore_ps(p, mask8(n), v)
            }
        }
    }
    #[inline(always)]
    unsafe fn fma(a: __m256, b: __m256, c: __m256) -> __m256 {
        unsafe { _mm256_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn fnma(a: __m256, b: __m256, c: __m256) -> __m256 {
        unsafe { _mm256_fnmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn add(a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_add_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn sub(a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_sub_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn mul(a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_mul_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn div(a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_div_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn max(a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_max_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn min(a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_min_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn round(a: __m256) -> __m256 {
        unsafe { _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(a) }
    }
    #[inline(always)]
    unsafe fn scale2(p: __m256, n: __m256) -> __m256 {
        // 2ⁿ built from exponent bits in two factors (2^min(n,127) · 2^(n−that)), so n = 128 works; both
        // products are exact unless the result is subnormal or overflows, where the one rounding is the
        // same as vscalefps's.
        unsafe {
            let ni = _mm256_cvtps_epi32(n);
            let e1 = _mm256_min_epi32(ni, _mm256_set1_epi32(127));
            let e2 = _mm256_sub_epi32(ni, e1);
            let bias = _mm256_set1_epi32(127);
            let p1 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(e1, bias)));
            let p2 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(e2, bias)));
            _mm256_mul_ps(_mm256_mul_ps(p, p1), p2)
        }
    }
    #[inline(always)]
    unsafe fn lt(a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_cmp_ps::<_CMP_LT_OQ>(a, b) }
    }
    #[inline(always)]
    unsafe fn gt(a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_cmp_ps::<_CMP_GT_OQ>(a, b) }
    }
    #[inline(always)]
    unsafe fn nan(a: __m256) -> __m256 {
        unsafe { _mm256_cmp_ps::<_CMP_UNORD_Q>(a, a) }
    }
    #[inline(always)]
    unsafe fn select(m: __m256, a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_blendv_ps(b, a, m) }
    }
    #[inline(always)]
    unsafe fn reduce_add(a: __m256) -> f32 {
        unsafe {
            let s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps::<1>(a));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_shuffle_ps::<0b01>(s, s));
            _mm_cvtss_f32(s)
        }
    }
    #[inline(always)]
    unsafe fn reduce_max(a: __m256) -> f32 {
        unsafe {
            let s = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps::<1>(a));
            let s = _mm_max_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_max_ss(s, _mm_shuffle_ps::<0b01>(s, s));
            _mm_cvtss_f32(s)
        }
    }
    #[inline(always)]
    unsafe fn widen_pairs(p: *const u32) -> (__m256, __m256) {
        unsafe {
            let x = _mm256_loadu_si256(p as *const __m256i);
            (
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(x)),
                _mm256_castsi256_ps(_mm256_and_si256(
                    x,
                    _mm256_set1_epi32(0xffff_0000u32 as i32),
                )),
            )
        }
    }
}

/// AVX-512F: 16 f32 lanes, 32 vector registers, mask registers.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Avx512;

/// Lane mask for the first `n` of 16 lanes.
#[inline(always)]
fn lanes(n: usize) -> __mmask16 {
    if n >= 16 {
        0xffff
    } else {
        ((1u32 << n) - 1) as __mmask16
    }
}

impl Simd for Avx512 {
    type V = __m512;
    type M = __mmask16;
    const LANES: usize = 16;
    const WIDE_TILE: usize = 4;
    const ISA: Isa = Isa::Avx512;

    #[inline(always)]
    unsafe fn zero() -> __m512 {
        unsafe { _mm512_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> __m512 {
        unsafe { _mm512_set1_ps(x) }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m512 {
        unsafe { _mm512_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m512) {
        unsafe { _mm512_storeu_ps(p, v) }
    }
    #[inline(always)]
    unsafe fn load_part(p: *const f32, n: usize) -> __m512 {
        // SAFETY: masked lanes are not read.
        unsafe { _mm512_maskz_loadu_ps(lanes(n), p) }
    }
    #[inline(always)]
    unsafe fn store_part(p: *mut f32, n: usize, v: __m512) {
        // SAFETY: masked lanes are not written.
        unsafe { _mm512_mask_storeu_ps(p, lanes(n), v) }
    }
    #[inline(always)]
    unsafe fn fma(a: __m512, b: __m512, c: __m512) -> __m512 {
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn fnma(a: __m512, b: __m512, c: __m512) -> __m512 {
        unsafe { _mm512_fnmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn add(a: __m512, b: __m512) -> __m512 {
        unsafe { _mm512_add_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn sub(a: __m512, b: __m512) -> __m512 {
        unsafe { _mm512_sub_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn mul(a: __m512, b: __m512) -> __m512 {
        unsafe { _mm512_mul_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn div(a: __m512, b: __m512) -> __m512 {
        unsafe { _mm512_div_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn max(a: __m512, b: __m512) -> __m512 {
        unsafe { _mm512_max_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn min(a: __m512, b: __m512) -> __m512 {
        unsafe { _mm512_min_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn round(a: __m512) -> __m512 {
        unsafe { _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(a) }
    }
    #[inline(always)]
    unsafe fn scale2(p: __m512, n: __m512) -> __m512 {
        unsafe { _mm512_scalef_ps(p, n) }
    }
    #[inline(always)]
    unsafe fn lt(a: __m512, b: __m512) -> __mmask16 {
        unsafe { _mm512_cmp_ps_mask::<_CMP_LT_OQ>(a, b) }
    }
    #[inline(always)]
    unsafe fn gt(a: __m512, b: __m512) -> __mmask16 {
        unsafe { _mm512_cmp_ps_mask::<_CMP_GT_OQ>(a, b) }
    }
    #[inline(always)]
    unsafe fn nan(a: __m512) -> __mmask16 {
        unsafe { _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(a, a) }
    }
    #[inline(always)]
    unsafe fn select(m: __mmask16, a: __m512, b: __m512) -> __m512 {
        unsafe { _mm512_mask_mov_ps(b, m, a) }
    }
    #[inline(always)]
    unsafe fn reduce_add(a: __m512) -> f32 {
        unsafe { _mm512_reduce_add_ps(a) }
    }
    #[inline(always)]
    unsafe fn reduce_max(a: __m512) -> f32 {
        unsafe { _mm512_reduce_max_ps(a) }
    }
    #[inline(always)]
    unsafe fn widen_pairs(p: *const u32) -> (__m512, __m512) {
        unsafe {
            let x = _mm512_loadu_si512(p as *const __m512i);
            (
                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(x)),
                _mm512_castsi512_ps(_mm512_and_si512(
                    x,
                    _mm512_set1_epi32(0xffff_0000u32 as i32),
                )),
            )
        }
    }
}

/// GEMM microkernel, bf16 arm: `kp` steps of `vdpbf16ps` over input pairs.
///
/// # Safety
/// AVX-512F + AVX512_BF16; each `a[r]` addresses `kp` u32 bf16 pairs of one activation row, `b` holds `kp · NR · 2` bf16
/// (`[kp][NR][2]`), `tile.c` addresses `tile.rows` rows of stride `tile.ldc` with `tile.ncols ≤ 64` writable
/// columns.
#[target_feature(enable = "avx512f,avx512bf16")]
pub(crate) unsafe fn ukr_bf16(kp: usize, a: &[*const u32; MR], b: *const u16, tile: Tile) {
    let Tile {
        c,
        ldc,
        rows,
        ncols,
        load,
    } = tile;
    // SAFETY: the caller guarantees the extents documented above; the transmutes reinterpret 512-bit
    // integer vectors as vectors of 32 bf16, which have the same size and no invalid bit patterns.
    unsafe {
        let m = [
            lanes(ncols),
            lanes(ncols.saturating_sub(16)),
            lanes(ncols.saturating_sub(32)),
            lanes(ncols.saturating_sub(48)),
        ];
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

/// Peak loop: `iters` rounds of 12 independent `vdpbf16ps`.
///
/// # Safety
/// AVX-512F + AVX512_BF16.
#[target_feature(enable = "avx512f,avx512bf16")]
#[cfg(feature = "peak")]
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
/// values). SSE, so every x86-64 CPU has it.
#[inline]
pub(crate) fn prefetch_l2(bytes: &[u8], from: usize, to: usize) {
    prefetch_lines::<_MM_HINT_T1>(bytes, from, to);
}

/// [`prefetch_l2`] into L1 as well.
#[inline]
pub(crate) fn prefetch_l1(bytes: &[u8], from: usize, to: usize) {
    prefetch_lines::<_MM_HINT_T0>(bytes, from, to);
}

#[inline(always)]
fn prefetch_lines<const HINT: i32>(bytes: &[u8], from: usize, to: usize) {
    let to = to.min(bytes.len());
    let mut i = from;
    while i < to {
        // SAFETY: prefetching is a hint that cannot fault; the address lies inside `bytes`.
        unsafe { _mm_prefetch::<HINT>(bytes.as_ptr().add(i) as *const i8) };
        i += 64;
    }
}

/// `dst[j·ldd + i] = src[i·lds + j]` for one 8 × 8 block: eight row loads, three rounds of in-register
/// shuffles, eight row stores (the scalar loop writes one element per column stride).
///
/// # Safety
/// AVX must be available; `src` must hold 8 rows of 8 at stride `lds`, `dst` 8 rows of 8 at stride `ldd`.
#[target_feature(enable = "avx")]
pub(crate) unsafe fn transpose8x8(src: *const f32, lds: usize, dst: *mut f32, ldd: usize) {
    // SAFETY: every access is inside the 8 × 8 blocks the caller vouches for.
    unsafe {
        let r: [__m256; 8] = std::array::from_fn(|i| _mm256_loadu_ps(src.add(i * lds)));
        let t = [
            _mm256_unpacklo_ps(r[0], r[1]),
            _mm256_unpackhi_ps(r[0], r[1]),
            _mm256_unpacklo_ps(r[2], r[3]),
            _mm256_unpackhi_ps(r[2], r[3]),
            _mm256_unpacklo_ps(r[4], r[5]),
            _mm256_unpackhi_ps(r[4], r[5]),
            _mm256_unpacklo_ps(r[6], r[7]),
            _mm256_unpackhi_ps(r[6], r[7]),
        ];
        let u = [
            _mm256_shuffle_ps::<0x44>(t[0], t[2]),
            _mm256_shuffle_ps::<0xEE>(t[0], t[2]),
            _mm256_shuffle_ps::<0x44>(t[1], t[3]),
            _mm256_shuffle_ps::<0xEE>(t[1], t[3]),
            _mm256_shuffle_ps::<0x44>(t[4], t[6]),
            _mm256_shuffle_ps::<0xEE>(t[4], t[6]),
            _mm256_shuffle_ps::<0x44>(t[5], t[7]),
            _mm256_shuffle_ps::<0xEE>(t[5], t[7]),
        ];
        for c in 0..4 {
            _mm256_storeu_ps(
                dst.add(c * ldd),
                _mm256_permute2f128_ps::<0x20>(u[c], u[c + 4]),
            );
            _mm256_storeu_ps(
                dst.add((c + 4) * ldd),
                _mm256_permute2f128_ps::<0x31>(u[c], u[c + 4]),
            );
        }
    }
}
