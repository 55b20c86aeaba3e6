//! Reusable buffers. A forward over a long row needs hundreds of megabytes of activations; allocating
//! them per layer made the kernel spend a tenth of the time in page faults and `munmap`. A [`Workspace`]
//! lives in a pool on the model and is reused by every call; small per-task buffers (a GDN chunk, an
//! attention block) are thread-local.
//!
//! Buffers are handed out with stale contents: every user overwrites what it reads.

use std::cell::RefCell;

/// `v[..n]`, growing `v` if needed (contents unspecified).
pub(crate) fn grow(v: &mut Vec<f32>, n: usize) -> &mut [f32] {
    if v.len() < n {
        v.resize(n, 0.0);
    }
    &mut v[..n]
}

thread_local! {
    static TLS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Run `f` with a thread-local buffer of `n` f32 (contents unspecified).
pub(crate) fn with_tls<R>(n: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    let mut buf = TLS.with(|c| std::mem::take(&mut *c.borrow_mut()));
    let r = f(grow(&mut buf, n));
    TLS.with(|c| {
        let mut b = c.borrow_mut();
        if b.capacity() < buf.capacity() {
            *b = buf;
        }
    });
    r
}

/// Buffers of the GDN mixer.
#[derive(Debug, Default)]
pub(crate) struct GdnScratch {
    pub conv: Vec<f32>,
    pub hist: Vec<f32>,
    pub qn: Vec<f32>,
    pub kn: Vec<f32>,
    pub beta: Vec<f32>,
    pub gl: Vec<f32>,
    pub heads_out: Vec<f32>,
}

/// Buffers of the attention mixer.
#[derive(Debug, Default)]
pub(crate) struct AttnScratch {
    pub q: Vec<f32>,
    /// Per kv head: Kᵀ and V in panel layout (see `attention::run`).
    pub kv: Vec<(Vec<f32>, Vec<f32>)>,
}

/// Every buffer of one forward call.
#[derive(Debug, Default)]
pub(crate) struct Workspace {
    pub x: Vec<f32>,
    pub hn: Vec<f32>,
    pub proj: Vec<f32>,
    pub core: Vec<f32>,
    pub out: Vec<f32>,
    pub gu: Vec<f32>,
    pub act: Vec<f32>,
    pub gdn: GdnScratch,
    pub attn: AttnScratch,
}
