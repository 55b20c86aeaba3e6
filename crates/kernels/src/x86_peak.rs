//! The int8 ceilings of x86 (see `peak.rs`): register-resident loops of the instruction chains the int8
//! kernels are built from, in inline assembly so the compiler can neither hoist the loop-invariant
//! products nor fuse or reorder the chain. Each function runs `iters` rounds and returns nothing of value
//! (assembly with side effects is never removed); [`Chain::macs`] says how many multiply-adds one round
//! holds.

use std::arch::asm;

/// A chain measured by [`run`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Chain {
    /// AVX2 `vpmaddubsw` → `vpmaddwd` (by ones) → `vpaddd`: 32 u8 × s8 multiply-adds per `vpmaddubsw`;
    /// exact on 7-bit weights (the AVX2 kernel for the rule's weights, `ukr_avx2_narrow`).
    MaddubsAvx2,
    /// AVX2 `vpsignb` → `vpmaddubsw` → `vpmaddwd` → `vpaddd`: the classic chain made exact for signed ×
    /// signed bytes (`|a|` unsigned, the sign moved onto the other operand, one `vpsignb` per product
    /// vector); the only exact form of `vpmaddubsw` for any int8 data, slower than `vpmaddwd` on i16.
    SignedMaddubsAvx2,
    /// AVX2 with two `vpmaddubsw` results summed in i16 (`vpaddw`) before one `vpmaddwd`: the pair-sum
    /// variant, where a bound allows it.
    PairSumAvx2,
    /// AVX2 `vpmaddwd` on i16 operands → `vpaddd`: 16 multiply-adds per `vpmaddwd` (the AVX2 kernel).
    MaddwdAvx2,
    /// AVX-512 VNNI `vpdpbusd` on zmm: 64 multiply-adds each.
    VnniZmm,
    /// `vpdpbusd` on ymm, EVEX encoding (AVX512_VNNI + AVX512VL): 32 each.
    VnniYmmEvex,
    /// `vpdpbusd` on ymm, VEX encoding (AVX-VNNI): 32 each.
    VnniYmmVex,
}

impl Chain {
    /// Every chain, the AVX2 ones first.
    const ALL: [Chain; 7] = [
        Chain::MaddubsAvx2,
        Chain::SignedMaddubsAvx2,
        Chain::PairSumAvx2,
        Chain::MaddwdAvx2,
        Chain::VnniYmmVex,
        Chain::VnniYmmEvex,
        Chain::VnniZmm,
    ];

    /// The chains whose instructions this CPU has.
    pub(crate) fn available() -> Vec<Chain> {
        use std::arch::is_x86_feature_detected as has;
        Self::ALL
            .into_iter()
            .filter(|c| match c {
                Chain::MaddubsAvx2
                | Chain::SignedMaddubsAvx2
                | Chain::PairSumAvx2
                | Chain::MaddwdAvx2 => has!("avx2"),
                Chain::VnniZmm => has!("avx512f") && has!("avx512vnni"),
                Chain::VnniYmmEvex => has!("avx512f") && has!("avx512vl") && has!("avx512vnni"),
                Chain::VnniYmmVex => has!("avxvnni"),
            })
            .collect()
    }

    /// The name reports use.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Chain::MaddubsAvx2 => "avx2 maddubsw",
            Chain::SignedMaddubsAvx2 => "avx2 maddubsw signed",
            Chain::PairSumAvx2 => "avx2 pair-sum",
            Chain::MaddwdAvx2 => "avx2 maddwd",
            Chain::VnniZmm => "vnni zmm",
            Chain::VnniYmmEvex => "vnni ymm",
            Chain::VnniYmmVex => "avx-vnni ymm",
        }
    }

    /// Multiply-adds per round of [`run`].
    pub(crate) fn macs(self) -> f64 {
        match self {
            Chain::MaddubsAvx2 | Chain::SignedMaddubsAvx2 => 6.0 * 32.0,
            Chain::PairSumAvx2 => 4.0 * 64.0,
            Chain::MaddwdAvx2 => 6.0 * 16.0,
            Chain::VnniZmm => 12.0 * 64.0,
            Chain::VnniYmmEvex | Chain::VnniYmmVex => 12.0 * 32.0,
        }
    }
}

/// `iters` rounds of `chain`.
///
/// # Safety
/// The CPU has the chain's instructions: AVX2 for the first four, AVX512_VNNI + AVX512VL (+F) for the
/// EVEX ones, AVX-VNNI for [`Chain::VnniYmmVex`].
pub(crate) unsafe fn run(chain: Chain, iters: u64) {
    // SAFETY: the caller checked the instruction set; the loops touch registers only.
    unsafe {
        match chain {
            Chain::MaddubsAvx2 => maddubs(iters),
            Chain::SignedMaddubsAvx2 => signed_maddubs(iters),
            Chain::PairSumAvx2 => pair_sum(iters),
            Chain::MaddwdAvx2 => maddwd(iters),
            Chain::VnniZmm => vnni_zmm(iters),
            Chain::VnniYmmEvex => vnni_ymm_evex(iters),
            Chain::VnniYmmVex => vnni_ymm_vex(iters),
        }
    }
}

/// Operands: ymm13 = bytes 1 (u8), ymm14 = bytes −1 (s8), ymm12 = i16 ones; all results stay small.
macro_rules! ymm_setup {
    () => {
        concat!(
            "vpcmpeqb ymm14, ymm14, ymm14\n",
            "vpabsb ymm13, ymm14\n",
            "vpabsw ymm12, ymm14\n",
        )
    };
}

#[target_feature(enable = "avx2")]
unsafe fn maddubs(iters: u64) {
    // SAFETY: AVX2 (the caller's contract); registers only.
    unsafe {
        asm!(
            ymm_setup!(),
            "2:",
            "vpmaddubsw ymm0, ymm13, ymm14", "vpmaddubsw ymm1, ymm13, ymm14",
            "vpmaddubsw ymm2, ymm13, ymm14", "vpmaddubsw ymm3, ymm13, ymm14",
            "vpmaddubsw ymm4, ymm13, ymm14", "vpmaddubsw ymm5, ymm13, ymm14",
            "vpmaddwd ymm0, ymm0, ymm12", "vpmaddwd ymm1, ymm1, ymm12",
            "vpmaddwd ymm2, ymm2, ymm12", "vpmaddwd ymm3, ymm3, ymm12",
            "vpmaddwd ymm4, ymm4, ymm12", "vpmaddwd ymm5, ymm5, ymm12",
            "vpaddd ymm6, ymm6, ymm0", "vpaddd ymm7, ymm7, ymm1",
            "vpaddd ymm8, ymm8, ymm2", "vpaddd ymm9, ymm9, ymm3",
            "vpaddd ymm10, ymm10, ymm4", "vpaddd ymm11, ymm11, ymm5",
            "dec {n}",
            "jnz 2b",
            n = inout(reg) iters => _,
            out("ymm0") _, out("ymm1") _, out("ymm2") _, out("ymm3") _, out("ymm4") _, out("ymm5") _,
            out("ymm6") _, out("ymm7") _, out("ymm8") _, out("ymm9") _, out("ymm10") _, out("ymm11") _,
            out("ymm12") _, out("ymm13") _, out("ymm14") _,
            options(nostack, nomem),
        );
    }
}

#[target_feature(enable = "avx2")]
unsafe fn signed_maddubs(iters: u64) {
    // SAFETY: AVX2 (the caller's contract); registers only.
    unsafe {
        asm!(
            ymm_setup!(),
            "2:",
            "vpsignb ymm0, ymm14, ymm13", "vpsignb ymm1, ymm14, ymm13",
            "vpsignb ymm2, ymm14, ymm13", "vpsignb ymm3, ymm14, ymm13",
            "vpsignb ymm4, ymm14, ymm13", "vpsignb ymm5, ymm14, ymm13",
            "vpmaddubsw ymm0, ymm13, ymm0", "vpmaddubsw ymm1, ymm13, ymm1",
            "vpmaddubsw ymm2, ymm13, ymm2", "vpmaddubsw ymm3, ymm13, ymm3",
            "vpmaddubsw ymm4, ymm13, ymm4", "vpmaddubsw ymm5, ymm13, ymm5",
            "vpmaddwd ymm0, ymm0, ymm12", "vpmaddwd ymm1, ymm1, ymm12",
            "vpmaddwd ymm2, ymm2, ymm12", "vpmaddwd ymm3, ymm3, ymm12",
            "vpmaddwd ymm4, ymm4, ymm12", "vpmaddwd ymm5, ymm5, ymm12",
            "vpaddd ymm6, ymm6, ymm0", "vpaddd ymm7, ymm7, ymm1",
            "vpaddd ymm8, ymm8, ymm2", "vpaddd ymm9, ymm9, ymm3",
            "vpaddd ymm10, ymm10, ymm4", "vpaddd ymm11, ymm11, ymm5",
            "dec {n}",
            "jnz 2b",
            n = inout(reg) iters => _,
            out("ymm0") _, out("ymm1") _, out("ymm2") _, out("ymm3") _, out("ymm4") _, out("ymm5") _,
            out("ymm6") _, out("ymm7") _, out("ymm8") _, out("ymm9") _, out("ymm10") _, out("ymm11") _,
            out("ymm12") _, out("ymm13") _, out("ymm14") _,
            options(nostack, nomem),
        );
    }
}

#[target_feature(enable = "avx2")]
unsafe fn pair_sum(iters: u64) {
    // SAFETY: AVX2 (the caller's contract); registers only.
    unsafe {
        asm!(
            ymm_setup!(),
            "2:",
            "vpmaddubsw ymm0, ymm13, ymm14", "vpmaddubsw ymm1, ymm13, ymm14",
            "vpmaddubsw ymm2, ymm13, ymm14", "vpmaddubsw ymm3, ymm13, ymm14",
            "vpmaddubsw ymm4, ymm13, ymm14", "vpmaddubsw ymm5, ymm13, ymm14",
            "vpmaddubsw ymm6, ymm13, ymm14", "vpmaddubsw ymm7, ymm13, ymm14",
            "vpaddw ymm0, ymm0, ymm1", "vpaddw ymm2, ymm2, ymm3",
            "vpaddw ymm4, ymm4, ymm5", "vpaddw ymm6, ymm6, ymm7",
            "vpmaddwd ymm0, ymm0, ymm12", "vpmaddwd ymm2, ymm2, ymm12",
            "vpmaddwd ymm4, ymm4, ymm12", "vpmaddwd ymm6, ymm6, ymm12",
            "vpaddd ymm8, ymm8, ymm0", "vpaddd ymm9, ymm9, ymm2",
            "vpaddd ymm10, ymm10, ymm4", "vpaddd ymm11, ymm11, ymm6",
            "dec {n}",
            "jnz 2b",
            n = inout(reg) iters => _,
            out("ymm0") _, out("ymm1") _, out("ymm2") _, out("ymm3") _, out("ymm4") _, out("ymm5") _,
            out("ymm6") _, out("ymm7") _, out("ymm8") _, out("ymm9") _, out("ymm10") _, out("ymm11") _,
            out("ymm12") _, out("ymm13") _, out("ymm14") _,
            options(nostack, nomem),
        );
    }
}

#[target_feature(enable = "avx2")]
unsafe fn maddwd(iters: u64) {
    // SAFETY: AVX2 (the caller's contract); registers only.
    unsafe {
        asm!(
            ymm_setup!(),
            "2:",
            "vpmaddwd ymm0, ymm12, ymm14", "vpmaddwd ymm1, ymm12, ymm14",
            "vpmaddwd ymm2, ymm12, ymm14", "vpmaddwd ymm3, ymm12, ymm14",
            "vpmaddwd ymm4, ymm12, ymm14", "vpmaddwd ymm5, ymm12, ymm14",
            "vpaddd ymm6, ymm6, ymm0", "vpaddd ymm7, ymm7, ymm1",
            "vpaddd ymm8, ymm8, ymm2", "vpaddd ymm9, ymm9, ymm3",
            "vpaddd ymm10, ymm10, ymm4", "vpaddd ymm11, ymm11, ymm5",
            "dec {n}",
            "jnz 2b",
            n = inout(reg) iters => _,
            out("ymm0") _, out("ymm1") _, out("ymm2") _, out("ymm3") _, out("ymm4") _, out("ymm5") _,
            out("ymm6") _, out("ymm7") _, out("ymm8") _, out("ymm9") _, out("ymm10") _, out("ymm11") _,
            out("ymm12") _, out("ymm13") _, out("ymm14") _,
            options(nostack, nomem),
        );
    }
}

#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn vnni_zmm(iters: u64) {
    // SAFETY: AVX-512F + VNNI (the caller's contract); registers only.
    unsafe {
        asm!(
            "vpternlogd zmm14, zmm14, zmm14, 0xff",
            "vpabsb zmm13, zmm14",
            "2:",
            "vpdpbusd zmm0, zmm13, zmm14", "vpdpbusd zmm1, zmm13, zmm14",
            "vpdpbusd zmm2, zmm13, zmm14", "vpdpbusd zmm3, zmm13, zmm14",
            "vpdpbusd zmm4, zmm13, zmm14", "vpdpbusd zmm5, zmm13, zmm14",
            "vpdpbusd zmm6, zmm13, zmm14", "vpdpbusd zmm7, zmm13, zmm14",
            "vpdpbusd zmm8, zmm13, zmm14", "vpdpbusd zmm9, zmm13, zmm14",
            "vpdpbusd zmm10, zmm13, zmm14", "vpdpbusd zmm11, zmm13, zmm14",
            "dec {n}",
            "jnz 2b",
            n = inout(reg) iters => _,
            out("zmm0") _, out("zmm1") _, out("zmm2") _, out("zmm3") _, out("zmm4") _, out("zmm5") _,
            out("zmm6") _, out("zmm7") _, out("zmm8") _, out("zmm9") _, out("zmm10") _, out("zmm11") _,
            out("zmm13") _, out("zmm14") _,
            options(nostack, nomem),
        );
    }
}

#[target_feature(enable = "avx512f,avx512vl,avx512vnni")]
unsafe fn vnni_ymm_evex(iters: u64) {
    // SAFETY: AVX512_VNNI + VL (the caller's contract); registers only. `{evex}` pins the encoding.
    unsafe {
        asm!(
            ymm_setup!(),
            "2:",
            "{{evex}} vpdpbusd ymm0, ymm13, ymm14", "{{evex}} vpdpbusd ymm1, ymm13, ymm14",
            "{{evex}} vpdpbusd ymm2, ymm13, ymm14", "{{evex}} vpdpbusd ymm3, ymm13, ymm14",
            "{{evex}} vpdpbusd ymm4, ymm13, ymm14", "{{evex}} vpdpbusd ymm5, ymm13, ymm14",
            "{{evex}} vpdpbusd ymm6, ymm13, ymm14", "{{evex}} vpdpbusd ymm7, ymm13, ymm14",
            "{{evex}} vpdpbusd ymm8, ymm13, ymm14", "{{evex}} vpdpbusd ymm9, ymm13, ymm14",
            "{{evex}} vpdpbusd ymm10, ymm13, ymm14", "{{evex}} vpdpbusd ymm11, ymm13, ymm14",
            "dec {n}",
            "jnz 2b",
            n = inout(reg) iters => _,
            out("ymm0") _, out("ymm1") _, out("ymm2") _, out("ymm3") _, out("ymm4") _, out("ymm5") _,
            out("ymm6") _, out("ymm7") _, out("ymm8") _, out("ymm9") _, out("ymm10") _, out("ymm11") _,
            out("ymm12") _, out("ymm13") _, out("ymm14") _,
            options(nostack, nomem),
        );
    }
}

#[target_feature(enable = "avxvnni")]
unsafe fn vnni_ymm_vex(iters: u64) {
    // SAFETY: AVX-VNNI (the caller's contract); registers only. `{vex}` pins the encoding.
    unsafe {
        asm!(
            ymm_setup!(),
            "2:",
            "{{vex}} vpdpbusd ymm0, ymm13, ymm14", "{{vex}} vpdpbusd ymm1, ymm13, ymm14",
            "{{vex}} vpdpbusd ymm2, ymm13, ymm14", "{{vex}} vpdpbusd ymm3, ymm13, ymm14",
            "{{vex}} vpdpbusd ymm4, ymm13, ymm14", "{{vex}} vpdpbusd ymm5, ymm13, ymm14",
            "{{vex}} vpdpbusd ymm6, ymm13, ymm14", "{{vex}} vpdpbusd ymm7, ymm13, ymm14",
            "{{vex}} vpdpbusd ymm8, ymm13, ymm14", "{{vex}} vpdpbusd ymm9, ymm13, ymm14",
            "{{vex}} vpdpbusd ymm10, ymm13, ymm14", "{{vex}} vpdpbusd ymm11, ymm13, ymm14",
            "dec {n}",
            "jnz 2b",
            n = inout(reg) iters => _,
            out("ymm0") _, out("ymm1") _, out("ymm2") _, out("ymm3") _, out("ymm4") _, out("ymm5") _,
            out("ymm6") _, out("ymm7") _, out("ymm8") _, out("ymm9") _, out("ymm10") _, out("ymm11") _,
            out("ymm12") _, out("ymm13") _, out("ymm14") _,
            options(nostack, nomem),
        );
    }
}
