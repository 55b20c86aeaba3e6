//! Every option of the decision service, and the defaults that depend on the machine.

use std::sync::Arc;

use kev_tokenize::Limits;

use crate::calibrate::Calibration;

/// Per-request work caps: a request over one is refused with 413 before the engine sees it.
///
/// Kev 1.0 sets no such limits (kev-contract §5.2: "no limit"), so one body could hold the engine for as
/// long as it liked. The defaults leave room for every request the contract's examples and the conformance
/// suites send ("hundreds of questions") and bound the engine time of one request to about two maximum-size
/// rows: a full 65,536-token state plus 64 Ki tokens of questions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    /// Most questions in one request (default 1,024).
    pub max_questions: usize,
    /// Most options over all questions (noul counts 2; default 16,384 — 64 choice questions of 255 options).
    pub max_options: usize,
    /// Most input tokens: the state once plus every question's branch, as `usage.input_tokens` counts them
    /// (default 131,072).
    pub max_input_tokens: usize,
    /// Most requests in one batch (`/v1/systemone/batch`; default 256).
    pub max_batch_requests: usize,
    /// Most input tokens over all the admitted requests of one batch (default 1,048,576: eight requests at
    /// `max_input_tokens`). Each request of a batch is also held to the caps above on its own.
    pub max_batch_input_tokens: usize,
}

impl Default for Caps {
    fn default() -> Self {
        Caps {
            max_questions: 1024,
            max_options: 16_384,
            max_input_tokens: 131_072,
            max_batch_requests: 256,
            max_batch_input_tokens: 1 << 20,
        }
    }
}

/// Every option of the decision service. The front ends (`kev` flags, the Python package's arguments) only
/// parse into it; what a request gets from them is decided here, once.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Token limits (kev-contract §5.2) and truncate-state mode.
    pub limits: Limits,
    /// Per-request work caps (413).
    pub caps: Caps,
    /// Largest number of tokens one forward pass takes (a longer single row still runs alone).
    pub pass_tokens: usize,
    /// Byte budget of the prepared-state cache (0 disables it). `None`: [`default_cache_bytes`], chosen
    /// when the service is assembled (`Kev::new`), once the weights are resident; the service's own
    /// settings then hold the budget chosen.
    pub cache_bytes: Option<usize>,
    /// Byte budget of the pinned states ([`crate::pinned`]; 0 disables pinning), beside the cache's.
    pub pin_bytes: usize,
    /// Snapshot at a multiple of the GDN chunk (exact sharing, see the module docs). Off: snapshot at
    /// the end of the state (fewer tokens, equal to a from-zero row only to fp32 rounding).
    pub chunk_aligned: bool,
    /// Run every question as its own row from zero, as the author's reference does (no sharing, no
    /// cache): for parity checks and benchmarks.
    pub rows_from_zero: bool,
    /// Add date facts to every state naming two or more dates (`kev_contract::with_date_facts`, the author's
    /// `KEV_DATE_FACTS=1`) before it is tokenized.
    pub date_facts: bool,
    /// Temperatures fitted by `kev calibrate` ([`Calibration::read`]), served by the pointer head instead
    /// of its stored one; `None` serves the stored temperature. (The default adapter's; another adapter
    /// serves its own, `AdapterSpec::calibration`.)
    pub calibration: Option<Arc<Calibration>>,
    /// A `model` that names no adapter is refused (400 `api_usage_error`, as the live SystemOne API does)
    /// instead of answered by the default adapter with the name echoed (Kev 1.0's behaviour, the default).
    pub strict_models: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            limits: Limits::KEV,
            caps: Caps::default(),
            pass_tokens: 4096,
            cache_bytes: None,
            pin_bytes: 1 << 30,
            chunk_aligned: true,
            rows_from_zero: false,
            date_facts: false,
            calibration: None,
            strict_models: false,
        }
    }
}

/// The prepared-state cache budget every front end defaults to, chosen once the weights are loaded: an
/// eighth of the physical memory this process does not already hold, at most 4 GiB (512 MiB if either
/// cannot be read). The cache competes with the weights for the machine: on an 8 GB laptop serving the
/// int8 4B (3.6 GiB resident) that is ~0.5 GiB, where an eighth of all memory (1 GiB) took the server
/// past 5 GiB at its peak.
pub fn default_cache_bytes() -> usize {
    use kev_engine::memory::{resident_bytes, total_memory};
    match (total_memory(), resident_bytes()) {
        (Some(total), Some(held)) => cache_budget(total as usize, held as usize),
        _ => 512 << 20,
    }
}

/// [`default_cache_bytes`] of a machine with `total` bytes of memory, `held` of them by this process.
fn cache_budget(total: usize, held: usize) -> usize {
    (total.saturating_sub(held) / 8).min(4 << 30)
}

#[cfg(test)]
mod tests {
    use super::cache_budget;

    #[test]
    fn the_default_cache_leaves_room_for_the_weights() {
        const MIB: usize = 1 << 20;
        const GIB: usize = 1 << 30;
        // An 8 GB laptop (7.5 GiB to Linux) serving the int8 4B (3.5 GiB resident): 512 MiB, where an
        // eighth of all memory was 960 MiB.
        assert_eq!(cache_budget(7680 * MIB, 3584 * MIB), 512 * MIB);
        // The BF16 4B (7 GiB) on a 16 GiB machine: 1.125 GiB. A large machine: capped at 4 GiB.
        assert_eq!(cache_budget(16 * GIB, 7 * GIB), 9 * GIB / 8);
        assert_eq!(cache_budget(256 * GIB, 7 * GIB), 4 * GIB);
        // A process holding more than the machine (swap): no cache.
        assert_eq!(cache_budget(4 * GIB, 5 * GIB), 0);
    }
}
