//! Pinned states: a state's prefix run once and kept by name until it expires or is unpinned, in a byte
//! budget of its own beside the prepared-state cache (the cache evicts by use; a pinned state stays).
//!
//! [`Kev::admit_pin`](crate::Kev::admit_pin) admits the state as a one-question request whose task, when its
//! prefix snapshot is made (or found in the cache), stores that snapshot here under the pin's id
//! ([`PinnedStates::fill`]); a later request on the same state (its token ids equal) starts from the pinned
//! snapshot ([`PinnedStates::snapshot`], asked before the cache), so it runs only its question rows — bit-equal to
//! running the prefix again, as for the cache (the snapshot ends on the 64-token grid). Every entry belongs to
//! an owner (the API key's name, or none): another owner neither finds nor removes it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use serde_json::Value;

use crate::cache::Snapshot;

/// What a pinned state is, as its owner sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct PinInfo {
    /// Its id.
    pub id: String,
    /// The state's tokens (the `<|fim_prefix|>` delimiter included).
    pub tokens: usize,
    /// The bytes it holds (0 while its prefix has not run yet).
    pub bytes: usize,
    /// When it is dropped.
    pub expires_at: SystemTime,
    /// Whether its prefix has run (false only while the pin request is in flight).
    pub ready: bool,
}

struct Entry<S> {
    /// The model identity (adapter, weights, arm) it was run under: only the same one may use it.
    model: u64,
    owner: Option<String>,
    state: Value,
    ids: Vec<u32>,
    snapshot: Option<Snapshot<S>>,
    bytes: usize,
    expires_at: SystemTime,
}

/// Counters for `/metrics`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PinStats {
    /// Pinned states held (ready or not).
    pub entries: u64,
    /// Bytes they hold.
    pub bytes: u64,
    /// The budget.
    pub budget: u64,
}

/// Why a pin could not be kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PinRefused {
    /// The snapshot alone is over the whole budget.
    TooLarge {
        /// Its bytes.
        bytes: usize,
        /// The budget.
        budget: usize,
    },
    /// The budget is held by other pinned states (until they expire or are unpinned).
    Full {
        /// Its bytes.
        bytes: usize,
        /// Bytes free.
        free: usize,
    },
}

/// The pinned states of one model.
pub struct PinnedStates<S> {
    inner: Mutex<HashMap<String, Entry<S>>>,
    budget: usize,
    refused: Mutex<HashMap<String, PinRefused>>,
}

impl<S: Clone> PinnedStates<S> {
    /// A store of at most `budget` bytes (0: pinning is off).
    pub fn new(budget: usize) -> Self {
        PinnedStates {
            inner: Mutex::new(HashMap::new()),
            budget,
            refused: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry<S>>> {
        let mut map = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let now = SystemTime::now();
        map.retain(|_, e| e.expires_at > now);
        map
    }

    /// The byte budget.
    pub fn budget(&self) -> usize {
        self.budget
    }

    /// Reserve an id for a state about to run (its snapshot follows with [`PinnedStates::fill`]).
    pub(crate) fn reserve(
        &self,
        model: u64,
        id: String,
        owner: Option<String>,
        state: Value,
        ids: Vec<u32>,
        ttl: Duration,
    ) {
        let entry = Entry {
            model,
            owner,
            state,
            ids,
            snapshot: None,
            bytes: 0,
            expires_at: SystemTime::now() + ttl,
        };
        self.lock().insert(id, entry);
    }

    /// Keep the snapshot of a reserved pin, or drop the pin when the budget cannot hold it (the refusal is
    /// kept for [`PinnedStates::take_refusal`]).
    pub(crate) fn fill(&self, id: &str, snapshot: &Snapshot<S>, bytes: usize) {
        let mut map = self.lock();
        let held: usize = map.values().map(|e| e.bytes).sum();
        let Some(entry) = map.get_mut(id) else {
            return; // unpinned or expired meanwhile
        };
        let bytes = bytes + entry.ids.len() * 4;
        let refusal = if bytes > self.budget {
            Some(PinRefused::TooLarge {
                bytes,
                budget: self.budget,
            })
        } else if held + bytes > self.budget {
            Some(PinRefused::Full {
                bytes,
                free: self.budget - held,
            })
        } else {
            None
        };
        match refusal {
            None => {
                entry.snapshot = Some(snapshot.clone());
                entry.bytes = bytes;
            }
            Some(r) => {
                map.remove(id);
                drop(map);
                self.refused
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(id.to_owned(), r);
            }
        }
    }

    /// Why pin `id` was dropped when its snapshot came, if it was (asked once).
    pub fn take_refusal(&self, id: &str) -> Option<PinRefused> {
        self.refused
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id)
    }

    /// The snapshot pinned for exactly these state ids under `model`, if any.
    pub(crate) fn snapshot(&self, model: u64, ids: &[u32]) -> Option<Snapshot<S>> {
        self.lock()
            .values()
            .find(|e| e.snapshot.is_some() && e.model == model && e.ids == ids)
            .and_then(|e| e.snapshot.clone())
    }

    /// Whether a task with these state ids should pin its snapshot under `id`.
    pub(crate) fn wants(&self, id: &str) -> bool {
        self.lock().get(id).is_some_and(|e| e.snapshot.is_none())
    }

    /// Pin `id` as `owner` sees it.
    pub fn info(&self, id: &str, owner: Option<&str>) -> Option<PinInfo> {
        let map = self.lock();
        let e = map.get(id).filter(|e| e.owner.as_deref() == owner)?;
        Some(PinInfo {
            id: id.to_owned(),
            tokens: e.ids.len(),
            bytes: e.bytes,
            expires_at: e.expires_at,
            ready: e.snapshot.is_some(),
        })
    }

    /// The state (JSON, as sent) of pin `id`, for `owner`.
    pub fn state(&self, id: &str, owner: Option<&str>) -> Option<Value> {
        let map = self.lock();
        map.get(id)
            .filter(|e| e.owner.as_deref() == owner)
            .map(|e| e.state.clone())
    }

    /// Unpin `id` (only its owner can); whether it was there.
    pub fn remove(&self, id: &str, owner: Option<&str>) -> bool {
        let mut map = self.lock();
        if map.get(id).is_some_and(|e| e.owner.as_deref() == owner) {
            map.remove(id);
            true
        } else {
            false
        }
    }

    /// Counters.
    pub fn stats(&self) -> PinStats {
        let map = self.lock();
        PinStats {
            entries: map.len() as u64,
            bytes: map.values().map(|e| e.bytes as u64).sum(),
            budget: self.budget as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(v: u32) -> Snapshot<Vec<u32>> {
        Snapshot {
            state: vec![v],
            aligned: 64,
        }
    }

    #[test]
    fn a_pin_is_found_by_its_ids_and_only_by_its_owner() {
        let p = PinnedStates::new(1000);
        p.reserve(
            0,
            "a".into(),
            Some("alice".into()),
            Value::from("s"),
            vec![1, 2],
            Duration::from_secs(60),
        );
        assert!(p.wants("a"));
        assert!(p.snapshot(0, &[1, 2]).is_none(), "not ready yet");
        p.fill("a", &snap(7), 100);
        assert!(!p.wants("a"));
        assert_eq!(p.snapshot(0, &[1, 2]).map(|s| s.state), Some(vec![7]));
        assert!(p.snapshot(0, &[1]).is_none());
        assert!(
            p.snapshot(1, &[1, 2]).is_none(),
            "another adapter's identity never finds it"
        );
        let info = p.info("a", Some("alice")).unwrap();
        assert_eq!((info.tokens, info.bytes, info.ready), (2, 108, true));
        assert!(p.info("a", None).is_none() && p.info("a", Some("bob")).is_none());
        assert!(p.state("a", Some("bob")).is_none());
        assert!(!p.remove("a", Some("bob")));
        assert!(p.remove("a", Some("alice")));
        assert!(p.snapshot(0, &[1, 2]).is_none());
        assert_eq!(p.stats().bytes, 0);
    }

    #[test]
    fn the_budget_refuses_what_it_cannot_hold_and_expiry_frees_it() {
        let p = PinnedStates::new(300);
        p.reserve(
            0,
            "big".into(),
            None,
            Value::Null,
            vec![1],
            Duration::from_secs(60),
        );
        p.fill("big", &snap(1), 1000);
        assert!(matches!(
            p.take_refusal("big"),
            Some(PinRefused::TooLarge { .. })
        ));
        assert!(p.info("big", None).is_none());
        p.reserve(
            0,
            "a".into(),
            None,
            Value::Null,
            vec![1],
            Duration::from_secs(60),
        );
        p.fill("a", &snap(1), 196);
        p.reserve(
            0,
            "b".into(),
            None,
            Value::Null,
            vec![2],
            Duration::from_secs(60),
        );
        p.fill("b", &snap(2), 196);
        assert_eq!(
            p.take_refusal("b"),
            Some(PinRefused::Full {
                bytes: 200,
                free: 100
            })
        );
        // An expired pin is gone and its bytes free.
        p.reserve(0, "c".into(), None, Value::Null, vec![3], Duration::ZERO);
        assert!(p.info("c", None).is_none());
        assert_eq!(p.stats().bytes, 200);
    }
}
