//! `kev verify DIR`: re-hash a prepared directory against its `manifest.json`.
//! Exit 0 when every listed file matches and nothing else is present, 1 otherwise.

use std::path::PathBuf;
use std::process::ExitCode;

/// Re-hash a prepared directory against its manifest.
#[derive(clap::Args)]
pub struct Args {
    /// The prepared directory (as written by `kev prepare`).
    dir: PathBuf,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let report = kev_release::manifest::verify(&args.dir)?;
    let m = &report.manifest;
    println!(
        "{}: {} (format {}), {} merged modules",
        args.dir.display(),
        m.tool,
        m.format_version,
        m.merge.merged_modules
    );
    for s in &m.sources {
        let what = match (&s.repo, &s.commit, &s.local_dir) {
            (Some(r), Some(c), _) => format!("{r}@{c}"),
            (Some(r), None, _) => format!("{r}@{}", s.revision.as_deref().unwrap_or("?")),
            (None, _, Some(d)) => d.clone(),
            _ => "?".into(),
        };
        println!(
            "  source {}: {what}{}",
            s.role,
            if s.pinned { " (pinned)" } else { " (unpinned)" }
        );
    }
    for name in &report.ok {
        println!("  ok       {name}");
    }
    for p in &report.problems {
        println!("  FAILED   {p}");
    }
    if report.is_ok() {
        println!("verified: {} files match the manifest", report.ok.len());
        Ok(ExitCode::SUCCESS)
    } else {
        println!(
            "NOT verified: {} problem(s); the directory was modified after `kev prepare` (re-run it)",
            report.problems.len()
        );
        Ok(ExitCode::from(1))
    }
}
