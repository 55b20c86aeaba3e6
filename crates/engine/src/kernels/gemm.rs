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

/// Which kernels run a product, and in which arithmetic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    /// The instruction set's kernels.
    pub kern: Kernels,
    /// The arithmetic (fp32, bf16 or int8 weights).
    pub arm: Arm,
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

/// `C[i, j] = Σ_k A[i, k] · W[j, k]` for `i < a.m`, `j < w.n()`; `A` row-major with stride `a.ld`, `C`
/// with stride `c.ld` (only the first `w.n()` columns of each row are written).
///
/// Panics if the slices are too short for the given sizes and strides (a caller bug, not an input error).
pub fn gemm(run: Run, a: Rows<'_>, w: &PackedMatrix, c: RowsMut<'_>) {
    let Run { kern, arm } = run;
    let Rows {
        m,
        data: a,
        ld: lda,
    } = a;
    let RowsMut { data: c, ld: ldc } = c;
    let (n, k) = (w.n(), w.k());
    if m == 0 || n == 0 {
        return;
    }
    assert!(
        lda >= k && a.len() >= (m - 1) * lda + k,
        "gemm: A too short"
    );
    assert!(
        ldc >= n && c.len() >= (m - 1) * ldc + n,
        "gemm: C too short"
    );
    if k == 0 {
        for i in 0..m {
            c[i * ldc..i * ldc + n].fill(0.0);
        }
        return;
    }
    if arm == Arm::Int8 {
        super::int8::gemm_int8(kern, m, a, lda, w.int8(), c, ldc);
        return;
    }
    let bf16_hw = arm == Arm::Bf16 && kern.avx512bf16() && w.is_bf16();
    if bf16_hw {
        // Tiles where the CPU has them, else `vdpbf16ps`: the same rounded activations either way.
        type Bf16Gemm = fn(Kernels, Rows<'_>, &PackedMatrix, RowsMut<'_>, &mut Vec<u32>);
        #[cfg(target_arch = "x86_64")]
        let run: Bf16Gemm = if kern.amx() {
            gemm_bf16_amx
        } else {
            gemm_bf16_hw
        };
        #[cfg(not(target_arch = "x86_64"))]
        let run: Bf16Gemm = gemm_bf16_hw;
        SCRATCH_U32.with(|s| {
            let mut buf = std::mem::take(&mut *s.borrow_mut());
            run(
                kern,
                Rows {
                    m,
                    data: a,
                    ld: lda,
                },
                w,
                RowsMut { data: c, ld: ldc },
                &mut buf,
            );
            *s.borrow_mut() = buf;
        });
    } else if arm == Arm::Bf16 {
        SCRATCH_F32.with(|s| {
            let mut buf = std::mem::take(&mut *s.borrow_mut());
            let lb = k + 16;
            buf.clear();
            buf.resize(m * lb, 0.0);
            buf.par_chunks_mut(lb).enumerate().for_each(|(i, row)| {
                for (d, x) in row.iter_mut().zip(&a[i * lda..i * lda + k]) {
                    *d = super::bf16_to_f32(bf16_bits(*x));
                }
            });
            gemm_f32(kern, m, &buf, lb, w, c, ldc);
            *s.borrow_mut() = buf;
        });
    } else {
        gemm_f32(kern, m, a, lda, w, c, ldc);
    }
}

fn gemm_f32(
    kern: Kernels,
    m: usize,
    a: &[f32],
    lda: usize,
    w: &PackedMatrix,
    c: &mut [f32],
    ldc: usize,
) {
    gemm_f32_kc(kern, kc_f32(), m, a, lda, w, c, ldc);
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

/// [`gemm_f32`] with input blocks of `kc` (a multiple of 16, at most [`KC_F32_MAX`]); the results do not
/// depend on it (each output is one FMA chain in input order, carried through C between blocks).
#[allow(clippy::too_many_arguments)]
fn gemm_f32_kc(
    kern: Kernels,
    kc: usize,
    m: usize,
    a: &[f32],
    lda: usize,
    w: &PackedMatrix,
    c: &mut [f32],
    ldc: usize,
) {
    assert!(kc.is_multiple_of(16) && (16..=KC_F32_MAX).contains(&kc));
    let cp = SendPtr(c.as_mut_ptr());
    let ap = SendPtr(a.as_ptr() as *mut f32);
    // Each task computes whole panels (disjoint columns of C); the instruction set is entered per
    // panel, inside the task, because rayon's closures are not compiled for it.
    (0..w.panels()).into_par_iter().for_each_init(
        || AlignedBuf::<f32>::zeroed(kc * NR),
        |buf, p| {
            crate::background::yield_point();
            dispatch(
                kern,
                PanelF32 {
                    w,
                    p,
                    m,
                    a: ap.get(),
                    lda,
                    c: cp.get(),
                    ldc,
                    kcb: kc,
                    buf: &mut buf[..],
                },
            )
        },
    );
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
        let mut mc0 = 0;
        while mc0 < m {
            let mc1 = (mc0 + MC).min(m);
            let mut kb = 0;
            while kb < k {
                let kc = (k - kb).min(kcb);
                let bptr: *const f32 = match w.store() {
                    Store::Bf16(d) => {
                        let off = p * kp * NR * 2 + (kb / 2) * NR * 2;
                        let pairs = kc.div_ceil(2);
                        widen::<S>(&d[off..off + pairs * NR * 2], &mut buf[..pairs * 2 * NR]);
                        buf.as_ptr()
                    }
                    Store::F32(d) => d[p * 2 * kp * NR + kb * NR..].as_ptr(),
                };
                // The block used after this one: next inputs, else the next row block of this
                // panel, else the next panel.
                let next = if kb + kc < k {
                    block(p, kb + kc)
                } else if mc1 < m {
                    block(p, 0)
                } else {
                    block(p + 1, 0)
                };
                let groups = (mc1 - mc0).div_ceil(MR);
                let mut i0 = mc0;
                while i0 < mc1 {
                    prefetch_share(next, (i0 - mc0) / MR, groups);
                    let rows = (mc1 - i0).min(MR);
                    let mut arows = [std::ptr::null::<f32>(); MR];
                    for (r, x) in arows.iter_mut().enumerate() {
                        // Rows past the block repeat its last row (computed, never stored).
                        *x = a.wrapping_add((i0 + r.min(rows - 1)) * lda + kb);
                    }
                    // SAFETY: `arows[r]` points at `kc` valid inputs of a row of `a` (asserted in
                    // `gemm`), `bptr` at `kc · NR` f32 of this panel block, and the C block at
                    // `rows` rows of `ncols ≤ NR` columns inside `c`; panels are disjoint in
                    // columns, so no two tasks write the same element.
                    let next_group = i0 + MR < mc1;
                    let mut nrows = [std::ptr::null::<f32>(); MR];
                    if next_group {
                        let last = mc1 - 1;
                        for (r, x) in nrows.iter_mut().enumerate() {
                            *x = a.wrapping_add((i0 + MR + r).min(last) * lda + kb);
                        }
                    }
                    let next = next_group.then_some(&nrows);
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
                    i0 += MR;
                }
                kb += kc;
            }
            mc0 = mc1;
        }
    }
}

fn gemm_bf16_hw(kern: Kernels, a: Rows<'_>, w: &PackedMatrix, c: RowsMut<'_>, abuf: &mut Vec<u32>) {
    let Rows {
        m,
        data: a,
        ld: lda,
    } = a;
    let RowsMut { data: c, ld: ldc } = c;
    let (n, k, kp) = (w.n(), w.k(), w.kp());
    let Store::Bf16(d) = w.store() else {
        unreachable!("bf16 path is only taken for bf16 storage")
    };
    // Rows padded by one cache line, so no stride is a multiple of 4 KiB (L1 set conflicts).
    let lpa = kp + 16;
    abuf.clear();
    abuf.resize(m * lpa, 0);
    abuf.par_chunks_mut(lpa).enumerate().for_each(|(i, row)| {
        round_pairs(kern, &a[i * lda..i * lda + k], &mut row[..kp]);
    });
    let cp = SendPtr(c.as_mut_ptr());
    let abase = abuf.as_ptr() as usize;
    let block = |p: usize, kb: usize| -> &[u8] {
        if p >= w.panels() {
            return &[];
        }
        let off = p * kp * NR * 2 + kb * NR * 2;
        as_bytes(&d[off..off + (kp - kb).min(KP_BF16) * NR * 2])
    };
    (0..w.panels()).into_par_iter().for_each(|p| {
        crate::background::yield_point();
        let ncols = (n - p * NR).min(NR);
        let mut mc0 = 0;
        while mc0 < m {
            let mc1 = (mc0 + MC).min(m);
            let mut kb = 0;
            while kb < kp {
                let kpc = (kp - kb).min(KP_BF16);
                let bptr = d[p * kp * NR * 2 + kb * NR * 2..].as_ptr();
                let next = if kb + kpc < kp {
                    block(p, kb + kpc)
                } else if mc1 < m {
                    block(p, 0)
                } else {
                    block(p + 1, 0)
                };
                let groups = (mc1 - mc0).div_ceil(MR);
                let mut i0 = mc0;
                while i0 < mc1 {
                    prefetch_share(next, (i0 - mc0) / MR, groups);
                    let rows = (mc1 - i0).min(MR);
                    let mut arows = [std::ptr::null::<u32>(); MR];
                    for (r, x) in arows.iter_mut().enumerate() {
                        *x = (abase as *const u32).wrapping_add((i0 + r.min(rows - 1)) * lpa + kb);
                    }
                    // SAFETY: as in `gemm_f32`: in-bounds rows of the rounded activations, `kpc` pairs
                    // of this panel, disjoint C columns per task; AVX512_BF16 checked by the caller.
                    unsafe {
                        let cblk = cp.get().add(i0 * ldc + p * NR);
                        #[cfg(target_arch = "x86_64")]
                        super::x86::ukr_bf16(
                            kpc,
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
                        let _ = (kpc, bptr, cblk, ncols);
                    }
                    i0 += MR;
                }
                kb += kpc;
            }
            mc0 = mc1;
        }
    });
}

/// The bf16 arm on AMX tiles: activations rounded to bf16 pairs as for `vdpbf16ps`, in rows padded with
/// zeros to whole tile blocks (32 rows, 16 pairs), then in chunks of rows that stay in L2, per panel and
/// per 32-row block two half-panel tile products over all inputs ([`super::amx::run_gemm`]), stored to a
/// small buffer and copied into C.
#[cfg(target_arch = "x86_64")]
fn gemm_bf16_amx(
    kern: Kernels,
    a: Rows<'_>,
    w: &PackedMatrix,
    c: RowsMut<'_>,
    abuf: &mut Vec<u32>,
) {
    use super::amx::{self, Product, ROWS, STEP, TileRows};
    let Rows {
        m,
        data: a,
        ld: lda,
    } = a;
    let RowsMut { data: c, ld: ldc } = c;
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
            round_pairs(kern, &a[i * lda..i * lda + k], &mut row[..kp]);
        });
    let cp = SendPtr(c.as_mut_ptr());
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
            Product::Bf16,
            TileRows {
                a: abuf.as_ptr() as *const u8,
                lda,
                m,
            },
            amx::Panels {
                data: as_bytes(&d[..]),
                panel_bytes: kp * NR * 2 * 2,
                n,
            },
            amx::chunks(lda, m),
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
            let step = |kk: usize, acc: &mut [[S::V; NV]; MR]| {
                let bp = b.add(kk * NR + j0);
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
            };
            let mut kk = 0;
            if let Some(n) = fetch {
                // One line every two steps, the rows in turn: over 2·MR steps the line offset is
                // fixed, so the loop carries no division (its multiply shared the FMA ports and
                // cost the AVX2 kernel several per cent).
                let mut off = 0;
                while kk + 2 * MR <= kc && off < kc {
                    for row in n {
                        prefetch_l1(row.wrapping_add(off));
                        step(kk, &mut acc);
                        step(kk + 1, &mut acc);
                        kk += 2;
                    }
                    off += 16;
                }
            }
            // Four steps a turn: the loop's own integer work issues on the FMA ports too.
            while kk + 4 <= kc {
                step(kk, &mut acc);
                step(kk + 1, &mut acc);
                step(kk + 2, &mut acc);
                step(kk + 3, &mut acc);
                kk += 4;
            }
            while kk < kc {
                step(kk, &mut acc);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
    }

    fn all_kernels() -> Vec<Kernels> {
        Kernels::available()
    }

    /// Σ_k a·w in f64, and Σ_k |a·w| for the error bound.
    fn exact(
        m: usize,
        a: &[f32],
        lda: usize,
        w: &[f32],
        n: usize,
        k: usize,
        round_a: bool,
    ) -> (Vec<f64>, Vec<f64>) {
        let mut c = vec![0f64; m * n];
        let mut mag = vec![0f64; m * n];
        for i in 0..m {
            for j in 0..n {
                for kk in 0..k {
                    let mut x = a[i * lda + kk];
                    if round_a {
                        x = crate::kernels::bf16_to_f32(bf16_bits(x));
                    }
                    let p = x as f64 * w[j * k + kk] as f64;
                    c[i * n + j] += p;
                    mag[i * n + j] += p.abs();
                }
            }
        }
        (c, mag)
    }

    #[test]
    fn gemm_matches_naive_on_odd_shapes() {
        let shapes = [
            (1, 1, 1),
            (5, 63, 7),
            (7, 65, 129),
            (13, 130, 300),
            (6, 64, 256),
            (20, 200, 515),
            // Several 32-row tile blocks (AMX), a partial last one.
            (70, 100, 90),
        ];
        for kern in all_kernels() {
            for &(m, n, k) in &shapes {
                for bf16_weights in [true, false] {
                    let mut seed = (m * 1000 + n * 10 + k) as u64;
                    let lda = k + 3;
                    let a: Vec<f32> = (0..m * lda).map(|_| lcg(&mut seed) * 4.0).collect();
                    let w: Vec<f32> = (0..n * k)
                        .map(|_| {
                            let x = lcg(&mut seed);
                            if bf16_weights {
                                crate::kernels::bf16_to_f32(bf16_bits(x))
                            } else {
                                x
                            }
                        })
                        .collect();
                    let pm = PackedMatrix::from_f32(n, k, &w);
                    assert_eq!(pm.is_bf16(), bf16_weights);
                    for arm in [Arm::Fp32, Arm::Bf16] {
                        let ldc = n + 5;
                        let mut c = vec![f32::NAN; m * ldc];
                        gemm(
                            Run { kern, arm },
                            Rows {
                                m,
                                data: &a,
                                ld: lda,
                            },
                            &pm,
                            RowsMut {
                                data: &mut c,
                                ld: ldc,
                            },
                        );
                        let (want, mag) = exact(m, &a, lda, &w, n, k, arm == Arm::Bf16);
                        for i in 0..m {
                            for j in 0..n {
                                let got = c[i * ldc + j] as f64;
                                let err = (got - want[i * n + j]).abs();
                                let tol = 2e-6 * (k as f64).sqrt() * mag[i * n + j] + 1e-30;
                                assert!(
                                    err <= tol,
                                    "{kern:?} {arm:?} {m}×{n}×{k} [{i},{j}]: {got} vs {}",
                                    want[i * n + j]
                                );
                            }
                            // Columns past n are never written.
                            assert!(c[i * ldc + n..i * ldc + ldc].iter().all(|x| x.is_nan()));
                        }
                    }
                }
            }
        }
    }

    /// The block chosen for a 32, 48 and 64 KiB L1D fits it with room for the six activation rows of
    /// the block and the C tile, and every block gives the same bits.
    #[test]
    fn the_fp32_block_fits_the_l1d_and_does_not_change_a_bit() {
        let mut blocks = Vec::new();
        for kib in [32usize, 48, 64] {
            let l1d = kib * 1024;
            let kc = kc_for_l1d(l1d);
            let bytes = kc * NR * 4 + MR * kc * 4 + MR * NR * 4;
            assert!(bytes <= l1d, "{kib} KiB: block {kc} needs {bytes} bytes");
            assert!(kc.is_multiple_of(16) && kc >= 32, "{kib} KiB: {kc}");
            blocks.push(kc);
        }
        assert!(blocks.windows(2).all(|b| b[0] < b[1]), "{blocks:?}");
        // Several whole blocks and a partial one at every size, with f32- and bf16-stored weights.
        let (m, n, k) = (13, 130, 397);
        let mut seed = 5;
        let a: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed)).collect();
        for bf16_weights in [true, false] {
            let w: Vec<f32> = (0..n * k)
                .map(|_| {
                    let x = lcg(&mut seed);
                    if bf16_weights {
                        crate::kernels::bf16_to_f32(bf16_bits(x))
                    } else {
                        x
                    }
                })
                .collect();
            let pm = PackedMatrix::from_f32(n, k, &w);
            for kern in all_kernels() {
                let run = |kc: usize| {
                    let mut c = vec![0f32; m * n];
                    gemm_f32_kc(kern, kc, m, &a, k, &pm, &mut c, n);
                    c.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
                };
                let want = run(KC_F32_MAX);
                for &kc in &blocks {
                    assert!(run(kc) == want, "{kern:?} block {kc} (bf16 {bf16_weights})");
                }
            }
        }
    }

    #[test]
    fn gemm_rows_do_not_depend_on_their_batch() {
        let (m, n, k) = (23, 130, 300);
        let mut seed = 99;
        let a: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed)).collect();
        let w: Vec<f32> = (0..n * k)
            .map(|_| crate::kernels::bf16_to_f32(bf16_bits(lcg(&mut seed))))
            .collect();
        let pm = PackedMatrix::from_f32(n, k, &w);
        for kern in all_kernels() {
            for arm in [Arm::Fp32, Arm::Bf16] {
                let mut all = vec![0f32; m * n];
                gemm(
                    Run { kern, arm },
                    Rows { m, data: &a, ld: k },
                    &pm,
                    RowsMut {
                        data: &mut all,
                        ld: n,
                    },
                );
                for start in [0, 1, 5, 17] {
                    for len in [1, 2, 6, 7] {
                        if start + len > m {
                            continue;
                        }
                        let mut part = vec![0f32; len * n];
                        gemm(
                            Run { kern, arm },
                            Rows {
                                m: len,
                                data: &a[start * k..],
                                ld: k,
                            },
                            &pm,
                            RowsMut {
                                data: &mut part,
                                ld: n,
                            },
                        );
                        assert_eq!(
                            &part[..],
                            &all[start * n..(start + len) * n],
                            "{kern:?} {arm:?} {start}+{len}"
                        );
                    }
                }
            }
        }
    }
}
