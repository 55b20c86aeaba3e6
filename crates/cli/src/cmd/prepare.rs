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
    /// The published release whose pins are used: `kev-4b` (Kev-4B v1.0) or `kev-0.8b` (Kev-0.8B v1.0;
    /// some of its files have no public digest: docs/kev-0.8b-pins.md).
    #[arg(long, value_name = "NAME", default_value = "kev-4b", value_parser = ["kev-4b", "kev-0.8b"],
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
    /// Keep the vision tower (`model.visual.*`), the base's composite config.json and its shard
    /// names: the layout of the published merged artifact, which still loads as the full base model.
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
    Ok(ExitCode::SUCCESS)
}

/// Peak resident set size of this process in KiB (Linux `VmHWM`), for the summary line.
fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}
