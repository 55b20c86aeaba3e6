//! The backend boundary: a small trait over plain data (token ids, states, wanted indices → f32 hidden
//! rows, state sizes, the snapshot grain), so the CUDA backend (`kev-cuda`) slots in beside the CPU one
//! without the callers (decide, server) knowing which runs. States are the backend's own type: a GPU backend keeps its states in device memory.

use std::sync::Arc;

use crate::error::EngineError;
use crate::forward::BatchRow;
use crate::kernels::Arm;
use crate::model::Backbone;
use crate::state::State;

/// A device that runs the backbone.
pub trait Backend: Send + Sync {
    /// A sequence state; `Clone` must be a cheap snapshot that later calls never disturb.
    type State: Clone + Send + Sync;

    /// Width of the returned hidden rows.
    fn hidden_size(&self) -> usize;

    /// The empty state (position 0).
    fn new_state(&self) -> Self::State;

    /// Tokens a state has consumed (the position of its next token).
    fn position(&self, state: &Self::State) -> usize;

    /// Bytes a state holds, wherever it lives (the prepared-state cache's budget counts them).
    fn state_bytes(&self, state: &Self::State) -> usize;

    /// The snapshot grain: a row split at a multiple of it and continued from the snapshot gives, bit for
    /// bit, the row run in one pass (the CPU's chunked delta rule splits at multiples of its chunk; a
    /// token-serial recurrence splits anywhere, grain 1).
    fn snapshot_grain(&self) -> usize;

    /// Advance every row's state by its tokens and return, per row, the final-norm hidden states at its
    /// wanted indices (`[wanted.len(), hidden]`, flattened, f32). On error no state changes.
    fn forward(&self, rows: &mut [BatchRow<'_, Self::State>])
    -> Result<Vec<Vec<f32>>, EngineError>;

    /// A short description for logs and `/v1/models` (`cpu avx512bf16 bf16`, …).
    fn describe(&self) -> String;

    /// The device as `/v1/models` names it (`x_device`: `cpu`, `cuda:0`).
    fn device(&self) -> String;
}

/// The CPU backend: a shared backbone and the compute arm to run it with.
#[derive(Debug, Clone)]
pub struct CpuBackend {
    model: Arc<Backbone>,
    arm: Arm,
    observer: Option<Arc<crate::ActivationObserver>>,
}

impl CpuBackend {
    /// The snapshot grain of the CPU path: the GDN chunk length (a split elsewhere changes the chunking,
    /// so the continued row differs from the one-pass row in the last bits).
    pub const SNAPSHOT_GRAIN: usize = crate::gdn::CHUNK;

    /// Run `model` with `arm`.
    pub fn new(model: Arc<Backbone>, arm: Arm) -> Self {
        CpuBackend {
            model,
            arm,
            observer: None,
        }
    }

    /// Run `model` with `arm`, every projection's input shown to `observer` first (the fp32 forwards of an
    /// int8 calibration: [`Backbone::activation_observer`]).
    pub fn observed(
        model: Arc<Backbone>,
        arm: Arm,
        observer: Arc<crate::ActivationObserver>,
    ) -> Self {
        CpuBackend {
            model,
            arm,
            observer: Some(observer),
        }
    }

    /// The loaded model.
    pub fn model(&self) -> &Arc<Backbone> {
        &self.model
    }

    /// The compute arm.
    pub fn arm(&self) -> Arm {
        self.arm
    }
}

impl Backend for CpuBackend {
    type State = State;

    fn hidden_size(&self) -> usize {
        self.model.config().hidden_size
    }

    fn new_state(&self) -> State {
        self.model.new_state()
    }

    fn position(&self, state: &State) -> usize {
        state.position()
    }

    fn state_bytes(&self, state: &State) -> usize {
        state.bytes()
    }

    fn snapshot_grain(&self) -> usize {
        Self::SNAPSHOT_GRAIN
    }

    fn forward(&self, rows: &mut [BatchRow<'_, State>]) -> Result<Vec<Vec<f32>>, EngineError> {
        self.model
            .forward_batch_observed(self.arm, rows, self.observer.as_deref())
    }

    fn describe(&self) -> String {
        format!("cpu {} {}", self.model.kernels().isa(), self.arm.name())
    }

    fn device(&self) -> String {
        "cpu".into()
    }
}
