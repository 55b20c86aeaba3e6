//! Decisions end to end: a request's rows → the state prefix run once (or taken from the prepared-state
//! cache) → every question branch continued from a clone of that state, branches batched through the
//! backbone's GEMMs → final-norm hidden states at the readout positions → pointer head → probabilities →
//! answers and usage.
#![deny(missing_docs)]

pub mod adapters;
pub mod admit;
pub mod cache;
pub mod calibrate;
pub mod card;
pub mod error;
pub mod fit;
pub mod head;
pub mod live;
pub mod load;
pub mod pinned;
pub mod prescan;
pub mod rows;
mod run;
pub mod service;
pub mod settings;
pub mod task;
pub mod urgency;

pub use adapters::{AdapterToken, LiveSource};
pub use admit::Body;
pub use calibrate::Calibration;
pub use card::{ModelInfo, WeightForm, served_names};
pub use head::PointerHead;
/// The engine types a front end names: the backend boundary, the CPU backend, and the process's memory
/// figures.
pub use kev_engine::{Backend, CpuBackend, memory};
pub use live::LiveError;
pub use load::{
    AdapterDir, LoadSpec, Source, demo_release, load_cpu, load_cpu_adapters, load_cpu_int8,
};
pub use pinned::{PinOrder, PinRefusal, STATE_ID_FIELD};
pub use service::{DecideError, Decision, Job, Kev, LOGITS_FIELD, OverCap, Refusal, Stats};
pub use settings::{Caps, Settings};
pub use task::{Grant, Lane, Need, Step, Task};
pub use urgency::{Priority, Urgency};
