//! The decision service's errors: a request refused before it runs ([`Refusal`]), and a failure of ours
//! while answering an accepted one ([`DecideError`]). Both keep the typed error of the layer that raised
//! it; their HTTP status and body come from the contract's status table ([`kev_contract::problem`]).

use std::sync::Arc;

use kev_contract::{AnswerError, ContractError, ErrorBody, ErrorKind, WireError};
use kev_engine::EngineError;
use kev_tokenize::TokenizeError;

use crate::pinned::PinRefusal;
use serde_json::{Value, json};

/// A work cap a request is over: the field, the bound and the request's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverCap {
    /// The quantity capped (`questions`, `options`, `input_tokens`).
    pub field: &'static str,
    /// The cap.
    pub bound: usize,
    /// The request's value (for `input_tokens`: a lower bound, counting stopped at the cap); for a request
    /// of several parts (a fan-out), the parts' total.
    pub value: usize,
    /// How many parts the request was admitted as (1 for a plain request).
    pub parts: usize,
}

impl OverCap {
    /// `too much work in one request: questions is 20000, over the limit of 1024 (…)`.
    pub fn message(&self) -> String {
        let (at_least, what) = match self.field {
            "questions" => ("", "questions in the request"),
            "options" => ("", "options over all questions; a noul question has 2"),
            "requests" => {
                return format!(
                    "too much work in one batch: requests is {}, over the limit of {}; split the batch",
                    self.value, self.bound
                );
            }
            "batch_input_tokens" => {
                return format!(
                    "too much work in one batch: input_tokens over its admitted requests is at least {}, over the limit of {} (usage.input_tokens summed); split the batch",
                    self.value, self.bound
                );
            }
            _ => (
                "at least ",
                "the state once plus every question's branch, as usage.input_tokens counts them",
            ),
        };
        let over_parts = match self.parts {
            0 | 1 => String::new(),
            n => format!(" over its {n} parts"),
        };
        format!(
            "too much work in one request: {}{over_parts} is {at_least}{}, over the limit of {} ({what}); split the questions across requests",
            self.field, self.value, self.bound
        )
    }
}

/// A request refused before the engine sees it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Refusal {
    /// Not a valid Kev 1.0 request (422, or 400 for an unreadable body).
    #[error(transparent)]
    Contract(#[from] ContractError),
    /// Over a token limit (422), or the tokenizer failed (500).
    #[error(transparent)]
    Tokenize(#[from] TokenizeError),
    /// Over a per-request work cap (413).
    #[error("{}", .0.message())]
    OverCap(OverCap),
    /// A `model` no adapter answers to, under `--strict-models` (400 `api_usage_error`).
    #[error("Unknown model: {0}")]
    UnknownModel(String),
    /// A `model` naming an adapter that was removed while the service ran (404).
    #[error("adapter {0:?} is not served: it was removed")]
    AdapterGone(String),
    /// A pinned state named that is not there (404) or not the request's `state` (422), or a pin that
    /// does not fit its key's share or the budget (429, 413).
    #[error(transparent)]
    Pin(#[from] PinRefusal),
}

impl From<OverCap> for Refusal {
    fn from(o: OverCap) -> Self {
        Refusal::OverCap(o)
    }
}

impl Refusal {
    /// The HTTP status (the status table's row).
    pub fn status(&self) -> u16 {
        self.kind().status()
    }

    /// The response body.
    pub fn body(&self) -> Value {
        self.error_body().to_value()
    }

    /// The `Retry-After` (seconds) of a refusal that may pass by waiting (a full pin budget).
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            Refusal::Pin(p) => p.retry_after(),
            _ => None,
        }
    }

    /// The work cap the request is over, if that is why it was refused.
    pub fn over(&self) -> Option<&OverCap> {
        match self {
            Refusal::OverCap(o) => Some(o),
            _ => None,
        }
    }
}

impl WireError for Refusal {
    fn kind(&self) -> ErrorKind {
        match self {
            Refusal::Contract(e) => e.kind(),
            Refusal::Tokenize(e) => e.kind(),
            Refusal::OverCap(_) => ErrorKind::TooMuchWork,
            Refusal::UnknownModel(_) => ErrorKind::UnknownModel,
            Refusal::AdapterGone(_) => ErrorKind::NotFound,
            Refusal::Pin(p) => p.kind(),
        }
    }

    /// A work cap's 413 names the field, the bound and the request's value beside the message.
    fn error_body(&self) -> ErrorBody {
        match self {
            Refusal::Contract(e) => e.error_body(),
            Refusal::Tokenize(e) => e.error_body(),
            Refusal::OverCap(o) => {
                let body = ErrorBody::typed(self.kind(), o.message())
                    .with("field", json!(o.field))
                    .with("limit", json!(o.bound))
                    .with("value", json!(o.value));
                if o.parts > 1 {
                    body.with("parts", json!(o.parts))
                } else {
                    body
                }
            }
            Refusal::UnknownModel(_) | Refusal::AdapterGone(_) => {
                ErrorBody::typed(self.kind(), self.to_string())
            }
            Refusal::Pin(p) => p.error_body(),
        }
    }
}

/// A failure of ours while answering an accepted request (always a 500: never the request's fault).
#[derive(Debug, Clone, thiserror::Error)]
pub enum DecideError {
    /// The backbone failed; one pass's error is shared by every request in the pass.
    #[error("engine: {0}")]
    Engine(#[from] Arc<EngineError>),
    /// The probabilities could not be shaped into answers (a NaN, a count mismatch).
    #[error("answers: {0}")]
    Answer(#[from] AnswerError),
    /// The answers could not be counted for usage.
    #[error("usage: {0}")]
    Usage(#[from] TokenizeError),
    /// The service returned no answer for the request (a bookkeeping fault).
    #[error("no answer: {0}")]
    Unanswered(&'static str),
}

impl From<EngineError> for DecideError {
    fn from(e: EngineError) -> Self {
        DecideError::Engine(Arc::new(e))
    }
}

impl WireError for DecideError {
    fn kind(&self) -> ErrorKind {
        ErrorKind::Internal
    }

    fn error_body(&self) -> ErrorBody {
        ErrorBody::typed(self.kind(), self.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_fault_stays_a_device_fault() {
        let e = DecideError::from(EngineError::Device("out of memory".into()));
        assert!(
            matches!(&e, DecideError::Engine(inner) if matches!(**inner, EngineError::Device(_)))
        );
        assert_eq!(e.to_string(), "engine: compute device: out of memory");
        assert_eq!(e.kind(), ErrorKind::Internal);
    }

    #[test]
    fn an_over_cap_refusal_names_its_field() {
        let r = Refusal::from(OverCap {
            field: "questions",
            bound: 1024,
            value: 20000,
            parts: 1,
        });
        assert_eq!(r.status(), 413);
        let b = r.body();
        assert_eq!(b["detail"]["error_type"], "invalid_request_error");
        assert_eq!(b["detail"]["field"], "questions");
        assert_eq!(b["detail"]["limit"], 1024);
        assert_eq!(b["detail"]["value"], 20000);
    }
}
