//! Readiness that proves the model: every `--canary-interval-s` the warm-up decision is answered again through
//! the served path (admission, the queue at high priority, engine passes, the head) and its answers compared,
//! byte for byte, with the answers it got at start. While the latest canary failed (an engine fault, no answer
//! within its time) or diverged, `/ready` is 503 `not_ready_error` saying why; the next canary that matches
//! makes it ready again. A canary refused for load (429, 529) or during the drain says nothing about the model
//! and changes nothing (`/ready` reports saturation on its own). `/live` stays a liveness probe: it answers
//! while the process serves, whatever the canary says.
//!
//! The answers are exactly reproducible (kev's shared and cached prefixes change no bit, kev-decide's tests), so
//! any difference is a fault: memory corruption, a bad adapter install, a broken kernel after a change.
//!
//! `/metrics`: `kev_canary_checks_total{result="ok|diverged|failed|shed"}`, `kev_canary_seconds` (the latest
//! canary's time to answer).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kev_contract::ErrorKind;
use serde_json::Value;

use crate::error::ApiError;
use crate::{App, Decider, Priority};

/// The canary's state: the reference answers and the latest verdict.
#[derive(Debug, Default)]
pub(crate) struct Canary {
    inner: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// `answers` and `usage` of the warm-up decision, as compact JSON.
    reference: Option<String>,
    /// Why the latest canary did not pass (`None`: it passed, or none ran yet).
    failing: Option<String>,
}

/// What a decision's answer is compared by: its `answers` and `usage` (not its latency).
fn fingerprint(answer: &Value) -> String {
    let pick = serde_json::json!({"answers": answer.get("answers"), "usage": answer.get("usage")});
    kev_contract::compact_json(&pick)
}

impl Canary {
    /// Keep the warm-up decision's answer as the reference.
    pub(crate) fn set_reference(&self, answer: &Value) {
        self.lock().reference = Some(fingerprint(answer));
    }

    /// `None` while the latest canary passed (or none ran yet); else why not.
    pub(crate) fn failing(&self) -> Option<String> {
        self.lock().failing.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Judge one canary's outcome.
    fn judge(&self, outcome: Result<Value, ApiError>, took: Duration) {
        metrics::gauge!("kev_canary_seconds").set(took.as_secs_f64());
        let mut s = self.lock();
        let verdict = match outcome {
            Ok(answer) => {
                let got = fingerprint(&answer);
                match &s.reference {
                    Some(r) if *r == got => Ok(()),
                    Some(r) => Err((
                        "diverged",
                        format!(
                            "the canary decision diverged from its answer at start: got {got}, expected {r}"
                        ),
                    )),
                    None => Ok(()),
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::QueueFull | ErrorKind::Overloaded | ErrorKind::Unavailable
                ) =>
            {
                metrics::counter!("kev_canary_checks_total", "result" => "shed").increment(1);
                return;
            }
            Err(e) => Err((
                "failed",
                format!(
                    "the canary decision failed: {} {}",
                    e.status().as_u16(),
                    e.error_body().to_value()
                ),
            )),
        };
        match verdict {
            Ok(()) => {
                metrics::counter!("kev_canary_checks_total", "result" => "ok").increment(1);
                if s.failing.take().is_some() {
                    tracing::warn!("the canary decision matches its answer at start again: ready");
                }
            }
            Err((result, why)) => {
                metrics::counter!("kev_canary_checks_total", "result" => result).increment(1);
                tracing::error!(reason = %why, "canary: /ready answers 503 until a canary passes");
                s.failing = Some(why);
            }
        }
    }
}

/// Run the canary every `interval` until the server drains. Each canary has `interval` (at least 10 s) to
/// answer; one that does not has failed.
pub(crate) async fn run<D: Decider>(app: Arc<App<D>>, body: Vec<u8>, interval: Duration) {
    let limit = interval.max(Duration::from_secs(10));
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if app.draining.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let started = Instant::now();
        let answer = tokio::time::timeout(
            limit,
            crate::pipeline::answer_body(&app, body.clone(), "canary", Priority::High),
        )
        .await
        .unwrap_or_else(|_| {
            Err(ApiError::typed(
                ErrorKind::Internal,
                format!("no answer within {} s", limit.as_secs()),
            ))
        });
        app.canary.judge(answer, started.elapsed());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn answers_and_usage_decide_latency_does_not() {
        let c = Canary::default();
        let a = json!({"model": "m", "answers": {"q": {"noul": 0.25}}, "usage": {"input_tokens": 9}, "x_latency_ms": 3.0});
        c.set_reference(&a);
        let mut later = a.clone();
        later["x_latency_ms"] = json!(7.5);
        c.judge(Ok(later), Duration::ZERO);
        assert_eq!(c.failing(), None);
        let mut drift = a.clone();
        drift["answers"]["q"]["noul"] = json!(0.2500001);
        c.judge(Ok(drift), Duration::ZERO);
        assert!(c.failing().unwrap().contains("diverged"));
        // Shed for load: no verdict either way.
        c.judge(Err(ApiError::queue_full(4, 1)), Duration::ZERO);
        assert!(c.failing().is_some());
        c.judge(Ok(a.clone()), Duration::ZERO);
        assert_eq!(c.failing(), None);
        c.judge(Err(ApiError::internal()), Duration::ZERO);
        assert!(c.failing().unwrap().contains("failed: 500"));
    }
}
