//! The backend boundary: a small trait over plain data (token ids, states, wanted indices → f32 hidden
//! rows, state sizes, the snapshot grain), so the CUDA backend (`kev-cuda`) slots in beside the CPU one
//! without the callers (decide, server) knowing which runs. States and adapters are the backend's own types:
//! a GPU backend keeps its states in device memory.

use std::path::Path;
use std::sync::Arc;

use crate::adapter::Adapter;
use crate::error::EngineError;
use crate::forward::PassOptions;
use crate::kernels::Arm;
use crate::model::Backbone;
use crate::pass::BatchRow;
use crate::pause::Lanes;
use crate::state::State;

/// A device that runs the backbone.
pub trait Backend: Send + Sync {
    /// A sequence state; `Clone` must be a cheap snapshot that later calls never disturb.
    type State: Clone + Send + Sync;

    /// A LoRA adapter laid out for this backend's model, run unmerged beside its weights (rows name it).
    type Adapter: Send + Sync;

    /// The PEFT adapter in `adapter_dir` for this model (loaded from `base_dir`), checked against it; a
    /// module or shape that does not fit is refused by name.
    fn load_adapter(
        &self,
        base_dir: &Path,
        adapter_dir: &Path,
    ) -> Result<Self::Adapter, EngineError>;

    /// Bytes an adapter holds.
    fn adapter_bytes(&self, adapter: &Self::Adapter) -> usize;

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
    /// wanted indices (`[wanted.len(), hidden]`, flattened, f32). On error no state changes. A
    /// `background` pass steps aside at its safe points while those lanes' foreground work runs.
    fn forward(
        &self,
        rows: &mut [BatchRow<'_, Self::State, Self::Adapter>],
        background: Option<&Lanes>,
    ) -> Result<Vec<Vec<f32>>, EngineError>;

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
    type Adapter = Adapter;

    fn load_adapter(&self, base_dir: &Path, adapter_dir: &Path) -> Result<Adapter, EngineError> {
        Adapter::load(&self.model, base_dir, adapter_dir)
    }

    fn adapter_bytes(&self, adapter: &Adapter) -> usize {
        adapter.bytes()
    }

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

    fn forward(
        &self,
        rows: &mut [BatchRow<'_, State>],
        background: Option<&Lanes>,
    ) -> Result<Vec<Vec<f32>>, EngineError> {
        let opts = PassOptions {
            observer: self.observer.as_deref(),
            background,
        };
        self.model.forward_batch_with(self.arm, rows, opts)
    }

    fn describe(&self) -> String {
        format!("cpu {} {}", self.model.kernels().isa(), self.arm.name())
    }

    fn device(&self) -> String {
        "cpu".into()
    }
}
