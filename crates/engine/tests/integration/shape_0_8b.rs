//! The Qwen3.5-0.8B shape through the loader and the forward pass. Where it differs from the 4B — 8/2
//! attention heads, 16 DeltaNet key heads for 16 value heads (1:1 where the 4B groups 1:2), hidden 1024,
//! MLP 3584 — nothing may be assumed. The release is `kev synth`'s 0.8B shape cut to its first block of four
//! layers (three DeltaNet + one attention, every width real) and a 2,048-row embedding: the full 24 layers
//! and 248,320 rows are 1.5 GB, too much to write in a test; the widths are what the loader and the kernels
//! see, and one block has every layer kind. Decisions on the whole 0.8B shape are measured against the
//! Python reference outside the tests (crates/engine/README.md).

use std::path::Path;

use kev_engine::reference::Reference;
use kev_engine::synth::{SynthOptions, cut, write_release};
use kev_engine::{Arm, Backbone, LayerKind, LoadOptions, Qwen35Config};
use serde_json::Value;

fn tokens(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 33) % vocab as u64) as u32
        })
        .collect()
}

fn rel_err(a: &[f32], b: &[f32], h: usize) -> f32 {
    a.chunks(h)
        .zip(b.chunks(h))
        .map(|(x, y)| {
            let m = y.iter().fold(0f32, |m, v| m.max(v.abs()));
            x.iter().zip(y).fold(0f32, |e, (p, q)| e.max((p - q).abs())) / m
        })
        .fold(0f32, f32::max)
}

fn small_08b() -> Qwen35Config {
    cut(&Qwen35Config::qwen35_0_8b(), 4, 2048)
}

fn write(dir: &Path, c: &Qwen35Config) {
    write_release(
        dir,
        &SynthOptions {
            config: c.clone(),
            seed: 8,
            shards: 1,
            adapter: true,
            f32_weights: false,
        },
    )
    .unwrap();
}

/// dtype of every tensor in a safetensors file, by name.
fn dtypes(path: &Path) -> Vec<(String, String)> {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let h: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    h.as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| *k != "__metadata__")
        .map(|(k, v)| (k.clone(), v["dtype"].as_str().unwrap().to_string()))
        .collect()
}

#[test]
fn the_0_8b_shape_loads_and_runs_like_the_reference() {
    let dir = tempfile::tempdir().unwrap();
    let c = small_08b();
    write(dir.path(), &c);
    let base = dir.path().join("base");

    // As written: the widths of the published config, A_log and the gated norm in F32 (2 per DeltaNet
    // layer, as the published 0.8B stores its 36), everything else BF16.
    let read = Qwen35Config::from_dir(&base).unwrap();
    assert_eq!(read, c);
    let types = dtypes(&base.join("model.safetensors"));
    let f32s: Vec<&str> = types
        .iter()
        .filter(|(_, d)| d == "F32")
        .map(|(n, _)| n.as_str())
        .collect();
    assert_eq!(f32s.len(), 2 * 3, "{f32s:?}");
    assert!(
        f32s.iter()
            .all(|n| n.ends_with("linear_attn.A_log") || n.ends_with("linear_attn.norm.weight"))
    );

    let m = Backbone::load(
        &base,
        &LoadOptions {
            adapter: Some(dir.path().join("kev")),
            kernels: None,
            merge_adapter: false,
        },
    )
    .unwrap();
    assert!(m.has_lora());
    let cfg = m.config();
    assert_eq!(
        cfg.layer_types,
        [
            LayerKind::Linear,
            LayerKind::Linear,
            LayerKind::Linear,
            LayerKind::Full
        ]
    );
    assert_eq!(
        (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.linear_num_key_heads,
            cfg.linear_num_value_heads
        ),
        (8, 2, 16, 16)
    );
    // BF16 weights of every projection: 3 DeltaNet layers (in_proj 8,224 × 1,024, out_proj 1,024 × 2,048),
    // one attention layer (q,k,v 5,120 × 1,024, o 1,024 × 2,048), 4 MLPs (3 × 3,584 × 1,024), the embedding.
    let proj = 3 * (8224 * 1024 + 1024 * 2048) + (5120 * 1024 + 1024 * 2048) + 4 * 3 * 3584 * 1024;
    let bf16_bytes = 2 * (proj + 2048 * 1024);
    assert!(m.weight_bytes() >= bf16_bytes, "{}", m.weight_bytes());

    // fp32 fast path (unmerged LoRA, every kernel the CPU has) against the engine's per-token reference on
    // the same weights; the tolerance of tests/engine.rs (random weights amplify f32 rounding).
    let toks = tokens(40, c.vocab_size, 1);
    let wanted: Vec<usize> = vec![0, 1, 17, 39];
    let mut s0 = m.new_state();
    let reference = Reference::load(
        &base,
        &LoadOptions {
            adapter: Some(dir.path().join("kev")),
            ..LoadOptions::default()
        },
    )
    .unwrap();
    let want = reference.forward(&mut s0, &toks, &wanted).unwrap();
    let mut s1 = m.new_state();
    let got = m.forward(Arm::Fp32, &mut s1, &toks, &wanted).unwrap();
    let e = rel_err(&got, &want, c.hidden_size);
    eprintln!("0.8B shape, fp32 vs reference: {e:.2e}");
    assert!(e < 1e-3, "fp32 {e}");
    assert!(want.iter().all(|x| x.is_finite()));
    // the LoRA is not a no-op here: without it the outputs move
    let plain = Backbone::load(&base, &LoadOptions::default()).unwrap();
    let mut s2 = plain.new_state();
    let off = plain.forward(Arm::Fp32, &mut s2, &toks, &wanted).unwrap();
    assert!(rel_err(&off, &want, c.hidden_size) > 1e-2);
}

/// An untied 0.8B-width checkpoint carries `lm_head.weight`; the backbone (which has no LM head) loads it
/// and skips it, and the config round-trips the tie.
#[test]
fn an_untied_checkpoint_loads_without_its_lm_head() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cut(&Qwen35Config::qwen35_0_8b(), 4, 256);
    c.tie_word_embeddings = false;
    write_release(
        dir.path(),
        &SynthOptions {
            config: c.clone(),
            seed: 2,
            shards: 2,
            adapter: false,
            f32_weights: false,
        },
    )
    .unwrap();
    let base = dir.path().join("base");
    let index: Value =
        serde_json::from_slice(&std::fs::read(base.join("model.safetensors.index.json")).unwrap())
            .unwrap();
    assert!(index["weight_map"].get("lm_head.weight").is_some());
    let m = Backbone::load(&base, &LoadOptions::default()).unwrap();
    assert!(!m.config().tie_word_embeddings);
    assert_eq!(m.config(), &c);
}
