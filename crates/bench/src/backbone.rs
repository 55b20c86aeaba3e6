//! `kev bench backbone`: one row of N tokens through the backbone (no cache), per compute arm, then the peers
//! on the same weights and the same token ids in the same run — torch fp32, torch bf16 (transformers, one row
//! without cache), llama.cpp on its BF16, F16 and Q8_0 GGUFs and ik_llama.cpp on F16, Q8_0 and Q4_K_M
//! (`llama-bench -p N`, ik with `-rtr 1`) — with the ratios the bars are stated in, and the bars of the
//! instruction set the kernels run (`bars`: issue 4's on AVX-512, issues 13's and 29's on AVX2, issue 29's int8
//! bar on VNNI and AMX). With AVX2 kernels the peers run as on an AVX2-only CPU (`peer_caps`).
//!
//! Order: load ours, measure the machine peak, time our arms, drop the model (RSS back to ~0), then run each
//! peer as its own subprocess. The token rows are prefixes of the shared bench stream (`peers::bench_ids`), so
//! torch times exactly our ids; llama-bench draws its own (prompt processing costs the same for any ids).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use kev_engine::kernels::Isa;
use kev_engine::{Arm, Backbone, Kernels, Qwen35Config, Stage, StageTimes, memory};
use kev_kernels::peak;
use kev_kernels::peak::process_cpu_seconds;
use serde::Serialize;

use super::peers::{self, BackboneRun, Fork, ORDINARY_VOCAB, PeerEnv, Quant, TorchDtype};
use super::{
    Bar, GIB, Machine, Model, PeerChoice, PeerMissing, PeerName, PeerSetup, gib, int8_from_float,
    load_backbone, median, peer_caps, peer_env, print_bars, secs, speedup, times, write_json,
};

mod bars;
use bars::{Measured, bars, isa_bars};

/// What `kev bench backbone` measures (its flags, parsed).
#[derive(Debug, Clone)]
pub struct Options {
    /// The model.
    pub model: Model,
    /// Row lengths in tokens.
    pub lengths: Vec<usize>,
    /// The one compute arm `--precision` asks for, if any (it overrides `arms`).
    pub precision: Option<Arm>,
    /// Compute arms to time (empty: fp32 and bf16).
    pub arms: Vec<Arm>,
    /// Timed runs per (arm, length); the median is reported.
    pub reps: usize,
    /// Untimed runs before the timed ones.
    pub warmup: usize,
    /// Seconds per peak micro-benchmark loop.
    pub peak_seconds: f64,
    /// Peers to run after ours.
    pub peers: Vec<PeerName>,
    /// Leave torch fp32 out of `torch`.
    pub no_torch_fp32: bool,
    /// Leave torch bf16 out of `torch`.
    pub no_torch_bf16: bool,
    /// Timed runs per peer and length (default: `reps`).
    pub peer_reps: Option<usize>,
    /// Write the JSON report to this file (else it is printed after the tables).
    pub json: Option<PathBuf>,
    /// Seed of the token stream shared with the torch peer (`peers::bench_ids`).
    pub seed: u64,
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
    /// Where the timed runs' wall time went, their mean.
    stages: Stages,
    /// GFLOP of the row's projections (`Qwen35Config::projection_flops`, one wanted row).
    projection_gflop: f64,
}

impl RowResult {
    /// The projections' own rate, GFLOP/s (GOP/s for int8), where the stages were timed.
    fn projection_gflops(&self) -> Option<f64> {
        (self.stages.projections_s > 0.0).then(|| self.projection_gflop / self.stages.projections_s)
    }
}

/// Seconds per stage of the forward (`kev_engine::stages`), the mean of the timed runs.
#[derive(Serialize, Clone, Copy, Debug, Default)]
struct Stages {
    projections_s: f64,
    gdn_s: f64,
    attention_s: f64,
    norms_s: f64,
    other_s: f64,
    /// Everything but the projections: the time the compute arms spend alike (all f32).
    outside_projections_s: f64,
}

impl Stages {
    fn of(t: &StageTimes) -> Self {
        Stages {
            projections_s: t.get(Stage::Projections),
            gdn_s: t.get(Stage::Gdn),
            attention_s: t.get(Stage::Attention),
            norms_s: t.get(Stage::Norms),
            other_s: t.get(Stage::Other),
            outside_projections_s: t.outside_projections(),
        }
    }

    fn total_s(&self) -> f64 {
        self.projections_s + self.outside_projections_s
    }

    /// The stages in the engine's report order: (name, seconds).
    fn each(&self) -> [(&'static str, f64); 5] {
        Stage::ALL.map(|s| {
            let secs = match s {
                Stage::Projections => self.projections_s,
                Stage::Gdn => self.gdn_s,
                Stage::Attention => self.attention_s,
                Stage::Norms => self.norms_s,
                Stage::Other => self.other_s,
            };
            (s.name(), secs)
        })
    }
}

/// One peer's timing of one row length, with the rates computed from our FLOP count of the same row.
#[derive(Serialize)]
struct PeerRow {
    tokens: usize,
    median_s: f64,
    min_s: f64,
    max_s: f64,
    samples_s: Vec<f64>,
    gflops: f64,
    /// Share of the peak of its precision (fp32 FMA for torch fp32, BF16 dot for the bf16 peers).
    peak_share: Option<f64>,
}

#[derive(Serialize)]
struct PeerResult {
    /// `torch fp32`, `torch bf16`, `llama.cpp bf16`.
    name: &'static str,
    /// The peer script (`torch backbone`, `llama.cpp`).
    peer: String,
    /// With versions: `torch 2.15.0 float32`, `llama.cpp 0c1e570 bf16`.
    label: String,
    threads: usize,
    peak_rss_gib: Option<f64>,
    rows: Vec<PeerRow>,
    /// The peer script's whole answer (versions, build, conversion).
    raw: serde_json::Value,
}

/// Our arm against one peer at one length.
#[derive(Serialize)]
struct Comparison {
    tokens: usize,
    arm: &'static str,
    peer: &'static str,
    ours_s: f64,
    peer_s: f64,
    /// `peer_s / ours_s`: how many times faster we are.
    speedup: Option<f64>,
}

#[derive(Serialize)]
struct BackboneReport {
    kind: &'static str,
    machine: Machine,
    model: String,
    adapter: Option<String>,
    /// `exact` (LoRA unmerged) or `merged`.
    weights: &'static str,
    /// The peers run on the checkpoint directory's weights as they are (a base without the adapter).
    peer_model: String,
    token_seed: u64,
    load_s: f64,
    weight_gib: f64,
    rss_after_load_gib: Option<f64>,
    /// Our RSS after dropping the model, before the peers started.
    rss_before_peers_gib: Option<f64>,
    peak: Option<peak::Peak>,
    rows: Vec<RowResult>,
    peer_setup: Option<PeerSetup>,
    peers: Vec<PeerResult>,
    peers_missing: Vec<PeerMissing>,
    comparisons: Vec<Comparison>,
    bars: Vec<Bar>,
}

/// Our arms against the peers: every pair both sides timed is compared and printed.
const PAIRS: [(&str, &str); 12] = [
    ("fp32", "torch fp32"),
    ("bf16", "torch bf16"),
    ("bf16", "llama.cpp bf16"),
    // Issue 13, on CPUs without BF16 dot products: fp32 against llama.cpp's fastest same-precision-class run
    // (BF16 or F16, whichever was faster: both are held).
    ("fp32", "llama.cpp bf16"),
    ("fp32", "llama.cpp f16"),
    ("fp32", "llama.cpp q8_0"),
    // Issue 29: int8 against every llama.cpp-family run (the bars take each family's fastest).
    ("int8", "llama.cpp bf16"),
    ("int8", "llama.cpp f16"),
    ("int8", "llama.cpp q8_0"),
    ("int8", "ik_llama.cpp f16"),
    ("int8", "ik_llama.cpp q8_0"),
    ("int8", "ik_llama.cpp q4_k_m"),
];

/// The llama.cpp-family runs `--peers` chose, in the order they run: (fork, GGUF, the bench's name for it).
fn llama_runs(choice: PeerChoice) -> Vec<(Fork, Quant, &'static str)> {
    [
        (choice.llama, Fork::Mainline, Quant::Bf16, "llama.cpp bf16"),
        (
            choice.llama_f16,
            Fork::Mainline,
            Quant::F16,
            "llama.cpp f16",
        ),
        (
            choice.llama_q8,
            Fork::Mainline,
            Quant::Q8_0,
            "llama.cpp q8_0",
        ),
        (choice.ik_f16, Fork::Ik, Quant::F16, "ik_llama.cpp f16"),
        (choice.ik_llama, Fork::Ik, Quant::Q8_0, "ik_llama.cpp q8_0"),
        (
            choice.ik_llama,
            Fork::Ik,
            Quant::Q4KM,
            "ik_llama.cpp q4_k_m",
        ),
    ]
    .into_iter()
    .filter(|r| r.0)
    .map(|(_, fork, quant, name)| (fork, quant, name))
    .collect()
}

/// What timing our rows and running the peers share: the options, the weights' directory, the model's shape,
/// the machine peak and the token rows.
struct Bench<'a> {
    a: &'a Options,
    dir: &'a Path,
    cfg: &'a Qwen35Config,
    pk: Option<&'a peak::Peak>,
    rows_ids: &'a [Vec<u32>],
}

/// Run the benchmark: print its tables and write its JSON.
pub fn run(a: Options) -> anyhow::Result<()> {
    let (dir, mut opts) = a.model.backbone_source()?;
    let arms = super::arms(a.precision, &a.arms);
    anyhow::ensure!(
        !a.lengths.is_empty() && !a.lengths.contains(&0),
        "--lengths must be positive"
    );
    let choice = PeerChoice::of(&a.peers);
    let kern = Kernels::detect();
    opts.kernels = Some(kern);
    let mut machine = Machine::now(kern.isa().name().to_string());

    // Ours first; the model is dropped once our rows are timed.
    let int8_only = arms == [Arm::Int8];
    let t = Instant::now();
    let model = load_backbone(&dir, &opts, int8_only)?;
    let load_s = t.elapsed().as_secs_f64();
    let rss_after_load = gib(memory::resident_bytes());
    eprintln!(
        "loaded {} in {load_s:.1} s ({:.2} GiB of weights, RSS {:.2} GiB); measuring the machine peak",
        dir.display(),
        model.weight_bytes() as f64 / GIB,
        rss_after_load.unwrap_or(f64::NAN)
    );
    let pk = peak::measure(kern, a.peak_seconds);
    let cfg: Qwen35Config = model.config().clone();
    let vocab = ORDINARY_VOCAB.min(u32::try_from(cfg.vocab_size).unwrap_or(u32::MAX));
    let rows_ids: Vec<Vec<u32>> = a
        .lengths
        .iter()
        .map(|&n| peers::bench_ids(n, a.seed, vocab))
        .collect();
    let bench = Bench {
        a: &a,
        dir: &dir,
        cfg: &cfg,
        pk: pk.as_ref(),
        rows_ids: &rows_ids,
    };
    let (model, mut rows) = time_ours(model, &bench, &arms, int8_only)?;
    // Reported by length, then in the order `--arms` gave.
    rows.sort_by_key(|r: &RowResult| (r.tokens, arms.iter().position(|x| x.name() == r.arm)));
    let weights = if model.has_lora() { "exact" } else { "merged" };
    let weight_gib = model.weight_bytes() as f64 / GIB;
    drop(model);
    let rss_before_peers = gib(memory::resident_bytes());

    let env = if choice.any() {
        peers_env(kern.isa())
    } else {
        None
    };
    let (peers_done, missing) = match &env {
        Some(env) => run_peers(&bench, env, choice, rss_before_peers),
        None => (Vec::new(), Vec::new()),
    };
    machine.finish();

    let comparisons = compare(&rows, &peers_done);
    let bars = bars(&Measured {
        isa: kern.isa(),
        int8_only,
        cpu_flags: &machine.cpu_flags,
        peak: pk.as_ref(),
        rows: &rows,
        comparisons: &comparisons,
        peers: &peers_done,
    });
    let report = BackboneReport {
        kind: "backbone",
        machine,
        model: dir.display().to_string(),
        adapter: opts.adapter.map(|p| p.display().to_string()),
        weights,
        peer_model: dir.display().to_string(),
        token_seed: a.seed,
        load_s,
        weight_gib,
        rss_after_load_gib: rss_after_load,
        rss_before_peers_gib: rss_before_peers,
        peak: pk,
        rows,
        peer_setup: env.as_ref().map(PeerSetup::of),
        peers: peers_done,
        peers_missing: missing,
        comparisons,
        bars,
    };
    print_table(&report, &a.lengths, kern.isa());
    write_json(&report, a.json.as_deref())?;
    Ok(())
}

/// Time our arms at every length: the float arms first, then the int8 arm on the int8 model made from the
/// float one, so that each row's peak RSS is that of its own arm's weights. Gives back the model last timed.
fn time_ours(
    mut model: Arc<Backbone>,
    bench: &Bench,
    arms: &[Arm],
    int8_only: bool,
) -> anyhow::Result<(Arc<Backbone>, Vec<RowResult>)> {
    let (first, beside): (Vec<Arm>, Vec<Arm>) =
        arms.iter().partition(|&&arm| arm != Arm::Int8 || int8_only);
    let mut rows = Vec::new();
    for (phase, arms_now) in [first, beside].into_iter().enumerate() {
        if phase == 1 && !arms_now.is_empty() {
            // Nothing shares the model: the float arms ran on a borrowed one.
            model = int8_from_float(model)?;
        }
        for (&n, toks) in bench.a.lengths.iter().zip(bench.rows_ids) {
            for &arm in &arms_now {
                rows.push(time_row(&model, bench, arm, n, toks)?);
            }
        }
    }
    Ok((model, rows))
}

/// Time one arm on one row of `n` tokens: the warm-up runs, then the timed ones.
fn time_row(
    model: &Backbone,
    bench: &Bench,
    arm: Arm,
    n: usize,
    toks: &[u32],
) -> anyhow::Result<RowResult> {
    let (a, cfg) = (bench.a, bench.cfg);
    let gflop = cfg.prefill_flops(n) / 1e9;
    // The stage clock reads the time a few hundred times a forward: nothing beside seconds.
    let once = |stages: &mut StageTimes| -> anyhow::Result<(f64, f64)> {
        let mut st = model.new_state();
        let c0 = process_cpu_seconds();
        let t = Instant::now();
        let h = model.forward_timed(arm, &mut st, toks, &[n - 1], stages)?;
        let dt = t.elapsed().as_secs_f64();
        let cpu = process_cpu_seconds() - c0;
        anyhow::ensure!(h.iter().all(|x| x.is_finite()), "non-finite hidden state");
        Ok((dt, cpu))
    };
    for _ in 0..a.warmup {
        once(&mut StageTimes::default())?;
    }
    let reps = a.reps.max(1);
    let mut stage_sum = StageTimes::default();
    let timed: Vec<(f64, f64)> = (0..reps)
        .map(|_| once(&mut stage_sum))
        .collect::<anyhow::Result<_>>()?;
    let stages = Stages::of(&stage_sum.mean_of(reps));
    let runs: Vec<f64> = timed.iter().map(|t| t.0).collect();
    let cpu: Vec<f64> = timed.iter().map(|t| t.1).collect();
    let med = median(&runs).unwrap_or(f64::NAN);
    let threads = kev_engine::kernels::threads() as f64;
    // The rate the run would have had with its threads to itself: a guide when other processes
    // share the cores (wall time is the figure of record). CPU time comes in 10 ms ticks: too short
    // a run has no meaningful rate.
    let cpu_med = median(&cpu).unwrap_or(0.0);
    let cpu_gflops = (cpu_med >= 0.1).then(|| gflop / (cpu_med / threads));
    let gflops = gflop / med;
    // An int8 share only over an int8 ceiling: a share of the f32 peak would mislead.
    let peak_share = if arm == Arm::Int8 {
        int8_ceiling(bench.pk).map(|g| gflops / g)
    } else {
        share_of_peak(bench.pk, arm == Arm::Bf16, gflops)
    };
    eprintln!(
        "{n:>5} tokens {}: {med:.3} s, {gflops:.0} GFLOP/s ({} per CPU-s); outside the projections {:.0} %",
        arm.name(),
        cpu_gflops.map_or("n/a".into(), |g| format!("{g:.0}")),
        100.0 * stages.outside_projections_s / stages.total_s().max(f64::MIN_POSITIVE)
    );
    Ok(RowResult {
        arm: arm.name(),
        tokens: n,
        median_s: med,
        runs_s: runs,
        cpu_s: cpu,
        gflops_per_cpu: cpu_gflops,
        gflop,
        gflops,
        peak_share,
        peak_rss_gib: gib(memory::peak_resident_bytes()),
        stages,
        projection_gflop: cfg.projection_flops(n, 1) / 1e9,
    })
}

/// The peers' environment; where our kernels run AVX2, the peers run as on an AVX2-only CPU.
fn peers_env(isa: Isa) -> Option<PeerEnv> {
    let caps = peer_caps(isa, |k| std::env::var_os(k).is_some());
    if !caps.is_empty() {
        eprintln!(
            "our kernels run avx2: the peers run as on an AVX2-only CPU ({})",
            caps.iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
    peer_env(kev_engine::kernels::threads(), &caps)
}

/// Run each peer `--peers` chose, each as its own subprocess on the checkpoint directory's weights: the
/// results, and the peers that could not run.
fn run_peers(
    bench: &Bench,
    env: &PeerEnv,
    choice: PeerChoice,
    rss_before_peers: Option<f64>,
) -> (Vec<PeerResult>, Vec<PeerMissing>) {
    let (a, dir, rows_ids) = (bench.a, bench.dir, bench.rows_ids);
    let mut peers_done = Vec::new();
    let mut missing = Vec::new();
    eprintln!(
        "our model dropped (RSS {:.2} GiB); running the peers on {}",
        rss_before_peers.unwrap_or(f64::NAN),
        dir.display()
    );
    let reps = a.peer_reps.unwrap_or(a.reps).max(1);
    let mut add = |name: &'static str, res: Result<BackboneRun, peers::PeerError>| match res {
        Ok(run) => peers_done.push(peer_result(name, run, bench.cfg, bench.pk)),
        Err(e) => missing.push(PeerMissing::note(name, &e)),
    };
    if choice.torch {
        if !a.no_torch_fp32 {
            add(
                "torch fp32",
                peers::torch_backbone(env, dir, rows_ids, TorchDtype::Float32, reps),
            );
        }
        if !a.no_torch_bf16 {
            add(
                "torch bf16",
                peers::torch_backbone(env, dir, rows_ids, TorchDtype::Bfloat16, reps),
            );
        }
    }
    for (fork, quant, name) in llama_runs(choice) {
        add(
            name,
            peers::llama_backbone(env, fork, dir, &a.lengths, reps, quant),
        );
    }
    (peers_done, missing)
}

/// Achieved rate over the peak of what the run computed with: the BF16 dot peak for a bf16 run where the
/// CPU has BF16 dot products, else the f32 FMA peak of the kernels' instruction set (a bf16 arm without
/// them computes in f32).
fn share_of_peak(pk: Option<&peak::Peak>, bf16: bool, gflops: f64) -> Option<f64> {
    let p = pk?;
    match (bf16, p.amx_bf16_gflops, p.bf16_gflops) {
        (true, Some(t), _) => Some(gflops / t),
        (true, None, Some(b)) => Some(gflops / b),
        _ => Some(gflops / p.fp32_gflops),
    }
}

/// The int8 ceiling of the kernels' int8 path, GOP/s (2 per multiply-add), where one is measured.
///
/// The ceiling of the integer chain the int8 kernels run (`kernels::peak`: AVX2's multiply-add chain, VNNI's
/// `vpdpbusd`, AMX's tiles), measured in the same run.
fn int8_ceiling(pk: Option<&peak::Peak>) -> Option<f64> {
    pk?.int8_gops
}

fn peer_result(
    name: &'static str,
    run: BackboneRun,
    cfg: &Qwen35Config,
    pk: Option<&peak::Peak>,
) -> PeerResult {
    let bf16 = name.ends_with("bf16");
    let rows = run
        .timings
        .iter()
        .map(|t| {
            let gflops = cfg.prefill_flops(t.tokens) / 1e9 / t.median_s;
            PeerRow {
                tokens: t.tokens,
                median_s: t.median_s,
                min_s: t.min_s,
                max_s: t.max_s,
                samples_s: t.samples_s.clone(),
                gflops,
                peak_share: share_of_peak(pk, bf16, gflops),
            }
        })
        .collect();
    PeerResult {
        name,
        peer: run.peer.to_string(),
        label: run.label,
        threads: run.threads,
        peak_rss_gib: run.peak_rss_bytes.map(|b| b as f64 / GIB),
        rows,
        raw: run.raw,
    }
}

/// Every (our arm, peer) pair of [`PAIRS`] at every length both timed.
fn compare(rows: &[RowResult], peers: &[PeerResult]) -> Vec<Comparison> {
    let mut out = Vec::new();
    for (arm, peer) in PAIRS {
        let Some(p) = peers.iter().find(|p| p.name == peer) else {
            continue;
        };
        for r in rows.iter().filter(|r| r.arm == arm) {
            if let Some(pr) = p.rows.iter().find(|pr| pr.tokens == r.tokens) {
                out.push(Comparison {
                    tokens: r.tokens,
                    arm,
                    peer,
                    ours_s: r.median_s,
                    peer_s: pr.median_s,
                    speedup: speedup(pr.median_s, r.median_s),
                });
            }
        }
    }
    out
}

fn print_table(r: &BackboneReport, lengths: &[usize], isa: Isa) {
    println!("{}", r.machine.headline());
    if let Some(p) = &r.peak {
        let widths: Vec<String> = p
            .fp32_by_isa
            .iter()
            .map(|(isa, g)| format!("{isa} {g:.0}"))
            .collect();
        println!(
            "machine peak ({} threads): fp32 FMA {:.0} GFLOP/s on the kernels' {} (every width: {}), bf16 dot {}{}",
            p.threads,
            p.fp32_gflops,
            p.isa,
            widths.join(", "),
            p.bf16_gflops
                .map_or("n/a".into(), |b| format!("{b:.0} GFLOP/s")),
            match (p.amx_bf16_gflops, p.amx_int8_gops, int8_ceiling(Some(p))) {
                (Some(b), Some(i), _) =>
                    format!(", AMX tiles bf16 {b:.0} GFLOP/s, int8 {i:.0} GOP/s"),
                (_, _, Some(i)) => format!(", int8 ceiling {i:.0} GOP/s"),
                _ => String::new(),
            }
        );
        let chains: Vec<String> = p
            .int8_by_chain
            .iter()
            .map(|(c, g)| format!("{c} {g:.0}"))
            .collect();
        println!(
            "int8 ceiling of the kernels' int8 path: {} (every int8 chain, GOP/s: {})",
            p.int8_gops
                .map_or("n/a".into(), |g| format!("{g:.0} GOP/s")),
            chains.join(", ")
        );
    }
    println!("model {} ({} weights)", r.model, r.weights);
    if let Some(setup) = r.peer_setup.as_ref().filter(|s| !s.vars.is_empty()) {
        println!(
            "peers capped as on an AVX2-only CPU (our kernels run avx2): {}",
            setup.vars.join(" ")
        );
    }
    println!();
    println!(
        "| engine | tokens | median s | GFLOP | GFLOP/s | share of peak | GFLOP/s per CPU-s | peak RSS GiB |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    let pct = |s: Option<f64>| s.map_or("n/a".into(), |s| format!("{:.0} %", 100.0 * s));
    for &n in lengths {
        for row in r.rows.iter().filter(|x| x.tokens == n) {
            println!(
                "| kev {} | {} | {} | {:.0} | {:.0} | {} | {} | {} |",
                row.arm,
                row.tokens,
                secs(row.median_s),
                row.gflop,
                row.gflops,
                pct(row.peak_share),
                row.gflops_per_cpu
                    .map_or("n/a".into(), |g| format!("{g:.0}")),
                row.peak_rss_gib.map_or("n/a".into(), |g| format!("{g:.2}")),
            );
        }
        for p in &r.peers {
            for pr in p.rows.iter().filter(|x| x.tokens == n) {
                println!(
                    "| {} | {} | {} | | {:.0} | {} | | {} |",
                    p.label,
                    pr.tokens,
                    secs(pr.median_s),
                    pr.gflops,
                    pct(pr.peak_share),
                    p.peak_rss_gib.map_or("n/a".into(), |g| format!("{g:.2}")),
                );
            }
        }
    }
    print_stages(&r.rows, lengths);
    // One column per pair this run timed.
    let pairs: Vec<(&str, &str)> = PAIRS
        .into_iter()
        .filter(|&(arm, peer)| r.comparisons.iter().any(|c| c.arm == arm && c.peer == peer))
        .collect();
    if !pairs.is_empty() {
        println!();
        let heads: Vec<String> = pairs
            .iter()
            .map(|(arm, peer)| format!(" {arm} vs {peer} |"))
            .collect();
        println!("| tokens |{}", heads.concat());
        println!("| ---: |{}", " ---: |".repeat(pairs.len()));
        for &n in lengths {
            let cells: Vec<String> = pairs
                .iter()
                .map(|&(arm, peer)| {
                    let x = r
                        .comparisons
                        .iter()
                        .find(|c| c.tokens == n && c.arm == arm && c.peer == peer)
                        .and_then(|c| c.speedup);
                    format!(" {} |", times(x))
                })
                .collect();
            println!("| {n} |{}", cells.concat());
        }
    }
    for miss in &r.peers_missing {
        println!("{}", miss.reason);
    }
    print_bars(&r.bars);
    if !r.bars.is_empty() {
        println!(
            "(bars of the kernels' instruction set, {}: {})",
            isa.name(),
            isa_bars(isa).source
        );
    }
}

/// Where each arm's forward spent its time: seconds and share per stage, the mean of the timed runs.
fn print_stages(rows: &[RowResult], lengths: &[usize]) {
    println!();
    println!(
        "where the time goes (mean of the timed runs; projections = the GEMMs with their fused quantisation):"
    );
    let heads: Vec<&str> = Stages::default().each().map(|(n, _)| n).to_vec();
    println!(
        "| arm | tokens | {} | outside the projections | projections' rate |",
        heads.join(" | ")
    );
    println!("| --- | ---: |{}", " ---: |".repeat(heads.len() + 2));
    for &n in lengths {
        for row in rows.iter().filter(|x| x.tokens == n) {
            let st = &row.stages;
            let total = st.total_s().max(f64::MIN_POSITIVE);
            let cell = |s: f64| format!(" {} ({:.0} %) |", secs(s), 100.0 * s / total);
            let cells: String = st.each().iter().map(|&(_, s)| cell(s)).collect();
            let unit = if row.arm == "int8" {
                "GOP/s"
            } else {
                "GFLOP/s"
            };
            println!(
                "| {} | {} |{cells}{} {} |",
                row.arm,
                row.tokens,
                cell(st.outside_projections_s),
                row.projection_gflops()
                    .map_or("n/a".into(), |g| format!("{g:.0} {unit}"))
            );
        }
    }
}

#[cfg(test)]
mod tests;
