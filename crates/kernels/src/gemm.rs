//! `C = A · Wᵀ` for f32 activations `A [m, k]` and a packed weight matrix `W [n, k]`.
//!
//! Blocking: the weights are already in 64-output panels (see [`super::pack`]); threads (rayon) take whole
//! panels, so each thread streams its own weights. Inside a panel, rows go in passes of 264 (so one input
//! block of their activations, 132 KiB, stays in L2 while it is re-read for every panel), and the input
//! dimension is cut into blocks (128 inputs in the fp32 arm, 256 in the bf16 arm) whose weights fit in L1;
//! for each block every 6-row group runs the microkernel (6 rows × 64 outputs = 24 vector accumulators),
//! and the next block is prefetched into L2 meanwhile.
//!
//! - fp32 arm: each block is widened to f32 once into a 32 KiB buffer (exact), then f32 FMAs; the widening
//!   costs one shift or mask per 16 weights, amortised over all rows.
//! - bf16 arm with AVX512_BF16: activations rounded to bf16 pairs once per call, `vdpbf16ps` straight on
//!   the packed weights. Without AVX512_BF16 (or with f32-stored weights), the bf16 arm rounds the
//!   activations and runs the f32 kernels: products of two bf16 are exact in f32, so this is the same
//!   arithmetic up to the order inside each pair.
//!
//! Every output element is one chain over the input index in increasing order, started from zero at the
//! first block and carried through memory between blocks, independent of `m` and of the row's slot in its
//! 6-row group.

use std::cell::RefCell;

use rayon::prelude::*;

use super::buf::AlignedBuf;
use super::cache::prefetch_share;
use super::dispatch::dispatch;
use super::layout::{MR, NR, Tile};
use super::pack::{PackedMatrix, Store};
use super::simd::{Kernel, Simd};
use super::{Arm, Kernels, SendPtr, bf16_bits};

/// The most inputs per block of the fp32 arm; the block used is chosen from the L1D size
/// ([`kc_for_l1d`]).
const KC_F32_MAX: usize = 256;
/// Input pairs per block, bf16 arm (`KP_BF16 · 64 · 4` = 32 KiB of weights).
const KP_BF16: usize = 128;
/// Rows per pass over a panel: the activations of one input block (MC × 512 bytes) stay in L2.
const MC: usize = 264;

thread_local! {
    static SCRATCH_U32: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
    static SCRATCH_F32: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Where a long product may pause: between weight panels, holding nothing another thread waits for. The
/// caller decides what pausing means (a background pass stepping aside for foreground work: the engine's
/// `pause` module); the kernels only reach it. [`SafePoint::NONE`] never pauses and costs a branch.
#[derive(Clone, Copy, Default)]
pub struct SafePoint<'a>(Option<&'a (dyn Fn() + Sync)>);

impl<'a> SafePoint<'a> {
    /// No pause: the foreground's products.
    pub const NONE: SafePoint<'static> = SafePoint(None);

    /// Pause by calling `wait` (it returns when the product may go on).
    pub fn new(wait: &'a (dyn Fn() + Sync)) -> Self {
        SafePoint(Some(wait))
    }

    /// A safe point is reached: wait if the caller says so.
    #[inline]
    pub fn reach(self) {
        if let Some(wait) = self.0 {
            wait();
        }
    }
}

impl std::fmt::Debug for SafePoint<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "SafePoint(pauses)"
        } else {
            "SafePoint::NONE"
        })
    }
}

/// How a product runs: the instruction set's kernels, the arithmetic, and where it may pause.
#[derive(Debug, Clone, Copy)]
pub struct Run<'a> {
    /// The instruction set's kernels.
    pub kern: Kernels,
    /// The arithmetic (fp32, bf16 or int8 weights).
    pub arm: Arm,
    /// Where the product may pause (between weight panels).
    pub pause: SafePoint<'a>,
}

impl Run<'static> {
    /// A product that never pauses.
    pub fn new(kern: Kernels, arm: Arm) -> Self {
        Run {
            kern,
            arm,
            pause: SafePoint::NONE,
        }
    }
}

/// The activations of a product: `m` rows of a row-major matrix, row `i` at `data[i · ld..]`.
#[derive(Debug, Clone, Copy)]
pub struct Rows<'a> {
    /// Rows.
    pub m: usize,
    /// The row-major values (at least `(m − 1) · ld + k` of them).
    pub data: &'a [f32],
    /// Row stride.
    pub ld: usize,
}

/// Where a product's rows go: row `i` at `data[i · ld..]` (as many rows as its [`Rows`]).
#[derive(Debug)]
pub struct RowsMut<'a> {
    /// The row-major values.
    pub data: &'a mut [f32],
    /// Row stride.
    pub ld: usize,
}

/// `C[i, j] = Σ_k A[i, k] · W[j, k]` for `i < a.m`, `j < w.n()`, in a float arm (fp32 or bf16); `A`
/// row-major with stride `a.ld`, `C` with stride `c.ld` (only the first `w.n()` columns of each row are
/// written). The int8 arm's product is [`crate::int8::gemm_int8`], over the weights' int8 form.
///
/// Panics if the slices are too short for the given sizes and strides, or if `run.arm` is the int8 arm
/// (caller bugs, not input errors).
pub fn gemm(run: Run<'_>, a: Rows<'_>, w: &PackedMatrix, c: RowsMut<'_>) {
    let Run { kern, arm, pause } = run;
    assert!(arm != Arm::Int8, "gemm: float weights, int8 arm");
    let (m, n, k) = (a.m, w.n(), w.k());
    if m == 0 || n == 0 {
        return;
    }
    assert!(
        a.ld >= k && a.data.len() >= (m - 1) * a.ld + k,
        "gemm: A too short"
    );
    assert!(
        c.ld >= n && c.data.len() >= (m - 1) * c.ld + n,
        "gemm: C too short"
    );
    if k == 0 {
        for i in 0..m {
            c.data[i * c.ld..i * c.ld + n].fill(0.0);
        }
        return;
    }
    let product = Product { kern, w, pause };
    if arm == Arm::Bf16 && kern.avx512bf16() && w.is_bf16() {
        // Tiles where the CPU has them, else `vdpbf16ps`: the same rounded activations either way.
        SCRATCH_U32.with(|s| {
            let mut buf = std::mem::take(&mut *s.borrow_mut());
            #[cfg(target_arch = "x86_64")]
            if kern.amx() {
                gemm_bf16_amx(product, a, c, &mut buf);
            } else {
                gemm_bf16_hw(product, a, c, &mut buf);
            }
            #[cfg(not(target_arch = "x86_64"))]
            gemm_bf16_hw(product, a, c, &mut buf);
            *s.borrow_mut() = buf;
        });
    } else if arm == Arm::Bf16 {
        SCRATCH_F32.with(|s| {
            let mut buf = std::mem::take(&mut *s.borrow_mut());
            let lb = k + 16;
            buf.clear();
            buf.resize(m * lb, 0.0);
            buf.par_chunks_mut(lb).enumerate().for_each(|(i, row)| {
                for (d, x) in row.iter_mut().zip(&a.data[i * a.ld..i * a.ld + k]) {
                    *d = super::bf16_to_f32(bf16_bits(*x));
                }
            });
            let rounded = Rows {
                m,
                data: &buf,
                ld: lb,
            };
            gemm_f32(product, kc_f32(), rounded, c);
            *s.borrow_mut() = buf;
        });
    } else {
        gemm_f32(product, kc_f32(), a, c);
    }
}

/// What every float product's drivers share: the kernels, the weights, and where to pause.
#[derive(Clone, Copy)]
struct Product<'a> {
    kern: Kernels,
    w: &'a PackedMatrix,
    pause: SafePoint<'a>,
}

/// The fp32 arm's input block for this CPU: [`kc_for_l1d`] of the L1D size, found once.
fn kc_f32() -> usize {
    static KC: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *KC.get_or_init(|| kc_for_l1d(super::cache::l1d_bytes()))
}

/// Inputs per block of the fp32 arm for an L1D of `l1d` bytes: the widened block (`kc · 64` f32) takes
/// at most half of it, leaving the rest to the six activation rows of the block, the C tile and the
/// next block's first lines; a multiple of 16 (whole pairs and cache lines), 32 to [`KC_F32_MAX`].
/// 32 KiB → 64 (16 KiB of weights), 48 KiB → 96, 64 KiB → 128.
pub(crate) fn kc_for_l1d(l1d: usize) -> usize {
    (l1d / 2 / (NR * 4) / 16 * 16).clamp(32, KC_F32_MAX)
}

/// The fp32 arm with input blocks of `kc` (a multiple of 16, at most [`KC_F32_MAX`]); the results do not
/// depend on it (each output is one FMA chain in input order, carried through C between blocks).
fn gemm_f32(p: Product<'_>, kc: usize, a: Rows<'_>, c: RowsMut<'_>) {
    assert!(kc.is_multiple_of(16) && (16..=KC_F32_MAX).contains(&kc));
    let cp = SendPtr(c.data.as_mut_ptr());
    let ap = SendPtr(a.data.as_ptr() as *mut f32);
    // Each task computes whole panels (disjoint columns of C); the instruction set is entered per
    // panel, inside the task, because rayon's closures are not compiled for it.
    (0..p.w.panels()).into_par_iter().for_each_init(
        || AlignedBuf::<f32>::zeroed(kc * NR),
        |buf, panel| {
            p.pause.reach();
            dispatch(
                p.kern,
                PanelF32 {
                    w: p.w,
                    p: panel,
                    m: a.m,
                    a: ap.get(),
                    lda: a.ld,
                    c: cp.get(),
                    ldc: c.ld,
                    kcb: kc,
                    buf: &mut buf[..],
                },
            )
        },
    );
}

/// One group of up to [`MR`] rows of a block of a [`Walk`].
#[derive(Clone, Copy)]
struct Group {
    /// Its first row and rows (`rows ≤ MR`).
    i0: usize,
    rows: usize,
    /// The end of its pass's rows.
    mc1: usize,
    /// The block's first input unit and units.
    kb: usize,
    kc: usize,
}

/// The order a float panel is walked in, the same for the fp32 and bf16 arms: rows in passes of [`MC`]
/// (one input block of their activations stays in L2), the inputs in blocks of `step` units (f32 inputs,
/// or bf16 pairs) whose weights fit in L1, and each block's groups of [`MR`] rows; while a block's groups
/// run, the block used after it — the next inputs, else this panel's first block again for the next pass,
/// else the next panel's first — is asked into L2, a share per group.
struct Walk<'a> {
    m: usize,
    units: usize,
    step: usize,
    /// The weight bytes of panel `p`'s block at unit `kb` (empty past the last panel).
    block: &'a (dyn Fn(usize, usize) -> &'a [u8] + Sync),
}

impl Walk<'_> {
    /// Walk panel `p`: `prepare(kb, kc)` readies each block (once per pass), `group` runs each row
    /// group on it.
    #[inline(always)]
    fn panel<B>(
        &self,
        p: usize,
        mut prepare: impl FnMut(usize, usize) -> B,
        mut group: impl FnMut(&B, Group),
    ) {
        let mut mc0 = 0;
        while mc0 < self.m {
            let mc1 = (mc0 + MC).min(self.m);
            let mut kb = 0;
            while kb < self.units {
                let kc = (self.units - kb).min(self.step);
                let ready = prepare(kb, kc);
                let next = if kb + kc < self.units {
                    (self.block)(p, kb + kc)
                } else if mc1 < self.m {
                    (self.block)(p, 0)
                } else {
                    (self.block)(p + 1, 0)
                };
                let groups = (mc1 - mc0).div_ceil(MR);
                let mut i0 = mc0;
                while i0 < mc1 {
                    prefetch_share(next, (i0 - mc0) / MR, groups);
                    let rows = (mc1 - i0).min(MR);
                    group(
                        &ready,
                        Group {
                            i0,
                            rows,
                            mc1,
                            kb,
                            kc,
                        },
                    );
                    i0 += MR;
                }
                kb += kc;
            }
            mc0 = mc1;
        }
    }
}

/// One 64-output panel of the fp32 arm: `C[.., p·NR..] = A · W_pᵀ`. `a` and `c` are the extents checked
/// by [`gemm`]; `buf` holds `kc · NR` f32.
struct PanelF32<'a> {
    w: &'a PackedMatrix,
    p: usize,
    m: usize,
    a: *const f32,
    lda: usize,
    c: *mut f32,
    ldc: usize,
    /// Inputs per block.
    kcb: usize,
    buf: &'a mut [f32],
}

impl Kernel for PanelF32<'_> {
    type Out = ();
    #[inline(always)]
    fn run<S: Simd>(self) {
        let PanelF32 {
            w,
            p,
            m,
            a,
            lda,
            c,
            ldc,
            kcb,
            buf,
        } = self;
        let (n, k, kp) = (w.n(), w.k(), w.kp());
        let ncols = (n - p * NR).min(NR);
        // The weight block of panel `p` starting at input `kb` (`kc` inputs), as bytes for prefetching.
        let block = |p: usize, kb: usize| -> &[u8] {
            if p >= w.panels() {
                return &[];
            }
            let kc = (k - kb).min(kcb);
            match w.store() {
                Store::Bf16(d) => {
                    let off = p * kp * NR * 2 + (kb / 2) * NR * 2;
                    as_bytes(&d[off..off + kc.div_ceil(2) * NR * 2])
                }
                Store::F32(d) => {
                    let off = p * 2 * kp * NR + kb * NR;
                    as_bytes(&d[off..off + kc * NR])
                }
            }
        };
        let walk = Walk {
            m,
            units: k,
            step: kcb,
            block: &block,
        };
        let prepare = |kb: usize, kc: usize| -> *const f32 {
            match w.store() {
                Store::Bf16(d) => {
                    let off = p * kp * NR * 2 + (kb / 2) * NR * 2;
                    let pairs = kc.div_ceil(2);
                    widen::<S>(&d[off..off + pairs * NR * 2], &mut buf[..pairs * 2 * NR]);
                    buf.as_ptr()
                }
                Store::F32(d) => d[p * 2 * kp * NR + kb * NR..].as_ptr(),
            }
        };
        walk.panel(p, prepare, |&bptr, g| {
            let Group {
                i0,
                rows,
                mc1,
                kb,
                kc,
            } = g;
            let mut arows = [std::ptr::null::<f32>(); MR];
            for (r, x) in arows.iter_mut().enumerate() {
                // Rows past the block repeat its last row (computed, never stored).
                *x = a.wrapping_add((i0 + r.min(rows - 1)) * lda + kb);
            }
            let next_group = i0 + MR < mc1;
            let mut nrows = [std::ptr::null::<f32>(); MR];
            if next_group {
                let last = mc1 - 1;
                for (r, x) in nrows.iter_mut().enumerate() {
                    *x = a.wrapping_add((i0 + MR + r).min(last) * lda + kb);
                }
            }
            let next = next_group.then_some(&nrows);
            // SAFETY: `arows[r]` points at `kc` valid inputs of a row of `a` (asserted in `gemm`),
            // `bptr` at `kc · NR` f32 of this panel block, and the C block at `rows` rows of
            // `ncols ≤ NR` columns inside `c`; panels are disjoint in columns, so no two tasks write
            // the same element.
            unsafe {
                let tile = Tile {
                    c: c.add(i0 * ldc + p * NR),
                    ldc,
                    rows,
                    ncols,
                    load: kb > 0,
                };
                if S::WIDE_TILE >= 4 {
                    ukr_f32::<S, 4>(kc, &arows, bptr, tile, next);
                } else {
                    ukr_f32::<S, 2>(kc, &arows, bptr, tile, next);
                }
            }
        });
    }
}

/// The bf16 arm with `vdpbf16ps`: activations rounded to bf16 pairs once per call into `abuf`, the
/// products straight on the packed weights, walked as the fp32 arm walks them.
fn gemm_bf16_hw(p: Product<'_>, a: Rows<'_>, c: RowsMut<'_>, abuf: &mut Vec<u32>) {
    let Product { kern, w, pause } = p;
    let (m, lda, ldc) = (a.m, a.ld, c.ld);
    let (n, k, kp) = (w.n(), w.k(), w.kp());
    let Store::Bf16(d) = w.store() else {
        unreachable!("bf16 path is only taken for bf16 storage")
    };
    // Rows padded by one cache line, so no stride is a multiple of 4 KiB (L1 set conflicts).
    let lpa = kp + 16;
    abuf.clear();
    abuf.resize(m * lpa, 0);
    abuf.par_chunks_mut(lpa).enumerate().for_each(|(i, row)| {
        round_pairs(kern, &a.data[i * lda..i * lda + k], &mut row[..kp]);
    });
    let cp = SendPtr(c.data.as_mut_ptr());
    let abase = abuf.as_ptr() as usize;
    let block = |p: usize, kb: usize| -> &[u8] {
        if p >= w.panels() {
            return &[];
        }
        let off = p * kp * NR * 2 + kb * NR * 2;
        as_bytes(&d[off..off + (kp - kb).min(KP_BF16) * NR * 2])
    };
    let walk = Walk {
        m,
        units: kp,
        step: KP_BF16,
        block: &block,
    };
    (0..w.panels()).into_par_iter().for_each(|p| {
        pause.reach();
        let ncols = (n - p * NR).min(NR);
        let prepare = |kb: usize, _| d[p * kp * NR * 2 + kb * NR * 2..].as_ptr();
        walk.panel(p, prepare, |&bptr, g| {
            let Group {
                i0, rows, kb, kc, ..
            } = g;
            let mut arows = [std::ptr::null::<u32>(); MR];
            for (r, x) in arows.iter_mut().enumerate() {
                *x = (abase as *const u32).wrapping_add((i0 + r.min(rows - 1)) * lpa + kb);
            }
            // SAFETY: as in the fp32 arm: in-bounds rows of the rounded activations, `kc` pairs of
            // this panel, disjoint C columns per task; AVX512_BF16 checked by the caller.
            unsafe {
                let cblk = cp.get().add(i0 * ldc + p * NR);
                #[cfg(target_arch = "x86_64")]
                super::x86::ukr_bf16(
                    kc,
                    &arows,
                    bptr,
                    Tile {
                        c: cblk,
                        ldc,
                        rows,
                        ncols,
                        load: kb > 0,
                    },
                );
                #[cfg(not(target_arch = "x86_64"))]
                let _ = (kc, bptr, cblk, ncols);
            }
        });
    });
}

/// The bf16 arm on AMX tiles: activations rounded to bf16 pairs as for `vdpbf16ps`, in rows padded with
/// zeros to whole tile blocks (32 rows, 16 pairs), then in chunks of rows that stay in L2, per panel and
/// per 32-row block two half-panel tile products over all inputs ([`super::amx::run_gemm`]), stored to a
/// small buffer and copied into C.
#[cfg(target_arch = "x86_64")]
fn gemm_bf16_amx(p: Product<'_>, a: Rows<'_>, c: RowsMut<'_>, abuf: &mut Vec<u32>) {
    use super::amx::{self, ROWS, STEP, TileRows};
    let Product { kern, w, pause } = p;
    let (m, lda, ldc) = (a.m, a.ld, c.ld);
    let (n, k, kp) = (w.n(), w.k(), w.kp());
    let Store::Bf16(d) = w.store() else {
        unreachable!("bf16 path is only taken for bf16 storage")
    };
    let steps = kp.div_ceil(STEP);
    // One cache line past the padded pairs, so no row stride is a multiple of 4 KiB.
    let lpa = steps * STEP + 16;
    let mpad = m.div_ceil(ROWS) * ROWS;
    abuf.clear();
    abuf.resize(mpad * lpa, 0);
    abuf[..m * lpa]
        .par_chunks_mut(lpa)
        .enumerate()
        .for_each(|(i, row)| {
            round_pairs(kern, &a.data[i * lda..i * lda + k], &mut row[..kp]);
        });
    let cp = SendPtr(c.data.as_mut_ptr());
    let copy = |p: usize, r0: usize, rows: usize, res: &[i32]| {
        let ncols = (n - p * NR).min(NR);
        for r in 0..rows {
            // SAFETY: panel `p` owns columns p·NR..p·NR+ncols of every row, and each (panel, row block)
            // is written once; rows < m.
            let crow = unsafe {
                std::slice::from_raw_parts_mut(cp.get().add((r0 + r) * ldc + p * NR), ncols)
            };
            for (x, v) in crow.iter_mut().zip(&res[r * NR..r * NR + ncols]) {
                *x = f32::from_bits(*v as u32);
            }
        }
    };
    let lda = lpa * 4;
    // SAFETY: `Kernels::amx` is only true where `amx::available()` said so; the rounded rows are padded
    // with zeros to whole 32-row blocks and 16-pair steps (`mpad`, `lpa`); the panels are `kp · NR`
    // pairs each.
    unsafe {
        amx::run_gemm::<amx::Amx>(
            amx::Job {
                product: amx::Product::Bf16,
                rows: TileRows {
                    a: abuf.as_ptr() as *const u8,
                    lda,
                    m,
                },
                w: amx::Panels {
                    data: as_bytes(&d[..]),
                    panel_bytes: kp * NR * 2 * 2,
                    n,
                },
                chunks: amx::chunks(lda, m),
                pause,
            },
            copy,
        )
    };
}

/// The bytes of a slice, for prefetch hints.
pub(crate) fn as_bytes<T: Copy>(s: &[T]) -> &[u8] {
    // SAFETY: any initialised memory may be viewed as bytes; the length covers exactly the slice.
    unsafe { std::slice::from_raw_parts(s.as_ptr() as *const u8, std::mem::size_of_val(s)) }
}

/// Ask for the cache line at `p` in L1 (a hint: it never faults, whatever the address).
#[inline(always)]
fn prefetch_l1(p: *const f32) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint that cannot fault, for any address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Widen a BF16 panel chunk `[kp][NR][2]` into f32 `[2·kp][NR]` (exact: a shift or a mask per vector).
#[inline(always)]
fn widen<S: Simd>(src: &[u16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len());
    let pairs = src.len() / (2 * NR);
    let (s, d) = (src.as_ptr() as *const u32, dst.as_mut_ptr());
    // SAFETY: pair row `kk` is `NR` u32 of `src` and fills rows `2kk`, `2kk + 1` of `dst` (`NR` f32
    // each); NR is a multiple of every LANES.
    unsafe {
        for kk in 0..pairs {
            let mut j = 0;
            while j < NR {
                let (even, odd) = S::widen_pairs(s.add(kk * NR + j));
                S::store(d.add(2 * kk * NR + j), even);
                S::store(d.add((2 * kk + 1) * NR + j), odd);
                j += S::LANES;
            }
        }
    }
}

fn round_pairs(kern: Kernels, src: &[f32], dst: &mut [u32]) {
    #[cfg(target_arch = "x86_64")]
    if kern.avx512bf16() {
        // SAFETY: AVX512_BF16 checked; `dst` has `src.len().div_ceil(2)` elements.
        unsafe { super::x86::round_pairs_bf16(src.len(), src.as_ptr(), dst.as_mut_ptr()) };
        return;
    }
    let _ = kern;
    for (i, d) in dst.iter_mut().enumerate() {
        let lo = src.get(2 * i).map_or(0, |x| bf16_bits(*x)) as u32;
        let hi = src.get(2 * i + 1).map_or(0, |x| bf16_bits(*x)) as u32;
        *d = lo | (hi << 16);
    }
}

/// GEMM microkernel, fp32 arm: `C[0..rows, 0..ncols] (+)= Σ_k A[k][r] · B[k][j]` over `kc` steps, in
/// column blocks of `NV` vectors (one block of 64 on AVX-512: 24 accumulators; four of 16 on AVX2: 12).
///
/// # Safety
/// Each `a[r]` addresses `kc` f32 of one activation row, `b` holds `kc · NR` f32 (`[k][NR]`), `tile.c`
/// addresses `tile.rows` rows of stride `tile.ldc` with `tile.ncols ≤ NR` writable columns.
#[inline(always)]
unsafe fn ukr_f32<S: Simd, const NV: usize>(
    kc: usize,
    a: &[*const f32; MR],
    b: *const f32,
    tile: Tile,
    next: Option<&[*const f32; MR]>,
) {
    let Tile {
        c,
        ldc,
        rows,
        ncols,
        load,
    } = tile;
    // SAFETY: the caller guarantees the extents documented above.
    unsafe {
        let mut j0 = 0;
        while j0 < ncols {
            let left = |v: usize| (ncols - j0).saturating_sub(v * S::LANES);
            let mut acc = [[S::zero(); NV]; MR];
            if load {
                for (r, row) in acc.iter_mut().enumerate().take(rows) {
                    for (v, x) in row.iter_mut().enumerate() {
                        *x = S::load_part(c.add(r * ldc + j0 + v * S::LANES), left(v));
                    }
                }
            }
            // The first column block also pulls the next row group's inputs towards L1, one line
            // per two steps: without it each group starts on cache misses to L3 (rows are a row
            // stride apart, too far for the hardware prefetcher), which costs AVX2 a fifth of its
            // rate once the activations outgrow L2.
            let fetch = if j0 == 0 { next } else { None };
            let bj = b.add(j0);
            let mut kk = 0;
            if let Some(n) = fetch {
                // One line every two steps, the rows in turn: over 2·MR steps the line offset is
                // fixed, so the loop carries no division (its multiply shared the FMA ports and
                // cost the AVX2 kernel several per cent).
                let mut off = 0;
                while kk + 2 * MR <= kc && off < kc {
                    for row in n {
                        prefetch_l1(row.wrapping_add(off));
                        fma_step::<S, NV>(a, bj, kk, &mut acc);
                        fma_step::<S, NV>(a, bj, kk + 1, &mut acc);
                        kk += 2;
                    }
                    off += 16;
                }
            }
            // Four steps a turn: the loop's own integer work issues on the FMA ports too.
            while kk + 4 <= kc {
                fma_step::<S, NV>(a, bj, kk, &mut acc);
                fma_step::<S, NV>(a, bj, kk + 1, &mut acc);
                fma_step::<S, NV>(a, bj, kk + 2, &mut acc);
                fma_step::<S, NV>(a, bj, kk + 3, &mut acc);
                kk += 4;
            }
            while kk < kc {
                fma_step::<S, NV>(a, bj, kk, &mut acc);
                kk += 1;
            }
            for (r, row) in acc.iter().enumerate().take(rows) {
                for (v, x) in row.iter().enumerate() {
                    S::store_part(c.add(r * ldc + j0 + v * S::LANES), left(v), *x);
                }
            }
            j0 += NV * S::LANES;
        }
    }
}

/// One k step of [`ukr_f32`]: `acc[r] += a[r][kk] · B[kk][block]`, `bj` the block's first column. A
/// function, not a closure, and always inlined: a closure called seven times was left out of line in one
/// instantiation (AVX2), and outside the `#[target_feature]` caller every intrinsic in it became a call.
///
/// # Safety
/// `bj + kk · NR` addresses `NV · S::LANES` f32; each `a[r]` addresses at least `kk + 1` f32.
#[inline(always)]
unsafe fn fma_step<S: Simd, const NV: usize>(
    a: &[*const f32; MR],
    bj: *const f32,
    kk: usize,
    acc: &mut [[S::V; NV]; MR],
) {
    // SAFETY: the caller guarantees the extents above.
    unsafe {
        let bp = bj.add(kk * NR);
        let mut bv = [S::zero(); NV];
        for (v, x) in bv.iter_mut().enumerate() {
            *x = S::load(bp.add(v * S::LANES));
        }
        for (r, row) in acc.iter_mut().enumerate() {
            let ar = S::splat(*a[r].add(kk));
            for (v, x) in row.iter_mut().enumerate() {
                *x = S::fma(ar, bv[v], *x);
            }
        }
    }
}

#[cfg(test)]
mod tests;
