//! The request and answer shapes the API document names beyond the wire types (`utoipa::ToSchema`), and
//! the examples it shows: what each handler's `#[utoipa::path]` declares its bodies with.

use kev_contract::Usage;
use kev_contract::wire::Request;
use serde_json::{Value, json};

/// `POST /v1/systemone/permute`: one choice question of a request re-run under several option orders.
#[derive(utoipa::ToSchema)]
pub struct PermuteRequest {
    /// A `/v1/systemone` request.
    pub request: Request,
    /// Id of a choice question of the request.
    pub question: String,
    /// Option orders to try (the given one counts; at most `MAX_PERMUTATIONS`, 64).
    #[schema(minimum = 1, maximum = 64, default = 6)]
    pub n_perm: u64,
    /// Seed of Python's `random.Random`; any integer (its absolute value seeds, as in CPython).
    #[schema(default = 0)]
    pub seed: i64,
}

/// `POST /v1/systemone/batch`: independent requests in one call — `requests`, or the shorthand `states` with
/// one `questions` object for all of them (send one of the two).
#[derive(utoipa::ToSchema)]
pub struct BatchRequest {
    /// Echoed in the answer; also the `model` of every entry that has none (default `kev-latest`).
    #[schema(default = "kev-latest")]
    pub model: Option<String>,
    /// `/v1/systemone` requests (1 to `--max-batch-requests`, default 256).
    pub requests: Option<Vec<Request>>,
    /// Shorthand: one request per state, each asking `questions`.
    #[schema(value_type = Option<Vec<Object>>)]
    pub states: Option<Vec<Value>>,
    /// With `states`: the questions every state is asked.
    #[schema(value_type = Option<Object>)]
    pub questions: Option<Value>,
    /// The `x_logits` of every entry that has none.
    pub x_logits: Option<bool>,
}

/// `POST /v1/systemone/batch`'s answer.
#[derive(utoipa::ToSchema)]
pub struct BatchResponse {
    /// The batch's `model`, echoed.
    pub model: String,
    /// One per entry, in input order: the body `/v1/systemone` answers for it alone, or `{status, error}` with
    /// the status and body it alone would have been refused with.
    #[schema(value_type = Vec<Object>)]
    pub results: Vec<Value>,
    /// Summed over the answered entries.
    pub usage: Usage,
    /// From submitting the entries to the last answer (ms).
    pub x_latency_ms: f64,
}

/// `POST /v1/systemone/states`: a state to pin.
#[derive(utoipa::ToSchema)]
pub struct PinRequest {
    /// Echoed nowhere; checked as `/v1/systemone` checks it.
    pub model: Option<String>,
    /// The document, as a `/v1/systemone` request would send it.
    #[schema(value_type = Object)]
    pub state: Value,
    /// Seconds to keep it (1 to 86,400; default 3,600).
    #[schema(minimum = 1, maximum = 86400, default = 3600)]
    pub ttl_s: Option<u64>,
}

/// A pinned state: name it as `x_state_id` in a `/v1/systemone` request to run only the questions.
#[derive(utoipa::ToSchema)]
pub struct PinnedState {
    /// The id to send as `x_state_id`.
    pub id: String,
    /// The state's tokens.
    pub tokens: u64,
    /// Bytes it holds of the pinned-state budget.
    pub bytes: u64,
    /// When it is dropped (Unix seconds).
    pub expires_at: u64,
    /// Whether its prefix has run.
    pub ready: bool,
}

/// `GET /v1/models`.
#[derive(utoipa::ToSchema)]
pub struct ModelList {
    /// One card per name the server answers to (`kev-latest`, `jev-latest`, the size, aliases).
    pub models: Vec<ModelCard>,
}

/// A model card: the SystemOne fields and kev's `x_` extensions.
#[derive(utoipa::ToSchema)]
pub struct ModelCard {
    /// The name clients send as `model`.
    pub name: String,
    /// What the model is and how it is served.
    pub description: String,
    /// `YYYY-MM-DD`.
    pub release_date: String,
    /// The calibration in force (`kev serve --calibration`); null when the head's stored temperature is used.
    #[schema(value_type = Option<Object>)]
    pub x_calibration: Option<Value>,
    /// Whether date facts are added to states (`--date-facts` / `KEV_DATE_FACTS=1`).
    pub x_date_facts: bool,
    /// Compute arm (`fp32`, `bf16`, `int8`).
    pub x_precision: String,
    /// Weight form (`merged`, `exact`).
    pub x_weights: String,
}

/// `GET /health`.
#[derive(utoipa::ToSchema)]
pub struct Health {
    /// Always `ok` while the process serves.
    pub status: String,
}

/// `GET /ready` when ready.
#[derive(utoipa::ToSchema)]
pub struct Ready {
    /// `ready`.
    pub status: String,
    /// Requests waiting for the engine.
    pub queue_depth: u64,
    /// Most requests that may wait.
    pub queue_capacity: u64,
    /// How long the oldest waiting request has waited (ms).
    pub oldest_wait_ms: u64,
    /// Longest a request may wait before it is answered 529 (ms).
    pub queue_deadline_ms: u64,
    /// Requests the engine is running.
    pub running: u64,
    /// Tokens of the requests in flight.
    pub inflight_tokens: u64,
}

/// `/ready`'s figures (with `status` when it is not null).
pub(crate) fn ready_figures(status: Value) -> Value {
    let mut v = json!({
        "queue_depth": 64,
        "queue_capacity": 64,
        "oldest_wait_ms": 60_000,
        "queue_deadline_ms": 60_000,
        "running": 2,
        "inflight_tokens": 8192,
    });
    if !status.is_null()
        && let Some(m) = v.as_object_mut()
    {
        let mut out = serde_json::Map::new();
        out.insert("status".into(), status);
        out.extend(m.iter().map(|(k, v)| (k.clone(), v.clone())));
        out.insert("queue_depth".into(), json!(0));
        out.insert("oldest_wait_ms".into(), json!(0));
        out.insert("running".into(), json!(0));
        out.insert("inflight_tokens".into(), json!(0));
        return Value::Object(out);
    }
    v
}

pub(crate) fn request_example() -> Value {
    json!({
        "model": "kev-latest",
        "state": "Hi, I was charged twice for my March invoice. Can you refund the duplicate?",
        "questions": {
            "refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"},
            "kind": {
                "type": "choice",
                "instructions": "Which team should handle this?",
                "criteria": {"Billing": "payments, invoices, refunds", "Support": null, "Sales": null}
            },
            "urgency": {"type": "score", "instructions": "How urgent is it?", "criteria": ["low", "medium", "high"]}
        }
    })
}

pub(crate) fn batch_example() -> Value {
    json!({
        "model": "kev-latest",
        "states": [
            "Hi, I was charged twice for my March invoice. Can you refund the duplicate?",
            "The app crashes when I open settings.",
        ],
        "questions": {"refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"}},
    })
}

pub(crate) fn batch_response_example() -> Value {
    json!({
        "model": "kev-latest",
        "results": [
            {"model": "kev-latest", "answers": {"refund": {"type": "noul", "noul": 0.9502}},
             "usage": {"input_tokens": 41, "output_tokens": 12}, "x_latency_ms": 20.3},
            {"model": "kev-latest", "answers": {"refund": {"type": "noul", "noul": 0.0311}},
             "usage": {"input_tokens": 33, "output_tokens": 12}, "x_latency_ms": 18.9},
        ],
        "usage": {"input_tokens": 74, "output_tokens": 24},
        "x_latency_ms": 21.0
    })
}

pub(crate) fn response_example() -> Value {
    json!({
        "model": "kev-latest",
        "answers": {
            "refund": {"type": "noul", "noul": 0.9731},
            "kind": {
                "type": "choice",
                "choice": "Billing",
                "confidence": 0.9412,
                "probabilities": {"Billing": 0.9412, "Support": 0.0511, "Sales": 0.0077}
            },
            "urgency": {
                "type": "score",
                "score": 1.2,
                "legend": {"0": "low", "1": "medium", "2": "high"},
                "probabilities": {"0": 0.1, "1": 0.6, "2": 0.3},
                "confidence": 0.6
            }
        },
        "usage": {"input_tokens": 98, "output_tokens": 104},
        "x_latency_ms": 41.7
    })
}

pub(crate) fn permute_example() -> Value {
    json!({
        "runs": [
            {"order": ["Billing", "Support", "Sales"], "probabilities": {"Billing": 0.9412, "Support": 0.0511, "Sales": 0.0077}, "choice": "Billing", "latency_ms": 12.4},
            {"order": ["Sales", "Billing", "Support"], "probabilities": {"Sales": 0.0102, "Billing": 0.9325, "Support": 0.0573}, "choice": "Billing", "latency_ms": 11.9},
            {"order": ["Support", "Sales", "Billing"], "probabilities": {"Support": 0.0622, "Sales": 0.0091, "Billing": 0.9287}, "choice": "Billing", "latency_ms": 12.1}
        ],
        "argmax_stable": true,
        "spread": {"Billing": 0.0125, "Support": 0.0111, "Sales": 0.0025}
    })
}

pub(crate) fn models_example() -> Value {
    json!({"models": [{
        "name": "kev-latest",
        "description": "Kev pointer head on Qwen/Qwen3.5-4B-Base, serving merged weights (bf16 compute) at temperature 1.00",
        "release_date": "2026-10-01",
        "x_calibration": null,
        "x_date_facts": false,
        "x_precision": "bf16",
        "x_weights": "merged"
    }]})
}
