//! Requests in, responses out: the orchestration of one or many decisions over a [`Backend`].
//!
//! For a batch of admitted requests:
//! 1. every distinct state prefix not in the prepared-state cache runs once (rows batched through the
//!    GEMMs), its snapshot is cached;
//! 2. every question branch of every request continues from a clone of its request's snapshot; branches
//!    are packed into passes of at most `pass_tokens` tokens, each pass one batched forward;
//! 3. the pointer head turns the hidden states at the readout positions into probabilities, and the
//!    contract shapes answers and usage.
//!
//! **Exact sharing.** The snapshot is taken where the state prefix ends on a multiple of the backend's
//! snapshot grain (the CPU's GDN chunk, 64 tokens) and the remaining `len % 64` state tokens run again at
//! the front of every branch. A branch
//! then meets exactly the arithmetic of the same row run from zero (the chunked delta rule splits at the
//! same places, and the backend computes each row independently of its batch), so sharing and caching
//! change no bit of any probability. It costs at most 63 extra tokens per question.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use kev_contract::{ResponseBody, ValidRequest, shape_answers};
use kev_engine::{Backend, BatchRow, EngineError};
use kev_tokenize::{CompiledRequest, KevTokenizer, Limits, TokenizeError};
use serde_json::{Value, json};

use crate::cache::{PrefixCache, Snapshot};
pub use crate::error::{DecideError, OverCap, Refusal};
use crate::head::PointerHead;

/// Per-request work caps: a request over one is refused with 413 before the engine sees it.
///
/// Kev 1.0 sets no such limits (kev-contract §5.2: "no limit"), so one body could hold the engine for as
/// long as it liked. The defaults leave room for every request the contract's examples and the conformance
/// suites send ("hundreds of questions") and bound the engine time of one request to about two maximum-size
/// rows: a full 65,536-token state plus 64 Ki tokens of questions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    /// Most questions in one request (default 1,024).
    pub max_questions: usize,
    /// Most options over all questions (noul counts 2; default 16,384 — 64 choice questions of 255 options).
    pub max_options: usize,
    /// Most input tokens: the state once plus every question's branch, as `usage.input_tokens` counts them
    /// (default 131,072).
    pub max_input_tokens: usize,
}

impl Default for Caps {
    fn default() -> Self {
        Caps {
            max_questions: 1024,
            max_options: 16_384,
            max_input_tokens: 131_072,
        }
    }
}

/// Tunables of the decision service.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Token limits (kev-contract §5.2) and truncate-state mode.
    pub limits: Limits,
    /// Per-request work caps (413).
    pub caps: Caps,
    /// Largest number of tokens one forward pass takes (a longer single row still runs alone).
    pub pass_tokens: usize,
    /// Byte budget of the prepared-state cache (0 disables it).
    pub cache_bytes: usize,
    /// Snapshot at a multiple of the GDN chunk (exact sharing, see the module docs). Off: snapshot at
    /// the end of the state (fewer tokens, equal to a from-zero row only to fp32 rounding).
    pub chunk_aligned: bool,
    /// Run every question as its own row from zero, as the author's reference does (no sharing, no
    /// cache): for parity checks and benchmarks.
    pub rows_from_zero: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            limits: Limits::KEV,
            caps: Caps::default(),
            pass_tokens: 4096,
            cache_bytes: 2 << 30,
            chunk_aligned: true,
            rows_from_zero: false,
        }
    }
}

/// A validated, compiled request waiting for the engine.
pub struct Job {
    request: ValidRequest,
    compiled: CompiledRequest,
}

impl Job {
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
}

/// One answered request.
#[derive(Debug, Clone)]
pub struct Decision {
    /// Unrounded fp32 probabilities per question, in request order.
    pub probabilities: Vec<Vec<f32>>,
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
}

/// The decision service over one loaded model.
pub struct Kev<B: Backend> {
    backend: B,
    head: PointerHead,
    tokenizer: KevTokenizer,
    settings: Settings,
    cache: PrefixCache<B::State>,
    model_id: u64,
    rows: AtomicU64,
    passes: AtomicU64,
}

impl<B: Backend> Kev<B> {
    /// Assemble a service. `model_id` identifies the weights, form and arm in cache keys.
    pub fn new(
        backend: B,
        head: PointerHead,
        tokenizer: KevTokenizer,
        settings: Settings,
        model_id: u64,
    ) -> Self {
        let cache = PrefixCache::new(settings.cache_bytes);
        Kev {
            backend,
            head,
            tokenizer,
            settings,
            cache,
            model_id,
            rows: AtomicU64::new(0),
            passes: AtomicU64::new(0),
        }
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &KevTokenizer {
        &self.tokenizer
    }

    /// The pointer head.
    pub fn head(&self) -> &PointerHead {
        &self.head
    }

    /// The pointer head, to set a calibration before serving.
    pub fn head_mut(&mut self) -> &mut PointerHead {
        &mut self.head
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
        }
    }

    /// Validate and compile a request body.
    pub fn admit(&self, body: &[u8]) -> Result<Job, Refusal> {
        self.precheck(body)?;
        let value = kev_contract::parse_body(body)?;
        // The question cap before validation, which renders every question (again here for the bodies
        // the pre-scan leaves to the full reader).
        let caps = &self.settings.caps;
        if let Some(n) = value
            .get("questions")
            .and_then(Value::as_object)
            .map(|q| q.len())
            && n > caps.max_questions
        {
            return Err(Refusal::from(OverCap {
                field: "questions",
                bound: caps.max_questions,
                value: n,
            }));
        }
        let request = kev_contract::validate(value)?;
        self.admit_request(request)
    }

    /// Refuse a body over the question cap before it is parsed in full (413): a cheap scan counts its
    /// questions as the full reader would (see [`crate::prescan`]). Bodies the scan cannot read pass; the
    /// full reader and [`Kev::admit_request`] judge them.
    pub fn precheck(&self, body: &[u8]) -> Result<(), Refusal> {
        let cap = self.settings.caps.max_questions;
        match crate::prescan::question_count(body) {
            Some(n) if n > cap => Err(Refusal::from(OverCap {
                field: "questions",
                bound: cap,
                value: n,
            })),
            _ => Ok(()),
        }
    }

    /// Compile an already validated request: the question and option caps first (nothing tokenized yet),
    /// then the rows, tokenizing stopped at the first limit passed.
    pub fn admit_request(&self, request: ValidRequest) -> Result<Job, Refusal> {
        let caps = &self.settings.caps;
        let questions = request.questions().len();
        if questions > caps.max_questions {
            return Err(Refusal::from(OverCap {
                field: "questions",
                bound: caps.max_questions,
                value: questions,
            }));
        }
        let options: usize = request.questions().iter().map(|q| q.options().len()).sum();
        if options > caps.max_options {
            return Err(Refusal::from(OverCap {
                field: "options",
                bound: caps.max_options,
                value: options,
            }));
        }
        let compiled = self
            .tokenizer
            .compile_capped(&request, &self.settings.limits, caps.max_input_tokens)
            .map_err(|e| match e {
                TokenizeError::TooMuchWork { at_least, limit } => Refusal::from(OverCap {
                    field: "input_tokens",
                    bound: limit,
                    value: at_least,
                }),
                e => Refusal::from(e),
            })?;
        Ok(Job { request, compiled })
    }

    /// Answer one request body end to end (`kev decide`).
    pub fn decide(&self, body: &[u8]) -> Result<Result<Decision, DecideError>, Refusal> {
        let job = self.admit(body)?;
        Ok(self
            .run(&[&job])
            .pop()
            .unwrap_or(Err(DecideError::Unanswered("no result"))))
    }

    /// Answer admitted requests together: their state prefixes and question branches share passes.
    /// One result per job, in order.
    pub fn run(&self, jobs: &[&Job]) -> Vec<Result<Decision, DecideError>> {
        jobs.iter()
            .zip(self.probabilities(jobs))
            .map(|(job, probs)| probs.and_then(|p| self.respond_to(job, p)))
            .collect()
    }

    pub(crate) fn respond_to(
        &self,
        job: &Job,
        probabilities: Vec<Vec<f32>>,
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
        Ok(Decision {
            probabilities,
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

    /// Per job, its per-question probabilities (or that job's engine error).
    fn probabilities(&self, jobs: &[&Job]) -> Vec<Result<Vec<Vec<f32>>, DecideError>> {
        // 1. Snapshots: from the cache, or run each distinct missing prefix once.
        let mut snapshots: Vec<Option<Snapshot<B::State>>> = Vec::with_capacity(jobs.len());
        let mut missing: HashMap<&[u32], Vec<usize>> = HashMap::new();
        let mut missing_order: Vec<&[u32]> = Vec::new();
        for (j, job) in jobs.iter().enumerate() {
            let ids = job.compiled.state_ids();
            let aligned = self.split_at(ids.len());
            if aligned == 0 {
                snapshots.push(Some(Snapshot {
                    state: self.backend.new_state(),
                    aligned: 0,
                }));
                continue;
            }
            let cached = if self.settings.cache_bytes > 0 && !self.settings.rows_from_zero {
                self.cache.get(self.model_id, ids)
            } else {
                None
            };
            match cached {
                Some(s) => snapshots.push(Some(s)),
                None => {
                    snapshots.push(None);
                    let entry = missing.entry(ids).or_default();
                    if entry.is_empty() {
                        missing_order.push(ids);
                    }
                    entry.push(j);
                }
            }
        }
        let mut failed: Vec<Option<Arc<EngineError>>> = vec![None; jobs.len()];
        let prefix_rows: Vec<(&[u32], usize)> = missing_order
            .iter()
            .map(|ids| (*ids, self.split_at(ids.len())))
            .collect();
        self.forward_in_passes(
            prefix_rows.iter().map(|(_, a)| *a),
            |_| self.backend.new_state(),
            |i| (&prefix_rows[i].0[..prefix_rows[i].1], &[][..]),
            |i, result| {
                let (ids, aligned) = prefix_rows[i];
                match result {
                    Ok((state, _)) => {
                        let snap = Snapshot { state, aligned };
                        if self.settings.cache_bytes > 0 && !self.settings.rows_from_zero {
                            let bytes = self.backend.state_bytes(&snap.state);
                            self.cache.put(self.model_id, ids, snap.clone(), bytes);
                        }
                        for &j in &missing[ids] {
                            snapshots[j] = Some(snap.clone());
                        }
                    }
                    Err(e) => {
                        for &j in &missing[ids] {
                            failed[j] = Some(Arc::clone(&e));
                        }
                    }
                }
            },
        );

        // 2. Branches: (job, question, tokens, wanted) packed into passes.
        struct BranchRow {
            job: usize,
            tokens: Vec<u32>,
            wanted: Vec<usize>,
        }
        let mut branch_rows: Vec<BranchRow> = Vec::new();
        for (j, job) in jobs.iter().enumerate() {
            let Some(snap) = &snapshots[j] else { continue };
            let ids = job.compiled.state_ids();
            let tail = &ids[snap.aligned..];
            for b in job.compiled.branches() {
                let mut tokens = Vec::with_capacity(tail.len() + b.len());
                tokens.extend_from_slice(tail);
                tokens.extend_from_slice(b.ids());
                let off = snap.aligned;
                let wanted = b
                    .option_ends()
                    .iter()
                    .map(|&i| i - off)
                    .chain(std::iter::once(b.decide() - off))
                    .collect();
                branch_rows.push(BranchRow {
                    job: j,
                    tokens,
                    wanted,
                });
            }
        }
        let mut hidden: Vec<Option<Vec<f32>>> = vec![None; branch_rows.len()];
        self.forward_in_passes(
            branch_rows.iter().map(|r| r.tokens.len()),
            |i| {
                snapshots[branch_rows[i].job]
                    .as_ref()
                    .map(|s| s.state.clone())
                    .unwrap_or_else(|| self.backend.new_state())
            },
            |i| (&branch_rows[i].tokens[..], &branch_rows[i].wanted[..]),
            |i, result| match result {
                // The branch's own state is dropped here: only its readout rows are kept.
                Ok((_, h)) => hidden[i] = Some(h),
                Err(e) => failed[branch_rows[i].job] = Some(e),
            },
        );

        // 3. Head: per job, per question, in order.
        let mut out: Vec<Result<Vec<Vec<f32>>, DecideError>> = (0..jobs.len())
            .map(|j| match (&failed[j], &snapshots[j]) {
                (Some(e), _) => Err(DecideError::Engine(Arc::clone(e))),
                (None, None) => Err(DecideError::Unanswered("state prefix did not run")),
                (None, Some(_)) => Ok(Vec::new()),
            })
            .collect();
        for (row, h) in branch_rows.iter().zip(hidden) {
            if let (Ok(list), Some(h)) = (&mut out[row.job], h) {
                // Branches are in question order, so the list's length is this branch's question.
                let kind = jobs[row.job].request.questions()[list.len()].kind();
                list.push(self.head.probabilities_for(&h, kind));
            }
        }
        out
    }

    /// Run rows (given by their token counts) in passes of at most `pass_tokens` tokens: `state(i)` makes
    /// row `i`'s starting state when its pass begins (so only one pass's states are alive at a time),
    /// `input(i)` gives its tokens and wanted indices, and `done(i, …)` receives its final state and hidden
    /// rows, or the pass's error (shared by every row of the pass).
    fn forward_in_passes<'a>(
        &self,
        lens: impl Iterator<Item = usize>,
        state: impl Fn(usize) -> B::State,
        input: impl Fn(usize) -> (&'a [u32], &'a [usize]),
        mut done: impl FnMut(usize, Result<(B::State, Vec<f32>), Arc<EngineError>>),
    ) {
        for pass in passes(lens, self.settings.pass_tokens) {
            let mut states: Vec<B::State> = pass.iter().map(|&i| state(i)).collect();
            let result = {
                let mut rows: Vec<BatchRow<'_, B::State>> = states
                    .iter_mut()
                    .zip(&pass)
                    .map(|(state, &i)| {
                        let (tokens, wanted) = input(i);
                        BatchRow {
                            state,
                            tokens,
                            wanted,
                        }
                    })
                    .collect();
                self.count_pass(rows.len());
                self.backend.forward(&mut rows)
            };
            match result {
                Ok(hidden) => {
                    for ((st, h), &i) in states.into_iter().zip(hidden).zip(&pass) {
                        done(i, Ok((st, h)));
                    }
                }
                Err(e) => {
                    let e = Arc::new(e);
                    for &i in &pass {
                        done(i, Err(Arc::clone(&e)));
                    }
                }
            }
        }
    }

    /// The cached snapshot of exactly these state ids, if any (and caching is on).
    pub(crate) fn cached(&self, ids: &[u32]) -> Option<Snapshot<B::State>> {
        if self.settings.cache_bytes > 0 && !self.settings.rows_from_zero {
            self.cache.get(self.model_id, ids)
        } else {
            None
        }
    }

    /// Keep a prefix snapshot in the cache (if caching is on).
    pub(crate) fn remember(&self, ids: &[u32], snapshot: &Snapshot<B::State>) {
        if self.settings.cache_bytes > 0 && !self.settings.rows_from_zero {
            let bytes = self.backend.state_bytes(&snapshot.state);
            self.cache.put(self.model_id, ids, snapshot.clone(), bytes);
        }
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
                    "row_ids": job.compiled.row_ids(k).unwrap_or_default(),
                    "option_ends": b.option_ends(),
                    "decide": b.decide(),
                })
            })
            .collect();
        json!({ "questions": qs, "state_tokens": job.compiled.state_ids().len() })
    }
}

/// Split items (by token count) into consecutive passes of at most `budget` tokens; an item over the
/// budget runs alone.
fn passes(lens: impl Iterator<Item = usize>, budget: usize) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut cur: Vec<usize> = Vec::new();
    let mut tokens = 0usize;
    for (i, len) in lens.enumerate() {
        if !cur.is_empty() && tokens + len > budget {
            out.push(std::mem::take(&mut cur));
            tokens = 0;
        }
        cur.push(i);
        tokens += len;
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::passes;

    #[test]
    fn passes_respect_the_budget_and_keep_order() {
        assert_eq!(
            passes([10, 20, 30, 50, 5].into_iter(), 60),
            vec![vec![0, 1, 2], vec![3, 4]]
        );
        assert_eq!(passes([100, 1].into_iter(), 60), vec![vec![0], vec![1]]);
        assert!(passes(std::iter::empty(), 60).is_empty());
    }
}
