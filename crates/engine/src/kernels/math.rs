//! Element-wise functions on slices, vectorised where the CPU allows. The AVX-512 versions use a
//! polynomial e^x of about 1 ulp (see `x86::exp512`); the portable ones use the standard library.

use super::Kernels;

/// `x ← e^x`.
pub fn exp_inplace(kern: Kernels, x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if kern.avx512() {
        // SAFETY: AVX-512F checked.
        return unsafe { super::x86::exp_inplace(x) };
    }
    let _ = kern;
    for v in x {
        *v = v.exp();
    }
}

/// `x ← silu(x) = x · sigmoid(x)`.
pub fn silu_inplace(kern: Kernels, x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if kern.avx512() {
        // SAFETY: AVX-512F checked.
        return unsafe { super::x86::silu_inplace(x) };
    }
    let _ = kern;
    for v in x {
        *v = silu(*v);
    }
}

/// `x ← sigmoid(x)`.
pub fn sigmoid_inplace(kern: Kernels, x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if kern.avx512() {
        // SAFETY: AVX-512F checked.
        return unsafe { super::x86::sigmoid_inplace(x) };
    }
    let _ = kern;
    for v in x {
        *v = sigmoid(*v);
    }
}

/// `out = silu(g) · u`, element-wise.
pub fn swiglu(kern: Kernels, g: &[f32], u: &[f32], out: &mut [f32]) {
    assert!(
        g.len() == out.len() && u.len() == out.len(),
        "swiglu: lengths differ"
    );
    #[cfg(target_arch = "x86_64")]
    if kern.avx512() {
        // SAFETY: AVX-512F checked; lengths equal.
        return unsafe { super::x86::swiglu(g, u, out) };
    }
    let _ = kern;
    for ((o, gi), ui) in out.iter_mut().zip(g).zip(u) {
        *o = silu(*gi) * ui;
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
        let k = Kernels::detect();
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
