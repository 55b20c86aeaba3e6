//! `ContractError`: a refused request, with the FastAPI body Kev sends; its status comes from the status table
//! ([`crate::problem`], kev-contract §8.5).

use serde_json::{Value, json};

use crate::detail::{ErrorDetail, LocItem};
use crate::problem::{ErrorBody, ErrorKind, WireError};

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
