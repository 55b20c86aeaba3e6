//! Every refusal and failure the API can answer, and the one table that gives each its HTTP status and
//! `error_type` (kev-contract §8.5).
//!
//! Each layer keeps its own error type (`ContractError`, the tokenizer's `TokenizeError`, the decision
//! service's errors, the server's `ApiError`); each names its [`ErrorKind`] and its [`ErrorBody`] through
//! [`WireError`], and only [`ErrorKind::row`] turns a kind into a status. Nothing else in the workspace
//! spells an HTTP status.

use serde_json::{Map, Value, json};

use crate::detail::ErrorDetail;

/// The `error_type` of a `{"detail":{"error_type","message"}}` body: the names the official SDK and jevcompat
/// map to their exception classes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ErrorType {
    /// The request is malformed, over a limit, or in a form the server does not take.
    InvalidRequestError,
    /// No API key, or the wrong one.
    AuthenticationError,
    /// The admission queue is full.
    RateLimitError,
    /// The engine is behind: the request waited past its deadline, or `/ready` reports saturation.
    OverloadedError,
    /// The model is still loading or warming up.
    NotReadyError,
    /// The server is stopping.
    UnavailableError,
    /// The body, or the whole request, took too long.
    TimeoutError,
    /// The server failed (our fault).
    ApiError,
    /// No such route.
    NotFoundError,
    /// A well-formed request the server cannot serve as asked (an unknown `model` under strict models):
    /// the live SystemOne API's name.
    ApiUsageError,
    /// The API key is known but may not do this (an adapter outside its policy, an admin route).
    PermissionError,
}

impl ErrorType {
    /// The wire name (`invalid_request_error`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorType::InvalidRequestError => "invalid_request_error",
            ErrorType::AuthenticationError => "authentication_error",
            ErrorType::RateLimitError => "rate_limit_error",
            ErrorType::OverloadedError => "overloaded_error",
            ErrorType::NotReadyError => "not_ready_error",
            ErrorType::UnavailableError => "unavailable_error",
            ErrorType::TimeoutError => "timeout_error",
            ErrorType::ApiError => "api_error",
            ErrorType::NotFoundError => "not_found_error",
            ErrorType::ApiUsageError => "api_usage_error",
            ErrorType::PermissionError => "permission_error",
        }
    }
}

/// What went wrong, as far as the client is concerned: the row of the status table an error answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The body could not be read as a body at all (FastAPI's "There was an error parsing the body").
    Unparseable,
    /// The body could not be read or decoded (a broken stream, corrupt gzip/zstd data).
    BadBody,
    /// A bearer key that is not the server's.
    AuthInvalid,
    /// No `Authorization: Bearer` header.
    AuthMissing,
    /// No such route.
    NotFound,
    /// The route exists, not with this method.
    MethodNotAllowed,
    /// The request's `model` names no model this server serves (with strict model names).
    UnknownModel,
    /// The body did not arrive in time.
    BodyTimeout,
    /// The whole request took longer than the server's request timeout.
    RequestTimeout,
    /// The (decompressed) body is over the byte limit.
    BodyTooLarge,
    /// The request is over a per-request work cap (questions, options, input tokens).
    TooMuchWork,
    /// A content coding or media type the server does not take.
    UnsupportedMedia,
    /// The request target (path and query) is over the server's limit.
    UriTooLong,
    /// The request head (field count or bytes) is over the server's limits.
    HeadTooLarge,
    /// Schema violations: the FastAPI/pydantic `detail` list.
    Validation,
    /// A valid request over a token limit of the contract, or otherwise unanswerable as asked.
    OverLimit,
    /// The admission queue is full.
    QueueFull,
    /// A named API key is over one of its own limits (requests per second, tokens per minute, in flight).
    KeyLimit,
    /// A failure of ours (engine, device, tokenizer, a lost worker).
    Internal,
    /// The model is loading or warming up.
    NotReady,
    /// The server is stopping and takes no new work.
    Unavailable,
    /// `/ready`: new work would be shed.
    Saturated,
    /// The request waited in the queue past its deadline.
    Overloaded,
    /// The API key may not do this: an adapter outside its policy, or an admin route (or admin routes are
    /// off).
    Forbidden,
    /// The request's own deadline (`x_deadline_ms`, `X-Kev-Deadline-Ms`) passed before it was answered.
    DeadlinePassed,
    /// The request conflicts with what the server holds (an adapter name already served, the default adapter,
    /// live adapters not offered by how the server was started).
    Conflict,
    /// An adapter directory that is not an adapter for the served base (the message names the problem).
    AdapterRefused,
}

impl ErrorKind {
    /// Every kind, in table order.
    pub const ALL: [ErrorKind; 27] = [
        ErrorKind::Unparseable,
        ErrorKind::BadBody,
        ErrorKind::UnknownModel,
        ErrorKind::AuthInvalid,
        ErrorKind::AuthMissing,
        ErrorKind::NotFound,
        ErrorKind::MethodNotAllowed,
        ErrorKind::BodyTimeout,
        ErrorKind::RequestTimeout,
        ErrorKind::BodyTooLarge,
        ErrorKind::TooMuchWork,
        ErrorKind::UnsupportedMedia,
        ErrorKind::UriTooLong,
        ErrorKind::HeadTooLarge,
        ErrorKind::Validation,
        ErrorKind::OverLimit,
        ErrorKind::QueueFull,
        ErrorKind::KeyLimit,
        ErrorKind::Internal,
        ErrorKind::NotReady,
        ErrorKind::Unavailable,
        ErrorKind::Saturated,
        ErrorKind::Overloaded,
        ErrorKind::Forbidden,
        ErrorKind::DeadlinePassed,
        ErrorKind::Conflict,
        ErrorKind::AdapterRefused,
    ];

    /// The status table: HTTP status and `error_type` of every kind. The only place a status is chosen.
    pub const fn row(self) -> (u16, ErrorType) {
        use ErrorType::*;
        match self {
            ErrorKind::Unparseable | ErrorKind::BadBody => (400, InvalidRequestError),
            ErrorKind::UnknownModel => (400, ApiUsageError),
            ErrorKind::AuthInvalid => (401, AuthenticationError),
            ErrorKind::AuthMissing => (403, AuthenticationError),
            ErrorKind::Forbidden => (403, PermissionError),
            ErrorKind::NotFound => (404, NotFoundError),
            ErrorKind::MethodNotAllowed => (405, InvalidRequestError),
            ErrorKind::Conflict => (409, InvalidRequestError),
            // A deadline of the request's own is a timeout too: the status the SDKs know (and retry).
            ErrorKind::BodyTimeout | ErrorKind::RequestTimeout | ErrorKind::DeadlinePassed => {
                (408, TimeoutError)
            }
            ErrorKind::BodyTooLarge | ErrorKind::TooMuchWork => (413, InvalidRequestError),
            ErrorKind::UriTooLong => (414, InvalidRequestError),
            ErrorKind::UnsupportedMedia => (415, InvalidRequestError),
            ErrorKind::HeadTooLarge => (431, InvalidRequestError),
            ErrorKind::Validation | ErrorKind::OverLimit | ErrorKind::AdapterRefused => {
                (422, InvalidRequestError)
            }
            ErrorKind::QueueFull | ErrorKind::KeyLimit => (429, RateLimitError),
            ErrorKind::Internal => (500, ApiError),
            ErrorKind::NotReady => (503, NotReadyError),
            ErrorKind::Unavailable => (503, UnavailableError),
            ErrorKind::Saturated => (503, OverloadedError),
            // Anthropic's "overloaded" status, which the SystemOne SDK retries.
            ErrorKind::Overloaded => (529, OverloadedError),
        }
    }

    /// The HTTP status.
    pub const fn status(self) -> u16 {
        self.row().0
    }

    /// The `error_type` of a typed body.
    pub const fn error_type(self) -> ErrorType {
        self.row().1
    }

    /// Whether the server is at fault (logged with the request id; the body names the id, not the cause).
    pub const fn is_fault(self) -> bool {
        matches!(self, ErrorKind::Internal)
    }
}

/// `{"error_type", "message", …}`: the `detail` of every error that is not a validation list. Extra fields
/// (`field`/`limit`/`value` of a 413 work cap, the queue figures of a saturated `/ready`) follow the message.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TypedError {
    /// The error class.
    pub error_type: ErrorType,
    /// What happened and what to do about it.
    pub message: String,
    /// Extra fields of this error (names and values depend on the kind).
    #[serde(flatten)]
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub extra: Map<String, Value>,
}

/// The body of an error answer. Serialized as `{"detail": …}` with a list (validation), an object (typed) or
/// a string (an unreadable body, as FastAPI words it).
#[derive(Debug, Clone, PartialEq)]
pub enum ErrorBody {
    /// pydantic's validation list.
    Validation(Vec<ErrorDetail>),
    /// `{"error_type", "message", …}`.
    Typed(TypedError),
    /// A bare message.
    Message(&'static str),
}

impl ErrorBody {
    /// A typed body with the kind's `error_type`.
    pub fn typed(kind: ErrorKind, message: impl Into<String>) -> Self {
        ErrorBody::Typed(TypedError {
            error_type: kind.error_type(),
            message: message.into(),
            extra: Map::new(),
        })
    }

    /// The same body with an extra field in a typed `detail` (other bodies are unchanged).
    pub fn with(mut self, key: &str, value: Value) -> Self {
        if let ErrorBody::Typed(t) = &mut self {
            t.extra.insert(key.to_owned(), value);
        }
        self
    }

    /// The body as JSON (`{"detail": …}`).
    pub fn to_value(&self) -> Value {
        let detail = match self {
            ErrorBody::Validation(items) => items.iter().map(ErrorDetail::to_value).collect(),
            ErrorBody::Typed(t) => {
                let mut m = Map::new();
                m.insert("error_type".into(), json!(t.error_type.as_str()));
                m.insert("message".into(), json!(t.message));
                m.extend(t.extra.iter().map(|(k, v)| (k.clone(), v.clone())));
                Value::Object(m)
            }
            ErrorBody::Message(text) => json!(text),
        };
        let mut m = Map::new();
        m.insert("detail".into(), detail);
        Value::Object(m)
    }
}

/// An error some layer answers a client with: its row of the status table and its body.
pub trait WireError {
    /// The row of the status table.
    fn kind(&self) -> ErrorKind;
    /// The body.
    fn error_body(&self) -> ErrorBody;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_keeps_the_statuses_clients_rely_on() {
        let status = |k: ErrorKind| k.status();
        assert_eq!(status(ErrorKind::Validation), 422);
        assert_eq!(status(ErrorKind::TooMuchWork), 413);
        assert_eq!(status(ErrorKind::QueueFull), 429);
        assert_eq!(status(ErrorKind::Overloaded), 529);
        assert_eq!(status(ErrorKind::Internal), 500);
        assert_eq!(ErrorKind::Internal.error_type().as_str(), "api_error");
        for k in ErrorKind::ALL {
            let (s, t) = k.row();
            assert!((400..600).contains(&s), "{k:?}");
            assert_eq!(
                serde_json::to_value(t).unwrap(),
                json!(t.as_str()),
                "{k:?}: serde and as_str agree"
            );
        }
    }

    #[test]
    fn typed_bodies_keep_their_extra_fields_after_the_message() {
        let b =
            ErrorBody::typed(ErrorKind::TooMuchWork, "too much").with("field", json!("questions"));
        assert_eq!(
            serde_json::to_string(&b.to_value()).unwrap(),
            r#"{"detail":{"error_type":"invalid_request_error","message":"too much","field":"questions"}}"#
        );
    }
}
