//! `ContractError`: a refused request, with the FastAPI body Kev sends; its status comes from the status table
//! ([`crate::problem`], kev-contract §8.5).

use serde_json::{Map, Value, json};

use crate::problem::{ErrorBody, ErrorKind, WireError};

use crate::pyfmt::{PyNumber, int_str, py_float_number, py_number};

/// One element of an error's `loc`: an object key or a list/offset index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LocItem {
    /// A field name, a question id, or a union member tag (`"Noul"`, `"function-after[_check(), Choice]"`).
    Key(String),
    /// A position (the character offset of a JSON decode error).
    Index(usize),
}

/// One entry of a FastAPI 422 `detail` list, as pydantic v2 reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct ErrorDetail {
    /// pydantic's error type (`missing`, `literal_error`, `dict_type`, `json_invalid`, ...).
    pub kind: String,
    /// Where: starts with `"body"`.
    pub loc: Vec<LocItem>,
    /// pydantic's message.
    pub msg: String,
    /// The offending input, echoed (numbers as Python would write them).
    pub input: Value,
    /// Extra context (`{"expected": "'noul'"}`, ...), when pydantic gives one.
    pub ctx: Option<Value>,
}

impl ErrorDetail {
    /// The entry as FastAPI serializes it: `{"type", "loc", "msg", "input", "ctx"?}`.
    pub fn to_value(&self) -> Value {
        let mut m = Map::new();
        m.insert("type".into(), Value::String(self.kind.clone()));
        let loc = self
            .loc
            .iter()
            .map(|l| match l {
                LocItem::Key(k) => Value::String(k.clone()),
                LocItem::Index(i) => Value::from(*i),
            })
            .collect();
        m.insert("loc".into(), Value::Array(loc));
        m.insert("msg".into(), Value::String(self.msg.clone()));
        m.insert("input".into(), python_echo(&self.input));
        if let Some(ctx) = &self.ctx {
            m.insert("ctx".into(), ctx.clone());
        }
        Value::Object(m)
    }
}

/// A request refused before any tokenizing or compute.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ContractError {
    /// The body is not JSON (Python `json.JSONDecodeError`): 422 `json_invalid` at Python's character offset.
    #[error("request body is not valid JSON: {message} at character {position}")]
    InvalidJson {
        /// Character offset (Python `str` index) of the error.
        position: usize,
        /// Python's message, e.g. `Expecting value`.
        message: &'static str,
    },
    /// The body could not be read at all (FastAPI: 400 "There was an error parsing the body").
    #[error("request body could not be parsed: {reason}")]
    Unparseable {
        /// What went wrong, for logs (not sent to the client).
        reason: &'static str,
    },
    /// Schema violations (Kev 1.0 rules, kev-contract §2.1): 422 with the pydantic error list.
    #[error("request failed validation ({} error(s)): {}", .0.len(), first_msg(.0))]
    Invalid(Vec<ErrorDetail>),
}

fn first_msg(details: &[ErrorDetail]) -> String {
    details.first().map(|d| d.msg.clone()).unwrap_or_default()
}

impl ContractError {
    /// The HTTP status (the status table's row for [`WireError::kind`]).
    pub fn status(&self) -> u16 {
        self.kind().status()
    }

    /// The error entries (a `json_invalid` error is one entry; an unreadable body has none).
    pub fn details(&self) -> Vec<ErrorDetail> {
        match self {
            ContractError::Invalid(d) => d.clone(),
            ContractError::InvalidJson { position, message } => vec![ErrorDetail {
                kind: "json_invalid".into(),
                loc: vec![LocItem::Key("body".into()), LocItem::Index(*position)],
                msg: "JSON decode error".into(),
                input: json!({}),
                ctx: Some(json!({ "error": message })),
            }],
            ContractError::Unparseable { .. } => Vec::new(),
        }
    }

    /// The response body, exactly as Kev's FastAPI server sends it.
    pub fn body(&self) -> Value {
        self.error_body().to_value()
    }
}

impl WireError for ContractError {
    fn kind(&self) -> ErrorKind {
        match self {
            ContractError::Unparseable { .. } => ErrorKind::Unparseable,
            ContractError::InvalidJson { .. } | ContractError::Invalid(_) => ErrorKind::Validation,
        }
    }

    fn error_body(&self) -> ErrorBody {
        match self {
            ContractError::Unparseable { .. } => {
                ErrorBody::Message("There was an error parsing the body")
            }
            _ => ErrorBody::Validation(self.details()),
        }
    }
}

/// An echoed input as Python writes it back: floats as `repr` (`1e-5` → `1e-05`), `-0` → `0`. Python cannot
/// write non-finite floats at all (Kev fails with a 500 there); they are echoed as `null`.
fn python_echo(v: &Value) -> Value {
    match v {
        Value::Number(n) => match py_number(n) {
            PyNumber::Int(text) => {
                let t = int_str(text);
                if t.len() == text.len() {
                    v.clone()
                } else {
                    Value::from(0)
                }
            }
            PyNumber::Float(x) => py_float_number(x).map_or(Value::Null, Value::Number),
        },
        Value::Array(items) => Value::Array(items.iter().map(python_echo).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, x)| (k.clone(), python_echo(x)))
                .collect(),
        ),
        other => other.clone(),
    }
}
