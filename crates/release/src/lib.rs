//! Release formats: what the Hub repositories of Kev and its Qwen3.5 base contain, read and written
//! without torch.
//!
//! - [`shards`]: a set of safetensors files (single file or sharded with `model.safetensors.index.json`),
//!   memory-mapped, tensor names resolved across the `model.language_model.` / `model.` / bare prefixes.
//! - [`adapter`]: PEFT `adapter_config.json` + `adapter_model.safetensors`, mapped onto base tensor names.
//! - [`merge`]: the LoRA merge `bf16(fp32(W) + (B @ A) · alpha/r)`, bit-exact with the author's merge.
//! - [`head`]: `head.pt` (torch zip + pickle) read without torch; `head.safetensors` + `kev_head.json`.
//! - [`manifest`]: digests (sha256, git blob sha1), pins, the prepared directory's `manifest.json`.
//! - [`published`]: the published releases by name (`kev-4b`, `kev-0.8b`) and the Kev-0.8B v1.0 pins.
//! - [`stream`]: safetensors read and written one tensor at a time (exports with bounded memory).
//! - [`pickle`]: the safe subset of Python's pickle that `torch.save` archives use.
#![deny(missing_docs)]

pub mod adapter;
mod file_error;
pub mod head;
pub mod manifest;
pub mod merge;
pub mod pickle;
pub mod published;
pub mod shards;
pub mod stream;

pub use file_error::FileError;

pub use adapter::{Adapter, AdapterConfig, AdapterError, LoraWeights};
pub use head::{Delimiters, HeadError, HeadMeta, HeadProvenance, KevHead, Linear, PreparedHead};
pub use manifest::{
    DigestKind, FileHashes, Manifest, ManifestError, PinnedFile, ReleasePins, RepoPin, verify,
};
pub use merge::{MergeError, RowMerge, merge_weight};
pub use published::Release;
pub use shards::{Dtype, ShardError, TensorStore, TensorView};
