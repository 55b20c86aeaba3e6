//! The errors of `kev prepare`: each names the file, tensor or pin it is about and how to proceed.

use std::path::{Path, PathBuf};

use crate::hub::HubError;

/// Errors of `kev prepare`.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    /// A source argument is malformed.
    #[error("{0}")]
    Usage(String),
    /// Downloading failed.
    #[error(transparent)]
    Hub(#[from] HubError),
    /// A file does not match its pin.
    #[error(
        "{} ({}@{}) does not match {}:\n  {}\n  file: {}\n  {}",
        .0.file, .0.repo, .0.revision, .0.against, .0.what, .0.path.display(), .0.hint
    )]
    PinMismatch(Box<PinMismatch>),
    /// A needed file is not among the pins of a pinned source.
    #[error(
        "{file} is not pinned for {repo}@{revision}; a pinned release must pin every file the engine uses"
    )]
    NotPinned {
        /// Repository.
        repo: String,
        /// Revision.
        revision: String,
        /// File.
        file: String,
    },
    /// A needed file is missing from a local source.
    #[error("{path}: missing ({role} release file)")]
    MissingFile {
        /// Which source.
        role: &'static str,
        /// Expected path.
        path: PathBuf,
    },
    /// `head.pt` names another base (or revision) than the one being merged.
    #[error(
        "head.pt was trained on {found_base}@{found_revision}, but the base given is {expected_base}@{expected_revision}; use the base the head names"
    )]
    HeadBase {
        /// Base named by head.pt.
        found_base: String,
        /// Revision named by head.pt.
        found_revision: String,
        /// Base being merged.
        expected_base: String,
        /// Its revision.
        expected_revision: String,
    },
    /// `head.pt` and the adapter disagree.
    #[error(
        "head.pt says LoRA rank {head}, adapter_config.json says r = {adapter}: they are not from the same release"
    )]
    HeadAdapter {
        /// Rank in head.pt.
        head: u64,
        /// Rank in the adapter.
        adapter: u64,
    },
    /// `head.pt` reads another hidden size than the base has.
    #[error("head.pt reads hidden states of width {head}, but the base's hidden_size is {base}")]
    HeadWidth {
        /// The head's input width.
        head: usize,
        /// The base's hidden size.
        base: u64,
    },
    /// The output directory exists and is not empty.
    #[error("{0}: exists and is not empty; choose a new --out or remove it")]
    OutputExists(PathBuf),
    /// Release formats.
    #[error(transparent)]
    Adapter(#[from] kev_release::AdapterError),
    /// Release formats.
    #[error(transparent)]
    Head(#[from] kev_release::HeadError),
    /// Release formats.
    #[error(transparent)]
    Manifest(#[from] kev_release::ManifestError),
    /// Release formats.
    #[error(transparent)]
    Shards(#[from] kev_release::ShardError),
    /// Release formats.
    #[error(transparent)]
    Stream(#[from] kev_release::stream::StreamError),
    /// Release formats.
    #[error(transparent)]
    Merge(#[from] kev_release::MergeError),
    /// A JSON input is malformed.
    #[error("{path}: {message}")]
    Json {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// File system trouble.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A broken invariant (a bug).
    #[error("internal error: {0}")]
    Internal(String),
}

/// Details of [`PrepareError::PinMismatch`].
#[derive(Debug)]
pub struct PinMismatch {
    /// Repository of the pin.
    pub repo: String,
    /// Pinned revision.
    pub revision: String,
    /// File name inside the repository.
    pub file: String,
    /// What it was checked against (`the pinned release`, `the Hub's id for it`).
    pub against: &'static str,
    /// Where the file was read.
    pub path: PathBuf,
    /// Sizes and both digests.
    pub what: String,
    /// How to proceed.
    pub hint: String,
}

pub(crate) fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> PrepareError + '_ {
    move |source| PrepareError::Io {
        path: path.to_path_buf(),
        source,
    }
}
