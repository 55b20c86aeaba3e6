//! The backend boundary: a small trait over plain data (token ids, states, wanted indices → f32 hidden
//! rows), so a CUDA backend can slot in beside the CPU one without the callers (decide, server) knowing
//! which runs. States are the backend's own type: a GPU backend keeps its states in device memory.

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

    /// Advance every row's state by its tokens and return, per row, the final-norm hidden states at its
    /// wanted indices (`[wanted.len(), hidden]`, flattened, f32). On error no state changes.
    fn forward(&self, rows: &mut [BatchRow<'_, Self::State>])
    -> Result<Vec<Vec<f32>>, EngineError>;

    /// A short description for logs and `/v1/models` (`cpu avx512bf16 bf16`, …).
    fn describe(&self) -> String;
}

/// The CPU backend: a shared backbone and the compute arm to run it with.
#[derive(Debug, Clone)]
pub struct CpuBackend {
    model: Arc<Backbone>,
    arm: Arm,
}

impl CpuBackend {
    /// Run `model` with `arm`.
    pub fn new(model: Arc<Backbone>, arm: Arm) -> Self {
        CpuBackend { model, arm }
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

    fn forward(&self, rows: &mut [BatchRow<'_, State>]) -> Result<Vec<Vec<f32>>, EngineError> {
        self.model.forward_batch(self.arm, rows)
    }

    fn describe(&self) -> String {
        format!("cpu {} {}", self.model.kernels().isa(), self.arm.name())
    }
}
