//! The Kev LoRA adapter, read for the `exact` weight form: PEFT's `adapter_config.json` and
//! `adapter_model.safetensors` (keys `base_model.model.<module path>.lora_{A,B}.weight`, `A [r, in]`,
//! `B [out, r]`), applied unmerged at run time as `y = W·x + (B·(A·x))·s` with `s = lora_alpha / r`
//! (`lora_alpha / √r` under rsLoRA), in f32, in PEFT's order.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kev_release::shards::{Dtype, TensorStore, TensorView};
use serde_json::Value;

use crate::error::EngineError;

/// The modules a LoRA may target, as `<block>.<name>` under `layers.{i}.`.
pub const TARGETS: [&str; 12] = [
    "linear_attn.in_proj_qkv",
    "linear_attn.in_proj_z",
    "linear_attn.in_proj_b",
    "linear_attn.in_proj_a",
    "linear_attn.out_proj",
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
];

/// One module's low-rank update, f32.
#[derive(Debug, Clone)]
pub struct LoraPair {
    /// Rank.
    pub r: usize,
    /// Input width.
    pub k: usize,
    /// Output width.
    pub n: usize,
    /// `A [r, k]`, row-major.
    pub a: Vec<f32>,
    /// `B [n, r]`, row-major.
    pub b: Vec<f32>,
    /// Scale `s`.
    pub scale: f32,
}

/// Every module's update, keyed by `(layer, module)` with module one of [`TARGETS`].
#[derive(Debug, Clone, Default)]
pub struct LoraAdapter {
    /// The updates.
    pub modules: BTreeMap<(usize, String), LoraPair>,
    /// `lora_alpha / r` (or `/ √r`).
    pub scale: f32,
    /// Rank.
    pub r: usize,
}

impl LoraAdapter {
    /// Read `adapter_config.json` + `adapter_model.safetensors` from a directory.
    pub fn from_dir(dir: &Path) -> Result<Self, EngineError> {
        let cfg_path = dir.join("adapter_config.json");
        let text = std::fs::read_to_string(&cfg_path).map_err(|source| EngineError::Io {
            path: cfg_path.clone(),
            source,
        })?;
        let cfg: Value = serde_json::from_str(&text).map_err(|e| EngineError::Parse {
            path: cfg_path.clone(),
            reason: e.to_string(),
        })?;
        let scale_r = parse_config(&cfg, &cfg_path)?;
        let file: PathBuf = dir.join("adapter_model.safetensors");
        let store = TensorStore::open_files(dir, &[file])?;
        Self::from_store(&store, scale_r.0, scale_r.1)
    }

    /// Read the pairs from an opened store, with scale and rank from the config.
    pub fn from_store(store: &TensorStore, scale: f32, r: usize) -> Result<Self, EngineError> {
        let mut halves: BTreeMap<
            (usize, String),
            (Option<TensorView<'_>>, Option<TensorView<'_>>),
        > = BTreeMap::new();
        for name in store.names() {
            let (layer, module, which) = parse_key(name)?;
            let slot = halves.entry((layer, module)).or_default();
            let view = store.get(name)?;
            if which == 'A' {
                slot.0 = Some(view);
            } else {
                slot.1 = Some(view);
            }
        }
        let mut modules = BTreeMap::new();
        for ((layer, module), (a, b)) in halves {
            let (Some(a), Some(b)) = (a, b) else {
                return Err(EngineError::Adapter(format!(
                    "layers.{layer}.{module}: lora_A and lora_B must both be present"
                )));
            };
            if a.shape.len() != 2 || b.shape.len() != 2 || a.shape[0] != r || b.shape[1] != r {
                return Err(EngineError::tensor(
                    a.name,
                    format!(
                        "LoRA shapes A {:?} / B {:?} do not match rank {r} (A [r, in], B [out, r])",
                        a.shape, b.shape
                    ),
                ));
            }
            let pair = LoraPair {
                r,
                k: a.shape[1],
                n: b.shape[0],
                a: to_f32(&a)?,
                b: to_f32(&b)?,
                scale,
            };
            modules.insert((layer, module), pair);
        }
        if modules.is_empty() {
            return Err(EngineError::Adapter(
                "no lora_A/lora_B tensors found".into(),
            ));
        }
        Ok(LoraAdapter { modules, scale, r })
    }

    /// Take the pair of one module out of the set (the loader consumes them so leftovers can be reported).
    pub(crate) fn take(&mut self, layer: usize, module: &str) -> Option<LoraPair> {
        self.modules.remove(&(layer, module.to_string()))
    }
}

/// `(scale, r)` from `adapter_config.json`, refusing what the engine does not implement.
fn parse_config(cfg: &Value, path: &Path) -> Result<(f32, usize), EngineError> {
    let bad = |field: &str, why: String| {
        EngineError::Adapter(format!("{}: `{field}` {why}", path.display()))
    };
    let r = cfg
        .get("r")
        .and_then(Value::as_u64)
        .filter(|r| *r > 0)
        .ok_or_else(|| bad("r", "must be a positive integer".into()))? as usize;
    let alpha = cfg
        .get("lora_alpha")
        .and_then(Value::as_f64)
        .ok_or_else(|| bad("lora_alpha", "must be a number".into()))?;
    for flag in ["use_dora", "fan_in_fan_out"] {
        if cfg.get(flag).and_then(Value::as_bool).unwrap_or(false) {
            return Err(bad(flag, "is not supported".into()));
        }
    }
    if let Some(bias) = cfg.get("bias").and_then(Value::as_str)
        && bias != "none"
    {
        return Err(bad(
            "bias",
            format!("`{bias}` is not supported (only none)"),
        ));
    }
    for pat in ["rank_pattern", "alpha_pattern"] {
        if cfg
            .get(pat)
            .and_then(Value::as_object)
            .is_some_and(|m| !m.is_empty())
        {
            return Err(bad(
                pat,
                "is not supported (one rank and alpha for all modules)".into(),
            ));
        }
    }
    let rslora = cfg
        .get("use_rslora")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    // PEFT computes the scale in Python floats and multiplies the f32 tensor by it.
    let scale = if rslora {
        alpha / (r as f64).sqrt()
    } else {
        alpha / r as f64
    };
    Ok((scale as f32, r))
}

/// `base_model.model.<prefix>layers.<i>.<block>.<name>.lora_<A|B>.weight` → `(i, "<block>.<name>", A|B)`.
fn parse_key(name: &str) -> Result<(usize, String, char), EngineError> {
    let bad = || {
        EngineError::Adapter(format!(
            "unexpected tensor {name} (not a LoRA weight of a known module)"
        ))
    };
    let rest = name.strip_prefix("base_model.model.").ok_or_else(bad)?;
    let (path, which) = if let Some(p) = rest.strip_suffix(".lora_A.weight") {
        (p, 'A')
    } else if let Some(p) = rest.strip_suffix(".lora_B.weight") {
        (p, 'B')
    } else {
        return Err(bad());
    };
    let at = path.find("layers.").ok_or_else(bad)?;
    let prefix = &path[..at];
    if !["", "model.", "model.language_model."].contains(&prefix) {
        return Err(bad());
    }
    let tail = &path[at + "layers.".len()..];
    let (idx, module) = tail.split_once('.').ok_or_else(bad)?;
    let layer: usize = idx.parse().map_err(|_| bad())?;
    if !TARGETS.contains(&module) {
        return Err(bad());
    }
    Ok((layer, module.to_string(), which))
}

/// A BF16 or F32 tensor widened to f32.
pub(crate) fn to_f32(v: &TensorView<'_>) -> Result<Vec<f32>, EngineError> {
    if let Some(size) = v.dtype.size()
        && v.data.len() != v.numel() * size
    {
        return Err(EngineError::tensor(
            v.name,
            format!(
                "holds {} bytes, its shape needs {}",
                v.data.len(),
                v.numel() * size
            ),
        ));
    }
    match v.dtype {
        Dtype::F32 => Ok(v
            .data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()),
        Dtype::BF16 => Ok(v
            .data
            .chunks_exact(2)
            .map(|b| f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16))
            .collect()),
        other => Err(EngineError::tensor(
            v.name,
            format!("dtype {} is not supported (BF16 or F32)", other.name()),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_config() {
        let (l, m, w) = parse_key(
            "base_model.model.model.language_model.layers.3.self_attn.q_proj.lora_B.weight",
        )
        .unwrap();
        assert_eq!((l, m.as_str(), w), (3, "self_attn.q_proj", 'B'));
        let (l, m, w) =
            parse_key("base_model.model.model.layers.10.mlp.down_proj.lora_A.weight").unwrap();
        assert_eq!((l, m.as_str(), w), (10, "mlp.down_proj", 'A'));
        assert!(parse_key("base_model.model.model.layers.1.mlp.fc1.lora_A.weight").is_err());
        assert!(parse_key("base_model.model.lm_head.lora_A.weight").is_err());
        let p = Path::new("adapter_config.json");
        let cfg = serde_json::json!({"r": 16, "lora_alpha": 32, "bias": "none"});
        assert_eq!(parse_config(&cfg, p).unwrap(), (2.0, 16));
        let cfg = serde_json::json!({"r": 16, "lora_alpha": 32, "use_rslora": true});
        assert_eq!(parse_config(&cfg, p).unwrap(), (8.0, 16));
        let cfg = serde_json::json!({"r": 16, "lora_alpha": 32, "use_dora": true});
        assert!(
            parse_config(&cfg, p)
                .unwrap_err()
                .to_string()
                .contains("use_dora")
        );
    }
}
