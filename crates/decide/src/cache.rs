//! The prepared-state cache: snapshots of the backbone state after a request's state prefix, keyed by
//! the model's identity and the *exact* state token ids, evicted least-recently-used to stay within a
//! byte budget.
//!
//! Keys hold the full id sequence, so a hit means token-equal, never just hash-equal. A snapshot is
//! taken where the prefix ends on a multiple of the GDN chunk (64 tokens): the state's last
//! `len % 64` tokens are re-run with every branch, which makes a branch from the cache bit-equal to the
//! same row run from zero (see the crate README).

use std::hash::Hash;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// A cached snapshot: the state after `aligned` tokens of the prefix.
#[derive(Clone)]
pub struct Snapshot<S> {
    /// Backend state after the first `aligned` prefix tokens.
    pub state: S,
    /// How many prefix tokens the state has consumed.
    pub aligned: usize,
}

#[derive(PartialEq, Eq, Hash, Clone)]
struct Key {
    model: u64,
    ids: Vec<u32>,
}

struct Inner<S> {
    map: lru::LruCache<Key, (Snapshot<S>, usize)>,
    bytes: usize,
}

/// Counters since start.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CacheStats {
    /// Lookups answered from the cache.
    pub hits: u64,
    /// Lookups that were not.
    pub misses: u64,
    /// Bytes held now.
    pub bytes: u64,
    /// Entries held now.
    pub entries: u64,
}

/// An LRU of state snapshots bounded in bytes (a budget of 0 disables caching).
pub struct PrefixCache<S> {
    inner: Mutex<Inner<S>>,
    budget: usize,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl<S: Clone> PrefixCache<S> {
    /// A cache holding at most `budget` bytes of snapshots.
    pub fn new(budget: usize) -> Self {
        PrefixCache {
            inner: Mutex::new(Inner {
                map: lru::LruCache::unbounded(),
                bytes: 0,
            }),
            budget,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<S>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The snapshot for exactly these state ids of this model, if cached (a clone: the cached one is never
    /// disturbed by what the caller runs next).
    pub fn get(&self, model: u64, ids: &[u32]) -> Option<Snapshot<S>> {
        let key = Key {
            model,
            ids: ids.to_vec(),
        };
        let found = self.lock().map.get(&key).map(|(s, _)| s.clone());
        match found {
            Some(_) => self.hits.fetch_add(1, Ordering::Relaxed),
            None => self.misses.fetch_add(1, Ordering::Relaxed),
        };
        found
    }

    /// Keep a snapshot of `bytes` bytes, evicting the least recently used ones to stay within budget.
    /// A snapshot larger than the whole budget is not kept.
    pub fn put(&self, model: u64, ids: &[u32], snapshot: Snapshot<S>, bytes: usize) {
        let bytes = bytes + ids.len() * 4;
        if bytes > self.budget {
            return;
        }
        let mut inner = self.lock();
        let key = Key {
            model,
            ids: ids.to_vec(),
        };
        if let Some((_, old)) = inner.map.pop(&key) {
            inner.bytes -= old;
        }
        while inner.bytes + bytes > self.budget {
            match inner.map.pop_lru() {
                Some((_, (_, b))) => inner.bytes -= b,
                None => break,
            }
        }
        inner.bytes += bytes;
        inner.map.put(key, (snapshot, bytes));
    }

    /// Hits, misses and size.
    pub fn stats(&self) -> CacheStats {
        let inner = self.lock();
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            bytes: inner.bytes as u64,
            entries: inner.map.len() as u64,
        }
    }

    /// Drop every snapshot of `model` (its adapter was removed).
    pub fn forget(&self, model: u64) {
        let mut inner = self.lock();
        let keys: Vec<Key> = inner
            .map
            .iter()
            .filter(|(k, _)| k.model == model)
            .map(|(k, _)| k.clone())
            .collect();
        for k in keys {
            if let Some((_, b)) = inner.map.pop(&k) {
                inner.bytes -= b;
            }
        }
    }

    /// Drop every snapshot (e.g. under memory pressure).
    pub fn clear(&self) {
        let mut inner = self.lock();
        inner.map.clear();
        inner.bytes = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(v: u32) -> Snapshot<Vec<u32>> {
        Snapshot {
            state: vec![v],
            aligned: 0,
        }
    }

    #[test]
    fn hit_requires_equal_ids_and_model() {
        let c = PrefixCache::new(1 << 20);
        c.put(1, &[1, 2, 3], snap(7), 100);
        assert_eq!(c.get(1, &[1, 2, 3]).map(|s| s.state), Some(vec![7]));
        assert!(c.get(1, &[1, 2]).is_none());
        assert!(c.get(1, &[1, 2, 3, 4]).is_none());
        assert!(c.get(2, &[1, 2, 3]).is_none());
        let s = c.stats();
        assert_eq!((s.hits, s.misses, s.entries), (1, 3, 1));
    }

    #[test]
    fn evicts_least_recently_used_within_budget() {
        let c = PrefixCache::new(300);
        c.put(1, &[1], snap(1), 96); // 100 bytes with the key
        c.put(1, &[2], snap(2), 96);
        c.put(1, &[3], snap(3), 96);
        assert!(c.get(1, &[1]).is_some()); // [2] is now the least recently used
        c.put(1, &[4], snap(4), 96);
        assert!(c.get(1, &[2]).is_none());
        assert!(c.get(1, &[1]).is_some());
        assert!(c.get(1, &[3]).is_some());
        assert!(c.get(1, &[4]).is_some());
        assert_eq!(c.stats().bytes, 300);
        // Larger than the whole budget: not kept, nothing evicted.
        c.put(1, &[5], snap(5), 1000);
        assert!(c.get(1, &[5]).is_none());
        assert_eq!(c.stats().entries, 3);
        c.clear();
        assert_eq!(c.stats().bytes, 0);
    }

    #[test]
    fn replacing_a_key_keeps_the_byte_count_right() {
        let c = PrefixCache::new(1000);
        c.put(1, &[1], snap(1), 96);
        c.put(1, &[1], snap(2), 196);
        assert_eq!(c.stats().bytes, 200);
        assert_eq!(c.get(1, &[1]).map(|s| s.state), Some(vec![2]));
    }
}
