//! Answering a batch at once (`kev decide`, the Python package, `kev calibrate`, `kev eval`, `kev accept`, the
//! benches): [`Kev::run`] makes the jobs' tasks and drives them through [`Kev::pass`] — the executor `kev serve`
//! drives from its scheduler — until every one is answered. Only the choice of grants is this module's
//! ([`fill`]): no latency to protect, so each pass is simply filled in request order up to `pass_tokens`.

use std::collections::HashMap;

use kev_engine::Backend;

use crate::service::{DecideError, Decision, Job, Kev};
use crate::task::{Grant, Lane, Need, Step, Task};

impl<B: Backend> Kev<B> {
    /// Answer one request body end to end (`kev decide`).
    pub fn decide(&self, body: &[u8]) -> Result<Result<Decision, DecideError>, crate::Refusal> {
        let job = self.admit(body)?;
        Ok(self
            .run(&[&job])
            .pop()
            .unwrap_or(Err(DecideError::Unanswered("no result"))))
    }

    /// Answer admitted requests together: their state prefixes and question branches share passes, and
    /// identical state prefixes run once. One result per job, in order.
    pub fn run(&self, jobs: &[&Job]) -> Vec<Result<Decision, DecideError>> {
        let mut tasks: Vec<Task<B::State, &Job>> = jobs.iter().map(|j| self.task(*j)).collect();
        let mut out: Vec<Option<Result<Decision, DecideError>>> =
            (0..tasks.len()).map(|_| None).collect();
        loop {
            let plan = {
                let open: Vec<Open<'_>> = tasks
                    .iter()
                    .enumerate()
                    .filter(|(_, t)| !t.is_finished())
                    .map(|(i, t)| Open {
                        index: i,
                        need: self.need(t),
                        prefix: t.prefix_point(),
                        takes: Box::new(|grant| Self::piece_tokens(t, self.piece(t, grant))),
                    })
                    .collect();
                fill(&open, self.settings().pass_tokens)
            };
            if plan.is_empty() {
                break;
            }
            let mut granted: Vec<Option<usize>> = vec![None; tasks.len()];
            for &(i, tokens) in &plan {
                granted[i] = Some(tokens);
            }
            let (order, mut grants): (Vec<usize>, Vec<Grant<'_, B::State, &Job>>) = tasks
                .iter_mut()
                .enumerate()
                .filter_map(|(i, task)| granted[i].map(|tokens| (i, Grant { task, tokens })))
                .unzip();
            for (i, step) in order
                .into_iter()
                .zip(self.pass(&mut grants, Lane::Foreground))
            {
                if let Step::Done(result) = step {
                    out[i] = Some(result);
                }
            }
        }
        out.into_iter()
            .map(|r| r.unwrap_or(Err(DecideError::Unanswered("no result"))))
            .collect()
    }
}

/// An unfinished task as [`fill`] sees it.
pub(crate) struct Open<'a> {
    /// Its position among the tasks.
    pub index: usize,
    /// What it has left.
    pub need: Need,
    /// Where its state prefix stands, while it has one to run (`Task::prefix_point`).
    pub prefix: Option<(&'a [u32], usize)>,
    /// Tokens a grant would make it run.
    pub takes: Box<dyn Fn(usize) -> usize + 'a>,
}

/// One pass's grants, `(index, tokens)`: the open tasks in order, each granted what is left of the `budget`
/// while its smallest piece fits (the first always, so a row longer than the budget runs alone). A task at
/// the same prefix point as one already granted (the same state, as far along) gets the same grant at no
/// cost: their piece is identical and [`Kev::pass`] runs it once, so identical state prefixes in a batch
/// run once. Empty when nothing is open.
pub(crate) fn fill(open: &[Open<'_>], budget: usize) -> Vec<(usize, usize)> {
    let mut left = budget.max(1);
    let mut out = Vec::new();
    let mut riding: HashMap<(&[u32], usize), usize> = HashMap::new();
    for t in open {
        if let Some(point) = t.prefix
            && let Some(&grant) = riding.get(&point)
        {
            out.push((t.index, grant));
            continue;
        }
        if !out.is_empty() && t.need.unit > left {
            continue;
        }
        let grant = left.max(t.need.unit);
        out.push((t.index, grant));
        if let Some(point) = t.prefix {
            riding.insert(point, grant);
        }
        left = left.saturating_sub((t.takes)(grant));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tasks of single rows of these lengths (a row is taken whole or not at all).
    fn rows(lens: &[usize]) -> Vec<Open<'static>> {
        lens.iter()
            .enumerate()
            .map(|(index, &len)| Open {
                index,
                need: Need {
                    phase: len,
                    unit: len,
                    remaining: len,
                },
                prefix: None,
                takes: Box::new(move |_| len),
            })
            .collect()
    }

    /// Passes until every row ran, as `fill` forms them.
    fn passes(lens: &[usize], budget: usize) -> Vec<Vec<usize>> {
        let mut open = rows(lens);
        let mut out = Vec::new();
        loop {
            let plan = fill(&open, budget);
            if plan.is_empty() {
                return out;
            }
            let ran: Vec<usize> = plan.iter().map(|&(i, _)| i).collect();
            open.retain(|t| !ran.contains(&t.index));
            out.push(ran);
        }
    }

    #[test]
    fn passes_respect_the_budget_and_keep_order() {
        assert_eq!(
            passes(&[10, 20, 30, 50, 5], 60),
            vec![vec![0, 1, 2], vec![3, 4]]
        );
        assert_eq!(passes(&[100, 1], 60), vec![vec![0], vec![1]]);
        assert!(passes(&[], 60).is_empty());
    }

    #[test]
    fn tasks_at_the_same_prefix_point_ride_along_free() {
        static IDS: [u32; 3] = [1, 2, 3];
        static OTHER: [u32; 3] = [1, 2, 4];
        // 128-token prefixes, cut at multiples of 64.
        let prefix = |index, ids: &'static [u32]| Open {
            index,
            need: Need {
                phase: 128,
                unit: 64,
                remaining: 200,
            },
            prefix: Some((ids, 0)),
            takes: Box::new(|grant: usize| (grant / 64 * 64).clamp(64, 128)),
        };
        let open = [prefix(0, &IDS), prefix(1, &OTHER), prefix(2, &IDS)];
        // The first prefix takes 128 of the budget, the other prefix the rest; the first's twin rides along at
        // its grant, whatever is left.
        assert_eq!(fill(&open, 256), vec![(0, 256), (1, 128), (2, 256)]);
        assert_eq!(fill(&open, 128), vec![(0, 128), (2, 128)]);
    }
}
