//! Run a kernel written once over [`Simd`] on the instruction set a [`Kernels`] value names: the one place
//! that knows every ISA's entry point (`x86`, `neon`), so the abstraction (`simd`) and its implementations
//! do not import each other.

use super::simd::{Kernel, Scalar};
use super::{Isa, Kernels};

/// Run `k` on the instruction set `kern` names.
#[inline]
pub(crate) fn dispatch<K: Kernel>(kern: Kernels, k: K) -> K::Out {
    match kern.isa() {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 | Isa::Avx512Bf16 | Isa::Amx => {
            // SAFETY: a `Kernels` value names only instruction sets the CPU has (`Kernels::with_isa`).
            unsafe { super::x86::on_avx512(k) }
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::AvxVnni => {
            // SAFETY: as above.
            unsafe { super::x86::on_avx2(k) }
        }
        #[cfg(target_arch = "aarch64")]
        Isa::Neon | Isa::NeonI8mm => {
            // SAFETY: as above.
            unsafe { super::neon::on_neon(k) }
        }
        _ => k.run::<Scalar>(),
    }
}
