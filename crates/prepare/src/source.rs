//! Where the release's files come from and what they are checked against: a source (Hub repository or
//! local directory) resolved to local files, fetched through the Hub cache where needed, and every file
//! verified against its pins (or hashed and recorded where unpinned).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kev_release::manifest::{
    DigestKind, FileHashes, FileRecord, PinCheck, PinnedFile, RepoPin, SourceRecord,
};
use rayon::prelude::*;

use crate::error::{PinMismatch, PrepareError, io_err};
use crate::hub::{self, HubClient};
use crate::{progress_bar, warn};

/// Where a repository's files come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A Hub repository at a revision (branch, tag or commit).
    Hub {
        /// `owner/name`.
        repo: String,
        /// Revision.
        revision: String,
    },
    /// A local directory with the repository's files.
    Dir(PathBuf),
}

impl Source {
    /// A command-line source: an existing local directory, else `owner/name[@revision]` on the Hub.
    pub fn parse(spec: &str) -> Result<Self, PrepareError> {
        let path = Path::new(spec);
        if path.is_dir() {
            return Ok(Source::Dir(path.to_path_buf()));
        }
        Self::parse_hub(spec).map_err(|_| {
            PrepareError::Usage(format!(
                "{spec:?} is neither a local directory nor a Hub repository (owner/name[@revision])"
            ))
        })
    }

    /// Parse `owner/name@revision` (revision defaults to `main`).
    pub fn parse_hub(spec: &str) -> Result<Self, PrepareError> {
        let (repo, revision) = match spec.split_once('@') {
            Some((r, v)) => (r, v),
            None => (spec, "main"),
        };
        let valid = |s: &str| {
            !s.is_empty()
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        };
        match repo.split_once('/') {
            Some((owner, name)) if valid(owner) && valid(name) && !revision.is_empty() => {
                Ok(Source::Hub {
                    repo: repo.to_string(),
                    revision: revision.to_string(),
                })
            }
            _ => Err(PrepareError::Usage(format!(
                "{spec:?} is not a Hub repository: expected owner/name[@revision]"
            ))),
        }
    }
}

/// A source resolved to local files.
pub(crate) struct Resolved {
    pub(crate) role: &'static str,
    pub(crate) source: Source,
    /// The pins the files are checked against, if the source is pinned.
    pub(crate) pin: Option<RepoPin>,
    pub(crate) commit: Option<String>,
    /// Repository file name → local path.
    pub(crate) files: BTreeMap<String, PathBuf>,
    /// Repository file name → the Hub's id for it (sha256 or git blob sha1), for Hub sources.
    pub(crate) etags: BTreeMap<String, String>,
    /// The directory the base store opens (base only).
    pub(crate) dir: PathBuf,
    /// For error hints.
    pub(crate) from_hub: bool,
}

impl Resolved {
    pub(crate) fn path(&self, name: &str) -> Result<&Path, PrepareError> {
        self.files
            .get(name)
            .map(PathBuf::as_path)
            .ok_or_else(|| PrepareError::Internal(format!("{name} was not fetched")))
    }

    pub(crate) fn label(&self) -> String {
        match (&self.source, &self.commit) {
            (Source::Hub { repo, .. }, Some(c)) => format!("{repo}@{c}"),
            (Source::Hub { repo, revision }, None) => format!("{repo}@{revision}"),
            (Source::Dir(d), _) => d.display().to_string(),
        }
    }
}

pub(crate) fn resolve(
    client: &HubClient,
    role: &'static str,
    source: &Source,
    pins: &RepoPin,
    pins_explicit: bool,
) -> Result<Resolved, PrepareError> {
    match source {
        Source::Hub { repo, revision } => {
            // Pinned when it is the pinned repository at the pinned commit (or a name for it).
            // Online, a branch or tag is resolved afresh by the first download; offline, by the cache.
            let resolved_commit = if hub::is_commit(revision) {
                Some(revision.clone())
            } else if client.config().offline {
                client.cached_commit(repo, revision)
            } else {
                None
            };
            let pinned = *repo == pins.repo
                && (revision == &pins.revision
                    || resolved_commit.as_deref() == Some(&pins.revision));
            Ok(Resolved {
                role,
                source: source.clone(),
                pin: pinned.then(|| pins.clone()),
                commit: resolved_commit,
                files: BTreeMap::new(),
                etags: BTreeMap::new(),
                dir: PathBuf::new(),
                from_hub: true,
            })
        }
        Source::Dir(d) => {
            if !d.is_dir() {
                return Err(PrepareError::MissingFile {
                    role,
                    path: d.clone(),
                });
            }
            // recorded in the manifest: an absolute path says where the files really were
            let d = std::fs::canonicalize(d).map_err(io_err(d))?;
            Ok(Resolved {
                role,
                source: Source::Dir(d.clone()),
                pin: pins_explicit.then(|| pins.clone()),
                commit: pins_explicit.then(|| pins.revision.clone()),
                files: BTreeMap::new(),
                etags: BTreeMap::new(),
                dir: d,
                from_hub: false,
            })
        }
    }
}

pub(crate) fn fetch_files(
    client: &HubClient,
    r: &mut Resolved,
    names: &[&str],
) -> Result<(), PrepareError> {
    for &name in names {
        if r.files.contains_key(name) {
            continue;
        }
        let path = match &r.source {
            Source::Dir(d) => {
                let p = d.join(name);
                if !p.is_file() {
                    return Err(PrepareError::MissingFile {
                        role: r.role,
                        path: p,
                    });
                }
                p
            }
            Source::Hub { repo, revision } => {
                let rev = r.commit.clone().unwrap_or_else(|| revision.clone());
                let f = client.fetch(repo, &rev, name)?;
                if r.commit.is_none() {
                    // the first answer fixes the commit: every later file comes from the same one
                    r.commit = Some(f.commit.clone());
                }
                if let Some(parent) = f.path.parent()
                    && r.dir.as_os_str().is_empty()
                {
                    // the snapshot directory of the commit (files may live in sub-folders)
                    let depth = Path::new(name).components().count();
                    let mut d = parent.to_path_buf();
                    for _ in 1..depth {
                        d.pop();
                    }
                    r.dir = d;
                }
                if let Some(e) = f.etag {
                    r.etags.insert(name.to_string(), e);
                }
                f.path
            }
        };
        r.files.insert(name.to_string(), path);
    }
    Ok(())
}

impl Resolved {
    /// A Hub branch or tag that turned out to be the pinned commit is pinned after all.
    pub(crate) fn repin(&mut self, pins: &RepoPin) {
        if let Source::Hub { repo, .. } = &self.source
            && self.pin.is_none()
            && *repo == pins.repo
            && self.commit.as_deref() == Some(pins.revision.as_str())
        {
            self.pin = Some(pins.clone());
        }
    }
}

fn pin_hint(r: &Resolved, path: &Path) -> String {
    if r.from_hub {
        format!(
            "the cached copy is damaged or the Hub serves other bytes: delete {} (and the blob it links to) to download it again; \
             to use different files knowingly, pin them with --pins FILE",
            path.display()
        )
    } else {
        "this directory is not an untouched copy of the pinned release: restore the file from the Hub, \
         or leave out --pins to use the directory as an unpinned source (it is then hashed and recorded, with a warning)"
            .to_string()
    }
}

pub(crate) fn verify_files(
    r: &Resolved,
    names: &[&str],
    progress: bool,
    warnings: &mut Vec<String>,
) -> Result<Vec<FileRecord>, PrepareError> {
    let mut jobs: Vec<(&str, &Path, Option<&PinnedFile>)> = Vec::new();
    for &name in names {
        let path = r.path(name)?;
        let pin = match &r.pin {
            Some(p) => Some(p.file(name).ok_or_else(|| PrepareError::NotPinned {
                repo: p.repo.clone(),
                revision: p.revision.clone(),
                file: name.to_string(),
            })?),
            None => None,
        };
        jobs.push((name, path, pin));
    }
    if r.pin.is_none() && !names.is_empty() {
        let w = format!(
            "{} source {} is unpinned: its files are hashed and recorded in the manifest, not checked",
            r.role,
            r.label()
        );
        warn(warnings, w);
    }
    let total: u64 = jobs
        .iter()
        .map(|(_, p, _)| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0))
        .sum();
    let bar = progress_bar(progress && total > (64 << 20), "verify");
    bar.set_length(total);
    // Two files hash at once: sha256 + sha1 keep one core busy each.
    let hashed: Vec<Result<FileHashes, PrepareError>> = jobs
        .par_iter()
        .with_max_len(1)
        .map(|(name, path, pin)| {
            let git = pin.is_some_and(|p| p.kind == DigestKind::GitSha1)
                || r.etags.get(*name).is_some_and(|e| e.len() == 40);
            Ok(FileHashes::of_file_with(path, git, |n| bar.inc(n))?)
        })
        .collect();
    bar.finish_and_clear();
    let mut records = Vec::new();
    for ((name, path, pin), h) in jobs.iter().zip(hashed) {
        let h = h?;
        if let (Some(pin), Some(repo)) = (pin, &r.pin) {
            let what = match pin.check(&h) {
                PinCheck::Ok => None,
                PinCheck::Size { expected, found } => Some(format!(
                    "size {found} bytes, pinned {expected} bytes; {} {}, pinned {}",
                    pin.kind,
                    h.get(pin.kind).unwrap_or("?"),
                    pin.digest
                )),
                PinCheck::Digest {
                    kind,
                    expected,
                    found,
                } => Some(format!("{kind} {found}, pinned {expected}")),
            };
            if let Some(what) = what {
                return Err(PrepareError::PinMismatch(Box::new(PinMismatch {
                    repo: repo.repo.clone(),
                    revision: repo.revision.clone(),
                    file: name.to_string(),
                    against: "the pinned release",
                    path: path.to_path_buf(),
                    what,
                    hint: pin_hint(r, path),
                })));
            }
        }
        // Unpinned Hub files still carry the Hub's own id: the cached copy must match it.
        if pin.is_none()
            && let Some(etag) = r.etags.get(*name)
        {
            let (kind, found) = match etag.len() {
                64 => (DigestKind::Sha256, Some(h.sha256.as_str())),
                40 => (DigestKind::GitSha1, h.git_sha1.as_deref()),
                _ => (DigestKind::Sha256, None),
            };
            if let Some(found) = found
                && !found.eq_ignore_ascii_case(etag)
            {
                let repo = match &r.source {
                    Source::Hub { repo, .. } => repo.clone(),
                    Source::Dir(d) => d.display().to_string(),
                };
                return Err(PrepareError::PinMismatch(Box::new(PinMismatch {
                    repo,
                    revision: r.commit.clone().unwrap_or_default(),
                    file: name.to_string(),
                    against: "the Hub's id for it",
                    path: path.to_path_buf(),
                    what: format!("{kind} {found}, the Hub's id {etag}"),
                    hint: pin_hint(r, path),
                })));
            }
        }
        records.push(FileRecord {
            role: Some(r.role.to_string()),
            name: name.to_string(),
            size: h.size,
            sha256: h.sha256,
        });
    }
    Ok(records)
}

pub(crate) fn source_record(r: &Resolved) -> SourceRecord {
    let (repo, revision, local_dir) = match &r.source {
        Source::Hub { repo, revision } => (Some(repo.clone()), Some(revision.clone()), None),
        Source::Dir(d) => (
            r.pin.as_ref().map(|p| p.repo.clone()),
            r.pin.as_ref().map(|p| p.revision.clone()),
            Some(d.display().to_string()),
        ),
    };
    SourceRecord {
        role: r.role.to_string(),
        repo,
        revision,
        commit: r.commit.clone(),
        local_dir,
        pinned: r.pin.is_some(),
    }
}
