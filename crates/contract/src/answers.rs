//! Answers from probabilities (kev-contract §7): Kev 1.0's `to_answers`, with Python's float semantics.
//!
//! Every derived value is computed from the unrounded fp32 probabilities (widened to f64, as `tolist()` does) and
//! rounded once with [`round4`]. Sums follow CPython 3.12's `sum()` (Neumaier-compensated), divisions and
//! comparisons are plain IEEE f64 as in Python.

use serde_json::{Map, Value};

use crate::pyfmt::{py_float_number, round4};
use crate::request::{QuestionKind, ValidRequest};

/// Why probabilities could not be shaped into answers (an engine fault, never the client's).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AnswerError {
    /// One probability list per question is needed.
    #[error("{got} probability lists for {want} questions")]
    QuestionCount {
        /// Questions in the request.
        want: usize,
        /// Lists given.
        got: usize,
    },
    /// A question's list must have one probability per option.
    #[error("question {id:?}: {got} probabilities for {want} options")]
    OptionCount {
        /// The question id.
        id: String,
        /// Options of the question.
        want: usize,
        /// Probabilities given.
        got: usize,
    },
    /// NaN or infinite values cannot be written as JSON.
    #[error("question {id:?}: a derived value is not finite")]
    NotFinite {
        /// The question id.
        id: String,
    },
}

/// CPython 3.12 `sum()` over floats (Neumaier compensation, the compensation added only when finite).
pub fn py_sum(xs: impl IntoIterator<Item = f64>) -> f64 {
    let mut f = 0.0f64;
    let mut c = 0.0f64;
    for x in xs {
        let t = f + x;
        if f.abs() >= x.abs() {
            c += (f - t) + x;
        } else {
            c += (x - t) + f;
        }
        f = t;
    }
    if c != 0.0 && c.is_finite() { f + c } else { f }
}

/// First index of the maximum (Python `max(range(n), key=p.__getitem__)`); 0 for an empty slice.
pub fn first_argmax(p: &[f64]) -> usize {
    let mut best = 0;
    for (i, &x) in p.iter().enumerate().skip(1) {
        if x > p[best] {
            best = i;
        }
    }
    best
}

/// Kev's `_normalize`: `p / sum(p)`, uniform when the sum is 0.
fn normalize(p: &[f64]) -> Vec<f64> {
    let t = py_sum(p.iter().copied());
    if t == 0.0 {
        vec![1.0 / p.len() as f64; p.len()]
    } else {
        p.iter().map(|x| x / t).collect()
    }
}

/// Python `max(a, b)` for floats: `b` only when `b > a` (so NaN and `-0.0` lose to `a`).
fn py_max(a: f64, b: f64) -> f64 {
    if b > a { b } else { a }
}

/// Choice confidence `(max(n) − 1/K) / (1 − 1/K)` on the normalised distribution; 1.0 for one option.
pub fn choice_confidence(p: &[f64]) -> f64 {
    let k = p.len();
    if k == 1 {
        return 1.0;
    }
    let n = normalize(p);
    let max = n.iter().copied().fold(f64::NEG_INFINITY, py_max);
    let inv = 1.0 / k as f64;
    (max - inv) / (1.0 - inv)
}

/// Score confidence `max(0, 1 − Σ n_i·|i − mode| / D)`, `D` the mean absolute deviation of the uniform
/// distribution over the `L` levels, `mode` the first argmax of the normalised `n`; 1.0 for one level.
pub fn score_confidence(p: &[f64]) -> f64 {
    let l = p.len();
    if l == 1 {
        return 1.0;
    }
    let n = normalize(p);
    let mode = first_argmax(&n);
    let mid = (l as f64 - 1.0) / 2.0;
    let d = py_sum((0..l).map(|i| (i as f64 - mid).abs())) / l as f64;
    let spread = py_sum(
        n.iter()
            .enumerate()
            .map(|(i, x)| x * i.abs_diff(mode) as f64),
    );
    py_max(0.0, 1.0 - spread / d)
}

/// Expected level `Σ i·p_i` on the raw probabilities.
pub fn expected_level(p: &[f64]) -> f64 {
    py_sum(p.iter().enumerate().map(|(i, x)| i as f64 * x))
}

fn number(x: f64, id: &str) -> Result<Value, AnswerError> {
    py_float_number(round4(x))
        .map(Value::Number)
        .ok_or_else(|| AnswerError::NotFinite { id: id.to_owned() })
}

/// The `answers` object (request order) for a request and its per-question fp32 probabilities (option order).
///
/// Numbers are JSON numbers whose text is Python's `repr` of the rounded value (`0.9523`, `1.0`, `0.0`), so
/// serializing the value writes what Kev's server writes. Errors only on inconsistent input from the engine
/// (wrong counts, non-finite values).
pub fn shape_answers(req: &ValidRequest, probabilities: &[Vec<f32>]) -> Result<Value, AnswerError> {
    let questions = req.questions();
    if questions.len() != probabilities.len() {
        return Err(AnswerError::QuestionCount {
            want: questions.len(),
            got: probabilities.len(),
        });
    }
    let mut answers = Map::new();
    for (q, p32) in questions.iter().zip(probabilities) {
        let id = q.id();
        if p32.len() != q.options().len() {
            return Err(AnswerError::OptionCount {
                id: id.to_owned(),
                want: q.options().len(),
                got: p32.len(),
            });
        }
        let p: Vec<f64> = p32.iter().map(|&x| f64::from(x)).collect();
        let mut a = Map::new();
        a.insert("type".into(), Value::String(q.kind().as_str().into()));
        match q.kind() {
            QuestionKind::Noul => {
                a.insert("noul".into(), number(p[1], id)?);
            }
            QuestionKind::Choice => {
                let keys = q.keys();
                a.insert(
                    "choice".into(),
                    Value::String(keys[first_argmax(&p)].clone()),
                );
                a.insert("confidence".into(), number(choice_confidence(&p), id)?);
                a.insert("probabilities".into(), distribution(keys, &p, id)?);
            }
            QuestionKind::Score => {
                a.insert("score".into(), number(expected_level(&p), id)?);
                let legend = q
                    .legend()
                    .map(|l| {
                        l.map(|(k, t)| (k.to_owned(), Value::String(t.to_owned())))
                            .collect()
                    })
                    .unwrap_or_default();
                a.insert("legend".into(), Value::Object(legend));
                a.insert("probabilities".into(), distribution(q.keys(), &p, id)?);
                a.insert("confidence".into(), number(score_confidence(&p), id)?);
            }
        }
        // A repeated id cannot occur: ids are the keys of one JSON object.
        answers.insert(id.to_owned(), Value::Object(a));
    }
    Ok(Value::Object(answers))
}

fn distribution(keys: &[String], p: &[f64], id: &str) -> Result<Value, AnswerError> {
    let mut m = Map::new();
    for (k, &x) in keys.iter().zip(p) {
        m.insert(k.clone(), number(x, id)?);
    }
    Ok(Value::Object(m))
}
