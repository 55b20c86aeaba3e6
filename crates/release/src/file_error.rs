//! The one error every reader and writer of release files gives for its file: it could not be read or
//! written, or its contents are not what they must be. Each layer's error wraps it
//! (`#[error(transparent)] File(#[from] FileError)`), so the wording is the same everywhere.

use std::path::PathBuf;

/// A file that could not be read or written, or whose contents are wrong.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The file could not be parsed, or does not hold what it must.
    #[error("{path}: {message}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}
