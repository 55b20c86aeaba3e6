//! The int8 arm's plan: which projections stay float (islands), how weights are quantised (7 or 8 bits,
//! clip search, SmoothQuant factors from calibration ranges, fp32 GDN gate rows), and the quantisation of
//! one projection's rows by it ([`Int8Plan::quantise`]), which every int8 load runs.

use crate::error::EngineError;
use crate::kernels::int8::{PackedInt8, WeightQuant, smoothing_factors};
use crate::kernels::{Arm, PackedMatrix};
use crate::model::ProjectionKind;
use crate::model::build::{At, WeightRows};
use crate::model::linear::Weight;

/// The largest `|x[k]|` each projection saw per input during calibration, in the order of
/// [`crate::Backbone::projection_names`].
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
    /// Further projections left as islands, by index in [`crate::Backbone::projection_names`] order (the
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

    /// Whether the projection at `at` is an island of this plan.
    pub(crate) fn is_island(&self, at: At) -> bool {
        self.bf16_islands.contains(&at.kind)
            || self.bf16_layer_islands.contains(&(at.layer, at.kind))
            || self.islands_at.contains(&at.id)
    }

    /// SmoothQuant `α = 0.5` on the projections that read a norm output (needs calibration rows).
    pub fn smoothed() -> Self {
        Int8Plan {
            scope: SmoothScope::NormInputs,
            ..Int8Plan::default()
        }
    }
}

impl Int8Plan {
    /// The arm its islands compute in.
    pub(crate) fn island_arm(&self) -> Result<Arm, EngineError> {
        match self.island_arm {
            Arm::Int8 => Err(EngineError::Int8(
                "an int8 island is no island: use fp32 or bf16".into(),
            )),
            arm => Ok(arm),
        }
    }

    /// The projection at `at` by this plan, from its `rows`: an island's float panels, or its int8 form
    /// (SmoothQuant factors from `act`, its input's calibration ranges, where the plan smooths its kind; the
    /// GDN gate rows kept in fp32 where it says so).
    pub(crate) fn build(
        &self,
        at: At,
        rows: &dyn WeightRows,
        act: Option<&[f32]>,
        gate_rows: usize,
    ) -> Result<Weight, EngineError> {
        let arm = self.island_arm()?;
        if self.is_island(at) {
            return Ok(Weight::Island {
                w: rows.pack(),
                arm,
            });
        }
        self.quantise(at, rows, act, gate_rows)
    }

    /// [`Int8Plan::build`] for a projection that is no island.
    pub(crate) fn quantise(
        &self,
        at: At,
        rows: &dyn WeightRows,
        act: Option<&[f32]>,
        gate_rows: usize,
    ) -> Result<Weight, EngineError> {
        let (n, k) = (rows.n(), rows.k());
        let name = at.name();
        let fp32_rows = (self.gdn_gates_fp32 && at.kind == ProjectionKind::GdnIn)
            .then(|| last_rows(rows, gate_rows, &name))
            .transpose()?;
        let wanted = match self.scope {
            SmoothScope::None => false,
            SmoothScope::NormInputs => at.kind.reads_norm(),
            SmoothScope::All => true,
        };
        let factors = match act.filter(|_| wanted) {
            Some(a) if a.len() == k => Some(smoothing_factors(a, &column_maxima(rows), self.alpha)),
            Some(a) => {
                return Err(EngineError::Int8(format!(
                    "{name}: {} activation ranges for {k} inputs",
                    a.len()
                )));
            }
            None => None,
        };
        let quant = WeightQuant {
            clip: self.weight_clip,
            narrow: self.narrow_weights,
        };
        let q =
            PackedInt8::from_rows_opts(n, k, |r, out| rows.row(r, out), factors.as_deref(), quant);
        if self.weights_only {
            if fp32_rows.is_some() {
                return Err(EngineError::Int8(format!(
                    "{name}: weights_only over fp32 gate rows"
                )));
            }
            // The dev-split ablation: the dequantised weights times unquantised activations, in fp32.
            let mut deq = vec![0f32; n * k];
            for (r, row) in deq.chunks_mut(k).enumerate() {
                for (c, v) in row.iter_mut().enumerate() {
                    *v = q.get(r, c);
                }
            }
            return Ok(Weight::Island {
                w: PackedMatrix::from_f32(n, k, &deq),
                arm: Arm::Fp32,
            });
        }
        Ok(Weight::Int8 { q, fp32_rows })
    }
}

/// The last `t` rows of a projection as float panels (the GDN gate rows the int8 arm computes in fp32).
pub(crate) fn last_rows(
    rows: &dyn WeightRows,
    t: usize,
    name: &str,
) -> Result<PackedMatrix, EngineError> {
    let (n, k) = (rows.n(), rows.k());
    if t > n {
        return Err(EngineError::Int8(format!(
            "{name}: no {t} rows to keep in fp32 (it has {n})"
        )));
    }
    let mut tail = vec![0f32; t * k];
    for (r, row) in tail.chunks_mut(k).enumerate() {
        rows.row(n - t + r, row);
    }
    Ok(PackedMatrix::from_f32(t, k, &tail))
}

/// `max_r |w[r][c]|` per input column.
fn column_maxima(rows: &dyn WeightRows) -> Vec<f32> {
    let (n, k) = (rows.n(), rows.k());
    let mut wmax = vec![0f32; k];
    let mut row = vec![0f32; k];
    for r in 0..n {
        rows.row(r, &mut row);
        for (m, v) in wmax.iter_mut().zip(&row) {
            *m = m.max(v.abs());
        }
    }
    wmax
}
