//! Named API keys, each with its own limits (`kev serve --api-keys FILE`; `KEV_API_KEY` stays one unnamed key).
//!
//! The file is JSON: `{"keys": [{"name": "alice", "key": "…", "requests_per_second": 5, "tokens_per_minute":
//! 200000, "concurrent": 4, "pin_bytes": 268435456}, …]}` — every limit optional (absent: none; for
//! `pin_bytes`, an even share of the pinned-state budget, [`Keys::pin_share`]). A request to `/v1/*` presents
//! `Authorization: Bearer <key>`; the key is compared with **every** entry in constant time (`subtle`), so
//! neither the answer's timing nor its position in the file tells a guesser anything. Then its limits, before
//! the body is read:
//! - `concurrent`: requests of this key in flight at once (the next one gets 429 + `Retry-After: 1`);
//! - `requests_per_second`: a token bucket of `max(1, rate)` requests refilled at `rate` per second (429 with
//!   the seconds until the next request fits);
//! - `tokens_per_minute`: a bucket of that many input tokens, refilled over a minute. A request is let in while
//!   the bucket is not in debt, and its admitted input tokens (`usage.input_tokens`, every part of a fan-out or
//!   batch) are charged when it is admitted, so a large request may take the bucket into debt and the key waits
//!   until it is paid back (429 with the seconds that takes). Refused requests cost nothing.
//!
//! **Policy**, beside the limits (each optional; absent: no restriction): `"adapters": ["support", …]` — the
//! adapters the key may use (a request answered by another adapter — its `model` resolved as the server resolves
//! it — gets 403 `permission_error` naming the key and the adapter, never the secret; a batch entry is refused
//! in its place); `"default_priority"` and `"max_priority"` (`high | normal | low`: what the key's requests get
//! when they ask nothing, and the most they may get, see `crate::urgency`); `"admin": true` — the key may use the
//! adapter admin routes (`/v1/adapters`).
//!
//! The 429s are this key's alone (`rate_limit_error`, the message names the key and the limit, never the
//! secret); other keys are not slowed. `/metrics` counts per key name: `kev_key_requests_total{key, status}`,
//! `kev_key_input_tokens_total{key}`, `kev_key_rejected_total{key, limit}`; the access log line of a request
//! names its key. [`Keys::reload`] (the server calls it on SIGHUP) re-reads the file: a key that stays keeps
//! its buckets and in-flight count, a removed one is refused (401) from its next request, requests already
//! admitted finish; a file that does not read leaves the keys as they were.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use subtle::ConstantTimeEq;

use crate::Priority;
use crate::error::ApiError;
use crate::urgency::PriorityPolicy;

/// The name the unnamed key (`KEV_API_KEY`, `--api-key-file`) goes by in metrics and logs.
pub const UNNAMED: &str = "default";

/// A key's limits; `None` is no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct KeyLimits {
    /// Requests per second (a bucket of `max(1, rate)`).
    pub requests_per_second: Option<f64>,
    /// Input tokens per minute.
    pub tokens_per_minute: Option<f64>,
    /// Requests in flight at once.
    pub concurrent: Option<usize>,
    /// Bytes of pinned states this key may hold (its share of `--pin-bytes`; absent: an even split of what
    /// the keys with an entry of their own leave, [`Keys::pin_share`]).
    pub pin_bytes: Option<usize>,
}

/// What a key may do beyond its limits (see the module docs); the default restricts nothing.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KeyPolicy {
    /// The adapters it may use (`None`: every adapter).
    pub adapters: Option<Vec<String>>,
    /// Its requests' priorities.
    pub priority: PriorityPolicy,
    /// Whether it may use the adapter admin routes.
    pub admin: bool,
}

/// One entry of the keys file.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct FileEntry {
    name: String,
    key: String,
    requests_per_second: Option<f64>,
    tokens_per_minute: Option<f64>,
    concurrent: Option<usize>,
    pin_bytes: Option<usize>,
    adapters: Option<Vec<String>>,
    default_priority: Option<String>,
    max_priority: Option<String>,
    #[serde(default)]
    admin: bool,
}

/// A checked entry of the keys file.
struct Entry {
    name: String,
    secret: Vec<u8>,
    limits: KeyLimits,
    policy: KeyPolicy,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    keys: Vec<FileEntry>,
}

/// Why a keys file was refused.
#[derive(Debug, thiserror::Error)]
pub enum KeysError {
    /// It could not be read.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// It is not a keys file.
    #[error("{path}: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong, naming the entry.
        message: String,
    },
}

/// A key's running state: kept across reloads while its name stays.
#[derive(Debug)]
struct State {
    buckets: Mutex<Buckets>,
    in_flight: AtomicUsize,
}

#[derive(Debug)]
struct Buckets {
    requests: f64,
    tokens: f64,
    at: Instant,
}

/// One key: its name, secret, limits, policy and state.
pub struct Key {
    name: String,
    secret: Vec<u8>,
    limits: KeyLimits,
    policy: KeyPolicy,
    state: Arc<State>,
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secret.
        f.debug_struct("Key")
            .field("name", &self.name)
            .field("limits", &self.limits)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

/// A request's hold on its key: counted in flight until dropped.
pub struct Pass {
    key: Arc<Key>,
}

impl Drop for Pass {
    fn drop(&mut self) {
        self.key.state.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Pass {
    /// The key.
    pub fn key(&self) -> &Arc<Key> {
        &self.key
    }
}

impl Key {
    fn new(e: Entry, state: Option<Arc<State>>) -> Self {
        let Entry {
            name,
            secret,
            limits,
            policy,
        } = e;
        let state = state.unwrap_or_else(|| {
            Arc::new(State {
                buckets: Mutex::new(Buckets {
                    requests: limits.requests_per_second.map_or(0.0, |r| r.max(1.0)),
                    tokens: limits.tokens_per_minute.unwrap_or(0.0),
                    at: Instant::now(),
                }),
                in_flight: AtomicUsize::new(0),
            })
        });
        Key {
            name,
            secret,
            limits,
            policy,
            state,
        }
    }

    /// Its policy.
    pub fn policy(&self) -> &KeyPolicy {
        &self.policy
    }

    /// Whether it may use the adapter named `adapter` (the one a request's `model` resolved to).
    pub fn may_use(&self, adapter: &str) -> bool {
        self.policy
            .adapters
            .as_ref()
            .is_none_or(|list| list.iter().any(|a| a == adapter))
    }

    /// Whether it may use the adapter admin routes.
    pub fn is_admin(&self) -> bool {
        self.policy.admin
    }

    /// Its name (what metrics and logs say).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its limits.
    pub fn limits(&self) -> KeyLimits {
        self.limits
    }

    /// Let one request in under this key's limits, or the 429 that says which limit and for how long.
    pub fn admit(self: &Arc<Self>) -> Result<Pass, ApiError> {
        let n = self.state.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        let pass = Pass {
            key: Arc::clone(self),
        };
        if let Some(max) = self.limits.concurrent
            && n > max
        {
            return Err(self.refuse("concurrent", format!("{max} requests in flight"), 1.0));
        }
        let mut b = self.state.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let dt = now.duration_since(b.at).as_secs_f64();
        b.at = now;
        if let Some(rate) = self.limits.requests_per_second {
            b.requests = (b.requests + dt * rate).min(rate.max(1.0));
            if b.requests < 1.0 {
                let wait = (1.0 - b.requests) / rate;
                return Err(self.refuse(
                    "requests_per_second",
                    format!("{rate} requests per second"),
                    wait,
                ));
            }
        }
        if let Some(tpm) = self.limits.tokens_per_minute {
            b.tokens = (b.tokens + dt * tpm / 60.0).min(tpm);
            if b.tokens < 0.0 {
                let wait = -b.tokens / (tpm / 60.0);
                return Err(self.refuse(
                    "tokens_per_minute",
                    format!("{tpm} input tokens per minute"),
                    wait,
                ));
            }
        }
        if self.limits.requests_per_second.is_some() {
            b.requests -= 1.0;
        }
        Ok(pass)
    }

    /// Charge the input tokens of an admitted request to this key.
    pub fn charge(&self, tokens: usize) {
        metrics::counter!("kev_key_input_tokens_total", "key" => self.name.clone())
            .increment(tokens as u64);
        if self.limits.tokens_per_minute.is_some() {
            let mut b = self.state.buckets.lock().unwrap_or_else(|e| e.into_inner());
            b.tokens -= tokens as f64;
        }
    }

    fn refuse(&self, limit: &'static str, what: String, wait_s: f64) -> ApiError {
        metrics::counter!("kev_key_rejected_total", "key" => self.name.clone(), "limit" => limit)
            .increment(1);
        let retry = (wait_s.ceil() as u64).max(1);
        ApiError::key_limited(&self.name, &what, retry)
    }
}

/// The keys a server accepts.
pub struct Keys {
    path: Option<PathBuf>,
    /// Keys that are not in the file (the unnamed key), kept across reloads.
    fixed: RwLock<Vec<Arc<Key>>>,
    current: RwLock<Arc<Vec<Arc<Key>>>>,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keys")
            .field("path", &self.path)
            .field("names", &self.names())
            .finish()
    }
}

fn positive(path: &Path, name: &str, what: &str, v: Option<f64>) -> Result<(), KeysError> {
    match v {
        Some(x) if !(x.is_finite() && x > 0.0) => Err(KeysError::Invalid {
            path: path.to_owned(),
            message: format!("key {name:?}: {what} must be a positive number, not {x}"),
        }),
        _ => Ok(()),
    }
}

/// A priority the keys file names, or what is wrong with it.
fn priority(name: &str, field: &str, v: Option<String>) -> Result<Option<Priority>, String> {
    match v {
        None => Ok(None),
        Some(text) => Priority::parse(&text).map(Some).ok_or_else(|| {
            format!(
                "key {name:?}: {field} must be one of {}, not {text:?}",
                Priority::expected()
            )
        }),
    }
}

/// Read and check a keys file (names and secrets non-empty and unique, limits positive, priorities named
/// and the default within the maximum, adapter names non-empty).
fn read_file(path: &Path) -> Result<Vec<Entry>, KeysError> {
    let text = std::fs::read(path).map_err(|source| KeysError::Read {
        path: path.to_owned(),
        source,
    })?;
    let invalid = |message: String| KeysError::Invalid {
        path: path.to_owned(),
        message,
    };
    let file: File = serde_json::from_slice(&text).map_err(|e| {
        invalid(format!(
            "not a keys file ({e}); expected {{\"keys\": [{{\"name\", \"key\", \"requests_per_second\"?, \"tokens_per_minute\"?, \"concurrent\"?, \"pin_bytes\"?, \"adapters\"?, \"default_priority\"?, \"max_priority\"?, \"admin\"?}}]}}"
        ))
    })?;
    let mut out: Vec<Entry> = Vec::new();
    for e in file.keys {
        if e.name.trim().is_empty() || e.key.is_empty() {
            return Err(invalid("every key needs a name and a non-empty key".into()));
        }
        if e.name == UNNAMED {
            return Err(invalid(format!(
                "the name {UNNAMED:?} is the unnamed key's (KEV_API_KEY); choose another"
            )));
        }
        if out.iter().any(|x| x.name == e.name) {
            return Err(invalid(format!("the name {:?} is used twice", e.name)));
        }
        if out.iter().any(|x| x.secret.as_slice() == e.key.as_bytes()) {
            return Err(invalid(format!(
                "key {:?} has the same secret as another entry",
                e.name
            )));
        }
        positive(path, &e.name, "requests_per_second", e.requests_per_second)?;
        positive(path, &e.name, "tokens_per_minute", e.tokens_per_minute)?;
        if e.pin_bytes == Some(0) {
            return Err(invalid(format!(
                "key {:?}: pin_bytes must be at least 1 (leave it out for an even share)",
                e.name
            )));
        }
        if e.concurrent == Some(0) {
            return Err(invalid(format!(
                "key {:?}: concurrent must be at least 1",
                e.name
            )));
        }
        let policy = KeyPolicy {
            priority: PriorityPolicy {
                default: priority(&e.name, "default_priority", e.default_priority)
                    .map_err(invalid)?,
                max: priority(&e.name, "max_priority", e.max_priority).map_err(invalid)?,
            },
            adapters: e.adapters,
            admin: e.admin,
        };
        if let PriorityPolicy {
            default: Some(d),
            max: Some(m),
        } = policy.priority
            && d > m
        {
            return Err(invalid(format!(
                "key {:?}: default_priority {d} is above its max_priority {m}",
                e.name
            )));
        }
        if policy
            .adapters
            .as_ref()
            .is_some_and(|list| list.iter().any(|a| a.trim().is_empty()))
        {
            return Err(invalid(format!(
                "key {:?}: an adapter name in its list is empty",
                e.name
            )));
        }
        out.push(Entry {
            name: e.name,
            secret: e.key.into_bytes(),
            limits: KeyLimits {
                requests_per_second: e.requests_per_second,
                tokens_per_minute: e.tokens_per_minute,
                concurrent: e.concurrent,
                pin_bytes: e.pin_bytes,
            },
            policy,
        });
    }
    Ok(out)
}

impl Keys {
    /// The keys of a file (see the module docs), re-read by [`Keys::reload`].
    pub fn read(path: &Path) -> Result<Self, KeysError> {
        let entries = read_file(path)?
            .into_iter()
            .map(|e| Arc::new(Key::new(e, None)))
            .collect();
        Ok(Keys {
            path: Some(path.to_owned()),
            fixed: RwLock::new(Vec::new()),
            current: RwLock::new(Arc::new(entries)),
        })
    }

    /// One unnamed key without limits (`KEV_API_KEY`).
    pub fn single(secret: &str) -> Self {
        let keys = Keys {
            path: None,
            fixed: RwLock::new(Vec::new()),
            current: RwLock::new(Arc::new(Vec::new())),
        };
        keys.add_unnamed(secret);
        keys
    }

    /// Accept the unnamed key too (without limits; kept across reloads).
    pub fn add_unnamed(&self, secret: &str) {
        let key = Arc::new(Key::new(
            Entry {
                name: UNNAMED.into(),
                secret: secret.as_bytes().to_vec(),
                limits: KeyLimits::default(),
                policy: KeyPolicy::default(),
            },
            None,
        ));
        self.fixed
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .push(key);
    }

    /// Re-read the file: keys that stay keep their state, removed ones are refused from their next request.
    /// On an error the keys stay as they were. Returns how many keys the file now has.
    pub fn reload(&self) -> Result<usize, KeysError> {
        let Some(path) = &self.path else {
            return Ok(0);
        };
        let fresh = read_file(path)?;
        let mut current = self.current.write().unwrap_or_else(|e| e.into_inner());
        let old = Arc::clone(&current);
        let entries: Vec<Arc<Key>> = fresh
            .into_iter()
            .map(|e| {
                let state = old
                    .iter()
                    .find(|k| k.name == e.name)
                    .map(|k| Arc::clone(&k.state));
                Arc::new(Key::new(e, state))
            })
            .collect();
        let n = entries.len();
        *current = Arc::new(entries);
        Ok(n)
    }

    /// Whether `given` is `secret`, in constant time (the `/metrics` key).
    pub fn same_secret(given: &[u8], secret: &[u8]) -> bool {
        bool::from(given.ct_eq(secret))
    }

    /// The key whose secret `given` is, compared in constant time with every key (no early exit).
    pub fn find(&self, given: &[u8]) -> Option<Arc<Key>> {
        let current = Arc::clone(&self.current.read().unwrap_or_else(|e| e.into_inner()));
        let fixed = self.fixed.read().unwrap_or_else(|e| e.into_inner());
        let mut found = None;
        for key in fixed.iter().chain(current.iter()) {
            if bool::from(given.ct_eq(&key.secret)) {
                found = Some(Arc::clone(key));
            }
        }
        found
    }

    /// Whether a key in force may use the adapter admin routes.
    pub fn has_admin(&self) -> bool {
        let current = self.current.read().unwrap_or_else(|e| e.into_inner());
        current.iter().any(|k| k.is_admin())
    }

    /// The names of the keys in force.
    pub fn names(&self) -> Vec<String> {
        let current = self.current.read().unwrap_or_else(|e| e.into_inner());
        let fixed = self.fixed.read().unwrap_or_else(|e| e.into_inner());
        fixed
            .iter()
            .chain(current.iter())
            .map(|k| k.name.clone())
            .collect()
    }

    /// The bytes of pinned state key `name` may hold out of a `budget`: its own `pin_bytes`, else an even
    /// split between the keys without one of what those with one leave (the whole budget over the keys when
    /// none says). `None` for a name that is no key's. A key's share is both what it is sure to get and what
    /// it may hold: pins are never evicted, so room one key borrowed could not be given back to another.
    pub fn pin_share(&self, name: &str, budget: usize) -> Option<usize> {
        let current = Arc::clone(&self.current.read().unwrap_or_else(|e| e.into_inner()));
        let fixed = self.fixed.read().unwrap_or_else(|e| e.into_inner());
        let all: Vec<&Arc<Key>> = fixed.iter().chain(current.iter()).collect();
        let key = all.iter().find(|k| k.name == name)?;
        if let Some(b) = key.limits.pin_bytes {
            return Some(b);
        }
        let said: usize = all.iter().filter_map(|k| k.limits.pin_bytes).sum();
        let unsaid = all.iter().filter(|k| k.limits.pin_bytes.is_none()).count();
        Some(budget.saturating_sub(said) / unsaid.max(1))
    }

    /// The file the keys come from, if any.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory of this test's own under the system's temporary one, removed when dropped.
    fn scratch(test: &str) -> tempfile::TempDir {
        tempfile::Builder::new()
            .prefix(&format!("kev-keys-{test}-"))
            .tempdir()
            .unwrap()
    }

    fn write(dir: &Path, text: &str) -> PathBuf {
        let p = dir.join("keys.json");
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn a_file_is_read_checked_and_reloaded_keeping_state() {
        let dir = scratch("a_file_is_re");
        let p = write(
            dir.path(),
            r#"{"keys": [{"name": "a", "key": "sa", "requests_per_second": 1}, {"name": "b", "key": "sb"}]}"#,
        );
        let keys = Keys::read(&p).unwrap();
        keys.add_unnamed("s0");
        assert_eq!(keys.names(), ["default", "a", "b"]);
        assert_eq!(keys.find(b"sb").unwrap().name(), "b");
        assert_eq!(keys.find(b"s0").unwrap().name(), "default");
        assert!(keys.find(b"s").is_none() && keys.find(b"sbb").is_none());
        // a's bucket holds one request; the second within the second is refused with Retry-After 1.
        let a = keys.find(b"sa").unwrap();
        let pass = a.admit().unwrap();
        let e = a.admit().err().unwrap();
        assert_eq!(e.status().as_u16(), 429);
        assert_eq!(e.retry_after(), Some(1));
        let msg = e.body()["detail"]["message"].as_str().unwrap().to_owned();
        assert!(msg.contains("\"a\""), "{msg}");
        drop(pass);
        // Reload: b removed, a kept with its (empty) bucket, c added.
        write(
            dir.path(),
            r#"{"keys": [{"name": "a", "key": "sa", "requests_per_second": 1}, {"name": "c", "key": "sc"}]}"#,
        );
        assert_eq!(keys.reload().unwrap(), 2);
        assert!(keys.find(b"sb").is_none());
        assert_eq!(keys.find(b"sc").unwrap().name(), "c");
        assert!(
            keys.find(b"sa").unwrap().admit().is_err(),
            "a's bucket was reset by the reload"
        );
        // A broken file keeps the keys in force.
        write(dir.path(), "{not json");
        assert!(keys.reload().is_err());
        assert_eq!(keys.names(), ["default", "a", "c"]);
    }

    #[test]
    fn bad_files_are_refused_naming_the_problem() {
        let dir = scratch("bad_files_ar");
        for (text, says) in [
            (r#"{"keys": [{"name": "a", "key": ""}]}"#, "non-empty"),
            (
                r#"{"keys": [{"name": "a", "key": "x"}, {"name": "a", "key": "y"}]}"#,
                "twice",
            ),
            (
                r#"{"keys": [{"name": "a", "key": "x"}, {"name": "b", "key": "x"}]}"#,
                "same secret",
            ),
            (
                r#"{"keys": [{"name": "a", "key": "x", "requests_per_second": 0}]}"#,
                "positive",
            ),
            (
                r#"{"keys": [{"name": "a", "key": "x", "concurrent": 0}]}"#,
                "at least 1",
            ),
            (
                r#"{"keys": [{"name": "a", "key": "x", "rate": 3}]}"#,
                "not a keys file",
            ),
            (r#"{"keys": [{"name": "default", "key": "x"}]}"#, "unnamed"),
            (
                r#"{"keys": [{"name": "a", "key": "x", "max_priority": "urgent"}]}"#,
                "max_priority must be one of 'high', 'normal' or 'low'",
            ),
            (
                r#"{"keys": [{"name": "a", "key": "x", "default_priority": "high", "max_priority": "normal"}]}"#,
                "above its max_priority",
            ),
            (
                r#"{"keys": [{"name": "a", "key": "x", "adapters": ["ops", " "]}]}"#,
                "adapter name in its list is empty",
            ),
            (
                r#"{"keys": [{"name": "a", "key": "x", "admin": "yes"}]}"#,
                "not a keys file",
            ),
        ] {
            let p = write(dir.path(), text);
            let e = Keys::read(&p).err().unwrap().to_string();
            assert!(e.contains(says), "{text}: {e}");
        }
    }

    #[test]
    fn policies_are_read_and_follow_a_reload() {
        let dir = scratch("policies_are");
        let p = write(
            dir.path(),
            r#"{"keys": [{"name": "ops", "key": "so", "adapters": ["ops"], "default_priority": "low", "max_priority": "normal"},
                          {"name": "root", "key": "sr", "admin": true}]}"#,
        );
        let keys = Keys::read(&p).unwrap();
        let ops = keys.find(b"so").unwrap();
        assert!(ops.may_use("ops") && !ops.may_use("support"));
        assert!(!ops.is_admin());
        assert_eq!(ops.policy().priority.apply(None), Priority::Low);
        assert_eq!(
            ops.policy().priority.apply(Some(Priority::High)),
            Priority::Normal
        );
        let root = keys.find(b"sr").unwrap();
        assert!(root.is_admin() && root.may_use("anything"));
        assert_eq!(
            root.policy().priority.apply(Some(Priority::High)),
            Priority::High
        );
        // The policy changes with the file; a key taken before the reload keeps the policy it had.
        write(
            dir.path(),
            r#"{"keys": [{"name": "ops", "key": "so", "adapters": ["ops", "support"]}]}"#,
        );
        keys.reload().unwrap();
        assert!(keys.find(b"so").unwrap().may_use("support"));
        assert!(!ops.may_use("support"));
        assert!(keys.find(b"sr").is_none());
    }

    #[test]
    fn the_pin_budget_is_split_between_the_keys() {
        let dir = scratch("pin_share");
        let p = write(
            dir.path(),
            r#"{"keys": [{"name": "a", "key": "sa"}, {"name": "b", "key": "sb"}, {"name": "big", "key": "sc", "pin_bytes": 600}]}"#,
        );
        let keys = Keys::read(&p).unwrap();
        assert_eq!(keys.pin_share("big", 1000), Some(600));
        assert_eq!(keys.pin_share("a", 1000), Some(200));
        assert_eq!(keys.pin_share("b", 1000), Some(200));
        assert_eq!(keys.pin_share("nobody", 1000), None);
        keys.add_unnamed("s0");
        assert_eq!(keys.pin_share("default", 900), Some(100));
        let p = write(
            dir.path(),
            r#"{"keys": [{"name": "a", "key": "sa", "pin_bytes": 0}]}"#,
        );
        assert!(
            Keys::read(&p)
                .err()
                .unwrap()
                .to_string()
                .contains("pin_bytes")
        );
    }

    #[test]
    fn tokens_per_minute_lets_a_request_in_while_not_in_debt() {
        let dir = scratch("tokens_per_m");
        let p = write(
            dir.path(),
            r#"{"keys": [{"name": "t", "key": "st", "tokens_per_minute": 100, "concurrent": 2}]}"#,
        );
        let keys = Keys::read(&p).unwrap();
        let t = keys.find(b"st").unwrap();
        let one = t.admit().unwrap();
        t.charge(80);
        let two = t.admit().unwrap(); // 20 left: in
        t.charge(80); // −60: in debt
        drop((one, two));
        let e = t.admit().err().unwrap();
        assert_eq!(e.status().as_u16(), 429);
        // 60 tokens at 100 a minute: 36 s.
        assert!(
            (35..=37).contains(&e.retry_after().unwrap()),
            "{:?}",
            e.retry_after()
        );
        // Concurrency: two held, the third refused.
        let keys = Keys::read(&write(
            dir.path(),
            r#"{"keys": [{"name": "c", "key": "sc", "concurrent": 2}]}"#,
        ))
        .unwrap();
        let c = keys.find(b"sc").unwrap();
        let held = (c.admit().unwrap(), c.admit().unwrap());
        assert!(c.admit().is_err());
        drop(held);
        assert!(c.admit().is_ok());
    }
}
