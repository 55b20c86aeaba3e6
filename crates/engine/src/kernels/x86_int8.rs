//! The int8 arm's x86 microkernels (see `int8.rs` for the scheme and the saturation argument).
//!
//! Both compute `acc[r][0..64] (+)= Σ_g Σ_t a[r][4g+t] · b[g][j][t]` exactly in i32 over `kg` groups of
//! four inputs, `b` in the `[kg][64][4]` panel layout.

use std::arch::x86_64::*;

use super::int8::{G, MR8};
use super::pack::NR;

/// AVX-512 VNNI: `vpdpbusd` on u8 activations (`q_a + 128`) and s8 weights; 6 rows × 4 vectors of 16
/// outputs = 24 accumulators.
///
/// # Safety
/// AVX-512F/BW/VNNI; each `a[r]` addresses `kg · 4` bytes, `b` `kg · 64 · 4` bytes, `acc` `rows · 64`
/// i32 (`rows ≤ 6`; rows past `rows` are computed from valid pointers and not stored).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(crate) unsafe fn ukr_vnni(
    kg: usize,
    a: &[*const u8; MR8],
    b: *const i8,
    acc: *mut i32,
    rows: usize,
    load: bool,
) {
    // SAFETY: extents as documented.
    unsafe {
        let mut c = [[_mm512_setzero_si512(); 4]; MR8];
        if load {
            for (r, row) in c.iter_mut().enumerate().take(rows) {
                for (v, x) in row.iter_mut().enumerate() {
                    *x = _mm512_loadu_si512(acc.add(r * NR + 16 * v) as *const __m512i);
                }
            }
        }
        for g in 0..kg {
            let bp = b.add(g * NR * G) as *const __m512i;
            let bv = [
                _mm512_loadu_si512(bp),
                _mm512_loadu_si512(bp.add(1)),
                _mm512_loadu_si512(bp.add(2)),
                _mm512_loadu_si512(bp.add(3)),
            ];
            for (r, row) in c.iter_mut().enumerate() {
                let ar = _mm512_set1_epi32((a[r].add(g * G) as *const i32).read_unaligned());
                for (v, x) in row.iter_mut().enumerate() {
                    *x = _mm512_dpbusd_epi32(*x, ar, bv[v]);
                }
            }
        }
        for (r, row) in c.iter().enumerate().take(rows) {
            for (v, x) in row.iter().enumerate() {
                _mm512_storeu_si512(acc.add(r * NR + 16 * v) as *mut __m512i, *x);
            }
        }
    }
}

/// AVX2: `vpmaddubsw(|q_a|, sign(q_w, q_a))` (pairs ≤ 32,258, no saturation) then `vpmaddwd` by ones;
/// 4 rows × 2 vectors of 8 outputs per column block (8 accumulators of 16 registers), four blocks.
///
/// # Safety
/// AVX2; as [`ukr_vnni`] with signed activations and `rows ≤ 4`.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn ukr_avx2(
    kg: usize,
    a: &[*const u8; MR8],
    b: *const i8,
    acc: *mut i32,
    rows: usize,
    load: bool,
) {
    const R: usize = 4;
    // SAFETY: extents as documented.
    unsafe {
        let ones = _mm256_set1_epi16(1);
        for jb in 0..NR / 16 {
            let mut c = [[_mm256_setzero_si256(); 2]; R];
            if load {
                for (r, row) in c.iter_mut().enumerate().take(rows) {
                    for (v, x) in row.iter_mut().enumerate() {
                        *x =
                            _mm256_loadu_si256(acc.add(r * NR + jb * 16 + 8 * v) as *const __m256i);
                    }
                }
            }
            for g in 0..kg {
                let bp = b.add(g * NR * G + jb * 16 * G) as *const __m256i;
                let bv = [_mm256_loadu_si256(bp), _mm256_loadu_si256(bp.add(1))];
                for (r, row) in c.iter_mut().enumerate() {
                    let ar = _mm256_set1_epi32((a[r].add(g * G) as *const i32).read_unaligned());
                    let aa = _mm256_abs_epi8(ar);
                    for (v, x) in row.iter_mut().enumerate() {
                        let p = _mm256_maddubs_epi16(aa, _mm256_sign_epi8(bv[v], ar));
                        *x = _mm256_add_epi32(*x, _mm256_madd_epi16(p, ones));
                    }
                }
            }
            for (r, row) in c.iter().enumerate().take(rows) {
                for (v, x) in row.iter().enumerate() {
                    _mm256_storeu_si256(acc.add(r * NR + jb * 16 + 8 * v) as *mut __m256i, *x);
                }
            }
        }
    }
}
