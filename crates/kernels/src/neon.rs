//! aarch64 Advanced SIMD: [`Neon`] (4 f32 lanes, 32 vector registers, fused multiply-add) implements
//! [`Simd`], entered through [`on_neon`]. NEON is part of every aarch64 CPU's baseline; the entry point
//! still names it so the generic bodies are compiled for it explicitly.

use std::arch::aarch64::*;

use super::Isa;
use super::simd::{Kernel, Simd};

/// Run `k` compiled for NEON.
///
/// # Safety
/// The CPU has NEON (every aarch64 CPU that runs Linux does).
#[target_feature(enable = "neon")]
pub(crate) unsafe fn on_neon<K: Kernel>(k: K) -> K::Out {
    k.run::<Neon>()
}

/// NEON: 4 f32 lanes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Neon;

impl Simd for Neon {
    type V = float32x4_t;
    type M = uint32x4_t;
    const LANES: usize = 4;
    const WIDE_TILE: usize = 4;
    const ISA: Isa = Isa::Neon;

    #[inline(always)]
    unsafe fn zero() -> float32x4_t {
        unsafe { vdupq_n_f32(0.0) }
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> float32x4_t {
        unsafe { vdupq_n_f32(x) }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> float32x4_t {
        unsafe { vld1q_f32(p) }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: float32x4_t) {
        unsafe { vst1q_f32(p, v) }
    }
    #[inline(always)]
    unsafe fn load_part(p: *const f32, n: usize) -> float32x4_t {
        // SAFETY: only the first `n` lanes are read from `p`.
        unsafe {
            if n >= 4 {
                vld1q_f32(p)
            } else {
                let mut t = [0f32; 4];
                std::ptr::copy_nonoverlapping(p, t.as_mut_ptr(), n);
                vld1q_f32(t.as_ptr())
            }
        }
    }
    #[inline(always)]
    unsafe fn store_part(p: *mut f32, n: usize, v: float32x4_t) {
        // SAFETY: only the first `n` lanes are written to `p`.
        unsafe {
            if n >= 4 {
                vst1q_f32(p, v)
            } else {
                let mut t = [0f32; 4];
                vst1q_f32(t.as_mut_ptr(), v);
                std::ptr::copy_nonoverlapping(t.as_ptr(), p, n);
            }
        }
    }
    #[inline(always)]
    unsafe fn fma(a: float32x4_t, b: float32x4_t, c: float32x4_t) -> float32x4_t {
        unsafe { vfmaq_f32(c, a, b) }
    }
    #[inline(always)]
    unsafe fn fnma(a: float32x4_t, b: float32x4_t, c: float32x4_t) -> float32x4_t {
        unsafe { vfmsq_f32(c, a, b) }
    }
    #[inline(always)]
    unsafe fn add(a: float32x4_t, b: float32x4_t) -> float32x4_t {
        unsafe { vaddq_f32(a, b) }
    }
    #[inline(always)]
    unsafe fn sub(a: float32x4_t, b: float32x4_t) -> float32x4_t {
        unsafe { vsubq_f32(a, b) }
    }
    #[inline(always)]
    unsafe fn mul(a: float32x4_t, b: float32x4_t) -> float32x4_t {
        unsafe { vmulq_f32(a, b) }
    }
    #[inline(always)]
    unsafe fn div(a: float32x4_t, b: float32x4_t) -> float32x4_t {
        unsafe { vdivq_f32(a, b) }
    }
    #[inline(always)]
    unsafe fn max(a: float32x4_t, b: float32x4_t) -> float32x4_t {
        // maxnm: a NaN operand loses, as with x86's max against a number in the second operand.
        unsafe { vmaxnmq_f32(a, b) }
    }
    #[inline(always)]
    unsafe fn min(a: float32x4_t, b: float32x4_t) -> float32x4_t {
        unsafe { vminnmq_f32(a, b) }
    }
    #[inline(always)]
    unsafe fn round(a: float32x4_t) -> float32x4_t {
        unsafe { vrndnq_f32(a) }
    }
    #[inline(always)]
    unsafe fn scale2(p: float32x4_t, n: float32x4_t) -> float32x4_t {
        // As on AVX2: 2ⁿ from exponent bits in two factors, so n = 128 works.
        unsafe {
            let ni = vcvtq_s32_f32(n);
            let e1 = vminq_s32(ni, vdupq_n_s32(127));
            let e2 = vsubq_s32(ni, e1);
            let bias = vdupq_n_s32(127);
            let p1 = vreinterpretq_f32_s32(vshlq_n_s32::<23>(vaddq_s32(e1, bias)));
            let p2 = vreinterpretq_f32_s32(vshlq_n_s32::<23>(vaddq_s32(e2, bias)));
            vmulq_f32(vmulq_f32(p, p1), p2)
        }
    }
    #[inline(always)]
    unsafe fn lt(a: float32x4_t, b: float32x4_t) -> uint32x4_t {
        unsafe { vcltq_f32(a, b) }
    }
    #[inline(always)]
    unsafe fn gt(a: float32x4_t, b: float32x4_t) -> uint32x4_t {
        unsafe { vcgtq_f32(a, b) }
    }
    #[inline(always)]
    unsafe fn nan(a: float32x4_t) -> uint32x4_t {
        unsafe { vmvnq_u32(vceqq_f32(a, a)) }
    }
    #[inline(always)]
    unsafe fn select(m: uint32x4_t, a: float32x4_t, b: float32x4_t) -> float32x4_t {
        unsafe { vbslq_f32(m, a, b) }
    }
    #[inline(always)]
    unsafe fn reduce_add(a: float32x4_t) -> f32 {
        unsafe { vaddvq_f32(a) }
    }
    #[inline(always)]
    unsafe fn reduce_max(a: float32x4_t) -> f32 {
        unsafe { vmaxnmvq_f32(a) }
    }
    #[inline(always)]
    unsafe fn widen_pairs(p: *const u32) -> (float32x4_t, float32x4_t) {
        unsafe {
            let x = vld1q_u32(p);
            (
                vreinterpretq_f32_u32(vshlq_n_u32::<16>(x)),
                vreinterpretq_f32_u32(vandq_u32(x, vdupq_n_u32(0xffff_0000))),
            )
        }
    }
}

/// The int8 arm's microkernel on the dot-product extension (`sdot`, ARMv8.2 DotProd): s8 × s8 with i32
/// accumulation, so neither operand is shifted and no correction is needed. A 128-bit weight load is 4
/// outputs × 4 inputs; the indexed form takes row `r`'s four activations straight from a lane of the
/// loaded group (rows 0–3 in one register, 4–5 in another), so there is no broadcast. 6 rows × 4 vectors
/// (16 outputs) = 24 accumulators of the 32 registers, four column blocks; the sums are kept as
/// `[4][6][16]` i32 (`Path::acc_cols` = 16).
///
/// # Safety
/// DotProd; `a` addresses `kg · 6 · 4` bytes (six rows interleaved by input group), `b` `kg · 64 · 4`,
/// `acc` `6 · 64` i32; rows past `rows ≤ 6` are computed and not stored.
#[target_feature(enable = "neon,dotprod")]
pub(crate) unsafe fn ukr_sdot(
    kg: usize,
    a: *const i8,
    b: *const i8,
    acc: *mut i32,
    rows: usize,
    load: bool,
) {
    use super::layout::{G, MR8, NR};
    // SAFETY: extents as documented.
    unsafe {
        for jb in 0..NR / 16 {
            let at = |r: usize, v: usize| acc.add(jb * MR8 * 16 + r * 16 + 4 * v);
            let mut c = [[vdupq_n_s32(0); 4]; MR8];
            if load {
                for (r, row) in c.iter_mut().enumerate().take(rows) {
                    for (v, x) in row.iter_mut().enumerate() {
                        *x = vld1q_s32(at(r, v));
                    }
                }
            }
            for g in 0..kg {
                let bp = b.add(g * NR * G + jb * 16 * G);
                let bv = [
                    vld1q_s8(bp),
                    vld1q_s8(bp.add(16)),
                    vld1q_s8(bp.add(32)),
                    vld1q_s8(bp.add(48)),
                ];
                let ap = a.add(g * MR8 * G);
                let lo = vld1q_s8(ap);
                // Rows 4 and 5 (8 bytes), read as the low half of a register.
                let hi = vcombine_s8(vld1_s8(ap.add(16)), vdup_n_s8(0));
                macro_rules! row {
                    ($r:expr, $src:expr, $lane:expr) => {
                        for (v, x) in c[$r].iter_mut().enumerate() {
                            *x = sdot_lane::<$lane>(*x, bv[v], $src);
                        }
                    };
                }
                row!(0, lo, 0);
                row!(1, lo, 1);
                row!(2, lo, 2);
                row!(3, lo, 3);
                row!(4, hi, 0);
                row!(5, hi, 1);
            }
            for (r, row) in c.iter().enumerate().take(rows) {
                for (v, x) in row.iter().enumerate() {
                    vst1q_s32(at(r, v), *x);
                }
            }
        }
    }
}

/// `acc + sdot(w, a.4b[L])`: each i32 lane `i` of `acc` plus the dot product of bytes `4i..4i+4` of `w`
/// with bytes `4L..4L+4` of `a`. Assembly, as the `vdotq_laneq_s32` intrinsic is not stable Rust yet.
///
/// # Safety
/// DotProd.
#[inline(always)]
unsafe fn sdot_lane<const L: i32>(acc: int32x4_t, w: int8x16_t, a: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: register arithmetic; DotProd is the caller's contract.
    unsafe {
        std::arch::asm!(
            "sdot {acc:v}.4s, {w:v}.16b, {a:v}.4b[{l}]",
            acc = inout(vreg) acc,
            w = in(vreg) w,
            a = in(vreg) a,
            l = const L,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    acc
}

/// The int8 arm's microkernel on the matrix-multiply extension (`smmla`, ARMv8.6 I8MM): one instruction
/// multiplies a 2 × 8 block of activations (two rows' eight inputs) by the transpose of a 2 × 8 block of
/// weights (two outputs' eight inputs) into a 2 × 2 block of i32 sums — twice the multiply-adds of an
/// `sdot`, and no broadcast. Both operands come in that shape from their layouts: the activations are
/// stored by pairs of input groups (`Path::unit_groups`) and the weight block interleaved the same way
/// (`block_for_kernel`), so a 128-bit load is one operand. Three row pairs × eight output pairs
/// (16 outputs) = 24 accumulators of the 32 registers, four column blocks; the sums are kept as
/// `[4][6][16]` i32 like [`ukr_sdot`]'s (`Path::acc_cols` = 16), each accumulator's two rows split to
/// their places when stored. All six rows' sums are loaded and stored (the buffer has room for them;
/// rows past the group's real ones are never dequantised).
///
/// # Safety
/// I8MM; `a` addresses `kg.div_ceil(2) · 6 · 8` bytes (six rows interleaved by pairs of input groups),
/// `b` `kg.div_ceil(2) · 64 · 8` (the interleaved block), `acc` `6 · 64` i32.
#[target_feature(enable = "neon,i8mm")]
pub(crate) unsafe fn ukr_smmla(kg: usize, a: *const i8, b: *const i8, acc: *mut i32, load: bool) {
    use super::layout::{MR8, NR};
    const PAIRS: usize = MR8 / 2;
    // SAFETY: extents as documented.
    unsafe {
        for jb in 0..NR / 16 {
            let at = |r: usize, v: usize| acc.add(jb * MR8 * 16 + r * 16 + 4 * v);
            // c[p][q]: rows 2p, 2p + 1 × outputs 2q, 2q + 1 of the column block, row-major.
            let mut c = [[vdupq_n_s32(0); 8]; PAIRS];
            if load {
                for (p, pair) in c.iter_mut().enumerate() {
                    for v in 0..4 {
                        let r0 = vreinterpretq_s64_s32(vld1q_s32(at(2 * p, v)));
                        let r1 = vreinterpretq_s64_s32(vld1q_s32(at(2 * p + 1, v)));
                        pair[2 * v] = vreinterpretq_s32_s64(vzip1q_s64(r0, r1));
                        pair[2 * v + 1] = vreinterpretq_s32_s64(vzip2q_s64(r0, r1));
                    }
                }
            }
            for u in 0..kg.div_ceil(2) {
                let ap = a.add(u * MR8 * 8);
                let av = [vld1q_s8(ap), vld1q_s8(ap.add(16)), vld1q_s8(ap.add(32))];
                let bp = b.add(u * NR * 8 + jb * 16 * 8);
                for q in 0..8 {
                    let w = vld1q_s8(bp.add(16 * q));
                    for (p, pair) in c.iter_mut().enumerate() {
                        pair[q] = smmla(pair[q], av[p], w);
                    }
                }
            }
            for (p, pair) in c.iter().enumerate() {
                for v in 0..4 {
                    let (x, y) = (
                        vreinterpretq_s64_s32(pair[2 * v]),
                        vreinterpretq_s64_s32(pair[2 * v + 1]),
                    );
                    vst1q_s32(at(2 * p, v), vreinterpretq_s32_s64(vzip1q_s64(x, y)));
                    vst1q_s32(at(2 * p + 1, v), vreinterpretq_s32_s64(vzip2q_s64(x, y)));
                }
            }
        }
    }
}

/// `acc + a · wᵀ` on 2 × 8 int8 blocks (`a`: two rows' eight bytes, `w` likewise): lane `2i + j` of
/// `acc` plus the dot product of bytes `8i..8i+8` of `a` with bytes `8j..8j+8` of `w`. Assembly, as the
/// `vmmlaq_s32` intrinsic is not stable Rust yet.
///
/// # Safety
/// I8MM.
#[inline(always)]
unsafe fn smmla(acc: int32x4_t, a: int8x16_t, w: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: register arithmetic; I8MM is the caller's contract.
    unsafe {
        std::arch::asm!(
            "smmla {acc:v}.4s, {a:v}.16b, {w:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            w = in(vreg) w,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    acc
}
