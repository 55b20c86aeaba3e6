//! `kev decide`: answer one request, or a JSONL file of requests, with a local model.

use std::io::{BufRead, BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use kev_contract::WireError;
use kev_decide::{Job, Kev};
use kev_engine::CpuBackend;
use serde_json::{Value, json};

use crate::loading::{ServiceArgs, load};
use crate::model_args::ModelArgs;

/// Answer a request (or a JSONL file of requests) with a local model.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    service: ServiceArgs,
    /// A request body (JSON) to answer; `-` reads standard input.
    #[arg(
        long,
        value_name = "FILE",
        conflicts_with = "jsonl",
        required_unless_present = "jsonl"
    )]
    request: Option<PathBuf>,
    /// A file of requests, one JSON body per line.
    #[arg(long, value_name = "FILE", requires = "out")]
    jsonl: Option<PathBuf>,
    /// Where `--jsonl` writes one response (or error object) per line.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// Add `x_debug`: per question the unrounded probabilities, the row's token ids and readout indices.
    #[arg(long)]
    debug: bool,
    /// With --jsonl: how many requests run together (their rows share passes).
    #[arg(long, default_value_t = 8)]
    batch: usize,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let (kev, _info) = load(&args.model, &args.service)?;
    match (&args.request, &args.jsonl, &args.out) {
        (Some(path), _, _) => one(&kev, path, args.debug),
        (None, Some(input), Some(out)) => many(&kev, input, out, args.debug, args.batch.max(1)),
        _ => anyhow::bail!("pass --request FILE, or --jsonl IN --out OUT"),
    }
}

fn read_body(path: &PathBuf) -> anyhow::Result<Vec<u8>> {
    if path.as_os_str() == "-" {
        let mut buf = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut buf)?;
        Ok(buf)
    } else {
        std::fs::read(path).with_context(|| format!("reading {}", path.display()))
    }
}

fn one(kev: &Kev<CpuBackend>, path: &PathBuf, debug: bool) -> anyhow::Result<ExitCode> {
    let body = read_body(path)?;
    let job = match kev.admit(&body) {
        Ok(job) => job,
        Err(refusal) => {
            println!("{}", error_line(&refusal));
            return Ok(ExitCode::from(2));
        }
    };
    let out = answer(kev, &[&job], debug).pop().unwrap_or(Value::Null);
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{}", kev_contract::compact_json(&out))?;
    Ok(ExitCode::SUCCESS)
}

/// `{"status", "body"}`: a refusal or failure as the server would answer it.
fn error_line(e: &impl WireError) -> Value {
    json!({"status": e.kind().status(), "body": e.error_body().to_value()})
}

/// Run admitted jobs together; each result is a response body, or an error object for our failures.
fn answer(kev: &Kev<CpuBackend>, jobs: &[&Job], debug: bool) -> Vec<Value> {
    kev.run(jobs)
        .into_iter()
        .zip(jobs)
        .map(|(r, job)| match r {
            Ok(decision) => {
                let mut body = decision.body();
                if debug && let Some(obj) = body.as_object_mut() {
                    obj.insert("x_debug".into(), kev.debug_info(job, &decision));
                }
                body
            }
            Err(e) => error_line(&e),
        })
        .collect()
}

fn many(
    kev: &Kev<CpuBackend>,
    input: &PathBuf,
    out: &PathBuf,
    debug: bool,
    batch: usize,
) -> anyhow::Result<ExitCode> {
    let file =
        std::fs::File::open(input).with_context(|| format!("opening {}", input.display()))?;
    let lines: Vec<String> = std::io::BufReader::new(file)
        .lines()
        .collect::<Result<_, _>>()
        .with_context(|| format!("reading {}", input.display()))?;
    let lines: Vec<&String> = lines.iter().filter(|l| !l.trim().is_empty()).collect();
    let writer =
        std::fs::File::create(out).with_context(|| format!("creating {}", out.display()))?;
    let mut writer = BufWriter::new(writer);
    let bar = indicatif::ProgressBar::new(lines.len() as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:40} {pos}/{len} requests {elapsed} eta {eta}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let (mut answered, mut refused, mut failed) = (0usize, 0usize, 0usize);
    for chunk in lines.chunks(batch) {
        // Admit each line; refused ones get their error object in place, the rest run together.
        let admitted: Vec<Result<Job, Value>> = chunk
            .iter()
            .map(|line| kev.admit(line.as_bytes()).map_err(|r| error_line(&r)))
            .collect();
        let jobs: Vec<&Job> = admitted.iter().filter_map(|a| a.as_ref().ok()).collect();
        let mut results = answer(kev, &jobs, debug).into_iter();
        for a in &admitted {
            let line = match a {
                Ok(_) => {
                    let v = results.next().unwrap_or(Value::Null);
                    if v.get("status").is_some() {
                        failed += 1;
                    } else {
                        answered += 1;
                    }
                    v
                }
                Err(e) => {
                    refused += 1;
                    e.clone()
                }
            };
            writeln!(writer, "{}", kev_contract::compact_json(&line))?;
        }
        bar.inc(chunk.len() as u64);
    }
    writer.flush()?;
    bar.finish_and_clear();
    eprintln!(
        "kev decide: {answered} answered, {refused} refused, {failed} failed → {}",
        out.display()
    );
    Ok(if failed > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}
