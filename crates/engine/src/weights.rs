//! The checkpoint as it is named: one tree of checked tensors, read once, that every backend builds from.
//!
//! [`Weights::read`] resolves the name prefix once (`model.language_model.`, `model.` or none), checks every
//! tensor's dtype (BF16 or F32), shape and byte length, attaches each LoRA pair to the projection it adapts,
//! and refuses adapter modules the model lacks and stored tensors it does not use (unless on the ignore list:
//! `mtp.*`, `model.visual.*`, `lm_head.weight`). The tree borrows the memory-mapped store: nothing is copied
//! until a backend converts a tensor (the CPU path packs panels, the reference widens to f32, the CUDA
//! backend uploads BF16). Field names are the checkpoint's, so `layers[3].mlp.up_proj` is
//! `model.language_model.layers.3.mlp.up_proj.weight`. Errors carry the full stored tensor name.

use std::collections::HashSet;
use std::path::Path;

use kev_release::adapter::LoraWeights;
use kev_release::merge::{bf16_rne, merge_weight};
use kev_release::shards::{Dtype, TensorStore, TensorView};

use crate::config::{LayerKind, Qwen35Config};
use crate::error::EngineError;
use crate::lora::{LoraAdapter, LoraPair, to_f32};

/// A checkpoint directory opened: its decoder configuration and its memory-mapped tensors.
pub struct Checkpoint {
    /// The decoder configuration (`config.json`).
    pub config: Qwen35Config,
    /// The safetensors store (single file or index + shards).
    pub store: TensorStore,
}

impl std::fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkpoint")
            .field("dir", &self.store.dir())
            .finish_non_exhaustive()
    }
}

impl Checkpoint {
    /// Open `dir` (config.json + safetensors).
    pub fn open(dir: &Path) -> Result<Self, EngineError> {
        Ok(Checkpoint {
            config: Qwen35Config::from_dir(dir)?,
            store: TensorStore::open(dir)?,
        })
    }

    /// Read the weight tree, with the PEFT adapter in `adapter` attached to the projections it adapts.
    pub fn weights(&self, adapter: Option<&Path>) -> Result<Weights<'_>, EngineError> {
        let adapter = adapter
            .map(|dir| LoraAdapter::from_release(dir, &self.store))
            .transpose()?;
        Weights::read(&self.config, &self.store, adapter)
    }
}

/// One stored tensor, checked: BF16 or F32, the shape the configuration implies, bytes to match.
#[derive(Debug, Clone, Copy)]
pub struct Tensor<'a> {
    view: TensorView<'a>,
}

impl<'a> Tensor<'a> {
    /// The full stored name.
    pub fn name(&self) -> &'a str {
        self.view.name
    }

    /// The stored shape.
    pub fn shape(&self) -> &'a [usize] {
        self.view.shape
    }

    /// The stored dtype (BF16 or F32).
    pub fn dtype(&self) -> Dtype {
        self.view.dtype
    }

    /// The raw view into the store.
    pub fn view(&self) -> &TensorView<'a> {
        &self.view
    }

    /// The values widened to f32 (exact for both stored dtypes).
    pub fn to_f32(&self) -> Vec<f32> {
        to_f32(&self.view).expect("dtype and length checked when the tree was read")
    }

    /// The values as BF16 bits: BF16 as stored, F32 rounded to nearest even.
    pub fn bf16_bits(&self) -> Vec<u16> {
        match self.view.dtype {
            Dtype::BF16 => self
                .view
                .data
                .chunks_exact(2)
                .map(|b| u16::from_le_bytes([b[0], b[1]]))
                .collect(),
            _ => self
                .to_f32()
                .into_iter()
                .map(|x| bf16_rne(x).to_bits())
                .collect(),
        }
    }
}

/// A projection `y = x · weightᵀ`, `weight [out, in]`, with the LoRA update that adapts it, if any.
#[derive(Debug)]
pub struct Projection<'a> {
    /// `<module>.weight`.
    pub weight: Tensor<'a>,
    /// The adapter's pair for this module (kept unmerged; [`Projection::merged_bf16`] merges it).
    pub lora: Option<LoraPair>,
}

impl Projection<'_> {
    /// Output width.
    pub fn rows(&self) -> usize {
        self.weight.shape()[0]
    }

    /// Input width.
    pub fn cols(&self) -> usize {
        self.weight.shape()[1]
    }

    /// With a LoRA: `bf16(fp32(W) + (B @ A) · s)`, bit-exact with PEFT's merge and the author's export
    /// (`kev_release::merge`); without one, `None`.
    pub fn merged_bf16(&self) -> Result<Option<Vec<u16>>, EngineError> {
        let Some((lw, scale)) = self.lora_weights() else {
            return Ok(None);
        };
        let merged = merge_weight(self.weight.view(), &lw, scale)
            .map_err(|e| EngineError::Adapter(e.to_string()))?;
        Ok(Some(merged.into_iter().map(|x| x.to_bits()).collect()))
    }

    /// The LoRA pair as the merge takes it (with its scale), if there is one: for
    /// [`kev_release::RowMerge`], which merges a row at a time as the loader packs or quantises the rows
    /// (the whole merged matrix is never held).
    pub fn lora_weights(&self) -> Option<(LoraWeights, f32)> {
        self.lora.as_ref().map(|pair| {
            (
                LoraWeights {
                    r: pair.r,
                    in_features: pair.k,
                    out_features: pair.n,
                    a: pair.a.clone(),
                    b: pair.b.clone(),
                },
                pair.scale,
            )
        })
    }

    /// The weight as BF16 bits with the LoRA merged in where there is one.
    pub fn bf16_bits_merged(&self) -> Result<Vec<u16>, EngineError> {
        Ok(match self.merged_bf16()? {
            Some(bits) => bits,
            None => self.weight.bf16_bits(),
        })
    }
}

/// A Gated DeltaNet mixer (`linear_attn`).
#[derive(Debug)]
pub struct LinearAttn<'a> {
    /// `[conv_dim, hidden]`: q, k, v before the convolution.
    pub in_proj_qkv: Projection<'a>,
    /// `[value_dim, hidden]`: the output gate.
    pub in_proj_z: Projection<'a>,
    /// `[value_heads, hidden]`: the write strength β.
    pub in_proj_b: Projection<'a>,
    /// `[value_heads, hidden]`: the decay input.
    pub in_proj_a: Projection<'a>,
    /// `A_log [value_heads]`.
    pub a_log: Tensor<'a>,
    /// `[value_heads]`.
    pub dt_bias: Tensor<'a>,
    /// `conv1d.weight [conv_dim, 1, conv_kernel]`.
    pub conv1d: Tensor<'a>,
    /// Gated RMSNorm weight `[value_head_dim]` (`x·w`, shared by all value heads).
    pub norm: Tensor<'a>,
    /// `[hidden, value_dim]`.
    pub out_proj: Projection<'a>,
}

/// A gated attention mixer (`self_attn`).
#[derive(Debug)]
pub struct SelfAttn<'a> {
    /// `[2 · heads · head_dim, hidden]`: query and gate interleaved per head.
    pub q_proj: Projection<'a>,
    /// `[kv_heads · head_dim, hidden]`.
    pub k_proj: Projection<'a>,
    /// `[kv_heads · head_dim, hidden]`.
    pub v_proj: Projection<'a>,
    /// `[hidden, heads · head_dim]`.
    pub o_proj: Projection<'a>,
    /// `[head_dim]` (an `x·(1+w)` RMSNorm).
    pub q_norm: Tensor<'a>,
    /// `[head_dim]` (an `x·(1+w)` RMSNorm).
    pub k_norm: Tensor<'a>,
}

/// A decoder layer's token mixer.
#[derive(Debug)]
pub enum Mixer<'a> {
    /// `linear_attn` (layer type `linear_attention`).
    LinearAttn(Box<LinearAttn<'a>>),
    /// `self_attn` (layer type `full_attention`).
    SelfAttn(Box<SelfAttn<'a>>),
}

/// The SwiGLU MLP (`mlp`).
#[derive(Debug)]
pub struct Mlp<'a> {
    /// `[intermediate, hidden]`.
    pub gate_proj: Projection<'a>,
    /// `[intermediate, hidden]`.
    pub up_proj: Projection<'a>,
    /// `[hidden, intermediate]`.
    pub down_proj: Projection<'a>,
}

/// One decoder layer (`layers.N`).
#[derive(Debug)]
pub struct DecoderLayer<'a> {
    /// `[hidden]` (an `x·(1+w)` RMSNorm).
    pub input_layernorm: Tensor<'a>,
    /// The token mixer.
    pub mixer: Mixer<'a>,
    /// `[hidden]` (an `x·(1+w)` RMSNorm).
    pub post_attention_layernorm: Tensor<'a>,
    /// The MLP.
    pub mlp: Mlp<'a>,
}

/// The text backbone's weights, named like the checkpoint.
pub struct Weights<'a> {
    store: &'a TensorStore,
    /// The decoder configuration the shapes were checked against.
    pub config: &'a Qwen35Config,
    /// `embed_tokens.weight [vocab, hidden]`.
    pub embed_tokens: Tensor<'a>,
    /// `layers.N`, in order.
    pub layers: Vec<DecoderLayer<'a>>,
    /// The final norm `norm.weight [hidden]` (an `x·(1+w)` RMSNorm).
    pub norm: Tensor<'a>,
}

impl std::fmt::Debug for Weights<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Weights")
            .field("dir", &self.store.dir())
            .field("layers", &self.layers.len())
            .finish_non_exhaustive()
    }
}

impl<'a> Weights<'a> {
    /// Read and check every tensor of `cfg` in `store`, attaching `adapter`'s pairs.
    pub fn read(
        cfg: &'a Qwen35Config,
        store: &'a TensorStore,
        mut adapter: Option<LoraAdapter>,
    ) -> Result<Self, EngineError> {
        let mut rd = Reader {
            store,
            prefix: store.text_prefix()?,
            used: HashSet::new(),
        };
        let h = cfg.hidden_size;
        let embed_tokens = rd.tensor("embed_tokens.weight", &[cfg.vocab_size, h])?;
        let mut layers = Vec::with_capacity(cfg.num_layers());
        for (i, kind) in cfg.layer_types.iter().enumerate() {
            layers.push(rd.layer(cfg, adapter.as_mut(), i, *kind)?);
        }
        let norm = rd.tensor("norm.weight", &[h])?;
        if let Some(a) = &adapter
            && let Some(((layer, module), _)) = a.modules.iter().next()
        {
            return Err(EngineError::Adapter(format!(
                "adapter has weights for layers.{layer}.{module}, which the model does not have"
            )));
        }
        rd.check_unused()?;
        Ok(Weights {
            store,
            config: cfg,
            embed_tokens,
            layers,
            norm,
        })
    }

    /// Tell the kernel it may drop the mapped pages of `t` (a backend has copied what it needs).
    pub fn release(&self, t: &Tensor<'_>) {
        self.store.release(t.name());
    }

    /// `t`'s bytes kept mapped beyond the checkpoint (see [`kev_release::shards::MappedTensor`]).
    pub fn mapped(&self, t: &Tensor<'_>) -> Result<kev_release::shards::MappedTensor, EngineError> {
        Ok(self.store.mapped(t.name())?)
    }

    /// Whether any projection carries a LoRA pair.
    pub fn has_lora(&self) -> bool {
        self.layers
            .iter()
            .any(|l| l.projections().iter().any(|p| p.lora.is_some()))
    }
}

impl<'a> DecoderLayer<'a> {
    /// Every projection of the layer, mixer first, then the MLP.
    pub fn projections(&self) -> Vec<&Projection<'a>> {
        let mut out = match &self.mixer {
            Mixer::LinearAttn(g) => vec![
                &g.in_proj_qkv,
                &g.in_proj_z,
                &g.in_proj_b,
                &g.in_proj_a,
                &g.out_proj,
            ],
            Mixer::SelfAttn(a) => vec![&a.q_proj, &a.k_proj, &a.v_proj, &a.o_proj],
        };
        out.extend([&self.mlp.gate_proj, &self.mlp.up_proj, &self.mlp.down_proj]);
        out
    }
}

/// Tensor access by unprefixed name, with dtype/shape checks and a record of what was used.
struct Reader<'a> {
    store: &'a TensorStore,
    prefix: &'static str,
    used: HashSet<String>,
}

impl<'a> Reader<'a> {
    fn tensor(&mut self, name: &str, shape: &[usize]) -> Result<Tensor<'a>, EngineError> {
        let full = format!("{}{name}", self.prefix);
        let v = self
            .store
            .get(&full)
            .map_err(|_| EngineError::tensor(&full, "missing"))?;
        if !matches!(v.dtype, Dtype::BF16 | Dtype::F32) {
            return Err(EngineError::tensor(
                &full,
                format!("dtype {} is not supported (BF16 or F32)", v.dtype.name()),
            ));
        }
        if v.shape != shape {
            return Err(EngineError::tensor(
                &full,
                format!("shape {:?}, expected {shape:?}", v.shape),
            ));
        }
        let size = v.dtype.size().unwrap_or(0);
        if v.data.len() != v.numel() * size {
            return Err(EngineError::tensor(
                &full,
                format!(
                    "holds {} bytes, its shape needs {}",
                    v.data.len(),
                    v.numel() * size
                ),
            ));
        }
        self.used.insert(full);
        Ok(Tensor { view: v })
    }

    /// `layers.{i}.{module}.weight [n, k]` with the adapter's pair for it.
    fn projection(
        &mut self,
        adapter: Option<&mut LoraAdapter>,
        i: usize,
        module: &str,
        n: usize,
        k: usize,
    ) -> Result<Projection<'a>, EngineError> {
        let lora = adapter.and_then(|a| a.take(i, module));
        if let Some(pair) = &lora
            && (pair.k != k || pair.n != n)
        {
            return Err(EngineError::Adapter(format!(
                "layers.{i}.{module}: LoRA maps {} → {} but the module maps {k} → {n}",
                pair.k, pair.n
            )));
        }
        let weight = self.tensor(&format!("layers.{i}.{module}.weight"), &[n, k])?;
        Ok(Projection { weight, lora })
    }

    fn layer(
        &mut self,
        cfg: &Qwen35Config,
        mut adapter: Option<&mut LoraAdapter>,
        i: usize,
        kind: LayerKind,
    ) -> Result<DecoderLayer<'a>, EngineError> {
        let h = cfg.hidden_size;
        let p = |s: &str| format!("layers.{i}.{s}");
        let input_layernorm = self.tensor(&p("input_layernorm.weight"), &[h])?;
        let post_attention_layernorm = self.tensor(&p("post_attention_layernorm.weight"), &[h])?;
        let mixer = match kind {
            LayerKind::Linear => {
                let (cd, vd, nv) = (cfg.conv_dim(), cfg.value_dim(), cfg.linear_num_value_heads);
                let mut proj = |rd: &mut Self, m: &str, n, k| {
                    rd.projection(adapter.as_deref_mut(), i, &format!("linear_attn.{m}"), n, k)
                };
                Mixer::LinearAttn(Box::new(LinearAttn {
                    in_proj_qkv: proj(self, "in_proj_qkv", cd, h)?,
                    in_proj_z: proj(self, "in_proj_z", vd, h)?,
                    in_proj_b: proj(self, "in_proj_b", nv, h)?,
                    in_proj_a: proj(self, "in_proj_a", nv, h)?,
                    out_proj: proj(self, "out_proj", h, vd)?,
                    conv1d: self
                        .tensor(&p("linear_attn.conv1d.weight"), &[cd, 1, cfg.conv_kernel])?,
                    dt_bias: self.tensor(&p("linear_attn.dt_bias"), &[nv])?,
                    a_log: self.tensor(&p("linear_attn.A_log"), &[nv])?,
                    norm: self
                        .tensor(&p("linear_attn.norm.weight"), &[cfg.linear_value_head_dim])?,
                }))
            }
            LayerKind::Full => {
                let (nh, nkv, hd) = (
                    cfg.num_attention_heads,
                    cfg.num_key_value_heads,
                    cfg.head_dim,
                );
                let mut proj = |rd: &mut Self, m: &str, n, k| {
                    rd.projection(adapter.as_deref_mut(), i, &format!("self_attn.{m}"), n, k)
                };
                Mixer::SelfAttn(Box::new(SelfAttn {
                    q_proj: proj(self, "q_proj", 2 * nh * hd, h)?,
                    k_proj: proj(self, "k_proj", nkv * hd, h)?,
                    v_proj: proj(self, "v_proj", nkv * hd, h)?,
                    o_proj: proj(self, "o_proj", h, nh * hd)?,
                    q_norm: self.tensor(&p("self_attn.q_norm.weight"), &[hd])?,
                    k_norm: self.tensor(&p("self_attn.k_norm.weight"), &[hd])?,
                }))
            }
        };
        let im = cfg.intermediate_size;
        let mut proj =
            |rd: &mut Self, m: &str, n, k| rd.projection(adapter.as_deref_mut(), i, m, n, k);
        let mlp = Mlp {
            gate_proj: proj(self, "mlp.gate_proj", im, h)?,
            up_proj: proj(self, "mlp.up_proj", im, h)?,
            down_proj: proj(self, "mlp.down_proj", h, im)?,
        };
        Ok(DecoderLayer {
            input_layernorm,
            mixer,
            post_attention_layernorm,
            mlp,
        })
    }

    fn check_unused(&self) -> Result<(), EngineError> {
        for name in self.store.names() {
            if self.used.contains(name) {
                continue;
            }
            let ignored = name.starts_with("mtp.")
                || name.starts_with("model.visual.")
                || name.starts_with("visual.")
                || name == "lm_head.weight";
            if !ignored {
                return Err(EngineError::UnexpectedTensor(name.to_string()));
            }
        }
        Ok(())
    }
}
