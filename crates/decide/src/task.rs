//! Requests in flight, advanced one engine pass at a time, so that a scheduler can interleave the passes of
//! many requests (a long state does not hold the engine until it is done).
//!
//! A [`Task`] is an admitted [`Job`] plus its progress:
//! 1. **prefix**: the state prefix `S[..aligned]` (aligned = the last multiple of 64, see [`crate::service`])
//!    runs from zero in *chunks*, each ending on a multiple of 64 tokens, the backend state carried from one
//!    chunk to the next. The chunked GDN and the attention over the cache split work at the same 64-token
//!    boundaries whether the prefix runs at once or in pieces, so a chunked prefix is bit-equal to the one-pass
//!    prefix (tested against [`Kev::run`] on every fixture);
//! 2. **branches**: every question's row continues from a clone of that snapshot, as many rows per pass as the
//!    grant allows (at least one);
//! 3. **done**: the head and the answer, as in [`Kev::run`].
//!
//! [`Kev::need`] says what a task has left, [`Kev::pass`] runs one forward pass over several tasks, each
//! advanced by at most its grant of tokens (always by at least one unit: 64 prefix tokens or one row).

use std::collections::HashMap;

use kev_engine::{Backend, BatchRow};

use crate::cache::Snapshot;
use crate::service::{DecideError, Decision, Job, Kev};

/// What a task has left to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Need {
    /// Tokens of its current phase (the rest of the prefix, or every branch row left).
    pub phase: usize,
    /// The smallest piece of the phase one pass can run: 64 prefix tokens, or the next branch row.
    pub unit: usize,
    /// Tokens of everything left (phase and the branches after it).
    pub remaining: usize,
}

enum Progress<S> {
    /// The prefix has not started; the cache is asked when it does.
    Fresh,
    /// `done` of `aligned` prefix tokens have run into `state`.
    Prefix { state: S, done: usize },
    /// Branches from `snapshot`: rows `0..next` have run.
    Branches {
        snapshot: Snapshot<S>,
        next: usize,
        probabilities: Vec<Vec<f32>>,
    },
    /// Answered or failed (taken by [`Kev::pass`]).
    Finished,
}

/// A request in flight.
pub struct Task<S> {
    job: Job,
    aligned: usize,
    row_lens: Vec<usize>,
    progress: Progress<S>,
}

impl<S> Task<S> {
    /// The admitted job.
    pub fn job(&self) -> &Job {
        &self.job
    }
}

/// One task's share of a pass.
pub struct Grant<'a, S> {
    /// The task.
    pub task: &'a mut Task<S>,
    /// Most tokens it may run in this pass (it always runs at least one unit).
    pub tokens: usize,
}

/// What a pass did for one task.
pub enum Step {
    /// More passes needed.
    Running,
    /// The answer (or this task's failure).
    Done(Result<Decision, DecideError>),
}

/// Where a task's rows come from in a pass.
enum Piece {
    /// Prefix tokens `from..to` into the task's own state (or a copy of a twin's, see `twin`).
    Prefix { from: usize, to: usize },
    /// Branch rows `from..to`.
    Rows { from: usize, to: usize },
    /// Nothing to run (the cache answered the prefix).
    Skip,
}

impl<B: Backend> Kev<B> {
    /// A task for an admitted job.
    pub fn task(&self, job: Job) -> Task<B::State> {
        let ids = job.compiled().state_ids();
        let aligned = self.split_at(ids.len());
        let tail = ids.len() - aligned;
        let row_lens = job
            .compiled()
            .branches()
            .iter()
            .map(|b| tail + b.len())
            .collect();
        Task {
            job,
            aligned,
            row_lens,
            progress: Progress::Fresh,
        }
    }

    /// What the task has left.
    pub fn need(&self, task: &Task<B::State>) -> Need {
        let rows: usize = task.row_lens.iter().sum();
        match &task.progress {
            Progress::Fresh | Progress::Prefix { .. } => {
                let done = match &task.progress {
                    Progress::Prefix { done, .. } => *done,
                    _ => 0,
                };
                let phase = task.aligned - done;
                if phase == 0 {
                    return self.rows_need(task, 0);
                }
                Need {
                    phase,
                    unit: phase.min(self.backend().snapshot_grain()),
                    remaining: phase + rows,
                }
            }
            Progress::Branches { next, .. } => self.rows_need(task, *next),
            Progress::Finished => Need {
                phase: 0,
                unit: 0,
                remaining: 0,
            },
        }
    }

    fn rows_need(&self, task: &Task<B::State>, next: usize) -> Need {
        let phase: usize = task.row_lens[next..].iter().sum();
        Need {
            phase,
            unit: task.row_lens.get(next).copied().unwrap_or(0),
            remaining: phase,
        }
    }

    /// One forward pass over the granted tasks. Per grant, in order: whether the task finished.
    pub fn pass(&self, grants: &mut [Grant<'_, B::State>]) -> Vec<Step> {
        // 1. What each task runs; a fresh task asks the cache first.
        let mut pieces = Vec::with_capacity(grants.len());
        for g in grants.iter_mut() {
            let task = &mut *g.task;
            if matches!(task.progress, Progress::Fresh) {
                self.start(task);
            }
            let piece = match &task.progress {
                Progress::Prefix { done, .. } => {
                    let left = task.aligned - done;
                    let take = if g.tokens >= left {
                        left
                    } else {
                        let grain = self.backend().snapshot_grain();
                        (g.tokens / grain * grain).max(grain).min(left)
                    };
                    Piece::Prefix {
                        from: *done,
                        to: done + take,
                    }
                }
                Progress::Branches { next, .. } => {
                    let mut to = *next;
                    let mut sum = 0;
                    while to < task.row_lens.len()
                        && (to == *next || sum + task.row_lens[to] <= g.tokens)
                    {
                        sum += task.row_lens[to];
                        to += 1;
                    }
                    Piece::Rows { from: *next, to }
                }
                Progress::Fresh | Progress::Finished => Piece::Skip,
            };
            pieces.push(piece);
        }

        // 2. Identical prefix pieces (same state ids, same span) run once; the twins copy the result.
        let mut first_of: HashMap<(&[u32], usize, usize), usize> = HashMap::new();
        let mut twin: Vec<Option<usize>> = vec![None; grants.len()];
        for (i, piece) in pieces.iter().enumerate() {
            if let Piece::Prefix { from, to } = piece {
                let ids = grants[i].task.job.compiled().state_ids();
                match first_of.get(&(ids, *from, *to)) {
                    Some(&j) => twin[i] = Some(j),
                    None => {
                        first_of.insert((ids, *from, *to), i);
                    }
                }
            }
        }

        // 3. The rows of the pass.
        struct RowSrc {
            grant: usize,
            tokens: Vec<u32>,
            wanted: Vec<usize>,
        }
        let mut srcs: Vec<RowSrc> = Vec::new();
        let mut states: Vec<B::State> = Vec::new();
        for (i, piece) in pieces.iter().enumerate() {
            let task = &*grants[i].task;
            let ids = task.job.compiled().state_ids();
            match piece {
                Piece::Prefix { from, to } if twin[i].is_none() => {
                    let Progress::Prefix { state, .. } = &task.progress else {
                        continue;
                    };
                    states.push(state.clone());
                    srcs.push(RowSrc {
                        grant: i,
                        tokens: ids[*from..*to].to_vec(),
                        wanted: Vec::new(),
                    });
                }
                Piece::Rows { from, to } => {
                    let Progress::Branches { snapshot, .. } = &task.progress else {
                        continue;
                    };
                    let tail = &ids[snapshot.aligned..];
                    let off = snapshot.aligned;
                    for b in &task.job.compiled().branches()[*from..*to] {
                        let mut tokens = Vec::with_capacity(tail.len() + b.len());
                        tokens.extend_from_slice(tail);
                        tokens.extend_from_slice(b.ids());
                        let wanted = b
                            .option_ends()
                            .iter()
                            .map(|&k| k - off)
                            .chain(std::iter::once(b.decide() - off))
                            .collect();
                        states.push(snapshot.state.clone());
                        srcs.push(RowSrc {
                            grant: i,
                            tokens,
                            wanted,
                        });
                    }
                }
                _ => {}
            }
        }
        let result = if srcs.is_empty() {
            Ok(Vec::new())
        } else {
            let mut rows: Vec<BatchRow<'_, B::State>> = states
                .iter_mut()
                .zip(&srcs)
                .map(|(state, s)| BatchRow {
                    state,
                    tokens: &s.tokens,
                    wanted: &s.wanted,
                })
                .collect();
            self.count_pass(rows.len());
            self.backend().forward(&mut rows)
        };

        // 4. Progress.
        let mut steps: Vec<Step> = (0..grants.len()).map(|_| Step::Running).collect();
        let hidden = match result {
            Ok(h) => h,
            Err(e) => {
                let e = std::sync::Arc::new(e);
                for (i, piece) in pieces.iter().enumerate() {
                    if !matches!(piece, Piece::Skip) {
                        grants[i].task.progress = Progress::Finished;
                        steps[i] = Step::Done(Err(DecideError::Engine(std::sync::Arc::clone(&e))));
                    }
                }
                return steps;
            }
        };
        let mut prefix_state: Vec<Option<B::State>> = (0..grants.len()).map(|_| None).collect();
        let mut rows_out: Vec<Vec<Vec<f32>>> = (0..grants.len()).map(|_| Vec::new()).collect();
        for ((src, state), h) in srcs.iter().zip(states).zip(hidden) {
            match pieces[src.grant] {
                Piece::Prefix { .. } => prefix_state[src.grant] = Some(state),
                Piece::Rows { from, .. } => {
                    // Rows run in question order from `from`: the calibration is chosen per question kind.
                    let g = src.grant;
                    let kind = grants[g].task.job.question_kind(from + rows_out[g].len());
                    rows_out[g].push(self.head().probabilities_for(&h, kind));
                }
                Piece::Skip => rows_out[src.grant].push(self.head().probabilities(&h)),
            }
        }
        for i in 0..grants.len() {
            match pieces[i] {
                Piece::Prefix { to, .. } => {
                    // Twins copy their representative's state (it comes first, so copy rather than take).
                    let state = prefix_state[twin[i].unwrap_or(i)].clone();
                    let Some(state) = state else { continue };
                    let task = &mut *grants[i].task;
                    if to == task.aligned {
                        let snapshot = Snapshot {
                            state,
                            aligned: task.aligned,
                        };
                        if twin[i].is_none() {
                            self.remember(task.job.compiled().state_ids(), &snapshot);
                        }
                        task.progress = Progress::Branches {
                            snapshot,
                            next: 0,
                            probabilities: Vec::with_capacity(task.row_lens.len()),
                        };
                    } else {
                        task.progress = Progress::Prefix { state, done: to };
                    }
                }
                Piece::Rows { to, .. } => {
                    let task = &mut *grants[i].task;
                    let finished = if let Progress::Branches {
                        next,
                        probabilities,
                        ..
                    } = &mut task.progress
                    {
                        probabilities.append(&mut rows_out[i]);
                        *next = to;
                        to == task.row_lens.len()
                    } else {
                        false
                    };
                    if finished
                        && let Progress::Branches { probabilities, .. } =
                            std::mem::replace(&mut task.progress, Progress::Finished)
                    {
                        steps[i] = Step::Done(self.respond_to(&task.job, probabilities));
                    }
                }
                Piece::Skip => {}
            }
        }
        steps
    }

    /// Begin a task: from the cache when its prefix is there, else from the empty state.
    fn start(&self, task: &mut Task<B::State>) {
        let ids = task.job.compiled().state_ids();
        if task.aligned == 0 {
            task.progress = Progress::Branches {
                snapshot: Snapshot {
                    state: self.backend().new_state(),
                    aligned: 0,
                },
                next: 0,
                probabilities: Vec::with_capacity(task.row_lens.len()),
            };
            return;
        }
        task.progress = match self.cached(ids) {
            Some(snapshot) => Progress::Branches {
                snapshot,
                next: 0,
                probabilities: Vec::with_capacity(task.row_lens.len()),
            },
            None => Progress::Prefix {
                state: self.backend().new_state(),
                done: 0,
            },
        };
    }
}
