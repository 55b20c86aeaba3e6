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

mod adapter;
mod attention;
pub mod backend;
pub mod config;
#[cfg(test)]
mod controls;
pub mod error;
/// The CPU kernels (the `kev-kernels` crate: a leaf that knows nothing of the model).
pub use kev_kernels as kernels;
mod forward;
mod gdn;
pub mod int8;
pub mod lora;
pub mod memory;
mod model;
mod pass;
pub mod pause;
pub mod reference;
mod scratch;
pub mod stages;
mod state;
pub mod synth;
pub mod weights;

pub use adapter::Adapter;
pub use backend::{Backend, CpuBackend};
pub use config::{LayerKind, Qwen35Config};
pub use error::EngineError;
pub use forward::PassOptions;
pub use int8::load::Int8Source;
pub use int8::plan::{ActivationRanges, Int8Plan, RULE_BF16_ISLANDS, SmoothScope};
pub use int8::stored::{INT8_FILE, INT8_FORMAT};
pub use kernels::{Arm, Kernels};
pub use memory::release_free_heap;
pub use model::{ActivationObserver, Backbone, LoadOptions, ProjectionKind, WeightArms};
pub use pass::BatchRow;
pub use pause::{Foreground, Lanes};
pub use stages::{Stage, StageTimes};
pub use state::State;
pub use weights::{Checkpoint, Weights};
