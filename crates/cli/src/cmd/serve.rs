//! `kev serve`: the SystemOne HTTP API over a local model.
//!
//! The model is named like every other command (`--model DIR` or `--base DIR --kev DIR`), or `--demo`
//! (kev-mini, the bundled miniature Kev in `fixtures/mini`), or nothing: then the prepared Kev-4B v1.0 (or
//! `--release kev-0.8b`) from the kev cache, prepared first (downloaded, verified, merged) when absent.
//! `/v1/models` lists the size (`kev-4b`, `kev-0.8b`) beside `kev-latest` and `jev-latest`.

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
    /// Longest a client may take to send a request's headers, and longest an idle keep-alive connection
    /// stays open (seconds).
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
    /// Longest the drain after SIGTERM/SIGINT may take (seconds): requests still open then are closed and the
    /// process exits (below the usual 30 s grace before SIGKILL). During the drain new requests get 503.
    #[arg(long, env = "KEV_DRAIN_TIMEOUT_S", default_value_t = 25)]
    drain_timeout_s: u64,
    /// The slowest a request body may arrive after its first second, in bytes per second on average (0 turns
    /// the floor off): a client dribbling its body is answered 408 and its queue slot freed within about a
    /// second, instead of holding it for the whole body timeout.
    #[arg(long, env = "KEV_MIN_BODY_RATE", default_value_t = 16 << 10)]
    min_body_rate: usize,
    /// A file holding the bearer key `/metrics` asks for (first line); `KEV_METRICS_KEY` does the same.
    /// Without either `/metrics` is open, as `/health` is.
    #[arg(long, value_name = "FILE")]
    metrics_key_file: Option<PathBuf>,
    /// Which published release to serve when no model is named (--model, --base/--kev, --demo win): `kev-4b`
    /// (default) or `kev-0.8b`. It is prepared (downloaded, verified, merged) into --model-dir on first use.
    #[arg(long, env = "KEV_RELEASE", value_name = "NAME", default_value = "kev-4b",
        value_parser = ["kev-4b", "kev-0.8b"])]
    release: String,
    /// Where the default release is prepared (default: $KEV_HOME or ~/.cache/kev, then `kev-4b-v1.0` or
    /// `kev-0.8b-v1.0`).
    #[arg(long, env = "KEV_MODEL_DIR", value_name = "DIR")]
    model_dir: Option<PathBuf>,
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
        header_read_timeout: Duration::from_secs(args.header_read_timeout_s.max(1)),
        admit_permits: args
            .admit_permits
            .unwrap_or(ServerConfig::default().admit_permits)
            .max(1),
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
    runtime.block_on(kev_server::serve(config, decider))?;
    Ok(ExitCode::SUCCESS)
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
    let pins = release.pins();
    let dir = match dir {
        Some(d) => d,
        None => {
            let home = std::env::var_os("KEV_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/kev")))
                .context("set KEV_HOME (or HOME) so kev knows where to keep the prepared model")?;
            home.join(release.dir_name())
        }
    };
    if dir.join("manifest.json").is_file() {
        return Ok(dir);
    }
    tracing::info!(dir = %dir.display(), release = release.name(), "no prepared model yet: preparing it from the pinned release");
    let opts = kev_prepare::PrepareOptions::for_release(dir.clone(), release);
    match kev_prepare::prepare(&opts) {
        Ok(report) => {
            for w in &report.warnings {
                tracing::warn!("{w}");
            }
            for u in &pins.unverified {
                tracing::warn!("not verified by the {} pins: {u}", pins.name);
            }
            Ok(dir)
        }
        Err(e) => anyhow::bail!(
            "no model to serve: preparing the pinned {} into {} failed: {e}\n\
             With no network, point kev at local copies instead:\n  \
             kev prepare --kev-dir KEV_REPO_DIR --base-dir BASE_REPO_DIR --out DIR && kev serve --model DIR\n\
             or serve the release files directly: kev serve --base BASE_REPO_DIR --kev KEV_REPO_DIR\n\
             (or try the API on the bundled miniature, kev-mini: kev serve --demo)",
            pins.name,
            dir.display()
        ),
    }
}
