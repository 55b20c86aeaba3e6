//! The decision gates: rows equal to the reference's, each arm against the author's fp32 reference (the
//! fixed bar, or the torch-bf16 yardstick on synthetic weights), the fp32 arms within 1e-4, reruns and
//! shared state bit-equal.

use kev_decide::WeightForm;
use kev_engine::Arm;
use serde_json::Value;

use crate::GateMode;
use crate::decisions::{ArmId, ArmRun, Rows};
use crate::metrics::{Distance, MARGIN, Pair, distance};
use crate::reference::ReferenceOutput;
use crate::report::{ArmReport, Gate, Status, TorchBf16, Yardstick};
use crate::requests::RequestSet;

/// The published parity bar (kev-contract §6): max |Δp|.
pub const MAX_ABS: f64 = 0.02;
/// The published parity bar: mean |Δp|.
pub const MEAN_ABS: f64 = 0.002;
/// The fp32 arms' bar: exact-fp32 against the reference, merged-fp32 against the reference's
/// merged-bf16 arm (same weights, same arithmetic).
pub const FP32_MAX_ABS: f64 = 1e-4;

fn widen(p: &[Vec<Vec<f32>>]) -> Vec<Vec<Vec<f64>>> {
    p.iter()
        .map(|r| {
            r.iter()
                .map(|q| q.iter().map(|&x| x as f64).collect())
                .collect()
        })
        .collect()
}

/// Distance of `ours` (per request in set order) from one arm of the reference; `None` when the reference
/// lacks that arm. A request the two sides do not both answer with the same questions counts as an
/// infinite difference (`decisions.rows` says why).
pub fn vs_reference_arm(
    set: &RequestSet,
    ours: &[Vec<Vec<f64>>],
    reference: &ReferenceOutput,
    arm: &str,
) -> Option<Distance> {
    if !reference.has_arm(arm) {
        return None;
    }
    let mut pairs = Vec::new();
    for (req, ours_r) in set.requests.iter().zip(ours) {
        match reference.record(&req.name) {
            Some(rec) if rec.questions.len() == ours_r.len() => {
                for (q, p) in rec.questions.iter().zip(ours_r) {
                    pairs.push(Pair {
                        request: &req.name,
                        question: &q.id,
                        ours: p,
                        theirs: q.arm(arm).unwrap_or(&[]),
                        reference: q.reference.as_deref().unwrap_or(&[]),
                    });
                }
            }
            _ => pairs.push(Pair {
                request: &req.name,
                question: "(not comparable: see decisions.rows)",
                ours: &[],
                theirs: &[],
                reference: &[],
            }),
        }
    }
    Some(distance(pairs))
}

/// Distance of one reference arm from the reference arm itself (torch's bf16 run, the merged weights),
/// over the set's requests only: a yardstick measured on other requests would not be the same run.
pub fn reference_arm_vs_reference(
    set: &RequestSet,
    reference: &ReferenceOutput,
    arm: &str,
) -> Option<Distance> {
    let mut pairs = Vec::new();
    for req in &set.requests {
        let rec = reference.record(&req.name)?;
        for q in &rec.questions {
            let r = q.reference.as_deref()?;
            pairs.push(Pair {
                request: &req.name,
                question: &q.id,
                ours: q.arm(arm)?,
                theirs: r,
                reference: r,
            });
        }
    }
    Some(distance(pairs))
}

/// Distance of one arm's probabilities from another's (no reference: the anchor arm decides margins).
pub fn vs_anchor(
    set: &RequestSet,
    rows: &[Rows],
    ours: &[Vec<Vec<f64>>],
    anchor: &[Vec<Vec<f64>>],
) -> Distance {
    let mut pairs = Vec::new();
    for (((req, r), o), a) in set.requests.iter().zip(rows).zip(ours).zip(anchor) {
        for ((q, po), pa) in r.questions.iter().zip(o).zip(a) {
            pairs.push(Pair {
                request: &req.name,
                question: &q.id,
                ours: po,
                theirs: pa,
                reference: pa,
            });
        }
    }
    distance(pairs)
}

/// The engine's rows equal the reference's, request by request.
pub fn rows_gate(set: &RequestSet, rows: &[Rows], reference: &ReferenceOutput) -> Gate {
    let id = "decisions.rows";
    let title = "token rows, readout indices and input_tokens equal the reference's (tokenizer and contract)";
    let mut problems = Vec::new();
    let mut questions = 0usize;
    for (req, ours) in set.requests.iter().zip(rows) {
        let Some(rec) = reference.record(&req.name) else {
            problems.push(format!(
                "{}: the reference rejected it, kev answers it",
                req.name
            ));
            continue;
        };
        if rec.state_ids != ours.state_ids {
            problems.push(format!(
                "{}: state tokens differ ({} vs the reference's {})",
                req.name,
                ours.state_ids.len(),
                rec.state_ids.len()
            ));
        }
        if rec.input_tokens != ours.input_tokens {
            problems.push(format!(
                "{}: input_tokens {} vs the reference's {}",
                req.name, ours.input_tokens, rec.input_tokens
            ));
        }
        if rec.questions.len() != ours.questions.len() {
            problems.push(format!(
                "{}: {} questions vs the reference's {}",
                req.name,
                ours.questions.len(),
                rec.questions.len()
            ));
            continue;
        }
        for (q, r) in ours.questions.iter().zip(&rec.questions) {
            questions += 1;
            if q.id != r.id {
                problems.push(format!(
                    "{}: question {:?} where the reference has {:?}",
                    req.name, q.id, r.id
                ));
            } else if q.row_ids != r.row_ids {
                let at = q
                    .row_ids
                    .iter()
                    .zip(&r.row_ids)
                    .position(|(a, b)| a != b)
                    .unwrap_or(q.row_ids.len().min(r.row_ids.len()));
                problems.push(format!(
                    "{} / {}: row differs from token {at} ({} vs {} tokens)",
                    req.name,
                    q.id,
                    q.row_ids.len(),
                    r.row_ids.len()
                ));
            } else if q.option_ends != r.option_ends || q.decide != r.decide {
                problems.push(format!("{} / {}: readout indices differ", req.name, q.id));
            }
        }
    }
    Gate::from_problems(
        id,
        title,
        format!(
            "{} requests, {questions} questions: rows identical",
            rows.len()
        ),
        problems,
    )
}

/// The yardstick one arm is held to against the reference.
pub fn yardstick(
    mode: GateMode,
    arm: ArmId,
    torch: Option<&Distance>,
) -> Result<Yardstick, String> {
    let fixed = |why: String| Yardstick {
        kind: "fixed".into(),
        why,
        max_abs: MAX_ABS,
        mean_abs: MEAN_ABS,
        flips: 0,
    };
    if arm.form == WeightForm::Exact && arm.arm == Arm::Fp32 {
        return Ok(fixed(
            "the exact fp32 arm is the author's own arithmetic: always the fixed bar (and 1e-4, gated separately)"
                .into(),
        ));
    }
    if mode == GateMode::Real {
        return Ok(fixed(
            "real weights: the published parity bar (kev-contract §6; the Core AI port's)".into(),
        ));
    }
    let t = torch.ok_or(
        "--gates synthetic needs the reference's torch_bf16 arm (torch's own bf16 run) to measure against",
    )?;
    let why = if arm.arm == Arm::Bf16 {
        format!(
            "synthetic random weights amplify bf16 rounding far beyond a trained model (torch's own bf16 run is {:.3} \
             from fp32 here), so the fixed 0.02 cannot be met by any bf16 run; the arm passes if it is no further from \
             the fp32 reference than torch's bf16 run (issue 6)",
            t.max_abs
        )
    } else {
        "synthetic random weights: the merged form stores the merged weights in bf16, and this model amplifies that \
         rounding like bf16 compute (see the reference's merged-bf16 arm below), so the torch-bf16 yardstick applies; \
         the arm's own arithmetic is held to 1e-4 of the reference's merged-bf16 arm (fp32 gate, never loosened)"
            .into()
    };
    Ok(Yardstick {
        kind: "torch-bf16".into(),
        why,
        max_abs: t.max_abs,
        mean_abs: t.mean_abs,
        flips: t.flips,
    })
}

fn fmt(x: f64) -> String {
    if x == 0.0 {
        "0".into()
    } else if x < 1e-3 {
        format!("{x:.2e}")
    } else {
        format!("{x:.4}")
    }
}

/// Pass/fail of a distance against a yardstick, with the numbers.
pub fn bar_gate(id: &str, title: &str, d: &Distance, y: &Yardstick) -> Gate {
    let mut problems = Vec::new();
    if d.max_abs > y.max_abs {
        let w = d
            .worst
            .as_ref()
            .map(|w| {
                format!(
                    " at {} / {:?} option {}: {} vs {}",
                    w.request,
                    w.question,
                    w.option,
                    fmt(w.ours),
                    fmt(w.theirs)
                )
            })
            .unwrap_or_default();
        problems.push(format!(
            "max |Δp| {} > {}{w}",
            fmt(d.max_abs),
            fmt(y.max_abs)
        ));
    }
    if d.mean_abs > y.mean_abs {
        problems.push(format!(
            "mean |Δp| {} > {}",
            fmt(d.mean_abs),
            fmt(y.mean_abs)
        ));
    }
    if d.flips > y.flips {
        let ex: Vec<String> = d
            .flip_examples
            .iter()
            .map(|f| {
                format!(
                    "{} / {:?} ({} vs {}, margin {:.3})",
                    f.request, f.question, f.ours, f.theirs, f.margin
                )
            })
            .collect();
        problems.push(format!(
            "argmax differs on {} of {} questions with a reference margin > {MARGIN} (allowed {}): {}",
            d.flips,
            d.decisive,
            y.flips,
            ex.join("; ")
        ));
    }
    Gate::from_problems(
        id,
        title,
        format!(
            "max |Δp| {} ≤ {}, mean {} ≤ {}, flips {}/{} ≤ {} ({} yardstick)",
            fmt(d.max_abs),
            fmt(y.max_abs),
            fmt(d.mean_abs),
            fmt(y.mean_abs),
            d.flips,
            d.decisive,
            y.flips,
            y.kind
        ),
        problems,
    )
}

fn fp32_gate(id: &str, title: &str, d: &Distance) -> Gate {
    let y = Yardstick {
        kind: "fp32".into(),
        why: String::new(),
        max_abs: FP32_MAX_ABS,
        mean_abs: f64::INFINITY,
        flips: usize::MAX,
    };
    let mut g = bar_gate(id, title, d, &y);
    g.detail = if g.status == Status::Pass {
        format!("max |Δp| {} ≤ 1e-4", fmt(d.max_abs))
    } else {
        g.detail
    };
    g
}

/// Semantic JSON equality: numbers by value, objects by key set.
fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| json_eq(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| json_eq(v, w)))
        }
        _ => a == b,
    }
}

fn responses_equal(
    set: &RequestSet,
    bodies: &[Value],
    reference: &ReferenceOutput,
    merged: bool,
) -> Option<(usize, usize)> {
    let mut equal = 0;
    let mut n = 0;
    for (req, body) in set.requests.iter().zip(bodies) {
        let rec = reference.record(&req.name)?;
        let theirs = if merged {
            rec.response_merged_bf16.as_ref()
        } else {
            rec.response.as_ref()
        }?;
        n += 1;
        let same = ["answers", "usage"]
            .iter()
            .all(|k| match (body.get(k), theirs.get(k)) {
                (Some(a), Some(b)) => json_eq(a, b),
                _ => false,
            });
        equal += usize::from(same);
    }
    Some((equal, n))
}

/// The decision gates and per-arm figures.
#[derive(Debug, Clone)]
pub struct Evaluation {
    /// Per arm: bar, fp32, rerun, shared (or vs-anchor), in arm order.
    pub gates: Vec<Gate>,
    /// Per arm figures.
    pub arms: Vec<ArmReport>,
    /// Torch's own bf16 run against the reference, when the reference has it.
    pub torch_bf16: Option<TorchBf16>,
}

/// Evaluate every arm. `anchor` = the arm other arms are compared with when there is no reference.
pub fn evaluate(
    mode: GateMode,
    set: &RequestSet,
    rows: &[Rows],
    runs: &[(ArmId, Result<ArmRun, String>)],
    reference: Option<&ReferenceOutput>,
) -> Result<Evaluation, String> {
    let mut gates = Vec::new();
    let mut reports = Vec::new();
    let torch = reference.and_then(|r| {
        reference_arm_vs_reference(set, r, "torch_bf16").map(|t| TorchBf16 {
            vs_reference: t,
            merged_bf16_vs_reference: reference_arm_vs_reference(set, r, "merged_bf16"),
        })
    });
    let anchor: Option<(ArmId, Vec<Vec<Vec<f64>>>)> = runs.iter().find_map(|(id, r)| {
        r.as_ref()
            .ok()
            .filter(|_| id.arm == Arm::Fp32)
            .map(|r| (*id, widen(&r.probabilities)))
    });
    let judge = Judge {
        mode,
        set,
        rows,
        torch: torch.as_ref(),
        anchor: anchor.as_ref(),
    };
    for (id, run) in runs {
        let name = id.name();
        let run = match run {
            Ok(r) => r,
            Err(e) => {
                gates.push(Gate::new(
                    &format!("arm.{name}.run"),
                    &format!("the {name} arm loads and answers every request"),
                    Status::Fail,
                    e.clone(),
                ));
                continue;
            }
        };
        let arm = ArmUnderTest {
            id: *id,
            ours: widen(&run.probabilities),
            name,
            run,
        };
        let mut report = arm.report();
        match reference {
            Some(rf) => judge.against_reference(&arm, rf, &mut report, &mut gates)?,
            None => judge.against_anchor(&arm, &mut report, &mut gates)?,
        }
        gates.extend(arm.bit_equal_gates());
        reports.push(report);
    }
    Ok(Evaluation {
        gates,
        arms: reports,
        torch_bf16: torch,
    })
}

/// What every arm is judged with.
struct Judge<'a> {
    mode: GateMode,
    set: &'a RequestSet,
    rows: &'a [Rows],
    /// Torch's own bf16 run against the reference: the synthetic yardstick.
    torch: Option<&'a TorchBf16>,
    /// The exact- (or merged-) fp32 arm, widened: what arms are compared with when there is no reference.
    anchor: Option<&'a (ArmId, Vec<Vec<Vec<f64>>>)>,
}

/// One arm that ran, its probabilities widened to f64.
struct ArmUnderTest<'a> {
    id: ArmId,
    name: String,
    run: &'a ArmRun,
    ours: Vec<Vec<Vec<f64>>>,
}

impl ArmUnderTest<'_> {
    /// The arm's figures before it is judged.
    fn report(&self) -> ArmReport {
        let run = self.run;
        ArmReport {
            name: self.name.clone(),
            weights: self.id.form.name().into(),
            precision: self.id.arm.name().into(),
            source: run.source.clone(),
            backend: run.backend.clone(),
            yardstick: None,
            vs_reference: None,
            vs_merged_bf16: None,
            vs_anchor: None,
            responses_equal: None,
            rerun_bit_equal: Some(run.rerun_difference.is_none()),
            shared_bit_equal: Some(run.shared_difference.is_none()),
            seconds: run.seconds.clone(),
        }
    }

    /// The rerun and shared-state gates: both bit-equal, or the first difference.
    fn bit_equal_gates(&self) -> [Gate; 2] {
        let (name, run) = (&self.name, self.run);
        [
            match &run.rerun_difference {
                None => Gate::new(
                    &format!("arm.{name}.rerun"),
                    "a second run (warm prepared-state cache, requests batched) is bit-equal to the first",
                    Status::Pass,
                    format!("{} requests bit-equal", run.probabilities.len()),
                ),
                Some(d) => Gate::new(
                    &format!("arm.{name}.rerun"),
                    "a second run (warm prepared-state cache, requests batched) is bit-equal to the first",
                    Status::Fail,
                    format!("differs: {d}"),
                ),
            },
            match &run.shared_difference {
                None => Gate::new(
                    &format!("arm.{name}.shared"),
                    "the shared state (the default service) is bit-equal to every question's row run from zero",
                    Status::Pass,
                    format!("{} requests bit-equal", run.probabilities.len()),
                ),
                Some(d) => Gate::new(
                    &format!("arm.{name}.shared"),
                    "the shared state (the default service) is bit-equal to every question's row run from zero",
                    Status::Fail,
                    format!("differs: {d}"),
                ),
            },
        ]
    }
}

impl Judge<'_> {
    /// The arm against the author's fp32 reference: the bar (or, for int8 on synthetic weights, figures
    /// only), and the fp32 arms within 1e-4.
    fn against_reference(
        &self,
        arm: &ArmUnderTest,
        rf: &ReferenceOutput,
        report: &mut ArmReport,
        gates: &mut Vec<Gate>,
    ) -> Result<(), String> {
        let (set, id, name, ours) = (self.set, &arm.id, &arm.name, &arm.ours);
        let d = vs_reference_arm(set, ours, rf, "reference")
            .ok_or("the reference has no `reference` arm")?;
        if self.mode == GateMode::Synthetic && id.arm == Arm::Int8 {
            // No yardstick judges int8 on random weights: torch's bf16 run measures bf16
            // rounding, and this model amplifies any rounding chaotically (engine README).
            gates.push(Gate::new(
                &format!("arm.{name}.bar"),
                &format!("{name} vs the author's fp32 reference"),
                Status::Info,
                format!(
                    "max |Δp| {}, mean {}, flips {}/{}; not gated: on synthetic random weights no yardstick \
                     applies to int8 (real weights: the fixed bar, max 0.02, mean 0.002, no flips)",
                    fmt(d.max_abs),
                    fmt(d.mean_abs),
                    d.flips,
                    d.decisive
                ),
            ));
            report.vs_merged_bf16 = vs_reference_arm(set, ours, rf, "merged_bf16");
            report.vs_reference = Some(d);
            return Ok(());
        }
        let y = yardstick(self.mode, *id, self.torch.map(|t| &t.vs_reference))?;
        gates.push(bar_gate(
            &format!("arm.{name}.bar"),
            &format!(
                "{name} vs the author's fp32 reference: argmax where margin > 0.02, max |Δp|, mean |Δp|"
            ),
            &d,
            &y,
        ));
        if *id == ArmId::ALL[0] {
            gates.push(fp32_gate(
                &format!("arm.{name}.fp32"),
                "exact-fp32 within 1e-4 of the author's fp32 reference",
                &d,
            ));
            report.responses_equal = responses_equal(set, &arm.run.bodies, rf, false);
        }
        if id.form == WeightForm::Merged {
            report.vs_merged_bf16 = vs_reference_arm(set, ours, rf, "merged_bf16");
        }
        if id.form == WeightForm::Merged && id.arm == Arm::Fp32 {
            match &report.vs_merged_bf16 {
                Some(m) => {
                    gates.push(fp32_gate(
                        &format!("arm.{name}.fp32"),
                        "merged-fp32 within 1e-4 of the reference's merged-bf16 arm (the same weights in fp32)",
                        m,
                    ));
                    report.responses_equal = responses_equal(set, &arm.run.bodies, rf, true);
                }
                None => gates.push(Gate::new(
                    &format!("arm.{name}.fp32"),
                    "merged-fp32 within 1e-4 of the reference's merged-bf16 arm",
                    Status::NotRun,
                    "the reference has no merged_bf16 arm",
                )),
            }
        }
        report.vs_reference = Some(d);
        report.yardstick = Some(y);
        Ok(())
    }

    /// With no reference, every arm but the anchor against the anchor: the real bar, or figures only on
    /// synthetic weights (their yardstick needs torch's bf16 run).
    fn against_anchor(
        &self,
        arm: &ArmUnderTest,
        report: &mut ArmReport,
        gates: &mut Vec<Gate>,
    ) -> Result<(), String> {
        let Some((aid, a)) = self.anchor else {
            return Ok(());
        };
        if *aid == arm.id {
            return Ok(());
        }
        let name = &arm.name;
        let d = vs_anchor(self.set, self.rows, &arm.ours, a);
        let title = format!("{name} vs the {} arm (no reference given)", aid.name());
        let gate_id = format!("arm.{name}.vs-anchor");
        if self.mode == GateMode::Real {
            let y = yardstick(GateMode::Real, arm.id, None)?;
            let mut g = bar_gate(&gate_id, &title, &d, &y);
            g.detail.push_str(&format!(
                " — against {}, not the author's reference",
                aid.name()
            ));
            gates.push(g);
        } else {
            gates.push(Gate::new(
                &gate_id,
                &title,
                Status::Info,
                format!(
                    "max |Δp| {}, mean {}, flips {}/{}; not gated: the synthetic yardstick needs torch's bf16 run (--reference)",
                    fmt(d.max_abs),
                    fmt(d.mean_abs),
                    d.flips,
                    d.decisive
                ),
            ));
        }
        report.vs_anchor = Some(d);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Distance;

    fn dist(max: f64, mean: f64, flips: usize) -> Distance {
        Distance {
            questions: 10,
            probabilities: 20,
            max_abs: max,
            mean_abs: mean,
            decisive: 8,
            flips,
            ..Default::default()
        }
    }

    #[test]
    fn exact_fp32_never_gets_the_synthetic_yardstick() {
        let torch = dist(0.9, 0.05, 6);
        let y = yardstick(GateMode::Synthetic, ArmId::ALL[0], Some(&torch)).unwrap();
        assert_eq!(
            (y.kind.as_str(), y.max_abs, y.mean_abs, y.flips),
            ("fixed", 0.02, 0.002, 0)
        );
        let b = yardstick(GateMode::Synthetic, ArmId::ALL[3], Some(&torch)).unwrap();
        assert_eq!(
            (b.kind.as_str(), b.max_abs, b.flips),
            ("torch-bf16", 0.9, 6)
        );
        // real weights: the fixed bar for every arm, torch or not
        let r = yardstick(GateMode::Real, ArmId::ALL[3], Some(&torch)).unwrap();
        assert_eq!(r.kind, "fixed");
        // synthetic without torch's run cannot judge
        assert!(yardstick(GateMode::Synthetic, ArmId::ALL[1], None).is_err());
    }

    #[test]
    fn bar_gate_checks_each_limit() {
        let y = yardstick(GateMode::Real, ArmId::ALL[1], None).unwrap();
        assert_eq!(
            bar_gate("g", "t", &dist(0.01, 0.001, 0), &y).status,
            Status::Pass
        );
        assert_eq!(
            bar_gate("g", "t", &dist(0.03, 0.001, 0), &y).status,
            Status::Fail
        );
        assert_eq!(
            bar_gate("g", "t", &dist(0.01, 0.003, 0), &y).status,
            Status::Fail
        );
        let g = bar_gate("g", "t", &dist(0.01, 0.001, 1), &y);
        assert_eq!(g.status, Status::Fail);
        assert!(
            g.detail.contains("argmax differs on 1 of 8"),
            "{}",
            g.detail
        );
        // exactly at the bar passes (≤)
        assert_eq!(
            bar_gate("g", "t", &dist(0.02, 0.002, 0), &y).status,
            Status::Pass
        );
    }

    #[test]
    fn fp32_gate_is_1e4() {
        assert_eq!(
            fp32_gate("g", "t", &dist(9e-5, 1.0, 5)).status,
            Status::Pass
        );
        assert_eq!(
            fp32_gate("g", "t", &dist(1.1e-4, 0.0, 0)).status,
            Status::Fail
        );
    }

    #[test]
    fn the_torch_yardstick_is_measured_on_the_set_only() {
        use crate::reference::{RefEntry, RefQuestion, RefRecord};
        use crate::requests::Request;
        let record = |torch: f64| {
            RefEntry::Answered(RefRecord {
                state_ids: vec![1],
                input_tokens: 3,
                questions: vec![RefQuestion {
                    id: "q".into(),
                    row_ids: vec![1, 2, 3],
                    option_ends: vec![1],
                    decide: 2,
                    reference: Some(vec![0.5, 0.5]),
                    merged_bf16: None,
                    torch_bf16: Some(vec![torch, 1.0 - torch]),
                }],
                response: None,
                response_merged_bf16: None,
            })
        };
        let reference = ReferenceOutput {
            source: "t".into(),
            requests: [
                ("in".to_string(), record(0.6)),
                ("other".to_string(), record(0.9)),
            ]
            .into_iter()
            .collect(),
        };
        let set = RequestSet {
            source: "t".into(),
            requests: vec![Request {
                name: "in".into(),
                body: vec![],
            }],
        };
        let d = reference_arm_vs_reference(&set, &reference, "torch_bf16").unwrap();
        assert_eq!(d.questions, 1);
        assert!((d.max_abs - 0.1).abs() < 1e-12, "{}", d.max_abs);
        assert!(reference_arm_vs_reference(&set, &reference, "merged_bf16").is_none());
    }

    #[test]
    fn json_equality_is_by_value() {
        let a: Value = serde_json::from_str(r#"{"a": 1.0, "b": [0.5, "x"]}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"b": [0.50, "x"], "a": 1}"#).unwrap();
        assert!(json_eq(&a, &b));
        let c: Value = serde_json::from_str(r#"{"a": 1.0, "b": [0.5001, "x"]}"#).unwrap();
        assert!(!json_eq(&a, &c));
    }
}
