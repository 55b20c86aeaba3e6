//! The streaming export: base shards in, merged shards out, one tensor in memory at a time.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};

use indicatif::ProgressBar;
use kev_release::Adapter;
use kev_release::merge::merge_weight;
use kev_release::shards::TensorView;
use kev_release::stream::{PlannedTensor, SafetensorsFile, SafetensorsWriter};

use crate::PrepareError;

/// Which base tensors leave the export.
#[derive(Debug, Clone, Copy, Default)]
pub struct ExtrasPolicy {
    /// Keep `model.visual.*` (the vision tower).
    pub keep_visual: bool,
    /// Keep `mtp.*` (the multi-token-prediction head).
    pub keep_mtp: bool,
    /// Keep `lm_head.weight`, which an untied base (Qwen3.5-9B) carries and a decision model never reads
    /// (2 GB of the 9B in BF16); the tied 0.8B and 4B have none.
    pub keep_lm_head: bool,
}

/// The LM head an untied base stores (top-level name, as transformers saves it).
pub const LM_HEAD: &str = "lm_head.weight";

impl ExtrasPolicy {
    /// Whether a base tensor is left out.
    pub fn drops(&self, name: &str) -> bool {
        (name.starts_with("model.visual.") && !self.keep_visual)
            || (name.starts_with("mtp.") && !self.keep_mtp)
            || (name == LM_HEAD && !self.keep_lm_head)
    }
}

/// One written shard.
#[derive(Debug, Clone)]
pub struct ShardOut {
    /// File name inside the output directory.
    pub name: String,
    /// Bytes.
    pub size: u64,
    /// sha256.
    pub sha256: String,
    /// Tensor names it holds.
    pub tensors: Vec<String>,
}

/// What the export did.
#[derive(Debug, Clone)]
pub struct ExportResult {
    /// Shards written, in order.
    pub shards: Vec<ShardOut>,
    /// Adapted modules merged.
    pub merged: usize,
    /// Tensors copied bit for bit.
    pub copied: usize,
    /// Tensors left out.
    pub dropped: Vec<String>,
    /// Sum of tensor payload bytes (the index's `total_size`).
    pub total_size: u64,
}

/// Merge `adapter` into the base shards (in order) and write the result into `out`.
pub fn export_shards(
    shards: &[(String, PathBuf)],
    adapter: &Adapter,
    policy: ExtrasPolicy,
    out: &Path,
    bar: &ProgressBar,
) -> Result<ExportResult, PrepareError> {
    let files: Vec<(String, SafetensorsFile)> = shards
        .iter()
        .map(|(name, path)| Ok((name.clone(), SafetensorsFile::open(path)?)))
        .collect::<Result<_, PrepareError>>()?;

    // Plan every output shard first: which tensors, under which file name.
    let mut dropped = Vec::new();
    let mut plans: Vec<(usize, Vec<PlannedTensor>)> = Vec::new();
    for (i, (_, f)) in files.iter().enumerate() {
        let mut plan = Vec::new();
        for t in f.tensors() {
            if policy.drops(&t.name) {
                dropped.push(t.name.clone());
                continue;
            }
            let dtype = if adapter.for_tensor(&t.name).is_some() {
                safetensors::Dtype::BF16
            } else {
                t.st_dtype
            };
            plan.push(PlannedTensor {
                name: t.name.clone(),
                dtype,
                shape: t.shape.clone(),
            });
        }
        if !plan.is_empty() {
            plans.push((i, plan));
        }
    }
    dropped.sort();
    // Keep the base's shard names unless dropping emptied a shard; then number the rest anew.
    let renumber = plans.len() != files.len();
    let total_bytes: u64 = plans
        .iter()
        .flat_map(|(_, p)| p.iter())
        .map(|t| t.shape.iter().product::<usize>() as u64 * (t.dtype.bitsize() as u64 / 8))
        .sum();
    bar.set_length(total_bytes);

    let mut result = ExportResult {
        shards: Vec::new(),
        merged: 0,
        copied: 0,
        dropped,
        total_size: total_bytes,
    };
    let n_out = plans.len();
    for (k, (i, plan)) in plans.into_iter().enumerate() {
        let (in_name, src) = &files[i];
        let name = if renumber {
            format!("model.safetensors-{:05}-of-{:05}.safetensors", k + 1, n_out)
        } else {
            in_name.clone()
        };
        let metadata: HashMap<String, String> = src
            .metadata()
            .cloned()
            .unwrap_or_else(|| [("format".to_string(), "pt".to_string())].into());
        let path = out.join(&name);
        let mut writer = SafetensorsWriter::create(&path, plan, Some(metadata))?;
        let order: Vec<String> = writer.order().map(str::to_string).collect();
        for tname in &order {
            let Some(t) = src.tensor(tname) else {
                return Err(PrepareError::Internal(format!(
                    "{tname} vanished from {in_name}"
                )));
            };
            if let Some(lora) = adapter.for_tensor(tname) {
                let bytes = src.read(t)?;
                let view = TensorView {
                    name: tname,
                    dtype: t.dtype(),
                    shape: &t.shape,
                    data: &bytes,
                };
                let merged = merge_weight(&view, lora, adapter.scale())?;
                drop(bytes);
                writer.write_tensor(tname, bytemuck::cast_slice(&merged))?;
                bar.inc(merged.len() as u64 * 2);
                result.merged += 1;
            } else {
                writer.write_with(tname, |w| {
                    let mut sink = ProgressWriter { bar, inner: w };
                    src.copy_to(t, &mut sink).map_err(|e| e.to_string())
                })?;
                result.copied += 1;
            }
        }
        let written = writer.finish()?;
        result.shards.push(ShardOut {
            name,
            size: written.size,
            sha256: written.sha256,
            tensors: order,
        });
    }
    if result.merged != adapter.len() {
        return Err(PrepareError::Internal(format!(
            "merged {} modules but the adapter has {}",
            result.merged,
            adapter.len()
        )));
    }
    Ok(result)
}

/// Counts copied bytes on the progress bar on their way into the shard writer.
struct ProgressWriter<'a, 'b> {
    bar: &'a ProgressBar,
    inner: &'b mut dyn Write,
}

impl Write for ProgressWriter<'_, '_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.bar.inc(n as u64);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// `model.safetensors.index.json` for the written shards, as transformers writes it.
pub fn index_json(result: &ExportResult) -> String {
    let mut weight_map = BTreeMap::new();
    for s in &result.shards {
        for t in &s.tensors {
            weight_map.insert(t.clone(), s.name.clone());
        }
    }
    let v = serde_json::json!({
        "metadata": {"total_size": result.total_size},
        "weight_map": weight_map,
    });
    let mut text = serde_json::to_string_pretty(&v).unwrap_or_default();
    text.push('\n');
    text
}

/// The text-only `config.json` the engine reads: the composite config's `text_config`, lifted out,
/// with `model_type: qwen3_5_text`. A config that is already text-only passes unchanged.
pub fn text_config(composite: &serde_json::Value) -> Result<serde_json::Value, String> {
    let obj = composite
        .as_object()
        .ok_or("config.json is not a JSON object")?;
    let Some(text) = obj.get("text_config") else {
        return Ok(composite.clone());
    };
    let mut text = text
        .as_object()
        .cloned()
        .ok_or("text_config is not a JSON object")?;
    text.insert("model_type".into(), "qwen3_5_text".into());
    text.insert(
        "architectures".into(),
        serde_json::json!(["Qwen3_5ForCausalLM"]),
    );
    for key in ["tie_word_embeddings", "transformers_version"] {
        if !text.contains_key(key)
            && let Some(v) = obj.get(key)
        {
            text.insert(key.into(), v.clone());
        }
    }
    Ok(serde_json::Value::Object(text))
}
