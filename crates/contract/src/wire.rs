//! The request and answer shapes as typed records, for the API document and for checking bodies against
//! it. Requests are read by [`crate::parse_request`] (Python's `json.loads` and Kev 1.0's validation, which
//! no derived reader reproduces) and answers written by [`crate::shape_answers`] (Python's float text); these
//! types describe the same shapes, and the contract's tests read every fixture request and response through
//! them, so the document cannot drift from the bodies the service reads and writes.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::response::Usage;

/// `POST /v1/systemone`: a state and typed questions about it (other fields are ignored, as Kev 1.0 ignores
/// them).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(as = Request))]
pub struct Request {
    /// Echoed in the response; any string is accepted (default `kev-latest`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(default = "kev-latest"))]
    pub model: Option<String>,
    /// The document: any JSON value, rendered to text.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub state: Value,
    /// The questions (at least one), answered in this order.
    pub questions: BTreeMap<String, Question>,
    /// kev extension: `true` adds `x_logits` (each option's pointer logit before the temperature) to the
    /// response; nothing else in it changes. Other servers ignore the field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub x_logits: Option<bool>,
    /// kev extension: the id of a state pinned with `POST /v1/systemone/states` (by the same API key): it is
    /// the request's `state` (a `state` sent beside it must be the same), and only the questions run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub x_state_id: Option<String>,
    /// kev extension: `high`, `normal` or `low` — the order the server serves requests in (higher first,
    /// lower never starved), capped by the API key's policy; default the key's `default_priority`, else
    /// `normal`. An `X-Kev-Priority` header does the same for clients that cannot add fields.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(pattern = "^(high|normal|low)$"))]
    pub x_priority: Option<String>,
    /// kev extension: milliseconds (1 to 86,400,000) from the request's arrival after which its answer is no use:
    /// still waiting then, it is answered 408 `timeout_error` and never run; running, it is stopped before its
    /// next pass. An `X-Kev-Deadline-Ms` header does the same (the earlier of the two holds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 86_400_000))]
    pub x_deadline_ms: Option<u64>,
}

/// A question about the state (other fields are ignored, as Kev 1.0 ignores them).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Question {
    /// Yes or no: the probability of `true`.
    Noul {
        /// What to decide (any JSON value, rendered to text).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
        instructions: Option<Value>,
        /// Optional descriptions of `true` and `false`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
        criteria: Option<Value>,
    },
    /// One of named options (1 to 255): a probability per option.
    Choice {
        /// What to decide.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
        instructions: Option<Value>,
        /// Option key → its description (any JSON value, or null); 1 to 255 options.
        #[cfg_attr(feature = "openapi", schema(value_type = Object))]
        criteria: Value,
    },
    /// A level on an ordered scale (1 to 255 levels): a probability per level and the expected level.
    Score {
        /// What to decide.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
        instructions: Option<Value>,
        /// The levels, lowest first.
        #[cfg_attr(feature = "openapi", schema(value_type = Vec<Object>, min_items = 1, max_items = 255))]
        criteria: Vec<Value>,
    },
}

/// The 200 body of `POST /v1/systemone`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(as = Response))]
pub struct Response {
    /// The request's `model`, echoed.
    pub model: String,
    /// Question id → its answer, in request order.
    pub answers: BTreeMap<String, Answer>,
    /// Tokens run and counted.
    pub usage: Usage,
    /// Engine time of the request (ms); the server adds it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub x_latency_ms: Option<f64>,
    /// With `--truncate-state`: whether the state was cut to the state limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub x_truncated: Option<bool>,
    /// With `--truncate-state`: the state's tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub x_state_tokens: Option<u64>,
    /// With `--truncate-state`: the state tokens read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub x_state_tokens_used: Option<u64>,
    /// With `x_logits: true` in the request: question id → probability key → the option's pointer logit
    /// `z = (k · q) / sqrt(head_dim)`, before the temperature (unrounded; the probabilities are
    /// `softmax(z / T)`, `T` the model card's temperature or the calibration's for the question's group).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub x_logits: Option<BTreeMap<String, BTreeMap<String, f64>>>,
}

/// One question's answer (probabilities rounded to 4 places).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
pub enum Answer {
    /// The probability of `true`.
    Noul {
        /// P(true).
        noul: f64,
    },
    /// The most probable option and every option's probability.
    Choice {
        /// The most probable option key.
        choice: String,
        /// Its probability.
        confidence: f64,
        /// Option key → probability.
        probabilities: BTreeMap<String, f64>,
    },
    /// The expected level and every level's probability.
    Score {
        /// The expected level (0 = lowest).
        score: f64,
        /// Level index → its text.
        legend: BTreeMap<String, String>,
        /// Level index → probability.
        probabilities: BTreeMap<String, f64>,
        /// Probability of the most probable level.
        confidence: f64,
    },
}

/// `{"detail": […]}`: schema violations, as FastAPI/pydantic report them (422).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(as = ValidationError))]
pub struct ValidationBody {
    /// One entry per violation.
    pub detail: Vec<ValidationItem>,
}

/// One schema violation.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ValidationItem {
    /// pydantic's error type (`missing`, `literal_error`, `json_invalid`, ...).
    #[serde(rename = "type")]
    pub kind: String,
    /// Where: `"body"`, then keys and indices.
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<Object>))]
    pub loc: Vec<Value>,
    /// pydantic's message.
    pub msg: String,
    /// The offending input, echoed.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub input: Value,
    /// Extra context, when pydantic gives one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub ctx: Option<Value>,
}

/// `{"detail": {"error_type", "message", …}}`: every error that is not a validation list.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(as = Error))]
pub struct TypedBody {
    /// The error.
    pub detail: crate::problem::TypedError,
}
