//! One entry of a 422 body's `detail` list, as FastAPI and pydantic v2 write it: where ([`LocItem`]s), what,
//! and the offending input echoed as Python would print it.

use serde_json::{Map, Value};

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
