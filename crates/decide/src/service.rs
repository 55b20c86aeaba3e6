//! Requests in, responses out: the decision service over one loaded model and a [`Backend`].
//!
//! [`Kev::admit`] (`crate::admit`) validates and compiles a body (the work caps, the service options — date
//! facts — and pinned states applied there, for every front end); [`Kev::task`] wraps the job for the executor, and [`Kev::pass`]
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

use kev_contract::{ResponseBody, ValidRequest, shape_answers};
use kev_engine::Backend;
use kev_tokenize::{CompiledRequest, KevTokenizer};
use serde_json::{Map, Value, json};

pub use crate::adapters::{Adapter, AdapterSpec, AdapterToken};
use crate::adapters::{LiveSource, Registry};
use crate::cache::{PrefixCache, Snapshot};
use crate::card::ModelInfo;
pub use crate::error::{DecideError, OverCap, Refusal};
use crate::head::PointerHead;
use crate::pinned::PinnedStates;
pub use crate::settings::{Caps, Settings};
use crate::urgency::Urgency;

/// A validated, compiled request waiting for the engine.
pub struct Job {
    request: ValidRequest,
    compiled: CompiledRequest,
    logits: bool,
    pin: Option<String>,
    adapter: AdapterToken,
    urgency: Urgency,
}

impl Job {
    pub(crate) fn new(
        request: ValidRequest,
        compiled: CompiledRequest,
        adapter: AdapterToken,
    ) -> Self {
        Job {
            request,
            compiled,
            logits: false,
            pin: None,
            adapter,
            urgency: Urgency::default(),
        }
    }

    /// The same job keeping its prefix snapshot as pin `id` (`Kev::admit_pin`).
    pub(crate) fn pinning(mut self, id: &str) -> Self {
        self.pin = Some(id.to_owned());
        self
    }

    /// The same job with its priority and deadline (`x_priority`, `x_deadline_ms`).
    pub(crate) fn with_urgency(mut self, urgency: Urgency) -> Self {
        self.urgency = urgency;
        self
    }

    /// The adapter that answers it (chosen by the request's `model`; held: a job admitted before its adapter
    /// was removed still runs on it).
    pub fn adapter(&self) -> &AdapterToken {
        &self.adapter
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

    /// Its priority and deadline, as its body states them (`x_priority`, `x_deadline_ms`; [`crate::urgency`]).
    pub fn urgency(&self) -> Urgency {
        self.urgency
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
    /// Time spent reading its answers out: the pointer head over its readout rows, and shaping the answers.
    pub readout: std::time::Duration,
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
    /// Adapters removed whose last requests are still in flight.
    pub adapters_retired: u64,
}

/// The name the default adapter answers to when the front end gives it none.
pub const DEFAULT_ADAPTER_NAME: &str = kev_contract::DEFAULT_MODEL;

/// The decision service over one loaded backbone and its Kev adapters (one, unless the front end adds
/// more: [`Kev::with_adapter`]); the first adapter is the default.
pub struct Kev<B: Backend> {
    backend: B,
    adapters: Registry<B::Adapter>,
    /// Where adapters added live come from (`None`: they are not offered).
    live: Option<LiveSource>,
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
            adapters: Registry::new(Adapter {
                token: AdapterToken::new(0, DEFAULT_ADAPTER_NAME.into(), model_id),
                lora: None,
                head,
                model_id,
                info: None,
                calibration,
            }),
            live: None,
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

    /// The default adapter, while the service is being built.
    fn default_mut(&mut self) -> &mut Adapter<B::Adapter> {
        self.adapters
            .default_mut()
            .expect("the default adapter is changed only while the service is built")
    }

    /// What was loaded ([`crate::load_cpu`] sets it), for the default adapter's model card.
    pub fn with_info(mut self, info: ModelInfo) -> Self {
        self.default_mut().info = Some(info);
        self
    }

    /// Name the default adapter (`name`, what requests select it by) and give it further names
    /// (`aliases`: `kev-latest`, `jev-latest`, …) that select it too.
    pub fn with_default_names(mut self, name: &str, aliases: &[String]) -> Self {
        let default = self.default_mut();
        default.token = AdapterToken::new(0, name.to_owned(), default.model_id);
        self.default_names = aliases.to_vec();
        self
    }

    /// Offer adapters added and removed live, from these files ([`crate::load`] sets it for a release
    /// served unmerged).
    pub fn with_live_source(mut self, source: LiveSource) -> Self {
        self.live = Some(source);
        self
    }

    /// Where live adapters come from, if they are offered.
    pub(crate) fn live_source(&self) -> Option<&LiveSource> {
        self.live.as_ref()
    }

    /// The adapters' registry.
    pub(crate) fn registry(&self) -> &Registry<B::Adapter> {
        &self.adapters
    }

    /// An adapter record for `spec`, with a token of its own.
    pub(crate) fn make_adapter(&self, spec: AdapterSpec<B::Adapter>) -> Adapter<B::Adapter> {
        let AdapterSpec {
            name,
            lora,
            mut head,
            calibration,
            model_id,
            info,
        } = spec;
        head.set_calibration(calibration.clone());
        Adapter {
            token: self.adapters.token(name, model_id),
            lora: Some(lora),
            head,
            model_id,
            info,
            calibration,
        }
    }

    /// Answer requests whose `model` is `spec.name` with another adapter over the same backbone.
    pub fn with_adapter(mut self, spec: AdapterSpec<B::Adapter>) -> Self {
        let adapter = self.make_adapter(spec);
        self.adapters.push(adapter);
        self
    }

    /// The adapters served now, the default first.
    pub fn adapters(&self) -> Vec<Arc<Adapter<B::Adapter>>> {
        let more = self.adapters.more();
        std::iter::once(Arc::clone(&self.adapters.default))
            .chain(more.iter().cloned())
            .collect()
    }

    /// Whether `name` is one of the default adapter's further names (or `kev-latest`).
    pub(crate) fn is_default_name(&self, name: &str) -> bool {
        name == DEFAULT_ADAPTER_NAME || self.default_names.iter().any(|n| n == name)
    }

    /// Whether a request naming `name` reaches an adapter of that name (the default's names included).
    pub(crate) fn serves_name(&self, name: &str) -> bool {
        self.is_default_name(name) || self.adapters().iter().any(|a| a.name() == name)
    }

    /// The adapter a request's `model` names: an adapter's own name, or one of the default's names; a removed
    /// adapter's name is a 404; any other name is the default adapter's (the name echoed, as Kev 1.0 does), or
    /// a 400 with [`Settings::strict_models`].
    pub fn resolve_model(&self, model: &str) -> Result<AdapterToken, Refusal> {
        if let Some(a) = self.adapters().iter().find(|a| a.name() == model) {
            return Ok(a.token.clone());
        }
        if self.adapters.was_removed(model) {
            return Err(Refusal::AdapterGone(model.to_owned()));
        }
        if self.settings.strict_models && !self.is_default_name(model) {
            return Err(Refusal::UnknownModel(model.to_owned()));
        }
        Ok(self.adapters.default.token.clone())
    }

    /// What was loaded, if the loader said (the default adapter's).
    pub fn info(&self) -> Option<&ModelInfo> {
        self.adapters.default.info.as_ref()
    }

    /// The `/v1/models` card fields other than `name` ([`ModelInfo::card`] with the settings in force): what
    /// `kev serve`, `kev calibrate` and the Python package report (the default adapter's).
    pub fn card(&self) -> Value {
        self.card_of(&self.adapters.default, true)
    }

    /// Adapter `i`'s card, of [`Kev::adapters`] (its own head, calibration and files; the backbone and
    /// settings shared).
    pub fn adapter_card(&self, i: usize) -> Value {
        let all = self.adapters();
        self.card_of(&all[i], i == 0)
    }

    /// `(name, card)` of every adapter served now, the default first.
    pub fn adapter_cards(&self) -> Vec<(String, Value)> {
        self.adapters()
            .iter()
            .enumerate()
            .map(|(i, a)| (a.name().to_owned(), self.card_of(a, i == 0)))
            .collect()
    }

    /// An adapter's card; `x_adapter` and `x_default` while several are served.
    pub(crate) fn card_of(&self, a: &Adapter<B::Adapter>, default: bool) -> Value {
        let mut card = match &a.info {
            Some(info) => info.card(&self.settings, a.calibration.as_deref()),
            None => ModelInfo::settings_card(&self.settings),
        };
        if !self.adapters.more().is_empty()
            && let Some(obj) = card.as_object_mut()
        {
            obj.insert("x_adapter".into(), Value::String(a.name().to_owned()));
            obj.insert("x_default".into(), Value::Bool(default));
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
        &self.adapters.default.head
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
            adapters_retired: self.retired_adapters() as u64,
        }
    }

    pub(crate) fn respond_to(
        &self,
        job: &Job,
        probabilities: Vec<Vec<f32>>,
        logits: Vec<Vec<f64>>,
        head_time: std::time::Duration,
    ) -> Result<Decision, DecideError> {
        let started = std::time::Instant::now();
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
            readout: head_time + started.elapsed(),
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

    /// The adapter a job runs under (a removed one while its jobs are in flight).
    pub fn adapter_of(&self, job: &Job) -> Arc<Adapter<B::Adapter>> {
        self.adapters.get(&job.adapter)
    }

    /// Drop an adapter's prepared states and pins (it was removed).
    pub(crate) fn forget_model(&self, model: u64) {
        self.cache.forget(model);
        self.pinned.forget(model);
    }

    /// The cached (or pinned) snapshot of exactly this job's state ids under its adapter, if any (and
    /// caching is on).
    pub(crate) fn cached(&self, job: &Job) -> Option<Snapshot<B::State>> {
        let (model, ids) = (job.adapter.model_id(), job.compiled.state_ids());
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
        // A removed adapter's jobs finish, but keep nothing.
        if self.caching() && self.adapters.is_served(&job.adapter) {
            let bytes = self.backend.state_bytes(&snapshot.state);
            let model = job.adapter.model_id();
            self.pinned.observe(job.compiled.state_ids().len(), bytes);
            self.cache
                .put(model, job.compiled.state_ids(), snapshot.clone(), bytes);
        }
    }

    /// Pin the snapshot a pin request's task has reached (`Kev::admit_pin`).
    pub(crate) fn pin_if_asked(&self, job: &Job, snapshot: &Snapshot<B::State>) {
        if let Some(id) = &job.pin
            && self.pinned.wants(id)
            && self.adapters.is_served(&job.adapter)
        {
            let bytes = self.backend.state_bytes(&snapshot.state);
            self.pinned.fill(id, snapshot, bytes);
        }
    }

    /// The pinned states.
    pub fn pinned(&self) -> &PinnedStates<B::State> {
        &self.pinned
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
