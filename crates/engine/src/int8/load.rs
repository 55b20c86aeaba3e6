//! The int8 arm's models: built from a checkpoint by a plan or a stored form ([`Backbone::load_quantised`]),
//! or from a loaded float model by a plan and its calibration ranges ([`Backbone::quantised`]); and the
//! observer a calibration's forwards carry.

use std::path::Path;
use std::sync::Mutex;

use crate::error::EngineError;
use crate::int8::plan::{ActivationRanges, Int8Plan};
use crate::int8::stored::StoredInt8;
use crate::kernels::Kernels;
use crate::model::build::{At, PanelRows};
use crate::model::linear::{Linear, Weight};
use crate::model::{ActivationObserver, Backbone, LoadOptions, WeightArms};
use crate::weights::Checkpoint;

/// Where [`Backbone::load_quantised`] takes each projection's int8 form from.
#[derive(Debug, Clone, Copy)]
pub enum Int8Source<'a> {
    /// Quantised at load by a plan (without calibration ranges: a plan that smooths needs them, see
    /// [`Backbone::quantised`]).
    Rule(&'a Int8Plan),
    /// Read from a stored form (`int8.safetensors`, written by [`Backbone::write_int8`]).
    Stored(&'a Path),
}

impl Backbone {
    /// [`Backbone::load`] for the int8 arm alone: each projection takes its int8 form from `source` as its
    /// rows are read — quantised by a plan, or read from a stored form — and no float copy is made (but
    /// the islands'), so the load peaks near the int8 model's size, not the float model's. Only the int8
    /// arm can run the result.
    pub fn load_quantised(
        dir: &Path,
        opts: &LoadOptions,
        source: Int8Source<'_>,
    ) -> Result<Self, EngineError> {
        let ck = Checkpoint::open(dir)?;
        let weights = ck.weights(opts.adapter.as_deref())?;
        let kern = opts.kernels.unwrap_or_else(Kernels::detect);
        let gates = 2 * weights.config.linear_num_value_heads;
        let how = (opts.merge_adapter, kern);
        match source {
            Int8Source::Rule(plan) => {
                Backbone::build(&weights, how, WeightArms::Int8, &|at, rows| {
                    plan.build(at, rows, None, gates)
                })
            }
            Int8Source::Stored(path) => {
                let stored = StoredInt8::open(path)?;
                let model = Backbone::build(&weights, how, WeightArms::Int8, &|at, rows| {
                    stored.build(at, rows, gates)
                })?;
                stored.finish(&model)?;
                Ok(model)
            }
        }
    }

    /// This float model as an int8 one by `plan`, smoothed from `ranges` (an int8 calibration's, recorded
    /// on this model: [`Backbone::activation_observer`]) where the plan smooths: each projection quantised
    /// from its float panels (the values it was loaded from), the islands' panels kept as they are. The
    /// float model is consumed; the result runs the int8 arm only.
    pub fn quantised(
        self,
        plan: &Int8Plan,
        ranges: Option<&ActivationRanges>,
    ) -> Result<Backbone, EngineError> {
        if self.arms != WeightArms::Float {
            return Err(EngineError::Int8("the model is int8 already".into()));
        }
        let count = self.layers.len() * 4;
        if let Some(r) = ranges
            && r.per_projection.len() != count
        {
            return Err(EngineError::Int8(format!(
                "{} activation ranges for {count} projections",
                r.per_projection.len()
            )));
        }
        let arm = plan.island_arm()?;
        let gates = 2 * self.cfg.linear_num_value_heads;
        let mut model = self;
        model.layers = std::mem::take(&mut model.layers)
            .into_iter()
            .enumerate()
            .map(|(li, layer)| {
                layer.map_projections(|kind, lin| {
                    let at = At {
                        layer: li,
                        kind,
                        id: lin.id,
                    };
                    let Weight::Float(w) = lin.weight else {
                        unreachable!("a float model's projections are float")
                    };
                    let weight = if plan.is_island(at) {
                        Weight::Island { w, arm }
                    } else {
                        let act = ranges.and_then(|r| r.per_projection[at.id].as_deref());
                        plan.quantise(at, &PanelRows(&w), act, gates)?
                    };
                    Ok(Linear { weight, id: lin.id })
                })
            })
            .collect::<Result<_, EngineError>>()?;
        model.arms = WeightArms::Int8;
        Ok(model)
    }

    /// An observer of this model's projection inputs, for the forwards of an int8 calibration
    /// ([`crate::CpuBackend::observed`], [`Backbone::forward_batch_with`]); read it back with
    /// [`Backbone::activation_ranges`].
    pub fn activation_observer(&self) -> ActivationObserver {
        let mut ranges: Vec<(usize, Mutex<Vec<f32>>)> = self
            .projections()
            .map(|(_, _, l): (_, _, &Linear)| (l.id, Mutex::new(vec![0.0; l.weight.k()])))
            .collect();
        ranges.sort_by_key(|(id, _)| *id);
        ActivationObserver {
            ranges: ranges.into_iter().map(|(_, r)| r).collect(),
        }
    }

    /// What `observer` recorded, per projection in projection order (`None` where no row reached it).
    pub fn activation_ranges(&self, observer: &ActivationObserver) -> ActivationRanges {
        let per_projection = observer
            .ranges
            .iter()
            .map(|r| {
                Some(r.lock().unwrap_or_else(|e| e.into_inner()).clone())
                    .filter(|r| r.iter().any(|x| *x > 0.0))
            })
            .collect();
        ActivationRanges { per_projection }
    }
}
