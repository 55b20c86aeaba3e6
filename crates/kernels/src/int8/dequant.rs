//! Dequantisation of the int8 GEMM's exact integer sums into C: `(f32(sum) · s_w) · s_a`, in this order on
//! every path (VNNI's shifted activations first take `128 · Σ q_w` off).

use crate::Kernels;
use crate::SendPtr;
use crate::layout::{MR8, NR};
use crate::simd::{Kernel, Simd};

use super::PackedInt8;

/// Where a microkernel that dequantises its own rows (AVX2 8-bit, ymm and zmm VNNI) writes them after
/// the last input block: `C[r][j] = (f32(sum) · sw[j]) · sa[r]` for `r < rows`, `j < ncols`, as
/// [`Dequant`] would (VNNI: `sum − 128 · wsum[j]`).
#[derive(Debug, Clone, Copy)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) struct Dequantised {
    /// Row 0 of the group, the panel's first column.
    pub(crate) c: *mut f32,
    pub(crate) ldc: usize,
    /// The panel's 64 weight scales (zero past `n`).
    pub(crate) sw: *const f32,
    /// The panel's 64 sums `Σ q_w` (for the VNNI kernels' `128 · Σ q_w` correction).
    pub(crate) wsum: *const i32,
    /// The group's six row scales.
    pub(crate) sa: *const f32,
    /// Columns of C in the panel.
    pub(crate) ncols: usize,
}

/// Writes panel `p`'s columns of C from exact integer sums.
pub(super) struct Dequant<'a> {
    pub(super) kern: Kernels,
    pub(super) w: &'a PackedInt8,
    pub(super) p: usize,
    /// `s_a` of every row of the call.
    pub(super) scale: &'a [f32],
    /// The sums include `128 · Σ q_w` (VNNI's shifted activations).
    pub(super) shift: bool,
    /// i32 sums per output (1, or 2 on AVX2: one per input pair of the groups).
    pub(super) lanes: usize,
    /// Outputs per column block of the sums' layout (see [`Path::acc_cols`](super::drive::Path::acc_cols)).
    pub(super) cols: usize,
    pub(super) c: SendPtr<f32>,
    pub(super) ldc: usize,
}

impl Dequant<'_> {
    /// Rows `rows` of C from `acc` (`NR · lanes` i32 per row in groups of six rows laid out as
    /// [`Path::acc_cols`](super::drive::Path::acc_cols) says, the first for `rows.start`; an output's lanes added, exactly): exact
    /// integer → f32, times `s_w`, times `s_a`, in this order on every path.
    pub(super) fn rows(&self, acc: &[i32], rows: std::ops::Range<usize>) {
        let Dequant {
            kern,
            w,
            p,
            scale,
            shift,
            lanes,
            cols,
            c,
            ldc,
        } = *self;
        let ncols = (w.n - p * NR).min(NR);
        let sc = &w.scale[p * NR..p * NR + ncols];
        let ws = &w.wsum[p * NR..p * NR + ncols];
        crate::dispatch::dispatch(
            kern,
            DequantRows {
                acc,
                rows,
                lanes,
                cols,
                sc,
                ws: shift.then_some(ws),
                scale,
                c: c.get().wrapping_add(p * NR),
                ldc,
            },
        );
    }
}

/// The body of [`Dequant::rows`], entered through `dispatch` so its plain loops are compiled (and
/// vectorised) for the kernels' instruction set.
struct DequantRows<'a> {
    acc: &'a [i32],
    rows: std::ops::Range<usize>,
    lanes: usize,
    cols: usize,
    /// `s_w` of the panel's columns (as many as it has).
    sc: &'a [f32],
    /// `Σ q_w` of the panel's columns where the sums include `128 · Σ q_w`.
    ws: Option<&'a [i32]>,
    scale: &'a [f32],
    /// Column `p · NR` of row 0 of C.
    c: *mut f32,
    ldc: usize,
}

impl Kernel for DequantRows<'_> {
    type Out = ();
    #[inline(always)]
    fn run<S: Simd>(self) {
        let DequantRows {
            acc,
            rows,
            lanes,
            cols,
            sc,
            ws,
            scale,
            c,
            ldc,
        } = self;
        let ncols = sc.len();
        let first = rows.start;
        for i in rows {
            let (g6, r) = ((i - first) / MR8, (i - first) % MR8);
            let base = g6 * MR8 * NR * lanes + r * cols * lanes;
            // SAFETY: the panel owns columns p·NR..p·NR+ncols of every row; rows < m.
            let crow = unsafe { std::slice::from_raw_parts_mut(c.add(i * ldc), ncols) };
            let s = scale[i];
            // Column block `b` of the row: `cols` outputs, `lanes` sums each, blocks `MR8 · cols ·
            // lanes` i32 apart.
            for b in 0..ncols.div_ceil(cols) {
                let j0 = b * cols;
                let nb = (ncols - j0).min(cols);
                let src = &acc[base + b * MR8 * cols * lanes..][..nb * lanes];
                let (out, sc) = (&mut crow[j0..j0 + nb], &sc[j0..j0 + nb]);
                match (lanes, ws) {
                    (2, _) => {
                        for ((o, v), f) in out.iter_mut().zip(src.chunks_exact(2)).zip(sc) {
                            *o = (v[0].wrapping_add(v[1]) as f32 * f) * s;
                        }
                    }
                    (_, Some(ws)) => {
                        for (((o, v), f), w) in out.iter_mut().zip(src).zip(sc).zip(&ws[j0..]) {
                            *o = ((v - 128 * w) as f32 * f) * s;
                        }
                    }
                    _ => {
                        for ((o, v), f) in out.iter_mut().zip(src).zip(sc) {
                            *o = (*v as f32 * f) * s;
                        }
                    }
                }
            }
        }
    }
}
