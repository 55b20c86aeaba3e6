use super::*;

/// The per-token recurrence of qwen35-arch §4.6 for one head.
fn recurrent(head: HeadInputs<'_>, s: &mut [f32]) -> Vec<f32> {
    let HeadInputs {
        q,
        k,
        v,
        beta,
        g,
        dk,
    } = head;
    let (dv, v) = (v.cols, |i: usize, b: usize| v.data[i * v.ld + b]);
    let t = beta.len();
    let mut o = vec![0f32; t * dv];
    for i in 0..t {
        let al = g[i].exp();
        for x in s.iter_mut() {
            *x *= al;
        }
        let kk = &k[i * dk..(i + 1) * dk];
        let mut u = vec![0f32; dv];
        for b in 0..dv {
            let mut p = 0f32;
            for a in 0..dk {
                p += s[a * dv + b] * kk[a];
            }
            u[b] = beta[i] * (v(i, b) - p);
        }
        for a in 0..dk {
            for b in 0..dv {
                s[a * dv + b] += kk[a] * u[b];
            }
        }
        for b in 0..dv {
            let mut p = 0f32;
            for a in 0..dk {
                p += s[a * dv + b] * q[i * dk + a];
            }
            o[i * dv + b] = p;
        }
    }
    o
}

/// The register-held substitution rows give the bits of the plain loop (terms outside, columns
/// inside), whole 64-column chunks and tails alike.
#[test]
fn add_scaled_rows_is_the_plain_loop_bit_for_bit() {
    let mut seed = 11u64;
    for d in [1usize, 24, 64, 100, 128, 192] {
        for terms in [0usize, 1, 7, 15] {
            let rows = rand_vec(terms * d, &mut seed, 3.0);
            let coefs = rand_vec(terms, &mut seed, 1.0);
            let start = rand_vec(d, &mut seed, 1.0);
            let mut want = start.clone();
            for (s, &c) in coefs.iter().enumerate() {
                for (x, y) in want.iter_mut().zip(&rows[s * d..(s + 1) * d]) {
                    *x += c * y;
                }
            }
            let mut got = start.clone();
            add_scaled_rows(&mut got, &rows, &coefs, d);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "d {d}, {terms} terms");
        }
    }
}

fn rand_vec(n: usize, seed: &mut u64, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((*seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0 * scale
        })
        .collect()
}

fn unit_rows(x: &mut [f32], d: usize) {
    for row in x.chunks_mut(d) {
        let n = row.iter().map(|v| v * v).sum::<f32>().sqrt();
        row.iter_mut().for_each(|v| *v /= n);
    }
}

#[test]
fn chunked_matches_recurrent() {
    // Mild decays, and strong ones (up to e^−10.5 a token, far past e^−87 across a chunk) whose
    // decayed products fall below the subnormal floor unless flushed (`TINY`).
    let cases = [
        (150, 16, 24, 0.3),
        (64, 8, 8, 0.3),
        (7, 32, 16, 0.3),
        (200, 128, 128, 0.3),
        (200, 128, 128, 8.0),
        (130, 16, 24, 8.0),
    ];
    for kern in Kernels::available() {
        for (t, dk, dv, strength) in cases {
            let mut seed = 7;
            let mut q = rand_vec(t * dk, &mut seed, 1.0);
            let mut k = rand_vec(t * dk, &mut seed, 1.0);
            unit_rows(&mut q, dk);
            unit_rows(&mut k, dk);
            let v = rand_vec(t * dv, &mut seed, 2.0);
            let beta: Vec<f32> = rand_vec(t, &mut seed, 4.0)
                .iter()
                .map(|x| math::sigmoid(*x))
                .collect();
            let g: Vec<f32> = rand_vec(t, &mut seed, 1.0)
                .iter()
                .map(|x| -strength * math::softplus(*x))
                .collect();
            let s0 = rand_vec(dk * dv, &mut seed, 0.5);
            let mut s_ref = s0.clone();
            let head = HeadInputs {
                q: &q,
                k: &k,
                v: Mat::new(&v, t, dv),
                beta: &beta,
                g: &g,
                dk,
            };
            let o_ref = recurrent(head, &mut s_ref);
            let mut s = s0.clone();
            let mut o = vec![0f32; t * dv];
            delta_rule_head(kern, head, &mut s, &mut o);
            let max_o = o_ref.iter().fold(0f32, |m, x| m.max(x.abs()));
            let err_o = o
                .iter()
                .zip(&o_ref)
                .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            let max_s = s_ref.iter().fold(0f32, |m, x| m.max(x.abs()));
            let err_s = s
                .iter()
                .zip(&s_ref)
                .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(
                err_o <= 2e-5 * max_o,
                "{t}×{dk}×{dv}: out {err_o} of {max_o}"
            );
            assert!(
                err_s <= 2e-5 * max_s,
                "{t}×{dk}×{dv}: state {err_s} of {max_s}"
            );
        }
    }
}

/// The value heads of one key head run together (the chunk's `Kᵀ` and `Q·Kᵀ` made once) give each head the
/// bits it gets alone, over several chunks and a short last one, with mild and strong decays.
#[test]
fn heads_sharing_a_key_head_match_each_alone_bit_for_bit() {
    for kern in Kernels::available() {
        for (t, dk, dv, strength) in [(150usize, 32usize, 24usize, 0.3f32), (94, 128, 128, 8.0)] {
            let mut seed = 19;
            let mut q = rand_vec(t * dk, &mut seed, 1.0);
            let mut k = rand_vec(t * dk, &mut seed, 1.0);
            unit_rows(&mut q, dk);
            unit_rows(&mut k, dk);
            let n = 3;
            let vs: Vec<Vec<f32>> = (0..n).map(|_| rand_vec(t * dv, &mut seed, 2.0)).collect();
            let betas: Vec<Vec<f32>> = (0..n)
                .map(|_| {
                    let b = rand_vec(t, &mut seed, 4.0);
                    b.iter().map(|x| math::sigmoid(*x)).collect()
                })
                .collect();
            let gs: Vec<Vec<f32>> = (0..n)
                .map(|_| {
                    let g = rand_vec(t, &mut seed, 1.0);
                    g.iter().map(|x| -strength * math::softplus(*x)).collect()
                })
                .collect();
            let heads: Vec<HeadInputs<'_>> = (0..n)
                .map(|h| HeadInputs {
                    q: &q,
                    k: &k,
                    v: Mat::new(&vs[h], t, dv),
                    beta: &betas[h],
                    g: &gs[h],
                    dk,
                })
                .collect();
            let s0 = rand_vec(n * dk * dv, &mut seed, 0.5);
            let mut s_all = s0.clone();
            let mut o_all = vec![0f32; n * t * dv];
            delta_rule_heads(kern, &heads, &mut s_all, &mut o_all);
            for (h, head) in heads.iter().enumerate() {
                let mut s = s0[h * dk * dv..(h + 1) * dk * dv].to_vec();
                let mut o = vec![0f32; t * dv];
                delta_rule_head(kern, *head, &mut s, &mut o);
                let same =
                    |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(
                    same(&o, &o_all[h * t * dv..(h + 1) * t * dv]),
                    "{kern:?} t {t}: head {h}'s output differs run with its key head's others"
                );
                assert!(
                    same(&s, &s_all[h * dk * dv..(h + 1) * dk * dv]),
                    "{kern:?} t {t}: head {h}'s state differs run with its key head's others"
                );
            }
        }
    }
}
