//! The loaded backbone: typed decoder layers whose weights are final once built, shareable behind an `Arc`.
//!
//! Loading reads the checkpoint-named tree ([`crate::weights::Weights`], which checks every tensor and
//! refuses unused ones) and builds each layer ([`build`]): each projection in the one form its load chose
//! ([`linear::Weight`]: float panels for the fp32 and bf16 arms, or int8 with the plan's float islands for
//! the int8 arm), fused where projections read the same input (GDN `in_proj_{qkv,z,b,a}`, attention
//! `{q,k,v}_proj`, MLP `{gate,up}_proj`), the mapped pages dropped as they are copied. Nothing in a
//! loaded model changes afterwards: adapters are objects of their own ([`Adapter`]), an int8 model is built
//! as one (`load_quantised`, or [`Backbone::quantised`] from a float model), and the forward's buffers
//! live in a pool beside the weights.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use kev_release::shards::TensorStore;

use crate::adapter::{Adapter, LoraSeg};
use crate::config::Qwen35Config;
use crate::error::EngineError;
use crate::kernels::{Arm, Kernels};
use crate::lora::LoraAdapter;
use crate::weights::{Checkpoint, Tensor, Weights};

pub(crate) mod build;
pub(crate) mod embed;
pub(crate) mod layer;
pub(crate) mod linear;
pub(crate) mod observe;
#[cfg(test)]
mod tests;

use embed::Embedding;
use layer::{Layer, Mixer};
use linear::{Linear, Weight};
pub use observe::{ActivationObserver, ProjectionKind};

/// How to load a model.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// A PEFT adapter directory to apply unmerged (the `exact` weight form); `None` loads the directory's
    /// weights as they are (a `merged` export, or the plain base).
    pub adapter: Option<std::path::PathBuf>,
    /// Kernels to compute with; `None` detects the best this CPU has.
    pub kernels: Option<Kernels>,
    /// With an adapter: merge it into the weights at load (`bf16(fp32(W) + (B @ A) · s)`, bit-exact with
    /// the prepared export, so this is the `merged` form without running `kev prepare`) instead of
    /// keeping it unmerged.
    pub merge_adapter: bool,
}

/// Which compute arms a model's weights run: decided by its load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightArms {
    /// Float panels: the fp32 and bf16 arms.
    Float,
    /// Int8 projections (and the plan's float islands): the int8 arm.
    Int8,
}

impl WeightArms {
    /// Whether `arm` runs these weights.
    pub fn runs(self, arm: Arm) -> bool {
        (self == WeightArms::Int8) == (arm == Arm::Int8)
    }
}

/// The Qwen3.5 text backbone, loaded and ready to run. Immutable; share it with `Arc`.
#[derive(Debug)]
pub struct Backbone {
    pub(crate) cfg: Qwen35Config,
    pub(crate) embed: Embedding,
    pub(crate) layers: Vec<Layer>,
    /// `1 + norm.weight`.
    pub(crate) final_norm: Vec<f32>,
    pub(crate) kern: Kernels,
    /// RoPE inverse frequencies in f32, as HF computes them.
    pub(crate) inv_freq: Vec<f32>,
    /// Activation buffers, reused across calls (one per concurrent call).
    pub(crate) pool: crate::scratch::WorkspacePool,
    pub(crate) arms: WeightArms,
    /// The adapter the model was loaded with in the `exact` form (unmerged): rows that name no other run
    /// under it.
    pub(crate) adapter: Option<Adapter>,
    /// Whether an adapter was merged into the weights at load (then no other adapter can share them).
    pub(crate) merged_adapter: bool,
    /// This load's identity: an [`Adapter`] laid out for another model is refused.
    pub(crate) id: u64,
}

/// A fresh identity for each model built.
pub(crate) fn next_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

impl Backbone {
    /// Load `dir` (config.json + safetensors) for the float arms, optionally with an adapter (unmerged,
    /// or merged with `opts.merge_adapter`).
    pub fn load(dir: &Path, opts: &LoadOptions) -> Result<Self, EngineError> {
        let ck = Checkpoint::open(dir)?;
        let weights = ck.weights(opts.adapter.as_deref())?;
        let kern = opts.kernels.unwrap_or_else(Kernels::detect);
        tracing::info!(
            isa = kern.isa().name(),
            "CPU kernels: {} (KEV_ISA={})",
            kern.isa(),
            std::env::var("KEV_ISA").unwrap_or_else(|_| "unset".into())
        );
        Self::from_weights(&weights, opts.merge_adapter, kern)
    }

    /// Build from an opened store; with `merge`, the adapter is merged into the weights at load.
    pub fn from_store(
        cfg: Qwen35Config,
        store: &TensorStore,
        adapter: Option<LoraAdapter>,
        merge: bool,
        kern: Kernels,
    ) -> Result<Self, EngineError> {
        Self::from_weights(&Weights::read(&cfg, store, adapter)?, merge, kern)
    }

    /// Pack the checkpoint tree for the float arms; with `merge`, each LoRA is merged into its weight
    /// (BF16, bit-exact with the prepared export), else it is kept unmerged as the model's own adapter.
    pub fn from_weights(w: &Weights<'_>, merge: bool, kern: Kernels) -> Result<Self, EngineError> {
        Self::build(w, (merge, kern), WeightArms::Float, &|_, rows| {
            Ok(Weight::Float(rows.pack()))
        })
    }

    /// The decoder configuration.
    pub fn config(&self) -> &Qwen35Config {
        &self.cfg
    }

    /// The kernels in use.
    pub fn kernels(&self) -> Kernels {
        self.kern
    }

    /// The compute arms this model's weights run.
    pub fn arms(&self) -> WeightArms {
        self.arms
    }

    /// Whether only the int8 arm can run this model (its projections were built in their int8 form).
    pub fn int8_only(&self) -> bool {
        self.arms == WeightArms::Int8
    }

    /// Every projection with its decoder layer and kind, in projection order (`4 · layer + slot`).
    pub(crate) fn projections(
        &self,
    ) -> impl Iterator<Item = (usize, ProjectionKind, &Linear)> + '_ {
        self.layers
            .iter()
            .enumerate()
            .flat_map(|(li, l)| l.projections().map(move |(kind, lin)| (li, kind, lin)))
    }

    /// The names the int8 form and activation ranges use for the (fused) projections, in order.
    pub fn projection_names(&self) -> Vec<String> {
        self.projections()
            .map(|(li, kind, _)| kind.name(li))
            .collect()
    }

    /// Bytes of the projections' int8 forms.
    pub fn int8_bytes(&self) -> usize {
        self.projections()
            .map(|(_, _, l)| l.weight.int8_bytes())
            .sum()
    }

    /// Bytes of owned weight storage (packed projections, embedding, small vectors, the own adapter).
    pub fn weight_bytes(&self) -> usize {
        let mut total = self.embed.bytes() + 4 * self.final_norm.len();
        for l in &self.layers {
            total += l
                .projections()
                .map(|(_, p)| p.weight.bytes())
                .sum::<usize>();
            total += 4 * (l.input_norm.len() + l.post_norm.len());
            total += 4 * match &l.mixer {
                Mixer::Gdn(g) => g.conv_t.len() + g.dt_bias.len() + g.neg_a.len() + g.norm.len(),
                Mixer::Attention(a) => a.q_norm.len() + a.k_norm.len(),
            };
        }
        total + self.adapter.as_ref().map_or(0, Adapter::bytes)
    }

    /// Whether a LoRA is applied unmerged (the `exact` form).
    pub fn has_lora(&self) -> bool {
        self.adapter.as_ref().is_some_and(|a| !a.is_empty())
    }

    /// The adapter the model was loaded with, unmerged (the `exact` form), if any.
    pub fn adapter(&self) -> Option<&Adapter> {
        self.adapter.as_ref()
    }
}

impl Adapter {
    /// `adapter` laid out for `model`'s projections, to run beside its own weights (rows name it per
    /// pass: [`crate::BatchRow::adapter`]). Refused, naming the module: a module or shape the model does
    /// not have, or a model whose adapter was merged into its weights (another adapter cannot share them).
    pub fn new(model: &Backbone, mut adapter: LoraAdapter) -> Result<Adapter, EngineError> {
        if model.merged_adapter {
            return Err(EngineError::Adapter(
                "the base has an adapter merged into its weights; load it unmerged to serve several adapters"
                    .into(),
            ));
        }
        let mut segments = Vec::new();
        for (li, layer) in model.layers.iter().enumerate() {
            for (kind, lin) in layer.projections() {
                let k = lin.weight.k();
                let mut segs = Vec::new();
                let mut col = 0;
                for (module, n) in kind.modules(&model.cfg) {
                    if let Some(pair) = adapter.take(li, module) {
                        if pair.k != k || pair.n != n {
                            return Err(EngineError::Adapter(format!(
                                "layers.{li}.{module}: the adapter maps {} → {} but the base module maps {k} → {n}",
                                pair.k, pair.n
                            )));
                        }
                        segs.push(LoraSeg::new(&pair, col, n, k));
                    }
                    col += n;
                }
                segments.push(segs);
            }
        }
        if let Some((layer, module)) = adapter.modules.keys().next() {
            return Err(EngineError::Adapter(format!(
                "layers.{layer}.{module}: the adapter adapts a module the base does not have"
            )));
        }
        Ok(Adapter {
            model: model.id,
            segments,
        })
    }

    /// [`Adapter::new`] for the PEFT adapter in `adapter_dir`, read (and checked against the base
    /// checkpoint `base_dir` that `model` came from) as [`LoraAdapter::from_release`] reads it.
    pub fn load(
        model: &Backbone,
        base_dir: &Path,
        adapter_dir: &Path,
    ) -> Result<Adapter, EngineError> {
        let store = TensorStore::open(base_dir)?;
        Adapter::new(model, LoraAdapter::from_release(adapter_dir, &store)?)
    }
}

/// HF's `1.0 / (base ** (arange(0, dim, 2).float() / dim))`, evaluated in f32 like torch.
pub(crate) fn rope_inv_freq(theta: f64, dim: usize) -> Vec<f32> {
    (0..dim / 2)
        .map(|i| {
            let e = (2 * i) as f32 / dim as f32;
            let p = (theta as f32 as f64).powf(e as f64) as f32;
            1.0f32 / p
        })
        .collect()
}

/// `1 + w` in f32 for an `x·(1+w)` RMSNorm.
pub(crate) fn norm1p(t: &Tensor<'_>) -> Vec<f32> {
    t.to_f32().into_iter().map(|w| 1.0 + w).collect()
}
