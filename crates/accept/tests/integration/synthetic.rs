//! The whole kit on the synthetic release (fixtures/, written by tools/reference): every gate passes
//! against the reference outputs committed with the fixtures; a tampered export, a wrong head and the
//! wrong-seed model each fail the gate that should catch them. No Python: the live reference path is the
//! `#[ignore]`d test at the end, with the real-weight tests.

use std::path::{Path, PathBuf};

use kev_accept::{
    AcceptError, AcceptOptions, ArmId, GateMode, ReferenceSource, Report, Status, accept,
};
use kev_prepare::{HubConfig, PrepareOptions, Source, prepare};
use kev_release::manifest::{ReleasePins, RepoPin};
use kev_release::stream::SafetensorsFile;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

fn shipped_reference() -> PathBuf {
    fixtures().join("accept/reference-synthetic.json")
}

/// A copy of a release (`release` or `release-wrong`) with symlinks resolved, so files can be tampered with.
fn copy_release(which: &str, to: &Path) {
    for role in ["kev", "base"] {
        let src = fixtures().join(which).join(role);
        let dst = to.join(role);
        std::fs::create_dir_all(&dst).unwrap();
        for e in std::fs::read_dir(&src).unwrap() {
            let p = e.unwrap().path();
            std::fs::copy(&p, dst.join(p.file_name().unwrap())).unwrap();
        }
    }
}

/// Pins computed from a pristine copy, under the real repository names and revisions (the synthetic
/// head.pt names the real base and revision).
fn pins_of(root: &Path) -> ReleasePins {
    let real = ReleasePins::kev_4b_v1();
    ReleasePins {
        name: "synthetic release".into(),
        kev: RepoPin::from_dir(&real.kev.repo, &real.kev.revision, &root.join("kev")).unwrap(),
        base: RepoPin::from_dir(&real.base.repo, &real.base.revision, &root.join("base")).unwrap(),
        unverified: Vec::new(),
    }
}

fn prepare_into(root: &Path, pins: &ReleasePins, out: &Path) {
    let mut o = PrepareOptions::new(out.to_path_buf());
    o.kev = Some(Source::Dir(root.join("kev")));
    o.base = Some(Source::Dir(root.join("base")));
    o.pins = pins.clone();
    o.pins_explicit = true;
    o.hub = HubConfig {
        endpoint: "http://127.0.0.1:9".into(), // never contacted: both sources are local
        cache_dir: root.join("hf-cache"),
        token: None,
        offline: true,
        progress: false,
    };
    prepare(&o).unwrap();
}

/// A pristine copy, its pins and a prepared directory made from it.
struct Kit {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    model: PathBuf,
    pins: ReleasePins,
}

fn kit(which: &str) -> Kit {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("release");
    copy_release(which, &root);
    let pins = pins_of(&root);
    let model = tmp.path().join("prepared");
    prepare_into(&root, &pins, &model);
    Kit {
        root,
        model,
        pins,
        _tmp: tmp,
    }
}

/// A few requests of the shipped set (short and long states, several questions), for the tests that
/// need decisions but not the whole set.
fn small_set(k: &Kit) -> PathBuf {
    let dir = k.root.join("small-set");
    std::fs::create_dir_all(&dir).unwrap();
    for name in ["multi-3", "state-long-1500", "devanagari", "score-10"] {
        let f = format!("{name}.json");
        std::fs::copy(fixtures().join("accept/requests").join(&f), dir.join(&f)).unwrap();
    }
    dir
}

fn options(k: &Kit) -> AcceptOptions {
    AcceptOptions {
        model: Some(k.model.clone()),
        base: Some(k.root.join("base")),
        kev: Some(k.root.join("kev")),
        pins: k.pins.clone(),
        pins_origin: "computed from a pristine copy".into(),
        gates: Some(GateMode::Synthetic),
        reference: ReferenceSource::Output(shipped_reference()),
        ..AcceptOptions::default()
    }
}

fn status(r: &Report, id: &str) -> Status {
    r.gate(id)
        .unwrap_or_else(|| panic!("no gate {id}; gates: {:#?}", r.gates))
        .status
}

fn failed_ids(r: &Report) -> Vec<String> {
    r.failed().map(|g| g.id.clone()).collect()
}

fn gate_text(r: &Report, id: &str) -> String {
    let g = r.gate(id).unwrap();
    format!("{} {}", g.detail, g.problems.join(" | "))
}

/// `fixtures/accept/pins-synthetic.json`: the pins `kev accept --pins` takes for the synthetic release on
/// the command line (VERIFYING.md). Regenerate with `KEV_ACCEPT_WRITE_PINS=1` after the fixtures change.
#[test]
fn the_committed_synthetic_pins_are_the_fixture_release() {
    let path = fixtures().join("accept/pins-synthetic.json");
    let pins = pins_of(&fixtures().join("release"));
    if std::env::var_os("KEV_ACCEPT_WRITE_PINS").is_some() {
        std::fs::write(&path, pins.to_json() + "\n").unwrap();
    }
    let committed = ReleasePins::from_json_file(&path).unwrap();
    assert_eq!(
        committed, pins,
        "fixtures/release changed: regenerate with KEV_ACCEPT_WRITE_PINS=1"
    );
}

#[test]
fn the_synthetic_release_passes_every_gate_with_the_shipped_set() {
    let k = kit("release");
    let report = accept(&options(&k)).unwrap();
    let failed = failed_ids(&report);
    assert!(
        report.passed(),
        "failed: {failed:?}\n{}",
        report.to_markdown()
    );

    // every gate the brief names ran and passed
    for id in [
        "inputs.manifest",
        "inputs.manifest-sources",
        "inputs.kev-pins",
        "inputs.base-pins",
        "inputs.head-identity",
        "merge.adapted",
        "merge.copied",
        "head.equal",
        "decisions.rows",
    ] {
        assert_eq!(status(&report, id), Status::Pass, "{id}");
    }
    for arm in ["exact-fp32", "exact-bf16", "merged-fp32", "merged-bf16"] {
        for g in ["bar", "rerun", "shared"] {
            assert_eq!(
                status(&report, &format!("arm.{arm}.{g}")),
                Status::Pass,
                "{arm}.{g}"
            );
        }
    }
    assert_eq!(status(&report, "arm.exact-fp32.fp32"), Status::Pass);
    assert_eq!(status(&report, "arm.merged-fp32.fp32"), Status::Pass);
    // the int8 arm runs like every arm (reruns and the shared state bit-equal); its bar is reported, not
    // gated, on random weights
    for g in ["rerun", "shared"] {
        assert_eq!(
            status(&report, &format!("arm.merged-int8.{g}")),
            Status::Pass,
            "{g}"
        );
    }
    assert_eq!(status(&report, "arm.merged-int8.bar"), Status::Info);
    // published digests: reported only, and not applicable to these pins
    assert_eq!(status(&report, "merge.published"), Status::Info);

    // the figures: 62 adapted modules, the set's coverage
    let m = report.merge.as_ref().unwrap();
    assert_eq!((m.adapter_modules, m.adapted_equal), (62, 62));
    assert_eq!(m.copied_equal, 46);
    let set = report.request_set.as_ref().unwrap();
    assert!(set.questions >= 60, "{} questions", set.questions);
    assert_eq!(set.options, (1, 255));
    assert!(
        set.state_tokens.1 >= 1500 && set.state_tokens.0 <= 5,
        "{:?}",
        set.state_tokens
    );
    for t in ["noul", "choice", "score"] {
        assert!(set.types[t].as_u64().unwrap() >= 5, "{t}");
    }
    // the yardsticks are stated per arm
    let y = |name: &str| {
        report
            .arms
            .iter()
            .find(|a| a.name == name)
            .and_then(|a| a.yardstick.clone())
            .unwrap()
    };
    assert_eq!(y("exact-fp32").kind, "fixed");
    assert_eq!(y("exact-bf16").kind, "torch-bf16");
    assert_eq!(y("merged-bf16").kind, "torch-bf16");
    let exact = report.arms.iter().find(|a| a.name == "exact-fp32").unwrap();
    let d = exact.vs_reference.as_ref().unwrap();
    assert!(d.max_abs <= 1e-4 && d.flips == 0, "{d:?}");
    eprintln!("{}", report.to_markdown());

    // the report files
    let out = k.root.join("reports/accept");
    let (json, md) = report.write(&out).unwrap();
    let back: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(back["verdict"], "pass");
    assert!(back["system"]["cpu"].is_string());
    assert!(back["wall_seconds"].as_f64().unwrap() > 0.0);
    let text = std::fs::read_to_string(md).unwrap();
    assert!(text.starts_with("# kev accept: PASS"), "{}", &text[..80]);
    assert!(text.contains("torch-bf16") && text.contains("| PASS | `arm.exact-fp32.fp32`"));
}

#[test]
fn the_fixture_requests_against_the_committed_expected_outputs() {
    // fixtures/expected/valid is the reference script's output shape, one record per file
    let k = kit("release");
    let opts = AcceptOptions {
        requests: Some(fixtures().join("requests/valid")),
        reference: ReferenceSource::Output(fixtures().join("expected/valid")),
        ..options(&k)
    };
    let report = accept(&opts).unwrap();
    eprintln!("{}", report.to_markdown());
    assert_eq!(report.request_set.as_ref().unwrap().requests, 57);
    // Every gate passes but one, measured when this test was written: on these 57 requests the engine's
    // merged-bf16 arm is within torch's bf16 run on max |Δp| (0.840 vs 0.873) and mean (0.044 vs 0.049)
    // but flips one decisive argmax more (7 vs 6 of 81). On the shipped set it passes. The yardstick is
    // not loosened for it; this test only allows that gate to fail on the flip count alone.
    let failed = failed_ids(&report);
    assert!(
        failed.iter().all(|id| id == "arm.merged-bf16.bar"),
        "failed: {failed:?}"
    );
    if let Some(g) = report
        .gate("arm.merged-bf16.bar")
        .filter(|g| g.status == Status::Fail)
    {
        assert!(
            g.problems.len() == 1 && g.problems[0].starts_with("argmax differs"),
            "{:?}",
            g.problems
        );
    }
    for id in [
        "decisions.rows",
        "arm.exact-fp32.fp32",
        "arm.merged-fp32.fp32",
        "arm.exact-bf16.bar",
    ] {
        assert_eq!(status(&report, id), Status::Pass, "{id}");
    }
    // the reference's own responses: a difference of 3e-5 can move a 4th decimal, so most, not all, are
    // equal after rounding
    let exact = report.arms.iter().find(|a| a.name == "exact-fp32").unwrap();
    let (equal, n) = exact.responses_equal.unwrap();
    assert_eq!(n, 57);
    assert!(equal * 4 >= n * 3, "{equal} of {n} responses equal");
}

#[test]
fn a_tampered_export_fails_the_manifest_and_the_merge() {
    let k = kit("release");
    // flip one byte inside an adapted tensor's data in the prepared shard
    let name = "model.language_model.layers.0.mlp.up_proj.weight";
    let index: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(k.model.join("model.safetensors.index.json")).unwrap(),
    )
    .unwrap();
    let shard = k.model.join(index["weight_map"][name].as_str().unwrap());
    let at = {
        let f = SafetensorsFile::open(&shard).unwrap();
        let t = f.tensor(name).unwrap();
        t.start + t.len / 2
    };
    let mut bytes = std::fs::read(&shard).unwrap();
    bytes[at as usize] ^= 0x40;
    std::fs::write(&shard, bytes).unwrap();

    let opts = AcceptOptions {
        arms: vec!["merged-fp32".parse::<ArmId>().unwrap()],
        requests: Some(small_set(&k)),
        ..options(&k)
    };
    let report = accept(&opts).unwrap();
    assert!(!report.passed());
    assert_eq!(status(&report, "inputs.manifest"), Status::Fail);
    assert!(
        gate_text(&report, "inputs.manifest")
            .contains(shard.file_name().unwrap().to_str().unwrap())
    );
    assert_eq!(status(&report, "merge.adapted"), Status::Fail);
    let text = gate_text(&report, "merge.adapted");
    assert!(text.contains(name) && text.contains("1 of"), "{text}");
    // the rest of the export is still exactly the merge
    assert_eq!(status(&report, "merge.copied"), Status::Pass);
    assert_eq!(status(&report, "head.equal"), Status::Pass);
    assert_eq!(status(&report, "inputs.kev-pins"), Status::Pass);
}

#[test]
fn a_wrong_head_fails_the_pins_and_the_head_gate() {
    let k = kit("release");
    // after preparing: the release's head.pt replaced by the wrong-seed one
    std::fs::copy(
        fixtures().join("release-wrong/kev/head.pt"),
        k.root.join("kev/head.pt"),
    )
    .unwrap();
    let opts = AcceptOptions {
        arms: vec!["exact-fp32".parse::<ArmId>().unwrap()],
        requests: Some(small_set(&k)),
        ..options(&k)
    };
    let report = accept(&opts).unwrap();
    assert!(!report.passed());
    assert_eq!(status(&report, "inputs.kev-pins"), Status::Fail);
    assert!(gate_text(&report, "inputs.kev-pins").contains("head.pt: sha256"));
    assert_eq!(status(&report, "head.equal"), Status::Fail);
    let text = gate_text(&report, "head.equal");
    assert!(
        text.contains("q.weight") && text.contains("temperature"),
        "{text}"
    );
    // the exact arm reads head.pt: its decisions move away from the reference
    assert_eq!(status(&report, "arm.exact-fp32.bar"), Status::Fail);
    // the base and the export are untouched
    assert_eq!(status(&report, "inputs.base-pins"), Status::Pass);
    assert_eq!(status(&report, "merge.adapted"), Status::Pass);
}

#[test]
fn the_wrong_seed_model_fails_the_decision_gates() {
    // a self-consistent release (its own pins, its own export) that is not the reference's model
    let k = kit("release-wrong");
    let opts = AcceptOptions {
        arms: vec![
            "exact-fp32".parse::<ArmId>().unwrap(),
            "merged-fp32".parse::<ArmId>().unwrap(),
        ],
        requests: Some(small_set(&k)),
        ..options(&k)
    };
    let report = accept(&opts).unwrap();
    assert!(!report.passed());
    for id in [
        "inputs.kev-pins",
        "inputs.base-pins",
        "merge.adapted",
        "head.equal",
        "decisions.rows",
    ] {
        assert_eq!(status(&report, id), Status::Pass, "{id}");
    }
    for id in [
        "arm.exact-fp32.bar",
        "arm.exact-fp32.fp32",
        "arm.merged-fp32.fp32",
    ] {
        assert_eq!(status(&report, id), Status::Fail, "{id}");
    }
    let text = gate_text(&report, "arm.exact-fp32.fp32");
    assert!(
        text.contains("max |Δp|") && text.contains("> 1.00e-4"),
        "{text}"
    );
    // the bits themselves are still reproducible: that is not what is wrong
    assert_eq!(status(&report, "arm.exact-fp32.rerun"), Status::Pass);

    // against the pristine release's pins, the files are refused by digest first
    let pristine = pins_of(&fixtures().join("release"));
    let report = accept(&AcceptOptions {
        pins: pristine,
        ..opts
    })
    .unwrap();
    assert_eq!(status(&report, "inputs.kev-pins"), Status::Fail);
    assert_eq!(status(&report, "inputs.base-pins"), Status::Fail);
    assert_eq!(status(&report, "inputs.manifest-sources"), Status::Fail);
    assert!(gate_text(&report, "inputs.kev-pins").contains("adapter_model.safetensors"));
}

#[test]
fn a_reference_that_disagrees_on_rows_fails_the_rows_gate_not_the_run() {
    let k = kit("release");
    let mut doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(shipped_reference()).unwrap()).unwrap();
    for r in doc["requests"].as_array_mut().unwrap() {
        match r["name"].as_str().unwrap() {
            // the reference rejected it; kev answers it
            "devanagari" => {
                *r = serde_json::json!({"name": "devanagari", "path": "x", "status": 422, "body": {}})
            }
            // one token of a row differs
            "multi-3" => r["questions"][1]["row_ids"][60] = 7.into(),
            _ => {}
        }
    }
    let path = k.root.join("reference-edited.json");
    std::fs::write(&path, doc.to_string()).unwrap();
    let opts = AcceptOptions {
        reference: ReferenceSource::Output(path),
        arms: vec!["exact-fp32".parse::<ArmId>().unwrap()],
        requests: Some(small_set(&k)),
        ..options(&k)
    };
    let report = accept(&opts).unwrap();
    assert_eq!(status(&report, "decisions.rows"), Status::Fail);
    let text = gate_text(&report, "decisions.rows");
    assert!(
        text.contains("devanagari: the reference rejected it")
            && text.contains("multi-3 / team: row differs from token 60"),
        "{text}"
    );
    // an unanswered request cannot pass the bar; the other requests are still compared
    assert_eq!(status(&report, "arm.exact-fp32.bar"), Status::Fail);
    assert_eq!(status(&report, "arm.exact-fp32.rerun"), Status::Pass);
}

#[test]
fn without_a_reference_the_arms_are_reported_against_exact_fp32() {
    let k = kit("release");
    let opts = AcceptOptions {
        reference: ReferenceSource::None,
        arms: ["exact-fp32", "merged-fp32", "merged-bf16"]
            .iter()
            .map(|a| a.parse::<ArmId>().unwrap())
            .collect(),
        ..options(&k)
    };
    let report = accept(&opts).unwrap();
    assert!(report.passed(), "failed: {:?}", failed_ids(&report));
    assert_eq!(status(&report, "decisions.reference"), Status::NotRun);
    // synthetic gates: the bf16 arms are reported, not gated, without torch's run to measure against
    assert_eq!(status(&report, "arm.merged-bf16.vs-anchor"), Status::Info);
    let merged = report
        .arms
        .iter()
        .find(|a| a.name == "merged-fp32")
        .unwrap();
    assert!(merged.vs_anchor.as_ref().unwrap().max_abs > 0.0);
    assert!(report.summary.contains("not run"), "{}", report.summary);
}

#[test]
fn a_prepared_directory_alone_finds_its_sources_through_the_manifest() {
    let k = kit("release");
    let opts = AcceptOptions {
        base: None,
        kev: None,
        arms: vec![
            "exact-fp32".parse::<ArmId>().unwrap(),
            "merged-bf16".parse::<ArmId>().unwrap(),
        ],
        requests: Some(small_set(&k)),
        ..options(&k)
    };
    let report = accept(&opts).unwrap();
    assert!(report.passed(), "failed: {:?}", failed_ids(&report));
    assert_eq!(
        report.inputs.release_from.as_deref(),
        Some("the manifest's local source directories")
    );
    assert_eq!(status(&report, "merge.adapted"), Status::Pass);
}

#[test]
fn bad_inputs_are_refused_before_anything_runs() {
    let k = kit("release");
    let none = AcceptOptions::default();
    assert!(matches!(accept(&none), Err(AcceptError::Usage(_))));
    // the synthetic yardstick is refused for the real pins: it would loosen the real bar
    let real_pins = AcceptOptions {
        pins: ReleasePins::kev_4b_v1(),
        ..options(&k)
    };
    let err = accept(&real_pins).unwrap_err().to_string();
    assert!(err.contains("--gates synthetic"), "{err}");
    // a reference computed on another request set
    let other_set = AcceptOptions {
        reference: ReferenceSource::Output(fixtures().join("expected/valid")),
        ..options(&k)
    };
    let err = accept(&other_set).unwrap_err().to_string();
    assert!(
        err.contains("no record of") && err.contains("choice-255"),
        "{err}"
    );
    // the exact arms need the release files
    let exact_without_release = AcceptOptions {
        base: None,
        kev: None,
        model: Some(k.model.clone()),
        arms: vec!["exact-fp32".parse().unwrap()],
        ..options(&k)
    };
    std::fs::remove_dir_all(k.root.join("base")).unwrap();
    assert!(matches!(
        accept(&exact_without_release),
        Err(AcceptError::Usage(_))
    ));
}

/// The live path: the embedded reference script run by a Python with torch + transformers + peft
/// (`KEV_REFERENCE_PYTHON`, default `python3`) on the synthetic release.
#[test]
#[ignore = "needs a Python with torch, transformers and peft (KEV_REFERENCE_PYTHON)"]
fn live_reference_on_the_synthetic_release() {
    let python = std::env::var("KEV_REFERENCE_PYTHON").unwrap_or_else(|_| "python3".into());
    let k = kit("release");
    let opts = AcceptOptions {
        reference: ReferenceSource::Python(PathBuf::from(python)),
        ..options(&k)
    };
    let report = accept(&opts).unwrap();
    eprintln!("{}", report.to_markdown());
    assert!(report.passed(), "failed: {:?}", failed_ids(&report));
    let rf = report.reference.as_ref().unwrap();
    assert_eq!(rf.arms, ["reference", "merged_bf16", "torch_bf16"]);
    assert!(rf.versions["torch"].is_string());
}

/// The real Kev-4B: `KEV_REAL_MODEL` (a prepared directory) and/or `KEV_REAL_BASE` + `KEV_REAL_KEV`,
/// optionally `KEV_REFERENCE_PYTHON`; the built-in Kev-4B v1.0 pins and the real bar. The report goes to
/// `KEV_ACCEPT_OUT` (default `target/kev-accept-real`).
#[test]
#[ignore = "needs the real Kev-4B files (KEV_REAL_MODEL or KEV_REAL_BASE + KEV_REAL_KEV)"]
fn real_model() {
    let var = |k: &str| std::env::var_os(k).map(PathBuf::from);
    let opts = AcceptOptions {
        model: var("KEV_REAL_MODEL"),
        base: var("KEV_REAL_BASE"),
        kev: var("KEV_REAL_KEV"),
        reference: match var("KEV_REFERENCE_PYTHON") {
            Some(p) => ReferenceSource::Python(p),
            None => ReferenceSource::None,
        },
        ..AcceptOptions::default()
    };
    let report = accept(&opts).unwrap();
    let out = var("KEV_ACCEPT_OUT").unwrap_or_else(|| PathBuf::from("target/kev-accept-real"));
    let (json, md) = report.write(&out).unwrap();
    eprintln!(
        "{}\nreport: {} {}",
        report.to_markdown(),
        json.display(),
        md.display()
    );
    assert!(report.passed(), "failed: {:?}", failed_ids(&report));
}
