//! Rows, positions, readout indices and limits (kev-contract §5, §8.4).
//!
//! ```text
//! S        = [<|fim_prefix|>] + user_tokens(render(state))
//! branch_k = [<|fim_middle|>] + user_tokens(instructions_k)
//!            + per option j: [<|box_start|>] + user_tokens(option_text_j) + [<|box_end|>]
//!            + [<|fim_suffix|>]
//! row_k    = S + branch_k, positions 0..len(row_k) (a branch's positions continue after the state)
//! ```
//! Readout indices (into `row_k`): each option's `<|box_end|>`, then the `<|fim_suffix|>` (= `len(row_k) - 1`).

use std::collections::HashMap;
use std::ops::Range;

use kev_contract::{ResponseBody, ValidRequest};
use serde_json::Value;

use crate::error::TokenizeError;
use crate::tokenizer::{DECIDE, KevTokenizer, OPTION_CLOSE, OPTION_OPEN, QUESTION, STATE};

/// Token limits at Kev 1.0 serving (§5.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most state tokens, the `<|fim_prefix|>` included (65,536).
    pub max_state_tokens: usize,
    /// Most tokens of one row, state + branch (73,728 = 65,536 + 8,192); enforced in truncate mode too.
    pub max_row_tokens: usize,
    /// Read only the first `max_state_tokens` of a longer state instead of refusing it
    /// (Kev's `KEV_TRUNCATE_STATES=1`); responses then report [`StateTruncation`].
    pub truncate_state: bool,
}

impl Limits {
    /// Kev 1.0's limits, truncation off.
    pub const KEV: Limits = Limits {
        max_state_tokens: 65_536,
        max_row_tokens: 73_728,
        truncate_state: false,
    };
}

impl Default for Limits {
    fn default() -> Self {
        Limits::KEV
    }
}

/// What truncate mode reports on every response (Kev: `truncated`, `usage.state_tokens`,
/// `usage.state_tokens_used`; here as `x_`-prefixed extensions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateTruncation {
    /// The request's state tokens, delimiter included.
    pub state_tokens: usize,
    /// The state tokens the model reads, delimiter included.
    pub state_tokens_used: usize,
}

impl StateTruncation {
    /// Whether the state was cut.
    pub fn truncated(&self) -> bool {
        self.state_tokens > self.state_tokens_used
    }

    /// Adds `x_truncated`, `x_state_tokens` and `x_state_tokens_used` to a response body.
    pub fn apply(&self, body: ResponseBody) -> ResponseBody {
        body.extra("x_truncated", Value::Bool(self.truncated()))
            .extra("x_state_tokens", Value::from(self.state_tokens))
            .extra("x_state_tokens_used", Value::from(self.state_tokens_used))
    }
}

/// One question's branch: its token ids and readout indices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Branch {
    ids: Vec<u32>,
    offset: usize,
    option_ends: Vec<usize>,
    decide: usize,
}

impl Branch {
    /// The branch tokens (`<|fim_middle|>` … `<|fim_suffix|>`), without the state.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// Number of branch tokens.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Never true: a branch has at least its three delimiters.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Positions of the branch tokens: they continue after the state (`Ls .. Ls + len`).
    pub fn positions(&self) -> Range<usize> {
        self.offset..self.offset + self.ids.len()
    }

    /// Row indices of each option's `<|box_end|>`, in option order.
    pub fn option_ends(&self) -> &[usize] {
        &self.option_ends
    }

    /// Row index of the `<|fim_suffix|>` (the row's last token).
    pub fn decide(&self) -> usize {
        self.decide
    }

    /// Branch-relative indices of each option's `<|box_end|>`.
    pub fn option_ends_in_branch(&self) -> impl Iterator<Item = usize> + '_ {
        self.option_ends.iter().map(|&i| i - self.offset)
    }

    /// Branch-relative index of the `<|fim_suffix|>` (`len - 1`).
    pub fn decide_in_branch(&self) -> usize {
        self.decide - self.offset
    }
}

/// A request compiled into token rows: the state prefix once, one branch per question (request order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompiledRequest {
    state: Vec<u32>,
    branches: Vec<Branch>,
    input_tokens: usize,
    truncation: Option<StateTruncation>,
}

impl CompiledRequest {
    /// `S`: `<|fim_prefix|>` and the state tokens (as used: cut in truncate mode).
    pub fn state_ids(&self) -> &[u32] {
        &self.state
    }

    /// One branch per question, in request order.
    pub fn branches(&self) -> &[Branch] {
        &self.branches
    }

    /// The whole row of question `k` (`S + branch_k`); `None` past the last question.
    pub fn row_ids(&self, k: usize) -> Option<Vec<u32>> {
        let b = self.branches.get(k)?;
        let mut row = Vec::with_capacity(self.state.len() + b.ids.len());
        row.extend_from_slice(&self.state);
        row.extend_from_slice(&b.ids);
        Some(row)
    }

    /// `usage.input_tokens`: the state once plus every branch (§8.4).
    pub fn input_tokens(&self) -> usize {
        self.input_tokens
    }

    /// In truncate mode, the state counts every response reports; `None` when truncation is off.
    pub fn truncation(&self) -> Option<StateTruncation> {
        self.truncation
    }
}

/// Token ids of each distinct text, computed once per request.
struct Memo<'a, 't> {
    tok: &'t KevTokenizer,
    seen: HashMap<&'a str, Vec<u32>>,
}

impl<'a> Memo<'a, '_> {
    fn get(&mut self, text: &'a str) -> Result<&[u32], TokenizeError> {
        if !self.seen.contains_key(text) {
            let ids = self.tok.user_tokens(text)?;
            self.seen.insert(text, ids);
        }
        Ok(self.seen.get(text).map(Vec::as_slice).unwrap_or(&[]))
    }
}

impl KevTokenizer {
    /// Compile a validated request into rows (§5.1), enforcing the limits (§5.2): the state first, then each
    /// question's row in request order (the first one over the limit is reported).
    pub fn compile(
        &self,
        req: &ValidRequest,
        limits: &Limits,
    ) -> Result<CompiledRequest, TokenizeError> {
        self.compile_capped(req, limits, usize::MAX)
    }

    /// [`Self::compile`] that also refuses a request of more than `max_input_tokens` input tokens (the state
    /// once plus every branch, as `usage.input_tokens` counts them) with [`TokenizeError::TooMuchWork`], and
    /// stops tokenizing as soon as a limit is certainly exceeded: a state far over the state limit is refused
    /// after reading about as much of it as the limit allows, not after tokenizing all of it.
    pub fn compile_capped(
        &self,
        req: &ValidRequest,
        limits: &Limits,
        max_input_tokens: usize,
    ) -> Result<CompiledRequest, TokenizeError> {
        if !limits.truncate_state
            && let Some(at_least) =
                self.certainly_over(req.rendered_state(), limits.max_state_tokens)
        {
            return Err(TokenizeError::StateFarTooLong {
                at_least,
                limit: limits.max_state_tokens,
            });
        }
        let state_text = self.user_tokens(req.rendered_state())?;
        let full = 1 + state_text.len();
        let keep = if full > limits.max_state_tokens {
            if !limits.truncate_state {
                return Err(TokenizeError::StateTooLong {
                    tokens: full,
                    limit: limits.max_state_tokens,
                });
            }
            limits.max_state_tokens.saturating_sub(1)
        } else {
            state_text.len()
        };
        let mut state = Vec::with_capacity(1 + keep);
        state.push(STATE);
        state.extend_from_slice(&state_text[..keep]);
        drop(state_text);
        let ls = state.len();
        let truncation = limits.truncate_state.then_some(StateTruncation {
            state_tokens: full,
            state_tokens_used: ls,
        });

        let mut memo = Memo {
            tok: self,
            seen: HashMap::new(),
        };
        let mut branches = Vec::with_capacity(req.questions().len());
        let mut input_tokens = ls;
        for q in req.questions() {
            let mut ids = vec![QUESTION];
            ids.extend_from_slice(memo.get(q.instructions())?);
            let mut option_ends = Vec::with_capacity(q.options().len());
            for text in q.options() {
                ids.push(OPTION_OPEN);
                ids.extend_from_slice(memo.get(text)?);
                ids.push(OPTION_CLOSE);
                option_ends.push(ls + ids.len() - 1);
            }
            ids.push(DECIDE);
            if ls + ids.len() > limits.max_row_tokens {
                return Err(TokenizeError::BranchTooLong {
                    question: q.id().to_owned(),
                    branch_tokens: ids.len(),
                    state_tokens: ls,
                    row_limit: limits.max_row_tokens,
                });
            }
            input_tokens += ids.len();
            if input_tokens > max_input_tokens {
                return Err(TokenizeError::TooMuchWork {
                    at_least: input_tokens,
                    limit: max_input_tokens,
                });
            }
            let decide = ls + ids.len() - 1;
            branches.push(Branch {
                ids,
                offset: ls,
                option_ends,
                decide,
            });
        }
        Ok(CompiledRequest {
            state,
            branches,
            input_tokens,
            truncation,
        })
    }
}
