//! `kev decide` as a user runs it, on the synthetic release: one request, a JSONL file with bad lines,
//! an invalid request, `--debug`, and a model that cannot be loaded.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

fn fixtures() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures"))
}

fn kev() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kev"));
    c.env("KEV_LOG", "warn");
    c
}

fn with_release(c: &mut Command) -> &mut Command {
    let r = fixtures().join("release");
    c.arg("--base")
        .arg(r.join("base"))
        .arg("--kev")
        .arg(r.join("kev"))
}

#[test]
fn one_request_matches_the_reference_response() {
    let name = "choice-5-mixed-descriptions";
    let expected: Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join(format!("expected/valid/{name}.json"))).unwrap(),
    )
    .unwrap();
    let out = with_release(kev().arg("decide"))
        .args([
            "--weights",
            "exact",
            "--precision",
            "fp32",
            "--debug",
            "--request",
        ])
        .arg(fixtures().join(format!("requests/valid/{name}.json")))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(got["model"], expected["response"]["model"]);
    assert_eq!(
        got["usage"]["input_tokens"],
        expected["response"]["usage"]["input_tokens"]
    );
    let q = &got["x_debug"]["questions"][0];
    let want = &expected["questions"][0];
    assert_eq!(q["row_ids"], want["row_ids"]);
    assert_eq!(q["option_ends"], want["option_ends"]);
    assert_eq!(q["decide"], want["decide"]);
    for (a, b) in q["probabilities"]
        .as_array()
        .unwrap()
        .iter()
        .zip(want["reference"].as_array().unwrap())
    {
        assert!((a.as_f64().unwrap() - b.as_f64().unwrap()).abs() < 1e-4);
    }
}

#[test]
fn an_invalid_request_prints_its_status_and_body_and_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let req = dir.path().join("bad.json");
    std::fs::write(&req, br#"{"state": "x", "questions": {}}"#).unwrap();
    let out = with_release(kev().arg("decide"))
        .arg("--request")
        .arg(&req)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["status"], 422);
    assert_eq!(v["body"]["detail"][0]["loc"][0], "body");
}

#[test]
fn jsonl_answers_every_line_in_order_and_continues_past_bad_ones() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    let out_path = dir.path().join("out.jsonl");
    let lines = [
        r#"{"model":"m1","state":"first","questions":{"a":{"type":"noul","instructions":"Yes?"}}}"#,
        r#"{"state":"x","questions":[]}"#,
        "not json at all",
        r#"{"model":"m4","state":{"k":[1,2.5]},"questions":{"b":{"type":"score","criteria":["lo","hi"]}}}"#,
    ];
    std::fs::write(&input, lines.join("\n") + "\n").unwrap();
    let out = with_release(kev().arg("decide"))
        .arg("--jsonl")
        .arg(&input)
        .arg("--out")
        .arg(&out_path)
        .args(["--batch", "3"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: Vec<Value> = std::fs::read_to_string(&out_path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(got.len(), 4);
    assert_eq!(got[0]["model"], "m1");
    assert_eq!(got[1]["status"], 422);
    assert_eq!(got[2]["status"], 422);
    assert_eq!(got[2]["body"]["detail"][0]["type"], "json_invalid");
    assert_eq!(got[3]["model"], "m4");
    assert_eq!(got[3]["answers"]["b"]["type"], "score");
    // The same request alone gives the same answer as in the batch.
    let single = dir.path().join("one.json");
    std::fs::write(&single, lines[3]).unwrap();
    let alone = with_release(kev().arg("decide"))
        .arg("--request")
        .arg(&single)
        .output()
        .unwrap();
    let alone: Value = serde_json::from_slice(&alone.stdout).unwrap();
    assert_eq!(alone["answers"], got[3]["answers"]);
}

#[test]
fn exact_weights_need_the_release_files() {
    let out = kev()
        .args([
            "decide",
            "--weights",
            "exact",
            "--request",
            "x.json",
            "--model",
        ])
        .arg(fixtures().join("release/base"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--base DIR --kev DIR"), "{err}");
}

/// What `kev synth` writes loads through the one loader: its `kev/` holds the head in the prepared form
/// (`head.safetensors` + `kev_head.json`, no `head.pt`), and `--kev` takes it as it is.
#[test]
fn a_synth_release_answers_kev_decide_base_kev() {
    let dir = tempfile::tempdir().unwrap();
    let out = kev()
        .args(["synth", "--config", "tiny", "--shards", "1", "--out"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kev synth: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (base, kev_dir) = (dir.path().join("base"), dir.path().join("kev"));
    assert!(!kev_dir.join("head.pt").exists() && kev_dir.join("kev_head.json").is_file());
    let request = fixtures().join("requests/valid/choice-5-mixed-descriptions.json");
    let out = kev()
        .arg("decide")
        .arg("--base")
        .arg(&base)
        .arg("--kev")
        .arg(&kev_dir)
        .arg("--request")
        .arg(&request)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kev decide on the synth release: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let answers = v["answers"].as_object().expect("answers");
    assert!(!answers.is_empty(), "{v}");
    assert!(v["usage"]["input_tokens"].as_u64().unwrap() > 0, "{v}");
}

/// `kev bench decide` times the int8 arm on weights made for it: alone (loaded quantised, as `kev serve
/// --precision int8` loads it) and beside a float arm (quantised from the float weights once that arm has
/// run). Weights are final at load, so a bench that ran every arm on one float load refused int8.
#[test]
fn bench_decide_runs_the_int8_arm_alone_and_beside_a_float_arm() {
    for arms in ["int8", "bf16,int8"] {
        let dir = tempfile::tempdir().unwrap();
        let json = dir.path().join("decide.json");
        let out = with_release(kev().args(["bench", "decide"]))
            .args([
                "--arms", arms, "--cases", "1q-94", "--reps", "1", "--warmup", "0",
            ])
            .args(["--peers", "none", "--json"])
            .arg(&json)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "kev bench decide --arms {arms}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        let timed: Vec<&str> = v["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["arm"].as_str().unwrap())
            .collect();
        for arm in arms.split(',') {
            assert!(timed.contains(&arm), "--arms {arms}: timed {timed:?}");
        }
    }
}
