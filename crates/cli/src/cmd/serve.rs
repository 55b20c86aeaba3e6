//! `kev serve`: the SystemOne HTTP API over a local model.
//!
//! The model is named like every other command (`--model DIR` or `--base DIR --kev DIR`), or `--demo`
//! (kev-mini, the bundled miniature Kev in `fixtures/mini`), or nothing: then the prepared Kev-4B v1.0 (or
//! `--release kev-0.8b`, `--release kev-9b`) from the kev cache, prepared first (downloaded, verified,
//! merged) when absent. `/v1/models` lists the size (`kev-4b`, `kev-0.8b`, `kev-9b`) beside `kev-latest`
//! and `jev-latest`.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use kev_decide::ModelInfo;
use kev_release::Release;
use kev_server::ServerConfig;

use crate::loading::{ServiceArgs, load};
use crate::model_args::ModelArgs;

/// Serve the SystemOne HTTP API.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    service: ServiceArgs,
    /// Serve kev-mini, the bundled miniature Kev (trained, in the real formats; not Kev-4B), so anyone can try the API.
    #[arg(long, conflicts_with_all = ["model", "base", "kev"])]
    demo: bool,
    /// Address to bind.
    #[arg(long, env = "KEV_HOST", default_value = "127.0.0.1")]
    host: IpAddr,
    /// Port to bind.
    #[arg(long, env = "KEV_PORT", default_value_t = 8009)]
    port: u16,
    /// Requests allowed to wait for the engine; beyond it requests get 429 at once.
    #[arg(long, env = "KEV_QUEUE_DEPTH", default_value_t = 64)]
    queue_depth: usize,
    /// Longest a request may wait in the queue before it is answered 529 (milliseconds).
    #[arg(long, env = "KEV_QUEUE_DEADLINE_MS", default_value_t = 60_000)]
    queue_deadline_ms: u64,
    /// Run long work (a state longer than a pass) on a lane of its own at the lowest OS priority,
    /// `SCHED_IDLE`, beside the short requests' passes (`on`); the same at nice 10 (`low`: for a host
    /// shared with other busy processes, where `on` stops long work while they keep every core busy); or
    /// in turns with short passes on the one engine thread (`off`).
    #[arg(long, env = "KEV_LONG_LANE", default_value = "on", value_parser = ["on", "low", "off"])]
    long_lane: String,
    /// The long lane's share of a machine saturated with short requests (0.05 to 0.9): while long work runs,
    /// short requests step aside for it this fraction of the time, so a long request's wait is at most about
    /// its time alone over the share (plus the queue ahead of it); `/metrics` reports it
    /// (`kev_long_lane_share`).
    #[arg(long, env = "KEV_LONG_LANE_SHARE", default_value_t = kev_server::share::DEFAULT_SHARE,
        value_parser = share_value)]
    long_lane_share: f64,
    /// Largest request body accepted, after decompression (bytes).
    #[arg(long, env = "KEV_MAX_BODY", default_value_t = 8 << 20)]
    max_body: usize,
    /// Longest a whole request may take (seconds); past it the request is answered 408 `timeout_error`
    /// and stopped before its next engine pass.
    #[arg(long, env = "KEV_REQUEST_TIMEOUT_S", default_value_t = 300)]
    request_timeout_s: u64,
    /// Open connections at most (further ones wait in the listen backlog).
    #[arg(long, env = "KEV_MAX_CONNECTIONS", default_value_t = 1024)]
    max_connections: usize,
    /// Open connections one peer address may hold (default: a quarter of --max-connections); one more is
    /// answered 429 and closed. Behind a reverse proxy every connection comes from the proxy's address: set
    /// it to --max-connections there.
    #[arg(long, env = "KEV_MAX_CONNECTIONS_PER_IP")]
    max_connections_per_ip: Option<usize>,
    /// Longest a client may take to send a request's headers, longest an idle keep-alive connection stays
    /// open, and longest a connection's answers may stand still (a client that does not read them) before
    /// it is closed (seconds).
    #[arg(long, env = "KEV_HEADER_READ_TIMEOUT_S", default_value_t = 10)]
    header_read_timeout_s: u64,
    /// Requests parsed and tokenized at once (default: the number of cores).
    #[arg(long, env = "KEV_ADMIT_PERMITS")]
    admit_permits: Option<usize>,
    /// Extra model names `/v1/models` lists and requests may use (`kev-latest` and `jev-latest` always are).
    #[arg(long = "alias", env = "KEV_ALIASES", value_delimiter = ',')]
    aliases: Vec<String>,
    /// A file holding the API key (first line); `KEV_API_KEY` does the same. Without either the API is open.
    #[arg(long, value_name = "FILE")]
    api_key_file: Option<PathBuf>,
    /// Named API keys with their own limits, a JSON file: `{"keys": [{"name", "key", "requests_per_second"?,
    /// "tokens_per_minute"?, "concurrent"?}]}`. Each key's 429s are its own; `/metrics` and the access log
    /// name the key (never the secret). Read again on SIGHUP (removed keys get 401, others keep their state).
    /// The unnamed key (`KEV_API_KEY`, --api-key-file) still works beside them.
    #[arg(long, env = "KEV_API_KEYS", value_name = "FILE")]
    api_keys: Option<PathBuf>,
    /// Longest the drain after SIGTERM/SIGINT may take (seconds): requests still waiting or running then are
    /// answered 503 and stopped, connections still open a second later closed, and the process exits within
    /// about 3 s of the deadline whatever is in flight (below the usual 30 s grace before SIGKILL). During
    /// the drain new requests get 503.
    #[arg(long, env = "KEV_DRAIN_TIMEOUT_S", default_value_t = 25)]
    drain_timeout_s: u64,
    /// The slowest a request body may arrive, in bytes per second over any 2 s (0 turns the floor off): a
    /// client dribbling its body, or stalling after a burst, is answered 408 and its body permit freed within
    /// about 2 s, instead of holding it for the whole body timeout.
    #[arg(long, env = "KEV_MIN_BODY_RATE", default_value_t = 16 << 10)]
    min_body_rate: usize,
    /// A file holding the key of the adapter admin routes (`POST /v1/adapters {name, dir}`, `DELETE
    /// /v1/adapters/NAME`; first line); `KEV_ADMIN_KEY` does the same, and so does a key marked `"admin": true`
    /// in --api-keys. Without any, those routes answer 403 (secure by default).
    #[arg(long, value_name = "FILE")]
    admin_key_file: Option<PathBuf>,
    /// A file holding the bearer key `/metrics` asks for (first line); `KEV_METRICS_KEY` does the same.
    /// Without either `/metrics` is open, as `/health` is.
    #[arg(long, value_name = "FILE")]
    metrics_key_file: Option<PathBuf>,
    /// Which published release to serve when no model is named (--model, --base/--kev, --demo win): `kev-4b`
    /// (default), `kev-0.8b` or `kev-9b`. It is prepared (downloaded, verified, merged) into --model-dir on
    /// first use.
    #[arg(long, env = "KEV_RELEASE", value_name = "NAME", default_value = "kev-4b",
        value_parser = Release::NAMES)]
    release: String,
    /// Where the default release is prepared (default: $KEV_HOME or ~/.cache/kev, then `kev-4b-v1.0`,
    /// `kev-0.8b-v1.0` or `kev-9b-v1.0`).
    #[arg(long, env = "KEV_MODEL_DIR", value_name = "DIR")]
    model_dir: Option<PathBuf>,
    /// Export OpenTelemetry traces of decision requests by OTLP to this collector: its base URL
    /// (`http://collector:4318`, `/v1/traces` added when the URL has no path; gRPC: `http://collector:4317`).
    /// Off by default (no exporter, no thread, no span).
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT", value_name = "URL")]
    otlp_endpoint: Option<String>,
    /// The OTLP transport: `http/protobuf` or `grpc`.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_PROTOCOL", default_value = "http/protobuf",
        value_parser = ["http/protobuf", "grpc"])]
    otlp_protocol: String,
    /// `service.name` of the exported spans.
    #[arg(long, env = "OTEL_SERVICE_NAME", default_value = "kev")]
    otlp_service_name: String,
    /// Write an audit log: one JSON line per decision request (request id, key name, adapter and its sha256,
    /// priority, status, tokens, phase times; never a secret) to FILE (appended; opened again on SIGHUP), or
    /// `-` for stderr.
    #[arg(long, env = "KEV_AUDIT_LOG", value_name = "FILE|-")]
    audit_log: Option<kev_server::audit::AuditTarget>,
    /// Also write each request's state (the document) in its audit line. Off by default: the audit log holds
    /// no document content.
    #[arg(long, env = "KEV_AUDIT_LOG_STATES", requires = "audit_log",
        value_parser = clap::builder::BoolishValueParser::new())]
    audit_log_states: bool,
    /// Every this many seconds, answer the warm-up decision again through the served path and compare it with
    /// its answer at start: `/ready` is 503 (saying why) while the latest canary failed or diverged. 0 turns it
    /// off.
    #[arg(long, env = "KEV_CANARY_INTERVAL_S", default_value_t = 30)]
    canary_interval_s: u64,
}

impl Args {
    /// The OTLP export these flags ask for (`None`: traces off).
    pub fn otlp(&self) -> Option<kev_server::telemetry::OtlpConfig> {
        let endpoint = self
            .otlp_endpoint
            .clone()
            .filter(|e| !e.trim().is_empty())?;
        Some(kev_server::telemetry::OtlpConfig {
            endpoint,
            protocol: self.otlp_protocol.parse().unwrap_or_default(),
            service_name: self.otlp_service_name.clone(),
        })
    }
}

pub fn run(mut args: Args) -> anyhow::Result<ExitCode> {
    if args.demo {
        let (base, kev) = kev_decide::demo_release()?;
        args.model.base = Some(base);
        args.model.kev = Some(kev);
    } else if args.model.model.is_none() && args.model.base.is_none() {
        let release: Release = args.release.parse().map_err(anyhow::Error::msg)?;
        args.model.model = Some(default_model(release, args.model_dir.clone())?);
    }
    let api_key = api_key(args.api_key_file.as_ref())?;
    let api_keys = match &args.api_keys {
        Some(path) => Some(Arc::new(kev_server::keys::Keys::read(path)?)),
        None => None,
    };
    let audit = match &args.audit_log {
        Some(target) => Some(Arc::new(
            kev_server::audit::AuditLog::start(&kev_server::audit::AuditConfig {
                target: target.clone(),
                states: args.audit_log_states,
            })
            .with_context(|| format!("opening the audit log {target:?}"))?,
        )),
        None => None,
    };
    let (mut kev, info) = load(&args.model, &args.service)?;
    if args.demo {
        kev = kev.with_info(ModelInfo {
            demo: true,
            ..info.clone()
        });
    }
    let names = kev_decide::served_names(&info.base, args.demo, &args.aliases);
    let default_name = kev.adapters()[0].name().to_owned();
    kev = kev.with_default_names(&default_name, &names);
    let config = ServerConfig {
        addr: SocketAddr::new(args.host, args.port),
        api_key,
        api_keys,
        queue_depth: args.queue_depth.max(1),
        queue_deadline: Duration::from_millis(args.queue_deadline_ms),
        pass_tokens: kev.settings().pass_tokens,
        long_lane: match args.long_lane.as_str() {
            "low" => kev_server::LongLane::Low,
            "off" => kev_server::LongLane::Off,
            _ => kev_server::LongLane::On,
        },
        max_body: args.max_body,
        request_timeout: Duration::from_secs(args.request_timeout_s.max(1)),
        model_names: names,
        drain_timeout: Duration::from_secs(args.drain_timeout_s),
        min_body_rate: args.min_body_rate,
        metrics_key: key_from(
            args.metrics_key_file.as_ref(),
            "KEV_METRICS_KEY",
            "metrics key",
        )?,
        max_connections: args.max_connections.max(1),
        max_connections_per_ip: args.max_connections_per_ip,
        long_lane_share: args.long_lane_share,
        header_read_timeout: Duration::from_secs(args.header_read_timeout_s.max(1)),
        admit_permits: args
            .admit_permits
            .unwrap_or(ServerConfig::default().admit_permits)
            .max(1),
        audit,
        admin_key: key_from(args.admin_key_file.as_ref(), "KEV_ADMIN_KEY", "admin key")?,
        adapters_file: args.model.adapters_file.clone(),
        canary_interval: (args.canary_interval_s > 0)
            .then(|| Duration::from_secs(args.canary_interval_s)),
        ..ServerConfig::default()
    };
    tracing::info!(
        auth = config.api_key.is_some() || config.api_keys.is_some(),
        keys = ?config.api_keys.as_ref().map(|k| k.names()),
        queue_depth = config.queue_depth,
        names = ?config.model_names,
        cache_bytes = kev.settings().cache_bytes.unwrap_or(0),
        "starting the server"
    );
    // The library's decision service is the server's decider as it stands (`kev_server::served`).
    let decider = Arc::new(kev);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let served = runtime.block_on(kev_server::serve(config, decider));
    // Admission work still on a blocking thread (a request the drain cut off) is not waited for long.
    runtime.shutdown_timeout(Duration::from_secs(1));
    served?;
    Ok(ExitCode::SUCCESS)
}

/// `--long-lane-share`: a fraction the server accepts.
fn share_value(s: &str) -> Result<f64, String> {
    let (lo, hi) = kev_server::share::SHARE_RANGE;
    match s.parse::<f64>() {
        Ok(v) if (lo..=hi).contains(&v) => Ok(v),
        _ => Err(format!(
            "a share from {lo} to {hi} (a fraction of the machine)"
        )),
    }
}

fn api_key(file: Option<&PathBuf>) -> anyhow::Result<Option<String>> {
    key_from(file, "KEV_API_KEY", "API key")
}

/// A key from the first line of `file`, else from the environment variable `env` (empty: none).
fn key_from(file: Option<&PathBuf>, env: &str, what: &str) -> anyhow::Result<Option<String>> {
    if let Some(path) = file {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the {what} file {}", path.display()))?;
        let key = text.lines().next().unwrap_or("").trim().to_string();
        if key.is_empty() {
            anyhow::bail!("the {what} file {} is empty", path.display());
        }
        return Ok(Some(key));
    }
    Ok(std::env::var(env).ok().filter(|k| !k.is_empty()))
}

/// The prepared release (Kev-4B v1.0 unless --release says otherwise), preparing it (download, verify,
/// merge) when it is not there yet.
fn default_model(release: Release, dir: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    kev_prepare::prepared_release(release, dir.clone()).map_err(|e| {
        let dir = kev_prepare::release_dir(release, dir)
            .map(|d| d.display().to_string())
            .unwrap_or_default();
        anyhow::anyhow!(
            "no model to serve: preparing the pinned {} into {dir} failed: {e}\n{}",
            release.pins().name,
            kev_prepare::offline_hint()
        )
    })
}
