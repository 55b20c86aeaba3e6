//! The flags every model-loading command shares (decide, serve, bench, accept).
#![allow(dead_code)]

use std::path::PathBuf;

/// Which model to load and how to compute with it.
#[derive(clap::Args, Debug, Clone)]
pub struct ModelArgs {
    /// A prepared (engine-ready) model directory, as written by `kev prepare`.
    #[arg(long, env = "KEV_MODEL", conflicts_with_all = ["base", "kev"])]
    pub model: Option<PathBuf>,
    /// The base release directory (Qwen3.5 base files); use with --kev.
    #[arg(long, requires = "kev")]
    pub base: Option<PathBuf>,
    /// The Kev release directory (adapter, head.pt, tokenizer.json); use with --base.
    #[arg(long, requires = "base")]
    pub kev: Option<PathBuf>,
    /// Weight form: `merged` (LoRA merged into BF16 weights) or `exact` (LoRA kept unmerged in fp32; needs --base/--kev).
    #[arg(long, env = "KEV_WEIGHTS", default_value = "merged", value_parser = ["merged", "exact"])]
    pub weights: String,
    /// Compute arm: `fp32` or `bf16` (default: bf16 where the CPU has native BF16 dot products, else fp32).
    #[arg(long, env = "KEV_PRECISION", value_parser = ["fp32", "bf16"])]
    pub precision: Option<String>,
    /// Device: `cpu` (or `cuda[:N]` where built with CUDA).
    #[arg(long, env = "KEV_DEVICE", default_value = "cpu")]
    pub device: String,
}
