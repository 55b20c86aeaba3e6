//! What a request compiles to, as JSON (kev-contract §5): per question the row's token ids, positions,
//! readout indices and option keys, plus `input_tokens`. `kev rows` prints it; the Python package's
//! `Model.rows` returns it.

use kev_tokenize::{KevTokenizer, Limits, TokenizeError};

use crate::Refusal;
use serde_json::{Map, Value, json};

/// `Ok(Ok(rows))`; `Ok(Err(refusal))` for a request the server would refuse (its status from the contract's table); `Err` for a fault of ours
/// (the tokenizer failed on valid text).
pub fn rows(
    tok: &KevTokenizer,
    body: &[u8],
    limits: &Limits,
) -> Result<Result<Value, Refusal>, TokenizeError> {
    let req = match kev_contract::parse_request(body) {
        Ok(r) => r,
        Err(e) => return Ok(Err(e.into())),
    };
    let compiled = match tok.compile(&req, limits) {
        Ok(c) => c,
        Err(e @ TokenizeError::Encode(_)) => return Err(e),
        Err(e) => return Ok(Err(e.into())),
    };
    let state_len = compiled.state_ids().len();
    let questions: Vec<Value> = req
        .questions()
        .iter()
        .zip(compiled.branches())
        .enumerate()
        .map(|(k, (q, b))| {
            let row = compiled.row_ids(k).unwrap_or_default();
            json!({
                "id": q.id(),
                "type": q.kind().as_str(),
                "keys": q.keys(),
                "option_texts": q.options(),
                "row_ids": row,
                "positions": (0..state_len + b.len()).collect::<Vec<_>>(),
                "option_ends": b.option_ends(),
                "decide": b.decide(),
                "branch_tokens": b.len(),
            })
        })
        .collect();
    let mut out = Map::new();
    out.insert("model".into(), Value::String(req.model().to_owned()));
    out.insert("state_tokens".into(), Value::from(state_len));
    out.insert("questions".into(), Value::Array(questions));
    out.insert("input_tokens".into(), Value::from(compiled.input_tokens()));
    if let Some(t) = compiled.truncation() {
        out.insert("x_truncated".into(), Value::Bool(t.truncated()));
        out.insert("x_state_tokens".into(), Value::from(t.state_tokens));
        out.insert(
            "x_state_tokens_used".into(),
            Value::from(t.state_tokens_used),
        );
    }
    Ok(Ok(Value::Object(out)))
}
