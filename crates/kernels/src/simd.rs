//! The instruction-set abstraction every kernel is written against.
//!
//! A kernel is written once, generic over [`Simd`] (a vector of `LANES` f32 and the few operations the
//! kernels need), and run through [`dispatch`], which calls it inside a function compiled for the
//! instruction set the [`Kernels`] value names (`#[target_feature]`): the generic body and every
//! `#[inline(always)]` operation it uses are inlined there, so each instruction set gets its own
//! machine code from one source. The implementations are `Scalar` (plain Rust, one lane: the
//! correctness fallback), `Avx2` (8 lanes, FMA) and `Avx512` (16 lanes) in `x86`, and `Neon` (4 lanes)
//! in `neon`.
//!
//! Why our own trait rather than a SIMD crate: the kernels need exact control of every rounding
//! (each output element is one fused multiply-add chain in input order, which is what makes a batched
//! row bit-equal to the row alone, and makes the f32 GEMM give the same bits on AVX2 and AVX-512),
//! partial vectors at row ends, and instruction-set-specific extras beside the common core (the
//! AVX512_BF16 dot products, prefetches). The core is ~20 operations per instruction set; a general
//! crate brings a much larger surface whose codegen we would have to audit anyway.

use super::Isa;

/// A vector of `LANES` f32 on one instruction set.
///
/// # Safety
/// Every method is `unsafe`: it may only run on a CPU that has the instruction set (guaranteed by
/// [`dispatch`], the only way kernels are entered), and pointer arguments must address the lanes read
/// or written.
pub(crate) trait Simd: Copy + 'static {
    /// The vector.
    type V: Copy;
    /// A lane mask (result of a comparison).
    type M: Copy;
    /// f32 lanes per vector.
    const LANES: usize;
    /// Vectors of accumulators a register-blocked kernel may keep per row group: 4 with 32 vector
    /// registers (AVX-512, NEON), 2 with 16 (AVX2). Kernels pick their tile shapes from it.
    const WIDE_TILE: usize;
    /// The instruction set (tests check the dispatch with it).
    #[allow(dead_code)]
    const ISA: Isa;

    unsafe fn zero() -> Self::V;
    unsafe fn splat(x: f32) -> Self::V;
    unsafe fn load(p: *const f32) -> Self::V;
    unsafe fn store(p: *mut f32, v: Self::V);
    /// The first `n` lanes from `p` (no read past them), the others zero; `n ≥ LANES` is a full load.
    unsafe fn load_part(p: *const f32, n: usize) -> Self::V;
    /// Store the first `n` lanes (no write past them); `n ≥ LANES` is a full store.
    unsafe fn store_part(p: *mut f32, n: usize, v: Self::V);
    /// `a · b + c`, one rounding where the instruction set fuses (everywhere but `Scalar`).
    unsafe fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// `c − a · b`, one rounding where the instruction set fuses.
    unsafe fn fnma(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn sub(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn div(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn max(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn min(a: Self::V, b: Self::V) -> Self::V;
    /// Round to the nearest integer, ties to even.
    unsafe fn round(a: Self::V) -> Self::V;
    /// `p · 2ⁿ` for integral `n` in `[−126, 128]`, rounded once (as `vscalefps`).
    unsafe fn scale2(p: Self::V, n: Self::V) -> Self::V;
    unsafe fn lt(a: Self::V, b: Self::V) -> Self::M;
    unsafe fn gt(a: Self::V, b: Self::V) -> Self::M;
    /// Lanes where `a` is NaN.
    unsafe fn nan(a: Self::V) -> Self::M;
    /// `m ? a : b` per lane.
    unsafe fn select(m: Self::M, a: Self::V, b: Self::V) -> Self::V;
    /// Sum of the lanes (lane order fixed per instruction set).
    unsafe fn reduce_add(a: Self::V) -> f32;
    /// Largest lane.
    unsafe fn reduce_max(a: Self::V) -> f32;
    /// `LANES` bf16 pairs from `p` (`u32` each: the even input in the low half): the even inputs and the
    /// odd inputs widened to f32 (exact).
    unsafe fn widen_pairs(p: *const u32) -> (Self::V, Self::V);

    /// e^x, about 1 ulp: range reduction by ln 2, degree-7 Taylor polynomial, [`Simd::scale2`]. Below
    /// −87.3 gives 0 (the true value is subnormal), above 88.72 +∞, NaN stays NaN.
    #[inline(always)]
    unsafe fn exp(x: Self::V) -> Self::V {
        const LOG2E: f32 = std::f32::consts::LOG2_E;
        const LN2_HI: f32 = 0.693_359_4;
        const LN2_LO: f32 = -2.121_944_4e-4;
        // SAFETY: register arithmetic only; the caller runs on this instruction set.
        unsafe {
            let under = Self::lt(x, Self::splat(-87.3));
            let over = Self::gt(x, Self::splat(88.722_83));
            let xc = Self::max(Self::min(x, Self::splat(88.722_83)), Self::splat(-87.3));
            let n = Self::round(Self::mul(xc, Self::splat(LOG2E)));
            let r = Self::fnma(n, Self::splat(LN2_HI), xc);
            let r = Self::fnma(n, Self::splat(LN2_LO), r);
            let mut p = Self::splat(1.0 / 5040.0);
            p = Self::fma(p, r, Self::splat(1.0 / 720.0));
            p = Self::fma(p, r, Self::splat(1.0 / 120.0));
            p = Self::fma(p, r, Self::splat(1.0 / 24.0));
            p = Self::fma(p, r, Self::splat(1.0 / 6.0));
            p = Self::fma(p, r, Self::splat(0.5));
            p = Self::fma(p, r, Self::splat(1.0));
            p = Self::fma(p, r, Self::splat(1.0));
            let y = Self::scale2(p, n);
            let y = Self::select(Self::nan(x), x, y);
            let y = Self::select(over, Self::splat(f32::INFINITY), y);
            Self::select(under, Self::zero(), y)
        }
    }
}

/// A kernel body generic over the instruction set: [`dispatch`] picks the instantiation.
pub(crate) trait Kernel {
    type Out;
    /// The body. Implementations are `#[inline(always)]`, so they are compiled inside the
    /// instruction-set entry point that calls them.
    fn run<S: Simd>(self) -> Self::Out;
}

/// Plain Rust, one lane. `fma` is a separate multiply and add (two roundings): a fused one would be a
/// libm call on CPUs without FMA, which is where this path runs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Scalar;

impl Simd for Scalar {
    type V = f32;
    type M = bool;
    const LANES: usize = 1;
    const WIDE_TILE: usize = 4;
    const ISA: Isa = Isa::Portable;

    #[inline(always)]
    unsafe fn zero() -> f32 {
        0.0
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> f32 {
        x
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> f32 {
        // SAFETY: the caller passes a readable lane.
        unsafe { *p }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: f32) {
        // SAFETY: the caller passes a writable lane.
        unsafe { *p = v }
    }
    #[inline(always)]
    unsafe fn load_part(p: *const f32, n: usize) -> f32 {
        // SAFETY: lane 0 is readable when n ≥ 1.
        if n >= 1 { unsafe { *p } } else { 0.0 }
    }
    #[inline(always)]
    unsafe fn store_part(p: *mut f32, n: usize, v: f32) {
        if n >= 1 {
            // SAFETY: lane 0 is writable when n ≥ 1.
            unsafe { *p = v }
        }
    }
    #[inline(always)]
    unsafe fn fma(a: f32, b: f32, c: f32) -> f32 {
        a * b + c
    }
    #[inline(always)]
    unsafe fn fnma(a: f32, b: f32, c: f32) -> f32 {
        c - a * b
    }
    #[inline(always)]
    unsafe fn add(a: f32, b: f32) -> f32 {
        a + b
    }
    #[inline(always)]
    unsafe fn sub(a: f32, b: f32) -> f32 {
        a - b
    }
    #[inline(always)]
    unsafe fn mul(a: f32, b: f32) -> f32 {
        a * b
    }
    #[inline(always)]
    unsafe fn div(a: f32, b: f32) -> f32 {
        a / b
    }
    #[inline(always)]
    unsafe fn max(a: f32, b: f32) -> f32 {
        a.max(b)
    }
    #[inline(always)]
    unsafe fn min(a: f32, b: f32) -> f32 {
        a.min(b)
    }
    #[inline(always)]
    unsafe fn round(a: f32) -> f32 {
        a.round_ties_even()
    }
    #[inline(always)]
    unsafe fn scale2(p: f32, n: f32) -> f32 {
        let e1 = n.min(127.0);
        p * f32::from_bits(((e1 as i32 + 127) as u32) << 23)
            * f32::from_bits((((n - e1) as i32 + 127) as u32) << 23)
    }
    #[inline(always)]
    unsafe fn lt(a: f32, b: f32) -> bool {
        a < b
    }
    #[inline(always)]
    unsafe fn gt(a: f32, b: f32) -> bool {
        a > b
    }
    #[inline(always)]
    unsafe fn nan(a: f32) -> bool {
        a.is_nan()
    }
    #[inline(always)]
    unsafe fn select(m: bool, a: f32, b: f32) -> f32 {
        if m { a } else { b }
    }
    #[inline(always)]
    unsafe fn reduce_add(a: f32) -> f32 {
        a
    }
    #[inline(always)]
    unsafe fn reduce_max(a: f32) -> f32 {
        a
    }
    #[inline(always)]
    unsafe fn widen_pairs(p: *const u32) -> (f32, f32) {
        // SAFETY: the caller passes one readable pair.
        let x = unsafe { *p };
        (f32::from_bits(x << 16), f32::from_bits(x & 0xffff_0000))
    }
    /// The standard library's e^x (correctly rounded in practice), as the portable path always used.
    #[inline(always)]
    unsafe fn exp(x: f32) -> f32 {
        x.exp()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Kernels;
    use crate::dispatch::dispatch;

    /// Every instruction set this CPU has, through the same generic body: the common operations agree
    /// with plain f32 arithmetic lane by lane (partial loads and stores included).
    #[test]
    fn every_isa_implements_the_core_the_same() {
        struct Probe(usize);
        impl Kernel for Probe {
            type Out = (Isa, Vec<f32>);
            #[inline(always)]
            fn run<S: Simd>(self) -> Self::Out {
                let n = self.0;
                let a: Vec<f32> = (0..n).map(|i| i as f32 * 0.37 - 3.0).collect();
                let b: Vec<f32> = (0..n).map(|i| 1.5 - i as f32 * 0.11).collect();
                let mut out = vec![f32::NAN; n + 1];
                let mut i = 0;
                // SAFETY: loads and stores stay within `a`, `b` and `out[..n]` (partial tails).
                unsafe {
                    while i < n {
                        let va = S::load_part(a.as_ptr().add(i), n - i);
                        let vb = S::load_part(b.as_ptr().add(i), n - i);
                        let v = S::fma(va, vb, S::splat(0.25));
                        let v = S::add(S::max(v, S::min(va, vb)), S::div(va, S::splat(4.0)));
                        let v = S::select(S::lt(va, S::zero()), S::round(v), v);
                        S::store_part(out.as_mut_ptr().add(i), n - i, v);
                        i += S::LANES;
                    }
                }
                (S::ISA, out)
            }
        }
        for kern in Kernels::available() {
            for n in [1, 5, 8, 15, 16, 17, 33] {
                let (isa, out) = dispatch(kern, Probe(n));
                let same = isa == kern.isa()
                    || (isa == Isa::Avx512 && matches!(kern.isa(), Isa::Avx512Bf16 | Isa::Amx))
                    || (isa == Isa::Avx2 && kern.isa() == Isa::AvxVnni)
                    || (isa == Isa::Neon && kern.isa() == Isa::NeonI8mm);
                assert!(same, "{:?} ran as {isa:?}", kern.isa());
                assert!(out[n].is_nan(), "{isa:?}: wrote past the end");
                for (i, got) in out.iter().enumerate().take(n) {
                    let (a, b) = (i as f32 * 0.37 - 3.0, 1.5 - i as f32 * 0.11);
                    let f = a.mul_add(b, 0.25);
                    let u = a * b + 0.25;
                    let want = |v: f32| {
                        let v = v.max(a.min(b)) + a / 4.0;
                        if a < 0.0 { v.round_ties_even() } else { v }
                    };
                    assert!(
                        *got == want(f) || *got == want(u),
                        "{isa:?} n={n} lane {i}: {got} vs {}",
                        want(f)
                    );
                }
            }
        }
    }
}
