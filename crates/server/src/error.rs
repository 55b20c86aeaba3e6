//! Every non-200 answer the server gives, and the one place that turns it into HTTP.
//!
//! Two body shapes (kev-contract §8.5): schema violations keep FastAPI's validation list
//! (`{"detail":[{"type","loc","msg","input"}]}`, built by `kev-contract`); everything else is
//! `{"detail":{"error_type": …, "message": …}}`, which the official SDK and jevcompat read.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// An error answer: status, JSON body and, for load shedding, a `Retry-After` in seconds.
#[derive(Debug, Clone)]
pub struct ApiError {
    status: StatusCode,
    body: Value,
    retry_after: Option<u64>,
    www_authenticate: bool,
}

impl ApiError {
    /// An error with a ready body (e.g. a 422 validation list from the contract).
    pub fn with_body(status: u16, body: Value) -> Self {
        ApiError {
            status: StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            body,
            retry_after: None,
            www_authenticate: false,
        }
    }

    /// `{"detail":{"error_type","message"}}` with the given status.
    pub fn typed(status: StatusCode, error_type: &str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            body: json!({"detail": {"error_type": error_type, "message": message.into()}}),
            retry_after: None,
            www_authenticate: false,
        }
    }

    /// 403: no `Authorization: Bearer` header at all.
    pub fn auth_missing() -> Self {
        let mut e = Self::typed(
            StatusCode::FORBIDDEN,
            "authentication_error",
            "Must supply an API key! Send Authorization: Bearer <key>.",
        );
        e.www_authenticate = true;
        e
    }

    /// 401: a bearer key that is not the server's.
    pub fn auth_invalid() -> Self {
        let mut e = Self::typed(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "Invalid API key. Send Authorization: Bearer <key> with the server's key.",
        );
        e.www_authenticate = true;
        e
    }

    /// 429: the admission queue is full.
    pub fn queue_full(depth: usize, retry_after: u64) -> Self {
        let mut e = Self::typed(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            format!("the request queue is full ({depth} waiting); retry after {retry_after} s"),
        );
        e.retry_after = Some(retry_after);
        e
    }

    /// 529: accepted, but it waited past its deadline before the engine could take it.
    pub fn overloaded(waited_ms: u128, retry_after: u64) -> Self {
        let mut e = Self::typed(
            StatusCode::from_u16(529).unwrap_or(StatusCode::SERVICE_UNAVAILABLE),
            "overloaded_error",
            format!(
                "the engine is overloaded: the request waited {waited_ms} ms in the queue, past its deadline"
            ),
        );
        e.retry_after = Some(retry_after);
        e
    }

    /// 503: the model is still loading or warming up.
    pub fn not_ready() -> Self {
        let mut e = Self::typed(
            StatusCode::SERVICE_UNAVAILABLE,
            "not_ready_error",
            "the model is loading; retry shortly",
        );
        e.retry_after = Some(1);
        e
    }

    /// 503: the server is shutting down and takes no new work.
    pub fn draining() -> Self {
        Self::typed(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable_error",
            "the server is stopping",
        )
    }

    /// 413: the (decompressed) body is over the limit.
    pub fn too_large(limit: usize) -> Self {
        Self::typed(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("request body is over the {limit}-byte limit"),
        )
    }

    /// 413: the request is over a per-request work cap; the message names the field, the bound and the
    /// request's value (`at_least`: counting stopped at the cap).
    pub fn too_much_work(
        field: &str,
        bound: usize,
        value: usize,
        message: impl Into<String>,
    ) -> Self {
        let mut e = Self::typed(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            message,
        );
        if let Some(d) = e.body.get_mut("detail").and_then(Value::as_object_mut) {
            d.insert("field".into(), json!(field));
            d.insert("limit".into(), json!(bound));
            d.insert("value".into(), json!(value));
        }
        e
    }

    /// 408: the body did not arrive in time (a slow client).
    pub fn body_timeout() -> Self {
        Self::typed(
            StatusCode::REQUEST_TIMEOUT,
            "timeout_error",
            "the request body did not arrive in time",
        )
    }

    /// 503 from `/ready`: the queue is full or its oldest request has waited its whole deadline.
    pub fn saturated(detail: Value) -> Self {
        let mut e = Self::typed(
            StatusCode::SERVICE_UNAVAILABLE,
            "overloaded_error",
            "saturated: new requests would be shed (429 or 529)",
        );
        if let (Some(d), Some(extra)) = (
            e.body.get_mut("detail").and_then(Value::as_object_mut),
            detail.as_object(),
        ) {
            for (k, v) in extra {
                d.insert(k.clone(), v.clone());
            }
        }
        e
    }

    /// The same error with a `Retry-After` (seconds).
    pub fn with_retry_after(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds);
        self
    }

    /// 415: an encoding or media type the server does not take.
    pub fn unsupported_media(message: impl Into<String>) -> Self {
        Self::typed(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "invalid_request_error",
            message,
        )
    }

    /// 500: our fault; the message carries the request id so the log line can be found.
    pub fn internal(request_id: &str) -> Self {
        Self::typed(
            StatusCode::INTERNAL_SERVER_ERROR,
            "api_error",
            format!("internal error (request id {request_id}); see the server log"),
        )
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The JSON body.
    pub fn body(&self) -> &Value {
        &self.body
    }

    /// `Retry-After`, in seconds, if any.
    pub fn retry_after(&self) -> Option<u64> {
        self.retry_after
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        // `compact_json` writes kept lone surrogates back as `\uXXXX` (ids in 422 bodies come back as sent).
        let body = kev_contract::compact_json(&self.body).into_bytes();
        let mut resp = (self.status, body).into_response();
        let h = resp.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Some(s) = self.retry_after {
            h.insert(header::RETRY_AFTER, HeaderValue::from(s));
            h.insert("retry-after-ms", HeaderValue::from(s * 1000));
        }
        if self.www_authenticate {
            h.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        resp
    }
}
