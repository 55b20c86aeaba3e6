//! Adapters added and removed while a service serves ([`crate::adapters`] holds what they are): the
//! directory read and checked as at start (`crate::load`), the swap, the retirement.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use kev_engine::Backend;
use serde_json::Value;

use crate::load::{AdapterDir, LoadError};
use crate::service::Kev;

/// Why an adapter could not be added or removed live.
#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    /// The service was not loaded in a form that takes adapters live.
    #[error("{0}")]
    NotOffered(String),
    /// An adapter (or the default's names) has this name already.
    #[error("an adapter named {0:?} is already served; remove it first")]
    Taken(String),
    /// No served adapter has this name.
    #[error("no adapter named {0:?} is served")]
    Unknown(String),
    /// The default adapter is part of the loaded weights.
    #[error(
        "{0:?} is the default adapter (the weights the server was started with); it cannot be removed"
    )]
    Default(String),
    /// The directory is not an adapter for this base: the same message as at start.
    #[error(transparent)]
    Refused(#[from] LoadError),
}

impl<B: Backend> Kev<B> {
    /// Whether adapters can be added and removed while the service serves.
    pub fn live_adapters(&self) -> bool {
        self.live_source().is_some()
    }

    /// Serve the adapter in `dir` under `name` from the next request on: read and checked as at start, laid out
    /// for the backbone on the calling thread, installed by one swap. Its card on success.
    pub fn add_adapter(&self, name: &str, dir: PathBuf) -> Result<Value, LiveError> {
        let source = self.live_source().ok_or_else(not_offered)?;
        let reg = self.registry();
        let _one = reg.changing.lock().unwrap_or_else(|p| p.into_inner());
        if self.serves_name(name) {
            return Err(LiveError::Taken(name.to_owned()));
        }
        let a = AdapterDir {
            name: name.to_owned(),
            dir,
        };
        let lora = self
            .backend()
            .load_adapter(&source.base, &a.dir)
            .map_err(|e| crate::load::adapter_error(&a, e))?;
        let bytes = self.backend().adapter_bytes(&lora);
        let spec = crate::load::adapter_spec(self, source, &a, Arc::new(lora), bytes)?;
        let adapter = Arc::new(self.make_adapter(spec));
        {
            let mut more = reg.more.write().unwrap_or_else(|p| p.into_inner());
            let mut list = Vec::clone(&**more);
            list.push(Arc::clone(&adapter));
            *more = Arc::new(list);
        }
        reg.removed_set().remove(name);
        tracing::info!(adapter = %name, dir = %a.dir.display(), adapter_bytes = bytes, "adapter added live");
        Ok(self.card_of(&adapter, false))
    }

    /// Stop serving adapter `name`: no request admitted from now on reaches it (404), the ones in flight finish
    /// on it, its cache entries and pins go now, its memory when its last request is done.
    pub fn remove_adapter(&self, name: &str) -> Result<(), LiveError> {
        let reg = self.registry();
        let _one = reg.changing.lock().unwrap_or_else(|p| p.into_inner());
        if reg.default.name() == name || self.is_default_name(name) {
            return Err(LiveError::Default(name.to_owned()));
        }
        let gone = {
            let mut more = reg.more.write().unwrap_or_else(|p| p.into_inner());
            let Some(at) = more.iter().position(|a| a.name() == name) else {
                return Err(LiveError::Unknown(name.to_owned()));
            };
            let mut list = Vec::clone(&**more);
            let gone = list.remove(at);
            *more = Arc::new(list);
            gone
        };
        reg.removed_set().insert(name.to_owned());
        self.forget_model(gone.model_id);
        if gone.token.in_use() {
            let mut retired = reg.retired.lock().unwrap_or_else(|p| p.into_inner());
            retired.push(gone);
            reg.any_retired.store(true, Ordering::Release);
        } else {
            drop(gone);
            kev_engine::release_free_heap();
        }
        tracing::info!(adapter = %name, "adapter removed live");
        Ok(())
    }

    /// Adapters removed whose last requests are still in flight (they go at the pass after those end).
    pub fn retired_adapters(&self) -> usize {
        self.registry()
            .retired
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }

    /// Drop the retired adapters whose last job is done, and give their memory back.
    pub(crate) fn sweep_adapters(&self) {
        if self.registry().sweep() {
            kev_engine::release_free_heap();
        }
    }
}

fn not_offered() -> LiveError {
    LiveError::NotOffered(
        "adapters are not changed live on this server: it serves a merged or prepared model; start it from the \
         release files unmerged (kev serve --base DIR --adapter NAME=DIR …, or --weights exact)"
            .into(),
    )
}
