//! `config.json` → [`Qwen35Config`]: read once, every field the engine implements checked, everything else
//! refused with an error naming the field.
//!
//! Two layouts are accepted: the composite `qwen3_5` config of a published checkpoint (decoder fields under
//! `text_config`) and the plain `qwen3_5_text` config written by `Qwen3_5ForCausalLM.save_pretrained`.
//! Defaults follow `configuration_qwen3_5.py` of transformers 5.23.0 only where the spec says the published
//! checkpoints rely on them (`partial_rotary_factor` 0.25, `layer_types` from `full_attention_interval`,
//! `rms_norm_eps` 1e-6); sizes have no defaults, because a silently assumed width is worse than an error.

use std::path::Path;

use serde_json::{Map, Value, json};

use crate::error::EngineError;

/// The mixer of one decoder layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerKind {
    /// Gated DeltaNet (`linear_attention`).
    Linear,
    /// Gated full attention (`full_attention`).
    Full,
}

impl LayerKind {
    /// `num_layers` layers with full attention at every `interval`-th (layers `interval − 1`, `2·interval − 1`,
    /// …) and Gated DeltaNet elsewhere: what `full_attention_interval` means when `layer_types` is absent.
    pub fn interleaved(num_layers: usize, interval: usize) -> Vec<LayerKind> {
        (0..num_layers)
            .map(|i| {
                if (i + 1) % interval == 0 {
                    LayerKind::Full
                } else {
                    LayerKind::Linear
                }
            })
            .collect()
    }
}

/// The resolved text-decoder configuration: no options, every size known.
#[derive(Debug, Clone, PartialEq)]
pub struct Qwen35Config {
    /// Rows of the embedding table.
    pub vocab_size: usize,
    /// Residual width.
    pub hidden_size: usize,
    /// SwiGLU inner width.
    pub intermediate_size: usize,
    /// Attention query heads.
    pub num_attention_heads: usize,
    /// Attention key/value heads.
    pub num_key_value_heads: usize,
    /// Attention head width.
    pub head_dim: usize,
    /// Gated DeltaNet query/key heads.
    pub linear_num_key_heads: usize,
    /// Gated DeltaNet value heads.
    pub linear_num_value_heads: usize,
    /// Gated DeltaNet query/key head width.
    pub linear_key_head_dim: usize,
    /// Gated DeltaNet value head width.
    pub linear_value_head_dim: usize,
    /// Depthwise conv taps (always 4 here).
    pub conv_kernel: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f32,
    /// RoPE base θ.
    pub rope_theta: f64,
    /// Rotated dims per attention head (`head_dim · partial_rotary_factor`).
    pub rotary_dim: usize,
    /// Mixer of each layer, in order.
    pub layer_types: Vec<LayerKind>,
    /// Whether the LM head is the embedding table (true for 0.8B and 4B, false for 9B and up). The decision
    /// backbone never runs an LM head, so it only decides whether a checkpoint may carry `lm_head.weight`.
    pub tie_word_embeddings: bool,
    /// M-RoPE sections over the rotary frequencies (temporal, height, width); they sum to `rotary_dim / 2`.
    /// Text positions are equal on all three axes, which makes M-RoPE plain RoPE: the sections are checked and
    /// written back, never applied.
    pub mrope_section: Vec<usize>,
    /// Interleaved (Qwen3.5) or blocked M-RoPE layout; like the sections, no effect on text positions.
    pub mrope_interleaved: bool,
}

impl Qwen35Config {
    /// Read and resolve `config.json` from a model directory.
    pub fn from_dir(dir: &Path) -> Result<Self, EngineError> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|source| EngineError::Io {
            path: path.clone(),
            source,
        })?;
        let value: Value = serde_json::from_str(&text).map_err(|e| EngineError::Parse {
            path,
            reason: e.to_string(),
        })?;
        Self::from_json(&value)
    }

    /// Resolve a parsed `config.json` (composite or plain).
    pub fn from_json(root: &Value) -> Result<Self, EngineError> {
        let root = root
            .as_object()
            .ok_or_else(|| EngineError::config("(root)", "must be a JSON object"))?;
        let model_type = root.get("model_type").and_then(Value::as_str);
        let (obj, pre) = match (root.get("text_config"), model_type) {
            (Some(tc), Some("qwen3_5") | None) => (
                tc.as_object()
                    .ok_or_else(|| EngineError::config("text_config", "must be an object"))?,
                "text_config.",
            ),
            (None, Some("qwen3_5_text") | None) => (root, ""),
            (None, Some("qwen3_5")) => {
                return Err(EngineError::config(
                    "text_config",
                    "missing (a composite qwen3_5 config keeps the decoder there)",
                ));
            }
            (_, Some(other)) => {
                return Err(EngineError::config(
                    "model_type",
                    format!(
                        "`{other}` is not supported (expected `qwen3_5` with a text_config, or `qwen3_5_text`)"
                    ),
                ));
            }
        };
        if let Some(mt) = obj.get("model_type").and_then(Value::as_str)
            && !pre.is_empty()
            && mt != "qwen3_5_text"
        {
            return Err(EngineError::config(
                format!("{pre}model_type"),
                format!("`{mt}` is not supported (expected `qwen3_5_text`)"),
            ));
        }
        let f = Fields { obj, pre };

        let hidden_act = f.opt_str("hidden_act")?.unwrap_or("silu");
        if hidden_act != "silu" {
            return Err(f.err(
                "hidden_act",
                format!("`{hidden_act}` is not supported (only silu)"),
            ));
        }
        if f.opt_bool("attention_bias")?.unwrap_or(false) {
            return Err(f.err("attention_bias", "attention biases are not supported"));
        }
        if f.opt_bool("attn_output_gate")? == Some(false) {
            return Err(f.err(
                "attn_output_gate",
                "false is not supported (Qwen3.5 attention is always gated)",
            ));
        }
        for flag in ["use_sliding_window", "mlp_bias"] {
            if f.opt_bool(flag)?.unwrap_or(false) {
                return Err(f.err(flag, "not supported"));
            }
        }

        let num_layers = f.req_usize("num_hidden_layers")?;
        let conv_kernel = f.req_usize("linear_conv_kernel_dim")?;
        if conv_kernel != 4 {
            return Err(f.err(
                "linear_conv_kernel_dim",
                format!("{conv_kernel} is not supported (only 4)"),
            ));
        }
        let head_dim = f.req_usize("head_dim")?;

        // RoPE: transformers 5 nests it under rope_parameters; older files keep rope_theta at the top.
        let rope = match obj
            .get("rope_parameters")
            .or_else(|| obj.get("rope_scaling"))
        {
            Some(Value::Object(m)) => Some(m),
            Some(Value::Null) | None => None,
            Some(_) => return Err(f.err("rope_parameters", "must be an object")),
        };
        let rope_key = if obj.contains_key("rope_parameters") {
            "rope_parameters"
        } else {
            "rope_scaling"
        };
        if let Some(rt) = rope
            .and_then(|m| m.get("rope_type").or_else(|| m.get("type")))
            .and_then(Value::as_str)
            && rt != "default"
        {
            return Err(f.err(
                &format!("{rope_key}.rope_type"),
                format!("`{rt}` is not supported (only default)"),
            ));
        }
        let rope_theta = match rope.and_then(|m| m.get("rope_theta")) {
            Some(v) => v
                .as_f64()
                .ok_or_else(|| f.err(&format!("{rope_key}.rope_theta"), "must be a number"))?,
            None => f
                .opt_f64("rope_theta")?
                .ok_or_else(|| f.err("rope_parameters.rope_theta", "missing"))?,
        };
        if !(rope_theta.is_finite() && rope_theta > 1.0) {
            return Err(f.err(
                "rope_parameters.rope_theta",
                format!("{rope_theta} is not a valid base"),
            ));
        }
        let prf = match rope.and_then(|m| m.get("partial_rotary_factor")) {
            Some(v) => v.as_f64().ok_or_else(|| {
                f.err(
                    &format!("{rope_key}.partial_rotary_factor"),
                    "must be a number",
                )
            })?,
            None => f.opt_f64("partial_rotary_factor")?.unwrap_or(0.25),
        };
        if prf != 0.25 {
            return Err(f.err(
                "rope_parameters.partial_rotary_factor",
                format!("{prf} is not supported (only 0.25)"),
            ));
        }
        let rotary_dim = head_dim / 4;
        if !head_dim.is_multiple_of(4) || !rotary_dim.is_multiple_of(2) || rotary_dim == 0 {
            return Err(f.err(
                "head_dim",
                format!(
                    "{head_dim} does not give an even rotary width at partial_rotary_factor 0.25"
                ),
            ));
        }

        // M-RoPE: defaults as configuration_qwen3_5.py's; the sum must cover the rotary frequencies exactly,
        // as HF's split (blocked) layout requires and every published checkpoint has.
        let mrope_section: Vec<usize> = match rope.and_then(|m| m.get("mrope_section")) {
            None | Some(Value::Null) => vec![11, 11, 10],
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| v.as_u64().and_then(|n| usize::try_from(n).ok()))
                .collect::<Option<Vec<usize>>>()
                .ok_or_else(|| {
                    f.err(
                        &format!("{rope_key}.mrope_section"),
                        "must be a list of non-negative integers",
                    )
                })?,
            Some(_) => return Err(f.err(&format!("{rope_key}.mrope_section"), "must be a list")),
        };
        if mrope_section.len() != 3 || mrope_section.iter().sum::<usize>() != rotary_dim / 2 {
            return Err(f.err(
                &format!("{rope_key}.mrope_section"),
                format!(
                    "{mrope_section:?} must be three sections summing to rotary_dim / 2 = {}",
                    rotary_dim / 2
                ),
            ));
        }
        let mrope_interleaved = match rope.and_then(|m| m.get("mrope_interleaved")) {
            None | Some(Value::Null) => true,
            Some(v) => v.as_bool().ok_or_else(|| {
                f.err(
                    &format!("{rope_key}.mrope_interleaved"),
                    "must be a boolean",
                )
            })?,
        };
        // The composite config states the tie at the top level, text_config repeats it; they must agree.
        let tie_text = f.opt_bool("tie_word_embeddings")?;
        let tie_root = match root.get("tie_word_embeddings") {
            Some(v) if !pre.is_empty() && !v.is_null() => Some(v.as_bool().ok_or_else(|| {
                EngineError::config("tie_word_embeddings", format!("{v} is not a boolean"))
            })?),
            _ => None,
        };
        if let (Some(a), Some(b)) = (tie_text, tie_root)
            && a != b
        {
            return Err(f.err(
                "tie_word_embeddings",
                format!("{a} disagrees with the top-level tie_word_embeddings {b}"),
            ));
        }
        // HF's default (Qwen3_5TextConfig) is untied.
        let tie_word_embeddings = tie_text.or(tie_root).unwrap_or(false);

        let layer_types = match obj.get("layer_types") {
            Some(Value::Array(items)) => {
                let mut v = Vec::with_capacity(items.len());
                for (i, it) in items.iter().enumerate() {
                    v.push(match it.as_str() {
                        Some("linear_attention") => LayerKind::Linear,
                        Some("full_attention") => LayerKind::Full,
                        other => {
                            return Err(f.err(
                                &format!("layer_types[{i}]"),
                                format!("{other:?} is not a supported layer type (linear_attention, full_attention)"),
                            ));
                        }
                    });
                }
                if v.len() != num_layers {
                    return Err(f.err(
                        "layer_types",
                        format!(
                            "has {} entries but num_hidden_layers is {num_layers}",
                            v.len()
                        ),
                    ));
                }
                v
            }
            None | Some(Value::Null) => {
                let interval = f.opt_usize("full_attention_interval")?.unwrap_or(4);
                if interval == 0 {
                    return Err(f.err("full_attention_interval", "must be positive"));
                }
                LayerKind::interleaved(num_layers, interval)
            }
            Some(_) => return Err(f.err("layer_types", "must be a list")),
        };

        let cfg = Qwen35Config {
            vocab_size: f.req_usize("vocab_size")?,
            hidden_size: f.req_usize("hidden_size")?,
            intermediate_size: f.req_usize("intermediate_size")?,
            num_attention_heads: f.req_usize("num_attention_heads")?,
            num_key_value_heads: f.req_usize("num_key_value_heads")?,
            head_dim,
            linear_num_key_heads: f.req_usize("linear_num_key_heads")?,
            linear_num_value_heads: f.req_usize("linear_num_value_heads")?,
            linear_key_head_dim: f.req_usize("linear_key_head_dim")?,
            linear_value_head_dim: f.req_usize("linear_value_head_dim")?,
            conv_kernel,
            rms_norm_eps: f.opt_f64("rms_norm_eps")?.unwrap_or(1e-6) as f32,
            rope_theta,
            rotary_dim,
            layer_types,
            tie_word_embeddings,
            mrope_section,
            mrope_interleaved,
        };
        for (name, v) in [
            ("vocab_size", cfg.vocab_size),
            ("hidden_size", cfg.hidden_size),
            ("intermediate_size", cfg.intermediate_size),
            ("num_hidden_layers", num_layers),
            ("num_attention_heads", cfg.num_attention_heads),
            ("num_key_value_heads", cfg.num_key_value_heads),
            ("linear_num_key_heads", cfg.linear_num_key_heads),
            ("linear_num_value_heads", cfg.linear_num_value_heads),
            ("linear_key_head_dim", cfg.linear_key_head_dim),
            ("linear_value_head_dim", cfg.linear_value_head_dim),
        ] {
            if v == 0 {
                return Err(f.err(name, "must be positive"));
            }
        }
        if !cfg
            .num_attention_heads
            .is_multiple_of(cfg.num_key_value_heads)
        {
            return Err(f.err("num_key_value_heads", "must divide num_attention_heads"));
        }
        if !cfg
            .linear_num_value_heads
            .is_multiple_of(cfg.linear_num_key_heads)
        {
            return Err(f.err("linear_num_key_heads", "must divide linear_num_value_heads"));
        }
        Ok(cfg)
    }

    /// Number of decoder layers.
    pub fn num_layers(&self) -> usize {
        self.layer_types.len()
    }

    /// Width of the GDN query (and key) block: key heads × key head dim.
    pub fn key_dim(&self) -> usize {
        self.linear_num_key_heads * self.linear_key_head_dim
    }

    /// Width of the GDN value block: value heads × value head dim.
    pub fn value_dim(&self) -> usize {
        self.linear_num_value_heads * self.linear_value_head_dim
    }

    /// Channels of the depthwise conv (= rows of `in_proj_qkv`).
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }

    /// Per-token cost of a forward pass in FLOPs at context length `n_ctx`, counted as qwen35-arch §11
    /// does: 2 FLOPs per weight of every projection, the GDN conv (`8·conv_dim`) and recurrence
    /// (`7·heads·dk·dv`), and `4·heads·head_dim` per context position per attention layer (7.23 GFLOP
    /// + 131,072·n_ctx for the 4B). Norms and element-wise work are left out.
    pub fn flops_per_token(&self, n_ctx: usize) -> f64 {
        // The GDN's own work per token: the conv and the recurrence.
        let gdn_mixer = (4 * self.conv_dim()) as f64
            + 3.5
                * (self.linear_num_value_heads
                    * self.linear_key_head_dim
                    * self.linear_value_head_dim) as f64;
        let mut params = 0.0;
        let mut n_full = 0usize;
        for &k in &self.layer_types {
            let (input, output_mlp) = self.projection_weights(k);
            params += input
                + output_mlp
                + match k {
                    LayerKind::Linear => gdn_mixer,
                    LayerKind::Full => {
                        n_full += 1;
                        0.0
                    }
                };
        }
        2.0 * params + (n_full * 4 * self.num_attention_heads * self.head_dim) as f64 * n_ctx as f64
    }

    /// The projection weights of a layer of kind `k`: (its input projections, its output projection and
    /// MLP).
    fn projection_weights(&self, k: LayerKind) -> (f64, f64) {
        let h = self.hidden_size as f64;
        let mlp = 3.0 * h * self.intermediate_size as f64;
        match k {
            LayerKind::Linear => (
                h * (self.conv_dim() + self.value_dim() + 2 * self.linear_num_value_heads) as f64,
                self.value_dim() as f64 * h + mlp,
            ),
            LayerKind::Full => {
                let qd = (self.num_attention_heads * self.head_dim) as f64;
                let kvd = (self.num_key_value_heads * self.head_dim) as f64;
                (h * (2.0 * qd + 2.0 * kvd), qd * h + mlp)
            }
        }
    }

    /// FLOPs of the projections alone (the weight GEMMs, 2 per weight and row) in one forward of `n` tokens
    /// whose last layer finishes `wanted` rows, as the fast path runs it: every layer's input projections
    /// on all rows, its output projection and MLP on all rows but in the last layer, which runs them on the
    /// wanted rows only. LoRA updates are left out.
    pub fn projection_flops(&self, n: usize, wanted: usize) -> f64 {
        let last = self.layer_types.len().saturating_sub(1);
        let mut f = 0.0;
        for (i, &k) in self.layer_types.iter().enumerate() {
            let (input, output_mlp) = self.projection_weights(k);
            let rows = if i == last { wanted } else { n } as f64;
            f += 2.0 * (input * n as f64 + output_mlp * rows);
        }
        f
    }

    /// FLOPs of one prefill of `n` tokens: `Σ_t flops_per_token(t+1)` (causal attention sees t+1 keys).
    pub fn prefill_flops(&self, n: usize) -> f64 {
        let base = self.flops_per_token(0);
        let attn_per_pos = self.flops_per_token(1) - base;
        base * n as f64 + attn_per_pos * (n as f64) * (n as f64 + 1.0) / 2.0
    }

    /// The Qwen3.5-4B text decoder (qwen35-arch §1).
    pub fn qwen35_4b() -> Self {
        Qwen35Config {
            vocab_size: 248_320,
            hidden_size: 2560,
            intermediate_size: 9216,
            num_attention_heads: 16,
            num_key_value_heads: 4,
            head_dim: 256,
            linear_num_key_heads: 16,
            linear_num_value_heads: 32,
            linear_key_head_dim: 128,
            linear_value_head_dim: 128,
            conv_kernel: 4,
            rms_norm_eps: 1e-6,
            rope_theta: 1e7,
            rotary_dim: 64,
            layer_types: LayerKind::interleaved(32, 4),
            tie_word_embeddings: true,
            mrope_section: vec![11, 11, 10],
            mrope_interleaved: true,
        }
    }

    /// The Qwen3.5-0.8B text decoder (`Qwen/Qwen3.5-0.8B-Base@dc7cdfe2` `config.json`, docs/kev-0.8b-pins.md):
    /// hidden 1024, MLP 3584, 24 layers (18 Gated DeltaNet + 6 attention), 8 query heads / 2 KV heads × 256,
    /// 16 key heads and 16 value heads × 128 in the DeltaNet (a 1:1 grouping where the 4B has 1:2), tied.
    pub fn qwen35_0_8b() -> Self {
        Qwen35Config {
            vocab_size: 248_320,
            hidden_size: 1024,
            intermediate_size: 3584,
            num_attention_heads: 8,
            num_key_value_heads: 2,
            head_dim: 256,
            linear_num_key_heads: 16,
            linear_num_value_heads: 16,
            linear_key_head_dim: 128,
            linear_value_head_dim: 128,
            conv_kernel: 4,
            rms_norm_eps: 1e-6,
            rope_theta: 1e7,
            rotary_dim: 64,
            layer_types: LayerKind::interleaved(24, 4),
            tie_word_embeddings: true,
            mrope_section: vec![11, 11, 10],
            mrope_interleaved: true,
        }
    }

    /// The Qwen3.5 base repository this decoder's shape is published as (`Qwen/Qwen3.5-4B-Base`,
    /// `Qwen/Qwen3.5-0.8B-Base`), if it is one of them.
    pub fn published_base(&self) -> Option<&'static str> {
        if *self == Self::qwen35_4b() {
            Some("Qwen/Qwen3.5-4B-Base")
        } else if *self == Self::qwen35_0_8b() {
            Some("Qwen/Qwen3.5-0.8B-Base")
        } else {
            None
        }
    }

    /// The composite `config.json` (`qwen3_5`, decoder under `text_config`) of a checkpoint with this decoder,
    /// as a published Qwen3.5 checkpoint spells it.
    pub fn to_composite_json(&self) -> Value {
        let layer_types: Vec<&str> = self
            .layer_types
            .iter()
            .map(|k| match k {
                LayerKind::Linear => "linear_attention",
                LayerKind::Full => "full_attention",
            })
            .collect();
        json!({
            "architectures": ["Qwen3_5ForConditionalGeneration"],
            "model_type": "qwen3_5",
            "tie_word_embeddings": self.tie_word_embeddings,
            "text_config": {
                "model_type": "qwen3_5_text",
                "attention_bias": false,
                "attn_output_gate": true,
                "hidden_act": "silu",
                "vocab_size": self.vocab_size,
                "hidden_size": self.hidden_size,
                "intermediate_size": self.intermediate_size,
                "num_hidden_layers": self.num_layers(),
                "num_attention_heads": self.num_attention_heads,
                "num_key_value_heads": self.num_key_value_heads,
                "head_dim": self.head_dim,
                "linear_num_key_heads": self.linear_num_key_heads,
                "linear_num_value_heads": self.linear_num_value_heads,
                "linear_key_head_dim": self.linear_key_head_dim,
                "linear_value_head_dim": self.linear_value_head_dim,
                "linear_conv_kernel_dim": self.conv_kernel,
                "rms_norm_eps": self.rms_norm_eps as f64,
                "layer_types": layer_types,
                "max_position_embeddings": 262_144,
                "tie_word_embeddings": self.tie_word_embeddings,
                "rope_parameters": {
                    "rope_type": "default",
                    "rope_theta": self.rope_theta,
                    "partial_rotary_factor": 0.25,
                    "mrope_section": self.mrope_section,
                    "mrope_interleaved": self.mrope_interleaved
                }
            },
            "vision_config": {"model_type": "qwen3_5_vision"}
        })
    }
}

/// Typed access to one JSON object, with errors that carry the dotted field name.
struct Fields<'a> {
    obj: &'a Map<String, Value>,
    pre: &'static str,
}

impl Fields<'_> {
    fn err(&self, field: &str, reason: impl Into<String>) -> EngineError {
        EngineError::config(format!("{}{field}", self.pre), reason)
    }

    fn present(&self, field: &str) -> Option<&Value> {
        self.obj.get(field).filter(|v| !v.is_null())
    }

    fn req_usize(&self, field: &str) -> Result<usize, EngineError> {
        self.opt_usize(field)?
            .ok_or_else(|| self.err(field, "missing"))
    }

    fn opt_usize(&self, field: &str) -> Result<Option<usize>, EngineError> {
        match self.present(field) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| self.err(field, format!("{v} is not a non-negative integer"))),
        }
    }

    fn opt_f64(&self, field: &str) -> Result<Option<f64>, EngineError> {
        match self.present(field) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.err(field, format!("{v} is not a number"))),
        }
    }

    fn opt_bool(&self, field: &str) -> Result<Option<bool>, EngineError> {
        match self.present(field) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.err(field, format!("{v} is not a boolean"))),
        }
    }

    fn opt_str(&self, field: &str) -> Result<Option<&str>, EngineError> {
        match self.present(field) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.err(field, format!("{v} is not a string"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn composite_round_trip_and_costs() {
        let c = Qwen35Config::qwen35_4b();
        let back = Qwen35Config::from_json(&c.to_composite_json()).unwrap();
        assert_eq!(back, c);
        assert_eq!(c.conv_dim(), 8192);
        // qwen35-arch §11: 7.23 GFLOP/token for linear layers, 131,072 per context position.
        let base = c.flops_per_token(0);
        assert!((base / 1e9 - 7.23).abs() < 0.01, "{base}");
        assert_eq!(c.flops_per_token(1) - base, 131_072.0);
        // The 4B's projection weights, shape by shape: 24 DeltaNet layers (in 2560 × 12,352, out
        // 4096 × 2560) and 8 attention layers (in 2560 × 10,240, out 4096 × 2560), each with a
        // 3 × 2560 × 9216 MLP: 3,569,090,560 weights; the last layer (attention) finishes `wanted` rows.
        let (gdn, attn, out, mlp) = (
            2560.0 * 12_352.0,
            2560.0 * 10_240.0,
            4096.0 * 2560.0,
            3.0 * 2560.0 * 9216.0,
        );
        let weights = 24.0 * (gdn + out + mlp) + 8.0 * (attn + out + mlp);
        assert_eq!(weights, 3_569_090_560.0);
        assert_eq!(c.projection_flops(94, 94), 2.0 * 94.0 * weights);
        assert_eq!(
            c.projection_flops(94, 1),
            2.0 * 94.0 * weights - 2.0 * 93.0 * (out + mlp)
        );
        // The rest of a token's FLOPs are the mixers' own: the GDN conv and recurrence.
        let mixers = 24.0 * 2.0 * (4.0 * 8192.0 + 3.5 * 32.0 * 128.0 * 128.0);
        assert_eq!(base, 2.0 * weights + mixers);
    }

    /// The 0.8B shape as its published config.json states it (docs/kev-0.8b-pins.md, §config).
    #[test]
    fn the_0_8b_shape() {
        let c = Qwen35Config::qwen35_0_8b();
        assert_eq!(Qwen35Config::from_json(&c.to_composite_json()).unwrap(), c);
        assert_eq!(c.num_layers(), 24);
        let full: Vec<usize> = (0..24)
            .filter(|&i| c.layer_types[i] == LayerKind::Full)
            .collect();
        assert_eq!(full, [3, 7, 11, 15, 19, 23]);
        // the LoRA shapes of the real adapter: in_proj_qkv B is [6144, 16], q_proj out 8·256·2
        assert_eq!(c.conv_dim(), 6144);
        assert_eq!(c.value_dim(), 2048);
        assert_eq!(2 * c.num_attention_heads * c.head_dim, 4096);
        assert_eq!(c.num_key_value_heads * c.head_dim, 512);
        assert_eq!(c.published_base(), Some("Qwen/Qwen3.5-0.8B-Base"));
        assert_eq!(
            Qwen35Config::qwen35_4b().published_base(),
            Some("Qwen/Qwen3.5-4B-Base")
        );
        // ≈ 0.75 B text parameters with the tied embedding: 2·(non-embedding) FLOPs per token
        let per_token = c.flops_per_token(0);
        assert!((per_token / 1e9 - 1.00).abs() < 0.05, "{per_token}");
    }

    #[test]
    fn tie_and_mrope_are_read_checked_and_written_back() {
        let mut c = Qwen35Config::qwen35_0_8b();
        c.tie_word_embeddings = false;
        c.mrope_section = vec![12, 10, 10];
        c.mrope_interleaved = false;
        let v = c.to_composite_json();
        assert_eq!(v["tie_word_embeddings"], json!(false));
        assert_eq!(Qwen35Config::from_json(&v).unwrap(), c);
        // absent: HF's defaults (untied; [11, 11, 10] interleaved)
        let mut v = Qwen35Config::qwen35_4b().to_composite_json();
        v.as_object_mut().unwrap().remove("tie_word_embeddings");
        let tc = v["text_config"].as_object_mut().unwrap();
        tc.remove("tie_word_embeddings");
        let rp = tc["rope_parameters"].as_object_mut().unwrap();
        rp.remove("mrope_section");
        rp.remove("mrope_interleaved");
        let d = Qwen35Config::from_json(&v).unwrap();
        assert!(!d.tie_word_embeddings);
        assert_eq!(
            (d.mrope_section, d.mrope_interleaved),
            (vec![11, 11, 10], true)
        );
        // refusals name the field
        let mut v = Qwen35Config::qwen35_0_8b().to_composite_json();
        v["text_config"]["rope_parameters"]["mrope_section"] = json!([11, 11, 11]);
        let err = Qwen35Config::from_json(&v).unwrap_err().to_string();
        assert!(err.contains("mrope_section") && err.contains("32"), "{err}");
        let mut v = Qwen35Config::qwen35_0_8b().to_composite_json();
        v["tie_word_embeddings"] = json!(false);
        let err = Qwen35Config::from_json(&v).unwrap_err().to_string();
        assert!(err.contains("tie_word_embeddings"), "{err}");
    }

    fn plain() -> Value {
        let mut v = Qwen35Config::qwen35_4b().to_composite_json();
        v["text_config"].take()
    }

    #[test]
    fn plain_form_and_defaults() {
        let mut v = plain();
        v.as_object_mut().unwrap().remove("layer_types");
        v.as_object_mut().unwrap().remove("rms_norm_eps");
        let c = Qwen35Config::from_json(&v).unwrap();
        assert_eq!(c, Qwen35Config::qwen35_4b());
    }

    #[test]
    fn unsupported_fields_are_named() {
        let cases: Vec<(&str, Value, &str)> = vec![
            ("hidden_act", json!("gelu"), "text_config.hidden_act"),
            ("attention_bias", json!(true), "text_config.attention_bias"),
            (
                "linear_conv_kernel_dim",
                json!(3),
                "text_config.linear_conv_kernel_dim",
            ),
            ("head_dim", Value::Null, "text_config.head_dim"),
            (
                "linear_key_head_dim",
                Value::Null,
                "text_config.linear_key_head_dim",
            ),
            (
                "layer_types",
                json!(["linear_attention", "mamba"]),
                "text_config.layer_types[1]",
            ),
        ];
        for (field, value, expect) in cases {
            let mut v = Qwen35Config::qwen35_4b().to_composite_json();
            v["text_config"][field] = value;
            let err = Qwen35Config::from_json(&v).unwrap_err();
            match &err {
                EngineError::Config { field, .. } => assert_eq!(field, expect, "{err}"),
                other => panic!("{other}"),
            }
        }
        let mut v = Qwen35Config::qwen35_4b().to_composite_json();
        v["text_config"]["rope_parameters"]["partial_rotary_factor"] = json!(0.5);
        let err = Qwen35Config::from_json(&v).unwrap_err().to_string();
        assert!(err.contains("partial_rotary_factor"), "{err}");
        let mut v = Qwen35Config::qwen35_4b().to_composite_json();
        v["model_type"] = json!("qwen3_next");
        assert!(
            Qwen35Config::from_json(&v)
                .unwrap_err()
                .to_string()
                .contains("model_type")
        );
    }
}
