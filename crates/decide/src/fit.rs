//! Whether a model fits this machine's memory in the compute arm asked for, decided before anything is loaded.
//!
//! Kev-9B in BF16 is 12.9 GiB of projections; on a 16 GB laptop the load would run the machine into swap or
//! the OOM killer minutes in. So the loader first estimates the resident memory of the arm (the projections as
//! the backbone packs them: 2 bytes a weight for the float arms, BF16 weights × f32 activations for `fp32` too;
//! 1 byte a weight plus row scales and the BF16 islands for `int8`; the unmerged LoRA in f32 for the `exact`
//! form; plus a working allowance for one forward pass, the tokenizer and the heap) from `config.json` alone,
//! compares it with the memory the system says is available now (`MemAvailable`: free memory and reclaimable
//! caches, after what every other process holds), and refuses a load that cannot fit with the figures and the
//! arm that would fit. The embedding is not counted: it stays memory-mapped and only the rows a request reads
//! become resident. The prepared-state cache is not counted either: its default budget is chosen after the
//! load from what is left (`default_cache_bytes`).
//!
//! `KEV_MEMORY_CHECK=off` skips the check (a machine whose `MemAvailable` understates what it can give).

use std::path::Path;

use kev_engine::{Arm, Qwen35Config};

use crate::card::WeightForm;

const GIB: f64 = (1u64 << 30) as f64;

/// The memory estimate of one arm.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Need {
    /// The resident weights (projections and small tensors; the mapped embedding excluded).
    pub weights: u64,
    /// Working memory: one forward pass's buffers, the tokenizer, the heap.
    pub working: u64,
}

impl Need {
    /// Everything.
    pub fn total(&self) -> u64 {
        self.weights + self.working
    }
}

/// What a load of `cfg` in `arm` (and `form`, with `adapter_bytes` of f32 LoRA factors kept unmerged in the
/// `exact` form) will hold resident, before its state cache. `pass_tokens` sizes the working allowance.
pub fn need(
    cfg: &Qwen35Config,
    arm: Arm,
    form: WeightForm,
    adapter_bytes: u64,
    pass_tokens: usize,
) -> Need {
    let p = cfg.projection_weight_count();
    let small =
        4 * (cfg.num_layers() as u64) * (4 * cfg.hidden_size as u64 + cfg.conv_dim() as u64 * 5);
    let projections = match arm {
        // int8 weights, an f32 scale per output row, and layer 0's DeltaNet input projections kept in BF16
        // (the rule's islands: bf16_layer_islands).
        Arm::Int8 => {
            let rows: u64 = cfg.projection_rows_count();
            let islands = cfg.hidden_size as u64
                * (cfg.conv_dim() + cfg.value_dim() + 2 * cfg.linear_num_value_heads) as u64;
            p + 4 * rows + 2 * islands
        }
        // BF16 panels for both float arms (fp32 widens as it multiplies).
        _ => 2 * p,
    };
    let lora = if form == WeightForm::Exact {
        adapter_bytes
    } else {
        0
    };
    // One pass's widest buffers: the MLP in passes of 1,056 rows (gate, up, activation in f32), the mixers'
    // projections of the whole pass, the residual stream; plus 512 MiB for the tokenizer and the heap.
    let pass = pass_tokens.max(1) as u64;
    let widths = (cfg.conv_dim() + cfg.value_dim() + 2 * cfg.num_attention_heads * cfg.head_dim)
        as u64
        + 4 * cfg.hidden_size as u64;
    let working = 4 * pass * widths + 3 * 4 * 1056 * cfg.intermediate_size as u64 + (512 << 20);
    Need {
        weights: projections + small + lora,
        working,
    }
}

/// The memory the system can give this process now (`MemAvailable`), if it says.
fn available() -> Option<u64> {
    kev_engine::memory::available_memory()
}

/// Refuse, before loading, a model `config_dir` holds that cannot fit in `arm`: the message names what the arm
/// needs, what is available and the arm that fits (or that none does). `None` when it fits, when the machine
/// does not say what is available, or when `KEV_MEMORY_CHECK=off`.
pub fn check(
    config_dir: &Path,
    arm: Arm,
    form: WeightForm,
    adapter_bytes: u64,
    pass_tokens: usize,
) -> Option<String> {
    if std::env::var("KEV_MEMORY_CHECK").is_ok_and(|v| v.eq_ignore_ascii_case("off")) {
        return None;
    }
    // A config the loader will refuse is the loader's to report.
    let cfg = Qwen35Config::from_dir(config_dir).ok()?;
    verdict(&cfg, arm, form, adapter_bytes, pass_tokens, available()?)
}

/// [`check`] on a machine with `available` bytes.
fn verdict(
    cfg: &Qwen35Config,
    arm: Arm,
    form: WeightForm,
    adapter_bytes: u64,
    pass_tokens: usize,
    available: u64,
) -> Option<String> {
    let n = need(cfg, arm, form, adapter_bytes, pass_tokens);
    if n.total() <= available {
        return None;
    }
    let gib = |b: u64| format!("{:.1} GiB", b as f64 / GIB);
    let fits = [Arm::Bf16, Arm::Fp32, Arm::Int8]
        .into_iter()
        .filter(|a| *a != arm)
        .map(|a| (a, need(cfg, a, WeightForm::Merged, 0, pass_tokens).total()))
        .filter(|(_, t)| *t <= available)
        .min_by_key(|(_, t)| *t);
    let advice = match fits {
        Some((a, t)) => format!(
            "--precision {} fits (about {}{})",
            a.name(),
            gib(t),
            if form == WeightForm::Exact {
                ", merged weights"
            } else {
                ""
            }
        ),
        None => "no arm fits: free memory, or use a machine with more".to_string(),
    };
    Some(format!(
        "not enough memory for the {} arm: it needs about {} ({} of weights, {} working), and {} is \
         available now; {advice}. KEV_MEMORY_CHECK=off loads anyway",
        arm.name(),
        gib(n.total()),
        gib(n.weights),
        gib(n.working),
        gib(available),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 1 << 30;

    #[test]
    fn the_9b_arms_are_what_the_issue_budgets() {
        let c = Qwen35Config::qwen35_9b();
        let bf16 = need(&c, Arm::Bf16, WeightForm::Merged, 0, 4096);
        let fp32 = need(&c, Arm::Fp32, WeightForm::Merged, 0, 4096);
        let int8 = need(&c, Arm::Int8, WeightForm::Merged, 0, 4096);
        // 6.92 B projection weights: 12.9 GiB in BF16, 6.4 GiB in int8 (+ scales and islands)
        assert_eq!(bf16, fp32);
        assert!(
            (bf16.weights as f64 / G as f64 - 12.9).abs() < 0.1,
            "{bf16:?}"
        );
        assert!(
            (int8.weights as f64 / G as f64 - 6.55).abs() < 0.15,
            "{int8:?}"
        );
        assert!(bf16.total() < 19 * G && int8.total() < 11 * G);
        let exact = need(&c, Arm::Fp32, WeightForm::Exact, 173 << 20, 4096);
        assert_eq!(exact.weights, bf16.weights + (173 << 20));
    }

    #[test]
    fn a_machine_too_small_for_the_arm_is_told_which_arm_fits() {
        let c = Qwen35Config::qwen35_9b();
        let bf16 = need(&c, Arm::Bf16, WeightForm::Merged, 0, 4096).total();
        let int8 = need(&c, Arm::Int8, WeightForm::Merged, 0, 4096).total();
        // a 16 GB laptop with 12 GiB available: bf16 does not fit, int8 does
        let msg = verdict(&c, Arm::Bf16, WeightForm::Merged, 0, 4096, 12 * G).unwrap();
        assert!(bf16 > 12 * G && int8 < 12 * G);
        assert!(
            msg.contains("bf16 arm")
                && msg.contains("--precision int8 fits")
                && msg.contains("12.0 GiB"),
            "{msg}"
        );
        // enough: no message
        assert_eq!(
            verdict(&c, Arm::Bf16, WeightForm::Merged, 0, 4096, 20 * G),
            None
        );
        assert_eq!(
            verdict(&c, Arm::Int8, WeightForm::Merged, 0, 4096, int8),
            None
        );
        // nothing fits
        let msg = verdict(&c, Arm::Int8, WeightForm::Merged, 0, 4096, 4 * G).unwrap();
        assert!(msg.contains("no arm fits"), "{msg}");
        // the 4B in bf16 on the same 12 GiB fits
        let four = Qwen35Config::qwen35_4b();
        assert_eq!(
            verdict(&four, Arm::Bf16, WeightForm::Merged, 0, 4096, 12 * G),
            None
        );
    }
}
