//! Building a model's layers from the checkpoint tree, each projection in the form its load chooses.
//!
//! A projection is read as its rows ([`WeightRows`]): the checkpoint's, with an adapter merged a row at a
//! time where the load merges it ([`kev_release::RowMerge`], the merge's one row step), or a float model's
//! panels (when an int8 model is made from one). What a load makes of those rows is its own choice (a
//! [`MakeWeight`]): float panels for the float arms, an int8 form by a plan or a stored file. So no
//! projection is ever packed in one form only to be converted into another.

use kev_release::shards::Dtype;
use rayon::prelude::*;

use crate::adapter::{Adapter, LoraSeg};
use crate::attention::Attention;
use crate::error::EngineError;
use crate::gdn::Gdn;
use crate::kernels::PackedMatrix;
use crate::kernels::pack::{Part, PartRows, Source};
use crate::model::embed::Embedding;
use crate::model::layer::{Layer, Mixer, Mlp};
use crate::model::linear::{Linear, Weight};
use crate::model::observe::ProjectionKind;
use crate::model::{Backbone, WeightArms, next_id, norm1p, rope_inv_freq};
use crate::scratch::with_tls;
use crate::weights::{self, Projection, Weights};

/// Where a projection is built: its decoder layer, kind and index in the model's projection order.
#[derive(Debug, Clone, Copy)]
pub(crate) struct At {
    pub layer: usize,
    pub kind: ProjectionKind,
    pub id: usize,
}

impl At {
    /// The projection's name (`layers.3.mlp.gate_up_proj`).
    pub fn name(self) -> String {
        self.kind.name(self.layer)
    }
}

/// A projection's rows, as a load reads them.
pub(crate) trait WeightRows: Sync {
    /// Output rows.
    fn n(&self) -> usize;
    /// Input columns.
    fn k(&self) -> usize;
    /// Row `r`, widened to f32.
    fn row(&self, r: usize, out: &mut [f32]);
    /// The rows as float panels (BF16 storage unless some value is not a bf16).
    fn pack(&self) -> PackedMatrix;
}

/// What a load makes of each projection's rows.
pub(crate) type MakeWeight<'a> = &'a dyn Fn(At, &dyn WeightRows) -> Result<Weight, EngineError>;

impl Backbone {
    /// Build every layer of the tree, each projection as `make` makes it (`merge`: each adapter merged into
    /// its weights, else kept as the model's own unmerged adapter); `arms` says what the result runs.
    pub(crate) fn build(
        w: &Weights<'_>,
        (merge, kern): (bool, crate::kernels::Kernels),
        arms: WeightArms,
        make: MakeWeight<'_>,
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
        let mut segments = Vec::new();
        let layers = w
            .layers
            .iter()
            .enumerate()
            .map(|(li, l)| build_layer(w, (li, l), merge, make, &mut segments))
            .collect::<Result<Vec<_>, EngineError>>()?;
        let id = next_id();
        let adapter = (!merge && w.has_lora()).then_some(Adapter {
            model: id,
            segments,
        });
        Ok(Backbone {
            final_norm: norm1p(&w.norm),
            inv_freq: rope_inv_freq(cfg.rope_theta, cfg.rotary_dim),
            cfg,
            embed,
            layers,
            kern,
            pool: crate::scratch::WorkspacePool::new(crate::scratch::WORKSPACE_KEEP),
            arms,
            adapter,
            merged_adapter: merge && w.has_lora(),
            id,
        })
    }
}

/// Build decoder layer `li`; the LoRA segments of its projections (when not merged) go to `segments`.
fn build_layer(
    w: &Weights<'_>,
    (li, l): (usize, &weights::DecoderLayer<'_>),
    merge: bool,
    make: MakeWeight<'_>,
    segments: &mut Vec<Vec<LoraSeg>>,
) -> Result<Layer, EngineError> {
    use ProjectionKind as K;
    let mut proj = |kind: ProjectionKind, parts: &[&Projection<'_>]| {
        let at = At {
            layer: li,
            kind,
            id: 4 * li + kind.slot(),
        };
        let (linear, segs) = build_linear(w, parts, merge, (at, make))?;
        segments.push(segs);
        Ok::<_, EngineError>(linear)
    };
    let mixer = match &l.mixer {
        weights::Mixer::LinearAttn(g) => {
            let in_proj = proj(
                K::GdnIn,
                &[&g.in_proj_qkv, &g.in_proj_z, &g.in_proj_b, &g.in_proj_a],
            )?;
            let out_proj = proj(K::GdnOut, &[&g.out_proj])?;
            let (cd, taps) = (w.config.conv_dim(), w.config.conv_kernel);
            let conv = g.conv1d.to_f32();
            let mut conv_t = vec![0f32; taps * cd];
            for c in 0..cd {
                for j in 0..taps {
                    conv_t[j * cd + c] = conv[c * taps + j];
                }
            }
            Mixer::Gdn(Gdn {
                in_proj,
                conv_t,
                dt_bias: g.dt_bias.to_f32(),
                neg_a: g.a_log.to_f32().iter().map(|x| -x.exp()).collect(),
                norm: g.norm.to_f32(),
                out_proj,
            })
        }
        weights::Mixer::SelfAttn(a) => {
            let qkv = proj(K::AttnQkv, &[&a.q_proj, &a.k_proj, &a.v_proj])?;
            let o_proj = proj(K::AttnOut, &[&a.o_proj])?;
            Mixer::Attention(Attention {
                qkv,
                q_norm: norm1p(&a.q_norm),
                k_norm: norm1p(&a.k_norm),
                o_proj,
            })
        }
    };
    let gate_up = proj(K::MlpGateUp, &[&l.mlp.gate_proj, &l.mlp.up_proj])?;
    let down = proj(K::MlpDown, &[&l.mlp.down_proj])?;
    Ok(Layer {
        input_norm: norm1p(&l.input_layernorm),
        mixer,
        post_norm: norm1p(&l.post_attention_layernorm),
        mlp: Mlp { gate_up, down },
    })
}

/// The vertical concatenation of `parts` (projections reading the same input) as one projection, made by
/// `make`; each LoRA merged into its part's rows, or returned as a segment over the part's columns.
fn build_linear(
    w: &Weights<'_>,
    parts: &[&Projection<'_>],
    merge: bool,
    (at, make): (At, MakeWeight<'_>),
) -> Result<(Linear, Vec<LoraSeg>), EngineError> {
    let k = parts[0].cols();
    let mut segs = Vec::new();
    let mut col = 0;
    for p in parts {
        if !merge && let Some(pair) = &p.lora {
            segs.push(LoraSeg::new(pair, col, p.rows(), k));
        }
        col += p.rows();
    }
    let loras: Vec<_> = parts
        .iter()
        .map(|p| if merge { p.lora_weights() } else { None })
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
    let rows = CheckpointRows {
        at: PartRows::new(srcs.iter().map(|p| p.rows)),
        srcs,
        k,
    };
    let weight = make(at, &rows)?;
    for p in parts {
        w.release(&p.weight);
    }
    Ok((Linear { weight, id: at.id }, segs))
}

/// A projection's weight as the checkpoint stores it (BF16 or F32).
fn stored<'a>(p: &Projection<'a>) -> Source<'a> {
    if p.weight.dtype() == Dtype::BF16 {
        Source::Bf16(p.weight.view().data)
    } else {
        Source::F32(p.weight.view().data)
    }
}

/// A (fused) projection's rows from the checkpoint, parts stacked.
struct CheckpointRows<'a> {
    srcs: Vec<Part<'a>>,
    at: PartRows,
    k: usize,
}

impl WeightRows for CheckpointRows<'_> {
    fn n(&self) -> usize {
        self.at.n()
    }

    fn k(&self) -> usize {
        self.k
    }

    fn row(&self, r: usize, out: &mut [f32]) {
        let (pi, r) = self.at.locate(r);
        self.srcs[pi].src.row_f32(r, self.k, out);
    }

    fn pack(&self) -> PackedMatrix {
        PackedMatrix::from_parts(self.k, &self.srcs)
    }
}

/// A loaded float projection's rows, read back from its panels (the values it was packed from).
pub(crate) struct PanelRows<'a>(pub &'a PackedMatrix);

impl WeightRows for PanelRows<'_> {
    fn n(&self) -> usize {
        self.0.n()
    }

    fn k(&self) -> usize {
        self.0.k()
    }

    fn row(&self, r: usize, out: &mut [f32]) {
        for (c, o) in out.iter_mut().enumerate() {
            *o = self.0.get(r, c);
        }
    }

    fn pack(&self) -> PackedMatrix {
        let (n, k) = (self.0.n(), self.0.k());
        let mut rows = vec![0f32; n * k];
        rows.par_chunks_mut(k.max(1))
            .enumerate()
            .for_each(|(r, row)| self.row(r, row));
        PackedMatrix::from_f32(n, k, &rows)
    }
}
