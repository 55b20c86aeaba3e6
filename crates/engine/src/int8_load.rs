//! The int8 arm's loads: each projection's int8 form made as the layer is packed — quantised by a plan
//! (`calibrate`), or read from a stored form (`int8_file`) — and its float copy never kept.

use std::path::Path;

use crate::error::EngineError;
use crate::kernels::Kernels;
use crate::model::{Backbone, LoadOptions, LoadSteps};
use crate::weights::Checkpoint;

/// Where [`Backbone::load_quantised`] takes each projection's int8 form from.
#[derive(Debug, Clone, Copy)]
pub enum Int8Source<'a> {
    /// Quantised at load by a plan without smoothing (the rule: `Int8Plan` with `SmoothScope::None`).
    Rule(&'a crate::Int8Plan),
    /// Read from a stored form (`int8.safetensors`, written by [`Backbone::write_int8`]).
    Stored(&'a Path),
}

impl Backbone {
    /// [`Backbone::load`] for the int8 arm alone: each layer's projections take their int8 form from
    /// `source` as soon as they are packed — quantised by a plan, or read from a stored form — and their
    /// float copies are dropped (but the islands'), so the peak memory of the load is about the int8
    /// model's, not the float model's plus its int8 form. Only the int8 arm can run the result. A plan
    /// must not need activation ranges (no smoothing: that needs calibration rows, see
    /// [`Backbone::quantize_int8`]; a stored form carries its smoothing factors).
    pub fn load_quantised(
        dir: &Path,
        opts: &LoadOptions,
        source: Int8Source<'_>,
    ) -> Result<Self, EngineError> {
        let ck = Checkpoint::open(dir)?;
        let weights = ck.weights(opts.adapter.as_deref())?;
        let kern = opts.kernels.unwrap_or_else(Kernels::detect);
        let gates = 2 * weights.config.linear_num_value_heads;
        match source {
            Int8Source::Rule(plan) => Backbone::build(
                &weights,
                opts.merge_adapter,
                kern,
                Some(&LoadSteps {
                    form: &|li, slot, kind| crate::calibrate::load_form(plan, li, slot, kind),
                    per_layer: &|layer, li| {
                        crate::calibrate::quantize_layer(layer, li, plan, gates)
                    },
                }),
            ),
            Int8Source::Stored(path) => {
                let stored = crate::int8_file::StoredInt8::open(path)?;
                let model = Backbone::build(
                    &weights,
                    opts.merge_adapter,
                    kern,
                    Some(&LoadSteps {
                        form: &|li, _, kind| stored.load_form(li, kind),
                        per_layer: &|layer, li| stored.install_layer(layer, li, gates),
                    }),
                )?;
                stored.finish(&model)?;
                Ok(model)
            }
        }
    }
}
