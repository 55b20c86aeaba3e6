//! The executor: requests in flight, advanced one engine pass at a time. Every decision kev makes runs here —
//! `kev serve`'s scheduler grants the passes of many requests interleaved (a long state does not hold the
//! engine until it is done), [`Kev::run`] (`crate::run`) grants them to answer a batch at once.
//!
//! A [`Task`] is an admitted [`Job`] plus its progress:
//! 1. **prefix**: the state prefix `S[..aligned]` (aligned = the last multiple of 64, see [`crate::service`])
//!    runs from zero in *chunks*, each ending on a multiple of 64 tokens, the backend state carried from one
//!    chunk to the next — unless the prepared-state cache holds it. The chunked GDN and the attention over the
//!    cache split work at the same 64-token boundaries whether the prefix runs at once or in pieces, so a
//!    chunked prefix is bit-equal to the one-pass prefix (tested on every fixture);
//! 2. **branches**: every question's row continues from a clone of that snapshot, as many rows per pass as the
//!    grant allows (at least one);
//! 3. **done**: the head and the answer.
//!
//! [`Kev::need`] says what a task has left, [`Kev::pass`] runs one forward pass over several tasks, each
//! advanced by at most its grant of tokens (always by at least one unit: 64 prefix tokens or one row). The
//! rows of a pass are built in one place ([`Kev::pass`], branch rows by `branch_row`).

use std::borrow::Borrow;
use std::collections::HashMap;
use std::sync::Arc;

use kev_engine::{Backend, BatchRow};
use kev_tokenize::Branch;

use crate::cache::Snapshot;
use crate::head::Readout;
use crate::service::{DecideError, Decision, Job, Kev};

/// What a task has left to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Need {
    /// Tokens of its current phase (the rest of the prefix, or every branch row left).
    pub phase: usize,
    /// The smallest piece of the phase one pass can run: 64 prefix tokens, or the next branch row.
    pub unit: usize,
    /// Tokens of everything left (phase and the branches after it).
    pub remaining: usize,
}

enum Progress<S> {
    /// Not started; the cache is asked when it is first granted a pass.
    Fresh,
    /// `done` of `aligned` prefix tokens have run into `state`.
    Prefix { state: S, done: usize },
    /// Branches from `snapshot`: rows `0..next` have run.
    Branches {
        snapshot: Snapshot<S>,
        next: usize,
        answered: Readouts,
    },
    /// Answered or failed (its [`Step::Done`] was returned).
    Finished,
}

/// The readouts of a task's questions so far, in question order, and the time the head took over them.
#[derive(Default)]
struct Readouts {
    probabilities: Vec<Vec<f32>>,
    logits: Vec<Vec<f64>>,
    took: std::time::Duration,
}

impl Readouts {
    fn with_capacity(n: usize) -> Self {
        Readouts {
            probabilities: Vec::with_capacity(n),
            logits: Vec::with_capacity(n),
            took: std::time::Duration::ZERO,
        }
    }

    fn push(&mut self, r: Readout) {
        self.probabilities.push(r.probabilities);
        self.logits.push(r.logits);
    }
}

/// A request in flight: its job (owned, or borrowed as `&Job` by [`Kev::run`]) and its progress.
pub struct Task<S, J = Job> {
    job: J,
    aligned: usize,
    row_lens: Vec<usize>,
    progress: Progress<S>,
}

impl<S, J: Borrow<Job>> Task<S, J> {
    /// The admitted job.
    pub fn job(&self) -> &Job {
        self.job.borrow()
    }

    /// Where its state prefix stands, while it has one to run: `(its state ids, prefix tokens done)`. Two tasks
    /// at the same point run the same next prefix piece for the same grant, and [`Kev::pass`] runs it once.
    pub(crate) fn prefix_point(&self) -> Option<(&[u32], usize)> {
        let done = match &self.progress {
            Progress::Fresh if self.aligned > 0 => 0,
            Progress::Prefix { done, .. } => *done,
            _ => return None,
        };
        Some((self.job().compiled().state_ids(), done))
    }

    /// Whether its answer was returned.
    pub fn is_finished(&self) -> bool {
        matches!(self.progress, Progress::Finished)
    }
}

/// One task's share of a pass.
pub struct Grant<'a, S, J = Job> {
    /// The task.
    pub task: &'a mut Task<S, J>,
    /// Most tokens it may run in this pass (it always runs at least one unit).
    pub tokens: usize,
}

/// Where a pass runs beside the service's other passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// The passes requests wait for: background passes step aside while one runs.
    Foreground,
    /// Long work beside them (a server's long lane): it steps aside at the engine's safe points (a layer,
    /// a weight panel, an attention tile) while a foreground pass runs. Only pauses, never changes a bit.
    Background,
}

/// What a pass did for one task.
// One `Step` per grant per pass, moved once: boxing the answer would buy nothing next to a forward pass.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Step {
    /// More passes needed.
    Running,
    /// The answer (or this task's failure).
    Done(Result<Decision, DecideError>),
}

/// What a task runs in one pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Piece {
    /// Prefix tokens `from..to`, continuing the task's own state (or, for a twin, a copy of its first
    /// twin's result).
    Prefix { from: usize, to: usize },
    /// Branch rows `from..to` (question order).
    Rows { from: usize, to: usize },
    /// Nothing: the task had finished before this pass (a caller's mistake, answered as such).
    Finished,
}

/// One row of a pass: its grant, tokens, wanted positions and adapter. The row holds its adapter's LoRA for
/// the pass (an adapter removed meanwhile lives until the pass ends).
struct RowSrc<A> {
    grant: usize,
    tokens: Vec<u32>,
    wanted: Vec<usize>,
    lora: Option<Arc<A>>,
}

/// Per grant, what a pass's rows gave it.
struct PassOutputs<S> {
    prefix_state: Vec<Option<S>>,
    readouts: Vec<Vec<Readout>>,
    /// The time the head took over each grant's readouts.
    head_time: Vec<std::time::Duration>,
}

/// Identical prefix pieces (same adapter, same state ids, same span) run once: per grant, the grant whose
/// row it copies.
fn twins<S, J: Borrow<Job>>(grants: &[Grant<'_, S, J>], pieces: &[Piece]) -> Vec<Option<usize>> {
    let mut first_of: HashMap<(u64, &[u32], usize, usize), usize> = HashMap::new();
    let mut twin = vec![None; grants.len()];
    for (i, piece) in pieces.iter().enumerate() {
        if let Piece::Prefix { from, to } = *piece {
            let job = grants[i].task.job();
            let key = (job.adapter().id(), job.compiled().state_ids(), from, to);
            match first_of.get(&key) {
                Some(&j) => twin[i] = Some(j),
                None => {
                    first_of.insert(key, i);
                }
            }
        }
    }
    twin
}

/// A question's row from a snapshot taken after `aligned` state tokens: the state's remaining tokens, then the
/// question's; its wanted rows are the options' `<|box_end|>`s and the `<|fim_suffix|>`, shifted by `aligned`.
fn branch_row(state_ids: &[u32], aligned: usize, branch: &Branch) -> (Vec<u32>, Vec<usize>) {
    let tail = &state_ids[aligned..];
    let mut tokens = Vec::with_capacity(tail.len() + branch.len());
    tokens.extend_from_slice(tail);
    tokens.extend_from_slice(branch.ids());
    let wanted = branch
        .option_ends()
        .iter()
        .map(|&k| k - aligned)
        .chain(std::iter::once(branch.decide() - aligned))
        .collect();
    (tokens, wanted)
}

impl<B: Backend> Kev<B> {
    /// A task for an admitted job (owned, or borrowed: any `J: Borrow<Job>`).
    pub fn task<J: Borrow<Job>>(&self, job: J) -> Task<B::State, J> {
        let compiled = job.borrow().compiled();
        let ids = compiled.state_ids();
        let aligned = self.split_at(ids.len());
        let tail = ids.len() - aligned;
        let row_lens = compiled.branches().iter().map(|b| tail + b.len()).collect();
        Task {
            job,
            aligned,
            row_lens,
            progress: Progress::Fresh,
        }
    }

    /// What the task has left (a fresh task's prefix counts in full: the cache is asked when it starts).
    pub fn need<J: Borrow<Job>>(&self, task: &Task<B::State, J>) -> Need {
        let rows: usize = task.row_lens.iter().sum();
        match &task.progress {
            Progress::Fresh | Progress::Prefix { .. } => {
                let done = match &task.progress {
                    Progress::Prefix { done, .. } => *done,
                    _ => 0,
                };
                let phase = task.aligned - done;
                if phase == 0 {
                    return Self::rows_need(task, 0);
                }
                Need {
                    phase,
                    unit: phase.min(self.backend().snapshot_grain()),
                    remaining: phase + rows,
                }
            }
            Progress::Branches { next, .. } => Self::rows_need(task, *next),
            Progress::Finished => Need::default(),
        }
    }

    fn rows_need<J>(task: &Task<B::State, J>, next: usize) -> Need {
        let phase: usize = task.row_lens[next..].iter().sum();
        Need {
            phase,
            unit: task.row_lens.get(next).copied().unwrap_or(0),
            remaining: phase,
        }
    }

    /// What the task would run for a grant of `tokens` (a fresh task as if its prefix were not cached).
    pub(crate) fn piece<J>(&self, task: &Task<B::State, J>, tokens: usize) -> Piece {
        let (prefix_done, next) = match &task.progress {
            Progress::Fresh if task.aligned > 0 => (Some(0), 0),
            Progress::Fresh => (None, 0),
            Progress::Prefix { done, .. } => (Some(*done), 0),
            Progress::Branches { next, .. } => (None, *next),
            Progress::Finished => return Piece::Finished,
        };
        if let Some(done) = prefix_done {
            let left = task.aligned - done;
            let take = if tokens >= left {
                left
            } else {
                let grain = self.backend().snapshot_grain();
                (tokens / grain * grain).max(grain).min(left)
            };
            return Piece::Prefix {
                from: done,
                to: done + take,
            };
        }
        let mut to = next;
        let mut sum = 0;
        while to < task.row_lens.len() && (to == next || sum + task.row_lens[to] <= tokens) {
            sum += task.row_lens[to];
            to += 1;
        }
        Piece::Rows { from: next, to }
    }

    /// Tokens a piece runs.
    pub(crate) fn piece_tokens<J>(task: &Task<B::State, J>, piece: Piece) -> usize {
        match piece {
            Piece::Prefix { from, to } => to - from,
            Piece::Rows { from, to } => task.row_lens[from..to].iter().sum(),
            Piece::Finished => 0,
        }
    }

    /// One forward pass over the granted tasks, in `lane`. Per grant, in order: whether the task finished.
    pub fn pass<J: Borrow<Job>>(
        &self,
        grants: &mut [Grant<'_, B::State, J>],
        lane: Lane,
    ) -> Vec<Step> {
        // Adapters removed while their last jobs ran go now that those are done.
        self.sweep_adapters();
        // 1. What each task runs; a fresh task asks the cache first.
        let mut pieces = Vec::with_capacity(grants.len());
        for g in grants.iter_mut() {
            if matches!(g.task.progress, Progress::Fresh) {
                self.start(g.task);
            }
            pieces.push(self.piece(g.task, g.tokens));
        }
        // 2. Identical prefix pieces run once; the twins copy the result.
        let twin = twins(grants, &pieces);
        // 3. The rows of the pass, run.
        let (srcs, mut states) = self.pass_rows(grants, &pieces, &twin);
        let result = self.run_rows(&srcs, &mut states, lane);
        // 4. Progress.
        let mut steps: Vec<Step> = pieces
            .iter()
            .map(|p| match p {
                Piece::Finished => Step::Done(Err(DecideError::Unanswered(
                    "granted a pass after its answer was returned",
                ))),
                _ => Step::Running,
            })
            .collect();
        let hidden = match result {
            Ok(h) => h,
            Err(e) => {
                // The pass's error is every task's in it (the engine cannot say whose row failed).
                let e = Arc::new(e);
                for (i, piece) in pieces.iter().enumerate() {
                    if *piece != Piece::Finished {
                        grants[i].task.progress = Progress::Finished;
                        steps[i] = Step::Done(Err(DecideError::Engine(Arc::clone(&e))));
                    }
                }
                return steps;
            }
        };
        let mut out = self.outputs(grants, &pieces, &srcs, (states, hidden));
        for (i, step) in steps.iter_mut().enumerate() {
            if let Some(done) = self.advance(&mut grants[i], (pieces[i], twin[i]), &mut out, i) {
                *step = Step::Done(done);
            }
        }
        steps
    }

    /// The rows of a pass: prefix pieces continue their task's state (twins run once), branch rows a clone
    /// of the snapshot, each under its task's adapter.
    fn pass_rows<J: Borrow<Job>>(
        &self,
        grants: &[Grant<'_, B::State, J>],
        pieces: &[Piece],
        twin: &[Option<usize>],
    ) -> (Vec<RowSrc<B::Adapter>>, Vec<B::State>) {
        let mut srcs = Vec::new();
        let mut states = Vec::new();
        for (i, piece) in pieces.iter().enumerate() {
            let task = &*grants[i].task;
            let compiled = task.job().compiled();
            let ids = compiled.state_ids();
            let lora = self.adapter_of(task.job()).lora.clone();
            match (*piece, &task.progress) {
                (Piece::Prefix { from, to }, Progress::Prefix { state, .. })
                    if twin[i].is_none() =>
                {
                    states.push(state.clone());
                    srcs.push(RowSrc {
                        grant: i,
                        tokens: ids[from..to].to_vec(),
                        wanted: Vec::new(),
                        lora,
                    });
                }
                (Piece::Rows { from, to }, Progress::Branches { snapshot, .. }) => {
                    for b in &compiled.branches()[from..to] {
                        let (tokens, wanted) = branch_row(ids, snapshot.aligned, b);
                        states.push(snapshot.state.clone());
                        srcs.push(RowSrc {
                            grant: i,
                            tokens,
                            wanted,
                            lora: lora.clone(),
                        });
                    }
                }
                _ => {}
            }
        }
        (srcs, states)
    }

    /// Run the pass's rows in `lane`: each row's hidden states at its wanted positions.
    fn run_rows(
        &self,
        srcs: &[RowSrc<B::Adapter>],
        states: &mut [B::State],
        lane: Lane,
    ) -> Result<Vec<Vec<f32>>, kev_engine::EngineError> {
        if srcs.is_empty() {
            return Ok(Vec::new());
        }
        let mut rows: Vec<BatchRow<'_, B::State, B::Adapter>> = states
            .iter_mut()
            .zip(srcs)
            .map(|(state, s)| BatchRow {
                state,
                tokens: &s.tokens,
                wanted: &s.wanted,
                adapter: s.lora.as_deref(),
            })
            .collect();
        self.count_pass(rows.len());
        match lane {
            Lane::Foreground => {
                let _fg = self.lanes().foreground();
                self.backend().forward(&mut rows, None)
            }
            Lane::Background => self.backend().forward(&mut rows, Some(&**self.lanes())),
        }
    }

    /// What the rows gave each grant: a prefix piece's new state, a branch piece's readouts (in question
    /// order from the piece's first question).
    fn outputs<J: Borrow<Job>>(
        &self,
        grants: &[Grant<'_, B::State, J>],
        pieces: &[Piece],
        srcs: &[RowSrc<B::Adapter>],
        (states, hidden): (Vec<B::State>, Vec<Vec<f32>>),
    ) -> PassOutputs<B::State> {
        let mut out = PassOutputs {
            prefix_state: (0..grants.len()).map(|_| None).collect(),
            readouts: (0..grants.len()).map(|_| Vec::new()).collect(),
            head_time: vec![std::time::Duration::ZERO; grants.len()],
        };
        for ((src, state), h) in srcs.iter().zip(states).zip(hidden) {
            let g = src.grant;
            match pieces[g] {
                Piece::Prefix { .. } => out.prefix_state[g] = Some(state),
                Piece::Rows { from, .. } => {
                    // Rows run in question order from `from`: the calibration is chosen per question kind.
                    let job = grants[g].task.job();
                    let kind = job.question_kind(from + out.readouts[g].len());
                    let started = std::time::Instant::now();
                    out.readouts[g].push(self.adapter_of(job).head().readout(&h, kind));
                    out.head_time[g] += started.elapsed();
                }
                Piece::Finished => {}
            }
        }
        out
    }

    /// Grant `i`'s task after its piece `(piece, its twin)`: a prefix kept (snapshotted, cached and pinned
    /// once it reaches the aligned point), or readouts added; its answer once every question is read.
    fn advance<J: Borrow<Job>>(
        &self,
        grant: &mut Grant<'_, B::State, J>,
        (piece, twin): (Piece, Option<usize>),
        out: &mut PassOutputs<B::State>,
        i: usize,
    ) -> Option<Result<Decision, DecideError>> {
        let task = &mut *grant.task;
        match piece {
            Piece::Prefix { to, .. } => {
                // Twins copy their representative's state (it comes first, so copy rather than take).
                let state = out.prefix_state[twin.unwrap_or(i)].clone()?;
                if to == task.aligned {
                    let snapshot = Snapshot {
                        state,
                        aligned: task.aligned,
                    };
                    if twin.is_none() {
                        self.remember(task.job(), &snapshot);
                    }
                    self.pin_if_asked(task.job(), &snapshot);
                    task.progress = Progress::Branches {
                        snapshot,
                        next: 0,
                        answered: Readouts::with_capacity(task.row_lens.len()),
                    };
                } else {
                    task.progress = Progress::Prefix { state, done: to };
                }
                None
            }
            Piece::Rows { to, .. } => {
                let finished = if let Progress::Branches { next, answered, .. } = &mut task.progress
                {
                    for r in out.readouts[i].drain(..) {
                        answered.push(r);
                    }
                    answered.took += out.head_time[i];
                    *next = to;
                    to == task.row_lens.len()
                } else {
                    false
                };
                if finished
                    && let Progress::Branches { answered, .. } =
                        std::mem::replace(&mut task.progress, Progress::Finished)
                {
                    return Some(self.respond_to(
                        task.job(),
                        answered.probabilities,
                        answered.logits,
                        answered.took,
                    ));
                }
                None
            }
            Piece::Finished => None,
        }
    }

    /// Begin a task: from the cache when its prefix is there, else from the empty state.
    fn start<J: Borrow<Job>>(&self, task: &mut Task<B::State, J>) {
        let questions = task.row_lens.len();
        let branches = |snapshot| Progress::Branches {
            snapshot,
            next: 0,
            answered: Readouts::with_capacity(questions),
        };
        if task.aligned == 0 {
            let snapshot = Snapshot {
                state: self.backend().new_state(),
                aligned: 0,
            };
            self.pin_if_asked(task.job(), &snapshot);
            task.progress = branches(snapshot);
            return;
        }
        task.progress = match self.cached(task.job()) {
            Some(snapshot) => {
                self.pin_if_asked(task.job(), &snapshot);
                branches(snapshot)
            }
            None => Progress::Prefix {
                state: self.backend().new_state(),
                done: 0,
            },
        };
    }
}
