//! Kev 1.0 validation: accepted shapes, and 422 bodies byte-for-byte as FastAPI + pydantic 2 send them (the
//! expected bodies were recorded from Kev 1.0's models under FastAPI 0.165 / pydantic 2.14).

use kev_contract::{ContractError, QuestionKind, parse_request, refuse_non_json_content};
use serde_json::{Value, json};

fn refused(body: &str) -> (u16, Value) {
    match parse_request(body.as_bytes()) {
        Ok(r) => panic!("{body}: accepted as {r:?}"),
        Err(e) => (e.status(), e.body()),
    }
}

fn body_text(body: &str) -> String {
    let (_, b) = refused(body);
    serde_json::to_string(&b).expect("serializes")
}

#[test]
fn union_errors_list_every_member() {
    assert_eq!(
        body_text(r#"{"state":1,"questions":{"a":{"type":"choice","criteria":{}}}}"#),
        r#"{"detail":[{"type":"literal_error","loc":["body","questions","a","Noul","type"],"msg":"Input should be 'noul'","input":"choice","ctx":{"expected":"'noul'"}},{"type":"value_error","loc":["body","questions","a","function-after[_check(), Choice]"],"msg":"Value error, criteria must have 1..255 options","input":{"type":"choice","criteria":{}},"ctx":{"error":{}}},{"type":"literal_error","loc":["body","questions","a","Score","type"],"msg":"Input should be 'score'","input":"choice","ctx":{"expected":"'score'"}},{"type":"list_type","loc":["body","questions","a","Score","criteria"],"msg":"Input should be a valid list","input":{}}]}"#
    );
    assert_eq!(
        body_text(r#"{"state":1,"questions":{"a":3}}"#),
        r#"{"detail":[{"type":"model_attributes_type","loc":["body","questions","a","Noul"],"msg":"Input should be a valid dictionary or object to extract fields from","input":3},{"type":"model_attributes_type","loc":["body","questions","a","function-after[_check(), Choice]"],"msg":"Input should be a valid dictionary or object to extract fields from","input":3},{"type":"model_attributes_type","loc":["body","questions","a","Score"],"msg":"Input should be a valid dictionary or object to extract fields from","input":3}]}"#
    );
    assert_eq!(
        body_text(r#"{"state":1,"questions":{"a":{}}}"#),
        r#"{"detail":[{"type":"missing","loc":["body","questions","a","Noul","type"],"msg":"Field required","input":{}},{"type":"missing","loc":["body","questions","a","function-after[_check(), Choice]","type"],"msg":"Field required","input":{}},{"type":"missing","loc":["body","questions","a","function-after[_check(), Choice]","criteria"],"msg":"Field required","input":{}},{"type":"missing","loc":["body","questions","a","Score","type"],"msg":"Field required","input":{}},{"type":"missing","loc":["body","questions","a","Score","criteria"],"msg":"Field required","input":{}}]}"#
    );
    assert_eq!(
        body_text(r#"{"state":1, "questions":{"a":{"type":"noul","criteria":[]}}}"#),
        r#"{"detail":[{"type":"dict_type","loc":["body","questions","a","Noul","criteria"],"msg":"Input should be a valid dictionary","input":[]},{"type":"literal_error","loc":["body","questions","a","function-after[_check(), Choice]","type"],"msg":"Input should be 'choice'","input":"noul","ctx":{"expected":"'choice'"}},{"type":"dict_type","loc":["body","questions","a","function-after[_check(), Choice]","criteria"],"msg":"Input should be a valid dictionary","input":[]},{"type":"literal_error","loc":["body","questions","a","Score","type"],"msg":"Input should be 'score'","input":"noul","ctx":{"expected":"'score'"}},{"type":"too_short","loc":["body","questions","a","Score","criteria"],"msg":"List should have at least 1 item after validation, not 0","input":[],"ctx":{"field_type":"List","min_length":1,"actual_length":0}}]}"#
    );
}

#[test]
fn top_level_errors() {
    assert_eq!(
        body_text(r#"{"questions":[]}"#),
        r#"{"detail":[{"type":"missing","loc":["body","state"],"msg":"Field required","input":{"questions":[]}},{"type":"dict_type","loc":["body","questions"],"msg":"Input should be a valid dictionary","input":[]}]}"#
    );
    assert_eq!(
        body_text(r#"{"state":1,"model":null,"questions":{}}"#),
        r#"{"detail":[{"type":"string_type","loc":["body","model"],"msg":"Input should be a valid string","input":null},{"type":"too_short","loc":["body","questions"],"msg":"Dictionary should have at least 1 item after validation, not 0","input":{},"ctx":{"field_type":"Dictionary","min_length":1,"actual_length":0}}]}"#
    );
    assert_eq!(
        body_text("[1]"),
        r#"{"detail":[{"type":"model_attributes_type","loc":["body"],"msg":"Input should be a valid dictionary or object to extract fields from","input":[1]}]}"#
    );
    assert_eq!(
        body_text("null"),
        r#"{"detail":[{"type":"model_attributes_type","loc":["body"],"msg":"Input should be a valid dictionary or object to extract fields from","input":null}]}"#
    );
    assert_eq!(
        body_text(""),
        r#"{"detail":[{"type":"missing","loc":["body"],"msg":"Field required","input":null}]}"#
    );
    // Floats are echoed as Python writes them.
    assert_eq!(
        body_text(r#"{"state":1,"model":1.0e-5,"questions":{"a":{"type":"noul"}}}"#),
        r#"{"detail":[{"type":"string_type","loc":["body","model"],"msg":"Input should be a valid string","input":1e-05}]}"#
    );
}

#[test]
fn json_errors_and_unreadable_bodies() {
    let (status, body) = refused(r#"{"state": "x", "questions":{"a":{"type":"noul"}}} x"#);
    assert_eq!(status, 422);
    assert_eq!(
        body,
        json!({"detail":[{"type":"json_invalid","loc":["body",50],"msg":"JSON decode error","input":{},"ctx":{"error":"Extra data"}}]})
    );
    let (status, body) = refused("{\"state\":\"\u{7f}\",\"questions\":{}}\u{0}");
    assert_eq!(
        (status, body["detail"][0]["ctx"]["error"].clone()),
        (422, json!("Extra data"))
    );
    match parse_request(b"{\"state\":\"\xff\",\"questions\":{}}") {
        Err(e @ ContractError::Unparseable { .. }) => {
            assert_eq!(e.status(), 400);
            assert_eq!(
                e.body(),
                json!({"detail": "There was an error parsing the body"})
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn size_bounds_of_choice_and_score() {
    let choice = |n: usize| {
        let c: serde_json::Map<String, Value> =
            (0..n).map(|i| (format!("k{i}"), json!(1))).collect();
        json!({"state": 1, "questions": {"q": {"type": "choice", "criteria": c}}}).to_string()
    };
    assert!(parse_request(choice(1).as_bytes()).is_ok());
    assert!(parse_request(choice(255).as_bytes()).is_ok());
    let (_, b) = refused(&choice(256));
    assert_eq!(b["detail"][1]["type"], "value_error");
    let score = |n: usize| {
        json!({"state": 1, "questions": {"q": {"type": "score", "criteria": vec![Value::Null; n]}}})
            .to_string()
    };
    assert!(parse_request(score(1).as_bytes()).is_ok());
    assert!(parse_request(score(255).as_bytes()).is_ok());
    let (_, b) = refused(&score(300));
    let last = &b["detail"][b["detail"].as_array().map_or(0, Vec::len) - 1];
    assert_eq!(last["type"], "too_long");
    assert_eq!(
        last["msg"],
        "List should have at most 255 items after validation, not 300"
    );
    assert_eq!(
        last["ctx"],
        json!({"field_type": "List", "max_length": 255, "actual_length": 300})
    );
}

#[test]
fn accepted_requests_and_their_options() {
    let r = parse_request(
        br#"{"state": null, "x_trace": 1, "questions": {
            "": {"type": "noul", "criteria": {"true": "They want a refund", "other": 5}},
            "q.2": {"type": "noul", "criteria": null, "label": "ignored"},
            "c": {"type": "choice", "instructions": ["Route.", "One team."], "criteria": {"Billing": {"owns": ["invoices"]}, "Tech": null, "Sales": ""}},
            "s": {"type": "score", "criteria": ["Calm", null, {"label": "Angry", "signals": ["threats"]}]}
        }}"#,
    )
    .expect("valid");
    assert_eq!(r.model(), "kev-latest");
    assert_eq!(r.rendered_state(), "");
    let q = r.questions();
    assert_eq!(q.len(), 4);
    assert_eq!((q[0].id(), q[0].kind()), ("", QuestionKind::Noul));
    assert_eq!(q[0].options(), ["no", "yes: They want a refund"]);
    assert_eq!(q[0].keys(), ["false", "true"]);
    assert_eq!(q[0].instructions(), "");
    assert_eq!(q[1].options(), ["no", "yes"]);
    assert_eq!(q[2].instructions(), "- Route.\n- One team.");
    assert_eq!(
        q[2].options(),
        ["Billing: owns:\n  - invoices", "Tech", "Sales"]
    );
    assert_eq!(q[2].keys(), ["Billing", "Tech", "Sales"]);
    assert_eq!(
        q[3].options(),
        ["Calm", "", "label: Angry\nsignals:\n  - threats"]
    );
    assert_eq!(q[3].keys(), ["0", "1", "2"]);
    let legend: Vec<_> = q[3].legend().map(Iterator::collect).unwrap_or_default();
    assert_eq!(
        legend,
        [
            ("0", "Calm"),
            ("1", ""),
            ("2", "label: Angry\nsignals:\n  - threats")
        ]
    );
    assert!(q[2].legend().is_none());
}

#[test]
fn duplicate_keys_last_value_first_position() {
    let r = parse_request(
        br#"{"state": {"a": 1, "b": 2, "a": 3}, "questions": {"x": {"type": "noul"}, "y": {"type": "noul"}, "x": {"type": "score", "criteria": [1]}}, "state": {"b": {}, "a": []}}"#,
    )
    .expect("valid");
    assert_eq!(r.rendered_state(), "b:\n\na:\n");
    let ids: Vec<_> = r.questions().iter().map(|q| (q.id(), q.kind())).collect();
    assert_eq!(ids, [("x", QuestionKind::Score), ("y", QuestionKind::Noul)]);
}

#[test]
fn model_is_echoed_not_checked() {
    let r = parse_request(
        br#"{"model": "jev-typo", "state": "", "questions": {"a": {"type": "noul"}}}"#,
    )
    .expect("valid");
    assert_eq!(r.model(), "jev-typo");
    assert_eq!(r.state(), &json!(""));
}

#[test]
fn non_json_content_type_is_refused_like_fastapi() {
    let e = refuse_non_json_content(br#"{"state":1}"#);
    assert_eq!(
        serde_json::to_string(&e.body()).expect("ser"),
        r#"{"detail":[{"type":"model_attributes_type","loc":["body"],"msg":"Input should be a valid dictionary or object to extract fields from","input":"{\"state\":1}"}]}"#
    );
    assert_eq!(
        refuse_non_json_content(b"").body()["detail"][0]["type"],
        "missing"
    );
}
