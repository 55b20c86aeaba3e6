//! GEMM benchmark on the 4B projection shapes: kev's fp32, bf16 and int8 arms (BF16 weights; int8 quantised
//! from them) against the `gemm` crate's f32 GEMM (weights pre-widened to f32, its best case). `cargo bench
//! -p kev-kernels --features peak --bench gemm`; `KEV_BENCH_M=94,380` picks the row counts, `KEV_BENCH_REPS` the repetitions
//! (median reported), `KEV_BENCH_ARMS=fp32,bf16,int8,crate` the columns (all by default),
//! `KEV_BENCH_SHAPES=9b` the 9B's shapes, `KEV_BENCH_COLD_MB=1200` the int8 weights rotated through copies
//! that outgrow the last-level cache (as a forward's are), `KEV_BENCH_INT8=wide` 8-bit weights for the int8
//! column (default: the rule's 7-bit weights, `WeightQuant::narrow`, which AVX2 multiplies with
//! `vpmaddubsw`); each read against its own chain's ceiling.

use std::time::Instant;

use kev_kernels::int8::{WeightQuant, ceiling_chain, gemm_int8};
use kev_kernels::peak::{self, process_cpu_seconds};
use kev_kernels::{
    Arm, Kernels, PackedInt8, PackedMatrix, Rows, RowsMut, Run, bf16_bits, bf16_to_f32, gemm,
};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Median wall seconds of `reps` runs of `f` after one warm-up, and the CPU seconds they took in all.
fn time(reps: usize, mut f: impl FnMut()) -> (f64, f64) {
    f();
    let c0 = process_cpu_seconds();
    let t: Vec<f64> = (0..reps)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64()
        })
        .collect();
    (median(t), process_cpu_seconds() - c0)
}

/// The bench's settings, from its environment.
struct Setup {
    ms: Vec<usize>,
    reps: usize,
    arms: Vec<String>,
    narrow: bool,
    /// Megabytes the int8 column's weight copies must outgrow (0: one copy, warm in cache).
    cold_mb: usize,
    kern: Kernels,
    threads: usize,
}

impl Setup {
    fn from_env() -> Self {
        let list = |var: &str, default: &str| -> Vec<String> {
            std::env::var(var)
                .unwrap_or_else(|_| default.into())
                .split(',')
                .map(|s| s.trim().to_string())
                .collect()
        };
        Setup {
            ms: list("KEV_BENCH_M", "94,380,1518")
                .iter()
                .filter_map(|s| s.parse().ok())
                .collect(),
            reps: std::env::var("KEV_BENCH_REPS")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(5),
            arms: list("KEV_BENCH_ARMS", "fp32,bf16,int8,crate"),
            narrow: std::env::var("KEV_BENCH_INT8").map_or(true, |v| v != "wide"),
            cold_mb: std::env::var("KEV_BENCH_COLD_MB")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0),
            kern: Kernels::detect(),
            threads: rayon::current_num_threads(),
        }
    }

    fn on(&self, name: &str) -> bool {
        self.arms.iter().any(|a| a == name)
    }
}

/// The machine's peaks, measured now (it may be shared), and the ceiling of the chain the int8 column's
/// weights run (AVX2: by their width).
fn ceilings(set: &Setup) -> (Option<peak::Peak>, Option<f64>) {
    let pk = peak::measure(set.kern, 1.0);
    let int8_ceiling = pk
        .as_ref()
        .and_then(|p| match ceiling_chain(set.kern, set.narrow) {
            Some(chain) => p
                .int8_by_chain
                .iter()
                .find(|(c, _)| c == chain)
                .map(|(_, g)| *g),
            None => p.int8_gops,
        });
    if let Some(p) = &pk {
        let chains: Vec<String> = p
            .int8_by_chain
            .iter()
            .map(|(c, g)| format!("{c} {g:.0}"))
            .collect();
        println!(
            "peak: fp32 FMA {:.0} GFLOP/s; int8 ceiling of the kernels' path {}; every int8 chain (GOP/s): {}",
            p.fp32_gflops,
            int8_ceiling.map_or("n/a".into(), |g| format!("{g:.0} GOP/s")),
            chains.join(", ")
        );
    }
    (pk, int8_ceiling)
}

fn main() {
    let set = Setup::from_env();
    println!(
        "kernels {:?}, {} threads, median of {}; GF/s = GFLOP/s (int8: GOP/s, 2 per multiply-add)",
        set.kern.isa(),
        set.threads,
        set.reps
    );
    let (_pk, int8_ceiling) = ceilings(&set);
    println!(
        "{:>5} {:>6} {:>5} | {:>14} {:>14} {:>14} {:>14}",
        "m", "n", "k", "kev fp32", "kev bf16", "kev int8", "gemm-crate f32"
    );
    // (n, k): GDN fused in_proj, GDN out_proj (and attention o_proj), MLP gate+up, MLP down.
    // `KEV_BENCH_SHAPES=9b` takes the 9B's (hidden 4,096, intermediate 12,288, GDN in_proj 8,192 + 4,096 + 2·32).
    let shapes: &[(usize, usize)] = match std::env::var("KEV_BENCH_SHAPES").as_deref() {
        Ok("9b") => &[(12352, 4096), (4096, 4096), (24576, 4096), (4096, 12288)],
        _ => &[(12352, 2560), (2560, 4096), (18432, 2560), (2560, 9216)],
    };
    let mut seed = 1u64;
    let mut rnd = move || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
    };
    for &(n, k) in shapes {
        let w: Vec<f32> = (0..n * k)
            .map(|_| bf16_to_f32(bf16_bits(rnd() * 0.05)))
            .collect();
        let packed = PackedMatrix::from_f32(n, k, &w);
        let quant = WeightQuant {
            narrow: set.narrow,
            ..WeightQuant::default()
        };
        // Cold weights, as in a model's forward (its weights are many times the last-level cache): copies
        // enough to outgrow `KEV_BENCH_COLD_MB`, a different one per call.
        let q8: Vec<PackedInt8> = if set.on("int8") {
            let q = PackedInt8::from_f32_with(n, k, &w, quant);
            vec![q; (set.cold_mb << 20).div_ceil(n * k).max(1)]
        } else {
            Vec::new()
        };
        for &m in &set.ms {
            // Rows padded by one cache line, as the engine lays out its activations.
            let lda = k + 16;
            let a: Vec<f32> = (0..m * lda).map(|_| rnd()).collect();
            let q8 = (!q8.is_empty()).then_some(&q8[..]);
            let cols = columns(&set, (&a, m, lda), (&w, &packed, q8), n);
            print_row(&set, (m, n, k), &cols, int8_ceiling);
        }
    }
}

/// Each column's (median wall seconds, CPU seconds) for one shape: kev's fp32, bf16 and int8 products and
/// the `gemm` crate's f32 product, `None` for a column not asked for.
fn columns(
    set: &Setup,
    (a, m, lda): (&[f32], usize, usize),
    (w, packed, q8): (&[f32], &PackedMatrix, Option<&[PackedInt8]>),
    n: usize,
) -> Vec<Option<(f64, f64)>> {
    let (kern, reps, k) = (set.kern, set.reps, packed.k());
    let mut c = vec![0f32; m * n];
    let rows = || Rows {
        m,
        data: a,
        ld: lda,
    };
    let mut cols = Vec::new();
    for arm in [Arm::Fp32, Arm::Bf16] {
        cols.push(set.on(arm.name()).then(|| {
            time(reps, || {
                let out = RowsMut {
                    data: &mut c,
                    ld: n,
                };
                gemm(Run::new(kern, arm), rows(), packed, out);
            })
        }));
    }
    cols.push(q8.map(|copies| {
        let mut next = 0;
        time(reps, || {
            let out = RowsMut {
                data: &mut c,
                ld: n,
            };
            next = (next + 1) % copies.len();
            gemm_int8(Run::new(kern, Arm::Int8), rows(), &copies[next], out)
        })
    }));
    // The gemm crate wants W as a [k, n] right-hand side: column stride k over the row-major W.
    cols.push(set.on("crate").then(|| {
        time(reps, || unsafe {
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
                ::gemm::Parallelism::Rayon(set.threads),
            )
        })
    }));
    cols
}

/// One shape's line: each column's rate, and per CPU-second; int8 as a share of its ceiling.
fn print_row(
    set: &Setup,
    (m, n, k): (usize, usize, usize),
    cols: &[Option<(f64, f64)>],
    int8_ceiling: Option<f64>,
) {
    let (reps, threads) = (set.reps, set.threads);
    let flops = 2.0 * (m * n * k) as f64;
    let rate = |c: &Option<(f64, f64)>| {
        c.map_or(format!("{:>14}", "-"), |(t, _)| {
            format!("{:>8.1} GF/s", flops / t / 1e9)
        })
    };
    let per_cpu = |c: &Option<(f64, f64)>| {
        c.map_or("-".to_string(), |(_, cpu)| {
            format!("{:.0}", flops * reps as f64 / cpu.max(1e-9) / 1e9)
        })
    };
    // int8 as a share of its ceiling: wall rate over the all-thread ceiling, and the rate per CPU-second
    // over one thread's share of it (less distorted by other load).
    let share = match (cols[2], int8_ceiling) {
        (Some((t, cpu)), Some(g)) => format!(
            " ({:.0} % of the int8 ceiling; per CPU-s {:.0} %)",
            100.0 * flops / t / 1e9 / g,
            100.0 * flops * reps as f64 / cpu.max(1e-9) / 1e9 / (g / threads as f64)
        ),
        _ => String::new(),
    };
    println!(
        "{m:>5} {n:>6} {k:>5} | {} {} {} {} | per CPU-s: fp32 {}, bf16 {}, int8 {}{share}",
        rate(&cols[0]),
        rate(&cols[1]),
        rate(&cols[2]),
        rate(&cols[3]),
        per_cpu(&cols[0]),
        per_cpu(&cols[1]),
        per_cpu(&cols[2]),
    );
}
