//! Digests, release pins and the prepared directory's `manifest.json`.
//!
//! The Hub identifies a file by one of two digests: LFS files by the sha256 of their bytes, small
//! files by their git blob id (`sha1("blob <size>\0" + bytes)`). Pins record which kind each file has;
//! [`FileHashes`] computes both (and the size) in one streaming pass, so checking a pin and recording
//! the sha256 for the manifest cost one read of the file.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha1::Sha1;
use sha2::{Digest as _, Sha256};

/// Errors from digests, pins and manifests.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A JSON file could not be parsed or has the wrong shape.
    #[error("{path}: {message}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The manifest's format version is not one this build reads.
    #[error(
        "{path}: manifest format version {found} is not supported (this kev reads version {MANIFEST_FORMAT_VERSION})"
    )]
    Version {
        /// The manifest.
        path: PathBuf,
        /// The version found.
        found: u32,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ManifestError + '_ {
    move |source| ManifestError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// How the Hub identifies a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DigestKind {
    /// sha256 of the bytes (LFS files).
    Sha256,
    /// git blob id: `sha1("blob <size>\0" + bytes)` (files stored in git proper).
    GitSha1,
}

impl std::fmt::Display for DigestKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DigestKind::Sha256 => "sha256",
            DigestKind::GitSha1 => "git-sha1",
        })
    }
}

/// Size, sha256 and (when asked for) git blob sha1 of one file, computed in a single pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileHashes {
    /// Length in bytes.
    pub size: u64,
    /// Lower-case hex sha256.
    pub sha256: String,
    /// Lower-case hex git blob id, when computed.
    pub git_sha1: Option<String>,
}

impl FileHashes {
    /// The digest of the given kind, if computed.
    pub fn get(&self, kind: DigestKind) -> Option<&str> {
        match kind {
            DigestKind::Sha256 => Some(&self.sha256),
            DigestKind::GitSha1 => self.git_sha1.as_deref(),
        }
    }

    /// Both digests of a file, streamed (1 MiB reads; memory does not grow with the file).
    pub fn of_file(path: &Path) -> Result<Self, ManifestError> {
        Self::of_file_with(path, true, |_| {})
    }

    /// Hash a file: sha256 always, the git blob id only when `git` (it costs as much again), calling
    /// `progress(bytes)` after every read.
    pub fn of_file_with(
        path: &Path,
        git: bool,
        progress: impl FnMut(u64),
    ) -> Result<Self, ManifestError> {
        let file = File::open(path).map_err(io_err(path))?;
        let size = file.metadata().map_err(io_err(path))?.len();
        Self::of_reader_with(file, size, git, progress).map_err(io_err(path))
    }

    /// Both digests of exactly `size` bytes from a reader; fails if it yields more or fewer.
    pub fn of_reader(
        reader: impl Read,
        size: u64,
        progress: impl FnMut(u64),
    ) -> std::io::Result<Self> {
        Self::of_reader_with(reader, size, true, progress)
    }

    /// As [`FileHashes::of_reader`], the git blob id only when `git`.
    pub fn of_reader_with(
        mut reader: impl Read,
        size: u64,
        git: bool,
        mut progress: impl FnMut(u64),
    ) -> std::io::Result<Self> {
        let mut hasher = if git {
            DualHasher::new(size)
        } else {
            DualHasher::sha256_only(size)
        };
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = reader.read(&mut buf)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            progress(n as u64);
        }
        hasher.finish()
    }
}

/// Streaming sha256 (+ git blob sha1) of a byte stream whose length is known in advance (the git blob
/// header carries the length, so it must be known before the first byte).
pub struct DualHasher {
    expected: u64,
    seen: u64,
    sha256: Sha256,
    sha1: Option<Sha1>,
}

impl DualHasher {
    /// A hasher of both digests for a stream of exactly `size` bytes.
    pub fn new(size: u64) -> Self {
        let mut sha1 = Sha1::new();
        sha1.update(format!("blob {size}\0").as_bytes());
        DualHasher {
            expected: size,
            seen: 0,
            sha256: Sha256::new(),
            sha1: Some(sha1),
        }
    }

    /// A hasher of the sha256 only.
    pub fn sha256_only(size: u64) -> Self {
        DualHasher {
            expected: size,
            seen: 0,
            sha256: Sha256::new(),
            sha1: None,
        }
    }

    /// Feed bytes.
    pub fn update(&mut self, bytes: &[u8]) {
        self.seen += bytes.len() as u64;
        self.sha256.update(bytes);
        if let Some(s) = &mut self.sha1 {
            s.update(bytes);
        }
    }

    /// The digests; an error if the stream length differs from the announced size.
    pub fn finish(self) -> std::io::Result<FileHashes> {
        if self.seen != self.expected {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("stream was {} bytes, expected {}", self.seen, self.expected),
            ));
        }
        Ok(FileHashes {
            size: self.seen,
            sha256: hex::encode(self.sha256.finalize()),
            git_sha1: self.sha1.map(|s| hex::encode(s.finalize())),
        })
    }
}

/// A writer that passes bytes through and computes their sha256 and length.
pub struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
    written: u64,
}

impl<W: Write> HashingWriter<W> {
    /// Wrap a writer.
    pub fn new(inner: W) -> Self {
        HashingWriter {
            inner,
            hasher: Sha256::new(),
            written: 0,
        }
    }

    /// Bytes written so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// The inner writer, the byte count and the hex sha256 of everything written.
    pub fn finish(self) -> (W, u64, String) {
        (
            self.inner,
            self.written,
            hex::encode(self.hasher.finalize()),
        )
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// sha256 of a byte slice, lower-case hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The digest kind the Hub uses for a file: LFS (sha256) for binary weight formats and anything of
/// 10 MiB or more, git (blob sha1) otherwise. Matches the published pins of Kev-4B v1.0.
pub fn hub_digest_kind(name: &str, size: u64) -> DigestKind {
    const LFS_EXT: [&str; 6] = [".safetensors", ".pt", ".bin", ".pth", ".gguf", ".onnx"];
    if size >= 10 << 20 || LFS_EXT.iter().any(|e| name.ends_with(e)) {
        DigestKind::Sha256
    } else {
        DigestKind::GitSha1
    }
}

/// One pinned file of a repository.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PinnedFile {
    /// Path inside the repository.
    pub name: String,
    /// Exact length in bytes.
    pub size: u64,
    /// Which digest the Hub records for it.
    pub kind: DigestKind,
    /// Lower-case hex digest of that kind.
    pub digest: String,
}

/// One repository at one commit, with its files.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepoPin {
    /// `owner/name` on the Hub.
    pub repo: String,
    /// Full 40-hex commit id.
    pub revision: String,
    /// Every file of the repository at that commit.
    pub files: Vec<PinnedFile>,
}

impl RepoPin {
    /// The pin of one file, by path.
    pub fn file(&self, name: &str) -> Option<&PinnedFile> {
        self.files.iter().find(|f| f.name == name)
    }

    /// Pins computed from a local directory's files (all regular files, recursively; names use `/`).
    /// Used to pin a release that is at hand, e.g. a pristine copy in a test.
    pub fn from_dir(repo: &str, revision: &str, dir: &Path) -> Result<Self, ManifestError> {
        let mut names = Vec::new();
        collect_files(dir, dir, &mut names)?;
        names.sort();
        let mut files = Vec::with_capacity(names.len());
        for name in names {
            let h = FileHashes::of_file(&dir.join(&name))?;
            let kind = hub_digest_kind(&name, h.size);
            files.push(PinnedFile {
                digest: h.get(kind).unwrap_or_default().to_string(),
                name,
                size: h.size,
                kind,
            });
        }
        Ok(RepoPin {
            repo: repo.to_string(),
            revision: revision.to_string(),
            files,
        })
    }
}

fn collect_files(root: &Path, dir: &Path, out: &mut Vec<String>) -> Result<(), ManifestError> {
    for entry in std::fs::read_dir(dir).map_err(io_err(dir))? {
        let entry = entry.map_err(io_err(dir))?;
        let path = entry.path();
        // Follow symlinks: the Hub cache and the fixtures both use them for file contents.
        let meta = std::fs::metadata(&path).map_err(io_err(&path))?;
        if meta.is_dir() {
            collect_files(root, &path, out)?;
        } else if meta.is_file() {
            let rel = path.strip_prefix(root).unwrap_or(&path);
            let name: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            out.push(name.join("/"));
        }
    }
    Ok(())
}

/// The pins of one Kev release: the Kev repository and its base.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleasePins {
    /// A label for messages, e.g. `Kev-4B v1.0`.
    pub name: String,
    /// The Kev repository (adapter, head, tokenizer).
    pub kev: RepoPin,
    /// The Qwen3.5 base repository.
    pub base: RepoPin,
    /// What these pins leave unverified (files without a public digest, digest kinds not checked), one
    /// statement each; prepared directories record them in their manifest. Empty for Kev-4B v1.0.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unverified: Vec<String>,
}

impl ReleasePins {
    /// Read pins from a JSON file (the shape [`ReleasePins::to_json`] writes).
    pub fn from_json_file(path: &Path) -> Result<Self, ManifestError> {
        let text = std::fs::read_to_string(path).map_err(io_err(path))?;
        let pins: ReleasePins = serde_json::from_str(&text).map_err(|e| ManifestError::Format {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        for repo in [&pins.kev, &pins.base] {
            for f in &repo.files {
                let want = match f.kind {
                    DigestKind::Sha256 => 64,
                    DigestKind::GitSha1 => 40,
                };
                if f.digest.len() != want || !f.digest.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(ManifestError::Format {
                        path: path.to_path_buf(),
                        message: format!(
                            "{}:{}: {} digest must be {want} hex digits",
                            repo.repo, f.name, f.kind
                        ),
                    });
                }
            }
        }
        Ok(pins)
    }

    /// Pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// The published Kev-4B v1.0 release (`release-pins.md`): `jaredpalmer/kev-4b@6cfce5c2…` on
    /// `Qwen/Qwen3.5-4B-Base@1001bb4d…`, every file with its size and Hub digest.
    pub fn kev_4b_v1() -> Self {
        use DigestKind::{GitSha1 as G, Sha256 as S};
        fn files(list: &[(&str, u64, DigestKind, &str)]) -> Vec<PinnedFile> {
            list.iter()
                .map(|&(name, size, kind, digest)| PinnedFile {
                    name: name.to_string(),
                    size,
                    kind,
                    digest: digest.to_string(),
                })
                .collect()
        }
        ReleasePins {
            name: "Kev-4B v1.0".to_string(),
            kev: RepoPin {
                repo: "jaredpalmer/kev-4b".to_string(),
                revision: "6cfce5c2fa4b4bd64026336ab649c5ca78857d52".to_string(),
                files: files(&[
                    (
                        "README.md",
                        24_981,
                        G,
                        "20ab650c92dbec5f963efaa32cb6c2979f4c39cb",
                    ),
                    (
                        "adapter_config.json",
                        1_271,
                        G,
                        "ea5c33529f3e0e9521f52b42485d44a23d333ba7",
                    ),
                    (
                        "adapter_model.safetensors",
                        129_924_032,
                        S,
                        "90e817356246e7f18bfa7ca3d31794cd4fbeb3332a66a84cb51d9ceae925f2b2",
                    ),
                    (
                        "added_tokens.json",
                        707,
                        G,
                        "b54f9135e44c1e81047e8d05cb027af8bc039eed",
                    ),
                    (
                        "head.pt",
                        5_249_791,
                        S,
                        "dd633435998ecc751ac538717a3742e32149500fabf7d7276287dbf0693f347c",
                    ),
                    (
                        "merges.txt",
                        1_671_853,
                        G,
                        "31349551d90c7606f325fe0f11bbb8bd5fa0d7c7",
                    ),
                    (
                        "provenance.json",
                        4_265,
                        G,
                        "5c34f812efe4ad2983c4db3fe3c50f243ed420f1",
                    ),
                    (
                        "result.json",
                        80_553,
                        G,
                        "1a18548b8d47bd0260021fdd7c30237c17f27bb1",
                    ),
                    (
                        "special_tokens_map.json",
                        616,
                        G,
                        "17305b3603dfb19ccc0f658ec2cd2cd3adff4a58",
                    ),
                    (
                        "tokenizer.json",
                        19_989_325,
                        S,
                        "06b9509352d2af50381ab2247e083b80d32d5c0aba91c272ca9ff729b6a0e523",
                    ),
                    (
                        "tokenizer_config.json",
                        1_128,
                        G,
                        "fa833096a2f03c2ff89094eb1ba7716fbd98b102",
                    ),
                    (
                        "training_config.json",
                        1_845,
                        G,
                        "2abc7a274e9ba1cb7290bc51ff20a6df4dbb4886",
                    ),
                    (
                        "training_metrics.json",
                        324,
                        G,
                        "8f551b88fa7f46a5201d7b0d4d281ffcec6940d8",
                    ),
                    (
                        "vocab.json",
                        2_776_833,
                        G,
                        "4783fe10ac3adce15ac8f358ef5462739852c569",
                    ),
                ]),
            },
            base: RepoPin {
                repo: "Qwen/Qwen3.5-4B-Base".to_string(),
                revision: "1001bb4d826a52d1f399e183466143f4da7b741b".to_string(),
                files: files(&[
                    (
                        "LICENSE",
                        11_343,
                        G,
                        "1d5180a42f1c3383ba7c7bd0a50f0837ef0168df",
                    ),
                    (
                        "README.md",
                        3_722,
                        G,
                        "f66751fce75ca423e0993107b38d4c5408f677fb",
                    ),
                    (
                        "config.json",
                        3_161,
                        G,
                        "557d961b205319c6a7da5f757f565b69b3967b7d",
                    ),
                    (
                        "merges.txt",
                        3_353_259,
                        G,
                        "a494e019ca1502219fd0128658b979e5f05ae8e8",
                    ),
                    (
                        "model.safetensors-00001-of-00002.safetensors",
                        5_329_398_712,
                        S,
                        "df547074dce70532a0493e5433152bd17a65efb89088cfabc2e7e2371a93d712",
                    ),
                    (
                        "model.safetensors-00002-of-00002.safetensors",
                        3_990_429_344,
                        S,
                        "590fbaac095dd31db886c322d9d2f7df47777966391acf306ddddc3e4e3a15ef",
                    ),
                    (
                        "model.safetensors.index.json",
                        76_196,
                        G,
                        "7586335c0c85f13864338166a651bc2afbf49849",
                    ),
                    (
                        "preprocessor_config.json",
                        390,
                        G,
                        "2ea84a437d448ff71b08df68fdd949d5cc4ebb64",
                    ),
                    (
                        "tokenizer.json",
                        12_807_196,
                        S,
                        "fe000e3ed39ed12b8d2481d527d44f93c65d37e87645d2dcc80d1bf9d50d2927",
                    ),
                    (
                        "tokenizer_config.json",
                        16_713,
                        G,
                        "ae8d254e44c51d0cb0907bcb221f18efca829d3e",
                    ),
                    (
                        "video_preprocessor_config.json",
                        386,
                        G,
                        "37900b3ff9295e1aa7e211378466356b52e64e55",
                    ),
                    (
                        "vocab.json",
                        6_722_759,
                        G,
                        "0aa0ce0658d60ac4a5d609f4eadb0e8e43514176",
                    ),
                ]),
            },
            unverified: Vec::new(),
        }
    }
}

/// Outcome of checking one file against its pin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PinCheck {
    /// Size and digest agree.
    Ok,
    /// The size differs.
    Size {
        /// Pinned size.
        expected: u64,
        /// Actual size.
        found: u64,
    },
    /// The digest differs.
    Digest {
        /// Digest kind compared.
        kind: DigestKind,
        /// Pinned digest.
        expected: String,
        /// Actual digest.
        found: String,
    },
}

impl PinnedFile {
    /// Compare computed hashes with this pin.
    pub fn check(&self, h: &FileHashes) -> PinCheck {
        if h.size != self.size {
            return PinCheck::Size {
                expected: self.size,
                found: h.size,
            };
        }
        let found = h.get(self.kind).unwrap_or("(not computed)");
        if !found.eq_ignore_ascii_case(&self.digest) {
            return PinCheck::Digest {
                kind: self.kind,
                expected: self.digest.to_ascii_lowercase(),
                found: found.to_string(),
            };
        }
        PinCheck::Ok
    }
}

/// Version of the `manifest.json` layout written by this build.
pub const MANIFEST_FORMAT_VERSION: u32 = 1;

/// File name of the manifest inside a prepared directory.
pub const MANIFEST_FILE: &str = "manifest.json";

/// Where one input came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceRecord {
    /// `kev` or `base`.
    pub role: String,
    /// Hub repository, when fetched from the Hub or pinned.
    pub repo: Option<String>,
    /// Revision as asked for (tag, branch or commit).
    pub revision: Option<String>,
    /// The commit the files came from, when known.
    pub commit: Option<String>,
    /// Local directory, when read from disk.
    pub local_dir: Option<String>,
    /// Whether every file used was checked against a pin.
    pub pinned: bool,
}

/// One file and its digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRecord {
    /// `kev` / `base` for inputs; absent for outputs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// Path (inputs: inside their repository; outputs: inside the prepared directory).
    pub name: String,
    /// Length in bytes.
    pub size: u64,
    /// Lower-case hex sha256.
    pub sha256: String,
}

/// What the merge did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MergeRecord {
    /// LoRA rank.
    pub r: u64,
    /// LoRA alpha, as in `adapter_config.json`.
    pub lora_alpha: f64,
    /// `lora_alpha / r` as the fp32 factor applied.
    pub scale: f32,
    /// Modules merged (248 for Kev-4B).
    pub merged_modules: usize,
    /// Tensors copied bit for bit.
    pub copied_tensors: usize,
    /// Tensors left out of the export, by name.
    pub dropped_tensors: Vec<String>,
}

/// The prepared directory's `manifest.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// [`MANIFEST_FORMAT_VERSION`].
    pub format_version: u32,
    /// `kev <version>`.
    pub tool: String,
    /// Label of the pins used, if any (e.g. `Kev-4B v1.0`).
    pub pins: Option<String>,
    /// Where the inputs came from.
    pub sources: Vec<SourceRecord>,
    /// Every input file read.
    pub inputs: Vec<FileRecord>,
    /// Every file of the prepared directory except the manifest itself.
    pub outputs: Vec<FileRecord>,
    /// The merge.
    pub merge: MergeRecord,
    /// Free-form notes (warnings raised while preparing, options).
    #[serde(default)]
    pub notes: BTreeMap<String, String>,
}

impl Manifest {
    /// Write `manifest.json` into `dir`.
    pub fn write(&self, dir: &Path) -> Result<(), ManifestError> {
        let path = dir.join(MANIFEST_FILE);
        let mut text = serde_json::to_string_pretty(self).map_err(|e| ManifestError::Format {
            path: path.clone(),
            message: e.to_string(),
        })?;
        text.push('\n');
        std::fs::write(&path, text).map_err(io_err(&path))
    }

    /// Read `manifest.json` from `dir`.
    pub fn read(dir: &Path) -> Result<Self, ManifestError> {
        let path = dir.join(MANIFEST_FILE);
        let text = std::fs::read_to_string(&path).map_err(io_err(&path))?;
        let value: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| ManifestError::Format {
                path: path.clone(),
                message: e.to_string(),
            })?;
        let found = value
            .get("format_version")
            .and_then(|v| v.as_u64())
            .ok_or_else(|| ManifestError::Format {
                path: path.clone(),
                message: "no format_version".into(),
            })?;
        if found != u64::from(MANIFEST_FORMAT_VERSION) {
            return Err(ManifestError::Version {
                path,
                found: u32::try_from(found).unwrap_or(u32::MAX),
            });
        }
        serde_json::from_value(value).map_err(|e| ManifestError::Format {
            path,
            message: e.to_string(),
        })
    }
}

/// One problem found by [`verify`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VerifyProblem {
    /// A recorded file is gone.
    Missing {
        /// File name.
        name: String,
    },
    /// A recorded file has another size.
    Size {
        /// File name.
        name: String,
        /// Recorded.
        expected: u64,
        /// Found.
        found: u64,
    },
    /// A recorded file has another sha256.
    Digest {
        /// File name.
        name: String,
        /// Recorded.
        expected: String,
        /// Found.
        found: String,
    },
    /// A file in the directory that the manifest does not list.
    Unlisted {
        /// File name.
        name: String,
    },
}

impl std::fmt::Display for VerifyProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            VerifyProblem::Missing { name } => write!(f, "{name}: missing"),
            VerifyProblem::Size {
                name,
                expected,
                found,
            } => write!(f, "{name}: size {found} bytes, manifest says {expected}"),
            VerifyProblem::Digest {
                name,
                expected,
                found,
            } => write!(f, "{name}: sha256 {found}, manifest says {expected}"),
            VerifyProblem::Unlisted { name } => write!(f, "{name}: not listed in the manifest"),
        }
    }
}

/// Result of re-hashing a prepared directory.
#[derive(Debug, Clone)]
pub struct VerifyReport {
    /// The manifest that was checked against.
    pub manifest: Manifest,
    /// Files that matched.
    pub ok: Vec<String>,
    /// Everything that did not.
    pub problems: Vec<VerifyProblem>,
}

impl VerifyReport {
    /// True when every listed file matched and nothing unlisted is present.
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Re-hash every output file of a prepared directory against its manifest. Files present in the
/// directory but not listed are reported too (a prepared directory should hold nothing else).
pub fn verify(dir: &Path) -> Result<VerifyReport, ManifestError> {
    verify_with(dir, |_, _| {})
}

/// As [`verify`], calling `progress(file, bytes)` while hashing.
pub fn verify_with(
    dir: &Path,
    mut progress: impl FnMut(&str, u64),
) -> Result<VerifyReport, ManifestError> {
    let manifest = Manifest::read(dir)?;
    let mut ok = Vec::new();
    let mut problems = Vec::new();
    for rec in &manifest.outputs {
        let path = dir.join(&rec.name);
        if !path.is_file() {
            problems.push(VerifyProblem::Missing {
                name: rec.name.clone(),
            });
            continue;
        }
        let h = FileHashes::of_file_with(&path, false, |n| progress(&rec.name, n))?;
        if h.size != rec.size {
            problems.push(VerifyProblem::Size {
                name: rec.name.clone(),
                expected: rec.size,
                found: h.size,
            });
        } else if !h.sha256.eq_ignore_ascii_case(&rec.sha256) {
            problems.push(VerifyProblem::Digest {
                name: rec.name.clone(),
                expected: rec.sha256.clone(),
                found: h.sha256,
            });
        } else {
            ok.push(rec.name.clone());
        }
    }
    let mut present = Vec::new();
    collect_files(dir, dir, &mut present)?;
    present.sort();
    for name in present {
        if name != MANIFEST_FILE && !manifest.outputs.iter().any(|r| r.name == name) {
            problems.push(VerifyProblem::Unlisted { name });
        }
    }
    Ok(VerifyReport {
        manifest,
        ok,
        problems,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn git_blob_sha1_matches_git() {
        // `printf 'hello\n' | git hash-object --stdin`
        let h = FileHashes::of_reader(&b"hello\n"[..], 6, |_| {}).unwrap();
        assert_eq!(
            h.git_sha1.as_deref(),
            Some("ce013625030ba8dba906f756967f9e9ca394464a")
        );
        assert_eq!(
            h.sha256,
            "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03"
        );
        // The empty blob is a well-known constant.
        let e = FileHashes::of_reader(&b""[..], 0, |_| {}).unwrap();
        assert_eq!(
            e.git_sha1.as_deref(),
            Some("e69de29bb2d1d6434b8b29ae775ad8c2e48c5391")
        );
        let only = FileHashes::of_reader_with(&b"hello\n"[..], 6, false, |_| {}).unwrap();
        assert_eq!((only.sha256, only.git_sha1), (h.sha256.clone(), None));
    }

    #[test]
    fn short_stream_is_an_error() {
        assert!(FileHashes::of_reader(&b"abc"[..], 4, |_| {}).is_err());
    }

    #[test]
    fn builtin_pins_are_well_formed() {
        let p = ReleasePins::kev_4b_v1();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pins.json");
        std::fs::write(&path, p.to_json()).unwrap();
        let back = ReleasePins::from_json_file(&path).unwrap();
        assert_eq!(back, p);
        assert_eq!(p.kev.files.len(), 14);
        assert_eq!(p.base.files.len(), 12);
        // Every pinned kind agrees with the Hub's LFS rule, so pins computed from a directory of the
        // real release would have the same kinds.
        for f in p.kev.files.iter().chain(&p.base.files) {
            assert_eq!(hub_digest_kind(&f.name, f.size), f.kind, "{}", f.name);
        }
    }

    #[test]
    fn pin_check_names_both_digests() {
        let pin = PinnedFile {
            name: "x".into(),
            size: 6,
            kind: DigestKind::GitSha1,
            digest: "ce013625030ba8dba906f756967f9e9ca394464a".into(),
        };
        let good = FileHashes::of_reader(&b"hello\n"[..], 6, |_| {}).unwrap();
        assert_eq!(pin.check(&good), PinCheck::Ok);
        let bad = FileHashes::of_reader(&b"hellO\n"[..], 6, |_| {}).unwrap();
        match pin.check(&bad) {
            PinCheck::Digest {
                expected, found, ..
            } => {
                assert_eq!(expected, pin.digest);
                assert_eq!(Some(found.as_str()), bad.git_sha1.as_deref());
            }
            other => panic!("{other:?}"),
        }
        let short = FileHashes::of_reader(&b"hell\n"[..], 5, |_| {}).unwrap();
        assert_eq!(
            pin.check(&short),
            PinCheck::Size {
                expected: 6,
                found: 5
            }
        );
    }

    #[test]
    fn verify_finds_flips_missing_and_unlisted() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("a.bin"), b"alpha").unwrap();
        std::fs::write(d.join("b.bin"), b"beta").unwrap();
        let rec = |n: &str| {
            let h = FileHashes::of_file(&d.join(n)).unwrap();
            FileRecord {
                role: None,
                name: n.into(),
                size: h.size,
                sha256: h.sha256,
            }
        };
        let m = Manifest {
            format_version: MANIFEST_FORMAT_VERSION,
            tool: "kev test".into(),
            pins: None,
            sources: vec![],
            inputs: vec![],
            outputs: vec![rec("a.bin"), rec("b.bin")],
            merge: MergeRecord {
                r: 16,
                lora_alpha: 32.0,
                scale: 2.0,
                merged_modules: 0,
                copied_tensors: 0,
                dropped_tensors: vec![],
            },
            notes: BTreeMap::new(),
        };
        m.write(d).unwrap();
        assert_eq!(Manifest::read(d).unwrap(), m);
        let r = verify(d).unwrap();
        assert!(r.is_ok(), "{:?}", r.problems);
        assert_eq!(r.ok.len(), 2);

        std::fs::write(d.join("a.bin"), b"alphA").unwrap();
        std::fs::remove_file(d.join("b.bin")).unwrap();
        std::fs::write(d.join("c.bin"), b"extra").unwrap();
        let r = verify(d).unwrap();
        assert_eq!(r.problems.len(), 3, "{:?}", r.problems);
        assert!(matches!(&r.problems[0], VerifyProblem::Digest { name, .. } if name == "a.bin"));
        assert!(matches!(&r.problems[1], VerifyProblem::Missing { name } if name == "b.bin"));
        assert!(matches!(&r.problems[2], VerifyProblem::Unlisted { name } if name == "c.bin"));
    }
}
