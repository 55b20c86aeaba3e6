//! `kev calibrate`: fit the pointer head's temperature on labelled data (the math is `kev_decide::calibrate`),
//! print and write the report, draw the reliability diagram.
//!
//! The model answers every labelled request once; each labelled question's pointer logits (before any
//! temperature, f64: [`kev_decide::Decision::logits`]) are what the fit reads, so a probability that underflows
//! fp32 costs nothing and a calibration already in force does not bias the fit. (`underflowed_options` counts
//! options whose logits were bounds: only in `--scores` files of older runs, which read `T0 · ln p` back.)

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use kev_contract::QuestionKind;
use kev_decide::calibrate::{self, Bin, FitOptions, GroupReport, Grouping, Scored};
use serde_json::json;

use crate::cmd::labelled;
use crate::loading::{ServiceArgs, load};
use crate::model_args::ModelArgs;

/// Fit temperatures on labelled data; write them for `kev serve --calibration`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    service: ServiceArgs,
    /// Labelled requests, JSONL: a SystemOne request per line plus `"labels": {"<question id>": "<option key>"}`
    /// (or a `"label"` inside each question).
    #[arg(long, value_name = "FILE")]
    data: PathBuf,
    /// One temperature for all questions, or one per question type, per option-count bucket (2, 3-5, 6-10,
    /// 11+), or per both.
    #[arg(long, default_value = "global", value_parser = ["global", "type", "options", "type+options"])]
    by: String,
    /// Where to write the calibration (temperatures and the report, JSON).
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
    /// The reliability diagram (PNG; default: `--out` with the extension `.png`).
    #[arg(long, value_name = "FILE")]
    plot: Option<PathBuf>,
    /// Folds for the out-of-fold estimates (whole request lines per fold).
    #[arg(long, default_value_t = 5)]
    folds: usize,
    /// Bootstrap resamples for the temperature's 95 % interval (0: none).
    #[arg(long, default_value_t = 200)]
    bootstrap: usize,
    /// Seed of the folds and the bootstrap.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Temperature the "before" columns are scored at (default: the head's stored one).
    #[arg(long, value_name = "T", conflicts_with = "start_scale")]
    start_temperature: Option<f64>,
    /// Score "before" at the stored temperature times this (e.g. 3 or 0.333 to start deliberately wrong).
    #[arg(long, value_name = "X")]
    start_scale: Option<f64>,
    /// Requests run together (their rows share passes).
    #[arg(long, default_value_t = 8)]
    batch: usize,
    /// Also write every labelled question's logits (and the head's temperature) to FILE, so that other
    /// groupings or starts can be fitted later with `--scores FILE` without running the model again.
    #[arg(long, value_name = "FILE", conflicts_with = "scores")]
    save_scores: Option<PathBuf>,
    /// Fit from the logits a `--save-scores` run wrote instead of running the model (`--data` must be the
    /// same file: its sha256 is checked; the model flags are not used).
    #[arg(long, value_name = "FILE")]
    scores: Option<PathBuf>,
}

/// What `--save-scores` writes and `--scores` reads back.
const SCORES_FORMAT: &str = "kev-calibrate-scores/1";

/// The labelled questions scored by the model, and what the report says of where they came from.
struct ScoredData {
    items: Vec<Scored>,
    underflow: usize,
    t0: f64,
    model: serde_json::Value,
}

fn kind_named(name: &str) -> Option<QuestionKind> {
    [
        QuestionKind::Noul,
        QuestionKind::Choice,
        QuestionKind::Score,
    ]
    .into_iter()
    .find(|k| k.as_str() == name)
}

fn save_scores(path: &Path, data: &ScoredData, data_sha: &str, lines: usize) -> anyhow::Result<()> {
    let items: Vec<serde_json::Value> = data
        .items
        .iter()
        .map(|it| json!({"line": it.line, "kind": it.kind.as_str(), "label": it.label, "logits": it.logits}))
        .collect();
    let file = json!({
        "format": SCORES_FORMAT,
        "data_sha256": data_sha,
        "lines": lines,
        "head_temperature": data.t0,
        "underflowed_options": data.underflow,
        "model": data.model,
        "items": items,
    });
    std::fs::write(path, serde_json::to_vec(&file)?)
        .with_context(|| format!("writing {}", path.display()))
}

fn read_scores(path: &Path, data_sha: &str) -> anyhow::Result<ScoredData> {
    let text = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let v: serde_json::Value =
        serde_json::from_slice(&text).with_context(|| format!("{}: not JSON", path.display()))?;
    let bad = |what: &str| anyhow::anyhow!("{}: {what}", path.display());
    if v["format"] != SCORES_FORMAT {
        return Err(bad(&format!(
            "not a {SCORES_FORMAT} file (written by --save-scores)"
        )));
    }
    if v["data_sha256"] != data_sha {
        bail!(
            "{}: scored from another --data file (sha256 {}), not this one ({data_sha})",
            path.display(),
            v["data_sha256"]
        );
    }
    let t0 = v["head_temperature"]
        .as_f64()
        .filter(|t| t.is_finite() && *t > 0.0)
        .ok_or_else(|| bad("head_temperature is not a positive number"))?;
    let items = v["items"]
        .as_array()
        .ok_or_else(|| bad("no items"))?
        .iter()
        .enumerate()
        .map(|(i, it)| {
            let item = || bad(&format!("item {i} is malformed"));
            Ok(Scored {
                logits: it["logits"]
                    .as_array()
                    .ok_or_else(item)?
                    .iter()
                    .map(|z| z.as_f64().ok_or_else(item))
                    .collect::<anyhow::Result<_>>()?,
                label: it["label"].as_u64().ok_or_else(item)? as usize,
                kind: it["kind"].as_str().and_then(kind_named).ok_or_else(item)?,
                line: it["line"].as_u64().ok_or_else(item)? as usize,
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(ScoredData {
        items,
        underflow: v["underflowed_options"].as_u64().unwrap_or(0) as usize,
        t0,
        model: v["model"].clone(),
    })
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if args.service.calibration.is_some() {
        bail!(
            "kev calibrate fits from the head's stored temperature; drop --calibration (KEV_CALIBRATION)"
        );
    }
    let by: Grouping = args.by.parse().map_err(anyhow::Error::msg)?;
    let data_bytes =
        std::fs::read(&args.data).with_context(|| format!("reading {}", args.data.display()))?;
    let lines = labelled::read(&args.data)?;
    let data_sha = calibrate::sha256_hex(&data_bytes);
    let scored = match &args.scores {
        Some(path) => read_scores(path, &data_sha)?,
        None => score(&args, &lines)?,
    };
    if let Some(path) = &args.save_scores {
        save_scores(path, &scored, &data_sha, lines.len())?;
    }
    let ScoredData {
        items,
        underflow,
        t0,
        model,
    } = scored;
    let start = args
        .start_temperature
        .unwrap_or(t0 * args.start_scale.unwrap_or(1.0));
    if !(start.is_finite() && start > 0.0) {
        bail!("--start-temperature {start} is not a positive number");
    }

    let opts = FitOptions {
        by,
        folds: args.folds,
        bootstrap: args.bootstrap,
        seed: args.seed,
        start_temperature: start,
    };
    let fit = calibrate::fit(&items, &opts).map_err(anyhow::Error::msg)?;
    let source = json!({
        "data": args.data.file_name().map(|n| n.to_string_lossy().into_owned()),
        "data_sha256": data_sha,
        "lines": lines.len(),
        "questions": items.len(),
        "underflowed_options": underflow,
        "head_temperature": t0,
        "model": model,
        "date_facts": args.service.date_facts,
    });
    let file = fit.to_file(&opts, source);
    let mut text = serde_json::to_string_pretty(&file)?;
    text.push('\n');
    std::fs::write(&args.out, &text).with_context(|| format!("writing {}", args.out.display()))?;
    let plot = args
        .plot
        .clone()
        .unwrap_or_else(|| args.out.with_extension("png"));
    draw(&plot, &fit.reliability_before, &fit.reliability_after)
        .with_context(|| format!("drawing {}", plot.display()))?;

    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "kev calibrate: {} questions from {} lines, by {}; head T0 = {t0:.6}, scored before at T = {start:.6}; \
         after = out of fold ({} folds); T interval = bootstrap 95 % ({} draws)",
        items.len(),
        lines.len(),
        by.name(),
        args.folds,
        args.bootstrap
    )?;
    write!(out, "{}", table(&fit.groups))?;
    writeln!(
        out,
        "\nreliability (all questions; the PNG draws these bins without text: bars = accuracy, ticks = mean confidence, \
         left before, right after)"
    )?;
    write!(
        out,
        "{}",
        reliability_table(&fit.reliability_before, &fit.reliability_after)
    )?;
    if underflow > 0 {
        writeln!(
            out,
            "note: {underflow} option probabilities underflowed fp32 at T0; their logits are bounds"
        )?;
    }
    writeln!(out, "wrote {} and {}", args.out.display(), plot.display())?;
    Ok(ExitCode::SUCCESS)
}

/// Run the model over the labelled lines at its stored temperature and read each labelled question's logits back.
fn score(args: &Args, lines: &[labelled::Line]) -> anyhow::Result<ScoredData> {
    let (kev, _info) = load(&args.model, &args.service)?;
    let t0 = kev.head().temperature();
    let mut items: Vec<Scored> = Vec::new();
    for (chunk_i, chunk) in lines.chunks(args.batch.max(1)).enumerate() {
        let jobs = chunk
            .iter()
            .map(|l| {
                kev.admit(&l.body).map_err(|r| {
                    anyhow::anyhow!(
                        "{}:{}: refused by the model ({}): {}",
                        args.data.display(),
                        l.number,
                        r.status(),
                        r.body()
                    )
                })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let refs: Vec<&kev_decide::Job> = jobs.iter().collect();
        for (k, (line, result)) in chunk.iter().zip(kev.run(&refs)).enumerate() {
            let decision = result.with_context(|| {
                format!("{}:{}: the model failed", args.data.display(), line.number)
            })?;
            for (q, label) in line.labelled() {
                items.push(Scored {
                    logits: decision.logits[q].clone(),
                    label,
                    kind: line.request.questions()[q].kind(),
                    line: chunk_i * args.batch.max(1) + k,
                });
            }
        }
    }

    Ok(ScoredData {
        items,
        underflow: 0,
        t0,
        model: kev.card()["description"].clone(),
    })
}

fn table(groups: &[GroupReport]) -> String {
    let mut s = format!(
        "{:<16} {:>6} {:>9} {:>21}  {:>17}  {:>17}  {:>17}  {:>15}\n",
        "group", "n", "T", "95% interval", "NLL before→after", "Brier", "ECE-15", "accuracy"
    );
    for g in groups {
        let interval = g
            .interval
            .map(|[a, b]| format!("[{a:.4}, {b:.4}]"))
            .unwrap_or_else(|| "-".into());
        s.push_str(&format!(
            "{:<16} {:>6} {:>9.4} {:>21}  {:>7.4} → {:<7.4}  {:>7.4} → {:<7.4}  {:>7.4} → {:<7.4}  {:>6.4} → {:<6.4}\n",
            g.group,
            g.n,
            g.temperature,
            interval,
            g.before.nll,
            g.after.nll,
            g.before.brier,
            g.after.brier,
            g.before.ece,
            g.after.ece,
            g.before.accuracy,
            g.after.accuracy,
        ));
    }
    s
}

fn reliability_table(before: &[Bin], after: &[Bin]) -> String {
    let mut s = format!(
        "{:<13} {:>6} {:>8} {:>8}   {:>6} {:>8} {:>8}\n",
        "confidence", "n", "conf", "acc", "n", "conf", "acc"
    );
    for (b, a) in before.iter().zip(after) {
        s.push_str(&format!(
            "[{:.3}, {:.3}) {:>6} {:>8.4} {:>8.4}   {:>6} {:>8.4} {:>8.4}\n",
            b.lo, b.hi, b.count, b.confidence, b.accuracy, a.count, a.confidence, a.accuracy
        ));
    }
    s
}

/// Two reliability panels (before, after) with no text: plotters' bitmap backend draws text only with a font
/// feature, and the numbers are in the text table anyway. In each 400×400 panel: the diagonal (grey), a bar per
/// bin up to its accuracy (blue, its width the bin's, lighter when it holds under 1 % of the questions), a red tick
/// at the bin's mean confidence.
fn draw(path: &Path, before: &[Bin], after: &[Bin]) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let root = BitMapBackend::new(path, (900, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e}"))?;
    let total: usize = before.iter().map(|b| b.count).sum::<usize>().max(1);
    for (panel, bins) in [before, after].into_iter().enumerate() {
        let (x0, y0, size) = (40 + panel as i32 * 440, 40, 400);
        let px = |v: f64| x0 + (v * size as f64).round() as i32;
        let py = |v: f64| y0 + size - (v * size as f64).round() as i32;
        let err = |e: DrawingAreaErrorKind<_>| anyhow::anyhow!("{e}");
        for bin in bins {
            if bin.count == 0 {
                continue;
            }
            let sparse = bin.count * 100 < total;
            let fill = if sparse {
                RGBColor(170, 190, 230)
            } else {
                RGBColor(50, 90, 200)
            };
            root.draw(&Rectangle::new(
                [
                    (px(bin.lo) + 1, py(bin.accuracy)),
                    (px(bin.hi) - 1, py(0.0)),
                ],
                fill.filled(),
            ))
            .map_err(err)?;
            let y = py(bin.confidence);
            root.draw(&PathElement::new(
                vec![(px(bin.lo), y), (px(bin.hi), y)],
                RED.stroke_width(3),
            ))
            .map_err(err)?;
        }
        root.draw(&PathElement::new(
            vec![(px(0.0), py(0.0)), (px(1.0), py(1.0))],
            RGBColor(120, 120, 120).stroke_width(1),
        ))
        .map_err(err)?;
        root.draw(&Rectangle::new(
            [(px(0.0), py(1.0)), (px(1.0), py(0.0))],
            BLACK.stroke_width(1),
        ))
        .map_err(err)?;
    }
    root.present().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
}
