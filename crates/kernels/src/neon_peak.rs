//! The int8 ceilings of aarch64 (`kernels::peak`): register-resident chains of the instructions the
//! int8 microkernels are built from, so a GEMM's rate can be read as a share of what its instruction
//! allows on the CPU it runs on.

use std::arch::asm;

/// A register-resident int8 chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Chain {
    /// DotProd `sdot` (s8 × s8 into i32): 16 multiply-adds each (`ukr_sdot`).
    Sdot,
    /// I8MM `smmla` (2 × 8 by 8 × 2 s8 into 2 × 2 i32): 32 multiply-adds each (`ukr_smmla`).
    Smmla,
}

impl Chain {
    /// The chains whose instructions this CPU has.
    pub(crate) fn available() -> Vec<Chain> {
        use std::arch::is_aarch64_feature_detected as has;
        [Chain::Sdot, Chain::Smmla]
            .into_iter()
            .filter(|c| match c {
                Chain::Sdot => has!("dotprod"),
                Chain::Smmla => has!("i8mm"),
            })
            .collect()
    }

    /// The name reports use.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Chain::Sdot => "neon sdot",
            Chain::Smmla => "neon smmla",
        }
    }

    /// Multiply-adds per round of [`run`] (16 independent accumulators: enough for a 4-cycle latency
    /// at four a cycle).
    pub(crate) fn macs(self) -> f64 {
        match self {
            Chain::Sdot => 16.0 * 16.0,
            Chain::Smmla => 16.0 * 32.0,
        }
    }
}

/// `iters` (≥ 1) rounds of `chain`.
///
/// # Safety
/// The CPU has the chain's instructions (see [`Chain::available`]).
pub(crate) unsafe fn run(chain: Chain, iters: u64) {
    // SAFETY: the caller checked the instruction set; the loops touch registers only.
    unsafe {
        match chain {
            Chain::Sdot => sdot(iters.max(1)),
            Chain::Smmla => smmla(iters.max(1)),
        }
    }
}

/// Sixteen accumulators `v0`–`v15` fed by `v16` × `v17` (bytes of 1: the sums wrap harmlessly).
macro_rules! chain {
    ($name:ident, $feature:literal, $op:literal) => {
        #[target_feature(enable = $feature)]
        unsafe fn $name(iters: u64) {
            // SAFETY: the instruction set is the caller's contract; registers only.
            unsafe {
                asm!(
                    "movi v16.16b, #1",
                    "movi v17.16b, #1",
                    "2:",
                    concat!($op, " v0.4s, v16.16b, v17.16b"), concat!($op, " v1.4s, v16.16b, v17.16b"),
                    concat!($op, " v2.4s, v16.16b, v17.16b"), concat!($op, " v3.4s, v16.16b, v17.16b"),
                    concat!($op, " v4.4s, v16.16b, v17.16b"), concat!($op, " v5.4s, v16.16b, v17.16b"),
                    concat!($op, " v6.4s, v16.16b, v17.16b"), concat!($op, " v7.4s, v16.16b, v17.16b"),
                    concat!($op, " v8.4s, v16.16b, v17.16b"), concat!($op, " v9.4s, v16.16b, v17.16b"),
                    concat!($op, " v10.4s, v16.16b, v17.16b"), concat!($op, " v11.4s, v16.16b, v17.16b"),
                    concat!($op, " v12.4s, v16.16b, v17.16b"), concat!($op, " v13.4s, v16.16b, v17.16b"),
                    concat!($op, " v14.4s, v16.16b, v17.16b"), concat!($op, " v15.4s, v16.16b, v17.16b"),
                    "subs {n}, {n}, #1",
                    "b.ne 2b",
                    n = inout(reg) iters => _,
                    out("v0") _, out("v1") _, out("v2") _, out("v3") _, out("v4") _, out("v5") _,
                    out("v6") _, out("v7") _, out("v8") _, out("v9") _, out("v10") _, out("v11") _,
                    out("v12") _, out("v13") _, out("v14") _, out("v15") _, out("v16") _, out("v17") _,
                    options(nostack, nomem),
                );
            }
        }
    };
}

chain!(sdot, "neon,dotprod", "sdot");
chain!(smmla, "neon,i8mm", "smmla");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_chain_the_cpu_has_runs() {
        let chains = Chain::available();
        eprintln!("int8 chains: {chains:?}");
        for c in chains {
            // SAFETY: listed by `available`.
            unsafe { run(c, 3) };
            assert!(c.macs() > 0.0 && !c.name().is_empty());
        }
    }
}
