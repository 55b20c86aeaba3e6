//! PEFT LoRA adapters: `adapter_config.json` + `adapter_model.safetensors`, mapped onto base tensors.
//!
//! PEFT stores the factors of module `<path>` as `base_model.model.<path>.lora_A.weight` (`[r, in]`)
//! and `…lora_B.weight` (`[out, r]`). `<path>` is relative to whatever model PEFT wrapped, so it may or
//! may not carry the `model.language_model.` / `model.` prefix the base checkpoint stores its tensors
//! under. [`Adapter::load`] picks the one prefix under which *every* adapted module exists in the base
//! store and fails, naming the modules, if there is none.
//!
//! Only plain LoRA merges exactly into `W + (B @ A) · alpha / r`. Every configuration that changes
//! that formula (DoRA, rsLoRA, per-module rank or alpha, trained biases, transposed weights, extra
//! trained modules, initialisations that rewrite the base, …) is refused with the field named.

use crate::FileError;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::shards::{Dtype, ShardError, TensorStore};

/// The modules of the Qwen3.5 text decoder the engine can apply an adapter to.
pub const KNOWN_TARGET_MODULES: [&str; 12] = [
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
    "in_proj_qkv",
    "in_proj_z",
    "in_proj_a",
    "in_proj_b",
    "out_proj",
];

const KEY_PREFIX: &str = "base_model.model.";

/// Errors while reading or mapping an adapter.
#[derive(Debug, thiserror::Error)]
pub enum AdapterError {
    /// A file could not be read or written, or holds what it must not.
    #[error(transparent)]
    File(#[from] crate::FileError),
    /// The configuration asks for something the exact merge cannot do.
    #[error("adapter_config.json: {field} = {value} is not supported: {why}")]
    Unsupported {
        /// The field.
        field: String,
        /// Its value, as JSON.
        value: String,
        /// Why it cannot be merged exactly.
        why: String,
    },
    /// The weights file is unreadable.
    #[error(transparent)]
    Shards(#[from] ShardError),
    /// A key in the weights file is not a LoRA factor of a known module.
    #[error("adapter_model.safetensors: unexpected tensor {key}: {why}")]
    UnexpectedKey {
        /// The key.
        key: String,
        /// Why it is refused.
        why: String,
    },
    /// A module has only one of its two factors.
    #[error("adapter_model.safetensors: {module} has lora_{present} but no lora_{missing}")]
    HalfPair {
        /// Module path.
        module: String,
        /// Factor found.
        present: char,
        /// Factor missing.
        missing: char,
    },
    /// A factor has the wrong shape or dtype.
    #[error("adapter_model.safetensors: {key}: {why}")]
    Factor {
        /// The key.
        key: String,
        /// What is wrong.
        why: String,
    },
    /// Some adapted modules have no base weight under any prefix.
    #[error(
        "the base checkpoint lacks adapted module(s) under every prefix (model.language_model., model., none): {}",
        .missing.join(", ")
    )]
    MissingModules {
        /// Module paths (as in the adapter) missing from the base under the best prefix.
        missing: Vec<String>,
    },
    /// The adapter holds no LoRA factors at all.
    #[error("adapter_model.safetensors holds no lora_A/lora_B tensors")]
    Empty,
}

/// The fields of `adapter_config.json` the merge reads; every other field is checked by
/// [`AdapterConfig::check_supported`] on the raw JSON.
#[derive(Debug, Clone, Deserialize)]
pub struct AdapterConfig {
    /// `LORA`.
    #[serde(default)]
    pub peft_type: Option<String>,
    /// Rank.
    pub r: u64,
    /// Alpha (an integer in PEFT, accepted as any number).
    pub lora_alpha: f64,
    /// Targets: a list of module names, or a regex string / `all-linear`.
    #[serde(default)]
    pub target_modules: Option<serde_json::Value>,
    /// The base model PEFT recorded, if any.
    #[serde(default)]
    pub base_model_name_or_path: Option<String>,
    /// The base revision PEFT recorded, if any.
    #[serde(default)]
    pub revision: Option<String>,
}

/// Fields that may hold any value: bookkeeping, training-time settings, or selectors whose effect is
/// fully visible in which tensors the weights file contains.
const HARMLESS_FIELDS: [&str; 27] = [
    "peft_type",
    "r",
    "lora_alpha",
    "target_modules",
    "base_model_name_or_path",
    "revision",
    "task_type",
    "inference_mode",
    "auto_mapping",
    "peft_version",
    "lora_dropout",
    "exclude_modules",
    "layers_to_transform",
    "layers_pattern",
    "megatron_config",
    "megatron_core",
    "loftq_config",
    "eva_config",
    "corda_config",
    "lora_ga_config",
    "runtime_config",
    "qalora_group_size",
    "ensure_weight_tying",
    "ephemeral_gpu_offload",
    "init_lora_weights",
    "use_qalora",
    "target_parameters",
];

/// Settings whose non-default value changes W' = W + (B @ A)·alpha/r, with why each is refused.
const MERGE_CHANGING_SETTINGS: [(&str, &str); 14] = [
    (
        "use_dora",
        "DoRA rescales the merged weight by a learned magnitude",
    ),
    ("use_rslora", "rsLoRA scales by alpha/sqrt(r), not alpha/r"),
    ("rank_pattern", "per-module ranks are not supported"),
    ("alpha_pattern", "per-module alphas are not supported"),
    (
        "modules_to_save",
        "fully trained extra modules are not supported",
    ),
    (
        "fan_in_fan_out",
        "transposed (Conv1D-style) weights are not supported",
    ),
    ("lora_bias", "trained LoRA biases are not supported"),
    (
        "layer_replication",
        "replicated layers change the model's structure",
    ),
    (
        "trainable_token_indices",
        "trained token embeddings are not supported",
    ),
    (
        "alora_invocation_tokens",
        "activated LoRA is not a static merge",
    ),
    ("use_bdlora", "block-diagonal LoRA is not supported"),
    ("arrow_config", "Arrow routing is not a static merge"),
    ("velora_config", "VeLoRA is not supported"),
    ("monteclora_config", "MonteCLoRA is not supported"),
];

/// A refusal of `field = value`.
fn unsupported(field: &str, value: &serde_json::Value, why: &str) -> AdapterError {
    AdapterError::Unsupported {
        field: field.to_string(),
        value: value.to_string(),
        why: why.to_string(),
    }
}

/// Whether a setting holds its off value (null, false, empty), which asks for nothing.
fn is_unset(v: &serde_json::Value) -> bool {
    use serde_json::Value;
    match v {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        Value::String(s) => s.is_empty(),
        Value::Number(_) => false,
    }
}

impl AdapterConfig {
    /// Parse and check `adapter_config.json`.
    pub fn from_file(path: &Path) -> Result<Self, AdapterError> {
        let text = std::fs::read_to_string(path).map_err(|source| FileError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_json(&text).map_err(|e| match e {
            AdapterError::File(FileError::Format { message, .. }) => FileError::Format {
                path: path.to_path_buf(),
                message,
            }
            .into(),
            other => other,
        })
    }

    /// Parse and check the text of `adapter_config.json`.
    pub fn from_json(text: &str) -> Result<Self, AdapterError> {
        let config_err = |message: String| -> AdapterError {
            FileError::Format {
                path: PathBuf::from("adapter_config.json"),
                message,
            }
            .into()
        };
        let raw: serde_json::Value =
            serde_json::from_str(text).map_err(|e| config_err(e.to_string()))?;
        let obj = raw
            .as_object()
            .ok_or_else(|| config_err("not a JSON object".into()))?;
        Self::check_supported(obj)?;
        let cfg: AdapterConfig =
            serde_json::from_value(raw.clone()).map_err(|e| config_err(e.to_string()))?;
        if cfg.r == 0 {
            return Err(config_err("r must be at least 1".into()));
        }
        if !cfg.lora_alpha.is_finite() {
            return Err(config_err("lora_alpha must be a finite number".into()));
        }
        if let Some(serde_json::Value::Array(list)) = &cfg.target_modules {
            for m in list {
                let name = m.as_str().unwrap_or_default();
                if !KNOWN_TARGET_MODULES.contains(&name) {
                    return Err(AdapterError::Unsupported {
                        field: "target_modules".into(),
                        value: m.to_string(),
                        why: format!("the engine knows only {}", KNOWN_TARGET_MODULES.join(", ")),
                    });
                }
            }
        }
        Ok(cfg)
    }

    /// Refuse every setting that changes the merge formula or the model's structure.
    pub fn check_supported(
        obj: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<(), AdapterError> {
        if let Some(v) = obj.get("peft_type")
            && v.as_str() != Some("LORA")
        {
            return Err(unsupported(
                "peft_type",
                v,
                "only LORA adapters can be merged",
            ));
        }
        for (field, why) in MERGE_CHANGING_SETTINGS {
            if let Some(v) = obj.get(field)
                && !is_unset(v)
            {
                return Err(unsupported(field, v, why));
            }
        }
        if let Some(v) = obj.get("kasa_config")
            && !is_unset(v)
        {
            return Err(unsupported("kasa_config", v, "KaSA is not supported"));
        }
        if let Some(v) = obj.get("bias")
            && !v.is_null()
            && v.as_str() != Some("none")
        {
            return Err(unsupported("bias", v, "trained biases are not supported"));
        }
        if let Some(v) = obj.get("init_lora_weights")
            && let Some(s) = v.as_str()
        {
            let lower = s.to_ascii_lowercase();
            let rewrites_base = ["pissa", "olora", "corda", "loftq", "lora_ga", "lora-ga"]
                .iter()
                .any(|p| lower.starts_with(p));
            if rewrites_base {
                return Err(unsupported(
                    "init_lora_weights",
                    v,
                    "this initialisation rewrites the base weights; convert the adapter to plain LoRA first",
                ));
            }
        }
        if let Some(v) = obj.get("use_qalora")
            && v.as_bool() == Some(true)
        {
            return Err(unsupported(
                "use_qalora",
                v,
                "quantization-aware LoRA is not supported",
            ));
        }
        if let Some(v) = obj.get("target_parameters")
            && !is_unset(v)
        {
            return Err(unsupported(
                "target_parameters",
                v,
                "LoRA on raw parameters is not supported",
            ));
        }
        for (k, v) in obj {
            if HARMLESS_FIELDS.contains(&k.as_str())
                || MERGE_CHANGING_SETTINGS.iter().any(|(f, _)| f == k)
                || k == "bias"
                || k == "kasa_config"
                || is_unset(v)
            {
                continue;
            }
            return Err(unsupported(
                k,
                v,
                "unknown setting; this kev cannot tell whether it changes the merge",
            ));
        }
        Ok(())
    }

    /// `lora_alpha / r` in float64, as PEFT computes `scaling`.
    pub fn scaling(&self) -> f64 {
        self.lora_alpha / self.r as f64
    }
}

/// The two factors of one adapted module, as float32.
#[derive(Debug, Clone)]
pub struct LoraWeights {
    /// Rank.
    pub r: usize,
    /// Input features (columns of the base weight).
    pub in_features: usize,
    /// Output features (rows of the base weight).
    pub out_features: usize,
    /// `A`, `[r, in]` row-major.
    pub a: Vec<f32>,
    /// `B`, `[out, r]` row-major.
    pub b: Vec<f32>,
}

/// A LoRA adapter mapped onto a base checkpoint.
#[derive(Debug, Clone)]
pub struct Adapter {
    config: AdapterConfig,
    scale: f32,
    /// The prefix put in front of adapter module paths to reach base tensor names.
    base_prefix: &'static str,
    /// The prefix of the text decoder in the base store.
    text_prefix: &'static str,
    /// Keyed by module path relative to the text decoder (`layers.0.mlp.up_proj`).
    modules: BTreeMap<String, LoraWeights>,
}

impl Adapter {
    /// Load `adapter_config.json` and `adapter_model.safetensors` from `dir` and map them onto `base`.
    pub fn load(dir: &Path, base: &TensorStore) -> Result<Self, AdapterError> {
        Self::load_files(
            &dir.join("adapter_config.json"),
            &dir.join("adapter_model.safetensors"),
            base,
        )
    }

    /// As [`Adapter::load`] with explicit file paths.
    pub fn load_files(
        config: &Path,
        weights: &Path,
        base: &TensorStore,
    ) -> Result<Self, AdapterError> {
        let config = AdapterConfig::from_file(config)?;
        let dir = weights.parent().unwrap_or(Path::new("."));
        let store = TensorStore::open_files(dir, &[weights.to_path_buf()])?;
        Self::from_parts(config, &store, base)
    }

    /// Map already-read parts onto `base`.
    pub fn from_parts(
        config: AdapterConfig,
        weights: &TensorStore,
        base: &TensorStore,
    ) -> Result<Self, AdapterError> {
        let r = usize::try_from(config.r).map_err(|_| FileError::Format {
            path: PathBuf::from("adapter_config.json"),
            message: "r too large".into(),
        })?;
        let pairs = pair_factor_keys(weights)?;
        let base_prefix = choose_base_prefix(&pairs, base)?;
        let text_prefix = base.text_prefix()?;

        let mut modules = BTreeMap::new();
        for (module, (a_key, b_key)) in &pairs {
            let (Some(a_key), Some(b_key)) = (a_key, b_key) else {
                continue;
            };
            let full = format!("{base_prefix}{module}");
            let rel =
                full.strip_prefix(text_prefix)
                    .ok_or_else(|| AdapterError::UnexpectedKey {
                        key: a_key.clone(),
                        why: format!("{full} is outside the text decoder ({text_prefix}*)"),
                    })?;
            let w = base.get(&format!("{full}.weight"))?;
            let [out_f, in_f] = *w.shape else {
                return Err(AdapterError::Factor {
                    key: a_key.clone(),
                    why: format!("base weight {full}.weight is not 2-D: {:?}", w.shape),
                });
            };
            let base_w = (format!("{full}.weight"), [out_f, in_f]);
            let a = read_factor(weights, a_key, [r, in_f], &base_w)?;
            let b = read_factor(weights, b_key, [out_f, r], &base_w)?;
            modules.insert(
                rel.to_string(),
                LoraWeights {
                    r,
                    in_features: in_f,
                    out_features: out_f,
                    a,
                    b,
                },
            );
        }
        // PEFT's scaling is a Python float; torch multiplies a float32 tensor by it in float32.
        let scale = config.scaling() as f32;
        Ok(Adapter {
            config,
            scale,
            base_prefix,
            text_prefix,
            modules,
        })
    }

    /// The parsed configuration.
    pub fn config(&self) -> &AdapterConfig {
        &self.config
    }

    /// `lora_alpha / r` as the float32 factor the merge applies.
    pub fn scale(&self) -> f32 {
        self.scale
    }

    /// Rank.
    pub fn r(&self) -> usize {
        self.config.r as usize
    }

    /// Number of adapted modules.
    pub fn len(&self) -> usize {
        self.modules.len()
    }

    /// True when no module is adapted (never, for a loaded adapter).
    pub fn is_empty(&self) -> bool {
        self.modules.is_empty()
    }

    /// The factors for a module path relative to the text decoder (`layers.0.linear_attn.in_proj_qkv`).
    pub fn module(&self, path: &str) -> Option<&LoraWeights> {
        self.modules.get(path)
    }

    /// The factors for a full stored base tensor name (`model.language_model.layers.0.mlp.up_proj.weight`).
    pub fn for_tensor(&self, name: &str) -> Option<&LoraWeights> {
        let rel = name
            .strip_prefix(self.text_prefix)?
            .strip_suffix(".weight")?;
        self.modules.get(rel)
    }

    /// Every adapted module: (path relative to the text decoder, factors), sorted by path.
    pub fn modules(&self) -> impl Iterator<Item = (&str, &LoraWeights)> {
        self.modules.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// The stored base tensor name of a module path relative to the text decoder.
    pub fn base_tensor_name(&self, path: &str) -> String {
        format!("{}{path}.weight", self.text_prefix)
    }

    /// The prefix that was put in front of the adapter's module paths to find them in the base.
    pub fn base_prefix(&self) -> &'static str {
        self.base_prefix
    }
}

/// The `lora_A` and `lora_B` keys of each adapted module, keyed by module path as the adapter spells it.
type FactorKeys = BTreeMap<String, (Option<String>, Option<String>)>;

/// Gather the weights file's keys into A/B pairs by module path, refusing any key that is not a
/// LoRA factor of a known module, an empty file, and a module with only one of its two factors.
fn pair_factor_keys(weights: &TensorStore) -> Result<FactorKeys, AdapterError> {
    let mut pairs = FactorKeys::new();
    for key in weights.names() {
        let Some(rest) = key.strip_prefix(KEY_PREFIX) else {
            return Err(AdapterError::UnexpectedKey {
                key: key.to_string(),
                why: format!("PEFT keys start with {KEY_PREFIX}"),
            });
        };
        let (module, which) = if let Some(m) = rest.strip_suffix(".lora_A.weight") {
            (m, 'A')
        } else if let Some(m) = rest.strip_suffix(".lora_B.weight") {
            (m, 'B')
        } else {
            let why = if rest.contains("lora_magnitude_vector") {
                "DoRA magnitudes are not supported"
            } else if rest.contains("lora_embedding") {
                "LoRA on embeddings is not supported"
            } else if rest.ends_with(".bias") {
                "trained biases are not supported"
            } else {
                "not a lora_A/lora_B weight"
            };
            return Err(AdapterError::UnexpectedKey {
                key: key.to_string(),
                why: why.to_string(),
            });
        };
        let leaf = module.rsplit('.').next().unwrap_or(module);
        if !KNOWN_TARGET_MODULES.contains(&leaf) {
            return Err(AdapterError::UnexpectedKey {
                key: key.to_string(),
                why: format!(
                    "module {leaf} is not one the engine knows ({})",
                    KNOWN_TARGET_MODULES.join(", ")
                ),
            });
        }
        let slot = pairs.entry(module.to_string()).or_default();
        if which == 'A' {
            slot.0 = Some(key.to_string());
        } else {
            slot.1 = Some(key.to_string());
        }
    }
    if pairs.is_empty() {
        return Err(AdapterError::Empty);
    }
    for (module, (a, b)) in &pairs {
        if a.is_none() || b.is_none() {
            return Err(AdapterError::HalfPair {
                module: module.clone(),
                present: if a.is_some() { 'A' } else { 'B' },
                missing: if a.is_some() { 'B' } else { 'A' },
            });
        }
    }
    Ok(pairs)
}

/// The one prefix under which every module exists in `base`; failing that, the best candidate's gaps.
fn choose_base_prefix(
    pairs: &FactorKeys,
    base: &TensorStore,
) -> Result<&'static str, AdapterError> {
    const PREFIXES: [&str; 3] = ["model.language_model.", "model.", ""];
    let mut best: Option<Vec<String>> = None;
    for p in PREFIXES {
        let missing: Vec<String> = pairs
            .keys()
            .filter(|m| !base.contains(&format!("{p}{m}.weight")))
            .cloned()
            .collect();
        if missing.is_empty() {
            return Ok(p);
        }
        if best.as_ref().is_none_or(|b| missing.len() < b.len()) {
            best = Some(missing);
        }
    }
    Err(AdapterError::MissingModules {
        missing: best.unwrap_or_default(),
    })
}

/// One LoRA factor of the base weight `base` (its stored name and shape), which fixes the factor's shape:
/// a factor of another shape (an adapter made for another base, a Kev-9B adapter on the 4B base) is refused
/// naming both tensors and both shapes.
fn read_factor(
    weights: &TensorStore,
    key: &str,
    shape: [usize; 2],
    (base_name, base_shape): &(String, [usize; 2]),
) -> Result<Vec<f32>, AdapterError> {
    let t = weights.get(key)?;
    if t.shape != shape {
        return Err(AdapterError::Factor {
            key: key.to_string(),
            why: format!(
                "shape {:?}, but the base's {base_name} is {base_shape:?}, which needs {shape:?}: \
                 the adapter was made for another base",
                t.shape
            ),
        });
    }
    let n = shape[0] * shape[1];
    let out: Vec<f32> = match t.dtype {
        Dtype::F32 if t.data.len() == n * 4 => t
            .data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        Dtype::BF16 if t.data.len() == n * 2 => t
            .data
            .chunks_exact(2)
            .map(|c| half::bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
            .collect(),
        Dtype::F16 if t.data.len() == n * 2 => t
            .data
            .chunks_exact(2)
            .map(|c| half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
            .collect(),
        other => {
            return Err(AdapterError::Factor {
                key: key.to_string(),
                why: format!(
                    "dtype {} with {} bytes (F32, BF16 or F16 expected)",
                    other.name(),
                    t.data.len()
                ),
            });
        }
    };
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(extra: &str) -> String {
        format!(
            r#"{{"peft_type": "LORA", "r": 16, "lora_alpha": 32, "target_modules": ["q_proj", "in_proj_qkv"],
               "bias": "none", "use_dora": false, "use_rslora": false, "rank_pattern": {{}}, "alpha_pattern": {{}},
               "modules_to_save": null, "fan_in_fan_out": false, "lora_dropout": 0.05, "task_type": "CAUSAL_LM",
               "megatron_core": "megatron.core", "qalora_group_size": 16, "init_lora_weights": true{extra}}}"#
        )
    }

    #[test]
    fn plain_lora_is_accepted() {
        let c = AdapterConfig::from_json(&cfg("")).unwrap();
        assert_eq!(c.r, 16);
        assert_eq!(c.scaling(), 2.0);
    }

    #[test]
    fn unsupported_settings_are_refused_by_name() {
        for (extra, field) in [
            (r#", "use_dora": true"#, "use_dora"),
            (r#", "use_rslora": true"#, "use_rslora"),
            (r#", "rank_pattern": {"q_proj": 8}"#, "rank_pattern"),
            (r#", "alpha_pattern": {"q_proj": 8}"#, "alpha_pattern"),
            (r#", "bias": "lora_only""#, "bias"),
            (r#", "modules_to_save": ["lm_head"]"#, "modules_to_save"),
            (r#", "fan_in_fan_out": true"#, "fan_in_fan_out"),
            (
                r#", "init_lora_weights": "pissa_niter_4""#,
                "init_lora_weights",
            ),
            (r#", "something_new": 3"#, "something_new"),
        ] {
            // later duplicate keys win in serde_json's map, so the extra overrides the default
            let err = AdapterConfig::from_json(&cfg(extra)).unwrap_err();
            match &err {
                AdapterError::Unsupported { field: f, .. } => assert_eq!(f, field, "{err}"),
                other => panic!("{extra}: {other}"),
            }
            assert!(err.to_string().contains(field), "{err}");
        }
        let err = AdapterConfig::from_json(
            r#"{"peft_type": "LORA", "r": 16, "lora_alpha": 32, "target_modules": ["q_proj", "lm_head"]}"#,
        )
        .unwrap_err();
        assert!(err.to_string().contains("lm_head"), "{err}");
    }
}
