//! The LoRA merge: `W' = bf16(fp32(W) + (B @ A) · scale)`, bit-exact with PEFT.
//!
//! PEFT merges with `base.weight.data += (B @ A) * scaling` on a float32 model, and the author's
//! export then casts the model to bfloat16 once. Three roundings decide the bits:
//!
//! 1. `B @ A` in float32. torch on CPU hands this to MKL's sgemm, whose kernels accumulate each
//!    output element as a chain of fused multiply-adds over k = 0..r, starting from zero. Measured
//!    against torch 2.15 (MKL 2024.2, AVX-512) on every 4B module shape (out ∈ {32, 1024, 2560, 4096,
//!    8192, 9216}, in ∈ {2560, 4096, 9216}): bit-identical. MKL uses other orders on edge blocks of
//!    tiny matrices (fewer than 4 output rows left over, or fewer than 16 input columns), which no
//!    real checkpoint has.
//! 2. `* scaling`: torch multiplies a float32 tensor by a Python float in float32
//!    (`float(alpha / r)`), one rounding.
//! 3. `+=` in float32, then the cast to bfloat16 with round-to-nearest-even (torch's rule, NaN → 0x7FC0).
//!
//! [`merge_weight`] is the one implementation; the export and the engine's in-memory merge both call it.

use half::bf16;
use rayon::prelude::*;

use crate::adapter::LoraWeights;
use crate::shards::{Dtype, TensorView};

/// Errors from the merge.
#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    /// The base weight is not a 2-D matrix of the adapter's shape.
    #[error("{name}: base weight shape {base:?} does not match the adapter (out {out}, in {inp})")]
    Shape {
        /// Tensor name.
        name: String,
        /// Base shape.
        base: Vec<usize>,
        /// Adapter output features.
        out: usize,
        /// Adapter input features.
        inp: usize,
    },
    /// The LoRA factors' lengths disagree with their declared shapes.
    #[error("{name}: LoRA factors of {a} and {b} values do not fit rank {r}")]
    Factors {
        /// Tensor name.
        name: String,
        /// Values in A.
        a: usize,
        /// Values in B.
        b: usize,
        /// Declared rank.
        r: usize,
    },
    /// The base weight has a dtype the merge does not read.
    #[error("{name}: cannot merge into a {dtype} weight (BF16, F16 or F32 only)")]
    Dtype {
        /// Tensor name.
        name: String,
        /// Its dtype.
        dtype: &'static str,
    },
    /// The base weight's byte length disagrees with its shape.
    #[error("{name}: {len} data bytes for shape {shape:?}")]
    Length {
        /// Tensor name.
        name: String,
        /// Bytes present.
        len: usize,
        /// Declared shape.
        shape: Vec<usize>,
    },
}

/// float32 → bfloat16 exactly as torch rounds (`c10::round_to_nearest_even`): ties to even, every NaN
/// becomes the canonical quiet NaN 0x7FC0.
#[inline]
pub fn bf16_rne(x: f32) -> bf16 {
    bf16::from_bits((bf16_rne_f32(x).to_bits() >> 16) as u16)
}

/// [`bf16_rne`] widened back to f32 (exact): the rounding as integer operations and one select, which
/// vectorise (the merge's inner loop).
#[inline(always)]
fn bf16_rne_f32(x: f32) -> f32 {
    let bits = x.to_bits();
    let rounding_bias = 0x7FFF + ((bits >> 16) & 1);
    let rounded = bits.wrapping_add(rounding_bias) & 0xFFFF_0000;
    f32::from_bits(if x.is_nan() { 0x7FC0_0000 } else { rounded })
}

/// One output row of `(B @ A)`: `out[c] = Σ_k B[row, k] · A[k, c]` as a chain of fused
/// multiply-adds over k = 0..r starting from +0, then multiplied by `scale` in float32.
///
/// `b_row` has r elements, `a` is `[r, in]` row-major, `out` has `in` elements ([`merge_weight`]
/// checks these lengths; here missing rows of `a` would only shorten the sum).
#[inline]
pub fn lora_delta_row(b_row: &[f32], a: &[f32], scale: f32, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("fma") && std::arch::is_x86_feature_detected!("avx2")
        {
            // SAFETY: the features the function is compiled for were just detected.
            unsafe { delta_row_fma(b_row, a, scale, out) };
            return;
        }
    }
    delta_row_portable(b_row, a, scale, out);
}

/// `f32::mul_add` is a correctly rounded fused multiply-add on every target (a library call where
/// the CPU has none), so this gives the same bits as the vectorised path, only slower.
///
/// Columns go in blocks of [`BLOCK`] whose sums stay in registers over the whole chain (the sum of one
/// column does not depend on its neighbours, so blocking changes no bits).
#[inline(always)]
fn delta_row_portable(b_row: &[f32], a: &[f32], scale: f32, out: &mut [f32]) {
    let n = out.len();
    if n == 0 {
        return;
    }
    let full = n / BLOCK * BLOCK;
    for c0 in (0..full).step_by(BLOCK) {
        let mut acc = [0f32; BLOCK];
        for (&bk, a_k) in b_row.iter().zip(a.chunks_exact(n)) {
            let a_blk: &[f32; BLOCK] = a_k[c0..c0 + BLOCK].try_into().expect("a full block");
            for (x, &av) in acc.iter_mut().zip(a_blk) {
                *x = bk.mul_add(av, *x);
            }
        }
        for (o, x) in out[c0..c0 + BLOCK].iter_mut().zip(&acc) {
            *o = x * scale;
        }
    }
    let tail = &mut out[full..];
    tail.fill(0.0);
    for (&bk, a_k) in b_row.iter().zip(a.chunks_exact(n)) {
        for (o, &av) in tail.iter_mut().zip(&a_k[full..]) {
            *o = bk.mul_add(av, *o);
        }
    }
    for o in tail.iter_mut() {
        *o *= scale;
    }
}

/// Columns per register block of [`delta_row_portable`] (8 ymm or 4 zmm sums).
const BLOCK: usize = 64;

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn delta_row_fma(b_row: &[f32], a: &[f32], scale: f32, out: &mut [f32]) {
    // The same loop as the portable one; compiled with FMA enabled, `mul_add` becomes vfmadd and
    // the loop over columns vectorises. The order over k per element is unchanged.
    delta_row_portable(b_row, a, scale, out)
}

/// Read a 2-D weight as float32 (exact for BF16/F16/F32). A BF16 value is widened by the shift alone
/// (`half` also quiets a signalling NaN, a branch per value): every NaN leaves the merge as the canonical
/// one (`bf16_rne`) either way.
fn row_to_f32(dtype: Dtype, bytes: &[u8], out: &mut [f32]) {
    match dtype {
        Dtype::BF16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16);
            }
        }
        Dtype::F16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32();
            }
        }
        _ => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
    }
}

/// One adapted weight, checked once and merged a row at a time: what [`merge_weight`] runs over every
/// row, and what a loader that never holds the whole merged matrix (the engine's int8 load) runs per row.
#[derive(Debug, Clone, Copy)]
pub struct RowMerge<'a> {
    data: &'a [u8],
    dtype: Dtype,
    esize: usize,
    lora: &'a LoraWeights,
    scale: f32,
}

impl<'a> RowMerge<'a> {
    /// Check `w` (`[out, in]`, BF16, F16 or F32) against the adapter's factors.
    pub fn new(w: &TensorView<'a>, lora: &'a LoraWeights, scale: f32) -> Result<Self, MergeError> {
        let (out_f, in_f) = (lora.out_features, lora.in_features);
        if w.shape != [out_f, in_f] {
            return Err(MergeError::Shape {
                name: w.name.to_string(),
                base: w.shape.to_vec(),
                out: out_f,
                inp: in_f,
            });
        }
        if lora.a.len() != lora.r * in_f || lora.b.len() != out_f * lora.r {
            return Err(MergeError::Factors {
                name: w.name.to_string(),
                a: lora.a.len(),
                b: lora.b.len(),
                r: lora.r,
            });
        }
        let esize = match w.dtype {
            Dtype::BF16 | Dtype::F16 => 2,
            Dtype::F32 => 4,
            other => {
                return Err(MergeError::Dtype {
                    name: w.name.to_string(),
                    dtype: other.name(),
                });
            }
        };
        if w.data.len() != out_f * in_f * esize {
            return Err(MergeError::Length {
                name: w.name.to_string(),
                len: w.data.len(),
                shape: w.shape.to_vec(),
            });
        }
        Ok(RowMerge {
            data: w.data,
            dtype: w.dtype,
            esize,
            lora,
            scale,
        })
    }

    /// Output rows.
    pub fn rows(&self) -> usize {
        self.lora.out_features
    }

    /// Input columns.
    pub fn cols(&self) -> usize {
        self.lora.in_features
    }

    /// Merged row `row`, each value the bf16 of the merge widened back to f32 (exact):
    /// `out[c] = f32(bf16(fp32(W[row, c]) + (B @ A)[row, c] · scale))`. `delta` is scratch; both have
    /// [`RowMerge::cols`] values.
    pub fn row_f32(&self, row: usize, delta: &mut [f32], out: &mut [f32]) {
        let (r, in_f) = (self.lora.r, self.lora.in_features);
        lora_delta_row(
            &self.lora.b[row * r..(row + 1) * r],
            &self.lora.a,
            self.scale,
            delta,
        );
        let bytes = &self.data[row * in_f * self.esize..(row + 1) * in_f * self.esize];
        row_to_f32(self.dtype, bytes, out);
        for (o, &d) in out.iter_mut().zip(delta.iter()) {
            *o = bf16_rne_f32(*o + d);
        }
    }
}

/// Merge one adapted weight: `bf16(fp32(W) + (B @ A) · scale)`, rows in parallel (rayon).
///
/// `w` is the base weight `[out, in]` in BF16, F16 or F32; the result is `[out, in]` row-major BF16.
pub fn merge_weight(
    w: &TensorView<'_>,
    lora: &LoraWeights,
    scale: f32,
) -> Result<Vec<bf16>, MergeError> {
    let rows = RowMerge::new(w, lora, scale)?;
    let in_f = rows.cols();
    let mut merged = vec![bf16::ZERO; rows.rows() * in_f];
    if in_f == 0 {
        return Ok(merged);
    }
    merged.par_chunks_mut(in_f).enumerate().for_each_init(
        || (vec![0f32; in_f], vec![0f32; in_f]),
        |(delta, row_f32), (row, dst)| {
            rows.row_f32(row, delta, row_f32);
            // Each value is a bf16 already (or bf16_rne's canonical NaN): its top half is its bits.
            for (d, v) in dst.iter_mut().zip(row_f32.iter()) {
                *d = bf16::from_bits((v.to_bits() >> 16) as u16);
            }
        },
    );
    Ok(merged)
}

/// The merged weight as little-endian BF16 bytes (the safetensors payload).
pub fn merge_weight_bytes(
    w: &TensorView<'_>,
    lora: &LoraWeights,
    scale: f32,
) -> Result<Vec<u8>, MergeError> {
    let merged = merge_weight(w, lora, scale)?;
    Ok(bytemuck::cast_slice::<bf16, u8>(&merged).to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounding_matches_torch_rules() {
        // exact values pass through
        assert_eq!(bf16_rne(1.0).to_bits(), 0x3F80);
        // halfway between 0x3F80 and 0x3F81 rounds to even (0x3F80); just above rounds up
        assert_eq!(bf16_rne(f32::from_bits(0x3F80_8000)).to_bits(), 0x3F80);
        assert_eq!(bf16_rne(f32::from_bits(0x3F80_8001)).to_bits(), 0x3F81);
        // halfway between 0x3F81 and 0x3F82 rounds to even (0x3F82)
        assert_eq!(bf16_rne(f32::from_bits(0x3F81_8000)).to_bits(), 0x3F82);
        // negative zero keeps its sign; NaN is canonical; overflow goes to infinity
        assert_eq!(bf16_rne(-0.0).to_bits(), 0x8000);
        assert_eq!(bf16_rne(f32::from_bits(0xFFC0_1234)).to_bits(), 0x7FC0);
        assert_eq!(bf16_rne(f32::MAX).to_bits(), 0x7F80);
        // Against torch's rule written out (round half to even on the top 16 bits, NaN canonical), over
        // every top half and the rounding boundaries of the low half; the f32 form is its widening.
        let torch = |x: f32| -> u16 {
            if x.is_nan() {
                return 0x7FC0;
            }
            let b = x.to_bits();
            ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) as u16
        };
        for hi in 0..=0xFFFFu32 {
            for lo in [0u32, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF] {
                let x = f32::from_bits(hi << 16 | lo);
                assert_eq!(bf16_rne(x).to_bits(), torch(x), "{:#010x}", x.to_bits());
                assert_eq!(bf16_rne_f32(x).to_bits(), (torch(x) as u32) << 16);
            }
        }
    }

    #[test]
    fn accumulation_is_a_fused_chain() {
        // acc = -1 after k = 0; then (1+e)(1-e) = 1 - e² added to -1. Fused: exactly -e². Rounding the
        // product first (1 - e² → 1.0) would give 0. Scale 2 is exact.
        let e = f32::EPSILON;
        let b = [-1.0f32, 1.0 + e];
        let a = [1.0f32, 1.0 - e];
        let mut out = [0.0f32];
        lora_delta_row(&b, &a, 2.0, &mut out);
        assert_eq!(out[0], -2.0 * e * e);
        let unfused = -1.0f32 + (1.0 + e) * (1.0 - e);
        assert_eq!(unfused, 0.0);
    }

    #[test]
    fn simd_and_portable_paths_agree() {
        // The definition: each column's chain over k = 0..r from +0, one column at a time, then the scale.
        fn chain(b: &[f32], a: &[f32], scale: f32, n: usize) -> Vec<u32> {
            (0..n)
                .map(|c| {
                    let mut acc = 0f32;
                    for (k, &bk) in b.iter().enumerate() {
                        acc = bk.mul_add(a[k * n + c], acc);
                    }
                    (acc * scale).to_bits()
                })
                .collect()
        }
        let r = 16;
        let mut s = 0x1234_5678u32;
        let mut rnd = || {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s as f32 / u32::MAX as f32 - 0.5) * 0.1
        };
        // Widths below, at and around the register block, and not a multiple of any vector width.
        for n in [1, 7, 63, 64, 65, 128, 203, 2567] {
            let a: Vec<f32> = (0..r * n).map(|_| rnd()).collect();
            let b: Vec<f32> = (0..r).map(|_| rnd()).collect();
            let mut x = vec![f32::NAN; n];
            let mut y = vec![f32::NAN; n];
            lora_delta_row(&b, &a, 2.0, &mut x);
            delta_row_portable(&b, &a, 2.0, &mut y);
            let want = chain(&b, &a, 2.0, n);
            assert_eq!(
                x.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                want,
                "{n}"
            );
            assert_eq!(
                y.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                want,
                "{n}"
            );
        }
    }
}
