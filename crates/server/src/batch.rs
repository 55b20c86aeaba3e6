//! `POST /v1/systemone/batch`: independent `/v1/systemone` requests in one call, through the one admission
//! pipeline (`crate::pipeline`) as a route whose parts are admitted each on its own.
//!
//! The body is `{model?, requests: [request, ...], x_logits?}`, or the shorthand
//! `{model?, states: [state, ...], questions: {...}, x_logits?}` (one request per state, every one asking the same
//! questions). An entry without its own `model` (or `x_logits`) takes the batch's. The answer is
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
use kev_contract::ContractError;
use serde_json::{Map, Value, json};

use crate::error::ApiError;
use crate::pipeline::{Admitted, Answers, Route, handle, ms};
use crate::wire::{invalid, parse_json};
use crate::{App, Decider};

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
    let model = match fields.get("model") {
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
    };
    let list = |key: &str, errors: &mut Vec<_>| -> Option<Vec<Value>> {
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
    };
    let has = |k: &str| fields.contains_key(k);
    let bodies: Option<Vec<Value>> = match (has("requests"), has("states")) {
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
        (true, false) => list("requests", &mut errors),
        (false, true) => {
            let states = list("states", &mut errors);
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
    };
    let Some(mut bodies) = bodies.filter(|_| errors.is_empty()) else {
        return Err(ContractError::Invalid(errors).into());
    };
    // What an entry does not say, the batch says for it.
    let inherited: Vec<(&str, &Value)> = ["model", kev_decide::LOGITS_FIELD]
        .into_iter()
        .filter_map(|k| fields.get(k).map(|v| (k, v)))
        .collect();
    for body in &mut bodies {
        if let Value::Object(entry) = body {
            for (k, v) in &inherited {
                if !entry.contains_key(*k) {
                    entry.insert((*k).to_owned(), (*v).clone());
                }
            }
        }
    }
    Ok((bodies, model.unwrap_or_else(|| DEFAULT_MODEL.to_owned())))
}

impl<D: Decider> Route<D> for Batch {
    type Plan = BatchPlan;

    fn split(&self, _: &D, bytes: Vec<u8>) -> Result<(Vec<Vec<u8>>, BatchPlan), ApiError> {
        let (bodies, model) = entries(parse_json(&bytes)?)?;
        // `compact_json` writes kept lone surrogates back as `\uXXXX`: each entry reads as it was sent.
        let bodies: Vec<Vec<u8>> = bodies
            .iter()
            .map(|b| kev_contract::compact_json(b).into_bytes())
            .collect();
        let plan = BatchPlan {
            entries: bodies.len(),
            model,
        };
        Ok((bodies, plan))
    }

    /// Each entry may name a pinned state of the requester's (`x_state_id`), resolved entry by entry: an entry
    /// whose pin is missing (or another key's) is refused in its place, as it would be alone.
    fn admit(
        &self,
        decider: &D,
        owner: Option<&str>,
        bodies: &[Vec<u8>],
    ) -> Result<Admitted<D::Job>, ApiError> {
        let mut unresolved = Vec::new();
        let resolved: Vec<Vec<u8>> = bodies
            .iter()
            .enumerate()
            .map(
                |(i, b)| match crate::state_ref::resolve(decider, owner, b.clone()) {
                    Ok(b) => b,
                    Err(e) => {
                        unresolved.push((i, e));
                        b.clone()
                    }
                },
            )
            .collect();
        let mut admitted = decider.admit_batch(&resolved)?;
        for (i, e) in unresolved {
            admitted[i] = Err(e);
        }
        Ok(admitted)
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
