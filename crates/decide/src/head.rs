//! The pointer head (kev-contract §6): `q = W_q·h[decide] + b_q`, `k_j = W_k·h[opt_j] + b_k`,
//! `z_j = (k_j·q)·scale / T`, `p = softmax(z)` within one question.
//!
//! The author computes it in fp32; we accumulate in f64 (as the Core AI port does) and round each
//! probability to f32 once, so the head adds no error of its own next to the backbone's.

use std::sync::Arc;

use kev_contract::QuestionKind;
use kev_release::head::KevHead;

use crate::calibrate::Calibration;

/// The q/k projections, scale and temperature of a Kev head.
#[derive(Debug, Clone)]
pub struct PointerHead {
    hidden: usize,
    dim: usize,
    q_w: Vec<f32>,
    q_b: Vec<f32>,
    k_w: Vec<f32>,
    k_b: Vec<f32>,
    scale: f64,
    temperature: f64,
    calibration: Option<Arc<Calibration>>,
}

/// A head whose shapes do not fit the backbone or each other.
#[derive(Debug, thiserror::Error)]
#[error("pointer head: {0}")]
pub struct HeadShapeError(String);

impl PointerHead {
    /// From a head read out of `head.pt` or a prepared directory, for a backbone of width `hidden`.
    pub fn new(head: &KevHead, hidden: usize) -> Result<Self, HeadShapeError> {
        let dim = head.meta.head_dim;
        for (name, l) in [("q", &head.q), ("k", &head.k)] {
            if l.in_features != hidden || l.out_features != dim {
                return Err(HeadShapeError(format!(
                    "{name} is [{}, {}], expected [{dim}, {hidden}] (head_dim × the backbone's hidden size)",
                    l.out_features, l.in_features
                )));
            }
            if l.weight.len() != dim * hidden || l.bias.len() != dim {
                return Err(HeadShapeError(format!(
                    "{name}: weight/bias sizes do not match its shape"
                )));
            }
        }
        let t = head.meta.temperature;
        if !(t.is_finite() && t > 0.0) {
            return Err(HeadShapeError(format!(
                "temperature {t} is not a positive number"
            )));
        }
        Ok(PointerHead {
            hidden,
            dim,
            q_w: head.q.weight.clone(),
            q_b: head.q.bias.clone(),
            k_w: head.k.weight.clone(),
            k_b: head.k.bias.clone(),
            scale: head.scale(),
            temperature: t,
            calibration: None,
        })
    }

    /// The softmax temperature, as stored.
    pub fn temperature(&self) -> f64 {
        self.temperature
    }

    /// Serve fitted temperatures (`kev calibrate`) instead of the stored one; `None` puts the stored one back.
    pub fn set_calibration(&mut self, calibration: Option<Arc<Calibration>>) {
        self.calibration = calibration;
    }

    /// The calibration in force, if any.
    pub fn calibration(&self) -> Option<&Calibration> {
        self.calibration.as_deref()
    }

    /// Head width.
    pub fn dim(&self) -> usize {
        self.dim
    }

    fn project(&self, w: &[f32], b: &[f32], h: &[f32]) -> Vec<f64> {
        w.chunks_exact(self.hidden)
            .zip(b)
            .map(|(row, &bias)| dot_f64(row, h) + bias as f64)
            .collect()
    }

    /// Probabilities of one question's options from the hidden rows: `rows` holds the options'
    /// `<|box_end|>` states in option order, then the `<|fim_suffix|>` state (`[n + 1, hidden]`). At the
    /// stored temperature, whatever the calibration.
    pub fn probabilities(&self, rows: &[f32]) -> Vec<f32> {
        self.probabilities_at(rows, self.temperature)
    }

    /// [`PointerHead::probabilities`] for a question of type `kind`: at the calibration's temperature for its
    /// group when one is set, else at the stored one (then bit-equal to `probabilities`).
    pub fn probabilities_for(&self, rows: &[f32], kind: QuestionKind) -> Vec<f32> {
        self.readout(rows, kind).probabilities
    }

    /// The whole readout of one question of type `kind`: its options' pointer logits before any temperature,
    /// and the probabilities [`PointerHead::probabilities_for`] answers.
    pub fn readout(&self, rows: &[f32], kind: QuestionKind) -> Readout {
        let t = match &self.calibration {
            None => self.temperature,
            Some(c) => c.temperature(kind, rows.len() / self.hidden - 1),
        };
        self.readout_at(rows, t)
    }

    fn probabilities_at(&self, rows: &[f32], temperature: f64) -> Vec<f32> {
        self.readout_at(rows, temperature).probabilities
    }

    fn readout_at(&self, rows: &[f32], temperature: f64) -> Readout {
        let n = rows.len() / self.hidden - 1;
        let decide = &rows[n * self.hidden..(n + 1) * self.hidden];
        let q = self.project(&self.q_w, &self.q_b, decide);
        let logits: Vec<f64> = rows[..n * self.hidden]
            .chunks_exact(self.hidden)
            .map(|h| {
                let k = self.project(&self.k_w, &self.k_b, h);
                let s: f64 = k.iter().zip(&q).map(|(a, b)| a * b).sum();
                s * self.scale
            })
            .collect();
        // `(s · scale) / T`, the order the probabilities were always computed in: bit-equal to before.
        let z: Vec<f64> = logits.iter().map(|z| z / temperature).collect();
        Readout {
            probabilities: softmax(&z),
            logits,
        }
    }
}

/// One question's readout.
#[derive(Debug, Clone, PartialEq)]
pub struct Readout {
    /// Per option (request order), the probability the answer reports (fp32, rounded once from f64).
    pub probabilities: Vec<f32>,
    /// Per option, the pointer logit `z = (k · q) / sqrt(head_dim)` in f64, before the temperature
    /// (stored or calibrated) divides it: what a client fitting its own calibration needs.
    pub logits: Vec<f64>,
}

/// Σ a·b in f64 with eight independent partial sums (a fixed order, so results are reproducible).
fn dot_f64(a: &[f32], b: &[f32]) -> f64 {
    let mut acc = [0f64; 8];
    let (a8, a_tail) = a.split_at(a.len() / 8 * 8);
    let (b8, b_tail) = b.split_at(a8.len());
    for (ca, cb) in a8.chunks_exact(8).zip(b8.chunks_exact(8)) {
        for ((s, x), y) in acc.iter_mut().zip(ca).zip(cb) {
            *s += *x as f64 * *y as f64;
        }
    }
    let tail: f64 = a_tail
        .iter()
        .zip(b_tail)
        .map(|(x, y)| *x as f64 * *y as f64)
        .sum();
    ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + tail
}

fn softmax(z: &[f64]) -> Vec<f32> {
    let max = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = z.iter().map(|v| (v - max).exp()).collect();
    let sum: f64 = e.iter().sum();
    e.iter().map(|v| (v / sum) as f32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kev_release::head::{HeadMeta, Linear};

    fn head(hidden: usize, dim: usize, t: f64) -> KevHead {
        let lin = |seed: f32| Linear {
            out_features: dim,
            in_features: hidden,
            weight: (0..dim * hidden)
                .map(|i| ((i as f32 * 0.37 + seed).sin()) * 0.5)
                .collect(),
            bias: (0..dim).map(|i| (i as f32 + seed).cos() * 0.1).collect(),
        };
        KevHead {
            meta: HeadMeta {
                base: "b".into(),
                base_revision: "r".into(),
                lora: serde_json::json!(16),
                head_dim: dim,
                option_isolation: serde_json::json!(false),
                special_embeddings: serde_json::json!(false),
                weights_dtype: serde_json::json!("bfloat16"),
                temperature: t,
                lora_placement: serde_json::json!("all"),
            },
            q: lin(1.0),
            k: lin(2.0),
        }
    }

    /// The head written out naively in f64, straight from the formula.
    fn naive(h: &KevHead, rows: &[Vec<f32>]) -> Vec<f64> {
        let proj = |l: &Linear, x: &[f32]| -> Vec<f64> {
            (0..l.out_features)
                .map(|o| {
                    (0..l.in_features)
                        .map(|i| l.weight[o * l.in_features + i] as f64 * x[i] as f64)
                        .sum::<f64>()
                        + l.bias[o] as f64
                })
                .collect()
        };
        let q = proj(&h.q, rows.last().unwrap());
        let z: Vec<f64> = rows[..rows.len() - 1]
            .iter()
            .map(|r| {
                let k = proj(&h.k, r);
                k.iter().zip(&q).map(|(a, b)| a * b).sum::<f64>()
                    / (h.meta.head_dim as f64).sqrt()
                    / h.meta.temperature
            })
            .collect();
        let m = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let s: f64 = z.iter().map(|v| (v - m).exp()).sum();
        z.iter().map(|v| (v - m).exp() / s).collect()
    }

    #[test]
    fn matches_the_formula_and_sums_to_one() {
        let h = head(19, 6, 2.406050072164233);
        let ph = PointerHead::new(&h, 19).unwrap();
        let rows: Vec<Vec<f32>> = (0..5)
            .map(|r| {
                (0..19)
                    .map(|i| ((r * 19 + i) as f32 * 0.11).cos())
                    .collect()
            })
            .collect();
        let flat: Vec<f32> = rows.concat();
        let p = ph.probabilities(&flat);
        let want = naive(&h, &rows);
        assert_eq!(p.len(), 4);
        for (a, b) in p.iter().zip(&want) {
            assert!((*a as f64 - b).abs() < 1e-7, "{a} vs {b}");
        }
        assert!((p.iter().map(|v| *v as f64).sum::<f64>() - 1.0).abs() < 1e-6);
    }

    #[test]
    fn temperature_flattens() {
        let rows: Vec<f32> = (0..4 * 8).map(|i| (i as f32 * 0.7).sin()).collect();
        let sharp = PointerHead::new(&head(8, 4, 0.5), 8)
            .unwrap()
            .probabilities(&rows);
        let flat = PointerHead::new(&head(8, 4, 50.0), 8)
            .unwrap()
            .probabilities(&rows);
        let spread = |p: &[f32]| {
            p.iter().cloned().fold(0f32, f32::max) - p.iter().cloned().fold(1f32, f32::min)
        };
        assert!(spread(&flat) < spread(&sharp));
    }

    #[test]
    fn calibration_divides_the_logits_per_group() {
        use crate::calibrate::{Calibration, Grouping};
        use std::collections::BTreeMap;
        let rows: Vec<f32> = (0..4 * 8).map(|i| (i as f32 * 0.37).cos()).collect();
        let mut ph = PointerHead::new(&head(8, 4, 2.4), 8).unwrap();
        let stored = ph.probabilities(&rows);
        // No calibration: bit-equal to the stored temperature, whatever the type.
        for kind in [
            QuestionKind::Noul,
            QuestionKind::Choice,
            QuestionKind::Score,
        ] {
            assert_eq!(ph.probabilities_for(&rows, kind), stored);
        }
        let mut temperatures = BTreeMap::new();
        temperatures.insert("choice".to_string(), 0.7);
        ph.set_calibration(Some(Arc::new(Calibration {
            by: Grouping::Type,
            global: 5.0,
            temperatures,
            source_sha256: None,
        })));
        let at = |t: f64| {
            PointerHead::new(&head(8, 4, t), 8)
                .unwrap()
                .probabilities(&rows)
        };
        assert_eq!(ph.probabilities_for(&rows, QuestionKind::Choice), at(0.7));
        assert_eq!(ph.probabilities_for(&rows, QuestionKind::Score), at(5.0));
        assert_eq!(ph.probabilities(&rows), stored);
        ph.set_calibration(None);
        assert_eq!(ph.probabilities_for(&rows, QuestionKind::Choice), stored);
    }

    #[test]
    fn rejects_mismatched_shapes() {
        assert!(PointerHead::new(&head(8, 4, 1.0), 9).is_err());
        assert!(PointerHead::new(&head(8, 4, 0.0), 8).is_err());
    }
}
