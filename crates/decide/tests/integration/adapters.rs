//! Several Kev adapters over one resident base (`fixtures/mini/adapters/`, written by
//! `tools/reference/train_adapters.py`: two domain fine-tunes of kev-mini with their reference-arm answers).
//!
//! Each adapter's answers equal the author's fp32 arm (1e-4) and, bit for bit, a single-adapter service of
//! that adapter in the `exact` form — alone, interleaved with the others in one pass, and after the others
//! ran the very same states (the prefix cache and the pass's twin pieces are keyed by adapter). A `model`
//! selects the adapter; bad adapter directories are refused at load, naming the problem.

use crate::support;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use kev_decide::{AdapterDir, Kev, LoadSpec, Settings, Source, WeightForm, load_cpu_adapters};
use kev_engine::{Arm, CpuBackend};
use serde_json::Value;
use support::mini;

/// The served adapters: kev-mini's own (the default) and the two fine-tunes.
const NAMES: [&str; 3] = ["kev", "support", "ops"];

pub(crate) fn dir_of(name: &str) -> PathBuf {
    match name {
        "kev" => mini().join("kev"),
        other => mini().join("adapters").join(other),
    }
}

pub(crate) fn spec(kev: &Path, arm: Arm, settings: Settings) -> LoadSpec {
    LoadSpec {
        source: Source::Release {
            base: mini().join("base"),
            kev: kev.to_path_buf(),
        },
        form: WeightForm::Exact,
        arm: Some(arm),
        settings,
    }
}

pub(crate) fn settings() -> Settings {
    Settings {
        cache_bytes: Some(64 << 20),
        strict_models: true,
        ..Settings::default()
    }
}

fn more() -> Vec<AdapterDir> {
    NAMES[1..]
        .iter()
        .map(|n| AdapterDir {
            name: n.to_string(),
            dir: dir_of(n),
        })
        .collect()
}

/// Base + all three adapters, `kev` the default.
pub(crate) fn multi(arm: Arm) -> Kev<CpuBackend> {
    load_cpu_adapters(&spec(&dir_of("kev"), arm, settings()), &more())
        .unwrap_or_else(|e| panic!("loading the adapters: {e}"))
        .0
        .with_default_names("kev", &["kev-latest".into(), "jev-latest".into()])
}

/// One adapter alone, as `kev serve --base --kev DIR --weights exact` loads it.
fn solo(name: &str, arm: Arm) -> Kev<CpuBackend> {
    load_cpu_adapters(&spec(&dir_of(name), arm, Settings::default()), &[])
        .unwrap_or_else(|e| panic!("loading {name}: {e}"))
        .0
}

pub(crate) struct Case {
    pub(crate) id: String,
    pub(crate) body: String,
    /// Per question, the reference arm's probabilities under each adapter (NAMES order).
    reference: Vec<Vec<Vec<f64>>>,
}

fn probs(rec: &Value) -> Vec<Vec<f64>> {
    rec["questions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| {
            q["reference"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect()
        })
        .collect()
}

pub(crate) fn cases() -> &'static [Case] {
    static CASES: OnceLock<Vec<Case>> = OnceLock::new();
    CASES.get_or_init(|| {
        let read = |p: PathBuf| -> Vec<Value> {
            std::fs::read_to_string(&p)
                .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect()
        };
        let kev_recs = read(mini().join("expected/test.jsonl"));
        let per: Vec<Vec<Value>> = NAMES[1..]
            .iter()
            .map(|n| read(dir_of(n).join("expected.jsonl")))
            .collect();
        let out: Vec<Case> = (0..per[0].len())
            .map(|i| {
                let id = per[0][i]["id"].as_str().unwrap().to_string();
                let own = kev_recs
                    .iter()
                    .find(|r| r["id"] == id.as_str())
                    .unwrap_or_else(|| panic!("{id} is not in kev-mini's expected answers"));
                assert_eq!(per[1][i]["id"], id.as_str());
                Case {
                    body: per[0][i]["body"].as_str().unwrap().to_string(),
                    reference: vec![probs(own), probs(&per[0][i]), probs(&per[1][i])],
                    id,
                }
            })
            .collect();
        assert!(out.len() >= 30, "{} adapter cases", out.len());
        out
    })
}

/// The body with `"model": name` first (the rest byte-identical).
pub(crate) fn with_model(body: &str, name: &str) -> Vec<u8> {
    format!("{{\"model\":{},{}", serde_json::json!(name), &body[1..]).into_bytes()
}

pub(crate) fn answer(kev: &Kev<CpuBackend>, body: &[u8], what: &str) -> Vec<Vec<f32>> {
    kev.decide(body)
        .unwrap_or_else(|r| panic!("{what}: refused {}", r.body()))
        .unwrap_or_else(|e| panic!("{what}: {e}"))
        .probabilities
}

pub(crate) fn bits(p: &[Vec<f32>]) -> Vec<Vec<u32>> {
    p.iter()
        .map(|q| q.iter().map(|x| x.to_bits()).collect())
        .collect()
}

#[test]
fn every_adapter_answers_as_the_reference_arm_and_bit_equal_to_its_own_server() {
    let m = multi(Arm::Fp32);
    assert_eq!(m.adapters().len(), 3);
    for (a, name) in NAMES.iter().enumerate() {
        let s = solo(name, Arm::Fp32);
        let mut worst = 0f64;
        for c in cases() {
            let got = answer(&m, &with_model(&c.body, name), &c.id);
            let alone = answer(&s, c.body.as_bytes(), &c.id);
            assert_eq!(
                bits(&got),
                bits(&alone),
                "{name} {}: the multi-adapter answer differs from its single-adapter server",
                c.id
            );
            for (g, r) in got.iter().zip(&c.reference[a]) {
                for (x, y) in g.iter().zip(r) {
                    worst = worst.max((*x as f64 - y).abs());
                }
            }
        }
        eprintln!("{name}: max |dp| vs the reference arm {worst:.2e}");
        assert!(worst <= 1e-4, "{name}: {worst} from the reference arm");
    }
    // The adapters really differ, so a mix-up could not pass the checks above.
    let c = &cases()[0];
    let answers: Vec<_> = NAMES
        .iter()
        .map(|n| bits(&answer(&m, &with_model(&c.body, n), n)))
        .collect();
    assert_ne!(answers[0], answers[1]);
    assert_ne!(answers[1], answers[2]);
}

#[test]
fn interleaved_adapters_in_one_pass_equal_their_solo_runs() {
    for arm in [Arm::Fp32, Arm::Int8] {
        let m = multi(arm);
        let solos: Vec<_> = NAMES.iter().map(|n| solo(n, arm)).collect();
        // Every case under every adapter, interleaved: the same states under three adapters share passes.
        let mut jobs = Vec::new();
        let mut want = Vec::new();
        for c in cases() {
            for (a, name) in NAMES.iter().enumerate() {
                jobs.push(m.admit(&with_model(&c.body, name)).unwrap());
                want.push(bits(&answer(&solos[a], c.body.as_bytes(), &c.id)));
            }
        }
        let refs: Vec<_> = jobs.iter().collect();
        let got = m.run(&refs);
        for (i, (g, w)) in got.into_iter().zip(&want).enumerate() {
            let g = g.unwrap_or_else(|e| panic!("job {i}: {e}"));
            assert_eq!(
                &bits(&g.probabilities),
                w,
                "{} job {i} ({}): differs from its solo run",
                arm.name(),
                NAMES[i % 3]
            );
        }
        let stats = m.stats();
        assert!(stats.passes > 0);
    }
}

#[test]
fn a_cached_state_never_answers_another_adapter() {
    let m = multi(Arm::Fp32);
    let ops = solo("ops", Arm::Fp32);
    // A state long enough to be cached (its prefix spans a 64-token chunk).
    let c = cases()
        .iter()
        .find(|c| {
            let job = m.admit(c.body.as_bytes()).unwrap();
            job.compiled().state_ids().len() > 64
        })
        .expect("a case with a state over 64 tokens");
    let support_first = answer(&m, &with_model(&c.body, "support"), "support");
    let misses = m.stats().cache.misses;
    let ops_after = answer(&m, &with_model(&c.body, "ops"), "ops");
    assert_eq!(
        m.stats().cache.misses,
        misses + 1,
        "ops must not find support's snapshot"
    );
    assert_eq!(
        bits(&ops_after),
        bits(&answer(&ops, c.body.as_bytes(), "ops alone"))
    );
    assert_ne!(bits(&support_first), bits(&ops_after));
    let hits = m.stats().cache.hits;
    let again = answer(&m, &with_model(&c.body, "ops"), "ops again");
    assert_eq!(m.stats().cache.hits, hits + 1, "ops finds its own snapshot");
    assert_eq!(bits(&again), bits(&ops_after));
}

#[test]
fn the_model_field_selects_the_adapter_and_strict_names_refuse_others() {
    let m = multi(Arm::Fp32);
    let body = &cases()[0].body;
    let default = answer(&m, &with_model(body, "kev"), "kev");
    for alias in ["kev-latest", "jev-latest"] {
        assert_eq!(
            bits(&answer(&m, &with_model(body, alias), alias)),
            bits(&default)
        );
    }
    assert_eq!(
        bits(&answer(&m, body.as_bytes(), "no model")),
        bits(&default)
    );
    let r = m
        .admit(&with_model(body, "kev-nonexistent"))
        .err()
        .expect("an unknown model is refused under strict names");
    assert_eq!(r.status(), 400);
    assert_eq!(r.body()["detail"]["error_type"], "api_usage_error");
    assert_eq!(
        r.body()["detail"]["message"],
        "Unknown model: kev-nonexistent"
    );
    // Without strict names, the default adapter answers and the name is echoed (Kev 1.0).
    let lax = load_cpu_adapters(
        &spec(
            &dir_of("kev"),
            Arm::Fp32,
            Settings {
                strict_models: false,
                ..settings()
            },
        ),
        &more(),
    )
    .unwrap()
    .0;
    let d = lax
        .decide(&with_model(body, "kev-nonexistent"))
        .unwrap()
        .unwrap();
    assert_eq!(bits(&d.probabilities), bits(&default));
    assert_eq!(d.body()["model"], "kev-nonexistent");
    // Each adapter has its own card; the default is marked.
    let cards: Vec<Value> = (0..3).map(|i| m.adapter_card(i)).collect();
    assert_eq!(cards[0]["x_default"], true);
    assert_eq!(cards[2]["x_adapter"], "ops");
    assert!(cards[1]["x_adapter_bytes"].as_u64().unwrap() > 0);
    assert_eq!(cards[1]["x_adapter_sha256"].as_str().unwrap().len(), 64);
    assert_ne!(cards[1]["x_adapter_sha256"], cards[2]["x_adapter_sha256"]);
    assert_eq!(cards[1]["x_weight_bytes"], cards[0]["x_weight_bytes"]);
    assert_ne!(cards[1]["x_temperature"], cards[2]["x_temperature"]);
}

#[test]
fn bad_adapter_directories_are_refused_at_load_naming_the_problem() {
    let load = |extra: Vec<AdapterDir>| {
        load_cpu_adapters(&spec(&dir_of("kev"), Arm::Fp32, settings()), &extra)
            .err()
            .map(|e| e.to_string())
            .expect("refused")
    };
    // The synthetic release's adapter: made for another base (other widths).
    let e = load(vec![AdapterDir {
        name: "other".into(),
        dir: mini().join("../release/kev"),
    }]);
    assert!(
        e.contains("adapter other") && e.contains("layers."),
        "names the adapter and the tensor: {e}"
    );
    // An adapter without its head.
    let tmp = std::env::temp_dir().join(format!("kev-adapter-nohead-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    for f in ["adapter_config.json", "adapter_model.safetensors"] {
        std::fs::copy(dir_of("ops").join(f), tmp.join(f)).unwrap();
    }
    let e = load(vec![AdapterDir {
        name: "headless".into(),
        dir: tmp.clone(),
    }]);
    assert!(e.contains("adapter headless") && e.contains("head"), "{e}");
    std::fs::remove_dir_all(&tmp).ok();
    // Two adapters of one name.
    let e = load(vec![
        AdapterDir {
            name: "ops".into(),
            dir: dir_of("ops"),
        },
        AdapterDir {
            name: "ops".into(),
            dir: dir_of("support"),
        },
    ]);
    assert!(e.contains("two adapters have this name"), "{e}");
    // A prepared (merged) model cannot host more adapters.
    let e = load_cpu_adapters(
        &LoadSpec {
            source: Source::Prepared(mini().join("base")),
            ..spec(&dir_of("kev"), Arm::Fp32, settings())
        },
        &more(),
    )
    .err()
    .map(|e| e.to_string())
    .unwrap();
    assert!(e.contains("release files"), "{e}");
}
