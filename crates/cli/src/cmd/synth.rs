//! `kev synth`: the flags; the writing is kev-bench's (`kev_bench::synth`).

use std::path::PathBuf;
use std::process::ExitCode;

use kev_bench::synth::Shape;

use crate::model_args::LibraryEnum;

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
    /// adapter name Kev-0.8B's base), `9b` (Qwen3.5-9B: hidden 4096, MLP 12,288, 32 layers, untied with an
    /// `lm_head.weight`; ≈ 18 GB; head and adapter name Kev-9B's base) or `tiny` (the fixture widths: hidden
    /// 16, 8 layers, the real vocabulary).
    #[arg(long, default_value = "4b", value_parser = LibraryEnum::<Shape>::new())]
    config: Shape,
    /// Keep only the first N layers of the shape, every width as it is (a release of the 9B shape small enough to
    /// check a benchmark pipeline end to end: `--config 9b --layers 4` is 5.8 GB).
    #[arg(long, value_name = "N")]
    layers: Option<usize>,
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
    let report = kev_bench::synth::run(&kev_bench::synth::Options {
        out: args.out,
        seed: args.seed,
        shape: args.config,
        shards: args.shards,
        layers: args.layers,
        no_adapter: args.no_adapter,
        skip_base: args.skip_base,
        tokenizer: args.tokenizer,
    })?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(ExitCode::SUCCESS)
}
