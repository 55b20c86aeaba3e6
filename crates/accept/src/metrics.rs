//! How far one set of probabilities is from another: the figures every decision gate is made of.
//!
//! Definitions (kev-contract §6, issue 6), fixed here so every report means the same thing:
//! - **max |Δp|**: the largest absolute difference over every option of every question;
//! - **mean |Δp|**: the mean over questions of each question's mean absolute difference over its options
//!   (a 255-option question counts once, like a 2-option one);
//! - **flips**: questions whose argmax (first index of the maximum, as Python's `max(range(n), key=…)`)
//!   differs, counted only where the *reference's* top-2 margin is above [`MARGIN`] (a near-tie may flip).

use serde::Serialize;

/// Top-2 margin of the reference above which the argmax must agree.
pub const MARGIN: f64 = 0.02;

/// One question's probabilities from two sources, plus the reference that decides which argmax counts.
#[derive(Debug, Clone, Copy)]
pub struct Pair<'a> {
    /// Request name (file stem).
    pub request: &'a str,
    /// Question id.
    pub question: &'a str,
    /// The side being judged.
    pub ours: &'a [f64],
    /// The side it is compared with.
    pub theirs: &'a [f64],
    /// The author's fp32 reference (for the margin rule); often the same slice as `theirs`.
    pub reference: &'a [f64],
}

/// Where the largest difference was.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Worst {
    /// Request name.
    pub request: String,
    /// Question id.
    pub question: String,
    /// Option index.
    pub option: usize,
    /// Value judged.
    pub ours: f64,
    /// Value compared with.
    pub theirs: f64,
}

/// A flip of the argmax on a decisive question.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Flip {
    /// Request name.
    pub request: String,
    /// Question id.
    pub question: String,
    /// Argmax of the side judged.
    pub ours: usize,
    /// Argmax of the side compared with.
    pub theirs: usize,
    /// The reference's top-2 margin there.
    pub margin: f64,
}

/// The distance between two sets of probabilities.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Distance {
    /// Questions compared.
    pub questions: usize,
    /// Probabilities compared.
    pub probabilities: usize,
    /// Largest |Δp|.
    pub max_abs: f64,
    /// Mean over questions of the per-question mean |Δp|.
    pub mean_abs: f64,
    /// Questions where the reference's top-2 margin is above [`MARGIN`].
    pub decisive: usize,
    /// Argmax disagreements among the decisive questions.
    pub flips: usize,
    /// Where `max_abs` was reached.
    pub worst: Option<Worst>,
    /// The first few flips, for the report.
    pub flip_examples: Vec<Flip>,
}

/// First index of the maximum (ties → the earliest option), as Kev's answer shaping does.
pub fn argmax(p: &[f64]) -> Option<usize> {
    let mut best: Option<(usize, f64)> = None;
    for (i, &v) in p.iter().enumerate() {
        match best {
            Some((_, b)) if v <= b => {}
            _ => best = Some((i, v)),
        }
    }
    best.map(|(i, _)| i)
}

/// The gap between the largest and second-largest value (`None` with fewer than two).
pub fn top2_margin(p: &[f64]) -> Option<f64> {
    if p.len() < 2 {
        return None;
    }
    let (mut a, mut b) = (f64::NEG_INFINITY, f64::NEG_INFINITY);
    for &v in p {
        if v > a {
            b = a;
            a = v;
        } else if v > b {
            b = v;
        }
    }
    Some(a - b)
}

/// Compare question by question. A length mismatch counts as an infinite difference (it cannot pass).
pub fn distance<'a>(pairs: impl IntoIterator<Item = Pair<'a>>) -> Distance {
    let mut d = Distance::default();
    let mut sum_means = 0.0f64;
    for p in pairs {
        d.questions += 1;
        if p.ours.len() != p.theirs.len() || p.ours.is_empty() {
            d.max_abs = f64::INFINITY;
            sum_means = f64::INFINITY;
            d.worst = Some(Worst {
                request: p.request.to_string(),
                question: p.question.to_string(),
                option: 0,
                ours: p.ours.len() as f64,
                theirs: p.theirs.len() as f64,
            });
            continue;
        }
        let mut q_sum = 0.0f64;
        for (i, (&a, &b)) in p.ours.iter().zip(p.theirs).enumerate() {
            // NaN never compares greater, so an explicit check keeps a NaN from passing silently.
            let diff = if a.is_nan() || b.is_nan() {
                f64::INFINITY
            } else {
                (a - b).abs()
            };
            d.probabilities += 1;
            q_sum += diff;
            if diff > d.max_abs || d.worst.is_none() {
                d.max_abs = d.max_abs.max(diff);
                d.worst = Some(Worst {
                    request: p.request.to_string(),
                    question: p.question.to_string(),
                    option: i,
                    ours: a,
                    theirs: b,
                });
            }
        }
        sum_means += q_sum / p.ours.len() as f64;
        if let Some(m) = top2_margin(p.reference)
            && m > MARGIN
        {
            d.decisive += 1;
            let (a, b) = (argmax(p.ours), argmax(p.theirs));
            if a != b {
                d.flips += 1;
                if d.flip_examples.len() < 5 {
                    d.flip_examples.push(Flip {
                        request: p.request.to_string(),
                        question: p.question.to_string(),
                        ours: a.unwrap_or(0),
                        theirs: b.unwrap_or(0),
                        margin: m,
                    });
                }
            }
        }
    }
    if d.questions > 0 {
        d.mean_abs = sum_means / d.questions as f64;
    }
    d
}

/// Whether two sets of fp32 probabilities are equal bit for bit; the first difference if not.
pub fn first_bit_difference(a: &[Vec<Vec<f32>>], b: &[Vec<Vec<f32>>]) -> Option<String> {
    if a.len() != b.len() {
        return Some(format!("{} requests vs {}", a.len(), b.len()));
    }
    for (r, (qa, qb)) in a.iter().zip(b).enumerate() {
        if qa.len() != qb.len() {
            return Some(format!(
                "request {r}: {} questions vs {}",
                qa.len(),
                qb.len()
            ));
        }
        for (q, (pa, pb)) in qa.iter().zip(qb).enumerate() {
            if pa.len() != pb.len() {
                return Some(format!(
                    "request {r} question {q}: {} options vs {}",
                    pa.len(),
                    pb.len()
                ));
            }
            for (o, (x, y)) in pa.iter().zip(pb).enumerate() {
                if x.to_bits() != y.to_bits() {
                    return Some(format!(
                        "request {r} question {q} option {o}: {x:e} vs {y:e} (Δ {:e})",
                        (x - y).abs()
                    ));
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair<'a>(ours: &'a [f64], theirs: &'a [f64]) -> Pair<'a> {
        Pair {
            request: "r",
            question: "q",
            ours,
            theirs,
            reference: theirs,
        }
    }

    #[test]
    fn argmax_takes_the_first_maximum() {
        assert_eq!(argmax(&[0.2, 0.4, 0.4]), Some(1));
        assert_eq!(argmax(&[1.0]), Some(0));
        assert_eq!(argmax(&[]), None);
        assert_eq!(
            top2_margin(&[0.1, 0.7, 0.2]).map(|m| (m * 10.0).round()),
            Some(5.0)
        );
        assert_eq!(top2_margin(&[1.0]), None);
    }

    #[test]
    fn mean_is_per_question_then_over_questions() {
        // question 1: |Δ| 0.1, 0.1 → mean 0.1; question 2: |Δ| 0.4, 0, 0, 0.4 → mean 0.2; over questions
        // 0.15 (a mean over all six probabilities would be 1/6)
        let d = distance([
            pair(&[0.6, 0.4], &[0.5, 0.5]),
            pair(&[0.4, 0.2, 0.2, 0.2], &[0.0, 0.2, 0.2, 0.6]),
        ]);
        assert_eq!(d.questions, 2);
        assert_eq!(d.probabilities, 6);
        assert!((d.mean_abs - 0.15).abs() < 1e-12, "{}", d.mean_abs);
        assert!((d.max_abs - 0.4).abs() < 1e-12);
        let w = d.worst.unwrap();
        assert_eq!((w.option, w.ours), (0, 0.4));
    }

    #[test]
    fn flips_count_only_where_the_reference_is_decisive() {
        // near-tie in the reference (margin 0.01): a flip there does not count
        let near = distance([pair(&[0.6, 0.4], &[0.495, 0.505])]);
        assert_eq!((near.decisive, near.flips), (0, 0));
        let clear = distance([pair(&[0.6, 0.4], &[0.3, 0.7])]);
        assert_eq!((clear.decisive, clear.flips), (1, 1));
        assert_eq!(clear.flip_examples[0].ours, 0);
        assert_eq!(clear.flip_examples[0].theirs, 1);
        // one-option questions are never decisive
        assert_eq!(distance([pair(&[1.0], &[1.0])]).decisive, 0);
    }

    #[test]
    fn nan_and_shape_mismatch_cannot_pass() {
        assert!(
            distance([pair(&[f64::NAN, 0.5], &[0.5, 0.5])])
                .max_abs
                .is_infinite()
        );
        assert!(distance([pair(&[1.0], &[0.5, 0.5])]).max_abs.is_infinite());
    }

    #[test]
    fn bit_equality_reports_the_first_difference() {
        let a = vec![vec![vec![0.25f32, 0.75]]];
        let mut b = a.clone();
        assert_eq!(first_bit_difference(&a, &b), None);
        b[0][0][1] = f32::from_bits(0.75f32.to_bits() + 1);
        let msg = first_bit_difference(&a, &b).unwrap();
        assert!(msg.contains("option 1"), "{msg}");
        // -0.0 and 0.0 differ in bits
        assert!(first_bit_difference(&[vec![vec![0.0]]], &[vec![vec![-0.0]]]).is_some());
    }
}
