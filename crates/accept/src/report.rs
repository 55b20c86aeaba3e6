//! The acceptance report: every gate with its numbers, per-arm figures, what was run on what, written as
//! JSON (for machines and diffs) and Markdown (for people).

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value;

use crate::AcceptError;
use crate::metrics::Distance;

/// Outcome of one gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    /// Checked and met.
    Pass,
    /// Checked and not met: the model is not accepted.
    Fail,
    /// Reported, not gated (the report says why).
    Info,
    /// Not run with the inputs given (the report says what it would need).
    NotRun,
}

impl Status {
    /// `PASS`, `FAIL`, `info`, `not run`.
    pub fn label(self) -> &'static str {
        match self {
            Status::Pass => "PASS",
            Status::Fail => "FAIL",
            Status::Info => "info",
            Status::NotRun => "not run",
        }
    }
}

/// One gate.
#[derive(Debug, Clone, Serialize)]
pub struct Gate {
    /// Stable id, e.g. `inputs.kev-pins`, `arm.exact-fp32.bar`.
    pub id: String,
    /// What it checks, in words.
    pub title: String,
    /// Outcome.
    pub status: Status,
    /// The numbers or the reason, one line.
    pub detail: String,
    /// Every problem found, one per line (empty when it passed).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
}

impl Gate {
    /// A gate with the given outcome.
    pub fn new(id: &str, title: &str, status: Status, detail: impl Into<String>) -> Self {
        Gate {
            id: id.to_string(),
            title: title.to_string(),
            status,
            detail: detail.into(),
            problems: Vec::new(),
        }
    }

    /// Pass when `problems` is empty, else fail listing them.
    pub fn from_problems(
        id: &str,
        title: &str,
        ok_detail: impl Into<String>,
        problems: Vec<String>,
    ) -> Self {
        if problems.is_empty() {
            Gate::new(id, title, Status::Pass, ok_detail)
        } else {
            let detail = if problems.len() == 1 {
                problems[0].clone()
            } else {
                format!("{} problems; first: {}", problems.len(), problems[0])
            };
            Gate {
                problems,
                ..Gate::new(id, title, Status::Fail, detail)
            }
        }
    }
}

/// The machine the acceptance ran on.
#[derive(Debug, Clone, Serialize)]
pub struct System {
    /// CPU model name (`/proc/cpuinfo`), or the architecture.
    pub cpu: String,
    /// The CPU features kev's kernels care about, as the OS reports them.
    pub cpu_flags: Vec<String>,
    /// The kernel set the engine picked.
    pub kernels: String,
    /// Logical CPUs available to this process.
    pub threads: usize,
    /// Operating system and architecture.
    pub os: String,
    /// Devices used: always the CPU (kev has no GPU backend yet).
    pub device: String,
}

/// Which bars the decision gates use.
#[derive(Debug, Clone, Serialize)]
pub struct GatesMode {
    /// `real` or `synthetic`.
    pub mode: String,
    /// Why this mode, in words.
    pub why: String,
}

/// One input file and what its digest was checked against.
#[derive(Debug, Clone, Serialize)]
pub struct FileDigest {
    /// `kev`, `base` or `prepared`.
    pub role: String,
    /// Path inside its repository or directory.
    pub name: String,
    /// Bytes.
    pub size: u64,
    /// `sha256` or `git-sha1`.
    pub kind: String,
    /// The digest computed.
    pub digest: String,
    /// `pinned-ok`, `pinned-MISMATCH`, `manifest-ok`, `manifest-MISMATCH`, `unpinned`.
    pub check: String,
}

/// What was accepted.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Inputs {
    /// The prepared directory, if any.
    pub model: Option<String>,
    /// The base release directory, if any.
    pub base: Option<String>,
    /// The Kev release directory, if any.
    pub kev: Option<String>,
    /// How the release directories were found (`--base/--kev`, the manifest's local directories, the Hub cache).
    pub release_from: Option<String>,
    /// The pins' label and where they came from.
    pub pins: String,
    /// What the pins leave unverified (their own statement; empty for Kev-4B v1.0).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pins_unverified: Vec<String>,
    /// Every file hashed.
    pub files: Vec<FileDigest>,
}

/// What the merge check saw.
#[derive(Debug, Clone, Default, Serialize)]
pub struct MergeSummary {
    /// Adapted modules in the adapter.
    pub adapter_modules: usize,
    /// Adapted tensors re-merged and equal to the export.
    pub adapted_equal: usize,
    /// Other tensors byte-identical to the base.
    pub copied_equal: usize,
    /// Base tensors left out of the export (`mtp.*`, `model.visual.*` unless kept).
    pub dropped: usize,
    /// Whether the export kept `model.visual.*` and the base's shard names (the published layout).
    pub published_layout: bool,
    /// The comparison with the published kev-4b-merged shard digests, when the layout allows it.
    pub published_digests: Option<String>,
}

/// The pointer head as checked.
#[derive(Debug, Clone, Serialize)]
pub struct HeadSummary {
    /// Base named by the head.
    pub base: String,
    /// Its revision.
    pub base_revision: String,
    /// LoRA rank as stored.
    pub lora: Value,
    /// As stored.
    pub option_isolation: Value,
    /// Head width.
    pub head_dim: usize,
    /// Temperature as stored (f64, exact).
    pub temperature: f64,
}

/// The request set.
#[derive(Debug, Clone, Serialize)]
pub struct SetInfo {
    /// `embedded` (shipped in the binary) or the directory.
    pub source: String,
    /// sha256 over the sorted `name\0bytes\0` records: the same set gives the same digest.
    pub sha256: String,
    /// Requests.
    pub requests: usize,
    /// Questions over all requests.
    pub questions: usize,
    /// Questions per type.
    pub types: Value,
    /// Fewest and most options of a question.
    pub options: (usize, usize),
    /// Shortest and longest state, in tokens (with the state delimiter).
    pub state_tokens: (usize, usize),
    /// Tokens of every question's row run from zero (what the reference computes).
    pub row_tokens: usize,
}

/// Where the reference probabilities came from.
#[derive(Debug, Clone, Serialize)]
pub struct ReferenceInfo {
    /// `python …` (run here) or `file …` (computed earlier).
    pub source: String,
    /// Arms it holds.
    pub arms: Vec<String>,
    /// Interpreter and package versions (when run here).
    pub versions: Value,
    /// sha256 of the reference script bundle that was run (when run here).
    pub script_sha256: Option<String>,
    /// Seconds it took (when run here).
    pub seconds: Option<f64>,
}

/// The bar a decision arm is held to.
#[derive(Debug, Clone, Serialize)]
pub struct Yardstick {
    /// `fixed` (max |Δp| ≤ 0.02, mean ≤ 0.002, no flips) or `torch-bf16` (no further than torch's own
    /// bf16 run, measured in the same run).
    pub kind: String,
    /// Why this yardstick applies to this arm.
    pub why: String,
    /// The limits in force: max |Δp|, mean |Δp|, flips.
    pub max_abs: f64,
    /// See `max_abs`.
    pub mean_abs: f64,
    /// See `max_abs`.
    pub flips: usize,
}

/// Seconds spent on one arm.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ArmSeconds {
    /// Loading the weights (shared by the two arms of one weight form).
    pub load: f64,
    /// First run (cold prepared-state cache).
    pub run: f64,
    /// Second run (warm cache, requests batched together).
    pub rerun: f64,
    /// Every question as its own row from zero.
    pub from_zero: f64,
}

/// One decision arm.
#[derive(Debug, Clone, Serialize)]
pub struct ArmReport {
    /// `exact-fp32`, `merged-bf16`, …
    pub name: String,
    /// `exact` or `merged`.
    pub weights: String,
    /// `fp32` or `bf16`.
    pub precision: String,
    /// Where the weights came from.
    pub source: String,
    /// The backend's description.
    pub backend: String,
    /// The bar applied against the reference (None without a reference).
    pub yardstick: Option<Yardstick>,
    /// Distance from the author's fp32 reference.
    pub vs_reference: Option<Distance>,
    /// Distance from the reference script's merged-bf16 arm (same weights as a merged export).
    pub vs_merged_bf16: Option<Distance>,
    /// Without a reference: distance from the anchor arm.
    pub vs_anchor: Option<Distance>,
    /// Responses (rounded answers and usage) equal to the reference's, of all compared.
    pub responses_equal: Option<(usize, usize)>,
    /// Second run bit-equal to the first.
    pub rerun_bit_equal: Option<bool>,
    /// Shared state + cache bit-equal to every row from zero.
    pub shared_bit_equal: Option<bool>,
    /// Timings.
    pub seconds: ArmSeconds,
}

/// Torch's own bf16 run against the fp32 reference: the synthetic yardstick.
#[derive(Debug, Clone, Serialize)]
pub struct TorchBf16 {
    /// Distance of the reference script's `torch_bf16` arm from its `reference` arm.
    pub vs_reference: Distance,
    /// Distance of its `merged_bf16` arm from its `reference` arm (the bf16 rounding of the merged
    /// weights alone).
    pub merged_bf16_vs_reference: Option<Distance>,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// `kev-accept <version>`.
    pub tool: String,
    /// `pass` or `fail`.
    pub verdict: String,
    /// One sentence: what passed, or which gates failed.
    pub summary: String,
    /// Seconds since the Unix epoch at the start.
    pub started_unix: u64,
    /// Wall time of the whole acceptance.
    pub wall_seconds: f64,
    /// The command line, when run from the CLI.
    pub command: Option<String>,
    /// The machine.
    pub system: System,
    /// Which bars the decision gates use.
    pub gates_mode: GatesMode,
    /// What was accepted.
    pub inputs: Inputs,
    /// The merge check.
    pub merge: Option<MergeSummary>,
    /// The head.
    pub head: Option<HeadSummary>,
    /// The request set.
    pub request_set: Option<SetInfo>,
    /// The reference.
    pub reference: Option<ReferenceInfo>,
    /// Torch's bf16 run against the reference (synthetic yardstick), when the reference has it.
    pub torch_bf16: Option<TorchBf16>,
    /// Per decision arm.
    pub arms: Vec<ArmReport>,
    /// Every gate, in the order run.
    pub gates: Vec<Gate>,
}

impl Report {
    /// True when no gate failed.
    pub fn passed(&self) -> bool {
        !self.gates.iter().any(|g| g.status == Status::Fail)
    }

    /// The gates that failed.
    pub fn failed(&self) -> impl Iterator<Item = &Gate> {
        self.gates.iter().filter(|g| g.status == Status::Fail)
    }

    /// A gate by id.
    pub fn gate(&self, id: &str) -> Option<&Gate> {
        self.gates.iter().find(|g| g.id == id)
    }

    /// Set `verdict` and `summary` from the gates.
    pub fn finish(&mut self) {
        let failed: Vec<String> = self.failed().map(|g| g.id.clone()).collect();
        let count = |s: Status| self.gates.iter().filter(|g| g.status == s).count();
        let (pass, not_run) = (count(Status::Pass), count(Status::NotRun));
        if failed.is_empty() {
            self.verdict = "pass".into();
            self.summary = format!("all {pass} gates passed");
            if not_run > 0 {
                self.summary.push_str(&format!(
                    "; {not_run} not run with these inputs (see below)"
                ));
            }
        } else {
            self.verdict = "fail".into();
            self.summary = format!(
                "{} of {} gates failed: {}",
                failed.len(),
                pass + failed.len(),
                failed.join(", ")
            );
        }
    }

    /// Pretty JSON.
    pub fn to_json(&self) -> String {
        let mut s = serde_json::to_string_pretty(self)
            .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
        s.push('\n');
        s
    }

    /// Markdown for people.
    pub fn to_markdown(&self) -> String {
        markdown(self)
    }

    /// Write `<prefix>.json` and `<prefix>.md`; returns both paths.
    pub fn write(&self, prefix: &Path) -> Result<(PathBuf, PathBuf), AcceptError> {
        let with = |ext: &str| {
            let mut name = prefix.file_name().unwrap_or_default().to_os_string();
            name.push(ext);
            prefix.with_file_name(name)
        };
        let (json, md) = (with(".json"), with(".md"));
        if let Some(dir) = json.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| AcceptError::io(dir, e))?;
        }
        std::fs::write(&json, self.to_json()).map_err(|e| AcceptError::io(&json, e))?;
        std::fs::write(&md, self.to_markdown()).map_err(|e| AcceptError::io(&md, e))?;
        Ok((json, md))
    }
}

fn fmt_p(x: f64) -> String {
    if x == 0.0 {
        "0".into()
    } else if x.is_infinite() {
        "∞".into()
    } else if x < 1e-3 {
        format!("{x:.2e}")
    } else {
        format!("{x:.4}")
    }
}

fn fmt_dist(d: &Option<Distance>) -> String {
    match d {
        Some(d) => format!(
            "max {} · mean {} · flips {}/{}",
            fmt_p(d.max_abs),
            fmt_p(d.mean_abs),
            d.flips,
            d.decisive
        ),
        None => "—".into(),
    }
}

fn yes_no(b: Option<bool>) -> &'static str {
    match b {
        Some(true) => "yes",
        Some(false) => "**NO**",
        None => "—",
    }
}

fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

fn markdown(r: &Report) -> String {
    let mut s = String::new();
    push_header(&mut s, r);
    push_gates(&mut s, r);
    push_arms(&mut s, r);
    push_merge_head_and_files(&mut s, r);
    s
}

/// The verdict, the summary, and what ran on what: tool, machine, gate mode, inputs, request set, reference.
fn push_header(s: &mut String, r: &Report) {
    let verdict = if r.passed() { "PASS" } else { "FAIL" };
    s.push_str(&format!("# kev accept: {verdict}\n\n{}.\n\n", r.summary));
    s.push_str(&format!(
        "- tool: {}\n- wall time: {:.1} s\n",
        r.tool, r.wall_seconds
    ));
    if let Some(c) = &r.command {
        s.push_str(&format!("- command: `{c}`\n"));
    }
    s.push_str(&format!(
        "- machine: {} ({} threads, {}; kernels {}; flags {})\n",
        r.system.cpu,
        r.system.threads,
        r.system.os,
        r.system.kernels,
        r.system.cpu_flags.join(" ")
    ));
    s.push_str(&format!("- device: {}\n", r.system.device));
    s.push_str(&format!(
        "- gates: **{}** — {}\n",
        r.gates_mode.mode, r.gates_mode.why
    ));
    let i = &r.inputs;
    for (k, v) in [
        ("prepared model", &i.model),
        ("base", &i.base),
        ("kev", &i.kev),
        ("release files found via", &i.release_from),
    ] {
        if let Some(v) = v {
            s.push_str(&format!("- {k}: `{v}`\n"));
        }
    }
    s.push_str(&format!("- pins: {}\n", i.pins));
    for u in &i.pins_unverified {
        s.push_str(&format!("  - not verified by these pins: {u}\n"));
    }
    if let Some(set) = &r.request_set {
        s.push_str(&format!(
            "- request set: {} ({} requests, {} questions {}, options {}–{}, states {}–{} tokens, {} row tokens; sha256 {})\n",
            set.source,
            set.requests,
            set.questions,
            set.types,
            set.options.0,
            set.options.1,
            set.state_tokens.0,
            set.state_tokens.1,
            set.row_tokens,
            &set.sha256[..16.min(set.sha256.len())]
        ));
    }
    match &r.reference {
        Some(rf) => {
            s.push_str(&format!(
                "- reference: {} (arms {})",
                rf.source,
                rf.arms.join(", ")
            ));
            if let Some(sec) = rf.seconds {
                s.push_str(&format!(", {sec:.1} s"));
            }
            if !rf.versions.is_null() {
                s.push_str(&format!(", {}", rf.versions));
            }
            s.push('\n');
        }
        None => s.push_str(
            "- reference: none (arms compared with each other; pass `--reference PYTHON` for the author's fp32 arm)\n",
        ),
    }
}

/// The gates table, then each failing gate's problems (the first 50).
fn push_gates(s: &mut String, r: &Report) {
    s.push_str(
        "\n## Gates\n\n| status | gate | what | figures / reason |\n| --- | --- | --- | --- |\n",
    );
    for g in &r.gates {
        s.push_str(&format!(
            "| {} | `{}` | {} | {} |\n",
            g.status.label(),
            g.id,
            cell(&g.title),
            cell(&g.detail)
        ));
    }
    let with_problems: Vec<&Gate> = r.gates.iter().filter(|g| !g.problems.is_empty()).collect();
    if !with_problems.is_empty() {
        s.push_str("\n### Problems\n\n");
        for g in with_problems {
            s.push_str(&format!("`{}`:\n\n", g.id));
            for p in g.problems.iter().take(50) {
                s.push_str(&format!("- {p}\n"));
            }
            if g.problems.len() > 50 {
                s.push_str(&format!(
                    "- … {} more (see the JSON report)\n",
                    g.problems.len() - 50
                ));
            }
            s.push('\n');
        }
    }
}

/// The decision arms table, the yardsticks applied, and torch's own bf16 run; nothing when no arm ran.
fn push_arms(s: &mut String, r: &Report) {
    if r.arms.is_empty() {
        return;
    }
    s.push_str("\n## Decision arms\n\n| arm | yardstick | vs reference | vs reference merged-bf16 | vs anchor | responses equal | rerun bit-equal | shared = from zero | seconds (load / run / rerun / from zero) |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for a in &r.arms {
        let yard = a
            .yardstick
            .as_ref()
            .map(|y| y.kind.clone())
            .unwrap_or_else(|| "—".into());
        let resp = a
            .responses_equal
            .map(|(e, n)| format!("{e}/{n}"))
            .unwrap_or_else(|| "—".into());
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {:.2} / {:.2} / {:.2} / {:.2} |\n",
            a.name,
            yard,
            fmt_dist(&a.vs_reference),
            fmt_dist(&a.vs_merged_bf16),
            fmt_dist(&a.vs_anchor),
            resp,
            yes_no(a.rerun_bit_equal),
            yes_no(a.shared_bit_equal),
            a.seconds.load,
            a.seconds.run,
            a.seconds.rerun,
            a.seconds.from_zero
        ));
    }
    s.push_str("\nYardsticks applied:\n\n");
    for a in &r.arms {
        if let Some(y) = &a.yardstick {
            s.push_str(&format!(
                "- **{}**: {} (max |Δp| ≤ {}, mean |Δp| ≤ {}, flips ≤ {}) — {}\n",
                a.name,
                y.kind,
                fmt_p(y.max_abs),
                fmt_p(y.mean_abs),
                y.flips,
                y.why
            ));
        }
    }
    if let Some(t) = &r.torch_bf16 {
        s.push_str(&format!(
            "\nTorch's own bf16 run vs the fp32 reference (same run): {}",
            fmt_dist(&Some(t.vs_reference.clone()))
        ));
        if let Some(m) = &t.merged_bf16_vs_reference {
            s.push_str(&format!(
                "; the merged-bf16 weights in fp32 vs the reference: {}",
                fmt_dist(&Some(m.clone()))
            ));
        }
        s.push_str(".\n");
    }
    s.push_str(
        "\nmax = largest |Δp| over every option; mean = mean over questions of each question's mean |Δp|; \
         flips = argmax disagreements among the questions whose reference top-2 margin is above 0.02 (flips/decisive). \
         responses equal (information, not a gate): rounded answers and usage identical to the reference's own \
         response; a difference of 1e-5 can move a 4th decimal.\n",
    );
}

/// The merge counts, the head's identity, and every re-hashed file, each when there is one.
fn push_merge_head_and_files(s: &mut String, r: &Report) {
    if let Some(m) = &r.merge {
        s.push_str(&format!(
            "\n## Merge\n\n{} of {} adapted modules re-merged equal to the export; {} other tensors byte-identical; {} base tensors left out; published layout: {}.\n",
            m.adapted_equal,
            m.adapter_modules,
            m.copied_equal,
            m.dropped,
            if m.published_layout { "yes" } else { "no" }
        ));
        if let Some(p) = &m.published_digests {
            s.push_str(&format!("Published kev-4b-merged digests: {p}\n"));
        }
    }
    if let Some(h) = &r.head {
        s.push_str(&format!(
            "\n## Head\n\nbase `{}` @ `{}`, lora {}, option_isolation {}, head_dim {}, temperature {:?}.\n",
            h.base, h.base_revision, h.lora, h.option_isolation, h.head_dim, h.temperature
        ));
    }
    if !r.inputs.files.is_empty() {
        s.push_str("\n## Files\n\n| role | file | bytes | digest | check |\n| --- | --- | --- | --- | --- |\n");
        for f in &r.inputs.files {
            s.push_str(&format!(
                "| {} | {} | {} | {} {} | {} |\n",
                f.role,
                cell(&f.name),
                f.size,
                f.kind,
                f.digest,
                f.check
            ));
        }
    }
}
