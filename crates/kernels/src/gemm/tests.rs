use super::*;

fn lcg(seed: &mut u64) -> f32 {
    *seed = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    ((*seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
}

fn all_kernels() -> Vec<Kernels> {
    Kernels::available()
}

/// Σ_k a·w in f64, and Σ_k |a·w| for the error bound.
fn exact(
    m: usize,
    a: &[f32],
    lda: usize,
    w: &[f32],
    n: usize,
    k: usize,
    round_a: bool,
) -> (Vec<f64>, Vec<f64>) {
    let mut c = vec![0f64; m * n];
    let mut mag = vec![0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            for kk in 0..k {
                let mut x = a[i * lda + kk];
                if round_a {
                    x = crate::bf16_to_f32(bf16_bits(x));
                }
                let p = x as f64 * w[j * k + kk] as f64;
                c[i * n + j] += p;
                mag[i * n + j] += p.abs();
            }
        }
    }
    (c, mag)
}

#[test]
fn gemm_matches_naive_on_odd_shapes() {
    let shapes = [
        (1, 1, 1),
        (5, 63, 7),
        (7, 65, 129),
        (13, 130, 300),
        (6, 64, 256),
        (20, 200, 515),
        // Several 32-row tile blocks (AMX), a partial last one.
        (70, 100, 90),
    ];
    for kern in all_kernels() {
        for &(m, n, k) in &shapes {
            for bf16_weights in [true, false] {
                let mut seed = (m * 1000 + n * 10 + k) as u64;
                let lda = k + 3;
                let a: Vec<f32> = (0..m * lda).map(|_| lcg(&mut seed) * 4.0).collect();
                let w: Vec<f32> = (0..n * k)
                    .map(|_| {
                        let x = lcg(&mut seed);
                        if bf16_weights {
                            crate::bf16_to_f32(bf16_bits(x))
                        } else {
                            x
                        }
                    })
                    .collect();
                let pm = PackedMatrix::from_f32(n, k, &w);
                assert_eq!(pm.is_bf16(), bf16_weights);
                for arm in [Arm::Fp32, Arm::Bf16] {
                    let ldc = n + 5;
                    let mut c = vec![f32::NAN; m * ldc];
                    gemm(
                        Run::new(kern, arm),
                        Rows {
                            m,
                            data: &a,
                            ld: lda,
                        },
                        &pm,
                        RowsMut {
                            data: &mut c,
                            ld: ldc,
                        },
                    );
                    let (want, mag) = exact(m, &a, lda, &w, n, k, arm == Arm::Bf16);
                    for i in 0..m {
                        for j in 0..n {
                            let got = c[i * ldc + j] as f64;
                            let err = (got - want[i * n + j]).abs();
                            let tol = 2e-6 * (k as f64).sqrt() * mag[i * n + j] + 1e-30;
                            assert!(
                                err <= tol,
                                "{kern:?} {arm:?} {m}×{n}×{k} [{i},{j}]: {got} vs {}",
                                want[i * n + j]
                            );
                        }
                        // Columns past n are never written.
                        assert!(c[i * ldc + n..i * ldc + ldc].iter().all(|x| x.is_nan()));
                    }
                }
            }
        }
    }
}

/// The block chosen for a 32, 48 and 64 KiB L1D fits it with room for the six activation rows of
/// the block and the C tile, and every block gives the same bits.
#[test]
fn the_fp32_block_fits_the_l1d_and_does_not_change_a_bit() {
    let mut blocks = Vec::new();
    for kib in [32usize, 48, 64] {
        let l1d = kib * 1024;
        let kc = kc_for_l1d(l1d);
        let bytes = kc * NR * 4 + MR * kc * 4 + MR * NR * 4;
        assert!(bytes <= l1d, "{kib} KiB: block {kc} needs {bytes} bytes");
        assert!(kc.is_multiple_of(16) && kc >= 32, "{kib} KiB: {kc}");
        blocks.push(kc);
    }
    assert!(blocks.windows(2).all(|b| b[0] < b[1]), "{blocks:?}");
    // Several whole blocks and a partial one at every size, with f32- and bf16-stored weights.
    let (m, n, k) = (13, 130, 397);
    let mut seed = 5;
    let a: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed)).collect();
    for bf16_weights in [true, false] {
        let w: Vec<f32> = (0..n * k)
            .map(|_| {
                let x = lcg(&mut seed);
                if bf16_weights {
                    crate::bf16_to_f32(bf16_bits(x))
                } else {
                    x
                }
            })
            .collect();
        let pm = PackedMatrix::from_f32(n, k, &w);
        for kern in all_kernels() {
            let run = |kc: usize| {
                let mut c = vec![0f32; m * n];
                gemm_f32(
                    Product {
                        kern,
                        w: &pm,
                        pause: SafePoint::NONE,
                    },
                    kc,
                    Rows { m, data: &a, ld: k },
                    RowsMut {
                        data: &mut c,
                        ld: n,
                    },
                );
                c.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
            };
            let want = run(KC_F32_MAX);
            for &kc in &blocks {
                assert!(run(kc) == want, "{kern:?} block {kc} (bf16 {bf16_weights})");
            }
        }
    }
}

#[test]
fn gemm_rows_do_not_depend_on_their_batch() {
    let (m, n, k) = (23, 130, 300);
    let mut seed = 99;
    let a: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed)).collect();
    let w: Vec<f32> = (0..n * k)
        .map(|_| crate::bf16_to_f32(bf16_bits(lcg(&mut seed))))
        .collect();
    let pm = PackedMatrix::from_f32(n, k, &w);
    for kern in all_kernels() {
        for arm in [Arm::Fp32, Arm::Bf16] {
            let mut all = vec![0f32; m * n];
            gemm(
                Run::new(kern, arm),
                Rows { m, data: &a, ld: k },
                &pm,
                RowsMut {
                    data: &mut all,
                    ld: n,
                },
            );
            for start in [0, 1, 5, 17] {
                for len in [1, 2, 6, 7] {
                    if start + len > m {
                        continue;
                    }
                    let mut part = vec![0f32; len * n];
                    gemm(
                        Run::new(kern, arm),
                        Rows {
                            m: len,
                            data: &a[start * k..],
                            ld: k,
                        },
                        &pm,
                        RowsMut {
                            data: &mut part,
                            ld: n,
                        },
                    );
                    assert_eq!(
                        &part[..],
                        &all[start * n..(start + len) * n],
                        "{kern:?} {arm:?} {start}+{len}"
                    );
                }
            }
        }
    }
}
