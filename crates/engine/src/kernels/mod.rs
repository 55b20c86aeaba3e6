//! CPU kernels: the BF16-weight GEMM (two arms), a small f32 matrix product for the mixers, element-wise
//! math, and a peak micro-benchmark.
//!
//! Every kernel exists twice: an AVX-512 version (`x86`, chosen at run time with `is_x86_feature_detected!`)
//! and a portable version in plain Rust. [`Kernels`] carries the choice, so tests can run both on one
//! machine and a model keeps the choice it was loaded with.
//!
//! Determinism: each output element of every kernel is one fixed-order chain of fused multiply-adds over
//! the reduction index, whatever the number of rows, their position inside a register block, or the thread
//! that computes them. That is what makes a batched forward bit-equal to rows run one by one.

pub mod buf;
pub mod gemm;
pub mod math;
pub mod matmul;
pub mod pack;
pub mod peak;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;

pub use gemm::gemm;
pub use pack::PackedMatrix;

/// The compute arm of the projections (GEMMs over the BF16 weights).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Arm {
    /// All arithmetic in f32: weights widened exactly, f32 fused multiply-adds.
    Fp32,
    /// Activations rounded to bf16 (nearest-even), BF16×BF16 products accumulated in f32
    /// (`vdpbf16ps` where the CPU has AVX512_BF16).
    Bf16,
}

impl Arm {
    /// `fp32` or `bf16`.
    pub fn name(self) -> &'static str {
        match self {
            Arm::Fp32 => "fp32",
            Arm::Bf16 => "bf16",
        }
    }
}

impl std::str::FromStr for Arm {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "fp32" => Ok(Arm::Fp32),
            "bf16" => Ok(Arm::Bf16),
            other => Err(format!("unknown compute arm `{other}` (fp32, bf16)")),
        }
    }
}

/// Which instruction set the kernels use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Isa {
    /// Plain Rust, no explicit SIMD.
    Portable,
    /// AVX-512F (f32 kernels); BF16 dot products emulated in f32.
    Avx512,
    /// AVX-512F plus AVX512_BF16 (`vdpbf16ps`, `vcvtne2ps2bf16`).
    Avx512Bf16,
}

/// The kernel set a model computes with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Kernels {
    isa: Isa,
}

impl Kernels {
    /// The best kernels this CPU supports. `KEV_ISA=portable` (or `avx512`) caps the choice, for
    /// testing the fallbacks on a machine that has more.
    pub fn detect() -> Self {
        let best = Self::best_isa();
        let cap = std::env::var("KEV_ISA").ok();
        let isa = match cap.as_deref() {
            Some("portable") => Isa::Portable,
            Some("avx512") if best != Isa::Portable => Isa::Avx512,
            _ => best,
        };
        Kernels { isa }
    }

    fn best_isa() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                if std::arch::is_x86_feature_detected!("avx512bf16") {
                    return Isa::Avx512Bf16;
                }
                return Isa::Avx512;
            }
        }
        Isa::Portable
    }

    /// Kernels for a given instruction set, if this CPU has it.
    pub fn with_isa(isa: Isa) -> Option<Self> {
        let best = Self::best_isa();
        let ok = match isa {
            Isa::Portable => true,
            Isa::Avx512 => best != Isa::Portable,
            Isa::Avx512Bf16 => best == Isa::Avx512Bf16,
        };
        ok.then_some(Kernels { isa })
    }

    /// The plain-Rust kernels (available everywhere).
    pub fn portable() -> Self {
        Kernels { isa: Isa::Portable }
    }

    /// The instruction set in use.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    pub(crate) fn avx512(&self) -> bool {
        self.isa != Isa::Portable
    }

    pub(crate) fn avx512bf16(&self) -> bool {
        self.isa == Isa::Avx512Bf16
    }
}

/// Run `f` inside a function compiled for AVX-512 when the kernels allow it, so the plain loops it
/// inlines vectorise 16-wide instead of SSE2's 4. Plain loops are not reassociated by the compiler, so
/// the results do not change, only the speed.
#[inline(always)]
pub(crate) fn wide<R>(kern: Kernels, f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    if kern.avx512() {
        #[target_feature(enable = "avx512f")]
        unsafe fn run<R>(f: impl FnOnce() -> R) -> R {
            f()
        }
        // SAFETY: AVX-512F checked.
        return unsafe { run(f) };
    }
    let _ = kern;
    f()
}

/// Threads the kernels run on (the rayon pool).
pub fn threads() -> usize {
    rayon::current_num_threads()
}

/// Round an f32 to bf16 bits, nearest-even (as `vcvtneps2bf16` and torch do); NaN stays NaN.
#[inline]
pub fn bf16_bits(x: f32) -> u16 {
    half::bf16::from_f32(x).to_bits()
}

/// Widen bf16 bits to f32 (exact).
#[inline]
pub fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// A raw pointer that may be shared between rayon tasks writing disjoint parts of one buffer.
#[derive(Clone, Copy)]
pub(crate) struct SendPtr<T>(pub *mut T);
impl<T> SendPtr<T> {
    /// The pointer (a method, so closures capture the `Send` wrapper rather than the raw field).
    #[inline]
    pub(crate) fn get(self) -> *mut T {
        self.0
    }
}
// SAFETY: used only where each task writes a disjoint region, as the call sites document.
unsafe impl<T> Send for SendPtr<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for SendPtr<T> {}
