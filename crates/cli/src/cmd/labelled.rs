//! Labelled data for `kev calibrate` and `kev eval`: JSONL, one SystemOne request per line plus the right option
//! of its questions, either as a top-level `"labels": {"<question id>": <label>}` or as a `"label"` inside a
//! question (both are unknown fields to `/v1/systemone`, which ignores them); or a record holding the request
//! apart, `{"id": …, "request": {…}, "labels": {…}}` (kev-mini's splits). A label is the option's key: `"true"`
//! / `"false"` (or JSON `true` / `false`) for noul, the choice name, the level index (`2` or `"2"`) for score.
//! Unlabelled questions are asked but not scored; a line with no label at all, a label that names no option, or
//! a label for a question the request does not have is refused with its line number.

use std::path::Path;

use anyhow::{Context, bail};
use kev_contract::{QuestionKind, ValidRequest};
use serde_json::Value;

/// One usable line.
pub struct Line {
    /// 1-based line number in the file.
    pub number: usize,
    /// The request as sent to a model: the line without its labels (`labels`, `label`).
    pub body: Vec<u8>,
    /// The validated request.
    pub request: ValidRequest,
    /// Per question in request order, the labelled option's index (`None`: not labelled).
    pub labels: Vec<Option<usize>>,
}

impl Line {
    /// (question index, label) of the labelled questions.
    pub fn labelled(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.labels
            .iter()
            .enumerate()
            .filter_map(|(i, l)| l.map(|l| (i, l)))
    }
}

fn label_index(kind: QuestionKind, keys: &[String], label: &Value) -> Result<usize, String> {
    let key = match (kind, label) {
        (QuestionKind::Noul, Value::Bool(b)) => b.to_string(),
        (QuestionKind::Score, Value::Number(n)) => n.to_string(),
        (_, Value::String(s)) => s.clone(),
        (_, other) => return Err(format!("label {other} is not an option key")),
    };
    keys.iter().position(|k| *k == key).ok_or_else(|| {
        let shown: Vec<&str> = keys.iter().take(8).map(String::as_str).collect();
        format!(
            "label {key:?} is none of the question's options ({}{})",
            shown.join(", "),
            if keys.len() > 8 { ", …" } else { "" }
        )
    })
}

/// Read and check one line.
fn line(number: usize, text: &str) -> Result<Line, String> {
    let mut v = kev_contract::python_loads(text.as_bytes())
        .map_err(|e| format!("not JSON: {}", e.body()))?;
    let Some(obj) = v.as_object_mut() else {
        return Err("not a JSON object".into());
    };
    // A record (`{"id", "request": {…}, "labels": {…}}`, kev-mini's splits) holds the request apart.
    let outer_labels = if !obj.contains_key("questions")
        && let Some(Value::Object(_)) = obj.get("request")
    {
        let labels = obj.remove("labels");
        let request = obj.remove("request").unwrap_or(Value::Null);
        v = request;
        labels
    } else {
        None
    };
    let Some(obj) = v.as_object_mut() else {
        return Err("not a JSON object".into());
    };
    let mut labels: Vec<(String, Value)> = Vec::new();
    match obj.remove("labels").or(outer_labels) {
        None => {}
        Some(Value::Object(m)) => labels.extend(m),
        Some(_) => return Err("\"labels\" is not an object of question id → option key".into()),
    }
    if let Some(Value::Object(qs)) = obj.get_mut("questions") {
        for (id, q) in qs.iter_mut() {
            if let Some(l) = q.as_object_mut().and_then(|q| q.remove("label")) {
                labels.push((id.clone(), l));
            }
        }
    }
    let body = serde_json::to_vec(&v).map_err(|e| e.to_string())?;
    let request = kev_contract::parse_request(&body)
        .map_err(|e| format!("not a valid request ({}): {}", e.status(), e.body()))?;
    let mut per_q: Vec<Option<usize>> = vec![None; request.questions().len()];
    for (id, label) in labels {
        let Some(k) = request.questions().iter().position(|q| q.id() == id) else {
            return Err(format!(
                "label for {id:?}, which is not a question of the request"
            ));
        };
        let q = &request.questions()[k];
        per_q[k] = Some(
            label_index(q.kind(), q.keys(), &label).map_err(|e| format!("question {id:?}: {e}"))?,
        );
    }
    if per_q.iter().all(Option::is_none) {
        return Err("no labels (add \"labels\": {\"<question id>\": \"<option key>\"})".into());
    }
    Ok(Line {
        number,
        body,
        request,
        labels: per_q,
    })
}

/// Every line of a labelled JSONL file (blank lines skipped), or the first unusable one's number and reason.
pub fn read(path: &Path) -> anyhow::Result<Vec<Line>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = Vec::new();
    for (i, t) in text.lines().enumerate() {
        if t.trim().is_empty() {
            continue;
        }
        match line(i + 1, t) {
            Ok(l) => out.push(l),
            Err(e) => bail!("{}:{}: unusable line: {e}", path.display(), i + 1),
        }
    }
    if out.is_empty() {
        bail!("{}: no labelled requests", path.display());
    }
    Ok(out)
}

/// A question's probabilities in option order, read back from a response body's answer (as any SystemOne
/// server writes it: `noul` → `[1 − p, p]`; choice and score from `probabilities` by key, a missing key 0).
pub fn probabilities_of(answer: &Value, kind: QuestionKind, keys: &[String]) -> Option<Vec<f64>> {
    match kind {
        QuestionKind::Noul => {
            let p = answer.get("noul")?.as_f64()?;
            Some(vec![1.0 - p, p])
        }
        _ => {
            let probs = answer.get("probabilities")?.as_object()?;
            Some(
                keys.iter()
                    .map(|k| probs.get(k).and_then(Value::as_f64).unwrap_or(0.0))
                    .collect(),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_in_both_places_and_refusals() {
        let ok = line(
            1,
            r#"{"state":"x","questions":{"a":{"type":"noul","label":true},"b":{"type":"choice","criteria":{"X":null,"Y":null}},"c":{"type":"score","criteria":["lo","hi"]}},"labels":{"b":"Y","c":1}}"#,
        )
        .unwrap();
        assert_eq!(ok.labels, vec![Some(1), Some(1), Some(1)]);
        let record = line(
            2,
            r#"{"id":"t-1","family":"x","request":{"state":"s","questions":{"a":{"type":"score","criteria":["lo","mid","hi"]}}},"labels":{"a":"2"}}"#,
        )
        .unwrap();
        assert_eq!(record.labels, vec![Some(2)]);
        let body: Value = serde_json::from_slice(&record.body).unwrap();
        assert!(body.get("id").is_none() && body.get("labels").is_none() && body["state"] == "s");
        let body: Value = serde_json::from_slice(&ok.body).unwrap();
        assert!(body.get("labels").is_none());
        assert!(body["questions"]["a"].get("label").is_none());
        for bad in [
            r#"{"state":"x","questions":{"a":{"type":"noul"}}}"#,
            r#"{"state":"x","questions":{"a":{"type":"noul"}},"labels":{"a":"yes"}}"#,
            r#"{"state":"x","questions":{"a":{"type":"noul"}},"labels":{"z":"true"}}"#,
            r#"{"state":"x","questions":{}},"labels":{}}"#,
            r#"{"state":"x","questions":{"a":{"type":"score","criteria":["l"]}},"labels":{"a":3}}"#,
            "[1]",
            "nope",
        ] {
            assert!(line(1, bad).is_err(), "{bad}");
        }
    }
}
