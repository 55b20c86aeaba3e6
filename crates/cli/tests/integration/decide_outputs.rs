//! `kev decide` answers byte for byte as recorded, on every arm and every instruction set this CPU has: the
//! guard of any change that must not move a bit (a restructuring of the engine, a kernel rewritten for speed).
//!
//! Each case runs the built `kev` over a fixed set of requests (`x_logits` on, so every option's raw pointer
//! logit is printed at full precision) with `KEV_ISA` set to each instruction set the CPU supports, and compares
//! the sha256 of the output file (and, for the prepared case, of the stored int8 form `kev prepare --int8`
//! writes) with `fixtures/expected/decide-outputs.json`. The requests: the contract's 57 valid fixtures on the
//! synthetic release, 24 kev-mini test-split requests, and one long request (about 1,400 tokens in its pass:
//! many GDN chunks, several attention key tiles, the MLP's row passes split). An instruction set without a
//! recorded digest (a CPU the record was not made on) is reported `skipped:`; the digests were made by the
//! binary of b38e820, before the engine's restructuring (issue 53), and the `amx` ones (on a Xeon with AMX,
//! 2026-12-07) by the binary of 4905759 (the engine of 6c16a09), before the tile loop's reordering.
//!
//! To record (only when a change is meant to move bits, with the reason in the commit):
//! `KEV_BLESS=1 [KEV_BIN=path/to/kev] cargo nextest run -p kev decide_outputs`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

fn root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

fn record_path() -> PathBuf {
    root().join("fixtures/expected/decide-outputs.json")
}

fn kev_bin() -> PathBuf {
    std::env::var_os("KEV_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_kev")))
}

/// One line per request.
fn write_jsonl(path: &Path, bodies: impl IntoIterator<Item = String>) {
    let text: String = bodies.into_iter().map(|b| b + "\n").collect();
    std::fs::write(path, text).unwrap();
}

fn lines(bodies: Vec<Value>) -> Vec<String> {
    bodies
        .iter()
        .map(|b| serde_json::to_string(b).unwrap())
        .collect()
}

fn with_logits(mut b: Value) -> Value {
    b["x_logits"] = json!(true);
    b
}

/// The contract's valid fixtures (synthetic release), as their bytes: some are not JSON to serde (a `NaN`
/// state is Python's JSON), so `x_logits` is written in after the opening brace and the line breaks, which
/// valid JSON has only between tokens, become spaces.
fn release_requests() -> Vec<String> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(root().join("fixtures/requests/valid"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    paths.sort();
    paths
        .iter()
        .map(|p| {
            let text = std::fs::read_to_string(p)
                .unwrap()
                .replace(['\n', '\r'], " ");
            let (head, rest) = text.split_once('{').expect("a request object");
            assert!(head.trim().is_empty(), "{}: not an object", p.display());
            format!("{{\"x_logits\":true,{rest}")
        })
        .collect()
}

/// 24 kev-mini test-split requests and a long one.
fn mini_requests() -> Vec<Value> {
    let text = std::fs::read_to_string(root().join("fixtures/mini/data/test.jsonl")).unwrap();
    let mut out: Vec<Value> = text
        .lines()
        .step_by(100)
        .take(24)
        .map(|l| with_logits(serde_json::from_str::<Value>(l).unwrap()["request"].clone()))
        .collect();
    out.push(with_logits(long_request()));
    out
}

/// A long support thread (deterministic words) with three questions.
fn long_request() -> Value {
    let words = [
        "invoice",
        "refund",
        "order",
        "charged",
        "twice",
        "delivery",
        "late",
        "account",
        "password",
        "reset",
        "upgrade",
        "plan",
        "price",
        "support",
        "waiting",
        "days",
        "angry",
        "please",
        "help",
        "parcel",
        "tracking",
        "number",
        "bank",
        "statement",
        "March",
        "April",
        "team",
        "manager",
    ];
    let mut s = String::from("Customer thread. ");
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in 0..900 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.push_str(words[(x % words.len() as u64) as usize]);
        s.push(if i % 17 == 16 { '.' } else { ' ' });
    }
    json!({
        "state": s,
        "questions": {
            "refund": {"type": "noul", "instructions": "Is the customer asking for money back?"},
            "team": {"type": "choice", "instructions": "Which team should handle this ticket?",
                     "criteria": {"Billing": "Payments, invoices, refunds", "Technical": "Bugs, outages",
                                  "Shipping": "Deliveries, tracking", "Sales": null}},
            "anger": {"type": "score", "instructions": "How frustrated is the customer?",
                      "criteria": ["Calm", "Annoyed", "Frustrated", "Very angry"]}
        }
    })
}

/// The mini requests, each naming one of the three adapters in turn.
fn adapter_requests() -> Vec<Value> {
    let names = ["kev", "support", "ops"];
    mini_requests()
        .into_iter()
        .enumerate()
        .map(|(i, mut b)| {
            b["model"] = json!(names[i % names.len()]);
            b
        })
        .collect()
}

fn sha256_file(path: &Path) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(std::fs::read(path).unwrap()))
}

/// The sha256 of a safetensors file's tensors (header entries in name order, then the data) and of its
/// metadata in key order, less `calibration` (it names the calibration file's path): the file's own bytes
/// vary between runs, as the safetensors writer lays out the metadata map in hash order.
fn safetensors_digest(path: &Path) -> String {
    use sha2::{Digest, Sha256};
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: BTreeMap<String, Value> = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let mut h = Sha256::new();
    for (name, entry) in &header {
        if name == "__metadata__" {
            let meta: BTreeMap<String, Value> = serde_json::from_value(entry.clone()).unwrap();
            for (k, v) in meta.iter().filter(|(k, _)| *k != "calibration") {
                h.update(format!("{k}={v};"));
            }
        } else {
            h.update(format!("{name}={entry};"));
        }
    }
    h.update(&bytes[8 + n..]);
    hex::encode(h.finalize())
}

fn run(isa: &str, args: &[String]) -> std::process::Output {
    Command::new(kev_bin())
        .env("KEV_ISA", isa)
        .env("KEV_LOG", "warn")
        .args(args)
        .output()
        .unwrap()
}

/// Every case's digests under `isa`.
fn digests(isa: &str, dir: &Path) -> BTreeMap<String, String> {
    let f = |p: &str| root().join("fixtures").join(p).display().to_string();
    let (release_in, mini_in, adapters_in) = (
        dir.join("release.jsonl"),
        dir.join("mini.jsonl"),
        dir.join("adapters.jsonl"),
    );
    write_jsonl(&release_in, release_requests());
    write_jsonl(&mini_in, lines(mini_requests()));
    write_jsonl(&adapters_in, lines(adapter_requests()));
    let release = ["--base", &f("release/base"), "--kev", &f("release/kev")];
    let mini = ["--base", &f("mini/base"), "--kev", &f("mini/kev")];
    let adapters = [
        "--base",
        &f("mini/base"),
        "--adapter",
        &format!("kev={}", f("mini/kev")),
        "--adapter",
        &format!("support={}", f("mini/adapters/support")),
        "--adapter",
        &format!("ops={}", f("mini/adapters/ops")),
    ];
    let prepared = dir.join("prepared");
    let calibration = dir.join("calibration.jsonl");
    let dev = std::fs::read_to_string(root().join("fixtures/mini/data/dev.jsonl")).unwrap();
    std::fs::write(
        &calibration,
        dev.lines().take(16).collect::<Vec<_>>().join("\n"),
    )
    .unwrap();
    let prep = run(
        isa,
        &[
            &[
                "prepare".to_string(),
                "--out".into(),
                prepared.display().to_string(),
            ][..],
            &mini.map(String::from),
            &[
                "--int8".into(),
                "--calibration".into(),
                calibration.display().to_string(),
                "--quiet".into(),
            ],
        ]
        .concat(),
    );
    assert!(
        prep.status.success(),
        "kev prepare --int8 ({isa}): {}",
        String::from_utf8_lossy(&prep.stderr)
    );
    let prepared_s = prepared.display().to_string();
    let cases: Vec<(&str, Vec<&str>, &Path)> = vec![
        (
            "release-exact-fp32",
            [&release[..], &["--weights", "exact", "--precision", "fp32"]].concat(),
            &release_in,
        ),
        (
            "release-merged-fp32",
            [&release[..], &["--precision", "fp32"]].concat(),
            &release_in,
        ),
        (
            "release-merged-bf16",
            [&release[..], &["--precision", "bf16"]].concat(),
            &release_in,
        ),
        (
            "mini-merged-bf16",
            [&mini[..], &["--precision", "bf16"]].concat(),
            &mini_in,
        ),
        (
            "mini-merged-int8",
            [&mini[..], &["--precision", "int8"]].concat(),
            &mini_in,
        ),
        (
            "mini-adapters-fp32",
            [&adapters[..], &["--precision", "fp32"]].concat(),
            &adapters_in,
        ),
        (
            "mini-adapters-int8",
            [&adapters[..], &["--precision", "int8"]].concat(),
            &adapters_in,
        ),
        (
            "mini-prepared-int8",
            vec!["--model", &prepared_s, "--precision", "int8"],
            &mini_in,
        ),
    ];
    let mut out = BTreeMap::new();
    out.insert(
        "mini-prepared-int8.safetensors".to_string(),
        safetensors_digest(&prepared.join("int8.safetensors")),
    );
    for (name, args, input) in cases {
        let dest = dir.join(format!("{name}.jsonl"));
        let mut all: Vec<String> = vec!["decide".into()];
        all.extend(args.iter().map(|s| s.to_string()));
        all.extend([
            "--jsonl".into(),
            input.display().to_string(),
            "--out".into(),
            dest.display().to_string(),
        ]);
        let r = run(isa, &all);
        assert!(
            r.status.success(),
            "kev decide {name} ({isa}): {}",
            String::from_utf8_lossy(&r.stderr)
        );
        let text = std::fs::read_to_string(&dest).unwrap();
        assert!(
            !text.contains("\"error\""),
            "{name} ({isa}): a request was refused or failed:\n{}",
            text.lines().find(|l| l.contains("\"error\"")).unwrap_or("")
        );
        out.insert(name.to_string(), sha256_file(&dest));
    }
    out
}

/// The instruction sets this CPU runs, by their `KEV_ISA` names.
fn isas() -> Vec<String> {
    kev_engine::Kernels::available()
        .into_iter()
        .map(|k| k.isa().name().to_string())
        .collect()
}

#[test]
fn decide_outputs_are_byte_identical_to_the_record_on_every_isa() {
    let bless = std::env::var_os("KEV_BLESS").is_some();
    let mut record: BTreeMap<String, BTreeMap<String, String>> = std::fs::read(record_path())
        .ok()
        .map(|b| serde_json::from_slice(&b).unwrap())
        .unwrap_or_default();
    let (mut compared, mut missing) = (0, Vec::new());
    for isa in isas() {
        if !bless && !record.contains_key(&isa) {
            missing.push(isa);
            continue;
        }
        let tmp = tempfile::tempdir().unwrap();
        let got = digests(&isa, tmp.path());
        if bless {
            record.insert(isa.clone(), got);
            continue;
        }
        let want = &record[&isa];
        for (case, digest) in want {
            assert_eq!(
                got.get(case),
                Some(digest),
                "KEV_ISA={isa}, {case}: the output differs from the record"
            );
            compared += 1;
        }
    }
    if bless {
        let text = serde_json::to_string_pretty(&record).unwrap();
        std::fs::write(record_path(), text + "\n").unwrap();
        eprintln!("recorded {}", record_path().display());
    } else if compared == 0 {
        eprintln!(
            "skipped: no recorded decide outputs for this CPU's instruction sets {missing:?}"
        );
    } else if !missing.is_empty() {
        eprintln!("not compared (no record for them): KEV_ISA={missing:?}");
    }
}
