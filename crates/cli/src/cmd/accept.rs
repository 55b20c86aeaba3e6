//! `kev accept`: prove that a Kev model on this machine agrees with the author's (digests, merge, head,
//! decision gates) and write the report. Exit 0 when every gate passes, 1 when one fails, 2 for bad input.
//! A thin wrapper of `kev_accept::accept`; see crates/accept/VERIFYING.md.

use std::path::PathBuf;
use std::process::ExitCode;

use kev_accept::{AcceptOptions, ArmId, GateMode, ReferenceSource, Status, accept};

/// Prove a model agrees with the author's reference.
#[derive(clap::Args)]
pub struct Args {
    /// A prepared directory (`kev prepare`). Its manifest names the release files it was made from; they are
    /// used when still present (local directories or the Hugging Face cache).
    #[arg(long)]
    model: Option<PathBuf>,
    /// The base release directory (Qwen3.5 base files); with --kev.
    #[arg(long, requires = "kev")]
    base: Option<PathBuf>,
    /// The Kev release directory (adapter, head.pt, tokenizer.json); with --base.
    #[arg(long, requires = "base")]
    kev: Option<PathBuf>,
    /// A Python with torch, transformers and peft (tools/reference/requirements.txt): runs the author's fp32
    /// reference on the same weights and applies the gates.
    #[arg(long, value_name = "PYTHON", conflicts_with = "reference_output")]
    reference: Option<PathBuf>,
    /// A reference computed earlier (`reference_arm.py --out` file, or a directory of expected records)
    /// instead of running Python.
    #[arg(long, value_name = "FILE_OR_DIR")]
    reference_output: Option<PathBuf>,
    /// A directory of request bodies (`*.json`) instead of the shipped acceptance set.
    #[arg(long, value_name = "DIR")]
    requests: Option<PathBuf>,
    /// Report prefix: writes PREFIX.json and PREFIX.md.
    #[arg(long, value_name = "PREFIX", default_value = "kev-accept")]
    out: PathBuf,
    /// Release pins (JSON, the shape `kev prepare --pins` reads); default: the built-in pins of --release.
    #[arg(long, value_name = "FILE")]
    pins: Option<PathBuf>,
    /// The published release whose built-in pins (and real bar) apply: `kev-4b` (default), `kev-0.8b` or
    /// `kev-9b`.
    #[arg(long, value_name = "NAME", default_value = "kev-4b", value_parser = kev_release::Release::NAMES,
        conflicts_with = "pins")]
    release: String,
    /// `real` (default): the published bar for every arm. `synthetic`: for random-weight releases only, the
    /// arms carrying bf16 rounding are held to torch's own bf16 run (refused with a published release's pins).
    #[arg(long, value_parser = ["real", "synthetic"])]
    gates: Option<String>,
    /// Comma-separated arms to run (exact-fp32, exact-bf16, merged-fp32, merged-bf16, merged-int8); default:
    /// every arm the inputs allow.
    #[arg(long, value_delimiter = ',')]
    arms: Vec<String>,
}

fn options(args: &Args) -> Result<AcceptOptions, String> {
    let mut opts = AcceptOptions {
        model: args.model.clone(),
        base: args.base.clone(),
        kev: args.kev.clone(),
        gates: args
            .gates
            .as_deref()
            .map(str::parse::<GateMode>)
            .transpose()?,
        requests: args.requests.clone(),
        reference: match (&args.reference, &args.reference_output) {
            (Some(py), _) => ReferenceSource::Python(py.clone()),
            (None, Some(p)) => ReferenceSource::Output(p.clone()),
            (None, None) => ReferenceSource::None,
        },
        arms: args
            .arms
            .iter()
            .map(|a| a.trim().parse::<ArmId>())
            .collect::<Result<_, _>>()?,
        command: Some(std::env::args().collect::<Vec<_>>().join(" ")),
        ..AcceptOptions::default()
    };
    let release: kev_release::Release = args.release.parse()?;
    opts = opts.with_release(release);
    if let Some(p) = &args.pins {
        opts = opts.with_pins_file(p).map_err(|e| e.to_string())?;
    }
    Ok(opts)
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let report = match options(&args).and_then(|o| accept(&o).map_err(|e| e.to_string())) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("kev accept: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    let (json, md) = report.write(&args.out)?;
    for g in &report.gates {
        println!("{:<8} {:<28} {}", g.status.label(), g.id, g.detail);
    }
    let verdict = if report.passed() { "PASS" } else { "FAIL" };
    println!(
        "\n{verdict}: {} ({:.1} s)\nreport: {} and {}",
        report.summary,
        report.wall_seconds,
        json.display(),
        md.display()
    );
    if report.gates.iter().any(|g| g.status == Status::Fail) {
        Ok(ExitCode::from(1))
    } else {
        Ok(ExitCode::SUCCESS)
    }
}
