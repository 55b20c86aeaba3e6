//! The tool belt end to end on the synthetic release (`fixtures/release`): `kev serve --demo` answering
//! `/v1/systemone/separate` and `/permute` against `/v1/systemone` on every fixture request; `kev calibrate`
//! on labelled data drawn from the model itself at a known temperature, started from wrong temperatures; the
//! fitted file served (`--calibration`) and reported by `/v1/models`; `kev eval` over HTTP against `kev eval
//! --model`; date facts in `kev decide`.

use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};

pub(crate) fn fixtures() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures"))
}

pub(crate) fn kev() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kev"));
    c.env("KEV_LOG", "warn");
    for v in [
        "KEV_DATE_FACTS",
        "KEV_CALIBRATION",
        "KEV_MODEL",
        "KEV_PORT",
        "KEV_API_KEY",
        "KEV_ADMIN_KEY",
        "KEV_API_KEYS",
        "KEV_AUDIT_LOG",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
    ] {
        c.env_remove(v);
    }
    c
}

fn with_release(c: &mut Command) -> &mut Command {
    let r = fixtures().join("release");
    c.arg("--base")
        .arg(r.join("base"))
        .arg("--kev")
        .arg(r.join("kev"))
}

/// A `kev serve --demo` child on a free port, killed on drop.
pub(crate) struct Served {
    pub(crate) child: Child,
    pub(crate) base: String,
}

impl Served {
    fn start(extra: &[&str]) -> Served {
        let mut args = vec!["--demo"];
        args.extend_from_slice(extra);
        Self::serve(&args)
    }

    /// `kev serve ARGS --port P` (the demo directory set to the random fixture release).
    pub(crate) fn serve(args: &[&str]) -> Served {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        // The demo is kev-mini; these tests' data come from the random fixture release.
        let child = kev()
            .env("KEV_DEMO_DIR", fixtures().join("release"))
            .arg("serve")
            .args(args)
            .args(["--port", &port.to_string()])
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let s = Served {
            child,
            base: format!("http://127.0.0.1:{port}"),
        };
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(180) {
            if let Ok(r) = ureq::get(&format!("{}/ready", s.base)).call()
                && r.status() == 200
            {
                return s;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("kev serve never became ready");
    }

    fn post(&self, path: &str, body: &[u8]) -> (u16, Value) {
        answer(
            ureq::post(&format!("{}{path}", self.base))
                .set("content-type", "application/json")
                .send_bytes(body),
        )
    }
}

/// The status and JSON body of an answer, whatever its status.
fn answer(r: Result<ureq::Response, ureq::Error>) -> (u16, Value) {
    let r = match r {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("{e}"),
    };
    (
        r.status(),
        serde_json::from_str(&r.into_string().unwrap()).unwrap(),
    )
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The request fixtures of `fixtures/requests/{kind}` (`valid`, `invalid`), by name, in name order.
fn fixture_requests(kind: &str) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(fixtures().join("requests").join(kind))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .map(|p| {
            (
                p.file_stem().unwrap().to_string_lossy().into_owned(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect();
    out.sort();
    out
}

fn valid_requests() -> Vec<(String, Vec<u8>)> {
    fixture_requests("valid")
}

#[test]
fn separate_and_permute_agree_with_systemone_on_every_fixture_request() {
    let s = Served::start(&[]);
    let mut permuted = 0;
    for (name, body) in valid_requests() {
        let (st, plain) = s.post("/v1/systemone", &body);
        assert_eq!(st, 200, "{name}: {plain}");
        let (st, sep) = s.post("/v1/systemone/separate", &body);
        assert_eq!(st, 200, "{name}: {sep}");
        // Bit for bit: the numbers carry the same text.
        assert_eq!(sep["answers"], plain["answers"], "{name}");
        assert_eq!(sep["model"], plain["model"], "{name}");
        let n = plain["answers"].as_object().unwrap().len() as u64;
        let sep_in = sep["usage"]["input_tokens"].as_u64().unwrap();
        let plain_in = plain["usage"]["input_tokens"].as_u64().unwrap();
        assert!(
            sep_in >= plain_in && (n > 1 || sep_in == plain_in),
            "{name}: {sep_in} vs {plain_in}"
        );
        assert_eq!(
            sep["usage"]["output_tokens"], plain["usage"]["output_tokens"],
            "{name}"
        );

        // Permute the first choice question of the request (3 orders).
        let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let Some(q) = plain["answers"]
            .as_object()
            .unwrap()
            .iter()
            .find(|(_, a)| a["type"] == "choice")
            .map(|(k, _)| k.clone())
        else {
            continue;
        };
        if request.is_null() {
            continue; // NaN literals: serde_json cannot write the envelope (the server reads them fine)
        }
        let env = json!({"request": request, "question": q, "n_perm": 3, "seed": 1});
        let (st, perm) = s.post("/v1/systemone/permute", &serde_json::to_vec(&env).unwrap());
        assert_eq!(st, 200, "{name}: {perm}");
        let runs = perm["runs"].as_array().unwrap();
        assert_eq!(runs.len(), 3);
        assert_eq!(
            runs[0]["probabilities"], plain["answers"][&q]["probabilities"],
            "{name}"
        );
        assert_eq!(runs[0]["choice"], plain["answers"][&q]["choice"], "{name}");
        let keys: Vec<String> = plain["answers"][&q]["probabilities"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect();
        assert_eq!(runs[0]["order"], json!(keys));
        for (k, v) in perm["spread"].as_object().unwrap() {
            let xs: Vec<f64> = runs
                .iter()
                .map(|r| r["probabilities"][k].as_f64().unwrap())
                .collect();
            let hi = xs.iter().cloned().fold(f64::MIN, f64::max);
            let lo = xs.iter().cloned().fold(f64::MAX, f64::min);
            assert_eq!(v.as_f64().unwrap(), hi - lo, "{name} {k}");
        }
        let stable = runs.windows(2).all(|w| w[0]["choice"] == w[1]["choice"]);
        assert_eq!(perm["argmax_stable"], json!(stable), "{name}");
        permuted += 1;
    }
    assert!(
        permuted >= 10,
        "only {permuted} fixtures had a choice question"
    );
}

fn rows_run(s: &Served) -> u64 {
    metric_value(s, "kev_engine_rows_total") as u64
}

/// `/permute` and `/separate` admit their parts together against the per-request caps summed over the parts
/// (413 naming the cap and the parts, nothing run), and take one queue slot: `/separate` at `--max-questions`
/// on a queue of fewer slots is answered.
#[test]
fn a_fan_out_is_held_to_the_work_caps_all_or_nothing() {
    let choice: Map<String, Value> = (0..20)
        .map(|i| (format!("option {i}"), Value::Null))
        .collect();
    let request = json!({"state": "A customer writes about a late order and asks what to do.",
                         "questions": {"pick": {"type": "choice", "criteria": choice}}});
    let permute = |n: usize| {
        serde_json::to_vec(&json!({"request": request, "question": "pick", "n_perm": n})).unwrap()
    };
    // One part's input tokens, as /v1/systemone counts them.
    let plain = Served::start(&[]);
    let (status, v) = plain.post("/v1/systemone", &serde_json::to_vec(&request).unwrap());
    assert_eq!(status, 200, "{v}");
    let part = v["usage"]["input_tokens"].as_u64().unwrap();
    drop(plain);

    let cap = 10 * part;
    let s = Served::start(&["--max-input-tokens", &cap.to_string()]);
    let before = rows_run(&s);
    // 64 option orders: 6.4 × the cap over the parts, each part alone far under it.
    let (status, v) = s.post("/v1/systemone/permute", &permute(64));
    assert_eq!(status, 413, "{v}");
    assert_eq!(v["detail"]["field"], "input_tokens", "{v}");
    assert_eq!(v["detail"]["limit"], cap, "{v}");
    assert_eq!(v["detail"]["parts"], 64, "{v}");
    assert!(v["detail"]["value"].as_u64().unwrap() > cap, "{v}");
    assert_eq!(rows_run(&s), before, "a refused fan-out ran rows");
    // Ten parts fill the cap exactly: answered.
    let (status, v) = s.post("/v1/systemone/permute", &permute(10));
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["runs"].as_array().unwrap().len(), 10);
    drop(s);

    let s = Served::start(&["--max-questions", "8", "--queue-depth", "2"]);
    // The parts' questions count together too: nine orders are nine questions.
    let (status, v) = s.post("/v1/systemone/permute", &permute(9));
    assert_eq!(status, 413, "{v}");
    assert_eq!(
        (&v["detail"]["field"], &v["detail"]["value"]),
        (&json!("questions"), &json!(9)),
        "{v}"
    );
    // /separate at --max-questions, more parts than queue slots: one slot, answered.
    let questions: Map<String, Value> = (0..8)
        .map(|i| {
            (
                format!("q{i}"),
                json!({"type": "noul", "instructions": format!("Question {i}?")}),
            )
        })
        .collect();
    let eight = json!({"state": "A short ticket.", "questions": questions});
    let (status, v) = s.post(
        "/v1/systemone/separate",
        &serde_json::to_vec(&eight).unwrap(),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["answers"].as_object().unwrap().len(), 8);
    // One over: the whole request's 413, exactly as /v1/systemone answers it.
    let mut nine = eight.clone();
    nine["questions"]["q8"] = json!({"type": "noul"});
    let nine = serde_json::to_vec(&nine).unwrap();
    let (s1, v1) = s.post("/v1/systemone", &nine);
    let (s2, v2) = s.post("/v1/systemone/separate", &nine);
    assert_eq!((s1, &v1), (s2, &v2));
    assert_eq!(s2, 413);
    assert_eq!(v2["detail"]["field"], "questions");
}

/// SplitMix64, for drawing labels.
struct Rng(u64);
impl Rng {
    fn unit(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    }
}

const WORDS: [&str; 16] = [
    "refund", "invoice", "login", "crash", "upgrade", "delivery", "password", "billing", "late",
    "broken", "thanks", "cancel", "discount", "error", "account", "shipping",
];

/// `lines` requests, each with a noul, a choice (2–7 options) and a score (3–5 levels) question.
fn requests(lines: usize) -> Vec<Value> {
    let mut rng = Rng(42);
    let mut pick = |n: usize| (rng.unit() * n as f64) as usize;
    (0..lines)
        .map(|i| {
            let state: Vec<&str> = (0..6).map(|_| WORDS[pick(16)]).collect();
            let k = 2 + pick(6);
            let criteria: Map<String, Value> = (0..k).map(|j| (WORDS[(i + 3 * j) % 16].to_string() + &j.to_string(), Value::Null)).collect();
            let levels: Vec<Value> = (0..3 + pick(3)).map(|j| json!(format!("level {j}"))).collect();
            json!({
                "state": format!("Ticket {i}: {}", state.join(" ")),
                "questions": {
                    "urgent": {"type": "noul", "instructions": format!("Is it about {}?", WORDS[pick(16)])},
                    "topic": {"type": "choice", "instructions": "Which topic?", "criteria": criteria},
                    "tone": {"type": "score", "instructions": "How upset?", "criteria": levels},
                }
            })
        })
        .collect()
}

fn write_jsonl(path: &Path, rows: &[Value]) {
    let mut f = std::fs::File::create(path).unwrap();
    for r in rows {
        writeln!(f, "{}", serde_json::to_string(r).unwrap()).unwrap();
    }
}

/// Labels drawn from the model's own unrounded probabilities at its stored temperature: data on which that
/// temperature is right by construction.
fn labelled(dir: &Path, lines: usize) -> PathBuf {
    let reqs = requests(lines);
    let input = dir.join("requests.jsonl");
    let answers = dir.join("answers.jsonl");
    write_jsonl(&input, &reqs);
    let out = with_release(kev().arg("decide"))
        .args(["--debug", "--jsonl"])
        .arg(&input)
        .arg("--out")
        .arg(&answers)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut rng = Rng(7);
    let rows: Vec<Value> = std::fs::read_to_string(&answers)
        .unwrap()
        .lines()
        .zip(&reqs)
        .map(|(line, req)| {
            let resp: Value = serde_json::from_str(line).unwrap();
            let mut labels = Map::new();
            for q in resp["x_debug"]["questions"].as_array().unwrap() {
                let p: Vec<f64> = q["probabilities"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_f64().unwrap())
                    .collect();
                let u = rng.unit();
                let mut acc = 0.0;
                let mut pick = p.len() - 1;
                for (j, v) in p.iter().enumerate() {
                    acc += v;
                    if u < acc {
                        pick = j;
                        break;
                    }
                }
                let id = q["id"].as_str().unwrap();
                let rq = &req["questions"][id];
                let key = match rq["type"].as_str().unwrap() {
                    "noul" => json!(["false", "true"][pick]),
                    "choice" => json!(
                        rq["criteria"]
                            .as_object()
                            .unwrap()
                            .keys()
                            .nth(pick)
                            .unwrap()
                    ),
                    _ => json!(pick),
                };
                labels.insert(id.to_string(), key);
            }
            let mut row = req.clone();
            row["labels"] = Value::Object(labels);
            row
        })
        .collect();
    let data = dir.join("labelled.jsonl");
    write_jsonl(&data, &rows);
    data
}

fn calibrate(data: &Path, out: &Path, by: &str, start: f64) -> Value {
    let run = with_release(kev().arg("calibrate"))
        .arg("--data")
        .arg(data)
        .args([
            "--by",
            by,
            "--bootstrap",
            "100",
            "--start-temperature",
            &start.to_string(),
        ])
        .arg("--out")
        .arg(out)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let text = String::from_utf8_lossy(&run.stdout);
    eprintln!("{text}");
    assert!(
        text.contains("ECE-15") && text.contains("reliability"),
        "{text}"
    );
    serde_json::from_str(&std::fs::read_to_string(out).unwrap()).unwrap()
}

fn head_temperature() -> f64 {
    let h: Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("expected/head.json")).unwrap(),
    )
    .unwrap();
    h["temperature"].as_f64().unwrap()
}

fn eval(args: &[&str], data: &Path, json_out: &Path) -> Value {
    let out = kev()
        .arg("eval")
        .args(args)
        .arg("--data")
        .arg(data)
        .arg("--json")
        .arg(json_out)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{}", String::from_utf8_lossy(&out.stdout));
    serde_json::from_str(&std::fs::read_to_string(json_out).unwrap()).unwrap()
}

#[test]
fn calibrate_repairs_wrong_temperatures_and_serving_it_matches_the_report() {
    let dir = tempfile::tempdir().unwrap();
    let data = labelled(dir.path(), 240);
    let t0 = head_temperature();
    for (scale, by) in [(3.0, "global"), (1.0 / 3.0, "type")] {
        let out = dir.path().join(format!("calib-{by}.json"));
        let file = calibrate(&data, &out, by, t0 * scale);
        let all = &file["groups"][0];
        assert_eq!(all["group"], "all");
        let (before, after) = (&all["before"], &all["after"]);
        let f = |v: &Value| v.as_f64().unwrap();
        eprintln!(
            "start ×{scale:.3} by {by}: ECE {} → {}, NLL {} → {}, T {}",
            before["ece"], after["ece"], before["nll"], after["nll"], all["temperature"]
        );
        assert!(
            f(&after["ece"]) <= 0.5 * f(&before["ece"]),
            "×{scale}: {all}"
        );
        assert!(f(&after["nll"]) < f(&before["nll"]), "×{scale}: {all}");
        // The data's temperature is the stored one: the fit lands near it, inside its interval.
        let t = f(&all["temperature"]);
        let [lo, hi] = [f(&all["interval"][0]), f(&all["interval"][1])];
        assert!(lo <= t && t <= hi, "{all}");
        assert!(
            (t / t0).ln().abs() < 0.4_f64,
            "fitted {t} vs the data's {t0}"
        );
        assert!(out.with_extension("png").is_file());
        let png = std::fs::read(out.with_extension("png")).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    }

    // Serve the per-type file: /v1/models reports it; the served answers score as the report says (in sample,
    // at the fitted temperatures); kev eval over HTTP equals kev eval --model.
    let calib = dir.path().join("calib-type.json");
    let file: Value = serde_json::from_str(&std::fs::read_to_string(&calib).unwrap()).unwrap();
    let s = Served::start(&["--calibration", calib.to_str().unwrap()]);
    let models: Value = serde_json::from_str(
        &ureq::get(&format!("{}/v1/models", s.base))
            .call()
            .unwrap()
            .into_string()
            .unwrap(),
    )
    .unwrap();
    let card = &models["models"][0]["x_calibration"];
    let sha = {
        let bytes = std::fs::read(&calib).unwrap();
        kev_decide::calibrate::sha256_hex(&bytes)
    };
    assert_eq!(card["sha256"], json!(sha));
    assert_eq!(card["by"], "type");
    assert_eq!(card["temperatures"], file["temperatures"]);
    let http = eval(
        &["--endpoint", &s.base],
        &data,
        &dir.path().join("eval-http.json"),
    );
    let local = eval(
        &[
            "--base",
            fixtures().join("release/base").to_str().unwrap(),
            "--kev",
            fixtures().join("release/kev").to_str().unwrap(),
            "--calibration",
            calib.to_str().unwrap(),
        ],
        &data,
        &dir.path().join("eval-model.json"),
    );
    assert_eq!(http["sides"][0]["groups"], local["sides"][0]["groups"]);
    let served_ece = http["sides"][0]["groups"]["all"]["ece"].as_f64().unwrap();
    let report_ece = file["groups"][0]["after_in_sample"]["ece"]
        .as_f64()
        .unwrap();
    eprintln!("served ECE {served_ece} vs report (in sample) {report_ece}");
    // Served probabilities are rounded to 4 places; that moves ECE by far less than this.
    assert!(
        (served_ece - report_ece).abs() < 2e-3,
        "{served_ece} vs {report_ece}"
    );
    let served_nll = http["sides"][0]["groups"]["all"]["nll"].as_f64().unwrap();
    let report_nll = file["groups"][0]["after_in_sample"]["nll"]
        .as_f64()
        .unwrap();
    assert!(
        (served_nll - report_nll).abs() < 2e-3,
        "{served_nll} vs {report_nll}"
    );

    // --compare against a server without the calibration: both printed, agreement reported.
    let plain = Served::start(&[]);
    let cmp = eval(
        &["--endpoint", &s.base, "--compare", &plain.base],
        &data,
        &dir.path().join("cmp.json"),
    );
    assert_eq!(cmp["sides"].as_array().unwrap().len(), 2);
    // Temperature never changes the top option: full agreement.
    assert_eq!(cmp["comparison"]["top_option_agreement"], json!(1.0));
}

#[test]
fn calibrate_refuses_unusable_data_with_the_line_number() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("bad.jsonl");
    std::fs::write(
        &data,
        "{\"state\":\"x\",\"questions\":{\"a\":{\"type\":\"noul\"}},\"labels\":{\"a\":\"true\"}}\n\n{\"state\":\"x\",\"questions\":{\"a\":{\"type\":\"noul\"}},\"labels\":{\"a\":\"maybe\"}}\n",
    )
    .unwrap();
    let out = with_release(kev().arg("calibrate"))
        .arg("--data")
        .arg(&data)
        .arg("--out")
        .arg(dir.path().join("c.json"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.jsonl:3:") && err.contains("maybe"),
        "{err}"
    );
}

#[test]
fn date_facts_reach_the_model_only_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let req = dir.path().join("r.json");
    std::fs::write(
        &req,
        br#"{"state":{"ordered":"July 22, 2026","delivered":"2026-08-03"},"questions":{"late":{"type":"noul","instructions":"Was it late?"}}}"#,
    )
    .unwrap();
    let run = |env: Option<&str>, flag: bool| -> Value {
        let mut c = kev();
        if let Some(v) = env {
            c.env("KEV_DATE_FACTS", v);
        }
        let c = with_release(c.arg("decide"));
        if flag {
            c.arg("--date-facts");
        }
        let out = c.arg("--request").arg(&req).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let off = run(None, false);
    let on = run(None, true);
    let env_on = run(Some("1"), false);
    let env_off = run(Some("0"), false);
    // The sentence "2026-08-03 is 12 days after July 22, 2026." adds state tokens.
    assert!(on["usage"]["input_tokens"].as_u64() > off["usage"]["input_tokens"].as_u64());
    assert_eq!(on, env_on);
    assert_eq!(off, env_off);
    // What the model read: the rows kev rows shows for the rewritten request.
    let rewritten = dir.path().join("w.json");
    std::fs::write(
        &rewritten,
        br#"{"state":{"ordered":"July 22, 2026","delivered":"2026-08-03","date_facts":"2026-08-03 is 12 days after July 22, 2026."},"questions":{"late":{"type":"noul","instructions":"Was it late?"}}}"#,
    )
    .unwrap();
    let out = with_release(kev().arg("decide"))
        .arg("--request")
        .arg(&rewritten)
        .output()
        .unwrap();
    let by_hand: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(on["answers"], by_hand["answers"]);
    assert_eq!(on["usage"], by_hand["usage"]);
}

#[test]
fn help_lists_the_new_commands_and_flags() {
    let out = kev().arg("--help").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("calibrate") && text.contains("eval"),
        "{text}"
    );
    // The environment settings that are no command's flag: the kernel cap with every name it takes.
    let cap = text
        .lines()
        .find(|l| l.contains("KEV_ISA="))
        .unwrap_or_else(|| panic!("no KEV_ISA in --help: {text}"));
    for isa in kev_engine::kernels::Isa::ALL {
        assert!(cap.contains(isa.name()), "{isa} missing from `{cap}`");
    }
    assert!(text.contains("KEV_LOG "), "{text}");
    let out = kev().args(["serve", "--help"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("--calibration")
            && text.contains("--date-facts")
            && text.contains("KEV_DATE_FACTS"),
        "{text}"
    );
}

/// Every invalid fixture request that is JSON (so that it can sit inside a batch body).
fn invalid_json_requests() -> Vec<(String, Vec<u8>)> {
    fixture_requests("invalid")
        .into_iter()
        .filter(|(_, b)| serde_json::from_slice::<Value>(b).is_ok())
        .collect()
}

/// A batch body of the raw request bodies (spliced byte for byte: NaN literals and lone surrogates included).
fn batch_of(bodies: &[&[u8]], extra: &str) -> Vec<u8> {
    let mut b = format!("{{{extra}\"requests\":[").into_bytes();
    for (i, body) in bodies.iter().enumerate() {
        if i > 0 {
            b.push(b',');
        }
        b.extend_from_slice(body);
    }
    b.extend_from_slice(b"]}");
    b
}

/// An answer without its engine time (the one field that differs from run to run).
fn timeless(mut v: Value) -> String {
    if let Some(m) = v.as_object_mut() {
        m.remove("x_latency_ms");
    }
    v.to_string()
}

/// `/v1/systemone/batch` on the real engine: every fixture request (and every invalid one) answered inside
/// batches of 1, 7 and 64 entries, shuffled and mixed, byte for byte as `/v1/systemone` answers it alone —
/// refusals included, as `{status, error}` in their place; the shorthand (`states` + `questions`) equals the
/// long form; the batch's `model` and `x_logits` reach entries without their own.
#[test]
fn a_batch_answers_every_entry_as_it_is_answered_alone() {
    let s = Served::start(&[]);
    let mut all: Vec<(String, Vec<u8>, String)> = Vec::new();
    for (name, body) in valid_requests().into_iter().chain(invalid_json_requests()) {
        let (status, v) = s.post("/v1/systemone", &body);
        let expected = if status == 200 {
            timeless(v)
        } else {
            json!({"status": status, "error": v}).to_string()
        };
        all.push((name, body, expected));
    }
    let refused = all
        .iter()
        .filter(|(_, _, e)| e.starts_with("{\"status\""))
        .count();
    assert!(
        refused >= 10 && all.len() - refused >= 40,
        "{refused} of {}",
        all.len()
    );

    let mut rng = Rng(7);
    for size in [1usize, 7, 64] {
        let mut order: Vec<usize> = (0..all.len()).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, (rng.unit() * (i + 1) as f64) as usize % (i + 1));
        }
        // Every request in at least one batch of this size (the last one topped up from the front).
        for chunk in order.chunks(size) {
            let mut picked = chunk.to_vec();
            let mut k = 0;
            while picked.len() < size.min(all.len()) {
                picked.push(order[k]);
                k += 1;
            }
            let bodies: Vec<&[u8]> = picked.iter().map(|&i| all[i].1.as_slice()).collect();
            let (status, v) = s.post("/v1/systemone/batch", &batch_of(&bodies, ""));
            assert_eq!(status, 200, "batch of {size}: {v}");
            let results = v["results"].as_array().unwrap();
            assert_eq!(results.len(), picked.len());
            let (mut input, mut output) = (0, 0);
            for (r, &i) in results.iter().zip(&picked) {
                let (name, _, expected) = &all[i];
                let got = if r.get("status").is_some() {
                    r.to_string()
                } else {
                    input += r["usage"]["input_tokens"].as_u64().unwrap();
                    output += r["usage"]["output_tokens"].as_u64().unwrap();
                    timeless(r.clone())
                };
                assert_eq!(&got, expected, "{name} in a batch of {size}");
            }
            assert_eq!(
                v["usage"],
                json!({"input_tokens": input, "output_tokens": output})
            );
            assert_eq!(v["model"], "kev-latest");
        }
    }

    // The shorthand is the long form; the batch's model and x_logits reach every entry.
    let questions = json!({"refund": {"type": "noul", "instructions": "A refund?"},
                           "team": {"type": "choice", "criteria": {"Billing": null, "Tech": "bugs"}}});
    let states = [
        json!("I was charged twice."),
        json!({"ticket": 7, "text": "The app crashes."}),
    ];
    let short = json!({"model": "m1", "x_logits": true, "states": states, "questions": questions});
    let long: Vec<Value> = states
        .iter()
        .map(|st| json!({"model": "m1", "x_logits": true, "state": st, "questions": questions}))
        .collect();
    let (s1, v1) = s.post("/v1/systemone/batch", &serde_json::to_vec(&short).unwrap());
    let (s2, v2) = s.post(
        "/v1/systemone/batch",
        &serde_json::to_vec(&json!({"requests": long})).unwrap(),
    );
    assert_eq!((s1, s2), (200, 200), "{v1} {v2}");
    assert_eq!(v1["model"], "m1");
    for (a, b) in v1["results"]
        .as_array()
        .unwrap()
        .iter()
        .zip(v2["results"].as_array().unwrap())
    {
        assert_eq!(timeless(a.clone()), timeless(b.clone()));
        assert_eq!(a["model"], "m1");
        assert!(a["x_logits"]["team"]["Tech"].is_f64(), "{a}");
    }
}

/// A batch over its own caps is 413 naming the bound, with nothing run; a body that is not a batch is 422.
#[test]
fn a_batch_is_held_to_its_caps_and_its_shape() {
    let s = Served::start(&[
        "--max-batch-requests",
        "4",
        "--max-batch-input-tokens",
        "400",
    ]);
    let one: &[u8] =
        br#"{"state":"A short ticket about a refund.","questions":{"q":{"type":"noul"}}}"#;
    let before = rows_run(&s);
    let (status, v) = s.post("/v1/systemone/batch", &batch_of(&[one; 5], ""));
    assert_eq!(status, 413, "{v}");
    assert_eq!(v["detail"]["field"], "requests", "{v}");
    assert_eq!(v["detail"]["limit"], 4, "{v}");
    assert_eq!(v["detail"]["value"], 5, "{v}");
    // Each entry alone is well under --max-input-tokens; four of these states together are over 400.
    let long = serde_json::to_vec(
        &json!({"state": "word ".repeat(120), "questions": {"q": {"type": "noul"}}}),
    )
    .unwrap();
    let (status, v) = s.post("/v1/systemone/batch", &batch_of(&[long.as_slice(); 4], ""));
    assert_eq!(status, 413, "{v}");
    assert_eq!(v["detail"]["field"], "batch_input_tokens", "{v}");
    assert_eq!(v["detail"]["limit"], 400, "{v}");
    assert_eq!(rows_run(&s), before, "a refused batch ran rows");
    // At the entry cap: answered.
    let (status, v) = s.post("/v1/systemone/batch", &batch_of(&[one; 4], ""));
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["results"].as_array().unwrap().len(), 4);

    for (body, field, kind) in [
        (json!({"requests": []}), "requests", "too_short"),
        (json!({"requests": {"state": "x"}}), "requests", "list_type"),
        (json!({"states": ["x"]}), "questions", "missing"),
        (
            json!({"state": "x", "questions": {}}),
            "requests",
            "missing",
        ),
        (
            json!({"model": 3, "requests": [{}]}),
            "model",
            "string_type",
        ),
    ] {
        let (status, v) = s.post("/v1/systemone/batch", &serde_json::to_vec(&body).unwrap());
        assert_eq!(status, 422, "{body}: {v}");
        assert_eq!(v["detail"][0]["type"], kind, "{body}: {v}");
        assert_eq!(v["detail"][0]["loc"], json!(["body", field]), "{body}: {v}");
    }
    let (status, v) = s.post(
        "/v1/systemone/batch",
        br#"{"requests":[{"state":"x","questions":{"q":{"type":"noul"}}}],"states":["y"]}"#,
    );
    assert_eq!(status, 422, "{v}");
    assert_eq!(v["detail"][0]["type"], "value_error", "{v}");
}

/// `kev serve --api-keys FILE`: named keys answer, a wrong one is 401; after the file changes and the server
/// gets SIGHUP, a removed key is refused and a new one answers, without a restart; a file that does not read
/// stops `kev serve` before it starts, naming the problem.
#[test]
fn api_keys_are_read_again_on_sighup() {
    let dir = std::env::temp_dir().join(format!("kev-cli-keys-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("keys.json");
    let write = |keys: Value| std::fs::write(&file, json!({ "keys": keys }).to_string()).unwrap();
    write(
        json!([{"name": "a", "key": "secret-a"}, {"name": "b", "key": "secret-b", "concurrent": 2}]),
    );
    let s = Served::start(&["--api-keys", file.to_str().unwrap()]);
    let body = json!({"state": "A short ticket.", "questions": {"q": {"type": "noul"}}});
    let ask = |key: &str| -> u16 { call(&s, "POST", "/v1/systemone", Some(key), Some(&body)).0 };
    assert_eq!(
        (ask("secret-a"), ask("secret-b"), ask("secret-c")),
        (200, 200, 401)
    );
    write(json!([{"name": "b", "key": "secret-b"}, {"name": "c", "key": "secret-c"}]));
    let hup = Command::new("kill")
        .args(["-HUP", &s.child.id().to_string()])
        .status()
        .unwrap();
    assert!(hup.success());
    let t = Instant::now();
    while ask("secret-a") != 401 {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the keys file was not read again"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!((ask("secret-b"), ask("secret-c")), (200, 200));

    write(json!([{"name": "x", "key": "same"}, {"name": "y", "key": "same"}]));
    let out = kev()
        .env("KEV_DEMO_DIR", fixtures().join("release"))
        .args([
            "serve",
            "--demo",
            "--port",
            "0",
            "--api-keys",
            file.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("same secret"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The Prometheus text of the server at `base`.
pub(crate) fn metrics_text(base: &str) -> String {
    ureq::get(&format!("{base}/metrics"))
        .call()
        .unwrap()
        .into_string()
        .unwrap()
}

/// The value of the series `name` (with its labels) on the server at `base`; 0 when it is absent.
pub(crate) fn metric_at(base: &str, name: &str) -> f64 {
    metrics_text(base)
        .lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

fn metric_value(s: &Served, name: &str) -> f64 {
    metric_at(&s.base, name)
}

/// A call with a bearer key (or none) and any method; (status, JSON body).
pub(crate) fn call(
    s: &Served,
    method: &str,
    path: &str,
    key: Option<&str>,
    body: Option<&Value>,
) -> (u16, Value) {
    let mut req = ureq::request(method, &format!("{}{path}", s.base));
    if let Some(k) = key {
        req = req.set("authorization", &format!("Bearer {k}"));
    }
    answer(match body {
        Some(b) => req
            .set("content-type", "application/json")
            .send_bytes(b.to_string().as_bytes()),
        None => req.call(),
    })
}

/// Pinned states on the real engine, the cache off: a request naming a pin runs only its question rows and
/// answers byte for byte as the plain request; pins belong to the key that made them; DELETE and expiry free
/// them; a snapshot over the budget is a 413.
#[test]
fn a_pinned_state_runs_only_the_questions_and_belongs_to_its_key() {
    let dir = std::env::temp_dir().join(format!("kev-cli-pins-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("keys.json");
    std::fs::write(
        &file,
        json!({"keys": [{"name": "a", "key": "secret-a"}, {"name": "b", "key": "secret-b"}]})
            .to_string(),
    )
    .unwrap();
    let s = Served::start(&["--cache-bytes", "0", "--api-keys", file.to_str().unwrap()]);
    let state = (0..40)
        .map(|i| format!("Line {i}: the customer asks about order {i} and a refund."))
        .collect::<Vec<_>>()
        .join("\n");
    let questions = json!({"refund": {"type": "noul", "instructions": "A refund?"},
                           "team": {"type": "choice", "criteria": {"Billing": null, "Tech": "bugs"}}});
    let a = Some("secret-a");
    // The plain request first (the cache is off: its prefix runs), then the state pinned.
    let plain = json!({"state": state, "questions": questions});
    let rows0 = rows_run(&s);
    let (st, p) = call(&s, "POST", "/v1/systemone", a, Some(&plain));
    assert_eq!(st, 200, "{p}");
    let rows1 = rows_run(&s);
    assert_eq!(
        rows1 - rows0,
        3,
        "the plain request runs its prefix and two questions"
    );
    let (st, pin) = call(
        &s,
        "POST",
        "/v1/systemone/states",
        a,
        Some(&json!({"state": state, "ttl_s": 600})),
    );
    assert_eq!(st, 200, "{pin}");
    let id = pin["id"].as_str().unwrap().to_owned();
    assert!(
        pin["ready"].as_bool().unwrap() && pin["bytes"].as_u64().unwrap() > 0,
        "{pin}"
    );
    assert!(pin["tokens"].as_u64().unwrap() > 300, "{pin}");
    assert_eq!(metric_value(&s, "kev_pinned_states"), 1.0);
    let rows1 = rows_run(&s);
    let (st, q) = call(
        &s,
        "POST",
        "/v1/systemone",
        a,
        Some(&json!({"x_state_id": id, "questions": questions})),
    );
    assert_eq!(st, 200, "{q}");
    let rows2 = rows_run(&s);
    assert_eq!(timeless(q.clone()), timeless(p.clone()));
    assert_eq!(
        rows2 - rows1,
        2,
        "the pinned request runs its two questions only"
    );
    // Naming the same state beside the id is fine; another state is a 422.
    let mut both = plain.clone();
    both["x_state_id"] = json!(id);
    assert_eq!(call(&s, "POST", "/v1/systemone", a, Some(&both)).0, 200);
    both["state"] = json!("another text");
    assert_eq!(call(&s, "POST", "/v1/systemone", a, Some(&both)).0, 422);

    // Inside a batch, entry by entry: the pinned entry answers as the plain request, a missing pin is refused
    // in its place (404), the other entries are untouched.
    let batch = json!({"requests": [
        {"x_state_id": id, "questions": questions},
        {"x_state_id": "no-such-pin", "questions": questions},
        plain.clone(),
    ]});
    let (st, r) = call(&s, "POST", "/v1/systemone/batch", a, Some(&batch));
    assert_eq!(st, 200, "{r}");
    assert_eq!(timeless(r["results"][0].clone()), timeless(p.clone()));
    assert_eq!(r["results"][1]["status"], 404, "{r}");
    assert_eq!(timeless(r["results"][2].clone()), timeless(p.clone()));

    // Another key neither uses, reads nor removes it.
    let b = Some("secret-b");
    let named = json!({"x_state_id": id, "questions": questions});
    assert_eq!(call(&s, "POST", "/v1/systemone", b, Some(&named)).0, 404);
    let (st, r) = call(
        &s,
        "POST",
        "/v1/systemone/batch",
        b,
        Some(&json!({"requests": [named.clone()]})),
    );
    assert_eq!((st, &r["results"][0]["status"]), (200, &json!(404)), "{r}");
    assert_eq!(
        call(&s, "GET", &format!("/v1/systemone/states/{id}"), b, None).0,
        404
    );
    assert_eq!(
        call(&s, "DELETE", &format!("/v1/systemone/states/{id}"), b, None).0,
        404
    );
    let (st, info) = call(&s, "GET", &format!("/v1/systemone/states/{id}"), a, None);
    assert_eq!((st, &info["id"]), (200, &json!(id)), "{info}");

    // Unpinned: its bytes are free and the id is gone.
    assert!(metric_value(&s, "kev_pinned_state_bytes") > 0.0);
    assert_eq!(
        call(&s, "DELETE", &format!("/v1/systemone/states/{id}"), a, None).0,
        200
    );
    assert_eq!(call(&s, "POST", "/v1/systemone", a, Some(&named)).0, 404);
    assert_eq!(metric_value(&s, "kev_pinned_state_bytes"), 0.0);

    // Expiry.
    let (st, short) = call(
        &s,
        "POST",
        "/v1/systemone/states",
        a,
        Some(&json!({"state": "short", "ttl_s": 1})),
    );
    assert_eq!(st, 200, "{short}");
    std::thread::sleep(Duration::from_millis(1500));
    let path = format!("/v1/systemone/states/{}", short["id"].as_str().unwrap());
    assert_eq!(call(&s, "GET", &path, a, None).0, 404);
    assert_eq!(
        call(
            &s,
            "POST",
            "/v1/systemone/states",
            a,
            Some(&json!({"state": "x", "ttl_s": 0}))
        )
        .0,
        422
    );
    drop(s);

    // A budget smaller than one snapshot.
    let s = Served::start(&["--pin-bytes", "1000"]);
    let (st, v) = call(
        &s,
        "POST",
        "/v1/systemone/states",
        None,
        Some(&json!({"state": state})),
    );
    assert_eq!(st, 413, "{v}");
    assert!(
        v["detail"]["message"].as_str().unwrap().contains("budget"),
        "{v}"
    );
    assert_eq!(metric_value(&s, "kev_pinned_states"), 0.0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// kev-mini's base with three adapters (`fixtures/mini/adapters`): `/v1/models` lists each, `model` picks
/// one (a batch may mix them; each entry answers as it does alone), `--strict-models` refuses other names,
/// `/metrics` counts per adapter, and a directory that does not fit the base stops the start naming it.
#[test]
fn several_adapters_over_one_base_are_chosen_by_model() {
    let mini = fixtures().join("mini");
    let arg = |name: &str, dir: PathBuf| format!("{name}={}", dir.display());
    let adapters = [
        arg("kev", mini.join("kev")),
        arg("support", mini.join("adapters/support")),
        arg("ops", mini.join("adapters/ops")),
    ];
    let base = mini.join("base").display().to_string();
    let s = Served::serve(&[
        "--base",
        &base,
        "--adapter",
        &adapters[0],
        "--adapter",
        &adapters[1],
        "--adapter",
        &adapters[2],
        "--default-adapter",
        "support",
        "--strict-models",
    ]);
    let (st, models) = call(&s, "GET", "/v1/models", None, None);
    assert_eq!(st, 200);
    let cards = models["models"].as_array().unwrap();
    let by_name = |n: &str| {
        cards
            .iter()
            .find(|c| c["name"] == n)
            .unwrap_or_else(|| panic!("{n} not listed: {models}"))
            .clone()
    };
    assert_eq!(by_name("kev-latest")["x_adapter"], "support");
    assert_eq!(by_name("support")["x_default"], true);
    assert_eq!(by_name("ops")["x_adapter"], "ops");
    assert_eq!(by_name("kev")["x_default"], false);
    assert!(by_name("ops")["x_adapter_bytes"].as_u64().unwrap() > 0);

    let body = |model: &str| {
        json!({"model": model, "state": "Hello, the invoice for order #4380 charges me twice. I want my money back. - Sam",
               "questions": {"refund": {"type": "noul", "instructions": "Is a refund requested?"},
                             "team": {"type": "choice", "instructions": "Which team should handle this ticket?",
                                      "criteria": {"Billing": null, "Sales": null, "Shipping": null}}}})
    };
    let mut answers = Vec::new();
    for model in ["support", "ops", "kev", "kev-latest"] {
        let (st, v) = call(&s, "POST", "/v1/systemone", None, Some(&body(model)));
        assert_eq!(st, 200, "{model}: {v}");
        assert_eq!(v["model"], model);
        answers.push(v["answers"].clone());
    }
    assert_ne!(answers[0], answers[1], "support and ops answer alike");
    assert_ne!(answers[1], answers[2], "ops and kev answer alike");
    assert_eq!(
        answers[3], answers[0],
        "kev-latest is the default adapter, support"
    );

    // A batch mixing adapters: each entry as it is answered alone.
    let batch = json!({"requests": [body("ops"), body("support"), body("kev"), body("ops")]});
    let (st, v) = call(&s, "POST", "/v1/systemone/batch", None, Some(&batch));
    assert_eq!(st, 200, "{v}");
    let got: Vec<Value> = v["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["answers"].clone())
        .collect();
    assert_eq!(
        got,
        vec![
            answers[1].clone(),
            answers[0].clone(),
            answers[2].clone(),
            answers[1].clone()
        ]
    );

    let (st, v) = call(&s, "POST", "/v1/systemone", None, Some(&body("kev-9b")));
    assert_eq!(st, 400, "{v}");
    assert_eq!(v["detail"]["error_type"], "api_usage_error");
    assert_eq!(v["detail"]["message"], "Unknown model: kev-9b");

    let ops = metric_value(&s, "kev_adapter_requests_total{adapter=\"ops\"}");
    assert!(ops >= 3.0, "ops requests counted: {ops}");
    drop(s);

    // An adapter made for another base stops the start, naming it and the tensor.
    let out = kev()
        .args([
            "serve",
            "--port",
            "0",
            "--base",
            &base,
            "--adapter",
            &adapters[0],
        ])
        .args(["--adapter", &arg("wrong", fixtures().join("release/kev"))])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("adapter wrong") && err.contains("layers."),
        "{err}"
    );
}
