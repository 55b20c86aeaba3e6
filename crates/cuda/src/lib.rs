//! The CUDA side of kev: finding a device, compiling the Qwen3.5 row kernels with NVRTC for it, and checking
//! them on the device against plain Rust transcriptions of the same arithmetic (`tests/device.rs`).
//!
//! Everything is loaded at run time (`cudarc` with `dynamic-loading`): the crate builds, and its tests run, on
//! machines with no CUDA at all; there the device tests report that they were skipped and why. NVRTC needs no
//! GPU, so where `libnvrtc.so` is on the library path (the CUDA toolkit, or PyPI's `nvidia-cuda-nvrtc` wheel) the
//! kernels are compiled for Hopper (`sm_90`) even on a CPU machine: a kernel that does not compile fails CI.
//!
//! [`backend::CudaBackend`] implements `kev_engine::Backend` over cuBLAS and these kernels; it has **never run**
//! (no GPU yet, issue 9) and is enabled nowhere until `tests/backend.rs` has passed on one. See README.md.

pub mod backend;
mod upload;

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream, DriverError};
use cudarc::nvrtc::{CompileOptions, Ptx};

/// The kernel source (CUDA C), compiled at start for the device's architecture.
pub const KERNEL_SOURCE: &str = include_str!("kernels.cu");

/// Every `extern "C"` kernel of [`KERNEL_SOURCE`], by name (a test keeps the two in step).
pub const KERNELS: [&str; 16] = [
    "embed_bf16",
    "rms_norm",
    "conv_silu",
    "l2_norm_heads",
    "gdn_gates",
    "gdn_recurrent",
    "gated_rms_norm",
    "qk_norm_rope",
    "kv_append",
    "attention",
    "sigmoid_gate",
    "silu_mul",
    "add_inplace",
    "to_bf16",
    "widen_bf16",
    "gather_rows",
];

/// Where a model runs (`--device cpu | cuda | cuda:N`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceChoice {
    Cpu,
    Cuda(usize),
}

impl FromStr for DeviceChoice {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad =
            || format!("--device {s}: expected `cpu`, `cuda` or `cuda:N` (N a device ordinal)");
        match s.trim() {
            "cpu" => Ok(DeviceChoice::Cpu),
            "cuda" => Ok(DeviceChoice::Cuda(0)),
            other => other
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(DeviceChoice::Cuda)
                .ok_or_else(bad),
        }
    }
}

impl fmt::Display for DeviceChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceChoice::Cpu => f.write_str("cpu"),
            DeviceChoice::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// Why CUDA cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    #[error(
        "no CUDA driver on this machine (libcuda.so not found on the library path): use --device cpu, or run on a \
         machine with an NVIDIA driver"
    )]
    NoDriver,
    #[error(
        "NVRTC (libnvrtc.so) not found: kev compiles its kernels at start with it; put the CUDA toolkit's lib \
         directory (or that of PyPI's nvidia-cuda-nvrtc wheel) on LD_LIBRARY_PATH"
    )]
    NoNvrtc,
    #[error("CUDA device {ordinal} does not exist ({count} found)")]
    NoSuchDevice { ordinal: usize, count: usize },
    #[error("CUDA device {ordinal}: {source}")]
    Driver {
        ordinal: usize,
        #[source]
        source: DriverError,
    },
    #[error("compiling kev's kernels for {arch} with NVRTC failed:\n{log}")]
    Compile { arch: String, log: String },
    #[error("kernel `{0}` is missing from the compiled module")]
    MissingKernel(String),
}

/// Which CUDA libraries the dynamic loader can find here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Libraries {
    pub driver: bool,
    pub nvrtc: bool,
    pub cublas: bool,
}

/// Look for the CUDA libraries without loading them for good (cudarc panics on first use of a missing one,
/// so every entry point checks here first).
pub fn libraries() -> Libraries {
    // SAFETY: each call only tries `dlopen` on the library's candidate names and closes what it opened.
    unsafe {
        Libraries {
            driver: cudarc::driver::sys::is_culib_present(),
            nvrtc: cudarc::nvrtc::sys::is_culib_present(),
            cublas: cudarc::cublas::sys::is_culib_present(),
        }
    }
}

/// `sm_XY` for compute capability X.Y.
pub fn arch_name(major: i32, minor: i32) -> String {
    format!("sm_{major}{minor}")
}

/// Compile [`KERNEL_SOURCE`] to PTX for `arch` (`sm_90` on Hopper). Needs NVRTC, not a GPU.
pub fn compile(arch: &str) -> Result<Ptx, CudaError> {
    if !libraries().nvrtc {
        return Err(CudaError::NoNvrtc);
    }
    // NVRTC takes the architecture as a `&'static str`; one leaked string per distinct call is a few bytes.
    let arch_static: &'static str = Box::leak(arch.to_string().into_boxed_str());
    let opts = CompileOptions {
        arch: Some(arch_static),
        // Denormals kept and IEEE division and square root: the CPU engine's fp32 arithmetic.
        ftz: Some(false),
        prec_div: Some(true),
        prec_sqrt: Some(true),
        name: Some("kev_kernels.cu".into()),
        ..Default::default()
    };
    cudarc::nvrtc::compile_ptx_with_opts(KERNEL_SOURCE, opts).map_err(|e| CudaError::Compile {
        arch: arch.to_string(),
        log: match e {
            cudarc::nvrtc::CompileError::CompileError { log, .. } => {
                log.to_string_lossy().into_owned()
            }
            other => format!("{other:?}"),
        },
    })
}

/// An opened device with kev's kernels loaded.
pub struct Device {
    ordinal: usize,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    module: Arc<CudaModule>,
    name: String,
    arch: String,
    memory_bytes: usize,
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}

impl Device {
    /// Open device `ordinal`, compile the kernels for its architecture and check every one is there.
    pub fn open(ordinal: usize) -> Result<Self, CudaError> {
        let libs = libraries();
        if !libs.driver {
            return Err(CudaError::NoDriver);
        }
        if !libs.nvrtc {
            return Err(CudaError::NoNvrtc);
        }
        let driver = |source| CudaError::Driver { ordinal, source };
        let count = CudaContext::device_count().map_err(driver)?.max(0) as usize;
        if ordinal >= count {
            return Err(CudaError::NoSuchDevice { ordinal, count });
        }
        let ctx = CudaContext::new(ordinal).map_err(driver)?;
        let (major, minor) = ctx.compute_capability().map_err(driver)?;
        let arch = arch_name(major, minor);
        let ptx = compile(&arch)?;
        let module = ctx.load_module(ptx).map_err(driver)?;
        for name in KERNELS {
            module
                .load_function(name)
                .map_err(|_| CudaError::MissingKernel(name.to_string()))?;
        }
        Ok(Device {
            ordinal,
            name: ctx.name().map_err(driver)?,
            memory_bytes: ctx.total_mem().map_err(driver)?,
            stream: ctx.default_stream(),
            ctx,
            module,
            arch,
        })
    }

    /// A kernel of [`KERNELS`].
    pub fn function(&self, name: &str) -> Result<CudaFunction, CudaError> {
        self.module
            .load_function(name)
            .map_err(|_| CudaError::MissingKernel(name.to_string()))
    }

    /// The device's ordinal (`cuda:N`).
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The stream kev's work is queued on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// `cuda:0 NVIDIA H200 (sm_90, 139.8 GiB)`, for logs and `/v1/models`.
    pub fn describe(&self) -> String {
        format!(
            "cuda:{} {} ({}, {:.1} GiB)",
            self.ordinal,
            self.name,
            self.arch,
            self.memory_bytes as f64 / (1u64 << 30) as f64
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_choices() {
        assert_eq!("cpu".parse(), Ok(DeviceChoice::Cpu));
        assert_eq!("cuda".parse(), Ok(DeviceChoice::Cuda(0)));
        assert_eq!("cuda:3".parse(), Ok(DeviceChoice::Cuda(3)));
        for bad in ["gpu", "cuda:", "cuda:x", "cuda:-1", "CUDA"] {
            let e = bad.parse::<DeviceChoice>().unwrap_err();
            assert!(e.contains(bad) && e.contains("cuda:N"), "{e}");
        }
        assert_eq!(DeviceChoice::Cuda(2).to_string(), "cuda:2");
    }

    #[test]
    fn the_kernel_list_is_the_source_list() {
        let mut in_source: Vec<&str> = KERNEL_SOURCE
            .split("extern \"C\" __global__ void ")
            .skip(1)
            .map(|rest| rest.split('(').next().unwrap().trim())
            .collect();
        in_source.sort_unstable();
        let mut listed = KERNELS.to_vec();
        listed.sort_unstable();
        assert_eq!(in_source, listed);
    }

    #[test]
    fn arch_names() {
        assert_eq!(arch_name(9, 0), "sm_90");
        assert_eq!(arch_name(12, 0), "sm_120");
    }
}
