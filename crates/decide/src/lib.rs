//! Decisions end to end: a request's rows → the state prefix run once (or taken from the prepared-state
//! cache) → every question branch continued from a clone of that state, branches batched through the
//! backbone's GEMMs → final-norm hidden states at the readout positions → pointer head → probabilities →
//! answers and usage.
#![deny(missing_docs)]

pub mod cache;
pub mod calibrate;
pub mod error;
pub mod head;
pub mod load;
pub mod pinned;
pub mod prescan;
pub mod rows;
mod run;
pub mod service;
pub mod task;

pub use calibrate::Calibration;
pub use head::PointerHead;
pub use load::{
    AdapterDir, LoadSpec, ModelInfo, Source, WeightForm, load_cpu, load_cpu_adapters, load_cpu_int8,
};
pub use service::{
    Caps, DecideError, Decision, Job, Kev, LOGITS_FIELD, OverCap, Refusal, Settings, Stats,
};
pub use task::{Grant, Need, Step, Task};
