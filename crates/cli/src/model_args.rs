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

impl ModelArgs {
    /// How to load the backbone: the checkpoint directory and its load options (the `exact` form keeps
    /// the adapter unmerged; `merged` from `--base/--kev` merges it at load, bit-exact with `kev prepare`).
    pub fn backbone_source(&self) -> anyhow::Result<(PathBuf, kev_engine::LoadOptions)> {
        let opts = |adapter: Option<&PathBuf>, merge: bool| kev_engine::LoadOptions {
            adapter: adapter.cloned(),
            kernels: None,
            merge_adapter: merge,
        };
        match (&self.model, &self.base, &self.kev, self.weights.as_str()) {
            (Some(model), _, _, "merged") => Ok((model.clone(), opts(None, false))),
            (Some(_), _, _, _) => anyhow::bail!(
                "--weights exact needs --base and --kev (a prepared --model holds merged weights only)"
            ),
            (None, Some(base), Some(kev), w) => Ok((base.clone(), opts(Some(kev), w == "merged"))),
            _ => anyhow::bail!("pass --model DIR, or --base DIR --kev DIR"),
        }
    }

    /// The compute arm asked for, if any.
    pub fn arm(&self) -> Option<kev_engine::Arm> {
        self.precision.as_deref().and_then(|p| p.parse().ok())
    }
}
