//! Pinned states: a state's prefix run once and kept by name until it expires or is unpinned, in a byte
//! budget of its own beside the prepared-state cache (the cache evicts by use; a pinned state stays).
//!
//! A pin's life:
//! 1. **reserved** ([`PinnedStates::reserve`], when its request is admitted): its bytes, estimated from the
//!    snapshots seen so far ([`Estimate`]), count toward its owner's share and the budget at once, so pin
//!    requests in flight cannot together promise more than there is; a request that does not fit is refused
//!    before its prefix runs (429, or 413 when the state could never fit);
//! 2. **filled** ([`PinnedStates::fill`], when its task makes the prefix snapshot): the snapshot's real bytes
//!    replace the estimate, checked again;
//! 3. **pinned** ([`PinnedStates::commit`], when its request is answered 200): only now does it exist for
//!    anyone — its id found by requests, `GET`, `DELETE`, the counters — and only now does its TTL start.
//!
//! A pin request cancelled, abandoned, timed out or refused before step 3 leaves nothing: its reservation is
//! dropped ([`PinnedStates::abandon`]). A later request on the same state (its token ids equal) starts from
//! the pinned snapshot ([`PinnedStates::snapshot`], asked before the cache), so it runs only its question
//! rows — bit-equal to running the prefix again, as for the cache (the snapshot ends on the 64-token grid).
//!
//! Every entry belongs to an owner (the API key's name, or none): another owner neither finds nor removes
//! it. An owner holds at most its **share** ([`PinOrder::share`]: the front end's split of the budget between
//! its keys; the whole budget when it does not say), so one key filling its pins never takes another's.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use kev_contract::{ErrorBody, ErrorKind, WireError};
use serde_json::Value;

use crate::cache::Snapshot;

/// The request extension that names a pinned state: `"x_state_id": ID` puts the pin's state in as the
/// request's `state` (read by admission, `Kev::admit_as`).
pub const STATE_ID_FIELD: &str = "x_state_id";

/// What a pin request asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PinOrder {
    /// The id it will be found by (given to the client only with the 200).
    pub id: String,
    /// The API key's name (`None`: auth is off).
    pub owner: Option<String>,
    /// How long it lives once pinned (from its creation, not from its request's arrival).
    pub ttl: Duration,
    /// The most its owner may hold in pins (`None`: the whole budget).
    pub share: Option<usize>,
}

/// What a pinned state is, as its owner sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct PinInfo {
    /// Its id.
    pub id: String,
    /// The state's tokens (the `<|fim_prefix|>` delimiter included).
    pub tokens: usize,
    /// The bytes it holds.
    pub bytes: usize,
    /// When it is dropped.
    pub expires_at: SystemTime,
}

struct Entry<S> {
    /// The model identity (adapter, weights, arm) it was run under: only the same one may use it.
    model: u64,
    owner: Option<String>,
    state: Value,
    ids: Vec<u32>,
    snapshot: Option<Snapshot<S>>,
    /// Estimated until the snapshot is made, then exact.
    bytes: usize,
    share: usize,
    ttl: Duration,
    /// `None` until its request is answered: it does not exist for anyone yet.
    expires_at: Option<SystemTime>,
}

impl<S> Entry<S> {
    fn pinned(&self) -> bool {
        self.expires_at.is_some()
    }
}

/// Counters for `/metrics`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PinStats {
    /// Pinned states (answered 200, not expired or unpinned).
    pub entries: u64,
    /// Bytes they hold.
    pub bytes: u64,
    /// Bytes reserved by pin requests in flight (estimated until their snapshot is made).
    pub reserved: u64,
    /// The budget.
    pub budget: u64,
}

/// Why a request naming a pin, or asking for one, is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PinRefusal {
    /// No such pin for this owner: it expired, was unpinned, never was, or is another key's (404).
    #[error("no pinned state {}: it expired, was unpinned, or was pinned under another API key", shown(.0))]
    NotFound(String),
    /// The request sent a `state` of its own that is not the pinned one (422).
    #[error("the request's state is not the state pinned as {}: send one of the two", shown(.0))]
    OtherState(String),
    /// The snapshot is larger than all its owner may ever hold (413).
    #[error(
        "this state's snapshot needs {bytes} bytes, over the {limit} bytes of the pinned-state budget this key may hold (--pin-bytes, or the key's pin_bytes)"
    )]
    TooLarge {
        /// The snapshot's bytes (estimated before it is made).
        bytes: usize,
        /// The owner's share (or the budget).
        limit: usize,
    },
    /// The owner's share (or the budget) is held by other pins until they expire or are unpinned (429).
    #[error("{}", full_message(*.bytes, *.free, *.retry_after_s, *.whose))]
    Full {
        /// The snapshot's bytes (estimated before it is made).
        bytes: usize,
        /// Bytes free for it.
        free: usize,
        /// Seconds until the earliest pin that holds the room expires (`None`: only pin requests in
        /// flight hold it).
        retry_after_s: Option<u64>,
        /// Whose pins hold the room.
        whose: Holding,
    },
    /// The pin request's reservation vanished before it was answered (a fault of ours, 500).
    #[error("the pin's reservation was lost before its answer")]
    Lost,
}

/// Whose pins fill the room a pin request needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holding {
    /// The key's own: its share is full.
    Own,
    /// Everyone's: the budget is full.
    All,
}

/// Seconds to wait when only pin requests in flight hold the room (they end within their request).
const RETRY_WHILE_RESERVED_S: u64 = 5;

fn full_message(bytes: usize, free: usize, retry: Option<u64>, whose: Holding) -> String {
    let held = match whose {
        Holding::Own => "this key's share of the pinned-state budget is held by its own pins",
        Holding::All => "the pinned-state budget is held by other pins",
    };
    let when = match retry {
        Some(s) => format!("the earliest of them expires in {s} s"),
        None => "pin requests in flight hold it".to_owned(),
    };
    format!(
        "{held}: this state needs {bytes} bytes, {free} are free; {when} (or unpin one: DELETE /v1/systemone/states/ID)"
    )
}

/// An id as an answer quotes it: at most 64 characters (a client may send a megabyte).
fn shown(id: &str) -> String {
    const MAX: usize = 64;
    match id.char_indices().nth(MAX) {
        None => format!("{id:?}"),
        Some((cut, _)) => format!("{:?}… ({} bytes)", &id[..cut], id.len()),
    }
}

impl PinRefusal {
    /// The `Retry-After` of a 429, in seconds.
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            PinRefusal::Full { retry_after_s, .. } => {
                Some(retry_after_s.unwrap_or(RETRY_WHILE_RESERVED_S).max(1))
            }
            _ => None,
        }
    }
}

impl WireError for PinRefusal {
    fn kind(&self) -> ErrorKind {
        match self {
            PinRefusal::NotFound(_) => ErrorKind::NotFound,
            PinRefusal::OtherState(_) => ErrorKind::OverLimit,
            PinRefusal::TooLarge { .. } => ErrorKind::TooMuchWork,
            PinRefusal::Full { .. } => ErrorKind::QueueFull,
            PinRefusal::Lost => ErrorKind::Internal,
        }
    }

    fn error_body(&self) -> ErrorBody {
        ErrorBody::typed(self.kind(), self.to_string())
    }
}

/// A state's snapshot bytes guessed from its token count before it is made, from the snapshots seen so far:
/// a line through the smallest and the largest (a state holds a fixed part and a part per token). With one
/// size seen it guesses no more than that size's bytes; with none, nothing. A guess low is corrected when
/// the snapshot is made; one high would refuse a pin that fits, so it leans low.
#[derive(Debug, Default, Clone, Copy)]
pub struct Estimate {
    low: Option<(usize, usize)>,
    high: Option<(usize, usize)>,
}

impl Estimate {
    /// A snapshot of `tokens` tokens held `bytes`.
    pub fn observe(&mut self, tokens: usize, bytes: usize) {
        if tokens == 0 {
            return;
        }
        if self.low.is_none_or(|(n, _)| tokens <= n) {
            self.low = Some((tokens, bytes));
        }
        if self.high.is_none_or(|(n, _)| tokens >= n) {
            self.high = Some((tokens, bytes));
        }
    }

    /// The guess for a state of `tokens` tokens.
    pub fn bytes(&self, tokens: usize) -> usize {
        match (self.low, self.high) {
            (Some((n0, b0)), Some((n1, b1))) if n1 > n0 => {
                let slope = b1.saturating_sub(b0) as f64 / (n1 - n0) as f64;
                let base = b0 as f64 - slope * n0 as f64;
                (base + slope * tokens as f64).max(0.0) as usize
            }
            (Some((n0, b0)), _) => {
                if tokens >= n0 {
                    b0
                } else {
                    (b0 as f64 * tokens as f64 / n0 as f64) as usize
                }
            }
            _ => 0,
        }
    }
}

/// The pinned states of one model.
pub struct PinnedStates<S> {
    inner: Mutex<HashMap<String, Entry<S>>>,
    budget: usize,
    refused: Mutex<HashMap<String, PinRefusal>>,
    estimate: Mutex<Estimate>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl<S: Clone> PinnedStates<S> {
    /// A store of at most `budget` bytes (0: pinning is off).
    pub fn new(budget: usize) -> Self {
        PinnedStates {
            inner: Mutex::new(HashMap::new()),
            budget,
            refused: Mutex::new(HashMap::new()),
            estimate: Mutex::new(Estimate::default()),
        }
    }

    /// The entries, the expired ones dropped.
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry<S>>> {
        let mut map = lock(&self.inner);
        let now = SystemTime::now();
        map.retain(|_, e| e.expires_at.is_none_or(|t| t > now));
        map
    }

    /// The byte budget.
    pub fn budget(&self) -> usize {
        self.budget
    }

    /// A snapshot of `tokens` tokens was made holding `bytes` (the cache's and the pins' alike): the
    /// reservations' guess learns from it.
    pub(crate) fn observe(&self, tokens: usize, bytes: usize) {
        lock(&self.estimate).observe(tokens, bytes);
    }

    /// Whether `bytes` more for `owner` (share `share`) fit beside every entry but `except`.
    fn room(
        &self,
        map: &HashMap<String, Entry<S>>,
        owner: Option<&str>,
        share: usize,
        bytes: usize,
        except: &str,
    ) -> Result<(), PinRefusal> {
        let limit = share.min(self.budget);
        if bytes > limit {
            return Err(PinRefusal::TooLarge { bytes, limit });
        }
        let others = || map.iter().filter(|(id, _)| id.as_str() != except);
        let own = |e: &Entry<S>| e.owner.as_deref() == owner;
        let held_own: usize = others().filter(|(_, e)| own(e)).map(|(_, e)| e.bytes).sum();
        let held_all: usize = others().map(|(_, e)| e.bytes).sum();
        let own_over = held_own + bytes > limit;
        let whose = if own_over && limit < self.budget {
            Holding::Own
        } else if own_over || held_all + bytes > self.budget {
            Holding::All
        } else {
            return Ok(());
        };
        let free = match whose {
            Holding::Own => limit - held_own,
            Holding::All => self.budget.saturating_sub(held_all),
        };
        let now = SystemTime::now();
        let retry_after_s = others()
            .filter(|(_, e)| whose == Holding::All || own(e))
            .filter_map(|(_, e)| e.expires_at)
            .min()
            .map(|t| {
                t.duration_since(now)
                    .unwrap_or_default()
                    .as_secs_f64()
                    .ceil() as u64
            });
        Err(PinRefusal::Full {
            bytes,
            free,
            retry_after_s,
            whose,
        })
    }

    /// Reserve room for a state about to run (its snapshot follows with [`PinnedStates::fill`]): refused at
    /// once when its estimated bytes do not fit its owner's share or the budget.
    pub(crate) fn reserve(
        &self,
        model: u64,
        order: &PinOrder,
        state: Value,
        ids: Vec<u32>,
    ) -> Result<(), PinRefusal> {
        let share = order.share.unwrap_or(self.budget);
        let bytes = lock(&self.estimate).bytes(ids.len()) + ids.len() * 4;
        let mut map = self.lock();
        self.room(&map, order.owner.as_deref(), share, bytes, &order.id)?;
        map.insert(
            order.id.clone(),
            Entry {
                model,
                owner: order.owner.clone(),
                state,
                ids,
                snapshot: None,
                bytes,
                share,
                ttl: order.ttl,
                expires_at: None,
            },
        );
        Ok(())
    }

    /// Keep the snapshot of a reserved pin, or drop the reservation when its real bytes do not fit (the
    /// refusal is kept for [`PinnedStates::commit`]).
    pub(crate) fn fill(&self, id: &str, snapshot: &Snapshot<S>, bytes: usize) {
        let mut map = self.lock();
        let Some(entry) = map.get(id).filter(|e| !e.pinned() && e.snapshot.is_none()) else {
            return; // abandoned meanwhile
        };
        lock(&self.estimate).observe(entry.ids.len(), bytes);
        let bytes = bytes + entry.ids.len() * 4;
        let (owner, share) = (entry.owner.clone(), entry.share);
        match self.room(&map, owner.as_deref(), share, bytes, id) {
            Ok(()) => {
                if let Some(entry) = map.get_mut(id) {
                    entry.snapshot = Some(snapshot.clone());
                    entry.bytes = bytes;
                }
            }
            Err(r) => {
                map.remove(id);
                drop(map);
                lock(&self.refused).insert(id.to_owned(), r);
            }
        }
    }

    /// The pin request was answered: its pin exists from now on, and lives its TTL from now. The refusal
    /// [`PinnedStates::fill`] kept, if its snapshot did not fit.
    pub fn commit(&self, id: &str) -> Result<PinInfo, PinRefusal> {
        if let Some(r) = lock(&self.refused).remove(id) {
            return Err(r);
        }
        let mut map = self.lock();
        let entry = map
            .get_mut(id)
            .filter(|e| e.snapshot.is_some())
            .ok_or(PinRefusal::Lost)?;
        let expires_at = *entry
            .expires_at
            .get_or_insert_with(|| SystemTime::now() + entry.ttl);
        Ok(PinInfo {
            id: id.to_owned(),
            tokens: entry.ids.len(),
            bytes: entry.bytes,
            expires_at,
        })
    }

    /// The pin request ended without its answer (cancelled, abandoned, timed out, refused): its
    /// reservation and any refusal kept for it are dropped. A pin already answered stays.
    pub fn abandon(&self, id: &str) {
        let mut map = self.lock();
        if map.get(id).is_some_and(|e| !e.pinned()) {
            map.remove(id);
        }
        drop(map);
        lock(&self.refused).remove(id);
    }

    /// The snapshot pinned for exactly these state ids under `model`, if any.
    pub(crate) fn snapshot(&self, model: u64, ids: &[u32]) -> Option<Snapshot<S>> {
        self.lock()
            .values()
            .find(|e| e.pinned() && e.model == model && e.ids == ids)
            .and_then(|e| e.snapshot.clone())
    }

    /// Whether a task should pin its snapshot under `id` (reserved, not filled yet).
    pub(crate) fn wants(&self, id: &str) -> bool {
        self.lock()
            .get(id)
            .is_some_and(|e| !e.pinned() && e.snapshot.is_none())
    }

    /// The pin `id` of `owner`.
    fn owned<'m>(
        map: &'m HashMap<String, Entry<S>>,
        id: &str,
        owner: Option<&str>,
    ) -> Option<&'m Entry<S>> {
        map.get(id)
            .filter(|e| e.pinned() && e.owner.as_deref() == owner)
    }

    /// Pin `id` as `owner` sees it.
    pub fn info(&self, id: &str, owner: Option<&str>) -> Option<PinInfo> {
        let map = self.lock();
        let e = Self::owned(&map, id, owner)?;
        Some(PinInfo {
            id: id.to_owned(),
            tokens: e.ids.len(),
            bytes: e.bytes,
            expires_at: e.expires_at?,
        })
    }

    /// The state (JSON, as sent) of pin `id`, for `owner`.
    pub fn state(&self, id: &str, owner: Option<&str>) -> Option<Value> {
        let map = self.lock();
        Self::owned(&map, id, owner).map(|e| e.state.clone())
    }

    /// Unpin `id` (only its owner can); whether it was there.
    pub fn remove(&self, id: &str, owner: Option<&str>) -> bool {
        let mut map = self.lock();
        if Self::owned(&map, id, owner).is_some() {
            map.remove(id);
            true
        } else {
            false
        }
    }

    /// Drop every pin made under `model` (its adapter was removed): later requests naming them get 404.
    pub(crate) fn forget(&self, model: u64) {
        self.lock().retain(|_, e| e.model != model);
    }

    /// Counters.
    pub fn stats(&self) -> PinStats {
        let map = self.lock();
        let (pinned, reserved): (Vec<&Entry<S>>, Vec<&Entry<S>>) =
            map.values().partition(|e| e.pinned());
        PinStats {
            entries: pinned.len() as u64,
            bytes: pinned.iter().map(|e| e.bytes as u64).sum(),
            reserved: reserved.iter().map(|e| e.bytes as u64).sum(),
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

    fn order(id: &str, owner: Option<&str>, ttl_s: u64, share: Option<usize>) -> PinOrder {
        PinOrder {
            id: id.into(),
            owner: owner.map(str::to_owned),
            ttl: Duration::from_secs(ttl_s),
            share,
        }
    }

    /// Reserve, fill with `bytes` (plus the ids' 4 bytes each) and answer a pin of one token.
    fn pin(
        p: &PinnedStates<Vec<u32>>,
        o: &PinOrder,
        token: u32,
        bytes: usize,
    ) -> Result<PinInfo, PinRefusal> {
        p.reserve(0, o, Value::Null, vec![token])?;
        p.fill(&o.id, &snap(token), bytes);
        p.commit(&o.id)
    }

    /// Nothing pinned, filled or reserved is left in `p` (made with a budget of 1,000 bytes).
    fn assert_holds_nothing<S: Clone>(p: &PinnedStates<S>) {
        let empty = PinStats {
            budget: 1000,
            ..PinStats::default()
        };
        assert_eq!(p.stats(), empty);
    }

    #[test]
    fn a_pin_exists_only_once_answered_and_only_for_its_owner() {
        let p = PinnedStates::new(1000);
        let o = order("a", Some("alice"), 60, None);
        p.reserve(0, &o, Value::from("s"), vec![1, 2]).unwrap();
        assert!(p.wants("a"));
        p.fill("a", &snap(7), 100);
        assert!(!p.wants("a"));
        // Filled but not answered: nobody finds it, the counters show it as reserved.
        assert!(p.snapshot(0, &[1, 2]).is_none());
        assert!(p.info("a", Some("alice")).is_none() && p.state("a", Some("alice")).is_none());
        assert_eq!((p.stats().entries, p.stats().reserved), (0, 108));
        let info = p.commit("a").unwrap();
        assert_eq!((info.tokens, info.bytes), (2, 108));
        assert_eq!(p.snapshot(0, &[1, 2]).map(|s| s.state), Some(vec![7]));
        assert!(p.snapshot(0, &[1]).is_none());
        assert!(
            p.snapshot(1, &[1, 2]).is_none(),
            "another adapter's identity never finds it"
        );
        assert!(p.info("a", None).is_none() && p.info("a", Some("bob")).is_none());
        assert!(p.state("a", Some("bob")).is_none());
        assert!(!p.remove("a", Some("bob")));
        p.abandon("a"); // answered: it stays
        assert!(p.remove("a", Some("alice")));
        assert!(p.snapshot(0, &[1, 2]).is_none());
        assert_holds_nothing(&p);
    }

    #[test]
    fn an_abandoned_pin_request_leaves_nothing() {
        let p = PinnedStates::new(1000);
        for (i, filled) in [(0u32, false), (1, true)] {
            let id = format!("p{i}");
            p.reserve(0, &order(&id, None, 60, None), Value::Null, vec![i])
                .unwrap();
            if filled {
                p.fill(&id, &snap(i), 500);
            }
            p.abandon(&id);
            assert!(!p.wants(&id));
            assert_eq!(p.commit(&id), Err(PinRefusal::Lost));
        }
        assert_holds_nothing(&p);
    }

    #[test]
    fn the_ttl_runs_from_the_answer_not_the_request() {
        let p = PinnedStates::new(1000);
        let o = PinOrder {
            ttl: Duration::from_millis(50),
            ..order("t", None, 0, None)
        };
        p.reserve(0, &o, Value::Null, vec![1]).unwrap();
        // The prefix takes longer than the TTL: the reservation does not expire.
        std::thread::sleep(Duration::from_millis(120));
        p.fill("t", &snap(1), 10);
        let info = p.commit("t").unwrap();
        assert!(info.expires_at > SystemTime::now());
        assert!(p.info("t", None).is_some());
        std::thread::sleep(Duration::from_millis(80));
        assert!(
            p.info("t", None).is_none(),
            "expired 50 ms after its answer"
        );
        assert_eq!(p.stats().bytes, 0);
    }

    #[test]
    fn a_key_keeps_its_share_and_a_full_one_says_when_room_comes() {
        // Two keys, 500 bytes each of 1000.
        let p = PinnedStates::new(1000);
        let share = Some(500);
        pin(&p, &order("a1", Some("a"), 60, share), 1, 296).unwrap();
        // Another pin of a's that would pass a's share: 429 naming a's own pins and their expiry.
        let r = pin(&p, &order("a2", Some("a"), 60, share), 2, 296).unwrap_err();
        match r {
            PinRefusal::Full {
                bytes: 300,
                free: 200,
                retry_after_s: Some(s),
                whose: Holding::Own,
            } => assert!((59..=60).contains(&s), "{s}"),
            other => panic!("{other:?}"),
        }
        assert!((59..=60).contains(&r.retry_after().unwrap()));
        assert!(r.to_string().contains("expires in"), "{r}");
        // b's share is untouched by a's.
        pin(&p, &order("b1", Some("b"), 60, share), 3, 396).unwrap();
        assert_eq!(p.stats().entries, 2);
        // A snapshot over the whole share on its own: 413, whoever holds what.
        let p = PinnedStates::new(1000);
        let r = pin(&p, &order("c", Some("c"), 60, share), 4, 900).unwrap_err();
        assert_eq!(
            r,
            PinRefusal::TooLarge {
                bytes: 904,
                limit: 500
            }
        );
        assert_holds_nothing(&p);
    }

    #[test]
    fn reservations_count_before_their_snapshots_exist() {
        let p: PinnedStates<Vec<u32>> = PinnedStates::new(3000);
        p.observe(100, 400); // a 100-token snapshot holds 400 bytes, a 200-token one 600
        p.observe(200, 600);
        for id in ["r1", "r2"] {
            p.reserve(0, &order(id, None, 60, None), Value::Null, vec![0; 150])
                .unwrap();
        }
        // Each: 500 estimated + 600 for the ids. The third does not fit beside the two in flight, and
        // no pin's expiry would make room: retry after a few seconds.
        assert_eq!(p.stats().reserved, 2200);
        let r = p
            .reserve(0, &order("r3", None, 60, None), Value::Null, vec![0; 150])
            .unwrap_err();
        assert!(
            matches!(
                r,
                PinRefusal::Full {
                    retry_after_s: None,
                    whose: Holding::All,
                    ..
                }
            ),
            "{r:?}"
        );
        assert_eq!(r.retry_after(), Some(RETRY_WHILE_RESERVED_S));
        p.abandon("r1");
        assert!(
            p.reserve(0, &order("r3", None, 60, None), Value::Null, vec![0; 150])
                .is_ok()
        );
    }

    #[test]
    fn the_estimate_leans_low_until_two_sizes_are_seen() {
        let mut e = Estimate::default();
        assert_eq!(e.bytes(1000), 0);
        e.observe(100, 5000);
        assert_eq!(
            (e.bytes(50), e.bytes(100), e.bytes(10_000)),
            (2500, 5000, 5000)
        );
        e.observe(300, 7000); // 4000 fixed + 10 per token
        assert_eq!((e.bytes(100), e.bytes(1000)), (5000, 14_000));
    }

    #[test]
    fn a_huge_id_is_not_quoted_whole() {
        let id = "x".repeat(1 << 20);
        let m = PinRefusal::NotFound(id).to_string();
        assert!(m.len() < 300, "{} bytes", m.len());
        assert!(m.contains("1048576 bytes"), "{m}");
        assert!(
            PinRefusal::NotFound("abc".into())
                .to_string()
                .contains("\"abc\"")
        );
    }
}
