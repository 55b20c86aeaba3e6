//! How urgent a request is: two kev extensions of the request body, read where the body is read
//! ([`crate::Kev::admit`]) and carried by its [`crate::Job`] to whoever schedules it.
//!
//! - `x_priority`: `"high"`, `"normal"` or `"low"` — the order a scheduler serves requests in (`kev serve` caps it
//!   by the API key's policy and still serves lower priorities, see kev-server's `sched`);
//! - `x_deadline_ms`: a positive integer of milliseconds, counted from when the request arrived — work still
//!   waiting for the engine when it passes is not run for nobody but answered at once (`kev serve`: 408
//!   `timeout_error`).
//!
//! Like every extension they keep the contract's reading of a body: a server that does not know them ignores
//! them (kev-contract §2: unknown fields ignored), `null` is the field not given, and a value of the wrong kind
//! is a 422 in pydantic's words (`literal_error`, `int_type`, `greater_than`, `less_than_equal`) under
//! `["body", field]`.

use std::time::Duration;

use kev_contract::{ContractError, ErrorDetail, LocItem};
use serde_json::{Value, json};

use crate::error::Refusal;

/// The request extension that sets a request's priority.
pub const PRIORITY_FIELD: &str = "x_priority";

/// The request extension that sets a request's deadline (milliseconds from its arrival).
pub const DEADLINE_FIELD: &str = "x_deadline_ms";

/// The longest deadline a request may ask for: a day (a request runs for minutes at most).
pub const MAX_DEADLINE_MS: u64 = 86_400_000;

/// A request's priority, lowest first (so `Ord` ranks them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Priority {
    /// Served when nothing more urgent waits (and never starved).
    Low,
    /// What a request gets when neither it nor its key says otherwise.
    #[default]
    Normal,
    /// Served first.
    High,
}

impl Priority {
    /// Every priority, lowest first.
    pub const ALL: [Priority; 3] = [Priority::Low, Priority::Normal, Priority::High];

    /// Its name on the wire (`high`, `normal`, `low`).
    pub fn name(self) -> &'static str {
        match self {
            Priority::Low => "low",
            Priority::Normal => "normal",
            Priority::High => "high",
        }
    }

    /// The priority a wire name names.
    pub fn parse(name: &str) -> Option<Self> {
        Priority::ALL.into_iter().find(|p| p.name() == name)
    }

    /// The words pydantic uses for the allowed values: `'high', 'normal' or 'low'`.
    pub fn expected() -> &'static str {
        "'high', 'normal' or 'low'"
    }
}

impl std::fmt::Display for Priority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What a request says about its urgency (each `None` where it says nothing).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Urgency {
    /// `x_priority`.
    pub priority: Option<Priority>,
    /// `x_deadline_ms`, from the request's arrival.
    pub deadline: Option<Duration>,
}

/// One validation entry under `[loc_root…, field]`, as pydantic words it.
fn entry(
    root: &[&str],
    field: &str,
    kind: &str,
    msg: String,
    input: Value,
    ctx: Option<Value>,
) -> ErrorDetail {
    let mut loc: Vec<LocItem> = root.iter().map(|r| LocItem::Key((*r).into())).collect();
    loc.push(LocItem::Key(field.into()));
    ErrorDetail {
        kind: kind.into(),
        loc,
        msg,
        input,
        ctx,
    }
}

/// A priority value as the body or a header gives it: `None` for null; the 422 entry (under `root`) for
/// anything but one of the three names.
pub fn read_priority(
    root: &[&str],
    field: &str,
    v: &Value,
) -> Result<Option<Priority>, Box<ErrorDetail>> {
    match v {
        Value::Null => Ok(None),
        Value::String(s) if Priority::parse(s).is_some() => Ok(Priority::parse(s)),
        other => Err(Box::new(entry(
            root,
            field,
            "literal_error",
            format!("Input should be {}", Priority::expected()),
            other.clone(),
            Some(json!({"expected": Priority::expected()})),
        ))),
    }
}

/// A deadline value as the body or a header gives it (milliseconds): `None` for null; the 422 entry (under
/// `root`) for anything but a whole number in `1..=MAX_DEADLINE_MS` (pydantic's lax integer: `250.0` is 250).
pub fn read_deadline(
    root: &[&str],
    field: &str,
    v: &Value,
) -> Result<Option<Duration>, Box<ErrorDetail>> {
    let bad = |kind: &str, msg: String, ctx: Option<Value>| {
        Box::new(entry(root, field, kind, msg, v.clone(), ctx))
    };
    let n = match v {
        Value::Null => return Ok(None),
        Value::Number(n) => n,
        _ => {
            return Err(bad(
                "int_type",
                "Input should be a valid integer".into(),
                None,
            ));
        }
    };
    // The number's own text (kept whole by the reader), so that integers past 2^53 are judged exactly.
    let text = n.to_string();
    let whole = if text.contains(['.', 'e', 'E']) {
        match text.parse::<f64>() {
            Ok(f) if f.is_finite() && f.fract() == 0.0 => Some(f),
            _ => {
                return Err(bad(
                    "int_from_float",
                    "Input should be a valid integer, got a number with a fractional part".into(),
                    None,
                ));
            }
        }
    } else {
        text.parse::<f64>().ok()
    };
    match whole {
        Some(f) if f <= 0.0 => Err(bad(
            "greater_than",
            "Input should be greater than 0".into(),
            Some(json!({"gt": 0})),
        )),
        Some(f) if f <= MAX_DEADLINE_MS as f64 => Ok(Some(Duration::from_millis(f as u64))),
        _ => Err(bad(
            "less_than_equal",
            format!("Input should be less than or equal to {MAX_DEADLINE_MS}"),
            Some(json!({"le": MAX_DEADLINE_MS})),
        )),
    }
}

/// The urgency a request body states (`x_priority`, `x_deadline_ms`), or its 422 listing every bad field.
pub fn read(body: &Value) -> Result<Urgency, Refusal> {
    let mut errors = Vec::new();
    let mut urgency = Urgency::default();
    if let Some(v) = body.get(PRIORITY_FIELD) {
        match read_priority(&["body"], PRIORITY_FIELD, v) {
            Ok(p) => urgency.priority = p,
            Err(e) => errors.push(*e),
        }
    }
    if let Some(v) = body.get(DEADLINE_FIELD) {
        match read_deadline(&["body"], DEADLINE_FIELD, v) {
            Ok(d) => urgency.deadline = d,
            Err(e) => errors.push(*e),
        }
    }
    if errors.is_empty() {
        Ok(urgency)
    } else {
        Err(Refusal::Contract(ContractError::Invalid(errors)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(body: Value) -> Vec<String> {
        match read(&body) {
            Ok(_) => Vec::new(),
            Err(Refusal::Contract(ContractError::Invalid(items))) => {
                items.into_iter().map(|i| i.kind).collect()
            }
            Err(other) => panic!("{other}"),
        }
    }

    #[test]
    fn the_fields_are_read_and_checked_as_pydantic_would() {
        let u = read(&json!({"x_priority": "high", "x_deadline_ms": 250})).unwrap();
        assert_eq!(u.priority, Some(Priority::High));
        assert_eq!(u.deadline, Some(Duration::from_millis(250)));
        assert_eq!(read(&json!({"state": "x"})).unwrap(), Urgency::default());
        assert_eq!(
            read(&json!({"x_priority": null, "x_deadline_ms": null})).unwrap(),
            Urgency::default()
        );
        assert_eq!(kinds(json!({"x_priority": "HIGH"})), ["literal_error"]);
        assert_eq!(kinds(json!({"x_priority": 2})), ["literal_error"]);
        assert_eq!(kinds(json!({"x_deadline_ms": "100"})), ["int_type"]);
        assert_eq!(kinds(json!({"x_deadline_ms": true})), ["int_type"]);
        assert_eq!(kinds(json!({"x_deadline_ms": 0})), ["greater_than"]);
        assert_eq!(kinds(json!({"x_deadline_ms": -5})), ["greater_than"]);
        assert_eq!(kinds(json!({"x_deadline_ms": 1.5})), ["int_from_float"]);
        assert_eq!(
            read(&json!({"x_deadline_ms": 250.0})).unwrap().deadline,
            Some(Duration::from_millis(250))
        );
        assert_eq!(
            kinds(json!({"x_deadline_ms": 86_400_001u64})),
            ["less_than_equal"]
        );
        // Both wrong: both named, in field order.
        assert_eq!(
            kinds(json!({"x_priority": "urgent", "x_deadline_ms": 0})),
            ["literal_error", "greater_than"]
        );
    }

    #[test]
    fn priorities_rank_low_to_high() {
        assert!(Priority::Low < Priority::Normal && Priority::Normal < Priority::High);
        for p in Priority::ALL {
            assert_eq!(Priority::parse(p.name()), Some(p));
        }
        assert_eq!(Priority::default(), Priority::Normal);
    }
}
