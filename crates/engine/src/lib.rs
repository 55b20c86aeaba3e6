//! kev-engine: the Qwen3.5 hybrid text backbone (Gated DeltaNet + gated attention) on CPU, exact and fast.
//!
//! - [`weights::Weights`] reads a checkpoint once (composite or plain `config.json`, sharded safetensors,
//!   any of the three name prefixes, BF16 or F32 per tensor, optionally a PEFT LoRA) into a tree named like
//!   the checkpoint; every backend builds from it.
//! - [`Backbone::load`] packs that tree into the GEMM's panel layout, the LoRA kept unmerged (the `exact`
//!   weight form) or merged at load.
//! - [`Backbone::forward`] / [`Backbone::forward_batch`] run rows from [`State`]s and return the fp32
//!   final-norm hidden states at the wanted positions; a [`State`] clone is a cheap snapshot to branch from.
//! - Two compute arms ([`Arm`]): `fp32` (exact f32 arithmetic on BF16 weights) and `bf16` (BF16 dot
//!   products with f32 accumulation).
//! - [`reference::Reference`] is the plain per-token implementation the fast path is tested against; it
//!   reads the same tree.
//! - [`backend::Backend`] is the boundary every device implements (the CUDA one lives in `kev-cuda`);
//!   [`backend::CpuBackend`] is this one.
//! - [`synth`] writes random-weight checkpoints and adapters in the published layout (the real 4B and 0.8B shapes
//!   for `kev synth`, tiny ones for tests).
#![deny(missing_docs)]

mod attention;
pub mod backend;
pub mod background;
pub mod calibrate;
pub mod config;
#[cfg(test)]
mod controls;
pub mod error;
mod forward;
mod gdn;
mod int8_file;
mod int8_load;
pub mod kernels;
pub mod lora;
pub mod memory;
mod model;
pub mod reference;
mod scratch;
pub mod stages;
mod state;
pub mod synth;
pub mod weights;

pub use backend::{Backend, CpuBackend};
pub use calibrate::{ActivationRanges, Int8Plan, SmoothScope};
pub use config::{LayerKind, Qwen35Config};
pub use error::EngineError;
pub use forward::BatchRow;
pub use int8_file::{INT8_FILE, INT8_FORMAT};
pub use int8_load::Int8Source;
pub use kernels::{Arm, Kernels};
pub use memory::release_free_heap;
pub use model::{ActivationObserver, Backbone, LoadOptions, ProjectionKind};
pub use stages::{Stage, StageTimes};
pub use state::State;
pub use weights::{Checkpoint, Weights};
