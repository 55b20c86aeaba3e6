//! `kev prepare`: fetch (or read), verify, merge and export the Kev release into an engine-ready
//! directory. All the work is in `kev-prepare`; this maps flags onto its options.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use kev_prepare::{ExtrasPolicy, HubConfig, PrepareOptions, Source};
use kev_release::{Release, ReleasePins};

/// Fetch, verify and merge the pinned release into an engine-ready directory.
#[derive(clap::Args)]
pub struct Args {
    /// The published release whose pins are used: `kev-4b` (Kev-4B v1.0), `kev-0.8b` (Kev-0.8B v1.0) or
    /// `kev-9b` (Kev-9B v1.0); some files of the last two have no public digest or size
    /// (docs/kev-0.8b-pins.md, docs/kev-9b-pins.md).
    #[arg(long, value_name = "NAME", default_value = "kev-4b", value_parser = Release::NAMES,
        conflicts_with = "pins")]
    release: String,
    /// The Kev repository: a local directory with its files (as every other command takes it), or
    /// `owner/name@revision` on the Hub (default: the pinned one of --release). An existing directory wins.
    #[arg(long, value_name = "DIR|REPO@REV", conflicts_with = "kev_dir")]
    kev: Option<String>,
    /// A local directory with the Kev repository's files (older spelling of `--kev DIR`).
    #[arg(long, value_name = "DIR")]
    kev_dir: Option<PathBuf>,
    /// The base repository: a local directory with its files, or `owner/name@revision` on the Hub
    /// (default: the pinned base of --release). An existing directory wins.
    #[arg(long, value_name = "DIR|REPO@REV", conflicts_with = "base_dir")]
    base: Option<String>,
    /// A local directory with the base repository's files (older spelling of `--base DIR`).
    #[arg(long, value_name = "DIR")]
    base_dir: Option<PathBuf>,
    /// The directory to create (must not exist, or be empty).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Keep the vision tower (`model.visual.*`), an untied base's `lm_head.weight`, the base's composite
    /// config.json and its shard names: the layout of the published merged artifact, which still loads as
    /// the full base model.
    #[arg(long)]
    keep_extras: bool,
    /// Also keep the MTP head (`mtp.*`), which no loader of this model uses.
    #[arg(long)]
    keep_mtp: bool,
    /// A pins file (JSON: the shape `kev_release::ReleasePins` writes) instead of the built-in pins of
    /// --release; local directories are then checked against it too.
    #[arg(long, value_name = "FILE")]
    pins: Option<PathBuf>,
    /// Use only the Hub cache (same as HF_HUB_OFFLINE=1).
    #[arg(long)]
    offline: bool,
    /// No progress bars.
    #[arg(long)]
    quiet: bool,
    /// Also write the int8 arm's weights (`int8.safetensors`, engine README), which `--precision int8`
    /// then loads: W8A8 with the rule's bf16 islands (layer 0's GDN projections), smoothed with
    /// --calibration.
    #[arg(long)]
    int8: bool,
    /// With --int8: SmoothQuant (α 0.5 on the norm-reading projections) from the activation ranges of
    /// these requests, JSON lines: each a request body, or a record with the body under `request` (the
    /// shape of kev-mini's `data/*.jsonl`). Use training or development data, never evaluation rows.
    #[arg(long, value_name = "FILE", requires = "int8")]
    calibration: Option<PathBuf>,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let release: Release = args.release.parse().map_err(anyhow::Error::msg)?;
    let mut opts = PrepareOptions::for_release(args.out.clone(), release);
    if let Some(p) = &args.pins {
        opts.pins = ReleasePins::from_json_file(p)
            .with_context(|| format!("reading pins {}", p.display()))?;
        opts.pins_explicit = true;
    }
    opts.kev = match (&args.kev, &args.kev_dir) {
        (Some(s), _) => Some(Source::parse(s)?),
        (None, Some(d)) => Some(Source::Dir(d.clone())),
        (None, None) => None,
    };
    opts.base = match (&args.base, &args.base_dir) {
        (Some(s), _) => Some(Source::parse(s)?),
        (None, Some(d)) => Some(Source::Dir(d.clone())),
        (None, None) => None,
    };
    opts.extras = ExtrasPolicy {
        keep_visual: args.keep_extras,
        keep_mtp: args.keep_mtp,
        keep_lm_head: args.keep_extras,
    };
    let mut hub = HubConfig::from_env();
    hub.offline |= args.offline;
    hub.progress = !args.quiet;
    opts.hub = hub;

    let started = std::time::Instant::now();
    let report = kev_prepare::prepare(&opts)?;
    let m = &report.manifest;
    if m.pins.is_some() {
        for u in &opts.pins.unverified {
            eprintln!("kev: not verified by the {} pins: {u}", opts.pins.name);
        }
    }
    // warnings were logged as they arose
    eprintln!(
        "kev: prepared {} in {:.1}s{}: {} modules merged, {} tensors copied, {} dropped, {} files",
        report.out.display(),
        started.elapsed().as_secs_f64(),
        peak_rss()
            .map(|kb| format!(" (peak RSS {:.0} MiB)", kb as f64 / 1024.0))
            .unwrap_or_default(),
        m.merge.merged_modules,
        m.merge.copied_tensors,
        m.merge.dropped_tensors.len(),
        m.outputs.len()
    );
    if args.int8 {
        let bodies = match args.calibration.as_deref() {
            Some(path) => read_calibration(path)?,
            None => Vec::new(),
        };
        let started = std::time::Instant::now();
        let plan = if bodies.is_empty() {
            kev_engine::Int8Plan::default()
        } else {
            kev_engine::Int8Plan::smoothed()
        };
        let spec = kev_decide::LoadSpec {
            source: kev_decide::Source::Prepared(report.out.clone()),
            form: kev_decide::WeightForm::Merged,
            arm: Some(kev_engine::Arm::Int8),
            settings: kev_decide::Settings::default(),
        };
        let source = match args.calibration.as_deref() {
            Some(path) => format!("{} ({} requests)", path.display(), bodies.len()),
            None => "none (the rule, no smoothing)".to_string(),
        };
        kev_prepare::add_output(&report.out, kev_engine::INT8_FILE, |file| {
            let kev = if bodies.is_empty() {
                kev_decide::load_cpu(&spec).map_err(|e| e.to_string())?.0
            } else {
                kev_decide::load_cpu_int8(&spec, &bodies, plan)
                    .map_err(|e| e.to_string())?
                    .0
            };
            let scheme = format!(
                "{}: {}-bit weights per output channel (stored as int8), int8 activations per token, \
                 SmoothQuant alpha {} on {:?}; bf16 islands (layer, projection) {:?}",
                if plan.narrow_weights { "W7A8" } else { "W8A8" },
                if plan.narrow_weights { 7 } else { 8 },
                plan.alpha,
                plan.scope,
                plan.bf16_layer_islands
            );
            kev.backend()
                .model()
                .write_int8(
                    file,
                    &[("scheme", scheme.clone()), ("calibration", source.clone())],
                )
                .map_err(|e| e.to_string())?;
            Ok([
                ("int8.scheme".to_string(), scheme),
                ("int8.calibration".to_string(), source.clone()),
            ]
            .into_iter()
            .collect())
        })?;
        eprintln!(
            "kev: wrote {} ({:.1}s, calibrated on {source})",
            report.out.join(kev_engine::INT8_FILE).display(),
            started.elapsed().as_secs_f64()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Calibration request bodies: one JSON value a line, the body itself or a record's `request`.
fn read_calibration(path: &std::path::Path) -> anyhow::Result<Vec<Vec<u8>>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading calibration {}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(line)
            .with_context(|| format!("{} line {}", path.display(), i + 1))?;
        let body = match v.get("request") {
            Some(r) if v.get("state").is_none() => r,
            _ => &v,
        };
        out.push(serde_json::to_vec(body)?);
    }
    anyhow::ensure!(
        !out.is_empty(),
        "{}: no calibration requests",
        path.display()
    );
    Ok(out)
}

/// Peak resident set size of this process in KiB (Linux `VmHWM`), for the summary line.
fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}
