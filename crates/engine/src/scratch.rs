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
use std::sync::Mutex;

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
    pub hist: Buf,
    pub qn: Buf,
    pub kn: Buf,
    /// The value heads' conv output, `[nv][t][dv]`.
    pub v: Buf,
    pub beta: Buf,
    pub gl: Buf,
    pub heads_out: Buf,
    /// One conv row of q or k per key head, `[nk][dk]`.
    pub row: Buf,
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

/// The most bytes a pooled workspace keeps between calls. A 4B pass over 2,000 tokens needs ~320 MB of
/// buffers; kept, they stay resident for the life of the server (on an 8 GB machine that is the room of the
/// state cache). Passes that need more than this (≳ 350 tokens on the 4B, seconds of arithmetic) map theirs
/// afresh: a few hundred huge-page faults, well under 1 % of such a pass.
pub(crate) const WORKSPACE_KEEP: usize = 64 << 20;

/// The model's idle workspaces (one per concurrent call at most), each kept only while it holds no more
/// than `keep` bytes.
#[derive(Debug)]
pub(crate) struct WorkspacePool {
    free: Mutex<Vec<Workspace>>,
    keep: usize,
}

impl WorkspacePool {
    pub fn new(keep: usize) -> Self {
        WorkspacePool {
            free: Mutex::new(Vec::new()),
            keep,
        }
    }

    fn free(&self) -> std::sync::MutexGuard<'_, Vec<Workspace>> {
        self.free.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An idle workspace, or an empty one.
    pub fn take(&self) -> Workspace {
        self.free().pop().unwrap_or_default()
    }

    /// Return a workspace after a call: kept for the next if small enough, else unmapped now and the C
    /// heap trimmed with it (of what earlier requests' row states and this pass's temporaries left in it).
    /// Whether it was kept.
    pub fn put(&self, ws: Workspace) -> bool {
        if ws.bytes() <= self.keep {
            self.free().push(ws);
            true
        } else {
            drop(ws);
            crate::memory::release_free_heap();
            false
        }
    }

    /// Workspaces held now.
    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.free().len()
    }
}

impl GdnScratch {
    fn bytes(&self) -> usize {
        [
            &self.hist,
            &self.qn,
            &self.kn,
            &self.v,
            &self.beta,
            &self.gl,
            &self.heads_out,
            &self.row,
        ]
        .iter()
        .map(|b| 4 * b.len())
        .sum()
    }
}

impl Workspace {
    /// Bytes of every buffer held.
    pub fn bytes(&self) -> usize {
        let own: usize = [
            &self.x, &self.hn, &self.proj, &self.core, &self.out, &self.gu, &self.act,
        ]
        .iter()
        .map(|b| 4 * b.len())
        .sum();
        let kv: usize = self
            .attn
            .kv
            .iter()
            .map(|(k, v)| 4 * (k.len() + v.len()))
            .sum();
        own + self.gdn.bytes() + 4 * self.attn.q.len() + kv
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workspace_bytes_count_every_buffer() {
        let mut ws = Workspace::default();
        grow(&mut ws.x, 10);
        grow(&mut ws.act, 20);
        grow(&mut ws.gdn.heads_out, 30);
        grow(&mut ws.attn.q, 40);
        ws.attn.kv.push((Buf::zeroed(50), Buf::zeroed(60)));
        assert_eq!(ws.bytes(), 4 * (10 + 20 + 30 + 40 + 50 + 60));
    }

    #[test]
    fn the_pool_keeps_small_workspaces_and_unmaps_large_ones() {
        let pool = WorkspacePool::new(4096);
        let mut small = pool.take();
        grow(&mut small.proj, 1024);
        assert!(pool.put(small));
        assert_eq!(pool.held(), 1);
        // The kept one comes back with its buffer; grown past the limit, it is not kept again.
        let mut big = pool.take();
        assert_eq!(big.proj.len(), 1024);
        grow(&mut big.proj, 1025);
        assert!(!pool.put(big));
        assert_eq!(pool.held(), 0);
    }
}
