//! `kev prepare` from local copies of the synthetic release: the export against the reference merge,
//! pinned and unpinned sources, tampering anywhere refused, `verify` of the prepared directory.

use std::path::{Path, PathBuf};

use kev_prepare::{ExtrasPolicy, HubConfig, PrepareError, PrepareOptions, Source, prepare};
use kev_release::manifest::{FileHashes, ReleasePins, RepoPin, VerifyProblem, verify};
use kev_release::stream::SafetensorsFile;
use serde_json::Value;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

fn json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// A pristine copy of the synthetic release (symlinks resolved), so files can be tampered with.
fn copy_release(to: &Path) {
    for role in ["kev", "base"] {
        let src = fixtures().join("release").join(role);
        let dst = to.join(role);
        std::fs::create_dir_all(&dst).unwrap();
        for e in std::fs::read_dir(&src).unwrap() {
            let p = e.unwrap().path();
            std::fs::copy(&p, dst.join(p.file_name().unwrap())).unwrap();
        }
    }
}

/// Pins of the copy, under the real repository names and revisions (head.pt names the real base).
fn pins_of(root: &Path) -> ReleasePins {
    let real = ReleasePins::kev_4b_v1();
    ReleasePins {
        name: "synthetic".into(),
        kev: RepoPin::from_dir(&real.kev.repo, &real.kev.revision, &root.join("kev")).unwrap(),
        base: RepoPin::from_dir(&real.base.repo, &real.base.revision, &root.join("base")).unwrap(),
        unverified: Vec::new(),
    }
}

fn options(root: &Path, out: PathBuf) -> PrepareOptions {
    let mut o = PrepareOptions::new(out);
    o.kev = Some(Source::Dir(root.join("kev")));
    o.base = Some(Source::Dir(root.join("base")));
    o.hub = HubConfig {
        endpoint: "http://127.0.0.1:9".into(), // never contacted: both sources are local
        cache_dir: root.join("hf-cache"),
        token: None,
        offline: true,
        progress: false,
    };
    o
}

fn flip_byte(path: &Path, at: u64) {
    let mut data = std::fs::read(path).unwrap();
    let i = (at as usize).min(data.len() - 1);
    data[i] ^= 0x01;
    std::fs::write(path, data).unwrap();
}

/// Every tensor of a prepared directory: merged ones must equal merge.json, copied ones the base
/// bytes (and merge.json, where it lists them). Returns (merged, copied).
fn check_against_reference(out: &Path, base: &Path) -> (usize, usize) {
    let expected = json(&fixtures().join("expected/merge.json"));
    let tensors = expected["tensors"].as_object().unwrap();
    let index = json(&out.join("model.safetensors.index.json"));
    let base_index = json(&base.join("model.safetensors.index.json"));
    let (mut merged, mut copied) = (0, 0);
    let mut total = 0u64;
    for (name, file) in index["weight_map"].as_object().unwrap() {
        let f = SafetensorsFile::open(&out.join(file.as_str().unwrap())).unwrap();
        let t = f.tensor(name).unwrap();
        let bytes = f.read(t).unwrap();
        total += bytes.len() as u64;
        let sha = kev_release::manifest::sha256_hex(&bytes);
        let bf =
            SafetensorsFile::open(&base.join(base_index["weight_map"][name].as_str().unwrap()))
                .unwrap();
        let bt = bf.tensor(name).unwrap();
        let e = &tensors[name.as_str()];
        let dtype = format!("{:?}", t.st_dtype);
        assert_eq!(dtype, e["dtype"].as_str().unwrap(), "{name}");
        assert_eq!(sha, e["sha256"].as_str().unwrap(), "{name}");
        if e["merged"].as_bool().unwrap() {
            merged += 1;
        } else {
            // bit for bit, dtype kept (A_log and the gated norm stay F32)
            assert_eq!(bytes, bf.read(bt).unwrap(), "{name}");
            assert_eq!(t.st_dtype, bt.st_dtype, "{name}");
            copied += 1;
        }
    }
    assert_eq!(index["metadata"]["total_size"].as_u64().unwrap(), total);
    (merged, copied)
}

#[test]
fn engine_export_from_unpinned_directories() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("prepared");
    let report = prepare(&options(&fixtures().join("release"), out.clone())).unwrap();
    let m = &report.manifest;
    assert_eq!(m.merge.merged_modules, 62);
    assert_eq!(m.merge.copied_tensors, 46);
    assert_eq!(m.merge.dropped_tensors.len(), 15 + 21);
    assert!(
        m.merge
            .dropped_tensors
            .iter()
            .all(|n| n.starts_with("mtp.") || n.starts_with("model.visual."))
    );
    assert!(m.sources.iter().all(|s| !s.pinned));
    assert_eq!(m.pins, None);
    // unpinned sources are recorded with a warning
    assert!(
        report
            .warnings
            .iter()
            .any(|w| w.contains("kev source") && w.contains("unpinned"))
    );
    assert!(
        report
            .warnings
            .iter()
            .any(|w| w.contains("base source") && w.contains("unpinned"))
    );
    // every input is recorded with its sha256
    for role in ["kev", "base"] {
        for name in std::fs::read_dir(fixtures().join("release").join(role)).unwrap() {
            let name = name.unwrap().file_name().into_string().unwrap();
            if name.starts_with("tokenizer_config") || (role == "base" && name == "tokenizer.json")
            {
                continue; // not used by the engine
            }
            let rec = m
                .inputs
                .iter()
                .find(|r| r.role.as_deref() == Some(role) && r.name == name)
                .unwrap_or_else(|| panic!("{role}/{name} not recorded"));
            let h =
                FileHashes::of_file(&fixtures().join("release").join(role).join(&name)).unwrap();
            assert_eq!(rec.sha256, h.sha256);
        }
    }
    let (merged, copied) = check_against_reference(&out, &fixtures().join("release/base"));
    assert_eq!((merged, copied), (62, 46));

    // the text config, the Kev tokenizer, the head
    let cfg = json(&out.join("config.json"));
    assert_eq!(cfg["model_type"], "qwen3_5_text");
    assert_eq!(cfg["hidden_size"], 16);
    assert_eq!(cfg["tie_word_embeddings"], true);
    assert!(cfg.get("text_config").is_none());
    assert_eq!(
        std::fs::read(out.join("tokenizer.json")).unwrap(),
        std::fs::read(fixtures().join("release/kev/tokenizer.json")).unwrap()
    );
    let head = kev_release::PreparedHead::read(&out).unwrap();
    let expected_head = json(&fixtures().join("expected/head.json"));
    assert_eq!(
        head.head.meta.temperature.to_bits(),
        expected_head["temperature"].as_f64().unwrap().to_bits()
    );
    assert_eq!(head.delimiters.decide, 248062);

    // the directory verifies; the staging directory is gone
    let v = verify(&out).unwrap();
    assert!(v.is_ok(), "{:?}", v.problems);
    assert_eq!(v.ok.len(), m.outputs.len());
    assert_eq!(m.outputs.len(), 2 + 1 + 1 + 1 + 2); // shards, index, config, tokenizer, head x2
    assert!(!tmp.path().join("prepared.kev-partial").exists());

    // a second run into the same directory is refused
    let err = prepare(&options(&fixtures().join("release"), out.clone())).unwrap_err();
    assert!(matches!(err, PrepareError::OutputExists(_)), "{err}");
}

#[test]
fn keep_extras_is_the_published_merged_layout() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("prepared");
    let mut o = options(&fixtures().join("release"), out.clone());
    o.extras = ExtrasPolicy {
        keep_visual: true,
        keep_mtp: false,
        keep_lm_head: true,
    };
    let report = prepare(&o).unwrap();
    let expected = json(&fixtures().join("expected/merge.json"));
    let m = &report.manifest;
    assert_eq!(
        m.merge.merged_modules as u64,
        expected["adapted"].as_u64().unwrap()
    );
    assert_eq!(
        m.merge.copied_tensors as u64,
        expected["copied"].as_u64().unwrap()
    );
    assert_eq!(m.merge.dropped_tensors.len(), 15);
    let (merged, copied) = check_against_reference(&out, &fixtures().join("release/base"));
    assert_eq!(
        merged + copied,
        expected["tensors"].as_object().unwrap().len()
    );
    // the base's shard names and composite config
    for n in [
        "model.safetensors-00001-of-00002.safetensors",
        "model.safetensors-00002-of-00002.safetensors",
    ] {
        assert!(out.join(n).is_file(), "{n}");
    }
    assert_eq!(
        json(&out.join("config.json")),
        json(&fixtures().join("release/base/config.json"))
    );
}

#[test]
fn pinned_directories_verify_and_any_flipped_byte_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("release");
    copy_release(&root);
    let pins = pins_of(&root);

    // pristine: pinned and accepted
    let mut o = options(&root, tmp.path().join("ok"));
    o.pins = pins.clone();
    o.pins_explicit = true;
    let report = prepare(&o).unwrap();
    assert!(report.manifest.sources.iter().all(|s| s.pinned));
    assert_eq!(report.manifest.pins.as_deref(), Some("synthetic"));
    assert!(report.warnings.is_empty(), "{:?}", report.warnings);

    // one flipped byte in any file the engine uses stops the run, naming the file and both digests
    let used = [
        ("kev", "adapter_config.json"),
        ("kev", "adapter_model.safetensors"),
        ("kev", "head.pt"),
        ("kev", "tokenizer.json"),
        ("base", "config.json"),
        ("base", "model.safetensors.index.json"),
        ("base", "model.safetensors-00001-of-00002.safetensors"),
        ("base", "model.safetensors-00002-of-00002.safetensors"),
    ];
    for (i, (role, name)) in used.iter().enumerate() {
        let path = root.join(role).join(name);
        let pristine = std::fs::read(&path).unwrap();
        let before = FileHashes::of_file(&path).unwrap();
        flip_byte(&path, 1000 + i as u64 * 7);
        let after = FileHashes::of_file(&path).unwrap();
        let mut o = options(&root, tmp.path().join(format!("bad{i}")));
        o.pins = pins.clone();
        o.pins_explicit = true;
        let err = prepare(&o).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, PrepareError::PinMismatch(_)), "{name}: {msg}");
        assert!(msg.contains(name), "{msg}");
        let repo = if *role == "kev" {
            &pins.kev
        } else {
            &pins.base
        };
        let kind = repo.file(name).unwrap().kind;
        let (old, new) = (before.get(kind).unwrap(), after.get(kind).unwrap());
        assert!(msg.contains(old) && msg.contains(new), "{msg}");
        assert!(msg.contains("leave out --pins"), "{msg}");
        assert!(!tmp.path().join(format!("bad{i}")).exists());
        std::fs::write(&path, pristine).unwrap();
    }

    // a file the engine does not use may change freely
    flip_byte(&root.join("kev/tokenizer_config.json"), 10);
    let mut o = options(&root, tmp.path().join("ok2"));
    o.pins = pins.clone();
    o.pins_explicit = true;
    prepare(&o).unwrap();

    // a truncated file is caught by its size
    let shard = root.join("base/model.safetensors-00002-of-00002.safetensors");
    let data = std::fs::read(&shard).unwrap();
    std::fs::write(&shard, &data[..data.len() - 8]).unwrap();
    let mut o = options(&root, tmp.path().join("short"));
    o.pins = pins.clone();
    o.pins_explicit = true;
    let msg = prepare(&o).unwrap_err().to_string();
    assert!(
        msg.contains("size") && msg.contains(&format!("{}", data.len() - 8)),
        "{msg}"
    );
    std::fs::write(&shard, &data).unwrap();
}

#[test]
fn head_must_name_the_pinned_base() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("release");
    copy_release(&root);
    let mut pins = pins_of(&root);
    pins.base.revision = "0123456789abcdef0123456789abcdef01234567".into();
    let mut o = options(&root, tmp.path().join("out"));
    o.pins = pins;
    o.pins_explicit = true;
    let err = prepare(&o).unwrap_err();
    assert!(matches!(err, PrepareError::HeadBase { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("1001bb4d826a52d1f399e183466143f4da7b741b")
            && msg.contains("0123456789abcdef"),
        "{msg}"
    );
}

#[test]
fn refusals_reach_the_entry_point() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("release");
    copy_release(&root);
    // unsupported adapter
    let cfg_path = root.join("kev/adapter_config.json");
    let pristine = std::fs::read(&cfg_path).unwrap();
    let mut cfg = json(&cfg_path);
    cfg["use_dora"] = Value::Bool(true);
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    let err = prepare(&options(&root, tmp.path().join("a"))).unwrap_err();
    assert!(
        err.to_string().contains("use_dora = true is not supported"),
        "{err}"
    );
    std::fs::write(&cfg_path, pristine).unwrap();
    // a missing needed file
    std::fs::remove_file(root.join("kev/head.pt")).unwrap();
    let err = prepare(&options(&root, tmp.path().join("b"))).unwrap_err();
    assert!(matches!(err, PrepareError::MissingFile { .. }), "{err}");
    assert!(err.to_string().contains("head.pt"), "{err}");
}

#[test]
fn verify_reports_tampering_of_the_prepared_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("prepared");
    prepare(&options(&fixtures().join("release"), out.clone())).unwrap();
    flip_byte(
        &out.join("model.safetensors-00001-of-00002.safetensors"),
        4096,
    );
    flip_byte(&out.join("kev_head.json"), 3);
    std::fs::remove_file(out.join("tokenizer.json")).unwrap();
    std::fs::write(out.join("stray.bin"), b"x").unwrap();
    let v = verify(&out).unwrap();
    assert!(!v.is_ok());
    let names = |pred: fn(&VerifyProblem) -> Option<&str>| -> Vec<String> {
        v.problems
            .iter()
            .filter_map(pred)
            .map(str::to_string)
            .collect()
    };
    assert_eq!(
        names(|p| match p {
            VerifyProblem::Digest { name, .. } => Some(name),
            _ => None,
        }),
        [
            "kev_head.json",
            "model.safetensors-00001-of-00002.safetensors"
        ]
    );
    assert_eq!(
        names(|p| match p {
            VerifyProblem::Missing { name } => Some(name),
            _ => None,
        }),
        ["tokenizer.json"]
    );
    assert_eq!(
        names(|p| match p {
            VerifyProblem::Unlisted { name } => Some(name),
            _ => None,
        }),
        ["stray.bin"]
    );
}

/// Pins that leave part of a release unverified (as the built-in Kev-0.8B ones do) say so in the manifest of
/// every directory prepared against them, and small files pinned by sha256 (the only digest public records
/// give for Kev-0.8B's) are checked like any other pin.
#[test]
fn unverified_pins_are_recorded_and_sha256_pins_of_small_files_hold() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("release");
    copy_release(&root);
    let mut pins = pins_of(&root);
    for (role, repo) in [("kev", &mut pins.kev), ("base", &mut pins.base)] {
        for f in &mut repo.files {
            f.kind = kev_release::DigestKind::Sha256;
            f.digest = FileHashes::of_file(&root.join(role).join(&f.name))
                .unwrap()
                .sha256;
        }
    }
    pins.unverified = vec![
        "README.md has no public digest".into(),
        "git blob ids not found".into(),
    ];
    let mut o = options(&root, tmp.path().join("ok"));
    o.pins = pins.clone();
    o.pins_explicit = true;
    let report = prepare(&o).unwrap();
    let notes = &report.manifest.notes;
    assert_eq!(notes["pins.unverified.0"], "README.md has no public digest");
    assert_eq!(notes["pins.unverified.1"], "git blob ids not found");
    assert!(report.warnings.is_empty(), "{:?}", report.warnings);
    // unpinned preparations carry no such note: there are no pins to qualify
    let unpinned = prepare(&options(&root, tmp.path().join("unpinned"))).unwrap();
    assert!(
        !unpinned
            .manifest
            .notes
            .keys()
            .any(|k| k.starts_with("pins."))
    );

    let path = root.join("kev/adapter_config.json");
    let before = FileHashes::of_file(&path).unwrap();
    flip_byte(&path, 40);
    let after = FileHashes::of_file(&path).unwrap();
    let mut o = options(&root, tmp.path().join("bad"));
    o.pins = pins;
    o.pins_explicit = true;
    let msg = prepare(&o).unwrap_err().to_string();
    assert!(
        msg.contains("adapter_config.json") && msg.contains("sha256"),
        "{msg}"
    );
    assert!(
        msg.contains(&before.sha256) && msg.contains(&after.sha256),
        "{msg}"
    );
}

/// `--release kev-0.8b` and `--release kev-9b` ask for their own repositories at their pinned commits
/// (offline with an empty cache, the refusal names what it looked for).
#[test]
fn each_release_asks_for_its_own_pinned_repositories() {
    for (release, pins, repo) in [
        (
            kev_release::Release::Kev08b,
            ReleasePins::kev_0_8b_v1(),
            "jaredpalmer/kev-0.8b@bf75a6a8848ea6960ff2ed108d9ed44c2941174f",
        ),
        (
            kev_release::Release::Kev9b,
            ReleasePins::kev_9b_v1(),
            "jaredpalmer/kev-9b@db029f08b290afd9fee4aa4bbcd9ae48602d1eb0",
        ),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let mut o = PrepareOptions::for_release(tmp.path().join("out"), release);
        o.hub = HubConfig {
            endpoint: "http://127.0.0.1:9".into(),
            cache_dir: tmp.path().join("empty-cache"),
            token: None,
            offline: true,
            progress: false,
        };
        assert_eq!(o.pins, pins);
        let msg = prepare(&o).unwrap_err().to_string();
        assert!(msg.contains(repo), "{msg}");
        assert!(!tmp.path().join("out").exists());
    }
}
