//! A decision request's trail: where its time went and whom it was for, filled in by the admission pipeline as
//! the request goes (`crate::pipeline`) and recorded once when it is answered — the per-phase histograms, its
//! audit line ([`crate::audit`]) and its trace ([`crate::telemetry`]). A request whose handler is dropped
//! before it answers (the request timeout, or the client gone) is recorded by the drop.
//!
//! Histograms (Prometheus, seconds), each labelled `adapter` (its name; `mixed` for a batch of several),
//! `key` (the API key's name; `none` with auth off) and `input_tokens` (a bucket of its input tokens: `0-127`,
//! `128-511`, `512-2047`, `2048-8191`, `8192-32767`, `32768+`), recorded for answered (200) requests:
//!
//! | histogram | phase |
//! | --- | --- |
//! | `kev_admission_seconds` | decoding, parsing and tokenizing the body (on a blocking worker, holding an admission permit) |
//! | `kev_queue_wait_seconds` | from submission to the first engine pass (its first part's) |
//! | `kev_compute_seconds` | the engine passes that advanced it (its longest part's), readout included |
//! | `kev_head_seconds` | of those, reading the answers out: the pointer head and shaping the answers |
//! | `kev_decision_seconds` | end to end: from the request's arrival at its handler to its answer |

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};

use crate::queue::Answered;
use crate::queue::PassRecord;
use crate::{AdapterTag, Priority};

/// The label of a request's input-token count.
pub(crate) fn token_bucket(tokens: usize) -> &'static str {
    match tokens {
        0..128 => "0-127",
        128..512 => "128-511",
        512..2048 => "512-2047",
        2048..8192 => "2048-8191",
        8192..32768 => "8192-32767",
        _ => "32768+",
    }
}

/// Where a request's record goes when it ends.
pub(crate) struct Sinks {
    /// The audit log, if one was asked for.
    pub audit: Option<Arc<crate::audit::AuditLog>>,
    /// The server's request timeout (a handler dropped past it was answered 408 by the timeout layer).
    pub request_timeout: Duration,
}

/// One decision request's record (see the module docs).
pub(crate) struct Trail {
    sinks: Option<Arc<Sinks>>,
    /// When it arrived at its handler.
    pub arrived: Instant,
    route: String,
    request_id: String,
    /// The API key's name it came in under.
    pub key: Option<String>,
    /// Its priority, once settled.
    pub priority: Option<Priority>,
    /// Its own deadline (ms), if it set one.
    pub deadline_ms: Option<u128>,
    /// When admission (decode, parse, tokenize) started and how long it took.
    pub admission: Option<(Instant, Duration)>,
    /// When its parts were submitted to the queue.
    pub submitted: Option<Instant>,
    /// Its parts' adapters, each once, in order of first use.
    pub adapters: Vec<AdapterTag>,
    /// Its parts' states, when the audit log records states.
    pub states: Vec<Value>,
    /// Admitted parts.
    pub parts: usize,
    /// Times and tokens of its answered parts.
    answered: Option<Summary>,
    /// The request's trace span (tracing on only).
    pub span: Option<tracing::Span>,
    done: bool,
}

/// What the answered parts of a request add up to.
#[derive(Debug, Clone, Default)]
struct Summary {
    queued: Duration,
    compute: Duration,
    head: Duration,
    input_tokens: usize,
    output_tokens: usize,
    started: Option<Instant>,
    passes: Vec<PassRecord>,
}

impl Trail {
    /// A request's trail from its arrival; `sinks: None` records nothing (the warm-up and canary decisions).
    pub(crate) fn start(
        sinks: Option<Arc<Sinks>>,
        arrived: Instant,
        route: &str,
        request_id: &str,
        key: Option<String>,
    ) -> Self {
        Trail {
            sinks,
            arrived,
            route: route.to_owned(),
            request_id: request_id.to_owned(),
            key,
            priority: None,
            deadline_ms: None,
            admission: None,
            submitted: None,
            adapters: Vec::new(),
            states: Vec::new(),
            parts: 0,
            answered: None,
            span: None,
            done: false,
        }
    }

    /// Whether its parts' states are wanted (the audit log records states).
    pub(crate) fn wants_states(&self) -> bool {
        self.sinks
            .as_ref()
            .and_then(|s| s.audit.as_ref())
            .is_some_and(|a| a.states())
    }

    /// Note an adapter one of its parts runs under.
    pub(crate) fn adapter(&mut self, tag: &AdapterTag) {
        if !self.adapters.contains(tag) {
            self.adapters.push(tag.clone());
        }
    }

    /// Note its answered parts: its wait is its first part's, its engine and readout time its longest part's.
    pub(crate) fn answered(&mut self, parts: &mut [Answered]) {
        let mut s = Summary {
            queued: parts.iter().map(|p| p.queued).min().unwrap_or_default(),
            compute: parts.iter().map(|p| p.compute).max().unwrap_or_default(),
            head: parts.iter().map(|p| p.head).max().unwrap_or_default(),
            started: parts.iter().filter_map(|p| p.started).min(),
            ..Summary::default()
        };
        for p in parts.iter_mut() {
            s.input_tokens += p.body.usage().input_tokens;
            s.output_tokens += p.body.usage().output_tokens;
            s.passes.append(&mut p.passes);
        }
        self.answered = Some(s);
    }

    /// The `adapter` label: its one adapter's name, `mixed` for several, `none` when unknown.
    fn adapter_label(&self) -> &str {
        match self.adapters.as_slice() {
            [] => "none",
            [one] => &one.name,
            _ => "mixed",
        }
    }

    /// Record it as answered with `status` (`error_type` for an error).
    pub(crate) fn finish(mut self, status: u16, error_type: Option<&str>) {
        self.record(status, error_type);
    }

    fn record(&mut self, status: u16, error_type: Option<&str>) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        let Some(sinks) = self.sinks.clone() else {
            return;
        };
        let total = self.arrived.elapsed();
        if status == 200
            && let Some(s) = &self.answered
        {
            let labels = [
                ("adapter", self.adapter_label().to_owned()),
                ("key", self.key.clone().unwrap_or_else(|| "none".into())),
                ("input_tokens", token_bucket(s.input_tokens).to_owned()),
            ];
            let admission = self.admission.map(|(_, d)| d).unwrap_or_default();
            for (name, d) in [
                ("kev_admission_seconds", admission),
                ("kev_queue_wait_seconds", s.queued),
                ("kev_compute_seconds", s.compute),
                ("kev_head_seconds", s.head),
                ("kev_decision_seconds", total),
            ] {
                metrics::histogram!(name, &labels).record(d.as_secs_f64());
            }
        }
        if let Some(audit) = &sinks.audit {
            audit.write(self.audit_line(status, error_type, total));
        }
        if let Some(span) = self.span.take() {
            let end = crate::telemetry::RequestEnd {
                status,
                error_type,
                key: self.key.as_deref(),
                priority: self.priority.map(|p| p.name()),
                adapters: self.adapters.iter().map(|a| a.name.clone()).collect(),
                admission: self.admission,
                submitted: self.submitted,
                passes: self.passes(),
            };
            crate::telemetry::close_request(&span, &end);
        }
    }

    /// Its audit line (see [`crate::audit`]).
    fn audit_line(&self, status: u16, error_type: Option<&str>, total: Duration) -> Value {
        let ms = |d: Duration| (d.as_secs_f64() * 1e4).round() / 10.0;
        let mut line = Map::new();
        line.insert("ts".into(), json!(crate::audit::timestamp()));
        line.insert("request_id".into(), json!(self.request_id));
        line.insert("route".into(), json!(self.route));
        line.insert("key".into(), json!(self.key));
        line.insert("status".into(), json!(status));
        if let Some(t) = error_type {
            line.insert("error_type".into(), json!(t));
        }
        let adapters: Vec<Value> = self
            .adapters
            .iter()
            .map(|a| json!({"name": a.name, "sha256": a.sha256}))
            .collect();
        line.insert("adapters".into(), Value::Array(adapters));
        line.insert("priority".into(), json!(self.priority.map(Priority::name)));
        line.insert("deadline_ms".into(), json!(self.deadline_ms));
        line.insert("parts".into(), json!(self.parts));
        let s = self.answered.clone().unwrap_or_default();
        line.insert("input_tokens".into(), json!(s.input_tokens));
        line.insert("output_tokens".into(), json!(s.output_tokens));
        line.insert(
            "ms".into(),
            json!({
                "admission": self.admission.map(|(_, d)| ms(d)),
                "queue": self.answered.as_ref().map(|s| ms(s.queued)),
                "compute": self.answered.as_ref().map(|s| ms(s.compute)),
                "head": self.answered.as_ref().map(|s| ms(s.head)),
                "total": ms(total),
            }),
        );
        if let Some(span) = &self.span
            && let Some(id) = crate::telemetry::trace_id(span)
        {
            line.insert("trace_id".into(), json!(id));
        }
        if !self.states.is_empty() {
            line.insert("states".into(), Value::Array(self.states.clone()));
        }
        Value::Object(line)
    }

    /// The passes its parts rode (traced requests), their first pass's start, and their summed times.
    pub(crate) fn passes(&self) -> (&[PassRecord], Option<Instant>, Option<(Duration, Duration)>) {
        match &self.answered {
            Some(s) => (&s.passes, s.started, Some((s.queued, s.head))),
            None => (&[], None, None),
        }
    }
}

impl Drop for Trail {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        // Dropped unanswered: the request timeout (the timeout layer answered 408), or the client left (no
        // answer at all: 499, as proxies log it).
        let timeout = self.sinks.as_ref().map(|s| s.request_timeout);
        if timeout.is_some_and(|t| self.arrived.elapsed() + Duration::from_millis(5) >= t) {
            self.record(408, Some("timeout_error"));
        } else {
            self.record(499, Some("client_closed_request"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::token_bucket;

    #[test]
    fn token_buckets() {
        assert_eq!(token_bucket(0), "0-127");
        assert_eq!(token_bucket(127), "0-127");
        assert_eq!(token_bucket(128), "128-511");
        assert_eq!(token_bucket(8191), "2048-8191");
        assert_eq!(token_bucket(131_072), "32768+");
    }
}
