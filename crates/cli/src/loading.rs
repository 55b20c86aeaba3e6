//! From flags to a loaded decision service: the model flags ([`ModelArgs`]) and the service flags
//! ([`ServiceArgs`]) shared by `decide`, `serve`, `bench` and `accept`.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use kev_decide::{Calibration, Caps, LoadSpec, ModelInfo, Settings, Source};
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
    /// Byte budget of the prepared-state cache (0 turns it off; default: an eighth of the memory the loaded
    /// model leaves free, at most 4 GiB).
    #[arg(long, env = "KEV_CACHE_BYTES")]
    pub cache_bytes: Option<usize>,
    /// Byte budget of pinned states (`POST /v1/systemone/states`), beside the cache's; 0 turns pinning off.
    #[arg(long, env = "KEV_PIN_BYTES", default_value_t = Settings::default().pin_bytes)]
    pub pin_bytes: usize,
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
    /// Add date facts to states naming two or more dates (`Month D, YYYY` / `YYYY-MM-DD`): one sentence per
    /// pair with its day count, as the author's `KEV_DATE_FACTS=1` does. Off by default.
    #[arg(long, env = "KEV_DATE_FACTS", value_parser = clap::builder::BoolishValueParser::new())]
    pub date_facts: bool,
    /// Refuse a request whose `model` names no served adapter (nor `kev-latest`, `jev-latest`, the size or an
    /// alias) with 400 `api_usage_error` "Unknown model: …", as the live SystemOne API does, instead of
    /// answering it with the default adapter and echoing the name (Kev 1.0's behaviour, the default).
    #[arg(long, env = "KEV_STRICT_MODELS", value_parser = clap::builder::BoolishValueParser::new())]
    pub strict_models: bool,
    /// Apply the temperatures `kev calibrate` fitted (its `--out` file) in the pointer head instead of the
    /// stored one.
    #[arg(long, env = "KEV_CALIBRATION", value_name = "FILE")]
    pub calibration: Option<PathBuf>,
    /// Most questions in one request (more → 413).
    #[arg(long, env = "KEV_MAX_QUESTIONS", default_value_t = Caps::default().max_questions)]
    pub max_questions: usize,
    /// Most options over all questions of one request (a noul question has 2; more → 413).
    #[arg(long, env = "KEV_MAX_OPTIONS", default_value_t = Caps::default().max_options)]
    pub max_options: usize,
    /// Most input tokens of one request: the state once plus every question's branch, as
    /// `usage.input_tokens` counts them (more → 413).
    #[arg(long, env = "KEV_MAX_INPUT_TOKENS", default_value_t = Caps::default().max_input_tokens)]
    pub max_input_tokens: usize,
    /// Most requests in one `/v1/systemone/batch` call (more → 413).
    #[arg(long, env = "KEV_MAX_BATCH_REQUESTS", default_value_t = Caps::default().max_batch_requests)]
    pub max_batch_requests: usize,
    /// Most input tokens over all admitted requests of one batch (more → 413; each request is also held
    /// to --max-input-tokens on its own).
    #[arg(long, env = "KEV_MAX_BATCH_INPUT_TOKENS", default_value_t = Caps::default().max_batch_input_tokens)]
    pub max_batch_input_tokens: usize,
}

impl ServiceArgs {
    /// The settings these flags ask for (the calibration file read here, through the library's reader).
    pub fn settings(&self) -> anyhow::Result<Settings> {
        let calibration = match &self.calibration {
            Some(path) => Some(Arc::new(Calibration::read(path)?)),
            None => None,
        };
        Ok(Settings {
            limits: Limits {
                truncate_state: self.truncate_state,
                ..Limits::KEV
            },
            caps: Caps {
                max_questions: self.max_questions,
                max_options: self.max_options,
                max_input_tokens: self.max_input_tokens,
                max_batch_requests: self.max_batch_requests,
                max_batch_input_tokens: self.max_batch_input_tokens,
            },
            pass_tokens: self.pass_tokens.max(1),
            cache_bytes: self.cache_bytes,
            pin_bytes: self.pin_bytes,
            chunk_aligned: !self.unaligned_state,
            rows_from_zero: self.rows_from_zero,
            date_facts: self.date_facts,
            calibration,
            strict_models: self.strict_models,
        })
    }
}

impl ModelArgs {
    /// The load specification these flags name.
    pub fn load_spec(&self, settings: Settings) -> anyhow::Result<LoadSpec> {
        self.check_device()?;
        Ok(LoadSpec {
            source: self.source()?,
            form: self.weights,
            arm: self.arm(),
            settings,
        })
    }
}

/// Load the model the flags name, with the service options the flags name.
pub fn load(
    model: &ModelArgs,
    service: &ServiceArgs,
) -> anyhow::Result<(kev_decide::Kev<CpuBackend>, ModelInfo)> {
    let mut spec = model.load_spec(service.settings()?)?;
    let adapters = model.adapter_dirs()?;
    if !adapters.is_empty() {
        // Served by name (`--adapter`, `--adapters-file`), even one: unmerged, so that adapters can be added
        // and removed live beside it (a merged adapter is part of the shared weights).
        spec.form = kev_decide::WeightForm::Exact;
    }
    let (kev, info) = kev_decide::load_cpu_adapters(&spec, adapters.get(1..).unwrap_or(&[]))
        .with_context(|| format!("loading {}", describe(&spec.source)))?;
    let kev = match adapters.first() {
        Some(first) => kev.with_default_names(&first.name, &[]),
        None => kev,
    };
    Ok((kev, info))
}

fn describe(source: &Source) -> String {
    match source {
        Source::Prepared(d) => d.display().to_string(),
        Source::Release { base, kev } => format!("{} + {}", base.display(), kev.display()),
    }
}
