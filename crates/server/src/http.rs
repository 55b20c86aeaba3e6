//! Routes, handlers and the layer stack.

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodFilter, MethodRouter, on};
use kev_contract::ErrorKind;
use serde_json::{Value, json};
use tower::ServiceBuilder;
use tower_http::cors::CorsLayer;
use tower_http::request_id::{
    MakeRequestId, PropagateRequestIdLayer, RequestId, SetRequestIdLayer,
};
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::TraceLayer;
use utoipa::openapi::path::{HttpMethod, Operation};

use crate::error::{ApiError, http_status};
use crate::wire::{
    KeyPass, REQUEST_ID, bearer_credentials, error_response, json_response, request_id,
};
use crate::{App, Decider};

/// The whole HTTP surface of an [`App`]: every [`Endpoint`] mounted at the path and method its
/// `#[utoipa::path]` declares (`/v1/*` behind the bearer check), then the layers.
pub fn router<D: Decider>(app: Arc<App<D>>) -> Router {
    let (mut v1, mut open) = (Router::new(), Router::new());
    for e in Endpoint::ALL {
        let (path, methods, _) = e.declared();
        let filter = methods
            .iter()
            .map(method_filter)
            .reduce(MethodFilter::or)
            .unwrap_or(MethodFilter::GET);
        // The admin routes check their own key (an admin key need not be an API key).
        if path.starts_with("/v1/") && !e.admin() {
            v1 = v1.route(&path, e.handler::<D>(filter));
        } else {
            open = open.route(&path, e.handler::<D>(filter));
        }
    }
    if let Some(keys) = app.keys.clone() {
        v1 = v1.layer(middleware::from_fn_with_state(keys, bearer_key));
    }
    let timeout = app.config.request_timeout;
    Router::new()
        .merge(v1)
        .merge(open)
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

/// Every endpoint of the API, listed once: [`router`] mounts each at the path and method declared beside its
/// handler (`#[utoipa::path]`), and `openapi::document` documents the same declarations (the document reaches
/// its own route through [`App`]: this module does not import it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Endpoint {
    SystemOne,
    Batch,
    Pin,
    PinGet,
    PinDelete,
    Permute,
    Separate,
    Models,
    Health,
    Live,
    Ready,
    Metrics,
    OpenApi,
    Adapters,
    AdapterAdd,
    AdapterRemove,
}

impl Endpoint {
    /// Every endpoint, in the order the document lists them.
    pub(crate) const ALL: [Endpoint; 16] = [
        Endpoint::SystemOne,
        Endpoint::Batch,
        Endpoint::Pin,
        Endpoint::PinGet,
        Endpoint::PinDelete,
        Endpoint::Permute,
        Endpoint::Separate,
        Endpoint::Models,
        Endpoint::Health,
        Endpoint::Live,
        Endpoint::Ready,
        Endpoint::Metrics,
        Endpoint::OpenApi,
        Endpoint::Adapters,
        Endpoint::AdapterAdd,
        Endpoint::AdapterRemove,
    ];

    /// Its path, methods and operation, as its handler's `#[utoipa::path]` declares them.
    pub(crate) fn declared(self) -> (String, Vec<HttpMethod>, Operation) {
        fn of<P: utoipa::Path>() -> (String, Vec<HttpMethod>, Operation) {
            (P::path(), P::methods(), P::operation())
        }
        match self {
            Endpoint::SystemOne => of::<__path_systemone>(),
            Endpoint::Batch => of::<crate::batch::__path_batch>(),
            Endpoint::Pin => of::<crate::states::__path_pin>(),
            Endpoint::PinGet => of::<crate::states::__path_pin_get>(),
            Endpoint::PinDelete => of::<crate::states::__path_pin_delete>(),
            Endpoint::Permute => of::<crate::tools::__path_permute>(),
            Endpoint::Separate => of::<crate::tools::__path_separate>(),
            Endpoint::Models => of::<__path_models>(),
            Endpoint::Health => of::<__path_health>(),
            Endpoint::Live => of::<__path_live>(),
            Endpoint::Ready => of::<__path_ready>(),
            Endpoint::Metrics => of::<__path_metrics_text>(),
            Endpoint::OpenApi => of::<__path_openapi>(),
            Endpoint::Adapters => of::<crate::admin::__path_list>(),
            Endpoint::AdapterAdd => of::<crate::admin::__path_add>(),
            Endpoint::AdapterRemove => of::<crate::admin::__path_remove>(),
        }
    }

    /// Whether it is an adapter admin route (`crate::admin`: its own key check).
    pub(crate) fn admin(self) -> bool {
        matches!(
            self,
            Endpoint::Adapters | Endpoint::AdapterAdd | Endpoint::AdapterRemove
        )
    }

    /// Whether it answers decisions: through the admission pipeline (`crate::pipeline`), every one.
    pub(crate) fn decides(self) -> bool {
        matches!(
            self,
            Endpoint::SystemOne
                | Endpoint::Batch
                | Endpoint::Pin
                | Endpoint::Permute
                | Endpoint::Separate
        )
    }

    fn handler<D: Decider>(self, filter: MethodFilter) -> MethodRouter<Arc<App<D>>> {
        match self {
            Endpoint::SystemOne => on(filter, systemone::<D>),
            Endpoint::Batch => on(filter, crate::batch::batch::<D>),
            Endpoint::Pin => on(filter, crate::states::pin::<D>),
            Endpoint::PinGet => on(filter, crate::states::pin_get::<D>),
            Endpoint::PinDelete => on(filter, crate::states::pin_delete::<D>),
            Endpoint::Permute => on(filter, crate::tools::permute::<D>),
            Endpoint::Separate => on(filter, crate::tools::separate::<D>),
            Endpoint::Models => on(filter, models::<D>),
            Endpoint::Health => on(filter, health),
            Endpoint::Live => on(filter, live),
            Endpoint::Ready => on(filter, ready::<D>),
            Endpoint::Metrics => on(filter, metrics_text::<D>),
            Endpoint::OpenApi => on(filter, openapi::<D>),
            Endpoint::Adapters => on(filter, crate::admin::list::<D>),
            Endpoint::AdapterAdd => on(filter, crate::admin::add::<D>),
            Endpoint::AdapterRemove => on(filter, crate::admin::remove::<D>),
        }
    }
}

fn method_filter(m: &HttpMethod) -> MethodFilter {
    match m {
        HttpMethod::Get => MethodFilter::GET,
        HttpMethod::Post => MethodFilter::POST,
        HttpMethod::Put => MethodFilter::PUT,
        HttpMethod::Delete => MethodFilter::DELETE,
        HttpMethod::Options => MethodFilter::OPTIONS,
        HttpMethod::Head => MethodFilter::HEAD,
        HttpMethod::Patch => MethodFilter::PATCH,
        HttpMethod::Trace => MethodFilter::TRACE,
    }
}

/// Answer typed questions about a state
#[utoipa::path(
    post,
    path = "/v1/systemone",
    request_body(content = kev_contract::wire::Request, example = json!(crate::schemas::request_example())),
    responses((status = 200, description = "Answers in request order", body = kev_contract::wire::Response,
        example = json!(crate::schemas::response_example()))),
)]
async fn systemone<D: Decider>(
    State(app): State<Arc<App<D>>>,
    request: axum::extract::Request,
) -> Response {
    crate::pipeline::handle(app, crate::pipeline::SystemOne, request).await
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

/// `Authorization: Bearer <key>` for `/v1/*`: missing → 403, no such key → 401 (compared with every key in
/// constant time, `Keys::find`), over the key's own limits → its 429 (`Key::admit`), all before the body is
/// read. A request let in carries its key (`KeyPass`, for the pipeline to charge its tokens to) and holds
/// its in-flight count until it is answered; its access-log line and `kev_key_requests_total` name the key.
async fn bearer_key(
    State(keys): State<Arc<crate::keys::Keys>>,
    mut req: Request,
    next: Next,
) -> Response {
    if req.method() == axum::http::Method::OPTIONS {
        return next.run(req).await; // CORS preflight carries no credentials
    }
    let rid = request_id(req.headers());
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| bearer_credentials(v.as_bytes()));
    let Some(given) = given else {
        return error_response(ApiError::auth_missing(), &rid);
    };
    let Some(key) = keys.find(given) else {
        return error_response(ApiError::auth_invalid(), &rid);
    };
    let name = key.name().to_owned();
    let pass = match key.admit() {
        Ok(p) => Arc::new(p),
        Err(e) => {
            metrics::counter!("kev_key_requests_total", "key" => name, "status" => "429")
                .increment(1);
            // Refused before the body was read: the body is read and thrown away while the 429 goes out.
            crate::pipeline::discard_in_background(req.into_body(), 8 << 20);
            return error_response(e, &rid);
        }
    };
    req.extensions_mut().insert(KeyPass(Arc::clone(&pass)));
    let (method, path) = (req.method().clone(), req.uri().path().to_owned());
    let started = Instant::now();
    let resp = next.run(req).await;
    let status = resp.status().as_u16();
    metrics::counter!("kev_key_requests_total", "key" => name.clone(), "status" => status.to_string())
        .increment(1);
    tracing::info!(target: "kev_server::access", key = %name, %method, path = %path, status,
        ms = started.elapsed().as_secs_f64() * 1000.0, request_id = %rid, "request");
    drop(pass);
    resp
}

/// The process's resident and peak resident bytes (Linux only).
fn process_memory() -> Option<(u64, u64)> {
    use kev_decide::memory;
    Some((memory::resident_bytes()?, memory::peak_resident_bytes()?))
}

/// The model names the server answers to
#[utoipa::path(
    get,
    path = "/v1/models",
    responses((status = 200, description = "Model cards", body = crate::schemas::ModelList,
        example = json!(crate::schemas::models_example()))),
)]
async fn models<D: Decider>(State(app): State<Arc<App<D>>>) -> Response {
    // `{name, …card}`: a card's fields after its name.
    let named = |name: &str, card: &Value| {
        let mut c = serde_json::Map::new();
        c.insert("name".into(), json!(name));
        if let Some(obj) = card.as_object() {
            c.extend(obj.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        Value::Object(c)
    };
    let card = app.decider.model_card();
    let mut models: Vec<Value> = app
        .config
        .model_names
        .iter()
        .map(|name| named(name, &card))
        .collect();
    // With several adapters, each is listed under its own name with its own card (the default's names
    // above carry the default's card).
    let adapters = app.decider.adapter_cards();
    if adapters.len() > 1 {
        models.extend(
            adapters
                .iter()
                .filter(|(name, _)| !app.config.model_names.contains(name))
                .map(|(name, card)| named(name, card)),
        );
    }
    json_response(StatusCode::OK, &json!({ "models": models }))
}

/// Liveness
#[utoipa::path(
    get,
    path = "/health",
    responses((status = 200, description = "The process serves", body = crate::schemas::Health,
        example = json!({"status": "ok"}))),
)]
async fn health() -> Response {
    json_response(StatusCode::OK, &json!({"status": "ok"}))
}

/// Liveness: 200 while the process serves HTTP (for a liveness probe: it never depends on the model, the
/// queue or the canary, so a busy or unready server is not restarted for it)
#[utoipa::path(
    get,
    path = "/live",
    responses((status = 200, description = "The process serves", body = crate::schemas::Health,
        example = json!({"status": "ok"}))),
)]
async fn live() -> Response {
    json_response(StatusCode::OK, &json!({"status": "ok"}))
}

/// Readiness: 200 once the warm-up decision succeeded, while the latest canary decision matches its answer at
/// start and new work would not be shed
#[utoipa::path(
    get,
    path = "/ready",
    responses((status = 200, description = "Ready, with the queue's figures", body = crate::schemas::Ready,
        example = json!(crate::schemas::ready_figures(json!("ready"))))),
)]
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
    } else if let Some(why) = app.canary.failing() {
        ApiError::typed(ErrorKind::NotReady, why)
            .with_retry_after(1)
            .into_response()
    } else {
        ApiError::not_ready().into_response()
    }
}

/// Prometheus metrics
#[utoipa::path(
    get,
    path = "/metrics",
    operation_id = "metrics",
    responses((status = 200, description = "Prometheus text exposition format", body = String,
        content_type = "text/plain; version=0.0.4", example = json!("kev_engine_passes_total 12\n"))),
)]
async fn metrics_text<D: Decider>(State(app): State<Arc<App<D>>>, headers: HeaderMap) -> Response {
    if let Some(key) = &app.config.metrics_key {
        // The API key's own parser: the scheme in any case, spaces after it.
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| bearer_credentials(v.as_bytes()));
        match given {
            None => return error_response(ApiError::auth_missing(), &request_id(&headers)),
            Some(k) if !crate::keys::Keys::same_secret(k, key.as_bytes()) => {
                return error_response(ApiError::auth_invalid(), &request_id(&headers));
            }
            Some(_) => {}
        }
    }
    if let Some((rss, peak)) = process_memory() {
        metrics::gauge!("kev_process_resident_bytes").set(rss as f64);
        metrics::gauge!("kev_process_peak_resident_bytes").set(peak as f64);
    }
    let s = app.decider.stats();
    metrics::counter!("kev_engine_rows_total").absolute(s.rows);
    metrics::counter!("kev_engine_passes_total").absolute(s.passes);
    metrics::counter!("kev_prepared_state_cache_hits_total").absolute(s.cache.hits);
    metrics::counter!("kev_prepared_state_cache_misses_total").absolute(s.cache.misses);
    metrics::gauge!("kev_prepared_state_cache_bytes").set(s.cache.bytes as f64);
    metrics::gauge!("kev_pinned_states").set(s.pins.entries as f64);
    metrics::gauge!("kev_pinned_state_bytes").set(s.pins.bytes as f64);
    metrics::gauge!("kev_pinned_state_budget_bytes").set(s.pins.budget as f64);
    metrics::gauge!("kev_adapters_retired").set(s.adapters_retired as f64);
    metrics::gauge!("kev_pinned_state_reserved_bytes").set(s.pins.reserved as f64);
    let q = app.queue.stats();
    use std::sync::atomic::Ordering::Relaxed;
    let bodies = q.rejected_bodies.load(Relaxed);
    metrics::counter!("kev_queue_rejected_total").absolute(q.rejected_full.load(Relaxed) + bodies);
    metrics::counter!("kev_body_permits_rejected_total").absolute(bodies);
    metrics::counter!("kev_queue_expired_total").absolute(q.expired.load(Relaxed));
    metrics::counter!("kev_queue_deadline_expired_total")
        .absolute(q.deadline_expired.load(Relaxed));
    for (p, n) in crate::Priority::ALL.iter().zip(&q.waiting_by_priority) {
        metrics::gauge!("kev_queue_waiting", "priority" => p.name()).set(n.load(Relaxed) as f64);
    }
    metrics::counter!("kev_queue_abandoned_total").absolute(q.abandoned.load(Relaxed));
    metrics::counter!("kev_engine_cancelled_total").absolute(q.cancelled.load(Relaxed));
    metrics::counter!("kev_engine_partial_pieces_total").absolute(q.partial_pieces.load(Relaxed));
    metrics::gauge!("kev_long_lane_share").set(app.config.long_lane_share_in_force());
    metrics::counter!("kev_long_lane_holds_total").absolute(q.lane_holds.load(Relaxed));
    metrics::gauge!("kev_long_lane_held_seconds").set(q.lane_held_ms.load(Relaxed) as f64 / 1000.0);
    metrics::counter!("kev_engine_scheduled_passes_total").absolute(q.passes.load(Relaxed));
    metrics::gauge!("kev_queue_depth").set(app.queue.depth() as f64);
    metrics::gauge!("kev_queue_capacity").set(app.queue.capacity() as f64);
    metrics::gauge!("kev_queue_oldest_wait_seconds").set(app.queue.oldest_wait().as_secs_f64());
    metrics::gauge!("kev_engine_running").set(q.running.load(Relaxed) as f64);
    metrics::gauge!("kev_engine_inflight_tokens").set(q.inflight_tokens.load(Relaxed) as f64);
    metrics::gauge!("kev_ready").set(if app.is_ready() { 1.0 } else { 0.0 });
    let mut text = app.metrics.render();
    adapter_lines(&mut text, &app.decider.adapter_cards());
    let mut resp = text.into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    resp
}

/// The adapters served at this moment (written here, not through the recorder, so that a removed adapter's
/// series go at once): `kev_adapter_loaded{adapter}` 1 each, `kev_adapter_bytes{adapter}`.
fn adapter_lines(text: &mut String, cards: &[(String, Value)]) {
    use std::fmt::Write;
    if cards.is_empty() {
        return;
    }
    let label = |n: &str| {
        n.replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n")
    };
    let _ = writeln!(
        text,
        "# HELP kev_adapter_loaded Adapters served now (1 each; a removed adapter's series goes at once)\n# TYPE kev_adapter_loaded gauge"
    );
    for (name, _) in cards {
        let _ = writeln!(text, "kev_adapter_loaded{{adapter=\"{}\"}} 1", label(name));
    }
    let _ = writeln!(
        text,
        "# HELP kev_adapter_bytes Bytes of each served adapter's own LoRA tensors\n# TYPE kev_adapter_bytes gauge"
    );
    for (name, card) in cards {
        let bytes = card["x_adapter_bytes"].as_u64().unwrap_or(0);
        let _ = writeln!(
            text,
            "kev_adapter_bytes{{adapter=\"{}\"}} {bytes}",
            label(name)
        );
    }
}

/// This document
#[utoipa::path(
    get,
    path = "/openapi.json",
    responses((status = 200, description = "The OpenAPI document", body = Object,
        example = json!({"openapi": "3.1.0", "info": {"title": "kev"}}))),
)]
async fn openapi<D: Decider>(State(app): State<Arc<App<D>>>) -> Response {
    let mut resp = (app.document)().into_response();
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
