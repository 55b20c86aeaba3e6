//! The Kev tokenizer pipeline (kev-contract §1, §4, §5, §8.4): a `tokenizer.json` checked at load, caller text
//! made unable to forge delimiters, token rows with readout indices, the token limits, and usage counts.
//!
//! 1. [`KevTokenizer::from_file`] loads the Kev `tokenizer.json` (Qwen2 split regex), or a base Qwen3.5 file
//!    whose split regex it switches to the Kev one (§4.2a); it verifies the five delimiter ids, `<|endoftext|>` and
//!    the 248,077-id vocabulary.
//! 2. [`KevTokenizer::user_tokens`] rewrites `<|name|>` to `<¦name¦>` and encodes without additions (§4.1).
//! 3. [`KevTokenizer::compile`] turns a [`kev_contract::ValidRequest`] into a [`CompiledRequest`]: the state
//!    prefix `S` once, one branch per question, readout indices, `input_tokens`; over a limit it is a
//!    [`TokenizeError`] that knows its 422 body (§5.2).
//! 4. [`KevTokenizer::output_tokens`] counts Python's `json.dumps(answers)` with the plain tokenizer (§8.4).
#![deny(missing_docs)]

mod compile;
mod error;
mod rewrite;
mod tokenizer;

pub use compile::{Branch, CompiledRequest, Limits, StateTruncation};
pub use error::{LoadError, TokenizeError};
pub use rewrite::neutralize_delimiters;
pub use tokenizer::{
    DECIDE, ENDOFTEXT, KevTokenizer, OPTION_CLOSE, OPTION_OPEN, PreTokenizerVariant, QUESTION,
    STATE, VOCAB_SIZE,
};
