//! kev-bench: kev's measurements of record, printed as tables and written as JSON, and the random-weight
//! releases they run on. The `kev` binary parses the flags and calls in here; nothing else depends on this
//! crate.
//!
//! - [`backbone`] (`kev bench backbone`): one row of N tokens through the backbone, per compute arm — median
//!   wall time, GFLOP/s, share of the machine peak measured in the same run, peak RSS — and, in the same run on
//!   the same weights and token ids, the peers: torch fp32, torch bf16, llama.cpp (BF16, F16, Q8_0 GGUFs),
//!   ik_llama.cpp (F16, Q8_0, Q4_K_M), with ratios and the bars of the instruction set in force.
//! - [`decide`] (`kev bench decide`): the Core AI port's timing cases end to end (request bytes → answers), from
//!   zero / shared / cached, both arms, and the torch reference (the author's row form) on two of them, with
//!   ratios.
//! - [`peers`]: the torch, llama.cpp and ik_llama.cpp runners (scripts under `tools/bench/`, run as subprocesses).
//! - [`synth`] (`kev synth`): random-weight releases in the published layout (the engine's
//!   `kev_engine::synth` writes the checkpoint and adapter), plus the Kev tokenizer and a random pointer head.
//!
//! Both benches measure our engine first, drop the model (8.5 GB), then run the peers as subprocesses: torch
//! fp32 on the 4B needs ~21 GB of a 24 GB machine. Timing lives here only; the unit tests check the arithmetic.

pub mod backbone;
pub mod decide;
pub mod peers;
mod requests;
pub mod synth;

use std::path::PathBuf;

use kev_decide::{Source, WeightForm};
use kev_engine::kernels::Isa;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use kev_engine::{Arm, Backbone, Int8Plan, Int8Source, LoadOptions};
use serde::Serialize;

use peers::{PeerEnv, PeerError};

/// The model a bench loads: its files and the weight form.
#[derive(Debug, Clone)]
pub struct Model {
    /// A prepared directory, or the release's base and Kev directories.
    pub source: Source,
    /// `merged` (LoRA merged into BF16 weights) or `exact` (kept unmerged in fp32; the release form only).
    pub weights: WeightForm,
}

impl Model {
    /// How to load the backbone: the checkpoint directory and its load options (the `exact` form keeps the
    /// adapter unmerged; `merged` from the release merges it at load, bit-exact with `kev prepare`).
    fn backbone_source(&self) -> anyhow::Result<(PathBuf, LoadOptions)> {
        let opts = |adapter: Option<&PathBuf>, merge: bool| LoadOptions {
            adapter: adapter.cloned(),
            kernels: None,
            merge_adapter: merge,
        };
        match (&self.source, self.weights) {
            (Source::Prepared(model), WeightForm::Merged) => Ok((model.clone(), opts(None, false))),
            (Source::Prepared(_), WeightForm::Exact) => anyhow::bail!(
                "--weights exact needs --base and --kev (a prepared --model holds merged weights only)"
            ),
            (Source::Release { base, kev }, w) => {
                Ok((base.clone(), opts(Some(kev), w == WeightForm::Merged)))
            }
        }
    }
}

/// Load the backbone for the arms to time. The int8 arm alone is loaded as `kev serve --precision int8`
/// loads it (each layer quantised by the rule as it is packed, no float projection made), so its peak RSS is
/// that arm's; with float arms beside it the model loads in float, and [`int8_from_float`] makes the int8
/// weights once those arms have run.
fn load_backbone(dir: &Path, opts: &LoadOptions, int8_only: bool) -> anyhow::Result<Arc<Backbone>> {
    let loaded = if int8_only {
        Backbone::load_quantised(dir, opts, Int8Source::Rule(&Int8Plan::default()))
    } else {
        Backbone::load(dir, opts)
    };
    Ok(Arc::new(
        loaded.with_context(|| format!("loading {}", dir.display()))?,
    ))
}

/// The int8 model made from the float one by the rule, the float panels dropped. Call it once nothing else
/// holds `float` (the float arms' runs are over).
fn int8_from_float(float: Arc<Backbone>) -> anyhow::Result<Arc<Backbone>> {
    let t = Instant::now();
    let float = Arc::try_unwrap(float)
        .map_err(|_| anyhow::anyhow!("the model is shared before its int8 form is built"))?;
    let int8 = float.quantised(&Int8Plan::default(), None)?;
    eprintln!(
        "int8 weights: {:.2} GiB, quantised in {:.1} s from the BF16 ones (dropped)",
        int8.int8_bytes() as f64 / GIB,
        t.elapsed().as_secs_f64()
    );
    Ok(Arc::new(int8))
}

/// The compute arms to time: `--precision` picks one, else `--arms`, else fp32 and bf16.
fn arms(precision: Option<Arm>, listed: &[Arm]) -> Vec<Arm> {
    match (precision, listed) {
        (Some(arm), _) => vec![arm],
        (None, []) => vec![Arm::Fp32, Arm::Bf16],
        (None, l) => l.to_vec(),
    }
}

/// One name `--peers` takes (a list of them, comma-separated, chooses the peers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerName {
    /// No peer.
    None,
    /// torch fp32 and bf16 (the backbone), or the torch reference (decisions).
    Torch,
    /// llama.cpp on its BF16 GGUF.
    Llama,
    /// llama.cpp on its Q8_0 GGUF (8-bit weights).
    LlamaQ8,
    /// llama.cpp on its F16 GGUF: the other half of issue 13's "fastest same-precision-class run" (on CPUs
    /// without BF16 dot products llama.cpp's F16 path, F16C conversions, can beat its BF16 one).
    LlamaF16,
    /// ik_llama.cpp (the CPU-focused fork) on mainline's F16, Q8_0 and Q4_K_M GGUFs with run-time repacking:
    /// issue 29's strongest CPU peer.
    IkLlama,
    /// ik_llama.cpp on the Q8_0 and Q4_K_M GGUFs only (no F16 GGUF: 18 GB less disk for the 9B, whose bars
    /// hold ik_llama.cpp's Q8_0 and Q4_K_M).
    IkLlamaQuant,
    /// torch, llama, llama-f16, llama-q8 and ik-llama.
    All,
}

impl PeerName {
    /// Every name, in the order `--help` lists them.
    pub const ALL: [PeerName; 8] = [
        PeerName::None,
        PeerName::Torch,
        PeerName::Llama,
        PeerName::LlamaQ8,
        PeerName::LlamaF16,
        PeerName::IkLlama,
        PeerName::IkLlamaQuant,
        PeerName::All,
    ];

    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            PeerName::None => "none",
            PeerName::Torch => "torch",
            PeerName::Llama => "llama",
            PeerName::LlamaQ8 => "llama-q8",
            PeerName::LlamaF16 => "llama-f16",
            PeerName::IkLlama => "ik-llama",
            PeerName::IkLlamaQuant => "ik-llama-q",
            PeerName::All => "all",
        }
    }
}

impl std::str::FromStr for PeerName {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        PeerName::ALL
            .into_iter()
            .find(|p| p.name() == s.trim())
            .ok_or_else(|| {
                let names: Vec<&str> = PeerName::ALL.iter().map(|p| p.name()).collect();
                format!("unknown peer `{s}` ({})", names.join(", "))
            })
    }
}

/// Which peers a bench runs (`--peers`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PeerChoice {
    torch: bool,
    llama: bool,
    /// llama.cpp on its Q8_0 conversion (8-bit weights), besides BF16.
    llama_q8: bool,
    /// llama.cpp on its F16 conversion, besides BF16.
    llama_f16: bool,
    /// ik_llama.cpp on the F16 GGUF.
    ik_f16: bool,
    /// ik_llama.cpp on the Q8_0 and Q4_K_M GGUFs.
    ik_llama: bool,
}

impl PeerChoice {
    fn of(names: &[PeerName]) -> Self {
        let mut c = PeerChoice {
            torch: false,
            llama: false,
            llama_q8: false,
            llama_f16: false,
            ik_f16: false,
            ik_llama: false,
        };
        for name in names {
            match name {
                PeerName::None => {}
                PeerName::Torch => c.torch = true,
                PeerName::Llama => c.llama = true,
                PeerName::LlamaQ8 => c.llama_q8 = true,
                PeerName::LlamaF16 => c.llama_f16 = true,
                PeerName::IkLlama => {
                    c.ik_f16 = true;
                    c.ik_llama = true;
                }
                PeerName::IkLlamaQuant => c.ik_llama = true,
                PeerName::All => {
                    c.torch = true;
                    c.llama = true;
                    c.llama_f16 = true;
                    c.llama_q8 = true;
                    c.ik_f16 = true;
                    c.ik_llama = true;
                }
            }
        }
        c
    }

    /// A comma-separated list of [`PeerName`]s.
    #[cfg(test)]
    fn parse(s: &str) -> Result<Self, String> {
        let names: Vec<PeerName> = s.split(',').map(str::parse).collect::<Result<_, _>>()?;
        Ok(Self::of(&names))
    }

    fn any(self) -> bool {
        self.torch || self.llama || self.llama_q8 || self.llama_f16 || self.ik_f16 || self.ik_llama
    }
}

/// What makes the peers run as on an AVX2-only CPU: llama.cpp's and ik_llama.cpp's AVX2 builds (AVX2 + FMA +
/// F16C, `setup.sh`), torch's AVX2 kernels (ATen's dispatch, oneDNN, MKL).
const AVX2_CAPS: [(&str, &str); 4] = [
    ("KEV_BENCH_LLAMA_ISA", "avx2"),
    ("ATEN_CPU_CAPABILITY", "avx2"),
    ("ONEDNN_MAX_CPU_ISA", "AVX2"),
    ("MKL_ENABLE_INSTRUCTIONS", "AVX2"),
];

/// The caps the peers get when our kernels run `isa`: on AVX2 (`KEV_ISA=avx2` on a bigger CPU, or an AVX2-only
/// one) the [`AVX2_CAPS`], so every ratio compares the same instruction set; elsewhere none (the peers build
/// and dispatch natively). A variable the caller already set (`is_set`) is left as it is.
fn peer_caps(isa: Isa, is_set: impl Fn(&str) -> bool) -> Vec<(&'static str, &'static str)> {
    if isa != Isa::Avx2 {
        return Vec::new();
    }
    AVX2_CAPS.into_iter().filter(|(k, _)| !is_set(k)).collect()
}

/// The peer environment, or `None` after printing why the peers cannot run at all. `vars` are set for every
/// peer process (the [`peer_caps`]).
fn peer_env(threads: usize, vars: &[(&str, &str)]) -> Option<PeerEnv> {
    match PeerEnv::from_env() {
        Ok(env) => Some(env.with_threads(threads).with_vars(vars.iter().copied())),
        Err(e) => {
            eprintln!("{e}");
            None
        }
    }
}

/// What a peer that gave no timing left in the report: `peer unavailable: …` or `peer failed: …`.
#[derive(Debug, Clone, Serialize)]
struct PeerMissing {
    /// The bench's name for the measurement (`torch fp32`, `llama.cpp bf16`, `torch reference`).
    what: String,
    /// The peer script concerned.
    peer: String,
    unavailable: bool,
    reason: String,
}

impl PeerMissing {
    /// Print the error (the bench carries on without the peer) and keep it for the JSON.
    fn note(what: &str, e: &PeerError) -> Self {
        eprintln!("{e}");
        PeerMissing {
            what: what.to_string(),
            peer: e.peer().to_string(),
            unavailable: e.is_unavailable(),
            reason: e.to_string(),
        }
    }
}

/// Where the peers ran from, for the reports.
#[derive(Debug, Clone, Serialize)]
struct PeerSetup {
    cache: String,
    threads: usize,
    python: Option<String>,
    /// Variables the bench set for the peers (the AVX2 caps), as `NAME=value`.
    vars: Vec<String>,
}

impl PeerSetup {
    fn of(env: &PeerEnv) -> Self {
        PeerSetup {
            cache: env.cache_dir().display().to_string(),
            threads: env.threads(),
            python: std::env::var("KEV_BENCH_PYTHON").ok(),
            vars: env.vars().iter().map(|(k, v)| format!("{k}={v}")).collect(),
        }
    }
}

/// Median, extremes and every sample of a set of timings, seconds.
#[derive(Debug, Clone, PartialEq, Serialize)]
struct Summary {
    median_s: f64,
    min_s: f64,
    max_s: f64,
    samples_s: Vec<f64>,
}

impl Summary {
    /// `None` for no samples.
    fn of(samples: &[f64]) -> Option<Self> {
        Some(Summary {
            median_s: median(samples)?,
            min_s: samples.iter().copied().fold(f64::INFINITY, f64::min),
            max_s: samples.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            samples_s: samples.to_vec(),
        })
    }
}

/// The median as Python's `statistics.median` computes it (the peers' figure): the middle sample, or the mean
/// of the two middle ones for an even count. `None` for no samples.
fn median(v: &[f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let m = s.len() / 2;
    Some(if s.len() % 2 == 1 {
        s[m]
    } else {
        (s[m - 1] + s[m]) / 2.0
    })
}

/// How many times faster `ours` is than `theirs` (both seconds): `theirs / ours`; `None` unless both are
/// positive and finite.
fn speedup(theirs: f64, ours: f64) -> Option<f64> {
    let ok = |x: f64| x.is_finite() && x > 0.0;
    (ok(theirs) && ok(ours)).then(|| theirs / ours)
}

/// A bar of an issue, checked against a measured value.
#[derive(Debug, Clone, PartialEq, Serialize)]
struct Bar {
    /// What is compared (`fp32 vs torch fp32 at 94 tokens`).
    what: String,
    /// The measured value (a ratio or a share).
    value: f64,
    /// `>=` or `<=`.
    op: &'static str,
    /// The bar.
    threshold: f64,
    met: bool,
}

impl Bar {
    fn at_least(what: impl Into<String>, value: f64, threshold: f64) -> Self {
        Bar {
            what: what.into(),
            value,
            op: ">=",
            threshold,
            met: value >= threshold,
        }
    }

    fn at_most(what: impl Into<String>, value: f64, threshold: f64) -> Self {
        Bar {
            what: what.into(),
            value,
            op: "<=",
            threshold,
            met: value <= threshold,
        }
    }
}

fn print_bars(bars: &[Bar]) {
    if bars.is_empty() {
        return;
    }
    println!();
    println!("| bar | measured | needed | met |");
    println!("| --- | ---: | ---: | --- |");
    for b in bars {
        println!(
            "| {} | {:.3} | {} {:.3} | {} |",
            b.what,
            b.value,
            b.op,
            b.threshold,
            if b.met { "yes" } else { "**no**" }
        );
    }
}

const GIB: f64 = (1u64 << 30) as f64;

/// A memory figure of `kev_engine::memory` (resident, peak resident) in GiB, where the platform counts it.
fn gib(bytes: Option<u64>) -> Option<f64> {
    Some(bytes? as f64 / GIB)
}

/// Reset this process's peak RSS (`VmHWM`) to its current RSS (Linux: `5` into `/proc/self/clear_refs`), so the
/// next reading is the peak of what follows. False where that is not possible (the peak then accumulates).
fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// The machine as the reports record it: CPU model, threads, load averages now.
#[derive(Debug, Clone, Serialize)]
struct Machine {
    cpu: String,
    threads: usize,
    /// The kernels' instruction set (`KEV_ISA` caps it).
    isa: String,
    /// The CPU's vector-relevant flags (`/proc/cpuinfo`): which instruction sets the machine has.
    cpu_flags: Vec<String>,
    /// `/proc/loadavg`'s 1-, 5- and 15-minute load averages when the bench started.
    load_at_start: Option<[f64; 3]>,
    /// The same when it finished.
    load_at_end: Option<[f64; 3]>,
    /// UTC, `YYYY-MM-DD HH:MM`.
    started_utc: String,
}

impl Machine {
    /// The first line of a report: what ran, when, and how busy the machine was.
    fn headline(&self) -> String {
        let load = |l: Option<[f64; 3]>| l.map_or("?".into(), |l| format!("{:.2}", l[0]));
        format!(
            "{} ({} threads, kernels {}; CPU has {}), {} UTC, load average {} → {}",
            self.cpu,
            self.threads,
            self.isa,
            self.cpu_flags.join(" "),
            self.started_utc,
            load(self.load_at_start),
            load(self.load_at_end),
        )
    }

    fn now(isa: String) -> Self {
        let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_flags = info
            .lines()
            .find(|l| l.starts_with("flags") || l.starts_with("Features"))
            .and_then(|l| l.split(':').nth(1))
            .map(|f| {
                f.split_whitespace()
                    .filter(|f| {
                        [
                            "avx", "fma", "f16c", "amx", "asimd", "sve", "bf16", "i8mm", "dotprod",
                        ]
                        .iter()
                        .any(|k| f.contains(k))
                    })
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        let cpu = Some(info)
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split(':').nth(1))
                    .map(|m| m.trim().to_string())
            })
            .unwrap_or_else(|| std::env::consts::ARCH.to_string());
        Machine {
            cpu,
            threads: kev_engine::kernels::threads(),
            isa,
            cpu_flags,
            load_at_start: load_average(),
            load_at_end: None,
            started_utc: utc_now(),
        }
    }

    fn finish(&mut self) {
        self.load_at_end = load_average();
    }
}

fn load_average() -> Option<[f64; 3]> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    let mut it = text.split_whitespace().map(|s| s.parse::<f64>().ok());
    Some([it.next()??, it.next()??, it.next()??])
}

/// The wall clock in UTC as `YYYY-MM-DD HH:MM`.
fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    utc_string(secs)
}

/// Seconds since 1970 → `YYYY-MM-DD HH:MM` (proleptic Gregorian, Howard Hinnant's days-to-civil).
fn utc_string(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let (hh, mm) = ((secs % 86_400) / 3600, (secs % 3600) / 60);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02} {hh:02}:{mm:02}")
}

/// Print the report's JSON to `path`, or to stdout after the tables when no path is given.
fn write_json(report: &impl Serialize, path: Option<&std::path::Path>) -> anyhow::Result<()> {
    use anyhow::Context;
    let json = serde_json::to_string_pretty(report)?;
    match path {
        Some(p) => {
            if let Some(dir) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("creating {}", dir.display()))?;
            }
            std::fs::write(p, json + "\n").with_context(|| format!("writing {}", p.display()))?;
            eprintln!("wrote {}", p.display());
        }
        None => println!("\n{json}"),
    }
    Ok(())
}

/// `1.234` → `"1.234"`, with a precision that suits seconds from milliseconds to minutes.
fn secs(s: f64) -> String {
    if s >= 100.0 {
        format!("{s:.1}")
    } else if s >= 10.0 {
        format!("{s:.2}")
    } else {
        format!("{s:.3}")
    }
}

/// An optional ratio for a table cell.
fn times(x: Option<f64>) -> String {
    x.map_or("–".into(), |x| format!("{x:.2}×"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_is_pythons() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0]), Some(3.0));
        assert_eq!(median(&[5.0, 1.0, 3.0]), Some(3.0));
        // statistics.median([4, 1, 3, 2]) == 2.5
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[2.0, 1.0]), Some(1.5));
    }

    #[test]
    fn summaries_keep_every_sample() {
        let s = Summary::of(&[1.5, 0.5, 1.0]).unwrap();
        assert_eq!(
            s,
            Summary {
                median_s: 1.0,
                min_s: 0.5,
                max_s: 1.5,
                samples_s: vec![1.5, 0.5, 1.0]
            }
        );
        assert!(Summary::of(&[]).is_none());
    }

    #[test]
    fn speedups_and_bars() {
        assert_eq!(speedup(5.0, 2.0), Some(2.5));
        assert_eq!(speedup(5.0, 0.0), None);
        assert_eq!(speedup(f64::NAN, 1.0), None);
        assert_eq!(speedup(-1.0, 1.0), None);
        let b = Bar::at_least("x", 2.0, 2.0);
        assert!(b.met && b.op == ">=");
        assert!(!Bar::at_least("x", 1.99, 2.0).met);
        assert!(Bar::at_most("y", 0.5, 0.5).met);
        assert!(!Bar::at_most("y", 0.51, 0.5).met);
    }

    #[test]
    fn peer_choices() {
        let all = PeerChoice::parse("all").unwrap();
        assert!(
            all.torch && all.llama && all.llama_f16 && all.llama_q8 && all.ik_llama && all.any()
        );
        let none = PeerChoice::parse("none").unwrap();
        assert!(!none.any());
        assert_eq!(
            PeerChoice::parse("torch,llama,llama-f16,llama-q8,ik-llama").unwrap(),
            PeerChoice::parse("all").unwrap()
        );
        assert_ne!(
            PeerChoice::parse("torch,llama").unwrap(),
            PeerChoice::parse("all").unwrap()
        );
        let t = PeerChoice::parse("torch").unwrap();
        assert!(t.torch && !t.llama && !t.ik_llama);
        let ik = PeerChoice::parse("ik-llama").unwrap();
        assert!(ik.ik_llama && ik.ik_f16 && !ik.llama && !ik.torch && ik.any());
        let q = PeerChoice::parse("ik-llama-q").unwrap();
        assert!(q.ik_llama && !q.ik_f16 && q.any());
        assert!(PeerChoice::parse("vllm").is_err());
    }

    #[test]
    fn arms_and_peer_names() {
        assert_eq!(arms(None, &[]), [Arm::Fp32, Arm::Bf16]);
        assert_eq!(arms(None, &[Arm::Int8]), [Arm::Int8]);
        assert_eq!(arms(Some(Arm::Bf16), &[Arm::Int8, Arm::Fp32]), [Arm::Bf16]);
        for p in PeerName::ALL {
            assert_eq!(p.name().parse::<PeerName>(), Ok(p));
        }
        assert_eq!(
            "vllm".parse::<PeerName>(),
            Err(
                "unknown peer `vllm` (none, torch, llama, llama-q8, llama-f16, ik-llama, ik-llama-q, all)"
                    .to_string()
            )
        );
        assert_eq!(" ik-llama ".parse::<PeerName>(), Ok(PeerName::IkLlama));
        assert!("ik_llama".parse::<PeerName>().is_err());
        let q8 = PeerChoice::of(&[PeerName::LlamaQ8]);
        assert!(q8.llama_q8 && !q8.llama && !q8.torch && q8.any());
        let f16 = PeerChoice::of(&[PeerName::LlamaF16]);
        assert!(f16.llama_f16 && !f16.llama && !f16.llama_q8 && f16.any());
    }

    #[test]
    fn peers_are_capped_to_avx2_with_our_kernels() {
        let none_set = |_: &str| false;
        let caps = peer_caps(Isa::Avx2, none_set);
        assert_eq!(caps.len(), 4);
        assert!(caps.contains(&("KEV_BENCH_LLAMA_ISA", "avx2")));
        assert!(caps.contains(&("ATEN_CPU_CAPABILITY", "avx2")));
        // A variable the caller set wins.
        let caps = peer_caps(Isa::Avx2, |k| k == "KEV_BENCH_LLAMA_ISA");
        assert_eq!(caps.len(), 3);
        assert!(caps.iter().all(|(k, _)| *k != "KEV_BENCH_LLAMA_ISA"));
        // Native peers on every other instruction set.
        for isa in [
            Isa::Portable,
            Isa::Avx512,
            Isa::Avx512Bf16,
            Isa::Amx,
            Isa::Neon,
            Isa::NeonI8mm,
        ] {
            assert!(peer_caps(isa, none_set).is_empty(), "{isa}");
        }
        let env = PeerEnv::new("t", "c").with_vars(peer_caps(Isa::Avx2, none_set));
        let setup = PeerSetup::of(&env);
        assert!(
            setup.vars.contains(&"ONEDNN_MAX_CPU_ISA=AVX2".to_string()),
            "{setup:?}"
        );
    }

    #[test]
    fn utc_dates() {
        assert_eq!(utc_string(0), "1970-01-01 00:00");
        // 2000-02-29 12:34 UTC
        assert_eq!(utc_string(951_827_640), "2000-02-29 12:34");
        assert_eq!(utc_string(1_767_225_599), "2025-12-31 23:59");
    }

    #[test]
    fn seconds_format() {
        assert_eq!(secs(0.0123), "0.012");
        assert_eq!(secs(12.345), "12.35");
        assert_eq!(secs(123.45), "123.5");
        assert_eq!(times(Some(2.0)), "2.00×");
        assert_eq!(times(None), "–");
    }
}
