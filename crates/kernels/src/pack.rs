//! Weight matrices repacked at load into the GEMM's panel layout.
//!
//! A linear layer `y = x · Wᵀ` has `W` stored `[n_out, k_in]`. The GEMM vectorises over outputs, so the
//! matrix is cut into panels of [`NR`] = 64 output rows, and inside a panel the values of one input index
//! for all 64 outputs sit next to each other. For BF16 storage, input indices are taken in pairs and
//! interleaved (`[k/2][64][2]`): one 512-bit load then holds 16 outputs × 2 inputs, exactly the operand
//! of `vdpbf16ps`, and for the fp32 arm a shift and a mask widen it to two f32 vectors exactly.
//!
//! Weights that are not all representable in bf16 (an F32 tensor with full mantissas) keep f32 storage,
//! `[k][64]` per panel, so the fp32 arm stays exact for any checkpoint.

use rayon::prelude::*;

use super::bf16_to_f32;
use super::buf::AlignedBuf;
use super::layout::{GROUP_BYTES, NR, interleave};

/// A row made on demand: `row(r, out)` writes row `r`'s `k` values.
pub type RowFn<'a> = &'a (dyn Fn(usize, &mut [f32]) + Sync);

/// Where the rows of one part of a packed matrix come from: little-endian bytes, row-major `[rows, k]`.
#[derive(Clone, Copy)]
pub enum Source<'a> {
    /// bfloat16 values.
    Bf16(&'a [u8]),
    /// f32 values.
    F32(&'a [u8]),
    /// f32 values already in memory.
    F32Slice(&'a [f32]),
    /// Rows made as they are packed, every value exactly a bfloat16 widened to f32 (a LoRA merged a
    /// row at a time: no merged copy of the matrix is ever held).
    Bf16Rows(RowFn<'a>),
}

impl std::fmt::Debug for Source<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Bf16(b) => write!(f, "Bf16({} bytes)", b.len()),
            Source::F32(b) => write!(f, "F32({} bytes)", b.len()),
            Source::F32Slice(s) => write!(f, "F32Slice({} values)", s.len()),
            Source::Bf16Rows(_) => write!(f, "Bf16Rows"),
        }
    }
}

impl Source<'_> {
    /// Row `r` of a `[rows, k]` source widened to f32 (exact for every source).
    pub fn row_f32(&self, r: usize, k: usize, out: &mut [f32]) {
        match *self {
            Source::Bf16(b) => {
                for (o, x) in out
                    .iter_mut()
                    .zip(b[r * k * 2..(r + 1) * k * 2].chunks_exact(2))
                {
                    *o = bf16_to_f32(u16::from_le_bytes([x[0], x[1]]));
                }
            }
            Source::F32(b) => {
                for (o, x) in out
                    .iter_mut()
                    .zip(b[r * k * 4..(r + 1) * k * 4].chunks_exact(4))
                {
                    *o = f32::from_le_bytes([x[0], x[1], x[2], x[3]]);
                }
            }
            Source::F32Slice(s) => out.copy_from_slice(&s[r * k..(r + 1) * k]),
            Source::Bf16Rows(row) => row(r, out),
        }
    }
}

/// A block of consecutive output rows.
#[derive(Debug, Clone, Copy)]
pub struct Part<'a> {
    /// Number of output rows.
    pub rows: usize,
    /// The values.
    pub src: Source<'a>,
}

/// Where each global row of a vertical concatenation of parts comes from.
#[derive(Debug, Clone)]
pub struct PartRows {
    starts: Vec<usize>,
    n: usize,
}

impl PartRows {
    /// The concatenation of parts of these row counts.
    pub fn new(rows: impl IntoIterator<Item = usize>) -> Self {
        let mut starts = Vec::new();
        let mut n = 0;
        for r in rows {
            starts.push(n);
            n += r;
        }
        PartRows { starts, n }
    }

    /// Rows in all.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Global row `row` as (part, row within the part).
    pub fn locate(&self, row: usize) -> (usize, usize) {
        let i = self.starts.partition_point(|&s| s <= row) - 1;
        (i, row - self.starts[i])
    }
}

/// Panel `p` of a [`PackedMatrix::from_parts`] (bytes of the bf16 or the f32 storage). Rows already in
/// the storage's form are interleaved straight from their bytes; others are widened, narrowed to the
/// storage's form (exact: `bf16` is chosen only where every value is a bf16) and put one at a time.
fn fill_panel(panel: &mut [u8], p: usize, k: usize, bf16: bool, parts: &[Part<'_>], at: &PartRows) {
    let rows = NR.min(at.n() - p * NR);
    let mut direct: Vec<(usize, &[u8])> = Vec::with_capacity(rows);
    let (mut vals, mut made) = (Vec::new(), Vec::new());
    for j in 0..rows {
        let (pi, r) = at.locate(p * NR + j);
        match (parts[pi].src, bf16) {
            (Source::Bf16(b), true) => direct.push((j, &b[r * k * 2..(r + 1) * k * 2])),
            (Source::F32(b), false) => direct.push((j, &b[r * k * 4..(r + 1) * k * 4])),
            (Source::F32Slice(s), false) => {
                direct.push((j, bytemuck::cast_slice(&s[r * k..(r + 1) * k])))
            }
            (src, _) => {
                vals.resize(k, 0f32);
                src.row_f32(r, k, &mut vals);
                made.clear();
                if bf16 {
                    // Every value is a bf16 here: its top half is its bits.
                    made.extend(
                        vals.iter()
                            .flat_map(|v| ((v.to_bits() >> 16) as u16).to_le_bytes()),
                    );
                } else {
                    made.extend(vals.iter().flat_map(|v| v.to_le_bytes()));
                }
                interleave(panel, &[(j, &made)]);
            }
        }
    }
    interleave(panel, &direct);
}

pub(crate) enum Store {
    Bf16(AlignedBuf<u16>),
    F32(AlignedBuf<f32>),
}

/// An immutable weight matrix `[n, k]` in panel layout.
pub struct PackedMatrix {
    n: usize,
    k: usize,
    kp: usize,
    store: Store,
}

impl std::fmt::Debug for PackedMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "PackedMatrix {{ n: {}, k: {}, {} }}",
            self.n,
            self.k,
            if self.is_bf16() { "bf16" } else { "f32" }
        )
    }
}

impl PackedMatrix {
    /// Pack the vertical concatenation of `parts` (each `[rows, k]`). Storage is BF16 unless some f32
    /// value is not exactly a bf16, in which case the whole matrix keeps f32.
    ///
    /// Panics if a part's byte length is not `rows · k · size`; the loader checks shapes first.
    pub fn from_parts(k: usize, parts: &[Part<'_>]) -> Self {
        let n: usize = parts.iter().map(|p| p.rows).sum();
        for p in parts {
            let len = match p.src {
                Source::Bf16(b) => b.len() / 2,
                Source::F32(b) => b.len() / 4,
                Source::F32Slice(s) => s.len(),
                Source::Bf16Rows(_) => p.rows * k,
            };
            assert_eq!(len, p.rows * k, "part size does not match its shape");
        }
        let exact = parts.iter().all(|p| match p.src {
            Source::Bf16(_) | Source::Bf16Rows(_) => true,
            Source::F32(b) => b
                .par_chunks(4 * 4096)
                .all(|c| c.chunks_exact(4).all(|x| x[0] == 0 && x[1] == 0)),
            Source::F32Slice(s) => s.par_iter().all(|x| x.to_bits() & 0xffff == 0),
        });
        let at = PartRows::new(parts.iter().map(|p| p.rows));
        let kp = k.div_ceil(2);
        let panels = n.div_ceil(NR);
        // A panel is kp groups of bf16 pairs, or 2·kp groups of one f32 (k padded to even).
        let panel_len = kp * NR * GROUP_BYTES;
        let store = if exact {
            let mut data = AlignedBuf::<u16>::zeroed(panels * panel_len / 2);
            data.par_chunks_mut(panel_len / 2)
                .enumerate()
                .for_each(|(p, chunk)| {
                    fill_panel(bytemuck::cast_slice_mut(chunk), p, k, true, parts, &at)
                });
            Store::Bf16(data)
        } else {
            let mut data = AlignedBuf::<f32>::zeroed(panels * 2 * panel_len / 4);
            data.par_chunks_mut(2 * panel_len / 4)
                .enumerate()
                .for_each(|(p, chunk)| {
                    fill_panel(bytemuck::cast_slice_mut(chunk), p, k, false, parts, &at)
                });
            Store::F32(data)
        };
        PackedMatrix { n, k, kp, store }
    }

    /// Pack a row-major `[n, k]` f32 matrix (BF16 storage when every value is a bf16).
    pub fn from_f32(n: usize, k: usize, w: &[f32]) -> Self {
        Self::from_parts(
            k,
            &[Part {
                rows: n,
                src: Source::F32Slice(w),
            }],
        )
    }

    /// Output rows.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Input columns.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Input index pairs (`k` rounded up to even, halved).
    pub(crate) fn kp(&self) -> usize {
        self.kp
    }

    /// Number of 64-row panels.
    pub(crate) fn panels(&self) -> usize {
        self.n.div_ceil(NR)
    }

    /// Whether the values are stored as bf16.
    pub fn is_bf16(&self) -> bool {
        matches!(self.store, Store::Bf16(_))
    }

    /// Bytes of weight storage.
    pub fn bytes(&self) -> usize {
        match &self.store {
            Store::Bf16(d) => d.len() * 2,
            Store::F32(d) => d.len() * 4,
        }
    }

    pub(crate) fn store(&self) -> &Store {
        &self.store
    }

    /// One weight, `W[row, col]`, widened to f32.
    pub fn get(&self, row: usize, col: usize) -> f32 {
        let (p, j) = (row / NR, row % NR);
        match &self.store {
            Store::Bf16(d) => {
                let base = p * self.kp * NR * 2;
                bf16_to_f32(d[base + ((col / 2) * NR + j) * 2 + (col & 1)])
            }
            Store::F32(d) => d[p * 2 * self.kp * NR + col * NR + j],
        }
    }

    /// The matrix back as row-major `[n, k]` f32 (for the reference path and tests).
    pub fn to_f32_rows(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.n * self.k];
        for r in 0..self.n {
            for c in 0..self.k {
                out[r * self.k + c] = self.get(r, c);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_both_storages() {
        // 37 inputs: 19 bf16 pairs (two of the interleave's blocks of 16 groups, the last pair half
        // padding), 37 f32 groups (three blocks); 70 rows: a partial second panel.
        let (n, k) = (70, 37);
        let exact: Vec<f32> = (0..n * k)
            .map(|i| super::super::bf16_to_f32(super::super::bf16_bits(i as f32 * 0.37 - 9.0)))
            .collect();
        let m = PackedMatrix::from_f32(n, k, &exact);
        assert!(m.is_bf16());
        assert_eq!(m.to_f32_rows(), exact);
        let full: Vec<f32> = (0..n * k).map(|i| i as f32 * 0.123_456_7 - 3.0).collect();
        let m = PackedMatrix::from_f32(n, k, &full);
        assert!(!m.is_bf16());
        assert_eq!(m.to_f32_rows(), full);
        // Two parts, one BF16 bytes, one F32 bytes: rows concatenate in order.
        let a: Vec<u8> = exact[..3 * k]
            .iter()
            .flat_map(|x| ((x.to_bits() >> 16) as u16).to_le_bytes())
            .collect();
        let b: Vec<u8> = exact[3 * k..]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let bf16_then = |rest: Source<'_>| {
            let first = Part {
                rows: 3,
                src: Source::Bf16(&a),
            };
            PackedMatrix::from_parts(
                k,
                &[
                    first,
                    Part {
                        rows: n - 3,
                        src: rest,
                    },
                ],
            )
        };
        let m = bf16_then(Source::F32(&b));
        assert!(m.is_bf16());
        assert_eq!(m.to_f32_rows(), exact);
        // BF16 bytes beside f32 values that are not bf16s: f32 storage, the bf16 rows widened.
        let m = bf16_then(Source::F32Slice(&full[3 * k..]));
        assert!(!m.is_bf16());
        let mut want = exact[..3 * k].to_vec();
        want.extend_from_slice(&full[3 * k..]);
        assert_eq!(m.to_f32_rows(), want);
    }
}
