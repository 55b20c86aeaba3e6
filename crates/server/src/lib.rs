//! `kev serve`: the SystemOne HTTP API (`POST /v1/systemone`) in front of a Kev model.
//!
//! The server knows nothing about tokens or weights. It talks to the model through [`Decider`]:
//! `admit` validates and compiles a body (on a blocking worker, before the request takes a queue
//! slot), `run` answers a batch of admitted jobs on the one engine thread. Between the two sits a
//! bounded queue ([`queue`]): a full queue answers 429 at once, a job that waits past its deadline
//! gets 529, a job whose client disconnected is dropped before it costs compute.
//!
//! Layers come from tower-http (request ids, CORS, timeouts, zstd/gzip request decompression, body
//! limits, bearer auth); error bodies follow kev-contract §8.5 and are built in one place
//! ([`error::ApiError`]).
#![deny(missing_docs)]

pub mod error;
mod http;
mod metrics_setup;
pub mod pyrandom;
pub mod queue;
mod tools;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::Value;

pub use error::ApiError;
pub use http::router;

/// A job the decider accepted, with the token count the queue budgets passes by.
pub struct Admission<J> {
    /// The compiled request.
    pub job: J,
    /// Tokens it will run (`usage.input_tokens` is a fine measure).
    pub tokens: usize,
}

/// Counters a decider reports for `/metrics` (absolute values since start).
#[derive(Debug, Default, Clone, Copy)]
pub struct EngineStats {
    /// Token rows run (state prefixes and question branches).
    pub rows: u64,
    /// Forward passes run.
    pub passes: u64,
    /// Prepared-state cache hits.
    pub cache_hits: u64,
    /// Prepared-state cache misses.
    pub cache_misses: u64,
    /// Bytes held by the prepared-state cache.
    pub cache_bytes: u64,
}

/// What the server needs from a model.
pub trait Decider: Send + Sync + 'static {
    /// A validated, compiled request.
    type Job: Send + 'static;

    /// Validate and compile a request body. Errors are client errors (422 and friends).
    fn admit(&self, body: &[u8]) -> Result<Admission<Self::Job>, ApiError>;

    /// Answer jobs; one result per job, in order. Each `Ok` is a response body
    /// (`{model, answers, usage, …}`).
    fn run(&self, jobs: Vec<Self::Job>) -> Vec<Result<Value, ApiError>>;

    /// Answer one real request end to end; `/ready` turns 200 only after this succeeds.
    fn warm_up(&self) -> Result<(), String>;

    /// The model card fields (everything but `name`): `description`, `release_date`, `x_…` extras.
    fn model_card(&self) -> Value;

    /// `usage.output_tokens` of an answers object (`/v1/systemone/separate` counts its merged answers);
    /// `None`: the parts' counts are summed instead.
    fn output_tokens(&self, _answers: &Value) -> Option<usize> {
        None
    }

    /// Engine counters for `/metrics`.
    fn stats(&self) -> EngineStats {
        EngineStats::default()
    }
}

/// Server settings (flags and environment twins are defined by the CLI).
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Address to listen on.
    pub addr: SocketAddr,
    /// Bearer key for `/v1/*`; `None` leaves the API open.
    pub api_key: Option<String>,
    /// Jobs allowed to wait for the engine.
    pub queue_depth: usize,
    /// Longest a job may wait in the queue before it is answered 529.
    pub queue_deadline: Duration,
    /// Token budget of one engine pass across requests.
    pub pass_tokens: usize,
    /// Largest accepted request body, after decompression.
    pub max_body: usize,
    /// Longest a whole request may take.
    pub request_timeout: Duration,
    /// Model names listed by `/v1/models` (the first is the default, `kev-latest`).
    pub model_names: Vec<String>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            addr: SocketAddr::from(([127, 0, 0, 1], 8009)),
            api_key: None,
            queue_depth: 64,
            queue_deadline: Duration::from_secs(60),
            pass_tokens: 8192,
            max_body: 8 << 20,
            request_timeout: Duration::from_secs(300),
            model_names: vec!["kev-latest".into(), "jev-latest".into()],
        }
    }
}

/// Shared state of a running server.
pub struct App<D: Decider> {
    decider: Arc<D>,
    queue: queue::Queue<D::Job>,
    config: ServerConfig,
    ready: AtomicBool,
    draining: AtomicBool,
    metrics: metrics_exporter_prometheus::PrometheusHandle,
}

impl<D: Decider> App<D> {
    /// Start the engine thread; the app is not ready until [`App::warm_up`] succeeds.
    pub fn new(config: ServerConfig, decider: Arc<D>) -> Arc<Self> {
        let state = queue::QueueState::new(
            config.queue_depth,
            config.queue_deadline,
            config.pass_tokens,
        );
        let queue = queue::Queue::start(Arc::clone(&decider), state);
        Arc::new(App {
            decider,
            queue,
            config,
            ready: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            metrics: metrics_setup::handle(),
        })
    }

    /// Run the decider's warm-up decision (blocking) and mark the server ready if it succeeds.
    pub fn warm_up(&self) -> Result<(), String> {
        self.decider.warm_up()?;
        self.ready.store(true, Ordering::SeqCst);
        tracing::info!("warm-up decision succeeded; ready");
        Ok(())
    }

    /// Whether `/ready` answers 200.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst) && !self.draining.load(Ordering::SeqCst)
    }

    /// Stop taking new work (503), let accepted work finish.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    /// Finish accepted jobs and stop the engine thread.
    pub fn stop(&self) {
        self.start_draining();
        self.queue.shutdown();
    }
}

/// Errors that stop the server.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// Binding or serving failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The warm-up decision failed: the model cannot answer.
    #[error("warm-up decision failed: {0}")]
    WarmUp(String),
}

/// Serve until SIGINT/SIGTERM, then drain: refuse new work with 503, finish what was accepted, return.
/// If the warm-up decision fails the server stops too, with [`ServerError::WarmUp`].
pub async fn serve<D: Decider>(config: ServerConfig, decider: Arc<D>) -> Result<(), ServerError> {
    let listener = tokio::net::TcpListener::bind(config.addr).await?;
    serve_on(listener, config, decider, shutdown_signal()).await
}

/// [`serve`] on a bound listener, stopping when `stop` resolves (tests and embedders).
pub async fn serve_on<D: Decider>(
    listener: tokio::net::TcpListener,
    config: ServerConfig,
    decider: Arc<D>,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    tracing::info!(addr = %listener.local_addr()?, "listening");
    let app = App::new(config, decider);
    let (failed_tx, mut failed_rx) = tokio::sync::watch::channel(None::<String>);
    let warm = Arc::clone(&app);
    tokio::task::spawn_blocking(move || {
        if let Err(e) = warm.warm_up() {
            tracing::error!(error = %e, "warm-up decision failed; stopping");
            let _ = failed_tx.send(Some(e));
        }
    });
    let shutdown_app = Arc::clone(&app);
    let mut failed_watch = failed_rx.clone();
    axum::serve(
        listener,
        router(Arc::clone(&app)).into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async move {
        tokio::select! {
            _ = stop => tracing::info!("shutting down: draining accepted requests"),
            // The sender is dropped after a successful warm-up: that is no reason to stop.
            Ok(_) = failed_watch.wait_for(Option::is_some) => {},
        }
        shutdown_app.start_draining();
    })
    .await?;
    let stop_app = Arc::clone(&app);
    let _ = tokio::task::spawn_blocking(move || stop_app.stop()).await;
    if let Some(e) = failed_rx.borrow_and_update().clone() {
        return Err(ServerError::WarmUp(e));
    }
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
