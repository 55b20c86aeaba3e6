//! Decisions: the request set through each arm of the engine (exact/merged weights × fp32/bf16
//! compute), the way the service runs it (shared state, prepared-state cache), then again with the
//! cache warm and the requests batched together, then every question as its own row from zero.
//!
//! One weight form is loaded at a time; its float compute arms share the loaded backbone (the arm is a
//! property of the backend, not of the weights). The int8 arm is loaded on its own, as `--precision
//! int8` loads it (quantised at load, or the prepared directory's stored int8 form, float copies dropped).

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Instant;

use kev_decide::{Job, Kev, LoadSpec, Settings, Source, WeightForm, load_cpu};
use kev_engine::{Arm, Backbone, CpuBackend};
use kev_tokenize::KevTokenizer;
use serde_json::Value;

use crate::metrics::first_bit_difference;
use crate::report::ArmSeconds;
use crate::requests::RequestSet;

/// One decision arm: a weight form and a compute precision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArmId {
    /// `exact` (LoRA unmerged, fp32) or `merged` (bf16 merged weights).
    pub form: WeightForm,
    /// Compute precision.
    pub arm: Arm,
}

impl ArmId {
    /// The five arms, anchor first.
    pub const ALL: [ArmId; 5] = [
        ArmId {
            form: WeightForm::Exact,
            arm: Arm::Fp32,
        },
        ArmId {
            form: WeightForm::Exact,
            arm: Arm::Bf16,
        },
        ArmId {
            form: WeightForm::Merged,
            arm: Arm::Fp32,
        },
        ArmId {
            form: WeightForm::Merged,
            arm: Arm::Bf16,
        },
        ArmId {
            form: WeightForm::Merged,
            arm: Arm::Int8,
        },
    ];

    /// `exact-fp32`, `merged-bf16`, …
    pub fn name(&self) -> String {
        format!("{}-{}", self.form.name(), self.arm.name())
    }
}

impl FromStr for ArmId {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        ArmId::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| {
                format!(
                    "unknown arm `{s}` (exact-fp32, exact-bf16, merged-fp32, merged-bf16, merged-int8)"
                )
            })
    }
}

/// One request's rows as the engine compiled them (for the comparison with the reference's rows).
#[derive(Debug, Clone)]
pub struct Rows {
    /// State prefix ids.
    pub state_ids: Vec<u32>,
    /// `usage.input_tokens`.
    pub input_tokens: usize,
    /// Per question: id, type, whole row, option ends, decide index.
    pub questions: Vec<QuestionRows>,
}

/// One question's row.
#[derive(Debug, Clone)]
pub struct QuestionRows {
    /// Question id.
    pub id: String,
    /// `noul`, `choice`, `score`.
    pub kind: &'static str,
    /// The whole row (state + branch).
    pub row_ids: Vec<u32>,
    /// Each option's `<|box_end|>` index in the row.
    pub option_ends: Vec<usize>,
    /// The `<|fim_suffix|>` index.
    pub decide: usize,
}

/// What one arm produced.
#[derive(Debug, Clone)]
pub struct ArmRun {
    /// Which arm.
    pub id: ArmId,
    /// Where the weights came from.
    pub source: String,
    /// The backend's description.
    pub backend: String,
    /// Per request (set order), per question, the unrounded fp32 probabilities of the first run.
    pub probabilities: Vec<Vec<Vec<f32>>>,
    /// Per request, the response body of the first run.
    pub bodies: Vec<Value>,
    /// `None` when the second run (warm cache, batched) was bit-equal; else the first difference.
    pub rerun_difference: Option<String>,
    /// `None` when every row from zero was bit-equal to the shared-state run; else the first difference.
    pub shared_difference: Option<String>,
    /// Timings.
    pub seconds: ArmSeconds,
}

/// What one weight form produced: its arms, and the rows (equal for every arm: same tokenizer).
#[derive(Debug)]
pub struct FormRun {
    /// Per requested arm, in order: its run, or why it could not run.
    pub arms: Vec<(ArmId, Result<ArmRun, String>)>,
    /// The compiled rows, per request (set order).
    pub rows: Vec<Rows>,
}

/// Where a weight form's files are.
#[derive(Debug, Clone)]
pub struct FormSource {
    /// The decide crate's source.
    pub source: Source,
    /// The `tokenizer.json` the service uses with it.
    pub tokenizer: PathBuf,
}

impl FormSource {
    /// A prepared directory (merged only).
    pub fn prepared(dir: PathBuf) -> Self {
        FormSource {
            tokenizer: dir.join("tokenizer.json"),
            source: Source::Prepared(dir),
        }
    }

    /// The release directories (exact, or merged in memory at load).
    pub fn release(base: PathBuf, kev: PathBuf) -> Self {
        FormSource {
            tokenizer: kev.join("tokenizer.json"),
            source: Source::Release { base, kev },
        }
    }
}

/// Requests per batched call in the second run: the service batches concurrent requests, and the
/// engine promises the same bits whatever the batch; bounded so a 4B model's cloned states fit in memory.
const BATCH: usize = 8;

/// Load one weight form and run the set through each of `arms` (all of that form). The float arms share
/// one loaded backbone; the int8 arm has its own (its float copies are dropped at load), and a failure
/// to load it fails that arm only.
pub fn run_form(
    from: &FormSource,
    form: WeightForm,
    arms: &[Arm],
    set: &RequestSet,
    settings: &Settings,
) -> Result<FormRun, String> {
    let (int8, float): (Vec<Arm>, Vec<Arm>) = arms.iter().partition(|a| **a == Arm::Int8);
    let mut out = Vec::new();
    let mut rows = None;
    if !float.is_empty() {
        let fr = run_loaded(from, form, &float, set, settings)?;
        rows = Some(fr.rows);
        out.extend(fr.arms);
    }
    if !int8.is_empty() {
        match run_loaded(from, form, &int8, set, settings) {
            Ok(fr) => {
                rows.get_or_insert(fr.rows);
                out.extend(fr.arms);
            }
            Err(e) if rows.is_some() => {
                out.push((
                    ArmId {
                        form,
                        arm: Arm::Int8,
                    },
                    Err(e),
                ));
            }
            Err(e) => return Err(e),
        }
    }
    out.sort_by_key(|(id, _)| arms.iter().position(|a| *a == id.arm));
    Ok(FormRun {
        arms: out,
        rows: rows.ok_or("no arm asked for")?,
    })
}

/// Load one weight form for `arms` (the first one's loading; the others derived from its backbone).
fn run_loaded(
    from: &FormSource,
    form: WeightForm,
    arms: &[Arm],
    set: &RequestSet,
    settings: &Settings,
) -> Result<FormRun, String> {
    let first = *arms.first().ok_or("no arm asked for")?;
    let started = Instant::now();
    let spec = LoadSpec {
        source: from.source.clone(),
        form,
        arm: Some(first),
        settings: settings.clone(),
    };
    let (kev0, info) =
        load_cpu(&spec).map_err(|e| format!("loading {} weights: {e}", form.name()))?;
    let load = started.elapsed().as_secs_f64();
    let model: Arc<Backbone> = kev0.backend().model().clone();
    let head = kev0.head().clone();
    let jobs0 = admit_all(&kev0, set)?;
    let rows = rows_of(&jobs0);
    drop(jobs0);

    let mut out = Vec::new();
    let mut loaded = Some(kev0);
    for (i, &arm) in arms.iter().enumerate() {
        let id = ArmId { form, arm };
        let shared = match loaded.take() {
            Some(k) if arm == first => Ok(k),
            _ => derive(&model, arm, &head, from, settings, 2 * i as u64 + 1),
        };
        let result = shared.and_then(|kev| {
            let zero_settings = Settings {
                rows_from_zero: true,
                ..settings.clone()
            };
            let zero = derive(&model, arm, &head, from, &zero_settings, 2 * i as u64 + 2)?;
            let mut run = run_arm(&kev, &zero, set)?;
            run.id = id;
            run.source = info.source.clone();
            run.backend = kev_engine::Backend::describe(kev.backend());
            run.seconds.load = load;
            Ok(run)
        });
        out.push((id, result));
    }
    Ok(FormRun { arms: out, rows })
}

/// A service over an already loaded backbone with another arm or settings.
fn derive(
    model: &Arc<Backbone>,
    arm: Arm,
    head: &kev_decide::PointerHead,
    from: &FormSource,
    settings: &Settings,
    model_id: u64,
) -> Result<Kev<CpuBackend>, String> {
    let tokenizer = KevTokenizer::from_file(&from.tokenizer)
        .map_err(|e| format!("{}: {e}", from.tokenizer.display()))?;
    Ok(Kev::new(
        CpuBackend::new(model.clone(), arm),
        head.clone(),
        tokenizer,
        settings.clone(),
        model_id,
    ))
}

fn admit_all(kev: &Kev<CpuBackend>, set: &RequestSet) -> Result<Vec<Job>, String> {
    set.requests
        .iter()
        .map(|r| {
            kev.admit(&r.body).map_err(|refusal| {
                format!(
                    "request {} was refused ({}): {}",
                    r.name,
                    refusal.status(),
                    refusal.body()
                )
            })
        })
        .collect()
}

fn rows_of(jobs: &[Job]) -> Vec<Rows> {
    jobs.iter()
        .map(|job| {
            let c = job.compiled();
            let questions = job
                .request()
                .questions()
                .iter()
                .zip(c.branches())
                .enumerate()
                .map(|(k, (q, b))| QuestionRows {
                    id: q.id().to_string(),
                    kind: q.kind().as_str(),
                    row_ids: c.row_ids(k).unwrap_or_default(),
                    option_ends: b.option_ends().to_vec(),
                    decide: b.decide(),
                })
                .collect();
            Rows {
                state_ids: c.state_ids().to_vec(),
                input_tokens: c.input_tokens(),
                questions,
            }
        })
        .collect()
}

type Probabilities = Vec<Vec<Vec<f32>>>;

/// Run every job through `kev`, `group` requests per call.
fn run_jobs(
    kev: &Kev<CpuBackend>,
    set: &RequestSet,
    jobs: &[Job],
    group: usize,
) -> Result<(Probabilities, Vec<Value>), String> {
    let mut probs = Vec::with_capacity(jobs.len());
    let mut bodies = Vec::with_capacity(jobs.len());
    let names: Vec<&str> = set.requests.iter().map(|r| r.name.as_str()).collect();
    for (chunk, chunk_names) in jobs.chunks(group.max(1)).zip(names.chunks(group.max(1))) {
        let refs: Vec<&Job> = chunk.iter().collect();
        for (result, name) in kev.run(&refs).into_iter().zip(chunk_names) {
            let d = result.map_err(|e| format!("request {name}: {e}"))?;
            bodies.push(d.body());
            probs.push(d.probabilities);
        }
    }
    if probs.len() != jobs.len() {
        return Err(format!(
            "{} answers for {} requests",
            probs.len(),
            jobs.len()
        ));
    }
    Ok((probs, bodies))
}

/// Run 1 (one request at a time, cold cache), run 2 (warm cache, batched), and every row from zero.
fn run_arm(
    kev: &Kev<CpuBackend>,
    zero: &Kev<CpuBackend>,
    set: &RequestSet,
) -> Result<ArmRun, String> {
    let jobs = admit_all(kev, set)?;
    let t = Instant::now();
    let (first, bodies) = run_jobs(kev, set, &jobs, 1)?;
    let run = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let (second, _) = run_jobs(kev, set, &jobs, BATCH)?;
    let rerun = t.elapsed().as_secs_f64();
    let zero_jobs = admit_all(zero, set)?;
    let t = Instant::now();
    let (from_zero, _) = run_jobs(zero, set, &zero_jobs, 1)?;
    let from_zero_s = t.elapsed().as_secs_f64();
    let name_of = |msg: String| name_request(set, msg);
    Ok(ArmRun {
        id: ArmId {
            form: WeightForm::Merged,
            arm: Arm::Fp32,
        },
        source: String::new(),
        backend: String::new(),
        rerun_difference: first_bit_difference(&first, &second).map(name_of),
        shared_difference: first_bit_difference(&first, &from_zero).map(name_of),
        probabilities: first,
        bodies,
        seconds: ArmSeconds {
            load: 0.0,
            run,
            rerun,
            from_zero: from_zero_s,
        },
    })
}

/// Replace a leading `request N` with the request's name.
fn name_request(set: &RequestSet, msg: String) -> String {
    if let Some(rest) = msg.strip_prefix("request ") {
        let (num, tail) = rest.split_once(' ').unwrap_or((rest, ""));
        if let Some(r) = num.parse::<usize>().ok().and_then(|i| set.requests.get(i)) {
            return format!("request {} {tail}", r.name).trim_end().to_string();
        }
    }
    msg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arm_names_round_trip() {
        for a in ArmId::ALL {
            assert_eq!(a.name().parse::<ArmId>().unwrap(), a);
        }
        assert!("exact-fp16".parse::<ArmId>().is_err());
        assert_eq!(ArmId::ALL[0].name(), "exact-fp32");
        assert_eq!(ArmId::ALL[4].name(), "merged-int8");
    }

    #[test]
    fn differences_name_the_request() {
        let set = RequestSet {
            source: "t".into(),
            requests: vec![
                crate::requests::Request {
                    name: "a".into(),
                    body: vec![],
                },
                crate::requests::Request {
                    name: "long-cjk".into(),
                    body: vec![],
                },
            ],
        };
        assert_eq!(
            name_request(&set, "request 1 question 0 option 2: x".into()),
            "request long-cjk question 0 option 2: x"
        );
        assert_eq!(name_request(&set, "request 9 x".into()), "request 9 x");
        assert_eq!(
            name_request(&set, "2 requests vs 3".into()),
            "2 requests vs 3"
        );
    }
}
