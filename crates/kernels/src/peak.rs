//! Machine peak, measured: f32 FMA throughput of every vector width the CPU has (ymm on AVX2, zmm on
//! AVX-512, NEON's q registers), BF16 dot-product throughput and, with AMX, the tile products' throughput,
//! on all cores, with 12 independent accumulator chains per thread (the micro-benchmark of peers-notes
//! Appendix A, in Rust). The int8 ceilings are the same kind of loop over the integer chains the int8
//! kernels are built from (`x86_peak.rs`): on AVX2 `vpmaddubsw → vpmaddwd → vpaddd` (the classic chain,
//! exact only on unsigned × signed bytes), the same with `vpsignb` (exact on signed × signed: kev's
//! operands), its pair-sum variant (four products in i16: exact only where a bound holds, which on
//! int8 data quantised by absmax almost no block meets — docs/results/engine.md), and `vpmaddwd → vpaddd`
//! on i16 operands (what kev's AVX2 kernel runs: the fastest exact chain); with VNNI
//! `vpdpbusd` on zmm and ymm. The bench reports achieved GFLOP/s (GOP/s) as a share of the peak of the
//! instruction set it ran, measured in the same run.

use std::time::Instant;

use super::dispatch::dispatch;
use super::simd::{Kernel, Simd};
use super::{Isa, Kernels};

/// Measured peaks in GFLOP/s (2 FLOPs per multiply-add).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Peak {
    /// Threads used.
    pub threads: usize,
    /// The instruction set the kernels run (whose f32 peak is `fp32_gflops`).
    pub isa: String,
    /// f32 FMA on the kernels' instruction set, all threads.
    pub fp32_gflops: f64,
    /// BF16 dot products (`vdpbf16ps`), all threads; `None` without AVX512_BF16 in use.
    pub bf16_gflops: Option<f64>,
    /// AMX BF16 tile products (`tdpbf16ps`), all threads; `None` without AMX in use.
    pub amx_bf16_gflops: Option<f64>,
    /// AMX int8 tile products (`tdpbssd`), all threads, in GOP/s (2 per multiply-add); `None` without
    /// AMX in use.
    pub amx_int8_gops: Option<f64>,
    /// f32 FMA peak of every SIMD instruction set this CPU has (`avx2` = ymm, `avx512` = zmm, `neon`),
    /// whichever the kernels use.
    pub fp32_by_isa: Vec<(String, f64)>,
    /// The int8 ceiling of the kernels' int8 path in GOP/s (2 per multiply-add), all threads: the
    /// register-resident rate of the instruction chain its microkernel runs on the rule's 7-bit weights
    /// (AVX2: `avx2 maddubsw`; AMX: the tile peak); `None` for the portable path.
    pub int8_gops: Option<f64>,
    /// Every int8 chain this CPU has, by name (`avx2 maddubsw`, `avx2 maddubsw signed`, `avx2 pair-sum`,
    /// `avx2 maddwd`, `vnni zmm`, `vnni ymm`, `avx-vnni ymm`; aarch64 `neon sdot`, `neon smmla`), GOP/s
    /// on all threads.
    pub int8_by_chain: Vec<(String, f64)>,
}

/// CPU seconds used by this process so far, all threads: the scheduler's nanosecond run times
/// (`/proc/self/task/*/schedstat`) where Linux keeps them, else `/proc/self/stat`'s 100 Hz ticks; 0
/// where the platform has no procfs. Benchmarks divide work by it as well as by wall time: a rate per
/// CPU-second is distorted less by other load on the machine.
pub fn process_cpu_seconds() -> f64 {
    if let Some(s) = schedstat_seconds() {
        return s;
    }
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the `(comm)`, which may itself hold spaces: utime and stime are the 12th and 13th.
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let tick = |i: usize| {
        fields
            .get(i)
            .and_then(|s| s.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (tick(11) + tick(12)) / 100.0
}

/// Σ over this process's threads of their time on a CPU, from `schedstat` (its first field, in ns).
/// Threads that ended are not counted, so this is for processes whose worker threads live on (rayon's).
fn schedstat_seconds() -> Option<f64> {
    let mut total = 0u64;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let path = task.ok()?.path().join("schedstat");
        total += first_field(&std::fs::read_to_string(path).ok()?)?;
    }
    Some(total as f64 * 1e-9)
}

/// Seconds the calling thread has been on a CPU (`/proc/thread-self/schedstat`), if Linux keeps it.
fn thread_cpu_seconds() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    Some(first_field(&s)? as f64 * 1e-9)
}

fn first_field(s: &str) -> Option<u64> {
    s.split_whitespace().next()?.parse().ok()
}

/// Run each loop for about `seconds` on every rayon thread and report the aggregate rate; `None` for
/// the portable kernels (no vector peak to speak of).
pub fn measure(kern: Kernels, seconds: f64) -> Option<Peak> {
    if !kern.simd() {
        return None;
    }
    let threads = rayon::current_num_threads();
    let mut by_isa = Vec::new();
    for isa in [Isa::Neon, Isa::Avx2, Isa::Avx512] {
        if let Some(k) = Kernels::with_isa(isa) {
            let lanes = dispatch(k, Lanes);
            let r = rate(seconds, 12.0 * lanes as f64 * 2.0, |it| {
                dispatch(k, FmaLoop(it))
            });
            by_isa.push((isa.name().to_string(), r));
        }
    }
    let own = match kern.isa() {
        Isa::Avx512Bf16 | Isa::Amx => Isa::Avx512,
        Isa::AvxVnni => Isa::Avx2,
        Isa::NeonI8mm => Isa::Neon,
        i => i,
    };
    let fp32 = by_isa
        .iter()
        .find(|(n, _)| n == own.name())
        .map(|(_, r)| *r)?;
    #[cfg(target_arch = "x86_64")]
    let bf16 = kern.avx512bf16().then(|| {
        rate(seconds, 12.0 * 32.0 * 2.0, |it| {
            // SAFETY: AVX512_BF16 checked.
            unsafe { super::x86::peak_bf16(it) }
        })
    });
    #[cfg(not(target_arch = "x86_64"))]
    let bf16 = None;
    #[cfg(target_arch = "x86_64")]
    let (amx_bf16, amx_int8) = if kern.amx() {
        use super::amx::{Product, peak};
        // 4 tile products per round, 16 × 16 outputs of 32 (bf16) or 64 (int8) multiply-adds each.
        let per = |depth: f64| 4.0 * 16.0 * 16.0 * depth * 2.0;
        // SAFETY: AMX checked (`Kernels::amx`).
        let b = rate(seconds, per(32.0), |it| unsafe { peak(Product::Bf16, it) });
        // SAFETY: as above.
        let i = rate(seconds, per(64.0), |it| unsafe { peak(Product::Int8, it) });
        (Some(b), Some(i))
    } else {
        (None, None)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let (amx_bf16, amx_int8) = (None, None);
    let (int8_by_chain, int8) = int8_ceilings(kern, seconds);
    let int8 = if kern.amx() { amx_int8 } else { int8 };
    Some(Peak {
        threads,
        isa: kern.isa().name().to_string(),
        fp32_gflops: fp32,
        bf16_gflops: bf16,
        amx_bf16_gflops: amx_bf16,
        amx_int8_gops: amx_int8,
        fp32_by_isa: by_isa,
        int8_gops: int8,
        int8_by_chain,
    })
}

/// The int8 chains of this CPU (name, GOP/s) and the rate of the one the kernels' int8 path runs.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn int8_ceilings(kern: Kernels, seconds: f64) -> (Vec<(String, f64)>, Option<f64>) {
    #[cfg(target_arch = "aarch64")]
    use super::neon_peak::{Chain, run};
    #[cfg(target_arch = "x86_64")]
    use super::x86_peak::{Chain, run};
    // The rule's weights are narrow (7-bit): the chain the int8 arm runs on them.
    let own = super::int8::Path::of(kern).narrowed().chain();
    let mut out = Vec::new();
    let mut mine = None;
    for chain in Chain::available() {
        // SAFETY: `Chain::available` lists only chains whose instructions this CPU has.
        let r = rate(seconds, chain.macs() * 2.0, |it| {
            unsafe { run(chain, it) };
            0.0
        });
        if own == Some(chain) {
            mine = Some(r);
        }
        out.push((chain.name().to_string(), r));
    }
    (out, mine)
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn int8_ceilings(_: Kernels, _: f64) -> (Vec<(String, f64)>, Option<f64>) {
    (Vec::new(), None)
}

struct Lanes;
impl Kernel for Lanes {
    type Out = usize;
    #[inline(always)]
    fn run<S: Simd>(self) -> usize {
        S::LANES
    }
}

/// `iters` rounds of 12 independent FMAs; returns a value that depends on all of them.
struct FmaLoop(u64);
impl Kernel for FmaLoop {
    type Out = f32;
    #[inline(always)]
    fn run<S: Simd>(self) -> f32 {
        // SAFETY: register arithmetic on the dispatched instruction set.
        unsafe {
            let x = S::splat(1.000_000_1);
            let y = S::splat(0.999_999_9);
            let mut a = [S::zero(); 12];
            for (i, v) in a.iter_mut().enumerate() {
                *v = S::splat(i as f32);
            }
            for _ in 0..self.0 {
                for v in a.iter_mut() {
                    *v = S::fma(*v, x, y);
                }
            }
            let mut s = a[0];
            for v in &a[1..] {
                s = S::add(s, *v);
            }
            S::reduce_add(s)
        }
    }
}

/// The aggregate rate of `f` on every thread. Each thread's rate is its work over its own time on a
/// CPU where Linux reports it (else over the wall time), so a peak is not lowered by other processes
/// sharing the cores: it is what the threads do while they run.
fn rate(seconds: f64, flops_per_iter: f64, f: impl Fn(u64) -> f32 + Sync) -> f64 {
    // Calibrate on one thread, then run all threads at once.
    let mut iters = 1u64 << 16;
    loop {
        let t = Instant::now();
        let c = thread_cpu_seconds();
        std::hint::black_box(f(iters));
        let dt = match (c, thread_cpu_seconds()) {
            (Some(a), Some(b)) if b > a => b - a,
            _ => t.elapsed().as_secs_f64(),
        };
        if dt > 0.05 {
            iters = ((iters as f64) * seconds / dt).max(1.0) as u64;
            break;
        }
        iters *= 4;
    }
    let per_thread: Vec<f64> = rayon::broadcast(|_| {
        let t = Instant::now();
        let c = thread_cpu_seconds();
        std::hint::black_box(f(iters));
        let wall = t.elapsed().as_secs_f64();
        let dt = match (c, thread_cpu_seconds()) {
            (Some(a), Some(b)) if b > a => b - a,
            _ => wall,
        };
        iters as f64 * flops_per_iter / dt / 1e9
    });
    per_thread.iter().sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every vector kernel set gets an f32 peak, and where its int8 path is built from a chain, that
    /// chain's ceiling is measured and reported under the name the GEMM bench looks up.
    #[test]
    fn the_peaks_of_every_kernel_set_are_measured() {
        for kern in Kernels::available().into_iter().filter(|k| k.simd()) {
            let p = measure(kern, 0.01).expect("an f32 peak for a SIMD kernel set");
            assert!(p.fp32_gflops > 0.0, "{kern:?}");
            if let Some(name) = super::super::int8::ceiling_chain(kern, true) {
                let (_, r) = p
                    .int8_by_chain
                    .iter()
                    .find(|(n, _)| n == name)
                    .unwrap_or_else(|| panic!("{kern:?}: no {name} among {:?}", p.int8_by_chain));
                assert!(*r > 0.0);
                if !kern.amx() {
                    assert_eq!(p.int8_gops, Some(*r), "{kern:?}");
                }
            }
        }
    }
}
