//! Kev 1.0 request validation (kev-contract §2.1) and the validated request (§3.2 options, keys, legend).
//!
//! The rules and the 422 entries are those of Kev 1.0's pydantic models under FastAPI: `SystemOneRequest`
//! (`state` required, any JSON; `model: str = "kev-latest"`; `questions: dict[str, Noul | Choice | Score]` with at
//! least one entry), validated as a *smart union*: a question that fits no member gets the errors of every member,
//! in member order, each under the member's tag (`Noul`, `function-after[_check(), Choice]`, `Score`).

use serde_json::{Map, Value, json};

use crate::detail::{ErrorDetail, LocItem};
use crate::error::ContractError;
use crate::pyjson::{self, JsonFailure};
use crate::render::{option_text, render};

/// The model name a request gets when it names none.
pub const DEFAULT_MODEL: &str = "kev-latest";

/// Most options of a choice question and levels of a score question.
pub const MAX_OPTIONS: usize = 255;

const TAG_NOUL: &str = "Noul";
const TAG_CHOICE: &str = "function-after[_check(), Choice]";
const TAG_SCORE: &str = "Score";

/// The three question types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuestionKind {
    /// Yes/no: options `no`, `yes`; the answer is P(yes).
    Noul,
    /// One of named options.
    Choice,
    /// An ordered scale of levels `0..n`.
    Score,
}

impl QuestionKind {
    /// The wire name (`"noul"`, `"choice"`, `"score"`).
    pub fn as_str(self) -> &'static str {
        match self {
            QuestionKind::Noul => "noul",
            QuestionKind::Choice => "choice",
            QuestionKind::Score => "score",
        }
    }
}

/// One validated question, with everything the tokenizer and the answer shaper need.
#[derive(Debug, Clone, PartialEq)]
pub struct Question {
    id: String,
    kind: QuestionKind,
    instructions: String,
    options: Vec<String>,
    keys: Vec<String>,
}

impl Question {
    /// The question's id (its key in `questions`; any string).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Noul, choice or score.
    pub fn kind(&self) -> QuestionKind {
        self.kind
    }

    /// `render(instructions)` (`""` when absent or null).
    pub fn instructions(&self) -> &str {
        &self.instructions
    }

    /// Option texts in option order (§3.2): noul `[no…, yes…]`, choice `name` / `name: description`, score the
    /// rendered levels.
    pub fn options(&self) -> &[String] {
        &self.options
    }

    /// Probability keys in option order: `["false", "true"]`, the choice names, or `"0".."n-1"`.
    pub fn keys(&self) -> &[String] {
        &self.keys
    }

    /// Score questions: the legend `{"i": render(level_i)}` as (key, text) pairs in level order.
    pub fn legend(&self) -> Option<impl Iterator<Item = (&str, &str)>> {
        (self.kind == QuestionKind::Score).then(|| {
            self.keys
                .iter()
                .map(String::as_str)
                .zip(self.options.iter().map(String::as_str))
        })
    }
}

/// A request that passed Kev 1.0 validation. Only [`parse_request`] and [`validate`] make one.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidRequest {
    model: String,
    state: Value,
    rendered_state: String,
    questions: Vec<Question>,
}

impl ValidRequest {
    /// The model name as sent (echoed in the response; not checked against any list), default `kev-latest`.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// The state value as sent (key order and number text kept).
    pub fn state(&self) -> &Value {
        &self.state
    }

    /// `render(state)`: the state text the model reads.
    pub fn rendered_state(&self) -> &str {
        &self.rendered_state
    }

    /// The questions in request order (at least one).
    pub fn questions(&self) -> &[Question] {
        &self.questions
    }

    /// The request with the date facts added to its state ([`crate::with_date_facts`]), re-rendered.
    pub fn with_date_facts(mut self) -> Self {
        self.state = crate::dates::with_date_facts(&self.state);
        self.rendered_state = render(&self.state);
        self
    }
}

/// Parse and validate a `POST /v1/systemone` body (bytes as received, after any content decoding).
///
/// The body is read as Python's `json.loads` would; an empty body is FastAPI's "body missing" error.
pub fn parse_request(body: &[u8]) -> Result<ValidRequest, ContractError> {
    validate(parse_body(body)?)
}

/// The body as a JSON value, read as Python's `json.loads` would, not yet validated (so that a server can
/// look at its size, e.g. count its questions, before validating it; then [`validate`]).
pub fn parse_body(body: &[u8]) -> Result<Value, ContractError> {
    if body.is_empty() {
        return Err(missing_body());
    }
    pyjson::loads(body).map_err(|f| match f {
        JsonFailure::Decode { pos, msg } => ContractError::InvalidJson {
            position: pos,
            message: msg,
        },
        JsonFailure::Unreadable(reason) => ContractError::Unparseable { reason },
    })
}

/// What Kev's FastAPI answers for a body sent with a Content-Type that is not `application/json` (or `+json`):
/// the body is not parsed, and the raw text fails the model (`model_attributes_type`, the text echoed; an empty
/// body is "missing"). Always an error.
pub fn refuse_non_json_content(body: &[u8]) -> ContractError {
    if body.is_empty() {
        return missing_body();
    }
    let mut errors = Errors::default();
    errors.push(
        &[],
        "model_attributes_type",
        "Input should be a valid dictionary or object to extract fields from",
        Value::String(String::from_utf8_lossy(body).into_owned()),
        None,
    );
    ContractError::Invalid(errors.0)
}

fn missing_body() -> ContractError {
    ContractError::Invalid(vec![ErrorDetail {
        kind: "missing".into(),
        loc: vec![LocItem::Key("body".into())],
        msg: "Field required".into(),
        input: Value::Null,
        ctx: None,
    }])
}

/// [`parse_body`] under the name the request-rewriting tools use: a value that writes back to JSON which
/// reads and renders the same (`NaN` → `"nan"`, `Infinity` → `1e400`), so a tool may split questions or
/// reorder options before the request is answered.
pub fn python_loads(body: &[u8]) -> Result<Value, ContractError> {
    parse_body(body)
}

/// Validate an already-parsed body against the Kev 1.0 rules (kev-contract §2.1).
pub fn validate(body: Value) -> Result<ValidRequest, ContractError> {
    let mut errors = Errors::default();
    let Value::Object(mut fields) = body else {
        errors.push(
            &[],
            "model_attributes_type",
            "Input should be a valid dictionary or object to extract fields from",
            body,
            None,
        );
        return Err(ContractError::Invalid(errors.0));
    };

    // Fields in the model's declaration order, which is the order of the errors: state, model, questions.
    if !fields.contains_key("state") {
        errors.push(
            &["state"],
            "missing",
            "Field required",
            Value::Object(fields.clone()),
            None,
        );
    }
    match fields.get("model") {
        None | Some(Value::String(_)) => {}
        Some(other) => errors.push(
            &["model"],
            "string_type",
            "Input should be a valid string",
            other.clone(),
            None,
        ),
    }
    let mut questions = Vec::new();
    match fields.get("questions") {
        None => errors.push(
            &["questions"],
            "missing",
            "Field required",
            Value::Object(fields.clone()),
            None,
        ),
        Some(Value::Object(map)) => {
            for (id, q) in map {
                if let Some(question) = question(id, q, &mut errors) {
                    questions.push(question);
                }
            }
            if map.is_empty() {
                errors.push(
                    &["questions"],
                    "too_short",
                    "Dictionary should have at least 1 item after validation, not 0",
                    Value::Object(Map::new()),
                    Some(json!({"field_type": "Dictionary", "min_length": 1, "actual_length": 0})),
                );
            }
        }
        Some(other) => errors.push(
            &["questions"],
            "dict_type",
            "Input should be a valid dictionary",
            other.clone(),
            None,
        ),
    }
    if !errors.0.is_empty() {
        return Err(ContractError::Invalid(errors.0));
    }

    let model = match fields.remove("model") {
        Some(Value::String(m)) => m,
        _ => DEFAULT_MODEL.to_owned(),
    };
    let state = fields.remove("state").unwrap_or(Value::Null);
    let rendered_state = render(&state);
    Ok(ValidRequest {
        model,
        state,
        rendered_state,
        questions,
    })
}

#[derive(Default)]
struct Errors(Vec<ErrorDetail>);

impl Errors {
    fn push(&mut self, loc: &[&str], kind: &str, msg: &str, input: Value, ctx: Option<Value>) {
        let mut full = Vec::with_capacity(loc.len() + 1);
        full.push(LocItem::Key("body".into()));
        full.extend(loc.iter().map(|k| LocItem::Key((*k).to_owned())));
        self.0.push(ErrorDetail {
            kind: kind.into(),
            loc: full,
            msg: msg.into(),
            input,
            ctx,
        });
    }
}

/// Validate one question against the union `Noul | Choice | Score`; on failure, every member's errors.
fn question(id: &str, q: &Value, errors: &mut Errors) -> Option<Question> {
    let Value::Object(fields) = q else {
        for tag in [TAG_NOUL, TAG_CHOICE, TAG_SCORE] {
            errors.push(
                &["questions", id, tag],
                "model_attributes_type",
                "Input should be a valid dictionary or object to extract fields from",
                q.clone(),
                None,
            );
        }
        return None;
    };
    let mut member_errors = Errors::default();
    for kind in [
        QuestionKind::Noul,
        QuestionKind::Choice,
        QuestionKind::Score,
    ] {
        match member(kind, id, fields, q, &mut member_errors) {
            Some(question) => return Some(question),
            None => continue,
        }
    }
    errors.0.append(&mut member_errors.0);
    None
}

/// One union member: its field errors in declaration order (type, instructions, criteria), then, for Choice,
/// the after-validator.
fn member(
    kind: QuestionKind,
    id: &str,
    fields: &Map<String, Value>,
    whole: &Value,
    errors: &mut Errors,
) -> Option<Question> {
    let tag = match kind {
        QuestionKind::Noul => TAG_NOUL,
        QuestionKind::Choice => TAG_CHOICE,
        QuestionKind::Score => TAG_SCORE,
    };
    let before = errors.0.len();
    let wanted = kind.as_str();
    match fields.get("type") {
        None => errors.push(
            &["questions", id, tag, "type"],
            "missing",
            "Field required",
            whole.clone(),
            None,
        ),
        Some(Value::String(t)) if t == wanted => {}
        Some(other) => errors.push(
            &["questions", id, tag, "type"],
            "literal_error",
            &format!("Input should be '{wanted}'"),
            other.clone(),
            Some(json!({ "expected": format!("'{wanted}'") })),
        ),
    }
    let criteria = fields.get("criteria");
    let criteria_loc = ["questions", id, tag, "criteria"];
    match (kind, criteria) {
        (QuestionKind::Noul, None | Some(Value::Null) | Some(Value::Object(_))) => {}
        (QuestionKind::Choice, Some(Value::Object(_))) => {}
        (QuestionKind::Choice | QuestionKind::Score, None) => errors.push(
            &criteria_loc,
            "missing",
            "Field required",
            whole.clone(),
            None,
        ),
        (QuestionKind::Noul | QuestionKind::Choice, Some(other)) => errors.push(
            &criteria_loc,
            "dict_type",
            "Input should be a valid dictionary",
            other.clone(),
            None,
        ),
        (QuestionKind::Score, Some(Value::Array(levels))) => {
            let n = levels.len();
            if n == 0 {
                errors.push(
                    &criteria_loc,
                    "too_short",
                    "List should have at least 1 item after validation, not 0",
                    Value::Array(Vec::new()),
                    Some(json!({"field_type": "List", "min_length": 1, "actual_length": 0})),
                );
            } else if n > MAX_OPTIONS {
                errors.push(
                    &criteria_loc,
                    "too_long",
                    &format!("List should have at most {MAX_OPTIONS} items after validation, not {n}"),
                    Value::Array(levels.clone()),
                    Some(json!({"field_type": "List", "max_length": MAX_OPTIONS, "actual_length": n})),
                );
            }
        }
        (QuestionKind::Score, Some(other)) => errors.push(
            &criteria_loc,
            "list_type",
            "Input should be a valid list",
            other.clone(),
            None,
        ),
    }
    if errors.0.len() > before {
        return None;
    }
    if kind == QuestionKind::Choice {
        let n = criteria.and_then(Value::as_object).map_or(0, Map::len);
        if !(1..=MAX_OPTIONS).contains(&n) {
            errors.push(
                &["questions", id, tag],
                "value_error",
                &format!("Value error, criteria must have 1..{MAX_OPTIONS} options"),
                whole.clone(),
                Some(json!({ "error": {} })),
            );
            return None;
        }
    }
    Some(build(kind, id, fields))
}

/// The validated question: rendered instructions, option texts and keys (kev-contract §3.2).
fn build(kind: QuestionKind, id: &str, fields: &Map<String, Value>) -> Question {
    let instructions = fields.get("instructions").map(render).unwrap_or_default();
    let criteria = fields.get("criteria");
    let (options, keys) = match kind {
        QuestionKind::Noul => {
            let c = criteria.and_then(Value::as_object);
            let side = |k: &str| c.and_then(|c| c.get(k));
            (
                vec![
                    option_text("no", side("false")),
                    option_text("yes", side("true")),
                ],
                vec!["false".to_owned(), "true".to_owned()],
            )
        }
        QuestionKind::Choice => criteria
            .and_then(Value::as_object)
            .map(|c| {
                c.iter()
                    .map(|(name, desc)| (option_text(name, Some(desc)), name.clone()))
                    .unzip()
            })
            .unwrap_or_default(),
        QuestionKind::Score => criteria
            .and_then(Value::as_array)
            .map(|levels| {
                levels
                    .iter()
                    .enumerate()
                    .map(|(i, level)| (render(level), i.to_string()))
                    .unzip()
            })
            .unwrap_or_default(),
    };
    Question {
        id: id.to_owned(),
        kind,
        instructions,
        options,
        keys,
    }
}
