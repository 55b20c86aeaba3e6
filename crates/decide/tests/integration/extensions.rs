//! Request extensions: `x_logits: true` adds each option's pointer logit before the temperature and changes no
//! other byte of the answer; the probabilities are exactly the softmax of those logits over the temperature.

use std::path::PathBuf;
use std::sync::OnceLock;

use kev_decide::{Kev, LOGITS_FIELD, LoadSpec, Settings, Source, WeightForm, load_cpu};
use kev_engine::{Arm, CpuBackend};
use serde_json::{Value, json};

fn root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures"))
}

fn kev() -> &'static Kev<CpuBackend> {
    static KEV: OnceLock<Kev<CpuBackend>> = OnceLock::new();
    KEV.get_or_init(|| {
        let r = root().join("release");
        let spec = LoadSpec {
            source: Source::Release {
                base: r.join("base"),
                kev: r.join("kev"),
            },
            form: WeightForm::Merged,
            arm: Some(Arm::Fp32),
            settings: Settings::default(),
        };
        load_cpu(&spec).expect("loading the synthetic release").0
    })
}

fn valid_bodies() -> Vec<(String, Value)> {
    let dir = root().join("requests/valid");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    paths.sort();
    paths
        .into_iter()
        .filter_map(|p| {
            let v: Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).ok()?;
            // Only object bodies can carry an extension field.
            v.is_object()
                .then(|| (p.file_stem().unwrap().to_string_lossy().into_owned(), v))
        })
        .collect()
}

/// The softmax the head computes, in the same order of operations.
fn softmax_over_t(z: &[f64], t: f64) -> Vec<f32> {
    let z: Vec<f64> = z.iter().map(|v| v / t).collect();
    let max = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = z.iter().map(|v| (v - max).exp()).collect();
    let sum: f64 = e.iter().sum();
    e.iter().map(|v| (v / sum) as f32).collect()
}

#[test]
fn logits_on_request_add_x_logits_and_change_no_other_byte() {
    let kev = kev();
    let t = kev.head().temperature();
    let bodies = valid_bodies();
    assert!(bodies.len() >= 30, "expected the valid request fixtures");
    for (name, body) in bodies {
        let plain = kev
            .decide(&serde_json::to_vec(&body).unwrap())
            .unwrap_or_else(|r| panic!("{name}: refused: {}", r.body()))
            .unwrap();
        assert!(plain.response.extension(LOGITS_FIELD).is_none(), "{name}");

        let mut asked = body.clone();
        asked[LOGITS_FIELD] = json!(true);
        let with = kev
            .decide(&serde_json::to_vec(&asked).unwrap())
            .unwrap()
            .unwrap();
        assert_eq!(with.probabilities, plain.probabilities, "{name}");

        // Everything but the extension is byte-identical to the plain answer.
        let mut v = with.body();
        let logits = v.as_object_mut().unwrap().remove(LOGITS_FIELD).unwrap();
        assert_eq!(
            serde_json::to_string(&v).unwrap(),
            serde_json::to_string(&plain.body()).unwrap(),
            "{name}"
        );

        // Keyed like the answers' probabilities, in request order, and exactly the head's softmax input.
        let logits = logits.as_object().unwrap();
        let answers = plain.body()["answers"].as_object().unwrap().clone();
        assert_eq!(
            logits.keys().collect::<Vec<_>>(),
            answers.keys().collect::<Vec<_>>(),
            "{name}"
        );
        for (k, (qid, by_key)) in logits.iter().enumerate() {
            let z: Vec<f64> = by_key
                .as_object()
                .unwrap()
                .values()
                .map(|x| x.as_f64().unwrap())
                .collect();
            assert_eq!(z, with.logits[k], "{name} {qid}");
            assert_eq!(
                softmax_over_t(&z, t),
                plain.probabilities[k],
                "{name} {qid}: softmax(z / T) is not the answer's probabilities"
            );
            if let Some(p) = answers[qid].get("probabilities") {
                assert_eq!(
                    by_key.as_object().unwrap().keys().collect::<Vec<_>>(),
                    p.as_object().unwrap().keys().collect::<Vec<_>>(),
                    "{name} {qid}"
                );
            } else {
                let keys: Vec<&String> = by_key.as_object().unwrap().keys().collect();
                assert_eq!(keys, ["false", "true"], "{name} {qid}: a noul's logits");
            }
        }

        // `false` is the same as absent.
        asked[LOGITS_FIELD] = json!(false);
        let off = kev
            .decide(&serde_json::to_vec(&asked).unwrap())
            .unwrap()
            .unwrap();
        assert_eq!(
            serde_json::to_string(&off.body()).unwrap(),
            serde_json::to_string(&plain.body()).unwrap(),
            "{name}"
        );
    }
}

#[test]
fn a_logits_flag_that_is_not_a_boolean_is_a_422_naming_it() {
    let body =
        json!({"state": "s", "questions": {"q": {"type": "noul", "instructions": "Is it?"}}});
    for bad in [json!("yes"), json!(1), json!(null), json!({})] {
        let mut b = body.clone();
        b[LOGITS_FIELD] = bad.clone();
        let refusal = match kev().decide(&serde_json::to_vec(&b).unwrap()) {
            Err(r) => r,
            Ok(_) => panic!("x_logits {bad} was accepted"),
        };
        assert_eq!(refusal.status(), 422, "{bad}");
        let detail = &refusal.body()["detail"][0];
        assert_eq!(detail["type"], "bool_type", "{bad}");
        assert_eq!(detail["loc"], json!(["body", "x_logits"]), "{bad}");
        assert_eq!(detail["input"], bad);
    }
}
