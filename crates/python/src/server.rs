//! `kev._kev.Server`: `kev serve` in-process, without a socket. It is kev-server's own application
//! ([`kev_server::App`] and [`kev_server::router`]: every route, the one admission pipeline, the queue and
//! scheduler, the error table) over the model an [`Engine`] loaded, and it answers a request given as
//! method, target, headers and body with the status, headers and body `kev serve` would send for it. A Ray
//! Serve replica (`kev.serve`) is one of these: its answers are `kev serve`'s because they are made by the same
//! code, not by a copy of it.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderName, HeaderValue, Method, Request};
use http_body_util::BodyExt;
use kev_decide::CpuBackend;
use kev_decide::Kev;
use kev_server::{App, ServerConfig};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use tower::ServiceExt;

use crate::Engine;

/// `Server(engine, options)`'s options: `kev serve`'s server flags (the Python half documents them; `None`
/// keeps `kev serve`'s default).
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
struct ServerOptions {
    queue_depth: Option<usize>,
    queue_deadline_ms: Option<u64>,
    long_lane: Option<String>,
    max_body: Option<usize>,
    request_timeout_s: Option<u64>,
    admit_permits: Option<usize>,
    api_key: Option<String>,
    metrics_key: Option<String>,
    min_body_rate: Option<usize>,
    pin_id_prefix: Option<String>,
    /// Tokio worker threads (HTTP and admission hand-offs; the engine has its own threads).
    io_threads: Option<usize>,
}

/// A running in-process server.
#[pyclass(frozen, module = "kev._kev")]
pub(crate) struct Server {
    app: Arc<App<Kev<CpuBackend>>>,
    router: axum::Router,
    runtime: tokio::runtime::Runtime,
}

/// Headers as they cross to Python: `(name, value)` byte pairs, in order, repeated names kept.
type RawHeaders = Vec<(Vec<u8>, Vec<u8>)>;

/// `(status, headers, body)` as Python gets them.
type Reply<'py> = (
    u16,
    Vec<(Bound<'py, PyBytes>, Bound<'py, PyBytes>)>,
    Bound<'py, PyBytes>,
);

/// A [`Reply`] held beyond the interpreter attachment that made it (what an `async` method returns).
struct PyAnswer(Py<pyo3::types::PyTuple>);

impl<'py> IntoPyObject<'py> for PyAnswer {
    type Target = pyo3::types::PyTuple;
    type Output = Bound<'py, pyo3::types::PyTuple>;
    type Error = std::convert::Infallible;

    fn into_pyobject(self, py: Python<'py>) -> Result<Self::Output, Self::Error> {
        Ok(self.0.into_bound(py))
    }
}

/// A response's head and its whole body.
struct Answered {
    parts: axum::http::response::Parts,
    body: bytes::Bytes,
}

impl Answered {
    fn into_python<'py>(self, py: Python<'py>) -> Reply<'py> {
        let headers = self
            .parts
            .headers
            .iter()
            .map(|(k, v)| {
                (
                    PyBytes::new(py, k.as_str().as_bytes()),
                    PyBytes::new(py, v.as_bytes()),
                )
            })
            .collect();
        (
            self.parts.status.as_u16(),
            headers,
            PyBytes::new(py, &self.body),
        )
    }
}

/// The router's answer to one request, its body collected.
async fn respond(router: axum::Router, request: Request<Body>) -> Result<Answered, String> {
    let response = router.oneshot(request).await.unwrap_or_else(|e| match e {});
    let (parts, body) = response.into_parts();
    let body = body
        .collect()
        .await
        .map_err(|e| format!("reading the response body: {e}"))?
        .to_bytes();
    Ok(Answered { parts, body })
}

/// A request running on the server's runtime; dropping it (the awaiting coroutine cancelled) aborts the
/// task, which drops the handler: the pipeline stops the request's parts before their next pass.
struct Answer(tokio::task::JoinHandle<Result<Answered, String>>);

impl std::future::Future for Answer {
    type Output = Result<Answered, String>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.0)
            .poll(cx)
            .map(|joined| joined.map_err(|e| format!("the request task failed: {e}"))?)
    }
}

impl Drop for Answer {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl ServerOptions {
    fn config(&self, engine: &Engine) -> PyResult<ServerConfig> {
        let d = ServerConfig::default();
        let long_lane = match self.long_lane.as_deref() {
            None | Some("on") => kev_server::LongLane::On,
            Some("low") => kev_server::LongLane::Low,
            Some("off") => kev_server::LongLane::Off,
            Some(other) => {
                return Err(PyValueError::new_err(format!(
                    "long_lane is 'on', 'low' or 'off', not {other:?}"
                )));
            }
        };
        // As `kev serve` builds it (crates/cli/src/cmd/serve.rs): the model's pass budget and names.
        Ok(ServerConfig {
            queue_depth: self.queue_depth.unwrap_or(d.queue_depth).max(1),
            queue_deadline: self
                .queue_deadline_ms
                .map_or(d.queue_deadline, Duration::from_millis),
            pass_tokens: engine.kev.settings().pass_tokens,
            long_lane,
            max_body: self.max_body.unwrap_or(d.max_body),
            request_timeout: self
                .request_timeout_s
                .map_or(d.request_timeout, |s| Duration::from_secs(s.max(1))),
            admit_permits: self.admit_permits.unwrap_or(d.admit_permits).max(1),
            api_key: self.api_key.clone().filter(|k| !k.is_empty()),
            metrics_key: self.metrics_key.clone().filter(|k| !k.is_empty()),
            min_body_rate: self.min_body_rate.unwrap_or(d.min_body_rate),
            model_names: engine.names.clone(),
            pin_id_prefix: self.pin_id_prefix.clone().unwrap_or_default(),
            ..d
        })
    }
}

#[pymethods]
impl Server {
    /// Start the server over `engine`'s model and answer its warm-up decision through the pipeline (as
    /// `kev serve` does before `/ready` turns 200); returns once it is ready, or raises if the model cannot
    /// answer.
    #[new]
    fn new(py: Python<'_>, engine: &Engine, options: ServerOptions) -> PyResult<Self> {
        let config = options.config(engine)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(options.io_threads.unwrap_or(2).max(1))
            .thread_name("kev-server")
            .enable_all()
            .build()
            .map_err(|e| PyRuntimeError::new_err(format!("starting the async runtime: {e}")))?;
        let decider = Arc::clone(&engine.kev);
        let app = {
            // The engine thread and the queue start inside the runtime (they spawn on it).
            let _entered = runtime.enter();
            App::new(config, decider)
        };
        let warm = Arc::clone(&app);
        py.detach(|| runtime.block_on(warm.warm_up()))
            .map_err(|e| PyRuntimeError::new_err(format!("warm-up decision failed: {e}")))?;
        let router = kev_server::router(Arc::clone(&app));
        Ok(Server {
            app,
            router,
            runtime,
        })
    }

    /// Answer one request: `method`, `target` (path and query), `headers` as `(name, value)` byte pairs,
    /// `body`. Returns `(status, headers, body)` as `kev serve` sends them (less what the connection adds:
    /// `date`, and `content-length`, which the caller's HTTP server writes). The GIL is released.
    fn handle<'py>(
        &self,
        py: Python<'py>,
        method: &str,
        target: &str,
        headers: RawHeaders,
        body: Vec<u8>,
    ) -> PyResult<Reply<'py>> {
        let request = build_request(method, target, headers, body)?;
        let task = self.runtime.spawn(respond(self.router.clone(), request));
        let answered = py.detach(|| self.runtime.block_on(Answer(task)));
        answered
            .map(|a| a.into_python(py))
            .map_err(PyRuntimeError::new_err)
    }

    /// [`Server::handle`] as an asyncio awaitable: the request runs on the server's runtime and the
    /// awaiting coroutine resumes when it is answered (no thread of the caller's held). Cancelling the
    /// awaitable stops the request as a client hanging up on `kev serve` does (before its next pass).
    async fn handle_async(
        &self,
        method: String,
        target: String,
        headers: RawHeaders,
        body: Vec<u8>,
    ) -> PyResult<PyAnswer> {
        let request = build_request(&method, &target, headers, body)?;
        let task = self.runtime.spawn(respond(self.router.clone(), request));
        let answered = Answer(task).await.map_err(PyRuntimeError::new_err)?;
        Python::attach(|py| {
            let reply = answered.into_python(py).into_pyobject(py)?;
            Ok(PyAnswer(reply.unbind()))
        })
    }

    /// Whether `/ready` would answer 200 (warmed up, not draining).
    #[getter]
    fn ready(&self) -> bool {
        self.app.is_ready()
    }

    /// Stop taking new work (503 `unavailable_error`), finish what was accepted, stop the engine thread.
    fn close(&self, py: Python<'_>) {
        let app = Arc::clone(&self.app);
        py.detach(move || app.stop());
    }
}

/// The answer kev-server gives for an error of `kind` (`unavailable`: 503 `unavailable_error` with
/// `Retry-After: 1`; `internal`: 500 `api_error` naming the request id), as `(status, headers, body)` — for
/// what a fleet's front end must answer itself (no replica could take the request), in the server's own
/// words and shape.
#[pyfunction]
pub(crate) fn error_answer<'py>(
    py: Python<'py>,
    kind: &str,
    message: &str,
    request_id: &str,
) -> PyResult<Reply<'py>> {
    use axum::response::IntoResponse;
    use kev_contract::ErrorKind;
    let error = match kind {
        "unavailable" => {
            kev_server::ApiError::typed(ErrorKind::Unavailable, message).with_retry_after(1)
        }
        "internal" => kev_server::ApiError::typed(ErrorKind::Internal, message),
        other => {
            return Err(PyValueError::new_err(format!(
                "error kind {other:?}: unavailable or internal"
            )));
        }
    };
    let response = error.for_request(request_id).into_response();
    let (mut parts, body) = response.into_parts();
    let body = tokio::runtime::Builder::new_current_thread()
        .build()
        .map_err(|e| PyRuntimeError::new_err(e.to_string()))?
        .block_on(body.collect())
        .map_err(|e| PyRuntimeError::new_err(e.to_string()))?
        .to_bytes();
    // The request-id layer's part of the answer (an error given outside the router).
    let rid = HeaderValue::from_str(request_id)
        .map_err(|e| PyValueError::new_err(format!("request id: {e}")))?;
    parts.headers.insert(kev_server::REQUEST_ID, rid);
    Ok(Answered { parts, body }.into_python(py))
}

impl Drop for Server {
    fn drop(&mut self) {
        self.app.stop();
    }
}

fn build_request(
    method: &str,
    target: &str,
    headers: RawHeaders,
    body: Vec<u8>,
) -> PyResult<Request<Body>> {
    let method = Method::from_bytes(method.as_bytes())
        .map_err(|e| PyValueError::new_err(format!("method {method:?}: {e}")))?;
    let mut builder = Request::builder().method(method).uri(target);
    for (name, value) in headers {
        let name = HeaderName::from_bytes(&name)
            .map_err(|e| PyValueError::new_err(format!("header name: {e}")))?;
        let value = HeaderValue::from_bytes(&value)
            .map_err(|e| PyValueError::new_err(format!("header {name}: {e}")))?;
        builder = builder.header(name, value);
    }
    builder
        .body(Body::from(body))
        .map_err(|e| PyValueError::new_err(format!("request {target:?}: {e}")))
}
