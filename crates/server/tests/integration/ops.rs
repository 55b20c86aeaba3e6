//! Running kev in production (issue 57), over the stand-in decider (its `model` names the adapter, its work is
//! tokens × time): priorities (higher first, lower never starved, queue slots by class), deadlines (answered
//! 408 on time, never run), per-key policy (allowed adapters → typed 403, priorities defaulted and capped,
//! changes on reload), the audit log and the per-phase histograms, and readiness that follows a canary
//! decision. Key and model names are unique to each test: the metrics recorder is the process's.

use crate::support;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use kev_server::keys::Keys;
use kev_server::{LongLane, ServerConfig};
use serde_json::{Value, json};
use support::{Running, Stub, agent, json_of, send, start_ready};

/// A one-question request of `tokens` tokens under `model`, with extra body fields.
fn body(model: &str, tokens: usize, extra: Value) -> Vec<u8> {
    let mut v = json!({"model": model, "state": format!("state of {model}"), "tokens": tokens,
                       "questions": {"q": {"type": "noul"}}});
    if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
        o.extend(e.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    v.to_string().into_bytes()
}

/// (status, headers we look at, JSON body) of a POST to `path` with the given headers.
fn post_to(
    r: &Running,
    path: &str,
    headers: &[(&str, &str)],
    b: &[u8],
) -> (u16, Option<String>, Value) {
    let mut req = agent()
        .post(&r.url(path))
        .set("content-type", "application/json");
    for (k, v) in headers {
        req = req.set(k, v);
    }
    let (status, resp) = send(req, b);
    let priority = resp.header("x-kev-priority").map(str::to_owned);
    (status, priority, json_of(resp))
}

fn post(r: &Running, headers: &[(&str, &str)], b: &[u8]) -> (u16, Option<String>, Value) {
    post_to(r, "/v1/systemone", headers, b)
}

/// One request per thread, `delay` apart, each answered in its own thread: `(model, status, when answered)`.
/// A model named `…-high` is sent with `X-Kev-Priority: high` too (the priority known before its body).
fn fire(
    r: &Running,
    requests: Vec<(String, Vec<u8>)>,
    delay: Duration,
) -> Vec<std::thread::JoinHandle<(String, u16, Instant)>> {
    requests
        .into_iter()
        .map(|(model, b)| {
            let url = r.url("/v1/systemone");
            let h = std::thread::spawn(move || {
                let mut req = agent().post(&url).set("content-type", "application/json");
                if model.ends_with("-high") {
                    req = req.set("x-kev-priority", "high");
                }
                let (status, _) = send(req, &b);
                (model, status, Instant::now())
            });
            std::thread::sleep(delay);
            h
        })
        .collect()
}

/// The first pass (index into the stub's passes) that carried `model`.
fn first_pass(stub: &Stub, model: &str) -> Option<usize> {
    stub.passes
        .lock()
        .unwrap()
        .iter()
        .position(|p| p.iter().any(|m| m == model))
}

#[test]
fn higher_priority_goes_first_and_low_slots_leave_room_for_the_others() {
    // One 100-token request per pass, 3 ms a token: a 300 ms blocker, then everything queued behind it.
    let config = ServerConfig {
        pass_tokens: 100,
        queue_depth: 4,
        long_lane: LongLane::Off,
        ..ServerConfig::default()
    };
    let stub = Arc::new(Stub::new(Duration::from_millis(3)));
    let r = start_ready(config, Arc::clone(&stub));
    let mut reqs = vec![("blocker".to_string(), body("blocker", 100, json!({})))];
    for i in 0..3 {
        let m = format!("prio-low-{i}");
        reqs.push((m.clone(), body(&m, 100, json!({"x_priority": "low"}))));
    }
    let handles = fire(&r, reqs, Duration::from_millis(25));
    // The queue (depth 4) holds three lows: a fourth low is refused (lows use 3 of the 4 slots), a normal
    // and a high still get in (the high, known high before its body, into the reserve beyond the depth); a
    // further normal finds the queue full before its body is read.
    let (status, _, v) = post(
        &r,
        &[],
        &body("prio-low-x", 100, json!({"x_priority": "low"})),
    );
    assert_eq!(status, 429, "{v}");
    let more = fire(
        &r,
        vec![
            ("prio-normal".into(), body("prio-normal", 100, json!({}))),
            (
                "prio-high".into(),
                body("prio-high", 100, json!({"x_priority": "high"})),
            ),
        ],
        Duration::from_millis(25),
    );
    std::thread::sleep(Duration::from_millis(20));
    let (status, _, v) = post(&r, &[], &body("prio-normal-x", 100, json!({})));
    assert_eq!(status, 429, "{v}");
    for h in handles.into_iter().chain(more) {
        let (m, status, _) = h.join().unwrap();
        assert_eq!(status, 200, "{m}");
    }
    let high = first_pass(&stub, "prio-high").unwrap();
    let normal = first_pass(&stub, "prio-normal").unwrap();
    for i in 0..3 {
        let low = first_pass(&stub, &format!("prio-low-{i}")).unwrap();
        assert!(
            high < low && normal < low,
            "passes: {:?}",
            stub.passes.lock().unwrap()
        );
    }
    assert!(high < normal, "passes: {:?}", stub.passes.lock().unwrap());
}

#[test]
fn low_priority_work_is_never_starved_by_a_stream_of_high_priority_work() {
    // Three clients keep high-priority requests waiting at every pass (two fit a pass); one low request must
    // still be answered: it goes first once skipped LOW_AGING × starve_passes passes in a row.
    let config = ServerConfig {
        pass_tokens: 100,
        long_lane: LongLane::Off,
        ..ServerConfig::default()
    };
    let stub = Arc::new(Stub::new(Duration::from_millis(1)));
    let r = start_ready(config, Arc::clone(&stub));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let highs: Vec<_> = (0..3)
        .map(|k| {
            let (url, stop) = (r.url("/v1/systemone"), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut n = 0;
                while !stop.load(Ordering::SeqCst) {
                    let b = body(
                        &format!("starve-high-{k}"),
                        50,
                        json!({"x_priority": "high"}),
                    );
                    let (status, _) = send(
                        agent().post(&url).set("content-type", "application/json"),
                        &b,
                    );
                    assert_eq!(status, 200);
                    n += 1;
                }
                n
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let t = Instant::now();
    let (status, priority, v) = post(
        &r,
        &[],
        &body("starve-low", 50, json!({"x_priority": "low"})),
    );
    let waited = t.elapsed();
    stop.store(true, Ordering::SeqCst);
    let served: usize = highs.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(status, 200, "{v}");
    assert_eq!(priority.as_deref(), Some("low"));
    // 16 skipped passes of ~50–100 ms at most, with generous room for a shared machine.
    assert!(
        waited < Duration::from_secs(6),
        "the low request waited {waited:?}"
    );
    // And it did wait behind high-priority work, which kept flowing meanwhile.
    let passes = stub.passes.lock().unwrap();
    let at = passes
        .iter()
        .position(|p| p.iter().any(|m| m == "starve-low"))
        .unwrap();
    let highs_before = passes[..at]
        .iter()
        .flatten()
        .filter(|m| m.starts_with("starve-high"))
        .count();
    assert!(
        highs_before >= 10 && served > highs_before,
        "{highs_before} / {served}"
    );
}

#[test]
fn a_deadline_that_passes_while_queued_is_answered_on_time_and_never_run() {
    let config = ServerConfig {
        pass_tokens: 100,
        long_lane: LongLane::Off,
        ..ServerConfig::default()
    };
    // A 1 s blocker: one indivisible pass.
    let stub = Arc::new(Stub::new(Duration::from_millis(10)));
    let r = start_ready(config, Arc::clone(&stub));
    let blocker = fire(
        &r,
        vec![("dl-blocker".into(), body("dl-blocker", 100, json!({})))],
        Duration::from_millis(50),
    );
    let t = Instant::now();
    let (status, _, v) = post(&r, &[], &body("dl-body", 10, json!({"x_deadline_ms": 200})));
    let took = t.elapsed();
    assert_eq!(status, 408, "{v}");
    assert_eq!(v["detail"]["error_type"], "timeout_error");
    assert!(
        v["detail"]["message"]
            .as_str()
            .unwrap()
            .contains("it was not run"),
        "{v}"
    );
    assert!(took < Duration::from_millis(800), "answered after {took:?}");
    // The header does the same for clients that cannot add fields.
    let (status, _, v) = post(
        &r,
        &[("X-Kev-Deadline-Ms", "150")],
        &body("dl-header", 10, json!({})),
    );
    assert_eq!(status, 408, "{v}");
    for h in blocker {
        assert_eq!(h.join().unwrap().1, 200);
    }
    // Once the engine is free: neither ever ran.
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(first_pass(&stub, "dl-body"), None);
    assert_eq!(first_pass(&stub, "dl-header"), None);
    // A deadline it can meet is met.
    let (status, _, v) = post(&r, &[], &body("dl-met", 10, json!({"x_deadline_ms": 5000})));
    assert_eq!(status, 200, "{v}");
    // A request that runs past its deadline is stopped before its next pass: 40 pieces of 10 tokens
    // (100 ms each), a 350 ms deadline.
    let b = json!({"model": "dl-running", "state": "x", "tokens": 400, "whole": false, "unit": 10,
                   "questions": {"q": {"type": "noul"}}, "x_deadline_ms": 350});
    let (status, _, v) = post(&r, &[], b.to_string().as_bytes());
    assert_eq!(status, 408, "{v}");
    assert!(
        v["detail"]["message"]
            .as_str()
            .unwrap()
            .contains("while it ran"),
        "{v}"
    );
    std::thread::sleep(Duration::from_millis(300));
    let pieces = stub
        .passes
        .lock()
        .unwrap()
        .iter()
        .filter(|p| p.iter().any(|m| m == "dl-running"))
        .count();
    assert!((1..=8).contains(&pieces), "ran {pieces} pieces of 40");
    // Bad values are the client's error, in pydantic's words.
    let (status, _, v) = post(
        &r,
        &[],
        &body(
            "dl-bad",
            10,
            json!({"x_deadline_ms": 0, "x_priority": "urgent"}),
        ),
    );
    assert_eq!(status, 422, "{v}");
    assert_eq!(v["detail"][0]["loc"], json!(["body", "x_priority"]));
    assert_eq!(v["detail"][1]["type"], "greater_than");
    let (status, _, v) = post(
        &r,
        &[("x-kev-deadline-ms", "soon")],
        &body("dl-bad", 10, json!({})),
    );
    assert_eq!(status, 422, "{v}");
    assert_eq!(
        v["detail"][0]["loc"],
        json!(["header", "x-kev-deadline-ms"])
    );
}

/// A keys file in a temporary directory of the test's own.
fn keys_file(test: &str, entries: Value) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::Builder::new()
        .prefix(&format!("kev-ops-{test}-"))
        .tempdir()
        .unwrap();
    let p = dir.path().join("keys.json");
    std::fs::write(&p, json!({ "keys": entries }).to_string()).unwrap();
    (dir, p)
}

#[test]
fn a_keys_policy_limits_adapters_and_priorities_and_follows_a_reload() {
    let (_dir, p) = keys_file(
        "policy",
        json!([
            {"name": "team-ops", "key": "sk-team-ops-secret", "adapters": ["pol-ops"],
             "default_priority": "low", "max_priority": "normal"},
            {"name": "team-all", "key": "sk-team-all-secret"},
        ]),
    );
    let keys = Arc::new(Keys::read(&p).unwrap());
    let config = ServerConfig {
        api_keys: Some(Arc::clone(&keys)),
        ..ServerConfig::default()
    };
    let r = start_ready(config, Arc::new(Stub::default()));
    let ops = [("authorization", "Bearer sk-team-ops-secret")];
    let (status, priority, v) = post(&r, &ops, &body("pol-ops", 10, json!({})));
    assert_eq!((status, priority.as_deref()), (200, Some("low")), "{v}");
    let (status, priority, _) = post(
        &r,
        &ops,
        &body("pol-ops", 10, json!({"x_priority": "high"})),
    );
    assert_eq!(
        (status, priority.as_deref()),
        (200, Some("normal")),
        "capped"
    );
    // Another adapter: 403 naming the key and the adapter, never the secret.
    let (status, _, v) = post(&r, &ops, &body("pol-support", 10, json!({})));
    assert_eq!(status, 403, "{v}");
    assert_eq!(v["detail"]["error_type"], "permission_error");
    let msg = v["detail"]["message"].as_str().unwrap();
    assert!(
        msg.contains("\"team-ops\"") && msg.contains("\"pol-support\""),
        "{msg}"
    );
    assert!(!v.to_string().contains("secret"), "{v}");
    // In a batch, the entry alone is refused, in its place.
    let batch = json!({"requests": [
        {"model": "pol-ops", "state": "a", "questions": {"q": {"type": "noul"}}},
        {"model": "pol-support", "state": "b", "questions": {"q": {"type": "noul"}}},
    ]});
    let (status, _, v) = post_to(
        &r,
        "/v1/systemone/batch",
        &ops,
        batch.to_string().as_bytes(),
    );
    assert_eq!(status, 200, "{v}");
    assert!(v["results"][0]["answers"].is_object(), "{v}");
    assert_eq!(v["results"][1]["status"], 403, "{v}");
    // Another key is not restricted.
    let all = [("authorization", "Bearer sk-team-all-secret")];
    let (status, priority, _) = post(
        &r,
        &all,
        &body("pol-support", 10, json!({"x_priority": "high"})),
    );
    assert_eq!((status, priority.as_deref()), (200, Some("high")));
    // The file changes (SIGHUP calls the same reload): the next request follows it.
    std::fs::write(
        &p,
        json!({"keys": [{"name": "team-ops", "key": "sk-team-ops-secret", "adapters": ["pol-ops", "pol-support"]}]})
            .to_string(),
    )
    .unwrap();
    keys.reload().unwrap();
    let (status, priority, v) = post(
        &r,
        &ops,
        &body("pol-support", 10, json!({"x_priority": "high"})),
    );
    assert_eq!((status, priority.as_deref()), (200, Some("high")), "{v}");
    let (status, _, _) = post(&r, &all, &body("pol-support", 10, json!({})));
    assert_eq!(status, 401, "team-all left the file");
}

fn metrics_text(r: &Running) -> String {
    let (_, resp) = send(agent().get(&r.url("/metrics")), b"");
    resp.into_string().unwrap()
}

/// The lines of `path` once it has `n` of them (the writer thread flushes when it has nothing queued).
fn lines(path: &std::path::Path, n: usize) -> Vec<Value> {
    for _ in 0..200 {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.lines().count() >= n {
            return text
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("{} holds fewer than {n} lines", path.display());
}

#[test]
fn each_request_gets_an_audit_line_and_phase_histograms_by_adapter_key_and_tokens() {
    use kev_server::audit::{AuditConfig, AuditLog, AuditTarget};
    let (dir, p) = keys_file(
        "audit",
        json!([{"name": "audit-key", "key": "sk-audit-secret"}]),
    );
    let log = dir.path().join("audit.jsonl");
    let audit = AuditLog::start(&AuditConfig {
        target: AuditTarget::File(log.clone()),
        states: false,
    })
    .unwrap();
    let config = ServerConfig {
        api_keys: Some(Arc::new(Keys::read(&p).unwrap())),
        audit: Some(Arc::new(audit)),
        ..ServerConfig::default()
    };
    let r = start_ready(config, Arc::new(Stub::default()));
    let key = [("authorization", "Bearer sk-audit-secret")];
    let b = json!({"model": "audit-model", "state": "A CONFIDENTIAL DOCUMENT", "tokens": 300,
                   "questions": {"q": {"type": "noul"}}, "x_priority": "high"});
    let (status, _, _) = post(&r, &key, b.to_string().as_bytes());
    assert_eq!(status, 200);
    let (status, _, _) = post(&r, &key, b"{not json");
    assert_eq!(status, 422);
    let got = lines(&log, 2);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        !text.contains("CONFIDENTIAL") && !text.contains("sk-audit-secret"),
        "{text}"
    );
    let ok = &got[0];
    assert_eq!(ok["status"], 200);
    assert_eq!(ok["key"], "audit-key");
    assert_eq!(ok["route"], "/v1/systemone");
    assert_eq!(
        ok["adapters"],
        json!([{"name": "audit-model", "sha256": "sha-of-audit-model"}])
    );
    assert_eq!(ok["priority"], "high");
    assert_eq!(ok["input_tokens"], 10, "the stub's usage");
    assert_eq!(ok["request_id"].as_str().unwrap().len(), 32);
    for phase in ["admission", "queue", "compute", "head", "total"] {
        assert!(ok["ms"][phase].is_number(), "{phase}: {ok}");
    }
    assert_eq!(got[1]["status"], 422);
    assert_eq!(got[1]["error_type"], "invalid_request_error");
    assert!(got[1]["ms"]["queue"].is_null(), "{}", got[1]);
    // The histograms: every phase, labelled by adapter, key and the input-token bucket.
    let m = metrics_text(&r);
    for h in [
        "kev_admission_seconds_count",
        "kev_queue_wait_seconds_count",
        "kev_compute_seconds_count",
        "kev_head_seconds_count",
        "kev_decision_seconds_count",
    ] {
        let line = m
            .lines()
            .find(|l| l.starts_with(h) && l.contains("adapter=\"audit-model\""))
            .unwrap_or_else(|| panic!("no {h} for audit-model:\n{m}"));
        assert!(
            line.contains("key=\"audit-key\"")
                && line.contains("input_tokens=\"0-127\"")
                && line.ends_with(" 1"),
            "{line}"
        );
    }
    drop(r);
    // With --audit-log-states the state is written too.
    let log2 = dir.path().join("audit-states.jsonl");
    let audit = AuditLog::start(&AuditConfig {
        target: AuditTarget::File(log2.clone()),
        states: true,
    })
    .unwrap();
    let config = ServerConfig {
        audit: Some(Arc::new(audit)),
        ..ServerConfig::default()
    };
    let r = start_ready(config, Arc::new(Stub::default()));
    let (status, _, _) = post(&r, &[], b.to_string().as_bytes());
    assert_eq!(status, 200);
    let got = lines(&log2, 1);
    assert_eq!(got[0]["states"], json!(["A CONFIDENTIAL DOCUMENT"]));
    assert_eq!(got[0]["key"], Value::Null);
}

#[test]
fn readiness_follows_the_canary_decision_and_liveness_does_not() {
    let stub = Arc::new(Stub {
        warm_up_body: Some(body("canary-model", 10, json!({}))),
        ..Stub::default()
    });
    let config = ServerConfig {
        canary_interval: Some(Duration::from_millis(100)),
        ..ServerConfig::default()
    };
    let r = start_ready(config, Arc::clone(&stub));
    let ready = || {
        let (status, resp) = send(agent().get(&r.url("/ready")), b"");
        (status, json_of(resp))
    };
    let wait_for = |want: u16| {
        for _ in 0..300 {
            let (status, v) = ready();
            if status == want {
                return v;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("/ready never answered {want}: {:?}", ready());
    };
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(ready().0, 200, "the canary matches");
    stub.drift.store(true, Ordering::SeqCst);
    let v = wait_for(503);
    assert_eq!(v["detail"]["error_type"], "not_ready_error");
    assert!(
        v["detail"]["message"]
            .as_str()
            .unwrap()
            .contains("diverged"),
        "{v}"
    );
    let (status, _) = send(agent().get(&r.url("/live")), b"");
    assert_eq!(status, 200, "liveness does not follow the canary");
    let m = metrics_text(&r);
    assert!(
        m.contains("kev_canary_checks_total{result=\"diverged\"}"),
        "{m}"
    );
    stub.drift.store(false, Ordering::SeqCst);
    wait_for(200);
}

#[test]
fn the_adapter_admin_routes_are_off_without_an_admin_key_and_answer_only_admins() {
    let b = json!({"name": "ops", "dir": "/nowhere"}).to_string();
    // No admin key: 403 saying how to turn them on (the API itself open, as auth is off).
    let r = start_ready(ServerConfig::default(), Arc::new(Stub::default()));
    let (status, _, v) = post_to(&r, "/v1/adapters", &[], b.as_bytes());
    assert_eq!(status, 403, "{v}");
    assert_eq!(v["detail"]["error_type"], "permission_error");
    assert!(
        v["detail"]["message"]
            .as_str()
            .unwrap()
            .contains("KEV_ADMIN_KEY"),
        "{v}"
    );
    drop(r);
    // An admin key, and a keys file with one admin key and one not.
    let (_dir, p) = keys_file(
        "admin",
        json!([{"name": "ops-admin", "key": "sk-ops-admin", "admin": true},
               {"name": "plain", "key": "sk-plain"}]),
    );
    let config = ServerConfig {
        api_keys: Some(Arc::new(Keys::read(&p).unwrap())),
        admin_key: Some("sk-root".into()),
        ..ServerConfig::default()
    };
    let r = start_ready(config, Arc::new(Stub::default()));
    let with = |key: &str| [("authorization", format!("Bearer {key}"))];
    let ask = |key: Option<&str>| {
        let h = key.map(with);
        let headers: Vec<(&str, &str)> =
            h.iter().flatten().map(|(k, v)| (*k, v.as_str())).collect();
        post_to(&r, "/v1/adapters", &headers, b.as_bytes())
    };
    assert_eq!(ask(None).0, 403);
    assert_eq!(ask(Some("sk-wrong")).0, 401);
    let (status, _, v) = ask(Some("sk-plain"));
    assert_eq!(status, 403, "{v}");
    assert!(
        v["detail"]["message"]
            .as_str()
            .unwrap()
            .contains("\"plain\""),
        "{v}"
    );
    // The admins get through to the model, which here does not take adapters live: 409.
    for key in ["sk-root", "sk-ops-admin"] {
        let (status, _, v) = ask(Some(key));
        assert_eq!(status, 409, "{key}: {v}");
    }
    let (status, _, v) = post_to(
        &r,
        "/v1/adapters",
        &[("authorization", "Bearer sk-root")],
        b"{\"name\": 3}",
    );
    assert_eq!(status, 422, "{v}");
    assert_eq!(v["detail"][0]["loc"], json!(["body", "name"]));
    assert_eq!(v["detail"][1]["type"], "missing");
}
