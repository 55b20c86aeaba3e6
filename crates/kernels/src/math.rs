//! Element-wise functions on slices, vectorised on every instruction set through [`Simd`]: e^x is the
//! polynomial of [`Simd::exp`] (about 1 ulp) on the SIMD sets and the standard library's on the portable
//! one. Also the reductions of a softmax row (max, shifted exp-sum).

use super::Kernels;
use super::dispatch::dispatch;
use super::simd::{Kernel, Simd};

#[derive(Clone, Copy)]
enum Op {
    Exp,
    Silu,
    Sigmoid,
}

#[inline(always)]
unsafe fn apply<S: Simd>(op: Op, v: S::V) -> S::V {
    // SAFETY: register arithmetic on the dispatched instruction set.
    unsafe {
        match op {
            Op::Exp => S::exp(v),
            // x / (1 + e^−x)
            Op::Silu => S::div(v, S::add(S::splat(1.0), S::exp(S::sub(S::zero(), v)))),
            Op::Sigmoid => S::div(
                S::splat(1.0),
                S::add(S::splat(1.0), S::exp(S::sub(S::zero(), v))),
            ),
        }
    }
}

struct Map<'a> {
    op: Op,
    x: &'a mut [f32],
}

impl Kernel for Map<'_> {
    type Out = ();
    #[inline(always)]
    fn run<S: Simd>(self) {
        let n = self.x.len();
        let p = self.x.as_mut_ptr();
        let mut i = 0;
        // SAFETY: loads and stores stay inside `x` (partial tail).
        unsafe {
            while i < n {
                let v = S::load_part(p.add(i), n - i);
                S::store_part(p.add(i), n - i, apply::<S>(self.op, v));
                i += S::LANES;
            }
        }
    }
}

/// `x ← e^x`.
pub fn exp_inplace(kern: Kernels, x: &mut [f32]) {
    dispatch(kern, Map { op: Op::Exp, x });
}

/// `x ← silu(x) = x · sigmoid(x)`.
pub fn silu_inplace(kern: Kernels, x: &mut [f32]) {
    dispatch(kern, Map { op: Op::Silu, x });
}

/// `x ← sigmoid(x)`.
pub fn sigmoid_inplace(kern: Kernels, x: &mut [f32]) {
    dispatch(kern, Map { op: Op::Sigmoid, x });
}

struct SwiGlu<'a> {
    g: &'a [f32],
    u: &'a [f32],
    out: &'a mut [f32],
}

impl Kernel for SwiGlu<'_> {
    type Out = ();
    #[inline(always)]
    fn run<S: Simd>(self) {
        let n = self.out.len();
        let mut i = 0;
        // SAFETY: the three slices have length `n` (checked by `swiglu`); partial tail.
        unsafe {
            while i < n {
                let g = S::load_part(self.g.as_ptr().add(i), n - i);
                let u = S::load_part(self.u.as_ptr().add(i), n - i);
                let s = apply::<S>(Op::Silu, g);
                S::store_part(self.out.as_mut_ptr().add(i), n - i, S::mul(s, u));
                i += S::LANES;
            }
        }
    }
}

/// `out = silu(g) · u`, element-wise.
pub fn swiglu(kern: Kernels, g: &[f32], u: &[f32], out: &mut [f32]) {
    assert!(
        g.len() == out.len() && u.len() == out.len(),
        "swiglu: lengths differ"
    );
    dispatch(kern, SwiGlu { g, u, out });
}

struct RowMax<'a> {
    x: &'a [f32],
    scale: f32,
}

impl Kernel for RowMax<'_> {
    type Out = f32;
    #[inline(always)]
    fn run<S: Simd>(self) -> f32 {
        let n = self.x.len();
        let full = n - n % S::LANES;
        let mut i = 0;
        // SAFETY: whole vectors inside `x`; the tail is read as plain values.
        unsafe {
            let mut m = S::splat(f32::NEG_INFINITY);
            let sc = S::splat(self.scale);
            while i < full {
                m = S::max(m, S::mul(S::load(self.x.as_ptr().add(i)), sc));
                i += S::LANES;
            }
            let tail = self.x[full..]
                .iter()
                .fold(f32::NEG_INFINITY, |a, v| a.max(v * self.scale));
            S::reduce_max(m).max(tail)
        }
    }
}

/// `max_i (x_i · scale)`; −∞ for an empty slice. NaN inputs are not propagated (a softmax over them is
/// undefined either way).
pub fn scaled_max(kern: Kernels, x: &[f32], scale: f32) -> f32 {
    dispatch(kern, RowMax { x, scale })
}

struct ExpShift<'a> {
    x: &'a mut [f32],
    scale: f32,
    shift: f32,
}

impl Kernel for ExpShift<'_> {
    type Out = f32;
    #[inline(always)]
    fn run<S: Simd>(self) -> f32 {
        let n = self.x.len();
        let p = self.x.as_mut_ptr();
        let mut i = 0;
        // SAFETY: loads and stores stay inside `x`; the sum adds only the lanes stored.
        unsafe {
            let (sc, sh) = (S::splat(self.scale), S::splat(self.shift));
            let mut acc = S::zero();
            while i < n {
                let left = n - i;
                let v = S::exp(S::sub(S::mul(S::load_part(p.add(i), left), sc), sh));
                S::store_part(p.add(i), left, v);
                if left >= S::LANES {
                    acc = S::add(acc, v);
                } else {
                    // The padding lanes hold e^(0−shift): add only the real ones.
                    acc = S::add(acc, S::load_part(p.add(i), left));
                }
                i += S::LANES;
            }
            S::reduce_add(acc)
        }
    }
}

/// `x ← e^(x·scale − shift)`; returns the sum of the new values (lane-wise partial sums, then a fixed
/// reduction order: deterministic for a given instruction set and length).
pub fn exp_scaled_shifted(kern: Kernels, x: &mut [f32], scale: f32, shift: f32) -> f32 {
    dispatch(kern, ExpShift { x, scale, shift })
}

/// Magnitudes under this (2⁻⁶³) are flushed to 0 where they would feed a product ([`flush_tiny`]): two
/// operands at least this large multiply to at least 2⁻¹²⁶, a normal f32. Why: on Intel cores an FMA that
/// reads or writes a subnormal takes a microcode assist (about a hundred cycles), and setting the
/// hardware's flush modes (MXCSR's FTZ/DAZ) is undefined behaviour in Rust. Beside the O(10⁻³…10) values
/// of a layer, 1.1·10⁻¹⁹ is far below what an f32 sum can resolve.
pub const TINY: f32 = 1.0842022e-19;

/// Σ x² in f64, the sum every RMS and L2 norm takes: element `i` goes to partial sum `i mod 8` and the eight
/// are added in one fixed tree, so the result is the same on every instruction set (plain loops, no
/// reassociation by the compiler). Why not one running sum: that is one dependent f64 add per element,
/// latency-bound at a quarter of the rate the eight independent chains reach (and vectorise to).
#[inline(always)]
pub fn sum_squares(x: &[f32]) -> f64 {
    let mut acc = [0f64; 8];
    let mut blocks = x.chunks_exact(8);
    for b in &mut blocks {
        for (a, v) in acc.iter_mut().zip(b) {
            *a += (*v as f64) * (*v as f64);
        }
    }
    for (a, v) in acc.iter_mut().zip(blocks.remainder()) {
        *a += (*v as f64) * (*v as f64);
    }
    ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))
}

/// `1 / sqrt(mean(x²) + eps)`, the scale of every RMSNorm (the mean in f64 over [`sum_squares`], then f32).
#[inline(always)]
pub fn rms_inv(x: &[f32], eps: f32) -> f32 {
    1.0 / ((sum_squares(x) / x.len() as f64) as f32 + eps).sqrt()
}

/// `dst = (src · rms_inv(src)) · w1p`, the `x·(1+w)` RMSNorm of one row (`w1p` = `1 + w`).
#[inline(always)]
pub fn rms_norm(src: &[f32], w1p: &[f32], eps: f32, dst: &mut [f32]) {
    let inv = rms_inv(src, eps);
    for ((d, x), w) in dst.iter_mut().zip(src).zip(w1p) {
        *d = (x * inv) * w;
    }
}

/// 0 wherever `|x| <` [`TINY`] (a plain loop: it vectorises inside the caller's instruction set).
#[inline(always)]
pub fn flush_tiny(x: &mut [f32]) {
    for v in x {
        if v.abs() < TINY {
            *v = 0.0;
        }
    }
}

/// Scalar silu, `x / (1 + e^−x)`.
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// Scalar sigmoid.
#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// torch's softplus (β = 1, threshold 20): `x` above 20, else `log1p(e^x)`.
#[inline]
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 { x } else { x.exp().ln_1p() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    /// Relative accuracy of a few ulp wherever the result is above 1e-30 (tiny results may flush to 0).
    fn vector_math_matches_libm() {
        for k in Kernels::available() {
            let xs: Vec<f32> = (0..4001).map(|i| (i as f32 - 2000.0) * 0.05).collect();
            let mut e = xs.clone();
            exp_inplace(k, &mut e);
            for (x, y) in xs.iter().zip(&e) {
                let r = (*x as f64).exp();
                let err = if r < 1.2e-38 {
                    (*y as f64 - r).abs()
                } else {
                    ((*y as f64 - r) / r).abs()
                };
                assert!(
                    err < 2.5e-7 || (r > 3.4e38 && y.is_infinite()),
                    "exp({x}) = {y}, want {r}"
                );
            }
            let mut s = xs.clone();
            silu_inplace(k, &mut s);
            let mut g = xs.clone();
            sigmoid_inplace(k, &mut g);
            let mut sw = vec![0f32; xs.len()];
            swiglu(k, &xs, &xs, &mut sw);
            for i in 0..xs.len() {
                let x = xs[i] as f64;
                let sg = 1.0 / (1.0 + (-x).exp());
                assert!(
                    (s[i] as f64 - x * sg).abs() <= (3e-7 * (x * sg).abs()).max(1e-30),
                    "silu({x})"
                );
                assert!(
                    (g[i] as f64 - sg).abs() <= (3e-7 * sg).max(1e-30),
                    "sigmoid({x})"
                );
                assert!(
                    (sw[i] as f64 - x * sg * x).abs() <= (5e-7 * (x * x * sg).abs()).max(1e-30),
                    "swiglu({x}) = {}, want {}",
                    sw[i],
                    x * sg * x
                );
            }
            let mut nan = [f32::NAN, 1.0];
            exp_inplace(k, &mut nan);
            assert!(nan[0].is_nan());
        }
    }

    #[test]
    fn sum_squares_is_the_same_on_every_instruction_set() {
        for n in [0usize, 1, 7, 8, 9, 128, 255, 2560] {
            // Magnitudes over twelve decades, so the order of the additions shows in the low bits.
            let x: Vec<f32> = (0..n)
                .map(|i| ((i * 7919 % 113) as f32 - 56.0) * 10f32.powi((i % 13) as i32 - 6))
                .collect();
            let base = sum_squares(&x);
            for k in Kernels::available() {
                assert_eq!(
                    crate::wide!(k, || sum_squares(&x)).to_bits(),
                    base.to_bits(),
                    "{k:?} {n}"
                );
            }
            // The fixed tree of eight partial sums, written out.
            let mut acc = [0f64; 8];
            for (i, v) in x.iter().enumerate() {
                acc[i % 8] += (*v as f64) * (*v as f64);
            }
            let tree =
                ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
            assert_eq!(base.to_bits(), tree.to_bits(), "{n}");
            let plain: f64 = x.iter().map(|v| (*v as f64) * (*v as f64)).sum();
            assert!(
                (base - plain).abs() <= 1e-14 * plain,
                "{n}: {base} vs {plain}"
            );
        }
    }

    #[test]
    fn softmax_reductions_match_plain_loops() {
        for k in Kernels::available() {
            for n in [1usize, 3, 8, 16, 17, 64, 100] {
                let x: Vec<f32> = (0..n)
                    .map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.7)
                    .collect();
                let m = scaled_max(k, &x, 0.5);
                let want = x.iter().fold(f32::NEG_INFINITY, |a, v| a.max(v * 0.5));
                assert_eq!(m, want, "{k:?} {n}");
                let mut y = x.clone();
                let s = exp_scaled_shifted(k, &mut y, 0.5, m);
                let mut ws = 0f64;
                for (i, v) in x.iter().enumerate() {
                    let e = ((v * 0.5 - m) as f64).exp();
                    ws += e;
                    assert!((y[i] as f64 - e).abs() <= 3e-7 * e, "{k:?} {n} {i}");
                }
                assert!((s as f64 - ws).abs() <= 1e-6 * ws, "{k:?} {n}: {s} vs {ws}");
            }
            assert_eq!(scaled_max(k, &[], 1.0), f32::NEG_INFINITY);
        }
    }
}
