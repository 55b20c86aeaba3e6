//! The Kev LoRA adapter for the `exact` weight form (applied unmerged at run time as
//! `y = W·x + (B·(A·x))·s`, in f32, in PEFT's order) and for merging at load.
//!
//! Reading and checking the PEFT files is `kev_release::adapter`'s job (the same code `kev prepare` uses,
//! so what one accepts the other does): this module only regroups its modules by layer for the loader.

use std::collections::BTreeMap;
use std::path::Path;

use kev_release::adapter::Adapter;
use kev_release::shards::{Dtype, TensorStore, TensorView};

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
    /// Read the PEFT adapter in `dir` (`adapter_config.json` + `adapter_model.safetensors`) and map it onto
    /// the base checkpoint `base`, refusing what the merge cannot reproduce exactly (DoRA, rsLoRA,
    /// per-module ranks, bias training, unknown modules).
    pub fn from_release(dir: &Path, base: &TensorStore) -> Result<Self, EngineError> {
        let adapter = Adapter::load(dir, base).map_err(|e| EngineError::Adapter(e.to_string()))?;
        Self::from_adapter(&adapter)
    }

    /// Regroup an already loaded adapter by layer.
    pub fn from_adapter(adapter: &Adapter) -> Result<Self, EngineError> {
        let scale = adapter.scale();
        let mut modules = BTreeMap::new();
        for (path, w) in adapter.modules() {
            let bad = || {
                EngineError::Adapter(format!(
                    "adapted module {path} is not a projection of a decoder layer"
                ))
            };
            let tail = path.strip_prefix("layers.").ok_or_else(bad)?;
            let (idx, module) = tail.split_once('.').ok_or_else(bad)?;
            let layer: usize = idx.parse().map_err(|_| bad())?;
            if !TARGETS.contains(&module) {
                return Err(bad());
            }
            modules.insert(
                (layer, module.to_string()),
                LoraPair {
                    r: w.r,
                    k: w.in_features,
                    n: w.out_features,
                    a: w.a.clone(),
                    b: w.b.clone(),
                    scale,
                },
            );
        }
        Ok(LoraAdapter {
            modules,
            scale,
            r: adapter.r(),
        })
    }

    /// Take the pair of one module out of the set (the loader consumes them so leftovers can be reported).
    pub(crate) fn take(&mut self, layer: usize, module: &str) -> Option<LoraPair> {
        self.modules.remove(&(layer, module.to_string()))
    }
}

/// A BF16 or F32 tensor widened to f32.
pub fn to_f32(v: &TensorView<'_>) -> Result<Vec<f32>, EngineError> {
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
    fn the_fixture_adapter_regroups_by_layer() {
        let root = Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../fixtures/release"
        ));
        let base = TensorStore::open(&root.join("base")).unwrap();
        let a = LoraAdapter::from_release(&root.join("kev"), &base).unwrap();
        assert_eq!(a.r, 16);
        assert_eq!(a.scale, 2.0);
        assert!(
            a.modules
                .contains_key(&(0, "linear_attn.in_proj_qkv".to_string()))
        );
        assert!(a.modules.contains_key(&(3, "self_attn.q_proj".to_string())));
        let pair = &a.modules[&(0, "mlp.down_proj".to_string())];
        assert_eq!(pair.a.len(), pair.r * pair.k);
        assert_eq!(pair.b.len(), pair.n * pair.r);
    }
}
