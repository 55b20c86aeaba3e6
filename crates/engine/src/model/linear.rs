//! A projection `y = x · Wᵀ (+ LoRA)`, its weights in the one form the load gave them.

use crate::adapter::RowLoras;
use crate::kernels::int8::{PackedInt8, gemm_int8};
use crate::kernels::{Arm, PackedMatrix, Rows, RowsMut, gemm};
use crate::pass::Pass;

/// A projection's weights in the form its load chose, never changed afterwards: what a model runs is
/// decided when it is built (a float model runs the fp32 and bf16 arms, an int8 model the int8 arm), so no
/// product asks at run time which form it has.
#[derive(Debug)]
pub(crate) enum Weight {
    /// Float panels (BF16 storage, or F32 where some value is not a bf16): the fp32 and bf16 arms.
    Float(PackedMatrix),
    /// Float panels an int8 model computes in a float arm: the int8 plan's islands (and the dev-split
    /// ablation that runs dequantised weights in fp32).
    Island {
        /// The weights.
        w: PackedMatrix,
        /// The arm they compute in (fp32 or bf16).
        arm: Arm,
    },
    /// Int8 per output channel.
    Int8 {
        /// The weights.
        q: PackedInt8,
        /// Its last rows again in f32, computed in fp32 in place of the int8 ones (the GDN gates, where the
        /// plan keeps them float).
        fp32_rows: Option<PackedMatrix>,
    },
}

impl Weight {
    /// Output rows.
    pub fn n(&self) -> usize {
        match self {
            Weight::Float(w) | Weight::Island { w, .. } => w.n(),
            Weight::Int8 { q, .. } => q.n(),
        }
    }

    /// Input columns.
    pub fn k(&self) -> usize {
        match self {
            Weight::Float(w) | Weight::Island { w, .. } => w.k(),
            Weight::Int8 { q, .. } => q.k(),
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        match self {
            Weight::Float(w) | Weight::Island { w, .. } => w.bytes(),
            Weight::Int8 { q, fp32_rows } => {
                q.bytes() + fp32_rows.as_ref().map_or(0, |t| t.bytes())
            }
        }
    }

    /// Bytes of the int8 form (0 for float weights).
    pub fn int8_bytes(&self) -> usize {
        match self {
            Weight::Int8 { q, .. } => q.bytes(),
            _ => 0,
        }
    }
}

/// A projection, possibly several checkpoint modules fused along the outputs.
#[derive(Debug)]
pub(crate) struct Linear {
    pub weight: Weight,
    /// Its index in the model's projection order (`4 · layer + slot`): what adapters and the calibration
    /// observer know it by.
    pub id: usize,
}

impl Linear {
    /// Output columns.
    pub fn n(&self) -> usize {
        self.weight.n()
    }

    /// `out[:, :n] = x · Wᵀ (+ each row's adapter's update)` over the `x.m` rows, in the pass's arm (or the
    /// island's, or int8); the pass's observer, when it carries one (int8 calibration), records the rows'
    /// per-input magnitudes first.
    pub fn apply(&self, pass: &Pass<'_>, loras: &RowLoras<'_>, x: Rows<'_>, out: RowsMut<'_>) {
        if let Some(obs) = pass.observer {
            obs.record(self.id, x);
        }
        let RowsMut { data: out, ld: ldo } = out;
        match &self.weight {
            Weight::Float(w) => gemm(pass.run(pass.arm), x, w, RowsMut { data: out, ld: ldo }),
            Weight::Island { w, arm } => gemm(pass.run(*arm), x, w, RowsMut { data: out, ld: ldo }),
            Weight::Int8 { q, fp32_rows } => {
                gemm_int8(pass.run(Arm::Int8), x, q, RowsMut { data: out, ld: ldo });
                if let Some(t) = fp32_rows {
                    // The int8 GEMM computed these rows too (a few of thousands); they are replaced.
                    let (nt, c0) = (t.n(), q.n() - t.n());
                    let m = x.m;
                    let mut buf = vec![0f32; m * nt];
                    gemm(
                        pass.run(Arm::Fp32),
                        x,
                        t,
                        RowsMut {
                            data: &mut buf,
                            ld: nt,
                        },
                    );
                    for i in 0..m {
                        out[i * ldo + c0..i * ldo + c0 + nt]
                            .copy_from_slice(&buf[i * nt..(i + 1) * nt]);
                    }
                }
            }
        }
        loras.apply(pass.kern, self.id, x, RowsMut { data: out, ld: ldo });
    }
}
