//! The peers `kev bench` compares against, measured in the same run on the same weights and tokens: the torch
//! reference (transformers; backbone rows and the author's decision row form) and llama.cpp's prompt processing.
//!
//! Each peer is a script under `tools/bench/` run as a subprocess; this module finds the scripts, sets the peer up on
//! first use (`setup.sh`: a Python with torch, a llama.cpp build; both cached under the bench cache), passes the
//! inputs through files, shows the peer's progress on stderr and parses its JSON answer. It depends on nothing of
//! the engine, so it compiles and tests on its own.
//!
//! A peer that cannot be set up (no Python, no compiler, no network for the first install) is
//! [`PeerError::Unavailable`]: the bench prints `peer unavailable: …` and goes on without it. A peer that was set up
//! but failed or answered something unexpected is [`PeerError::Failed`].
//!
//! Environment: `KEV_BENCH_CACHE` (cache root, default `target/bench-cache` of the source tree), `KEV_BENCH_PYTHON` (an existing
//! interpreter with torch, transformers, peft: skips the venv install), `KEV_BENCH_TOOLS` (the `tools/bench`
//! directory, when the binary does not run from its source tree).

use std::collections::VecDeque;
use std::ffi::OsString;
use std::fmt;
use std::io::{self, BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use serde::Deserialize;

/// Seed of the bench token stream that `kev bench` and the torch peer share (`"kev"` in ASCII).
pub const BENCH_SEED: u64 = 0x006b_6576;
/// Ordinary (non-special) tokens of the Qwen3.5 vocabulary: random rows draw ids below this.
pub const ORDINARY_VOCAB: u32 = 248_044;
/// Default cache root for peer installs, builds and converted models.
/// The cache root when `KEV_BENCH_CACHE` is unset, relative to the repository root (`tools/bench/../..`).
pub const DEFAULT_CACHE: &str = "target/bench-cache";

/// The repository root of a `tools/bench` directory (its grandparent), made absolute when it can be.
fn repo_root(tools: &std::path::Path) -> PathBuf {
    let root = tools.join("../..");
    root.canonicalize().unwrap_or(root)
}

/// How many of a failing peer's last stderr lines go into its error.
const TAIL_LINES: usize = 12;

/// The first `n` ids of the bench stream: splitmix64 from `seed`, each output modulo `vocab`.
///
/// `tools/bench/common.py` (`bench_ids`) draws the same stream, so the torch peer's rows equal ours whichever side
/// generates them. A row of `n` tokens is a prefix of every longer row.
pub fn bench_ids(n: usize, seed: u64, vocab: u32) -> Vec<u32> {
    let vocab = u64::from(vocab.max(1));
    let mut state = seed;
    (0..n)
        .map(|_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            // The remainder is below `vocab`, itself a u32.
            (z % vocab) as u32
        })
        .collect()
}

/// Which peer an error or a result is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peer {
    /// transformers' Qwen3.5 backbone, one row without cache (`torch_backbone.py`).
    TorchBackbone,
    /// llama.cpp's `llama-bench` prompt processing on a converted GGUF (`llama_cpp.py`).
    LlamaCpp,
    /// The author's decision row form through the reference code (`torch_decide.py`).
    TorchDecide,
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Peer::TorchBackbone => "torch backbone",
            Peer::LlamaCpp => "llama.cpp",
            Peer::TorchDecide => "torch decide",
        })
    }
}

/// Why a peer gave no timing.
#[derive(Debug)]
pub enum PeerError {
    /// The peer could not be set up here; the bench goes on without it.
    Unavailable {
        /// The peer.
        peer: Peer,
        /// What is missing, with the failing step's last output lines.
        reason: String,
    },
    /// The peer was set up but its run failed or its answer did not fit the question.
    Failed {
        /// The peer.
        peer: Peer,
        /// What went wrong, with the script's last output lines.
        reason: String,
    },
}

impl PeerError {
    /// True for a peer that could not be set up (print "peer unavailable" and go on).
    pub fn is_unavailable(&self) -> bool {
        matches!(self, PeerError::Unavailable { .. })
    }

    /// The peer concerned.
    pub fn peer(&self) -> Peer {
        match self {
            PeerError::Unavailable { peer, .. } | PeerError::Failed { peer, .. } => *peer,
        }
    }
}

impl fmt::Display for PeerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PeerError::Unavailable { peer, reason } => {
                write!(f, "peer unavailable: {peer}: {reason}")
            }
            PeerError::Failed { peer, reason } => write!(f, "peer failed: {peer}: {reason}"),
        }
    }
}

impl std::error::Error for PeerError {}

/// Compute type of a torch peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TorchDtype {
    /// float32 everywhere (the author's reference arm for `torch_decide`).
    Float32,
    /// bfloat16 weights and activations (for `torch_decide`: the LoRA merged first, head in fp32).
    Bfloat16,
}

impl TorchDtype {
    fn arg(self) -> &'static str {
        match self {
            TorchDtype::Float32 => "float32",
            TorchDtype::Bfloat16 => "bfloat16",
        }
    }
}

/// Where the peer scripts and the cache are, and how many threads the peers get.
#[derive(Debug)]
pub struct PeerEnv {
    tools: PathBuf,
    cache: PathBuf,
    threads: usize,
    python: OnceLock<Result<PathBuf, String>>,
    llama: OnceLock<Result<PathBuf, String>>,
}

impl PeerEnv {
    /// From the environment: `KEV_BENCH_TOOLS`, else this source tree's `tools/bench`, else `./tools/bench`;
    /// `KEV_BENCH_CACHE` or [`DEFAULT_CACHE`]; every core (`KEV_BENCH_PYTHON` is read by `setup.sh`).
    pub fn from_env() -> Result<Self, PeerError> {
        let tools = find_tools(std::env::var_os("KEV_BENCH_TOOLS")).ok_or_else(|| PeerError::Unavailable {
            peer: Peer::TorchBackbone,
            reason: "tools/bench not found: set KEV_BENCH_TOOLS to the repository's tools/bench directory".into(),
        })?;
        let cache = std::env::var_os("KEV_BENCH_CACHE")
            .filter(|v| !v.is_empty())
            .map_or_else(|| repo_root(&tools).join(DEFAULT_CACHE), PathBuf::from);
        Ok(Self::new(tools, cache))
    }

    /// Explicit script directory (`tools/bench`) and cache root; every core.
    pub fn new(tools: impl Into<PathBuf>, cache: impl Into<PathBuf>) -> Self {
        Self {
            tools: tools.into(),
            cache: cache.into(),
            threads: std::thread::available_parallelism().map_or(1, usize::from),
            python: OnceLock::new(),
            llama: OnceLock::new(),
        }
    }

    /// Threads every peer runs with (torch intra-op threads, llama-bench `-t`).
    pub fn with_threads(mut self, threads: usize) -> Self {
        self.threads = threads.max(1);
        self
    }

    /// Use this interpreter for the Python peers as it is, without `setup.sh torch` (the tests' fake
    /// interpreters; `kev bench` goes through `setup.sh`, which checks `KEV_BENCH_PYTHON`'s imports).
    #[cfg(test)]
    pub fn with_python(self, python: impl Into<PathBuf>) -> Self {
        // A fresh OnceLock is empty, so this set cannot fail.
        let _ = self.python.set(Ok(python.into()));
        self
    }

    /// The cache root.
    pub fn cache_dir(&self) -> &Path {
        &self.cache
    }

    /// Threads the peers run with.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The Python interpreter of the torch peers, creating the bench venv on first use (minutes, once).
    pub fn python(&self, peer: Peer) -> Result<PathBuf, PeerError> {
        self.python
            .get_or_init(|| self.setup("torch"))
            .clone()
            .map_err(|reason| PeerError::Unavailable { peer, reason })
    }

    /// The directory holding `llama-bench`, building llama.cpp on first use (~4 min on 2 cores, once).
    pub fn llama_bin(&self) -> Result<PathBuf, PeerError> {
        self.llama
            .get_or_init(|| self.setup("llama"))
            .clone()
            .map_err(|reason| PeerError::Unavailable {
                peer: Peer::LlamaCpp,
                reason,
            })
    }

    fn setup(&self, what: &str) -> Result<PathBuf, String> {
        let script = self.tools.join("setup.sh");
        if !script.is_file() {
            return Err(format!("{} not found", script.display()));
        }
        let mut cmd = Command::new("bash");
        cmd.arg(&script)
            .arg(what)
            .env("KEV_BENCH_CACHE", &self.cache);
        eprintln!(
            "[peers] setting up {what} (cached under {})",
            self.cache.display()
        );
        let out = run_logged(&mut cmd, true)
            .map_err(|e| format!("cannot run bash {}: {e}", script.display()))?;
        if !out.success {
            return Err(format!(
                "setup.sh {what} failed ({}){}",
                out.status,
                out.tail()
            ));
        }
        let line = out
            .stdout
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("")
            .trim();
        if line.is_empty() {
            return Err(format!("setup.sh {what} printed no path"));
        }
        Ok(PathBuf::from(line))
    }

    fn run_dir(&self, peer: Peer) -> Result<PathBuf, PeerError> {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let dir = self
            .cache
            .join("runs")
            .join(format!("{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| PeerError::Unavailable {
            peer,
            reason: format!("cannot create {}: {e}", dir.display()),
        })?;
        Ok(dir)
    }

    /// Run one peer script under the bench Python; its JSON answer is written to `out`.
    fn run_script(
        &self,
        peer: Peer,
        python: &Path,
        script: &str,
        args: &[OsString],
        out: &Path,
    ) -> Result<Vec<u8>, PeerError> {
        let path = self.tools.join(script);
        if !path.is_file() {
            return Err(PeerError::Unavailable {
                peer,
                reason: format!("{} not found", path.display()),
            });
        }
        let mut cmd = Command::new(python);
        cmd.arg(&path)
            .args(args)
            .arg("--out")
            .arg(out)
            .env("KEV_BENCH_CACHE", &self.cache);
        eprintln!("[peers] {peer}: {} {script} …", python.display());
        let res = run_logged(&mut cmd, false).map_err(|e| PeerError::Unavailable {
            peer,
            reason: format!("cannot run {}: {e}", python.display()),
        })?;
        if !res.success {
            return Err(PeerError::Failed {
                peer,
                reason: format!("{script} failed ({}){}", res.status, res.tail()),
            });
        }
        std::fs::read(out).map_err(|e| PeerError::Failed {
            peer,
            reason: format!("{script} wrote no {}: {e}", out.display()),
        })
    }
}

fn find_tools(explicit: Option<OsString>) -> Option<PathBuf> {
    let has_setup = |p: &Path| p.join("setup.sh").is_file();
    if let Some(dir) = explicit.filter(|v| !v.is_empty()) {
        let dir = PathBuf::from(dir);
        return has_setup(&dir).then_some(dir);
    }
    // A binary built in this repository finds its scripts without configuration.
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tools/bench");
    if has_setup(&source) {
        return Some(source);
    }
    let cwd = PathBuf::from("tools/bench");
    has_setup(&cwd).then_some(cwd)
}

/// What a finished subprocess left: exit status, captured stdout (if asked), the last stderr lines.
struct Finished {
    success: bool,
    status: String,
    stdout: String,
    tail: Vec<String>,
}

impl Finished {
    fn tail(&self) -> String {
        if self.tail.is_empty() {
            String::new()
        } else {
            format!(":\n  {}", self.tail.join("\n  "))
        }
    }
}

/// Run `cmd`, echoing its stderr to ours line by line while keeping the last lines for an error message. Its
/// stdout is captured when `capture` (setup.sh answers there), else sent to our stderr so that `kev bench`'s own
/// stdout (tables, JSON) stays clean.
fn run_logged(cmd: &mut Command, capture: bool) -> io::Result<Finished> {
    cmd.stdin(Stdio::null()).stderr(Stdio::piped());
    if capture {
        cmd.stdout(Stdio::piped());
    } else {
        cmd.stdout(Stdio::from(io::stderr()));
    }
    let mut child = cmd.spawn()?;
    let tail = Arc::new(Mutex::new(VecDeque::with_capacity(TAIL_LINES)));
    let stderr = child.stderr.take();
    let keeper = {
        let tail = Arc::clone(&tail);
        std::thread::spawn(move || {
            let Some(stderr) = stderr else { return };
            let mut reader = BufReader::new(stderr);
            let mut buf = Vec::new();
            loop {
                buf.clear();
                match reader.read_until(b'\n', &mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        let _ = io::stderr().write_all(&buf);
                        // Progress bars redraw with \r: keep only what a terminal would finally show.
                        let text = String::from_utf8_lossy(&buf);
                        let line = text
                            .trim_end()
                            .rsplit('\r')
                            .next()
                            .unwrap_or("")
                            .trim_end()
                            .to_string();
                        if !line.is_empty() {
                            let mut t = tail.lock().unwrap_or_else(|p| p.into_inner());
                            if t.len() == TAIL_LINES {
                                t.pop_front();
                            }
                            t.push_back(line);
                        }
                    }
                }
            }
        })
    };
    let mut stdout = String::new();
    if let Some(mut out) = child.stdout.take() {
        io::Read::read_to_string(&mut out, &mut stdout)?;
    }
    let status = child.wait()?;
    let _ = keeper.join();
    let tail = tail
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .cloned()
        .collect();
    Ok(Finished {
        success: status.success(),
        status: status.to_string(),
        stdout,
        tail,
    })
}

/// One row length's timing.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct Timing {
    /// Tokens in the row.
    pub tokens: usize,
    /// Median wall time of the timed runs, seconds (the figure to compare).
    pub median_s: f64,
    /// Fastest run, seconds.
    pub min_s: f64,
    /// Slowest run, seconds.
    pub max_s: f64,
    /// Every timed run, seconds.
    pub samples_s: Vec<f64>,
}

/// A backbone peer's answer.
#[derive(Clone, Debug)]
pub struct BackboneRun {
    /// Which peer.
    pub peer: Peer,
    /// For tables: e.g. `torch 2.15.0 float32` or `llama.cpp 0c1e570 bf16`.
    pub label: String,
    /// Threads it ran with.
    pub threads: usize,
    /// Peak resident set of the peer's process, bytes.
    pub peak_rss_bytes: Option<u64>,
    /// One entry per requested row, in request order.
    pub timings: Vec<Timing>,
    /// The script's whole JSON answer (versions, build, conversion details) for the bench's JSON report.
    pub raw: serde_json::Value,
}

impl BackboneRun {
    /// The median for a row length, if it was timed.
    #[cfg(test)]
    pub fn median_for(&self, tokens: usize) -> Option<f64> {
        self.timings
            .iter()
            .find(|t| t.tokens == tokens)
            .map(|t| t.median_s)
    }
}

/// One request's timing in the torch decision peer.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct RequestTiming {
    /// Questions in the request (= rows run).
    pub questions: usize,
    /// Tokens of each question's row (state + branch), in question order.
    pub row_tokens: Vec<usize>,
    /// The response's `usage.input_tokens`.
    pub input_tokens: usize,
    /// Median wall time per request (tokenize + every row from zero + head), seconds.
    pub median_s: f64,
    /// Fastest run, seconds.
    pub min_s: f64,
    /// Slowest run, seconds.
    pub max_s: f64,
    /// Every timed run, seconds.
    pub samples_s: Vec<f64>,
    /// The unrounded probabilities of the last run, per question in request order (to check both engines
    /// answered the same thing).
    pub probabilities: Vec<Vec<f64>>,
}

/// The torch decision peer's answer.
#[derive(Clone, Debug)]
pub struct DecideRun {
    /// For tables: e.g. `torch 2.15.0 reference fp32`.
    pub label: String,
    /// Threads it ran with.
    pub threads: usize,
    /// Peak resident set of the peer's process, bytes.
    pub peak_rss_bytes: Option<u64>,
    /// One entry per request, in request order.
    pub requests: Vec<RequestTiming>,
    /// The script's whole JSON answer.
    pub raw: serde_json::Value,
}

#[derive(Deserialize)]
struct BackboneDoc {
    threads: usize,
    peak_rss_bytes: Option<u64>,
    results: Vec<Timing>,
}

#[derive(Deserialize)]
struct DecideDoc {
    threads: usize,
    arm: String,
    peak_rss_bytes: Option<u64>,
    requests: Vec<RequestTiming>,
}

fn failed(peer: Peer, reason: impl Into<String>) -> PeerError {
    PeerError::Failed {
        peer,
        reason: reason.into(),
    }
}

fn check_runs(peer: Peer, runs: usize) -> Result<(), PeerError> {
    if runs == 0 {
        Err(failed(peer, "runs must be at least 1"))
    } else {
        Ok(())
    }
}

fn write_file(peer: Peer, path: &Path, bytes: &[u8]) -> Result<(), PeerError> {
    std::fs::write(path, bytes)
        .map_err(|e| failed(peer, format!("cannot write {}: {e}", path.display())))
}

fn str_at<'a>(v: &'a serde_json::Value, path: &[&str]) -> Option<&'a str> {
    path.iter().try_fold(v, |v, k| v.get(k))?.as_str()
}

fn parse_backbone(
    peer: Peer,
    bytes: &[u8],
    lengths: &[usize],
    label: impl FnOnce(&serde_json::Value) -> String,
) -> Result<BackboneRun, PeerError> {
    let raw: serde_json::Value = serde_json::from_slice(bytes)
        .map_err(|e| failed(peer, format!("unreadable answer: {e}")))?;
    let doc = BackboneDoc::deserialize(&raw)
        .map_err(|e| failed(peer, format!("unexpected answer: {e}")))?;
    let got: Vec<usize> = doc.results.iter().map(|t| t.tokens).collect();
    if got != lengths {
        return Err(failed(
            peer,
            format!("timed rows of {got:?} tokens, asked for {lengths:?}"),
        ));
    }
    if let Some(t) = doc
        .results
        .iter()
        .find(|t| t.samples_s.is_empty() || !(t.median_s.is_finite() && t.median_s > 0.0))
    {
        return Err(failed(
            peer,
            format!("no valid timing for {} tokens", t.tokens),
        ));
    }
    Ok(BackboneRun {
        peer,
        label: label(&raw),
        threads: doc.threads,
        peak_rss_bytes: doc.peak_rss_bytes,
        timings: doc.results,
        raw,
    })
}

fn parse_decide(bytes: &[u8], n_requests: usize) -> Result<DecideRun, PeerError> {
    let peer = Peer::TorchDecide;
    let raw: serde_json::Value = serde_json::from_slice(bytes)
        .map_err(|e| failed(peer, format!("unreadable answer: {e}")))?;
    let doc = DecideDoc::deserialize(&raw)
        .map_err(|e| failed(peer, format!("unexpected answer: {e}")))?;
    if doc.requests.len() != n_requests {
        return Err(failed(
            peer,
            format!(
                "answered {} requests, asked {n_requests}",
                doc.requests.len()
            ),
        ));
    }
    if let Some((i, _)) = doc.requests.iter().enumerate().find(|(_, r)| {
        r.samples_s.is_empty()
            || r.probabilities.len() != r.questions
            || r.row_tokens.len() != r.questions
    }) {
        return Err(failed(peer, format!("request {i}: inconsistent answer")));
    }
    let version = str_at(&raw, &["versions", "torch"]).unwrap_or("?");
    let label = format!("torch {version} {}", doc.arm);
    Ok(DecideRun {
        label,
        threads: doc.threads,
        peak_rss_bytes: doc.peak_rss_bytes,
        requests: doc.requests,
        raw,
    })
}

/// Runs the run directory's cleanup when dropped on success.
struct RunDir(PathBuf);

impl RunDir {
    fn done(self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// transformers' Qwen3.5 text backbone on `rows` (each its own row from position 0, no cache): one warm-up and
/// `runs` timed runs per row, median wall time each. `model` is a base directory (config.json + shards).
/// Build rows with [`bench_ids`] so they equal the engine's.
pub fn torch_backbone(
    env: &PeerEnv,
    model: &Path,
    rows: &[Vec<u32>],
    dtype: TorchDtype,
    runs: usize,
) -> Result<BackboneRun, PeerError> {
    let peer = Peer::TorchBackbone;
    check_runs(peer, runs)?;
    if rows.is_empty() || rows.iter().any(Vec::is_empty) {
        return Err(failed(peer, "rows must be non-empty"));
    }
    let python = env.python(peer)?;
    let dir = RunDir(env.run_dir(peer)?);
    let ids = dir.0.join("ids.json");
    let doc = serde_json::json!({ "rows": rows });
    write_file(peer, &ids, doc.to_string().as_bytes())?;
    let args: Vec<OsString> = vec![
        "--model".into(),
        model.into(),
        "--ids".into(),
        ids.into(),
        "--dtype".into(),
        dtype.arg().into(),
        "--runs".into(),
        runs.to_string().into(),
        "--warmup".into(),
        "1".into(),
        "--threads".into(),
        env.threads.to_string().into(),
    ];
    let out = dir.0.join("torch_backbone.json");
    let bytes = env.run_script(peer, &python, "torch_backbone.py", &args, &out)?;
    let lengths: Vec<usize> = rows.iter().map(Vec::len).collect();
    let run = parse_backbone(peer, &bytes, &lengths, |raw| {
        format!(
            "torch {} {}",
            str_at(raw, &["versions", "torch"]).unwrap_or("?"),
            dtype.arg()
        )
    })?;
    dir.done();
    Ok(run)
}

/// llama.cpp's prompt processing (`llama-bench -p N -n 0`) on `model` converted to a GGUF of `outtype` (`bf16`,
/// `q8_0`, …) by llama.cpp's own converter; builds llama.cpp and converts the model on first use (both cached). llama-bench draws its own random
/// prompt ids: prompt processing costs the same whatever the ids, so only the lengths are passed.
pub fn llama_cpp_backbone(
    env: &PeerEnv,
    model: &Path,
    lengths: &[usize],
    runs: usize,
    outtype: &str,
) -> Result<BackboneRun, PeerError> {
    let peer = Peer::LlamaCpp;
    check_runs(peer, runs)?;
    if lengths.is_empty() || lengths.contains(&0) {
        return Err(failed(peer, "lengths must be positive"));
    }
    let bin = env.llama_bin()?;
    // setup.sh answers `<llama dir>/build/bin`.
    let llama_dir = bin
        .parent()
        .and_then(Path::parent)
        .ok_or_else(|| PeerError::Unavailable {
            peer,
            reason: format!("unexpected llama.cpp bin dir {}", bin.display()),
        })?
        .to_path_buf();
    let python = env.python(peer)?;
    let dir = RunDir(env.run_dir(peer)?);
    let tokens = lengths
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let args: Vec<OsString> = vec![
        "--llama-dir".into(),
        llama_dir.into(),
        "--gguf-cache".into(),
        env.cache.join("gguf").into(),
        "--model".into(),
        model.into(),
        "--outtype".into(),
        outtype.into(),
        "--tokens".into(),
        tokens.into(),
        "--runs".into(),
        runs.to_string().into(),
        "--threads".into(),
        env.threads.to_string().into(),
    ];
    let out = dir.0.join("llama_cpp.json");
    let bytes = env.run_script(peer, &python, "llama_cpp.py", &args, &out)?;
    let run = parse_backbone(peer, &bytes, lengths, |raw| {
        format!(
            "llama.cpp {} {outtype}",
            str_at(raw, &["llama", "build_commit"]).unwrap_or("?")
        )
    })?;
    dir.done();
    Ok(run)
}

/// The author's decision path on raw request bodies: per request, render + tokenize, every question as its own
/// row from zero (`Float32`: the reference arm, LoRA unmerged through PEFT; `Bfloat16`: merged, cast), pointer
/// head; one warm-up pass, then `runs` timed passes, median per request. `base`/`kev` are the release directories.
pub fn torch_decide(
    env: &PeerEnv,
    base: &Path,
    kev: &Path,
    requests: &[&[u8]],
    dtype: TorchDtype,
    runs: usize,
) -> Result<DecideRun, PeerError> {
    let peer = Peer::TorchDecide;
    check_runs(peer, runs)?;
    if requests.is_empty() {
        return Err(failed(peer, "no requests"));
    }
    let python = env.python(peer)?;
    let dir = RunDir(env.run_dir(peer)?);
    let mut jsonl = Vec::new();
    for body in requests {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Err(failed(peer, "an empty request body"));
        }
        // JSON allows raw line breaks only as whitespace between tokens (inside strings they must be escaped), so
        // turning them into spaces keeps every body's meaning byte for byte and makes it one JSONL line.
        jsonl.extend(
            body.iter()
                .map(|&b| if b == b'\n' || b == b'\r' { b' ' } else { b }),
        );
        jsonl.push(b'\n');
    }
    let file = dir.0.join("requests.jsonl");
    write_file(peer, &file, &jsonl)?;
    let args: Vec<OsString> = vec![
        "--base".into(),
        base.into(),
        "--kev".into(),
        kev.into(),
        "--requests".into(),
        file.into(),
        "--dtype".into(),
        dtype.arg().into(),
        "--runs".into(),
        runs.to_string().into(),
        "--warmup".into(),
        "1".into(),
        "--threads".into(),
        env.threads.to_string().into(),
    ];
    let out = dir.0.join("torch_decide.json");
    let bytes = env.run_script(peer, &python, "torch_decide.py", &args, &out)?;
    let run = parse_decide(&bytes, requests.len())?;
    dir.done();
    Ok(run)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bench_ids_equal_the_python_stream() {
        // Values printed by tools/bench/common.py `bench_ids` (the torch peer's own generator).
        assert_eq!(
            bench_ids(8, BENCH_SEED, ORDINARY_VOCAB),
            [197003, 246589, 150328, 33122, 110518, 82963, 221674, 187950]
        );
        assert_eq!(bench_ids(4, 0, 1000), [535, 700, 679, 444]);
        assert_eq!(
            bench_ids(3, u64::MAX, u32::MAX),
            [4103576, 3314973489, 3936516661]
        );
    }

    #[test]
    fn bench_rows_are_prefixes_and_in_range() {
        let long = bench_ids(1518, BENCH_SEED, ORDINARY_VOCAB);
        assert_eq!(bench_ids(94, BENCH_SEED, ORDINARY_VOCAB), long[..94]);
        assert!(long.iter().all(|&t| t < ORDINARY_VOCAB));
        assert_ne!(bench_ids(94, BENCH_SEED + 1, ORDINARY_VOCAB), long[..94]);
        assert!(bench_ids(0, BENCH_SEED, ORDINARY_VOCAB).is_empty());
    }

    /// A scratch `tools/bench` with a fake interpreter (a bash script) standing in for Python.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Self {
            static N: AtomicUsize = AtomicUsize::new(0);
            let dir = std::env::temp_dir().join(format!(
                "kev-peers-{name}-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(dir.join("tools")).unwrap();
            Scratch(dir)
        }

        fn tools(&self) -> PathBuf {
            self.0.join("tools")
        }

        fn file(&self, rel: &str, text: &str) -> PathBuf {
            let p = self.0.join(rel);
            std::fs::write(&p, text).unwrap();
            p
        }

        /// An interpreter that runs `body` with the script path in $1 and the other arguments after it; `$OUT` is
        /// the value of `--out`.
        fn python(&self, body: &str) -> PathBuf {
            let p = self.file(
                "python",
                &format!(
                    "#!/usr/bin/env bash\nset -eu\nOUT=\nprev=\nfor a in \"$@\"; do [ \"$prev\" = --out ] && OUT=$a; prev=$a; done\n{body}\n"
                ),
            );
            let status = Command::new("chmod").arg("+x").arg(&p).status().unwrap();
            assert!(status.success());
            p
        }

        fn env(&self) -> PeerEnv {
            PeerEnv::new(self.tools(), self.0.join("cache")).with_threads(2)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn backbone_answer(lengths: &[usize]) -> String {
        let results: Vec<_> = lengths
            .iter()
            .map(|&n| {
                let s = n as f64 / 100.0;
                serde_json::json!({"tokens": n, "runs": 2, "warmup": 1, "median_s": s, "min_s": s, "max_s": s,
                                   "samples_s": [s, s]})
            })
            .collect();
        serde_json::json!({"peer": "torch", "kind": "backbone", "threads": 2, "peak_rss_bytes": 1234,
                           "versions": {"torch": "2.15.0"}, "results": results})
        .to_string()
    }

    #[test]
    fn torch_backbone_passes_the_rows_and_parses_the_answer() {
        let s = Scratch::new("tb");
        s.file("tools/torch_backbone.py", "# stand-in\n");
        let answer = s.file("answer.json", &backbone_answer(&[94, 380]));
        let seen = s.0.join("seen-ids.json");
        // Record the ids file and the arguments the script got, then answer.
        let py = s.python(&format!(
            "prev=; for a in \"$@\"; do [ \"$prev\" = --ids ] && cp \"$a\" {seen}; prev=$a; done\n\
             echo \"$@\" > {args}\necho progress >&2\ncp {answer} \"$OUT\"",
            seen = seen.display(),
            args = s.0.join("args").display(),
            answer = answer.display()
        ));
        let env = s.env().with_python(&py);
        let rows = vec![
            bench_ids(94, BENCH_SEED, ORDINARY_VOCAB),
            bench_ids(380, BENCH_SEED, ORDINARY_VOCAB),
        ];
        let run = torch_backbone(
            &env,
            Path::new("/models/base"),
            &rows,
            TorchDtype::Bfloat16,
            2,
        )
        .unwrap();
        assert_eq!(run.label, "torch 2.15.0 bfloat16");
        assert_eq!(run.peak_rss_bytes, Some(1234));
        assert_eq!(run.median_for(380), Some(3.8));
        assert_eq!(run.median_for(1518), None);
        let ids: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&seen).unwrap()).unwrap();
        let got: Vec<Vec<u32>> = serde_json::from_value(ids["rows"].clone()).unwrap();
        assert_eq!(got, rows);
        let args = std::fs::read_to_string(s.0.join("args")).unwrap();
        assert!(args.contains("--model /models/base"), "{args}");
        assert!(
            args.contains("--dtype bfloat16 --runs 2 --warmup 1 --threads 2"),
            "{args}"
        );
        // The run directory is removed after a good run.
        assert_eq!(
            std::fs::read_dir(s.0.join("cache/runs")).unwrap().count(),
            0
        );
    }

    #[test]
    fn an_answer_for_other_lengths_is_a_failure() {
        let s = Scratch::new("len");
        s.file("tools/torch_backbone.py", "");
        let answer = s.file("answer.json", &backbone_answer(&[94]));
        let py = s.python(&format!("cp {} \"$OUT\"", answer.display()));
        let env = s.env().with_python(&py);
        let err = torch_backbone(
            &env,
            Path::new("m"),
            &[vec![1; 94], vec![2; 95]],
            TorchDtype::Float32,
            1,
        )
        .unwrap_err();
        assert!(!err.is_unavailable(), "{err}");
        assert!(err.to_string().contains("asked for [94, 95]"), "{err}");
    }

    #[test]
    fn a_failing_script_reports_its_last_lines() {
        let s = Scratch::new("fail");
        s.file("tools/torch_backbone.py", "");
        let py = s.python("echo 'Traceback: out of memory' >&2\nexit 3");
        let env = s.env().with_python(&py);
        let err = torch_backbone(&env, Path::new("m"), &[vec![1, 2]], TorchDtype::Float32, 1)
            .unwrap_err();
        assert_eq!(err.peer(), Peer::TorchBackbone);
        assert!(!err.is_unavailable());
        let msg = err.to_string();
        assert!(
            msg.starts_with("peer failed: torch backbone: torch_backbone.py failed"),
            "{msg}"
        );
        assert!(msg.contains("Traceback: out of memory"), "{msg}");
    }

    #[test]
    fn a_peer_that_cannot_be_set_up_is_unavailable() {
        let s = Scratch::new("setup");
        s.file(
            "tools/setup.sh",
            "echo '[bench setup] error: no python3 >= 3.10' >&2\nexit 1\n",
        );
        let env = s.env();
        let err =
            torch_backbone(&env, Path::new("m"), &[vec![1]], TorchDtype::Float32, 1).unwrap_err();
        assert!(err.is_unavailable(), "{err}");
        let msg = err.to_string();
        assert!(
            msg.starts_with("peer unavailable: torch backbone: setup.sh torch failed"),
            "{msg}"
        );
        assert!(msg.contains("no python3 >= 3.10"), "{msg}");
        // llama.cpp's setup fails the same way.
        let err = llama_cpp_backbone(&env, Path::new("m"), &[94], 1, "bf16").unwrap_err();
        assert!(
            err.is_unavailable() && err.peer() == Peer::LlamaCpp,
            "{err}"
        );
        // No scripts at all: unavailable too.
        let err = torch_backbone(
            &PeerEnv::new(s.0.join("nowhere"), s.0.join("c")),
            Path::new("m"),
            &[vec![1]],
            TorchDtype::Float32,
            1,
        )
        .unwrap_err();
        assert!(err.is_unavailable(), "{err}");
    }

    #[test]
    fn setup_answers_the_last_stdout_line() {
        let s = Scratch::new("answer");
        let py = s.python("exit 0");
        s.file(
            "tools/setup.sh",
            &format!("echo noise\necho {}\necho building >&2\n", py.display()),
        );
        assert_eq!(s.env().python(Peer::TorchDecide).unwrap(), py);
    }

    #[test]
    fn torch_decide_sends_one_line_per_request_and_checks_the_answer() {
        let s = Scratch::new("decide");
        s.file("tools/torch_decide.py", "");
        let seen = s.0.join("seen.jsonl");
        let answer = serde_json::json!({
        "peer": "torch", "kind": "decide", "arm": "reference", "threads": 2, "peak_rss_bytes": 99,
        "versions": {"torch": "2.15.0"},
        "requests": [
            {"index": 0, "questions": 1, "row_tokens": [94], "input_tokens": 94, "median_s": 0.5, "min_s": 0.4,
             "max_s": 0.6, "samples_s": [0.4, 0.5, 0.6], "tokenize_median_s": 0.001, "probabilities": [[0.25, 0.75]]},
            {"index": 1, "questions": 2, "row_tokens": [30, 31], "input_tokens": 40, "median_s": 0.7, "min_s": 0.7,
             "max_s": 0.7, "samples_s": [0.7], "tokenize_median_s": 0.001, "probabilities": [[1.0], [0.5, 0.5]]}
        ]});
        let answer = s.file("answer.json", &answer.to_string());
        let py = s.python(&format!(
            "prev=; for a in \"$@\"; do [ \"$prev\" = --requests ] && cp \"$a\" {}; prev=$a; done\ncp {} \"$OUT\"",
            seen.display(),
            answer.display()
        ));
        let env = s.env().with_python(&py);
        let bodies: [&[u8]; 2] = [
            b"{\"state\": \"a\\nb\",\r\n \"questions\": {}}",
            b"{\"x\":\n1}",
        ];
        let run = torch_decide(
            &env,
            Path::new("b"),
            Path::new("k"),
            &bodies,
            TorchDtype::Float32,
            3,
        )
        .unwrap();
        assert_eq!(run.label, "torch 2.15.0 reference");
        assert_eq!(run.requests.len(), 2);
        assert_eq!(run.requests[1].row_tokens, [30, 31]);
        assert_eq!(run.requests[0].probabilities, [[0.25, 0.75]]);
        let sent = std::fs::read_to_string(&seen).unwrap();
        assert_eq!(
            sent,
            "{\"state\": \"a\\nb\",   \"questions\": {}}\n{\"x\": 1}\n"
        );
        // Each line is still the same JSON document.
        let first: serde_json::Value = serde_json::from_str(sent.lines().next().unwrap()).unwrap();
        assert_eq!(first["state"], "a\nb");
        // Asking for three requests but getting two answers is a failure.
        let three: [&[u8]; 3] = [b"{}", b"{}", b"{}"];
        let err = torch_decide(
            &env,
            Path::new("b"),
            Path::new("k"),
            &three,
            TorchDtype::Float32,
            1,
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("answered 2 requests, asked 3"),
            "{err}"
        );
    }

    fn env_or(name: &str, default: &str) -> String {
        std::env::var(name).unwrap_or_else(|_| default.to_string())
    }

    /// Every peer for real, on a release, through this API:
    /// `KEV_PEERS_BASE=DIR KEV_PEERS_KEV=DIR [KEV_BENCH_PYTHON=…] cargo test -p kev -- --ignored real_peers --nocapture`.
    /// `KEV_PEERS_TOKENS` (default 94,380,1518), `KEV_PEERS_RUNS` (default 2), `KEV_PEERS_ONLY` (a subset of
    /// `torch-fp32,torch-bf16,llama,decide`; `decide` needs `KEV_PEERS_KEV`). Prints one line per timing.
    #[test]
    #[ignore = "runs torch and llama.cpp for minutes; needs KEV_PEERS_BASE (and KEV_PEERS_KEV)"]
    fn real_peers_end_to_end() {
        let base = PathBuf::from(
            std::env::var("KEV_PEERS_BASE").expect("set KEV_PEERS_BASE to a base release dir"),
        );
        let only = env_or("KEV_PEERS_ONLY", "torch-fp32,torch-bf16,llama,decide");
        let wants = |p: &str| only.split(',').any(|w| w.trim() == p);
        let lengths: Vec<usize> = env_or("KEV_PEERS_TOKENS", "94,380,1518")
            .split(',')
            .map(|t| t.trim().parse().unwrap())
            .collect();
        let runs: usize = env_or("KEV_PEERS_RUNS", "2").parse().unwrap();
        let env = PeerEnv::from_env().unwrap();
        let rows: Vec<Vec<u32>> = lengths
            .iter()
            .map(|&n| bench_ids(n, BENCH_SEED, ORDINARY_VOCAB))
            .collect();
        let gib = |b: Option<u64>| b.map_or(f64::NAN, |b| b as f64 / f64::from(1u32 << 30));
        let mut done = Vec::new();
        for (name, dtype) in [
            ("torch-fp32", TorchDtype::Float32),
            ("torch-bf16", TorchDtype::Bfloat16),
        ] {
            if wants(name) {
                done.push(torch_backbone(&env, &base, &rows, dtype, runs).unwrap());
            }
        }
        if wants("llama") {
            done.push(llama_cpp_backbone(&env, &base, &lengths, runs, "bf16").unwrap());
        }
        for run in &done {
            for t in &run.timings {
                assert!(t.median_s > 0.0 && t.min_s <= t.median_s && t.median_s <= t.max_s);
                println!(
                    "PEER {:<26} {:>5} tokens  median {:>8.3} s  ({:>6.1} tok/s)  peak RSS {:.2} GiB",
                    run.label,
                    t.tokens,
                    t.median_s,
                    t.tokens as f64 / t.median_s,
                    gib(run.peak_rss_bytes)
                );
            }
        }
        if !wants("decide") {
            return;
        }
        let kev = PathBuf::from(
            std::env::var("KEV_PEERS_KEV").expect("set KEV_PEERS_KEV to a Kev release dir"),
        );
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/requests/valid");
        let bodies: Vec<Vec<u8>> = ["state-spec-example", "multi-3"]
            .iter()
            .map(|n| std::fs::read(fixtures.join(format!("{n}.json"))).unwrap())
            .collect();
        let refs: Vec<&[u8]> = bodies.iter().map(Vec::as_slice).collect();
        let run = torch_decide(&env, &base, &kev, &refs, TorchDtype::Float32, runs).unwrap();
        for (i, r) in run.requests.iter().enumerate() {
            for p in &r.probabilities {
                let sum: f64 = p.iter().sum();
                assert!(
                    (sum - 1.0).abs() < 1e-5,
                    "request {i}: probabilities sum to {sum}"
                );
            }
            println!(
                "PEER {:<26} request {i}: {} questions, rows {:?} tokens  median {:>8.3} s  peak RSS {:.2} GiB",
                run.label,
                r.questions,
                r.row_tokens,
                r.median_s,
                gib(run.peak_rss_bytes)
            );
        }
    }

    #[test]
    fn finds_this_repository_scripts() {
        let dir = find_tools(None).expect("tools/bench of this source tree");
        for f in [
            "setup.sh",
            "torch_backbone.py",
            "torch_decide.py",
            "llama_cpp.py",
            "common.py",
            "gguf_convert.py",
        ] {
            assert!(dir.join(f).is_file(), "{f} missing in {}", dir.display());
        }
        assert!(find_tools(Some("/nonexistent/kev-tools".into())).is_none());
    }
}
