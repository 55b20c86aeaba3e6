//! The reference path: the backbone written as plainly as the spec reads (qwen35-arch §3–§7), one token
//! and one head at a time, f32, no SIMD, no threads, no chunking. The Gated DeltaNet uses the per-token
//! recurrence of §4.6, attention an explicit softmax per query. It exists to test the fast path (and to
//! be read): it shares the loaded weights (unpacked back to row-major f32) and the [`State`] type, and
//! nothing else.

use std::sync::Arc;

use crate::config::Qwen35Config;
use crate::error::EngineError;
use crate::model::{Backbone, Linear, Mixer};
use crate::state::{GdnState, KvSeg, LayerState, State};

/// One linear module: `W [n, k]` row-major plus an optional LoRA (`A [r, k]`, `B [n, r]`, scale).
struct RefLinear {
    n: usize,
    k: usize,
    w: Vec<f32>,
    lora: Option<(usize, Vec<f32>, Vec<f32>, f32)>,
}

impl RefLinear {
    /// Split a fused projection back into its modules (rows `[start, start + n)` each).
    fn split(lin: &Linear, sizes: &[usize]) -> Vec<RefLinear> {
        let all = lin.w.to_f32_rows();
        let k = lin.w.k();
        let mut out = Vec::new();
        let mut start = 0;
        for &n in sizes {
            let lora = lin
                .loras
                .iter()
                .find(|s| s.col == start)
                .map(|s| (s.r, s.a.clone(), s.b.clone(), s.scale));
            out.push(RefLinear {
                n,
                k,
                w: all[start * k..(start + n) * k].to_vec(),
                lora,
            });
            start += n;
        }
        out
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

/// The reference implementation of a loaded backbone.
pub struct Reference<'a> {
    model: &'a Backbone,
    layers: Vec<RefLayer>,
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

impl<'a> Reference<'a> {
    /// Unpack the backbone's weights (cost: one f32 copy of every projection).
    pub fn new(model: &'a Backbone) -> Self {
        let c = &model.cfg;
        let layers = model
            .layers
            .iter()
            .map(|l| {
                let mixer = match &l.mixer {
                    Mixer::Gdn(g) => {
                        let mut v = RefLinear::split(
                            &g.in_proj,
                            &[
                                c.conv_dim(),
                                c.value_dim(),
                                c.linear_num_value_heads,
                                c.linear_num_value_heads,
                            ],
                        )
                        .into_iter();
                        let (qkv, z, b, a) =
                            (next(&mut v), next(&mut v), next(&mut v), next(&mut v));
                        let cd = c.conv_dim();
                        let mut conv = vec![0f32; cd * 4];
                        for ch in 0..cd {
                            for j in 0..4 {
                                conv[ch * 4 + j] = g.conv_t[j * cd + ch];
                            }
                        }
                        RefMixer::Gdn {
                            qkv,
                            z,
                            b,
                            a,
                            out: next(
                                &mut RefLinear::split(&g.out_proj, &[c.hidden_size]).into_iter(),
                            ),
                            conv,
                            dt_bias: g.dt_bias.clone(),
                            neg_a: g.neg_a.clone(),
                            norm: g.norm.clone(),
                        }
                    }
                    Mixer::Attn(a) => {
                        let (nh, nkv, hd) =
                            (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
                        let mut v = RefLinear::split(&a.qkv, &[2 * nh * hd, nkv * hd, nkv * hd])
                            .into_iter();
                        RefMixer::Attn {
                            q: next(&mut v),
                            k: next(&mut v),
                            v: next(&mut v),
                            o: next(&mut RefLinear::split(&a.o_proj, &[c.hidden_size]).into_iter()),
                            q_norm: a.q_norm.clone(),
                            k_norm: a.k_norm.clone(),
                        }
                    }
                };
                let mut gu =
                    RefLinear::split(&l.gate_up, &[c.intermediate_size, c.intermediate_size])
                        .into_iter();
                RefLayer {
                    input_norm: l.input_norm.clone(),
                    post_norm: l.post_norm.clone(),
                    mixer,
                    gate: next(&mut gu),
                    up: next(&mut gu),
                    down: next(&mut RefLinear::split(&l.down, &[c.hidden_size]).into_iter()),
                }
            })
            .collect();
        Reference { model, layers }
    }

    /// Run `tokens` from `state` (advancing it) and return the final-norm hidden states at the `wanted`
    /// indices of `tokens`, `[wanted.len(), hidden]` flattened.
    pub fn forward(
        &self,
        state: &mut State,
        tokens: &[u32],
        wanted: &[usize],
    ) -> Result<Vec<f32>, EngineError> {
        let cfg = &self.model.cfg;
        crate::forward::check_row(cfg, state, tokens, wanted)?;
        let h = cfg.hidden_size;
        let eps = cfg.rms_norm_eps;
        let mut x: Vec<Vec<f32>> = tokens
            .iter()
            .map(|&t| {
                let mut row = vec![0f32; h];
                self.model.embed.row(t as usize, h, &mut row);
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
                    attention(cfg, &self.model.inv_freq, &layer.mixer, &hn, kv, state.pos)
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
            out.extend(rms_norm(&x[w], &self.model.final_norm, eps));
        }
        Ok(out)
    }
}

fn next(it: &mut impl Iterator<Item = RefLinear>) -> RefLinear {
    it.next().expect("split yields one linear per size")
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
