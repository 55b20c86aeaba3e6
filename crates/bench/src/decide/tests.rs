use super::report::row_list;
use super::*;

fn result(case: &'static str, arm: &'static str, mode: Mode, median_s: f64) -> RunResult {
    RunResult {
        case,
        arm,
        mode,
        tokens_run: 0,
        timing: Summary::of(&[median_s]).unwrap(),
        cpu_s: vec![],
        rows_per_request: 0.0,
        passes_per_request: 0.0,
        cache_hits: 0,
        cache_misses: 0,
        peak_rss_gib: None,
        probabilities: vec![vec![0.25, 0.75]],
    }
}

fn info(name: &'static str, share_num: usize) -> CaseInfo {
    let request = CaseRequest {
        body: Vec::new(),
        state_tokens: 137,
        branch_tokens: vec![share_num],
        input_tokens: 137 + share_num,
    };
    CaseInfo {
        name,
        questions: 1,
        row_tokens: request.row_tokens(),
        question_share: request.question_share(),
        request,
    }
}

#[test]
fn bars_of_issue_6() {
    let results = vec![
        result("5q-137", "fp32", Mode::FromZero, 10.0),
        RunResult {
            tokens_run: 280,
            ..result("5q-137", "fp32", Mode::Shared, 4.0)
        },
        RunResult {
            tokens_run: 140,
            ..result("5q-137-cached", "fp32", Mode::Cached, 2.5)
        },
        result("5q-137", "bf16", Mode::FromZero, 5.0),
        result("5q-137", "bf16", Mode::Shared, 3.0),
        result("1q-94", "fp32", Mode::Shared, 2.0),
    ];
    // Question rows: 100 of 237 tokens (share 0.422).
    let cases = vec![info("5q-137", 100), info("5q-137-cached", 100)];
    let torch = TorchResult {
        label: "torch".into(),
        setup: PeerSetup {
            cache: String::new(),
            threads: 2,
            python: None,
            vars: Vec::new(),
        },
        threads: 2,
        peak_rss_gib: None,
        cases: vec![TorchCase {
            case: "1q-94",
            timing: Summary::of(&[5.0]).unwrap(),
            row_tokens: vec![94],
            rows_match: true,
            max_abs_dp: vec![],
        }],
        raw: serde_json::Value::Null,
    };
    let comps = compare(&results, Some(&torch));
    assert_eq!(comps.len(), 1);
    assert_eq!(comps[0].speedup, Some(2.5));
    let b = bars(&results, &cases, &comps);
    let get = |s: &str| b.iter().find(|x| x.what.contains(s)).unwrap();
    let fp32_shared = get("fp32: shared");
    assert!(fp32_shared.met && fp32_shared.value == 0.4);
    // bf16: 3 / 5 = 0.6 > 0.5.
    assert!(!get("bf16: shared").met);
    // Hit / miss = 2.5 / 4 = 0.625 against the hit's 140 of 280 tokens + 0.10; the question tokens alone
    // (100 of 237) are named in the label.
    let hit = get("fp32: cache hit");
    assert_eq!(hit.value, 0.625);
    assert!((hit.threshold - 0.6).abs() < 1e-12);
    assert!(!hit.met);
    assert!(hit.what.contains("140 of 280") && hit.what.contains("0.422"));
    // No cached bf16 result: no bar for it.
    assert!(!b.iter().any(|x| x.what.contains("bf16: cache")));
    let t = get("fp32 end to end");
    assert!(t.met && t.value == 2.5);
    assert_eq!(b.len(), 4);
}

#[test]
fn probability_differences() {
    let torch = vec![vec![0.25, 0.75], vec![1.0]];
    assert_eq!(
        max_abs_dp(&torch, &[vec![0.25, 0.5], vec![1.0]]),
        Some(0.25)
    );
    assert_eq!(max_abs_dp(&torch, &[vec![0.25, 0.75]]), None);
    assert_eq!(max_abs_dp(&torch, &[vec![0.25], vec![1.0]]), None);
}

#[test]
fn modes_and_cases() {
    assert!(Mode::FromZero.settings(4096, true).rows_from_zero);
    let shared = Mode::Shared.settings(4096, true);
    assert!(!shared.rows_from_zero && shared.cache_bytes == Some(0) && shared.chunk_aligned);
    assert!(!Mode::Shared.settings(4096, false).chunk_aligned);
    assert_eq!(Mode::Cached.settings(0, true).cache_bytes, None);
    assert_eq!(Mode::Cached.settings(0, true).pass_tokens, 1);
    let r = CaseRequest {
        body: Vec::new(),
        state_tokens: 137,
        branch_tokens: vec![20; 5],
        input_tokens: 237,
    };
    assert_eq!(Mode::FromZero.tokens_run(&r, true), 5 * 157);
    assert_eq!(Mode::Shared.tokens_run(&r, true), 128 + 5 * 29);
    assert_eq!(Mode::Cached.tokens_run(&r, true), 5 * 29);
    // Unaligned: the whole state once, the branches alone on a hit.
    assert_eq!(Mode::Shared.tokens_run(&r, false), 137 + 5 * 20);
    assert_eq!(Mode::Cached.tokens_run(&r, false), 5 * 20);
    // Case names are unique and the barred ones exist.
    for name in [FIVE, FIVE_CACHED, ONE] {
        assert_eq!(CASES.iter().filter(|c| c.name == name).count(), 1);
    }
    assert_eq!(row_list(&[94]), "94");
    assert_eq!(row_list(&[157, 157]), "2 × 157");
    assert_eq!(row_list(&[157, 160]), "157+160");
}
