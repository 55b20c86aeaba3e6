//! Inputs: finding the release files, re-verifying every pinned digest, the prepared directory's
//! manifest, and the head's identity against the pins.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use kev_release::head::HeadMeta;
use kev_release::manifest::{
    DigestKind, FileHashes, Manifest, PinCheck, ReleasePins, RepoPin, verify,
};
use serde_json::Value;

use crate::report::{FileDigest, Gate, Status};

/// The two release directories (the Hub repositories' files).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseDirs {
    /// Base repository files.
    pub base: PathBuf,
    /// Kev repository files.
    pub kev: PathBuf,
    /// How they were found.
    pub found_via: String,
}

/// The release directories: given explicitly, or named by a prepared directory's manifest (its local
/// source directories, or the Hub cache snapshot of the recorded commit).
pub fn locate_release(
    base: Option<&Path>,
    kev: Option<&Path>,
    manifest: Option<&Manifest>,
) -> Option<ReleaseDirs> {
    if let (Some(b), Some(k)) = (base, kev) {
        return Some(ReleaseDirs {
            base: b.to_path_buf(),
            kev: k.to_path_buf(),
            found_via: "--base / --kev".into(),
        });
    }
    let m = manifest?;
    let hub = kev_prepare::HubConfig::from_env();
    let mut found: Vec<(PathBuf, &'static str)> = Vec::new();
    for role in ["base", "kev"] {
        let s = m.sources.iter().find(|s| s.role == role)?;
        let local = s
            .local_dir
            .as_ref()
            .map(PathBuf::from)
            .filter(|d| d.is_dir());
        let cached = match (&s.repo, &s.commit) {
            (Some(repo), Some(commit)) => {
                let d = kev_prepare::HubClient::new(hub.clone())
                    .repo_dir(repo)
                    .join("snapshots")
                    .join(commit);
                d.is_dir().then_some(d)
            }
            _ => None,
        };
        match (local, cached) {
            (Some(d), _) => found.push((d, "the manifest's local source directories")),
            (None, Some(d)) => {
                found.push((d, "the Hugging Face cache snapshots the manifest names"))
            }
            (None, None) => return None,
        }
    }
    let (kev_dir, via) = found.pop()?;
    let (base_dir, _) = found.pop()?;
    Some(ReleaseDirs {
        base: base_dir,
        kev: kev_dir,
        found_via: via.into(),
    })
}

/// The files of each repository the engine reads (the others may be absent).
pub fn required_files(role: &str, dir: &Path) -> Vec<String> {
    match role {
        "kev" => kev_prepare::KEV_FILES
            .iter()
            .map(|s| s.to_string())
            .collect(),
        _ => {
            let mut v = vec!["config.json".to_string()];
            let index = dir.join("model.safetensors.index.json");
            match std::fs::read_to_string(&index)
                .ok()
                .and_then(|t| serde_json::from_str::<Value>(&t).ok())
            {
                Some(idx) => {
                    v.push("model.safetensors.index.json".into());
                    let shards: BTreeSet<String> = idx
                        .get("weight_map")
                        .and_then(Value::as_object)
                        .map(|m| {
                            m.values()
                                .filter_map(Value::as_str)
                                .map(str::to_string)
                                .collect()
                        })
                        .unwrap_or_default();
                    v.extend(shards);
                }
                None => v.push("model.safetensors".into()),
            }
            v
        }
    }
}

/// Re-hash every pinned file present in `dir` and compare with the pin; required files must be present.
pub fn check_repo_pins(
    role: &str,
    dir: &Path,
    pin: &RepoPin,
    pins_name: &str,
) -> (Gate, Vec<FileDigest>) {
    let id = format!("inputs.{role}-pins");
    let title = format!(
        "every {role} file matches the {pins_name} pins ({}@{})",
        pin.repo,
        short(&pin.revision)
    );
    let required = required_files(role, dir);
    let mut problems = Vec::new();
    let mut files = Vec::new();
    let mut absent_optional = Vec::new();
    for name in &required {
        if pin.file(name).is_none() {
            problems.push(format!(
                "{name}: the engine reads it but the pins do not list it"
            ));
        }
    }
    let mut checked = 0usize;
    for f in &pin.files {
        let path = dir.join(&f.name);
        if !path.is_file() {
            if required.contains(&f.name) {
                problems.push(format!("{}: missing from {}", f.name, dir.display()));
            } else {
                absent_optional.push(f.name.clone());
            }
            continue;
        }
        let h = match FileHashes::of_file_with(&path, f.kind == DigestKind::GitSha1, |_| {}) {
            Ok(h) => h,
            Err(e) => {
                problems.push(format!("{}: {e}", f.name));
                continue;
            }
        };
        checked += 1;
        let verdict = match f.check(&h) {
            PinCheck::Ok => "pinned-ok".to_string(),
            PinCheck::Size { expected, found } => {
                problems.push(format!(
                    "{}: {found} bytes, pinned {expected} bytes",
                    f.name
                ));
                "pinned-MISMATCH".into()
            }
            PinCheck::Digest {
                kind,
                expected,
                found,
            } => {
                problems.push(format!("{}: {kind} {found}, pinned {expected}", f.name));
                "pinned-MISMATCH".into()
            }
        };
        files.push(FileDigest {
            role: role.into(),
            name: f.name.clone(),
            size: h.size,
            kind: f.kind.to_string(),
            digest: h.get(f.kind).unwrap_or_default().to_string(),
            check: verdict,
        });
    }
    let mut detail = format!(
        "{checked} files re-hashed in {}, all equal to the pins",
        dir.display()
    );
    if !absent_optional.is_empty() {
        detail.push_str(&format!(
            "; not present (not read by kev): {}",
            absent_optional.join(", ")
        ));
    }
    (Gate::from_problems(&id, &title, detail, problems), files)
}

/// Re-hash a prepared directory against its `manifest.json`.
pub fn check_manifest(dir: &Path) -> (Gate, Option<Manifest>, Vec<FileDigest>) {
    let id = "inputs.manifest";
    let title =
        "the prepared directory re-hashes to its manifest.json (nothing missing, changed or added)";
    match verify(dir) {
        Ok(report) => {
            let files = report
                .manifest
                .outputs
                .iter()
                .map(|r| {
                    let bad = report.problems.iter().any(|p| problem_names(p) == r.name);
                    FileDigest {
                        role: "prepared".into(),
                        name: r.name.clone(),
                        size: r.size,
                        kind: "sha256".into(),
                        digest: r.sha256.clone(),
                        check: if bad {
                            "manifest-MISMATCH".into()
                        } else {
                            "manifest-ok".into()
                        },
                    }
                })
                .collect();
            let problems: Vec<String> = report.problems.iter().map(|p| p.to_string()).collect();
            let gate = Gate::from_problems(
                id,
                title,
                format!("{} files equal to manifest.json", report.ok.len()),
                problems,
            );
            (gate, Some(report.manifest), files)
        }
        Err(e) => (
            Gate::new(
                id,
                title,
                Status::Fail,
                format!("{e} (is this a directory written by `kev prepare`?)"),
            ),
            None,
            Vec::new(),
        ),
    }
}

fn problem_names(p: &kev_release::manifest::VerifyProblem) -> &str {
    use kev_release::manifest::VerifyProblem as V;
    match p {
        V::Missing { name }
        | V::Size { name, .. }
        | V::Digest { name, .. }
        | V::Unlisted { name } => name,
    }
}

/// The inputs a prepared directory records were the pinned files.
pub fn check_manifest_inputs(manifest: &Manifest, pins: &ReleasePins) -> Gate {
    let id = "inputs.manifest-sources";
    let title =
        "the prepared directory was made from the pinned files (its manifest's input digests)";
    let mut problems = Vec::new();
    let mut compared = 0usize;
    let mut size_only = Vec::new();
    for rec in &manifest.inputs {
        let repo = match rec.role.as_deref() {
            Some("kev") => &pins.kev,
            Some("base") => &pins.base,
            other => {
                problems.push(format!("{}: unknown input role {other:?}", rec.name));
                continue;
            }
        };
        let Some(pin) = repo.file(&rec.name) else {
            problems.push(format!(
                "{}: used to prepare the model but not in the pins of {}",
                rec.name, repo.repo
            ));
            continue;
        };
        compared += 1;
        if let Some(size) = pin.size
            && size != rec.size
        {
            problems.push(format!(
                "{}: the manifest records {} bytes, pinned {size}",
                rec.name, rec.size
            ));
        } else if pin.kind == DigestKind::Sha256 && !pin.digest.eq_ignore_ascii_case(&rec.sha256) {
            problems.push(format!(
                "{}: the manifest records sha256 {}, pinned {}",
                rec.name, rec.sha256, pin.digest
            ));
        } else if pin.kind == DigestKind::GitSha1 {
            size_only.push(rec.name.clone());
        }
    }
    if manifest.inputs.is_empty() {
        problems.push("the manifest records no inputs".into());
    }
    let mut detail = format!("{compared} recorded inputs equal to the pins");
    if !size_only.is_empty() {
        detail.push_str(&format!(
            " ({} pinned by git blob id, compared by size here: {})",
            size_only.len(),
            size_only.join(", ")
        ));
    }
    Gate::from_problems(id, title, detail, problems)
}

/// `head.pt`'s identity: the base it names, the LoRA rank, option isolation.
pub fn check_head_identity(
    meta: &HeadMeta,
    from: &str,
    pins: &ReleasePins,
    rank: Option<u64>,
) -> Gate {
    let id = "inputs.head-identity";
    let title = "head.pt names the pinned base and revision, the adapter's LoRA rank, option_isolation False";
    let mut problems = Vec::new();
    if meta.base != pins.base.repo {
        problems.push(format!(
            "base {:?}, the pins say {:?}",
            meta.base, pins.base.repo
        ));
    }
    // in full, or abbreviated to at least 7 hex digits
    if !pins.base.names_revision(&meta.base_revision) {
        problems.push(format!(
            "base_revision {:?}, the pins say {:?}",
            meta.base_revision, pins.base.revision
        ));
    }
    match (meta.lora_rank(), rank) {
        (Some(l), Some(r)) if l != r => {
            problems.push(format!("lora {l}, the adapter's rank is {r}"))
        }
        (None, _) => problems.push(format!("lora {} is not an integer rank", meta.lora)),
        _ => {}
    }
    if meta.option_isolation != Value::Bool(false) {
        problems.push(format!(
            "option_isolation {}, Kev 1.0 checkpoints have False",
            meta.option_isolation
        ));
    }
    Gate::from_problems(
        id,
        title,
        format!(
            "{from}: base {}@{}, lora {}, option_isolation False",
            meta.base,
            short(&meta.base_revision),
            meta.lora
        ),
        problems,
    )
}

/// First 8 characters of a commit id.
pub fn short(rev: &str) -> &str {
    rev.get(..8).unwrap_or(rev)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kev_release::manifest::{FileRecord, MergeRecord, SourceRecord};

    fn manifest(inputs: Vec<FileRecord>, sources: Vec<SourceRecord>) -> Manifest {
        Manifest {
            format_version: 1,
            tool: "kev test".into(),
            pins: None,
            sources,
            inputs,
            outputs: vec![],
            merge: MergeRecord {
                r: 16,
                lora_alpha: 32.0,
                scale: 2.0,
                merged_modules: 0,
                copied_tensors: 0,
                dropped_tensors: vec![],
            },
            notes: Default::default(),
        }
    }

    #[test]
    fn manifest_inputs_are_compared_with_sha256_pins() {
        let pins = ReleasePins::kev_4b_v1();
        let head = pins.kev.file("head.pt").unwrap();
        let good = FileRecord {
            role: Some("kev".into()),
            name: "head.pt".into(),
            size: head.size.unwrap(),
            sha256: head.digest.clone(),
        };
        assert_eq!(
            check_manifest_inputs(&manifest(vec![good.clone()], vec![]), &pins).status,
            Status::Pass
        );
        let bad = FileRecord {
            sha256: "0".repeat(64),
            ..good.clone()
        };
        let g = check_manifest_inputs(&manifest(vec![bad], vec![]), &pins);
        assert_eq!(g.status, Status::Fail);
        assert!(g.detail.contains("head.pt"), "{}", g.detail);
        let stray = FileRecord {
            name: "vocab2.json".into(),
            ..good
        };
        assert_eq!(
            check_manifest_inputs(&manifest(vec![stray], vec![]), &pins).status,
            Status::Fail
        );
    }

    #[test]
    fn head_identity_names_each_disagreement() {
        let pins = ReleasePins::kev_4b_v1();
        let meta = HeadMeta {
            base: pins.base.repo.clone(),
            base_revision: pins.base.revision.clone(),
            lora: 16.into(),
            head_dim: 256,
            option_isolation: false.into(),
            special_embeddings: Value::Null,
            weights_dtype: Value::Null,
            temperature: 2.406050072164233,
            lora_placement: Value::Null,
        };
        assert_eq!(
            check_head_identity(&meta, "head.pt", &pins, Some(16)).status,
            Status::Pass
        );
        let other = HeadMeta {
            base_revision: "0".repeat(40),
            option_isolation: true.into(),
            ..meta.clone()
        };
        let g = check_head_identity(&other, "head.pt", &pins, Some(8));
        assert_eq!(g.status, Status::Fail);
        assert_eq!(g.problems.len(), 3, "{:?}", g.problems);
    }

    #[test]
    fn release_dirs_come_from_the_manifest_local_sources() {
        let tmp = tempfile::tempdir().unwrap();
        let (b, k) = (tmp.path().join("b"), tmp.path().join("k"));
        std::fs::create_dir_all(&b).unwrap();
        std::fs::create_dir_all(&k).unwrap();
        let src = |role: &str, d: &Path| SourceRecord {
            role: role.into(),
            repo: None,
            revision: None,
            commit: None,
            local_dir: Some(d.display().to_string()),
            pinned: false,
        };
        let m = manifest(vec![], vec![src("kev", &k), src("base", &b)]);
        let found = locate_release(None, None, Some(&m)).unwrap();
        assert_eq!((found.base, found.kev), (b.clone(), k.clone()));
        // explicit directories win
        let x = locate_release(Some(&k), Some(&b), Some(&m)).unwrap();
        assert_eq!(x.base, k);
        // a source that is gone: not found
        let gone = manifest(
            vec![],
            vec![src("kev", &k), src("base", &tmp.path().join("gone"))],
        );
        assert_eq!(locate_release(None, None, Some(&gone)), None);
    }
}
