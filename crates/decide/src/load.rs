//! Loading a Kev model for decisions, in either of its two forms:
//!
//! - a **prepared** directory (`kev prepare`): merged BF16 safetensors + text `config.json`,
//!   `tokenizer.json`, `head.safetensors` + `kev_head.json`;
//! - a **release**: the base repository's files (`--base`) and the Kev repository's (`--kev`: adapter,
//!   `tokenizer.json`, and the head as `head.pt` or in the prepared form that `kev synth` writes — found by
//!   `KevHead::read_dir`, the one reader of a directory's head). The LoRA is merged at load exactly as `kev prepare` merges it
//!   (`merged`, the default) or kept unmerged in fp32 (`exact`, the author's reference arm).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use kev_engine::{
    ActivationRanges, Arm, Backbone, Backend, CpuBackend, Int8Plan, Int8Source, Kernels,
    LoadOptions, SmoothScope,
};
use kev_release::head::KevHead;
use kev_tokenize::KevTokenizer;

use crate::adapters::{AdapterSpec, LiveSource};
use crate::calibrate::Calibration;
use crate::card::{ModelInfo, WeightForm};
use crate::head::PointerHead;
use crate::service::Kev;
use crate::settings::Settings;

/// Where the model's files are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A prepared directory.
    Prepared(PathBuf),
    /// The two release directories.
    Release {
        /// Base repository files (config.json, sharded safetensors).
        base: PathBuf,
        /// Kev repository files (adapter, tokenizer.json, head.pt or the prepared head).
        kev: PathBuf,
    },
}

/// Everything needed to load a model for decisions.
#[derive(Debug, Clone)]
pub struct LoadSpec {
    /// Files.
    pub source: Source,
    /// Weight form.
    pub form: WeightForm,
    /// Compute arm; `None` picks bf16 where the CPU has native BF16 dot products, else fp32.
    pub arm: Option<Arm>,
    /// Service settings.
    pub settings: Settings,
}

/// Why a model could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The combination asked for does not exist.
    #[error("{0}")]
    Unsupported(String),
    /// The backbone.
    #[error(transparent)]
    Engine(#[from] kev_engine::EngineError),
    /// The head files.
    #[error(transparent)]
    Head(#[from] kev_release::head::HeadError),
    /// The head does not fit the backbone.
    #[error(transparent)]
    HeadShape(#[from] crate::head::HeadShapeError),
    /// The tokenizer.
    #[error(transparent)]
    Tokenizer(#[from] kev_tokenize::LoadError),
    /// The machine has too little memory for the arm asked for (checked before the load, `crate::fit`).
    #[error("{0}")]
    Memory(String),
    /// A calibration request of the int8 arm was refused or failed.
    #[error("int8 calibration request {index}: {reason}")]
    Calibration {
        /// Its position in the calibration list.
        index: usize,
        /// Why.
        reason: String,
    },
}

/// The bundled release `kev serve --demo` (and `python -m kev.serve --demo`) answers with: kev-mini, a
/// miniature Kev trained on synthetic decision records in the real release formats (`fixtures/mini` of the
/// source tree this was built from; `KEV_DEMO_DIR` overrides). Its `(base, kev)` directories.
pub fn demo_release() -> Result<(PathBuf, PathBuf), LoadError> {
    let root = std::env::var_os("KEV_DEMO_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/mini"))
        });
    let (base, kev) = (root.join("base"), root.join("kev"));
    let has_head =
        kev.join("head.pt").is_file() || kev.join(kev_release::head::HEAD_JSON).is_file();
    if !base.join("config.json").is_file() || !has_head {
        return Err(LoadError::Unsupported(format!(
            "the demo release is not at {} (set KEV_DEMO_DIR to a directory with base/ and kev/)",
            root.display()
        )));
    }
    Ok((base, kev))
}

/// The compute arm a CPU gets by default: bf16 with native BF16 dot products, else fp32.
pub fn default_arm() -> Arm {
    use kev_engine::kernels::Isa;
    if matches!(Kernels::detect().isa(), Isa::Avx512Bf16 | Isa::Amx) {
        Arm::Bf16
    } else {
        Arm::Fp32
    }
}

/// Load a model on the CPU. For the int8 arm the projections are quantised at load and their BF16/F32
/// copies dropped (but the rule's BF16 islands): from a prepared directory's stored int8 form
/// (`int8.safetensors`, written by `kev prepare --int8`, smoothed from its calibration) where there is
/// one, else W8A8 by the rule ([`Int8Plan::default`]; no smoothing: no calibration rows here; see
/// [`load_cpu_int8`]).
pub fn load_cpu(spec: &LoadSpec) -> Result<(Kev<CpuBackend>, ModelInfo), LoadError> {
    load_cpu_adapters(spec, &[])
}

/// A further Kev adapter to serve over the same base: a Kev release directory (PEFT `adapter_config.json` +
/// `adapter_model.safetensors`, the head as `head.pt` or in the prepared form, optionally `calibration.json`,
/// the file `kev calibrate --save` writes) and the name requests select it by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdapterDir {
    /// The name (`model`).
    pub name: String,
    /// The release directory.
    pub dir: PathBuf,
}

impl AdapterDir {
    /// The adapters a file lists: `{"adapters": [{"name", "dir"}], "default"?: NAME}`, relative dirs from the
    /// file's directory (`kev serve --adapters-file`, read again on SIGHUP).
    pub fn read_file(path: &Path) -> Result<(Vec<AdapterDir>, Option<String>), LoadError> {
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Entry {
            name: String,
            dir: PathBuf,
        }
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct File {
            adapters: Vec<Entry>,
            default: Option<String>,
        }
        let bad = |e: &dyn std::fmt::Display| {
            LoadError::Unsupported(format!("the adapters file {}: {e}", path.display()))
        };
        let text = std::fs::read(path).map_err(|e| bad(&e))?;
        let file: File = serde_json::from_slice(&text).map_err(|e| bad(&e))?;
        let root = path.parent().unwrap_or(Path::new("."));
        let list = file
            .adapters
            .into_iter()
            .map(|e| AdapterDir {
                dir: if e.dir.is_absolute() {
                    e.dir
                } else {
                    root.join(e.dir)
                },
                name: e.name,
            })
            .collect();
        Ok((list, file.default))
    }
}

/// The calibration file an adapter directory may carry (served by that adapter's head).
pub const ADAPTER_CALIBRATION_FILE: &str = "calibration.json";

/// [`load_cpu`] with further adapters over the one resident base: `spec.source` must be a release (its `kev`
/// is the default adapter); every adapter is kept unmerged in fp32 (the `exact` form, whatever `spec.form`
/// says: a merged adapter would change the base the others share), so each adapter answers bit for bit as a
/// single-adapter `exact` service of it would. Refused at start, naming the problem: a directory that is not
/// a Kev release for this base (a module or shape that does not fit, a head for another base or width, a
/// different tokenizer), two adapters of one name. A release served unmerged (several adapters, or the
/// `exact` form) also takes adapters live ([`Kev::add_adapter`]).
pub fn load_cpu_adapters(
    spec: &LoadSpec,
    more: &[AdapterDir],
) -> Result<(Kev<CpuBackend>, ModelInfo), LoadError> {
    let owned;
    let spec = if more.is_empty() {
        spec
    } else {
        let Source::Release { .. } = &spec.source else {
            return Err(LoadError::Unsupported(
                "several adapters share one base only from the release files: use --base DIR with --kev DIR \
                 or --adapter NAME=DIR"
                    .into(),
            ));
        };
        if spec.form == WeightForm::Merged {
            tracing::info!(
                "several adapters: every adapter is kept unmerged (the exact weight form)"
            );
        }
        owned = LoadSpec {
            form: WeightForm::Exact,
            ..spec.clone()
        };
        &owned
    };
    let int8 = spec.arm == Some(Arm::Int8);
    let stored = match &spec.source {
        Source::Prepared(dir) if int8 => {
            Some(dir.join(kev_engine::INT8_FILE)).filter(|p| p.is_file())
        }
        _ => None,
    };
    // Each layer takes its int8 form as soon as it is packed, read from the stored form or quantised by
    // the rule, so the float projections are never all held.
    let plan = Int8Plan {
        scope: SmoothScope::None,
        ..Int8Plan::default()
    };
    let source = match &stored {
        Some(path) => Some(Int8Source::Stored(path)),
        None => int8.then_some(Int8Source::Rule(&plan)),
    };
    let opened = open_cpu(spec, source)?;
    let backbone = opened.backbone;
    let mut loras = Vec::with_capacity(more.len());
    if let Source::Release { base, .. } = &spec.source {
        for a in more {
            let lora = kev_engine::Adapter::load(&backbone, base, &a.dir)
                .map_err(|e| adapter_error(a, e))?;
            loras.push(Arc::new(lora));
        }
    }
    if int8 {
        tracing::info!(
            int8_bytes = backbone.int8_bytes(),
            "int8 weights: {}, layer by layer at load",
            match &stored {
                Some(p) => format!("stored form {}", p.display()),
                None => "quantised by the rule (7-bit weights, 8-bit activations, bf16 islands; no stored form)"
                    .into(),
            }
        );
    }
    let tok_path = opened.files.tok_path.clone();
    let (kev, info) = finish_cpu(spec, Arc::new(backbone), opened.files)?;
    let mut kev = kev;
    if let (Source::Release { base, .. }, WeightForm::Exact) = (&spec.source, spec.form) {
        kev = kev.with_live_source(LiveSource {
            base: base.clone(),
            default: info.clone(),
            tokenizer: tok_path.clone(),
        });
    }
    for (a, lora) in more.iter().zip(loras) {
        if kev.adapters().iter().any(|x| x.name() == a.name) {
            return Err(adapter_error(a, "two adapters have this name"));
        }
        let bytes = lora.bytes();
        let source = LiveSource {
            base: PathBuf::new(),
            default: info.clone(),
            tokenizer: tok_path.clone(),
        };
        let spec = adapter_spec(&kev, &source, a, lora, bytes)?;
        tracing::info!(adapter = %a.name, dir = %a.dir.display(), adapter_bytes = bytes, "adapter loaded over the resident base");
        kev = kev.with_adapter(spec);
    }
    Ok((kev, info))
}

pub(crate) fn adapter_error(a: &AdapterDir, e: impl std::fmt::Display) -> LoadError {
    LoadError::Unsupported(format!("adapter {} ({}): {e}", a.name, a.dir.display()))
}

/// What serving adapter `a` takes beside its LoRA (laid out for the backbone, `bytes` of it): its head (for
/// this base and width), its calibration, the tokenizer check, its card and identity — the same checks and
/// messages at start and live.
pub(crate) fn adapter_spec<B: Backend>(
    kev: &Kev<B>,
    source: &LiveSource,
    a: &AdapterDir,
    lora: Arc<B::Adapter>,
    bytes: usize,
) -> Result<AdapterSpec<B::Adapter>, LoadError> {
    let (default, default_tok) = (&source.default, &source.tokenizer);
    let bad = |e: &dyn std::fmt::Display| adapter_error(a, e);
    let (head, head_path) = KevHead::read_dir(&a.dir).map_err(|e| bad(&e))?;
    if head.meta.base != default.base {
        return Err(bad(&format!(
            "its head was trained on {}, the served base is {}",
            head.meta.base, default.base
        )));
    }
    let hidden = kev.backend().hidden_size();
    let pointer = PointerHead::new(&head, hidden).map_err(|e| bad(&e))?;
    let tok = a.dir.join("tokenizer.json");
    if tok.is_file() && std::fs::read(&tok).ok() != std::fs::read(default_tok).ok() {
        return Err(bad(
            &"its tokenizer.json differs from the default adapter's (one tokenizer serves every adapter)",
        ));
    }
    let cal_path = a.dir.join(ADAPTER_CALIBRATION_FILE);
    let calibration = if cal_path.is_file() {
        Some(Arc::new(Calibration::read(&cal_path).map_err(|e| bad(&e))?))
    } else {
        None
    };
    let info = ModelInfo {
        source: format!("adapter {} over {}", a.dir.display(), default.source),
        lora: head.meta.lora.clone(),
        temperature: head.meta.temperature,
        release_date: file_date(&head_path),
        adapter_bytes: bytes,
        adapter_sha256: adapter_sha256(&a.dir),
        ..default.clone()
    };
    // Each load its own identity in the cache and pins: a directory loaded again (its files changed
    // meanwhile, perhaps) never meets snapshots of the previous load.
    static LOADS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let load = LOADS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let model_id = model_id(&info) ^ fnv1a(&load.to_le_bytes());
    Ok(AdapterSpec {
        name: a.name.clone(),
        lora,
        head: pointer,
        calibration,
        model_id,
        info: Some(info),
    })
}

/// Load a model on the CPU for the int8 arm (whatever `spec.arm` says), its projections quantised with
/// SmoothQuant factors from the activation ranges that `calibration` (request bodies, decided on the fp32
/// arm of the same weights) produces. Returns the ranges too, for `kev prepare --int8`.
pub fn load_cpu_int8(
    spec: &LoadSpec,
    calibration: &[Vec<u8>],
    plan: Int8Plan,
) -> Result<(Kev<CpuBackend>, ModelInfo, ActivationRanges), LoadError> {
    let opened = open_cpu(spec, None)?;
    let backbone = Arc::new(opened.backbone);
    let files = opened.files;
    let hidden = backbone.config().hidden_size;
    // A separate fp32 service over the same weights, with no prefix cache (its states never reach the
    // int8 service), whose forwards show every projection's input to the observer.
    let observer = Arc::new(backbone.activation_observer());
    let fp32 = Kev::new(
        CpuBackend::observed(backbone.clone(), Arm::Fp32, Arc::clone(&observer)),
        PointerHead::new(&files.head, hidden)?,
        KevTokenizer::from_file(&files.tok_path)?,
        Settings {
            cache_bytes: Some(0),
            ..spec.settings.clone()
        },
        0,
    );
    for (index, body) in calibration.iter().enumerate() {
        match fp32.decide(body) {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                return Err(LoadError::Calibration {
                    index,
                    reason: e.to_string(),
                });
            }
            Err(r) => {
                return Err(LoadError::Calibration {
                    index,
                    reason: format!("refused ({}): {r}", r.status()),
                });
            }
        }
    }
    drop(fp32);
    let ranges = backbone.activation_ranges(&observer);
    let float = Arc::try_unwrap(backbone).expect("the calibration service was dropped");
    let backbone = Arc::new(float.quantised(&plan, Some(&ranges))?);
    let spec = LoadSpec {
        arm: Some(Arm::Int8),
        ..spec.clone()
    };
    let (kev, info) = finish_cpu(&spec, backbone, files)?;
    Ok((kev, info, ranges))
}

/// The files beside the backbone.
struct Files {
    head: KevHead,
    head_path: PathBuf,
    tok_path: PathBuf,
    desc: String,
}

struct Opened {
    backbone: Backbone,
    files: Files,
}

/// Refuse, before anything is read, a load this machine's memory cannot hold in `arm` (`crate::fit`).
fn check_memory(spec: &LoadSpec, arm: Arm) -> Result<(), LoadError> {
    let (config_dir, adapter_bytes) = match &spec.source {
        Source::Prepared(dir) => (dir.as_path(), 0),
        Source::Release { base, kev } => (
            base.as_path(),
            std::fs::metadata(kev.join("adapter_model.safetensors")).map_or(0, |m| m.len()),
        ),
    };
    match crate::fit::check(
        config_dir,
        arm,
        spec.form,
        adapter_bytes,
        spec.settings.pass_tokens,
    ) {
        Some(message) => Err(LoadError::Memory(message)),
        None => Ok(()),
    }
}

/// Open the model files; with `int8`, the projections take their int8 form layer by layer as they load
/// ([`Backbone::load_quantised`]).
fn open_cpu(spec: &LoadSpec, int8: Option<Int8Source<'_>>) -> Result<Opened, LoadError> {
    // The float arms hold the same BF16 panels (int8 loads quantise layer by layer, so never hold them all).
    check_memory(
        spec,
        match int8 {
            Some(_) => Arm::Int8,
            None => match spec.arm.unwrap_or_else(default_arm) {
                Arm::Int8 => Arm::Fp32,
                other => other,
            },
        },
    )?;
    let load = |dir: &Path, opts: &LoadOptions| match int8 {
        Some(source) => Backbone::load_quantised(dir, opts, source),
        None => Backbone::load(dir, opts),
    };
    let (backbone, head, head_path, tok_path, desc) = match (&spec.source, spec.form) {
        (Source::Prepared(dir), WeightForm::Merged) => {
            let backbone = load(dir, &LoadOptions::default())?;
            let (head, head_path) = KevHead::read_dir(dir)?;
            (
                backbone,
                head,
                head_path,
                dir.join("tokenizer.json"),
                format!("prepared {}", dir.display()),
            )
        }
        (Source::Prepared(_), WeightForm::Exact) => {
            return Err(LoadError::Unsupported(
                "--weights exact keeps the LoRA unmerged, so it needs the release files: use --base DIR --kev DIR"
                    .into(),
            ));
        }
        (Source::Release { base, kev }, form) => {
            let opts = LoadOptions {
                adapter: Some(kev.clone()),
                merge_adapter: form == WeightForm::Merged,
                ..LoadOptions::default()
            };
            let backbone = load(base, &opts)?;
            let (head, head_path) = KevHead::read_dir(kev)?;
            (
                backbone,
                head,
                head_path,
                kev.join("tokenizer.json"),
                format!("release {} + {}", base.display(), kev.display()),
            )
        }
    };
    Ok(Opened {
        backbone,
        files: Files {
            head,
            head_path,
            tok_path,
            desc,
        },
    })
}

fn finish_cpu(
    spec: &LoadSpec,
    backbone: Arc<Backbone>,
    files: Files,
) -> Result<(Kev<CpuBackend>, ModelInfo), LoadError> {
    let arm = spec.arm.unwrap_or_else(default_arm);
    let Files {
        head,
        head_path,
        tok_path,
        desc,
    } = files;
    let hidden = backbone.config().hidden_size;
    let pointer = PointerHead::new(&head, hidden)?;
    let tokenizer = KevTokenizer::from_file(&tok_path)?;
    let weight_bytes = backbone.weight_bytes();
    let adapter_bytes = backbone.adapter().map_or(0, kev_engine::Adapter::bytes);
    let backend = CpuBackend::new(backbone, arm);
    let info = ModelInfo {
        source: desc,
        form: spec.form,
        arm,
        backend: kev_engine::Backend::describe(&backend),
        device: kev_engine::Backend::device(&backend),
        base: head.meta.base.clone(),
        base_revision: head.meta.base_revision.clone(),
        lora: head.meta.lora.clone(),
        temperature: head.meta.temperature,
        release_date: file_date(&head_path),
        weight_bytes,
        adapter_bytes,
        adapter_sha256: match &spec.source {
            Source::Release { kev, .. } => adapter_sha256(kev),
            Source::Prepared(_) => None,
        },
        demo: false,
    };
    let model_id = model_id(&info);
    let kev = Kev::new(backend, pointer, tokenizer, spec.settings.clone(), model_id)
        .with_info(info.clone());
    // Loading leaves hundreds of megabytes of freed temporaries (tensor conversions, the tokenizer's JSON)
    // in the C heap; a server would hold them for its whole life.
    kev_engine::release_free_heap();
    tracing::info!(
        source = %info.source,
        weights = spec.form.name(),
        precision = arm.name(),
        backend = %info.backend,
        weight_bytes,
        "model loaded"
    );
    Ok((kev, info))
}

/// sha256 of `dir/adapter_model.safetensors` (`None` if it cannot be read), streamed by the release crate's
/// one file hasher.
fn adapter_sha256(dir: &Path) -> Option<String> {
    kev_release::manifest::FileHashes::of_file_with(
        &dir.join("adapter_model.safetensors"),
        false,
        |_| {},
    )
    .ok()
    .map(|h| h.sha256)
}

/// The identity of what `info` describes (files, weight form, arm) in the prepared-state cache and pins.
fn model_id(info: &ModelInfo) -> u64 {
    fnv1a(format!("{}|{}|{}", info.source, info.form.name(), info.arm.name()).as_bytes())
}

fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in bytes {
        h ^= *b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

/// A file's modification date as `YYYY-MM-DD` (UTC), or today's if it cannot be read.
fn file_date(path: &Path) -> String {
    let t = std::fs::metadata(path)
        .and_then(|m| m.modified())
        .unwrap_or_else(|_| SystemTime::now());
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    civil_date(secs / 86_400)
}

/// Days since 1970-01-01 → `YYYY-MM-DD` (proleptic Gregorian; Howard Hinnant's algorithm).
fn civil_date(days: u64) -> String {
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!("{y:04}-{m:02}-{d:02}")
}

#[cfg(test)]
mod tests {
    use super::civil_date;

    #[test]
    fn civil_dates() {
        assert_eq!(civil_date(0), "1970-01-01");
        assert_eq!(civil_date(20_363), "2025-10-02");
        assert_eq!(civil_date(11_016), "2000-02-29");
    }
}
