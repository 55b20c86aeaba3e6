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

    /// Resolve a parsed `config.json` (composite or plain). Fields are checked in file order of importance;
    /// the first problem is reported with its dotted name.
    pub fn from_json(root: &Value) -> Result<Self, EngineError> {
        let (root, obj, pre) = text_config(root)?;
        let f = Fields { obj, pre };
        refuse_unsupported(&f)?;
        let num_layers = f.req_usize("num_hidden_layers")?;
        let conv_kernel = f.req_usize("linear_conv_kernel_dim")?;
        if conv_kernel != 4 {
            return Err(f.err(
                "linear_conv_kernel_dim",
                format!("{conv_kernel} is not supported (only 4)"),
            ));
        }
        let head_dim = f.req_usize("head_dim")?;
        let rope = Rope::read(&f, head_dim)?;
        let tie_word_embeddings = tie_word_embeddings(&f, root)?;
        let layer_types = layer_types(&f, num_layers)?;
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
            rope_theta: rope.theta,
            rotary_dim: rope.rotary_dim,
            layer_types,
            tie_word_embeddings,
            mrope_section: rope.mrope_section,
            mrope_interleaved: rope.mrope_interleaved,
        };
        check_widths(&f, &cfg, num_layers)?;
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

    /// Number of projection weights (every layer's input and output projections and MLP): what the backbone
    /// packs, 2 bytes each in BF16, 1 in int8 (6,918,504,448 for the 9B). The embedding is not among them.
    pub fn projection_weight_count(&self) -> u64 {
        self.layer_types
            .iter()
            .map(|&k| {
                let (input, output_mlp) = self.projection_weights(k);
                (input + output_mlp) as u64
            })
            .sum()
    }

    /// Number of projection output rows (one int8 scale each).
    pub fn projection_rows_count(&self) -> u64 {
        let (h, im) = (self.hidden_size, self.intermediate_size);
        self.layer_types
            .iter()
            .map(|&k| {
                let mixer = match k {
                    LayerKind::Linear => {
                        self.conv_dim() + self.value_dim() + 2 * self.linear_num_value_heads + h
                    }
                    LayerKind::Full => {
                        (2 * self.num_attention_heads + 2 * self.num_key_value_heads)
                            * self.head_dim
                            + h
                    }
                };
                (mixer + 2 * im + h) as u64
            })
            .sum()
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

    /// The Qwen3.5-9B text decoder (`Qwen/Qwen3.5-9B-Base@68c46c4b` `config.json`, docs/kev-9b-pins.md): a
    /// wider 4B — hidden 4096, MLP 12,288, the 4B's 32 layers and head geometry — with **untied** embeddings:
    /// the checkpoint carries an `lm_head.weight` the backbone never reads.
    pub fn qwen35_9b() -> Self {
        Qwen35Config {
            hidden_size: 4096,
            intermediate_size: 12_288,
            tie_word_embeddings: false,
            ..Self::qwen35_4b()
        }
    }

    /// The Qwen3.5 base repository this decoder's shape is published as (`Qwen/Qwen3.5-4B-Base`,
    /// `Qwen/Qwen3.5-0.8B-Base`, `Qwen/Qwen3.5-9B-Base`), if it is one of them.
    pub fn published_base(&self) -> Option<&'static str> {
        [
            (Self::qwen35_4b(), "Qwen/Qwen3.5-4B-Base"),
            (Self::qwen35_0_8b(), "Qwen/Qwen3.5-0.8B-Base"),
            (Self::qwen35_9b(), "Qwen/Qwen3.5-9B-Base"),
        ]
        .into_iter()
        .find_map(|(c, name)| (c == *self).then_some(name))
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

/// A JSON object.
type Object = Map<String, Value>;

/// The decoder's object of a `config.json`: `text_config` of a composite `qwen3_5` config, or the root of
/// a plain `qwen3_5_text` one; with the root and the prefix its fields are named under.
fn text_config(root: &Value) -> Result<(&Object, &Object, &'static str), EngineError> {
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
    Ok((root, obj, pre))
}

/// What the engine does not implement, refused by name.
fn refuse_unsupported(f: &Fields<'_>) -> Result<(), EngineError> {
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
    Ok(())
}

/// The rotary embedding's settings.
struct Rope {
    theta: f64,
    rotary_dim: usize,
    mrope_section: Vec<usize>,
    mrope_interleaved: bool,
}

impl Rope {
    /// Read from `rope_parameters` (transformers 5), `rope_scaling` or the top level.
    fn read(f: &Fields<'_>, head_dim: usize) -> Result<Rope, EngineError> {
        let obj = f.obj;
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
        Ok(Rope {
            theta: rope_theta,
            rotary_dim,
            mrope_section,
            mrope_interleaved,
        })
    }
}

/// Whether the embeddings are tied: the composite config states it at the top level, text_config repeats
/// it; they must agree.
fn tie_word_embeddings(f: &Fields<'_>, root: &Map<String, Value>) -> Result<bool, EngineError> {
    let pre = f.pre;
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
    Ok(tie_text.or(tie_root).unwrap_or(false))
}

/// Each layer's kind: `layer_types`, or every `full_attention_interval`-th layer full attention.
fn layer_types(f: &Fields<'_>, num_layers: usize) -> Result<Vec<LayerKind>, EngineError> {
    let obj = f.obj;
    Ok(match obj.get("layer_types") {
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
    })
}

/// Every width positive, and the heads grouping evenly.
fn check_widths(f: &Fields<'_>, cfg: &Qwen35Config, num_layers: usize) -> Result<(), EngineError> {
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
    Ok(())
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
mod tests;
