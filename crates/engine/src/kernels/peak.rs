//! Machine peak, measured: f32 FMA and BF16 dot-product throughput on all cores, with 12 independent
//! accumulator chains per thread (the micro-benchmark of peers-notes Appendix A, in Rust). The bench
//! reports achieved GFLOP/s as a share of these figures, measured in the same run.

use std::time::Instant;

use super::Kernels;

/// Measured peaks in GFLOP/s (2 FLOPs per multiply-add).
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Peak {
    /// Threads used.
    pub threads: usize,
    /// f32 FMA, all threads.
    pub fp32_gflops: f64,
    /// BF16 dot products (`vdpbf16ps`), all threads; `None` without AVX512_BF16.
    pub bf16_gflops: Option<f64>,
}

/// CPU seconds used by this process so far, all threads (`/proc/self/stat`, 100 Hz ticks); 0 where the
/// platform has no procfs. Benchmarks divide work by it as well as by wall time: a rate per CPU-second is
/// distorted less by other load on the machine.
pub fn process_cpu_seconds() -> f64 {
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

/// Run each loop for about `seconds` on every rayon thread and report the aggregate rate.
pub fn measure(kern: Kernels, seconds: f64) -> Option<Peak> {
    #[cfg(target_arch = "x86_64")]
    if kern.avx512() {
        let threads = rayon::current_num_threads();
        let fp32 = rate(threads, seconds, 12.0 * 16.0 * 2.0, |it| {
            // SAFETY: AVX-512F checked.
            unsafe { super::x86::peak_fma(it) }
        });
        let bf16 = kern.avx512bf16().then(|| {
            rate(threads, seconds, 12.0 * 32.0 * 2.0, |it| {
                // SAFETY: AVX512_BF16 checked.
                unsafe { super::x86::peak_bf16(it) }
            })
        });
        return Some(Peak {
            threads,
            fp32_gflops: fp32,
            bf16_gflops: bf16,
        });
    }
    let _ = (kern, seconds);
    None
}

#[cfg(target_arch = "x86_64")]
fn rate(threads: usize, seconds: f64, flops_per_iter: f64, f: impl Fn(u64) -> f32 + Sync) -> f64 {
    // Calibrate on one thread, then run all threads at once.
    let mut iters = 1u64 << 16;
    loop {
        let t = Instant::now();
        std::hint::black_box(f(iters));
        let dt = t.elapsed().as_secs_f64();
        if dt > 0.05 {
            iters = ((iters as f64) * seconds / dt).max(1.0) as u64;
            break;
        }
        iters *= 4;
    }
    let t = Instant::now();
    let sink: f32 = rayon::broadcast(|_| f(iters)).into_iter().sum();
    let dt = t.elapsed().as_secs_f64();
    std::hint::black_box(sink);
    threads as f64 * iters as f64 * flops_per_iter / dt / 1e9
}
