//! Reusable buffers. A forward over a long row needs hundreds of megabytes of activations; allocating
//! them per layer made the kernel spend a tenth of the time in page faults and `munmap`. A [`Workspace`]
//! lives in a pool on the model and is reused by every call; small per-task buffers (a GDN chunk, an
//! attention block) are thread-local.
//!
//! Buffers are handed out with stale contents: every user overwrites what it reads.
//!
//! The workspace's buffers are [`AlignedBuf`]s, so the large ones (a 1,518-token row's activations are tens of
//! megabytes) sit on transparent huge pages like the packed weights: the GEMM walks every row of its
//! activations once per column panel, and on 4 KiB pages that walk can take a TLB miss per row.

use std::cell::RefCell;

use crate::kernels::buf::AlignedBuf;

/// A workspace buffer.
pub(crate) type Buf = AlignedBuf<f32>;

/// `v[..n]`, replacing `v` by a larger buffer if needed (contents unspecified).
pub(crate) fn grow(v: &mut Buf, n: usize) -> &mut [f32] {
    if v.len() < n {
        *v = Buf::zeroed(n);
    }
    &mut v[..n]
}

/// [`grow`] for the small thread-local buffers, which stay ordinary vectors.
fn grow_vec(v: &mut Vec<f32>, n: usize) -> &mut [f32] {
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
    let r = f(grow_vec(&mut buf, n));
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
    pub conv: Buf,
    pub hist: Buf,
    pub qn: Buf,
    pub kn: Buf,
    pub beta: Buf,
    pub gl: Buf,
    pub heads_out: Buf,
}

/// Buffers of the attention mixer.
#[derive(Debug, Default)]
pub(crate) struct AttnScratch {
    pub q: Buf,
    /// Per kv head: Kᵀ and V in panel layout (see `attention::run`).
    pub kv: Vec<(Buf, Buf)>,
}

/// Every buffer of one forward call.
#[derive(Debug, Default)]
pub(crate) struct Workspace {
    pub x: Buf,
    pub hn: Buf,
    pub proj: Buf,
    pub core: Buf,
    pub out: Buf,
    pub gu: Buf,
    pub act: Buf,
    pub gdn: GdnScratch,
    pub attn: AttnScratch,
}
