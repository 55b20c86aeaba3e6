//! `kev serve`: the SystemOne HTTP API (`POST /v1/systemone`) in front of a Kev model.
//!
//! The server talks to the model through [`Decider`], which [`kev_decide::Kev`] implements ([`served`]); the
//! scheduling records it speaks in ([`Need`], [`Step`], [`Stats`]) are kev-decide's own, so the executor's
//! words reach the scheduler unchanged. Tests put stand-ins behind the same trait.
//!
//! Every decision route answers through one admission pipeline (`pipeline.rs`): a queue slot, the body
//! (with a timeout), its decoding, an admission permit, `Decider::admit_parts` on a blocking worker, the
//! request's parts submitted together to the bounded queue ([`queue`]: a full queue answers 429 at once, a
//! request that waits past its deadline gets 529, one whose client left or whose time ran out is stopped
//! before its next pass), and the answer. A route only says what its body asks the model (its parts) and how
//! their answers make its response (`pipeline::Route`).
//!
//! Layers come from tower-http (request ids, CORS, timeouts, zstd/gzip request decompression, body
//! limits, bearer auth); error bodies follow kev-contract §8.5 and are built in one place
//! ([`error::ApiError`]), their statuses taken from the contract's status table
//! ([`kev_contract::ErrorKind`]). [`openapi`] derives the API document from the wire types and the routes'
//! own declarations.
#![deny(missing_docs)]

mod accept;
mod admin;
pub mod audit;
mod batch;
mod canary;
mod conn;
pub mod error;
pub mod head;
mod http;
pub mod keys;
mod metrics_setup;
pub mod openapi;
mod permits;
mod pipeline;
pub mod pyrandom;
pub mod queue;
pub mod sched;
pub mod schemas;
pub mod served;
pub mod share;
mod states;
pub mod telemetry;
mod tools;
mod trail;
pub mod urgency;
mod wire;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::Value;

pub use error::ApiError;
pub use http::router;
pub use kev_decide::STATE_ID_FIELD;
pub use kev_decide::{Body, Need, Priority, Stats, Step, Urgency};
pub use pipeline::decode_request_body;
pub use queue::LongLane;
pub use wire::REQUEST_ID;

/// A job the decider accepted, with the token count the queue budgets passes by.
pub struct Admission<J> {
    /// The compiled request.
    pub job: J,
    /// Tokens it will run (`usage.input_tokens` is a fine measure).
    pub tokens: usize,
}

/// The adapter that answers a job, as the server names it (keys' policies, metrics, the audit log).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdapterTag {
    /// Its name: what a request's `model` selects it by, and what a key's `adapters` list names.
    pub name: String,
    /// sha256 of its weights file, when known.
    pub sha256: Option<String>,
}

/// What the server reads of an admitted job beside its work.
#[derive(Debug, Clone, Default)]
pub struct JobInfo {
    /// The adapter that answers it (`None`: the decider does not say).
    pub adapter: Option<AdapterTag>,
    /// Its priority and deadline as its body states them (`x_priority`, `x_deadline_ms`).
    pub urgency: Urgency,
}

/// What the server needs from a model.
///
/// The engine thread calls [`Decider::pass`] over and over, each time with the requests the scheduler
/// ([`sched`]) chose and the tokens each may run, so a long request advances piece by piece between other
/// requests' passes, and a request whose client left or whose time ran out is dropped between pieces.
pub trait Decider: Send + Sync + 'static {
    /// A validated, compiled request, and its progress once it runs.
    type Job: Send + 'static;

    /// Validate and compile a request body (a stand-in's one way in; kev's own decider admits through
    /// [`Decider::admit_parts`]). Errors are the client's (validation, limits, work caps) or, rarely, ours (a
    /// tokenizer fault); [`ApiError::from_wire`] answers any layer's typed error.
    fn admit(&self, body: &[u8]) -> Result<Admission<Self::Job>, ApiError>;

    /// Validate and compile the parts of one request (a fan-out route's: `/permute`, `/separate`; a plain
    /// request is one part), all or nothing, the per-request work caps held for the parts together; `owner`
    /// is the key the request came in under (a part naming a pinned state gets `owner`'s). Each part is read
    /// once ([`Body`]: bytes as sent, or a value read out of the route's body). The default admits each part
    /// as a request of its own, from bytes (a stand-in with no caps and no pins).
    fn admit_parts(
        &self,
        parts: Vec<Body<'static>>,
        owner: Option<&str>,
    ) -> Result<Vec<Admission<Self::Job>>, ApiError> {
        let _ = owner;
        parts
            .into_iter()
            .map(|b| self.admit(&b.into_bytes()))
            .collect()
    }

    /// Admit the independent requests of one batch (`/v1/systemone/batch`): each on its own (a refused one is
    /// its own `Err`, answered in its place), the outer `Err` for a batch over its own caps (nothing runs).
    /// The default admits each as a request of its own (a stand-in with no batch caps and no pins).
    #[allow(clippy::type_complexity)]
    fn admit_batch(
        &self,
        parts: Vec<Body<'static>>,
        owner: Option<&str>,
    ) -> Result<Vec<Result<Admission<Self::Job>, ApiError>>, ApiError> {
        let _ = owner;
        Ok(parts
            .into_iter()
            .map(|b| self.admit(&b.into_bytes()))
            .collect())
    }

    /// The pinned states' byte budget (0: pinning is not offered).
    fn pin_budget(&self) -> usize {
        0
    }

    /// Admit a state to pin (`POST /v1/systemone/states`; body `{model?, state}`) as `order` says; it is
    /// pinned only by [`Decider::pin_commit`] once its answer is ready, and dropped by
    /// [`Decider::pin_abandon`] if the request ends otherwise. The default: pinning is not offered (404).
    fn admit_pin(
        &self,
        _body: Body<'static>,
        _order: &kev_decide::PinOrder,
    ) -> Result<Admission<Self::Job>, ApiError> {
        Err(ApiError::not_found())
    }

    /// The pin request `id` was answered: pin it (its TTL starts now) and say what it is,
    /// `{id, tokens, bytes, expires_at, ready}` — or why it could not be kept (its snapshot did not fit).
    fn pin_commit(&self, _id: &str) -> Result<Value, ApiError> {
        Err(ApiError::internal())
    }

    /// The pin request `id` ended without its answer: drop what it reserved (a pinned one stays).
    fn pin_abandon(&self, _id: &str) {}

    /// Pin `id` as `owner` sees it: `{id, tokens, bytes, expires_at, ready}`; `None` if there is none (or it is
    /// another owner's).
    fn pin_info(&self, _id: &str, _owner: Option<&str>) -> Option<Value> {
        None
    }

    /// Unpin `id` (its owner only); whether it was there.
    fn unpin(&self, _id: &str, _owner: Option<&str>) -> bool {
        false
    }

    /// One `(name, card)` per adapter served over the backbone, the default first (`/v1/models` lists each
    /// under its own name). The default: none beyond [`Decider::model_card`].
    fn adapter_cards(&self) -> Vec<(String, Value)> {
        Vec::new()
    }

    /// Whether adapters can be added and removed while serving (`/v1/adapters`). The default: no.
    fn live_adapters(&self) -> bool {
        false
    }

    /// Serve the adapter in `dir` under `name` from the next request on (called on a blocking worker, never the
    /// engine thread; installed between passes): its card. The default: not offered (409).
    fn add_adapter(&self, _name: &str, _dir: &std::path::Path) -> Result<Value, ApiError> {
        Err(ApiError::typed(
            kev_contract::ErrorKind::Conflict,
            "this model does not take adapters live",
        ))
    }

    /// Stop serving adapter `name` (requests in flight on it finish on it). The default: not offered (409).
    fn remove_adapter(&self, _name: &str) -> Result<(), ApiError> {
        Err(ApiError::typed(
            kev_contract::ErrorKind::Conflict,
            "this model does not take adapters live",
        ))
    }

    /// Whom an admitted job is for and how urgent it says it is (default: nothing known).
    fn job_info(&self, _job: &Self::Job) -> JobInfo {
        JobInfo::default()
    }

    /// The state of an admitted job as it was sent, for an audit log that asks for states
    /// (`--audit-log-states`; default: none).
    fn job_state(&self, _job: &Self::Job) -> Option<Value> {
        None
    }

    /// What the job has left.
    fn need(&self, job: &Self::Job) -> Need;

    /// One engine pass in `lane`: advance each job by at most its grant of tokens, and by at least one
    /// unit. One [`Step`] per grant, in order; a failure is logged by the server with its cause. A
    /// background pass (the long lane's) steps aside at the engine's safe points while a foreground pass
    /// runs.
    fn pass(&self, grants: &mut [(&mut Self::Job, usize)], lane: kev_decide::Lane) -> Vec<Step>;

    /// Anything to do before the warm-up request, on a blocking worker (default: nothing).
    fn warm_up(&self) -> Result<(), String> {
        Ok(())
    }

    /// A request body the server answers through its own pipeline (admission, queue, engine passes) before
    /// `/ready` turns 200, so that readiness proves the path requests take; `None`: no warm-up decision.
    fn warm_up_request(&self) -> Option<Vec<u8>> {
        None
    }

    /// The model card fields (everything but `name`): `description`, `release_date`, `x_…` extras.
    fn model_card(&self) -> Value;

    /// `usage.output_tokens` of an answers object (`/v1/systemone/separate` counts its merged answers);
    /// `None`: the parts' counts are summed instead.
    fn output_tokens(&self, _answers: &Value) -> Option<usize> {
        None
    }

    /// Engine counters for `/metrics`.
    fn stats(&self) -> Stats {
        Stats::default()
    }
}

/// Server settings (flags and environment twins are defined by the CLI).
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Address to listen on.
    pub addr: SocketAddr,
    /// The unnamed bearer key for `/v1/*` (`KEV_API_KEY`); with neither it nor `api_keys` the API is open.
    pub api_key: Option<String>,
    /// Named keys with their own limits (`--api-keys FILE`, [`keys::Keys`]), beside the unnamed one.
    pub api_keys: Option<Arc<keys::Keys>>,
    /// Jobs allowed to wait for the engine.
    pub queue_depth: usize,
    /// Longest a job may wait in the queue before it is answered 529.
    pub queue_deadline: Duration,
    /// Token budget of one engine pass across requests.
    pub pass_tokens: usize,
    /// Passes a request may be skipped in a row before it goes first (aging; see [`sched`]).
    pub starve_passes: u32,
    /// Requests longer than one pass that may be in flight at once (each holds a state's cache).
    pub long_in_flight: usize,
    /// Longest piece of long work when no short work was seen lately (see [`sched`]).
    pub solo_piece: Duration,
    /// Long work runs on a lane of its own at a low priority, beside the short passes (a short request
    /// never waits for a long piece, however deep in its state; [`LongLane::On`], the default, or
    /// [`LongLane::Low`] on a shared host); [`LongLane::Off`] makes them take turns on the one engine
    /// thread.
    pub long_lane: LongLane,
    /// Requests parsed and tokenized at once (admission permits; about the number of cores).
    pub admit_permits: usize,
    /// Open connections at most; further connections wait in the listen backlog.
    pub max_connections: usize,
    /// Open connections one peer address may hold (`None`: a quarter of `max_connections`); a connection
    /// past it is answered 429 and closed ([`ServerConfig::connections_per_ip`]).
    pub max_connections_per_ip: Option<usize>,
    /// Longest a client may take to send a request's headers (slow clients are closed); also the idle
    /// timeout (a connection, HTTP/1.1 or HTTP/2, with no request open for this long is closed) and the
    /// send timeout (a connection whose answers have not moved for this long is closed: a client that does
    /// not read them).
    pub header_read_timeout: Duration,
    /// Longest a decision request's body may take to arrive once its headers did (408); never less than
    /// `header_read_timeout`.
    pub body_read_timeout: Duration,
    /// Largest accepted request body, after decompression.
    pub max_body: usize,
    /// Longest a whole request may take.
    pub request_timeout: Duration,
    /// Model names listed by `/v1/models` (the first is the default, `kev-latest`).
    pub model_names: Vec<String>,
    /// Longest the drain after SIGTERM may take: past it, requests still waiting or running are answered 503
    /// (their work stopped), connections still open a moment later closed, and the server returns within
    /// [`DRAIN_GRACE`] of the deadline — before the usual 30 s grace of a process manager runs out.
    pub drain_timeout: Duration,
    /// A bearer key `/metrics` asks for (`None`: open, as `/health` is).
    pub metrics_key: Option<String>,
    /// The slowest a decision request's body may arrive, in bytes per second over any `body_rate_window`
    /// (0: no floor, only `body_read_timeout`): a client dribbling its body, or stalling after a burst,
    /// holds its body permit about a window, not the whole body timeout.
    pub min_body_rate: usize,
    /// How long a body may take before the rate floor applies.
    pub body_grace: Duration,
    /// Put before every pinned-state id this server makes (empty for `kev serve`). A fleet front end names
    /// the replica here, so that an id says which replica holds its pin (`kev.serve` routes by it); a
    /// replica that does not hold the id answers the usual 404.
    pub pin_id_prefix: String,
    /// The audit log (`--audit-log`): a JSON line per decision request ([`audit`]); `None`: none.
    pub audit: Option<Arc<audit::AuditLog>>,
    /// How often the warm-up decision is answered again and compared with its answer at start (`canary`):
    /// `/ready` is 503 while the latest one failed or diverged. `None`: no canary.
    pub canary_interval: Option<Duration>,
    /// The key of the adapter admin routes (`KEV_ADMIN_KEY`, `--admin-key-file`; keys marked `admin` in the
    /// keys file count too). With none, the routes answer 403 saying how to enable them.
    pub admin_key: Option<String>,
    /// The adapters file the server was started with (`--adapters-file`): read again on SIGHUP, adapters
    /// added, removed or loaded again to match it.
    pub adapters_file: Option<std::path::PathBuf>,
    /// Listen for SIGHUP (keys file, audit log, adapters file). [`serve`] sets it.
    pub reload_on_sighup: bool,
    /// The window the rate floor holds over (a body gets one window to begin).
    pub body_rate_window: Duration,
    /// The long lane's share of a machine saturated with short requests (0 < share < 1): while long work
    /// runs, short passes step aside for it this fraction of the time ([`share`]).
    pub long_lane_share: f64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            addr: SocketAddr::from(([127, 0, 0, 1], 8009)),
            api_key: None,
            api_keys: None,
            queue_depth: 64,
            queue_deadline: Duration::from_secs(60),
            pass_tokens: 8192,
            starve_passes: 4,
            long_in_flight: 2,
            solo_piece: Duration::from_secs(2),
            long_lane: LongLane::On,
            admit_permits: std::thread::available_parallelism().map_or(2, |n| n.get()),
            max_connections: 1024,
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(30),
            max_body: 8 << 20,
            request_timeout: Duration::from_secs(300),
            model_names: vec!["kev-latest".into(), "jev-latest".into()],
            drain_timeout: Duration::from_secs(25),
            metrics_key: None,
            min_body_rate: 16 << 10,
            body_grace: Duration::from_secs(1),
            pin_id_prefix: String::new(),
            audit: None,
            canary_interval: None,
            admin_key: None,
            adapters_file: None,
            reload_on_sighup: false,
            body_rate_window: Duration::from_secs(2),
            max_connections_per_ip: None,
            long_lane_share: share::DEFAULT_SHARE,
        }
    }
}

impl ServerConfig {
    /// The long lane's share in force: `long_lane_share` as [`share::LaneShare`] clamps it, 0 without a lane.
    pub fn long_lane_share_in_force(&self) -> f64 {
        match self.long_lane {
            LongLane::Off => 0.0,
            _ => share::LaneShare::new(self.long_lane_share).share(),
        }
    }

    /// The connections one peer address may hold: `max_connections_per_ip`, or a quarter of
    /// `max_connections` (at least 1).
    pub fn connections_per_ip(&self) -> usize {
        self.max_connections_per_ip
            .unwrap_or(self.max_connections / 4)
            .clamp(1, self.max_connections.max(1))
    }
}

/// How long past the drain deadline the server takes to return: the 503s written, then what is still open
/// closed ([`accept`]); the engine's pass in flight is not waited for ([`queue::SHUTDOWN_WAIT`]).
pub const DRAIN_GRACE: Duration = Duration::from_secs(1);

/// Request bodies read at once for a queue of `queue_depth`: twice the depth, so a full queue's worth of
/// bodies can arrive while as many requests wait, and slow senders cannot hold more.
pub(crate) fn body_permits(queue_depth: usize) -> usize {
    2 * queue_depth.max(1)
}

/// Shared state of a running server.
pub struct App<D: Decider> {
    decider: Arc<D>,
    keys: Option<Arc<keys::Keys>>,
    queue: queue::Queue<D::Job>,
    permits: tokio::sync::Semaphore,
    /// Bodies being read at once: [`body_permits`], shared between peer addresses and keys ([`permits`]).
    bodies: permits::BodyPermits,
    config: ServerConfig,
    ready: AtomicBool,
    draining: AtomicBool,
    /// The periodic canary decision's verdict (`/ready`).
    canary: canary::Canary,
    metrics: metrics_exporter_prometheus::PrometheusHandle,
    /// Where each decision request's record goes (histograms, the audit log, its trace).
    sinks: Arc<trail::Sinks>,
    /// The API document `GET /openapi.json` serves ([`openapi::json`]), given to the router here: the
    /// document lists every route, its own included.
    document: fn() -> &'static str,
}

impl<D: Decider> App<D> {
    /// Start the engine thread; the app is not ready until [`App::warm_up`] succeeds.
    pub fn new(config: ServerConfig, decider: Arc<D>) -> Arc<Self> {
        let queue = queue::Queue::start(
            Arc::clone(&decider),
            queue::QueueConfig {
                depth: config.queue_depth.max(1),
                deadline: config.queue_deadline,
                policy: sched::Policy {
                    pass_tokens: config.pass_tokens.max(1),
                    starve_passes: config.starve_passes.max(1),
                    long_in_flight: config.long_in_flight.max(1),
                    // A solo piece never outlasts half the queue deadline: short requests that arrive
                    // during one still start before theirs.
                    solo_piece: config.solo_piece.min(config.queue_deadline / 2),
                },
                long_lane: config.long_lane,
                long_lane_share: config.long_lane_share,
            },
        );
        let permits = tokio::sync::Semaphore::new(config.admit_permits.max(1));
        let bodies = permits::BodyPermits::new(body_permits(config.queue_depth));
        let unnamed = config.api_key.clone().filter(|k| !k.is_empty());
        let keys = match (config.api_keys.clone(), unnamed) {
            (Some(keys), None) => Some(keys),
            (Some(keys), Some(secret)) => {
                keys.add_unnamed(&secret);
                Some(keys)
            }
            (None, Some(secret)) => Some(Arc::new(keys::Keys::single(&secret))),
            (None, None) => None,
        };
        Arc::new(App {
            decider,
            keys,
            queue,
            permits,
            bodies,
            ready: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            canary: canary::Canary::default(),
            metrics: metrics_setup::handle(),
            sinks: Arc::new(trail::Sinks {
                audit: config.audit.clone(),
                request_timeout: config.request_timeout,
            }),
            config,
            document: openapi::json,
        })
    }

    /// Run the decider's warm-up, then its warm-up request through the served path (admission, the queue,
    /// engine passes: `pipeline::answer_body`), and mark the server ready if both succeed.
    pub async fn warm_up(self: &Arc<Self>) -> Result<(), String> {
        let decider = Arc::clone(&self.decider);
        tokio::task::spawn_blocking(move || decider.warm_up())
            .await
            .map_err(|e| format!("warm-up: {e}"))??;
        if let Some(body) = self.decider.warm_up_request() {
            let answer = pipeline::answer_body(self, body.clone(), "warm-up", Priority::High)
                .await
                .map_err(|e| e.error_body().to_value().to_string())?;
            self.canary.set_reference(&answer);
            if let Some(every) = self.config.canary_interval {
                tokio::spawn(canary::run(Arc::clone(self), body, every));
            }
        }
        self.ready.store(true, Ordering::SeqCst);
        tracing::info!("warm-up decision succeeded; ready");
        Ok(())
    }

    /// Whether `/ready` answers 200: warmed up, not draining, and the latest canary passed.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
            && !self.draining.load(Ordering::SeqCst)
            && self.canary.failing().is_none()
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
/// If the warm-up decision fails the server stops too, with [`ServerError::WarmUp`]. On SIGHUP the keys file
/// (`ServerConfig::api_keys`) is read again ([`keys::Keys::reload`]) without dropping a request.
pub async fn serve<D: Decider>(
    mut config: ServerConfig,
    decider: Arc<D>,
) -> Result<(), ServerError> {
    let listener = tokio::net::TcpListener::bind(config.addr).await?;
    config.reload_on_sighup = true;
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
    #[cfg(unix)]
    if app.config.reload_on_sighup {
        tokio::spawn(reload_on_sighup(Arc::clone(&app)));
    }
    let (failed_tx, mut failed_rx) = tokio::sync::watch::channel(None::<String>);
    let warm = Arc::clone(&app);
    tokio::spawn(async move {
        if let Err(e) = warm.warm_up().await {
            tracing::error!(error = %e, "warm-up decision failed; stopping");
            let _ = failed_tx.send(Some(e));
        }
    });
    let mut failed_watch = failed_rx.clone();
    let stop = async move {
        tokio::select! {
            _ = stop => tracing::info!("shutting down: draining accepted requests"),
            // The sender is dropped after a successful warm-up: that is no reason to stop.
            Ok(_) = failed_watch.wait_for(Option::is_some) => {},
        }
    };
    accept::accept_loop(listener, Arc::clone(&app), stop).await;
    let stop_app = Arc::clone(&app);
    let _ = tokio::task::spawn_blocking(move || stop_app.stop()).await;
    if let Some(e) = failed_rx.borrow_and_update().clone() {
        return Err(ServerError::WarmUp(e));
    }
    Ok(())
}

/// On SIGHUP: the keys file read again, the audit log's file opened again (after a rotation), the adapters
/// file read again and the adapters brought to it ([`admin::FileAdapters`]).
#[cfg(unix)]
async fn reload_on_sighup<D: Decider>(app: Arc<App<D>>) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut hup) = signal(SignalKind::hangup()) else {
        tracing::warn!("cannot listen for SIGHUP: the keys and adapters files are read once");
        return;
    };
    let default = app.decider.adapter_cards().first().map(|(n, _)| n.clone());
    let mut files =
        admin::FileAdapters::start(app.config.adapters_file.clone(), default.as_deref());
    while hup.recv().await.is_some() {
        if let Some(audit) = &app.config.audit {
            audit.reopen();
        }
        let changes = files.sync(&app).await;
        if app.config.adapters_file.is_some() {
            tracing::info!(changes, "SIGHUP: adapters file read again");
        }
        let Some(keys) = &app.config.api_keys else {
            continue;
        };
        match keys.reload() {
            Ok(n) => {
                tracing::info!(keys = n, names = ?keys.names(), "SIGHUP: keys file read again")
            }
            Err(e) => {
                tracing::error!(error = %e, "SIGHUP: the keys file does not read; the keys in force stay")
            }
        }
    }
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
