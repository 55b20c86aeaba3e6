//! kev's CPU kernels: the GEMMs of every compute arm (BF16 weights × f32 or bf16 activations, int8 weights ×
//! int8 activations), a small f32 matrix product for the mixers, element-wise math, and (feature `peak`) the
//! peak-rate loops benchmarks divide by. A leaf: nothing here knows of the model; a long product pauses only
//! where its caller's [`SafePoint`] says.
//!
//! Every kernel is written once, generic over the [`simd::Simd`] abstraction, and instantiated at run
//! time for the instruction set a [`Kernels`] value names: AVX-512F (+AVX512_BF16 for the bf16 arm's dot
//! products, +AMX tiles for the bf16 and int8 arms' products), AVX2 + FMA, NEON on aarch64, or plain Rust (the correctness fallback). [`Kernels`] carries
//! the choice, so tests can run every instruction set on one machine and a model keeps the choice it
//! was loaded with.
//!
//! Determinism: each output element of every kernel is one fixed-order chain of fused multiply-adds over
//! the reduction index, whatever the number of rows, their position inside a register block, or the thread
//! that computes them. That is what makes a batched forward bit-equal to rows run one by one. The f32
//! GEMM and matrix product give the same bits on every instruction set that fuses (AVX2, AVX-512, NEON).

#[cfg(target_arch = "x86_64")]
pub(crate) mod amx;
pub mod buf;
pub mod cache;
pub(crate) mod dispatch;
pub mod gemm;
pub mod int8;
pub mod layout;
pub mod math;
pub mod matmul;
#[cfg(target_arch = "aarch64")]
pub(crate) mod neon;
#[cfg(all(target_arch = "aarch64", feature = "peak"))]
pub(crate) mod neon_peak;
pub mod pack;
#[cfg(feature = "peak")]
pub mod peak;
pub(crate) mod simd;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86_int8;
#[cfg(all(target_arch = "x86_64", feature = "peak"))]
pub(crate) mod x86_peak;

pub use gemm::{Rows, RowsMut, Run, SafePoint, gemm};
pub use int8::PackedInt8;
pub use pack::PackedMatrix;

/// The compute arm of the projections (GEMMs over the BF16 weights).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Arm {
    /// All arithmetic in f32: weights widened exactly, f32 fused multiply-adds.
    Fp32,
    /// Activations rounded to bf16 (nearest-even), BF16×BF16 products accumulated in f32
    /// (`vdpbf16ps` where the CPU has AVX512_BF16; elsewhere exact f32 products of the rounded values).
    Bf16,
    /// W8A8: weights int8 per output channel, activations int8 per token, exact i32 dot products,
    /// f32 dequantisation (`int8.rs`; the weights are quantised from the BF16/F32 ones on first use).
    Int8,
}

impl Arm {
    /// `fp32`, `bf16` or `int8`.
    pub fn name(self) -> &'static str {
        match self {
            Arm::Fp32 => "fp32",
            Arm::Bf16 => "bf16",
            Arm::Int8 => "int8",
        }
    }
}

impl std::str::FromStr for Arm {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "fp32" => Ok(Arm::Fp32),
            "bf16" => Ok(Arm::Bf16),
            "int8" => Ok(Arm::Int8),
            other => Err(format!("unknown compute arm `{other}` (fp32, bf16, int8)")),
        }
    }
}

/// Which instruction set the kernels use, ordered by capability (the best one a CPU has is chosen).
/// On x86-64 each set includes the ones before it, except that the AVX-512 sets do not require
/// [`Isa::AvxVnni`]: they have the same instruction in its EVEX form (AVX512_VNNI), or none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Isa {
    /// Plain Rust, no explicit SIMD.
    Portable,
    /// aarch64 Advanced SIMD (4 f32 lanes, fused multiply-add); the int8 arm on DotProd `sdot` where the
    /// CPU has it.
    Neon,
    /// aarch64 Advanced SIMD plus I8MM: the int8 arm's products on `smmla`, everything else as
    /// [`Isa::Neon`]. `KEV_ISA=neon` keeps `sdot` on such a CPU, so the two kernels can be A/B'd there.
    NeonI8mm,
    /// AVX2 + FMA (8 f32 lanes); BF16 dot products as exact f32 products.
    Avx2,
    /// AVX2 + FMA plus AVX-VNNI (VEX `vpdpbusd` on ymm: Alder Lake and later, Zen 5): the int8 arm's
    /// products on ymm `vpdpbusd`, everything else as AVX2. Never chosen on its own by a CPU with
    /// AVX-512, but `KEV_ISA=avxvnni` runs it on one with AVX512_VNNI + VL and no AVX-VNNI (Zen 4, Ice
    /// Lake): the same instruction on ymm in its EVEX encoding, so those CPUs test and measure the
    /// AVX-VNNI kernels as `KEV_ISA=avx2` lets them measure the AVX2 ones.
    AvxVnni,
    /// AVX-512F (16 lanes); BF16 dot products as exact f32 products.
    Avx512,
    /// AVX-512F plus AVX512_BF16 (`vdpbf16ps`, `vcvtne2ps2bf16`).
    Avx512Bf16,
    /// AVX512_BF16 plus AMX tiles (Sapphire Rapids and later): the bf16 arm's products on `tdpbf16ps`,
    /// the int8 arm's on `tdpbssd`; f32 work as AVX-512.
    Amx,
}

impl Isa {
    /// The names `KEV_ISA` takes and reports use.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Neon => "neon",
            Isa::NeonI8mm => "neoni8mm",
            Isa::Avx2 => "avx2",
            Isa::AvxVnni => "avxvnni",
            Isa::Avx512 => "avx512",
            Isa::Avx512Bf16 => "avx512bf16",
            Isa::Amx => "amx",
        }
    }

    /// Every instruction set, weakest first.
    pub const ALL: [Isa; 8] = [
        Isa::Portable,
        Isa::Neon,
        Isa::NeonI8mm,
        Isa::Avx2,
        Isa::AvxVnni,
        Isa::Avx512,
        Isa::Avx512Bf16,
        Isa::Amx,
    ];
}

impl std::fmt::Display for Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Isa {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Isa::ALL.into_iter().find(|i| i.name() == s).ok_or_else(|| {
            let names: Vec<&str> = Isa::ALL.iter().map(|i| i.name()).collect();
            format!("unknown instruction set `{s}` ({})", names.join(", "))
        })
    }
}

/// The kernel set a model computes with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Kernels {
    isa: Isa,
}

impl Kernels {
    /// The best kernels this CPU supports, capped by `KEV_ISA` (`portable`, `avx2`, `avxvnni`, `avx512`,
    /// `avx512bf16`, `amx`, `neon`, `neoni8mm`) so an AVX-512 machine can run and test the AVX2 kernels.
    /// A cap above what the CPU has, or an unknown name, leaves the best choice (and says so in the log).
    pub fn detect() -> Self {
        let best = Self::best_isa();
        let isa = match std::env::var("KEV_ISA") {
            Ok(cap) if !cap.is_empty() => match cap.parse::<Isa>() {
                Ok(want) if Self::supported(want) => want,
                Ok(want) => {
                    tracing::warn!("KEV_ISA={want}: this CPU does not have it; using {best}");
                    best
                }
                Err(e) => {
                    tracing::warn!("KEV_ISA: {e}; using {best}");
                    best
                }
            },
            _ => best,
        };
        Kernels { isa }
    }

    /// Whether this CPU can run `isa`.
    pub fn supported(isa: Isa) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            match isa {
                Isa::Portable => true,
                Isa::Neon | Isa::NeonI8mm => false,
                Isa::Avx2 => has!("avx2") && has!("fma"),
                Isa::AvxVnni => {
                    has!("avx2")
                        && has!("fma")
                        && (has!("avxvnni")
                            || (has!("avx512f") && has!("avx512vl") && has!("avx512vnni")))
                }
                Isa::Avx512 => has!("avx512f") && has!("avx2") && has!("fma"),
                Isa::Avx512Bf16 => has!("avx512f") && has!("avx512bf16"),
                Isa::Amx => has!("avx512f") && has!("avx512bf16") && amx::available(),
            }
        }
        #[cfg(target_arch = "aarch64")]
        {
            use std::arch::is_aarch64_feature_detected as has;
            match isa {
                Isa::Portable => true,
                Isa::Neon => has!("neon"),
                Isa::NeonI8mm => has!("neon") && has!("i8mm"),
                _ => false,
            }
        }
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        {
            isa == Isa::Portable
        }
    }

    fn best_isa() -> Isa {
        Isa::ALL
            .into_iter()
            .rev()
            .find(|i| Self::supported(*i))
            .unwrap_or(Isa::Portable)
    }

    /// The best kernels this CPU supports, whatever `KEV_ISA` says: for work whose results do not depend
    /// on the instruction set (the int8 weights' quantisation), where the cap would only cost time.
    pub(crate) fn best() -> Self {
        Kernels {
            isa: Self::best_isa(),
        }
    }

    /// Kernels for a given instruction set, if this CPU has it.
    pub fn with_isa(isa: Isa) -> Option<Self> {
        Self::supported(isa).then_some(Kernels { isa })
    }

    /// Every kernel set this CPU can run, weakest first (what tests loop over).
    pub fn available() -> Vec<Kernels> {
        Isa::ALL.into_iter().filter_map(Self::with_isa).collect()
    }

    /// The plain-Rust kernels (available everywhere).
    pub fn portable() -> Self {
        Kernels { isa: Isa::Portable }
    }

    /// The instruction set in use.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// Native BF16 dot products (`vdpbf16ps` and the bf16 rounding instructions).
    pub(crate) fn avx512bf16(&self) -> bool {
        matches!(self.isa, Isa::Avx512Bf16 | Isa::Amx)
    }

    /// AMX tiles (the bf16 and int8 arms' products).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) fn amx(&self) -> bool {
        self.isa == Isa::Amx
    }

    /// Whether the vectors are wider than one lane (the SIMD kernels, not the portable fallback).
    pub(crate) fn simd(&self) -> bool {
        self.isa != Isa::Portable
    }
}

/// `wide!(kern, || body)`: run `body` inside a function compiled for the kernels' instruction set, so the
/// plain loops it holds vectorise to its width instead of SSE2's 4 lanes. Plain loops are neither
/// reassociated nor fused by the compiler, so the results do not change with the instruction set, only the
/// speed.
///
/// A macro so the closure is always `#[inline(always)]`: it is called from every arm of [`run_wide`], and
/// without the attribute LLVM keeps its body as one function compiled for the baseline that each arm only
/// jumps to (`objdump` showed the GDN conv in SSE `mulps` that way until 2026-12-05).
#[macro_export]
macro_rules! wide {
    ($kern:expr, || $body:expr $(,)?) => {
        $crate::run_wide(
            $kern,
            #[inline(always)]
            || $body,
        )
    };
}

/// The body of [`wide!`]; call it through the macro.
#[inline(always)]
#[doc(hidden)]
pub fn run_wide<R>(kern: Kernels, f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    match kern.isa() {
        Isa::Avx512 | Isa::Avx512Bf16 | Isa::Amx => {
            #[target_feature(enable = "avx512f,avx2,fma")]
            unsafe fn run<R>(f: impl FnOnce() -> R) -> R {
                f()
            }
            // SAFETY: AVX-512F checked.
            return unsafe { run(f) };
        }
        Isa::Avx2 | Isa::AvxVnni => {
            #[target_feature(enable = "avx2,fma")]
            unsafe fn run<R>(f: impl FnOnce() -> R) -> R {
                f()
            }
            // SAFETY: AVX2 checked.
            return unsafe { run(f) };
        }
        _ => {}
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
pub struct SendPtr<T>(pub *mut T);
impl<T> SendPtr<T> {
    /// The pointer (a method, so closures capture the `Send` wrapper rather than the raw field).
    #[inline]
    pub fn get(self) -> *mut T {
        self.0
    }
}
// SAFETY: used only where each task writes a disjoint region, as the call sites document.
unsafe impl<T> Send for SendPtr<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for SendPtr<T> {}
