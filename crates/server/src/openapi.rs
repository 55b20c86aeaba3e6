//! The API document (`GET /openapi.json`, committed as `crates/server/openapi.json`), derived from the code:
//! each endpoint's path, method, summary, request and 200 answer from the `#[utoipa::path]` declared beside its
//! handler (the same declarations `http::router` mounts, one list: `http::Endpoint`), schemas from the wire
//! types (`utoipa::ToSchema`), every error response from the status table ([`ErrorKind::row`]) with an example
//! body built by the code that answers it.
//!
//! The committed file must equal [`json`]; `tests/openapi.rs` fails on drift. Regenerate with
//! `KEV_WRITE_OPENAPI=1 cargo test -p kev-server --test integration openapi::`.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use kev_contract::wire::{
    Answer, Question, Request, Response, TypedBody, ValidationBody, ValidationItem,
};
use kev_contract::{ContractError, ErrorBody, ErrorKind, ErrorType, TypedError, Usage};
use serde_json::{Value, json};
use utoipa::OpenApi;
use utoipa::openapi::example::ExampleBuilder;
use utoipa::openapi::path::{ParameterBuilder, ParameterIn};
use utoipa::openapi::response::ResponseBuilder;
use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Type};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{ContentBuilder, Ref, RefOr, Required, Schema};

use crate::error::ApiError;
use crate::http::Endpoint;
use crate::tools::{PermuteResponse, PermuteRun};

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

#[derive(OpenApi)]
#[openapi(
    info(
        title = "kev — SystemOne API for the Kev decision model",
        version = "1.0",
        description = "Kev returns a calibrated probability for every option of typed questions about a state. \
                       Compatible with the SystemOne API (POST /v1/systemone)."
    ),
    components(schemas(
        Request,
        Question,
        Response,
        Answer,
        Usage,
        ValidationBody,
        ValidationItem,
        TypedBody,
        TypedError,
        ErrorType,
        BatchRequest,
        BatchResponse,
        PinRequest,
        PinnedState,
        PermuteRequest,
        PermuteResponse,
        PermuteRun,
        ModelList,
        ModelCard,
        Health,
        Ready
    ))
)]
struct Schemas;

/// The document as committed and served: pretty JSON with a final newline.
pub fn json() -> &'static str {
    static DOC: LazyLock<String> = LazyLock::new(|| {
        let mut text = document()
            .to_pretty_json()
            .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
        text.push('\n');
        text
    });
    &DOC
}

/// The errors every decision route answers (the admission pipeline's, and the model's refusals).
const DECIDE_ERRORS: [ErrorKind; 17] = [
    ErrorKind::Unparseable,
    ErrorKind::BadBody,
    ErrorKind::AuthInvalid,
    ErrorKind::AuthMissing,
    ErrorKind::BodyTimeout,
    ErrorKind::RequestTimeout,
    ErrorKind::BodyTooLarge,
    ErrorKind::TooMuchWork,
    ErrorKind::UnsupportedMedia,
    ErrorKind::Validation,
    ErrorKind::OverLimit,
    ErrorKind::QueueFull,
    ErrorKind::KeyLimit,
    ErrorKind::Internal,
    ErrorKind::NotReady,
    ErrorKind::Unavailable,
    ErrorKind::Overloaded,
];

/// The API document: every endpoint as declared beside its handler, completed with the errors it answers.
pub fn document() -> utoipa::openapi::OpenApi {
    let mut doc = Schemas::openapi();
    let mut paths = utoipa::openapi::path::Paths::new();
    for e in Endpoint::ALL {
        let (path, methods, mut op) = e.declared();
        let errors: &[ErrorKind] = match e {
            _ if e.decides() => &DECIDE_ERRORS,
            Endpoint::Models => &[ErrorKind::AuthInvalid, ErrorKind::AuthMissing],
            Endpoint::PinGet | Endpoint::PinDelete => &[
                ErrorKind::AuthInvalid,
                ErrorKind::AuthMissing,
                ErrorKind::NotFound,
            ],
            Endpoint::Ready => &[
                ErrorKind::NotReady,
                ErrorKind::Unavailable,
                ErrorKind::Saturated,
            ],
            _ => &[],
        };
        add_errors(&mut op, errors);
        if e.decides() {
            op.parameters = Some(vec![
                request_id_header().into(),
                ParameterBuilder::new()
                    .name("Content-Encoding")
                    .parameter_in(ParameterIn::Header)
                    .required(Required::False)
                    .description(Some(
                        "identity, gzip, zstd or deflate; stacked codings are decoded in order",
                    ))
                    .schema(Some(ObjectBuilder::new().schema_type(Type::String)))
                    .build()
                    .into(),
            ]);
        }
        if path.starts_with("/v1/") {
            // Bearer auth when the server has keys (KEV_API_KEY, --api-keys); open otherwise.
            op.security = Some(vec![
                SecurityRequirement::default(),
                SecurityRequirement::new("bearer", Vec::<String>::new()),
            ]);
        }
        paths.add_path_operation(path, methods, op);
    }
    doc.paths = paths;
    if let Some(components) = doc.components.as_mut() {
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "`Authorization: Bearer <key>` on every /v1 route when the server has a key (KEV_API_KEY) or named keys (--api-keys); missing → 403, unknown → 401",
                    ))
                    .build(),
            ),
        );
    }
    doc
}

fn request_id_header() -> utoipa::openapi::path::Parameter {
    ParameterBuilder::new()
        .name("x-typesafe-request-id")
        .parameter_in(ParameterIn::Header)
        .required(Required::False)
        .description(Some(
            "Echoed back; generated (32 hex digits) when absent. A 500 names it.",
        ))
        .schema(Some(ObjectBuilder::new().schema_type(Type::String)))
        .build()
}

/// The error responses of `errors`: kinds sharing a status share its response (one schema, or a choice of
/// two), one example each.
fn add_errors(op: &mut utoipa::openapi::path::Operation, errors: &[ErrorKind]) {
    let mut by_status: BTreeMap<u16, Vec<ErrorKind>> = BTreeMap::new();
    for &k in errors {
        by_status.entry(k.status()).or_default().push(k);
    }
    for (status, kinds) in by_status {
        let description = kinds
            .iter()
            .map(|k| describe(*k))
            .collect::<Vec<_>>()
            .join("; or ");
        let validation = kinds.contains(&ErrorKind::Validation);
        let typed = kinds.iter().any(|k| *k != ErrorKind::Validation);
        let schema: RefOr<Schema> = match (validation, typed) {
            (true, true) => OneOfBuilder::new()
                .item(Ref::from_schema_name("ValidationError"))
                .item(Ref::from_schema_name("Error"))
                .into(),
            (true, false) => Ref::from_schema_name("ValidationError").into(),
            _ => Ref::from_schema_name("Error").into(),
        };
        let examples = kinds.iter().map(|k| {
            (
                format!("{k:?}"),
                ExampleBuilder::new()
                    .summary(describe(*k))
                    .value(Some(error_example(*k)))
                    .build(),
            )
        });
        op.responses.responses.insert(
            status.to_string(),
            ResponseBuilder::new()
                .description(description)
                .content(
                    "application/json",
                    ContentBuilder::new()
                        .schema(Some(schema))
                        .examples_from_iter(examples)
                        .build(),
                )
                .build()
                .into(),
        );
    }
}

/// What each kind means to a client.
fn describe(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::Unparseable => "The body could not be parsed at all",
        ErrorKind::BadBody => "The body could not be read or decoded (Content-Encoding)",
        ErrorKind::UnknownModel => {
            "`model` names no served adapter (api_usage_error; only with --strict-models)"
        }
        ErrorKind::AuthInvalid => "Wrong API key (authentication_error)",
        ErrorKind::AuthMissing => "Missing API key (authentication_error)",
        ErrorKind::NotFound => "No such route",
        ErrorKind::MethodNotAllowed => "The route does not take this method",
        ErrorKind::BodyTimeout => "The body did not arrive in time",
        ErrorKind::RequestTimeout => {
            "The request took longer than the server's request timeout; it is stopped before its next pass"
        }
        ErrorKind::BodyTooLarge => "Body over the size limit (after decompression)",
        ErrorKind::TooMuchWork => {
            "Over a per-request work cap (questions, options, input tokens): names the field, limit and value"
        }
        ErrorKind::UnsupportedMedia => "Unsupported Content-Encoding, or a multipart body",
        ErrorKind::UriTooLong => "The request target is over the server's limit",
        ErrorKind::HeadTooLarge => {
            "The request head (header count or bytes) is over the server's limits"
        }
        ErrorKind::Validation => "Schema violation (pydantic's detail list)",
        ErrorKind::OverLimit => {
            "Over a token limit of the contract (state or row), or a question the route cannot use"
        }
        ErrorKind::QueueFull => "Queue full (rate_limit_error); see Retry-After",
        ErrorKind::KeyLimit => {
            "The API key is over one of its own limits (rate_limit_error, names the key and limit); see Retry-After"
        }
        ErrorKind::Internal => {
            "Server fault (api_error): names the request id; the cause is logged"
        }
        ErrorKind::NotReady => "The model is loading or warming up; see Retry-After",
        ErrorKind::Unavailable => "The server is stopping",
        ErrorKind::Saturated => "Saturated: new requests would be shed; the queue's figures follow",
        ErrorKind::Overloaded => {
            "Overloaded: waited past the queue deadline (overloaded_error); see Retry-After"
        }
    }
}

/// An example body of each kind, made by the code that answers it where the server holds that code.
fn error_example(kind: ErrorKind) -> Value {
    let typed = |message: &str| ErrorBody::typed(kind, message).to_value();
    match kind {
        ErrorKind::Unparseable => {
            ApiError::from(ContractError::Unparseable { reason: "example" }).body()
        }
        ErrorKind::BadBody => ApiError::bad_body(
            "the request body is not valid gzip data (content-encoding)",
        )
        .body(),
        // Written by kev-decide (the server does not know the adapters).
        ErrorKind::UnknownModel => typed("Unknown model: kev-nonexistent"),
        ErrorKind::AuthInvalid => ApiError::auth_invalid().body(),
        ErrorKind::AuthMissing => ApiError::auth_missing().body(),
        ErrorKind::NotFound => ApiError::not_found().body(),
        ErrorKind::MethodNotAllowed => typed("Method Not Allowed"),
        ErrorKind::BodyTimeout => ApiError::body_timeout().body(),
        ErrorKind::RequestTimeout => {
            typed("the request took longer than the server's request timeout")
        }
        ErrorKind::BodyTooLarge => ApiError::too_large(8 << 20).body(),
        // Written by kev-decide (the server does not know the caps).
        ErrorKind::TooMuchWork => ErrorBody::typed(
            kind,
            "too much work in one request: questions is 2000, over the limit of 1024 (questions in the request); \
             split the questions across requests",
        )
        .with("field", json!("questions"))
        .with("limit", json!(1024))
        .with("value", json!(2000))
        .to_value(),
        ErrorKind::UriTooLong => {
            typed("the request target is 9000 bytes, over the limit of 8192")
        }
        ErrorKind::HeadTooLarge => {
            typed("the request has 101 header fields, over the limit of 100")
        }
        ErrorKind::UnsupportedMedia => ApiError::unsupported_media(
            "unsupported Content-Encoding \"br\": send identity, gzip, zstd or deflate (stacked codings are decoded in order)",
        )
        .body(),
        ErrorKind::Validation => match kev_contract::parse_request(br#"{"state": "x"}"#) {
            Err(e) => ApiError::from(e).body(),
            Ok(_) => Value::Null,
        },
        // Written by kev-tokenize (the server does not tokenize).
        ErrorKind::OverLimit => typed(
            "state is 70,000 tokens, over the 65,536-token limit (the <state> token included): shorten the \
             document or split it across requests; or start the server with KEV_TRUNCATE_STATES=1 to read only \
             its first 65,536 tokens (responses then say truncated: true)",
        ),
        ErrorKind::QueueFull => ApiError::queue_full(64, 1).body(),
        ErrorKind::KeyLimit => ApiError::key_limited("alice", "5 requests per second", 1).body(),
        ErrorKind::Internal => ApiError::internal()
            .for_request("4f3c2a9e0b8d4e6f9a1b2c3d4e5f6a7b")
            .body(),
        ErrorKind::NotReady => ApiError::not_ready().body(),
        ErrorKind::Unavailable => ApiError::draining().body(),
        ErrorKind::Saturated => ApiError::saturated(&ready_figures(Value::Null)).body(),
        ErrorKind::Overloaded => ApiError::overloaded(60_000, 1).body(),
    }
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
