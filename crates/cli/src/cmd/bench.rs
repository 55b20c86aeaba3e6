//! `kev bench <sub-benchmark>`: performance measurements, printed as a table and as JSON.
//!
//! - `backbone`: one row of N tokens through the backbone (no cache), per compute arm: median wall time,
//!   achieved GFLOP/s (qwen35-arch §11 FLOP count), share of the machine's peak measured by a
//!   micro-benchmark in the same run, peak RSS.
//!
//! Each sub-benchmark is one variant of [`Sub`] with its own flags and a `run_*` function; they share
//! the measurement helpers at the bottom (median, RSS, machine peak).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use kev_engine::kernels::peak;
use kev_engine::{Arm, Backbone, Kernels};
use serde::Serialize;

use crate::model_args::ModelArgs;

/// Flags of `kev bench`.
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    sub: Sub,
}

#[derive(clap::Subcommand)]
enum Sub {
    /// One row of N tokens through the backbone, per compute arm.
    Backbone(BackboneArgs),
}

/// Flags of `kev bench backbone`.
#[derive(clap::Args)]
struct BackboneArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Row lengths in tokens.
    #[arg(long, value_delimiter = ',', default_values_t = [94usize, 380, 1518])]
    lengths: Vec<usize>,
    /// Compute arms to time (default: both; `--precision` picks one).
    #[arg(long, value_delimiter = ',', value_parser = ["fp32", "bf16"])]
    arms: Vec<String>,
    /// Timed runs per (arm, length); the median is reported.
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Untimed runs before the timed ones.
    #[arg(long, default_value_t = 1)]
    warmup: usize,
    /// Seconds per peak micro-benchmark loop.
    #[arg(long, default_value_t = 1.0)]
    peak_seconds: f64,
    /// Also write the JSON report to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Seed of the token ids.
    #[arg(long, default_value_t = 7)]
    seed: u64,
}

#[derive(Serialize)]
struct RowResult {
    arm: &'static str,
    tokens: usize,
    median_s: f64,
    runs_s: Vec<f64>,
    /// CPU seconds (all threads) of each run.
    cpu_s: Vec<f64>,
    /// GFLOP per (CPU second / threads): the rate had the run had its cores to itself.
    gflops_per_cpu: Option<f64>,
    gflop: f64,
    gflops: f64,
    peak_share: Option<f64>,
    peak_rss_gib: Option<f64>,
}

#[derive(Serialize)]
struct BackboneReport {
    model: String,
    adapter: Option<String>,
    /// `exact` (LoRA unmerged) or `merged`.
    weights: &'static str,
    isa: String,
    threads: usize,
    load_s: f64,
    weight_gib: f64,
    rss_after_load_gib: Option<f64>,
    peak: Option<peak::Peak>,
    rows: Vec<RowResult>,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    match args.sub {
        Sub::Backbone(a) => run_backbone(a),
    }
}

fn run_backbone(a: BackboneArgs) -> anyhow::Result<ExitCode> {
    let (dir, mut opts) = a.model.backbone_source()?;
    let arms: Vec<Arm> = if let Some(arm) = a.model.arm() {
        vec![arm]
    } else if a.arms.is_empty() {
        vec![Arm::Fp32, Arm::Bf16]
    } else {
        a.arms
            .iter()
            .map(|s| s.parse().map_err(anyhow::Error::msg))
            .collect::<anyhow::Result<_>>()?
    };
    let kern = Kernels::detect();
    opts.kernels = Some(kern);
    let t = Instant::now();
    let model = Arc::new(
        Backbone::load(&dir, &opts).with_context(|| format!("loading {}", dir.display()))?,
    );
    let load_s = t.elapsed().as_secs_f64();
    let rss_after_load = rss_gib("VmRSS");
    eprintln!(
        "loaded {} in {load_s:.1} s ({:.2} GiB of weights, RSS {:.2} GiB); measuring the machine peak",
        dir.display(),
        model.weight_bytes() as f64 / GIB,
        rss_after_load.unwrap_or(f64::NAN)
    );
    let pk = peak::measure(kern, a.peak_seconds);
    let cfg = model.config().clone();
    let mut rows = Vec::new();
    for &n in &a.lengths {
        let toks = token_ids(n, cfg.vocab_size, a.seed);
        let gflop = cfg.prefill_flops(n) / 1e9;
        for &arm in &arms {
            let once = || -> anyhow::Result<(f64, f64)> {
                let mut st = model.new_state();
                let c0 = cpu_seconds();
                let t = Instant::now();
                let h = model.forward(arm, &mut st, &toks, &[n - 1])?;
                let dt = t.elapsed().as_secs_f64();
                let cpu = cpu_seconds() - c0;
                anyhow::ensure!(h.iter().all(|x| x.is_finite()), "non-finite hidden state");
                Ok((dt, cpu))
            };
            for _ in 0..a.warmup {
                once()?;
            }
            let timed: Vec<(f64, f64)> = (0..a.reps.max(1))
                .map(|_| once())
                .collect::<anyhow::Result<_>>()?;
            let runs: Vec<f64> = timed.iter().map(|t| t.0).collect();
            let cpu: Vec<f64> = timed.iter().map(|t| t.1).collect();
            let med = median(&runs);
            let threads = kev_engine::kernels::threads() as f64;
            // The rate the run would have had with its threads to itself: a guide when other processes
            // share the cores (wall time is the figure of record).
            // CPU time comes in 10 ms ticks: too short a run has no meaningful rate.
            let cpu_med = median(&cpu);
            let cpu_gflops = (cpu_med >= 0.1).then(|| gflop / (cpu_med / threads));
            let gflops = gflop / med;
            let peak_share = pk.and_then(|p| match arm {
                Arm::Fp32 => Some(gflops / p.fp32_gflops),
                Arm::Bf16 => p.bf16_gflops.map(|b| gflops / b),
            });
            eprintln!(
                "{:>5} tokens {}: {med:.3} s, {gflops:.0} GFLOP/s ({} per CPU-s)",
                n,
                arm.name(),
                cpu_gflops.map_or("n/a".into(), |g| format!("{g:.0}"))
            );
            rows.push(RowResult {
                arm: arm.name(),
                tokens: n,
                median_s: med,
                runs_s: runs,
                cpu_s: cpu,
                gflops_per_cpu: cpu_gflops,
                gflop,
                gflops,
                peak_share,
                peak_rss_gib: rss_gib("VmHWM"),
            });
        }
    }
    let report = BackboneReport {
        model: dir.display().to_string(),
        adapter: opts.adapter.map(|p| p.display().to_string()),
        weights: if model.has_lora() { "exact" } else { "merged" },
        isa: format!("{:?}", kern.isa()),
        threads: kev_engine::kernels::threads(),
        load_s,
        weight_gib: model.weight_bytes() as f64 / GIB,
        rss_after_load_gib: rss_after_load,
        peak: pk,
        rows,
    };
    print_table(&report);
    let json = serde_json::to_string_pretty(&report)?;
    println!("{json}");
    if let Some(path) = &a.json {
        std::fs::write(path, json + "\n").with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}

fn print_table(r: &BackboneReport) {
    if let Some(p) = &r.peak {
        println!(
            "machine peak ({} threads): fp32 FMA {:.0} GFLOP/s, bf16 dot {}",
            p.threads,
            p.fp32_gflops,
            p.bf16_gflops
                .map_or("n/a".into(), |b| format!("{b:.0} GFLOP/s"))
        );
    }
    println!(
        "| arm | tokens | median s | GFLOP | GFLOP/s | share of peak | GFLOP/s per CPU-s | peak RSS GiB |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for row in &r.rows {
        println!(
            "| {} | {} | {:.3} | {:.0} | {:.0} | {} | {} | {} |",
            row.arm,
            row.tokens,
            row.median_s,
            row.gflop,
            row.gflops,
            row.peak_share
                .map_or("n/a".into(), |s| format!("{:.0} %", 100.0 * s)),
            row.gflops_per_cpu
                .map_or("n/a".into(), |g| format!("{g:.0}")),
            row.peak_rss_gib.map_or("n/a".into(), |g| format!("{g:.2}")),
        );
    }
}

const GIB: f64 = (1u64 << 30) as f64;

/// Deterministic pseudo-random token ids below `vocab`.
fn token_ids(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 33) % vocab as u64) as u32
        })
        .collect()
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    s[s.len() / 2]
}

/// CPU seconds used by this process so far, all threads (`/proc/self/stat`, 100 Hz ticks); 0 where the
/// platform has no procfs.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
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

/// A `/proc/self/status` memory line (`VmRSS`, `VmHWM`) in GiB, where the platform has one.
fn rss_gib(field: &str) -> Option<f64> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = text.lines().find(|l| l.starts_with(field))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024.0 / GIB)
}
