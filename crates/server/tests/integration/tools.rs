//! `/v1/systemone/permute` and `/v1/systemone/separate` over a stand-in decider whose choice probabilities
//! depend on each option's name *and position*, so that reordering moves them: the orders tried (CPython's
//! shuffle), runs[0] against the plain answer, spreads and stability recomputed from the runs, usage, errors.
//! The same endpoints over the real engine are checked end to end in the CLI tests (kev serve --demo).

use crate::support;

use std::sync::Arc;

use kev_server::{Admission, ApiError, Decider, Need, ServerConfig, Step};
use serde_json::{Map, Value, json};
use support::{Running, done, parse_body, validation};

/// The choice stand-in (`choice_answer`); noul questions get 0.25.
struct Stub;

fn round4(x: f64) -> f64 {
    (x * 1e4).round() / 1e4
}

/// A choice answer: weight of option j named `k` = `len(k) + 3·j + 1`, normalised.
fn choice_answer(criteria: &Map<String, Value>) -> Value {
    let w: Vec<f64> = criteria
        .keys()
        .enumerate()
        .map(|(j, k)| (k.len() + 3 * j + 1) as f64)
        .collect();
    let s: f64 = w.iter().sum();
    let p: Vec<f64> = w.iter().map(|v| v / s).collect();
    let mut best = 0;
    for (i, v) in p.iter().enumerate() {
        if *v > p[best] {
            best = i;
        }
    }
    let probs: Map<String, Value> = criteria
        .keys()
        .zip(&p)
        .map(|(k, v)| (k.clone(), json!(round4(*v))))
        .collect();
    let choice = criteria.keys().nth(best).cloned().unwrap_or_default();
    json!({"type": "choice", "choice": choice, "confidence": 0.5, "probabilities": probs})
}

impl Decider for Stub {
    type Job = Value;

    fn admit(&self, body: &[u8]) -> Result<Admission<Value>, ApiError> {
        let v = parse_body(body)?;
        let Some(qs) = v
            .get("questions")
            .and_then(Value::as_object)
            .filter(|q| !q.is_empty())
        else {
            return Err(validation(
                json!({"detail":[{"type":"missing","loc":["body","questions"],"msg":"Field required","input":v}]}),
            ));
        };
        let tokens = 10 + 5 * qs.len();
        Ok(Admission { job: v, tokens })
    }

    fn need(&self, job: &Value) -> Need {
        let t = 10 + 5 * job["questions"].as_object().map_or(0, |q| q.len());
        Need {
            phase: t,
            unit: t,
            remaining: t,
        }
    }

    fn pass(&self, grants: &mut [(&mut Value, usize)], _lane: kev_decide::Lane) -> Vec<Step> {
        grants
            .iter()
            .map(|(v, _)| {
                let qs = v["questions"].as_object().unwrap();
                let answers: Map<String, Value> = qs
                    .iter()
                    .map(|(id, q)| {
                        let a = match q["type"].as_str() {
                            Some("choice") => choice_answer(q["criteria"].as_object().unwrap()),
                            _ => json!({"type": "noul", "noul": 0.25}),
                        };
                        (id.clone(), a)
                    })
                    .collect();
                done(json!({
                    "model": v.get("model").cloned().unwrap_or(json!("kev-latest")),
                    "answers": answers,
                    "usage": {"input_tokens": 10 + 5 * qs.len(), "output_tokens": 3 * qs.len()},
                }))
            })
            .collect()
    }

    fn warm_up(&self) -> Result<(), String> {
        Ok(())
    }

    fn model_card(&self) -> Value {
        json!({"description": "stub", "release_date": "2026-10-01"})
    }
}

/// A ready server over the choice stand-in.
fn start(api_key: Option<&str>) -> Running {
    let config = ServerConfig {
        api_key: api_key.map(String::from),
        ..ServerConfig::default()
    };
    support::start_ready(config, Arc::new(Stub))
}

fn post(r: &Running, path: &str, body: &Value, key: Option<&str>) -> (u16, Value) {
    let mut req =
        ureq::post(&format!("http://{}{path}", r.addr)).set("content-type", "application/json");
    if let Some(k) = key {
        req = req.set("authorization", &format!("Bearer {k}"));
    }
    let resp = match req.send_bytes(&serde_json::to_vec(body).unwrap()) {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("{e}"),
    };
    let status = resp.status();
    (
        status,
        serde_json::from_str(&resp.into_string().unwrap()).unwrap(),
    )
}

fn request() -> Value {
    json!({
        "model": "kev-latest",
        "state": "a ticket",
        "questions": {
            "first": {"type": "noul"},
            "team": {"type": "choice", "instructions": "Which team?", "criteria": {"A": null, "B": "bee", "C": null, "D": null, "E": null, "F": null}},
            "last": {"type": "choice", "criteria": {"x": null, "yy": null}},
        }
    })
}

#[test]
fn permute_runs_the_cpython_orders_and_summarises_them() {
    let r = start(None);
    let (s, plain) = post(&r, "/v1/systemone", &request(), None);
    assert_eq!(s, 200);
    let (s, out) = post(
        &r,
        "/v1/systemone/permute",
        &json!({"request": request(), "question": "team", "n_perm": 4}),
        None,
    );
    assert_eq!(s, 200, "{out}");
    let runs = out["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 4);
    // Printed by CPython 3.11: r = random.Random(0); then for each later run v = list("ABCDEF"); r.shuffle(v).
    let want = [
        ["A", "B", "C", "D", "E", "F"],
        ["E", "C", "B", "A", "F", "D"],
        ["E", "A", "B", "F", "C", "D"],
        ["F", "D", "A", "C", "B", "E"],
    ];
    for (run, order) in runs.iter().zip(want) {
        assert_eq!(run["order"], json!(order));
        // The run asked the question with its options in that order.
        let criteria: Map<String, Value> = order
            .iter()
            .map(|k| {
                (
                    k.to_string(),
                    request()["questions"]["team"]["criteria"][*k].clone(),
                )
            })
            .collect();
        let a = choice_answer(&criteria);
        assert_eq!(run["probabilities"], a["probabilities"]);
        assert_eq!(run["choice"], a["choice"]);
        assert!(run["latency_ms"].as_f64().is_some());
    }
    // runs[0] is the plain answer.
    assert_eq!(
        runs[0]["probabilities"],
        plain["answers"]["team"]["probabilities"]
    );
    assert_eq!(runs[0]["choice"], plain["answers"]["team"]["choice"]);
    // Spread per option in the given order, recomputed from the runs.
    let spread = out["spread"].as_object().unwrap();
    assert_eq!(
        spread.keys().collect::<Vec<_>>(),
        ["A", "B", "C", "D", "E", "F"]
    );
    for (k, v) in spread {
        let xs: Vec<f64> = runs
            .iter()
            .map(|r| r["probabilities"][k].as_f64().unwrap())
            .collect();
        let hi = xs.iter().cloned().fold(f64::MIN, f64::max);
        let lo = xs.iter().cloned().fold(f64::MAX, f64::min);
        assert_eq!(v.as_f64().unwrap(), hi - lo, "{k}");
        assert!(
            hi - lo > 0.0,
            "the stub moves every option with its position"
        );
    }
    let choices: Vec<&Value> = runs.iter().map(|r| &r["choice"]).collect();
    assert_eq!(
        out["argmax_stable"],
        json!(choices.windows(2).all(|w| w[0] == w[1]))
    );
    assert_eq!(
        out["argmax_stable"],
        json!(false),
        "the option asked last wins here: {choices:?}"
    );

    // Defaults: n_perm 6, seed 0; another seed gives CPython's orders for it.
    let (_, out) = post(
        &r,
        "/v1/systemone/permute",
        &json!({"request": request(), "question": "team"}),
        None,
    );
    assert_eq!(out["runs"].as_array().unwrap().len(), 6);
    let (_, out) = post(
        &r,
        "/v1/systemone/permute",
        &json!({"request": request(), "question": "last", "n_perm": 3, "seed": 7}),
        None,
    );
    let orders: Vec<&Value> = out["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| &r["order"])
        .collect();
    // CPython: r = random.Random(7); the later runs shuffle ["x", "yy"] each time.
    let mut rng = kev_server::pyrandom::PyRandom::new(7);
    let mut want = vec![json!(["x", "yy"])];
    for _ in 0..2 {
        let mut v = vec!["x", "yy"];
        rng.shuffle(&mut v);
        want.push(json!(v));
    }
    assert_eq!(orders, want.iter().collect::<Vec<_>>());
    // A single option order is stable with zero spread.
    let one =
        json!({"state": "s", "questions": {"q": {"type": "choice", "criteria": {"only": null}}}});
    let (_, out) = post(
        &r,
        "/v1/systemone/permute",
        &json!({"request": one, "question": "q", "n_perm": 3}),
        None,
    );
    assert_eq!(out["argmax_stable"], json!(true));
    assert_eq!(out["spread"], json!({"only": 0.0}));
}

#[test]
fn permute_refuses_what_it_cannot_run() {
    let r = start(None);
    let cases = [
        (
            json!({"request": request(), "question": "first"}),
            "not choice",
        ),
        (
            json!({"request": request(), "question": "nope"}),
            "missing question",
        ),
    ];
    for (body, why) in cases {
        let (s, out) = post(&r, "/v1/systemone/permute", &body, None);
        assert_eq!(s, 422, "{why}: {out}");
        assert_eq!(
            out["detail"]["error_type"], "invalid_request_error",
            "{why}: {out}"
        );
    }
    let lists = [
        (
            json!({"request": request(), "question": "team", "n_perm": 0}),
            json!(["body", "n_perm"]),
            "greater_than_equal",
        ),
        (
            json!({"request": request(), "question": "team", "n_perm": 65}),
            json!(["body", "n_perm"]),
            "less_than_equal",
        ),
        (
            json!({"request": request(), "question": "team", "n_perm": "six"}),
            json!(["body", "n_perm"]),
            "int_type",
        ),
        (
            json!({"request": request(), "question": "team", "seed": 1.5}),
            json!(["body", "seed"]),
            "int_type",
        ),
        (
            json!({"question": "team"}),
            json!(["body", "request"]),
            "missing",
        ),
        (
            json!({"request": request(), "question": 3}),
            json!(["body", "question"]),
            "string_type",
        ),
        (
            json!({"request": {"state": "s"}, "question": "team"}),
            json!(["body", "request", "questions"]),
            "missing",
        ),
        (json!([1]), json!(["body"]), "model_attributes_type"),
    ];
    for (body, loc, kind) in lists {
        let (s, out) = post(&r, "/v1/systemone/permute", &body, None);
        assert_eq!(s, 422, "{body}: {out}");
        assert_eq!(out["detail"][0]["loc"], loc, "{body}: {out}");
        assert_eq!(out["detail"][0]["type"], kind, "{body}: {out}");
    }
    // An integral float is an integer (pydantic's lax mode); big seeds are fine.
    let (s, out) = post(
        &r,
        "/v1/systemone/permute",
        &json!({"request": request(), "question": "team", "n_perm": 2.0, "seed": "-12345678901234567890".parse::<Value>().unwrap()}),
        None,
    );
    assert_eq!(s, 200, "{out}");
}

#[test]
fn separate_answers_each_question_alone_and_sums_usage() {
    let r = start(None);
    let (_, plain) = post(&r, "/v1/systemone", &request(), None);
    let (s, sep) = post(&r, "/v1/systemone/separate", &request(), None);
    assert_eq!(s, 200, "{sep}");
    assert_eq!(sep["answers"], plain["answers"]);
    assert_eq!(
        sep["answers"]
            .as_object()
            .unwrap()
            .keys()
            .collect::<Vec<_>>(),
        ["first", "team", "last"]
    );
    assert_eq!(sep["model"], "kev-latest");
    // Three one-question parts of 15 input tokens and 3 output tokens (this decider counts no merged tokens).
    assert_eq!(
        sep["usage"],
        json!({"input_tokens": 45, "output_tokens": 9})
    );
    assert!(sep["x_latency_ms"].as_f64().is_some());
    // A request /v1/systemone refuses gets the same error.
    let bad = json!({"state": "s", "questions": {}});
    let (s1, e1) = post(&r, "/v1/systemone", &bad, None);
    let (s2, e2) = post(&r, "/v1/systemone/separate", &bad, None);
    assert_eq!((s1, &e1), (s2, &e2));
    assert_eq!(s2, 422);
}

#[test]
fn the_extras_sit_behind_the_api_key() {
    let r = start(Some("sekrit"));
    for path in ["/v1/systemone/permute", "/v1/systemone/separate"] {
        let (s, _) = post(&r, path, &request(), Some("wrong"));
        assert_eq!(s, 401, "{path}");
    }
    let (s, _) = post(&r, "/v1/systemone/separate", &request(), Some("sekrit"));
    assert_eq!(s, 200);
}

#[test]
fn the_openapi_document_lists_the_extras() {
    let doc: Value = serde_json::from_str(include_str!("../../openapi.json")).unwrap();
    for p in ["/v1/systemone/permute", "/v1/systemone/separate"] {
        assert!(
            doc["paths"][p]["post"]["responses"]["422"].is_object(),
            "{p}"
        );
    }
    let perm = &doc["components"]["schemas"]["PermuteRequest"]["properties"];
    assert_eq!(perm["n_perm"]["maximum"], 64);
    assert_eq!(perm["n_perm"]["default"], 6);
    assert!(doc["components"]["schemas"]["ModelCard"]["properties"]["x_calibration"].is_object());
}
