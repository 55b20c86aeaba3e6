//! What the int8 arm's calibration watches: the kinds of projection, and an observer of their inputs.

use std::sync::Mutex;

use crate::config::Qwen35Config;
use crate::kernels::Rows;

/// The (fused) projections of a layer, in the order every list of a model's projections takes them.
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

    /// Its place among a layer's four projections (mixer in, mixer out, MLP gate/up, MLP down).
    pub fn slot(self) -> usize {
        match self {
            ProjectionKind::GdnIn | ProjectionKind::AttnQkv => 0,
            ProjectionKind::GdnOut | ProjectionKind::AttnOut => 1,
            ProjectionKind::MlpGateUp => 2,
            ProjectionKind::MlpDown => 3,
        }
    }

    /// The checkpoint modules fused in a projection of this kind (as [`crate::lora::TARGETS`] names them),
    /// with their output widths, in the order their rows are stacked.
    pub fn modules(self, c: &Qwen35Config) -> Vec<(&'static str, usize)> {
        let (nh, nkv, hd) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
        match self {
            ProjectionKind::GdnIn => vec![
                ("linear_attn.in_proj_qkv", c.conv_dim()),
                ("linear_attn.in_proj_z", c.value_dim()),
                ("linear_attn.in_proj_b", c.linear_num_value_heads),
                ("linear_attn.in_proj_a", c.linear_num_value_heads),
            ],
            ProjectionKind::GdnOut => vec![("linear_attn.out_proj", c.hidden_size)],
            ProjectionKind::AttnQkv => vec![
                ("self_attn.q_proj", 2 * nh * hd),
                ("self_attn.k_proj", nkv * hd),
                ("self_attn.v_proj", nkv * hd),
            ],
            ProjectionKind::AttnOut => vec![("self_attn.o_proj", c.hidden_size)],
            ProjectionKind::MlpGateUp => vec![
                ("mlp.gate_proj", c.intermediate_size),
                ("mlp.up_proj", c.intermediate_size),
            ],
            ProjectionKind::MlpDown => vec![("mlp.down_proj", c.hidden_size)],
        }
    }

    /// The name of decoder layer `li`'s projection of this kind, as the stored int8 form and
    /// [`crate::Backbone::projection_names`] write it.
    pub fn name(self, li: usize) -> String {
        let name = match self {
            ProjectionKind::GdnIn => "linear_attn.in_proj",
            ProjectionKind::GdnOut => "linear_attn.out_proj",
            ProjectionKind::AttnQkv => "self_attn.qkv_proj",
            ProjectionKind::AttnOut => "self_attn.o_proj",
            ProjectionKind::MlpGateUp => "mlp.gate_up_proj",
            ProjectionKind::MlpDown => "mlp.down_proj",
        };
        format!("layers.{li}.{name}")
    }
}

/// What a calibration forward records: per projection (by its index in the model's projection order), the
/// largest `|x[k]|` seen per input. Passed to the fp32 forwards that run the calibration rows
/// ([`crate::CpuBackend::observed`]; made by [`crate::Backbone::activation_observer`], read back by
/// [`crate::Backbone::activation_ranges`]), it is the only mutable thing those forwards touch: the weights
/// stay as loaded.
pub struct ActivationObserver {
    pub(crate) ranges: Vec<Mutex<Vec<f32>>>,
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
    /// Fold the rows of `x`, the input of projection `id`, into its maxima.
    pub(crate) fn record(&self, id: usize, x: Rows<'_>) {
        if let Some(r) = self.ranges.get(id) {
            let mut r = r.lock().unwrap_or_else(|e| e.into_inner());
            let k = r.len();
            for i in 0..x.m {
                for (mx, v) in r.iter_mut().zip(&x.data[i * x.ld..i * x.ld + k]) {
                    *mx = mx.max(v.abs());
                }
            }
        }
    }
}
