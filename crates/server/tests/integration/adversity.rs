//! Serving under adversity (issue 15) with stand-in deciders whose work is measured in tokens and time:
//! overload sheds with both 429 and 529 and answers everything it accepted; a request waiting behind a
//! busy engine gets its 529 at its deadline, not when the engine is free; long work advances in pieces
//! between short requests; a request whose time runs out stops between pieces; header semantics.

use crate::support;

use std::io::{Read, Write};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use kev_server::{LongLane, ServerConfig};
use serde_json::{Value, json};
use support::{Running, Stub, agent, json_of, send};

/// A ready server over the stand-in, whose work is measured in tokens, each costing its `per_token` of sleep.
fn start(config: ServerConfig, stub: Arc<Stub>) -> Running {
    support::start_ready(config, stub)
}

fn body(model: &str, tokens: usize, whole: bool) -> Vec<u8> {
    body_unit(model, tokens, whole, 64)
}

fn body_unit(model: &str, tokens: usize, whole: bool, unit: usize) -> Vec<u8> {
    json!({"model": model, "state": "x", "tokens": tokens, "whole": whole, "unit": unit,
           "questions": {format!("id-{model}"): {"type": "noul"}}})
    .to_string()
    .into_bytes()
}

fn post(r: &Running, b: &[u8]) -> (u16, ureq::Response) {
    send(
        agent()
            .post(&r.url("/v1/systemone"))
            .set("content-type", "application/json"),
        b,
    )
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

#[test]
fn overload_sheds_with_both_429_and_529_and_answers_everything_it_accepted() {
    let config = ServerConfig {
        queue_depth: 4,
        queue_deadline: Duration::from_millis(150),
        pass_tokens: 10, // one job per pass
        ..ServerConfig::default()
    };
    // Each job: one indivisible 400 ms pass.
    let stub = Arc::new(Stub::new(Duration::from_millis(40)));
    let r = start(config, Arc::clone(&stub));
    let n = 16; // 4 × the queue capacity
    let url = r.url("/v1/systemone");
    let barrier = Arc::new(std::sync::Barrier::new(n));
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let url = url.clone();
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                barrier.wait();
                let (status, resp) = send(
                    agent().post(&url).set("content-type", "application/json"),
                    &body(&format!("m{i}"), 10, true),
                );
                let retry = resp.header("retry-after").map(str::to_string);
                (i, status, retry, json_of(resp))
            })
        })
        .collect();
    let mut by_status = std::collections::BTreeMap::<u16, usize>::new();
    for h in handles {
        let (i, status, retry, v) = h.join().unwrap();
        *by_status.entry(status).or_default() += 1;
        match status {
            200 => assert_eq!(v["model"], format!("m{i}")),
            429 => {
                assert!(retry.is_some(), "429 without Retry-After");
                assert_eq!(v["detail"]["error_type"], "rate_limit_error");
            }
            529 => {
                assert!(retry.is_some(), "529 without Retry-After");
                assert_eq!(v["detail"]["error_type"], "overloaded_error");
            }
            other => panic!("status {other}: {v}"),
        }
    }
    let ok = by_status.get(&200).copied().unwrap_or(0);
    let full = by_status.get(&429).copied().unwrap_or(0);
    let late = by_status.get(&529).copied().unwrap_or(0);
    assert!(ok >= 1, "{by_status:?}");
    assert!(
        full >= 1,
        "no 429: the queue is not bounded ({by_status:?})"
    );
    assert!(
        late >= 1,
        "no 529: the deadline is not applied ({by_status:?})"
    );
    // Accepted = answered 200 or 529; every 200 ran exactly once, nothing shed ran.
    assert_eq!(ok + full + late, n);
    assert_eq!(stub.runs.load(Ordering::SeqCst), ok);
    assert_eq!(metric(&r, "kev_queue_expired_total") as usize, late);
    assert_eq!(metric(&r, "kev_queue_rejected_total") as usize, full);
    assert_eq!(post(&r, &body("after", 10, true)).0, 200);
}

#[test]
fn a_request_behind_a_busy_engine_gets_529_at_its_deadline() {
    let config = ServerConfig {
        queue_deadline: Duration::from_millis(300),
        pass_tokens: 100,
        long_in_flight: 1,
        ..ServerConfig::default()
    };
    // The first request is one indivisible 3 s pass (the engine is busy); the second cannot start
    // beside it (a second long request) and must get 529 at 300 ms, not after 3 s.
    let stub = Arc::new(Stub::new(Duration::from_millis(1)));
    let r = start(config, Arc::clone(&stub));
    let url = r.url("/v1/systemone");
    let busy = std::thread::spawn(move || {
        send(
            agent().post(&url).set("content-type", "application/json"),
            &body("busy", 3000, true),
        )
        .0
    });
    std::thread::sleep(Duration::from_millis(200));
    let t = Instant::now();
    let (status, resp) = post(&r, &body("late", 3000, true));
    let took = t.elapsed();
    assert!(resp.header("retry-after").is_some());
    assert_eq!(status, 529, "{}", json_of(resp));
    assert!(
        took < Duration::from_millis(1500),
        "529 after {took:?} (deadline 300 ms, engine busy for 3 s)"
    );
    // While the engine is busy with a long request, /ready says how loaded it is.
    let (_, ready) = send(agent().get(&r.url("/ready")), b"");
    let ready = json_of(ready);
    assert!(ready["running"].as_u64().is_some(), "{ready}");
    assert_eq!(busy.join().unwrap(), 200);
    assert_eq!(metric(&r, "kev_queue_expired_total"), 1.0);
}

#[test]
fn long_work_advances_in_pieces_between_short_requests() {
    let config = ServerConfig {
        pass_tokens: 512,
        ..ServerConfig::default()
    };
    // 1 ms per token: the long request is 8 s of work, a short one 10 ms.
    let stub = Arc::new(Stub::new(Duration::from_millis(1)));
    let r = start(config, Arc::clone(&stub));
    let url = r.url("/v1/systemone");
    let idle: Vec<Duration> = (0..10)
        .map(|i| {
            let t = Instant::now();
            assert_eq!(post(&r, &body(&format!("idle{i}"), 10, false)).0, 200);
            t.elapsed()
        })
        .collect();
    let long_started = Instant::now();
    let long = std::thread::spawn(move || {
        let (s, _) = send(
            agent().post(&url).set("content-type", "application/json"),
            &body_unit("long", 8000, false, 8),
        );
        (s, long_started.elapsed())
    });
    std::thread::sleep(Duration::from_millis(100));
    let loaded: Vec<Duration> = (0..20)
        .map(|i| {
            let t = Instant::now();
            assert_eq!(post(&r, &body(&format!("short{i}"), 10, false)).0, 200);
            t.elapsed()
        })
        .collect();
    let shorts_done = long_started.elapsed();
    let (status, long_took) = long.join().unwrap();
    assert_eq!(status, 200);
    assert!(
        long_took > shorts_done,
        "the long request finished before the short ones: the test did not overlap"
    );
    let worst_idle = idle.iter().max().unwrap();
    let worst_loaded = loaded.iter().max().unwrap();
    // Without pieces a short request would wait for up to a 512-token (0.5 s) pass; with time-sized
    // pieces it waits about one short pass.
    assert!(
        *worst_loaded <= *worst_idle * 3 + Duration::from_millis(30),
        "short requests beside a long one: worst {worst_loaded:?}, idle worst {worst_idle:?}"
    );
    assert!(metric(&r, "kev_engine_partial_pieces_total") > 5.0);
    // The long request shared no pass with short work except when it was starved.
    let passes = stub.passes.lock().unwrap();
    assert!(passes.iter().any(|p| p == &["long".to_string()]));
}

#[test]
fn short_requests_stay_fast_through_the_end_of_a_long_request() {
    // The long request's last `pass_tokens` fit one pass's budget: they must still go in time-sized
    // pieces (a whole 512-token pass is 0.5 s here, 50 × a short request's pass).
    let config = ServerConfig {
        pass_tokens: 512,
        ..ServerConfig::default()
    };
    let stub = Arc::new(Stub::new(Duration::from_millis(1)));
    let r = start(config, Arc::clone(&stub));
    let url = r.url("/v1/systemone");
    let idle: Vec<Duration> = (0..10)
        .map(|i| {
            let t = Instant::now();
            assert_eq!(post(&r, &body(&format!("idle{i}"), 10, false)).0, 200);
            t.elapsed()
        })
        .collect();
    let long = std::thread::spawn(move || {
        send(
            agent().post(&url).set("content-type", "application/json"),
            &body_unit("long", 1500, false, 8),
        )
        .0
    });
    // Short requests from start to finish of the long one, its tail included: one every 20 ms or so, so that
    // the lane runs between them (a stream that saturates the engine makes short requests step aside for the
    // lane's share now and then: `adversity3::long_work_gets_its_share…`).
    let mut loaded = Vec::new();
    let mut i = 0;
    while !long.is_finished() {
        let t = Instant::now();
        assert_eq!(post(&r, &body(&format!("short{i}"), 10, false)).0, 200);
        loaded.push(t.elapsed());
        i += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(long.join().unwrap(), 200);
    assert!(loaded.len() > 10, "only {} short requests", loaded.len());
    let worst_idle = idle.iter().max().unwrap();
    let worst_loaded = loaded.iter().max().unwrap();
    assert!(
        *worst_loaded <= *worst_idle * 3 + Duration::from_millis(30),
        "short requests through a long one: worst {worst_loaded:?}, idle worst {worst_idle:?}"
    );
    // The long request advanced in many pieces.
    let passes = stub.passes.lock().unwrap();
    assert!(
        passes
            .iter()
            .filter(|p| p.contains(&"long".to_string()))
            .count()
            > 5
    );
}

#[test]
fn a_request_past_its_timeout_is_stopped_between_pieces() {
    let config = ServerConfig {
        pass_tokens: 64,
        request_timeout: Duration::from_secs(1),
        ..ServerConfig::default()
    };
    // 5,000 tokens at 1 ms: 5 s of work in 64-token pieces; the timeout is 1 s.
    let stub = Arc::new(Stub::new(Duration::from_millis(1)));
    let r = start(config, Arc::clone(&stub));
    let t = Instant::now();
    let (status, resp) = post(&r, &body("slow", 5000, false));
    assert_eq!(status, 408);
    assert_eq!(json_of(resp)["detail"]["error_type"], "timeout_error");
    assert!(t.elapsed() < Duration::from_millis(2500));
    std::thread::sleep(Duration::from_millis(300));
    let ran = stub.tokens_run.load(Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        stub.tokens_run.load(Ordering::SeqCst),
        ran,
        "the request kept running after its timeout"
    );
    assert!(ran < 2500, "{ran} tokens ran");
    assert_eq!(metric(&r, "kev_engine_cancelled_total"), 1.0);
}

#[test]
fn a_client_that_hangs_up_stops_its_remaining_pieces() {
    let config = ServerConfig {
        pass_tokens: 64,
        ..ServerConfig::default()
    };
    let stub = Arc::new(Stub::new(Duration::from_millis(1)));
    let r = start(config, Arc::clone(&stub));
    let b = body("gone", 5000, false);
    let mut s = std::net::TcpStream::connect(r.addr).unwrap();
    let head = format!(
        "POST /v1/systemone HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        b.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(&b).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    s.shutdown(std::net::Shutdown::Both).unwrap();
    drop(s);
    std::thread::sleep(Duration::from_millis(300));
    let ran = stub.tokens_run.load(Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(stub.tokens_run.load(Ordering::SeqCst), ran);
    assert!(ran < 2000, "{ran}");
    assert_eq!(stub.runs.load(Ordering::SeqCst), 0);
}

#[test]
fn content_codings_are_case_insensitive_and_stack_in_order() {
    let stub = Arc::new(Stub::new(Duration::ZERO));
    let r = start(ServerConfig::default(), stub);
    let plain = body("enc", 10, false);
    let zstd = zstd::encode_all(&plain[..], 3).unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&plain).unwrap();
    let gzip = gz.finish().unwrap();
    // Applied gzip then zstd: `Content-Encoding: gzip, zstd`.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&plain).unwrap();
    let stacked = zstd::encode_all(&gz.finish().unwrap()[..], 3).unwrap();
    let req = |enc: &str| {
        agent()
            .post(&r.url("/v1/systemone"))
            .set("content-type", "application/json")
            .set("content-encoding", enc)
    };
    for (enc, data) in [
        ("ZSTD", &zstd),
        ("Zstd", &zstd),
        ("GZip", &gzip),
        ("x-gzip", &gzip),
        ("gzip, zstd", &stacked),
        ("identity, GZIP , Zstd", &stacked),
        ("Identity", &plain),
    ] {
        let (status, resp) = send(req(enc), data);
        assert_eq!(status, 200, "{enc}: {}", json_of(resp));
    }
    // The wrong order is not valid data for the last coding.
    let (status, _) = send(req("zstd, gzip"), &stacked);
    assert_eq!(status, 400);
    let (status, resp) = send(req("gzip, br"), &plain);
    assert_eq!(status, 415);
    let v = json_of(resp);
    assert!(
        v["detail"]["message"].as_str().unwrap().contains("\"br\""),
        "{v}"
    );
}

#[test]
fn the_auth_scheme_is_case_insensitive() {
    let stub = Arc::new(Stub::new(Duration::ZERO));
    let config = ServerConfig {
        api_key: Some("s3cret".into()),
        ..ServerConfig::default()
    };
    let r = start(config, stub);
    let with = |auth: &str| {
        send(
            agent()
                .post(&r.url("/v1/systemone"))
                .set("content-type", "application/json")
                .set("authorization", auth),
            &body("auth", 10, false),
        )
        .0
    };
    for ok in [
        "Bearer s3cret",
        "bearer s3cret",
        "BEARER s3cret",
        "bEaReR   s3cret",
    ] {
        assert_eq!(with(ok), 200, "{ok}");
    }
    assert_eq!(with("bearer wrong"), 401);
    assert_eq!(with("Basic s3cret"), 403);
    assert_eq!(with("Bearers3cret"), 403);
    // The key itself stays case-sensitive.
    assert_eq!(with("Bearer S3CRET"), 401);
}

#[test]
fn slow_clients_are_closed_and_connections_capped() {
    let stub = Arc::new(Stub::new(Duration::ZERO));
    let config = ServerConfig {
        header_read_timeout: Duration::from_millis(500),
        max_connections: 4,
        // Every connection here comes from one address: the cap tested is the total.
        max_connections_per_ip: Some(4),
        ..ServerConfig::default()
    };
    let r = start(config, stub);
    // A slowloris: half a request line, then nothing. The server closes it after the header timeout.
    let mut s = std::net::TcpStream::connect(r.addr).unwrap();
    s.write_all(b"POST /v1/systemone HTTP/1.1\r\nhost: x\r\n")
        .unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let t = Instant::now();
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "slow client kept open {:?}",
        t.elapsed()
    );
    // Idle keep-alive connections are closed after the same timeout.
    let mut idle = std::net::TcpStream::connect(r.addr).unwrap();
    idle.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        .unwrap();
    idle.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let t = Instant::now();
    let mut all = Vec::new();
    let _ = idle.read_to_end(&mut all);
    assert!(String::from_utf8_lossy(&all).starts_with("HTTP/1.1 200"));
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "idle kept {:?}",
        t.elapsed()
    );
    // Four open connections hold every slot: a fifth waits until one closes.
    let held: Vec<_> = (0..4)
        .map(|_| std::net::TcpStream::connect(r.addr).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(100));
    let t = Instant::now();
    let fifth = agent().get(&r.url("/health")).call();
    assert!(fifth.is_ok());
    // It was served only once the held connections timed out (500 ms header timeout).
    assert!(
        t.elapsed() >= Duration::from_millis(200),
        "{:?}",
        t.elapsed()
    );
    drop(held);
}

/// Send raw bytes, read the whole answer (the connection is closed after it): status and body.
fn raw(r: &Running, request: &[u8]) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(r.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request).unwrap();
    let mut all = Vec::new();
    let _ = s.read_to_end(&mut all);
    let text = String::from_utf8_lossy(&all).into_owned();
    let status = text
        .get(9..12)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {text:?}"));
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    (status, body)
}

#[test]
fn oversized_heads_get_json_answers_below_hypers_own_limits() {
    use kev_server::head::{HYPER_MAX_HEADERS, MAX_HEAD_BYTES, MAX_HEADERS, MAX_URI_BYTES};
    let r = start(ServerConfig::default(), Arc::new(Stub::new(Duration::ZERO)));
    let detail = |body: &str| -> Value {
        let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body:?}"));
        v["detail"].clone()
    };
    // Too many header fields (but fewer than hyper's own limit).
    let mut req = String::from("GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n");
    for i in 0..MAX_HEADERS + 20 {
        req.push_str(&format!("x-h{i}: v\r\n"));
    }
    req.push_str("\r\n");
    let (status, body) = raw(&r, req.as_bytes());
    assert_eq!(status, 431, "{body}");
    assert_eq!(detail(&body)["error_type"], "invalid_request_error");
    assert!(
        detail(&body)["message"]
            .as_str()
            .unwrap()
            .contains("header fields")
    );
    // One huge header (over our byte limit, under hyper's ~400 KB buffer).
    let req = format!(
        "GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\nx-big: {}\r\n\r\n",
        "a".repeat(MAX_HEAD_BYTES + 1000)
    );
    let (status, body) = raw(&r, req.as_bytes());
    assert_eq!(status, 431, "{body}");
    assert!(detail(&body)["message"].as_str().unwrap().contains("bytes"));
    // A long request target.
    let req = format!(
        "GET /health?{} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        "q".repeat(MAX_URI_BYTES + 10)
    );
    let (status, body) = raw(&r, req.as_bytes());
    assert_eq!(status, 414, "{body}");
    assert_eq!(detail(&body)["error_type"], "invalid_request_error");
    // Under every limit: served.
    let (status, _) = raw(
        &r,
        b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    );
    assert_eq!(status, 200);
    // Past hyper's own limits hyper answers itself, with an empty body (no hook in hyper 1): documented.
    let mut req = String::from("GET /health HTTP/1.1\r\nhost: x\r\n");
    for i in 0..HYPER_MAX_HEADERS + 1 {
        req.push_str(&format!("x-h{i}: v\r\n"));
    }
    req.push_str("\r\n");
    let (status, body) = raw(&r, req.as_bytes());
    assert_eq!(status, 431);
    assert_eq!(body, "");
}

/// Short requests' worst latency while a long request (pieces of `unit` tokens at 1 ms each) is in flight.
fn worst_short_beside_long(long_lane: LongLane, unit: usize) -> (Duration, Duration) {
    let config = ServerConfig {
        pass_tokens: 512,
        long_lane,
        ..ServerConfig::default()
    };
    let stub = Arc::new(Stub::new(Duration::from_millis(1)));
    let r = start(config, Arc::clone(&stub));
    let url = r.url("/v1/systemone");
    let long = std::thread::spawn(move || {
        let t = Instant::now();
        let (s, _) = send(
            agent().post(&url).set("content-type", "application/json"),
            &body_unit("long", 4 * unit, false, unit),
        );
        (s, t.elapsed())
    });
    std::thread::sleep(Duration::from_millis(100));
    let mut worst = Duration::ZERO;
    for i in 0..15 {
        let t = Instant::now();
        assert_eq!(post(&r, &body(&format!("short{i}"), 10, false)).0, 200);
        worst = worst.max(t.elapsed());
        std::thread::sleep(Duration::from_millis(20));
    }
    let (status, long_took) = long.join().unwrap();
    assert_eq!(status, 200);
    (worst, long_took)
}

#[test]
fn with_the_long_lane_a_short_request_never_waits_for_a_long_piece() {
    // Every piece of the long request is one indivisible 400 ms unit (a piece deep in a long state).
    let (lane, long_took) = worst_short_beside_long(LongLane::On, 400);
    assert!(
        long_took > Duration::from_millis(1200),
        "the long request ran in {long_took:?}: the test did not overlap"
    );
    assert!(
        lane < Duration::from_millis(150),
        "a short request beside a long lane piece took {lane:?}"
    );
    // Without the lane a short request arriving during a piece waits for its end.
    let (turns, _) = worst_short_beside_long(LongLane::Off, 400);
    assert!(
        turns > Duration::from_millis(200),
        "without the lane the worst short request took only {turns:?}: the test cannot tell"
    );
}

/// A server whose long lane has `share`, and one long request of a single 5 s unit on the lane; 300 ms in,
/// short requests of `short_ms` one after another. Returns how long each took.
fn shorts_beside_a_lane_piece(share: f64, short_ms: usize, n: usize) -> Vec<Duration> {
    let config = ServerConfig {
        pass_tokens: 512,
        long_lane_share: share,
        ..ServerConfig::default()
    };
    let stub = Arc::new(Stub::new(Duration::from_millis(1)));
    let r = start(config, Arc::clone(&stub));
    let url = r.url("/v1/systemone");
    let long = std::thread::spawn(move || {
        send(
            agent().post(&url).set("content-type", "application/json"),
            &body_unit("long", 5000, false, 5000),
        )
        .0
    });
    std::thread::sleep(Duration::from_millis(300));
    let took = (0..n)
        .map(|i| {
            let t = Instant::now();
            assert_eq!(post(&r, &body(&format!("s{i}"), short_ms, true)).0, 200);
            t.elapsed()
        })
        .collect();
    drop(r);
    let _ = long.join();
    took
}

#[test]
fn short_passes_step_aside_for_the_lanes_share_then_go_on() {
    // Share 0.2: 75 ms of lane time is owed for each 300 ms short pass beside the piece (less the moment
    // between two requests, when the lane runs): a quantum (250 ms) after four. The first four short
    // requests run at once; the fifth waits about that hold, not for the piece to be back (5 s); the sixth
    // runs at once again.
    let took = shorts_beside_a_lane_piece(0.2, 300, 6);
    for (i, t) in took.iter().enumerate().take(4) {
        assert!(
            *t < Duration::from_millis(500),
            "short {i} took {t:?}: {took:?}"
        );
    }
    assert!(
        took[4] > Duration::from_millis(480) && took[4] < Duration::from_millis(1500),
        "the fifth short request should wait one hold: {took:?}"
    );
    assert!(took[5] < Duration::from_millis(500), "{took:?}");
    // Share 0.5: 300 ms owed after each short pass, a hold before the next.
    let took = shorts_beside_a_lane_piece(0.5, 300, 2);
    assert!(
        took[1] > Duration::from_millis(480),
        "at share 0.5 the second short request waits for the lane: {took:?}"
    );
}

#[test]
fn short_requests_with_a_short_deadline_start_while_a_long_piece_runs() {
    // After a quiet spell a long state's pieces may be long (here one indivisible 1.2 s unit); with a 500 ms
    // queue deadline, 30 short requests arriving together during it must all start (the lane runs the long
    // piece beside them), not all get 529. Their few milliseconds of passes are far from a starved piece's
    // `solo_piece` (250 ms here, half the deadline), however late into the piece a loaded machine lets them
    // arrive.
    let config = ServerConfig {
        pass_tokens: 512,
        queue_deadline: Duration::from_millis(500),
        ..ServerConfig::default()
    };
    let stub = Arc::new(Stub::new(Duration::from_millis(1)));
    let r = start(config, Arc::clone(&stub));
    let url = r.url("/v1/systemone");
    let long = std::thread::spawn(move || {
        send(
            agent().post(&url).set("content-type", "application/json"),
            &body_unit("long", 2400, false, 1200),
        )
        .0
    });
    std::thread::sleep(Duration::from_millis(200));
    let shorts: Vec<_> = (0..30)
        .map(|i| {
            let url = r.url("/v1/systemone");
            std::thread::spawn(move || {
                send(
                    agent().post(&url).set("content-type", "application/json"),
                    &body(&format!("short{i}"), 2, false),
                )
                .0
            })
        })
        .collect();
    let statuses: Vec<u16> = shorts.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(
        statuses.iter().all(|&s| s == 200),
        "short requests beside a long piece: {statuses:?}"
    );
    assert_eq!(long.join().unwrap(), 200);
}

/// Clients still sending their bodies hold a body-read permit each (twice the queue depth): one more is
/// refused with 429 before its body is read, counted in both 429 counters; once the slow bodies arrive,
/// they are answered and new requests are taken again.
#[test]
fn slow_bodies_hold_the_read_permits_and_the_next_request_gets_429() {
    // No rate floor: with it the half-sent bodies are cut (408) a second after they start, and on a busy
    // machine the third request may come later than that.
    let config = ServerConfig {
        queue_depth: 1,
        min_body_rate: 0,
        ..ServerConfig::default()
    };
    let r = start(config, Arc::new(Stub::new(Duration::ZERO)));
    let full = body("slow", 10, true);
    let (head, tail) = full.split_at(full.len() / 2);
    // A request whose headers and half a body have arrived.
    let open_slow = || {
        let mut s = std::net::TcpStream::connect(r.addr).unwrap();
        write!(
            s,
            "POST /v1/systemone HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
             content-length: {}\r\n\r\n",
            full.len()
        )
        .unwrap();
        s.write_all(head).unwrap();
        s
    };
    // Whether the server has answered `s` already.
    let answered = |s: &std::net::TcpStream| {
        s.set_nonblocking(true).unwrap();
        let got = s.peek(&mut [0u8; 1]);
        s.set_nonblocking(false).unwrap();
        matches!(got, Ok(n) if n > 0)
    };
    // Two (2 × depth 1) of them.
    let mut slow: Vec<std::net::TcpStream> = (0..2).map(|_| open_slow()).collect();
    // The server takes the permits as it reads the heads; the third request's status tells when both are
    // held (until then it may be answered 200). A slow head read while such a third request held the one
    // queue slot was itself answered 429 and holds nothing: it is sent again.
    let start = Instant::now();
    let mut resent = 0.0;
    let (status, resp) = loop {
        let (status, resp) = post(&r, &body("third", 10, true));
        if status == 429 || start.elapsed() > Duration::from_secs(20) {
            break (status, resp);
        }
        for s in &mut slow {
            if answered(s) {
                *s = open_slow();
                resent += 1.0;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status, 429, "no 429 while every body-read permit is held");
    assert!(resp.header("retry-after").is_some());
    let v = json_of(resp);
    assert_eq!(v["detail"]["error_type"], "rate_limit_error", "{v}");
    let bodies = metric(&r, "kev_body_permits_rejected_total");
    assert!(bodies >= 1.0, "kev_body_permits_rejected_total {bodies}");
    // Every 429 is in the queue's total: the body-permit ones and any slow head's queue-full one.
    let all = metric(&r, "kev_queue_rejected_total");
    assert!(
        all >= bodies && all <= bodies + resent,
        "kev_queue_rejected_total {all}, body permits {bodies}, resent {resent}"
    );
    // The slow bodies finish and are answered; the server takes new requests again.
    for s in &mut slow {
        s.write_all(tail).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut got = [0u8; 12];
        s.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"HTTP/1.1 200", "{}", String::from_utf8_lossy(&got));
    }
    assert_eq!(post(&r, &body("after", 10, true)).0, 200);
}
