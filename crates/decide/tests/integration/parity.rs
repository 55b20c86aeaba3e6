//! Decisions on the synthetic release against the reference generator's fixtures (issue 6):
//! parity of every arm, shared state vs rows from zero, the prepared-state cache, reruns, invariance to
//! question ids/order/neighbours, and a wrong model that must fail the bar.

use crate::support;

use std::path::PathBuf;
use std::sync::OnceLock;

use kev_decide::{Kev, LoadSpec, Settings, Source, WeightForm, load_cpu};
use kev_engine::{Arm, CpuBackend};
use serde_json::Value;
use support::argmax;

fn root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures"))
}

struct Case {
    name: String,
    body: Vec<u8>,
    expected: Value,
}

fn cases() -> &'static [Case] {
    static CASES: OnceLock<Vec<Case>> = OnceLock::new();
    CASES.get_or_init(|| {
        let dir = root().join("expected/valid");
        let mut names: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        names.sort();
        let out: Vec<Case> = names
            .iter()
            .map(|p| {
                let expected: Value =
                    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
                let body =
                    std::fs::read(root().join(expected["request"].as_str().unwrap())).unwrap();
                Case {
                    name: p.file_stem().unwrap().to_string_lossy().into_owned(),
                    body,
                    expected,
                }
            })
            .collect();
        assert!(
            out.len() >= 40,
            "expected ≥ 40 valid fixtures, found {}",
            out.len()
        );
        out
    })
}

fn load(release: &str, form: WeightForm, arm: Arm, settings: Settings) -> Kev<CpuBackend> {
    let r = root().join(release);
    let spec = LoadSpec {
        source: Source::Release {
            base: r.join("base"),
            kev: r.join("kev"),
        },
        form,
        arm: Some(arm),
        settings,
    };
    load_cpu(&spec)
        .unwrap_or_else(|e| panic!("loading {release}: {e}"))
        .0
}

fn small_cache() -> Settings {
    Settings {
        cache_bytes: Some(64 << 20),
        ..Settings::default()
    }
}

/// Per case, per question, the unrounded probabilities and the response body.
fn run_all(kev: &Kev<CpuBackend>) -> Vec<(Vec<Vec<f32>>, Value)> {
    cases()
        .iter()
        .map(|c| {
            let d = kev
                .decide(&c.body)
                .unwrap_or_else(|r| panic!("{}: refused {:?}", c.name, r.body()))
                .unwrap_or_else(|e| panic!("{}: {e}", c.name));
            let body = d.body();
            (d.probabilities, body)
        })
        .collect()
}

/// max |Δp| and the mean over questions of the per-question mean |Δp|, against one arm of the fixtures.
fn distance(got: &[(Vec<Vec<f32>>, Value)], arm: &str) -> (f64, f64) {
    let mut max = 0f64;
    let mut means = Vec::new();
    for (c, (probs, _)) in cases().iter().zip(got) {
        let qs = c.expected["questions"].as_array().unwrap();
        assert_eq!(qs.len(), probs.len(), "{}", c.name);
        for (q, p) in qs.iter().zip(probs) {
            let want: Vec<f64> = q[arm]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap())
                .collect();
            assert_eq!(want.len(), p.len(), "{} {}", c.name, q["id"]);
            let d: Vec<f64> = want
                .iter()
                .zip(p)
                .map(|(a, b)| (a - *b as f64).abs())
                .collect();
            max = max.max(d.iter().cloned().fold(0.0, f64::max));
            means.push(d.iter().sum::<f64>() / d.len() as f64);
        }
    }
    (max, means.iter().sum::<f64>() / means.len() as f64)
}

/// Rounded answers and usage against the fixture's response for the same arm. Answers must be identical,
/// except that a 4-decimal value may differ by one unit in the last place (its unrounded value sat within
/// the arms' |Δp| of a rounding boundary, where the last digit depends on arithmetic's last bits) — and then
/// `output_tokens` may differ with the digits. Returns (requests identical, requests with last-digit
/// differences).
fn same_rounded_answers(got: &[(Vec<Vec<f32>>, Value)], response_key: &str) -> (usize, usize) {
    fn walk(a: &Value, b: &Value, path: &str, ulps: &mut usize) {
        match (a, b) {
            (Value::Number(x), Value::Number(y)) => {
                let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
                if x != y {
                    assert!((x - y).abs() <= 1e-4 + 1e-12, "{path}: {x} vs {y}");
                    *ulps += 1;
                }
            }
            (Value::Object(x), Value::Object(y)) => {
                assert_eq!(
                    x.keys().collect::<Vec<_>>(),
                    y.keys().collect::<Vec<_>>(),
                    "{path}: keys"
                );
                for (k, v) in x {
                    walk(v, &y[k], &format!("{path}.{k}"), ulps);
                }
            }
            _ => assert_eq!(a, b, "{path}"),
        }
    }
    let (mut identical, mut last_digit) = (0, 0);
    for (c, (_, body)) in cases().iter().zip(got) {
        let want = &c.expected[response_key];
        assert_eq!(body["model"], want["model"], "{}", c.name);
        assert_eq!(
            body["usage"]["input_tokens"], want["usage"]["input_tokens"],
            "{}",
            c.name
        );
        let mut ulps = 0;
        walk(&body["answers"], &want["answers"], &c.name, &mut ulps);
        if ulps == 0 {
            assert_eq!(body["usage"], want["usage"], "{}: usage", c.name);
            identical += 1;
        } else {
            last_digit += 1;
        }
    }
    (identical, last_digit)
}

#[test]
fn exact_fp32_matches_the_reference() {
    let kev = load("release", WeightForm::Exact, Arm::Fp32, small_cache());
    let got = run_all(&kev);
    let (max, mean) = distance(&got, "reference");
    eprintln!("exact+fp32 vs reference: max |Δp| {max:.3e}, mean {mean:.3e}");
    assert!(max <= 1e-4, "max |Δp| {max:.3e} > 1e-4");
    let (same, last_digit) = same_rounded_answers(&got, "response");
    eprintln!(
        "rounded answers: {same}/{} requests identical, {last_digit} with a last-digit difference at a rounding boundary",
        cases().len()
    );
}

#[test]
fn merged_fp32_matches_the_merged_reference_arm() {
    let kev = load("release", WeightForm::Merged, Arm::Fp32, small_cache());
    let got = run_all(&kev);
    let (max, mean) = distance(&got, "merged_bf16");
    let (to_ref, to_ref_mean) = distance(&got, "reference");
    eprintln!(
        "merged+fp32 vs reference's merged arm: max |Δp| {max:.3e}, mean {mean:.3e}; vs the reference: max {to_ref:.3e}, mean {to_ref_mean:.3e}"
    );
    assert!(max <= 1e-4, "max |Δp| {max:.3e} > 1e-4");
    let (same, last_digit) = same_rounded_answers(&got, "response_merged_bf16");
    eprintln!("rounded answers: {same} identical, {last_digit} with a last-digit difference");
}

/// Questions whose reference top-2 margin exceeds 0.02 and whose argmax `probs` changes.
fn flips(probs: &[Vec<Vec<f32>>]) -> (Vec<String>, usize) {
    let mut out = Vec::new();
    let mut checked = 0;
    for (c, per_q) in cases().iter().zip(probs) {
        for (q, p) in c.expected["questions"]
            .as_array()
            .unwrap()
            .iter()
            .zip(per_q)
        {
            let r: Vec<f64> = q["reference"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap())
                .collect();
            if r.len() < 2 {
                continue;
            }
            let mut s = r.clone();
            s.sort_by(|a, b| b.partial_cmp(a).unwrap());
            if s[0] - s[1] <= 0.02 {
                continue;
            }
            checked += 1;
            if argmax(&r) != argmax(&p.iter().map(|v| *v as f64).collect::<Vec<_>>()) {
                out.push(format!("{} {}", c.name, q["id"]));
            }
        }
    }
    (out, checked)
}

/// The bf16 compute arm against the fp32 reference, judged by how far torch's own bf16 run (the merged
/// model cast to bfloat16, as the author serves it) is on the same random model: the random synthetic model
/// amplifies rounding far beyond a trained one, so the fixed 0.02 bar is for real weights (kev accept).
#[test]
fn bf16_is_no_further_from_the_reference_than_torch_bf16() {
    let torch: Vec<Vec<Vec<f32>>> = cases()
        .iter()
        .map(|c| {
            c.expected["questions"]
                .as_array()
                .unwrap()
                .iter()
                .map(|q| {
                    q["torch_bf16"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|v| v.as_f64().unwrap() as f32)
                        .collect()
                })
                .collect()
        })
        .collect();
    let as_pairs = |p: &[Vec<Vec<f32>>]| -> Vec<(Vec<Vec<f32>>, Value)> {
        p.iter().map(|x| (x.clone(), Value::Null)).collect()
    };
    let (tmax, tmean) = distance(&as_pairs(&torch), "reference");
    let (tflips, checked) = flips(&torch);
    eprintln!(
        "torch bf16 vs reference: max |Δp| {tmax:.4}, mean {tmean:.5}, {} argmax flips over {checked} questions with margin > 0.02",
        tflips.len()
    );
    for (form, label) in [
        (WeightForm::Exact, "exact+bf16"),
        (WeightForm::Merged, "merged+bf16"),
    ] {
        let got = run_all(&load("release", form, Arm::Bf16, small_cache()));
        let (max, mean) = distance(&got, "reference");
        let probs: Vec<Vec<Vec<f32>>> = got.iter().map(|x| x.0.clone()).collect();
        let (f, _) = flips(&probs);
        eprintln!(
            "{label} vs reference: max |Δp| {max:.4}, mean {mean:.5}, {} argmax flips: {f:?}",
            f.len()
        );
        assert!(max <= tmax, "{label}: max |Δp| {max} > torch bf16's {tmax}");
        assert!(
            mean <= tmean,
            "{label}: mean |Δp| {mean} > torch bf16's {tmean}"
        );
        if form == WeightForm::Exact {
            // Without the bf16 rounding of merged weights, the arm must flip no more than torch does.
            assert!(
                f.len() <= tflips.len(),
                "{label}: {} flips > torch bf16's {}",
                f.len(),
                tflips.len()
            );
        }
    }
}

#[test]
fn shared_state_and_cache_equal_rows_from_zero_bit_for_bit() {
    let shared = load("release", WeightForm::Exact, Arm::Fp32, small_cache());
    let zero = load(
        "release",
        WeightForm::Exact,
        Arm::Fp32,
        Settings {
            rows_from_zero: true,
            ..Settings::default()
        },
    );
    let a = run_all(&shared); // cache misses
    let b = run_all(&shared); // cache hits
    let z = run_all(&zero);
    let st = shared.stats();
    assert!(st.cache.hits > 0, "{st:?}");
    for ((c, x), (y, w)) in cases().iter().zip(&a).zip(b.iter().zip(&z)) {
        assert_eq!(x.0, y.0, "{}: cache hit differs from miss", c.name);
        assert_eq!(
            x.0, w.0,
            "{}: shared state differs from rows from zero",
            c.name
        );
    }
    // Unaligned snapshots: equal to fp32 rounding only.
    let unaligned = load(
        "release",
        WeightForm::Exact,
        Arm::Fp32,
        Settings {
            chunk_aligned: false,
            ..small_cache()
        },
    );
    let u = run_all(&unaligned);
    let mut worst = 0f64;
    for (x, w) in u.iter().zip(&z) {
        for (p, q) in x.0.iter().zip(&w.0) {
            for (s, t) in p.iter().zip(q) {
                worst = worst.max((*s as f64 - *t as f64).abs());
            }
        }
    }
    eprintln!("unaligned shared state vs rows from zero: max |Δp| {worst:.3e}");
    assert!(
        worst <= 1e-4,
        "unaligned sharing moved a probability by {worst:.3e}"
    );
}

#[test]
fn two_processes_worth_of_runs_are_bit_equal() {
    let a = run_all(&load(
        "release",
        WeightForm::Merged,
        Arm::Bf16,
        small_cache(),
    ));
    let b = run_all(&load(
        "release",
        WeightForm::Merged,
        Arm::Bf16,
        small_cache(),
    ));
    for ((c, x), y) in cases().iter().zip(&a).zip(&b) {
        assert_eq!(x.0, y.0, "{}", c.name);
        assert_eq!(x.1, y.1, "{}", c.name);
    }
}

#[test]
fn answers_do_not_depend_on_ids_order_or_neighbours() {
    let kev = load("release", WeightForm::Merged, Arm::Bf16, small_cache());
    let probs = |body: &Value| -> Vec<Vec<f32>> {
        kev.decide(body.to_string().as_bytes())
            .unwrap()
            .unwrap()
            .probabilities
    };
    let mut checked = 0;
    for c in cases() {
        let req: Value = match serde_json::from_slice(&c.body) {
            Ok(v) => v,
            Err(_) => continue,
        };
        let Some(qs) = req["questions"].as_object() else {
            continue;
        };
        if qs.len() < 2 {
            continue;
        }
        let base = probs(&req);
        // Renamed ids.
        let mut renamed = req.clone();
        renamed["questions"] = Value::Object(
            qs.iter()
                .enumerate()
                .map(|(i, (_, q))| (format!("renamed-{i} 🙂"), q.clone()))
                .collect(),
        );
        assert_eq!(probs(&renamed), base, "{}: renamed ids", c.name);
        // Reversed order.
        let mut reversed = req.clone();
        reversed["questions"] = Value::Object(
            qs.iter()
                .rev()
                .map(|(k, q)| (k.clone(), q.clone()))
                .collect(),
        );
        let mut rev = probs(&reversed);
        rev.reverse();
        assert_eq!(rev, base, "{}: reversed order", c.name);
        // Unrelated questions added.
        let mut more = req.clone();
        let extra: serde_json::Map<String, Value> = serde_json::from_str(
            r#"{"zz-extra-1":{"type":"noul","instructions":"Is it raining?"},"zz-extra-2":{"type":"score","instructions":"How long is it?","criteria":["short","long"]}}"#,
        )
        .unwrap();
        let mut m = qs.clone();
        m.extend(extra);
        more["questions"] = Value::Object(m);
        let with = probs(&more);
        assert_eq!(
            &with[..base.len()],
            &base[..],
            "{}: neighbours changed an answer",
            c.name
        );
        checked += 1;
    }
    assert!(checked >= 5, "only {checked} multi-question fixtures");
}

#[test]
fn the_wrong_model_fails_the_bar() {
    let kev = load("release-wrong", WeightForm::Exact, Arm::Fp32, small_cache());
    let got = run_all(&kev);
    let (max, _) = distance(&got, "reference");
    eprintln!("wrong model vs reference: max |Δp| {max:.3}");
    assert!(
        max > 1e-2,
        "a different model came within {max} of the reference: the parity test could not fail"
    );
}
