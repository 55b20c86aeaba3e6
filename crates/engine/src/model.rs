//! The loaded backbone: weights repacked into owned panel buffers, immutable, shareable behind an `Arc`.
//!
//! Loading reads the checkpoint-named tree ([`crate::weights::Weights`], which checks every tensor and
//! refuses unused ones), packs each projection from it (fusing the ones that read the same input: GDN
//! `in_proj_{qkv,z,b,a}`, attention `{q,k,v}_proj`, MLP `{gate,up}_proj`) and tells the kernel it may drop
//! the mapped pages it has copied.

use std::path::Path;

use kev_release::shards::{Dtype, TensorStore};

use crate::config::Qwen35Config;
use crate::error::EngineError;
use crate::kernels::int8::{PackedInt8, WeightQuant};
use crate::kernels::pack::{Part, PartRows, Source};
use rayon::prelude::*;

use crate::kernels::{Arm, Kernels, PackedMatrix, Rows, RowsMut, Run, SendPtr, gemm, matmul};
use crate::lora::{LoraAdapter, LoraPair};
use crate::scratch::with_tls;
use crate::weights::{self, Checkpoint, Projection, Tensor, Weights};

/// A LoRA update attached to a column range of a (possibly fused) projection.
#[derive(Debug)]
pub(crate) struct LoraSeg {
    /// First output column.
    pub col: usize,
    /// Output columns.
    pub n: usize,
    /// Rank.
    pub r: usize,
    /// Input width.
    pub k: usize,
    /// `Aᵀ [k, r]`.
    pub a_t: Vec<f32>,
    /// `Bᵀ [r, n]`.
    pub b_t: Vec<f32>,
    /// Scale.
    pub scale: f32,
}

/// A projection `y = x · Wᵀ (+ LoRA)`, possibly several checkpoint modules fused along the outputs.
#[derive(Debug)]
pub(crate) struct Linear {
    pub w: PackedMatrix,
    /// The LoRA segments of each adapter slot (slot `a` at `loras[a]`; a slot past the end adapts nothing
    /// here). Slot 0 is the adapter the model was loaded with; [`Backbone::add_adapter`] adds the others.
    pub loras: Vec<Vec<LoraSeg>>,
    /// How the int8 arm computes this projection, chosen at load (`quantize_int8`, `load_quantised`).
    pub island: Island,
    /// Output rows `[n − t, n)` the int8 arm computes in fp32 from this copy (`t` = its rows): the GDN
    /// gates `in_proj_b`/`in_proj_a` when the plan keeps them float (calibrate.rs).
    pub float_tail: std::sync::OnceLock<PackedMatrix>,
}

/// How the int8 arm computes one projection.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Island {
    /// In int8 (every projection but the plan's islands).
    #[default]
    None,
    /// As the bf16 arm does: an island of the int8 plan.
    Bf16,
    /// As the fp32 arm does (the dev-split ablations).
    Fp32,
}

impl Linear {
    /// `out[:, :n] = x · Wᵀ + Σ_seg (x·Aᵀ·Bᵀ)·s` over the `x.m` rows; `observer`, when a forward carries one
    /// (int8 calibration), records the rows' per-input magnitudes first.
    ///
    /// `slots` names each row's adapter slot (empty: every row is slot 0); a row gets only its own
    /// adapter's low-rank update, so rows of different adapters share the base product and nothing else.
    pub fn apply(
        &self,
        run: Run,
        observer: Observe<'_>,
        slots: &[u16],
        x: Rows<'_>,
        out: RowsMut<'_>,
    ) {
        let Run { kern, arm } = run;
        let Rows {
            m,
            data: x,
            ld: ldx,
        } = x;
        let RowsMut { data: out, ld: ldo } = out;
        assert!(
            arm == Arm::Int8 || !self.w.float_dropped(),
            "this model keeps int8 weights only: the {} arm cannot run it",
            arm.name()
        );
        let arm = match (arm, self.island) {
            (Arm::Int8, Island::Bf16) => Arm::Bf16,
            (Arm::Int8, Island::Fp32) => Arm::Fp32,
            (arm, _) => arm,
        };
        if let Some(obs) = observer {
            obs.record(self, m, x, ldx);
        }
        gemm(
            Run { kern, arm },
            Rows {
                m,
                data: x,
                ld: ldx,
            },
            &self.w,
            RowsMut {
                data: &mut *out,
                ld: ldo,
            },
        );
        if arm == Arm::Int8
            && let Some(t) = self.float_tail.get()
        {
            // The int8 GEMM computed these rows too (a few of thousands); they are replaced.
            let (nt, c0) = (t.n(), self.w.n() - t.n());
            let mut buf = vec![0f32; m * nt];
            gemm(
                Run {
                    kern,
                    arm: Arm::Fp32,
                },
                Rows {
                    m,
                    data: x,
                    ld: ldx,
                },
                t,
                RowsMut {
                    data: &mut buf,
                    ld: nt,
                },
            );
            for i in 0..m {
                out[i * ldo + c0..i * ldo + c0 + nt].copy_from_slice(&buf[i * nt..(i + 1) * nt]);
            }
        }
        if self.loras.iter().all(Vec::is_empty) {
            return;
        }
        debug_assert!(slots.is_empty() || slots.len() >= m);
        let slot_of = |i: usize| slots.get(i).copied().unwrap_or(0) as usize;
        // Row blocks in parallel, each cut where the adapter changes; each computes t = x·Aᵀ, u = t·Bᵀ
        // and adds u·s (PEFT: result + lora_B(lora_A(x)) * scaling, the product rounded before the sum).
        // Rows never interact, so a row's bits do not depend on the block it lands in.
        const ROWS: usize = 32;
        let mut blocks: Vec<(usize, usize, usize)> = Vec::with_capacity(m.div_ceil(ROWS));
        let mut i0 = 0;
        while i0 < m {
            let slot = slot_of(i0);
            let mut end = i0 + 1;
            while end < m && end - i0 < ROWS && slot_of(end) == slot {
                end += 1;
            }
            if self.loras.get(slot).is_some_and(|s| !s.is_empty()) {
                blocks.push((i0, end - i0, slot));
            }
            i0 = end;
        }
        let op = SendPtr(out.as_mut_ptr());
        let olen = out.len();
        blocks.into_par_iter().for_each(|(i0, rows, slot)| {
            for seg in &self.loras[slot] {
                with_tls(rows * (seg.r + seg.n), |buf| {
                    let (t, u) = buf.split_at_mut(rows * seg.r);
                    matmul::matmul(
                        kern,
                        matmul::Mat {
                            data: &x[i0 * ldx..],
                            rows,
                            cols: seg.k,
                            ld: ldx,
                        },
                        matmul::Mat::new(&seg.a_t, seg.k, seg.r),
                        t,
                        seg.r,
                        false,
                    );
                    matmul::matmul(
                        kern,
                        matmul::Mat::new(t, rows, seg.r),
                        matmul::Mat::new(&seg.b_t, seg.r, seg.n),
                        u,
                        seg.n,
                        false,
                    );
                    for r in 0..rows {
                        let off = (i0 + r) * ldo + seg.col;
                        debug_assert!(off + seg.n <= olen);
                        // SAFETY: each block writes only its own rows i0..i0+rows of `out`.
                        let o = unsafe { std::slice::from_raw_parts_mut(op.get().add(off), seg.n) };
                        for (oj, uj) in o.iter_mut().zip(&u[r * seg.n..(r + 1) * seg.n]) {
                            *oj += *uj * seg.scale;
                        }
                    }
                });
            }
        });
    }
}

/// Gated DeltaNet mixer weights (`linear_attn`).
#[derive(Debug)]
pub(crate) struct GdnWeights {
    /// Fused `[in_proj_qkv; in_proj_z; in_proj_b; in_proj_a]`.
    pub in_proj: Linear,
    /// Conv taps transposed, `[4][conv_dim]` (tap 3 multiplies the current token).
    pub conv_t: Vec<f32>,
    pub dt_bias: Vec<f32>,
    /// `−exp(A_log)` in f32, as HF computes it each call.
    pub neg_a: Vec<f32>,
    /// Gated RMSNorm weight (`x·w`, shared by all value heads).
    pub norm: Vec<f32>,
    pub out_proj: Linear,
}

/// Gated attention mixer weights (`self_attn`).
#[derive(Debug)]
pub(crate) struct AttnWeights {
    /// Fused `[q_proj (query+gate interleaved per head); k_proj; v_proj]`.
    pub qkv: Linear,
    /// `1 + q_norm.weight`.
    pub q_norm: Vec<f32>,
    /// `1 + k_norm.weight`.
    pub k_norm: Vec<f32>,
    pub o_proj: Linear,
}

#[derive(Debug)]
pub(crate) enum Mixer {
    Gdn(GdnWeights),
    Attn(AttnWeights),
}

/// One decoder layer.
#[derive(Debug)]
pub(crate) struct Layer {
    /// `1 + input_layernorm.weight`.
    pub input_norm: Vec<f32>,
    /// `1 + post_attention_layernorm.weight`.
    pub post_norm: Vec<f32>,
    pub mixer: Mixer,
    /// Fused `[gate_proj; up_proj]`.
    pub gate_up: Linear,
    pub down: Linear,
}

/// The (fused) projections of a layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProjectionKind {
    /// GDN `in_proj_{qkv,z,b,a}` (reads the input norm).
    GdnIn,
    /// GDN `out_proj`.
    GdnOut,
    /// Attention `q/k/v_proj` (reads the input norm).
    AttnQkv,
    /// Attention `o_proj`.
    AttnOut,
    /// MLP `gate/up_proj` (reads the post-attention norm).
    MlpGateUp,
    /// MLP `down_proj`.
    MlpDown,
}

impl ProjectionKind {
    /// Whether the projection reads an RMSNorm output.
    pub fn reads_norm(self) -> bool {
        matches!(
            self,
            ProjectionKind::GdnIn | ProjectionKind::AttnQkv | ProjectionKind::MlpGateUp
        )
    }
}

/// What a calibration forward records: per projection, the largest `|x[k]|` seen per input. Passed to the
/// fp32 forwards that run the calibration rows ([`crate::CpuBackend::observed`]; made by `Backbone::activation_observer`, read by
/// `Backbone::activation_ranges` in `calibrate`), it is the only mutable thing
/// those forwards touch: the weights stay as loaded.
pub struct ActivationObserver {
    /// Per projection (by its address, which the loaded model keeps), the running maxima.
    pub(crate) ranges: std::collections::HashMap<usize, std::sync::Mutex<Vec<f32>>>,
}

/// The observer a forward carries, if any.
pub(crate) type Observe<'a> = Option<&'a ActivationObserver>;

impl std::fmt::Debug for ActivationObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ActivationObserver")
            .field("projections", &self.ranges.len())
            .finish()
    }
}

impl ActivationObserver {
    /// Fold `m` rows of `x` (stride `ldx`), the input of `l`, into its maxima.
    pub(crate) fn record(&self, l: &Linear, m: usize, x: &[f32], ldx: usize) {
        if let Some(r) = self.ranges.get(&(l as *const Linear as usize)) {
            observe(&mut r.lock().unwrap_or_else(|e| e.into_inner()), m, x, ldx);
        }
    }
}

/// Fold `m` rows of `x` (stride `ldx`) into the running per-input maxima `r`.
pub(crate) fn observe(r: &mut [f32], m: usize, x: &[f32], ldx: usize) {
    let k = r.len();
    for i in 0..m {
        for (mx, v) in r.iter_mut().zip(&x[i * ldx..i * ldx + k]) {
            *mx = mx.max(v.abs());
        }
    }
}

/// The token embedding table, kept in its stored dtype.
pub(crate) enum Embedding {
    Bf16(Vec<u16>),
    /// BF16 rows read from the checkpoint's mapping as tokens need them: the 4B's 1.2 GiB table is not
    /// copied, and only the rows of the tokens seen become resident.
    MappedBf16(kev_release::shards::MappedTensor),
    F32(Vec<f32>),
}

impl std::fmt::Debug for Embedding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Embedding::Bf16(v) => write!(f, "Embedding::Bf16({} values)", v.len()),
            Embedding::MappedBf16(t) => write!(f, "Embedding::MappedBf16({t:?})"),
            Embedding::F32(v) => write!(f, "Embedding::F32({} values)", v.len()),
        }
    }
}

impl Embedding {
    pub fn row(&self, id: usize, width: usize, out: &mut [f32]) {
        match self {
            Embedding::Bf16(v) => {
                for (o, b) in out.iter_mut().zip(&v[id * width..(id + 1) * width]) {
                    *o = crate::kernels::bf16_to_f32(*b);
                }
            }
            Embedding::MappedBf16(t) => {
                let row = &t.bytes()[2 * id * width..2 * (id + 1) * width];
                for (o, b) in out.iter_mut().zip(row.chunks_exact(2)) {
                    *o = crate::kernels::bf16_to_f32(u16::from_le_bytes([b[0], b[1]]));
                }
            }
            Embedding::F32(v) => out.copy_from_slice(&v[id * width..(id + 1) * width]),
        }
    }

    fn bytes(&self) -> usize {
        match self {
            Embedding::Bf16(v) => v.len() * 2,
            Embedding::MappedBf16(t) => t.bytes().len(),
            Embedding::F32(v) => v.len() * 4,
        }
    }
}

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
    /// Adapter slots a row may name ([`crate::BatchRow::adapter`]): 1 plus those [`Backbone::add_adapter`]
    /// added.
    pub(crate) slots: usize,
    /// Whether an adapter was merged into the weights at load (then no other adapter can share them).
    pub(crate) merged_adapter: bool,
}

impl Backbone {
    /// Load `dir` (config.json + safetensors), optionally with an unmerged LoRA adapter.
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

    /// Pack the checkpoint tree; with `merge`, each LoRA is merged into its weight (BF16, bit-exact with
    /// the prepared export), else it is kept unmerged beside the packed weight.
    pub fn from_weights(w: &Weights<'_>, merge: bool, kern: Kernels) -> Result<Self, EngineError> {
        Self::build(w, merge, kern, None)
    }

    /// Pack every layer, in the forms `steps` chooses, running its `per_layer` on each as soon as it is
    /// packed (the int8 loads); without `steps`, every projection in float.
    pub(crate) fn build(
        w: &Weights<'_>,
        merge: bool,
        kern: Kernels,
        steps: Option<&LoadSteps<'_>>,
    ) -> Result<Self, EngineError> {
        let cfg = w.config.clone();
        let embed = match w.embed_tokens.dtype() {
            Dtype::BF16 => Embedding::MappedBf16(w.mapped(&w.embed_tokens)?),
            _ => {
                let e = Embedding::F32(w.embed_tokens.to_f32());
                w.release(&w.embed_tokens);
                e
            }
        };
        let layers = w
            .layers
            .iter()
            .enumerate()
            .map(|(li, l)| {
                let form = |slot, kind| steps.map_or(Form::Float, |s| (s.form)(li, slot, kind));
                let mut layer = pack_layer(w, l, merge, &form)?;
                if let Some(s) = steps {
                    (s.per_layer)(&mut layer, li)?;
                }
                Ok(layer)
            })
            .collect::<Result<Vec<_>, EngineError>>()?;
        let inv_freq = rope_inv_freq(cfg.rope_theta, cfg.rotary_dim);
        Ok(Backbone {
            final_norm: norm1p(&w.norm),
            cfg,
            embed,
            layers,
            kern,
            inv_freq,
            pool: crate::scratch::WorkspacePool::new(crate::scratch::WORKSPACE_KEEP),
            slots: 1,
            merged_adapter: merge && w.has_lora(),
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

    /// Bytes of the projections' int8 forms built so far.
    pub fn int8_bytes(&self) -> usize {
        self.projections()
            .iter()
            .map(|(_, l, _)| l.w.int8_bytes())
            .sum()
    }

    /// Bytes of owned weight storage (packed projections, embedding, small vectors).
    pub fn weight_bytes(&self) -> usize {
        let lin = |l: &Linear| {
            l.w.bytes()
                + l.w.int8_bytes()
                + l.loras
                    .iter()
                    .flatten()
                    .map(|s| 4 * (s.a_t.len() + s.b_t.len()))
                    .sum::<usize>()
        };
        let mut total = self.embed.bytes() + 4 * self.final_norm.len();
        for l in &self.layers {
            total += lin(&l.gate_up) + lin(&l.down) + 4 * (l.input_norm.len() + l.post_norm.len());
            total += match &l.mixer {
                Mixer::Gdn(g) => {
                    lin(&g.in_proj)
                        + lin(&g.out_proj)
                        + 4 * (g.conv_t.len() + g.dt_bias.len() + g.neg_a.len() + g.norm.len())
                }
                Mixer::Attn(a) => {
                    lin(&a.qkv) + lin(&a.o_proj) + 4 * (a.q_norm.len() + a.k_norm.len())
                }
            };
        }
        total
    }

    /// Build the int8 arm's weights of every projection now (they are otherwise built on first use),
    /// with the rule's BF16 islands ([`crate::Int8Plan::default`]) when nothing was quantised yet:
    /// per-output-channel int8 from the loaded BF16/F32 weights, kept beside them. Returns their bytes.
    pub fn prepare_int8(&mut self) -> usize {
        if self
            .projections()
            .iter()
            .all(|(_, l, _)| l.w.int8_built().is_none())
            && let Ok(bytes) = self.quantize_int8(None, crate::Int8Plan::default())
        {
            return bytes;
        }
        let mut lins: Vec<&Linear> = Vec::new();
        for l in &self.layers {
            lins.push(&l.gate_up);
            lins.push(&l.down);
            match &l.mixer {
                Mixer::Gdn(g) => lins.extend([&g.in_proj, &g.out_proj]),
                Mixer::Attn(a) => lins.extend([&a.qkv, &a.o_proj]),
            }
        }
        lins.iter().map(|l| l.w.int8().bytes()).sum()
    }

    /// Adapter slots rows may name: slot 0 (the adapter loaded with the weights, or none) and one per
    /// [`Backbone::add_adapter`].
    pub fn adapter_slots(&self) -> usize {
        self.slots
    }

    /// Serve one more Kev adapter over these weights, unmerged, in fp32 (the `exact` form's arithmetic):
    /// rows that name the returned slot get its low-rank updates, every other row is untouched. The base
    /// weights are shared, so an adapter costs only its own tensors. Refused when the loaded weights hold a
    /// merged adapter, or when a module of `adapter` does not fit the base (named).
    pub fn add_adapter(&mut self, mut adapter: LoraAdapter) -> Result<usize, EngineError> {
        if self.merged_adapter {
            return Err(EngineError::Adapter(
                "these weights hold a merged adapter: several adapters need the base weights with every \
                 adapter unmerged (the exact form)"
                    .into(),
            ));
        }
        let slot = u16::try_from(self.slots)
            .map_err(|_| EngineError::Adapter("too many adapters (65,536 slots)".into()))?
            as usize;
        let cfg = self.cfg.clone();
        let mut built: Vec<Vec<Vec<LoraSeg>>> = Vec::with_capacity(self.layers.len());
        for (li, layer) in self.layers.iter_mut().enumerate() {
            let mut per = Vec::new();
            for (lin, parts) in layer.fused_mut(&cfg) {
                let k = lin.w.k();
                let mut segs = Vec::new();
                let mut col = 0;
                for (module, n) in parts {
                    if let Some(pair) = adapter.take(li, module) {
                        if pair.k != k || pair.n != n {
                            return Err(EngineError::Adapter(format!(
                                "layers.{li}.{module}: the adapter maps {} → {} but the base module maps {k} → {n}",
                                pair.k, pair.n
                            )));
                        }
                        segs.push(seg(&pair, col, n, k));
                    }
                    col += n;
                }
                per.push(segs);
            }
            built.push(per);
        }
        if let Some((layer, module)) = adapter.modules.keys().next() {
            return Err(EngineError::Adapter(format!(
                "layers.{layer}.{module}: the adapter adapts a module the base does not have"
            )));
        }
        for (layer, per) in self.layers.iter_mut().zip(built) {
            for ((lin, _), segs) in layer.fused_mut(&cfg).into_iter().zip(per) {
                lin.loras.resize_with(slot, Vec::new);
                lin.loras.push(segs);
            }
        }
        self.slots += 1;
        Ok(slot)
    }

    /// Bytes of adapter slot `slot`'s unmerged LoRA tensors (0 for a slot with none).
    pub fn adapter_bytes(&self, slot: usize) -> usize {
        self.projections()
            .iter()
            .filter_map(|(_, l, _)| l.loras.get(slot))
            .flatten()
            .map(|s| 4 * (s.a_t.len() + s.b_t.len()))
            .sum()
    }

    /// [`Backbone::add_adapter`] for the PEFT adapter in `adapter_dir`, read (and checked against the
    /// base checkpoint `base_dir` these weights came from) as [`LoraAdapter::from_release`] reads it.
    pub fn attach_adapter(
        &mut self,
        base_dir: &Path,
        adapter_dir: &Path,
    ) -> Result<usize, EngineError> {
        let store = TensorStore::open(base_dir)?;
        let adapter = LoraAdapter::from_release(adapter_dir, &store)?;
        self.add_adapter(adapter)
    }

    /// Whether a LoRA is applied unmerged (the `exact` form).
    pub fn has_lora(&self) -> bool {
        self.projections()
            .iter()
            .any(|(_, l, _)| l.loras.iter().any(|s| !s.is_empty()))
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

impl Layer {
    /// Each fused projection with its checkpoint modules (as [`crate::lora::TARGETS`] names them) and their
    /// output widths, in the order [`pack_layer`] stacks them.
    pub(crate) fn fused_mut(
        &mut self,
        c: &Qwen35Config,
    ) -> Vec<(&mut Linear, Vec<(&'static str, usize)>)> {
        let mut out: Vec<(&mut Linear, Vec<(&'static str, usize)>)> = Vec::with_capacity(4);
        match &mut self.mixer {
            Mixer::Gdn(g) => {
                let nv = c.linear_num_value_heads;
                out.push((
                    &mut g.in_proj,
                    vec![
                        ("linear_attn.in_proj_qkv", c.conv_dim()),
                        ("linear_attn.in_proj_z", c.value_dim()),
                        ("linear_attn.in_proj_b", nv),
                        ("linear_attn.in_proj_a", nv),
                    ],
                ));
                out.push((
                    &mut g.out_proj,
                    vec![("linear_attn.out_proj", c.hidden_size)],
                ));
            }
            Mixer::Attn(a) => {
                let (nh, nkv, hd) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
                out.push((
                    &mut a.qkv,
                    vec![
                        ("self_attn.q_proj", 2 * nh * hd),
                        ("self_attn.k_proj", nkv * hd),
                        ("self_attn.v_proj", nkv * hd),
                    ],
                ));
                out.push((&mut a.o_proj, vec![("self_attn.o_proj", c.hidden_size)]));
            }
        }
        out.push((
            &mut self.gate_up,
            vec![
                ("mlp.gate_proj", c.intermediate_size),
                ("mlp.up_proj", c.intermediate_size),
            ],
        ));
        out.push((&mut self.down, vec![("mlp.down_proj", c.hidden_size)]));
        out
    }
}

/// What the loader builds of one projection as it packs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Form {
    /// The float panels (every arm can run it; the int8 loads' islands and what they quantise later).
    Float,
    /// The int8 form alone, quantised from the checkpoint's rows as they are read (an adapter merged a
    /// row at a time): no float copy of the projection is ever made. The same bytes as quantising the
    /// float panels (their values are the rows' values).
    Int8(WeightQuant),
    /// Neither: the layer's `per_layer` step installs a stored int8 form next.
    Int8Stored,
}

/// The int8 loads' choices while [`Backbone::build`] packs: each projection's [`Form`] (by decoder layer,
/// slot in the layer as `calibrate::layer_projections` orders them, and kind), and the step run on each
/// layer once it is packed.
pub(crate) struct LoadSteps<'a> {
    pub form: &'a dyn Fn(usize, usize, ProjectionKind) -> Form,
    pub per_layer: &'a dyn Fn(&mut Layer, usize) -> Result<(), EngineError>,
}

/// Pack one decoder layer of the tree, each projection in the form `form(slot, kind)` chooses.
fn pack_layer(
    w: &Weights<'_>,
    l: &weights::DecoderLayer<'_>,
    merge: bool,
    form: &dyn Fn(usize, ProjectionKind) -> Form,
) -> Result<Layer, EngineError> {
    use ProjectionKind as K;
    let mixer = match &l.mixer {
        weights::Mixer::LinearAttn(g) => {
            let cd = w.config.conv_dim();
            let taps = w.config.conv_kernel;
            let conv = g.conv1d.to_f32();
            let mut conv_t = vec![0f32; taps * cd];
            for c in 0..cd {
                for j in 0..taps {
                    conv_t[j * cd + c] = conv[c * taps + j];
                }
            }
            Mixer::Gdn(GdnWeights {
                in_proj: pack(
                    w,
                    &[&g.in_proj_qkv, &g.in_proj_z, &g.in_proj_b, &g.in_proj_a],
                    merge,
                    form(0, K::GdnIn),
                )?,
                conv_t,
                dt_bias: g.dt_bias.to_f32(),
                neg_a: g.a_log.to_f32().iter().map(|x| -x.exp()).collect(),
                norm: g.norm.to_f32(),
                out_proj: pack(w, &[&g.out_proj], merge, form(1, K::GdnOut))?,
            })
        }
        weights::Mixer::SelfAttn(a) => Mixer::Attn(AttnWeights {
            qkv: pack(
                w,
                &[&a.q_proj, &a.k_proj, &a.v_proj],
                merge,
                form(0, K::AttnQkv),
            )?,
            q_norm: norm1p(&a.q_norm),
            k_norm: norm1p(&a.k_norm),
            o_proj: pack(w, &[&a.o_proj], merge, form(1, K::AttnOut))?,
        }),
    };
    Ok(Layer {
        input_norm: norm1p(&l.input_layernorm),
        post_norm: norm1p(&l.post_attention_layernorm),
        mixer,
        gate_up: pack(
            w,
            &[&l.mlp.gate_proj, &l.mlp.up_proj],
            merge,
            form(2, K::MlpGateUp),
        )?,
        down: pack(w, &[&l.mlp.down_proj], merge, form(3, K::MlpDown))?,
    })
}

/// Pack the vertical concatenation of `parts` (projections reading the same input) into one matrix in
/// `form`, each LoRA merged into its part or kept as a segment over the part's columns.
fn pack(
    w: &Weights<'_>,
    parts: &[&Projection<'_>],
    merge: bool,
    form: Form,
) -> Result<Linear, EngineError> {
    let k = parts[0].cols();
    let mut segs = Vec::new();
    let mut col = 0;
    for p in parts {
        if !merge && let Some(pair) = &p.lora {
            segs.push(seg(pair, col, p.rows(), k));
        }
        col += p.rows();
    }
    // A merged adapter is merged a row at a time as the rows are packed or quantised (a stored int8 form
    // needs neither).
    let loras: Vec<Option<(kev_release::adapter::LoraWeights, f32)>> = parts
        .iter()
        .map(|p| {
            if merge && form != Form::Int8Stored {
                p.lora_weights()
            } else {
                None
            }
        })
        .collect();
    let merges = parts
        .iter()
        .zip(&loras)
        .map(|(p, lw)| {
            lw.as_ref()
                .map(|(l, scale)| kev_release::RowMerge::new(p.weight.view(), l, *scale))
                .transpose()
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| EngineError::Adapter(e.to_string()))?;
    let merged_rows: Vec<_> = merges
        .iter()
        .map(|m| {
            m.as_ref().map(|m| {
                move |r: usize, out: &mut [f32]| {
                    with_tls(out.len(), |delta| m.row_f32(r, delta, out))
                }
            })
        })
        .collect();
    let srcs: Vec<Part<'_>> = parts
        .iter()
        .zip(&merged_rows)
        .map(|(p, rows)| Part {
            rows: p.rows(),
            src: match rows {
                Some(f) => Source::Bf16Rows(f),
                None => stored(p),
            },
        })
        .collect();
    let m = match form {
        Form::Float => PackedMatrix::from_parts(k, &srcs),
        Form::Int8(quant) => {
            let at = PartRows::new(srcs.iter().map(|p| p.rows));
            let q = PackedInt8::from_rows_opts(
                at.n(),
                k,
                |row, out| {
                    let (pi, r) = at.locate(row);
                    srcs[pi].src.row_f32(r, k, out);
                },
                None,
                quant,
            );
            PackedMatrix::int8_only(q)
        }
        Form::Int8Stored => PackedMatrix::int8_pending(srcs.iter().map(|p| p.rows).sum(), k),
    };
    for p in parts {
        w.release(&p.weight);
    }
    Ok(Linear {
        w: m,
        loras: vec![segs],
        island: Default::default(),
        float_tail: Default::default(),
    })
}

/// A projection's weight as the checkpoint stores it (BF16 or F32).
fn stored<'a>(p: &Projection<'a>) -> Source<'a> {
    if p.weight.dtype() == Dtype::BF16 {
        Source::Bf16(p.weight.view().data)
    } else {
        Source::F32(p.weight.view().data)
    }
}

/// A LoRA pair as a segment over output columns `[col, col + n)` (shapes checked by the tree).
fn seg(pair: &LoraPair, col: usize, n: usize, k: usize) -> LoraSeg {
    let r = pair.r;
    let mut a_t = vec![0f32; k * r];
    crate::kernels::matmul::transpose(&pair.a, r, k, k, &mut a_t);
    let mut b_t = vec![0f32; r * n];
    crate::kernels::matmul::transpose(&pair.b, n, r, r, &mut b_t);
    LoraSeg {
        col,
        n,
        r,
        k,
        a_t,
        b_t,
        scale: pair.scale,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest, Sha256};

    /// Merging at load gives, bit for bit, the weights of the author's merged export (the fixture's
    /// `merge.json` hashes every merged tensor after the bf16 cast).
    #[test]
    fn merge_at_load_is_bit_exact_with_the_export() {
        let fx = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures");
        let mut m = Backbone::load(
            &fx.join("release/base"),
            &LoadOptions {
                adapter: Some(fx.join("release/kev")),
                kernels: None,
                merge_adapter: true,
            },
        )
        .unwrap();
        assert!(!m.has_lora());
        let want: serde_json::Value =
            serde_json::from_slice(&std::fs::read(fx.join("expected/merge.json")).unwrap())
                .unwrap();
        let c = m.cfg.clone();
        let mut checked = 0;
        for (i, l) in m.layers.iter_mut().enumerate() {
            let modules = l.fused_mut(&c);
            for (lin, parts) in modules {
                assert!(lin.w.is_bf16());
                let rows = lin.w.to_f32_rows();
                let k = lin.w.k();
                let mut start = 0;
                for (name, n) in parts {
                    let bytes: Vec<u8> = rows[start * k..(start + n) * k]
                        .iter()
                        .flat_map(|x| ((x.to_bits() >> 16) as u16).to_le_bytes())
                        .collect();
                    let key = format!("model.language_model.layers.{i}.{name}.weight");
                    let entry = &want["tensors"][&key];
                    assert_eq!(entry["merged"], true, "{key}");
                    assert_eq!(
                        hex::encode(Sha256::digest(&bytes)),
                        entry["sha256"].as_str().unwrap(),
                        "{key}"
                    );
                    checked += 1;
                    start += n;
                }
            }
        }
        assert_eq!(checked, want["adapted"].as_u64().unwrap() as usize);
    }

    /// A pass whose workspace is over the pool's limit gives its buffers back (nothing pooled), and the
    /// next pass, on buffers mapped afresh, gives the same bits as one on pooled buffers.
    #[test]
    fn a_workspace_over_the_limit_is_not_kept_and_results_do_not_change() {
        let fx = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures");
        let mut m = Backbone::load(&fx.join("release/base"), &LoadOptions::default()).unwrap();
        let tokens: Vec<u32> = (0..300).map(|i| (i * 7 % 200) as u32).collect();
        let wanted = [0, 150, 299];
        let run = |m: &Backbone| {
            let mut state = m.new_state();
            m.forward(Arm::Fp32, &mut state, &tokens, &wanted).unwrap()
        };
        let first = run(&m);
        assert_eq!(
            m.pool.held(),
            1,
            "the default limit keeps a small model's workspace"
        );
        assert_eq!(run(&m), first, "pooled buffers");
        m.pool = crate::scratch::WorkspacePool::new(1 << 10);
        assert_eq!(run(&m), first, "fresh buffers");
        assert_eq!(m.pool.held(), 0, "over the limit: not kept");
        assert_eq!(run(&m), first, "fresh buffers again");
    }
}
