//! `kev eval`: score a SystemOne server (or a local model) on labelled data — accuracy, NLL, Brier, ECE-15,
//! latency p50/p99, per question type — and optionally compare it with a second server question by question.
//!
//! Every figure is computed from response bodies as the wire carries them (probabilities rounded to 4 places,
//! noul as `P(yes)`), whichever side produced them, so `--model DIR` and `--endpoint` on a server running that
//! model give the same numbers. Latency is per request as this client sees it (for `--model`, the decision's
//! time in process). Requests run one at a time, in file order. For the NLL a labelled option whose rounded
//! probability is 0 counts as 5e-5 (half the rounding unit).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, bail};
use kev_contract::QuestionKind;
use kev_decide::calibrate::{Metrics, metrics_with_floor};
use serde_json::{Value, json};

use crate::cmd::labelled::{self, Line, probabilities_of};
use crate::loading::{ServiceArgs, load};
use crate::model_args::ModelArgs;

/// Score a SystemOne server or a local model on labelled data.
#[derive(clap::Args)]
pub struct Args {
    /// A SystemOne server: its base URL (`http://127.0.0.1:8009`) or the full `…/v1/systemone` URL.
    /// (The model flags are then ignored.)
    #[arg(long, value_name = "URL")]
    endpoint: Option<String>,
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    service: ServiceArgs,
    /// Labelled requests, JSONL (the format `kev calibrate` reads).
    #[arg(long, value_name = "FILE")]
    data: PathBuf,
    /// A second server to score on the same data, printed side by side with per-question agreement.
    #[arg(long, value_name = "URL")]
    compare: Option<String>,
    /// Bearer key sent to the endpoints.
    #[arg(long, env = "KEV_EVAL_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Also write the report as JSON.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Seconds to wait for one answer from an endpoint.
    #[arg(long, default_value_t = 300)]
    timeout_s: u64,
}

/// Per question of the data: its type, label and the probabilities one side answered.
struct Answered {
    kind: QuestionKind,
    label: usize,
    probabilities: Vec<f64>,
}

struct Side {
    name: String,
    questions: Vec<Answered>,
    latencies_ms: Vec<f64>,
}

/// Anything that answers a request body with a response body.
trait Answerer {
    fn answer(&mut self, line: &Line) -> anyhow::Result<Value>;
}

struct Http {
    url: String,
    key: Option<String>,
    agent: ureq::Agent,
}

impl Http {
    fn new(base: &str, key: Option<String>, timeout_s: u64) -> Self {
        let trimmed = base.trim_end_matches('/');
        let url = if trimmed.ends_with("/v1/systemone") {
            trimmed.to_string()
        } else {
            format!("{trimmed}/v1/systemone")
        };
        let agent = ureq::AgentBuilder::new()
            .timeout(std::time::Duration::from_secs(timeout_s.max(1)))
            .build();
        Http { url, key, agent }
    }
}

impl Answerer for Http {
    fn answer(&mut self, line: &Line) -> anyhow::Result<Value> {
        let mut req = self
            .agent
            .post(&self.url)
            .set("content-type", "application/json");
        if let Some(k) = &self.key {
            req = req.set("authorization", &format!("Bearer {k}"));
        }
        match req.send_bytes(&line.body) {
            Ok(resp) => Ok(serde_json::from_reader(resp.into_reader())
                .with_context(|| format!("{}: line {}: not JSON", self.url, line.number))?),
            Err(ureq::Error::Status(code, resp)) => bail!(
                "{}: line {}: status {code}: {}",
                self.url,
                line.number,
                resp.into_string().unwrap_or_default()
            ),
            Err(e) => bail!("{}: line {}: {e}", self.url, line.number),
        }
    }
}

struct Local {
    kev: kev_decide::Kev<kev_engine::CpuBackend>,
}

impl Answerer for Local {
    fn answer(&mut self, line: &Line) -> anyhow::Result<Value> {
        let job = self.kev.admit(&line.body).map_err(|r| {
            anyhow::anyhow!(
                "line {}: refused ({}): {}",
                line.number,
                r.status(),
                r.body()
            )
        })?;
        let d = self
            .kev
            .run(&[&job])
            .pop()
            .context("no result")?
            .with_context(|| format!("line {}: the model failed", line.number))?;
        Ok(d.body())
    }
}

fn score(name: String, lines: &[Line], who: &mut dyn Answerer) -> anyhow::Result<Side> {
    let mut side = Side {
        name,
        questions: Vec::new(),
        latencies_ms: Vec::new(),
    };
    for line in lines {
        let t = Instant::now();
        let body = who.answer(line)?;
        side.latencies_ms.push(t.elapsed().as_secs_f64() * 1000.0);
        for (q, label) in line.labelled() {
            let question = &line.request.questions()[q];
            let answer = &body["answers"][question.id()];
            let p =
                probabilities_of(answer, question.kind(), question.keys()).with_context(|| {
                    format!(
                        "line {}: the answer to {:?} has no probabilities: {answer}",
                        line.number,
                        question.id()
                    )
                })?;
            side.questions.push(Answered {
                kind: question.kind(),
                label,
                probabilities: p,
            });
        }
    }
    Ok(side)
}

/// Nearest-rank percentile.
fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

const GROUPS: [(&str, Option<QuestionKind>); 4] = [
    ("all", None),
    ("noul", Some(QuestionKind::Noul)),
    ("choice", Some(QuestionKind::Choice)),
    ("score", Some(QuestionKind::Score)),
];

fn group_metrics(side: &Side, kind: Option<QuestionKind>) -> Metrics {
    let items: Vec<(&[f64], usize)> = side
        .questions
        .iter()
        .filter(|a| kind.is_none_or(|k| a.kind == k))
        .map(|a| (a.probabilities.as_slice(), a.label))
        .collect();
    // A labelled option the wire rounded to 0 counts as half the rounding unit.
    metrics_with_floor(items.iter().copied(), 5e-5)
}

fn report(side: &Side) -> Value {
    let mut lat = side.latencies_ms.clone();
    lat.sort_by(f64::total_cmp);
    let groups: serde_json::Map<String, Value> = GROUPS
        .iter()
        .map(|(name, k)| (name.to_string(), json!(group_metrics(side, *k))))
        .filter(|(_, m)| m["n"].as_u64() != Some(0))
        .collect();
    json!({
        "name": side.name,
        "requests": side.latencies_ms.len(),
        "latency_ms": {"p50": percentile(&lat, 0.5), "p99": percentile(&lat, 0.99)},
        "groups": groups,
    })
}

fn argmax(p: &[f64]) -> usize {
    let mut best = 0;
    for (i, v) in p.iter().enumerate() {
        if *v > p[best] {
            best = i;
        }
    }
    best
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let lines = labelled::read(&args.data)?;
    let primary = match &args.endpoint {
        Some(url) => {
            let mut http = Http::new(url, args.api_key.clone(), args.timeout_s);
            score(url.clone(), &lines, &mut http)?
        }
        None => {
            let (kev, _info) = load(&args.model, &args.service)?;
            let mut local = Local { kev };
            let name = args
                .model
                .model
                .as_ref()
                .or(args.model.kev.as_ref())
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| "model".into());
            score(name, &lines, &mut local)?
        }
    };
    let other = match &args.compare {
        Some(url) => {
            let mut http = Http::new(url, args.api_key.clone(), args.timeout_s);
            Some(score(url.clone(), &lines, &mut http)?)
        }
        None => None,
    };

    let mut out = std::io::stdout().lock();
    let sides: Vec<&Side> = std::iter::once(&primary).chain(other.as_ref()).collect();
    writeln!(
        out,
        "kev eval: {} requests, {} labelled questions from {}",
        lines.len(),
        primary.questions.len(),
        args.data.display()
    )?;
    for side in &sides {
        let r = report(side);
        writeln!(
            out,
            "\n{}: latency p50 {:.1} ms, p99 {:.1} ms (client side, one request at a time)",
            side.name,
            r["latency_ms"]["p50"].as_f64().unwrap_or(0.0),
            r["latency_ms"]["p99"].as_f64().unwrap_or(0.0)
        )?;
        writeln!(
            out,
            "{:<8} {:>6} {:>9} {:>9} {:>9} {:>9}",
            "type", "n", "accuracy", "NLL", "Brier", "ECE-15"
        )?;
        for (name, k) in GROUPS {
            let m = group_metrics(side, k);
            if m.n == 0 {
                continue;
            }
            writeln!(
                out,
                "{name:<8} {:>6} {:>9.4} {:>9.4} {:>9.4} {:>9.4}",
                m.n, m.accuracy, m.nll, m.brier, m.ece
            )?;
        }
    }
    let mut comparison = Value::Null;
    if let Some(o) = &other {
        let mut agree = 0usize;
        let mut max_diff = 0f64;
        let mut sum_diff = 0f64;
        let mut count = 0usize;
        for (a, b) in primary.questions.iter().zip(&o.questions) {
            agree += (argmax(&a.probabilities) == argmax(&b.probabilities)) as usize;
            for (x, y) in a.probabilities.iter().zip(&b.probabilities) {
                max_diff = max_diff.max((x - y).abs());
                sum_diff += (x - y).abs();
                count += 1;
            }
        }
        let n = primary.questions.len().max(1);
        writeln!(
            out,
            "\nagreement: top option equal on {agree}/{} questions ({:.2} %); |Δp| mean {:.5}, max {:.5}",
            primary.questions.len(),
            100.0 * agree as f64 / n as f64,
            sum_diff / count.max(1) as f64,
            max_diff
        )?;
        comparison = json!({
            "questions": primary.questions.len(),
            "top_option_agreement": agree as f64 / n as f64,
            "mean_abs_probability_difference": sum_diff / count.max(1) as f64,
            "max_abs_probability_difference": max_diff,
        });
    }
    if let Some(path) = &args.json {
        let doc = json!({
            "data": args.data.display().to_string(),
            "sides": sides.iter().map(|s| report(s)).collect::<Vec<_>>(),
            "comparison": comparison,
        });
        std::fs::write(path, serde_json::to_string_pretty(&doc)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}
