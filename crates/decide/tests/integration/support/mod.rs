//! What the decide crate's kev-mini tests share (`mod support;` in each): where kev-mini lives, how it is
//! loaded, its dev split's request bodies, and the argmax the flip checks use. Each test binary uses part of it.
#![allow(dead_code)]

use std::path::PathBuf;

use kev_decide::{LoadSpec, Settings, Source, WeightForm};
use kev_engine::Arm;
use serde_json::Value;

/// kev-mini, the trained miniature (`fixtures/mini`).
pub fn mini() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/mini"))
}

/// kev-mini's release files in the given weight form and compute arm, with a small state cache.
pub fn spec(form: WeightForm, arm: Option<Arm>) -> LoadSpec {
    LoadSpec {
        source: Source::Release {
            base: mini().join("base"),
            kev: mini().join("kev"),
        },
        form,
        arm,
        settings: Settings {
            cache_bytes: Some(64 << 20),
            ..Settings::default()
        },
    }
}

/// The dev split's request bodies: the int8 arm's calibration rows (never the test split).
pub fn dev_bodies() -> Vec<Vec<u8>> {
    std::fs::read_to_string(mini().join("data/dev.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            serde_json::to_vec(&v["request"]).unwrap()
        })
        .collect()
}

/// The first index of the largest value.
pub fn argmax(v: &[f64]) -> usize {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best
}
