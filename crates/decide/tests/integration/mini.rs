//! kev-mini (`fixtures/mini`, written by `tools/reference/train_mini.py`): a *trained* miniature Kev in the
//! real release formats, so the bars are the real ones and can fail — unlike on the random synthetic
//! release, where rounding is amplified chaotically and bf16 can only be compared with torch's own bf16.
//!
//! On every test-split question (splits by template: the test states' frames never occur in training):
//! exact fp32 within 1e-4 of the author's fp32 arm; bf16 compute and the merged-bf16 weights within the
//! real bar (max |Δp| ≤ 0.02, mean of per-question mean |Δp| ≤ 0.002, the argmax kept wherever the
//! reference margin exceeds 0.02); accuracy equal to the reference arm's and far above chance; and the
//! README's own example answered sensibly, read from the README itself.

use crate::support;

use std::sync::OnceLock;

use kev_decide::{Kev, WeightForm, load_cpu, load_cpu_int8};
use kev_engine::{Arm, CpuBackend, Int8Plan};
use serde_json::Value;
use support::{argmax, dev_bodies, mini, spec};

/// One expected record of `expected/test.jsonl` (fixtures/README.md).
struct Case {
    id: String,
    body: Vec<u8>,
    expected: Value,
}

fn cases() -> &'static [Case] {
    static CASES: OnceLock<Vec<Case>> = OnceLock::new();
    CASES.get_or_init(|| {
        let text = std::fs::read_to_string(mini().join("expected/test.jsonl")).unwrap();
        let out: Vec<Case> = text
            .lines()
            .map(|l| {
                let v: Value = serde_json::from_str(l).unwrap();
                Case {
                    id: v["id"].as_str().unwrap().to_string(),
                    body: v["body"].as_str().unwrap().as_bytes().to_vec(),
                    expected: v,
                }
            })
            .collect();
        assert!(
            out.len() >= 100,
            "expected ≥ 100 test requests, found {}",
            out.len()
        );
        out
    })
}

fn load(form: WeightForm, arm: Option<Arm>) -> Kev<CpuBackend> {
    load_cpu(&spec(form, arm))
        .unwrap_or_else(|e| panic!("loading kev-mini: {e}"))
        .0
}

fn run_all(kev: &Kev<CpuBackend>) -> Vec<Vec<Vec<f64>>> {
    cases()
        .iter()
        .map(|c| {
            let d = kev
                .decide(&c.body)
                .unwrap_or_else(|r| panic!("{}: refused {:?}", c.id, r.body()))
                .unwrap_or_else(|e| panic!("{}: {e}", c.id));
            d.probabilities
                .iter()
                .map(|p| p.iter().map(|x| *x as f64).collect())
                .collect()
        })
        .collect()
}

fn arm_of(c: &Case, arm: &str) -> Vec<Vec<f64>> {
    c.expected["questions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| {
            q[arm]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap())
                .collect()
        })
        .collect()
}

/// Distances of `got` from the reference arm over every test question.
#[derive(Debug)]
struct Gap {
    max: f64,
    mean: f64,
    flips: Vec<String>,
    checked: usize,
}

fn gap(got: &[Vec<Vec<f64>>]) -> Gap {
    let (mut max, mut means, mut flips, mut checked) = (0f64, Vec::new(), Vec::new(), 0);
    for (c, per_q) in cases().iter().zip(got) {
        let want = arm_of(c, "reference");
        assert_eq!(want.len(), per_q.len(), "{}", c.id);
        for (k, (r, p)) in want.iter().zip(per_q).enumerate() {
            assert_eq!(r.len(), p.len(), "{} question {k}", c.id);
            let d: Vec<f64> = r.iter().zip(p).map(|(a, b)| (a - b).abs()).collect();
            max = max.max(d.iter().cloned().fold(0.0, f64::max));
            means.push(d.iter().sum::<f64>() / d.len() as f64);
            let mut s = r.clone();
            s.sort_by(|a, b| b.partial_cmp(a).unwrap());
            if s.len() > 1 && s[0] - s[1] > 0.02 {
                checked += 1;
                if argmax(r) != argmax(p) {
                    flips.push(format!("{} question {k}", c.id));
                }
            }
        }
    }
    Gap {
        max,
        mean: means.iter().sum::<f64>() / means.len() as f64,
        flips,
        checked,
    }
}

/// (accuracy against the labels, chance, questions).
fn accuracy(got: &[Vec<Vec<f64>>]) -> (f64, f64, usize) {
    let (mut hits, mut chance, mut n) = (0usize, 0f64, 0usize);
    for (c, per_q) in cases().iter().zip(got) {
        for (q, p) in c.expected["questions"]
            .as_array()
            .unwrap()
            .iter()
            .zip(per_q)
        {
            let keys = q["keys"].as_array().unwrap();
            hits += usize::from(keys[argmax(p)] == q["label"]);
            chance += 1.0 / p.len() as f64;
            n += 1;
        }
    }
    (hits as f64 / n as f64, chance / n as f64, n)
}

fn fixture_arm(arm: &str) -> Vec<Vec<Vec<f64>>> {
    cases().iter().map(|c| arm_of(c, arm)).collect()
}

#[test]
fn bf16_compute_and_merged_bf16_meet_the_real_bar() {
    let torch = gap(&fixture_arm("torch_bf16"));
    eprintln!(
        "kev-mini torch bf16 vs reference (fixture, for comparison): max |Δp| {:.4}, mean {:.5}, {} flips over {} questions with margin > 0.02",
        torch.max,
        torch.mean,
        torch.flips.len(),
        torch.checked
    );
    let merged_ref = gap(&fixture_arm("merged_bf16"));
    eprintln!(
        "kev-mini reference merged-bf16 arm vs reference (fixture): max |Δp| {:.4}, mean {:.5}",
        merged_ref.max, merged_ref.mean
    );
    for (form, arm, label) in [
        (WeightForm::Exact, Arm::Bf16, "exact weights + bf16 compute"),
        (
            WeightForm::Merged,
            Arm::Bf16,
            "merged bf16 weights + bf16 compute",
        ),
    ] {
        let g = gap(&run_all(&load(form, Some(arm))));
        eprintln!(
            "kev-mini {label} vs reference: max |Δp| {:.4}, mean {:.5}, {} flips over {} questions with margin > 0.02",
            g.max,
            g.mean,
            g.flips.len(),
            g.checked
        );
        assert!(g.max <= 0.02, "{label}: max |Δp| {:.4} > 0.02", g.max);
        assert!(g.mean <= 0.002, "{label}: mean |Δp| {:.5} > 0.002", g.mean);
        assert!(
            g.flips.is_empty(),
            "{label}: argmax changed where the reference margin > 0.02: {:?}",
            g.flips
        );
    }
}

/// The int8 arm as `--precision int8` loads the merged weights: the rule fixed on the dev split before the
/// test split was run (engine README, "int8 arm"; `tests/int8_dev.rs`): W7A8 (7-bit weights since issue
/// 29, chosen on the dev split too) with layer 0's GDN `in_proj` and `out_proj` in BF16, float copies of
/// the others dropped, measured on every test question against the fp32 reference arm. The rule with
/// 8-bit weights, plain W8A8 (no islands) and the SmoothQuant variant (α 0.5 on the norm-reading
/// projections, calibrated on the dev split) are printed beside it; the rule did not choose them.
fn int8_gap() -> Gap {
    let kev = load(WeightForm::Merged, Some(Arm::Int8));
    assert!(
        kev.backend().model().int8_only(),
        "the float copies of the projections must be dropped"
    );
    let g = gap(&run_all(&kev));
    drop(kev);
    let mut rows = vec![("merged + int8 (the rule: W7A8, layer 0 GDN in/out bf16)", g)];
    // The variants the rule did not choose are printed for comparison, never asserted: two more runs of
    // the split, so only on request.
    if std::env::var_os("KEV_TEST_INT8_VARIANTS").is_some() {
        let (smooth, info, _) = load_cpu_int8(
            &spec(WeightForm::Merged, Some(Arm::Int8)),
            &dev_bodies(),
            Int8Plan::smoothed(),
        )
        .unwrap_or_else(|e| panic!("loading kev-mini for smoothed int8: {e}"));
        assert_eq!(info.arm, Arm::Int8);
        let sg = gap(&run_all(&smooth));
        drop(smooth);
        let (plain, _, _) = load_cpu_int8(
            &spec(WeightForm::Merged, Some(Arm::Int8)),
            &[],
            Int8Plan::plain(),
        )
        .unwrap_or_else(|e| panic!("loading kev-mini for plain int8: {e}"));
        let pg = gap(&run_all(&plain));
        drop(plain);
        let (wide, _, _) = load_cpu_int8(
            &spec(WeightForm::Merged, Some(Arm::Int8)),
            &[],
            Int8Plan {
                narrow_weights: false,
                ..Int8Plan::default()
            },
        )
        .unwrap_or_else(|e| panic!("loading kev-mini for 8-bit int8: {e}"));
        let wg = gap(&run_all(&wide));
        rows.push((
            "merged + int8 (the rule's islands, 8-bit weights; the rule before issue 29)",
            wg,
        ));
        rows.push(("merged + int8 (plain W8A8, no islands; not the rule)", pg));
        rows.push((
            "merged + int8 (SmoothQuant α 0.5 on norm inputs, dev calibration; not the rule)",
            sg,
        ));
    } else {
        eprintln!(
            "(plain W8A8 and SmoothQuant not run: set KEV_TEST_INT8_VARIANTS=1 to print them beside the rule)"
        );
    }
    for (label, g) in &rows {
        eprintln!(
            "kev-mini {label} vs reference: max |Δp| {:.4}, mean {:.5}, {} flips over {} questions with margin > 0.02",
            g.max,
            g.mean,
            g.flips.len(),
            g.checked
        );
    }
    rows.swap_remove(0).1
}

/// The whole int8 bar from one run of the rule (max |Δp| ≤ 0.02 on every test question, mean ≤ 0.002, no
/// argmax flip where the reference margin exceeds 0.02; issue 20): measured 0.0065 on the 600-request test
/// split when the rule was committed (plain W8A8 0.0197 there), 0.0095 on the 2,400-request split (plain
/// W8A8 0.0259).
#[test]
fn int8_keeps_the_max_the_mean_and_the_argmax() {
    let g = int8_gap();
    assert!(g.max <= 0.02, "int8: max |Δp| {:.4} > 0.02", g.max);
    assert!(g.mean <= 0.002, "int8: mean |Δp| {:.5} > 0.002", g.mean);
    assert!(
        g.flips.is_empty(),
        "int8: argmax changed where the reference margin > 0.02: {:?}",
        g.flips
    );
}

/// Merged bf16 weights with fp32 compute: the reference's own merged arm within 1e-4, and the real bar
/// (max 0.02, mean 0.002, no flip) against the reference, from one run.
#[test]
fn merged_fp32_matches_the_reference_merged_arm() {
    let got = run_all(&load(WeightForm::Merged, Some(Arm::Fp32)));
    let g = gap(&got);
    eprintln!(
        "kev-mini merged bf16 weights + fp32 compute vs reference: max |Δp| {:.4}, mean {:.5}, {} flips over {} questions with margin > 0.02",
        g.max,
        g.mean,
        g.flips.len(),
        g.checked
    );
    assert!(g.max <= 0.02, "merged+fp32: max |Δp| {:.4} > 0.02", g.max);
    assert!(
        g.mean <= 0.002,
        "merged+fp32: mean |Δp| {:.5} > 0.002",
        g.mean
    );
    assert!(
        g.flips.is_empty(),
        "merged+fp32: argmax flips: {:?}",
        g.flips
    );
    let mut max = 0f64;
    for (c, per_q) in cases().iter().zip(&got) {
        for (r, p) in arm_of(c, "merged_bf16").iter().zip(per_q) {
            for (a, b) in r.iter().zip(p) {
                max = max.max((a - b).abs());
            }
        }
    }
    eprintln!("kev-mini merged+fp32 vs the reference's merged-bf16 arm: max |Δp| {max:.3e}");
    assert!(max <= 1e-4, "max |Δp| {max:.3e} > 1e-4");
}

/// One run of the exact fp32 arm over the test split holds both of its bars: every probability within 1e-4 of the
/// reference (no flip), and the same accuracy (each test is its own process under nextest, so the run is
/// not shared between tests).
#[test]
fn exact_fp32_matches_the_reference_and_its_accuracy_on_every_test_question() {
    let (ref_acc, chance, n) = accuracy(&fixture_arm("reference"));
    let got = run_all(&load(WeightForm::Exact, Some(Arm::Fp32)));
    let g = gap(&got);
    eprintln!(
        "kev-mini exact+fp32 vs reference: max |Δp| {:.3e}, mean {:.3e}",
        g.max, g.mean
    );
    assert!(g.max <= 1e-4, "max |Δp| {:.3e} > 1e-4", g.max);
    assert!(g.flips.is_empty(), "argmax flips: {:?}", g.flips);
    let (acc, _, _) = accuracy(&got);
    let served = run_all(&load(WeightForm::Merged, None));
    let (served_acc, _, _) = accuracy(&served);
    eprintln!(
        "kev-mini test split, {n} questions: reference {ref_acc:.3}, kev exact+fp32 {acc:.3}, kev as served {served_acc:.3}, chance {chance:.3}"
    );
    for (c, (p, k)) in cases().iter().zip(got.iter().zip(&served)) {
        for (i, (r, (x, y))) in arm_of(c, "reference")
            .iter()
            .zip(p.iter().zip(k))
            .enumerate()
        {
            assert_eq!(argmax(r), argmax(x), "{} question {i}: exact+fp32", c.id);
            let mut s = r.clone();
            s.sort_by(|a, b| b.partial_cmp(a).unwrap());
            if s.len() < 2 || s[0] - s[1] > 0.02 {
                assert_eq!(argmax(r), argmax(y), "{} question {i}: as served", c.id);
            }
        }
    }
    assert_eq!(acc, ref_acc);
    assert!(
        ref_acc >= 2.0 * chance,
        "test accuracy {ref_acc:.3} is not far above chance {chance:.3}"
    );
}

/// The request body of the README's curl example (`-d '…'`), so the test follows the README.
fn readme_body() -> String {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    let start = readme
        .find("/v1/systemone -H 'content-type: application/json' -d '")
        .expect("README curl example");
    let rest = &readme[start..];
    let open = rest.find("-d '").unwrap() + 4;
    let close = rest[open..].find("'\n").expect("end of the curl body") + open;
    rest[open..close].to_string()
}

#[test]
fn the_readme_example_answers_sensibly() {
    let body = readme_body();
    let want: Value = serde_json::from_str(
        &std::fs::read_to_string(mini().join("expected/readme-example.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap(),
        serde_json::from_str::<Value>(want["body"].as_str().unwrap()).unwrap(),
        "the README example and expected/readme-example.json disagree: rerun train_mini.py"
    );
    let check = |label: &str, answers: &Value| {
        let refund = answers["refund"]["noul"].as_f64().unwrap();
        let team = answers["team"]["choice"].as_str().unwrap();
        let anger = answers["anger"]["score"].as_f64().unwrap();
        eprintln!("README example, {label}: refund {refund}, team {team}, anger {anger}");
        // Issue 14's bar (a random network answers 0.0001).
        assert!(refund >= 0.9, "{label}: refund p(yes) {refund} < 0.9");
        assert_eq!(team, "Billing", "{label}");
        assert!(
            anger >= 1.0,
            "{label}: anger score {anger} < 1 (Frustrated)"
        );
    };
    check("reference arm", &want["response"]["answers"]);
    for (form, arm, label) in [
        (WeightForm::Exact, Some(Arm::Fp32), "exact+fp32"),
        (WeightForm::Merged, None, "as `kev serve --demo` serves it"),
    ] {
        let d = load(form, arm).decide(body.as_bytes()).unwrap().unwrap();
        check(label, &d.body()["answers"]);
    }
}
