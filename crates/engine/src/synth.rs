//! Random-weight releases in the published layout, written as a stream (memory stays at one chunk).
//!
//! `base/`: composite `config.json`, safetensors shards with `model.language_model.` names (BF16; the GDN
//! `A_log` and gated-norm weight in F32 as the published checkpoints store them: 36 F32 tensors for the 0.8B,
//! 48 for the 4B and the 9B) plus a few `mtp.*` tensors a loader must skip, `lm_head.weight` when the config
//! is untied, and `model.safetensors.index.json`. The adapter (and kev-bench's head) names the base of the
//! release the shape stands for ([`Identity`]: Kev-0.8B for the 0.8B widths, Kev-9B for the 9B's, Kev-4B
//! otherwise). `kev/` (optional): a PEFT `adapter_config.json` + `adapter_model.safetensors` over the 12
//! target modules, F32, rank 16, with non-zero `B` so the adapter changes the outputs, keyed as PEFT writes
//! them around the text model (`base_model.model.layers.{i}.…`, like the Kev release). transformers + PEFT load both directories,
//! and the engine matches their float32 hidden states (checked by hand with transformers 5.23.0).
//!
//! This is the checkpoint side only, which the engine's own tests load. What a decision needs on top (the Kev
//! tokenizer and a random pointer head) and the `kev synth` command are kev-bench's (`kev_bench::synth`), which
//! draws the head's values with the same generator ([`draw_uniform`]).
//!
//! Values come from a counter-based generator (one hash per element index), so any chunk can be made
//! independently, in parallel, and the files are identical for a given seed. Scales keep activations in a
//! sane range through a random deep network (no overflow, no subnormals), which is all a benchmark or a
//! fast-versus-reference test needs.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use rayon::prelude::*;
use serde_json::{Map, Value, json};

use kev_release::stream::{PlannedTensor, SafetensorsWriter, StreamError};

use crate::config::{LayerKind, Qwen35Config};
use crate::error::EngineError;
use crate::lora::TARGETS;

/// How values of one tensor are drawn.
#[derive(Debug, Clone, Copy)]
enum Init {
    /// Uniform on `[-a, a]`.
    Uniform(f32),
    /// Uniform on `[lo, hi]`.
    Range(f32, f32),
    /// `ln(u)` with `u` uniform on `[lo, hi]` (for `A_log`).
    LogRange(f32, f32),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DType {
    Bf16,
    F32,
}

#[derive(Debug, Clone)]
struct Spec {
    name: String,
    shape: Vec<usize>,
    dtype: DType,
    init: Init,
}

impl Spec {
    fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    fn bytes(&self) -> usize {
        self.numel() * if self.dtype == DType::Bf16 { 2 } else { 4 }
    }
}

/// What to write.
#[derive(Debug, Clone)]
pub struct SynthOptions {
    /// Decoder shape.
    pub config: Qwen35Config,
    /// Seed of every value.
    pub seed: u64,
    /// Number of safetensors shards for `base/` (an index is written when more than one).
    pub shards: usize,
    /// Also write `kev/` with a random LoRA adapter.
    pub adapter: bool,
    /// Store every projection in F32 with full mantissas instead of BF16 (tests the f32 weight path).
    pub f32_weights: bool,
}

/// What was written.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SynthReport {
    /// The base directory.
    pub base: PathBuf,
    /// The adapter directory, if written.
    pub kev: Option<PathBuf>,
    /// Tensors in `base/`.
    pub tensors: usize,
    /// Bytes of tensor data in `base/`.
    pub bytes: usize,
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn name_key(seed: u64, name: &str) -> u64 {
    name.bytes()
        .fold(splitmix(seed), |h, b| splitmix(h ^ b as u64))
}

/// Uniform in [0, 1).
fn unit(key: u64, i: u64) -> f32 {
    (splitmix(key ^ i.wrapping_mul(0xd1b5_4a32_d192_ed03)) >> 40) as f32 / (1u64 << 24) as f32
}

fn value(init: Init, key: u64, i: u64) -> f32 {
    let u = unit(key, i);
    match init {
        Init::Uniform(a) => (2.0 * u - 1.0) * a,
        Init::Range(lo, hi) => lo + (hi - lo) * u,
        Init::LogRange(lo, hi) => (lo + (hi - lo) * u).ln(),
    }
}

/// The tensors of the base checkpoint, in file order.
fn base_specs(cfg: &Qwen35Config, f32_weights: bool) -> Vec<Spec> {
    let p = "model.language_model.";
    let h = cfg.hidden_size;
    let wd = if f32_weights { DType::F32 } else { DType::Bf16 };
    let mat = |name: String, n: usize, k: usize| Spec {
        name,
        shape: vec![n, k],
        dtype: wd,
        init: Init::Uniform((3.0 / k as f32).sqrt()),
    };
    let norm1p = |name: String, n: usize| Spec {
        name,
        shape: vec![n],
        dtype: DType::Bf16,
        init: Init::Uniform(0.2),
    };
    let mut v = vec![Spec {
        name: format!("{p}embed_tokens.weight"),
        shape: vec![cfg.vocab_size, h],
        dtype: DType::Bf16,
        init: Init::Uniform(1.0),
    }];
    for (i, kind) in cfg.layer_types.iter().enumerate() {
        let l = format!("{p}layers.{i}.");
        v.push(norm1p(format!("{l}input_layernorm.weight"), h));
        match kind {
            LayerKind::Linear => {
                let (cd, vd, nv) = (cfg.conv_dim(), cfg.value_dim(), cfg.linear_num_value_heads);
                v.push(Spec {
                    name: format!("{l}linear_attn.A_log"),
                    shape: vec![nv],
                    dtype: DType::F32,
                    init: Init::LogRange(1.0, 16.0),
                });
                v.push(Spec {
                    name: format!("{l}linear_attn.conv1d.weight"),
                    shape: vec![cd, 1, cfg.conv_kernel],
                    dtype: DType::Bf16,
                    init: Init::Uniform(0.5),
                });
                v.push(Spec {
                    name: format!("{l}linear_attn.dt_bias"),
                    shape: vec![nv],
                    dtype: DType::Bf16,
                    init: Init::Range(-1.0, 1.0),
                });
                v.push(mat(format!("{l}linear_attn.in_proj_a.weight"), nv, h));
                v.push(mat(format!("{l}linear_attn.in_proj_b.weight"), nv, h));
                v.push(mat(format!("{l}linear_attn.in_proj_qkv.weight"), cd, h));
                v.push(mat(format!("{l}linear_attn.in_proj_z.weight"), vd, h));
                v.push(Spec {
                    name: format!("{l}linear_attn.norm.weight"),
                    shape: vec![cfg.linear_value_head_dim],
                    dtype: DType::F32,
                    init: Init::Range(0.8, 1.2),
                });
                v.push(mat(format!("{l}linear_attn.out_proj.weight"), h, vd));
            }
            LayerKind::Full => {
                let (nh, nkv, hd) = (
                    cfg.num_attention_heads,
                    cfg.num_key_value_heads,
                    cfg.head_dim,
                );
                v.push(mat(format!("{l}self_attn.k_proj.weight"), nkv * hd, h));
                v.push(norm1p(format!("{l}self_attn.k_norm.weight"), hd));
                v.push(mat(format!("{l}self_attn.o_proj.weight"), h, nh * hd));
                v.push(mat(format!("{l}self_attn.q_proj.weight"), 2 * nh * hd, h));
                v.push(norm1p(format!("{l}self_attn.q_norm.weight"), hd));
                v.push(mat(format!("{l}self_attn.v_proj.weight"), nkv * hd, h));
            }
        }
        let im = cfg.intermediate_size;
        v.push(mat(format!("{l}mlp.down_proj.weight"), h, im));
        v.push(mat(format!("{l}mlp.gate_proj.weight"), im, h));
        v.push(mat(format!("{l}mlp.up_proj.weight"), im, h));
        v.push(norm1p(format!("{l}post_attention_layernorm.weight"), h));
    }
    v.push(norm1p(format!("{p}norm.weight"), h));
    if !cfg.tie_word_embeddings {
        // An untied checkpoint carries its LM head (top-level name, as HF saves it); the backbone skips it.
        v.push(Spec {
            name: "lm_head.weight".into(),
            shape: vec![cfg.vocab_size, h],
            dtype: DType::Bf16,
            init: Init::Uniform((3.0 / h as f32).sqrt()),
        });
    }
    // A token MTP head, as published checkpoints carry one; loaders must skip it.
    v.push(Spec {
        name: "mtp.fc.weight".into(),
        shape: vec![h, 2 * h],
        dtype: DType::Bf16,
        init: Init::Uniform(0.1),
    });
    v
}

/// The adapter tensors (`A [r, in]`, `B [out, r]`) for every target module of every layer.
fn adapter_specs(cfg: &Qwen35Config, r: usize) -> Vec<Spec> {
    let h = cfg.hidden_size;
    let mut v = Vec::new();
    for (i, kind) in cfg.layer_types.iter().enumerate() {
        for module in TARGETS {
            let (n, k) = match (module, kind) {
                ("linear_attn.in_proj_qkv", LayerKind::Linear) => (cfg.conv_dim(), h),
                ("linear_attn.in_proj_z", LayerKind::Linear) => (cfg.value_dim(), h),
                ("linear_attn.in_proj_b" | "linear_attn.in_proj_a", LayerKind::Linear) => {
                    (cfg.linear_num_value_heads, h)
                }
                ("linear_attn.out_proj", LayerKind::Linear) => (h, cfg.value_dim()),
                ("self_attn.q_proj", LayerKind::Full) => {
                    (2 * cfg.num_attention_heads * cfg.head_dim, h)
                }
                ("self_attn.k_proj" | "self_attn.v_proj", LayerKind::Full) => {
                    (cfg.num_key_value_heads * cfg.head_dim, h)
                }
                ("self_attn.o_proj", LayerKind::Full) => {
                    (h, cfg.num_attention_heads * cfg.head_dim)
                }
                ("mlp.gate_proj" | "mlp.up_proj", _) => (cfg.intermediate_size, h),
                ("mlp.down_proj", _) => (h, cfg.intermediate_size),
                _ => continue,
            };
            let base = format!("base_model.model.layers.{i}.{module}");
            v.push(Spec {
                name: format!("{base}.lora_A.weight"),
                shape: vec![r, k],
                dtype: DType::F32,
                init: Init::Uniform((3.0 / k as f32).sqrt()),
            });
            v.push(Spec {
                name: format!("{base}.lora_B.weight"),
                shape: vec![n, r],
                dtype: DType::F32,
                init: Init::Uniform(0.01),
            });
        }
    }
    v
}

fn io_err(path: &Path) -> impl Fn(std::io::Error) -> EngineError + '_ {
    move |source| EngineError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Write one safetensors file holding `specs` through [`kev_release::stream`] (the export's writer: the
/// `safetensors` library's layout), generating values chunk by chunk. Returns the data bytes.
fn write_safetensors(path: &Path, specs: &[Spec], seed: u64) -> Result<usize, EngineError> {
    let stream_err = |e: StreamError| EngineError::Parse {
        path: path.to_path_buf(),
        reason: e.to_string(),
    };
    let planned = specs
        .iter()
        .map(|s| PlannedTensor {
            name: s.name.clone(),
            dtype: match s.dtype {
                DType::Bf16 => safetensors::Dtype::BF16,
                DType::F32 => safetensors::Dtype::F32,
            },
            shape: s.shape.clone(),
        })
        .collect();
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    let mut w = SafetensorsWriter::create(path, planned, Some(metadata)).map_err(stream_err)?;
    let by_name: HashMap<&str, &Spec> = specs.iter().map(|s| (s.name.as_str(), s)).collect();
    let order: Vec<String> = w.order().map(str::to_string).collect();
    for name in &order {
        let s = by_name[name.as_str()];
        w.write_with(name, |out| write_values(out, s, seed))
            .map_err(stream_err)?;
    }
    w.finish().map_err(stream_err)?;
    Ok(specs.iter().map(Spec::bytes).sum())
}

/// Generate one tensor's values in chunks of 4 Mi elements (in parallel within a chunk) and write them.
fn write_values(out: &mut dyn Write, s: &Spec, seed: u64) -> Result<(), String> {
    const CHUNK: usize = 1 << 22;
    let key = name_key(seed, &s.name);
    let n = s.numel();
    let size = if s.dtype == DType::Bf16 { 2 } else { 4 };
    let mut buf: Vec<u8> = Vec::new();
    let mut start = 0;
    while start < n {
        let len = (n - start).min(CHUNK);
        buf.clear();
        buf.resize(len * size, 0);
        buf.par_chunks_mut(size * 4096)
            .enumerate()
            .for_each(|(c, out)| {
                for (j, dst) in out.chunks_exact_mut(size).enumerate() {
                    let i = (start + c * 4096 + j) as u64;
                    let x = value(s.init, key, i);
                    if size == 2 {
                        dst.copy_from_slice(&crate::kernels::bf16_bits(x).to_le_bytes());
                    } else {
                        dst.copy_from_slice(&x.to_le_bytes());
                    }
                }
            });
        out.write_all(&buf).map_err(|e| e.to_string())?;
        start += len;
    }
    Ok(())
}

fn write_json(path: &Path, v: &Value) -> Result<(), EngineError> {
    let text = serde_json::to_string_pretty(v).map_err(|e| EngineError::Parse {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    std::fs::write(path, text + "\n").map_err(io_err(path))
}

/// Write `out/base` (and `out/kev` when asked).
pub fn write_release(out: &Path, opts: &SynthOptions) -> Result<SynthReport, EngineError> {
    let base = out.join("base");
    std::fs::create_dir_all(&base).map_err(io_err(&base))?;
    write_json(&base.join("config.json"), &opts.config.to_composite_json())?;
    let specs = base_specs(&opts.config, opts.f32_weights);
    let total: usize = specs.iter().map(Spec::bytes).sum();
    let shards = opts.shards.max(1);
    // Cut in file order at equal byte shares.
    let mut groups: Vec<Vec<Spec>> = vec![Vec::new(); shards];
    let mut acc = 0usize;
    for s in &specs {
        let g = ((acc as u128 * shards as u128) / total.max(1) as u128) as usize;
        groups[g.min(shards - 1)].push(s.clone());
        acc += s.bytes();
    }
    groups.retain(|g| !g.is_empty());
    let n = groups.len();
    let mut weight_map = Map::new();
    for (i, g) in groups.iter().enumerate() {
        let fname = if n == 1 {
            "model.safetensors".to_string()
        } else {
            format!("model.safetensors-{:05}-of-{n:05}.safetensors", i + 1)
        };
        write_safetensors(&base.join(&fname), g, opts.seed)?;
        for s in g {
            weight_map.insert(s.name.clone(), Value::String(fname.clone()));
        }
    }
    if n > 1 {
        write_json(
            &base.join("model.safetensors.index.json"),
            &json!({"metadata": {"total_size": total}, "weight_map": weight_map}),
        )?;
    }
    let kev = if opts.adapter {
        Some(write_adapter(&out.join("kev"), &opts.config, opts.seed)?)
    } else {
        None
    };
    Ok(SynthReport {
        base,
        kev,
        tensors: specs.len(),
        bytes: total,
    })
}

/// Write `dir/adapter_config.json` + `dir/adapter_model.safetensors`: the random rank-16 LoRA over the 12
/// target modules that [`write_release`] puts in `kev/` (the same bytes for the same seed). Returns `dir`.
pub fn write_adapter(dir: &Path, cfg: &Qwen35Config, seed: u64) -> Result<PathBuf, EngineError> {
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    let r = 16;
    write_json(
        &dir.join("adapter_config.json"),
        &json!({
            "peft_type": "LORA",
            "base_model_name_or_path": Identity::of(cfg).base,
            "r": r,
            "lora_alpha": 32,
            "lora_dropout": 0.0,
            "bias": "none",
            "fan_in_fan_out": false,
            "use_rslora": false,
            "use_dora": false,
            "task_type": null,
            "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                "down_proj", "in_proj_qkv", "in_proj_z", "in_proj_a", "in_proj_b", "out_proj"]
        }),
    )?;
    write_safetensors(
        &dir.join("adapter_model.safetensors"),
        &adapter_specs(cfg, r),
        seed ^ 0x5eed,
    )?;
    Ok(dir.to_path_buf())
}

/// Which published release a synthetic one stands in for: the base its adapter (and kev-bench's head) name,
/// and the pinned revision Kev 1.0 was trained on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    /// Base repository (`Qwen/Qwen3.5-0.8B-Base`).
    pub base: &'static str,
    /// Its pinned revision (release-pins, docs/kev-0.8b-pins.md).
    pub base_revision: &'static str,
}

impl Identity {
    /// Kev-0.8B's for a decoder of the 0.8B widths, Kev-9B's for the 9B widths (untied, like the 9B), each at
    /// any depth or vocabulary (so cut-down test variants keep it); Kev-4B's otherwise.
    pub fn of(cfg: &Qwen35Config) -> Self {
        let same_widths = |real: &Qwen35Config| {
            let mut widths = cfg.clone();
            widths.vocab_size = real.vocab_size;
            widths.layer_types = real.layer_types.clone();
            widths == *real
        };
        if same_widths(&Qwen35Config::qwen35_0_8b()) {
            Identity {
                base: "Qwen/Qwen3.5-0.8B-Base",
                base_revision: "dc7cdfe2ee4154fa7e30f5b51ca41bfa40174e68",
            }
        } else if same_widths(&Qwen35Config::qwen35_9b()) {
            Identity {
                base: "Qwen/Qwen3.5-9B-Base",
                base_revision: "68c46c4b3498877f3ef123c856ecfde50c39f404",
            }
        } else {
            Identity {
                base: "Qwen/Qwen3.5-4B-Base",
                base_revision: "1001bb4d826a52d1f399e183466143f4da7b741b",
            }
        }
    }
}

/// `n` values uniform on `[-a, a]`, drawn as every synthetic tensor's are: keyed by `seed` and `name`, one
/// hash per element index (the same values for the same arguments, on any machine).
pub fn draw_uniform(seed: u64, name: &str, n: usize, a: f32) -> Vec<f32> {
    let key = name_key(seed, name);
    (0..n as u64)
        .map(|i| value(Init::Uniform(a), key, i))
        .collect()
}

/// A small decoder for tests and demos: the fixture release's widths (hidden 16, 8 layers 3:1) with a
/// vocabulary of `vocab` rows.
pub fn tiny_config(vocab: usize) -> Qwen35Config {
    Qwen35Config {
        vocab_size: vocab,
        hidden_size: 16,
        intermediate_size: 64,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 32,
        linear_num_key_heads: 2,
        linear_num_value_heads: 4,
        linear_key_head_dim: 16,
        linear_value_head_dim: 24,
        conv_kernel: 4,
        rms_norm_eps: 1e-6,
        rope_theta: 1e7,
        rotary_dim: 8,
        layer_types: LayerKind::interleaved(8, 4),
        tie_word_embeddings: true,
        mrope_section: vec![2, 1, 1],
        mrope_interleaved: true,
    }
}

/// `cfg` with its widths kept but only the first `layers` layers and a `vocab`-row embedding: a published
/// shape cut down to what a test can write and load in seconds (the 0.8B's 24 layers and 248,320-row table
/// are 1.5 GB; its first 4 layers with 2,048 rows, 174 MB).
pub fn cut(cfg: &Qwen35Config, layers: usize, vocab: usize) -> Qwen35Config {
    let mut c = cfg.clone();
    c.layer_types.truncate(layers);
    c.vocab_size = vocab;
    c
}
