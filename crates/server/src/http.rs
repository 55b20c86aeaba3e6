//! Routes, handlers and the layer stack.

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::body::Body;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use kev_contract::ErrorKind;
use serde_json::{Value, json};
use tower::ServiceBuilder;
use tower_http::cors::CorsLayer;
use tower_http::request_id::{
    MakeRequestId, PropagateRequestIdLayer, RequestId, SetRequestIdLayer,
};
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::TraceLayer;
use tower_http::validate_request::{ValidateRequest, ValidateRequestHeaderLayer};

use crate::error::{ApiError, http_status};
use crate::{App, Decider};

/// The request-id header the official SDK reads (`response.request_id`).
pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-typesafe-request-id");

/// The whole HTTP surface of an [`App`].
pub fn router<D: Decider>(app: Arc<App<D>>) -> Router {
    let mut v1 = Router::new()
        .route("/v1/systemone", post(systemone::<D>))
        .route("/v1/models", get(models::<D>))
        .merge(crate::tools::routes::<D>());
    if let Some(key) = app.config.api_key.clone().filter(|k| !k.is_empty()) {
        v1 = v1.layer(ValidateRequestHeaderLayer::custom(BearerKey {
            key: Arc::from(key.into_bytes()),
        }));
    }
    let timeout = app.config.request_timeout;
    Router::new()
        .merge(v1)
        .route("/health", get(health))
        .route("/ready", get(ready::<D>))
        .route("/metrics", get(metrics_text::<D>))
        .route("/openapi.json", get(openapi))
        .fallback(not_found)
        .layer(middleware::from_fn(observe))
        .layer(
            ServiceBuilder::new()
                .layer(TraceLayer::new_for_http())
                .layer(SetRequestIdLayer::new(REQUEST_ID, HexRequestId))
                .layer(PropagateRequestIdLayer::new(REQUEST_ID))
                .layer(
                    CorsLayer::permissive()
                        .expose_headers([REQUEST_ID, HeaderName::from_static("server-timing")]),
                )
                .layer(middleware::from_fn(jsonify_errors))
                .layer(middleware::from_fn(crate::head::check))
                // Dropping the handler at the timeout drops its ticket: the engine stops the request
                // before its next pass.
                .layer(TimeoutLayer::with_status_code(
                    http_status(ErrorKind::RequestTimeout),
                    timeout,
                )),
        )
        .with_state(app)
}

/// `uuid4().hex`, as Kev's server makes request ids (32 lowercase hex digits).
#[derive(Clone, Copy)]
struct HexRequestId;

impl MakeRequestId for HexRequestId {
    fn make_request_id<B>(&mut self, _: &axum::http::Request<B>) -> Option<RequestId> {
        let id = uuid::Uuid::new_v4().simple().to_string();
        HeaderValue::from_str(&id).ok().map(RequestId::new)
    }
}

/// `Authorization: Bearer <key>`, compared in constant time. Missing → 403, wrong → 401.
#[derive(Clone)]
struct BearerKey {
    key: Arc<[u8]>,
}

impl<B> ValidateRequest<B> for BearerKey {
    type ResponseBody = Body;

    fn validate(&mut self, request: &mut axum::http::Request<B>) -> Result<(), Response> {
        use subtle::ConstantTimeEq;
        if request.method() == axum::http::Method::OPTIONS {
            return Ok(()); // CORS preflight carries no credentials
        }
        let Some(value) = request.headers().get(header::AUTHORIZATION) else {
            return Err(ApiError::auth_missing().into_response());
        };
        let Some(given) = bearer_credentials(value.as_bytes()) else {
            return Err(ApiError::auth_missing().into_response());
        };
        if bool::from(given.ct_eq(&self.key)) {
            Ok(())
        } else {
            Err(ApiError::auth_invalid().into_response())
        }
    }
}

/// The credentials of `Authorization: Bearer <token>`: the scheme is case-insensitive (RFC 9110 §11.1),
/// followed by one or more spaces; `None` for another scheme.
fn bearer_credentials(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(6)?;
    if !scheme.eq_ignore_ascii_case(b"bearer") || rest.first() != Some(&b' ') {
        return None;
    }
    let start = rest.iter().position(|&b| b != b' ').unwrap_or(rest.len());
    Some(&rest[start..])
}

pub(crate) fn request_id(headers: &HeaderMap) -> String {
    headers
        .get(&REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-")
        .to_string()
}

async fn systemone<D: Decider>(
    State(app): State<Arc<App<D>>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let started = Instant::now();
    let rid = request_id(&headers);
    let result = decide(&app, &headers, body, &rid).await;
    let elapsed_ms = started.elapsed().as_secs_f64() * 1000.0;
    let mut resp = match result {
        Ok(resp) => resp,
        Err(e) => error_response(e, &rid),
    };
    if let Ok(v) = HeaderValue::from_str(&format!("app;dur={elapsed_ms:.1}")) {
        resp.headers_mut()
            .insert(HeaderName::from_static("server-timing"), v);
    }
    resp
}

async fn decide<D: Decider>(
    app: &Arc<App<D>>,
    headers: &HeaderMap,
    body: Body,
    rid: &str,
) -> Result<Response, ApiError> {
    if app.draining.load(std::sync::atomic::Ordering::SeqCst) {
        return Err(ApiError::draining());
    }
    if !app.is_ready() {
        return Err(ApiError::not_ready());
    }
    if let Some(ct) = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        && ct
            .trim_start()
            .to_ascii_lowercase()
            .starts_with("multipart/")
    {
        return Err(ApiError::unsupported_media(
            "Kev is text-only: multipart bodies (image assets) are not supported; send the request as application/json",
        ));
    }
    let encodings = content_codings(headers)?;
    // A slot before any work: a full queue answers 429 before the body is even read.
    let slot = app.queue.reserve()?;
    let raw = tokio::time::timeout(app.config.header_read_timeout.max(BODY_READ_MIN), async {
        read_body(body, app.config.max_body).await
    })
    .await
    .map_err(|_| ApiError::body_timeout())??;
    // An admission permit (about one per core) before decoding, parsing or tokenizing.
    let wait = app.queue.deadline();
    let permit = tokio::time::timeout(wait, app.permits.acquire())
        .await
        .map_err(|_| ApiError::overloaded(wait.as_millis(), 1))?
        .map_err(|_| ApiError::draining())?;
    let decider = Arc::clone(&app.decider);
    let max_body = app.config.max_body;
    let admission = tokio::task::spawn_blocking(move || {
        let bytes = decode_body(raw, &encodings, max_body)?;
        decider.admit(&bytes)
    })
    .await
    .map_err(|_| ApiError::internal())??;
    drop(permit);
    let ticket = app.queue.submit(slot, admission.job, admission.tokens)?;
    metrics::gauge!("kev_queue_depth").set(app.queue.depth() as f64);
    let answered = app.queue.answer(ticket, rid).await?;
    metrics::histogram!("kev_queue_wait_seconds").record(answered.queued.as_secs_f64());
    metrics::histogram!("kev_compute_seconds").record(answered.compute.as_secs_f64());
    let usage = answered.body.usage();
    metrics::counter!("kev_input_tokens_total").increment(usage.input_tokens as u64);
    metrics::counter!("kev_output_tokens_total").increment(usage.output_tokens as u64);
    let ms = (answered.compute.as_secs_f64() * 10_000.0).round() / 10.0;
    let body = answered.body.extra("x_latency_ms", json!(ms));
    Ok(json_response(StatusCode::OK, &body.to_value()))
}

/// An error leaving a handler: a fault is logged with its cause and answered with the request id only.
pub(crate) fn error_response(e: ApiError, request_id: &str) -> Response {
    if e.kind().is_fault() {
        tracing::error!(request_id = %request_id, cause = %e.error_body().to_value(), "internal error");
    }
    e.for_request(request_id).into_response()
}

/// Past the limit, read (and drop) this much more before answering 413, so a client still sending its
/// body gets the 413 instead of a connection reset.
const LINGER_BYTES: usize = 16 << 20;

/// The body must arrive within the header-read timeout, and never in less time than this.
const BODY_READ_MIN: std::time::Duration = std::time::Duration::from_secs(30);

/// The body as sent (still encoded), or 413 once it is over `limit`.
pub(crate) async fn read_body(body: Body, limit: usize) -> Result<Vec<u8>, ApiError> {
    use http_body_util::BodyExt;
    let mut body = body;
    let mut buf = Vec::new();
    let mut seen = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame
            .map_err(|e| ApiError::bad_body(format!("could not read the request body: {e}")))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        seen += data.len();
        if seen > limit {
            buf = Vec::new();
            if seen > limit + LINGER_BYTES {
                break;
            }
        } else {
            buf.extend_from_slice(&data);
        }
    }
    if seen > limit {
        return Err(ApiError::too_large(limit));
    }
    Ok(buf)
}

/// A content coding the server decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Coding {
    Gzip,
    Zstd,
    Deflate,
}

/// The codings of `Content-Encoding`, in the order they were applied (names case-insensitive, RFC 9110
/// §8.4.1; `identity` skipped; several headers or comma-separated lists stack). 415 naming the first
/// coding the server does not decode.
pub(crate) fn content_codings(headers: &HeaderMap) -> Result<Vec<Coding>, ApiError> {
    let mut out = Vec::new();
    for value in headers.get_all(header::CONTENT_ENCODING) {
        let text = value.to_str().map_err(|_| {
            ApiError::unsupported_media(
                "unreadable Content-Encoding: send identity, gzip, zstd or deflate",
            )
        })?;
        for name in text.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let coding = match name.to_ascii_lowercase().as_str() {
                "identity" => continue,
                "gzip" | "x-gzip" => Coding::Gzip,
                "zstd" => Coding::Zstd,
                "deflate" => Coding::Deflate,
                _ => {
                    return Err(ApiError::unsupported_media(format!(
                        "unsupported Content-Encoding {name:?}: send identity, gzip, zstd or deflate (stacked codings are decoded in order)"
                    )));
                }
            };
            out.push(coding);
        }
    }
    Ok(out)
}

/// Undo the codings, last applied first, each output held to `limit` bytes (413 past it, so a
/// decompression bomb costs at most `limit` bytes of work per coding).
pub(crate) fn decode_body(
    raw: Vec<u8>,
    codings: &[Coding],
    limit: usize,
) -> Result<Vec<u8>, ApiError> {
    use std::io::Read;
    let mut data = raw;
    for coding in codings.iter().rev() {
        let mut out = Vec::new();
        let cap = limit as u64 + 1;
        let read = match coding {
            Coding::Gzip => flate2::read::MultiGzDecoder::new(&data[..])
                .take(cap)
                .read_to_end(&mut out),
            Coding::Deflate => flate2::read::ZlibDecoder::new(&data[..])
                .take(cap)
                .read_to_end(&mut out),
            Coding::Zstd => zstd::stream::read::Decoder::new(&data[..])
                .and_then(|d| d.take(cap).read_to_end(&mut out)),
        };
        if read.is_err() {
            return Err(ApiError::bad_body(
                format!("the request body is not valid {coding:?} data (Content-Encoding)")
                    .to_lowercase(),
            ));
        }
        if out.len() > limit {
            return Err(ApiError::too_large(limit));
        }
        data = out;
    }
    Ok(data)
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

async fn models<D: Decider>(State(app): State<Arc<App<D>>>) -> Response {
    let card = app.decider.model_card();
    let models: Vec<Value> = app
        .config
        .model_names
        .iter()
        .map(|name| {
            let mut c = serde_json::Map::new();
            c.insert("name".into(), json!(name));
            if let Some(obj) = card.as_object() {
                for (k, v) in obj {
                    c.insert(k.clone(), v.clone());
                }
            }
            Value::Object(c)
        })
        .collect();
    json_response(StatusCode::OK, &json!({ "models": models }))
}

async fn health() -> Response {
    json_response(StatusCode::OK, &json!({"status": "ok"}))
}

async fn ready<D: Decider>(State(app): State<Arc<App<D>>>) -> Response {
    if app.is_ready() {
        let q = &app.queue;
        use std::sync::atomic::Ordering::Relaxed;
        let depth = q.depth();
        let oldest = q.oldest_wait();
        let detail = json!({
            "queue_depth": depth,
            "queue_capacity": q.capacity(),
            "oldest_wait_ms": oldest.as_millis() as u64,
            "queue_deadline_ms": q.deadline().as_millis() as u64,
            "running": q.stats().running.load(Relaxed),
            "inflight_tokens": q.stats().inflight_tokens.load(Relaxed),
        });
        if depth >= q.capacity() || oldest >= q.deadline() {
            // Saturated: new work would get 429 or 529; say so to whoever routes traffic here.
            return ApiError::saturated(&detail).into_response();
        }
        let mut body = json!({"status": "ready"});
        if let (Some(obj), Some(d)) = (body.as_object_mut(), detail.as_object()) {
            for (k, v) in d {
                obj.insert(k.clone(), v.clone());
            }
        }
        json_response(StatusCode::OK, &body)
    } else if app.draining.load(std::sync::atomic::Ordering::SeqCst) {
        ApiError::draining().into_response()
    } else {
        ApiError::not_ready().into_response()
    }
}

async fn metrics_text<D: Decider>(State(app): State<Arc<App<D>>>) -> Response {
    let s = app.decider.stats();
    metrics::counter!("kev_engine_rows_total").absolute(s.rows);
    metrics::counter!("kev_engine_passes_total").absolute(s.passes);
    metrics::counter!("kev_prepared_state_cache_hits_total").absolute(s.cache_hits);
    metrics::counter!("kev_prepared_state_cache_misses_total").absolute(s.cache_misses);
    metrics::gauge!("kev_prepared_state_cache_bytes").set(s.cache_bytes as f64);
    let q = app.queue.stats();
    use std::sync::atomic::Ordering::Relaxed;
    metrics::counter!("kev_queue_rejected_total").absolute(q.rejected_full.load(Relaxed));
    metrics::counter!("kev_queue_expired_total").absolute(q.expired.load(Relaxed));
    metrics::counter!("kev_queue_abandoned_total").absolute(q.abandoned.load(Relaxed));
    metrics::counter!("kev_engine_cancelled_total").absolute(q.cancelled.load(Relaxed));
    metrics::counter!("kev_engine_partial_pieces_total").absolute(q.partial_pieces.load(Relaxed));
    metrics::counter!("kev_engine_scheduled_passes_total").absolute(q.passes.load(Relaxed));
    metrics::gauge!("kev_queue_depth").set(app.queue.depth() as f64);
    metrics::gauge!("kev_queue_capacity").set(app.queue.capacity() as f64);
    metrics::gauge!("kev_queue_oldest_wait_seconds").set(app.queue.oldest_wait().as_secs_f64());
    metrics::gauge!("kev_engine_running").set(q.running.load(Relaxed) as f64);
    metrics::gauge!("kev_engine_inflight_tokens").set(q.inflight_tokens.load(Relaxed) as f64);
    metrics::gauge!("kev_ready").set(if app.is_ready() { 1.0 } else { 0.0 });
    let mut resp = app.metrics.render().into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    resp
}

async fn openapi() -> Response {
    let mut resp = crate::openapi::json().into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

async fn not_found() -> ApiError {
    ApiError::not_found()
}

/// Requests by route and status, and their latency.
async fn observe(req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "unmatched".to_string());
    let started = Instant::now();
    let resp = next.run(req).await;
    let status = resp.status().as_u16().to_string();
    metrics::counter!("kev_requests_total", "route" => route.clone(), "status" => status)
        .increment(1);
    metrics::histogram!("kev_request_duration_seconds", "route" => route)
        .record(started.elapsed().as_secs_f64());
    resp
}

/// The statuses layers and axum answer on their own (routing, the request timeout, the body limit), with
/// the message each gets.
const LAYER_ANSWERS: [(ErrorKind, &str); 5] = [
    (ErrorKind::NotFound, "Not Found"),
    (ErrorKind::MethodNotAllowed, "Method Not Allowed"),
    (
        ErrorKind::RequestTimeout,
        "the request took longer than the server's request timeout",
    ),
    (
        ErrorKind::BodyTooLarge,
        "request body is over the size limit",
    ),
    (
        ErrorKind::UnsupportedMedia,
        "unsupported Content-Encoding: send identity, gzip or zstd",
    ),
];

/// Layers (decompression, body limit, timeout) and axum (405) answer errors with empty or text
/// bodies; give every error the `{"detail":{"error_type","message"}}` shape (a 5xx names the request id).
async fn jsonify_errors(req: Request, next: Next) -> Response {
    let rid = request_id(req.headers());
    let resp = next.run(req).await;
    let status = resp.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return resp;
    }
    let is_json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("application/json"));
    if is_json {
        return resp;
    }
    let known = LAYER_ANSWERS
        .iter()
        .find(|(kind, _)| http_status(*kind) == status);
    let error = match known {
        Some((kind, message)) => ApiError::typed(*kind, *message),
        None if status.is_server_error() => {
            ApiError::passthrough(status, ErrorKind::Internal, String::new())
        }
        None => ApiError::passthrough(
            status,
            ErrorKind::BadBody,
            status
                .canonical_reason()
                .unwrap_or("bad request")
                .to_string(),
        ),
    };
    let mut out = error.for_request(&rid).into_response();
    for name in [
        header::RETRY_AFTER,
        header::WWW_AUTHENTICATE,
        header::ALLOW,
        header::ACCEPT_ENCODING,
    ] {
        if let Some(v) = resp.headers().get(&name) {
            out.headers_mut().insert(name, v.clone());
        }
    }
    out
}
