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
