//! `kev prepare`: from the pinned Hub release (or local copies) to an engine-ready directory.
//!
//! 1. **Fetch** only the files the engine needs (Kev: `adapter_config.json`,
//!    `adapter_model.safetensors`, `head.pt`, `tokenizer.json`; base: `config.json`, the shard index and
//!    the shards) through the Hub cache ([`hub`]), or take them from local directories.
//! 2. **Verify** every file before use: against the pins (size + sha256 or git blob sha1) where the
//!    source is pinned; unpinned sources are hashed, recorded and warned about. `head.pt` must name the
//!    base it is merged into.
//! 3. **Merge** shard by shard ([`export`]): adapted weights become `bf16(fp32(W) + (B@A)·alpha/r)`,
//!    every other tensor is copied bit for bit; `mtp.*` and `model.visual.*` are dropped unless kept.
//! 4. **Write** the merged shards + index, the text `config.json`, the Kev `tokenizer.json`,
//!    `head.safetensors` + `kev_head.json`, and `manifest.json` (last: its presence marks a complete
//!    directory). The directory is assembled under `<out>.kev-partial` and renamed into place.
#![deny(missing_docs)]

mod cached;
mod error;
pub mod export;
pub mod hub;
mod source;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use kev_release::head::{Delimiters, HeadProvenance, KevHead};
use kev_release::manifest::{
    FileHashes, FileRecord, MANIFEST_FORMAT_VERSION, Manifest, MergeRecord, ReleasePins,
};
use kev_release::{Adapter, AdapterConfig, Release, TensorStore};

pub use cached::{offline_hint, prepared_release, release_dir};
pub use error::{PinMismatch, PrepareError};
pub use export::ExtrasPolicy;
pub use hub::{HubClient, HubConfig, HubError};
pub use source::Source;

use error::io_err;
use source::{Resolved, fetch_files, resolve, source_record, verify_files};

/// Files of the Kev repository the engine needs. Never `vocab.json`, `merges.txt` or
/// `added_tokens.json`: they are stale (Qwen3-era ids) in the Kev repository.
pub const KEV_FILES: [&str; 4] = [
    "adapter_config.json",
    "adapter_model.safetensors",
    "head.pt",
    "tokenizer.json",
];

/// Everything `kev prepare` needs to know.
#[derive(Debug, Clone)]
pub struct PrepareOptions {
    /// The Kev repository; `None` = the pinned one.
    pub kev: Option<Source>,
    /// The base repository; `None` = the pinned one.
    pub base: Option<Source>,
    /// Output directory (must not exist or be empty).
    pub out: PathBuf,
    /// Which extras to keep.
    pub extras: ExtrasPolicy,
    /// The release pins (default: Kev-4B v1.0).
    pub pins: ReleasePins,
    /// True when the pins were given explicitly: local directories are then checked against them.
    pub pins_explicit: bool,
    /// Hub settings (endpoint, cache, token, offline).
    pub hub: HubConfig,
}

impl PrepareOptions {
    /// Defaults: the Kev-4B v1.0 pins, the Hub as configured by the environment.
    pub fn new(out: PathBuf) -> Self {
        Self::for_release(out, Release::default())
    }

    /// The pins of a published release (`kev-4b`, `kev-0.8b`, `kev-9b`), the Hub as configured by the
    /// environment.
    pub fn for_release(out: PathBuf, release: Release) -> Self {
        PrepareOptions {
            kev: None,
            base: None,
            out,
            extras: ExtrasPolicy::default(),
            pins: release.pins(),
            pins_explicit: false,
            hub: HubConfig::from_env(),
        }
    }
}

/// What `kev prepare` did.
#[derive(Debug, Clone)]
pub struct PrepareReport {
    /// The prepared directory.
    pub out: PathBuf,
    /// Its manifest (also written to `manifest.json`).
    pub manifest: Manifest,
    /// Warnings raised (unpinned sources, unchecked base identity).
    pub warnings: Vec<String>,
}

/// Run `kev prepare`.
pub fn prepare(opts: &PrepareOptions) -> Result<PrepareReport, PrepareError> {
    let started = std::time::Instant::now();
    let mut warnings = Vec::new();
    let client = HubClient::new(opts.hub.clone());
    check_output(&opts.out)?;

    // 1 + 2: fetch and verify.
    let Fetched {
        kev,
        base,
        inputs,
        shard_names,
    } = fetch_and_verify(&client, opts, started, &mut warnings)?;

    // The head must name the base being merged.
    let head = KevHead::read_pt(kev.path("head.pt")?)?;
    check_head_names_base(&head, &base, &mut warnings)?;

    let config_path = base.path("config.json")?;
    let config_json = read_json(config_path)?;
    let hidden = config_json
        .get("text_config")
        .unwrap_or(&config_json)
        .get("hidden_size")
        .and_then(serde_json::Value::as_u64);
    if let Some(h) = hidden
        && h != head.hidden_size() as u64
    {
        return Err(PrepareError::HeadWidth {
            head: head.hidden_size(),
            base: h,
        });
    }

    // 3: the adapter, mapped onto the base's tensor names; the merge.
    let adapter = load_adapter(&kev, &base, &shard_names, &head)?;
    let staging = staging_dir(&opts.out);
    let result = merge_and_export(opts, &base, &shard_names, &adapter, &staging)?;

    // 4: the rest of the directory.
    let mut outputs: Vec<FileRecord> = result
        .shards
        .iter()
        .map(|s| FileRecord {
            role: None,
            name: s.name.clone(),
            size: s.size,
            sha256: s.sha256.clone(),
        })
        .collect();
    let write = |name: &str, text: &str| -> Result<(), PrepareError> {
        let p = staging.join(name);
        std::fs::write(&p, text).map_err(io_err(&p))
    };
    write(INDEX_NAME, &export::index_json(&result))?;
    let config_out = if opts.extras.keep_visual {
        config_json
    } else {
        export::text_config(&config_json).map_err(|message| PrepareError::Json {
            path: config_path.to_path_buf(),
            message,
        })?
    };
    let mut config_text = serde_json::to_string_pretty(&config_out)
        .map_err(|e| PrepareError::Internal(e.to_string()))?;
    config_text.push('\n');
    write("config.json", &config_text)?;
    let tok_src = kev.path("tokenizer.json")?;
    std::fs::copy(tok_src, staging.join("tokenizer.json")).map_err(io_err(tok_src))?;
    let delimiters = Delimiters::from_tokenizer_json(tok_src)?;
    head.write_prepared(&staging, &delimiters, &head_provenance(&kev, &inputs))?;
    for name in [
        INDEX_NAME,
        "config.json",
        "tokenizer.json",
        kev_release::head::HEAD_SAFETENSORS,
        kev_release::head::HEAD_JSON,
    ] {
        let h = FileHashes::of_file_with(&staging.join(name), false, |_| {})?;
        outputs.push(FileRecord {
            role: None,
            name: name.to_string(),
            size: h.size,
            sha256: h.sha256,
        });
    }
    outputs.sort_by(|a, b| a.name.cmp(&b.name));

    let pinned = kev.pin.is_some() || base.pin.is_some();
    let notes = manifest_notes(opts, &result, &warnings, pinned);
    let manifest = Manifest {
        format_version: MANIFEST_FORMAT_VERSION,
        tool: concat!("kev ", env!("CARGO_PKG_VERSION")).to_string(),
        pins: pinned.then(|| opts.pins.name.clone()),
        sources: [&kev, &base].iter().map(|r| source_record(r)).collect(),
        inputs,
        outputs,
        merge: MergeRecord {
            r: adapter.config().r,
            lora_alpha: adapter.config().lora_alpha,
            scale: adapter.scale(),
            merged_modules: result.merged,
            copied_tensors: result.copied,
            dropped_tensors: result.dropped.clone(),
        },
        notes,
    };
    manifest.write(&staging)?;
    if opts.out.exists() {
        // check_output allowed only an empty directory
        std::fs::remove_dir(&opts.out).map_err(io_err(&opts.out))?;
    }
    std::fs::rename(&staging, &opts.out).map_err(io_err(&opts.out))?;
    Ok(PrepareReport {
        out: opts.out.clone(),
        manifest,
        warnings,
    })
}

/// The base's shard index; without it the base is one `model.safetensors`.
const INDEX_NAME: &str = "model.safetensors.index.json";

/// Both repositories fetched and verified.
struct Fetched {
    kev: Resolved,
    base: Resolved,
    /// Every input file's record, sorted by role and name.
    inputs: Vec<FileRecord>,
    /// The base's weight shards.
    shard_names: Vec<String>,
}

/// Fetch and verify the Kev files, then the base's config and index, then the shards the index names.
fn fetch_and_verify(
    client: &HubClient,
    opts: &PrepareOptions,
    started: std::time::Instant,
    warnings: &mut Vec<String>,
) -> Result<Fetched, PrepareError> {
    let kev_src = opts.kev.clone().unwrap_or_else(|| Source::Hub {
        repo: opts.pins.kev.repo.clone(),
        revision: opts.pins.kev.revision.clone(),
    });
    let base_src = opts.base.clone().unwrap_or_else(|| Source::Hub {
        repo: opts.pins.base.repo.clone(),
        revision: opts.pins.base.revision.clone(),
    });
    // The base index decides which shards exist, so it is verified first.
    let mut inputs: Vec<FileRecord> = Vec::new();
    let mut kev = resolve(client, "kev", &kev_src, &opts.pins.kev, opts.pins_explicit)?;
    fetch_files(client, &mut kev, &KEV_FILES)?;
    kev.repin(&opts.pins.kev);
    let progress = opts.hub.progress;
    // the small side first: a wrong Kev release is refused before gigabytes of base are fetched
    inputs.extend(verify_files(&kev, &KEV_FILES, progress, warnings)?);
    let mut base = resolve(
        client,
        "base",
        &base_src,
        &opts.pins.base,
        opts.pins_explicit,
    )?;
    let has_index = match (&base.pin, &base.source) {
        (Some(p), _) => p.file(INDEX_NAME).is_some(),
        (None, Source::Dir(d)) => d.join(INDEX_NAME).is_file(),
        (None, Source::Hub { repo, revision }) => client.exists(repo, revision, INDEX_NAME)?,
    };
    let first: Vec<&str> = if has_index {
        vec!["config.json", INDEX_NAME]
    } else {
        vec!["config.json", "model.safetensors"]
    };
    fetch_files(client, &mut base, &first)?;
    base.repin(&opts.pins.base);
    inputs.extend(verify_files(&base, &first, progress, warnings)?);
    let shard_names: Vec<String> = if has_index {
        shard_list(base.path(INDEX_NAME)?)?
    } else {
        vec!["model.safetensors".to_string()]
    };
    let shard_refs: Vec<&str> = shard_names.iter().map(String::as_str).collect();
    if has_index {
        fetch_files(client, &mut base, &shard_refs)?;
        inputs.extend(verify_files(&base, &shard_refs, progress, warnings)?);
    }
    inputs.sort_by(|a, b| (&a.role, &a.name).cmp(&(&b.role, &b.name)));
    tracing::info!(
        files = inputs.len(),
        bytes = inputs.iter().map(|r| r.size).sum::<u64>(),
        seconds = started.elapsed().as_secs_f64(),
        "inputs fetched and verified"
    );
    Ok(Fetched {
        kev,
        base,
        inputs,
        shard_names,
    })
}

/// Refuse a head made for another base than the one being merged; an unpinned local base cannot be
/// checked, which is a warning.
fn check_head_names_base(
    head: &KevHead,
    base: &Resolved,
    warnings: &mut Vec<String>,
) -> Result<(), PrepareError> {
    let expected_base = match (&base.pin, &base.source) {
        (Some(p), _) => Some((p.repo.clone(), p.revision.clone())),
        (None, Source::Hub { repo, .. }) => base.commit.clone().map(|c| (repo.clone(), c)),
        (None, Source::Dir(d)) => {
            warn(
                warnings,
                format!(
                    "the base directory {} is unpinned: cannot check that it is {}@{} as head.pt says",
                    d.display(),
                    head.meta.base,
                    head.meta.base_revision
                ),
            );
            None
        }
    };
    // The revision may be abbreviated in the head (a card's `68c46c4b`): it must still name this commit.
    if let Some((repo, rev)) = expected_base
        && (head.meta.base != repo
            || !kev_release::manifest::names_commit(&head.meta.base_revision, &rev))
    {
        return Err(PrepareError::HeadBase {
            found_base: head.meta.base.clone(),
            found_revision: head.meta.base_revision.clone(),
            expected_base: repo,
            expected_revision: rev,
        });
    }
    Ok(())
}

/// The adapter mapped onto the base's tensor names, its rank checked against the one the head records.
fn load_adapter(
    kev: &Resolved,
    base: &Resolved,
    shard_names: &[String],
    head: &KevHead,
) -> Result<Adapter, PrepareError> {
    let store = open_base_store(base, shard_names)?;
    let config = AdapterConfig::from_file(kev.path("adapter_config.json")?)?;
    if let Some(rank) = head.meta.lora_rank()
        && rank != config.r
    {
        return Err(PrepareError::HeadAdapter {
            head: rank,
            adapter: config.r,
        });
    }
    let weights_path = kev.path("adapter_model.safetensors")?;
    let weights = TensorStore::open_files(
        weights_path.parent().unwrap_or(Path::new(".")),
        &[weights_path.to_path_buf()],
    )?;
    let adapter = Adapter::from_parts(config, &weights, &store)?;
    drop(weights);
    drop(store);
    Ok(adapter)
}

/// Merge and export every shard into a fresh `staging` directory.
fn merge_and_export(
    opts: &PrepareOptions,
    base: &Resolved,
    shard_names: &[String],
    adapter: &Adapter,
    staging: &Path,
) -> Result<export::ExportResult, PrepareError> {
    if staging.exists() {
        std::fs::remove_dir_all(staging).map_err(io_err(staging))?;
    }
    std::fs::create_dir_all(staging).map_err(io_err(staging))?;

    let bar = progress_bar(opts.hub.progress, "merge + export");
    let shards: Vec<(String, PathBuf)> = shard_names
        .iter()
        .map(|n| Ok((n.clone(), base.path(n)?.to_path_buf())))
        .collect::<Result<_, PrepareError>>()?;
    let t_export = std::time::Instant::now();
    let result = export::export_shards(&shards, adapter, opts.extras, staging, &bar)?;
    tracing::info!(
        merged = result.merged,
        copied = result.copied,
        bytes = result.total_size,
        seconds = t_export.elapsed().as_secs_f64(),
        "merged and exported"
    );
    bar.finish_and_clear();
    Ok(result)
}

/// Where `head.pt` came from, for `kev_head.json`.
fn head_provenance(kev: &Resolved, inputs: &[FileRecord]) -> HeadProvenance {
    let head_sha = inputs
        .iter()
        .find(|r| r.role.as_deref() == Some("kev") && r.name == "head.pt")
        .map(|r| r.sha256.clone())
        .unwrap_or_default();
    HeadProvenance {
        source: match &kev.source {
            Source::Hub { repo, .. } => repo.clone(),
            Source::Dir(d) => d.display().to_string(),
        },
        revision: kev.commit.clone(),
        head_pt_sha256: head_sha,
    }
}

/// The manifest's notes: what became of the extras, the warnings raised, and (`pinned`: a source was
/// checked against the pins) what the pins leave unverified.
fn manifest_notes(
    opts: &PrepareOptions,
    result: &export::ExportResult,
    warnings: &[String],
    pinned: bool,
) -> BTreeMap<String, String> {
    let mut notes = BTreeMap::new();
    let fate = |kept: bool| if kept { "kept" } else { "dropped" };
    notes.insert(
        "extras".to_string(),
        format!(
            "model.visual.* {}, mtp.* {}, {} {}",
            fate(opts.extras.keep_visual),
            fate(opts.extras.keep_mtp),
            export::LM_HEAD,
            if result.dropped.iter().any(|d| d == export::LM_HEAD) {
                "dropped (untied base; never read)"
            } else if opts.extras.keep_lm_head {
                "kept"
            } else {
                "absent (tied base)"
            }
        ),
    );
    for (i, w) in warnings.iter().enumerate() {
        notes.insert(format!("warning.{i}"), w.clone());
    }
    // What the pins themselves leave open travels with every directory prepared against them.
    if pinned {
        for (i, u) in opts.pins.unverified.iter().enumerate() {
            notes.insert(format!("pins.unverified.{i}"), u.clone());
        }
    }
    notes
}

/// Add a file to a prepared directory (`kev prepare --int8`: the stored int8 form): `write` creates
/// `dir/name` (it runs before the manifest changes; on error nothing is recorded and a partial file is
/// removed), then the file is hashed into the manifest's outputs and `notes` are added to its notes.
pub fn add_output(
    dir: &Path,
    name: &str,
    write: impl FnOnce(&Path) -> Result<BTreeMap<String, String>, String>,
) -> Result<Manifest, PrepareError> {
    let mut manifest = Manifest::read(dir)?;
    if manifest.outputs.iter().any(|o| o.name == name) {
        return Err(PrepareError::Usage(format!(
            "{}: the manifest already records {name}",
            dir.display()
        )));
    }
    let path = dir.join(name);
    let notes = match write(&path) {
        Ok(n) => n,
        Err(e) => {
            let _ = std::fs::remove_file(&path);
            return Err(PrepareError::Internal(format!("writing {name}: {e}")));
        }
    };
    let h = FileHashes::of_file_with(&path, false, |_| {})?;
    manifest.outputs.push(FileRecord {
        role: None,
        name: name.to_string(),
        size: h.size,
        sha256: h.sha256,
    });
    manifest.outputs.sort_by(|a, b| a.name.cmp(&b.name));
    manifest.notes.extend(notes);
    manifest.write(dir)?;
    Ok(manifest)
}

pub(crate) fn warn(warnings: &mut Vec<String>, w: String) {
    if !warnings.contains(&w) {
        tracing::warn!("{w}");
        warnings.push(w);
    }
}

fn staging_dir(out: &Path) -> PathBuf {
    let mut name = out.file_name().unwrap_or_default().to_os_string();
    name.push(".kev-partial");
    out.with_file_name(name)
}

fn check_output(out: &Path) -> Result<(), PrepareError> {
    if out.as_os_str().is_empty() || out.file_name().is_none() {
        return Err(PrepareError::Usage(format!(
            "--out {}: not a directory name",
            out.display()
        )));
    }
    match std::fs::read_dir(out) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(PrepareError::OutputExists(out.to_path_buf()));
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(PrepareError::Io {
            path: out.to_path_buf(),
            source: e,
        }),
    }
}

fn read_json(path: &Path) -> Result<serde_json::Value, PrepareError> {
    let text = std::fs::read_to_string(path).map_err(io_err(path))?;
    serde_json::from_str(&text).map_err(|e| PrepareError::Json {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

fn shard_list(index: &Path) -> Result<Vec<String>, PrepareError> {
    let v = read_json(index)?;
    let bad = |message: &str| PrepareError::Json {
        path: index.to_path_buf(),
        message: message.to_string(),
    };
    let map = v
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| bad("no weight_map"))?;
    let mut names: Vec<String> = Vec::new();
    for f in map.values() {
        let f = f
            .as_str()
            .ok_or_else(|| bad("weight_map values must be file names"))?;
        if f.contains("..") || f.starts_with('/') || f.contains('\\') {
            return Err(bad("shard names must stay inside the repository"));
        }
        if !names.iter().any(|n| n == f) {
            names.push(f.to_string());
        }
    }
    names.sort();
    if names.is_empty() {
        return Err(bad("weight_map is empty"));
    }
    Ok(names)
}

fn open_base_store(base: &Resolved, shards: &[String]) -> Result<TensorStore, PrepareError> {
    let paths: Vec<PathBuf> = shards
        .iter()
        .map(|n| Ok(base.path(n)?.to_path_buf()))
        .collect::<Result<_, PrepareError>>()?;
    Ok(TensorStore::open_files(&base.dir, &paths)?)
}

pub(crate) fn progress_bar(enabled: bool, label: &str) -> ProgressBar {
    if !enabled {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template(
        "{msg:16} {bar:40} {bytes:>10}/{total_bytes:<10} {bytes_per_sec:>12} {eta:>4}",
    ) {
        bar.set_style(style);
    }
    bar.set_message(label.to_string());
    bar
}
