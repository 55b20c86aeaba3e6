//! Digests, release pins and the prepared directory's `manifest.json`.
//!
//! The Hub identifies a file by one of two digests: LFS files by the sha256 of their bytes, small
//! files by their git blob id (`sha1("blob <size>\0" + bytes)`). Pins record which kind each file has;
//! [`FileHashes`] computes both (and the size) in one streaming pass, so checking a pin and recording
//! the sha256 for the manifest cost one read of the file.

use crate::FileError;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

mod digest;
mod pins;

pub use digest::{DigestKind, DualHasher, FileHashes, HashingWriter, hub_digest_kind, sha256_hex};
use pins::collect_files;
pub use pins::{PinCheck, PinnedFile, ReleasePins, RepoPin, names_commit};

/// Errors from digests, pins and manifests.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// A file could not be read or written, or holds what it must not.
    #[error(transparent)]
    File(#[from] crate::FileError),
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

pub(crate) fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ManifestError + '_ {
    move |source| {
        FileError::Io {
            path: path.to_path_buf(),
            source,
        }
        .into()
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
        let mut text = serde_json::to_string_pretty(self).map_err(|e| FileError::Format {
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
            serde_json::from_str(&text).map_err(|e| FileError::Format {
                path: path.clone(),
                message: e.to_string(),
            })?;
        let found = value
            .get("format_version")
            .and_then(|v| v.as_u64())
            .ok_or_else(|| FileError::Format {
                path: path.clone(),
                message: "no format_version".into(),
            })?;
        if found != u64::from(MANIFEST_FORMAT_VERSION) {
            return Err(ManifestError::Version {
                path,
                found: u32::try_from(found).unwrap_or(u32::MAX),
            });
        }
        serde_json::from_value(value).map_err(|e| {
            FileError::Format {
                path,
                message: e.to_string(),
            }
            .into()
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
            let size = f.size.expect("every Kev-4B v1.0 file has its size pinned");
            assert_eq!(hub_digest_kind(&f.name, size), f.kind, "{}", f.name);
        }
    }

    #[test]
    fn pin_check_names_both_digests() {
        let pin = PinnedFile {
            name: "x".into(),
            size: Some(6),
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
    fn a_pin_without_a_size_is_held_by_its_digest_alone() {
        let hello = FileHashes::of_reader(&b"hello\n"[..], 6, |_| {}).unwrap();
        let pin = PinnedFile {
            name: "x".into(),
            size: None,
            kind: DigestKind::Sha256,
            digest: hello.sha256.clone(),
        };
        assert_eq!(pin.check(&hello), PinCheck::Ok);
        let longer = FileHashes::of_reader(&b"hello!\n"[..], 7, |_| {}).unwrap();
        assert!(matches!(pin.check(&longer), PinCheck::Digest { .. }));
        // absent from the JSON both ways; an old pins file with a size still reads
        let json = serde_json::to_string(&pin).unwrap();
        assert!(!json.contains("size"), "{json}");
        assert_eq!(serde_json::from_str::<PinnedFile>(&json).unwrap(), pin);
        let sized: PinnedFile =
            serde_json::from_str(r#"{"name": "x", "size": 6, "kind": "sha256", "digest": "00"}"#)
                .unwrap();
        assert_eq!(sized.size, Some(6));
    }

    #[test]
    fn revisions_are_named_in_full_or_by_an_abbreviation() {
        let p = ReleasePins::kev_4b_v1().base;
        assert!(p.names_revision("1001bb4d826a52d1f399e183466143f4da7b741b"));
        assert!(p.names_revision("1001BB4D826A52D1F399E183466143F4DA7B741B"));
        assert!(p.names_revision("1001bb4"));
        assert!(p.names_revision("1001bb4d"));
        for not in [
            "",
            "1001bb",
            "1001bb4e",
            "1001bb4d826a52d1f399e183466143f4da7b741b0",
            "main",
        ] {
            assert!(!p.names_revision(not), "{not}");
        }
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
