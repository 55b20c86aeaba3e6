//! `kev`: the command-line front end. A thin binary: parse flags, dispatch to one
//! subcommand, map its `Result` to an exit code (0 ok, 1 failure, 2 invalid input).

mod cmd;
mod loading;
mod model_args;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Settings read from the environment that are not flags of any one command.
const ENVIRONMENT: &str = "\
Environment:
  KEV_ISA=portable|avx2|avxvnni|avx512|avx512bf16|amx|neon|neoni8mm
      Cap the CPU kernels (default: the best this CPU has). The choice in force is logged, reported
      by /v1/models (x_backend) and in bench JSON; a set the CPU lacks falls back to the best one.
  KEV_LOG_FORMAT=text|json   Log format on stderr (as --log-format).
  KEV_LOG                    Log filter, tracing-subscriber EnvFilter syntax (default info).";

#[derive(Parser)]
#[command(
    name = "kev",
    version,
    about = "Serve the Kev decision model natively: exact, fast, no Python at run time",
    after_help = ENVIRONMENT
)]
struct Cli {
    /// Log format on stderr.
    #[arg(long, global = true, env = "KEV_LOG_FORMAT", default_value = "text", value_parser = ["text", "json"])]
    log_format: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show what a request compiles to (token rows, readout indices, usage) without running a model.
    Rows(cmd::rows::Args),
    /// Answer a request (or a JSONL file of requests) with a local model.
    Decide(cmd::decide::Args),
    /// Fetch, verify and merge the pinned release into an engine-ready directory.
    Prepare(cmd::prepare::Args),
    /// Re-hash a prepared directory against its manifest.
    Verify(cmd::verify::Args),
    /// Serve the SystemOne HTTP API.
    Serve(Box<cmd::serve::Args>),
    /// Write a random-weight release in the published layout (real 4B dimensions by default).
    Synth(cmd::synth::Args),
    /// Benchmarks against the torch reference and llama.cpp.
    Bench(cmd::bench::Args),
    /// Prove a model agrees with the author's reference: digests, merge, head, decision gates.
    Accept(cmd::accept::Args),
    /// Fit the pointer head's temperature on labelled data (for `serve --calibration`), with a report.
    Calibrate(cmd::calibrate::Args),
    /// Score a SystemOne server or a local model on labelled data; compare two servers.
    Eval(cmd::eval::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // `kev serve --otlp-endpoint`: its spans go out through a layer of the one subscriber, set up here; the
    // exporter is flushed and stopped when `telemetry` drops, after the command.
    let otlp = match &cli.command {
        Command::Serve(a) => a.otlp(),
        _ => None,
    };
    let telemetry = match init_tracing(&cli.log_format, otlp.as_ref()) {
        Ok(t) => t,
        Err(err) => {
            eprintln!("kev: error: {}", describe(&err));
            return ExitCode::from(2);
        }
    };
    let result = match cli.command {
        Command::Rows(a) => cmd::rows::run(a),
        Command::Decide(a) => cmd::decide::run(a),
        Command::Prepare(a) => cmd::prepare::run(a),
        Command::Verify(a) => cmd::verify::run(a),
        Command::Serve(a) => cmd::serve::run(*a),
        Command::Synth(a) => cmd::synth::run(a),
        Command::Bench(a) => cmd::bench::run(a),
        Command::Accept(a) => cmd::accept::run(a),
        Command::Calibrate(a) => cmd::calibrate::run(a),
        Command::Eval(a) => cmd::eval::run(a),
    };
    drop(telemetry);
    match result {
        Ok(code) => code,
        Err(err) => {
            if is_broken_pipe(&err) {
                return ExitCode::SUCCESS;
            }
            eprintln!("kev: error: {}", describe(&err));
            ExitCode::from(1)
        }
    }
}

/// The error and its causes on one line, `outer: inner: …`, each message once. Errors of the lower layers
/// quote their source in their own message (`{path}: {source}`, so a log line or an HTTP body reads whole)
/// and name it as their source too: a cause whose text already ends the line is not repeated.
fn describe(err: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if line.ends_with(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// Logs on stderr (`KEV_LOG`, text or JSON) and, with an OTLP endpoint, the exported traces: the server's
/// spans (`kev_server::telemetry::TARGET`) go to the exporter only, never into the log lines.
fn init_tracing(
    format: &str,
    otlp: Option<&kev_server::telemetry::OtlpConfig>,
) -> anyhow::Result<Option<kev_server::telemetry::Telemetry>> {
    use tracing_subscriber::prelude::*;
    use tracing_subscriber::{EnvFilter, Layer};
    let filter = EnvFilter::try_from_env("KEV_LOG")
        .unwrap_or_else(|_| EnvFilter::new("info"))
        .add_directive(format!("{}=off", kev_server::telemetry::TARGET).parse()?);
    let (otel, telemetry) = match otlp {
        Some(config) => {
            let (layer, telemetry) = kev_server::telemetry::start(config)?;
            (Some(layer), Some(telemetry))
        }
        None => (None, None),
    };
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let fmt = if format == "json" {
        fmt.json().boxed()
    } else {
        fmt.boxed()
    };
    tracing_subscriber::registry()
        .with(otel)
        .with(fmt.with_filter(filter))
        .init();
    if let Some(config) = otlp {
        tracing::info!(endpoint = %config.endpoint, protocol = ?config.protocol, "exporting traces by OTLP");
    }
    Ok(telemetry)
}

#[cfg(test)]
mod tests {
    use super::describe;

    /// Like the lower layers' `#[error("{path}: {source}")]` errors: quotes its source and names it.
    #[derive(Debug)]
    struct Quoting {
        path: String,
        source: std::io::Error,
    }

    impl std::fmt::Display for Quoting {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "{}: {}", self.path, self.source)
        }
    }

    impl std::error::Error for Quoting {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.source)
        }
    }

    #[test]
    fn each_cause_is_said_once() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        let err = anyhow::Error::new(Quoting {
            path: "m/config.json".into(),
            source: io,
        })
        .context("loading m");
        assert_eq!(describe(&err), "loading m: m/config.json: no such file");
        // A cause its wrapper does not quote is still said.
        let err = anyhow::anyhow!("bad value").context("reading x");
        assert_eq!(describe(&err), "reading x: bad value");
    }
}
