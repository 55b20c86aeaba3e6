//! The two digests the Hub identifies files by, computed in one streaming pass.

use std::fs::File;
use std::io::{Read, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha1::Sha1;
use sha2::{Digest as _, Sha256};

use super::{ManifestError, io_err};

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
