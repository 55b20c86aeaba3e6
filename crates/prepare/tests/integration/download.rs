//! `kev prepare` fetching through a loopback server that speaks the Hub file protocol: resolve URLs
//! with `X-Repo-Commit` / `ETag` / `X-Linked-Etag` / `X-Linked-Size`, a redirect of LFS files to a
//! separate storage host, `Range` requests. The test drives it through the real environment variables
//! (`HF_ENDPOINT`, `HF_HOME`, `HF_TOKEN`, `HF_HUB_OFFLINE`), so it is the only test in this binary.

use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use kev_prepare::{HubConfig, HubError, PrepareError, PrepareOptions, Source, prepare};
use kev_release::manifest::{
    DigestKind, FileHashes, ReleasePins, RepoPin, hub_digest_kind, verify,
};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

const TOKEN: &str = "hf_loopback_test_token";

#[derive(Debug, Clone)]
struct Logged {
    server: &'static str,
    method: String,
    path: String,
    range: Option<String>,
    auth: Option<String>,
}

struct HubRepo {
    name: String,
    commit: String,
    refs: Vec<String>,
    files: BTreeMap<String, Vec<u8>>,
}

struct State {
    repos: Vec<HubRepo>,
    cdn_origin: Mutex<String>,
    /// sha256 of blobs whose next full GET is cut off half way.
    truncate_once: Mutex<HashSet<String>>,
    /// sha256 of blobs whose next GET carries one flipped byte.
    corrupt_once: Mutex<HashSet<String>>,
    log: Mutex<Vec<Logged>>,
    down: AtomicBool,
}

impl State {
    fn blob(&self, sha: &str) -> Option<Vec<u8>> {
        self.repos
            .iter()
            .flat_map(|r| r.files.values())
            .find(|b| kev_release::manifest::sha256_hex(b) == sha)
            .cloned()
    }
}

fn serve(listener: TcpListener, state: Arc<State>, server: &'static str) {
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let state = state.clone();
            std::thread::spawn(move || {
                let _ = handle(stream, &state, server);
            });
        }
    });
}

fn handle(mut stream: TcpStream, state: &State, server: &'static str) -> std::io::Result<()> {
    if state.down.load(Ordering::SeqCst) {
        return Ok(()); // drop the connection: the network is "gone"
    }
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_string();
    let path = parts.next().unwrap_or_default().to_string();
    let mut range = None;
    let mut auth = None;
    loop {
        let mut h = String::new();
        reader.read_line(&mut h)?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            match k.trim().to_ascii_lowercase().as_str() {
                "range" => range = Some(v.trim().to_string()),
                "authorization" => auth = Some(v.trim().to_string()),
                _ => {}
            }
        }
    }
    state.log.lock().unwrap().push(Logged {
        server,
        method: method.clone(),
        path: path.clone(),
        range: range.clone(),
        auth: auth.clone(),
    });
    let head_only = method == "HEAD";
    let respond =
        |stream: &mut TcpStream, status: &str, headers: &[(String, String)], body: &[u8]| {
            let mut out = format!("HTTP/1.1 {status}\r\nConnection: close\r\n");
            for (k, v) in headers {
                out.push_str(&format!("{k}: {v}\r\n"));
            }
            out.push_str("\r\n");
            stream.write_all(out.as_bytes())?;
            if !head_only {
                stream.write_all(body)?;
            }
            stream.flush()
        };
    let not_found = |stream: &mut TcpStream| {
        respond(
            stream,
            "404 Not Found",
            &[
                ("Content-Length".into(), "0".into()),
                ("X-Error-Code".into(), "EntryNotFound".into()),
            ],
            b"",
        )
    };

    if server == "hub" {
        if auth.as_deref() != Some(&format!("Bearer {TOKEN}")) {
            return respond(
                &mut stream,
                "401 Unauthorized",
                &[("Content-Length".into(), "0".into())],
                b"",
            );
        }
        // /{owner}/{name}/resolve/{rev}/{file}
        let segs: Vec<&str> = path.trim_start_matches('/').splitn(5, '/').collect();
        if segs.len() != 5 || segs[2] != "resolve" {
            return not_found(&mut stream);
        }
        let repo_name = format!("{}/{}", segs[0], segs[1]);
        let Some(repo) = state.repos.iter().find(|r| r.name == repo_name) else {
            return not_found(&mut stream);
        };
        if segs[3] != repo.commit && !repo.refs.iter().any(|r| r == segs[3]) {
            return not_found(&mut stream);
        }
        let Some(bytes) = repo.files.get(segs[4]) else {
            return not_found(&mut stream);
        };
        let h = FileHashes::of_reader(&bytes[..], bytes.len() as u64, |_| {}).unwrap();
        let mut headers = vec![("X-Repo-Commit".to_string(), repo.commit.clone())];
        if hub_digest_kind(segs[4], h.size) == DigestKind::Sha256 {
            let cdn = state.cdn_origin.lock().unwrap().clone();
            headers.extend([
                ("Location".into(), format!("{cdn}/blobs/{}", h.sha256)),
                ("X-Linked-Etag".into(), format!("\"{}\"", h.sha256)),
                ("X-Linked-Size".into(), h.size.to_string()),
                (
                    "ETag".into(),
                    format!("W/\"{}\"", h.git_sha1.clone().unwrap()),
                ),
                ("Content-Length".into(), "0".into()),
            ]);
            return respond(&mut stream, "302 Found", &headers, b"");
        }
        headers.extend([
            (
                "ETag".into(),
                format!("\"{}\"", h.git_sha1.clone().unwrap()),
            ),
            ("Content-Length".into(), h.size.to_string()),
        ]);
        return respond(&mut stream, "200 OK", &headers, bytes);
    }

    // storage host: /blobs/{sha256}
    let Some(sha) = path.strip_prefix("/blobs/") else {
        return not_found(&mut stream);
    };
    if auth.is_some() {
        // the token must never leave the Hub's host
        return respond(
            &mut stream,
            "400 Bad Request",
            &[("Content-Length".into(), "0".into())],
            b"",
        );
    }
    let Some(mut bytes) = state.blob(sha) else {
        return not_found(&mut stream);
    };
    if !head_only && state.corrupt_once.lock().unwrap().remove(sha) {
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0x40;
    }
    let total = bytes.len();
    let start = range
        .as_deref()
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.strip_suffix('-'))
        .and_then(|s| s.parse::<usize>().ok());
    match start {
        Some(s) if s < total => respond(
            &mut stream,
            "206 Partial Content",
            &[
                ("Content-Length".into(), (total - s).to_string()),
                (
                    "Content-Range".into(),
                    format!("bytes {s}-{}/{total}", total - 1),
                ),
            ],
            &bytes[s..],
        ),
        _ => {
            let headers = [
                ("Content-Length".into(), total.to_string()),
                ("Accept-Ranges".into(), "bytes".into()),
            ];
            if !head_only && state.truncate_once.lock().unwrap().remove(sha) {
                // announce everything, send half, hang up
                let mut head = "HTTP/1.1 200 OK\r\nConnection: close\r\n".to_string();
                for (k, v) in &headers {
                    head.push_str(&format!("{k}: {v}\r\n"));
                }
                head.push_str("\r\n");
                stream.write_all(head.as_bytes())?;
                stream.write_all(&bytes[..total / 2])?;
                stream.flush()?;
                return stream.shutdown(std::net::Shutdown::Both);
            }
            respond(&mut stream, "200 OK", &headers, &bytes)
        }
    }
}

fn read_dir_files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect()
}

fn sha(bytes: &[u8]) -> String {
    kev_release::manifest::sha256_hex(bytes)
}

/// The same options with pins of another repository, so the Kev source is unpinned.
fn options_unpinned(options: &dyn Fn(&str) -> PrepareOptions, out: &str) -> PrepareOptions {
    let mut o = options(out);
    o.pins.kev.repo = "someone/else".into();
    o
}

fn set_env(k: &str, v: Option<&str>) {
    // SAFETY: this binary holds exactly one test; while it changes the environment no other thread
    // reads it (the server threads never do).
    unsafe {
        match v {
            Some(v) => std::env::set_var(k, v),
            None => std::env::remove_var(k),
        }
    }
}

#[test]
fn prepare_downloads_resumes_and_then_works_offline() {
    let tmp = tempfile::tempdir().unwrap();
    let real = ReleasePins::kev_4b_v1();
    let kev_dir = fixtures().join("release/kev");
    let base_dir = fixtures().join("release/base");
    let pins = ReleasePins {
        name: "synthetic".into(),
        kev: RepoPin::from_dir(&real.kev.repo, &real.kev.revision, &kev_dir).unwrap(),
        base: RepoPin::from_dir(&real.base.repo, &real.base.revision, &base_dir).unwrap(),
        unverified: Vec::new(),
    };
    let mut kev_files = read_dir_files(&kev_dir);
    // stale files the Kev repository carries and the engine must never download
    for stale in ["vocab.json", "merges.txt", "added_tokens.json"] {
        kev_files.insert(stale.into(), b"{\"stale\": true}".to_vec());
    }
    let base_files = read_dir_files(&base_dir);
    let adapter_sha = sha(&kev_files["adapter_model.safetensors"]);
    let head_sha = sha(&kev_files["head.pt"]);
    let shard_sha = sha(&base_files["model.safetensors-00001-of-00002.safetensors"]);
    let state = Arc::new(State {
        repos: vec![
            HubRepo {
                name: real.kev.repo.clone(),
                commit: real.kev.revision.clone(),
                refs: vec!["v1.0".into(), "main".into()],
                files: kev_files,
            },
            HubRepo {
                name: real.base.repo.clone(),
                commit: real.base.revision.clone(),
                refs: vec!["main".into()],
                files: base_files,
            },
        ],
        cdn_origin: Mutex::new(String::new()),
        truncate_once: Mutex::new([adapter_sha.clone()].into()),
        corrupt_once: Mutex::new([head_sha.clone()].into()),
        log: Mutex::new(Vec::new()),
        down: AtomicBool::new(false),
    });
    let hub = TcpListener::bind("127.0.0.1:0").unwrap();
    let cdn = TcpListener::bind("127.0.0.1:0").unwrap();
    let hub_url = format!("http://{}", hub.local_addr().unwrap());
    *state.cdn_origin.lock().unwrap() = format!("http://{}", cdn.local_addr().unwrap());
    serve(hub, state.clone(), "hub");
    serve(cdn, state.clone(), "cdn");

    let hf_home = tmp.path().join("hf-home");
    set_env("HF_ENDPOINT", Some(&hub_url));
    set_env("HF_HOME", Some(hf_home.to_str().unwrap()));
    set_env("HF_TOKEN", Some(TOKEN));
    set_env("HF_HUB_CACHE", None);
    set_env("HF_HUB_OFFLINE", None);

    let options = |out: &str| {
        let mut o = PrepareOptions::new(tmp.path().join(out));
        o.pins = pins.clone();
        o.pins_explicit = true;
        // the tag resolves to the pinned commit on the Hub; the base comes from the pins
        o.kev = Some(Source::Hub {
            repo: real.kev.repo.clone(),
            revision: "v1.0".into(),
        });
        o.hub = HubConfig::from_env();
        o.hub.progress = false;
        o
    };
    let hub_cfg = HubConfig::from_env();
    assert_eq!(hub_cfg.endpoint, hub_url);
    assert_eq!(hub_cfg.cache_dir, hf_home.join("hub"));
    assert_eq!(hub_cfg.token.as_deref(), Some(TOKEN));

    // Run 1: the adapter's transfer breaks off half way and is resumed; head.pt arrives damaged,
    // which its X-Linked-Etag (sha256) exposes before the blob is kept.
    let err = prepare(&options("out1")).unwrap_err();
    match &err {
        PrepareError::Hub(HubError::Corrupt(c)) => {
            assert_eq!(c.file, "head.pt");
            assert_eq!(c.expected, head_sha);
            assert_ne!(c.found, head_sha);
        }
        other => panic!("expected a corrupt download, got {other}"),
    }
    let kev_cache = hf_home.join("hub/models--jaredpalmer--kev-4b");
    assert!(!kev_cache.join(format!("blobs/{head_sha}")).exists());
    assert!(
        !kev_cache
            .join(format!("blobs/{head_sha}.incomplete"))
            .exists()
    );
    {
        let log = state.log.lock().unwrap();
        let adapter_gets: Vec<&Logged> = log
            .iter()
            .filter(|l| l.server == "cdn" && l.path.ends_with(&adapter_sha) && l.method == "GET")
            .collect();
        assert_eq!(adapter_gets.len(), 2, "{adapter_gets:?}");
        assert_eq!(adapter_gets[0].range, None);
        let half = (std::fs::metadata(kev_dir.join("adapter_model.safetensors"))
            .unwrap()
            .len()
            / 2) as usize;
        assert_eq!(
            adapter_gets[1].range.as_deref(),
            Some(format!("bytes={half}-").as_str())
        );
    }

    // Run 2: the first base shard is cut off too; everything completes.
    state
        .truncate_once
        .lock()
        .unwrap()
        .insert(shard_sha.clone());
    let n_before = state.log.lock().unwrap().len();
    let report = prepare(&options("out2")).unwrap();
    let m = &report.manifest;
    assert!(m.sources.iter().all(|s| s.pinned), "{:?}", m.sources);
    assert_eq!(m.pins.as_deref(), Some("synthetic"));
    assert_eq!(m.merge.merged_modules, 62);
    let kev_src = m.sources.iter().find(|s| s.role == "kev").unwrap();
    assert_eq!(kev_src.revision.as_deref(), Some("v1.0"));
    assert_eq!(kev_src.commit.as_deref(), Some(real.kev.revision.as_str()));
    assert!(verify(&tmp.path().join("out2")).unwrap().is_ok());
    {
        let log = state.log.lock().unwrap();
        let run2 = &log[n_before..];
        // the adapter is cached: asked about, not downloaded again
        assert!(
            !run2
                .iter()
                .any(|l| l.server == "cdn" && l.path.ends_with(&adapter_sha))
        );
        let shard_gets: Vec<&Logged> = run2
            .iter()
            .filter(|l| l.server == "cdn" && l.path.ends_with(&shard_sha))
            .collect();
        assert_eq!(shard_gets.len(), 2, "{shard_gets:?}");
        assert!(
            shard_gets[1]
                .range
                .as_deref()
                .is_some_and(|r| r.starts_with("bytes=") && r != "bytes=0-")
        );
        // the token went to the Hub on every request and never to the storage host
        assert!(
            log.iter()
                .filter(|l| l.server == "hub")
                .all(|l| l.auth.is_some())
        );
        assert!(
            log.iter()
                .filter(|l| l.server == "cdn")
                .all(|l| l.auth.is_none())
        );
        // only the files the engine needs were asked for
        for stale in [
            "vocab.json",
            "merges.txt",
            "added_tokens.json",
            "tokenizer_config.json",
        ] {
            assert!(
                !log.iter().any(|l| l.path.ends_with(stale)),
                "{stale} was requested"
            );
        }
        assert!(
            !log.iter()
                .any(|l| l.path.contains("Qwen3.5-4B-Base") && l.path.ends_with("tokenizer.json"))
        );
    }

    // The prepared bytes equal a preparation from the local fixtures.
    let local = tmp.path().join("local");
    let mut lo = PrepareOptions::new(local.clone());
    lo.kev = Some(Source::Dir(kev_dir.clone()));
    lo.base = Some(Source::Dir(base_dir.clone()));
    lo.hub = HubConfig::from_env();
    lo.hub.progress = false;
    let local_report = prepare(&lo).unwrap();
    for rec in &local_report.manifest.outputs {
        if rec.name.ends_with(".safetensors")
            || rec.name.ends_with("index.json")
            || rec.name == "config.json"
        {
            let dl = m.outputs.iter().find(|r| r.name == rec.name).unwrap();
            assert_eq!(dl.sha256, rec.sha256, "{}", rec.name);
        }
    }

    // The Hub cache layout that Python tools share.
    let commit = &real.kev.revision;
    assert_eq!(
        std::fs::read_to_string(kev_cache.join("refs/v1.0"))
            .unwrap()
            .trim(),
        commit
    );
    let snap = kev_cache.join(format!("snapshots/{commit}/head.pt"));
    assert_eq!(
        std::fs::read_link(&snap).unwrap(),
        PathBuf::from(format!("../../blobs/{head_sha}"))
    );
    let cfg_blob = kev_cache.join(format!(
        "blobs/{}",
        FileHashes::of_file(&kev_dir.join("adapter_config.json"))
            .unwrap()
            .git_sha1
            .unwrap()
    ));
    assert!(cfg_blob.is_file());
    for e in std::fs::read_dir(kev_cache.join("blobs")).unwrap() {
        let name = e.unwrap().file_name().into_string().unwrap();
        assert!(!name.ends_with(".incomplete"), "{name} left behind");
    }

    // Run 3: the network is gone; offline mode serves everything from the cache.
    state.down.store(true, Ordering::SeqCst);
    set_env("HF_HUB_OFFLINE", Some("1"));
    let n_before = state.log.lock().unwrap().len();
    let offline = prepare(&options("out3")).unwrap();
    assert_eq!(
        state.log.lock().unwrap().len(),
        n_before,
        "offline mode touched the network"
    );
    for (a, b) in offline.manifest.outputs.iter().zip(&m.outputs) {
        assert_eq!((&a.name, &a.sha256), (&b.name, &b.sha256));
    }

    // Offline and unpinned (pins for another repository): a damaged cached blob is still caught by
    // the Hub's id it is filed under.
    let tok_blob =
        std::fs::canonicalize(kev_cache.join(format!("snapshots/{commit}/tokenizer.json")))
            .unwrap();
    let pristine = std::fs::read(&tok_blob).unwrap();
    let mut damaged = pristine.clone();
    damaged[100] ^= 1;
    std::fs::write(&tok_blob, &damaged).unwrap();
    let mut o = options("out5");
    o.pins.kev.repo = "someone/else".into();
    let err = prepare(&o).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, PrepareError::PinMismatch(_)), "{msg}");
    assert!(
        msg.contains("tokenizer.json") && msg.contains("the Hub's id"),
        "{msg}"
    );
    std::fs::write(&tok_blob, &pristine).unwrap();
    let unpinned = prepare(&options_unpinned(&options, "out6")).unwrap();
    assert!(
        unpinned.warnings.iter().any(|w| w.contains("unpinned")),
        "{:?}",
        unpinned.warnings
    );

    // Offline with an empty cache: a clear refusal.
    set_env(
        "HF_HOME",
        Some(tmp.path().join("empty-home").to_str().unwrap()),
    );
    let err = prepare(&options("out4")).unwrap_err();
    assert!(
        matches!(err, PrepareError::Hub(HubError::NotCached { .. })),
        "{err}"
    );
    assert!(err.to_string().contains("offline"), "{err}");
}
