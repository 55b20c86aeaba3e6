//! Temperature calibration of the pointer head: fit `T` by minimising the negative log-likelihood of labelled
//! answers, score probabilities (NLL, Brier, ECE over 15 bins, accuracy), and the calibration file `kev serve
//! --calibration` reads.
//!
//! A calibration replaces the head's one temperature by one per *group* of questions: all questions
//! (`global`), per question type (`type`), per option-count bucket (`options`: 2, 3–5, 6–10, 11+, as llama.cpp
//! buckets them) or both (`type+options`). It divides the logits: `p = softmax(z / T)`, never `p^(1/T)`.
//!
//! Fitting is on logits `z_j = (k_j·q)·scale` without any temperature. NLL(β = 1/T) is convex in β, so it is
//! unimodal in `ln T` and a golden-section search on `ln T` finds the minimum. Out-of-fold estimates fit on k−1
//! folds (folds are whole request lines) and score the held-out one; the interval is a percentile bootstrap over
//! questions. All randomness is a seeded SplitMix64, so a report is reproducible.

use std::collections::BTreeMap;

use kev_contract::QuestionKind;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// Bins of the expected calibration error and the reliability diagram.
pub const ECE_BINS: usize = 15;

/// Smallest and largest temperature a fit may return.
pub const T_RANGE: (f64, f64) = (1e-3, 1e4);

/// How questions are grouped, each group getting its own temperature.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Grouping {
    /// One temperature for every question.
    #[serde(rename = "global")]
    Global,
    /// One per question type: `noul`, `choice`, `score`.
    #[serde(rename = "type")]
    Type,
    /// One per option-count bucket: `2`, `3-5`, `6-10`, `11+`.
    #[serde(rename = "options")]
    Options,
    /// One per type and bucket: `choice/3-5`, …
    #[serde(rename = "type+options")]
    TypeOptions,
}

impl Grouping {
    /// The name used on the command line and in the file.
    pub fn name(self) -> &'static str {
        match self {
            Grouping::Global => "global",
            Grouping::Type => "type",
            Grouping::Options => "options",
            Grouping::TypeOptions => "type+options",
        }
    }

    /// The group of a question of this type with `n` options.
    pub fn group(self, kind: QuestionKind, n: usize) -> String {
        match self {
            Grouping::Global => "all".into(),
            Grouping::Type => kind.as_str().into(),
            Grouping::Options => bucket(n).into(),
            Grouping::TypeOptions => format!("{}/{}", kind.as_str(), bucket(n)),
        }
    }
}

impl std::str::FromStr for Grouping {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "global" => Ok(Grouping::Global),
            "type" => Ok(Grouping::Type),
            "options" => Ok(Grouping::Options),
            "type+options" => Ok(Grouping::TypeOptions),
            other => Err(format!(
                "unknown grouping {other:?}: use global, type, options or type+options"
            )),
        }
    }
}

/// The option-count bucket of a question with `n` options (one option counts with two: its softmax is 1
/// whatever the temperature).
pub fn bucket(n: usize) -> &'static str {
    match n {
        0..=2 => "2",
        3..=5 => "3-5",
        6..=10 => "6-10",
        _ => "11+",
    }
}

/// Fitted temperatures, as `kev calibrate` writes them and `kev serve --calibration` applies them.
#[derive(Debug, Clone, PartialEq)]
pub struct Calibration {
    /// How questions are grouped.
    pub by: Grouping,
    /// The temperature of a question whose group has none (fitted on all questions).
    pub global: f64,
    /// Per group.
    pub temperatures: BTreeMap<String, f64>,
    /// sha256 of the file it was read from (hex), `None` when built in memory.
    pub source_sha256: Option<String>,
}

/// A calibration file that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("calibration: {0}")]
pub struct CalibrationError(String);

fn positive(t: f64, what: &str) -> Result<f64, CalibrationError> {
    if t.is_finite() && t > 0.0 {
        Ok(t)
    } else {
        Err(CalibrationError(format!(
            "{what}: {t} is not a positive temperature"
        )))
    }
}

impl Calibration {
    /// The temperature for a question of this type with `n` options.
    pub fn temperature(&self, kind: QuestionKind, n: usize) -> f64 {
        if self.by == Grouping::Global {
            return self.global;
        }
        self.temperatures
            .get(&self.by.group(kind, n))
            .copied()
            .unwrap_or(self.global)
    }

    /// Read a calibration file (`kev calibrate --out`; `kev serve --calibration FILE`, the Python package's
    /// `calibration=PATH`): [`Calibration::from_bytes`] of its contents, the error naming the file.
    pub fn read(path: &std::path::Path) -> Result<Self, CalibrationError> {
        let bytes = std::fs::read(path)
            .map_err(|e| CalibrationError(format!("reading {}: {e}", path.display())))?;
        Self::from_bytes(&bytes)
            .map_err(|CalibrationError(m)| CalibrationError(format!("{}: {m}", path.display())))
    }

    /// Read a calibration file (`kev calibrate --out`): `by`, `global`, `temperatures` are used, everything else
    /// (the report) is kept in the file for people. Its sha256 is remembered for `/v1/models`.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, CalibrationError> {
        let v: Value = serde_json::from_slice(bytes)
            .map_err(|e| CalibrationError(format!("not JSON: {e}")))?;
        if v.get("kind").and_then(Value::as_str) != Some("kev-calibration") {
            return Err(CalibrationError(
                "not a kev calibration file (no \"kind\": \"kev-calibration\")".into(),
            ));
        }
        let by: Grouping = v
            .get("by")
            .and_then(Value::as_str)
            .ok_or_else(|| CalibrationError("no \"by\"".into()))?
            .parse()
            .map_err(CalibrationError)?;
        let global = positive(
            v.get("global")
                .and_then(Value::as_f64)
                .ok_or_else(|| CalibrationError("no \"global\" temperature".into()))?,
            "global",
        )?;
        let mut temperatures = BTreeMap::new();
        if let Some(map) = v.get("temperatures").and_then(Value::as_object) {
            for (g, t) in map {
                let t = t.as_f64().ok_or_else(|| {
                    CalibrationError(format!("temperature of {g:?} is not a number"))
                })?;
                temperatures.insert(g.clone(), positive(t, g)?);
            }
        } else if by != Grouping::Global {
            return Err(CalibrationError("no \"temperatures\" object".into()));
        }
        Ok(Calibration {
            by,
            global,
            temperatures,
            source_sha256: Some(sha256_hex(bytes)),
        })
    }

    /// What `/v1/models` reports: the file's hash, the grouping and every group's temperature.
    pub fn card(&self) -> Value {
        json!({
            "sha256": self.source_sha256,
            "by": self.by.name(),
            "global": self.global,
            "temperatures": self.temperatures,
        })
    }
}

/// sha256 of bytes, hex (calibration files and their source data are named by it).
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// One labelled question: its logits (no temperature), the index of the right option, and its group inputs.
#[derive(Debug, Clone)]
pub struct Scored {
    /// `z_j` per option, without the temperature (any constant shift is harmless).
    pub logits: Vec<f64>,
    /// The labelled option.
    pub label: usize,
    /// The question's type.
    pub kind: QuestionKind,
    /// The request line it came from (folds keep a line's questions together).
    pub line: usize,
}

/// `softmax(z / t)` in f64.
pub fn softmax_t(z: &[f64], t: f64) -> Vec<f64> {
    let max = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = z.iter().map(|v| ((v - max) / t).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|v| v / s).collect()
}

/// `-ln softmax(z / t)[label]`, computed as a log-sum-exp (no underflow).
fn nll_one(z: &[f64], label: usize, t: f64) -> f64 {
    let max = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let lse: f64 = z.iter().map(|v| ((v - max) / t).exp()).sum::<f64>().ln();
    lse - (z[label] - max) / t
}

/// Probability scores of a set of answers.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Default)]
pub struct Metrics {
    /// Questions scored.
    pub n: usize,
    /// Mean negative log-likelihood of the labelled option (probabilities clamped at `1e-12`).
    pub nll: f64,
    /// Mean multi-class Brier score `Σ_j (p_j − y_j)²`.
    pub brier: f64,
    /// Expected calibration error of the top option over 15 equal-width confidence bins.
    pub ece: f64,
    /// Share of questions whose first argmax is the labelled option.
    pub accuracy: f64,
    /// Mean top-option probability.
    pub confidence: f64,
}

/// One bin of a reliability diagram.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Bin {
    /// Lower edge of the confidence bin.
    pub lo: f64,
    /// Upper edge.
    pub hi: f64,
    /// Questions whose top probability falls in it.
    pub count: usize,
    /// Their mean top probability.
    pub confidence: f64,
    /// Share of them answered right.
    pub accuracy: f64,
}

fn top(p: &[f64]) -> (usize, f64) {
    let mut best = 0;
    for (i, v) in p.iter().enumerate() {
        if *v > p[best] {
            best = i;
        }
    }
    (best, p.get(best).copied().unwrap_or(0.0))
}

/// The bin of a top probability `c` (`[k/15, (k+1)/15)`, the last bin closed).
pub fn bin_of(c: f64) -> usize {
    ((c * ECE_BINS as f64).floor() as usize).min(ECE_BINS - 1)
}

/// Reliability bins of (probabilities, label) pairs.
pub fn reliability<'a>(items: impl IntoIterator<Item = (&'a [f64], usize)>) -> Vec<Bin> {
    let mut sum_c = [0f64; ECE_BINS];
    let mut sum_a = [0f64; ECE_BINS];
    let mut count = [0usize; ECE_BINS];
    for (p, label) in items {
        let (arg, c) = top(p);
        let b = bin_of(c);
        sum_c[b] += c;
        sum_a[b] += (arg == label) as u8 as f64;
        count[b] += 1;
    }
    (0..ECE_BINS)
        .map(|b| Bin {
            lo: b as f64 / ECE_BINS as f64,
            hi: (b + 1) as f64 / ECE_BINS as f64,
            count: count[b],
            confidence: if count[b] > 0 {
                sum_c[b] / count[b] as f64
            } else {
                0.0
            },
            accuracy: if count[b] > 0 {
                sum_a[b] / count[b] as f64
            } else {
                0.0
            },
        })
        .collect()
}

/// NLL, Brier, ECE, accuracy of (probabilities, label) pairs.
pub fn metrics<'a>(items: impl IntoIterator<Item = (&'a [f64], usize)> + Clone) -> Metrics {
    metrics_with_floor(items, 1e-12)
}

/// [`metrics`] with the labelled option's probability floored at `floor` for the NLL (`kev eval` reads
/// probabilities rounded to 4 places, where a small one arrives as 0: it counts as half a unit, 5e-5).
pub fn metrics_with_floor<'a>(
    items: impl IntoIterator<Item = (&'a [f64], usize)> + Clone,
    floor: f64,
) -> Metrics {
    let mut m = Metrics::default();
    for (p, label) in items.clone() {
        let (arg, c) = top(p);
        m.n += 1;
        m.nll += -p[label].max(floor).ln();
        m.brier += p
            .iter()
            .enumerate()
            .map(|(j, v)| (v - (j == label) as u8 as f64).powi(2))
            .sum::<f64>();
        m.accuracy += (arg == label) as u8 as f64;
        m.confidence += c;
    }
    if m.n == 0 {
        return m;
    }
    let n = m.n as f64;
    m.nll /= n;
    m.brier /= n;
    m.accuracy /= n;
    m.confidence /= n;
    m.ece = reliability(items)
        .iter()
        .map(|b| b.count as f64 / n * (b.accuracy - b.confidence).abs())
        .sum();
    m
}

/// Probabilities the head serves at temperature `t`: softmax in f64, rounded to f32 once, as
/// [`crate::PointerHead`] does.
pub fn served(z: &[f64], t: f64) -> Vec<f64> {
    softmax_t(z, t).iter().map(|v| *v as f32 as f64).collect()
}

/// Metrics of questions at given temperatures.
pub fn metrics_at(items: &[&Scored], t: impl Fn(&Scored) -> f64) -> Metrics {
    let probs: Vec<Vec<f64>> = items.iter().map(|s| served(&s.logits, t(s))).collect();
    metrics(
        probs
            .iter()
            .zip(items)
            .map(|(p, s)| (p.as_slice(), s.label)),
    )
}

/// Mean NLL of questions at temperature `t`.
pub fn mean_nll(items: &[&Scored], t: f64) -> f64 {
    if items.is_empty() {
        return 0.0;
    }
    items
        .iter()
        .map(|s| nll_one(&s.logits, s.label, t))
        .sum::<f64>()
        / items.len() as f64
}

/// The temperature minimising the mean NLL of `items` (golden-section search on `ln T` over [`T_RANGE`]);
/// `None` when no item has two or more options (the temperature changes nothing then).
pub fn fit_temperature(items: &[&Scored]) -> Option<f64> {
    let informative: Vec<&Scored> = items
        .iter()
        .copied()
        .filter(|s| s.logits.len() > 1)
        .collect();
    if informative.is_empty() {
        return None;
    }
    let f = |u: f64| mean_nll(&informative, u.exp());
    let (mut a, mut b) = (T_RANGE.0.ln(), T_RANGE.1.ln());
    let g = (5f64.sqrt() - 1.0) / 2.0;
    let mut c = b - g * (b - a);
    let mut d = a + g * (b - a);
    let (mut fc, mut fd) = (f(c), f(d));
    for _ in 0..120 {
        if fc <= fd {
            b = d;
            d = c;
            fd = fc;
            c = b - g * (b - a);
            fc = f(c);
        } else {
            a = c;
            c = d;
            fc = fd;
            d = a + g * (b - a);
            fd = f(d);
        }
    }
    Some(((a + b) / 2.0).exp())
}

/// SplitMix64: a small seeded generator for folds and bootstrap draws.
#[derive(Debug, Clone)]
pub struct SplitMix(u64);

impl SplitMix {
    /// Seeded.
    pub fn new(seed: u64) -> Self {
        SplitMix(seed)
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`; the modulo bias is below 2^-40 for the sizes used here).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// Settings of a fit.
#[derive(Debug, Clone)]
pub struct FitOptions {
    /// Grouping.
    pub by: Grouping,
    /// Folds for out-of-fold estimates (≥ 2).
    pub folds: usize,
    /// Bootstrap resamples for the interval (0: none).
    pub bootstrap: usize,
    /// Seed of folds and bootstrap.
    pub seed: u64,
    /// The temperature the "before" columns are scored at (the head's, or a deliberately wrong one).
    pub start_temperature: f64,
}

/// Before/after scores and the fitted temperature of one group.
#[derive(Debug, Clone, Serialize)]
pub struct GroupReport {
    /// Group name (`all` for every question together).
    pub group: String,
    /// Questions.
    pub n: usize,
    /// Fitted on all of the group's questions (what the file serves); for `all` under a finer grouping, the
    /// global fallback.
    pub temperature: f64,
    /// 2.5 % and 97.5 % bootstrap percentiles of the fitted temperature.
    pub interval: Option<[f64; 2]>,
    /// At the start temperature.
    pub before: Metrics,
    /// At the temperatures fitted on the other folds (out of fold).
    pub after: Metrics,
    /// At the temperature fitted on all of the data (in sample), for comparison.
    pub after_in_sample: Metrics,
}

/// A whole calibration run: the temperatures to serve and the report.
#[derive(Debug, Clone)]
pub struct Fit {
    /// What `--calibration` applies.
    pub calibration: Calibration,
    /// `all` first, then one row per group.
    pub groups: Vec<GroupReport>,
    /// Reliability bins of every question at the start temperature.
    pub reliability_before: Vec<Bin>,
    /// Reliability bins of every question out of fold.
    pub reliability_after: Vec<Bin>,
}

/// Temperatures per group fitted on `items`, with the global one as fallback.
fn fit_groups(items: &[&Scored], by: Grouping) -> (f64, BTreeMap<String, f64>) {
    let global = fit_temperature(items).unwrap_or(1.0);
    let mut groups: BTreeMap<String, Vec<&Scored>> = BTreeMap::new();
    if by != Grouping::Global {
        for s in items {
            groups
                .entry(by.group(s.kind, s.logits.len()))
                .or_default()
                .push(s);
        }
    }
    let temps = groups
        .into_iter()
        .filter_map(|(g, v)| fit_temperature(&v).map(|t| (g, t)))
        .collect();
    (global, temps)
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    let pos = q * (sorted.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

fn bootstrap(items: &[&Scored], draws: usize, rng: &mut SplitMix) -> Option<[f64; 2]> {
    if draws == 0 || items.is_empty() {
        return None;
    }
    let mut ts: Vec<f64> = (0..draws)
        .filter_map(|_| {
            let sample: Vec<&Scored> = (0..items.len())
                .map(|_| items[rng.below(items.len())])
                .collect();
            fit_temperature(&sample)
        })
        .collect();
    if ts.is_empty() {
        return None;
    }
    ts.sort_by(f64::total_cmp);
    Some([percentile(&ts, 0.025), percentile(&ts, 0.975)])
}

/// Fit temperatures on labelled questions and report before/after, in sample and out of fold.
pub fn fit(items: &[Scored], opts: &FitOptions) -> Result<Fit, String> {
    if items.is_empty() {
        return Err("no labelled questions".into());
    }
    let lines = items.iter().map(|s| s.line).max().unwrap_or(0) + 1;
    let folds = opts.folds.max(2);
    if lines < folds {
        return Err(format!(
            "{lines} request line(s) cannot make {folds} folds; pass --folds {lines} or more data"
        ));
    }
    let all: Vec<&Scored> = items.iter().collect();
    let (global, temps) = fit_groups(&all, opts.by);
    let calibration = Calibration {
        by: opts.by,
        global,
        temperatures: temps,
        source_sha256: None,
    };

    // Folds of whole lines, shuffled (Fisher–Yates) so that neighbouring lines do not share a fold.
    let mut rng = SplitMix::new(opts.seed);
    let mut order: Vec<usize> = (0..lines).collect();
    for i in (1..lines).rev() {
        order.swap(i, rng.below(i + 1));
    }
    let mut fold_of = vec![0usize; lines];
    for (rank, &line) in order.iter().enumerate() {
        fold_of[line] = rank % folds;
    }
    let mut oof_t = vec![0f64; items.len()];
    for f in 0..folds {
        let train: Vec<&Scored> = items.iter().filter(|s| fold_of[s.line] != f).collect();
        let (g, t) = fit_groups(&train, opts.by);
        let c = Calibration {
            by: opts.by,
            global: g,
            temperatures: t,
            source_sha256: None,
        };
        for (i, s) in items.iter().enumerate() {
            if fold_of[s.line] == f {
                oof_t[i] = c.temperature(s.kind, s.logits.len());
            }
        }
    }
    // Every `&Scored` below points into `items`: its offset is its index.
    let oof_of = |s: &Scored| -> f64 {
        let i = (std::ptr::from_ref(s) as usize - items.as_ptr() as usize)
            / std::mem::size_of::<Scored>();
        oof_t[i]
    };

    let report = |name: String, members: &[&Scored], t: f64, rng: &mut SplitMix| GroupReport {
        group: name,
        n: members.len(),
        temperature: t,
        interval: bootstrap(members, opts.bootstrap, rng),
        before: metrics_at(members, |_| opts.start_temperature),
        after: metrics_at(members, oof_of),
        after_in_sample: metrics_at(members, |s| calibration.temperature(s.kind, s.logits.len())),
    };
    let mut groups = vec![report("all".into(), &all, global, &mut rng)];
    if opts.by != Grouping::Global {
        let mut by_group: BTreeMap<String, Vec<&Scored>> = BTreeMap::new();
        for s in &all {
            by_group
                .entry(opts.by.group(s.kind, s.logits.len()))
                .or_default()
                .push(s);
        }
        for (g, members) in by_group {
            let t = calibration.temperatures.get(&g).copied().unwrap_or(global);
            groups.push(report(g, &members, t, &mut rng));
        }
    }
    let before: Vec<Vec<f64>> = all
        .iter()
        .map(|s| served(&s.logits, opts.start_temperature))
        .collect();
    let after: Vec<Vec<f64>> = all.iter().map(|s| served(&s.logits, oof_of(s))).collect();
    Ok(Fit {
        calibration,
        reliability_before: reliability(
            before
                .iter()
                .zip(&all)
                .map(|(p, s)| (p.as_slice(), s.label)),
        ),
        reliability_after: reliability(
            after.iter().zip(&all).map(|(p, s)| (p.as_slice(), s.label)),
        ),
        groups,
    })
}

impl Fit {
    /// The calibration file: what serving reads (`kind`, `by`, `global`, `temperatures`) and the report.
    pub fn to_file(&self, opts: &FitOptions, source: Value) -> Value {
        json!({
            "kind": "kev-calibration",
            "version": 1,
            "by": self.calibration.by.name(),
            "global": self.calibration.global,
            "temperatures": self.calibration.temperatures,
            "source": source,
            "fit": {
                "start_temperature": opts.start_temperature,
                "folds": opts.folds,
                "bootstrap": opts.bootstrap,
                "seed": opts.seed,
                "ece_bins": ECE_BINS,
            },
            "groups": self.groups,
            "reliability": {"before": self.reliability_before, "after_out_of_fold": self.reliability_after},
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Questions drawn from a known softmax at temperature `t_true` over random logits.
    fn synthetic(n: usize, k: usize, t_true: f64, seed: u64) -> Vec<Scored> {
        let mut rng = SplitMix::new(seed);
        let unit = |r: &mut SplitMix| (r.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        (0..n)
            .map(|i| {
                let z: Vec<f64> = (0..k).map(|_| unit(&mut rng) * 8.0 - 4.0).collect();
                let p = softmax_t(&z, t_true);
                let u = unit(&mut rng);
                let mut acc = 0.0;
                let mut label = k - 1;
                for (j, v) in p.iter().enumerate() {
                    acc += v;
                    if u < acc {
                        label = j;
                        break;
                    }
                }
                Scored {
                    logits: z,
                    label,
                    kind: if k == 2 {
                        QuestionKind::Noul
                    } else {
                        QuestionKind::Choice
                    },
                    line: i,
                }
            })
            .collect()
    }

    #[test]
    fn recovers_a_known_temperature() {
        let items = synthetic(4000, 4, 2.5, 7);
        let refs: Vec<&Scored> = items.iter().collect();
        let t = fit_temperature(&refs).unwrap();
        assert!((t - 2.5).abs() < 0.25, "fitted {t}");
        // The fit is a minimum: both neighbours are worse.
        assert!(mean_nll(&refs, t) <= mean_nll(&refs, t * 1.05));
        assert!(mean_nll(&refs, t) <= mean_nll(&refs, t / 1.05));
    }

    #[test]
    fn wrong_start_temperatures_are_repaired_out_of_fold() {
        let items = synthetic(3000, 3, 2.0, 11);
        for start in [6.0, 2.0 / 3.0] {
            let opts = FitOptions {
                by: Grouping::Global,
                folds: 5,
                bootstrap: 50,
                seed: 1,
                start_temperature: start,
            };
            let fit = fit(&items, &opts).unwrap();
            let all = &fit.groups[0];
            assert!(all.after.ece <= 0.5 * all.before.ece, "{all:?}");
            assert!(all.after.nll < all.before.nll, "{all:?}");
            let [lo, hi] = all.interval.unwrap();
            assert!(lo <= all.temperature && all.temperature <= hi, "{all:?}");
        }
    }

    #[test]
    fn groups_get_their_own_temperature() {
        let mut items = synthetic(2000, 2, 1.0, 3);
        let more = synthetic(2000, 6, 4.0, 5);
        items.extend(more.into_iter().map(|mut s| {
            s.line += 2000;
            s
        }));
        let opts = FitOptions {
            by: Grouping::TypeOptions,
            folds: 4,
            bootstrap: 0,
            seed: 2,
            start_temperature: 1.0,
        };
        let fit = fit(&items, &opts).unwrap();
        let c = &fit.calibration;
        assert!(
            (c.temperature(QuestionKind::Noul, 2) - 1.0).abs() < 0.15,
            "{c:?}"
        );
        assert!(
            (c.temperature(QuestionKind::Choice, 6) - 4.0).abs() < 0.6,
            "{c:?}"
        );
        // A group the data never had falls back to the global temperature.
        assert_eq!(c.temperature(QuestionKind::Score, 3), c.global);
        assert_eq!(fit.groups.len(), 3);
    }

    #[test]
    fn metrics_by_hand() {
        let p = [vec![0.9, 0.1], vec![0.4, 0.6], vec![0.2, 0.8]];
        let labels = [0usize, 0, 1];
        let m = metrics(p.iter().zip(labels).map(|(p, l)| (p.as_slice(), l)));
        assert_eq!(m.n, 3);
        assert!((m.accuracy - 2.0 / 3.0).abs() < 1e-12);
        let nll = -(0.9f64.ln() + 0.4f64.ln() + 0.8f64.ln()) / 3.0;
        assert!((m.nll - nll).abs() < 1e-12);
        let brier = (2.0 * 0.01 + 2.0 * 0.36 + 2.0 * 0.04) / 3.0;
        assert!((m.brier - brier).abs() < 1e-12);
        // Bins: 0.9 → bin 13 (right), 0.6 → bin 9 (wrong), 0.8 → bin 12 (right).
        let ece = (0.1 + 0.6 + 0.2) / 3.0;
        assert!((m.ece - ece).abs() < 1e-12, "{}", m.ece);
    }

    #[test]
    fn calibration_files_round_trip_and_refuse_nonsense() {
        let items = synthetic(500, 3, 1.5, 9);
        let opts = FitOptions {
            by: Grouping::Type,
            folds: 3,
            bootstrap: 0,
            seed: 0,
            start_temperature: 1.0,
        };
        let fit = fit(&items, &opts).unwrap();
        let bytes = serde_json::to_vec(&fit.to_file(&opts, json!({}))).unwrap();
        let back = Calibration::from_bytes(&bytes).unwrap();
        assert_eq!(back.by, Grouping::Type);
        assert_eq!(back.global, fit.calibration.global);
        assert_eq!(back.temperatures, fit.calibration.temperatures);
        assert_eq!(back.source_sha256.as_deref().map(str::len), Some(64));
        for bad in [
            &br#"{"by":"global","global":1}"#[..],
            br#"{"kind":"kev-calibration","by":"global","global":-1}"#,
            br#"{"kind":"kev-calibration","by":"types","global":1}"#,
            br#"{"kind":"kev-calibration","by":"type","global":1,"temperatures":{"noul":0}}"#,
            b"nope",
        ] {
            assert!(Calibration::from_bytes(bad).is_err());
        }
    }
}
