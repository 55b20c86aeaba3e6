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
    /// Compute arm: `fp32`, `bf16` or `int8` (W8A8 projections; default: bf16 where the CPU has native BF16
    /// dot products, else fp32).
    #[arg(long, env = "KEV_PRECISION", value_parser = ["fp32", "bf16", "int8"])]
    pub precision: Option<String>,
    /// Device: `cpu`, or `cuda[:N]` (checks the device and kernels; the CUDA backend is not enabled until it has
    /// passed its parity test on a GPU).
    #[arg(long, env = "KEV_DEVICE", default_value = "cpu")]
    pub device: String,
}

impl ModelArgs {
    /// `--device`: `cpu` runs; `cuda[:N]` opens the device and compiles the kernels, so that the error says
    /// whether the machine could run them, then refuses until the CUDA backend has passed its parity test on a GPU
    /// (issue 9).
    pub fn check_device(&self) -> anyhow::Result<()> {
        let choice: kev_cuda::DeviceChoice = self.device.parse().map_err(anyhow::Error::msg)?;
        let kev_cuda::DeviceChoice::Cuda(n) = choice else {
            return Ok(());
        };
        match kev_cuda::Device::open(n) {
            Err(e) => anyhow::bail!("--device {choice}: {e}"),
            Ok(d) => anyhow::bail!(
                "--device {choice}: {} is usable and kev's kernels compile for it, but the CUDA backend has not \
                 passed its parity test on a GPU yet (kev-cuda's tests/backend.rs), so kev does not serve with it; \
                 use --device cpu",
                d.describe()
            ),
        }
    }

    /// How to load the backbone: the checkpoint directory and its load options (the `exact` form keeps
    /// the adapter unmerged; `merged` from `--base/--kev` merges it at load, bit-exact with `kev prepare`).
    pub fn backbone_source(&self) -> anyhow::Result<(PathBuf, kev_engine::LoadOptions)> {
        self.check_device()?;
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
