//! Traces: OpenTelemetry spans for each decision request, exported by OTLP (`kev serve --otlp-endpoint URL`, or
//! `OTEL_EXPORTER_OTLP_ENDPOINT`), over HTTP/protobuf (the default) or gRPC (`--otlp-protocol grpc`).
//!
//! A request's span (`POST /v1/systemone`, kind server) continues the caller's trace when the request carries
//! a W3C `traceparent` header, and carries `kev.request_id` (the `x-typesafe-request-id` it was answered with),
//! the key's name, its priority, adapter, tokens and status. Its children, one per phase: `kev.admission`
//! (decode, parse, tokenize), `kev.queue` (waiting for its first pass), one `kev.pass` per engine pass it rode
//! (`kev.tokens`, `kev.batch`: the requests the pass advanced, `kev.lane`: a long-lane piece; at most 256 per
//! part) and `kev.readout` (the pointer head and the answer; its length measured, placed at the end of its last
//! pass). The phases are measured as the request goes and written when it is answered, with their own times.
//!
//! **Off by default, and free when off**: without an endpoint no exporter, no thread and no span exists — a
//! request checks one flag ([`enabled`]). With one, spans go through the OpenTelemetry SDK's batch processor
//! (its own thread, `OpenTelemetry.Traces.BatchProcessor`; a full buffer drops spans rather than slowing
//! requests) to the exporter: HTTP through a blocking client on that thread, gRPC (tonic) on a one-thread
//! runtime of its own (`kev-otlp`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use axum::http::HeaderMap;
use opentelemetry::trace::{
    Span as _, SpanKind, TraceContextExt, Tracer as _, TracerProvider as _,
};
use opentelemetry::{KeyValue, propagation::TextMapPropagator};
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter, Tracer};
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::queue::PassRecord;

/// The `tracing` target of the spans exported (the CLI keeps its log output free of them).
pub const TARGET: &str = "kev::trace";

static ON: AtomicBool = AtomicBool::new(false);
static TRACER: OnceLock<Tracer> = OnceLock::new();

/// Whether requests are traced (an exporter was started in this process).
pub fn enabled() -> bool {
    ON.load(Ordering::Relaxed)
}

/// The OTLP transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OtlpProtocol {
    /// Protobuf over HTTP (`http/protobuf`), to `ENDPOINT/v1/traces`.
    #[default]
    HttpProtobuf,
    /// gRPC (`grpc`), to `ENDPOINT`.
    Grpc,
}

impl std::str::FromStr for OtlpProtocol {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "http/protobuf" | "http" => Ok(OtlpProtocol::HttpProtobuf),
            "grpc" => Ok(OtlpProtocol::Grpc),
            o => Err(format!(
                "unknown OTLP protocol {o:?} (http/protobuf, grpc; http/json is not offered)"
            )),
        }
    }
}

/// Where spans go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtlpConfig {
    /// The collector's base URL (`http://collector:4318`, or `http://collector:4317` for gRPC); for HTTP,
    /// `/v1/traces` is added when the URL has no path, as `OTEL_EXPORTER_OTLP_ENDPOINT` is read.
    pub endpoint: String,
    /// The transport.
    pub protocol: OtlpProtocol,
    /// `service.name` of the spans (`kev`).
    pub service_name: String,
}

/// Why traces could not be started.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The exporter refused its settings.
    #[error("OTLP exporter: {0}")]
    Exporter(String),
    /// Traces were started already in this process.
    #[error("traces are already being exported by this process")]
    Twice,
}

/// The running exporter: spans are flushed and the exporter stopped by [`Telemetry::shutdown`] (or drop).
pub struct Telemetry {
    provider: SdkTracerProvider,
    _runtime: Option<tokio::runtime::Runtime>,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry").finish_non_exhaustive()
    }
}

impl Telemetry {
    /// Export the spans ended so far now.
    pub fn flush(&self) {
        let _ = self.provider.force_flush();
    }

    /// Export what is left and stop.
    pub fn shutdown(self) {
        drop(self);
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        ON.store(false, Ordering::Relaxed);
        let _ = self.provider.shutdown_with_timeout(Duration::from_secs(5));
    }
}

/// The HTTP URL spans are posted to: the base endpoint with `/v1/traces` when it has no path of its own.
pub fn http_traces_url(endpoint: &str) -> String {
    let trimmed = endpoint.trim_end_matches('/');
    let has_path = trimmed
        .split_once("://")
        .map_or(trimmed, |(_, rest)| rest)
        .contains('/');
    if has_path {
        endpoint.to_owned()
    } else {
        format!("{trimmed}/v1/traces")
    }
}

/// Start exporting: the exporter, the SDK's batch processor and the tracer. Returns the `tracing` layer that
/// turns the server's spans ([`TARGET`]) into OpenTelemetry spans — add it to the process's subscriber — and
/// the handle that flushes and stops the export.
pub fn start<S>(
    config: &OtlpConfig,
) -> Result<(impl tracing_subscriber::Layer<S>, Telemetry), TelemetryError>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
    use tracing_subscriber::Layer as _;

    if TRACER.get().is_some() {
        return Err(TelemetryError::Twice);
    }
    let err = |e: &dyn std::fmt::Display| TelemetryError::Exporter(e.to_string());
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(config.service_name.clone())
        .build();
    let builder = SdkTracerProvider::builder().with_resource(resource);
    let (provider, runtime) = match config.protocol {
        OtlpProtocol::HttpProtobuf => {
            let exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_http_client(UreqClient::new())
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .with_endpoint(http_traces_url(&config.endpoint))
                .with_timeout(Duration::from_secs(10))
                .build()
                .map_err(|e| err(&e))?;
            (builder.with_batch_exporter(exporter).build(), None)
        }
        OtlpProtocol::Grpc => {
            // tonic's channel and timers live on a runtime; the batch processor's thread is not one, so every
            // export runs there ([`OnRuntime`]).
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("kev-otlp")
                .enable_all()
                .build()
                .map_err(|e| err(&e))?;
            let exporter = {
                let _in = runtime.enter();
                opentelemetry_otlp::SpanExporter::builder()
                    .with_tonic()
                    .with_endpoint(config.endpoint.clone())
                    .with_timeout(Duration::from_secs(10))
                    .build()
                    .map_err(|e| err(&e))?
            };
            let exporter = OnRuntime {
                inner: Arc::new(exporter),
                runtime: runtime.handle().clone(),
            };
            (builder.with_batch_exporter(exporter).build(), Some(runtime))
        }
    };
    let tracer = provider.tracer("kev");
    TRACER
        .set(tracer.clone())
        .map_err(|_| TelemetryError::Twice)?;
    // The server's spans are INFO: a finer level here would raise the process's level hint, and every debug
    // and trace record of every dependency (and each `log` record, through tracing-log) would then be
    // checked against the filters at run time — measured at several percent of a request's CPU.
    let layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_filter(
            tracing_subscriber::filter::Targets::new().with_target(TARGET, tracing::Level::INFO),
        );
    ON.store(true, Ordering::Relaxed);
    Ok((
        layer,
        Telemetry {
            provider,
            _runtime: runtime,
        },
    ))
}

/// A decision request's span, continuing the trace its `traceparent` names (`None` with tracing off).
pub(crate) fn request_span(
    headers: &HeaderMap,
    method: &str,
    route: &str,
    request_id: &str,
) -> Option<tracing::Span> {
    if !enabled() {
        return None;
    }
    let span = tracing::info_span!(
        target: TARGET,
        "kev.request",
        otel.name = %format!("{method} {route}"),
        otel.kind = "server",
        http.request.method = %method,
        http.route = %route,
        kev.request_id = %request_id,
    );
    let parent = opentelemetry_sdk::propagation::TraceContextPropagator::new()
        .extract(&opentelemetry_http::HeaderExtractor(headers));
    let _ = span.set_parent(parent);
    Some(span)
}

/// The trace id of a request's span (32 hex digits).
pub(crate) fn trace_id(span: &tracing::Span) -> Option<String> {
    let cx = span.context();
    let sc = cx.span().span_context().clone();
    sc.is_valid().then(|| sc.trace_id().to_string())
}

/// How a traced request ended, as its span records it (the request's trail fills it in).
pub(crate) struct RequestEnd<'a> {
    /// The HTTP status answered.
    pub status: u16,
    /// The error's type, if it was one.
    pub error_type: Option<&'a str>,
    /// The key's name.
    pub key: Option<&'a str>,
    /// Its priority's name.
    pub priority: Option<&'static str>,
    /// Its adapters' names.
    pub adapters: Vec<String>,
    /// When admission started and how long it took.
    pub admission: Option<(Instant, Duration)>,
    /// When its parts were submitted.
    pub submitted: Option<Instant>,
    /// The passes its parts rode, the first one's start, and (queue wait, head time) summed.
    pub passes: (
        &'a [PassRecord],
        Option<Instant>,
        Option<(Duration, Duration)>,
    ),
}

/// Finish a request's span: its outcome as attributes, and a child span per phase with its own times.
pub(crate) fn close_request(span: &tracing::Span, end: &RequestEnd<'_>) {
    let status = end.status;
    span.set_attribute("http.response.status_code", i64::from(status));
    if let Some(key) = end.key {
        span.set_attribute("kev.key", key.to_owned());
    }
    if let Some(p) = end.priority {
        span.set_attribute("kev.priority", p);
    }
    if let Some(t) = end.error_type {
        span.set_attribute("error.type", t.to_owned());
    }
    if status >= 500 {
        span.set_status(opentelemetry::trace::Status::error(format!("{status}")));
    }
    if !end.adapters.is_empty() {
        span.set_attribute("kev.adapter", end.adapters.join(","));
    }
    let Some(tracer) = TRACER.get() else {
        return;
    };
    let cx = span.context();
    let clock = Clock::now();
    let child = |name: &'static str, from: Instant, to: Instant, attrs: Vec<KeyValue>| {
        let mut s = tracer
            .span_builder(name)
            .with_kind(SpanKind::Internal)
            .with_start_time(clock.at(from))
            .with_attributes(attrs)
            .start_with_context(tracer, &cx);
        s.end_with_timestamp(clock.at(to.max(from)));
    };
    if let Some((t0, d)) = end.admission {
        child("kev.admission", t0, t0 + d, Vec::new());
    }
    let (passes, first, times) = end.passes;
    if let (Some(submitted), Some(first)) = (end.submitted, first) {
        child("kev.queue", submitted, first, Vec::new());
    }
    for p in passes {
        child(
            "kev.pass",
            p.start,
            p.start + p.took,
            vec![
                KeyValue::new("kev.tokens", p.tokens as i64),
                KeyValue::new("kev.batch", p.batch as i64),
                KeyValue::new("kev.lane", p.lane),
            ],
        );
    }
    if let (Some(last), Some((_, head))) = (passes.iter().map(|p| p.start + p.took).max(), times)
        && head > Duration::ZERO
    {
        child(
            "kev.readout",
            last.checked_sub(head).unwrap_or(last),
            last,
            Vec::new(),
        );
    }
}

/// Instants to wall-clock times, from one reading of both clocks.
struct Clock {
    instant: Instant,
    system: SystemTime,
}

impl Clock {
    fn now() -> Self {
        Clock {
            instant: Instant::now(),
            system: SystemTime::now(),
        }
    }

    fn at(&self, t: Instant) -> SystemTime {
        match self.instant.checked_duration_since(t) {
            Some(ago) => self.system - ago,
            None => self.system + t.duration_since(self.instant),
        }
    }
}

/// OTLP/HTTP through ureq: a blocking client, driven on the batch processor's own thread.
#[derive(Debug)]
struct UreqClient {
    agent: ureq::Agent,
}

impl UreqClient {
    fn new() -> Self {
        UreqClient {
            agent: ureq::AgentBuilder::new()
                .timeout(Duration::from_secs(10))
                .build(),
        }
    }
}

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for UreqClient {
    async fn send_bytes(
        &self,
        request: opentelemetry_http::Request<opentelemetry_http::Bytes>,
    ) -> Result<
        opentelemetry_http::Response<opentelemetry_http::Bytes>,
        opentelemetry_http::HttpError,
    > {
        use std::io::Read;
        let (parts, body) = request.into_parts();
        let mut req = self
            .agent
            .request(parts.method.as_str(), &parts.uri.to_string());
        for (name, value) in &parts.headers {
            if let Ok(v) = value.to_str() {
                req = req.set(name.as_str(), v);
            }
        }
        let resp = match req.send_bytes(&body) {
            Ok(r) | Err(ureq::Error::Status(_, r)) => r,
            Err(e) => return Err(Box::new(e)),
        };
        let mut out = opentelemetry_http::Response::builder().status(resp.status());
        for name in resp.headers_names() {
            if let Some(v) = resp.header(&name) {
                out = out.header(name.as_str(), v);
            }
        }
        let mut bytes = Vec::new();
        resp.into_reader().take(1 << 20).read_to_end(&mut bytes)?;
        Ok(out.body(opentelemetry_http::Bytes::from(bytes))?)
    }
}

/// An exporter whose exports run on a tokio runtime (tonic's), whichever thread asks.
#[derive(Debug)]
struct OnRuntime<E> {
    inner: Arc<E>,
    runtime: tokio::runtime::Handle,
}

impl<E: SpanExporter + 'static> SpanExporter for OnRuntime<E> {
    async fn export(&self, batch: Vec<SpanData>) -> opentelemetry_sdk::error::OTelSdkResult {
        let inner = Arc::clone(&self.inner);
        match self
            .runtime
            .spawn(async move { inner.export(batch).await })
            .await
        {
            Ok(r) => r,
            Err(e) => Err(opentelemetry_sdk::error::OTelSdkError::InternalFailure(
                e.to_string(),
            )),
        }
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> opentelemetry_sdk::error::OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> opentelemetry_sdk::error::OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.set_resource(resource);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::http_traces_url;

    #[test]
    fn the_http_url_gets_its_path_as_the_environment_variable_would() {
        assert_eq!(http_traces_url("http://c:4318"), "http://c:4318/v1/traces");
        assert_eq!(http_traces_url("http://c:4318/"), "http://c:4318/v1/traces");
        assert_eq!(
            http_traces_url("https://c.example/otlp/v1/traces"),
            "https://c.example/otlp/v1/traces"
        );
    }
}
