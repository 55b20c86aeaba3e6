//! Release pins: per repository, the revision and every file's size and digest, and checking files
//! against them.

use crate::FileError;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::digest::{DigestKind, FileHashes, hub_digest_kind};
use super::{ManifestError, io_err};

/// One pinned file of a repository.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PinnedFile {
    /// Path inside the repository.
    pub name: String,
    /// Exact length in bytes; `None` where no public record gives it (the digest alone then binds the
    /// bytes: a sha256 pin fixes the length too, and [`ReleasePins::unverified`] says the size was not
    /// found).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
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

    /// Whether `rev` names this pin's commit ([`names_commit`]).
    pub fn names_revision(&self, rev: &str) -> bool {
        names_commit(rev, &self.revision)
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
                size: Some(h.size),
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

/// Whether `named` names the commit `commit`: the full id, or an abbreviation of at least 7 hex digits (a
/// model card's `68c46c4b`), ignoring case. A head that records its base revision abbreviated still names
/// exactly one commit of the base's history for every practical purpose; an empty or shorter string names
/// nothing.
pub fn names_commit(named: &str, commit: &str) -> bool {
    let named = named.trim();
    named.len() >= 7
        && named.len() <= commit.len()
        && named.bytes().all(|b| b.is_ascii_hexdigit())
        && commit[..named.len()].eq_ignore_ascii_case(named)
}

pub(super) fn collect_files(
    root: &Path,
    dir: &Path,
    out: &mut Vec<String>,
) -> Result<(), ManifestError> {
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
        let pins: ReleasePins = serde_json::from_str(&text).map_err(|e| FileError::Format {
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
                    return Err(FileError::Format {
                        path: path.to_path_buf(),
                        message: format!(
                            "{}:{}: {} digest must be {want} hex digits",
                            repo.repo, f.name, f.kind
                        ),
                    }
                    .into());
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
    // shape: table (the pinned files, one line each)
    pub fn kev_4b_v1() -> Self {
        use DigestKind::{GitSha1 as G, Sha256 as S};
        fn files(list: &[(&str, u64, DigestKind, &str)]) -> Vec<PinnedFile> {
            list.iter()
                .map(|&(name, size, kind, digest)| PinnedFile {
                    name: name.to_string(),
                    size: Some(size),
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
        if let Some(size) = self.size
            && h.size != size
        {
            return PinCheck::Size {
                expected: size,
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
