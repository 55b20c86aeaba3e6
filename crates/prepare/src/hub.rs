//! A Hugging Face Hub file client: the resolve protocol, the shared cache layout, resumable downloads.
//!
//! Protocol (as `huggingface_hub` speaks it): `HEAD {endpoint}/{repo}/resolve/{revision}/{file}` without
//! following redirects gives the commit (`X-Repo-Commit`), the file's id (`X-Linked-Etag` for LFS files:
//! their sha256; else `ETag`: the git blob sha1), its size (`X-Linked-Size` / `Content-Length`) and,
//! for LFS files, a redirect to the storage host. The body is then fetched with `GET`, resuming a
//! partial download with `Range: bytes=<have>-`.
//!
//! Cache (shared with Python tools): `{cache}/models--{owner}--{name}/blobs/{etag}` holds the bytes,
//! `snapshots/{commit}/{file}` is a relative symlink to the blob, `refs/{revision}` holds the commit a
//! branch or tag resolved to. A partial download lives in `blobs/{etag}.incomplete`.
//!
//! Environment: `HF_ENDPOINT`, `HF_HOME` (cache in `$HF_HOME/hub`, token in `$HF_HOME/token`),
//! `HF_HUB_CACHE`, `HF_TOKEN`, `HF_HUB_OFFLINE=1`.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use kev_release::manifest::DualHasher;

/// Errors of the Hub client.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    /// The server answered with an error status.
    #[error("{url}: HTTP {status}{hint}")]
    Status {
        /// The URL.
        url: String,
        /// The status code.
        status: u16,
        /// A hint for 401/403/404.
        hint: String,
    },
    /// The server could not be reached or the transfer failed.
    #[error("{url}: {message}")]
    Transport {
        /// The URL.
        url: String,
        /// What failed.
        message: String,
    },
    /// The server's answer lacks something the protocol requires.
    #[error("{url}: {message}")]
    Protocol {
        /// The URL.
        url: String,
        /// What is missing or wrong.
        message: String,
    },
    /// Offline and the file is not in the cache.
    #[error(
        "{repo}@{revision}: {file} is not in the Hub cache ({cache}) and offline mode is on; run once online or unset HF_HUB_OFFLINE"
    )]
    NotCached {
        /// Repository.
        repo: String,
        /// Revision.
        revision: String,
        /// File.
        file: String,
        /// Cache directory.
        cache: String,
    },
    /// The downloaded bytes do not match the id the server gave.
    #[error(
        "{}@{}: {}: downloaded {} is {}, the Hub announced {}; the partial file was removed, try again",
        .0.repo, .0.revision, .0.file, .0.kind, .0.found, .0.expected
    )]
    Corrupt(Box<CorruptDownload>),
    /// Local file system trouble in the cache.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

/// Details of [`HubError::Corrupt`].
#[derive(Debug)]
pub struct CorruptDownload {
    /// Repository.
    pub repo: String,
    /// Revision.
    pub revision: String,
    /// File.
    pub file: String,
    /// Digest kind.
    pub kind: &'static str,
    /// Announced digest.
    pub expected: String,
    /// Digest of the bytes received.
    pub found: String,
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> HubError + '_ {
    move |source| HubError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Where and how to reach the Hub.
#[derive(Debug, Clone)]
pub struct HubConfig {
    /// Base URL, without a trailing slash (`https://huggingface.co`).
    pub endpoint: String,
    /// The cache directory (`…/huggingface/hub`).
    pub cache_dir: PathBuf,
    /// Bearer token, if any.
    pub token: Option<String>,
    /// Never touch the network; serve from the cache only.
    pub offline: bool,
    /// Draw progress bars on stderr (only where stderr is a terminal).
    pub progress: bool,
}

impl HubConfig {
    /// Read the standard variables from the process environment.
    pub fn from_env() -> Self {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// Read the standard variables through `get` (the environment, or a map in tests).
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Self {
        let nonempty = |k: &str| get(k).filter(|v| !v.trim().is_empty());
        let endpoint = nonempty("HF_ENDPOINT")
            .unwrap_or_else(|| "https://huggingface.co".to_string())
            .trim_end_matches('/')
            .to_string();
        let home = nonempty("HF_HOME").map(PathBuf::from).unwrap_or_else(|| {
            let xdg = nonempty("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| nonempty("HOME").map(|h| PathBuf::from(h).join(".cache")))
                .unwrap_or_else(|| PathBuf::from(".cache"));
            xdg.join("huggingface")
        });
        let cache_dir = nonempty("HF_HUB_CACHE")
            .or_else(|| nonempty("HUGGINGFACE_HUB_CACHE"))
            .map(PathBuf::from)
            .unwrap_or_else(|| home.join("hub"));
        let token = nonempty("HF_TOKEN")
            .or_else(|| nonempty("HUGGING_FACE_HUB_TOKEN"))
            .or_else(|| {
                let path = nonempty("HF_TOKEN_PATH")
                    .map(PathBuf::from)
                    .unwrap_or_else(|| home.join("token"));
                fs::read_to_string(path)
                    .ok()
                    .map(|t| t.trim().to_string())
                    .filter(|t| !t.is_empty())
            });
        let truthy = |k: &str| {
            nonempty(k).is_some_and(|v| {
                matches!(
                    v.trim().to_ascii_lowercase().as_str(),
                    "1" | "true" | "yes" | "on"
                )
            })
        };
        HubConfig {
            endpoint,
            cache_dir,
            token,
            offline: truthy("HF_HUB_OFFLINE") || truthy("TRANSFORMERS_OFFLINE"),
            progress: true,
        }
    }
}

/// A file available locally after [`HubClient::fetch`].
#[derive(Debug, Clone)]
pub struct Fetched {
    /// The snapshot path (a symlink into `blobs/`).
    pub path: PathBuf,
    /// The commit it belongs to.
    pub commit: String,
    /// The Hub's id for it (sha256 for LFS files, git blob sha1 otherwise), when known.
    pub etag: Option<String>,
}

/// What a `HEAD` on a resolve URL told us.
#[derive(Debug, Clone)]
struct FileInfo {
    commit: String,
    etag: String,
    size: u64,
    download_url: String,
}

/// A Hub client over `ureq`, redirects handled by hand so the token never leaves the endpoint's host.
pub struct HubClient {
    config: HubConfig,
    agent: ureq::Agent,
}

const MAX_ATTEMPTS: usize = 5;

impl HubClient {
    /// A client for `config`.
    pub fn new(config: HubConfig) -> Self {
        let agent = ureq::AgentBuilder::new()
            .redirects(0)
            .timeout_connect(Duration::from_secs(30))
            .timeout_read(Duration::from_secs(120))
            .user_agent(concat!("kev/", env!("CARGO_PKG_VERSION")))
            .build();
        HubClient { config, agent }
    }

    /// The configuration in use.
    pub fn config(&self) -> &HubConfig {
        &self.config
    }

    /// The cache folder of one model repository.
    pub fn repo_dir(&self, repo: &str) -> PathBuf {
        self.config
            .cache_dir
            .join(format!("models--{}", repo.replace('/', "--")))
    }

    /// Resolve `revision` to a commit from the cache (`refs/{revision}`, or the revision itself when it
    /// is a full commit id).
    pub fn cached_commit(&self, repo: &str, revision: &str) -> Option<String> {
        if is_commit(revision) {
            return Some(revision.to_string());
        }
        fs::read_to_string(self.repo_dir(repo).join("refs").join(revision))
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| is_commit(s))
    }

    /// Make `file` of `repo@revision` available locally, downloading it unless the cache has it.
    pub fn fetch(&self, repo: &str, revision: &str, file: &str) -> Result<Fetched, HubError> {
        let repo_dir = self.repo_dir(repo);
        // A file of a known commit never changes: serve it from the cache without asking.
        if let Some(commit) = self.cached_commit(repo, revision)
            && (is_commit(revision) || self.config.offline)
        {
            let snap = repo_dir.join("snapshots").join(&commit).join(file);
            if snap.is_file() {
                let etag = fs::read_link(&snap)
                    .ok()
                    .and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()));
                return Ok(Fetched {
                    path: snap,
                    commit,
                    etag,
                });
            }
        }
        if self.config.offline {
            return Err(HubError::NotCached {
                repo: repo.to_string(),
                revision: revision.to_string(),
                file: file.to_string(),
                cache: self.config.cache_dir.display().to_string(),
            });
        }
        let info = self.head(repo, revision, file)?;
        let blobs = repo_dir.join("blobs");
        fs::create_dir_all(&blobs).map_err(io_err(&blobs))?;
        let blob = blobs.join(&info.etag);
        let blob_ok = fs::metadata(&blob).is_ok_and(|m| m.is_file() && m.len() == info.size);
        if !blob_ok {
            self.download(repo, revision, file, &info, &blob)?;
        }
        let snap_dir = repo_dir.join("snapshots").join(&info.commit);
        let snap = snap_dir.join(file);
        let parent = snap.parent().unwrap_or(&snap_dir).to_path_buf();
        fs::create_dir_all(&parent).map_err(io_err(&parent))?;
        link_blob(&blob, &snap)?;
        if revision != info.commit {
            let refs = repo_dir.join("refs");
            let ref_path = refs.join(revision);
            if let Some(p) = ref_path.parent() {
                fs::create_dir_all(p).map_err(io_err(p))?;
            }
            fs::write(&ref_path, &info.commit).map_err(io_err(&ref_path))?;
        }
        Ok(Fetched {
            path: snap,
            commit: info.commit,
            etag: Some(info.etag),
        })
    }

    /// Whether a file exists at `repo@revision` (a `HEAD` that may answer 404).
    pub fn exists(&self, repo: &str, revision: &str, file: &str) -> Result<bool, HubError> {
        if self.config.offline {
            return Ok(self.cached_commit(repo, revision).is_some_and(|c| {
                self.repo_dir(repo)
                    .join("snapshots")
                    .join(c)
                    .join(file)
                    .is_file()
            }));
        }
        match self.head(repo, revision, file) {
            Ok(_) => Ok(true),
            Err(HubError::Status { status: 404, .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn resolve_url(&self, repo: &str, revision: &str, file: &str) -> String {
        let enc = |s: &str| -> String {
            s.bytes()
                .map(|b| match b {
                    b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => {
                        char::from(b).to_string()
                    }
                    _ => format!("%{b:02X}"),
                })
                .collect()
        };
        format!(
            "{}/{}/resolve/{}/{}",
            self.config.endpoint,
            repo,
            enc(revision).replace('/', "%2F"),
            enc(file)
        )
    }

    fn request(&self, method: &str, url: &str) -> ureq::Request {
        let mut req = self.agent.request(method, url);
        if let Some(t) = &self.config.token
            && same_origin(url, &self.config.endpoint)
        {
            req = req.set("Authorization", &format!("Bearer {t}"));
        }
        req
    }

    fn call(&self, req: ureq::Request, url: &str) -> Result<ureq::Response, HubError> {
        match req.call() {
            Ok(r) => Ok(r),
            Err(ureq::Error::Status(status, _)) => Err(HubError::Status {
                url: url.to_string(),
                status,
                hint: match status {
                    401 | 403 => " (gated or private: set HF_TOKEN)".to_string(),
                    404 => " (no such repository, revision or file)".to_string(),
                    _ => String::new(),
                },
            }),
            Err(e) => Err(HubError::Transport {
                url: url.to_string(),
                message: e.to_string(),
            }),
        }
    }

    fn head(&self, repo: &str, revision: &str, file: &str) -> Result<FileInfo, HubError> {
        let mut url = self.resolve_url(repo, revision, file);
        let mut hops = 0;
        loop {
            let resp = self.call(
                self.request("HEAD", &url)
                    .set("Accept-Encoding", "identity"),
                &url,
            )?;
            let status = resp.status();
            let location = resp.header("location").map(str::to_string);
            // Relative redirects stay on the Hub (renamed repositories): follow them. An absolute one
            // points at the storage host: that is where the bytes are, but the metadata is here.
            if (300..400).contains(&status)
                && let Some(loc) = &location
                && loc.starts_with('/')
            {
                hops += 1;
                if hops > 5 {
                    return Err(HubError::Protocol {
                        url,
                        message: "too many redirects".into(),
                    });
                }
                url = format!("{}{}", origin(&self.config.endpoint), loc);
                continue;
            }
            let proto = |message: &str| HubError::Protocol {
                url: url.clone(),
                message: message.to_string(),
            };
            let commit = resp
                .header("x-repo-commit")
                .map(str::to_string)
                .ok_or_else(|| proto("no X-Repo-Commit header: is HF_ENDPOINT a Hub?"))?;
            let etag = resp
                .header("x-linked-etag")
                .or_else(|| resp.header("etag"))
                .map(normalize_etag)
                .filter(|e| !e.is_empty())
                .ok_or_else(|| proto("no ETag header"))?;
            if etag.contains(['/', '\\']) || etag.starts_with('.') {
                return Err(proto("unusable ETag"));
            }
            let size = resp
                .header("x-linked-size")
                .or_else(|| resp.header("content-length"))
                .and_then(|s| s.trim().parse::<u64>().ok())
                .ok_or_else(|| proto("no file size (X-Linked-Size / Content-Length)"))?;
            let download_url = match (status, location) {
                (300..=399, Some(loc)) => loc,
                (300..=399, None) => return Err(proto("redirect without Location")),
                _ => url.clone(),
            };
            return Ok(FileInfo {
                commit,
                etag,
                size,
                download_url,
            });
        }
    }

    fn download(
        &self,
        repo: &str,
        revision: &str,
        file: &str,
        info: &FileInfo,
        blob: &Path,
    ) -> Result<(), HubError> {
        let partial = PathBuf::from(format!("{}.incomplete", blob.display()));
        let bar = self.progress_bar(file, info.size);
        let mut last_err = None;
        for attempt in 0..MAX_ATTEMPTS {
            if attempt > 0 {
                tracing::warn!(
                    file,
                    attempt,
                    "download interrupted ({}); resuming",
                    last_err
                        .as_ref()
                        .map(ToString::to_string)
                        .unwrap_or_default()
                );
                std::thread::sleep(Duration::from_millis(200 * attempt as u64));
            }
            match self.download_once(&info.download_url, &partial, info.size, &bar) {
                Ok(()) => {
                    last_err = None;
                    break;
                }
                Err(
                    e @ HubError::Status {
                        status: 400..=499, ..
                    },
                ) => {
                    bar.abandon();
                    return Err(e);
                }
                Err(e) => last_err = Some(e),
            }
        }
        if let Some(e) = last_err {
            bar.abandon();
            return Err(e);
        }
        bar.finish_and_clear();
        // The id the Hub gave is a digest of the content: check it before the blob becomes visible.
        let check = check_etag(&partial, &info.etag, info.size)?;
        if let Some((kind, found)) = check {
            let _ = fs::remove_file(&partial);
            return Err(HubError::Corrupt(Box::new(CorruptDownload {
                repo: repo.to_string(),
                revision: revision.to_string(),
                file: file.to_string(),
                kind,
                expected: info.etag.clone(),
                found,
            })));
        }
        fs::rename(&partial, blob).map_err(io_err(blob))
    }

    fn download_once(
        &self,
        url: &str,
        partial: &Path,
        size: u64,
        bar: &ProgressBar,
    ) -> Result<(), HubError> {
        let have = fs::metadata(partial).map(|m| m.len()).unwrap_or(0);
        if have > size {
            fs::remove_file(partial).map_err(io_err(partial))?;
            return self.download_once(url, partial, size, bar);
        }
        if have == size {
            return Ok(());
        }
        let mut url = url.to_string();
        let mut hops = 0;
        let resp = loop {
            let mut req = self.request("GET", &url).set("Accept-Encoding", "identity");
            if have > 0 {
                req = req.set("Range", &format!("bytes={have}-"));
            }
            let resp = self.call(req, &url)?;
            if (300..400).contains(&resp.status()) {
                let loc = resp.header("location").ok_or_else(|| HubError::Protocol {
                    url: url.clone(),
                    message: "redirect without Location".into(),
                })?;
                url = if loc.starts_with('/') {
                    format!("{}{}", origin(&url), loc)
                } else {
                    loc.to_string()
                };
                hops += 1;
                if hops > 5 {
                    return Err(HubError::Protocol {
                        url,
                        message: "too many redirects".into(),
                    });
                }
                continue;
            }
            break resp;
        };
        let (mut out, start) = match resp.status() {
            206 => {
                let start = resp
                    .header("content-range")
                    .and_then(|cr| cr.strip_prefix("bytes "))
                    .and_then(|cr| cr.split('-').next())
                    .and_then(|s| s.trim().parse::<u64>().ok());
                if start != Some(have) {
                    return Err(HubError::Protocol {
                        url,
                        message: format!("asked for bytes {have}-, got Content-Range {start:?}"),
                    });
                }
                let f = OpenOptions::new()
                    .append(true)
                    .open(partial)
                    .map_err(io_err(partial))?;
                (f, have)
            }
            200 => (File::create(partial).map_err(io_err(partial))?, 0),
            status => {
                return Err(HubError::Status {
                    url,
                    status,
                    hint: String::new(),
                });
            }
        };
        bar.set_position(start);
        let mut reader = resp.into_reader();
        let mut buf = vec![0u8; 1 << 20];
        let mut pos = start;
        loop {
            let n = match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    out.flush().map_err(io_err(partial))?;
                    return Err(HubError::Transport {
                        url,
                        message: format!("transfer broke off at byte {pos} of {size}: {e}"),
                    });
                }
            };
            out.write_all(&buf[..n]).map_err(io_err(partial))?;
            pos += n as u64;
            bar.set_position(pos);
        }
        out.sync_all().map_err(io_err(partial))?;
        if pos != size {
            return Err(HubError::Transport {
                url,
                message: format!("transfer ended at byte {pos} of {size}"),
            });
        }
        Ok(())
    }

    fn progress_bar(&self, file: &str, size: u64) -> ProgressBar {
        if !self.config.progress {
            return ProgressBar::hidden();
        }
        let bar = ProgressBar::with_draw_target(Some(size), ProgressDrawTarget::stderr());
        if let Ok(style) = ProgressStyle::with_template(
            "{msg:40!} {bar:30} {bytes:>10}/{total_bytes:<10} {bytes_per_sec:>12} {eta:>4}",
        ) {
            bar.set_style(style);
        }
        bar.set_message(file.to_string());
        bar
    }
}

/// Check a downloaded file against the Hub's id: sha256 (64 hex) or git blob sha1 (40 hex). Returns
/// the digest kind and the actual value when they differ; ids of other shapes are not digests.
fn check_etag(
    path: &Path,
    etag: &str,
    size: u64,
) -> Result<Option<(&'static str, String)>, HubError> {
    let is_hex = etag.bytes().all(|b| b.is_ascii_hexdigit());
    let kind = match (etag.len(), is_hex) {
        (64, true) => "sha256",
        (40, true) => "git-sha1",
        _ => return Ok(None),
    };
    let mut f = File::open(path).map_err(io_err(path))?;
    let mut h = if kind == "git-sha1" {
        DualHasher::new(size)
    } else {
        DualHasher::sha256_only(size)
    };
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(io_err(path))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    let hashes = h.finish().map_err(io_err(path))?;
    let found = if kind == "sha256" {
        hashes.sha256
    } else {
        hashes.git_sha1.unwrap_or_default()
    };
    Ok((!found.eq_ignore_ascii_case(etag)).then_some((kind, found)))
}

fn link_blob(blob: &Path, snap: &Path) -> Result<(), HubError> {
    if fs::symlink_metadata(snap).is_ok() {
        fs::remove_file(snap).map_err(io_err(snap))?;
    }
    // Relative link, as huggingface_hub makes them: the cache stays valid when moved.
    let depth = snap
        .parent()
        .and_then(|p| p.strip_prefix(blob.parent()?.parent()?).ok())
        .map(|rel| rel.components().count())
        .unwrap_or(2);
    let mut target = PathBuf::new();
    for _ in 0..depth {
        target.push("..");
    }
    target.push("blobs");
    target.push(blob.file_name().unwrap_or_default());
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink(&target, snap).map_err(io_err(snap))
    }
    #[cfg(not(unix))]
    {
        fs::copy(blob, snap).map(|_| ()).map_err(io_err(snap))
    }
}

fn normalize_etag(raw: &str) -> String {
    raw.trim()
        .trim_start_matches("W/")
        .trim_matches('"')
        .to_string()
}

/// True for a full 40-hex git commit id.
pub fn is_commit(s: &str) -> bool {
    s.len() == 40 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

fn origin(url: &str) -> String {
    let after_scheme = url.find("://").map(|i| i + 3).unwrap_or(0);
    let end = url[after_scheme..]
        .find('/')
        .map(|i| after_scheme + i)
        .unwrap_or(url.len());
    url[..end].to_string()
}

fn same_origin(a: &str, b: &str) -> bool {
    origin(a).eq_ignore_ascii_case(&origin(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environment_is_read_like_huggingface_hub() {
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        let c = HubConfig::from_vars(vars(&[("HOME", "/home/u")]));
        assert_eq!(c.endpoint, "https://huggingface.co");
        assert_eq!(c.cache_dir, PathBuf::from("/home/u/.cache/huggingface/hub"));
        assert!(!c.offline);
        let c = HubConfig::from_vars(vars(&[
            ("HF_HOME", "/data/hf"),
            ("HF_ENDPOINT", "http://127.0.0.1:9/"),
            ("HF_TOKEN", "hf_x"),
            ("HF_HUB_OFFLINE", "1"),
        ]));
        assert_eq!(c.endpoint, "http://127.0.0.1:9");
        assert_eq!(c.cache_dir, PathBuf::from("/data/hf/hub"));
        assert_eq!(c.token.as_deref(), Some("hf_x"));
        assert!(c.offline);
        let c = HubConfig::from_vars(vars(&[("HF_HOME", "/data/hf"), ("HF_HUB_CACHE", "/c")]));
        assert_eq!(c.cache_dir, PathBuf::from("/c"));
    }

    #[test]
    fn origins_and_etags() {
        assert_eq!(origin("https://a.b:8/x/y"), "https://a.b:8");
        assert!(same_origin("http://h:1/a", "http://h:1"));
        assert!(!same_origin("http://cdn:1/a", "http://h:1"));
        assert_eq!(normalize_etag("W/\"abc\""), "abc");
        assert!(is_commit("1001bb4d826a52d1f399e183466143f4da7b741b"));
        assert!(!is_commit("main"));
    }
}
