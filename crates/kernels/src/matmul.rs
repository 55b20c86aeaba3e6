//! `C (+)= A · B` for f32 matrices in memory: the products inside the Gated DeltaNet chunks, attention
//! and the unmerged LoRA. Sizes are small (a 64-token chunk, a 128-wide head) and both operands change
//! with every call, so there is no packing: a 6-row × 64-column register block (12 × 16 or 12 × 32 for
//! narrow outputs) reads `B` rows straight from memory.

use std::cell::Cell;

use rayon::prelude::*;

use super::dispatch::dispatch;
use super::simd::{Kernel, Simd};
use super::{Kernels, SendPtr};

thread_local! {
    static PACK: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// A row-major matrix view: `rows × cols` with row stride `ld`.
#[derive(Debug, Clone, Copy)]
pub struct Mat<'a> {
    /// The elements (at least `(rows − 1) · ld + cols`).
    pub data: &'a [f32],
    /// Rows.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
    /// Row stride.
    pub ld: usize,
}

impl<'a> Mat<'a> {
    /// A dense `rows × cols` view.
    pub fn new(data: &'a [f32], rows: usize, cols: usize) -> Self {
        Mat {
            data,
            rows,
            cols,
            ld: cols,
        }
    }

    fn check(&self, what: &str) {
        assert!(
            self.ld >= self.cols
                && (self.rows == 0 || self.data.len() >= (self.rows - 1) * self.ld + self.cols),
            "matmul: {what} too short"
        );
    }
}

/// `C[m × n] = A[m × k] · B[k × n]` (or `+=` when `accumulate`); `c` row-major with stride `ldc`.
/// Each element is one FMA chain over `k` in increasing order (from the old value when accumulating).
pub fn matmul(kern: Kernels, a: Mat<'_>, b: Mat<'_>, c: &mut [f32], ldc: usize, accumulate: bool) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    assert_eq!(b.rows, k, "matmul: inner sizes differ");
    a.check("A");
    b.check("B");
    if m == 0 || n == 0 {
        return;
    }
    assert!(
        ldc >= n && c.len() >= (m - 1) * ldc + n,
        "matmul: C too short"
    );
    if kern.simd() && m >= 24 && b.ld >= 128 {
        // Rows of B a power-of-two apart share L1 sets; copy each 64-column block of B into a dense
        // `[k, 64]` buffer first (same arithmetic, same order).
        return PACK.with(|p| {
            let mut buf = p.take();
            let mut j0 = 0;
            while j0 < n {
                let nc = (n - j0).min(64);
                if buf.len() < k * 64 {
                    buf.resize(k * 64, 0.0);
                }
                for kk in 0..k {
                    buf[kk * 64..kk * 64 + nc]
                        .copy_from_slice(&b.data[kk * b.ld + j0..kk * b.ld + j0 + nc]);
                }
                dispatch(
                    kern,
                    Product {
                        m,
                        n: nc,
                        k,
                        a: a.data.as_ptr(),
                        lda: a.ld,
                        b: buf.as_ptr(),
                        ldb: 64,
                        // SAFETY (of the offset): j0 < n ≤ ldc, inside the first row of C.
                        c: c[j0..].as_mut_ptr(),
                        ldc,
                        accumulate,
                    },
                );
                j0 += 64;
            }
            p.set(buf);
        });
    }
    dispatch(
        kern,
        Product {
            m,
            n,
            k,
            a: a.data.as_ptr(),
            lda: a.ld,
            b: b.data.as_ptr(),
            ldb: b.ld,
            c: c.as_mut_ptr(),
            ldc,
            accumulate,
        },
    );
}

/// One product with extents checked by [`matmul`]: `C[m×n] (+)= A[m×k] · B[k×n]`, row-major strides.
struct Product {
    m: usize,
    n: usize,
    k: usize,
    a: *const f32,
    lda: usize,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
}

impl Kernel for Product {
    type Out = ();
    #[inline(always)]
    fn run<S: Simd>(self) {
        let bw = S::WIDE_TILE * S::LANES;
        let mut j0 = 0;
        while j0 < self.n {
            let nc = (self.n - j0).min(bw);
            let nv = nc.div_ceil(S::LANES);
            // SAFETY: the column block lies inside B's and C's rows (extents checked by `matmul`).
            unsafe {
                let (b, c) = (self.b.add(j0), self.c.add(j0));
                // Narrow column blocks have few accumulators per row, so take more rows per block;
                // with 16 vector registers (AVX2) at most 12 accumulators fit.
                if S::WIDE_TILE >= 4 {
                    match nv {
                        1 => self.rows::<S, 12, 1>(b, c, nc),
                        2 => self.rows::<S, 12, 2>(b, c, nc),
                        3 => self.rows::<S, 8, 3>(b, c, nc),
                        _ => self.rows::<S, 6, 4>(b, c, nc),
                    }
                } else {
                    match nv {
                        1 => self.rows::<S, 12, 1>(b, c, nc),
                        _ => self.rows::<S, 6, 2>(b, c, nc),
                    }
                }
            }
            j0 += bw;
        }
    }
}

impl Product {
    /// Every row block of one column block of `nc ≤ NV · LANES` columns starting at `b` / `c`.
    #[inline(always)]
    unsafe fn rows<S: Simd, const MRB: usize, const NV: usize>(
        &self,
        b: *const f32,
        c: *mut f32,
        nc: usize,
    ) {
        // SAFETY: rows past `m` in a register block reuse the last valid row's pointer and are never
        // stored; every other access is inside the checked extents.
        unsafe {
            let mut i0 = 0;
            while i0 < self.m {
                let rows = (self.m - i0).min(MRB);
                let mut arows = [self.a; MRB];
                for (r, p) in arows.iter_mut().enumerate() {
                    *p = self.a.add((i0 + r.min(rows - 1)) * self.lda);
                }
                let cblk = c.add(i0 * self.ldc);
                let mut acc = [[S::zero(); NV]; MRB];
                if self.accumulate {
                    for (r, row) in acc.iter_mut().enumerate().take(rows) {
                        for (v, x) in row.iter_mut().enumerate() {
                            let left = nc.saturating_sub(v * S::LANES);
                            *x = S::load_part(cblk.add(r * self.ldc + v * S::LANES), left);
                        }
                    }
                }
                for kk in 0..self.k {
                    let bp = b.add(kk * self.ldb);
                    let mut bv = [S::zero(); NV];
                    // Whole blocks load without masks: a masked load costs more (the products of a
                    // GDN chunk measured 12–17 % faster this way on AVX-512).
                    if nc == NV * S::LANES {
                        for (v, x) in bv.iter_mut().enumerate() {
                            *x = S::load(bp.add(v * S::LANES));
                        }
                    } else {
                        for (v, x) in bv.iter_mut().enumerate() {
                            *x =
                                S::load_part(bp.add(v * S::LANES), nc.saturating_sub(v * S::LANES));
                        }
                    }
                    for (r, row) in acc.iter_mut().enumerate() {
                        let ar = S::splat(*arows[r].add(kk));
                        for (v, x) in row.iter_mut().enumerate() {
                            *x = S::fma(ar, bv[v], *x);
                        }
                    }
                }
                for (r, row) in acc.iter().enumerate().take(rows) {
                    for (v, x) in row.iter().enumerate() {
                        let left = nc.saturating_sub(v * S::LANES);
                        S::store_part(cblk.add(r * self.ldc + v * S::LANES), left, *x);
                    }
                }
                i0 += MRB;
            }
        }
    }
}

/// [`matmul`] with the rows of `A` split across threads (for the tall products of the LoRA path).
/// Results are identical to [`matmul`]: rows never interact.
pub fn matmul_par(
    kern: Kernels,
    a: Mat<'_>,
    b: Mat<'_>,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    const ROWS: usize = 48;
    let (m, n) = (a.rows, b.cols);
    if m <= ROWS {
        return matmul(kern, a, b, c, ldc, accumulate);
    }
    a.check("A");
    assert!(
        ldc >= n && c.len() >= (m - 1) * ldc + n,
        "matmul: C too short"
    );
    let cp = SendPtr(c.as_mut_ptr());
    let clen = c.len();
    (0..m.div_ceil(ROWS)).into_par_iter().for_each(|blk| {
        let i0 = blk * ROWS;
        let rows = (m - i0).min(ROWS);
        let sub = Mat {
            data: &a.data[i0 * a.ld..],
            rows,
            cols: a.cols,
            ld: a.ld,
        };
        let start = i0 * ldc;
        let len = ((rows - 1) * ldc + n).min(clen - start);
        // SAFETY: blocks cover disjoint row ranges of `c`, so the sub-slices never overlap.
        let csub = unsafe { std::slice::from_raw_parts_mut(cp.get().add(start), len) };
        matmul(kern, sub, b, csub, ldc, accumulate);
    });
}

/// Transpose `src` (`rows × cols`, stride `lds`) into `dst` (`cols × rows`, dense).
pub fn transpose(src: &[f32], rows: usize, cols: usize, lds: usize, dst: &mut [f32]) {
    assert!(dst.len() >= rows * cols, "transpose: dst too short");
    assert!(
        rows == 0 || cols == 0 || src.len() >= (rows - 1) * lds + cols,
        "transpose: src too short"
    );
    // Whole 8 × 8 blocks in registers where AVX is there (a GDN chunk's Kᵀ, 64 × 128, every chunk: the
    // element loop took a third of the chunk's set-up), the edges element by element.
    let (r8, c8) = transpose_blocks(src, rows, cols, lds, dst);
    let mut one = |i: usize, j: usize| dst[j * rows + i] = src[i * lds + j];
    for i in 0..r8 {
        for j in c8..cols {
            one(i, j);
        }
    }
    for i in r8..rows {
        for j in 0..cols {
            one(i, j);
        }
    }
}

/// The whole 8 × 8 blocks of [`transpose`] (extents checked there); returns the rows and columns they
/// covered (none without AVX).
fn transpose_blocks(
    src: &[f32],
    rows: usize,
    cols: usize,
    lds: usize,
    dst: &mut [f32],
) -> (usize, usize) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx") {
        let (r8, c8) = (rows / 8 * 8, cols / 8 * 8);
        for i0 in (0..r8).step_by(8) {
            for j0 in (0..c8).step_by(8) {
                // SAFETY: AVX detected; the block's rows i0..i0+8 and columns j0..j0+8 lie inside `src`
                // and, transposed, inside `dst` (`cols × rows`): both extents asserted by `transpose`.
                unsafe {
                    super::x86::transpose8x8(
                        src.as_ptr().add(i0 * lds + j0),
                        lds,
                        dst.as_mut_ptr().add(j0 * rows + i0),
                        rows,
                    )
                };
            }
        }
        return (r8, c8);
    }
    let _ = (src, rows, cols, lds, dst);
    (0, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matmul_matches_naive_and_is_row_independent() {
        let kernels = Kernels::available();
        let mut seed = 5u64;
        let mut r = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        };
        for kern in kernels {
            for &(m, k, n) in &[
                (1, 1, 1),
                (7, 5, 17),
                (13, 64, 64),
                (128, 128, 128),
                (30, 9, 150),
                (100, 2560, 16),
            ] {
                let lda = k + 1;
                let ldb = n + 2;
                let a: Vec<f32> = (0..m * lda).map(|_| r()).collect();
                let b: Vec<f32> = (0..k * ldb).map(|_| r()).collect();
                let c0: Vec<f32> = (0..m * n).map(|_| r()).collect();
                for acc in [false, true] {
                    let mut c = c0.clone();
                    let am = Mat {
                        data: &a,
                        rows: m,
                        cols: k,
                        ld: lda,
                    };
                    let bm = Mat {
                        data: &b,
                        rows: k,
                        cols: n,
                        ld: ldb,
                    };
                    matmul(kern, am, bm, &mut c, n, acc);
                    let mut cp = c0.clone();
                    matmul_par(kern, am, bm, &mut cp, n, acc);
                    assert_eq!(c, cp);
                    for i in 0..m {
                        for j in 0..n {
                            let mut s = if acc { c0[i * n + j] as f64 } else { 0.0 };
                            let mut mag = s.abs();
                            for kk in 0..k {
                                let p = a[i * lda + kk] as f64 * b[kk * ldb + j] as f64;
                                s += p;
                                mag += p.abs();
                            }
                            let err = (c[i * n + j] as f64 - s).abs();
                            assert!(
                                err <= 2e-6 * (k as f64).sqrt() * mag + 1e-30,
                                "{kern:?} {m}×{k}×{n} [{i},{j}]"
                            );
                        }
                    }
                    // One row alone gives the same bits as inside the block.
                    if m > 3 {
                        let mut one = c0[3 * n..4 * n].to_vec();
                        let a3 = Mat {
                            data: &a[3 * lda..],
                            rows: 1,
                            cols: k,
                            ld: lda,
                        };
                        matmul(kern, a3, bm, &mut one, n, acc);
                        assert_eq!(&one[..], &c[3 * n..4 * n]);
                    }
                }
            }
        }
    }

    #[test]
    fn transpose_is_the_definition_on_every_path() {
        for (rows, cols, lds) in [
            (8, 8, 8),
            (64, 128, 128),
            (16, 24, 40),
            (7, 37, 40),
            (30, 128, 128),
        ] {
            let src: Vec<f32> = (0..rows * lds).map(|i| i as f32 * 0.5 - 3.0).collect();
            let mut t = vec![f32::NAN; rows * cols];
            transpose(&src, rows, cols, lds, &mut t);
            for i in 0..rows {
                for j in 0..cols {
                    assert_eq!(
                        t[j * rows + i],
                        src[i * lds + j],
                        "{rows}x{cols} at ({i}, {j})"
                    );
                }
            }
        }
    }

    #[test]
    fn transpose_round_trip() {
        let src: Vec<f32> = (0..7 * 40).map(|i| i as f32).collect();
        let mut t = vec![0f32; 7 * 37];
        transpose(&src, 7, 37, 40, &mut t);
        let mut back = vec![0f32; 7 * 37];
        transpose(&t, 37, 7, 7, &mut back);
        for i in 0..7 {
            assert_eq!(&back[i * 37..(i + 1) * 37], &src[i * 40..i * 40 + 37]);
        }
    }
}
