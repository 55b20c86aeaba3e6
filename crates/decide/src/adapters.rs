//! The adapters a service answers with, changed while it serves.
//!
//! The default adapter (the backbone's weights as loaded) is fixed; the others live in a list that is swapped
//! whole when one is added or removed ([`crate::Kev::add_adapter`], [`crate::Kev::remove_adapter`], in `crate::live`). A job holds its
//! adapter's [`AdapterToken`] from admission on: a pass looks the adapter up by the token's id, and an adapter
//! removed while jobs hold its token is *retired* — no new request reaches it, the ones in flight finish on it —
//! until the last of them is done; then the retired adapter is dropped at the next pass and its memory given
//! back to the system. Its prepared-state cache entries and pins go at removal, and no job of it caches or pins
//! anything afterwards. A removed adapter's name answers 404 until an adapter of that name is added again.
//!
//! Adding one (on the caller's thread — a server's blocking worker — never the engine thread's) reads and checks
//! the directory exactly as at start (`crate::load`: the PEFT files against the base, the head, the tokenizer,
//! the calibration) and lays its LoRA out for the backbone ([`Backend::load_adapter`]); the install itself is
//! one swap under a write lock that a pass takes only to read the list, so a pass waits on a load for no longer
//! than the swap. Live changes need the service to serve the release files unmerged (`load_cpu_adapters` with
//! `--adapter`, or `--weights exact`): a merged default adapter is part of the shared weights.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use crate::calibrate::Calibration;
use crate::card::ModelInfo;
use crate::head::PointerHead;

/// An adapter's identity as its jobs hold it: an id never reused in the process, its name, and the identity of
/// its weights in cache keys. A clone per job in flight: the count tells when a removed adapter is unused.
#[derive(Debug, Clone)]
pub struct AdapterToken(Arc<TokenInner>);

#[derive(Debug)]
struct TokenInner {
    id: u64,
    name: String,
    model_id: u64,
}

impl AdapterToken {
    pub(crate) fn new(id: u64, name: String, model_id: u64) -> Self {
        AdapterToken(Arc::new(TokenInner { id, name, model_id }))
    }

    /// Its id (the default adapter's is 0).
    pub fn id(&self) -> u64 {
        self.0.id
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.0.name
    }

    /// The identity of its weights, form and arm in cache keys and pins.
    pub fn model_id(&self) -> u64 {
        self.0.model_id
    }

    /// Whether jobs hold it (beside its adapter).
    pub(crate) fn in_use(&self) -> bool {
        Arc::strong_count(&self.0) > 1
    }
}

/// One Kev adapter the service answers with: its rows run under its LoRA (`lora`, beside the shared
/// backbone's weights; none for the default adapter, whose weights are the backbone's as loaded), its
/// readout through its own head (and calibration), its prefix snapshots cached and pinned under its own
/// identity, so a state run under one adapter never answers another.
pub struct Adapter<A> {
    pub(crate) token: AdapterToken,
    pub(crate) lora: Option<Arc<A>>,
    pub(crate) head: PointerHead,
    pub(crate) model_id: u64,
    pub(crate) info: Option<ModelInfo>,
    pub(crate) calibration: Option<Arc<Calibration>>,
}

impl<A> Adapter<A> {
    /// Its name (what a request's `model` selects it by).
    pub fn name(&self) -> &str {
        self.token.name()
    }

    /// Its token (id, name, weights identity).
    pub fn token(&self) -> &AdapterToken {
        &self.token
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

/// A further adapter for [`crate::Kev::with_adapter`]: its name, LoRA, head, calibration and identity.
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

/// Where live adapters come from: the base directory the backbone was loaded from, and the default adapter's
/// record and tokenizer, which every adapter must match (`crate::load` sets it).
#[derive(Debug, Clone)]
pub struct LiveSource {
    /// The base release directory (its config and weights' names check an adapter's modules and shapes).
    pub base: PathBuf,
    /// What was loaded for the default adapter (base name and revision, arm, form).
    pub default: ModelInfo,
    /// The default adapter's `tokenizer.json` (one tokenizer serves every adapter).
    pub tokenizer: PathBuf,
}

/// The adapters of a service (see the module docs).
pub(crate) struct Registry<A> {
    pub(crate) default: Arc<Adapter<A>>,
    pub(crate) more: RwLock<Arc<Vec<Arc<Adapter<A>>>>>,
    pub(crate) retired: Mutex<Vec<Arc<Adapter<A>>>>,
    pub(crate) any_retired: AtomicBool,
    pub(crate) removed: Mutex<HashSet<String>>,
    pub(crate) next_id: AtomicU64,
    /// Serializes adds and removes (a load reads files for a while; the swap itself is short).
    pub(crate) changing: Mutex<()>,
}

impl<A> Registry<A> {
    pub(crate) fn new(default: Adapter<A>) -> Self {
        Registry {
            default: Arc::new(default),
            more: RwLock::new(Arc::new(Vec::new())),
            retired: Mutex::new(Vec::new()),
            any_retired: AtomicBool::new(false),
            removed: Mutex::new(HashSet::new()),
            next_id: AtomicU64::new(1),
            changing: Mutex::new(()),
        }
    }

    /// A fresh token for an adapter being made.
    pub(crate) fn token(&self, name: String, model_id: u64) -> AdapterToken {
        AdapterToken::new(self.next_id.fetch_add(1, Ordering::Relaxed), name, model_id)
    }

    /// The default adapter, to change while the service is being built (`None` once it is shared).
    pub(crate) fn default_mut(&mut self) -> Option<&mut Adapter<A>> {
        Arc::get_mut(&mut self.default)
    }

    /// The further adapters now.
    pub(crate) fn more(&self) -> Arc<Vec<Arc<Adapter<A>>>> {
        Arc::clone(&self.more.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// Add an adapter while the service is being built (not yet shared).
    pub(crate) fn push(&mut self, a: Adapter<A>) {
        let list = self.more.get_mut().unwrap_or_else(|p| p.into_inner());
        Arc::make_mut(list).push(Arc::new(a));
    }

    /// The adapter a token names: a served one, or a retired one a job still holds.
    pub(crate) fn get(&self, token: &AdapterToken) -> Arc<Adapter<A>> {
        if token.id() == 0 {
            return Arc::clone(&self.default);
        }
        if let Some(a) = self.more().iter().find(|a| a.token.id() == token.id()) {
            return Arc::clone(a);
        }
        let retired = self.retired.lock().unwrap_or_else(|p| p.into_inner());
        match retired.iter().find(|a| a.token.id() == token.id()) {
            Some(a) => Arc::clone(a),
            // Unreachable while the job holds its token; the default keeps the pass going.
            None => Arc::clone(&self.default),
        }
    }

    /// Whether the adapter a token names is still served (a retired one's jobs cache and pin nothing).
    pub(crate) fn is_served(&self, token: &AdapterToken) -> bool {
        token.id() == 0 || self.more().iter().any(|a| a.token.id() == token.id())
    }

    /// Whether `name` was removed (and not added again): its requests get 404, not the default adapter.
    pub(crate) fn was_removed(&self, name: &str) -> bool {
        self.removed_set().contains(name)
    }

    pub(crate) fn removed_set(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.removed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Drop the retired adapters no job holds any more; whether any went.
    pub(crate) fn sweep(&self) -> bool {
        if !self.any_retired.load(Ordering::Acquire) {
            return false;
        }
        let mut retired = self.retired.lock().unwrap_or_else(|p| p.into_inner());
        let before = retired.len();
        retired.retain(|a| a.token.in_use());
        self.any_retired
            .store(!retired.is_empty(), Ordering::Release);
        retired.len() < before
    }
}
