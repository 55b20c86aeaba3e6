//! The LoRA merge against PEFT's own merge on *unrounded* fp32 factors at real Kev-4B module shapes.
//!
//! The synthetic release's LoRA sits on a grid where every summation order of `B @ A` agrees, so its
//! merge manifest cannot catch an order bug. Here W, A and B come from splitmix64 streams that
//! `tools/reference/merge_case.py` generated the same way; the fixture holds the sha256 of PEFT's merged
//! BF16 weight (`fixtures/merge-4b.json`), and records how many elements an exact float64
//! product would round differently (non-zero: the case tells summation orders apart).

use std::path::PathBuf;

use kev_release::adapter::LoraWeights;
use kev_release::merge::{bf16_rne, merge_weight_bytes};
use kev_release::shards::{Dtype, TensorView};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// `(2u − 1) · scale` with `u = (splitmix64(seed, i) >> 40) · 2^-24`, element i = 0..n, in float32.
fn stream(seed: u64, n: usize, scale: f32) -> Vec<f32> {
    (1..=n as u64)
        .map(|i| {
            let mut z = seed.wrapping_add(i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            let u = (z >> 40) as f32 * (2f32).powi(-24);
            (u * 2.0 - 1.0) * scale
        })
        .collect()
}

#[test]
fn merge_equals_peft_on_unrounded_lora_at_4b_shapes() {
    let path = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../fixtures/merge-4b.json"
    ));
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let r = doc["r"].as_u64().unwrap() as usize;
    let scale = doc["scale"].as_f64().unwrap() as f32;
    let cases = doc["cases"].as_array().unwrap();
    assert!(cases.len() >= 2);
    let mut discriminating = 0;
    for c in cases {
        let (out_f, in_f) = (
            c["out"].as_u64().unwrap() as usize,
            c["in"].as_u64().unwrap() as usize,
        );
        let seeds: Vec<u64> = c["seeds"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_u64().unwrap())
            .collect();
        let w: Vec<u8> = stream(seeds[0], out_f * in_f, 0.05)
            .into_iter()
            .flat_map(|v| bf16_rne(v).to_bits().to_le_bytes())
            .collect();
        let lora = LoraWeights {
            r,
            in_features: in_f,
            out_features: out_f,
            a: stream(seeds[1], r * in_f, (1.0 / (in_f as f64).sqrt()) as f32),
            b: stream(seeds[2], out_f * r, 0.02),
        };
        let shape = [out_f, in_f];
        let name = c["module"].as_str().unwrap();
        let view = TensorView {
            name,
            dtype: Dtype::BF16,
            shape: &shape,
            data: &w,
        };
        let merged = merge_weight_bytes(&view, &lora, scale).unwrap();
        let got = hex::encode(Sha256::digest(&merged));
        assert_eq!(
            got,
            c["sha256"].as_str().unwrap(),
            "{name} [{out_f}, {in_f}]: the merge differs from PEFT's"
        );
        if c["differs_from_exact_product"].as_u64().unwrap() > 0 {
            discriminating += 1;
        }
    }
    assert!(
        discriminating >= 1,
        "no case separates summation orders: the test could not fail on an order bug"
    );
}
