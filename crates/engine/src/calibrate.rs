//! Calibration of the int8 arm: per-input activation ranges observed on calibration rows, and the
//! quantisation of every projection from them (SmoothQuant factors, `kernels/int8.rs`).
//!
//! Ranges are recorded per projection by [`crate::model::Linear::apply`] while [`Backbone::calibrate_int8`]
//! runs the caller's forward passes (on any arm; the fp32 arm gives the statistics of the reference
//! computation). Each projection keeps its own record, so other models running meanwhile are not seen.

use crate::error::EngineError;
use crate::kernels::int8::{PackedInt8, smoothing_factors};
use crate::model::{Backbone, Linear, Mixer};

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

/// How to quantise the projections for the int8 arm.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Int8Plan {
    /// Smoothing strength `α` (0.5 balances activation and weight ranges).
    pub alpha: f32,
    /// Which projections are smoothed.
    pub scope: SmoothScope,
    /// Projections the int8 arm leaves in BF16 (computed as the bf16 arm computes them).
    pub bf16_islands: &'static [ProjectionKind],
}

impl Default for Int8Plan {
    /// Plain W8A8: no smoothing, no islands — what the rule fixed on kev-mini's dev split chose (engine
    /// README, "int8 arm").
    fn default() -> Self {
        Int8Plan {
            alpha: 0.5,
            scope: SmoothScope::None,
            bf16_islands: &[],
        }
    }
}

impl Int8Plan {
    /// SmoothQuant `α = 0.5` on the projections that read a norm output (needs calibration rows).
    pub fn smoothed() -> Self {
        Int8Plan {
            scope: SmoothScope::NormInputs,
            ..Int8Plan::default()
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

impl Backbone {
    /// Every projection with its kind, in a fixed order.
    pub(crate) fn projections(&self) -> Vec<(String, &Linear, ProjectionKind)> {
        use ProjectionKind as K;
        let mut out = Vec::new();
        for (i, l) in self.layers.iter().enumerate() {
            match &l.mixer {
                Mixer::Gdn(g) => {
                    out.push((
                        format!("layers.{i}.linear_attn.in_proj"),
                        &g.in_proj,
                        K::GdnIn,
                    ));
                    out.push((
                        format!("layers.{i}.linear_attn.out_proj"),
                        &g.out_proj,
                        K::GdnOut,
                    ));
                }
                Mixer::Attn(a) => {
                    out.push((format!("layers.{i}.self_attn.qkv_proj"), &a.qkv, K::AttnQkv));
                    out.push((
                        format!("layers.{i}.self_attn.o_proj"),
                        &a.o_proj,
                        K::AttnOut,
                    ));
                }
            }
            out.push((
                format!("layers.{i}.mlp.gate_up_proj"),
                &l.gate_up,
                K::MlpGateUp,
            ));
            out.push((format!("layers.{i}.mlp.down_proj"), &l.down, K::MlpDown));
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

    /// Run `calibration` (forward passes through this model) while recording each projection's
    /// per-input activation ranges; returns its result and the ranges.
    pub fn calibrate_int8<R>(&self, calibration: impl FnOnce() -> R) -> (R, ActivationRanges) {
        let lins = self.projections();
        for (_, l, _) in &lins {
            *l.ranges.lock().unwrap_or_else(|e| e.into_inner()) = Some(vec![0.0; l.w.k()]);
        }
        let out = calibration();
        let per_projection = lins
            .iter()
            .map(|(_, l, _)| {
                l.ranges
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .take()
                    .filter(|r| r.iter().any(|x| *x > 0.0))
            })
            .collect();
        (out, ActivationRanges { per_projection })
    }

    /// Quantise every projection for the int8 arm now, smoothed by `plan` where `ranges` has
    /// statistics. Fails if a projection's int8 form was already built (an int8 call ran before).
    /// Returns the bytes of the int8 forms.
    pub fn quantize_int8(
        &self,
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
        let mut bytes = 0;
        for (i, (name, l, kind)) in lins.iter().enumerate() {
            if plan.bf16_islands.contains(kind) {
                l.bf16_island
                    .store(true, std::sync::atomic::Ordering::Relaxed);
                continue;
            }
            let wanted = match plan.scope {
                SmoothScope::None => false,
                SmoothScope::NormInputs => kind.reads_norm(),
                SmoothScope::All => true,
            };
            let act = ranges
                .and_then(|r| r.per_projection[i].as_ref())
                .filter(|_| wanted);
            let factors = match act {
                Some(a) if a.len() == l.w.k() => {
                    let w = &l.w;
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
                        l.w.k()
                    )));
                }
                None => None,
            };
            let q = PackedInt8::from_packed(&l.w, factors.as_deref());
            bytes += q.bytes();
            if !l.w.set_int8(q) {
                return Err(EngineError::Int8(format!(
                    "{name}: its int8 form was already built (quantise before the first int8 call)"
                )));
            }
        }
        Ok(bytes)
    }
}
