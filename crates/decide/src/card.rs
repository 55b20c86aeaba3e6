//! What a service reports about the model it serves: the weight form, what was loaded ([`ModelInfo`]) and
//! the `/v1/models` card built from it and the settings in force.

use kev_engine::Arm;
use serde_json::{Value, json};

use crate::calibrate::Calibration;
use crate::settings::Settings;

/// How the LoRA reaches the weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightForm {
    /// One BF16 matrix per projection, `bf16(fp32(W) + (B@A)·s)`.
    Merged,
    /// The base weight plus the LoRA applied unmerged in fp32 at run time.
    Exact,
}

impl WeightForm {
    /// `merged` or `exact`.
    pub fn name(self) -> &'static str {
        match self {
            WeightForm::Merged => "merged",
            WeightForm::Exact => "exact",
        }
    }
}

impl std::str::FromStr for WeightForm {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "merged" => Ok(WeightForm::Merged),
            "exact" => Ok(WeightForm::Exact),
            o => Err(format!("unknown weight form `{o}` (merged, exact)")),
        }
    }
}

/// What was loaded, for logs, `/v1/models` and reports.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    /// `prepared DIR` or `release BASE + KEV`.
    pub source: String,
    /// `merged` / `exact`.
    pub form: WeightForm,
    /// The compute arm in force.
    pub arm: Arm,
    /// The backend's own description (ISA, arm).
    pub backend: String,
    /// The device the backend runs on (`cpu`, `cuda:0`).
    pub device: String,
    /// The base model the head names.
    pub base: String,
    /// Its revision.
    pub base_revision: String,
    /// LoRA rank as stored in the head metadata.
    pub lora: Value,
    /// Softmax temperature.
    pub temperature: f64,
    /// `YYYY-MM-DD`: the head file's modification date (no network is asked).
    pub release_date: String,
    /// Bytes of backbone weights held in memory (the base once, every adapter's LoRA beside it).
    pub weight_bytes: usize,
    /// Bytes of this adapter's own unmerged LoRA tensors among them (0 when merged).
    pub adapter_bytes: usize,
    /// sha256 of the adapter's `adapter_model.safetensors` (release sources; `None` for a prepared model).
    pub adapter_sha256: Option<String>,
    /// The bundled miniature (`kev serve --demo`): the card says so, and that its answers are for trying the
    /// API.
    pub demo: bool,
}

impl ModelInfo {
    /// The `/v1/models` card fields other than `name`: what was loaded, and the service options of `settings`
    /// that change answers (limits, calibration, date facts). The one card `kev serve`, `kev calibrate` and the
    /// Python package report (`Kev::card`).
    pub fn card(&self, settings: &Settings, calibration: Option<&Calibration>) -> Value {
        let mut card = json!({
            "description": format!(
                "Kev pointer head on {}, serving {} weights ({} compute) at temperature {:.2}",
                self.base, self.form.name(), self.arm.name(), self.temperature
            ),
            "release_date": self.release_date,
            "x_base": self.base,
            "x_base_revision": self.base_revision,
            "x_lora": self.lora,
            "x_device": self.device,
            "x_backend": self.backend,
            "x_precision": self.arm.name(),
            "x_weights": self.form.name(),
            "x_temperature": self.temperature,
            "x_weight_bytes": self.weight_bytes,
            "x_adapter_bytes": self.adapter_bytes,
            "x_adapter_sha256": self.adapter_sha256,
        });
        if let (Some(obj), Value::Object(rest)) =
            (card.as_object_mut(), Self::settings_card(settings))
        {
            for (k, v) in rest {
                obj.insert(k, v);
            }
            if self.demo {
                obj.insert(
                    "description".into(),
                    Value::String(
                        "kev demo: kev-mini, a miniature Kev (hidden 64, 4 layers, trained on synthetic support tickets, \
                         reviews, routing and JSON checks) in the real Kev formats; it is NOT Kev-4B: its answers are for \
                         trying the API"
                            .into(),
                    ),
                );
                obj.insert("x_demo".into(), Value::Bool(true));
                obj.insert("x_model".into(), Value::String("kev-mini".into()));
                obj.insert("x_miniature".into(), Value::Bool(true));
            }
            // The options that change answers come last, where `/v1/models` has always listed them.
            let calibration = calibration.map(Calibration::card);
            obj.insert("x_calibration".into(), calibration.unwrap_or(Value::Null));
            obj.insert("x_date_facts".into(), Value::Bool(settings.date_facts));
        }
        card
    }

    /// The card's fields that come from the settings alone (limits, cache, pass budget).
    pub(crate) fn settings_card(settings: &Settings) -> Value {
        json!({
            "x_max_state_tokens": settings.limits.max_state_tokens,
            "x_max_row_tokens": settings.limits.max_row_tokens,
            "x_truncate_states": settings.limits.truncate_state,
            "x_prefix_cache": {"bytes": settings.cache_bytes.unwrap_or(0), "chunk_aligned": settings.chunk_aligned},
            "x_pass_tokens": settings.pass_tokens,
        })
    }
}
