//! Admission: a request → a compiled [`Job`], or the [`Refusal`] that says why not. Every front end admits
//! here (`kev decide`, `kev serve`, the Python package), so the work caps, the service options (date facts)
//! and pinned states apply the same everywhere.
//!
//! A request is read **once**. It arrives as bytes a client sent ([`Body::Bytes`]: its questions counted by
//! a cheap scan first, so a body far over the question cap is refused before it is parsed in full, then read
//! as Python's `json.loads` reads it) or as a value already read out of a larger body ([`Body::Value`]: a
//! batch entry, one part of a fan-out), never written back to bytes and read again. On that one reading:
//! `x_state_id` ([`STATE_ID_FIELD`]) — a key the JSON reader has unescaped, however it was spelled — puts the
//! caller's pinned state in as the request's `state` (404 for a pin that is not the caller's, 422 beside a
//! different `state`); `x_logits` is read ([`LOGITS_FIELD`]); then the contract's validation, the caps and
//! the tokenizer.

use std::borrow::Cow;

use kev_contract::{ContractError, ErrorDetail, LocItem, ValidRequest};
use kev_engine::Backend;
use kev_tokenize::TokenizeError;
use serde_json::{Value, json};

use crate::pinned::{PinOrder, PinRefusal, STATE_ID_FIELD};
use crate::service::{Caps, Job, Kev, LOGITS_FIELD, OverCap, Refusal};

/// A request as admission takes it.
#[derive(Debug, Clone, PartialEq)]
pub enum Body<'a> {
    /// As a client sent it.
    Bytes(Cow<'a, [u8]>),
    /// Already read out of a larger body (a batch entry, a fan-out's part).
    Value(Value),
}

impl<'a> Body<'a> {
    /// Bytes a client sent.
    pub fn bytes(b: impl Into<Cow<'a, [u8]>>) -> Self {
        Body::Bytes(b.into())
    }

    /// As bytes (a value written with `compact_json`, lone surrogates as `\uXXXX`): for a stand-in that
    /// reads bytes only, never on kev's own path.
    pub fn into_bytes(self) -> Cow<'a, [u8]> {
        match self {
            Body::Bytes(b) => b,
            Body::Value(v) => Cow::Owned(kev_contract::compact_json(&v).into_bytes()),
        }
    }

    /// Its question count as the full reader sees it, where that is cheap to know (see [`crate::prescan`]).
    fn question_count(&self) -> Option<usize> {
        match self {
            Body::Bytes(b) => crate::prescan::question_count(b),
            Body::Value(v) => v
                .get("questions")
                .and_then(Value::as_object)
                .map(|q| q.len()),
        }
    }

    /// The JSON value (the one parse of a body sent as bytes).
    fn read(self) -> Result<Value, Refusal> {
        match self {
            Body::Bytes(b) => Ok(kev_contract::parse_body(&b)?),
            Body::Value(v) => Ok(v),
        }
    }
}

/// Whether `body` asks for the logits (its [`LOGITS_FIELD`]); 422 for a value that is not a JSON boolean.
pub fn asks_for_logits(body: &Value) -> Result<bool, Refusal> {
    match body.get(LOGITS_FIELD) {
        None | Some(Value::Bool(false)) => Ok(false),
        Some(Value::Bool(true)) => Ok(true),
        Some(other) => Err(Refusal::Contract(ContractError::Invalid(vec![
            ErrorDetail {
                kind: "bool_type".into(),
                loc: vec![
                    LocItem::Key("body".into()),
                    LocItem::Key(LOGITS_FIELD.into()),
                ],
                msg: "Input should be a valid boolean".into(),
                input: other.clone(),
                ctx: None,
            },
        ]))),
    }
}

impl<B: Backend> Kev<B> {
    /// Validate and compile a request body: the work caps first (the question count before the body is parsed
    /// in full), the date facts when the settings ask for them, then the rows, tokenizing stopped at the first
    /// limit passed. No caller: a request naming a pinned state finds none.
    pub fn admit(&self, body: &[u8]) -> Result<Job, Refusal> {
        self.admit_as(Body::bytes(body), None)
    }

    /// [`Kev::admit`] for `owner` (the API key's name): a request naming one of `owner`'s pinned states gets
    /// it as its state.
    pub fn admit_as(&self, body: Body<'_>, owner: Option<&str>) -> Result<Job, Refusal> {
        let mut tally = Tally::new(self.settings().caps, 1);
        self.admit_part(body, owner, &mut tally)
    }

    /// Admit several bodies as the parts of one request (a fan-out: `/v1/systemone/permute`, `/separate`):
    /// each part is admitted as a request of its own, and the work caps hold for the parts *together* (a 413
    /// names the cap and the parts' total). All or nothing: one refused part refuses them all.
    pub fn admit_parts<T: AsRef<[u8]>>(&self, bodies: &[T]) -> Result<Vec<Job>, Refusal> {
        let bodies = bodies.iter().map(|b| Body::bytes(b.as_ref())).collect();
        self.admit_parts_as(bodies, None)
    }

    /// [`Kev::admit_parts`] for `owner`.
    pub fn admit_parts_as(
        &self,
        bodies: Vec<Body<'_>>,
        owner: Option<&str>,
    ) -> Result<Vec<Job>, Refusal> {
        let mut tally = Tally::new(self.settings().caps, bodies.len());
        // Every part's question count first (a cheap scan), so that an oversized fan-out parses nothing.
        for body in &bodies {
            if let Some(n) = body.question_count() {
                tally.add_questions(n)?;
            }
        }
        tally.questions = 0;
        bodies
            .into_iter()
            .map(|b| self.admit_part(b, owner, &mut tally))
            .collect()
    }

    /// Admit the independent requests of one batch: each on its own (its own caps; a refused one is its own
    /// `Err` and never fails the others), the batch as a whole held to [`Caps::max_batch_requests`] and
    /// [`Caps::max_batch_input_tokens`] over its admitted requests (the outer `Err`, 413: nothing runs).
    pub fn admit_batch<T: AsRef<[u8]>>(
        &self,
        bodies: &[T],
    ) -> Result<Vec<Result<Job, Refusal>>, Refusal> {
        let bodies = bodies.iter().map(|b| Body::bytes(b.as_ref())).collect();
        self.admit_batch_as(bodies, None)
    }

    /// [`Kev::admit_batch`] for `owner`: an entry naming a pinned state that is not `owner`'s is refused in
    /// its place (404), as it would be alone.
    pub fn admit_batch_as(
        &self,
        bodies: Vec<Body<'_>>,
        owner: Option<&str>,
    ) -> Result<Vec<Result<Job, Refusal>>, Refusal> {
        let caps = self.settings().caps;
        let n = bodies.len();
        let over = |field, bound, value| {
            Refusal::from(OverCap {
                field,
                bound,
                value,
                parts: n,
            })
        };
        if n > caps.max_batch_requests {
            return Err(over("requests", caps.max_batch_requests, n));
        }
        let mut tokens = 0usize;
        let mut out = Vec::with_capacity(n);
        for body in bodies {
            let admitted = self.admit_as(body, owner);
            if let Ok(job) = &admitted {
                tokens += job.tokens();
                if tokens > caps.max_batch_input_tokens {
                    return Err(over(
                        "batch_input_tokens",
                        caps.max_batch_input_tokens,
                        tokens,
                    ));
                }
            }
            out.push(admitted);
        }
        Ok(out)
    }

    fn admit_part(
        &self,
        body: Body<'_>,
        owner: Option<&str>,
        tally: &mut Tally,
    ) -> Result<Job, Refusal> {
        if let Some(n) = body.question_count() {
            tally.check_questions(n)?;
        }
        let value = body.read()?;
        // The question cap before validation, which renders every question (again here for the bodies
        // the pre-scan leaves to the full reader).
        if let Some(n) = value
            .get("questions")
            .and_then(Value::as_object)
            .map(|q| q.len())
        {
            tally.check_questions(n)?;
        }
        let value = self.with_pinned_state(value, owner)?;
        let logits = asks_for_logits(&value)?;
        let urgency = crate::urgency::read(&value)?;
        let request = kev_contract::validate(value)?;
        Ok(self
            .compile(request, tally)?
            .with_logits(logits)
            .with_urgency(urgency))
    }

    /// A request naming a pinned state ([`STATE_ID_FIELD`]) with that state put in as its `state`, for
    /// `owner`'s pins only; any other request as it is.
    fn with_pinned_state(&self, value: Value, owner: Option<&str>) -> Result<Value, Refusal> {
        let Value::Object(mut fields) = value else {
            return Ok(value);
        };
        let Some(id) = fields.remove(STATE_ID_FIELD) else {
            return Ok(Value::Object(fields));
        };
        let Value::String(id) = id else {
            return Err(Refusal::Contract(ContractError::Invalid(vec![
                ErrorDetail {
                    kind: "string_type".into(),
                    loc: vec![
                        LocItem::Key("body".into()),
                        LocItem::Key(STATE_ID_FIELD.into()),
                    ],
                    msg: "Input should be a valid string".into(),
                    input: id,
                    ctx: None,
                },
            ])));
        };
        let state = self
            .pinned()
            .state(&id, owner)
            .ok_or_else(|| PinRefusal::NotFound(id.clone()))?;
        if fields.get("state").is_some_and(|s| *s != state) {
            return Err(PinRefusal::OtherState(id).into());
        }
        fields.insert("state".into(), state);
        Ok(Value::Object(fields))
    }

    /// Refuse a body over the question cap before it is parsed in full (413): a cheap scan counts its
    /// questions as the full reader would (see [`crate::prescan`]). Bodies the scan cannot read pass; the
    /// full reader and [`Kev::admit_request`] judge them.
    pub fn precheck(&self, body: &[u8]) -> Result<(), Refusal> {
        match crate::prescan::question_count(body) {
            Some(n) => Tally::new(self.settings().caps, 1).check_questions(n),
            None => Ok(()),
        }
    }

    /// Compile an already validated request (with its date facts, when the settings ask for them): the question
    /// and option caps first (nothing tokenized yet), then the rows, tokenizing stopped at the first limit
    /// passed.
    pub fn admit_request(&self, request: ValidRequest) -> Result<Job, Refusal> {
        self.compile(request, &mut Tally::new(self.settings().caps, 1))
    }

    fn compile(&self, request: ValidRequest, tally: &mut Tally) -> Result<Job, Refusal> {
        let adapter = self.resolve_model(request.model())?;
        let request = if self.settings().date_facts {
            request.with_date_facts()
        } else {
            request
        };
        tally.add_questions(request.questions().len())?;
        tally.add_options(request.questions().iter().map(|q| q.options().len()).sum())?;
        let compiled = self
            .tokenizer()
            .compile_capped(&request, &self.settings().limits, tally.tokens_left())
            .map_err(|e| match e {
                TokenizeError::TooMuchWork { at_least, .. } => tally.over_tokens(at_least),
                e => Refusal::from(e),
            })?;
        tally.tokens += compiled.input_tokens();
        Ok(Job::new(request, compiled, adapter))
    }

    /// Admit a state to pin (`POST /v1/systemone/states`): `body` is `{model?, state, x_logits?}` (the
    /// `ttl_s` and the rest are the front end's); the state is admitted as a request of one yes/no question
    /// (its answer is not used) whose task keeps its prefix snapshot under `order.id` once it is made. Refused
    /// as that request would be (422 for a bad state or `x_logits`, 413 over the caps); 422 for a body without
    /// a state; 429 / 413 when its estimated bytes do not fit the owner's share or the budget (nothing runs).
    /// The pin exists only once [`crate::pinned::PinnedStates::commit`] is called for its answer; the front
    /// end calls [`crate::pinned::PinnedStates::abandon`] for a request that ends otherwise.
    pub fn admit_pin(&self, body: Body<'_>, order: &PinOrder) -> Result<Job, Refusal> {
        let value = body.read()?;
        asks_for_logits(&value)?;
        let Some(state) = value.get("state").cloned() else {
            return Err(Refusal::Contract(ContractError::Invalid(vec![
                ErrorDetail {
                    kind: "missing".into(),
                    loc: vec![LocItem::Key("body".into()), LocItem::Key("state".into())],
                    msg: "Field required".into(),
                    input: value.clone(),
                    ctx: None,
                },
            ])));
        };
        let mut request = serde_json::Map::new();
        if let Some(m) = value.get("model") {
            request.insert("model".into(), m.clone());
        }
        request.insert("state".into(), state.clone());
        request.insert("questions".into(), json!({"pinned": {"type": "noul"}}));
        let request = kev_contract::validate(Value::Object(request))?;
        let job = self.admit_request(request)?;
        self.pinned().reserve(
            job.adapter().model_id(),
            order,
            state,
            job.compiled().state_ids().to_vec(),
        )?;
        Ok(job.pinning(&order.id))
    }
}

/// The work caps' running totals over the parts of one request (one part for a plain request).
struct Tally {
    caps: Caps,
    parts: usize,
    questions: usize,
    options: usize,
    tokens: usize,
}
impl Tally {
    fn new(caps: Caps, parts: usize) -> Self {
        Tally {
            caps,
            parts,
            questions: 0,
            options: 0,
            tokens: 0,
        }
    }

    fn over(&self, field: &'static str, bound: usize, value: usize) -> Refusal {
        Refusal::from(OverCap {
            field,
            bound,
            value,
            parts: self.parts,
        })
    }

    /// Refuse `n` more questions if they would pass the cap (nothing counted).
    fn check_questions(&self, n: usize) -> Result<(), Refusal> {
        let total = self.questions + n;
        if total > self.caps.max_questions {
            return Err(self.over("questions", self.caps.max_questions, total));
        }
        Ok(())
    }

    fn add_questions(&mut self, n: usize) -> Result<(), Refusal> {
        self.check_questions(n)?;
        self.questions += n;
        Ok(())
    }

    fn add_options(&mut self, n: usize) -> Result<(), Refusal> {
        self.options += n;
        if self.options > self.caps.max_options {
            return Err(self.over("options", self.caps.max_options, self.options));
        }
        Ok(())
    }

    /// Input tokens the next part may still have.
    fn tokens_left(&self) -> usize {
        self.caps.max_input_tokens.saturating_sub(self.tokens)
    }

    /// The refusal of a part whose tokenizing stopped at `at_least` tokens, past what was left.
    fn over_tokens(&self, at_least: usize) -> Refusal {
        self.over(
            "input_tokens",
            self.caps.max_input_tokens,
            self.tokens + at_least,
        )
    }
}
