//! Every non-200 answer the server gives, and the one place that turns it into HTTP.
//!
//! Two body shapes (kev-contract §8.5, [`kev_contract::problem`]): schema violations keep FastAPI's validation
//! list (`{"detail":[{"type","loc","msg","input"}]}`); everything else is
//! `{"detail":{"error_type": …, "message": …}}`, which the official SDK and jevcompat read. The status of
//! each comes from the contract's status table ([`ErrorKind::row`]); this module only adds what HTTP needs
//! beside it (`Retry-After`, `WWW-Authenticate`) and the request id of a fault.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use kev_contract::{ContractError, ErrorBody, ErrorKind, LocItem, WireError};
use serde_json::{Value, json};

/// An error answer: its row of the status table, its body and, for load shedding, a `Retry-After` in
/// seconds.
#[derive(Debug, Clone)]
pub struct ApiError {
    kind: ErrorKind,
    /// Set only for statuses the table does not hold (a layer's own answer, passed through).
    status: Option<StatusCode>,
    // Boxed: `Result<_, ApiError>` is returned on every path, and the body is the bulk of an error.
    body: Box<ErrorBody>,
    retry_after: Option<u64>,
    request_id: Option<String>,
}

/// The HTTP status of a row of the status table.
pub(crate) fn http_status(kind: ErrorKind) -> StatusCode {
    StatusCode::from_u16(kind.status()).unwrap_or_else(|_| http_status(ErrorKind::Internal))
}

impl From<ContractError> for ApiError {
    fn from(e: ContractError) -> Self {
        ApiError::from_wire(&e)
    }
}

impl ApiError {
    /// The answer to any layer's typed error: its kind and body, as the status table says.
    pub fn from_wire(e: &impl WireError) -> Self {
        Self::new(e.kind(), e.error_body())
    }

    fn new(kind: ErrorKind, body: ErrorBody) -> Self {
        ApiError {
            kind,
            status: None,
            body: Box::new(body),
            retry_after: None,
            request_id: None,
        }
    }

    /// `{"detail":{"error_type","message"}}` for the kind.
    pub fn typed(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self::new(kind, ErrorBody::typed(kind, message))
    }

    /// A layer's (or hyper's) error status the table has no row for: passed through, with a typed body of
    /// the nearest kind.
    pub(crate) fn passthrough(status: StatusCode, kind: ErrorKind, message: String) -> Self {
        let mut e = Self::typed(kind, message);
        e.status = Some(status);
        e
    }

    /// No `Authorization: Bearer` header at all.
    pub fn auth_missing() -> Self {
        Self::typed(
            ErrorKind::AuthMissing,
            "Must supply an API key! Send Authorization: Bearer <key>.",
        )
    }

    /// A bearer key that is not the server's.
    pub fn auth_invalid() -> Self {
        Self::typed(
            ErrorKind::AuthInvalid,
            "Invalid API key. Send Authorization: Bearer <key> with the server's key.",
        )
    }

    /// A named key is over one of its own limits (`limit` says which, in words).
    pub fn key_limited(name: &str, limit: &str, retry_after: u64) -> Self {
        Self::typed(
            ErrorKind::KeyLimit,
            format!(
                "API key {name:?} is over its limit of {limit}; retry after {retry_after} s (other keys are not affected)"
            ),
        )
        .with_retry_after(retry_after)
    }

    /// The admission queue is full.
    pub fn queue_full(depth: usize, retry_after: u64) -> Self {
        Self::typed(
            ErrorKind::QueueFull,
            format!("the request queue is full ({depth} waiting); retry after {retry_after} s"),
        )
        .with_retry_after(retry_after)
    }

    /// Every body-read permit is held (twice the queue depth of clients still sending their bodies).
    pub fn bodies_full(permits: usize, retry_after: u64) -> Self {
        Self::typed(
            ErrorKind::QueueFull,
            format!("{permits} request bodies are already arriving; retry after {retry_after} s"),
        )
        .with_retry_after(retry_after)
    }

    /// The body-read permits left are the reserve, and this peer address (or key) holds its share already.
    pub fn bodies_over_share(permits: usize, retry_after: u64) -> Self {
        Self::typed(
            ErrorKind::QueueFull,
            format!(
                "this address (or API key) is already sending its share of the {permits} request bodies the server reads at once; retry after {retry_after} s"
            ),
        )
        .with_retry_after(retry_after)
    }

    /// This peer address holds its share of the connections (`--max-connections-per-ip`).
    pub fn connections_per_peer(limit: usize, retry_after: u64) -> Self {
        Self::typed(
            ErrorKind::QueueFull,
            format!(
                "this address already holds {limit} connections, the most one address may (--max-connections-per-ip); retry after {retry_after} s"
            ),
        )
        .with_retry_after(retry_after)
    }

    /// The drain deadline passed before the request was answered: it was stopped.
    pub fn drained() -> Self {
        Self::typed(
            ErrorKind::Unavailable,
            "the server is stopping and its drain deadline passed before this request was answered; retry on another instance",
        )
    }

    /// Accepted, but it waited past its deadline before the engine could take it.
    pub fn overloaded(waited_ms: u128, retry_after: u64) -> Self {
        Self::typed(
            ErrorKind::Overloaded,
            format!(
                "the engine is overloaded: the request waited {waited_ms} ms in the queue, past its deadline"
            ),
        )
        .with_retry_after(retry_after)
    }

    /// The request's own deadline passed: while it waited (`started` false: it was never run) or while it ran
    /// (stopped before its next pass).
    pub fn deadline_passed(deadline_ms: u128, started: bool) -> Self {
        let what = if started {
            "while it ran: it was stopped before its next engine pass"
        } else {
            "while it waited for the engine: it was not run"
        };
        Self::typed(
            ErrorKind::DeadlinePassed,
            format!("the request's deadline of {deadline_ms} ms passed {what}"),
        )
    }

    /// A key whose policy does not let it use this adapter (names the key and adapter, never the secret).
    pub fn adapter_forbidden(key: &str, adapter: &str) -> Self {
        Self::typed(
            ErrorKind::Forbidden,
            format!(
                "API key {key:?} may not use adapter {adapter:?} (its policy in the keys file lists the adapters it may use)"
            ),
        )
    }

    /// The model is still loading or warming up.
    pub fn not_ready() -> Self {
        Self::typed(ErrorKind::NotReady, "the model is loading; retry shortly").with_retry_after(1)
    }

    /// The server is shutting down and takes no new work.
    pub fn draining() -> Self {
        Self::typed(ErrorKind::Unavailable, "the server is stopping")
    }

    /// The (decompressed) body is over the limit.
    pub fn too_large(limit: usize) -> Self {
        Self::typed(
            ErrorKind::BodyTooLarge,
            format!("request body is over the {limit}-byte limit"),
        )
    }

    /// The body could not be read, or its content coding could not be undone.
    pub fn bad_body(message: impl Into<String>) -> Self {
        Self::typed(ErrorKind::BadBody, message)
    }

    /// The body did not arrive in time (a slow client).
    pub fn body_timeout() -> Self {
        Self::typed(
            ErrorKind::BodyTimeout,
            "the request body did not arrive in time",
        )
    }

    /// `/ready`: the queue is full or its oldest request has waited its whole deadline; `detail` adds the
    /// queue figures to the body.
    pub fn saturated(detail: &Value) -> Self {
        let mut body = ErrorBody::typed(
            ErrorKind::Saturated,
            "saturated: new requests would be shed (429 or 529)",
        );
        for (k, v) in detail.as_object().into_iter().flatten() {
            body = body.with(k, v.clone());
        }
        Self::new(ErrorKind::Saturated, body).with_retry_after(1)
    }

    /// An encoding or media type the server does not take.
    pub fn unsupported_media(message: impl Into<String>) -> Self {
        Self::typed(ErrorKind::UnsupportedMedia, message)
    }

    /// A valid request the route cannot answer as asked (e.g. permuting a question that is not a choice).
    pub fn unanswerable(message: impl Into<String>) -> Self {
        Self::typed(ErrorKind::OverLimit, message)
    }

    /// No such route.
    pub fn not_found() -> Self {
        Self::typed(ErrorKind::NotFound, "Not Found")
    }

    /// Our fault. The body names the request id (stamped by [`ApiError::for_request`] where the answer
    /// leaves), so the log line can be found; the cause goes to the log, not to the client.
    pub fn internal() -> Self {
        Self::typed(ErrorKind::Internal, "internal error; see the server log")
    }

    /// The same error with a `Retry-After` (seconds).
    pub fn with_retry_after(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds);
        self
    }

    /// The same error answering request `request_id`: a fault's message names it.
    pub fn for_request(mut self, request_id: &str) -> Self {
        self.request_id = Some(request_id.to_owned());
        self
    }

    /// A validation error re-rooted under `key` (`["body", key, …]`), for a request nested in an envelope.
    pub fn under(mut self, key: &str) -> Self {
        if let ErrorBody::Validation(items) = &mut *self.body {
            for item in items {
                if matches!(item.loc.first(), Some(LocItem::Key(k)) if k == "body") {
                    item.loc.insert(1, LocItem::Key(key.to_owned()));
                }
            }
        }
        self
    }

    /// The row of the status table.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.status.unwrap_or_else(|| http_status(self.kind))
    }

    /// The body.
    pub fn error_body(&self) -> &ErrorBody {
        &self.body
    }

    /// The JSON body as sent.
    pub fn body(&self) -> Value {
        let mut body = self.body.to_value();
        if self.kind.is_fault()
            && let Some(detail) = body.get_mut("detail").and_then(Value::as_object_mut)
        {
            let id = self.request_id.as_deref().unwrap_or("-");
            detail.insert(
                "message".into(),
                json!(format!(
                    "internal error (request id {id}); see the server log"
                )),
            );
        }
        body
    }

    /// `Retry-After`, in seconds, if any.
    pub fn retry_after(&self) -> Option<u64> {
        self.retry_after
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        // `compact_json` writes kept lone surrogates back as `\uXXXX` (ids in 422 bodies come back as sent).
        let body = kev_contract::compact_json(&self.body()).into_bytes();
        let mut resp = (self.status(), body).into_response();
        let h = resp.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Some(s) = self.retry_after {
            h.insert(header::RETRY_AFTER, HeaderValue::from(s));
            h.insert("retry-after-ms", HeaderValue::from(s * 1000));
        }
        if matches!(self.kind, ErrorKind::AuthMissing | ErrorKind::AuthInvalid) {
            h.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        resp
    }
}
