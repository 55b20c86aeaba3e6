use super::drive::{Path, gemm_int8_on};
use crate::{Arm, Rows, RowsMut, Run};

/// [`gemm_int8_on`] with the positional arguments these tests were written with.
// Eight plain numbers and slices: a struct per call would hide what each test varies.
#[allow(clippy::too_many_arguments)]
fn on(
    kern: Kernels,
    path: Path,
    m: usize,
    a: &[f32],
    lda: usize,
    w: &PackedInt8,
    c: &mut [f32],
    ldc: usize,
) {
    gemm_int8_on(
        Run::new(kern, Arm::Int8),
        path,
        Rows {
            m,
            data: a,
            ld: lda,
        },
        w,
        RowsMut { data: c, ld: ldc },
    );
}

/// [`gemm_int8`] with positional arguments.
fn int8_gemm(
    kern: Kernels,
    m: usize,
    a: &[f32],
    lda: usize,
    w: &PackedInt8,
    c: &mut [f32],
    ldc: usize,
) {
    on(kern, Path::of(kern).for_weights(w), m, a, lda, w, c, ldc);
}
use super::*;
use crate::Kernels;

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

/// `[n, k]` row-major quantised with 8-bit or, `narrow`, 7-bit weights.
fn quantised(n: usize, k: usize, w: &[f32], narrow: bool) -> PackedInt8 {
    let quant = WeightQuant {
        narrow,
        ..WeightQuant::default()
    };
    PackedInt8::from_f32_with(n, k, w, quant)
}

/// `rows × k` values of magnitude `v` whose rows go by threes: all positive, all negative, random signs.
fn signed_rows(rows: usize, k: usize, v: f32, seed: &mut u64) -> Vec<f32> {
    (0..rows * k)
        .map(|i| {
            let negative = match (i / k) % 3 {
                0 => false,
                1 => true,
                _ => lcg(seed) < 0.0,
            };
            if negative { -v } else { v }
        })
        .collect()
}

/// `m` rows of `a` (`k` apart) times `w` on every path (the one each takes for `w`'s weights), bit for
/// bit the definition.
fn every_path_is_the_definition(m: usize, a: &[f32], k: usize, w: &PackedInt8) {
    let n = w.n();
    let want = naive(m, a, k, w);
    for (kern, path) in paths() {
        let path = path.for_weights(w);
        let mut c = vec![0f32; m * n];
        on(kern, path, m, a, k, w, &mut c, n);
        assert_eq!(
            c.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            want.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            "{kern:?} {path:?}"
        );
    }
}

/// Every (kernels, path) pair this CPU can run: each instruction set's own path (`neon` is `sdot`,
/// `neoni8mm` `smmla`, so a CPU with both runs both).
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
        if has!("avxvnni") && has!("avx2") && has!("fma") {
            assert!(v.iter().any(|(_, p)| *p == Path::VnniYmm));
        } else if has!("avx512f") && has!("avx512vl") && has!("avx512vnni") && has!("avx2") {
            assert!(v.iter().any(|(_, p)| *p == Path::VnniYmmEvex));
        }
        if crate::amx::available() {
            assert!(v.iter().any(|(_, p)| *p == Path::Amx));
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        use std::arch::is_aarch64_feature_detected as has;
        if has!("dotprod") {
            assert!(v.iter().any(|(_, p)| *p == Path::NeonDot));
        }
        if has!("i8mm") {
            assert!(v.iter().any(|(_, p)| *p == Path::NeonMmla));
        }
        // Which integer paths ran, for the log (qemu-user's CPU decides it under CI).
        eprintln!(
            "int8 paths tested: {:?}",
            v.iter().map(|(_, p)| *p).collect::<Vec<_>>()
        );
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
        // Several 32-row tile blocks, a partial last one, and a partial last input step.
        (45, 100, 1100),
    ];
    // Both weight widths: 7-bit weights take AVX2's `vpmaddubsw` kernel (`Path::for_weights`).
    for (kern, path, narrow) in paths()
        .into_iter()
        .flat_map(|(k, p)| [(k, p, false), (k, p, true)])
    {
        for &(m, n, k) in &shapes {
            let mut seed = (m * 1000 + n * 10 + k) as u64;
            let lda = k + 3;
            let a: Vec<f32> = (0..m * lda).map(|_| lcg(&mut seed) * 4.0).collect();
            let wv: Vec<f32> = (0..n * k).map(|_| lcg(&mut seed)).collect();
            let w = quantised(n, k, &wv, narrow);
            let path = path.for_weights(&w);
            let want = naive(m, &a, lda, &w);
            let ldc = n + 5;
            let mut c = vec![f32::NAN; m * ldc];
            on(kern, path, m, &a, lda, &w, &mut c, ldc);
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

/// Narrow weights at ±63 against activations at ±127 (stored as 255 and 1 where shifted): the largest
/// `vpmaddubsw` pairs the narrow AVX2 kernel meets, ±32,130, are exact; every path agrees. And the
/// kernel choice follows the weights: a stored form with one value past ±63 is not narrow.
#[test]
fn narrow_weights_at_their_extremes_are_exact() {
    let (m, n, k) = (7, 66, 1027);
    let mut seed = 9u64;
    let a = signed_rows(m, k, 2.0, &mut seed);
    let wv = signed_rows(n, k, 0.5, &mut seed);
    let w = quantised(n, k, &wv, true);
    assert!(w.narrow());
    assert!((0..n).all(|j| (0..k).all(|c| w.q(j, c).unsigned_abs() == NARROW as u8)));
    every_path_is_the_definition(m, &a, k, &w);
    // The stored form decides by its values.
    let mut q = w.q_rows();
    let stored = PackedInt8::from_quantised(n, k, &q, w.scales(), None).unwrap();
    assert!(stored.narrow());
    // Packed, scaled and summed as the form it was read from (the sums through every kernel).
    assert_eq!(stored.q_rows(), q);
    assert_eq!(stored.scales(), w.scales());
    every_path_is_the_definition(m, &a, k, &stored);
    q[5] = 64;
    let wide = PackedInt8::from_quantised(n, k, &q, w.scales(), None).unwrap();
    assert!(!wide.narrow());
    every_path_is_the_definition(m, &a, k, &wide);
    // −128 anywhere (here in the last, partial panel) is refused.
    let mut bad = q.clone();
    bad[(n - 1) * k + 3] = i8::MIN;
    assert!(PackedInt8::from_quantised(n, k, &bad, w.scales(), None).is_err());
    assert!(!PackedInt8::from_f32(n, k, &wv).narrow());
    #[cfg(target_arch = "x86_64")]
    for (kern, path) in paths() {
        if path == Path::Avx2 {
            assert_eq!(path.for_weights(&stored), Path::Avx2Narrow, "{kern:?}");
            assert_eq!(path.for_weights(&wide), Path::Avx2, "{kern:?}");
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
    let wv = signed_rows(n, k, 0.5, &mut seed);
    let w = PackedInt8::from_f32(n, k, &wv);
    assert!((0..n).all(|j| (0..k).all(|c| w.q(j, c).unsigned_abs() == 127)));
    every_path_is_the_definition(m, &a, k, &w);
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
        on(kern, path, m, &a, k, &w, &mut all, n);
        for start in [0, 1, 5, 17] {
            for len in [1, 2, 4, 6, 7] {
                if start + len > m {
                    continue;
                }
                let mut part = vec![0f32; len * n];
                on(kern, path, len, &a[start * k..], k, &w, &mut part, n);
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
    int8_gemm(Kernels::detect(), m, &a, k, &w, &mut c, n);
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
        on(kern, path, m, &a, k, &smooth, &mut c, n);
        assert_eq!(
            c.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            want.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            "{kern:?} {path:?}"
        );
    }
    let mut c = vec![0f32; m * n];
    int8_gemm(Kernels::detect(), m, &a, k, &plain, &mut c, n);
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
    let clip = WeightQuant {
        clip: true,
        ..WeightQuant::default()
    };
    let clipped = PackedInt8::from_f32_with(n, k, &wv, clip);
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
        on(kern, path, m, &a, k, &clipped, &mut c, n);
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
    int8_gemm(Kernels::portable(), 1, &[1.0; 5], 5, &zero, &mut out, 3);
    assert_eq!(out, vec![0.0; 3]);
}

/// The vectorised quantisation the x86 paths run gives the bytes of the definition, `quantize_row`, in
/// every stored form: odd lengths (vector body and scalar tail), smoothing, a NaN among finite values,
/// all zeros, an infinity.
#[cfg(target_arch = "x86_64")]
#[test]
fn vectorised_quantisation_is_the_definition() {
    use crate::x86_int8::{QForm, quantize_avx2};
    if !std::arch::is_x86_feature_detected!("avx2") {
        println!("skipped: no AVX2 on this CPU; the vectorised quantisation was not run");
        return;
    }
    let mut seed = 17;
    for n in [1usize, 7, 8, 9, 31, 64, 300, 1027] {
        for case in 0..5 {
            let mut x: Vec<f32> = (0..n).map(|_| lcg(&mut seed) * 9.0).collect();
            match case {
                2 => x[n / 2] = f32::NAN,
                3 => x.fill(0.0),
                4 => x[n - 1] = f32::INFINITY,
                _ => {}
            }
            let u: Vec<f32> = (0..n).map(|_| 0.5 + lcg(&mut seed).abs()).collect();
            let unsmooth = (case == 1).then_some(&u[..]);
            let kg = n.div_ceil(G) + 1;
            for form in [QForm::I16, QForm::I8, QForm::U8Shifted] {
                let shift = form == QForm::U8Shifted;
                let mut want = vec![0u8; kg * G];
                let sw = quantize_row(&x, unsmooth, &mut want[..n], shift);
                want[n..].fill(if shift { 128 } else { 0 });
                // Groups 3 apart, as in a six-row group of i16 or a two-row one of bytes.
                let eb = if form == QForm::I16 { 2 } else { 1 };
                let stride = 3 * G * eb;
                let mut got = vec![0xA5u8; kg * stride];
                // SAFETY: AVX2 checked; `kg · 4 ≥ n`, every group inside `got`.
                let sg = unsafe { quantize_avx2(&x, unsmooth, kg, got.as_mut_ptr(), stride, form) };
                assert_eq!(sw.to_bits(), sg.to_bits(), "n {n} case {case} {form:?}");
                for (k, &wk) in want.iter().enumerate() {
                    let at = (k / G) * stride + (k % G) * eb;
                    let v = if eb == 2 {
                        i16::from_le_bytes([got[at], got[at + 1]]) as i32
                    } else {
                        got[at] as i32
                    };
                    let w = if eb == 2 { wk as i8 as i32 } else { wk as i32 };
                    assert_eq!(v, w, "n {n} case {case} {form:?} input {k}");
                }
            }
        }
    }
}

#[test]
fn only_avx2_has_a_faster_kernel_for_narrow_weights() {
    for (kern, path) in paths() {
        #[cfg(target_arch = "x86_64")]
        let faster = path == Path::Avx2;
        #[cfg(not(target_arch = "x86_64"))]
        let faster = false;
        assert_eq!(super::narrow_is_faster(kern), faster, "{kern:?} {path:?}");
    }
}

/// The weight quantisation gives the same bytes and scales on every instruction set as its definition
/// taken literally (each clip candidate's squared error summed on its own, in input order, the first
/// least one kept), and every candidate's error bit for bit. Rows with outliers, short and constant
/// rows, all-zero and non-finite rows; both widths, with and without the clip search.
#[test]
fn weight_quantisation_is_its_definition_on_every_isa() {
    /// The squared rounding error of `w` with step `s`, summed in input order.
    fn err(w: &[f32], s: f32, qmax: f32) -> f64 {
        w.iter()
            .map(|x| {
                let d = (x / s).round_ties_even().clamp(-qmax, qmax) * s - x;
                d as f64 * d as f64
            })
            .sum::<f64>()
    }
    /// Range `t` of the clip search: `max|w| · (1 − t/100)`.
    fn range(amax: f32, t: usize) -> f32 {
        amax * (1.0 - t as f32 / 100.0)
    }
    fn definition(w: &[f32], q: &mut [i8], quant: WeightQuant) -> f32 {
        let qmax = quant.qmax();
        let amax = w.iter().fold(0f32, |m, x| m.max(x.abs()));
        if amax == 0.0 || !amax.is_finite() {
            q.fill(0);
            return if amax == 0.0 { 0.0 } else { f32::NAN };
        }
        let mut best = amax;
        if quant.clip {
            let mut least = err(w, amax / qmax, qmax);
            for t in 1..=20 {
                let e = err(w, range(amax, t) / qmax, qmax);
                if e < least {
                    (least, best) = (e, range(amax, t));
                }
            }
        }
        let s = best / qmax;
        for (d, x) in q.iter_mut().zip(w) {
            *d = (x / s).round_ties_even().clamp(-qmax, qmax) as i8;
        }
        s
    }
    let mut seed = 23;
    let mut rows: Vec<Vec<f32>> = Vec::new();
    for k in [1usize, 3, 8, 37, 256, 2560] {
        rows.push((0..k).map(|_| lcg(&mut seed)).collect());
        rows.push(
            (0..k)
                .map(|i| lcg(&mut seed) * if i % 17 == 5 { 12.0 } else { 1.0 })
                .collect(),
        );
        rows.push(vec![0.25; k]);
        rows.push(
            (0..k)
                .map(|i| if i % 2 == 0 { 0.5 } else { -0.5 })
                .collect(),
        );
    }
    rows.push(vec![0.0; 40]);
    rows.push(
        (0..40)
            .map(|i| if i == 9 { f32::NAN } else { 1.0 })
            .collect(),
    );
    rows.push(
        (0..40)
            .map(|i| if i == 9 { f32::INFINITY } else { 1.0 })
            .collect(),
    );
    for clip in [false, true] {
        for narrow in [false, true] {
            let quant = WeightQuant { clip, narrow };
            for (i, w) in rows.iter().enumerate() {
                let mut want = vec![0i8; w.len()];
                let sw = definition(w, &mut want, quant);
                for kern in Kernels::available() {
                    let mut got = vec![0x55i8; w.len()];
                    let sg = quantize_weight_row(kern, w, &mut got, quant);
                    let what = format!("{kern:?} {quant:?} row {i} (k {})", w.len());
                    assert_eq!(sg.to_bits(), sw.to_bits(), "{what}");
                    assert_eq!(got, want, "{what}");
                    let amax = w.iter().fold(0f32, |m, x| m.max(x.abs()));
                    if clip && amax > 0.0 && amax.is_finite() {
                        let qmax = quant.qmax();
                        let ranges = clip_ranges(amax);
                        let got = crate::dispatch::dispatch(kern, ClipErrors { w, ranges, qmax });
                        let got: Vec<u64> = got[..CLIPS].iter().map(|e| e.to_bits()).collect();
                        let want: Vec<u64> = (0..=20)
                            .map(|t| err(w, range(amax, t) / qmax, qmax).to_bits())
                            .collect();
                        assert_eq!(got, want, "{what}: the candidates' errors");
                    }
                }
            }
        }
    }
}

/// Each weight is `round(w / s)` clamped to the range, whatever the instruction set, a row length that is
/// not a whole number of groups included; a NaN weight (which the range skips) gives 0.
#[test]
fn weights_quantise_by_the_definition_and_nan_gives_zero() {
    for narrow in [false, true] {
        let k = 37;
        let mut w: Vec<f32> = (0..k).map(|i| (i as f32 - 18.0) * 0.013).collect();
        w[5] = f32::NAN;
        let quant = WeightQuant {
            narrow,
            ..WeightQuant::default()
        };
        let q = PackedInt8::from_f32_with(1, k, &w, quant);
        let qmax = if narrow { NARROW as f32 } else { 127.0 };
        let s = q.scales()[0];
        assert_eq!(s, 18.0 * 0.013 / qmax);
        for (c, x) in w.iter().enumerate() {
            let want = if x.is_nan() {
                0
            } else {
                (x / s).round_ties_even().clamp(-qmax, qmax) as i8
            };
            assert_eq!(q.q(0, c), want, "{c}");
        }
    }
}

/// The stored form's row sums and range (i16 lanes widened every 128 values a lane) are the plain i32 sum
/// and `max |q|` on every instruction set: rows that widen more than once, every tail, all −128 (the
/// lanes' extreme), all 127.
#[test]
fn row_stats_are_the_plain_sums_on_every_isa() {
    let mut seed = 5u64;
    for kern in Kernels::available() {
        for len in [0, 1, 63, 64, 65, 8191, 8192, 8193, 20_011, 65_999] {
            let random: Vec<i8> = (0..len)
                .map(|_| {
                    seed = seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    (seed >> 56) as i8
                })
                .collect();
            for q in [random, vec![i8::MIN; len], vec![i8::MAX; len]] {
                let want = (
                    q.iter().map(|&v| v as i32).sum::<i32>(),
                    q.iter().map(|v| v.unsigned_abs()).max().unwrap_or(0),
                );
                assert_eq!(row_stats(kern, &q), want, "{kern:?}, {len} values");
            }
        }
    }
}
