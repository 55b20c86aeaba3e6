//! The Kev 1.0 decision contract, pure: no I/O, no tokenizer, no model (kev-contract spec §2, §3, §7, §8).
//!
//! 1. [`parse_request`] reads a `POST /v1/systemone` body as Python's `json.loads` would and validates it with
//!    Kev 1.0's rules → a [`ValidRequest`] (state text, questions with rendered instructions, option texts,
//!    probability keys, score legend), or a [`ContractError`] with its FastAPI body.
//! 2. [`render`] and [`option_text`] flatten JSON into the text the model reads, with Python's `str`/`repr`/
//!    `lstrip` semantics.
//! 3. [`shape_answers`] turns fp32 probabilities into the `answers` object; [`python_dumps`] writes it as
//!    Python's `json.dumps` does (the text `usage.output_tokens` counts); [`ResponseBody`] writes the 200 body.
//! 4. [`wire`] types the request and answer shapes for the API document; [`problem`] holds the wire shapes of every error answer and the one table of HTTP statuses ([`ErrorKind`]).
#![deny(missing_docs)]

mod answers;
mod dates;
mod detail;
mod error;
pub mod problem;
mod pyfmt;
mod pyjson;
mod render;
mod request;
mod response;
pub mod surrogate;
pub mod wire;

pub use answers::{
    AnswerError, choice_confidence, expected_level, first_argmax, py_sum, score_confidence,
    shape_answers,
};
pub use dates::{date_facts, with_date_facts};
pub use detail::{ErrorDetail, LocItem};
pub use error::ContractError;
pub use problem::{ErrorBody, ErrorKind, ErrorType, TypedError, WireError};
pub use pyfmt::{float_repr, py_float_number, python_dumps, round4};
pub use render::{is_py_space, option_text, py_lstrip, render};
pub use request::{
    DEFAULT_MODEL, MAX_OPTIONS, Question, QuestionKind, ValidRequest, parse_body, parse_request,
    python_loads, refuse_non_json_content, validate,
};
pub use response::{ModelCard, ResponseBody, Usage, compact_json, models_body};
