//! Errors: loading a tokenizer (start-up faults) and compiling a request (client errors over a limit, or an
//! encoder failure).

use std::path::PathBuf;

use kev_contract::{ErrorBody, ErrorKind, WireError};
use serde_json::Value;

/// A `tokenizer.json` that cannot serve Kev.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file could not be read.
    #[error("cannot read tokenizer file {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not a tokenizer the `tokenizers` crate can build.
    #[error("cannot parse tokenizer file {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        message: String,
    },
    /// A special token has another id than Kev's (or is missing): not the Qwen3.5 vocabulary.
    #[error("token {token} has id {found:?}, Kev needs {expected}: not the Qwen3.5 tokenizer")]
    TokenId {
        /// The token's text.
        token: &'static str,
        /// Kev's id.
        expected: u32,
        /// The file's id (`None`: absent).
        found: Option<u32>,
    },
    /// The vocabulary (with added tokens) is not 248,077 ids.
    #[error("vocabulary has {found} ids, Kev needs {expected}: not the Qwen3.5 tokenizer")]
    VocabSize {
        /// 248,077.
        expected: usize,
        /// The file's size.
        found: usize,
    },
    /// The pre-tokenizer is neither the Kev (Qwen2 regex) nor the base (Qwen3.5 regex) pipeline.
    #[error("unrecognised pre-tokenizer: {0}")]
    PreTokenizer(String),
}

/// A request that cannot be compiled into rows.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TokenizeError {
    /// The state is over the state limit (and truncation is off): 422.
    #[error("{}", state_message(*.tokens, *.limit))]
    StateTooLong {
        /// State tokens including the `<|fim_prefix|>` delimiter.
        tokens: usize,
        /// The limit (65,536).
        limit: usize,
    },
    /// A question's row (state + branch) is over the row limit: 422, also in truncate mode.
    #[error(
        "branch too long: {branch_tokens} tokens with a {state_tokens}-token state (row limit {row_limit})"
    )]
    BranchTooLong {
        /// The question's id.
        question: String,
        /// Tokens of the branch (delimiters included).
        branch_tokens: usize,
        /// Tokens of the state prefix (as used).
        state_tokens: usize,
        /// The row limit (73,728).
        row_limit: usize,
    },
    /// The state is so far over the state limit that it was not tokenized to its end: 422.
    #[error(
        "state is over the {}-token limit (the <state> token included): its first part alone is {} tokens; \
         shorten the document or split it across requests",
        thousands(*.limit),
        thousands(*.at_least)
    )]
    StateFarTooLong {
        /// Tokens counted before giving up (a lower bound of the state's length).
        at_least: usize,
        /// The limit (65,536).
        limit: usize,
    },
    /// The request's input tokens (state once + every branch) are over the server's per-request cap: 413.
    #[error(
        "too much work in one request: input_tokens (the state once plus every question's branch) is at least {}, over the limit of {}; split the questions across requests",
        thousands(*.at_least),
        thousands(*.limit)
    )]
    TooMuchWork {
        /// Input tokens counted when the cap was passed.
        at_least: usize,
        /// The cap.
        limit: usize,
    },
    /// The encoder failed (not expected for any text; a server fault).
    #[error("tokenizer failed: {0}")]
    Encode(String),
}

/// Kev 1.0's message for an over-long state (kev-contract §5.2), with its thousands separators.
fn state_message(tokens: usize, limit: usize) -> String {
    format!(
        "state is {} tokens, over the {}-token limit (the <state> token included): shorten the document or split it \
         across requests; or start the server with KEV_TRUNCATE_STATES=1 to read only its first {} tokens \
         (responses then say truncated: true)",
        thousands(tokens),
        thousands(limit),
        thousands(limit)
    )
}

/// Python's `f"{n:,}"`.
fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

impl TokenizeError {
    /// HTTP status: 422 for a token limit, 413 for the per-request work cap, 500 for an encoder fault (the
    /// status table's rows, [`kev_contract::problem`]).
    pub fn status(&self) -> u16 {
        self.kind().status()
    }

    /// The response body: `{"detail": {"error_type", "message"}}`.
    pub fn body(&self) -> Value {
        self.error_body().to_value()
    }
}

impl WireError for TokenizeError {
    fn kind(&self) -> ErrorKind {
        match self {
            TokenizeError::StateTooLong { .. }
            | TokenizeError::StateFarTooLong { .. }
            | TokenizeError::BranchTooLong { .. } => ErrorKind::OverLimit,
            TokenizeError::TooMuchWork { .. } => ErrorKind::TooMuchWork,
            TokenizeError::Encode(_) => ErrorKind::Internal,
        }
    }

    fn error_body(&self) -> ErrorBody {
        ErrorBody::typed(self.kind(), self.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_match_kev() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(65536), "65,536");
        assert_eq!(thousands(1234567), "1,234,567");
        let e = TokenizeError::StateTooLong {
            tokens: 70000,
            limit: 65536,
        };
        assert_eq!(
            e.to_string(),
            "state is 70,000 tokens, over the 65,536-token limit (the <state> token included): shorten the document \
             or split it across requests; or start the server with KEV_TRUNCATE_STATES=1 to read only its first \
             65,536 tokens (responses then say truncated: true)"
        );
        assert_eq!(e.status(), 422);
        assert_eq!(e.body()["detail"]["error_type"], "invalid_request_error");
        let b = TokenizeError::BranchTooLong {
            question: "q".into(),
            branch_tokens: 9000,
            state_tokens: 65000,
            row_limit: 73728,
        };
        assert_eq!(
            b.to_string(),
            "branch too long: 9000 tokens with a 65000-token state (row limit 73728)"
        );
    }
}
