//! The weights on the device: the checkpoint tree ([`kev_engine::Weights`]) uploaded once, BF16 matrices
//! (each LoRA merged at load, bit-exact with the CPU loader's merge) and f32 vectors, plus the kernels the
//! forward pass launches.

use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig, PushKernelArg};
use kev_engine::weights::{Mixer as CkMixer, Projection, Tensor};
use kev_engine::{Arm, EngineError, Weights};

use crate::Device;

/// A driver or cuBLAS error as the engine's device error.
pub(crate) fn dev_err(e: impl std::fmt::Debug) -> EngineError {
    EngineError::Device(format!("{e:?}"))
}

/// One thread per element, in blocks of 256.
pub(crate) fn blocks(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(256) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// A projection `y = x · Wᵀ`, `W` `[n, k]` row-major.
pub(crate) struct Mat {
    pub n: usize,
    pub k: usize,
    pub bf16: CudaSlice<u16>,
    /// The fp32 arm's widened copy.
    pub f32: Option<CudaSlice<f32>>,
}

// One per layer, never moved after load: the size difference between the variants costs nothing.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Mixer {
    Gdn {
        qkv: Mat,
        z: Mat,
        b: Mat,
        a: Mat,
        /// `[conv_dim, 4]`.
        taps: CudaSlice<f32>,
        a_log: CudaSlice<f32>,
        dt_bias: CudaSlice<f32>,
        norm: CudaSlice<f32>,
        out: Mat,
    },
    Attn {
        q: Mat,
        k: Mat,
        v: Mat,
        q_norm: CudaSlice<f32>,
        k_norm: CudaSlice<f32>,
        o: Mat,
    },
}

pub(crate) struct Layer {
    pub in_norm: CudaSlice<f32>,
    pub mixer: Mixer,
    pub post_norm: CudaSlice<f32>,
    pub gate: Mat,
    pub up: Mat,
    pub down: Mat,
}

/// The kernels, looked up once.
pub(crate) struct Funcs {
    pub embed: CudaFunction,
    pub rms_norm: CudaFunction,
    pub conv_silu: CudaFunction,
    pub l2_norm_heads: CudaFunction,
    pub gdn_gates: CudaFunction,
    pub gdn_recurrent: CudaFunction,
    pub gated_rms_norm: CudaFunction,
    pub qk_norm_rope: CudaFunction,
    pub kv_append: CudaFunction,
    pub attention: CudaFunction,
    pub sigmoid_gate: CudaFunction,
    pub silu_mul: CudaFunction,
    pub add_inplace: CudaFunction,
    pub to_bf16: CudaFunction,
    pub widen_bf16: CudaFunction,
    pub gather_rows: CudaFunction,
}

impl Funcs {
    pub fn look_up(dev: &Device) -> Result<Self, EngineError> {
        let fun = |n: &str| dev.function(n).map_err(dev_err);
        Ok(Funcs {
            embed: fun("embed_bf16")?,
            rms_norm: fun("rms_norm")?,
            conv_silu: fun("conv_silu")?,
            l2_norm_heads: fun("l2_norm_heads")?,
            gdn_gates: fun("gdn_gates")?,
            gdn_recurrent: fun("gdn_recurrent")?,
            gated_rms_norm: fun("gated_rms_norm")?,
            qk_norm_rope: fun("qk_norm_rope")?,
            kv_append: fun("kv_append")?,
            attention: fun("attention")?,
            sigmoid_gate: fun("sigmoid_gate")?,
            silu_mul: fun("silu_mul")?,
            add_inplace: fun("add_inplace")?,
            to_bf16: fun("to_bf16")?,
            widen_bf16: fun("widen_bf16")?,
            gather_rows: fun("gather_rows")?,
        })
    }
}

/// Every weight of the model, in device memory.
pub(crate) struct DeviceWeights {
    /// `embed_tokens` as BF16 bits.
    pub embed: CudaSlice<u16>,
    pub layers: Vec<Layer>,
    /// `norm.weight` (applied as `x·(1+w)` by the kernel).
    pub final_norm: CudaSlice<f32>,
}

/// Uploads tensors of the tree to one device.
struct Uploader<'d> {
    dev: &'d Device,
    f: &'d Funcs,
    arm: Arm,
}

impl Uploader<'_> {
    fn vector(&self, t: &Tensor<'_>) -> Result<CudaSlice<f32>, EngineError> {
        self.dev.stream().clone_htod(&t.to_f32()).map_err(dev_err)
    }

    /// A projection as BF16 (LoRA merged), with the fp32 arm's widened copy made on the device.
    fn mat(&self, p: &Projection<'_>) -> Result<Mat, EngineError> {
        let s = self.dev.stream();
        let (n, k) = (p.rows(), p.cols());
        let bf16 = s.clone_htod(&p.bf16_bits_merged()?).map_err(dev_err)?;
        let f32 = if self.arm == Arm::Fp32 {
            let mut w = s.alloc_zeros::<f32>(n * k).map_err(dev_err)?;
            let len = (n * k) as i64;
            let mut b = s.launch_builder(&self.f.widen_bf16);
            b.arg(&bf16).arg(&mut w).arg(&len);
            unsafe { b.launch(blocks(n * k)) }.map_err(dev_err)?;
            Some(w)
        } else {
            None
        };
        Ok(Mat { n, k, bf16, f32 })
    }
}

impl DeviceWeights {
    /// Upload `w` to `dev`; the fp32 arm also keeps an fp32 copy of every matrix.
    pub fn upload(dev: &Device, f: &Funcs, w: &Weights<'_>, arm: Arm) -> Result<Self, EngineError> {
        let up = Uploader { dev, f, arm };
        let s = dev.stream();
        let embed = s.clone_htod(&w.embed_tokens.bf16_bits()).map_err(dev_err)?;
        let mut layers = Vec::with_capacity(w.layers.len());
        for l in &w.layers {
            let mixer = match &l.mixer {
                CkMixer::LinearAttn(g) => Mixer::Gdn {
                    qkv: up.mat(&g.in_proj_qkv)?,
                    z: up.mat(&g.in_proj_z)?,
                    b: up.mat(&g.in_proj_b)?,
                    a: up.mat(&g.in_proj_a)?,
                    taps: up.vector(&g.conv1d)?,
                    a_log: up.vector(&g.a_log)?,
                    dt_bias: up.vector(&g.dt_bias)?,
                    norm: up.vector(&g.norm)?,
                    out: up.mat(&g.out_proj)?,
                },
                CkMixer::SelfAttn(a) => Mixer::Attn {
                    q: up.mat(&a.q_proj)?,
                    k: up.mat(&a.k_proj)?,
                    v: up.mat(&a.v_proj)?,
                    q_norm: up.vector(&a.q_norm)?,
                    k_norm: up.vector(&a.k_norm)?,
                    o: up.mat(&a.o_proj)?,
                },
            };
            layers.push(Layer {
                in_norm: up.vector(&l.input_layernorm)?,
                mixer,
                post_norm: up.vector(&l.post_attention_layernorm)?,
                gate: up.mat(&l.mlp.gate_proj)?,
                up: up.mat(&l.mlp.up_proj)?,
                down: up.mat(&l.mlp.down_proj)?,
            });
        }
        let final_norm = up.vector(&w.norm)?;
        s.synchronize().map_err(dev_err)?;
        Ok(DeviceWeights {
            embed,
            layers,
            final_norm,
        })
    }
}
