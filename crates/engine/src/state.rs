//! The sequence state: everything a continuation needs, held outside the weights (qwen35-arch §8).
//!
//! - per GDN layer: the last 3 pre-conv `qkv` rows and the fp32 recurrent state `[value heads, dk, dv]`;
//! - per attention layer: post-norm, post-RoPE keys and the values of every position so far;
//! - the position offset.
//!
//! A forward never mutates shared data: it replaces a GDN layer's state with a new `Arc` and appends a new
//! key/value segment. So [`State::clone`] is a snapshot that costs one `Arc` per layer, and any number of
//! branches continue from one snapshot without disturbing each other or copying the prefix's keys.

use std::sync::{Arc, Mutex};

use crate::config::{LayerKind, Qwen35Config};

/// Recurrent state of one Gated DeltaNet layer.
#[derive(Debug)]
pub(crate) struct GdnState {
    /// Last `K−1` pre-conv rows, oldest first, `[3, conv_dim]` (zeros before the first token).
    pub conv: Vec<f32>,
    /// `[value heads, dk, dv]`, row-major (`S[h][a][b]`, `a` over the key dim).
    pub rec: Vec<f32>,
}

/// Buffers of dropped states (GDN states, key/value segments), kept for the next state. A fresh 4B
/// state needs 24 GDN buffers of 2 MiB and, per 1,000 tokens, 64 MB of keys and values; mapping, faulting
/// in and unmapping that memory on every call cost a tenth of a short row's time (page faults are
/// expensive here). At most `SPARE_LIMIT` bytes are kept: 64 MiB (one 4B state's GDN buffers and some keys)
/// answered 25 short 4B requests as fast as 256 MiB did (A/B, Zen 4, 2026-12-05) and leaves 192 MiB more to
/// the state cache on a small machine.
static SPARE: Mutex<Vec<Vec<f32>>> = Mutex::new(Vec::new());
const SPARE_LIMIT: usize = 64 << 20;
/// And at most this many buffers (the list is searched linearly).
const SPARE_COUNT: usize = 256;

fn spare() -> std::sync::MutexGuard<'static, Vec<Vec<f32>>> {
    SPARE.lock().unwrap_or_else(|e| e.into_inner())
}

/// A buffer of `n` f32 holding a copy of `src`, or zeros when `src` is `None`: a kept buffer of
/// capacity `n..=2n` (the smallest), else a new one.
pub(crate) fn buffer(n: usize, src: Option<&[f32]>) -> Vec<f32> {
    let reused = {
        let mut sp = spare();
        sp.iter()
            .enumerate()
            .filter(|(_, v)| v.capacity() >= n && v.capacity() <= 2 * n)
            .min_by_key(|(_, v)| v.capacity())
            .map(|(i, _)| i)
            .map(|i| sp.swap_remove(i))
    };
    let mut v = reused.unwrap_or_default();
    v.clear();
    match src {
        Some(s) => v.extend_from_slice(s),
        None => v.resize(n, 0.0),
    }
    v
}

/// Keep `bufs` for reuse, as far as the limit allows.
fn give_back(bufs: [Vec<f32>; 2]) {
    let mut sp = spare();
    let held: usize = sp.iter().map(|v| v.capacity() * 4).sum();
    let mut room = SPARE_LIMIT.saturating_sub(held);
    for v in bufs {
        if v.capacity() > 0 && v.capacity() * 4 <= room && sp.len() < SPARE_COUNT {
            room -= v.capacity() * 4;
            sp.push(v);
        }
    }
}

impl Drop for GdnState {
    fn drop(&mut self) {
        let mut sp = spare();
        let held: usize = sp.iter().map(|v| v.capacity() * 4).sum();
        let mut room = SPARE_LIMIT.saturating_sub(held);
        for v in [
            std::mem::take(&mut self.rec),
            std::mem::take(&mut self.conv),
        ] {
            if v.capacity() > 0 && v.capacity() * 4 <= room && sp.len() < SPARE_COUNT {
                room -= v.capacity() * 4;
                sp.push(v);
            }
        }
    }
}

impl Clone for GdnState {
    fn clone(&self) -> Self {
        GdnState {
            conv: buffer(self.conv.len(), Some(&self.conv)),
            rec: buffer(self.rec.len(), Some(&self.rec)),
        }
    }
}

impl GdnState {
    /// The state before the first token.
    pub fn zeros(cfg: &Qwen35Config) -> Self {
        let rec = cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim;
        GdnState {
            conv: buffer((cfg.conv_kernel - 1) * cfg.conv_dim(), None),
            rec: buffer(rec, None),
        }
    }
}

/// Keys and values of consecutive positions, appended by one forward call.
#[derive(Debug)]
pub(crate) struct KvSeg {
    pub len: usize,
    /// `[len, kv heads, head_dim]`, post-norm, post-RoPE.
    pub k: Vec<f32>,
    /// `[len, kv heads, head_dim]`.
    pub v: Vec<f32>,
}

impl Drop for KvSeg {
    fn drop(&mut self) {
        give_back([std::mem::take(&mut self.k), std::mem::take(&mut self.v)]);
    }
}

/// All keys and values of one attention layer, as a list of shared segments.
#[derive(Debug, Clone, Default)]
pub(crate) struct KvCache {
    pub segs: Vec<Arc<KvSeg>>,
    pub len: usize,
}

impl KvCache {
    /// Copy head `g`'s keys and values, positions in order, into `k` and `v` (`[len, head_dim]` each).
    pub fn gather(&self, g: usize, nkv: usize, hd: usize, k: &mut [f32], v: &mut [f32]) {
        let mut t = 0;
        for s in &self.segs {
            for i in 0..s.len {
                let src = (i * nkv + g) * hd;
                k[t * hd..(t + 1) * hd].copy_from_slice(&s.k[src..src + hd]);
                v[t * hd..(t + 1) * hd].copy_from_slice(&s.v[src..src + hd]);
                t += 1;
            }
        }
    }
}

/// Advance a GDN layer's state by `f`: in place when no snapshot shares it, else on a copy (the snapshot
/// keeps the old one); the all-zero state of a fresh sequence is made first.
pub(crate) fn advance_gdn(
    slot: &mut Option<Arc<GdnState>>,
    cfg: &Qwen35Config,
    f: impl FnOnce(&mut GdnState),
) {
    let mut own = match slot.take() {
        Some(arc) => Arc::try_unwrap(arc).unwrap_or_else(|shared| (*shared).clone()),
        None => GdnState::zeros(cfg),
    };
    f(&mut own);
    *slot = Some(Arc::new(own));
}

#[derive(Debug, Clone)]
pub(crate) enum LayerState {
    /// `None` is the all-zero state of a fresh sequence.
    Gdn(Option<Arc<GdnState>>),
    Attn(KvCache),
}

/// The state of one sequence after some prefix. `Clone` is a cheap snapshot.
#[derive(Debug, Clone)]
pub struct State {
    pub(crate) pos: usize,
    pub(crate) layers: Vec<LayerState>,
    /// Widths of the model the state was made for (checked by every forward).
    dims: [usize; 6],
}

fn dims(cfg: &Qwen35Config) -> [usize; 6] {
    [
        cfg.conv_dim(),
        cfg.linear_num_value_heads,
        cfg.linear_key_head_dim,
        cfg.linear_value_head_dim,
        cfg.num_key_value_heads,
        cfg.head_dim,
    ]
}

impl State {
    /// The empty state (position 0) for a model with this configuration.
    pub fn new(cfg: &Qwen35Config) -> Self {
        State {
            pos: 0,
            dims: dims(cfg),
            layers: cfg
                .layer_types
                .iter()
                .map(|k| match k {
                    LayerKind::Linear => LayerState::Gdn(None),
                    LayerKind::Full => LayerState::Attn(KvCache::default()),
                })
                .collect(),
        }
    }

    /// Tokens consumed so far; the next token gets this position.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Bytes this state holds (GDN states plus keys and values), counting shared segments in full. Counted
    /// by capacity: a buffer reused from the spares may be up to twice as long as its contents, and the
    /// cache's byte budget is a promise about resident memory.
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| match l {
                LayerState::Gdn(Some(g)) => 4 * (g.conv.capacity() + g.rec.capacity()),
                LayerState::Gdn(None) => 0,
                LayerState::Attn(kv) => kv
                    .segs
                    .iter()
                    .map(|s| 4 * (s.k.capacity() + s.v.capacity()))
                    .sum(),
            })
            .sum()
    }

    /// Whether this state was made for a model with this configuration (layer pattern and widths).
    pub(crate) fn fits(&self, cfg: &Qwen35Config) -> bool {
        self.dims == dims(cfg)
            && self.layers.len() == cfg.num_layers()
            && self.layers.iter().zip(&cfg.layer_types).all(|(l, k)| {
                matches!(
                    (l, k),
                    (LayerState::Gdn(_), LayerKind::Linear)
                        | (LayerState::Attn(_), LayerKind::Full)
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reused buffer may be longer than its contents; what the state holds is its capacity, and the
    /// cache's budget counts that.
    #[test]
    fn bytes_count_what_the_buffers_hold() {
        let cfg = crate::synth::tiny_config(64);
        let mut s = State::new(&cfg);
        let gdn = s
            .layers
            .iter()
            .position(|l| matches!(l, LayerState::Gdn(_)))
            .unwrap();
        let attn = s
            .layers
            .iter()
            .position(|l| matches!(l, LayerState::Attn(_)))
            .unwrap();
        let mut rec = Vec::with_capacity(100);
        rec.resize(40, 0.0);
        let mut conv = Vec::with_capacity(30);
        conv.resize(30, 0.0);
        s.layers[gdn] = LayerState::Gdn(Some(Arc::new(GdnState { conv, rec })));
        let mut k = Vec::with_capacity(64);
        k.resize(16, 0.0);
        s.layers[attn] = LayerState::Attn(KvCache {
            segs: vec![Arc::new(KvSeg {
                len: 1,
                k,
                v: vec![0.0; 16],
            })],
            len: 1,
        });
        assert_eq!(s.bytes(), 4 * (100 + 30 + 64 + 16));
    }
}
