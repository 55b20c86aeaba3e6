//! Answer shaping (kev-contract §7) and `output_tokens` text (§8.4): formulas, ties, rounding, request order.

use kev_contract::{
    ResponseBody, choice_confidence, parse_request, python_dumps, round4, score_confidence,
    shape_answers,
};
use serde_json::json;

fn req(questions: serde_json::Value) -> kev_contract::ValidRequest {
    parse_request(
        json!({"state": "s", "questions": questions})
            .to_string()
            .as_bytes(),
    )
    .expect("valid")
}

#[test]
fn noul_choice_score_shapes() {
    let r = req(json!({
        "refund": {"type": "noul"},
        "team": {"type": "choice", "criteria": {"Billing": null, "Technical": null, "Sales": null}},
        "anger": {"type": "score", "criteria": ["Calm", "Frustrated", "Very angry"]}
    }));
    let a = shape_answers(
        &r,
        &[vec![0.1, 0.9], vec![0.2, 0.5, 0.3], vec![0.1, 0.6, 0.3]],
    )
    .expect("shapes");
    let text = serde_json::to_string(&a).expect("ser");
    assert_eq!(
        text,
        r#"{"refund":{"type":"noul","noul":0.9},"team":{"type":"choice","choice":"Technical","confidence":0.25,"probabilities":{"Billing":0.2,"Technical":0.5,"Sales":0.3}},"anger":{"type":"score","score":1.2,"legend":{"0":"Calm","1":"Frustrated","2":"Very angry"},"probabilities":{"0":0.1,"1":0.6,"2":0.3},"confidence":0.4}}"#
    );
    // Python's json.dumps of the same object (what output_tokens counts).
    assert!(python_dumps(&a).starts_with(r#"{"refund": {"type": "noul", "noul": 0.9}, "team": {"#));
}

#[test]
fn argmax_ties_go_to_the_first_option() {
    let r = req(json!({"c": {"type": "choice", "criteria": {"A": 1, "B": 2, "C": 3}}}));
    let a = shape_answers(&r, &[vec![0.25, 0.375, 0.375]]).expect("shapes");
    assert_eq!(a["c"]["choice"], "B");
    let a = shape_answers(&r, &[vec![1.0 / 3.0; 3]]).expect("shapes");
    assert_eq!(a["c"]["choice"], "A");
    assert_eq!(a["c"]["confidence"].to_string(), "0.0");
}

#[test]
fn single_option_and_level() {
    let r = req(json!({
        "team": {"type": "choice", "instructions": "Team?", "criteria": {"Billing": null}},
        "s": {"type": "score", "criteria": ["Calm"]}
    }));
    let a = shape_answers(&r, &[vec![1.0], vec![1.0]]).expect("shapes");
    assert_eq!(
        python_dumps(&a),
        r#"{"team": {"type": "choice", "choice": "Billing", "confidence": 1.0, "probabilities": {"Billing": 1.0}}, "s": {"type": "score", "score": 0.0, "legend": {"0": "Calm"}, "probabilities": {"0": 1.0}, "confidence": 1.0}}"#
    );
}

#[test]
fn confidence_formulas() {
    // (3·max − 1)/2 for three options; zero at uniform; the all-zero distribution counts as uniform.
    assert!((choice_confidence(&[0.6, 0.3, 0.1]) - 0.4).abs() < 1e-12);
    assert_eq!(choice_confidence(&[0.0, 0.0]), 0.0);
    // Unnormalised input is normalised first.
    assert!((choice_confidence(&[2.0, 2.0, 4.0]) - 0.25).abs() < 1e-12);
    // L = 2: same as the choice formula; D = 0.5.
    assert!((score_confidence(&[0.068, 0.932]) - 0.864).abs() < 1e-12);
    // L = 3, D = 2/3: all mass at the ends around mode 0 → 1 − (0.5·2)/(2/3) < 0 → 0.
    assert_eq!(score_confidence(&[0.5, 0.0, 0.5]), 0.0);
    assert_eq!(score_confidence(&[0.0, 1.0, 0.0]), 1.0);
}

#[test]
fn rounding_is_python_round_half_even_on_binary_values() {
    assert_eq!(round4(0.03125), 0.0312);
    assert_eq!(round4(0.09375), 0.0938);
    let r = req(json!({"q": {"type": "noul"}}));
    // 0.03125 is exact in f32: ties to even.
    let a = shape_answers(&r, &[vec![0.96875, 0.03125]]).expect("shapes");
    assert_eq!(a["q"]["noul"].to_string(), "0.0312");
}

#[test]
fn counts_must_match() {
    let r = req(json!({"q": {"type": "noul"}}));
    assert!(shape_answers(&r, &[]).is_err());
    assert!(shape_answers(&r, &[vec![1.0]]).is_err());
    assert!(shape_answers(&r, &[vec![f32::NAN, 0.5]]).is_ok());
    assert!(shape_answers(&r, &[vec![0.5, f32::NAN]]).is_err());
}

#[test]
fn response_body_is_compact_utf8_with_x_extensions() {
    let r = req(json!({"질문": {"type": "noul"}}));
    let a = shape_answers(&r, &[vec![0.5, 0.5]]).expect("shapes");
    let body = ResponseBody::new(r.model(), a, 12, 22)
        .extra("latency_ms", json!(1.5))
        .usage_extra("x_state_tokens", json!(3));
    assert_eq!(
        body.to_json(),
        r#"{"model":"kev-latest","answers":{"질문":{"type":"noul","noul":0.5}},"usage":{"input_tokens":12,"output_tokens":22,"x_state_tokens":3},"x_latency_ms":1.5}"#
    );
}
