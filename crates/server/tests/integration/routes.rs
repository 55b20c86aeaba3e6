//! The server's adversity tests against each decision route (`/v1/systemone`, `/batch`, `/permute`, `/separate`: one
//! admission pipeline): a slow body gets 408; with the queue full each answers 429 before its body is read; a
//! multipart body gets 415; a hang-up or a timeout stops every part of a fan-out at its next pass (each part
//! counted in `kev_engine_cancelled_total`); a fan-out takes one queue slot. (Beside `adversity.rs`, not in it:
//! the metrics recorder is the process's, and these tests' rejections and cancellations would show in that
//! file's exact counts.) The fan-out held to the work caps, all or nothing, needs the real model's caps: the CLI
//! tests check it on `kev serve` (`crates/cli/tests/serve_adversity.rs`).

use crate::support;

use std::io::{Read, Write};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use kev_server::ServerConfig;
use serde_json::{Value, json};
use support::{Running, Stub, agent, json_of, send};

fn start(config: ServerConfig, stub: Arc<Stub>) -> Running {
    support::start_ready(config, stub)
}

fn metric(r: &Running, name: &str) -> f64 {
    let (_, resp) = send(agent().get(&r.url("/metrics")), b"");
    let text = resp.into_string().unwrap();
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// Every route that answers decisions, and a body for it asking for one question of `tokens` tokens per part
/// (`parts` parts where the route fans out: `/permute` runs each option order as a part, `/separate` each
/// question, `/batch` each request).
const DECISION_ROUTES: [&str; 4] = [
    "/v1/systemone",
    "/v1/systemone/batch",
    "/v1/systemone/permute",
    "/v1/systemone/separate",
];

fn route_body(route: &str, tokens: usize, parts: usize) -> Vec<u8> {
    let question = json!({"type": "choice", "criteria": {"a": null, "b": null, "c": null}});
    let questions: serde_json::Map<String, Value> = (0..parts.max(1))
        .map(|i| (format!("q{i}"), question.clone()))
        .collect();
    let request = json!({"model": "fan", "state": "x", "tokens": tokens, "whole": false, "unit": 64,
                         "questions": questions});
    match route {
        "/v1/systemone/permute" => {
            let mut one = request.clone();
            one["questions"] = json!({"q0": question});
            json!({"request": one, "question": "q0", "n_perm": parts})
        }
        "/v1/systemone/batch" => {
            let mut one = request.clone();
            one["questions"] = json!({"q0": question});
            json!({"requests": vec![one; parts.max(1)]})
        }
        _ => request,
    }
    .to_string()
    .into_bytes()
}

/// The request head of a POST to `route` announcing a body of `len` bytes.
fn head(route: &str, len: usize, content_type: &str) -> String {
    format!(
        "POST {route} HTTP/1.1\r\nhost: x\r\ncontent-type: {content_type}\r\ncontent-length: {len}\r\nconnection: close\r\n\r\n"
    )
}

/// The status and body of the answer on `s`: read until the whole answer (its `content-length`) is in, or the
/// server closes.
fn answer_of(s: &mut std::net::TcpStream) -> (u16, Value) {
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut all = Vec::new();
    let mut chunk = [0u8; 64 << 10];
    loop {
        if let Some(end) = all.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&all[..end]).to_ascii_lowercase();
            let len = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok());
            if len.is_some_and(|n| all.len() >= end + 4 + n) {
                break;
            }
        }
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => all.extend_from_slice(&chunk[..n]),
        }
    }
    let text = String::from_utf8_lossy(&all).into_owned();
    let status = text
        .get(9..12)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {text:?}"));
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    let v = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {text:?}"));
    (status, v)
}

#[test]
fn a_slow_body_gets_408_on_every_decision_route() {
    let config = ServerConfig {
        header_read_timeout: Duration::from_millis(400),
        body_read_timeout: Duration::from_millis(400),
        ..ServerConfig::default()
    };
    let r = start(config, Arc::new(Stub::new(Duration::ZERO)));
    for route in DECISION_ROUTES {
        let b = route_body(route, 10, 2);
        let mut s = std::net::TcpStream::connect(r.addr).unwrap();
        s.write_all(head(route, b.len(), "application/json").as_bytes())
            .unwrap();
        s.write_all(&b[..10]).unwrap(); // then nothing
        let t = Instant::now();
        let (status, v) = answer_of(&mut s);
        assert_eq!(status, 408, "{route}: {v}");
        assert_eq!(v["detail"]["error_type"], "timeout_error", "{route}: {v}");
        assert!(
            v["detail"]["message"].as_str().unwrap().contains("body"),
            "{route}: {v}"
        );
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "{route}: 408 after {:?}",
            t.elapsed()
        );
    }
}

#[test]
fn a_full_queue_answers_429_on_every_decision_route_before_the_body_is_read() {
    let config = ServerConfig {
        queue_depth: 2,
        ..ServerConfig::default()
    };
    // 10 tokens at 200 ms: every request takes 2 s; one runs, two more wait in both slots.
    let r = start(config, Arc::new(Stub::new(Duration::from_millis(200))));
    let held: Vec<_> = (0..3)
        .map(|i| {
            let url = r.url("/v1/systemone");
            let t = std::thread::spawn(move || {
                let b = route_body("/v1/systemone", 10, 2);
                send(
                    agent().post(&url).set("content-type", "application/json"),
                    &b,
                )
                .0
            });
            // The first in the engine before the others arrive; time to spare on a busy machine.
            std::thread::sleep(Duration::from_millis(if i == 0 { 300 } else { 100 }));
            t
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    for route in DECISION_ROUTES {
        // Headers only: the answer must come without the body.
        let mut s = std::net::TcpStream::connect(r.addr).unwrap();
        s.write_all(head(route, 1000, "application/json").as_bytes())
            .unwrap();
        let t = Instant::now();
        let (status, v) = answer_of(&mut s);
        assert_eq!(status, 429, "{route}: {v}");
        assert_eq!(v["detail"]["error_type"], "rate_limit_error", "{route}");
        assert!(t.elapsed() < Duration::from_secs(1), "{route}");
    }
    assert_eq!(
        metric(&r, "kev_queue_rejected_total"),
        DECISION_ROUTES.len() as f64
    );
    // What was accepted is answered.
    for t in held {
        assert_eq!(t.join().unwrap(), 200);
    }
}

#[test]
fn a_multipart_body_gets_415_on_every_decision_route() {
    let r = start(ServerConfig::default(), Arc::new(Stub::new(Duration::ZERO)));
    for route in DECISION_ROUTES {
        let (status, resp) = send(
            agent()
                .post(&r.url(route))
                .set("content-type", "multipart/form-data; boundary=x"),
            &route_body(route, 10, 2),
        );
        let v = json_of(resp);
        assert_eq!(status, 415, "{route}: {v}");
        assert!(
            v["detail"]["message"]
                .as_str()
                .unwrap()
                .contains("multipart"),
            "{route}: {v}"
        );
    }
}

/// The parts of a fan-out, left to run `tokens` tokens each, and what stops them: the client hanging up, or the
/// request timeout (1 s).
fn fan_out_stops(route: &str, parts: usize, hang_up: bool) {
    let config = ServerConfig {
        pass_tokens: 64,
        request_timeout: Duration::from_secs(if hang_up { 300 } else { 1 }),
        ..ServerConfig::default()
    };
    // Parts of 5,000 tokens at 1 ms a token: seconds of work each, in 64-token pieces.
    let stub = Arc::new(Stub::new(Duration::from_millis(1)));
    let r = start(config, Arc::clone(&stub));
    let b = route_body(route, 5000, parts);
    let mut s = std::net::TcpStream::connect(r.addr).unwrap();
    s.write_all(head(route, b.len(), "application/json").as_bytes())
        .unwrap();
    s.write_all(&b).unwrap();
    if hang_up {
        std::thread::sleep(Duration::from_millis(500));
        s.shutdown(std::net::Shutdown::Both).unwrap();
        drop(s);
    } else {
        let t = Instant::now();
        let (status, v) = answer_of(&mut s);
        assert_eq!(status, 408, "{route}: {v}");
        assert_eq!(v["detail"]["error_type"], "timeout_error");
        assert!(t.elapsed() < Duration::from_millis(2500), "{route}");
    }
    // The pieces in flight finish (a lane piece at the lowest OS priority may take long to on a loaded
    // machine), then nothing more runs: wait for the count to hold still for 600 ms. Parts that kept
    // going would run all their 5,000 tokens (caught below) or keep it moving to the deadline.
    let t = Instant::now();
    let mut ran = stub.tokens_run.load(Ordering::SeqCst);
    loop {
        std::thread::sleep(Duration::from_millis(600));
        let now = stub.tokens_run.load(Ordering::SeqCst);
        if now == ran {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "{route}: parts kept running after the client was gone ({now} tokens)"
        );
        ran = now;
    }
    assert!(ran > 0, "{route}: nothing ran");
    assert!(ran < parts * 2000, "{route}: {ran} tokens ran");
    assert_eq!(stub.runs.load(Ordering::SeqCst), 0, "{route}");
    // Every part counts, started or still waiting behind its siblings. (The counter is the process's: each
    // case here cancels more parts than the one before, so the figure read is this server's own.)
    let t = Instant::now();
    while metric(&r, "kev_engine_cancelled_total") < parts as f64
        && t.elapsed() < Duration::from_secs(10)
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        metric(&r, "kev_engine_cancelled_total"),
        parts as f64,
        "{route}"
    );
}

#[test]
fn a_hang_up_or_a_timeout_stops_every_part_of_a_fan_out_at_its_next_pass() {
    fan_out_stops("/v1/systemone/permute", 4, true);
    fan_out_stops("/v1/systemone/separate", 5, true);
    fan_out_stops("/v1/systemone/permute", 6, false);
    fan_out_stops("/v1/systemone/separate", 7, false);
    fan_out_stops("/v1/systemone/batch", 8, true);
    fan_out_stops("/v1/systemone/batch", 9, false);
}

#[test]
fn a_fan_out_takes_one_queue_slot_whatever_its_parts() {
    // Four slots; a separate of 100 questions (the old way, one slot a part, was a 429 on an idle server:
    // a retry could never succeed) and a permute of 64 orders are answered.
    let config = ServerConfig {
        queue_depth: 4,
        ..ServerConfig::default()
    };
    let stub = Arc::new(Stub::new(Duration::ZERO));
    let r = start(config, Arc::clone(&stub));
    let (status, resp) = send(
        agent()
            .post(&r.url("/v1/systemone/separate"))
            .set("content-type", "application/json"),
        &route_body("/v1/systemone/separate", 10, 100),
    );
    let v = json_of(resp);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["answers"].as_object().unwrap().len(), 100);
    let (status, resp) = send(
        agent()
            .post(&r.url("/v1/systemone/permute"))
            .set("content-type", "application/json"),
        &route_body("/v1/systemone/permute", 10, 64),
    );
    let v = json_of(resp);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["runs"].as_array().unwrap().len(), 64);
    assert_eq!(stub.runs.load(Ordering::SeqCst), 164);
}

#[test]
fn a_declared_length_over_the_limit_is_413_at_once_on_every_decision_route() {
    let r = start(ServerConfig::default(), Arc::new(Stub::new(Duration::ZERO)));
    for route in DECISION_ROUTES {
        let mut s = std::net::TcpStream::connect(r.addr).unwrap();
        // 10^18 bytes announced, none sent.
        s.write_all(head(route, 1_000_000_000_000_000_000, "application/json").as_bytes())
            .unwrap();
        let t = Instant::now();
        let (status, v) = answer_of(&mut s);
        assert_eq!(status, 413, "{route}: {v}");
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "{route}: {:?}",
            t.elapsed()
        );
    }
    // Nothing was held: a normal request is answered.
    let (status, _) = send(
        agent()
            .post(&r.url("/v1/systemone"))
            .set("content-type", "application/json"),
        &route_body("/v1/systemone", 10, 1),
    );
    assert_eq!(status, 200);
}

/// SIGTERM with a client that never finishes its body: the drain ends at `drain_timeout`, not at the body
/// timeout, and a request that arrives during the drain is answered 503 `unavailable_error` (not refused at TCP).
#[test]
fn the_drain_has_a_deadline_and_answers_new_requests_503() {
    let config = ServerConfig {
        drain_timeout: Duration::from_millis(1500),
        body_read_timeout: Duration::from_secs(60),
        min_body_rate: 0,
        ..ServerConfig::default()
    };
    let r = start(config, Arc::new(Stub::new(Duration::ZERO)));
    let addr = r.addr;
    let mut slow = std::net::TcpStream::connect(addr).unwrap();
    slow.write_all(head("/v1/systemone", 100, "application/json").as_bytes())
        .unwrap();
    slow.write_all(b"{\"state\":").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    let stopper = std::thread::spawn(move || r.stop());
    std::thread::sleep(Duration::from_millis(300));
    let body = br#"{"state":"x","questions":{"q":{"type":"noul"}}}"#;
    let mut late =
        std::net::TcpStream::connect(addr).expect("a connection during the drain is accepted");
    late.write_all(head("/v1/systemone", body.len(), "application/json").as_bytes())
        .unwrap();
    late.write_all(body).unwrap();
    let (status, v) = answer_of(&mut late);
    assert_eq!(status, 503, "{v}");
    assert_eq!(v["detail"]["error_type"], "unavailable_error");
    stopper.join().unwrap().unwrap();
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(1200) && took < Duration::from_secs(6),
        "the drain took {took:?} (deadline 1.5 s, body timeout 60 s)"
    );
    drop(slow);
}

/// `metrics_key` guards `/metrics` (403 without a key, 401 with another); with it, the page has the
/// process's memory gauges.
#[test]
fn a_metrics_key_guards_metrics_and_the_page_reports_memory() {
    let config = ServerConfig {
        metrics_key: Some("scrape-me".into()),
        ..ServerConfig::default()
    };
    let r = start(config, Arc::new(Stub::new(Duration::ZERO)));
    let (st, _) = send(agent().get(&r.url("/metrics")), b"");
    assert_eq!(st, 403);
    let (st, _) = send(
        agent()
            .get(&r.url("/metrics"))
            .set("authorization", "Bearer nope"),
        b"",
    );
    assert_eq!(st, 401);
    let (st, resp) = send(
        agent()
            .get(&r.url("/metrics"))
            .set("authorization", "Bearer scrape-me"),
        b"",
    );
    assert_eq!(st, 200);
    let text = resp.into_string().unwrap();
    let rss = text
        .lines()
        .find_map(|l| l.strip_prefix("kev_process_resident_bytes "))
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no RSS gauge in {text}"));
    assert!(rss > 1e6, "{rss}");
    // The open routes stay open.
    let (st, _) = send(agent().get(&r.url("/health")), b"");
    assert_eq!(st, 200);
}

/// `--queue-depth` clients that send their headers and dribble their bodies do not hold the queue: the rate
/// floor answers them 408 within about `body_rate_window`, and a normal request then gets its answer, not 429.
#[test]
fn dribbled_bodies_are_cut_by_the_rate_floor_and_free_the_queue() {
    let config = ServerConfig {
        queue_depth: 4,
        body_read_timeout: Duration::from_secs(30),
        body_rate_window: Duration::from_millis(500),
        min_body_rate: 1024,
        ..ServerConfig::default()
    };
    let r = start(config, Arc::new(Stub::new(Duration::ZERO)));
    let t = Instant::now();
    let mut slow: Vec<_> = (0..4)
        .map(|_| {
            let mut s = std::net::TcpStream::connect(r.addr).unwrap();
            s.write_all(head("/v1/systemone", 10_000, "application/json").as_bytes())
                .unwrap();
            s.write_all(b"{").unwrap();
            s
        })
        .collect();
    // While they dribble (queue-depth of them), a normal request neither waits nor gets 429: a body
    // still arriving holds no queue slot.
    std::thread::sleep(Duration::from_millis(100));
    let body = br#"{"state":"x","questions":{"q":{"type":"noul"}}}"#;
    let t_normal = Instant::now();
    let (status, _) = send(agent().post(&r.url("/v1/systemone")), body);
    assert_eq!(status, 200);
    assert!(
        t_normal.elapsed() < Duration::from_secs(2),
        "a normal request beside the dribblers took {:?}",
        t_normal.elapsed()
    );
    for s in &mut slow {
        let (status, v) = answer_of(s);
        assert_eq!(status, 408, "{v}");
        assert_eq!(v["detail"]["error_type"], "timeout_error");
    }
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "the dribblers held on for {:?}",
        t.elapsed()
    );
    let (status, _) = send(agent().post(&r.url("/v1/systemone")), body);
    assert_eq!(status, 200);
}
