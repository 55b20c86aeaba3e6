//! What every route shares to read a request and write its answer: the request id, the key it was let in
//! under, FastAPI-style validation entries, Python's reading of a JSON body, JSON and error responses.

use std::sync::Arc;

use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use kev_contract::{ErrorDetail, LocItem};
use serde_json::Value;

use crate::error::ApiError;

/// The request-id header the official SDK reads (`response.request_id`).
pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-typesafe-request-id");

/// The key a request was let in under (a request extension), for the pipeline to charge its tokens to.
#[derive(Clone)]
pub(crate) struct KeyPass(pub Arc<crate::keys::Pass>);

/// The request's id as the request-id layer set or propagated it (`-` where there is none).
pub(crate) fn request_id(headers: &HeaderMap) -> String {
    headers
        .get(&REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-")
        .to_string()
}

/// An error leaving a handler: a fault is logged with its cause and answered with the request id only.
pub(crate) fn error_response(e: ApiError, request_id: &str) -> Response {
    if e.kind().is_fault() {
        tracing::error!(request_id = %request_id, cause = %e.error_body().to_value(), "internal error");
    }
    e.for_request(request_id).into_response()
}

pub(crate) fn json_response(status: StatusCode, body: &Value) -> Response {
    // `compact_json` writes kept lone surrogates back as `\uXXXX`: distinct ids stay distinct.
    let bytes = kev_contract::compact_json(body).into_bytes();
    let mut resp = (status, bytes).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// One FastAPI validation error under `body`.
pub(crate) fn invalid(
    loc: &[&str],
    kind: &str,
    msg: &str,
    input: Value,
    ctx: Option<Value>,
) -> ErrorDetail {
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
pub(crate) fn parse_json(bytes: &[u8]) -> Result<Value, ApiError> {
    Ok(kev_contract::python_loads(bytes)?)
}

/// The credentials of `Authorization: Bearer <token>`: the scheme is case-insensitive (RFC 9110 §11.1),
/// followed by one or more spaces; `None` for another scheme.
pub(crate) fn bearer_credentials(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(6)?;
    if !scheme.eq_ignore_ascii_case(b"bearer") || rest.first() != Some(&b' ') {
        return None;
    }
    let start = rest.iter().position(|&b| b != b' ').unwrap_or(rest.len());
    Some(&rest[start..])
}
