//! GEMM benchmark on the 4B projection shapes: kev's fp32 and bf16 arms (BF16 weights) against the `gemm`
//! crate's f32 GEMM (weights pre-widened to f32, its best case). `cargo bench -p kev-engine --bench gemm`;
//! `KEV_BENCH_M=94,380` picks the row counts, `KEV_BENCH_REPS` the repetitions (median reported).

use std::time::Instant;

use kev_engine::kernels::peak::process_cpu_seconds;
use kev_engine::kernels::{
    Arm, Kernels, PackedMatrix, Rows, RowsMut, Run, bf16_bits, bf16_to_f32, gemm,
};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let ms: Vec<usize> = std::env::var("KEV_BENCH_M")
        .unwrap_or_else(|_| "94,380,1518".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let reps: usize = std::env::var("KEV_BENCH_REPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let kern = Kernels::detect();
    let threads = rayon::current_num_threads();
    println!(
        "kernels {:?}, {threads} threads, median of {reps}",
        kern.isa()
    );
    println!(
        "{:>5} {:>6} {:>5} | {:>14} {:>14} {:>14}",
        "m", "n", "k", "kev fp32", "kev bf16", "gemm-crate f32"
    );
    // (n, k): GDN fused in_proj, GDN out_proj, MLP gate+up, MLP down.
    let shapes = [
        (12352usize, 2560usize),
        (2560, 4096),
        (18432, 2560),
        (2560, 9216),
    ];
    let mut seed = 1u64;
    let mut rnd = move || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
    };
    for &(n, k) in &shapes {
        let w: Vec<f32> = (0..n * k)
            .map(|_| bf16_to_f32(bf16_bits(rnd() * 0.05)))
            .collect();
        let packed = PackedMatrix::from_f32(n, k, &w);
        // The gemm crate wants W as a [k, n] right-hand side: use column stride k over the row-major W.
        for &m in &ms {
            // Rows padded by one cache line, as the engine lays out its activations.
            let lda = k + 16;
            let a: Vec<f32> = (0..m * lda).map(|_| rnd()).collect();
            let mut c = vec![0f32; m * n];
            let flops = 2.0 * (m * n * k) as f64;
            let mut rates = Vec::new();
            let mut cpu_rates = Vec::new();
            for arm in [Arm::Fp32, Arm::Bf16] {
                gemm(
                    Run { kern, arm },
                    Rows {
                        m,
                        data: &a,
                        ld: lda,
                    },
                    &packed,
                    RowsMut {
                        data: &mut c,
                        ld: n,
                    },
                );
                let c0 = process_cpu_seconds();
                let t: Vec<f64> = (0..reps)
                    .map(|_| {
                        let s = Instant::now();
                        gemm(
                            Run { kern, arm },
                            Rows {
                                m,
                                data: &a,
                                ld: lda,
                            },
                            &packed,
                            RowsMut {
                                data: &mut c,
                                ld: n,
                            },
                        );
                        s.elapsed().as_secs_f64()
                    })
                    .collect();
                cpu_rates.push(flops * reps as f64 / (process_cpu_seconds() - c0).max(1e-9) / 1e9);
                rates.push(flops / median(t) / 1e9);
            }
            let run_crate = |c: &mut [f32]| unsafe {
                ::gemm::gemm(
                    m,
                    n,
                    k,
                    c.as_mut_ptr(),
                    1,
                    n as isize,
                    false,
                    a.as_ptr(),
                    1,
                    lda as isize,
                    w.as_ptr(),
                    k as isize,
                    1,
                    0.0f32,
                    1.0f32,
                    false,
                    false,
                    false,
                    ::gemm::Parallelism::Rayon(threads),
                )
            };
            run_crate(&mut c);
            let t: Vec<f64> = (0..reps)
                .map(|_| {
                    let s = Instant::now();
                    run_crate(&mut c);
                    s.elapsed().as_secs_f64()
                })
                .collect();
            rates.push(flops / median(t) / 1e9);
            println!(
                "{m:>5} {n:>6} {k:>5} | {:>8.1} GF/s {:>8.1} GF/s {:>8.1} GF/s | per CPU-s: fp32 {:.0}, bf16 {:.0}",
                rates[0], rates[1], rates[2], cpu_rates[0], cpu_rates[1]
            );
        }
    }
}
