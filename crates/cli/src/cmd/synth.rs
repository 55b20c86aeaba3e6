//! `kev synth`: write a random-weight release in the published layout, for benchmarks and demos.
//! The writing streams (one chunk in memory), so the 8.4 GB 4B-shaped release needs no more RAM than a
//! few megabytes; see `kev_engine::synth` for the layout and the value distributions.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use kev_engine::Qwen35Config;
use kev_engine::synth::{SynthOptions, tiny_config, write_release};

/// Flags of `kev synth`.
#[derive(clap::Args)]
pub struct Args {
    /// Output directory; `base/` (and `kev/`) are created inside.
    #[arg(long)]
    out: PathBuf,
    /// Seed of every value.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Decoder shape: `4b` (Qwen3.5-4B: hidden 2560, 32 layers, vocab 248,320; ≈ 8.4 GB) or `tiny`
    /// (the fixture widths: hidden 16, 8 layers, the real vocabulary).
    #[arg(long, default_value = "4b", value_parser = ["4b", "tiny"])]
    config: String,
    /// Number of safetensors shards in `base/` (an index file is written for more than one).
    #[arg(long, default_value_t = 2)]
    shards: usize,
    /// Do not write `kev/` (the random LoRA adapter over the 12 target modules).
    #[arg(long)]
    no_adapter: bool,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let config = match args.config.as_str() {
        "tiny" => tiny_config(248_320),
        _ => Qwen35Config::qwen35_4b(),
    };
    let t = Instant::now();
    let report = write_release(
        &args.out,
        &SynthOptions {
            config,
            seed: args.seed,
            shards: args.shards,
            adapter: !args.no_adapter,
            f32_weights: false,
        },
    )
    .with_context(|| format!("writing {}", args.out.display()))?;
    let mut v = serde_json::to_value(&report)?;
    v["seconds"] = serde_json::json!((t.elapsed().as_secs_f64() * 10.0).round() / 10.0);
    println!("{}", serde_json::to_string_pretty(&v)?);
    Ok(ExitCode::SUCCESS)
}
