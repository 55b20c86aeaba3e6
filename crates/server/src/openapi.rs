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
use crate::schemas::{
    BatchRequest, BatchResponse, Health, ModelCard, ModelList, PermuteRequest, PinRequest,
    PinnedState, Ready, ready_figures,
};
use crate::tools::{PermuteResponse, PermuteRun};

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
const DECIDE_ERRORS: [ErrorKind; 19] = [
    ErrorKind::Unparseable,
    ErrorKind::BadBody,
    ErrorKind::AuthInvalid,
    ErrorKind::AuthMissing,
    ErrorKind::Forbidden,
    ErrorKind::BodyTimeout,
    ErrorKind::RequestTimeout,
    ErrorKind::DeadlinePassed,
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
            Endpoint::Adapters => &[
                ErrorKind::AuthInvalid,
                ErrorKind::AuthMissing,
                ErrorKind::Forbidden,
            ],
            Endpoint::AdapterAdd => &[
                ErrorKind::AuthInvalid,
                ErrorKind::AuthMissing,
                ErrorKind::Forbidden,
                ErrorKind::Conflict,
                ErrorKind::Validation,
                ErrorKind::AdapterRefused,
            ],
            Endpoint::AdapterRemove => &[
                ErrorKind::AuthInvalid,
                ErrorKind::AuthMissing,
                ErrorKind::Forbidden,
                ErrorKind::NotFound,
                ErrorKind::Conflict,
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
        ErrorKind::Forbidden => {
            "The API key may not do this (permission_error): an adapter outside its policy, or an admin route"
        }
        ErrorKind::DeadlinePassed => {
            "The request's own deadline (x_deadline_ms, X-Kev-Deadline-Ms) passed: not run if it was still waiting, stopped before its next pass if it ran"
        }
        ErrorKind::Conflict => {
            "Conflicts with what the server holds: an adapter of that name is served, the default adapter, adapters not taken live"
        }
        ErrorKind::AdapterRefused => {
            "The directory is not a Kev adapter for the served base: the same message as at start"
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
        ErrorKind::Forbidden => ApiError::adapter_forbidden("alice", "ops").body(),
        ErrorKind::DeadlinePassed => ApiError::deadline_passed(250, false).body(),
        ErrorKind::Conflict => {
            typed("an adapter named \"ops\" is already served; remove it first")
        }
        // Written by kev-decide's loader (the server does not read adapters).
        ErrorKind::AdapterRefused => typed(
            "adapter ops (/models/kev-ops): its head was trained on Qwen/Qwen3.5-0.8B-Base, the served base is Qwen/Qwen3.5-4B-Base",
        ),
    }
}
