//! The peers `kev bench` compares against, measured in the same run on the same weights and tokens: the torch
//! reference (transformers; backbone rows and the author's decision row form) and the prompt processing of
//! llama.cpp and of ik_llama.cpp (the CPU-focused fork), both on mainline's GGUFs.
//!
//! Each peer is a script under `tools/bench/` run as a subprocess; this module finds the scripts, sets the peer up on
//! first use (`setup.sh`: a Python with torch, the llama.cpp and ik_llama.cpp builds; all cached under the bench
//! cache), passes the
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
    /// ik_llama.cpp's `llama-bench` with run-time repacking on mainline's GGUFs (`llama_cpp.py --bench-dir`).
    IkLlama,
    /// The author's decision row form through the reference code (`torch_decide.py`).
    TorchDecide,
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Peer::TorchBackbone => "torch backbone",
            Peer::LlamaCpp => "llama.cpp",
            Peer::IkLlama => "ik_llama.cpp",
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
    /// Variables set for every setup and peer process (the bench's AVX2 caps).
    vars: Vec<(String, String)>,
    python: OnceLock<Result<PathBuf, String>>,
    llama: OnceLock<Result<PathBuf, String>>,
    ik_llama: OnceLock<Result<PathBuf, String>>,
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
            vars: Vec::new(),
            python: OnceLock::new(),
            llama: OnceLock::new(),
            ik_llama: OnceLock::new(),
        }
    }

    /// Set these environment variables for every setup and peer process (e.g. `KEV_BENCH_LLAMA_ISA=avx2`).
    pub fn with_vars<K: Into<String>, V: Into<String>>(
        mut self,
        vars: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        self.vars
            .extend(vars.into_iter().map(|(k, v)| (k.into(), v.into())));
        self
    }

    /// The variables set for the peers' processes.
    pub fn vars(&self) -> &[(String, String)] {
        &self.vars
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

    /// The directory holding a fork's `llama-bench` (mainline's also `llama-quantize`), building it on first
    /// use (minutes on 2 cores, once).
    pub fn llama_bin(&self, fork: Fork) -> Result<PathBuf, PeerError> {
        let cell = match fork {
            Fork::Mainline => &self.llama,
            Fork::Ik => &self.ik_llama,
        };
        cell.get_or_init(|| self.setup(fork.setup_name()))
            .clone()
            .map_err(|reason| PeerError::Unavailable {
                peer: fork.peer(),
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
            .envs(self.vars.iter().map(|(k, v)| (k, v)))
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
            .envs(self.vars.iter().map(|(k, v)| (k, v)))
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

mod run;
pub use run::*;

#[cfg(test)]
mod tests;
