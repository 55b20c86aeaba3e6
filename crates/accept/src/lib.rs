//! `kev accept`: prove, in one command, that a Kev model on this machine agrees with the author's.
//!
//! 1. **Inputs**: every pinned file re-hashed against the release pins (Kev-4B v1.0 by default, Kev-0.8B v1.0
//!    with `--release kev-0.8b`, Kev-9B v1.0 with `--release kev-9b`); a
//!    prepared directory re-hashed against its `manifest.json`, and the inputs it records compared with
//!    the pins; `head.pt`'s identity (base, revision, LoRA rank, option isolation).
//! 2. **Merge**: every adapted module re-merged from base + adapter and compared byte for byte with the
//!    prepared export; every other tensor byte-identical; the published merged artifact's digests compared
//!    when the export has its layout.
//! 3. **Head**: `head.safetensors` equal to `head.pt` bit for bit, temperature as stored.
//! 4. **Decisions**: the shipped request set through every available arm (exact/merged × fp32/bf16), each
//!    run as the service runs it, again with a warm cache and batched, and as rows from zero; with a
//!    reference (the project's Python script on the same weights, or its output computed earlier) the
//!    gates of kev-contract §6 and issue 8 apply.
//! 5. **Report**: JSON + Markdown; [`Report::passed`] decides the exit code.
#![deny(missing_docs)]

pub mod decisions;
pub mod gates;
pub mod head_check;
pub mod inputs;
pub mod merge_check;
pub mod metrics;
pub mod reference;
pub mod report;
pub mod requests;
pub mod system;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime};

use kev_decide::{Settings, WeightForm};
use kev_engine::Arm;
use kev_release::Release;
use kev_release::head::KevHead;
use kev_release::manifest::{Manifest, ReleasePins};
use kev_release::{AdapterConfig, PreparedHead};

pub use decisions::ArmId;
pub use reference::ReferenceOutput;
pub use report::{Gate, Report, Status};
pub use requests::RequestSet;

/// Why an acceptance could not be run at all (bad input: exit 2). Anything about the model itself is a
/// failed gate in the report instead.
#[derive(Debug, thiserror::Error)]
pub enum AcceptError {
    /// The arguments do not make sense together.
    #[error("{0}")]
    Usage(String),
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The pins file is unreadable.
    #[error("pins: {0}")]
    Pins(#[from] kev_release::ManifestError),
    /// The reference could not be run or read.
    #[error("reference: {0}")]
    Reference(String),
}

impl AcceptError {
    /// An I/O error on `path`.
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        AcceptError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Which bars the decision gates use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateMode {
    /// The published parity bar for every arm: argmax where margin > 0.02, max |Δp| ≤ 0.02,
    /// mean ≤ 0.002.
    Real,
    /// For synthetic random weights: the arms that carry bf16 rounding (bf16 compute, or the bf16
    /// merged weights) are held to torch's own bf16 run; exact-fp32 keeps the fixed bar; the 1e-4 fp32
    /// gates are unchanged.
    Synthetic,
}

impl std::str::FromStr for GateMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "real" => Ok(GateMode::Real),
            "synthetic" => Ok(GateMode::Synthetic),
            o => Err(format!("unknown gates `{o}` (real, synthetic)")),
        }
    }
}

/// Where the reference probabilities come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReferenceSource {
    /// None: the arms are reported against each other.
    None,
    /// Run the embedded reference script with this Python (torch + transformers + peft) on the release.
    Python(PathBuf),
    /// A `reference_arm.py` output file computed earlier, or a directory of `expected/valid` records.
    Output(PathBuf),
}

/// Everything one acceptance needs.
#[derive(Debug, Clone)]
pub struct AcceptOptions {
    /// A prepared directory (`kev prepare`).
    pub model: Option<PathBuf>,
    /// The base release directory.
    pub base: Option<PathBuf>,
    /// The Kev release directory.
    pub kev: Option<PathBuf>,
    /// The release pins.
    pub pins: ReleasePins,
    /// Where the pins came from, for the report.
    pub pins_origin: String,
    /// Gate mode; `None` = real.
    pub gates: Option<GateMode>,
    /// A directory of request bodies; `None` = the embedded set.
    pub requests: Option<PathBuf>,
    /// The reference.
    pub reference: ReferenceSource,
    /// Arms to run; empty = every arm the inputs allow.
    pub arms: Vec<ArmId>,
    /// Service settings the arms run with (the service's defaults).
    pub settings: Settings,
    /// The command line, for the report.
    pub command: Option<String>,
}

impl Default for AcceptOptions {
    fn default() -> Self {
        AcceptOptions {
            model: None,
            base: None,
            kev: None,
            pins: ReleasePins::kev_4b_v1(),
            pins_origin: "built in".into(),
            gates: None,
            requests: None,
            reference: ReferenceSource::None,
            arms: Vec::new(),
            settings: Settings::default(),
            command: None,
        }
    }
}

impl AcceptOptions {
    /// Use the built-in pins of a published release (`kev-4b`, `kev-0.8b`, `kev-9b`).
    pub fn with_release(mut self, release: Release) -> Self {
        self.pins = release.pins();
        self.pins_origin = format!("built in, --release {release}");
        self
    }

    /// Use the pins in a JSON file (the shape `ReleasePins::to_json` writes).
    pub fn with_pins_file(mut self, path: &Path) -> Result<Self, AcceptError> {
        self.pins = ReleasePins::from_json_file(path)?;
        self.pins_origin = format!("from {}", path.display());
        Ok(self)
    }
}

fn seconds_since_epoch() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn check_dir(flag: &str, p: &Option<PathBuf>) -> Result<(), AcceptError> {
    match p {
        Some(d) if !d.is_dir() => Err(AcceptError::Usage(format!(
            "{flag} {}: not a directory",
            d.display()
        ))),
        _ => Ok(()),
    }
}

/// Run the whole acceptance. `Err` only for bad input; every finding about the model is a gate.
pub fn accept(opts: &AcceptOptions) -> Result<Report, AcceptError> {
    let started = Instant::now();
    let started_unix = seconds_since_epoch();
    let (published, mode) = check_usage(opts)?;
    let is_kev4b = published == Some(Release::Kev4b);
    let gates_mode = gates_mode_of(mode, opts.gates.is_some());
    let set = match &opts.requests {
        Some(dir) => RequestSet::from_dir(dir)?,
        None => RequestSet::embedded(),
    };

    let mut gates: Vec<Gate> = Vec::new();
    let mut inputs = inputs_named(opts);

    // 1. Inputs.
    let (manifest, release) = check_inputs(opts, &mut gates, &mut inputs);
    gates.extend(head_identity_gate(
        opts,
        release.as_ref(),
        manifest.as_ref(),
    ));

    // 2 + 3. Merge and head.
    let (merge_summary, head_summary) = check_merge_and_head(
        opts,
        release.as_ref(),
        manifest.as_ref(),
        is_kev4b,
        &mut gates,
    );

    // 4. The arms this acceptance runs.
    let arms = choose_arms(opts, release.is_some())?;

    // The reference, before the arms: a bad reference setup is bad input, found before the long part.
    let (reference, reference_info) = load_reference(opts, release.as_ref(), &set, &arms, mode)?;
    if let Some(rf) = &reference {
        check_reference_covers(rf, &set, mode)?;
    } else {
        gates.push(Gate::new(
            "decisions.reference",
            "the arms against the author's fp32 reference",
            Status::NotRun,
            "no reference given (--reference PYTHON runs it on the same weights): the arms are reported against the \
             exact-fp32 arm (or merged-fp32) instead",
        ));
    }

    let (runs, rows) = run_arms(opts, release.as_ref(), &arms, &set);
    let set_info = rows.as_ref().map(|r| set_info(&set, r));
    if let (Some(rf), Some(r)) = (&reference, &rows) {
        gates.push(gates::rows_gate(&set, r, rf));
    }
    let evaluation = gates::evaluate(
        mode,
        &set,
        rows.as_deref().unwrap_or(&[]),
        &runs,
        reference.as_ref(),
    )
    .map_err(AcceptError::Reference)?;
    gates.extend(evaluation.gates);

    let mut report = Report {
        tool: concat!("kev-accept ", env!("CARGO_PKG_VERSION")).into(),
        verdict: String::new(),
        summary: String::new(),
        started_unix,
        wall_seconds: 0.0,
        command: opts.command.clone(),
        system: system::describe(),
        gates_mode,
        inputs,
        merge: merge_summary,
        head: head_summary,
        request_set: set_info,
        reference: reference_info,
        torch_bf16: evaluation.torch_bf16,
        arms: evaluation.arms,
        gates,
    };
    report.wall_seconds = started.elapsed().as_secs_f64();
    report.finish();
    Ok(report)
}

/// Refuse options that do not make sense together; the published release the pins name, and the gate mode.
fn check_usage(opts: &AcceptOptions) -> Result<(Option<Release>, GateMode), AcceptError> {
    check_dir("--model", &opts.model)?;
    check_dir("--base", &opts.base)?;
    check_dir("--kev", &opts.kev)?;
    if opts.model.is_none() && (opts.base.is_none() || opts.kev.is_none()) {
        return Err(AcceptError::Usage(
            "pass --model DIR (a prepared directory), or --base DIR --kev DIR (the release files), or both".into(),
        ));
    }
    if opts.base.is_some() != opts.kev.is_some() {
        return Err(AcceptError::Usage("--base and --kev go together".into()));
    }
    let published = Release::of_pins(&opts.pins);
    let mode = opts.gates.unwrap_or(GateMode::Real);
    if let (GateMode::Synthetic, Some(r)) = (mode, published) {
        return Err(AcceptError::Usage(format!(
            "--gates synthetic is for synthetic (random-weight) releases; the {} pins ({r}) take the real bar. \
             Pass --pins FILE for a synthetic release",
            opts.pins.name
        )));
    }
    Ok((published, mode))
}

/// The gate mode as the report states it, and why it applies (`explicit`: chosen with `--gates`).
fn gates_mode_of(mode: GateMode, explicit: bool) -> report::GatesMode {
    report::GatesMode {
        mode: match mode {
            GateMode::Real => "real".into(),
            GateMode::Synthetic => "synthetic".into(),
        },
        why: match (mode, explicit) {
            (GateMode::Real, false) => {
                "the default: the published parity bar (kev-contract §6) for every arm".into()
            }
            (GateMode::Real, true) => "--gates real: the published parity bar for every arm".into(),
            (GateMode::Synthetic, _) => "--gates synthetic: random synthetic weights amplify bf16 rounding far \
                beyond a trained model, so arms carrying bf16 rounding are held to torch's own bf16 run measured \
                in the same run; exact-fp32 keeps the fixed bar and the 1e-4 fp32 gates are never loosened"
                .into(),
        },
    }
}

/// The report's inputs section before anything is checked: the prepared directory and the pins.
fn inputs_named(opts: &AcceptOptions) -> report::Inputs {
    report::Inputs {
        model: opts.model.as_ref().map(|p| p.display().to_string()),
        pins: format!(
            "{} ({}; {}@{} on {}@{})",
            opts.pins.name,
            opts.pins_origin,
            opts.pins.kev.repo,
            inputs::short(&opts.pins.kev.revision),
            opts.pins.base.repo,
            inputs::short(&opts.pins.base.revision)
        ),
        pins_unverified: opts.pins.unverified.clone(),
        ..Default::default()
    }
}

/// Re-hash the prepared directory against its manifest and the release files against the pins; the
/// manifest read, and the release directories (given, or found through the manifest).
fn check_inputs(
    opts: &AcceptOptions,
    gates: &mut Vec<Gate>,
    inputs: &mut report::Inputs,
) -> (Option<Manifest>, Option<inputs::ReleaseDirs>) {
    let mut manifest = None;
    if let Some(dir) = &opts.model {
        tracing::info!(dir = %dir.display(), "re-hashing the prepared directory against its manifest");
        let (g, m, files) = inputs::check_manifest(dir);
        gates.push(g);
        inputs.files.extend(files);
        if let Some(m) = &m {
            gates.push(inputs::check_manifest_inputs(m, &opts.pins));
        }
        manifest = m;
    }
    let release =
        inputs::locate_release(opts.base.as_deref(), opts.kev.as_deref(), manifest.as_ref());
    if let Some(r) = &release {
        inputs.base = Some(r.base.display().to_string());
        inputs.kev = Some(r.kev.display().to_string());
        inputs.release_from = Some(r.found_via.clone());
        for (role, dir, pin) in [
            ("kev", &r.kev, &opts.pins.kev),
            ("base", &r.base, &opts.pins.base),
        ] {
            tracing::info!(dir = %dir.display(), "re-hashing the {role} files against the pins");
            let (g, files) = inputs::check_repo_pins(role, dir, pin, &opts.pins.name);
            gates.push(g);
            inputs.files.extend(files);
        }
    } else {
        for role in ["kev", "base"] {
            gates.push(Gate::new(
                &format!("inputs.{role}-pins"),
                &format!("every {role} file matches the pins"),
                Status::NotRun,
                "the release files are not at hand (pass --base DIR --kev DIR; the manifest's sources were not found)",
            ));
        }
    }
    (manifest, release)
}

/// The head's identity against the pins, from `head.pt` when the release is at hand, else from the prepared
/// head; `None` when there is neither.
fn head_identity_gate(
    opts: &AcceptOptions,
    release: Option<&inputs::ReleaseDirs>,
    manifest: Option<&Manifest>,
) -> Option<Gate> {
    let head_meta = match (release, &opts.model) {
        (Some(r), _) => Some((
            KevHead::read_pt(&r.kev.join("head.pt")).map(|h| h.meta),
            "head.pt",
        )),
        (None, Some(m)) => Some((PreparedHead::read(m).map(|h| h.head.meta), "kev_head.json")),
        (None, None) => None,
    };
    let rank = release
        .and_then(|r| AdapterConfig::from_file(&r.kev.join("adapter_config.json")).ok())
        .map(|c| c.r)
        .or(manifest.map(|m| m.merge.r));
    match head_meta {
        Some((Ok(meta), from)) => Some(inputs::check_head_identity(&meta, from, &opts.pins, rank)),
        Some((Err(e), _)) => Some(Gate::new(
            "inputs.head-identity",
            "head.pt names the pinned base",
            Status::Fail,
            e.to_string(),
        )),
        None => None,
    }
}

/// Re-merge and compare the export, and compare the prepared head with `head.pt`; the summaries of both.
fn check_merge_and_head(
    opts: &AcceptOptions,
    release: Option<&inputs::ReleaseDirs>,
    manifest: Option<&Manifest>,
    is_kev4b: bool,
    gates: &mut Vec<Gate>,
) -> (Option<report::MergeSummary>, Option<report::HeadSummary>) {
    let mut merge_summary = None;
    match (&opts.model, release) {
        (Some(m), Some(r)) => {
            tracing::info!("re-merging every adapted module and comparing the export byte for byte");
            let (g, s) = merge_check::check_merge(m, r, manifest, is_kev4b);
            gates.extend(g);
            merge_summary = Some(s);
        }
        _ => gates.push(Gate::new(
            "merge.adapted",
            "every adapted module re-merged equals the export",
            Status::NotRun,
            if opts.model.is_none() {
                "no prepared directory (--model) to compare: the merged arms merge in memory with the same function"
            } else {
                "the release files are not at hand (pass --base DIR --kev DIR)"
            },
        )),
    }
    let mut head_summary = None;
    if let Some(m) = &opts.model {
        let (g, s) = head_check::check_head(
            m,
            release.map(|r| r.kev.join("head.pt")).as_deref(),
            &opts.pins,
        );
        gates.push(g);
        head_summary = s;
    } else if let Some(r) = release
        && let Ok(h) = KevHead::read_pt(&r.kev.join("head.pt"))
    {
        head_summary = Some(head_check::summary_of(&h));
    }
    (merge_summary, head_summary)
}

/// The arms asked for (all the inputs allow, when none is named), in [`ArmId::ALL`] order; an arm whose
/// weights are not at hand is bad input.
fn choose_arms(opts: &AcceptOptions, has_release: bool) -> Result<Vec<ArmId>, AcceptError> {
    let mut available: Vec<ArmId> = Vec::new();
    for a in ArmId::ALL {
        let ok = match a.form {
            WeightForm::Exact => has_release,
            WeightForm::Merged => opts.model.is_some() || has_release,
        };
        if ok {
            available.push(a);
        }
    }
    if opts.arms.is_empty() {
        return Ok(available);
    }
    for a in &opts.arms {
        if !available.contains(a) {
            return Err(AcceptError::Usage(format!(
                "arm {} needs {}",
                a.name(),
                if a.form == WeightForm::Exact {
                    "the release files (--base DIR --kev DIR)"
                } else {
                    "--model DIR or --base/--kev"
                }
            )));
        }
    }
    Ok(ArmId::ALL
        .into_iter()
        .filter(|a| opts.arms.contains(a))
        .collect())
}

/// Read the reference output, or run the reference script with the arms the chosen arms and mode need.
fn load_reference(
    opts: &AcceptOptions,
    release: Option<&inputs::ReleaseDirs>,
    set: &RequestSet,
    arms: &[ArmId],
    mode: GateMode,
) -> Result<(Option<ReferenceOutput>, Option<report::ReferenceInfo>), AcceptError> {
    Ok(match &opts.reference {
        ReferenceSource::None => (None, None),
        ReferenceSource::Output(p) => {
            let out = ReferenceOutput::read(p)?;
            let info = report::ReferenceInfo {
                source: format!("file {}", p.display()),
                arms: out.arms(),
                versions: serde_json::Value::Null,
                script_sha256: None,
                seconds: None,
            };
            (Some(out), Some(info))
        }
        ReferenceSource::Python(py) => {
            let Some(r) = release else {
                return Err(AcceptError::Usage(
                    "--reference runs the author's model on the release files: pass --base DIR --kev DIR (or keep \
                     the sources the manifest names)"
                        .into(),
                ));
            };
            let mut want = vec!["reference"];
            if arms.iter().any(|a| a.form == WeightForm::Merged) {
                want.push("merged_bf16");
            }
            if mode == GateMode::Synthetic {
                want.push("torch_bf16");
            }
            let (out, info) = reference::run_python(py, &r.base, &r.kev, set, &want)?;
            (Some(out), Some(info))
        }
    })
}

/// Refuse a reference that misses a request of the set or an arm the gates measure against.
fn check_reference_covers(
    rf: &ReferenceOutput,
    set: &RequestSet,
    mode: GateMode,
) -> Result<(), AcceptError> {
    let missing: Vec<&str> = set
        .requests
        .iter()
        .filter(|r| !rf.requests.contains_key(&r.name))
        .map(|r| r.name.as_str())
        .collect();
    if !missing.is_empty() {
        return Err(AcceptError::Reference(format!(
            "{} has no record of {} request(s) of the set: {} (was it computed on another request set?)",
            rf.source,
            missing.len(),
            missing.join(", ")
        )));
    }
    if !rf.has_arm("reference") {
        return Err(AcceptError::Reference(format!(
            "{} lacks the `reference` arm",
            rf.source
        )));
    }
    if mode == GateMode::Synthetic && !rf.has_arm("torch_bf16") {
        return Err(AcceptError::Reference(format!(
            "{} lacks the `torch_bf16` arm that --gates synthetic measures against",
            rf.source
        )));
    }
    Ok(())
}

/// Every arm's run, and the compiled rows of the first weight form that ran.
type ArmRuns = (
    Vec<(ArmId, Result<decisions::ArmRun, String>)>,
    Option<Vec<decisions::Rows>>,
);

/// Run the request set through the arms, one weight form at a time (exact first: it is the anchor). A
/// form that fails to load fails each of its arms.
fn run_arms(
    opts: &AcceptOptions,
    release: Option<&inputs::ReleaseDirs>,
    arms: &[ArmId],
    set: &RequestSet,
) -> ArmRuns {
    let mut runs = Vec::new();
    let mut rows = None;
    for form in [WeightForm::Exact, WeightForm::Merged] {
        let form_arms: Vec<Arm> = arms
            .iter()
            .filter(|a| a.form == form)
            .map(|a| a.arm)
            .collect();
        if form_arms.is_empty() {
            continue;
        }
        let source = match (form, &opts.model, release) {
            (WeightForm::Merged, Some(m), _) => decisions::FormSource::prepared(m.clone()),
            (_, _, Some(r)) => decisions::FormSource::release(r.base.clone(), r.kev.clone()),
            _ => continue,
        };
        tracing::info!(weights = form.name(), arms = ?form_arms, "running the request set");
        match decisions::run_form(&source, form, &form_arms, set, &opts.settings) {
            Ok(fr) => {
                if rows.is_none() {
                    rows = Some(fr.rows);
                }
                runs.extend(fr.arms);
            }
            Err(e) => {
                for a in form_arms {
                    runs.push((ArmId { form, arm: a }, Err(e.clone())));
                }
            }
        }
    }
    (runs, rows)
}

fn set_info(set: &RequestSet, rows: &[decisions::Rows]) -> report::SetInfo {
    let mut types: BTreeMap<&str, usize> = BTreeMap::new();
    let mut options = (usize::MAX, 0usize);
    let mut states = (usize::MAX, 0usize);
    let mut questions = 0usize;
    let mut row_tokens = 0usize;
    for r in rows {
        states = (
            states.0.min(r.state_ids.len()),
            states.1.max(r.state_ids.len()),
        );
        for q in &r.questions {
            questions += 1;
            *types.entry(q.kind).or_default() += 1;
            options = (
                options.0.min(q.option_ends.len()),
                options.1.max(q.option_ends.len()),
            );
            row_tokens += q.row_ids.len();
        }
    }
    report::SetInfo {
        source: set.source.clone(),
        sha256: set.sha256(),
        requests: set.requests.len(),
        questions,
        types: serde_json::to_value(types).unwrap_or_default(),
        options: if questions == 0 { (0, 0) } else { options },
        state_tokens: if rows.is_empty() { (0, 0) } else { states },
        row_tokens,
    }
}
