//! The author's demo extras, each a fan-out of `/v1/systemone` requests through the one admission pipeline
//! (`crate::pipeline`): their parts are admitted together (all or nothing, the per-request work caps held for
//! the parts' total), take the request's one queue slot, share engine passes and the prepared-state cache, and
//! stop together when the client leaves — so they answer exactly what `/v1/systemone` answers for the requests
//! they make, under its guards:
//!
//! - `POST /v1/systemone/permute` `{request, question, n_perm = 6, seed = 0}`: one choice question re-run under
//!   `n_perm` option orders — the given order first, then `random.Random(seed).shuffle` of it (CPython's
//!   generator, reproduced in [`crate::pyrandom`]) — as one-question requests on the same state. Answers
//!   `{runs: [{order, probabilities, choice, latency_ms}], argmax_stable, spread}`, `spread` per option being
//!   max − min of its (rounded) probability over the runs.
//! - `POST /v1/systemone/separate`: every question in its own request on the same state; answers merged in
//!   request order, `input_tokens` summed, `output_tokens` counted on the merged answers.
//!
//! `x_latency_ms` (`/separate`) is the time from submitting the parts to the last answer.

use std::sync::Arc;

use axum::extract::State;
use axum::response::Response;
use kev_contract::{ContractError, ErrorDetail, ResponseBody};
use serde_json::{Map, Value, json};

use crate::error::ApiError;
use crate::pipeline::{Answers, Route, handle, ms};
use crate::pyrandom::{PyRandom, words_of_decimal};
use crate::wire::{invalid, parse_json};
use crate::{App, Body, Decider};

/// Most option orders one permute request may ask for (the author's bound).
pub const MAX_PERMUTATIONS: u64 = 64;

/// The request with only question `id` (its value replaced by `question`), as a part admission takes (the
/// value itself: read once with the request, never written back and read again).
fn with_one_question(request: &Map<String, Value>, id: &str, question: Value) -> Body<'static> {
    let mut one = request.clone();
    let mut qs = Map::new();
    qs.insert(id.to_string(), question);
    one.insert("questions".into(), Value::Object(qs));
    Body::Value(Value::Object(one))
}

/// A truncating server's marks, as one part carries them (each part read the same state).
const TRUNCATION_MARKS: [&str; 3] = ["x_truncated", "x_state_tokens", "x_state_tokens_used"];

/// Answer every question in its own request on the same state (the author's demo extra)
#[utoipa::path(
    post,
    path = "/v1/systemone/separate",
    request_body(content = kev_contract::wire::Request, example = json!(crate::schemas::request_example())),
    responses((status = 200, description = "The parts' answers merged in request order, input tokens summed",
        body = kev_contract::wire::Response, example = json!(crate::schemas::response_example()))),
)]
pub(crate) async fn separate<D: Decider>(
    State(app): State<Arc<App<D>>>,
    request: axum::extract::Request,
) -> Response {
    handle(app, Separate, request).await
}

/// `/v1/systemone/separate`: one part per question.
#[derive(Clone, Copy)]
struct Separate;

impl<D: Decider> Route<D> for Separate {
    type Plan = ();

    fn split(
        &self,
        decider: &D,
        owner: Option<&str>,
        bytes: Vec<u8>,
    ) -> Result<(Vec<Body<'static>>, ()), ApiError> {
        let request = parse_json(&bytes)?;
        // The whole request is admitted first: a bad one gets exactly `/v1/systemone`'s error.
        decider.admit_parts(vec![Body::Value(request.clone())], owner)?;
        // Admitted, so an object with a `questions` object; anything else is a fault of ours.
        let request = match request {
            Value::Object(m) => m,
            _ => return Err(ApiError::internal()),
        };
        let questions = match request.get("questions") {
            Some(Value::Object(q)) => q,
            _ => return Err(ApiError::internal()),
        };
        let bodies = questions
            .iter()
            .map(|(id, q)| with_one_question(&request, id, q.clone()))
            .collect();
        Ok((bodies, ()))
    }

    fn merge(&self, decider: &D, _: (), answers: Answers) -> Result<Value, ApiError> {
        let parts = &answers.parts;
        let mut merged = Map::new();
        let mut input = 0;
        let mut output = 0;
        for part in parts {
            if let Some(a) = part.body.answers().as_object() {
                for (k, v) in a {
                    merged.insert(k.clone(), v.clone());
                }
            }
            input += part.body.usage().input_tokens;
            output += part.body.usage().output_tokens;
        }
        let merged = Value::Object(merged);
        let output = decider.output_tokens(&merged).unwrap_or(output);
        let first = &parts.first().ok_or_else(ApiError::internal)?.body;
        let mut out = ResponseBody::new(first.model(), merged, input, output);
        for k in TRUNCATION_MARKS {
            if let Some(v) = first.extension(k) {
                out = out.extra(k, v.clone());
            }
        }
        Ok(out
            .extra("x_latency_ms", json!(ms(answers.elapsed)))
            .to_value())
    }
}

/// Re-run one choice question under several option orders (the author's demo extra)
#[utoipa::path(
    post,
    path = "/v1/systemone/permute",
    request_body(content = crate::schemas::PermuteRequest,
        example = json!({"request": crate::schemas::request_example(), "question": "kind", "n_perm": 3, "seed": 0})),
    responses((status = 200, description = "One run per option order, the given order first",
        body = PermuteResponse, example = json!(crate::schemas::permute_example()))),
)]
pub(crate) async fn permute<D: Decider>(
    State(app): State<Arc<App<D>>>,
    request: axum::extract::Request,
) -> Response {
    handle(app, Permute, request).await
}

/// `/v1/systemone/permute`: one part per option order.
#[derive(Clone, Copy)]
struct Permute;

/// What a permute's answers are read with: the question, its keys in the given order, the orders run.
struct PermutePlan {
    question: String,
    keys: Vec<String>,
    orders: Vec<Vec<String>>,
}

/// The envelope `{request, question, n_perm, seed}`, checked as pydantic checks the author's model.
struct Envelope {
    request: Map<String, Value>,
    question: String,
    n_perm: u64,
    seed: Vec<u32>,
}

fn integer(v: &Value) -> Option<String> {
    match v {
        Value::Number(n) => {
            let text = n.to_string();
            if words_of_decimal(&text).is_some() {
                return Some(text);
            }
            // An integral float (`6.0`) is an integer to pydantic's lax mode.
            let f = n.as_f64()?;
            (f.is_finite() && f.fract() == 0.0 && f.abs() < 9.007e15)
                .then(|| format!("{}", f as i64))
        }
        _ => None,
    }
}

fn parse_permute(v: Value) -> Result<Envelope, ApiError> {
    let Value::Object(fields) = v else {
        return Err(ContractError::Invalid(vec![invalid(
            &[],
            "model_attributes_type",
            "Input should be a valid dictionary or object to extract fields from",
            v,
            None,
        )])
        .into());
    };
    let mut errors: Vec<ErrorDetail> = Vec::new();
    let mut push = |e: ErrorDetail| errors.push(e);
    let request = match fields.get("request") {
        Some(Value::Object(m)) => Some(m.clone()),
        Some(other) => {
            push(invalid(
                &["request"],
                "model_attributes_type",
                "Input should be a valid dictionary or object to extract fields from",
                other.clone(),
                None,
            ));
            None
        }
        None => {
            push(invalid(
                &["request"],
                "missing",
                "Field required",
                Value::Object(fields.clone()),
                None,
            ));
            None
        }
    };
    let question = match fields.get("question") {
        Some(Value::String(s)) => Some(s.clone()),
        Some(other) => {
            push(invalid(
                &["question"],
                "string_type",
                "Input should be a valid string",
                other.clone(),
                None,
            ));
            None
        }
        None => {
            push(invalid(
                &["question"],
                "missing",
                "Field required",
                Value::Object(fields.clone()),
                None,
            ));
            None
        }
    };
    let mut n_perm = Some(6u64);
    if let Some(v) = fields.get("n_perm") {
        n_perm = None;
        match integer(v) {
            None => push(invalid(
                &["n_perm"],
                "int_type",
                "Input should be a valid integer",
                v.clone(),
                None,
            )),
            Some(t) if t.starts_with('-') || t == "0" => push(invalid(
                &["n_perm"],
                "greater_than_equal",
                "Input should be greater than or equal to 1",
                v.clone(),
                Some(json!({"ge": 1})),
            )),
            Some(t) => match t.parse::<u64>() {
                Ok(n) if n <= MAX_PERMUTATIONS => n_perm = Some(n),
                _ => push(invalid(
                    &["n_perm"],
                    "less_than_equal",
                    "Input should be less than or equal to 64",
                    v.clone(),
                    Some(json!({"le": MAX_PERMUTATIONS})),
                )),
            },
        }
    }
    let mut seed = Some(Vec::new());
    if let Some(v) = fields.get("seed") {
        seed = integer(v).and_then(|t| words_of_decimal(&t));
        if seed.is_none() {
            push(invalid(
                &["seed"],
                "int_type",
                "Input should be a valid integer",
                v.clone(),
                None,
            ));
        }
    }
    match (request, question, n_perm, seed) {
        (Some(request), Some(question), Some(n_perm), Some(seed)) if errors.is_empty() => {
            Ok(Envelope {
                request,
                question,
                n_perm,
                seed,
            })
        }
        _ => Err(ContractError::Invalid(errors).into()),
    }
}

impl<D: Decider> Route<D> for Permute {
    type Plan = PermutePlan;

    fn split(
        &self,
        decider: &D,
        owner: Option<&str>,
        bytes: Vec<u8>,
    ) -> Result<(Vec<Body<'static>>, PermutePlan), ApiError> {
        let p = parse_permute(parse_json(&bytes)?)?;
        // The inner request as `/v1/systemone` would judge it, its errors located under `request`.
        let inner = Body::Value(Value::Object(p.request.clone()));
        decider
            .admit_parts(vec![inner], owner)
            .map_err(|e| e.under("request"))?;
        let not_choice = || {
            ApiError::unanswerable(format!(
                "question {:?} must be an existing choice question of the request",
                p.question
            ))
        };
        let q = p
            .request
            .get("questions")
            .and_then(|qs| qs.get(&p.question))
            .and_then(Value::as_object)
            .filter(|q| q.get("type") == Some(&json!("choice")))
            .ok_or_else(not_choice)?;
        let criteria = q
            .get("criteria")
            .and_then(Value::as_object)
            .ok_or_else(not_choice)?;
        let keys: Vec<String> = criteria.keys().cloned().collect();

        let mut rng = PyRandom::from_words(&p.seed);
        let mut orders: Vec<Vec<String>> = Vec::new();
        let mut bodies = Vec::new();
        for i in 0..p.n_perm {
            let mut order = keys.clone();
            if i > 0 {
                rng.shuffle(&mut order);
            }
            let mut q2 = q.clone();
            let reordered: Map<String, Value> = order
                .iter()
                .map(|k| (k.clone(), criteria[k].clone()))
                .collect();
            q2.insert("criteria".into(), Value::Object(reordered));
            bodies.push(with_one_question(
                &p.request,
                &p.question,
                Value::Object(q2),
            ));
            orders.push(order);
        }
        let plan = PermutePlan {
            question: p.question,
            keys,
            orders,
        };
        Ok((bodies, plan))
    }

    fn merge(&self, _: &D, plan: PermutePlan, answers: Answers) -> Result<Value, ApiError> {
        let PermutePlan {
            question,
            keys,
            orders,
        } = plan;
        let parts = &answers.parts;
        let mut runs = Vec::new();
        for (order, part) in orders.into_iter().zip(parts) {
            let a = &part.body.answers()[&question];
            runs.push(PermuteRun {
                order,
                probabilities: a["probabilities"].clone(),
                choice: a["choice"].clone(),
                latency_ms: ms(part.compute),
            });
        }
        let spread: Map<String, Value> = keys
            .iter()
            .map(|k| {
                let values = parts
                    .iter()
                    .filter_map(|p| p.body.answers()[&question]["probabilities"][k].as_f64());
                let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
                    (lo.min(v), hi.max(v))
                });
                (k.clone(), json!(hi - lo))
            })
            .collect();
        let argmax_stable = runs.windows(2).all(|w| w[0].choice == w[1].choice);
        let first = parts.first().map(|p| &p.body);
        let mark = |k: &str| first.and_then(|b| b.extension(k)).cloned();
        let out = PermuteResponse {
            runs,
            argmax_stable,
            spread,
            x_truncated: mark(TRUNCATION_MARKS[0]),
            x_state_tokens: mark(TRUNCATION_MARKS[1]),
            x_state_tokens_used: mark(TRUNCATION_MARKS[2]),
        };
        serde_json::to_value(out).map_err(|_| ApiError::internal())
    }
}

/// `POST /v1/systemone/permute`'s answer.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct PermuteResponse {
    /// One run per option order, the given order first.
    pub runs: Vec<PermuteRun>,
    /// Whether every run chose the same option.
    pub argmax_stable: bool,
    /// Per option: max − min of its (rounded) probability over the runs.
    #[schema(value_type = HashMap<String, f64>)]
    pub spread: Map<String, Value>,
    /// As `/v1/systemone` answers with `--truncate-state`: whether the state was cut.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<bool>)]
    pub x_truncated: Option<Value>,
    /// The state's tokens (truncating servers only).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<u64>)]
    pub x_state_tokens: Option<Value>,
    /// The state tokens read (truncating servers only).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<u64>)]
    pub x_state_tokens_used: Option<Value>,
}

/// One option order's answer to the permuted question.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct PermuteRun {
    /// The option keys in the order the model read them.
    pub order: Vec<String>,
    /// Per option key, its probability (rounded as `/v1/systemone` rounds).
    #[schema(value_type = HashMap<String, f64>)]
    pub probabilities: Value,
    /// The chosen option key.
    #[schema(value_type = String)]
    pub choice: Value,
    /// Engine time of this run (ms).
    pub latency_ms: f64,
}
