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

/// The model names a server answers to and `/v1/models` lists, the default adapter's: `kev-latest`,
/// `jev-latest`, then the size from the base the head names (`kev-0.8b` on Qwen3.5-0.8B-Base; not for the
/// demo's random weights), then the aliases (empty and repeated ones skipped). `kev serve` and the Python
/// package's in-process server (`kev.Server`, under `kev.serve`) both name the model with it.
pub fn served_names(base: &str, demo: bool, aliases: &[String]) -> Vec<String> {
    let mut names = vec!["kev-latest".to_string(), "jev-latest".to_string()];
    if let Some(size) = kev_release::published::size_name(base)
        && !demo
    {
        names.push(size);
    }
    for a in aliases {
        if !a.is_empty() && !names.contains(a) {
            names.push(a.clone());
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::served_names;

    #[test]
    fn served_names_name_the_size() {
        let v = |x: &[&str]| x.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            served_names("Qwen/Qwen3.5-0.8B-Base", false, &[]),
            v(&["kev-latest", "jev-latest", "kev-0.8b"])
        );
        assert_eq!(
            served_names("Qwen/Qwen3.5-4B-Base", false, &v(&["kev-0.8b", "mine", ""])),
            v(&["kev-latest", "jev-latest", "kev-4b", "kev-0.8b", "mine"])
        );
        assert_eq!(
            served_names("Qwen/Qwen3.5-0.8B-Base", true, &[]),
            v(&["kev-latest", "jev-latest"])
        );
        assert_eq!(
            served_names("Qwen/Qwen3.5-9B-Base", false, &[]),
            v(&["kev-latest", "jev-latest", "kev-9b"])
        );
        assert_eq!(
            served_names("local/base", false, &v(&["kev-latest"])),
            v(&["kev-latest", "jev-latest"])
        );
    }
}
