//! `kev serve` run as an operator runs it, on kev-mini with its two trained adapters: a key's adapter policy
//! (403 naming key and adapter) that changes on SIGHUP from the next request, the audit log with each adapter's
//! sha256 and no document text, `/live`, and no trace exporter without an endpoint (the process's threads).

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::tools::{Served, call, fixtures, metrics_text};

/// The names of process `pid`'s threads.
fn threads(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|c| c.trim().to_owned())
        .collect()
}

#[test]
fn key_policies_follow_sighup_and_the_audit_log_names_adapters_not_documents() {
    let dir = tempfile::Builder::new()
        .prefix("kev-cli-ops-")
        .tempdir()
        .unwrap();
    let keys = dir.path().join("keys.json");
    let audit = dir.path().join("audit.jsonl");
    let write = |v: Value| std::fs::write(&keys, json!({ "keys": v }).to_string()).unwrap();
    write(json!([{"name": "ops-team", "key": "sk-ops-team", "adapters": ["ops"]}]));
    let mini = fixtures().join("mini");
    let arg = |name: &str, sub: &str| format!("{name}={}", mini.join(sub).display());
    let s = Served::serve(&[
        "--base",
        &mini.join("base").display().to_string(),
        "--adapter",
        &arg("support", "adapters/support"),
        "--adapter",
        &arg("ops", "adapters/ops"),
        "--api-keys",
        keys.to_str().unwrap(),
        "--audit-log",
        audit.to_str().unwrap(),
    ]);
    let body = |model: &str| {
        json!({"model": model, "state": "PRIVATE: the invoice for order #4380 charges me twice.",
               "questions": {"refund": {"type": "noul", "instructions": "Is a refund requested?"}}})
    };
    let ask = |model: &str| {
        call(
            &s,
            "POST",
            "/v1/systemone",
            Some("sk-ops-team"),
            Some(&body(model)),
        )
    };
    assert_eq!(ask("ops").0, 200);
    let (st, v) = ask("support");
    assert_eq!(st, 403, "{v}");
    assert_eq!(v["detail"]["error_type"], "permission_error");
    let msg = v["detail"]["message"].as_str().unwrap();
    assert!(
        msg.contains("\"ops-team\"") && msg.contains("\"support\""),
        "{msg}"
    );
    // The file changes; SIGHUP; the next request follows it.
    write(json!([{"name": "ops-team", "key": "sk-ops-team", "adapters": ["ops", "support"]}]));
    let hup = Command::new("kill")
        .args(["-HUP", &s.child.id().to_string()])
        .status()
        .unwrap();
    assert!(hup.success());
    let t = Instant::now();
    while ask("support").0 != 200 {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the policy did not change"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Liveness; and no exporter thread without an endpoint (the audit writer is there).
    let (st, _) = call(&s, "GET", "/live", None, None);
    assert_eq!(st, 200);
    let names = threads(s.child.id());
    assert!(
        !names
            .iter()
            .any(|n| n.starts_with("OpenTelemetry") || n.starts_with("kev-otlp")),
        "{names:?}"
    );
    assert!(names.iter().any(|n| n == "kev-audit"), "{names:?}");
    // The audit log: one line per decision request, the adapter's sha256, never the document or the secret.
    let t = Instant::now();
    let text = loop {
        let text = std::fs::read_to_string(&audit).unwrap_or_default();
        if text.lines().count() >= 3 || t.elapsed() > Duration::from_secs(10) {
            break text;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        !text.contains("PRIVATE") && !text.contains("sk-ops-team"),
        "{text}"
    );
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines[0]["status"], 200);
    assert_eq!(lines[0]["key"], "ops-team");
    assert_eq!(lines[0]["adapters"][0]["name"], "ops");
    let sha = lines[0]["adapters"][0]["sha256"].as_str().unwrap();
    assert_eq!(sha.len(), 64, "{sha}");
    assert_eq!(lines[1]["status"], 403);
    assert_eq!(lines[1]["error_type"], "permission_error");
}

/// `(status, body)` of a request to the admin routes with `key` (or none).
fn admin_call(
    s: &Served,
    method: &str,
    path: &str,
    key: Option<&str>,
    body: Option<&Value>,
) -> (u16, Value) {
    call(s, method, path, key, body)
}

/// An answer without its latency (the rest is byte for byte the model's).
fn timeless(mut v: Value) -> Value {
    if let Some(o) = v.as_object_mut() {
        o.remove("x_latency_ms");
    }
    v
}

#[test]
fn adapters_are_added_and_removed_live_and_follow_the_adapters_file() {
    let dir = tempfile::Builder::new()
        .prefix("kev-cli-live-")
        .tempdir()
        .unwrap();
    let key_file = dir.path().join("admin.key");
    std::fs::write(&key_file, "sk-admin-live\n").unwrap();
    let list = dir.path().join("adapters.json");
    let mini = fixtures().join("mini");
    let write_list = |names: &[&str]| {
        let adapters: Vec<Value> = names
            .iter()
            .map(|n| json!({"name": n, "dir": mini.join("adapters").join(n)}))
            .collect();
        std::fs::write(&list, json!({ "adapters": adapters }).to_string()).unwrap();
    };
    write_list(&[]);
    let base = mini.join("base").display().to_string();
    let kev_arg = format!("kev={}", mini.join("kev").display());
    let live = Served::serve(&[
        "--base",
        &base,
        "--adapter",
        &kev_arg,
        "--adapters-file",
        list.to_str().unwrap(),
        "--admin-key-file",
        key_file.to_str().unwrap(),
    ]);
    // The reference: every adapter loaded at start.
    let reference = Served::serve(&[
        "--base",
        &base,
        "--adapter",
        &kev_arg,
        "--adapter",
        &format!("ops={}", mini.join("adapters/ops").display()),
        "--adapter",
        &format!("support={}", mini.join("adapters/support").display()),
    ]);
    let admin = Some("sk-admin-live");
    let ops_dir = mini.join("adapters/ops").display().to_string();
    let add = json!({"name": "ops", "dir": ops_dir});
    assert_eq!(
        admin_call(&live, "POST", "/v1/adapters", None, Some(&add)).0,
        403
    );
    assert_eq!(
        admin_call(&live, "POST", "/v1/adapters", Some("nope"), Some(&add)).0,
        401
    );
    let (st, card) = admin_call(&live, "POST", "/v1/adapters", admin, Some(&add));
    assert_eq!(st, 200, "{card}");
    assert_eq!(card["name"], "ops");
    let (_, models) = call(&live, "GET", "/v1/models", None, None);
    assert!(
        models.to_string().contains("\"x_adapter\":\"ops\""),
        "{models}"
    );
    assert!(metrics_text(&live.base).contains("kev_adapter_loaded{adapter=\"ops\"} 1"));
    let body = |model: &str, i: usize| {
        json!({"model": model, "state": format!("Ticket {i}: the parcel is late and the customer wants a refund."),
               "questions": {"refund": {"type": "noul", "instructions": "Is a refund requested?"},
                             "team": {"type": "choice", "criteria": {"Billing": null, "Shipping": null}}}})
    };
    for i in 0..3 {
        for model in ["ops", "kev"] {
            let (a, b) = (
                call(&live, "POST", "/v1/systemone", None, Some(&body(model, i))),
                call(
                    &reference,
                    "POST",
                    "/v1/systemone",
                    None,
                    Some(&body(model, i)),
                ),
            );
            assert_eq!((a.0, timeless(a.1)), (b.0, timeless(b.1)), "{model} {i}");
        }
    }
    // A directory for another base: the start's message, nothing changed.
    let other = json!({"name": "other", "dir": fixtures().join("release/kev")});
    let (st, v) = admin_call(&live, "POST", "/v1/adapters", admin, Some(&other));
    assert_eq!(st, 422, "{v}");
    assert!(
        v["detail"]["message"]
            .as_str()
            .unwrap()
            .contains("adapter other"),
        "{v}"
    );
    // Requests racing the removal: each answered, or the typed 404.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let racers: Vec<_> = (0..3)
        .map(|k| {
            let (url, stop) = (live.base.clone(), std::sync::Arc::clone(&stop));
            let b = body("ops", 10 + k);
            std::thread::spawn(move || {
                let mut seen = Vec::new();
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    let r = ureq::post(&format!("{url}/v1/systemone"))
                        .set("content-type", "application/json")
                        .send_bytes(b.to_string().as_bytes());
                    seen.push(match r {
                        Ok(r) => r.status(),
                        Err(ureq::Error::Status(c, _)) => c,
                        Err(e) => panic!("{e}"),
                    });
                }
                seen
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let (st, v) = admin_call(&live, "DELETE", "/v1/adapters/ops", admin, None);
    assert_eq!(st, 200, "{v}");
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let statuses: Vec<u16> = racers.into_iter().flat_map(|h| h.join().unwrap()).collect();
    assert!(
        statuses.iter().all(|s| *s == 200 || *s == 404),
        "{statuses:?}"
    );
    assert!(
        statuses.contains(&200) && statuses.contains(&404),
        "{statuses:?}"
    );
    let (st, v) = call(&live, "POST", "/v1/systemone", None, Some(&body("ops", 0)));
    assert_eq!(st, 404, "{v}");
    let (_, models) = call(&live, "GET", "/v1/models", None, None);
    assert!(
        !models.to_string().contains("\"x_adapter\":\"ops\""),
        "{models}"
    );
    assert!(!metrics_text(&live.base).contains("kev_adapter_loaded{adapter=\"ops\"}"));
    assert_eq!(
        admin_call(&live, "DELETE", "/v1/adapters/kev", admin, None).0,
        409
    );
    // The adapters file: SIGHUP brings the served adapters to it.
    let hup = || {
        assert!(
            Command::new("kill")
                .args(["-HUP", &live.child.id().to_string()])
                .status()
                .unwrap()
                .success()
        )
    };
    let status_of =
        |model: &str| call(&live, "POST", "/v1/systemone", None, Some(&body(model, 0))).0;
    // (Before it is served, `support` is answered by the default adapter, as Kev 1.0 answers any name.)
    write_list(&["support"]);
    hup();
    let t = Instant::now();
    while !metrics_text(&live.base).contains("kev_adapter_loaded{adapter=\"support\"} 1") {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "support was not added"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let (a, b) = (
        call(
            &live,
            "POST",
            "/v1/systemone",
            None,
            Some(&body("support", 1)),
        ),
        call(
            &reference,
            "POST",
            "/v1/systemone",
            None,
            Some(&body("support", 1)),
        ),
    );
    assert_eq!(timeless(a.1), timeless(b.1));
    write_list(&[]);
    hup();
    let t = Instant::now();
    while status_of("support") != 404 {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "support was not removed"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
