//! Calibration of the int8 arm: per-input activation ranges observed on calibration rows, and the
//! quantisation of every projection from them (SmoothQuant factors, `kernels/int8.rs`).
//!
//! Ranges are recorded by an [`ActivationObserver`] that the calibration's forwards carry
//! ([`crate::CpuBackend::observed`] → [`Backbone::forward_batch_observed`] → `Linear::apply`; any arm, the fp32
//! arm giving the statistics of the reference computation). The weights are not touched while observed: the
//! observer is the only thing those forwards write besides their states, so other services over the same
//! weights run meanwhile unseen and unchanged. The int8 plan (each projection's island) is chosen once, at
//! load: through `&mut Backbone` ([`Backbone::quantize_int8`]), or layer by layer as the model loads
//! ([`Backbone::load_quantised`]).

use crate::error::EngineError;
use crate::kernels::int8::{WeightQuant, smoothing_factors};
use crate::kernels::{Arm, PackedMatrix};
use crate::model::{
    ActivationObserver, Backbone, Form, Island, Layer, Linear, Mixer, ProjectionKind,
};

/// The largest `|x[k]|` each projection saw per input during calibration, in the order of
/// [`Backbone::projection_names`].
#[derive(Debug, Clone, PartialEq)]
pub struct ActivationRanges {
    /// One vector per projection (its input width), or `None` when no row reached it.
    pub per_projection: Vec<Option<Vec<f32>>>,
}

/// Which projections the int8 arm smooths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SmoothScope {
    /// None (plain W8A8).
    None,
    /// The projections that read an RMSNorm output: GDN `in_proj_*`, attention `q/k/v`, MLP `gate/up`
    /// (where SmoothQuant folds the factors into the norm weight).
    NormInputs,
    /// Every projection.
    All,
}

/// How to quantise the projections for the int8 arm.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Int8Plan {
    /// Smoothing strength `α` (0.5 balances activation and weight ranges).
    pub alpha: f32,
    /// Which projections are smoothed.
    pub scope: SmoothScope,
    /// Projections the int8 arm leaves in BF16 (computed as the bf16 arm computes them).
    pub bf16_islands: &'static [ProjectionKind],
    /// Projections left in BF16 by (decoder layer, kind).
    pub bf16_layer_islands: &'static [(usize, ProjectionKind)],
    /// Further projections left as islands, by index in [`Backbone::projection_names`] order (the
    /// dev-split ablations).
    pub islands_at: &'static [usize],
    /// The arm the islands run: [`Arm::Bf16`] (the product), or [`Arm::Fp32`] (the dev-split ablations:
    /// the quantisation error of the other projections alone).
    pub island_arm: Arm,
    /// Compute the GDN gate rows (`in_proj_b`, `in_proj_a`: 2 per value head, 0.5 % of `in_proj` on
    /// Kev-4B) in fp32: they set each token's decay and write strength of the recurrent state.
    pub gdn_gates_fp32: bool,
    /// Choose each weight row's scale by the least squared rounding error over clip ratios
    /// 1.00, 0.99, …, 0.80 of `max|w|` (instead of `max|w|` itself).
    pub weight_clip: bool,
    /// 7-bit weights (`q_w` in `[−63, 63]`, [`WeightQuant::narrow`]): AVX2 then multiplies with
    /// `vpmaddubsw`, exactly, at a third fewer vector operations per product than `vpmaddwd`.
    pub narrow_weights: bool,
    /// Dev-split ablation only: the int8 weights (dequantised) times unquantised f32 activations, to
    /// separate the weights' share of the error from the activations'. Not a product arm (no speed-up).
    pub weights_only: bool,
}

/// The int8 arm's rule (issue 20), fixed on kev-mini's dev split before its test split was run
/// (`crates/decide/tests/int8_dev.rs` measures every candidate; engine README, "int8 arm"): one projection
/// int8 at a time, every other fp32, only layer 0's GDN `in_proj` and `out_proj` moved p off the fp32 floor
/// (rms |Δp| 0.0017 and 0.0011 alone, all fourteen others 0.0003 = the floor); keeping those two in BF16
/// took plain W8A8 from max |Δp| 0.0138 / mean 0.0011 to 0.0047 / 0.00033 (the merged-bf16 arm: 0.0036 /
/// 0.00029). Size bound: the first layer's mixer projections are 1.2 % of Kev-4B's projection weights
/// (42 M of 3,569 M), so the int8 arm keeps its speed-up. Smoothing, clip search and fp32 GDN gates were
/// measured and not taken (no gain, or worse). Issue 29 added 7-bit weights to the rule, chosen on the
/// same dev split (`int8_narrow_weights_on_the_dev_split`): max / mean / rms |Δp| 0.0045 / 0.00034 /
/// 0.00069 against the 8-bit rule's 0.0047 / 0.00033 / 0.00068 (0 flips both), so no measurable cost,
/// and AVX2 multiplies them with `vpmaddubsw` at 1.3–1.4× the GEMM rate of `vpmaddwd` on 8-bit weights.
pub const RULE_BF16_ISLANDS: &[(usize, ProjectionKind)] =
    &[(0, ProjectionKind::GdnIn), (0, ProjectionKind::GdnOut)];

impl Default for Int8Plan {
    /// The rule: W7A8 (7-bit weights per output channel stored as int8, 8-bit activations per token, no
    /// smoothing) with layer 0's GDN `in_proj` and `out_proj` in BF16 ([`RULE_BF16_ISLANDS`]).
    fn default() -> Self {
        Int8Plan {
            alpha: 0.5,
            scope: SmoothScope::None,
            bf16_islands: &[],
            bf16_layer_islands: RULE_BF16_ISLANDS,
            islands_at: &[],
            island_arm: Arm::Bf16,
            gdn_gates_fp32: false,
            weight_clip: false,
            narrow_weights: true,
            weights_only: false,
        }
    }
}

impl Int8Plan {
    /// Plain W8A8 on every projection: 8-bit weights, no smoothing, no islands (the pre-rule arm; the
    /// ablations).
    pub fn plain() -> Self {
        Int8Plan {
            bf16_layer_islands: &[],
            narrow_weights: false,
            ..Int8Plan::default()
        }
    }

    /// Whether projection `index` (of [`Backbone::projection_names`]), of `kind` in decoder layer
    /// `layer`, is an island of this plan.
    fn is_island(&self, index: usize, layer: usize, kind: ProjectionKind) -> bool {
        self.bf16_islands.contains(&kind)
            || self.bf16_layer_islands.contains(&(layer, kind))
            || self.islands_at.contains(&index)
    }

    /// SmoothQuant `α = 0.5` on the projections that read a norm output (needs calibration rows).
    pub fn smoothed() -> Self {
        Int8Plan {
            scope: SmoothScope::NormInputs,
            ..Int8Plan::default()
        }
    }
}

impl Linear {
    /// Keep the last `t` output rows in fp32 for the int8 arm ([`Linear::float_tail`]), copied from the
    /// float weights (which must still be loaded). Returns their bytes.
    pub(crate) fn keep_float_rows(&self, t: usize, name: &str) -> Result<usize, EngineError> {
        let (n, k) = (self.w.n(), self.w.k());
        if self.w.float_dropped() || t > n {
            return Err(EngineError::Int8(format!(
                "{name}: no float weights to keep {t} rows of"
            )));
        }
        let mut rows = vec![0f32; t * k];
        for (r, row) in rows.chunks_mut(k).enumerate() {
            for (c, v) in row.iter_mut().enumerate() {
                *v = self.w.get(n - t + r, c);
            }
        }
        let tail = PackedMatrix::from_f32(t, k, &rows);
        let bytes = tail.bytes();
        self.float_tail
            .set(tail)
            .map_err(|_| EngineError::Int8(format!("{name}: its fp32 rows were already built")))?;
        Ok(bytes)
    }
}

impl Backbone {
    /// Rows of the GDN gates `in_proj_b`, `in_proj_a` at the end of each fused `in_proj`.
    pub(crate) fn gdn_gate_rows(&self) -> usize {
        2 * self.cfg.linear_num_value_heads
    }
}

impl Backbone {
    /// Every projection with its kind, in a fixed order.
    pub(crate) fn projections(&self) -> Vec<(String, &Linear, ProjectionKind)> {
        use ProjectionKind as K;
        let mut out = Vec::new();
        for (i, l) in self.layers.iter().enumerate() {
            let (mixer_in, mixer_out, kinds) = match &l.mixer {
                Mixer::Gdn(g) => (&g.in_proj, &g.out_proj, [K::GdnIn, K::GdnOut]),
                Mixer::Attn(a) => (&a.qkv, &a.o_proj, [K::AttnQkv, K::AttnOut]),
            };
            for (lin, kind) in [
                (mixer_in, kinds[0]),
                (mixer_out, kinds[1]),
                (&l.gate_up, K::MlpGateUp),
                (&l.down, K::MlpDown),
            ] {
                out.push((projection_name(i, kind), lin, kind));
            }
        }
        out
    }

    /// The decoder layer of every projection, in the order of [`Backbone::projections`].
    pub(crate) fn projection_layers(&self) -> Vec<usize> {
        let mut out = Vec::new();
        for i in 0..self.layers.len() {
            out.extend([i; 4]);
        }
        out
    }

    /// Every projection, mutably, in the order of [`Backbone::projections`].
    pub(crate) fn projections_mut(&mut self) -> Vec<&mut Linear> {
        let mut out = Vec::new();
        for l in &mut self.layers {
            match &mut l.mixer {
                Mixer::Gdn(g) => out.extend([&mut g.in_proj, &mut g.out_proj]),
                Mixer::Attn(a) => out.extend([&mut a.qkv, &mut a.o_proj]),
            }
            out.extend([&mut l.gate_up, &mut l.down]);
        }
        out
    }

    /// The names the int8 form and [`ActivationRanges`] use for the (fused) projections, in order.
    pub fn projection_names(&self) -> Vec<String> {
        self.projections().into_iter().map(|(n, _, _)| n).collect()
    }

    /// An observer of this model's projection inputs, for the forwards of an int8 calibration
    /// ([`crate::CpuBackend::observed`], [`Backbone::forward_batch_observed`]); read it back with
    /// [`Backbone::activation_ranges`].
    pub fn activation_observer(&self) -> ActivationObserver {
        ActivationObserver {
            ranges: self
                .projections()
                .into_iter()
                .map(|(_, l, _)| {
                    (
                        l as *const Linear as usize,
                        std::sync::Mutex::new(vec![0.0; l.w.k()]),
                    )
                })
                .collect(),
        }
    }

    /// What `observer` recorded, per projection in [`Backbone::projections`] order (`None` where no row
    /// reached it).
    pub fn activation_ranges(&self, observer: &ActivationObserver) -> ActivationRanges {
        let per_projection = self
            .projections()
            .into_iter()
            .map(|(_, l, _)| {
                observer
                    .ranges
                    .get(&(l as *const Linear as usize))
                    .map(|r| r.lock().unwrap_or_else(|e| e.into_inner()).clone())
                    .filter(|r| r.iter().any(|x| *x > 0.0))
            })
            .collect();
        ActivationRanges { per_projection }
    }

    /// Quantise every projection for the int8 arm now, smoothed by `plan` where `ranges` has
    /// statistics. Fails if a projection's int8 form was already built (an int8 call ran before).
    /// Returns the bytes of the int8 forms.
    pub fn quantize_int8(
        &mut self,
        ranges: Option<&ActivationRanges>,
        plan: Int8Plan,
    ) -> Result<usize, EngineError> {
        let lins = self.projections();
        if let Some(r) = ranges
            && r.per_projection.len() != lins.len()
        {
            return Err(EngineError::Int8(format!(
                "{} activation ranges for {} projections",
                r.per_projection.len(),
                lins.len()
            )));
        }
        let island = plan.island()?;
        let gates = self.gdn_gate_rows();
        let layers = self.projection_layers();
        let mut bytes = 0;
        let mut islands = vec![Island::None; lins.len()];
        for (i, (name, l, kind)) in lins.iter().enumerate() {
            if plan.is_island(i, layers[i], *kind) {
                islands[i] = island;
                continue;
            }
            let act = ranges.and_then(|r| r.per_projection[i].as_deref());
            bytes += l.quantize(name, *kind, gates, &plan, act)?;
        }
        drop(lins);
        for (l, island) in self.projections_mut().into_iter().zip(islands) {
            l.island = island;
        }
        Ok(bytes)
    }
}

impl Int8Plan {
    /// How its islands compute.
    fn island(&self) -> Result<Island, EngineError> {
        match self.island_arm {
            Arm::Fp32 => Ok(Island::Fp32),
            Arm::Bf16 => Ok(Island::Bf16),
            Arm::Int8 => Err(EngineError::Int8(
                "an int8 island is no island: use fp32 or bf16".into(),
            )),
        }
    }
}

/// Decoder layer `li`'s four (fused) projections with their kinds and names: projection `slot` of the
/// layer is projection `4·li + slot` of [`Backbone::projections`] (mixer in, mixer out, MLP gate/up, MLP
/// down).
pub(crate) fn layer_projections(
    layer: &mut Layer,
    li: usize,
) -> [(&mut Linear, ProjectionKind, String); 4] {
    use ProjectionKind as K;
    let (mixer_in, mixer_out, kinds) = match &mut layer.mixer {
        Mixer::Gdn(g) => (&mut g.in_proj, &mut g.out_proj, [K::GdnIn, K::GdnOut]),
        Mixer::Attn(a) => (&mut a.qkv, &mut a.o_proj, [K::AttnQkv, K::AttnOut]),
    };
    [
        (mixer_in, kinds[0], projection_name(li, kinds[0])),
        (mixer_out, kinds[1], projection_name(li, kinds[1])),
        (
            &mut layer.gate_up,
            K::MlpGateUp,
            projection_name(li, K::MlpGateUp),
        ),
        (&mut layer.down, K::MlpDown, projection_name(li, K::MlpDown)),
    ]
}

/// The name of decoder layer `li`'s (fused) projection of this kind, as the stored int8 form and
/// [`Backbone::projection_names`] write it.
pub(crate) fn projection_name(li: usize, kind: ProjectionKind) -> String {
    use ProjectionKind as K;
    let name = match kind {
        K::GdnIn => "linear_attn.in_proj",
        K::GdnOut => "linear_attn.out_proj",
        K::AttnQkv => "self_attn.qkv_proj",
        K::AttnOut => "self_attn.o_proj",
        K::MlpGateUp => "mlp.gate_up_proj",
        K::MlpDown => "mlp.down_proj",
    };
    format!("layers.{li}.{name}")
}

/// The form the load by `plan` packs decoder layer `li`'s projection `slot` in: its int8 form straight
/// from the checkpoint where [`quantize_layer`] would quantise the float panels as they are (no
/// smoothing, no float gate rows, no dequantised ablation), else float (islands, and what
/// [`quantize_layer`] still quantises from the panels).
pub(crate) fn load_form(plan: &Int8Plan, li: usize, slot: usize, kind: ProjectionKind) -> Form {
    let float = plan.is_island(4 * li + slot, li, kind)
        || plan.scope != SmoothScope::None
        || plan.weights_only
        || (plan.gdn_gates_fp32 && kind == ProjectionKind::GdnIn);
    if float {
        Form::Float
    } else {
        Form::Int8(WeightQuant {
            clip: plan.weight_clip,
            narrow: plan.narrow_weights,
        })
    }
}

/// Quantise decoder layer `li`'s projections by `plan` as soon as the layer is packed, and drop each float
/// copy but the islands' ([`Backbone::load_quantised`]): the model never holds its float projections and
/// their int8 forms at once. No activation ranges: a plan that smooths needs calibration
/// ([`Backbone::quantize_int8`]).
pub(crate) fn quantize_layer(
    layer: &mut Layer,
    li: usize,
    plan: &Int8Plan,
    gates: usize,
) -> Result<(), EngineError> {
    let island = plan.island()?;
    for (slot, (l, kind, name)) in layer_projections(layer, li).into_iter().enumerate() {
        if plan.is_island(4 * li + slot, li, kind) {
            l.island = island;
            continue;
        }
        if l.w.float_dropped() {
            // Built in its int8 form as it was packed (`load_form`).
            continue;
        }
        l.quantize(&name, kind, gates, plan, None)?;
        l.w.drop_float();
    }
    Ok(())
}

impl Linear {
    /// Build this projection's int8 form by `plan` (SmoothQuant factors from `act`, its input's recorded
    /// ranges, where the plan smooths its kind; the GDN gate rows kept in fp32 where it says so). Returns
    /// the bytes built.
    pub(crate) fn quantize(
        &self,
        name: &str,
        kind: ProjectionKind,
        gates: usize,
        plan: &Int8Plan,
        act: Option<&[f32]>,
    ) -> Result<usize, EngineError> {
        let mut bytes = 0;
        if plan.gdn_gates_fp32 && kind == ProjectionKind::GdnIn {
            bytes += self.keep_float_rows(gates, name)?;
        }
        let wanted = match plan.scope {
            SmoothScope::None => false,
            SmoothScope::NormInputs => kind.reads_norm(),
            SmoothScope::All => true,
        };
        let act = act.filter(|_| wanted);
        let factors = match act {
            Some(a) if a.len() == self.w.k() => {
                let w = &self.w;
                let mut wmax = vec![0f32; w.k()];
                for r in 0..w.n() {
                    for (c, m) in wmax.iter_mut().enumerate() {
                        *m = m.max(w.get(r, c).abs());
                    }
                }
                Some(smoothing_factors(a, &wmax, plan.alpha))
            }
            Some(a) => {
                return Err(EngineError::Int8(format!(
                    "{name}: {} activation ranges for {} inputs",
                    a.len(),
                    self.w.k()
                )));
            }
            None => None,
        };
        let quant = WeightQuant {
            clip: plan.weight_clip,
            narrow: plan.narrow_weights,
        };
        let q = self.w.quantised(factors.as_deref(), quant);
        bytes += q.bytes();
        if plan.weights_only {
            let (n, k) = (q.n(), q.k());
            let mut deq = vec![0f32; n * k];
            for (r, row) in deq.chunks_mut(k).enumerate() {
                for (c, v) in row.iter_mut().enumerate() {
                    *v = q.get(r, c);
                }
            }
            if self
                .float_tail
                .set(PackedMatrix::from_f32(n, k, &deq))
                .is_err()
            {
                return Err(EngineError::Int8(format!(
                    "{name}: weights_only over fp32 gate rows"
                )));
            }
        }
        if !self.w.set_int8(q) {
            return Err(EngineError::Int8(format!(
                "{name}: its int8 form was already built (quantise before the first int8 call)"
            )));
        }
        Ok(bytes)
    }
}
