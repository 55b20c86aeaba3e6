//! From flags to a loaded decision service: the model flags ([`ModelArgs`]) and the service flags
//! ([`ServiceArgs`]) shared by `decide`, `serve`, `bench` and `accept`.

use std::path::PathBuf;

use anyhow::Context;
use kev_decide::{LoadSpec, ModelInfo, Settings, Source, WeightForm};
use kev_engine::CpuBackend;
use kev_tokenize::Limits;

use crate::model_args::ModelArgs;

/// Tunables of the decision service.
#[derive(clap::Args, Debug, Clone)]
pub struct ServiceArgs {
    /// Largest number of tokens one forward pass takes (rows of several questions and requests are packed
    /// up to it).
    #[arg(long, env = "KEV_PASS_TOKENS", default_value_t = 4096)]
    pub pass_tokens: usize,
    /// Byte budget of the prepared-state cache (0 turns it off; default: an eighth of the machine's memory,
    /// at most 4 GiB).
    #[arg(long, env = "KEV_CACHE_BYTES")]
    pub cache_bytes: Option<usize>,
    /// Read only the first 65,536 tokens of an over-long state instead of refusing it (responses then
    /// carry `x_truncated`).
    #[arg(long, env = "KEV_TRUNCATE_STATES")]
    pub truncate_state: bool,
    /// Snapshot the shared state at its end rather than at the last multiple of 64 tokens (fewer tokens;
    /// equal to from-zero rows only to fp32 rounding instead of bit for bit).
    #[arg(long)]
    pub unaligned_state: bool,
    /// Run every question as its own row from zero, as the author's reference does (no sharing, no cache).
    #[arg(long)]
    pub rows_from_zero: bool,
}

impl ServiceArgs {
    /// The settings these flags ask for.
    pub fn settings(&self) -> Settings {
        Settings {
            limits: Limits {
                truncate_state: self.truncate_state,
                ..Limits::KEV
            },
            pass_tokens: self.pass_tokens.max(1),
            cache_bytes: self.cache_bytes.unwrap_or_else(default_cache_bytes),
            chunk_aligned: !self.unaligned_state,
            rows_from_zero: self.rows_from_zero,
        }
    }
}

/// An eighth of physical memory, at most 4 GiB (512 MiB if it cannot be read).
pub fn default_cache_bytes() -> usize {
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<usize>().ok())
        })
        .map(|kb| kb * 1024);
    match total {
        Some(t) => (t / 8).min(4 << 30),
        None => 512 << 20,
    }
}

impl ModelArgs {
    /// The load specification these flags name.
    pub fn load_spec(&self, settings: Settings) -> anyhow::Result<LoadSpec> {
        self.check_device()?;
        let form: WeightForm = self
            .weights
            .parse()
            .map_err(|e: String| anyhow::anyhow!(e))?;
        let source = match (&self.model, &self.base, &self.kev) {
            (Some(dir), _, _) => Source::Prepared(dir.clone()),
            (None, Some(base), Some(kev)) => Source::Release {
                base: base.clone(),
                kev: kev.clone(),
            },
            _ => anyhow::bail!(
                "name a model: --model DIR (prepared), or --base DIR --kev DIR (release)"
            ),
        };
        Ok(LoadSpec {
            source,
            form,
            arm: self.arm(),
            settings,
        })
    }
}

/// Load the model the flags name.
pub fn load(
    model: &ModelArgs,
    service: &ServiceArgs,
) -> anyhow::Result<(kev_decide::Kev<CpuBackend>, ModelInfo)> {
    let spec = model.load_spec(service.settings())?;
    kev_decide::load_cpu(&spec).with_context(|| format!("loading {}", describe(&spec.source)))
}

fn describe(source: &Source) -> String {
    match source {
        Source::Prepared(d) => d.display().to_string(),
        Source::Release { base, kev } => format!("{} + {}", base.display(), kev.display()),
    }
}

/// The bundled release `kev serve --demo` answers with: kev-mini, a miniature Kev trained on synthetic
/// decision records in the real release formats (`fixtures/mini`; `KEV_DEMO_DIR` overrides).
pub fn demo_release() -> anyhow::Result<(PathBuf, PathBuf)> {
    let root = std::env::var_os("KEV_DEMO_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/mini"))
        });
    let (base, kev) = (root.join("base"), root.join("kev"));
    if !base.join("config.json").is_file() || !kev.join("head.pt").is_file() {
        anyhow::bail!(
            "the demo release is not at {} (set KEV_DEMO_DIR to a directory with base/ and kev/)",
            root.display()
        );
    }
    Ok((base, kev))
}
