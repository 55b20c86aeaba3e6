//! The author's demo extras, built on `/v1/systemone`'s own path (admit → queue → engine), so they answer
//! exactly what `/v1/systemone` answers for the requests they make:
//!
//! - `POST /v1/systemone/permute` `{request, question, n_perm = 6, seed = 0}`: one choice question re-run under
//!   `n_perm` option orders — the given order first, then `random.Random(seed).shuffle` of it (CPython's
//!   generator, reproduced in [`crate::pyrandom`]) — as one-question requests on the same state. Answers
//!   `{runs: [{order, probabilities, choice, latency_ms}], argmax_stable, spread}`, `spread` per option being
//!   max − min of its (rounded) probability over the runs.
//! - `POST /v1/systemone/separate`: every question in its own request on the same state; answers merged in
//!   request order, `input_tokens` summed, `output_tokens` counted on the merged answers.
//!
//! The parts are submitted together, so they share engine passes and the prepared-state cache; `x_latency_ms`
//! is the time from submitting the first part to the last answer.

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::post;
use kev_contract::{ContractError, ErrorDetail, LocItem, ResponseBody};
use serde_json::{Map, Value, json};

use crate::error::ApiError;
use crate::http::{error_response, json_response};
use crate::pyrandom::{PyRandom, words_of_decimal};
use crate::{App, Decider};

/// Most option orders one permute request may ask for (the author's bound).
pub const MAX_PERMUTATIONS: u64 = 64;

/// The routes, merged into the `/v1` router (so they sit behind the same bearer key).
pub(crate) fn routes<D: Decider>() -> Router<Arc<App<D>>> {
    Router::new()
        .route("/v1/systemone/permute", post(permute::<D>))
        .route("/v1/systemone/separate", post(separate::<D>))
}

/// One FastAPI validation error under `body`.
fn invalid(loc: &[&str], kind: &str, msg: &str, input: Value, ctx: Option<Value>) -> ErrorDetail {
    let mut full = vec![LocItem::Key("body".into())];
    full.extend(loc.iter().map(|l| LocItem::Key((*l).into())));
    ErrorDetail {
        kind: kind.into(),
        loc: full,
        msg: msg.into(),
        input,
        ctx,
    }
}

/// The body as Python's `json.loads` reads it; a malformed one gets the contract's validation error (or
/// its unreadable-body error).
fn parse_json(bytes: &[u8]) -> Result<Value, ApiError> {
    Ok(kev_contract::python_loads(bytes)?)
}

/// Admit one request body and wait for its answer: the response and the engine's compute time.
async fn answer<D: Decider>(
    app: &Arc<App<D>>,
    bytes: Vec<u8>,
    rid: &str,
) -> Result<(ResponseBody, f64), ApiError> {
    // As `/v1/systemone`: a queue slot before any work, then admission, then the engine.
    let slot = app.queue.reserve()?;
    let decider = Arc::clone(&app.decider);
    let admission = tokio::task::spawn_blocking(move || decider.admit(&bytes))
        .await
        .map_err(|_| ApiError::internal())??;
    let ticket = app.queue.submit(slot, admission.job, admission.tokens)?;
    let answered = app.queue.answer(ticket, rid).await?;
    let ms = (answered.compute.as_secs_f64() * 10_000.0).round() / 10.0;
    Ok((answered.body, ms))
}

/// Answer several bodies together (all submitted before any is awaited).
async fn answer_all<D: Decider>(
    app: &Arc<App<D>>,
    bodies: Vec<Vec<u8>>,
    rid: &str,
) -> Result<Vec<(ResponseBody, f64)>, ApiError> {
    let handles: Vec<_> = bodies
        .into_iter()
        .map(|b| {
            let app = Arc::clone(app);
            let rid = rid.to_string();
            tokio::spawn(async move { answer(&app, b, &rid).await })
        })
        .collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(h.await.map_err(|_| ApiError::internal())??);
    }
    Ok(out)
}

/// The readiness checks `/v1/systemone` makes, and the body, decoded as its `Content-Encoding` says.
async fn accept<D: Decider>(
    app: &Arc<App<D>>,
    headers: &HeaderMap,
    body: Body,
) -> Result<Vec<u8>, ApiError> {
    if app.draining.load(std::sync::atomic::Ordering::SeqCst) {
        return Err(ApiError::draining());
    }
    if !app.is_ready() {
        return Err(ApiError::not_ready());
    }
    let codings = crate::http::content_codings(headers)?;
    let raw = crate::http::read_body(body, app.config.max_body).await?;
    let max = app.config.max_body;
    tokio::task::spawn_blocking(move || crate::http::decode_body(raw, &codings, max))
        .await
        .map_err(|_| ApiError::internal())?
}

/// The request with only question `id` (its value replaced by `question`).
fn with_one_question(request: &Map<String, Value>, id: &str, question: Value) -> Vec<u8> {
    let mut one = request.clone();
    let mut qs = Map::new();
    qs.insert(id.to_string(), question);
    one.insert("questions".into(), Value::Object(qs));
    serde_json::to_vec(&Value::Object(one)).unwrap_or_default()
}

/// A truncating server's marks, as one part carries them (each part read the same state).
const TRUNCATION_MARKS: [&str; 3] = ["x_truncated", "x_state_tokens", "x_state_tokens_used"];

fn respond(result: Result<Value, ApiError>, request_id: &str) -> Response {
    match result {
        Ok(v) => json_response(StatusCode::OK, &v),
        Err(e) => error_response(e, request_id),
    }
}

async fn separate<D: Decider>(
    State(app): State<Arc<App<D>>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let rid = crate::http::request_id(&headers);
    respond(separate_body(&app, &headers, body, &rid).await, &rid)
}

async fn separate_body<D: Decider>(
    app: &Arc<App<D>>,
    headers: &HeaderMap,
    body: Body,
    rid: &str,
) -> Result<Value, ApiError> {
    let bytes = accept(app, headers, body).await?;
    // The whole request is admitted first: a bad one gets exactly `/v1/systemone`'s error.
    let decider = Arc::clone(&app.decider);
    let check = bytes.clone();
    tokio::task::spawn_blocking(move || decider.admit(&check).map(|_| ()))
        .await
        .map_err(|_| ApiError::internal())??;
    // Admitted, so an object with a `questions` object; anything else is a fault of ours.
    let request = match parse_json(&bytes)? {
        Value::Object(m) => m,
        _ => return Err(ApiError::internal()),
    };
    let questions = match request.get("questions") {
        Some(Value::Object(q)) => q.clone(),
        _ => return Err(ApiError::internal()),
    };
    let bodies = questions
        .iter()
        .map(|(id, q)| with_one_question(&request, id, q.clone()))
        .collect();
    let started = Instant::now();
    let parts = answer_all(app, bodies, rid).await?;
    let elapsed = (started.elapsed().as_secs_f64() * 10_000.0).round() / 10.0;
    let mut answers = Map::new();
    let mut input = 0;
    let mut output = 0;
    for (part, _) in &parts {
        if let Some(a) = part.answers().as_object() {
            for (k, v) in a {
                answers.insert(k.clone(), v.clone());
            }
        }
        input += part.usage().input_tokens;
        output += part.usage().output_tokens;
    }
    let answers = Value::Object(answers);
    let output = app.decider.output_tokens(&answers).unwrap_or(output);
    let Some((first, _)) = parts.first() else {
        return Err(ApiError::internal());
    };
    let mut out = ResponseBody::new(first.model(), answers, input, output);
    for k in TRUNCATION_MARKS {
        if let Some(v) = first.extension(k) {
            out = out.extra(k, v.clone());
        }
    }
    Ok(out.extra("x_latency_ms", json!(elapsed)).to_value())
}

async fn permute<D: Decider>(
    State(app): State<Arc<App<D>>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let rid = crate::http::request_id(&headers);
    respond(permute_body(&app, &headers, body, &rid).await, &rid)
}

/// The envelope `{request, question, n_perm, seed}`, checked as pydantic checks the author's model.
struct Permute {
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

fn parse_permute(v: Value) -> Result<Permute, ApiError> {
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
            Ok(Permute {
                request,
                question,
                n_perm,
                seed,
            })
        }
        _ => Err(ContractError::Invalid(errors).into()),
    }
}

async fn permute_body<D: Decider>(
    app: &Arc<App<D>>,
    headers: &HeaderMap,
    body: Body,
    rid: &str,
) -> Result<Value, ApiError> {
    let bytes = accept(app, headers, body).await?;
    let p = parse_permute(parse_json(&bytes)?)?;
    let inner = serde_json::to_vec(&Value::Object(p.request.clone())).unwrap_or_default();
    let decider = Arc::clone(&app.decider);
    tokio::task::spawn_blocking(move || decider.admit(&inner).map(|_| ()))
        .await
        .map_err(|_| ApiError::internal())?
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
    let parts = answer_all(app, bodies, rid).await?;
    let mut runs = Vec::new();
    for (order, (body, ms)) in orders.into_iter().zip(&parts) {
        let a = &body.answers()[&p.question];
        runs.push(PermuteRun {
            order,
            probabilities: a["probabilities"].clone(),
            choice: a["choice"].clone(),
            latency_ms: *ms,
        });
    }
    let spread: Map<String, Value> = keys
        .iter()
        .map(|k| {
            let values = parts
                .iter()
                .filter_map(|(b, _)| b.answers()[&p.question]["probabilities"][k].as_f64());
            let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
                (lo.min(v), hi.max(v))
            });
            (k.clone(), json!(hi - lo))
        })
        .collect();
    let argmax_stable = runs.windows(2).all(|w| w[0].choice == w[1].choice);
    let first = parts.first().map(|(b, _)| b);
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
