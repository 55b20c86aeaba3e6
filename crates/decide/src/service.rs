//! Requests in, responses out: the decision service over one loaded model and a [`Backend`].
//!
//! [`Kev::admit`] validates and compiles a body (the work caps and the service options — date facts — applied
//! here, for every front end); [`Kev::task`] wraps the job for the executor, and [`Kev::pass`]
//! (`crate::task`) runs every engine pass there is: a state prefix run once (or taken from the prepared-state
//! cache), then every question branch continued from a clone of its snapshot, the pointer head on the readout
//! rows, the contract shaping answers and usage. [`Kev::run`] answers admitted requests together by driving
//! their tasks through `pass` (`crate::run`); `kev serve` drives the same tasks from its scheduler.
//!
//! **Exact sharing.** The snapshot is taken where the state prefix ends on a multiple of the backend's
//! snapshot grain (the CPU's GDN chunk, 64 tokens) and the remaining `len % 64` state tokens run again at
//! the front of every branch. A branch
//! then meets exactly the arithmetic of the same row run from zero (the chunked delta rule splits at the
//! same places, and the backend computes each row independently of its batch), so sharing and caching
//! change no bit of any probability. It costs at most 63 extra tokens per question.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use kev_contract::{
    ContractError, ErrorDetail, LocItem, ResponseBody, ValidRequest, shape_answers,
};
use kev_engine::Backend;
use kev_tokenize::{CompiledRequest, KevTokenizer, TokenizeError};
use serde_json::{Map, Value, json};

use crate::cache::{PrefixCache, Snapshot};
use crate::calibrate::Calibration;
use crate::card::ModelInfo;
pub use crate::error::{DecideError, OverCap, Refusal};
use crate::head::PointerHead;
use crate::pinned::PinnedStates;
pub use crate::settings::{Caps, Settings};

/// A validated, compiled request waiting for the engine.
pub struct Job {
    request: ValidRequest,
    compiled: CompiledRequest,
    logits: bool,
    pin: Option<String>,
    adapter: usize,
}

impl Job {
    /// The adapter that answers it (an index into [`Kev::adapters`], chosen by the request's `model`).
    pub fn adapter(&self) -> usize {
        self.adapter
    }

    /// The kind of question `i` (request order): the head's calibration may differ by kind.
    pub(crate) fn question_kind(&self, i: usize) -> kev_contract::QuestionKind {
        self.request.questions()[i].kind()
    }

    /// Tokens the request runs (`usage.input_tokens`).
    pub fn tokens(&self) -> usize {
        self.compiled.input_tokens()
    }

    /// The validated request.
    pub fn request(&self) -> &ValidRequest {
        &self.request
    }

    /// Its rows.
    pub fn compiled(&self) -> &CompiledRequest {
        &self.compiled
    }

    /// Whether its answer carries the options' pointer logits (`x_logits`, see [`LOGITS_FIELD`]).
    pub fn wants_logits(&self) -> bool {
        self.logits
    }

    /// Ask for (or stop asking for) the pointer logits in the answer.
    pub fn with_logits(mut self, on: bool) -> Self {
        self.logits = on;
        self
    }
}

/// The request extension that asks for the raw pointer logits: `"x_logits": true` adds a top-level
/// `"x_logits": {question id: {probability key: z}}` to the answer, `z` the option's logit before the
/// temperature divides it (f64, unrounded). The `answers`, `usage` and every other byte of the body are
/// those of the same request without it; a server that does not know the field ignores it, as the contract
/// ignores unknown fields. Anything but `true`/`false` is a 422.
pub const LOGITS_FIELD: &str = "x_logits";

/// Whether `body` asks for the logits (its [`LOGITS_FIELD`]); 422 for a value that is not a JSON boolean.
fn asks_for_logits(body: &Value) -> Result<bool, Refusal> {
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

/// One answered request.
#[derive(Debug, Clone)]
pub struct Decision {
    /// Unrounded fp32 probabilities per question, in request order.
    pub probabilities: Vec<Vec<f32>>,
    /// Per question, its options' pointer logits before the temperature (f64), in request order; in the
    /// response only when the request asked (`x_logits`).
    pub logits: Vec<Vec<f64>>,
    /// The response: answers, usage and extensions.
    pub response: ResponseBody,
}

impl Decision {
    /// The response body as JSON.
    pub fn body(&self) -> Value {
        self.response.to_value()
    }
}

/// Counters since start.
#[derive(Debug, Default, Clone, Copy)]
pub struct Stats {
    /// Rows run (state prefixes and branches).
    pub rows: u64,
    /// Forward passes run.
    pub passes: u64,
    /// Prepared-state cache counters.
    pub cache: crate::cache::CacheStats,
    /// Pinned states.
    pub pins: crate::pinned::PinStats,
}

/// One Kev adapter the service answers with: its rows run under its LoRA (`lora`, beside the shared
/// backbone's weights; none for the default adapter, whose weights are the backbone's as loaded), its
/// readout through its own head (and calibration), its prefix snapshots cached and pinned under its own
/// identity, so a state run under one adapter never answers another.
pub struct Adapter<A> {
    name: String,
    lora: Option<Arc<A>>,
    head: PointerHead,
    model_id: u64,
    info: Option<ModelInfo>,
    calibration: Option<Arc<Calibration>>,
}

impl<A> Adapter<A> {
    /// Its name (what a request's `model` selects it by).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The LoRA its rows run under ([`kev_engine::BatchRow::adapter`]); `None`: the backbone's weights as
    /// loaded.
    pub fn lora(&self) -> Option<&A> {
        self.lora.as_deref()
    }

    /// Its pointer head.
    pub fn head(&self) -> &PointerHead {
        &self.head
    }

    /// What was loaded for it, if the loader said.
    pub fn info(&self) -> Option<&ModelInfo> {
        self.info.as_ref()
    }
}

/// A further adapter for [`Kev::with_adapter`]: its name, LoRA, head, calibration and identity.
pub struct AdapterSpec<A> {
    /// The name requests select it by (`model`).
    pub name: String,
    /// Its LoRA, laid out for the service's backbone ([`kev_engine::Backend::load_adapter`]).
    pub lora: Arc<A>,
    /// Its pointer head.
    pub head: PointerHead,
    /// Its temperatures (`None`: its head's stored one).
    pub calibration: Option<Arc<Calibration>>,
    /// Identifies its weights, form and arm in cache keys (distinct from every other adapter's).
    pub model_id: u64,
    /// What was loaded, for its card.
    pub info: Option<ModelInfo>,
}

/// The name the default adapter answers to when the front end gives it none.
pub const DEFAULT_ADAPTER_NAME: &str = kev_contract::DEFAULT_MODEL;

/// The decision service over one loaded backbone and its Kev adapters (one, unless the front end adds
/// more: [`Kev::with_adapter`]); the first adapter is the default.
pub struct Kev<B: Backend> {
    backend: B,
    adapters: Vec<Adapter<B::Adapter>>,
    /// Where the service's background passes (a server's long lane) step aside for its foreground ones.
    lanes: Arc<kev_engine::Lanes>,
    /// Further names of the default adapter (`kev-latest`, `jev-latest`, the size, aliases).
    default_names: Vec<String>,
    tokenizer: KevTokenizer,
    settings: Settings,
    cache: PrefixCache<B::State>,
    pinned: PinnedStates<B::State>,
    rows: AtomicU64,
    passes: AtomicU64,
}

impl<B: Backend> Kev<B> {
    /// Assemble a service. `model_id` identifies the weights, form and arm in cache keys. The head serves
    /// `settings.calibration` when there is one.
    pub fn new(
        backend: B,
        mut head: PointerHead,
        tokenizer: KevTokenizer,
        mut settings: Settings,
        model_id: u64,
    ) -> Self {
        let cache_bytes = settings
            .cache_bytes
            .unwrap_or_else(crate::settings::default_cache_bytes);
        settings.cache_bytes = Some(cache_bytes);
        let cache = PrefixCache::new(cache_bytes);
        let pinned = PinnedStates::new(settings.pin_bytes);
        head.set_calibration(settings.calibration.clone());
        let calibration = settings.calibration.clone();
        Kev {
            backend,
            adapters: vec![Adapter {
                name: DEFAULT_ADAPTER_NAME.into(),
                lora: None,
                head,
                model_id,
                info: None,
                calibration,
            }],
            lanes: kev_engine::Lanes::new(),
            default_names: Vec::new(),
            tokenizer,
            settings,
            cache,
            pinned,
            rows: AtomicU64::new(0),
            passes: AtomicU64::new(0),
        }
    }

    /// What was loaded ([`crate::load_cpu`] sets it), for the default adapter's model card.
    pub fn with_info(mut self, info: ModelInfo) -> Self {
        self.adapters[0].info = Some(info);
        self
    }

    /// Name the default adapter (`name`, what requests select it by) and give it further names
    /// (`aliases`: `kev-latest`, `jev-latest`, …) that select it too.
    pub fn with_default_names(mut self, name: &str, aliases: &[String]) -> Self {
        self.adapters[0].name = name.to_owned();
        self.default_names = aliases.to_vec();
        self
    }

    /// Answer requests whose `model` is `spec.name` with another adapter over the same backbone.
    pub fn with_adapter(mut self, spec: AdapterSpec<B::Adapter>) -> Self {
        let AdapterSpec {
            name,
            lora,
            mut head,
            calibration,
            model_id,
            info,
        } = spec;
        head.set_calibration(calibration.clone());
        self.adapters.push(Adapter {
            name,
            lora: Some(lora),
            head,
            model_id,
            info,
            calibration,
        });
        self
    }

    /// The adapters, the default first.
    pub fn adapters(&self) -> &[Adapter<B::Adapter>] {
        &self.adapters
    }

    /// The adapter a request's `model` names: an adapter's own name, or one of the default's names; any other
    /// name is the default adapter's (the name echoed, as Kev 1.0 does), or a 400 with
    /// [`Settings::strict_models`].
    pub fn resolve_model(&self, model: &str) -> Result<usize, Refusal> {
        if let Some(i) = self.adapters.iter().position(|a| a.name == model) {
            return Ok(i);
        }
        if self.settings.strict_models
            && model != DEFAULT_ADAPTER_NAME
            && !self.default_names.iter().any(|n| n == model)
        {
            return Err(Refusal::UnknownModel(model.to_owned()));
        }
        Ok(0)
    }

    /// What was loaded, if the loader said (the default adapter's).
    pub fn info(&self) -> Option<&ModelInfo> {
        self.adapters[0].info.as_ref()
    }

    /// The `/v1/models` card fields other than `name` ([`ModelInfo::card`] with the settings in force): what
    /// `kev serve`, `kev calibrate` and the Python package report (the default adapter's).
    pub fn card(&self) -> Value {
        self.adapter_card(0)
    }

    /// Adapter `i`'s card (its own head, calibration and files; the backbone and settings shared).
    pub fn adapter_card(&self, i: usize) -> Value {
        let a = &self.adapters[i];
        let mut card = match &a.info {
            Some(info) => info.card(&self.settings, a.calibration.as_deref()),
            None => ModelInfo::settings_card(&self.settings),
        };
        if self.adapters.len() > 1
            && let Some(obj) = card.as_object_mut()
        {
            obj.insert("x_adapter".into(), Value::String(a.name.clone()));
            obj.insert("x_default".into(), Value::Bool(i == 0));
        }
        card
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &KevTokenizer {
        &self.tokenizer
    }

    /// The pointer head (the default adapter's).
    pub fn head(&self) -> &PointerHead {
        &self.adapters[0].head
    }

    /// The settings in force.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Counters since start.
    pub fn stats(&self) -> Stats {
        Stats {
            rows: self.rows.load(Ordering::Relaxed),
            passes: self.passes.load(Ordering::Relaxed),
            cache: self.cache.stats(),
            pins: self.pinned.stats(),
        }
    }

    /// Validate and compile a request body: the work caps first (the question count before the body is parsed
    /// in full), the date facts when the settings ask for them, then the rows, tokenizing stopped at the first
    /// limit passed.
    pub fn admit(&self, body: &[u8]) -> Result<Job, Refusal> {
        let mut tally = Tally::new(self.settings.caps, 1);
        self.admit_part(body, &mut tally)
    }

    /// Admit several bodies as the parts of one request (a fan-out: `/v1/systemone/permute`, `/separate`):
    /// each part is admitted as a request of its own, and the work caps hold for the parts *together* (a 413
    /// names the cap and the parts' total). All or nothing: one refused part refuses them all.
    pub fn admit_parts<T: AsRef<[u8]>>(&self, bodies: &[T]) -> Result<Vec<Job>, Refusal> {
        let mut tally = Tally::new(self.settings.caps, bodies.len());
        // Every part's question count first (a cheap scan), so that an oversized fan-out parses nothing.
        for body in bodies {
            if let Some(n) = crate::prescan::question_count(body.as_ref()) {
                tally.add_questions(n)?;
            }
        }
        tally.questions = 0;
        bodies
            .iter()
            .map(|b| self.admit_part(b.as_ref(), &mut tally))
            .collect()
    }

    /// Admit the independent requests of one batch: each on its own (its own caps; a refused one is its own
    /// `Err` and never fails the others), the batch as a whole held to [`Caps::max_batch_requests`] and
    /// [`Caps::max_batch_input_tokens`] over its admitted requests (the outer `Err`, 413: nothing runs).
    pub fn admit_batch<T: AsRef<[u8]>>(
        &self,
        bodies: &[T],
    ) -> Result<Vec<Result<Job, Refusal>>, Refusal> {
        let caps = self.settings.caps;
        let over = |field, bound, value| {
            Refusal::from(OverCap {
                field,
                bound,
                value,
                parts: bodies.len(),
            })
        };
        if bodies.len() > caps.max_batch_requests {
            return Err(over("requests", caps.max_batch_requests, bodies.len()));
        }
        let mut tokens = 0usize;
        let mut out = Vec::with_capacity(bodies.len());
        for body in bodies {
            let admitted = self.admit(body.as_ref());
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

    fn admit_part(&self, body: &[u8], tally: &mut Tally) -> Result<Job, Refusal> {
        if let Some(n) = crate::prescan::question_count(body) {
            tally.check_questions(n)?;
        }
        let value = kev_contract::parse_body(body)?;
        // The question cap before validation, which renders every question (again here for the bodies
        // the pre-scan leaves to the full reader).
        if let Some(n) = value
            .get("questions")
            .and_then(Value::as_object)
            .map(|q| q.len())
        {
            tally.check_questions(n)?;
        }
        let logits = asks_for_logits(&value)?;
        let request = kev_contract::validate(value)?;
        Ok(self.compile(request, tally)?.with_logits(logits))
    }

    /// Refuse a body over the question cap before it is parsed in full (413): a cheap scan counts its
    /// questions as the full reader would (see [`crate::prescan`]). Bodies the scan cannot read pass; the
    /// full reader and [`Kev::admit_request`] judge them.
    pub fn precheck(&self, body: &[u8]) -> Result<(), Refusal> {
        match crate::prescan::question_count(body) {
            Some(n) => Tally::new(self.settings.caps, 1).check_questions(n),
            None => Ok(()),
        }
    }

    /// Compile an already validated request (with its date facts, when the settings ask for them): the question
    /// and option caps first (nothing tokenized yet), then the rows, tokenizing stopped at the first limit
    /// passed.
    pub fn admit_request(&self, request: ValidRequest) -> Result<Job, Refusal> {
        self.compile(request, &mut Tally::new(self.settings.caps, 1))
    }

    fn compile(&self, request: ValidRequest, tally: &mut Tally) -> Result<Job, Refusal> {
        let adapter = self.resolve_model(request.model())?;
        let request = if self.settings.date_facts {
            request.with_date_facts()
        } else {
            request
        };
        tally.add_questions(request.questions().len())?;
        tally.add_options(request.questions().iter().map(|q| q.options().len()).sum())?;
        let compiled = self
            .tokenizer
            .compile_capped(&request, &self.settings.limits, tally.tokens_left())
            .map_err(|e| match e {
                TokenizeError::TooMuchWork { at_least, .. } => tally.over_tokens(at_least),
                e => Refusal::from(e),
            })?;
        tally.tokens += compiled.input_tokens();
        Ok(Job {
            request,
            compiled,
            logits: false,
            pin: None,
            adapter,
        })
    }

    pub(crate) fn respond_to(
        &self,
        job: &Job,
        probabilities: Vec<Vec<f32>>,
        logits: Vec<Vec<f64>>,
    ) -> Result<Decision, DecideError> {
        let answers = shape_answers(&job.request, &probabilities)?;
        let output = self.tokenizer.output_tokens(&answers)?;
        let mut body = ResponseBody::new(
            job.request.model(),
            answers,
            job.compiled.input_tokens(),
            output,
        );
        if let Some(t) = job.compiled.truncation() {
            body = t.apply(body);
        }
        if job.logits {
            let by_question: Map<String, Value> = job
                .request
                .questions()
                .iter()
                .zip(&logits)
                .map(|(q, z)| {
                    let by_key: Map<String, Value> = q
                        .keys()
                        .iter()
                        .cloned()
                        .zip(z.iter().map(|v| json!(v)))
                        .collect();
                    (q.id().to_owned(), Value::Object(by_key))
                })
                .collect();
            body = body.extra(LOGITS_FIELD, Value::Object(by_question));
        }
        Ok(Decision {
            probabilities,
            logits,
            response: body,
        })
    }

    /// Where a job's shared snapshot ends.
    pub(crate) fn split_at(&self, state_len: usize) -> usize {
        if self.settings.rows_from_zero {
            0
        } else if self.settings.chunk_aligned {
            let grain = self.backend.snapshot_grain();
            state_len / grain * grain
        } else {
            state_len
        }
    }

    /// The adapter a job runs under.
    pub(crate) fn adapter_of(&self, job: &Job) -> &Adapter<B::Adapter> {
        &self.adapters[job.adapter]
    }

    /// The cached (or pinned) snapshot of exactly this job's state ids under its adapter, if any (and
    /// caching is on).
    pub(crate) fn cached(&self, job: &Job) -> Option<Snapshot<B::State>> {
        let (model, ids) = (self.adapter_of(job).model_id, job.compiled.state_ids());
        if let Some(s) = self.pinned.snapshot(model, ids) {
            return Some(s);
        }
        if self.caching() {
            self.cache.get(model, ids)
        } else {
            None
        }
    }

    /// Whether prepared states are cached (a budget, and rows that share prefixes).
    fn caching(&self) -> bool {
        self.settings.cache_bytes.is_some_and(|b| b > 0) && !self.settings.rows_from_zero
    }

    /// Keep a job's prefix snapshot in the cache, under its adapter (if caching is on).
    pub(crate) fn remember(&self, job: &Job, snapshot: &Snapshot<B::State>) {
        if self.caching() {
            let bytes = self.backend.state_bytes(&snapshot.state);
            let model = self.adapter_of(job).model_id;
            self.cache
                .put(model, job.compiled.state_ids(), snapshot.clone(), bytes);
        }
    }

    /// Pin the snapshot a pin request's task has reached (`Kev::admit_pin`).
    pub(crate) fn pin_if_asked(&self, job: &Job, snapshot: &Snapshot<B::State>) {
        if let Some(id) = &job.pin
            && self.pinned.wants(id)
        {
            let bytes = self.backend.state_bytes(&snapshot.state);
            self.pinned.fill(id, snapshot, bytes);
        }
    }

    /// The pinned states.
    pub fn pinned(&self) -> &PinnedStates<B::State> {
        &self.pinned
    }

    /// Admit a state to pin under `id` for `owner` (`POST /v1/systemone/states`): `body` is `{model?, state}`;
    /// the state is admitted as a request of one yes/no question (its answer is not used) whose task keeps
    /// its prefix snapshot under `id` for `ttl` once it is made. Refused as that request would be (422 for a
    /// bad state, 413 over the caps); 422 for a body without a state.
    pub fn admit_pin(
        &self,
        body: &[u8],
        id: &str,
        owner: Option<&str>,
        ttl: std::time::Duration,
    ) -> Result<Job, Refusal> {
        let value = kev_contract::parse_body(body)?;
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
        let mut job = self.admit_request(request)?;
        self.pinned.reserve(
            self.adapter_of(&job).model_id,
            id.to_owned(),
            owner.map(str::to_owned),
            state,
            job.compiled.state_ids().to_vec(),
            ttl,
        );
        job.pin = Some(id.to_owned());
        Ok(job)
    }

    /// The lanes the service's passes run in ([`crate::Lane`]).
    pub(crate) fn lanes(&self) -> &Arc<kev_engine::Lanes> {
        &self.lanes
    }

    pub(crate) fn count_pass(&self, rows: usize) {
        self.passes.fetch_add(1, Ordering::Relaxed);
        self.rows.fetch_add(rows as u64, Ordering::Relaxed);
    }

    /// `x_debug` for `kev decide --debug`: per question the unrounded probabilities, the row's token
    /// ids and readout indices.
    pub fn debug_info(&self, job: &Job, decision: &Decision) -> Value {
        let qs: Vec<Value> = job
            .request
            .questions()
            .iter()
            .zip(job.compiled.branches())
            .zip(&decision.probabilities)
            .enumerate()
            .map(|(k, ((q, b), p))| {
                json!({
                    "id": q.id(),
                    "probabilities": p.iter().map(|v| *v as f64).collect::<Vec<_>>(),
                    "logits": decision.logits.get(k),
                    "row_ids": job.compiled.row_ids(k).unwrap_or_default(),
                    "option_ends": b.option_ends(),
                    "decide": b.decide(),
                })
            })
            .collect();
        json!({ "questions": qs, "state_tokens": job.compiled.state_ids().len() })
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
