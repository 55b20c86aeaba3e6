//! Running the peers and reading their answers: the timings they report, the JSON documents they write,
//! and one function per peer and measurement.

use super::*;

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

/// A llama.cpp-family build whose `llama-bench` is timed (`setup.sh llama` / `setup.sh ik-llama`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fork {
    /// Mainline llama.cpp (vendored by `llama-cpp-python`); its converter and `llama-quantize` make every GGUF.
    Mainline,
    /// ik_llama.cpp (vendored by `ik-llama-cpp-python`), timed with run-time repacking (`-rtr 1`: its int8
    /// dot-product GEMMs on interleaved rows), as its users run it on CPUs.
    Ik,
}

impl Fork {
    /// The `setup.sh` target that builds it.
    pub fn setup_name(self) -> &'static str {
        match self {
            Fork::Mainline => "llama",
            Fork::Ik => "ik-llama",
        }
    }

    /// The peer its errors and results are about.
    pub fn peer(self) -> Peer {
        match self {
            Fork::Mainline => Peer::LlamaCpp,
            Fork::Ik => Peer::IkLlama,
        }
    }

    /// `llama_cpp.py`'s arguments that make it time this fork: the `llama-bench` directory (`None`: the
    /// mainline build's own) and the repacking flag.
    fn script_args(self, bin: &Path) -> Vec<OsString> {
        match self {
            Fork::Mainline => Vec::new(),
            Fork::Ik => vec![
                "--bench-dir".into(),
                bin.into(),
                "--run-time-repack".into(),
                "--peer".into(),
                "ik_llama.cpp".into(),
            ],
        }
    }
}

/// The weights a llama.cpp-family peer times: a GGUF of the base directory, all made by mainline's tools and
/// cached under the bench cache (`<dir name>-<key>.<outtype>.gguf`, the key over the directory's path and its
/// files' names, sizes and mtimes), so both forks time the very same file of a type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Quant {
    /// The converter's BF16 (exact for the BF16 checkpoints).
    Bf16,
    /// The converter's F16.
    F16,
    /// The converter's Q8_0 (8-bit blocks of 32 with an F16 scale).
    Q8_0,
    /// `llama-quantize … Q4_K_M` of the BF16 GGUF: 4-bit K-quants (some tensors 6-bit), outside Kev's
    /// fidelity bar, timed because it is ik_llama.cpp's fastest CPU form.
    Q4KM,
}

impl Quant {
    /// `llama_cpp.py --outtype`, the cached file's suffix and the label's last word.
    pub fn outtype(self) -> &'static str {
        match self {
            Quant::Bf16 => "bf16",
            Quant::F16 => "f16",
            Quant::Q8_0 => "q8_0",
            Quant::Q4KM => "q4_k_m",
        }
    }

    /// The GGUF this one is made from by `llama-quantize`, if it is not written by the converter.
    pub fn quantized_from(self) -> Option<Quant> {
        match self {
            Quant::Q4KM => Some(Quant::Bf16),
            Quant::Bf16 | Quant::F16 | Quant::Q8_0 => None,
        }
    }
}

/// A llama.cpp-family peer's prompt processing (`llama-bench -p N -n 0`, ik_llama.cpp with `-rtr 1`) on `model`
/// as a GGUF of `quant`; builds the fork and makes the GGUF on first use (all cached). llama-bench draws its own
/// random prompt ids: prompt processing costs the same whatever the ids, so only the lengths are passed.
pub fn llama_backbone(
    env: &PeerEnv,
    fork: Fork,
    model: &Path,
    lengths: &[usize],
    runs: usize,
    quant: Quant,
) -> Result<BackboneRun, PeerError> {
    let peer = fork.peer();
    check_runs(peer, runs)?;
    if lengths.is_empty() || lengths.contains(&0) {
        return Err(failed(peer, "lengths must be positive"));
    }
    // Mainline's build makes the GGUFs (converter, llama-quantize) whichever fork is timed.
    let mainline = env.llama_bin(Fork::Mainline).map_err(|e| match e {
        PeerError::Unavailable { reason, .. } => PeerError::Unavailable {
            peer,
            reason: format!("llama.cpp (which makes the GGUFs): {reason}"),
        },
        other => other,
    })?;
    let bin = match fork {
        Fork::Mainline => mainline.clone(),
        Fork::Ik => env.llama_bin(fork)?,
    };
    // setup.sh answers `<llama dir>/build/bin`.
    let llama_dir = mainline
        .parent()
        .and_then(Path::parent)
        .ok_or_else(|| PeerError::Unavailable {
            peer,
            reason: format!("unexpected llama.cpp bin dir {}", mainline.display()),
        })?
        .to_path_buf();
    let python = env.python(peer)?;
    let dir = RunDir(env.run_dir(peer)?);
    let tokens = lengths
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let mut args: Vec<OsString> = vec![
        "--llama-dir".into(),
        llama_dir.into(),
        "--gguf-cache".into(),
        env.cache.join("gguf").into(),
        "--model".into(),
        model.into(),
        "--outtype".into(),
        quant.outtype().into(),
        "--tokens".into(),
        tokens.into(),
        "--runs".into(),
        runs.to_string().into(),
        "--threads".into(),
        env.threads.to_string().into(),
    ];
    args.extend(fork.script_args(&bin));
    let out = dir.0.join("llama_cpp.json");
    let bytes = env.run_script(peer, &python, "llama_cpp.py", &args, &out)?;
    let run = parse_backbone(peer, &bytes, lengths, |raw| llama_label(fork, quant, raw))?;
    dir.done();
    Ok(run)
}

/// `llama.cpp 0c1e570 bf16`, `ik_llama.cpp 55d3c05 q4_k_m rtr`: the build's commit as llama-bench reports it.
fn llama_label(fork: Fork, quant: Quant, raw: &serde_json::Value) -> String {
    let commit = str_at(raw, &["llama", "build_commit"]).unwrap_or("?");
    let repack = if fork == Fork::Ik { " rtr" } else { "" };
    format!("{} {commit} {}{repack}", fork.peer(), quant.outtype())
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
