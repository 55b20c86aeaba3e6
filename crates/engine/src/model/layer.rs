//! A decoder layer: `x += mixer(norm(x))`, then `x += mlp(norm(x))` (qwen35-arch §3), the mixer a Gated
//! DeltaNet or a gated attention.

use rayon::prelude::*;

use crate::attention::Attention;
use crate::gdn::Gdn;
use crate::kernels::{Rows, RowsMut, math};
use crate::model::linear::Linear;
use crate::model::observe::ProjectionKind;
use crate::pass::{Acts, MLP_ROWS, Pass, Stack, add_rows, rms_norm_rows};
use crate::stages::Stage;

/// One decoder layer.
#[derive(Debug)]
pub(crate) struct Layer {
    /// `1 + input_layernorm.weight`.
    pub input_norm: Vec<f32>,
    pub mixer: Mixer,
    /// `1 + post_attention_layernorm.weight`.
    pub post_norm: Vec<f32>,
    pub mlp: Mlp,
}

/// A layer's token mixer.
#[derive(Debug)]
pub(crate) enum Mixer {
    Gdn(Gdn),
    Attention(Attention),
}

/// The SiLU-gated MLP: `down(silu(gate(x)) · up(x))`.
#[derive(Debug)]
pub(crate) struct Mlp {
    /// Fused `[gate_proj; up_proj]`.
    pub gate_up: Linear,
    pub down: Linear,
}

impl Layer {
    /// Its four projections with their kinds: mixer in, mixer out, MLP gate/up, MLP down.
    pub fn projections(&self) -> impl Iterator<Item = (ProjectionKind, &Linear)> {
        use ProjectionKind as K;
        let (mixer_in, mixer_out, kinds) = match &self.mixer {
            Mixer::Gdn(g) => (&g.in_proj, &g.out_proj, [K::GdnIn, K::GdnOut]),
            Mixer::Attention(a) => (&a.qkv, &a.o_proj, [K::AttnQkv, K::AttnOut]),
        };
        [
            (kinds[0], mixer_in),
            (kinds[1], mixer_out),
            (K::MlpGateUp, &self.mlp.gate_up),
            (K::MlpDown, &self.mlp.down),
        ]
        .into_iter()
    }

    /// The layer with each projection replaced by `f(kind, projection)`, in the order of
    /// [`Layer::projections`] (an int8 model made from a float one).
    pub fn map_projections<E>(
        self,
        mut f: impl FnMut(ProjectionKind, Linear) -> Result<Linear, E>,
    ) -> Result<Layer, E> {
        use ProjectionKind as K;
        let Layer {
            input_norm,
            mixer,
            post_norm,
            mlp,
        } = self;
        let mixer = match mixer {
            Mixer::Gdn(g) => Mixer::Gdn(Gdn {
                in_proj: f(K::GdnIn, g.in_proj)?,
                out_proj: f(K::GdnOut, g.out_proj)?,
                ..g
            }),
            Mixer::Attention(a) => Mixer::Attention(Attention {
                qkv: f(K::AttnQkv, a.qkv)?,
                o_proj: f(K::AttnOut, a.o_proj)?,
                ..a
            }),
        };
        let mlp = Mlp {
            gate_up: f(K::MlpGateUp, mlp.gate_up)?,
            down: f(K::MlpDown, mlp.down)?,
        };
        Ok(Layer {
            input_norm,
            mixer,
            post_norm,
            mlp,
        })
    }

    /// Layer `li` over the stacked rows (each row's state of this layer advanced). The last layer finishes
    /// only the wanted rows once its mixer has run over every token: every step past the mixer is per
    /// token, so their values are the same bits.
    pub fn forward(
        &self,
        li: usize,
        last: bool,
        pass: &Pass<'_>,
        stack: &mut Stack<'_, '_>,
        a: &mut Acts<'_>,
    ) {
        let (h, eps) = (pass.cfg.hidden_size, pass.cfg.rms_norm_eps);
        let m = stack.m;
        rms_norm_rows(
            pass.kern,
            &a.x[..m * h],
            &self.input_norm,
            eps,
            &mut a.hn[..m * h],
        );
        pass.mark(Stage::Norms);
        let out_proj = match &self.mixer {
            Mixer::Gdn(g) => {
                g.forward(li, pass, stack, a);
                &g.out_proj
            }
            Mixer::Attention(at) => {
                at.forward(li, pass, stack, a);
                &at.o_proj
            }
        };
        let core = if last {
            keep_wanted(stack, a, (out_proj.weight.k(), h));
            pass.mark(Stage::Other);
            &a.proj[..]
        } else {
            &a.core[..]
        };
        let m = stack.m;
        out_proj.apply(
            pass,
            &stack.loras,
            Rows {
                m,
                data: core,
                ld: a.ldc,
            },
            RowsMut { data: a.out, ld: h },
        );
        pass.mark(Stage::Projections);
        add_rows(&mut a.x[..m * h], &a.out[..m * h]);
        pass.mark(Stage::Other);
        self.mlp_half(pass, stack, a);
    }

    /// `x += down(silu(gate(h)) · up(h))` with `h = RMSNorm1p(x)`, in passes of [`MLP_ROWS`] rows.
    fn mlp_half(&self, pass: &Pass<'_>, stack: &Stack<'_, '_>, a: &mut Acts<'_>) {
        let (kern, h, im) = (pass.kern, pass.cfg.hidden_size, pass.cfg.intermediate_size);
        let (ldg, lda) = (2 * im + 16, im + 16);
        let m = stack.m;
        let (x, hn) = (&mut a.x[..m * h], &mut a.hn[..m * h]);
        rms_norm_rows(kern, x, &self.post_norm, pass.cfg.rms_norm_eps, hn);
        pass.mark(Stage::Norms);
        let mut r0 = 0;
        while r0 < m {
            let rows = (m - r0).min(MLP_ROWS);
            let loras = stack.loras.part(r0, rows);
            self.mlp.gate_up.apply(
                pass,
                &loras,
                Rows {
                    m: rows,
                    data: &hn[r0 * h..(r0 + rows) * h],
                    ld: h,
                },
                RowsMut {
                    data: &mut *a.gu,
                    ld: ldg,
                },
            );
            pass.mark(Stage::Projections);
            a.act[..rows * lda]
                .par_chunks_mut(lda)
                .zip(a.gu.par_chunks(ldg))
                .for_each(|(act, g)| math::swiglu(kern, &g[..im], &g[im..2 * im], &mut act[..im]));
            pass.mark(Stage::Other);
            self.mlp.down.apply(
                pass,
                &loras,
                Rows {
                    m: rows,
                    data: a.act,
                    ld: lda,
                },
                RowsMut {
                    data: &mut a.out[r0 * h..(r0 + rows) * h],
                    ld: h,
                },
            );
            pass.mark(Stage::Projections);
            r0 += rows;
        }
        add_rows(x, &a.out[..m * h]);
        pass.mark(Stage::Other);
    }
}

/// Past the last mixer: the wanted rows of its output (`width` wide) into `proj` and of the residual stream
/// (`h` wide) to the front of `x`, in order (a wanted position may repeat), and the stack narrowed to them.
fn keep_wanted(stack: &mut Stack<'_, '_>, a: &mut Acts<'_>, (width, h): (usize, usize)) {
    let ldc = a.ldc;
    let mut ms = 0;
    for t in stack.wanted().collect::<Vec<_>>() {
        a.proj[ms * ldc..ms * ldc + width].copy_from_slice(&a.core[t * ldc..t * ldc + width]);
        a.hn[ms * h..(ms + 1) * h].copy_from_slice(&a.x[t * h..(t + 1) * h]);
        ms += 1;
    }
    a.x[..ms * h].copy_from_slice(&a.hn[..ms * h]);
    stack.narrow_to_wanted();
}
