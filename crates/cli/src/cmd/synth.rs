//! `kev synth`: write a random-weight release in the published layout, for benchmarks and demos.
//! The writing streams (one chunk in memory), so the 8.4 GB 4B-shaped release (or the 1.5 GB 0.8B-shaped one)
//! needs no more RAM than a few megabytes; see `kev_engine::synth` for the layout and the value distributions.
//!
//! `kev/` holds what a decision needs besides the base: the adapter, the Kev tokenizer (copied: the real
//! vocabulary) and a random pointer head in the prepared form (`head.safetensors` + `kev_head.json`). So
//! `kev bench decide --base DIR/base --kev DIR/kev` runs on it as it is; `head.pt` (a torch pickle, needed by
//! `kev decide --base/--kev` and `kev prepare`) is written from the same tensors by `tools/bench/head_pt.py`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use kev_engine::Qwen35Config;
use kev_engine::synth::{SynthOptions, tiny_config, write_decision_files, write_release};

/// Flags of `kev synth`.
#[derive(clap::Args)]
pub struct Args {
    /// Output directory; `base/` (and `kev/`) are created inside.
    #[arg(long)]
    out: PathBuf,
    /// Seed of every value.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Decoder shape: `4b` (Qwen3.5-4B: hidden 2560, 32 layers, vocab 248,320; ≈ 8.4 GB), `0.8b`
    /// (Qwen3.5-0.8B: hidden 1024, 24 layers, 8/2 attention heads, 16/16 DeltaNet heads; ≈ 1.5 GB; head and
    /// adapter name Kev-0.8B's base) or `tiny` (the fixture widths: hidden 16, 8 layers, the real vocabulary).
    #[arg(long, default_value = "4b", value_parser = ["4b", "0.8b", "tiny"])]
    config: String,
    /// Number of safetensors shards in `base/` (an index file is written for more than one).
    #[arg(long, default_value_t = 2)]
    shards: usize,
    /// Do not write `kev/` (adapter, tokenizer, head).
    #[arg(long)]
    no_adapter: bool,
    /// Keep an existing `base/` (its config.json must describe the chosen shape) and write only `kev/`: adds
    /// the decision files to a release written before, without touching the 8.4 GB of shards (nor the
    /// GGUF that llama.cpp's bench converted from them and keyed by their modification times).
    #[arg(long, conflicts_with = "no_adapter")]
    skip_base: bool,
    /// The Kev-variant `tokenizer.json` copied into `kev/` (default: the repository's
    /// `fixtures/release/kev/tokenizer.json`).
    #[arg(long, value_name = "FILE")]
    tokenizer: Option<PathBuf>,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let config = match args.config.as_str() {
        "tiny" => tiny_config(248_320),
        "0.8b" => Qwen35Config::qwen35_0_8b(),
        _ => Qwen35Config::qwen35_4b(),
    };
    let tokenizer = match &args.tokenizer {
        Some(path) => path.clone(),
        None => default_tokenizer(),
    };
    if !args.no_adapter && !tokenizer.is_file() {
        anyhow::bail!(
            "the Kev tokenizer is not at {} (pass --tokenizer FILE)",
            tokenizer.display()
        );
    }
    let t = Instant::now();
    let base = args.out.join("base");
    let mut v = if args.skip_base {
        check_base(&base, &config)?;
        let kev = args.out.join("kev");
        kev_engine::synth::write_adapter(&kev, &config, args.seed)
            .with_context(|| format!("writing {}", kev.display()))?;
        serde_json::json!({"base": base, "kev": kev, "base_kept": true})
    } else {
        let report = write_release(
            &args.out,
            &SynthOptions {
                config: config.clone(),
                seed: args.seed,
                shards: args.shards,
                adapter: !args.no_adapter,
                f32_weights: false,
            },
        )
        .with_context(|| format!("writing {}", args.out.display()))?;
        serde_json::to_value(&report)?
    };
    if !args.no_adapter {
        let kev = args.out.join("kev");
        let files = write_decision_files(&kev, &tokenizer, &config, args.seed)
            .with_context(|| format!("writing the decision files into {}", kev.display()))?;
        v["decision_files"] = serde_json::to_value(&files)?;
    }
    v["seconds"] = serde_json::json!((t.elapsed().as_secs_f64() * 10.0).round() / 10.0);
    println!("{}", serde_json::to_string_pretty(&v)?);
    Ok(ExitCode::SUCCESS)
}

/// The Kev tokenizer bundled with the fixtures of this source tree.
fn default_tokenizer() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/release/kev/tokenizer.json")
}

/// `--skip-base` must not pair new `kev/` files with a base of another shape.
fn check_base(base: &Path, config: &Qwen35Config) -> anyhow::Result<()> {
    let found = Qwen35Config::from_dir(base)
        .with_context(|| format!("--skip-base: reading {}", base.display()))?;
    anyhow::ensure!(
        &found == config,
        "--skip-base: {} holds another decoder shape than --config asks for",
        base.display()
    );
    Ok(())
}
