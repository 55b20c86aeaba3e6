//! `POST /v1/systemone/batch`: independent `/v1/systemone` requests in one call, through the one admission
//! pipeline (`crate::pipeline`) as a route whose parts are admitted each on its own.
//!
//! The body is `{model?, requests: [request, ...], x_logits?}`, or the shorthand
//! `{model?, states: [state, ...], questions: {...}, x_logits?}` (one request per state, every one asking the same
//! questions). An entry without its own `model` (or `x_logits`, `x_priority`, `x_deadline_ms`) takes the batch's. The answer is
//! `{model, results: [...], usage, x_latency_ms}`, results in input order, each exactly the body
//! `/v1/systemone` answers for that entry alone (its `x_latency_ms` the engine time of its own passes) or
//! `{"status", "error"}` with the status and body that entry alone would have been refused with — one bad entry
//! never fails the others. `usage` sums the answered entries'.
//!
//! The batch takes one queue slot; its entries are submitted together and share engine passes with each other
//! and with other traffic (the scheduler packs them), and a hang-up or the request timeout stops them all.
//! Bounds: the batch's own caps (`Caps::max_batch_requests`, `Caps::max_batch_input_tokens`: 413 naming the
//! bound, nothing run) beside each entry's per-request caps, and the body limit. Answers do not depend on
//! batch neighbours: every row of a pass is computed independently of the others (tested byte for byte).

use std::sync::Arc;

use axum::extract::State;
use axum::response::Response;
use kev_contract::{ContractError, ErrorDetail};
use serde_json::{Map, Value, json};

use crate::error::ApiError;
use crate::pipeline::{Admitted, Answers, Route, handle, ms};
use crate::wire::{invalid, parse_json};
use crate::{App, Body, Decider};

/// The fields an entry takes from the batch when it does not say them itself.
const INHERITED: [&str; 4] = [
    "model",
    kev_decide::LOGITS_FIELD,
    kev_decide::urgency::PRIORITY_FIELD,
    kev_decide::urgency::DEADLINE_FIELD,
];

/// The model name a batch without one echoes (as `/v1/systemone` does).
const DEFAULT_MODEL: &str = "kev-latest";

/// Answer several independent requests in one call
#[utoipa::path(
    post,
    path = "/v1/systemone/batch",
    request_body(content = crate::schemas::BatchRequest, example = json!(crate::schemas::batch_example())),
    responses((status = 200, description = "One result per entry, in input order: its /v1/systemone answer, or its status and error",
        body = crate::schemas::BatchResponse, example = json!(crate::schemas::batch_response_example()))),
)]
pub(crate) async fn batch<D: Decider>(
    State(app): State<Arc<App<D>>>,
    request: axum::extract::Request,
) -> Response {
    handle(app, Batch, request).await
}

/// `/v1/systemone/batch`: one part per entry, each admitted on its own.
#[derive(Clone, Copy)]
struct Batch;

/// What the merge needs: how many entries, and the batch's model name.
struct BatchPlan {
    entries: usize,
    model: String,
}

/// The entries of a batch body as `/v1/systemone` bodies, and the batch's model name; 422 for a body that is
/// not a batch.
fn entries(v: Value) -> Result<(Vec<Value>, String), ApiError> {
    let object_error = |input: Value| {
        ApiError::from(ContractError::Invalid(vec![invalid(
            &[],
            "model_attributes_type",
            "Input should be a valid dictionary or object to extract fields from",
            input,
            None,
        )]))
    };
    let Value::Object(fields) = v else {
        return Err(object_error(v));
    };
    let mut errors = Vec::new();
    let model = batch_model(&fields, &mut errors);
    check_logits(&fields, &mut errors);
    let bodies = entry_bodies(&fields, &mut errors);
    let Some(mut bodies) = bodies.filter(|_| errors.is_empty()) else {
        return Err(ContractError::Invalid(errors).into());
    };
    inherit(&fields, &mut bodies);
    Ok((bodies, model.unwrap_or_else(|| DEFAULT_MODEL.to_owned())))
}

/// The batch's own `model`, if it says one (a non-string one is an error).
fn batch_model(fields: &Map<String, Value>, errors: &mut Vec<ErrorDetail>) -> Option<String> {
    match fields.get("model") {
        None => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(other) => {
            errors.push(invalid(
                &["model"],
                "string_type",
                "Input should be a valid string",
                other.clone(),
                None,
            ));
            None
        }
    }
}

/// The batch's `x_logits` is the batch's own field: a bad one refuses the batch, as `/v1/systemone` refuses
/// a request with one (each entry's own is its entry's).
fn check_logits(fields: &Map<String, Value>, errors: &mut Vec<ErrorDetail>) {
    if let Some(flag) = fields.get(kev_decide::LOGITS_FIELD)
        && !flag.is_boolean()
    {
        errors.push(invalid(
            &[kev_decide::LOGITS_FIELD],
            "bool_type",
            "Input should be a valid boolean",
            flag.clone(),
            None,
        ));
    }
}

/// The non-empty list at `key`, if there is one (a list that is empty or not a list is an error).
fn list(
    fields: &Map<String, Value>,
    key: &str,
    errors: &mut Vec<ErrorDetail>,
) -> Option<Vec<Value>> {
    match fields.get(key)? {
        Value::Array(items) if items.is_empty() => {
            errors.push(invalid(
                &[key],
                "too_short",
                "List should have at least 1 item after validation, not 0",
                json!([]),
                Some(json!({"field_type": "List", "min_length": 1, "actual_length": 0})),
            ));
            None
        }
        Value::Array(items) => Some(items.clone()),
        other => {
            errors.push(invalid(
                &[key],
                "list_type",
                "Input should be a valid list",
                other.clone(),
                None,
            ));
            None
        }
    }
}

/// The entries' bodies as the batch sends them: its `requests`, or one `{state, questions}` per state.
fn entry_bodies(fields: &Map<String, Value>, errors: &mut Vec<ErrorDetail>) -> Option<Vec<Value>> {
    let has = |k: &str| fields.contains_key(k);
    match (has("requests"), has("states")) {
        (true, true) => {
            errors.push(invalid(
                &[],
                "value_error",
                "Value error, send either requests or states with questions, not both",
                Value::Object(fields.clone()),
                Some(json!({"error": {}})),
            ));
            None
        }
        (false, false) => {
            errors.push(invalid(
                &["requests"],
                "missing",
                "Field required",
                Value::Object(fields.clone()),
                None,
            ));
            None
        }
        (true, false) => list(fields, "requests", errors),
        (false, true) => {
            let states = list(fields, "states", errors);
            let questions = fields.get("questions").cloned();
            if questions.is_none() {
                errors.push(invalid(
                    &["questions"],
                    "missing",
                    "Field required",
                    Value::Object(fields.clone()),
                    None,
                ));
            }
            match (states, questions) {
                (Some(states), Some(questions)) => Some(
                    states
                        .into_iter()
                        .map(|state| json!({"state": state, "questions": questions}))
                        .collect(),
                ),
                _ => None,
            }
        }
    }
}

/// What an entry does not say, the batch says for it.
fn inherit(fields: &Map<String, Value>, bodies: &mut [Value]) {
    let inherited: Vec<(&str, &Value)> = INHERITED
        .into_iter()
        .filter_map(|k| fields.get(k).map(|v| (k, v)))
        .collect();
    for body in bodies {
        if let Value::Object(entry) = body {
            for (k, v) in &inherited {
                if !entry.contains_key(*k) {
                    entry.insert((*k).to_owned(), (*v).clone());
                }
            }
        }
    }
}

impl<D: Decider> Route<D> for Batch {
    type Plan = BatchPlan;

    fn split(
        &self,
        _: &D,
        _: Option<&str>,
        bytes: Vec<u8>,
    ) -> Result<(Vec<Body<'static>>, BatchPlan), ApiError> {
        // The batch is read once; each entry goes to admission as the value read, never written back.
        let (bodies, model) = entries(parse_json(&bytes)?)?;
        let plan = BatchPlan {
            entries: bodies.len(),
            model,
        };
        Ok((bodies.into_iter().map(Body::Value).collect(), plan))
    }

    /// Each entry on its own: one naming a pinned state (`x_state_id`) gets the requester's, and a missing one
    /// (or another key's) is refused in its place, as it would be alone.
    fn admit(
        &self,
        decider: &D,
        owner: Option<&str>,
        parts: Vec<Body<'static>>,
    ) -> Result<Admitted<D::Job>, ApiError> {
        decider.admit_batch(parts, owner)
    }

    fn independent_parts(&self) -> bool {
        true
    }

    fn merge(&self, _: &D, plan: BatchPlan, answers: Answers) -> Result<Value, ApiError> {
        let mut answered = answers.parts.into_iter();
        let mut refused = answers.refused.into_iter().peekable();
        let (mut input, mut output) = (0usize, 0usize);
        let mut results = Vec::with_capacity(plan.entries);
        for i in 0..plan.entries {
            if refused.peek().is_some_and(|(at, _)| *at == i) {
                let (_, e) = refused.next().ok_or_else(ApiError::internal)?;
                results.push(json!({"status": e.status().as_u16(), "error": e.body()}));
                continue;
            }
            let part = answered.next().ok_or_else(ApiError::internal)?;
            input += part.body.usage().input_tokens;
            output += part.body.usage().output_tokens;
            results.push(
                part.body
                    .extra("x_latency_ms", json!(ms(part.compute)))
                    .to_value(),
            );
        }
        let mut out = Map::new();
        out.insert("model".into(), Value::String(plan.model));
        out.insert("results".into(), Value::Array(results));
        out.insert(
            "usage".into(),
            json!({"input_tokens": input, "output_tokens": output}),
        );
        out.insert("x_latency_ms".into(), json!(ms(answers.elapsed)));
        Ok(Value::Object(out))
    }
}
