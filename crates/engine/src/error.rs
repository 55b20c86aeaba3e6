//! The engine's error type: every failure names what it is about (a config field, a tensor, an input).

use std::path::PathBuf;

/// Errors from loading a model or running it.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// `config.json` asks for something this engine does not implement, or lacks a field it needs.
    #[error("config.json: field `{field}`: {reason}")]
    Config {
        /// Dotted field name as it appears in the file (`text_config.hidden_act`).
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A file could not be parsed.
    #[error("{path}: {reason}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The safetensors store could not be opened or read.
    #[error(transparent)]
    Shard(#[from] kev_release::shards::ShardError),
    /// A tensor the model needs is absent, or present with the wrong dtype or shape.
    #[error("tensor {name}: {reason}")]
    Tensor {
        /// Full stored name.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The checkpoint holds a tensor the model does not use and that is not on the ignore list.
    #[error("tensor {0} is not part of the configured model (unexpected tensor)")]
    UnexpectedTensor(String),
    /// The LoRA adapter is malformed or uses a feature this engine does not implement.
    #[error("adapter: {0}")]
    Adapter(String),
    /// A forward call was given inputs it cannot run (bad token id, wanted index, state from another model).
    #[error("invalid input: {0}")]
    Input(String),
    /// A forward asked for a compute arm the model's weights were not built for (a float model runs the
    /// fp32 and bf16 arms, an int8 model the int8 arm).
    #[error("{0}")]
    Arm(String),
    /// The compute device failed (a GPU backend's driver, memory or kernel error): not the input's fault.
    #[error("compute device: {0}")]
    Device(String),
    /// The int8 arm's weights could not be built as asked (calibration that does not fit the model,
    /// or quantisation after the first int8 call).
    #[error("int8: {0}")]
    Int8(String),
}

impl EngineError {
    pub(crate) fn config(field: impl Into<String>, reason: impl Into<String>) -> Self {
        EngineError::Config {
            field: field.into(),
            reason: reason.into(),
        }
    }

    pub(crate) fn tensor(name: impl Into<String>, reason: impl Into<String>) -> Self {
        EngineError::Tensor {
            name: name.into(),
            reason: reason.into(),
        }
    }
}
