//! `kev prepare --int8` end to end on kev-mini (`fixtures/mini`, a trained miniature Kev): the prepared
//! directory's stored int8 form (`int8.safetensors`) loads for `--precision int8` and answers every dev-split
//! request bit for bit as the int8 arm quantised at load from the release does; the manifest records the file
//! and the scheme. Skips (prints `skipped:`) where `fixtures/mini` is absent.

use std::path::PathBuf;
use std::process::Command;

use kev_decide::{Kev, LoadSpec, Settings, Source, WeightForm, load_cpu};
use kev_engine::{Arm, CpuBackend};
use serde_json::Value;

fn mini() -> Option<PathBuf> {
    let d = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/mini"));
    (d.join("kev/head.pt").is_file() && d.join("data/dev.jsonl").is_file()).then_some(d)
}

fn answers(kev: &Kev<CpuBackend>, bodies: &[Vec<u8>]) -> Vec<Vec<Vec<u32>>> {
    bodies
        .iter()
        .map(|b| {
            let d = kev.decide(b).unwrap().unwrap();
            d.probabilities
                .iter()
                .map(|p| p.iter().map(|x| x.to_bits()).collect())
                .collect()
        })
        .collect()
}

fn load(source: Source) -> Kev<CpuBackend> {
    load_cpu(&LoadSpec {
        source,
        form: WeightForm::Merged,
        arm: Some(Arm::Int8),
        settings: Settings::default(),
    })
    .unwrap()
    .0
}

#[test]
fn prepare_int8_stores_the_arm_it_loads() {
    let Some(m) = mini() else {
        eprintln!("skipped: fixtures/mini (kev-mini) is not in this checkout");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("prepared");
    let run = Command::new(env!("CARGO_BIN_EXE_kev"))
        .env("KEV_LOG", "warn")
        .arg("prepare")
        .arg("--base")
        .arg(m.join("base"))
        .arg("--kev")
        .arg(m.join("kev"))
        .arg("--out")
        .arg(&out)
        .args(["--int8", "--quiet"])
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "kev prepare --int8: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    let file = out.join(kev_engine::INT8_FILE);
    assert!(file.is_file(), "no {}", file.display());
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("manifest.json")).unwrap()).unwrap();
    assert!(
        manifest.to_string().contains(kev_engine::INT8_FILE),
        "the manifest does not record {}",
        kev_engine::INT8_FILE
    );

    let bodies: Vec<Vec<u8>> = std::fs::read_to_string(m.join("data/dev.jsonl"))
        .unwrap()
        .lines()
        .take(40)
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            serde_json::to_vec(&v["request"]).unwrap()
        })
        .collect();
    let stored = load(Source::Prepared(out.clone()));
    assert!(stored.backend().model().int8_only());
    let at_load = load(Source::Release {
        base: m.join("base"),
        kev: m.join("kev"),
    });
    assert!(at_load.backend().model().int8_only());
    let (a, b) = (answers(&stored, &bodies), answers(&at_load, &bodies));
    assert_eq!(a.len(), bodies.len());
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        assert_eq!(
            x, y,
            "dev request {i}: stored int8 form vs quantised at load"
        );
    }
    eprintln!(
        "kev prepare --int8: {} dev requests bit-equal, stored form {} bytes",
        bodies.len(),
        std::fs::metadata(&file).unwrap().len()
    );
}
