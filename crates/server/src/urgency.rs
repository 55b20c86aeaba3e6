//! Priorities and deadlines as the server applies them.
//!
//! A request's priority is what it asks (`x_priority` in its body — the highest of its parts' — or an
//! `X-Kev-Priority` header for clients that cannot add fields; the body wins), else its API key's
//! `default_priority`, else `normal`; then capped by the key's `max_priority` (the answer says what it got:
//! `x-kev-priority`). Its deadline is the earliest of `x_deadline_ms` (its parts') and `X-Kev-Deadline-Ms`,
//! counted from when the request arrived.
//!
//! - **Queue slots** ([`slots_for`]): `normal` work uses the `--queue-depth` slots as before; `low` work at most
//!   three quarters of them (so low traffic cannot shed normal traffic); `high` work a reserve beyond them
//!   (an eighth of the depth, at least one), so urgent work is not shed because others filled the queue. A
//!   full queue answers 429 before the body is read, so the slot is taken for the priority known then — an
//!   `X-Kev-Priority` header, else the key's `default_priority` (within its `max_priority`), else `normal` —
//!   and held to the request's settled priority once its body is admitted (a low request past the low
//!   slots: 429).
//! - **Scheduling**: see [`crate::sched`] (higher first, lower never starved).
//! - **Deadlines**: a request whose deadline passes while it waits is answered 408 `timeout_error` at once
//!   (by its handler, on time, whatever the engine is doing) and never run; one that has started is stopped
//!   before its next pass and answered 408.

use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use kev_contract::{ContractError, ErrorDetail};
use kev_decide::urgency::{read_deadline, read_priority};
use serde_json::Value;

use crate::error::ApiError;
use crate::{Priority, Urgency};

/// The header that sets a request's deadline in milliseconds (for clients that cannot add body fields).
pub const DEADLINE_HEADER: &str = "x-kev-deadline-ms";

/// The header that sets a request's priority (`high`, `normal`, `low`).
pub const PRIORITY_HEADER: &str = "x-kev-priority";

/// How long a priority counts as "about" after its last request was seen (the planner's share rule).
pub const RECENT: Duration = Duration::from_secs(1);

/// When a request's own deadline falls, and the milliseconds it was given (for the 408's message).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline {
    /// When it passes.
    pub at: Instant,
    /// The deadline as the request gave it.
    pub ms: u128,
}

/// How a request is queued: its priority, its deadline, and the span its passes are traced under.
#[derive(Debug, Clone, Default)]
pub struct Submit {
    /// Its priority (after its key's policy).
    pub priority: Priority,
    /// Its own deadline, if it set one.
    pub deadline: Option<Deadline>,
    /// The request's trace span (`None` with tracing off: nothing is recorded).
    pub span: Option<tracing::Span>,
    /// The server's own decision (the warm-up, the canary): served at its priority, but not counted as
    /// urgent work about ([`Recent`]), so a high-priority canary never pushes users' normal work aside.
    pub internal: bool,
}

/// The queue slots a request of priority `p` may use out of a queue of `depth` (see the module docs).
pub fn slots_for(depth: usize, p: Priority) -> usize {
    match p {
        Priority::Low => depth - depth / 4,
        Priority::Normal => depth,
        Priority::High => depth + (depth / 8).max(1),
    }
}

/// What the headers say of a request's urgency: the 422 (pydantic's list under `["header", name]`) for a value
/// that is not one.
pub fn from_headers(headers: &HeaderMap) -> Result<Urgency, ApiError> {
    let mut errors: Vec<ErrorDetail> = Vec::new();
    let mut out = Urgency::default();
    let text = |name: &str| {
        headers
            .get(name)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).trim().to_owned())
    };
    if let Some(v) = text(PRIORITY_HEADER) {
        match read_priority(&["header"], PRIORITY_HEADER, &Value::String(v)) {
            Ok(p) => out.priority = p,
            Err(e) => errors.push(*e),
        }
    }
    if let Some(v) = text(DEADLINE_HEADER) {
        // A header is text: read it as the JSON number it spells (anything else is not an integer).
        let value = serde_json::from_str::<Value>(&v)
            .ok()
            .filter(Value::is_number)
            .unwrap_or(Value::String(v));
        match read_deadline(&["header"], DEADLINE_HEADER, &value) {
            Ok(d) => out.deadline = d,
            Err(e) => errors.push(*e),
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(ContractError::Invalid(errors).into())
    }
}

/// A key's say on priorities (`None`: no say).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PriorityPolicy {
    /// What its requests get when they ask nothing.
    pub default: Option<Priority>,
    /// The most its requests may get.
    pub max: Option<Priority>,
}

impl PriorityPolicy {
    /// The priority a request gets: what it asks (`asked`), else the default, else normal, capped by the max.
    pub fn apply(&self, asked: Option<Priority>) -> Priority {
        let p = asked.or(self.default).unwrap_or_default();
        match self.max {
            Some(max) => p.min(max),
            None => p,
        }
    }
}

/// A request's urgency from its parts' (`parts`), its headers' (`header`) and its key's policy: the highest
/// priority asked (a body's over the header's), the earliest deadline, counted from `arrived`.
pub fn settle(
    parts: impl IntoIterator<Item = Urgency>,
    header: Urgency,
    policy: PriorityPolicy,
    arrived: Instant,
) -> (Priority, Option<Deadline>) {
    let mut asked: Option<Priority> = None;
    let mut deadline = header.deadline;
    for u in parts {
        asked = asked.max(u.priority);
        deadline = match (deadline, u.deadline) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    let priority = policy.apply(asked.or(header.priority));
    let deadline = deadline.map(|d| Deadline {
        at: arrived + d,
        ms: d.as_millis(),
    });
    (priority, deadline)
}

/// The priorities the engine thread has seen lately: a priority stays "about" for [`RECENT`] after its
/// last request was waiting or running.
#[derive(Debug, Default)]
pub(crate) struct Recent {
    last: [Option<Instant>; 3],
}

impl Recent {
    /// Note the priorities of the work in hand at `now`; the planner's view of urgency.
    pub(crate) fn see(
        &mut self,
        now_about: impl Iterator<Item = Priority>,
        now: Instant,
    ) -> crate::sched::Urgency {
        for p in now_about {
            self.last[p as usize] = Some(now);
        }
        let recent = Priority::ALL
            .into_iter()
            .rev()
            .find(|p| self.last[*p as usize].is_some_and(|t| now.duration_since(t) < RECENT));
        crate::sched::Urgency { recent }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn slots_by_priority() {
        assert_eq!(
            (
                slots_for(64, Priority::Low),
                slots_for(64, Priority::Normal),
                slots_for(64, Priority::High)
            ),
            (48, 64, 72)
        );
        // Small queues: low keeps at least what normal has when a quarter rounds to nothing; high one more.
        assert_eq!(slots_for(1, Priority::Low), 1);
        assert_eq!(slots_for(1, Priority::High), 2);
        assert_eq!(slots_for(4, Priority::Low), 3);
    }

    #[test]
    fn policy_defaults_and_caps() {
        let open = PriorityPolicy::default();
        assert_eq!(open.apply(None), Priority::Normal);
        assert_eq!(open.apply(Some(Priority::High)), Priority::High);
        let batch = PriorityPolicy {
            default: Some(Priority::Low),
            max: Some(Priority::Normal),
        };
        assert_eq!(batch.apply(None), Priority::Low);
        assert_eq!(batch.apply(Some(Priority::High)), Priority::Normal);
    }

    #[test]
    fn parts_headers_and_policy_settle_one_urgency() {
        let t = Instant::now();
        let ms = Duration::from_millis;
        let part = |p, d: Option<u64>| Urgency {
            priority: p,
            deadline: d.map(ms),
        };
        let header = part(Some(Priority::Low), Some(500));
        let (p, d) = settle(
            [part(None, Some(800)), part(Some(Priority::High), Some(300))],
            header,
            PriorityPolicy::default(),
            t,
        );
        assert_eq!(p, Priority::High, "the body's ask wins over the header's");
        assert_eq!(d.unwrap().at, t + ms(300));
        assert_eq!(d.unwrap().ms, 300);
        let (p, d) = settle([part(None, None)], header, PriorityPolicy::default(), t);
        assert_eq!((p, d.unwrap().ms), (Priority::Low, 500));
    }

    #[test]
    fn headers_are_read_and_checked() {
        let mut h = HeaderMap::new();
        h.insert(PRIORITY_HEADER, HeaderValue::from_static("high"));
        h.insert(DEADLINE_HEADER, HeaderValue::from_static(" 250 "));
        let u = from_headers(&h).unwrap();
        assert_eq!(u.priority, Some(Priority::High));
        assert_eq!(u.deadline, Some(Duration::from_millis(250)));
        h.insert(DEADLINE_HEADER, HeaderValue::from_static("soon"));
        h.insert(PRIORITY_HEADER, HeaderValue::from_static("urgent"));
        let e = from_headers(&h).unwrap_err();
        assert_eq!(e.status().as_u16(), 422);
        let body = e.body();
        assert_eq!(
            body["detail"][0]["loc"],
            serde_json::json!(["header", "x-kev-priority"])
        );
        assert_eq!(body["detail"][1]["type"], "int_type");
    }

    #[test]
    fn a_priority_stays_about_for_a_second() {
        let mut r = Recent::default();
        let t = Instant::now();
        assert_eq!(
            r.see([Priority::High].into_iter(), t).recent,
            Some(Priority::High)
        );
        assert_eq!(
            r.see([Priority::Low].into_iter(), t + Duration::from_millis(900))
                .recent,
            Some(Priority::High)
        );
        assert_eq!(
            r.see(std::iter::empty(), t + Duration::from_millis(1500))
                .recent,
            Some(Priority::Low)
        );
        assert_eq!(
            r.see(std::iter::empty(), t + Duration::from_secs(3)).recent,
            None
        );
    }
}
