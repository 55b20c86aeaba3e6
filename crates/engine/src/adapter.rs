//! LoRA adapters applied unmerged, in f32, in PEFT's order: `y = W·x + (B·(A·x))·s`.
//!
//! An [`Adapter`] is one PEFT adapter laid out for one loaded backbone (its segments over each fused
//! projection's output columns), immutable and apart from the backbone's weights: rows name the adapter they
//! run under per pass, so a service adds and drops adapters while the backbone is shared, and an adapter's
//! memory is its own (freed with its last `Arc`). Made by `Adapter::new` / `Adapter::load` (in `model`,
//! which knows the projections' layout), or at load for the adapter a model is loaded with in the `exact` form.

use rayon::prelude::*;

use crate::kernels::{Kernels, Rows, RowsMut, SendPtr, matmul};
use crate::lora::LoraPair;
use crate::scratch::with_tls;

/// A LoRA update over the output columns `[col, col + n)` of a (possibly fused) projection.
#[derive(Debug)]
pub(crate) struct LoraSeg {
    /// First output column.
    pub col: usize,
    /// Output columns.
    pub n: usize,
    /// Rank.
    pub r: usize,
    /// Input width.
    pub k: usize,
    /// `Aᵀ [k, r]`.
    pub a_t: Vec<f32>,
    /// `Bᵀ [r, n]`.
    pub b_t: Vec<f32>,
    /// Scale.
    pub scale: f32,
}

impl LoraSeg {
    /// A LoRA pair as a segment over output columns `[col, col + n)` (shapes checked by the caller).
    pub(crate) fn new(pair: &LoraPair, col: usize, n: usize, k: usize) -> Self {
        let r = pair.r;
        let mut a_t = vec![0f32; k * r];
        matmul::transpose(&pair.a, r, k, k, &mut a_t);
        let mut b_t = vec![0f32; r * n];
        matmul::transpose(&pair.b, n, r, r, &mut b_t);
        LoraSeg {
            col,
            n,
            r,
            k,
            a_t,
            b_t,
            scale: pair.scale,
        }
    }

    fn bytes(&self) -> usize {
        4 * (self.a_t.len() + self.b_t.len())
    }
}

/// One PEFT adapter laid out for one loaded backbone: per projection (in the backbone's projection order),
/// its segments. See the module documentation.
#[derive(Debug)]
pub struct Adapter {
    /// The backbone it was laid out for ([`crate::Backbone`]'s load id): a forward refuses it elsewhere.
    pub(crate) model: u64,
    pub(crate) segments: Vec<Vec<LoraSeg>>,
}

impl Adapter {
    /// Bytes of its f32 LoRA tensors.
    pub fn bytes(&self) -> usize {
        self.segments.iter().flatten().map(LoraSeg::bytes).sum()
    }

    /// Whether it adapts any projection.
    pub fn is_empty(&self) -> bool {
        self.segments.iter().all(Vec::is_empty)
    }

    fn of(&self, projection: usize) -> &[LoraSeg] {
        self.segments.get(projection).map_or(&[], Vec::as_slice)
    }
}

/// Which adapter each stacked row of a pass's products adds (none for rows of the weights alone).
#[derive(Debug, Default)]
pub(crate) struct RowLoras<'a> {
    /// Per row; empty when no row has an adapter.
    rows: Vec<Option<&'a Adapter>>,
}

impl<'a> RowLoras<'a> {
    /// `per_row` adapters, `None` where a row has none.
    pub fn new(per_row: impl IntoIterator<Item = Option<&'a Adapter>>) -> Self {
        let rows: Vec<_> = per_row.into_iter().collect();
        if rows.iter().all(Option::is_none) {
            return RowLoras::default();
        }
        RowLoras { rows }
    }

    /// Rows `from..from + len` of these, as rows `0..len` of a product over them.
    pub fn part(&self, from: usize, len: usize) -> RowLoras<'a> {
        RowLoras {
            rows: self
                .rows
                .get(from..from + len)
                .map_or_else(Vec::new, <[_]>::to_vec),
        }
    }

    fn of(&self, row: usize) -> Option<&'a Adapter> {
        self.rows.get(row).copied().flatten()
    }

    /// `out[:, seg] += ((x · Aᵀ) · Bᵀ) · s` for each row's adapter's segments of `projection`, over the
    /// `x.m` rows. Row blocks run in parallel, each cut where the adapter changes; each computes
    /// `t = x·Aᵀ`, `u = t·Bᵀ` and adds `u·s` (PEFT: result + lora_B(lora_A(x)) * scaling, the product
    /// rounded before the sum). Rows never interact, so a row's bits do not depend on the block it lands in.
    pub fn apply(&self, kern: Kernels, projection: usize, x: Rows<'_>, out: RowsMut<'_>) {
        if self.rows.is_empty() {
            return;
        }
        const ROWS: usize = 32;
        let Rows {
            m,
            data: x,
            ld: ldx,
        } = x;
        let RowsMut { data: out, ld: ldo } = out;
        let same = |a: Option<&Adapter>, b: Option<&Adapter>| match (a, b) {
            (Some(a), Some(b)) => std::ptr::eq(a, b),
            (None, None) => true,
            _ => false,
        };
        let mut blocks: Vec<(usize, usize, &[LoraSeg])> = Vec::with_capacity(m.div_ceil(ROWS));
        let mut i0 = 0;
        while i0 < m {
            let adapter = self.of(i0);
            let mut end = i0 + 1;
            while end < m && end - i0 < ROWS && same(self.of(end), adapter) {
                end += 1;
            }
            if let Some(segs) = adapter.map(|a| a.of(projection)).filter(|s| !s.is_empty()) {
                blocks.push((i0, end - i0, segs));
            }
            i0 = end;
        }
        let op = SendPtr(out.as_mut_ptr());
        let olen = out.len();
        blocks.into_par_iter().for_each(|(i0, rows, segs)| {
            for seg in segs {
                with_tls(rows * (seg.r + seg.n), |buf| {
                    let (t, u) = buf.split_at_mut(rows * seg.r);
                    matmul::matmul(
                        kern,
                        matmul::Mat {
                            data: &x[i0 * ldx..],
                            rows,
                            cols: seg.k,
                            ld: ldx,
                        },
                        matmul::Mat::new(&seg.a_t, seg.k, seg.r),
                        t,
                        seg.r,
                        false,
                    );
                    matmul::matmul(
                        kern,
                        matmul::Mat::new(t, rows, seg.r),
                        matmul::Mat::new(&seg.b_t, seg.r, seg.n),
                        u,
                        seg.n,
                        false,
                    );
                    for r in 0..rows {
                        let off = (i0 + r) * ldo + seg.col;
                        debug_assert!(off + seg.n <= olen);
                        // SAFETY: each block writes only its own rows i0..i0+rows of `out`.
                        let o = unsafe { std::slice::from_raw_parts_mut(op.get().add(off), seg.n) };
                        for (oj, uj) in o.iter_mut().zip(&u[r * seg.n..(r + 1) * seg.n]) {
                            *oj += *uj * seg.scale;
                        }
                    }
                });
            }
        });
    }
}
