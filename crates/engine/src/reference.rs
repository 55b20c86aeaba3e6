//! The reference path: the backbone written as plainly as the spec reads (qwen35-arch §3–§7), one token
//! and one head at a time, f32, no SIMD, no threads, no chunking. The Gated DeltaNet uses the per-token
//! recurrence of §4.6, attention an explicit softmax per query. It exists to test the fast path (and to
//! be read): it reads the checkpoint tree ([`Weights`]) directly, widened to row-major f32, and shares
//! only the [`State`] type with the fast path.

use std::path::Path;
use std::sync::Arc;

use kev_release::shards::Dtype;

use crate::config::Qwen35Config;
use crate::error::EngineError;
use crate::model::embed::Embedding;
use crate::model::{LoadOptions, norm1p, rope_inv_freq};
use crate::state::{GdnState, KvSeg, LayerState, State};
use crate::weights::{Checkpoint, Mixer, Projection, Weights};

/// One linear module: `W [n, k]` row-major plus an optional LoRA (`A [r, k]`, `B [n, r]`, scale).
struct RefLinear {
    n: usize,
    k: usize,
    w: Vec<f32>,
    lora: Option<(usize, Vec<f32>, Vec<f32>, f32)>,
}

impl RefLinear {
    /// The projection widened to f32: its LoRA merged in (BF16, as the fast path merges) with `merge`,
    /// else kept beside it.
    fn new(p: &Projection<'_>, merge: bool) -> Result<RefLinear, EngineError> {
        let merged = if merge { p.merged_bf16()? } else { None };
        let (w, lora) = match merged {
            Some(bits) => (
                bits.into_iter().map(crate::kernels::bf16_to_f32).collect(),
                None,
            ),
            None => (
                p.weight.to_f32(),
                p.lora
                    .as_ref()
                    .map(|l| (l.r, l.a.clone(), l.b.clone(), l.scale)),
            ),
        };
        Ok(RefLinear {
            n: p.rows(),
            k: p.cols(),
            w,
            lora,
        })
    }

    /// `y = W·x + (B·(A·x))·s` for one token.
    fn apply(&self, x: &[f32]) -> Vec<f32> {
        let mut y = vec![0f32; self.n];
        for (j, yj) in y.iter_mut().enumerate() {
            let row = &self.w[j * self.k..(j + 1) * self.k];
            let mut s = 0f32;
            for (w, xv) in row.iter().zip(x) {
                s += w * xv;
            }
            *yj = s;
        }
        if let Some((r, a, b, scale)) = &self.lora {
            let mut t = vec![0f32; *r];
            for (i, ti) in t.iter_mut().enumerate() {
                let mut s = 0f32;
                for (w, xv) in a[i * self.k..(i + 1) * self.k].iter().zip(x) {
                    s += w * xv;
                }
                *ti = s;
            }
            for (j, yj) in y.iter_mut().enumerate() {
                let mut s = 0f32;
                for (i, ti) in t.iter().enumerate() {
                    s += b[j * r + i] * ti;
                }
                *yj += s * scale;
            }
        }
        y
    }
}

enum RefMixer {
    Gdn {
        qkv: RefLinear,
        z: RefLinear,
        b: RefLinear,
        a: RefLinear,
        out: RefLinear,
        conv: Vec<f32>,
        dt_bias: Vec<f32>,
        neg_a: Vec<f32>,
        norm: Vec<f32>,
    },
    Attn {
        q: RefLinear,
        k: RefLinear,
        v: RefLinear,
        o: RefLinear,
        q_norm: Vec<f32>,
        k_norm: Vec<f32>,
    },
}

struct RefLayer {
    input_norm: Vec<f32>,
    post_norm: Vec<f32>,
    mixer: RefMixer,
    gate: RefLinear,
    up: RefLinear,
    down: RefLinear,
}

/// The reference implementation of a checkpoint.
pub struct Reference {
    cfg: Qwen35Config,
    embed: Embedding,
    layers: Vec<RefLayer>,
    /// `1 + norm.weight`.
    final_norm: Vec<f32>,
    inv_freq: Vec<f32>,
}

/// `x / sqrt(mean(x²) + eps) · w1p` where `w1p` is `1 + w` (or `w` for the gated norm).
fn rms_norm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let mut ss = 0f32;
    for v in x {
        ss += v * v;
    }
    let inv = 1.0 / (ss / x.len() as f32 + eps).sqrt();
    x.iter().zip(w).map(|(v, w)| (v * inv) * w).collect()
}

fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

fn softplus(x: f32) -> f32 {
    if x > 20.0 { x } else { x.exp().ln_1p() }
}

impl Reference {
    /// Read `dir` as [`crate::Backbone::load`] reads it with `opts` (kernels aside).
    pub fn load(dir: &Path, opts: &LoadOptions) -> Result<Self, EngineError> {
        let ck = Checkpoint::open(dir)?;
        Self::new(&ck.weights(opts.adapter.as_deref())?, opts.merge_adapter)
    }

    /// Widen the tree's weights (cost: one f32 copy of every projection); with `merge`, each LoRA is
    /// merged into its weight.
    pub fn new(w: &Weights<'_>, merge: bool) -> Result<Self, EngineError> {
        let c = w.config;
        let lin = |p: &Projection<'_>| RefLinear::new(p, merge);
        let layers = w
            .layers
            .iter()
            .map(|l| -> Result<RefLayer, EngineError> {
                let mixer = match &l.mixer {
                    Mixer::LinearAttn(g) => RefMixer::Gdn {
                        qkv: lin(&g.in_proj_qkv)?,
                        z: lin(&g.in_proj_z)?,
                        b: lin(&g.in_proj_b)?,
                        a: lin(&g.in_proj_a)?,
                        out: lin(&g.out_proj)?,
                        conv: g.conv1d.to_f32(),
                        dt_bias: g.dt_bias.to_f32(),
                        neg_a: g.a_log.to_f32().iter().map(|x| -x.exp()).collect(),
                        norm: g.norm.to_f32(),
                    },
                    Mixer::SelfAttn(a) => RefMixer::Attn {
                        q: lin(&a.q_proj)?,
                        k: lin(&a.k_proj)?,
                        v: lin(&a.v_proj)?,
                        o: lin(&a.o_proj)?,
                        q_norm: norm1p(&a.q_norm),
                        k_norm: norm1p(&a.k_norm),
                    },
                };
                Ok(RefLayer {
                    input_norm: norm1p(&l.input_layernorm),
                    post_norm: norm1p(&l.post_attention_layernorm),
                    mixer,
                    gate: lin(&l.mlp.gate_proj)?,
                    up: lin(&l.mlp.up_proj)?,
                    down: lin(&l.mlp.down_proj)?,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let embed = match w.embed_tokens.dtype() {
            Dtype::BF16 => Embedding::Bf16(w.embed_tokens.bf16_bits()),
            _ => Embedding::F32(w.embed_tokens.to_f32()),
        };
        Ok(Reference {
            cfg: c.clone(),
            embed,
            layers,
            final_norm: norm1p(&w.norm),
            inv_freq: rope_inv_freq(c.rope_theta, c.rotary_dim),
        })
    }

    /// Run `tokens` from `state` (advancing it) and return the final-norm hidden states at the `wanted`
    /// indices of `tokens`, `[wanted.len(), hidden]` flattened.
    pub fn forward(
        &self,
        state: &mut State,
        tokens: &[u32],
        wanted: &[usize],
    ) -> Result<Vec<f32>, EngineError> {
        let cfg = &self.cfg;
        crate::pass::check_row(cfg, state, tokens, wanted)?;
        let h = cfg.hidden_size;
        let eps = cfg.rms_norm_eps;
        let mut x: Vec<Vec<f32>> = tokens
            .iter()
            .map(|&t| {
                let mut row = vec![0f32; h];
                self.embed.row(t as usize, h, &mut row);
                row
            })
            .collect();
        for (li, layer) in self.layers.iter().enumerate() {
            let hn: Vec<Vec<f32>> = x
                .iter()
                .map(|r| rms_norm(r, &layer.input_norm, eps))
                .collect();
            let mixed = match (&layer.mixer, &mut state.layers[li]) {
                (RefMixer::Gdn { .. }, LayerState::Gdn(st)) => gdn(cfg, &layer.mixer, &hn, st),
                (RefMixer::Attn { .. }, LayerState::Attn(kv)) => {
                    attention(cfg, &self.inv_freq, &layer.mixer, &hn, kv, state.pos)
                }
                _ => unreachable!("state layout checked by check_row"),
            };
            for (xr, m) in x.iter_mut().zip(&mixed) {
                for (a, b) in xr.iter_mut().zip(m) {
                    *a += b;
                }
            }
            for xr in x.iter_mut() {
                let hn = rms_norm(xr, &layer.post_norm, eps);
                let g = layer.gate.apply(&hn);
                let u = layer.up.apply(&hn);
                let act: Vec<f32> = g.iter().zip(&u).map(|(g, u)| silu(*g) * u).collect();
                let d = layer.down.apply(&act);
                for (a, b) in xr.iter_mut().zip(&d) {
                    *a += b;
                }
            }
        }
        state.pos += tokens.len();
        let mut out = Vec::with_capacity(wanted.len() * h);
        for &w in wanted {
            out.extend(rms_norm(&x[w], &self.final_norm, eps));
        }
        Ok(out)
    }
}

/// Gated DeltaNet over the tokens of one call (§4), per-token recurrence; replaces the layer's state.
fn gdn(
    cfg: &Qwen35Config,
    m: &RefMixer,
    hn: &[Vec<f32>],
    st: &mut Option<Arc<GdnState>>,
) -> Vec<Vec<f32>> {
    let RefMixer::Gdn {
        qkv,
        z,
        b,
        a,
        out,
        conv,
        dt_bias,
        neg_a,
        norm,
    } = m
    else {
        unreachable!()
    };
    let (nk, nv, dk, dv) = (
        cfg.linear_num_key_heads,
        cfg.linear_num_value_heads,
        cfg.linear_key_head_dim,
        cfg.linear_value_head_dim,
    );
    let cd = cfg.conv_dim();
    let kd = cfg.key_dim();
    let ratio = nv / nk;
    let (mut hist, mut s) = match st {
        Some(g) => (g.conv.clone(), g.rec.clone()),
        None => (vec![0f32; 3 * cd], vec![0f32; nv * dk * dv]),
    };
    let mut outs = Vec::with_capacity(hn.len());
    for x in hn {
        let pre = qkv.apply(x);
        // Causal conv: taps 0..2 read the three previous pre-conv rows, tap 3 the current one.
        let mut c = vec![0f32; cd];
        for ch in 0..cd {
            let w = &conv[ch * 4..ch * 4 + 4];
            let acc =
                w[0] * hist[ch] + w[1] * hist[cd + ch] + w[2] * hist[2 * cd + ch] + w[3] * pre[ch];
            c[ch] = silu(acc);
        }
        hist.copy_within(cd.., 0);
        hist[2 * cd..].copy_from_slice(&pre);
        let zz = z.apply(x);
        let bb = b.apply(x);
        let aa = a.apply(x);
        let l2 = |v: &[f32]| -> Vec<f32> {
            let mut ss = 0f32;
            for x in v {
                ss += x * x;
            }
            let inv = 1.0 / (ss + 1e-6).sqrt();
            v.iter().map(|x| x * inv).collect()
        };
        let scale = (dk as f32).powf(-0.5);
        let mut y = vec![0f32; nv * dv];
        for hh in 0..nv {
            let j = hh / ratio;
            let q: Vec<f32> = l2(&c[j * dk..(j + 1) * dk])
                .iter()
                .map(|v| v * scale)
                .collect();
            let k = l2(&c[kd + j * dk..kd + (j + 1) * dk]);
            let v = &c[2 * kd + hh * dv..2 * kd + (hh + 1) * dv];
            let beta = sigmoid(bb[hh]);
            let g = neg_a[hh] * softplus(aa[hh] + dt_bias[hh]);
            let alpha = g.exp();
            let sh = &mut s[hh * dk * dv..(hh + 1) * dk * dv];
            for e in sh.iter_mut() {
                *e *= alpha;
            }
            // u = β (v − Sᵀk)
            let mut u = vec![0f32; dv];
            for (bi, ub) in u.iter_mut().enumerate() {
                let mut p = 0f32;
                for ai in 0..dk {
                    p += sh[ai * dv + bi] * k[ai];
                }
                *ub = beta * (v[bi] - p);
            }
            for ai in 0..dk {
                for bi in 0..dv {
                    sh[ai * dv + bi] += k[ai] * u[bi];
                }
            }
            // o = Sᵀ q, read after the write; then the gated per-head RMSNorm.
            let mut o = vec![0f32; dv];
            for (bi, ob) in o.iter_mut().enumerate() {
                let mut p = 0f32;
                for ai in 0..dk {
                    p += sh[ai * dv + bi] * q[ai];
                }
                *ob = p;
            }
            let normed = rms_norm(&o, norm, cfg.rms_norm_eps);
            for bi in 0..dv {
                y[hh * dv + bi] = normed[bi] * silu(zz[hh * dv + bi]);
            }
        }
        outs.push(out.apply(&y));
    }
    *st = Some(Arc::new(GdnState { conv: hist, rec: s }));
    outs
}

/// RoPE on the first `inv_freq.len() · 2` dims (rotate-half layout), angles `pos · inv_freq` in f32.
pub(crate) fn rope_ref(x: &mut [f32], pos: usize, inv_freq: &[f32]) {
    let half = inv_freq.len();
    let rot: Vec<f32> = x[..2 * half].to_vec();
    for i in 0..2 * half {
        let ang = pos as f32 * inv_freq[i % half];
        let (s, c) = ((ang as f64).sin() as f32, (ang as f64).cos() as f32);
        let rh = if i < half {
            -rot[i + half]
        } else {
            rot[i - half]
        };
        x[i] = rot[i] * c + rh * s;
    }
}

/// Gated full attention over the tokens of one call (§5), appending their keys and values.
fn attention(
    cfg: &Qwen35Config,
    inv_freq: &[f32],
    m: &RefMixer,
    hn: &[Vec<f32>],
    kv: &mut crate::state::KvCache,
    pos0: usize,
) -> Vec<Vec<f32>> {
    let RefMixer::Attn {
        q,
        k,
        v,
        o,
        q_norm,
        k_norm,
    } = m
    else {
        unreachable!()
    };
    let (nh, nkv, hd) = (
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.head_dim,
    );
    let t = hn.len();
    let mut qs = Vec::with_capacity(t);
    let mut gates = Vec::with_capacity(t);
    let mut seg_k = Vec::with_capacity(t * nkv * hd);
    let mut seg_v = Vec::with_capacity(t * nkv * hd);
    for (i, x) in hn.iter().enumerate() {
        let qg = q.apply(x);
        let kk = k.apply(x);
        let vv = v.apply(x);
        let mut qrow = vec![0f32; nh * hd];
        let mut grow = vec![0f32; nh * hd];
        for hh in 0..nh {
            let mut qh = rms_norm(&qg[2 * hd * hh..2 * hd * hh + hd], q_norm, cfg.rms_norm_eps);
            rope_ref(&mut qh, pos0 + i, inv_freq);
            qrow[hh * hd..(hh + 1) * hd].copy_from_slice(&qh);
            grow[hh * hd..(hh + 1) * hd].copy_from_slice(&qg[2 * hd * hh + hd..2 * hd * (hh + 1)]);
        }
        for g in 0..nkv {
            let mut kh = rms_norm(&kk[g * hd..(g + 1) * hd], k_norm, cfg.rms_norm_eps);
            rope_ref(&mut kh, pos0 + i, inv_freq);
            seg_k.extend_from_slice(&kh);
        }
        seg_v.extend_from_slice(&vv);
        qs.push(qrow);
        gates.push(grow);
    }
    kv.segs.push(Arc::new(KvSeg {
        len: t,
        k: seg_k,
        v: seg_v,
    }));
    kv.len += t;
    let n = kv.len;
    let mut keys = vec![vec![0f32; n * hd]; nkv];
    let mut vals = vec![vec![0f32; n * hd]; nkv];
    for g in 0..nkv {
        kv.gather(g, nkv, hd, &mut keys[g], &mut vals[g]);
    }
    let scale = (hd as f32).powf(-0.5);
    let mut outs = Vec::with_capacity(t);
    for i in 0..t {
        let p = pos0 + i;
        let mut y = vec![0f32; nh * hd];
        for hh in 0..nh {
            let g = hh / (nh / nkv);
            let qh = &qs[i][hh * hd..(hh + 1) * hd];
            let mut sc: Vec<f32> = (0..=p)
                .map(|j| {
                    let mut s = 0f32;
                    for d in 0..hd {
                        s += qh[d] * keys[g][j * hd + d];
                    }
                    s * scale
                })
                .collect();
            let mx = sc.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0f32;
            for s in sc.iter_mut() {
                *s = (*s - mx).exp();
                sum += *s;
            }
            for d in 0..hd {
                let mut acc = 0f32;
                for (j, s) in sc.iter().enumerate() {
                    acc += (s / sum) * vals[g][j * hd + d];
                }
                y[hh * hd + d] = acc * sigmoid(gates[i][hh * hd + d]);
            }
        }
        outs.push(o.apply(&y));
    }
    outs
}
