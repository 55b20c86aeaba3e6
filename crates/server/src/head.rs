//! Limits on a request's head (request line and headers), answered by us with JSON bodies.
//!
//! hyper answers a head it cannot take (431 past its buffer or header-count limit, 414 past its URI
//! limit, 400 for a request line or header it cannot parse) itself, from inside its connection task
//! (`proto::h1::role::Server::on_error`), with a status line and an empty body; hyper 1 offers no hook for
//! that answer. So the server's own limits sit *below* hyper's, here, where the answer is ours: hyper is
//! configured ([`HYPER_MAX_HEADERS`], its default ~400 KB buffer) to accept far more than these bounds, and
//! a head over them reaches this layer and gets a JSON 431/414. Only a head beyond hyper's own limits (or
//! one it cannot parse at all) still gets hyper's empty answer.

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use kev_contract::ErrorKind;

use crate::error::ApiError;

/// Most header fields in one request (hyper's own default, so well-behaved clients see no change).
pub const MAX_HEADERS: usize = 100;
/// Most bytes of request line plus header fields (as sent: `name: value\r\n`).
pub const MAX_HEAD_BYTES: usize = 64 << 10;
/// Longest request target (path and query).
pub const MAX_URI_BYTES: usize = 8 << 10;
/// hyper's header-count limit: far above [`MAX_HEADERS`], so a request with too many headers reaches
/// [`check`] (past this hyper answers an empty 431).
pub const HYPER_MAX_HEADERS: usize = 1024;

/// Refuse a head over the limits with a JSON 431 or 414 before anything else runs.
pub async fn check(req: Request, next: Next) -> Response {
    match over_limits(&req) {
        Some(e) => e.into_response(),
        None => next.run(req).await,
    }
}

fn over_limits(req: &Request) -> Option<ApiError> {
    let uri = req
        .uri()
        .path_and_query()
        .map_or(req.uri().path().len(), |p| p.as_str().len());
    if uri > MAX_URI_BYTES {
        return Some(ApiError::typed(
            ErrorKind::UriTooLong,
            format!("the request target is {uri} bytes, over the limit of {MAX_URI_BYTES}"),
        ));
    }
    let headers = req.headers();
    if headers.len() > MAX_HEADERS {
        return Some(ApiError::typed(
            ErrorKind::HeadTooLarge,
            format!(
                "the request has {} header fields, over the limit of {MAX_HEADERS}",
                headers.len()
            ),
        ));
    }
    // `METHOD target HTTP/1.1\r\n`, then `name: value\r\n` per field.
    let bytes = req.method().as_str().len()
        + uri
        + 11
        + headers
            .iter()
            .map(|(k, v)| k.as_str().len() + v.len() + 4)
            .sum::<usize>();
    if bytes > MAX_HEAD_BYTES {
        return Some(ApiError::typed(
            ErrorKind::HeadTooLarge,
            format!(
                "the request line and headers are {bytes} bytes, over the limit of {MAX_HEAD_BYTES}"
            ),
        ));
    }
    None
}
