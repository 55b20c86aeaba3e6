//! HTTP behaviour of the server with stand-in deciders: every status of the error contract, auth on/off,
//! compressed bodies, request ids, readiness, overload and shutdown. Real answers are tested where the
//! engine glue is (kev-engine) and end to end in the CLI tests.

use crate::support;

use std::io::Write;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kev_server::ServerConfig;
use serde_json::Value;
use support::{Running, Stub, agent, json_of, send, start, wait_ready};

const BODY: &str = r#"{"model":"jev-latest","state":"hello","questions":{"q1":{"type":"noul"},"q2":{"type":"noul"}}}"#;

fn post(r: &Running) -> ureq::Request {
    agent()
        .post(&r.url("/v1/systemone"))
        .set("content-type", "application/json")
}

fn assert_error_type(v: &Value, error_type: &str) {
    assert_eq!(v["detail"]["error_type"], error_type, "{v}");
    assert!(v["detail"]["message"].is_string(), "{v}");
}

#[test]
fn answers_in_request_order_with_headers_and_usage() {
    let r = start(ServerConfig::default(), Arc::new(Stub::default()));
    wait_ready(&r);
    let (status, resp) = send(
        post(&r).set("x-typesafe-request-id", "abc-123"),
        BODY.as_bytes(),
    );
    assert_eq!(status, 200);
    assert_eq!(resp.header("x-typesafe-request-id"), Some("abc-123"));
    assert!(
        resp.header("server-timing")
            .unwrap()
            .starts_with("app;dur=")
    );
    let v = json_of(resp);
    assert_eq!(v["model"], "jev-latest");
    let ids: Vec<&String> = v["answers"].as_object().unwrap().keys().collect();
    assert_eq!(ids, ["q1", "q2"]);
    assert!(v["x_latency_ms"].is_number());
    // Without a client id, one is generated: 32 lowercase hex digits.
    let (_, resp) = send(post(&r), BODY.as_bytes());
    let id = resp.header("x-typesafe-request-id").unwrap().to_string();
    assert_eq!(id.len(), 32);
    assert!(
        id.chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
    );
}

#[test]
fn validation_errors_are_422_lists_and_never_5xx() {
    let r = start(ServerConfig::default(), Arc::new(Stub::default()));
    wait_ready(&r);
    for body in [&b"not json"[..], br#"{"state":"x"}"#] {
        let (status, resp) = send(post(&r), body);
        assert_eq!(status, 422);
        let v = json_of(resp);
        assert_eq!(v["detail"][0]["loc"][0], "body");
    }
}

#[test]
fn auth_on_guards_v1_routes_only() {
    let config = ServerConfig {
        api_key: Some("s3cret".into()),
        ..ServerConfig::default()
    };
    let r = start(config, Arc::new(Stub::default()));
    wait_ready(&r);
    let (status, resp) = send(post(&r), BODY.as_bytes());
    assert_eq!(status, 403);
    assert_eq!(resp.header("www-authenticate"), Some("Bearer"));
    assert_error_type(&json_of(resp), "authentication_error");
    let (status, resp) = send(
        post(&r).set("authorization", "Bearer wrong"),
        BODY.as_bytes(),
    );
    assert_eq!(status, 401);
    assert_error_type(&json_of(resp), "authentication_error");
    let (status, _) = send(
        post(&r).set("authorization", "Bearer s3cret"),
        BODY.as_bytes(),
    );
    assert_eq!(status, 200);
    // The scheme is case-insensitive (RFC 9110 §11.1), the key is not.
    let (status, _) = send(
        post(&r).set("authorization", "bearer s3cret"),
        BODY.as_bytes(),
    );
    assert_eq!(status, 200);
    let (status, _) = send(
        post(&r).set("authorization", "Bearer S3CRET"),
        BODY.as_bytes(),
    );
    assert_eq!(status, 401);
    let (status, _) = send(agent().get(&r.url("/v1/models")), b"");
    assert_eq!(status, 403);
    let (status, _) = send(
        agent()
            .get(&r.url("/v1/models"))
            .set("authorization", "Bearer s3cret"),
        b"",
    );
    assert_eq!(status, 200);
    for open in ["/health", "/metrics", "/openapi.json"] {
        let (status, _) = send(agent().get(&r.url(open)), b"");
        assert_eq!(status, 200, "{open}");
    }
}

#[test]
fn auth_off_accepts_any_bearer() {
    let r = start(ServerConfig::default(), Arc::new(Stub::default()));
    wait_ready(&r);
    let (status, _) = send(
        post(&r).set("authorization", "Bearer jevcompat-no-key"),
        BODY.as_bytes(),
    );
    assert_eq!(status, 200);
}

#[test]
fn compressed_bodies_and_encodings() {
    let r = start(ServerConfig::default(), Arc::new(Stub::default()));
    wait_ready(&r);
    let zstd_body = zstd::encode_all(BODY.as_bytes(), 3).unwrap();
    let (status, resp) = send(post(&r).set("content-encoding", "zstd"), &zstd_body);
    assert_eq!(status, 200);
    assert_eq!(json_of(resp)["model"], "jev-latest");
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(BODY.as_bytes()).unwrap();
    let (status, _) = send(
        post(&r).set("content-encoding", "gzip"),
        &gz.finish().unwrap(),
    );
    assert_eq!(status, 200);
    let (status, resp) = send(post(&r).set("content-encoding", "br"), BODY.as_bytes());
    assert_eq!(status, 415);
    assert_error_type(&json_of(resp), "invalid_request_error");
    let (status, resp) = send(
        post(&r).set("content-encoding", "zstd"),
        b"definitely not zstd",
    );
    assert!((400..500).contains(&status), "{status}");
    json_of(resp);
    let (status, resp) = send(
        agent()
            .post(&r.url("/v1/systemone"))
            .set("content-type", "multipart/form-data; boundary=x"),
        b"--x--",
    );
    assert_eq!(status, 415);
    assert_error_type(&json_of(resp), "invalid_request_error");
}

#[test]
fn body_limit_applies_after_decompression() {
    let config = ServerConfig {
        max_body: 4096,
        ..ServerConfig::default()
    };
    let r = start(config, Arc::new(Stub::default()));
    wait_ready(&r);
    let big = format!(
        r#"{{"state":"{}","questions":{{"q":{{"type":"noul"}}}}}}"#,
        "a".repeat(10_000)
    );
    let (status, resp) = send(post(&r), big.as_bytes());
    assert_eq!(status, 413);
    assert_error_type(&json_of(resp), "invalid_request_error");
    // Small on the wire, large once decompressed.
    let z = zstd::encode_all(big.as_bytes(), 19).unwrap();
    assert!(z.len() < 4096);
    let (status, resp) = send(post(&r).set("content-encoding", "zstd"), &z);
    assert_eq!(status, 413);
    assert_error_type(&json_of(resp), "invalid_request_error");
}

#[test]
fn unknown_routes_and_methods_are_json() {
    let r = start(ServerConfig::default(), Arc::new(Stub::default()));
    wait_ready(&r);
    let (status, resp) = send(agent().get(&r.url("/nope")), b"");
    assert_eq!(status, 404);
    assert_error_type(&json_of(resp), "not_found_error");
    let (status, resp) = send(agent().get(&r.url("/v1/systemone")), b"");
    assert_eq!(status, 405);
    assert_error_type(&json_of(resp), "invalid_request_error");
}

#[test]
fn models_lists_every_alias_with_the_card() {
    let config = ServerConfig {
        model_names: vec!["kev-latest".into(), "jev-latest".into(), "kev-4b".into()],
        ..ServerConfig::default()
    };
    let r = start(config, Arc::new(Stub::default()));
    wait_ready(&r);
    let (status, resp) = send(agent().get(&r.url("/v1/models")), b"");
    assert_eq!(status, 200);
    let v = json_of(resp);
    let names: Vec<&str> = v["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["kev-latest", "jev-latest", "kev-4b"]);
    assert_eq!(v["models"][2]["release_date"], "2026-10-01");
    assert_eq!(v["models"][0]["description"], "stub");
}

#[test]
fn not_ready_until_warm_up_succeeds() {
    let (tx, rx) = std::sync::mpsc::channel();
    let stub = Stub {
        hold_warm_up: Some(Mutex::new(rx)),
        ..Stub::default()
    };
    let r = start(ServerConfig::default(), Arc::new(stub));
    // Wait for the listener, then check readiness is off while warm-up is held.
    let mut ready_status = 0;
    for _ in 0..200 {
        if let Ok(resp) = agent().get(&r.url("/health")).call() {
            assert_eq!(resp.status(), 200);
            ready_status = send(agent().get(&r.url("/ready")), b"").0;
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(ready_status, 503);
    let (status, resp) = send(post(&r), BODY.as_bytes());
    assert_eq!(status, 503);
    assert!(resp.header("retry-after").is_some());
    tx.send(()).unwrap();
    wait_ready(&r);
    assert_eq!(send(post(&r), BODY.as_bytes()).0, 200);
}

#[test]
fn engine_panic_is_a_500_with_the_request_id_and_the_server_stays_up() {
    let stub = Stub {
        panic_on: Some("boom".into()),
        ..Stub::default()
    };
    let r = start(ServerConfig::default(), Arc::new(stub));
    wait_ready(&r);
    let body = r#"{"model":"boom","state":"x","questions":{"q":{"type":"noul"}}}"#;
    let (status, resp) = send(
        post(&r).set("x-typesafe-request-id", "req-77"),
        body.as_bytes(),
    );
    assert_eq!(status, 500);
    let v = json_of(resp);
    assert_error_type(&v, "api_error");
    let message = v["detail"]["message"].as_str().unwrap();
    assert!(
        message.contains("req-77"),
        "the 500 names the request id: {v}"
    );
    assert_eq!(send(post(&r), BODY.as_bytes()).0, 200);
    assert_eq!(send(agent().get(&r.url("/ready")), b"").0, 200);
}

#[test]
fn overload_answers_200_429_or_529_and_loses_nothing() {
    let config = ServerConfig {
        queue_depth: 4,
        queue_deadline: Duration::from_millis(400),
        pass_tokens: 20,
        ..ServerConfig::default()
    };
    let stub = Arc::new(Stub {
        delay: Duration::from_millis(60),
        ..Stub::default()
    });
    let r = start(config, Arc::clone(&stub));
    wait_ready(&r);
    let n = 16; // 4 × the queue capacity
    let url = r.url("/v1/systemone");
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let url = url.clone();
            std::thread::spawn(move || {
                let body = format!(
                    r#"{{"model":"m{i}","state":"x","questions":{{"id{i}":{{"type":"noul"}}}}}}"#
                );
                let (status, resp) = send(
                    agent().post(&url).set("content-type", "application/json"),
                    body.as_bytes(),
                );
                let retry = resp.header("retry-after").map(str::to_string);
                (i, status, retry, json_of(resp))
            })
        })
        .collect();
    let mut ok = 0;
    let mut shed = 0;
    for h in handles {
        let (i, status, retry, v) = h.join().unwrap();
        match status {
            200 => {
                ok += 1;
                assert_eq!(v["model"], format!("m{i}"));
                assert!(v["answers"].get(format!("id{i}")).is_some(), "{v}");
            }
            429 | 529 => {
                shed += 1;
                assert!(retry.is_some(), "{status} without Retry-After");
            }
            other => panic!("status {other}: {v}"),
        }
    }
    assert_eq!(ok + shed, n);
    assert!(ok >= 1);
    // Every 200 ran exactly once; nothing that was shed ran.
    assert_eq!(stub.runs.load(Ordering::SeqCst), ok);
    assert_eq!(send(agent().get(&r.url("/ready")), b"").0, 200);
    assert_eq!(send(post(&r), BODY.as_bytes()).0, 200);
}

#[test]
fn shutdown_finishes_accepted_work() {
    let stub = Stub {
        delay: Duration::from_millis(300),
        ..Stub::default()
    };
    let r = start(ServerConfig::default(), Arc::new(stub));
    wait_ready(&r);
    let url = r.url("/v1/systemone");
    let inflight = std::thread::spawn(move || {
        send(
            agent().post(&url).set("content-type", "application/json"),
            BODY.as_bytes(),
        )
        .0
    });
    std::thread::sleep(Duration::from_millis(100));
    assert!(r.stop().is_ok());
    assert_eq!(inflight.join().unwrap(), 200);
}

#[test]
fn metrics_and_openapi() {
    let r = start(ServerConfig::default(), Arc::new(Stub::default()));
    wait_ready(&r);
    assert_eq!(send(post(&r), BODY.as_bytes()).0, 200);
    let (status, resp) = send(agent().get(&r.url("/metrics")), b"");
    assert_eq!(status, 200);
    let text = resp.into_string().unwrap();
    for series in [
        "kev_requests_total",
        "kev_request_duration_seconds",
        "kev_input_tokens_total",
        "kev_queue_depth",
        "kev_prepared_state_cache_hits_total",
        "kev_engine_passes_total",
    ] {
        assert!(text.contains(series), "{series} missing from /metrics");
    }
    let (status, resp) = send(agent().get(&r.url("/openapi.json")), b"");
    assert_eq!(status, 200);
    let doc = json_of(resp);
    assert!(doc["paths"]["/v1/systemone"]["post"].is_object());
}

#[test]
fn a_request_whose_client_left_is_dropped_before_it_runs() {
    use std::io::{Read, Write as _};
    let stub = Arc::new(Stub {
        delay: Duration::from_millis(400),
        ..Stub::default()
    });
    let r = start(ServerConfig::default(), Arc::clone(&stub));
    wait_ready(&r);
    // A occupies the engine.
    let url = r.url("/v1/systemone");
    let a = std::thread::spawn(move || {
        send(
            agent().post(&url).set("content-type", "application/json"),
            BODY.as_bytes(),
        )
        .0
    });
    std::thread::sleep(Duration::from_millis(100));
    // B is sent, queued behind A, and its client hangs up while it waits.
    let mut s = std::net::TcpStream::connect(r.addr).unwrap();
    let req = format!(
        "POST /v1/systemone HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{}",
        BODY.len(),
        BODY
    );
    s.write_all(req.as_bytes()).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    s.shutdown(std::net::Shutdown::Both).unwrap();
    drop(s);
    assert_eq!(a.join().unwrap(), 200);
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(
        stub.runs.load(Ordering::SeqCst),
        1,
        "the abandoned request ran"
    );
    let mut m = String::new();
    std::net::TcpStream::connect(r.addr)
        .and_then(|mut c| {
            c.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")?;
            c.read_to_string(&mut m)
        })
        .unwrap();
    assert!(m.contains("kev_queue_abandoned_total 1"), "{m}");
}

#[test]
fn the_warm_up_request_runs_the_served_path_before_ready() {
    let warm =
        serde_json::json!({"model": "warm-up", "state": "x", "questions": {"q": {"type": "noul"}}});
    let stub = Arc::new(Stub {
        warm_up_body: Some(warm.to_string().into_bytes()),
        ..Stub::default()
    });
    let r = support::start_ready(ServerConfig::default(), Arc::clone(&stub));
    // Ready only once the warm-up request went through the engine thread's passes.
    assert_eq!(stub.runs.load(Ordering::SeqCst), 1);
    assert_eq!(
        stub.passes.lock().unwrap().first(),
        Some(&vec!["warm-up".to_string()])
    );
    drop(r);
    // A warm-up request the model cannot answer stops the server instead of serving.
    let stub = Arc::new(Stub {
        warm_up_body: Some(warm.to_string().into_bytes()),
        panic_on: Some("warm-up".into()),
        ..Stub::default()
    });
    let r = support::start(ServerConfig::default(), stub);
    // It ends by itself (a stop asked before the warm-up failed would drain it instead, answering 503).
    assert!(
        r.ended_within(std::time::Duration::from_secs(60)),
        "the server kept running"
    );
    let err = r.stop().expect_err("the server stopped on its own");
    assert!(err.to_string().contains("warm-up"), "{err}");
}

/// POST `body` to `path` on an open HTTP/2 connection: status and body bytes.
async fn h2_post(
    client: &mut h2::client::SendRequest<bytes::Bytes>,
    addr: std::net::SocketAddr,
    path: &str,
    body: &'static [u8],
) -> (u16, Vec<u8>) {
    let req = http::Request::post(format!("http://{addr}{path}"))
        .header("content-type", "application/json")
        .body(())
        .unwrap();
    let (resp, mut send) = client.send_request(req, false).unwrap();
    send.send_data(bytes::Bytes::from_static(body), true)
        .unwrap();
    let resp = resp.await.unwrap();
    let status = resp.status().as_u16();
    let mut recv = resp.into_body();
    let mut all = Vec::new();
    while let Some(chunk) = recv.data().await {
        let chunk = chunk.unwrap();
        let _ = recv.flow_control().release_capacity(chunk.len());
        all.extend_from_slice(&chunk);
    }
    (status, all)
}

/// POST `body` to `path` over HTTP/2 with prior knowledge (the preface first, no upgrade): status and body.
fn post_h2(r: &Running, path: &str, body: &'static [u8]) -> (u16, Value) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let addr = r.addr;
    rt.block_on(async move {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (mut client, conn) = h2::client::handshake(tcp).await.unwrap();
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let (status, all) = h2_post(&mut client, addr, path, body).await;
        (status, serde_json::from_slice(&all).unwrap())
    })
}

#[test]
fn http2_with_prior_knowledge_gets_the_same_answers_and_errors() {
    let config = ServerConfig {
        max_body: 200,
        ..ServerConfig::default()
    };
    let r = start(config, Arc::new(Stub::new(Duration::ZERO)));
    wait_ready(&r);
    let (status, v) = post_h2(&r, "/v1/systemone", BODY.as_bytes());
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["answers"]["q1"]["type"], "noul", "{v}");
    // A client error has its documented shape over HTTP/2 too.
    static BIG: [u8; 300] = [b' '; 300];
    let (status, v) = post_h2(&r, "/v1/systemone", &BIG);
    assert_eq!(status, 413, "{v}");
    assert!(v["detail"]["error_type"].is_string(), "{v}");
    let (status, _) = post_h2(&r, "/v1/nothing", b"{}");
    assert_eq!(status, 404);
}

/// An HTTP/2 connection is closed (GOAWAY) once it has held no request for the idle timeout, as an idle
/// HTTP/1.1 keep-alive connection is, so idle clients cannot hold every connection slot; a request that
/// takes longer than the timeout keeps its connection open until it is answered.
#[test]
fn idle_http2_connections_are_closed_and_busy_ones_are_not() {
    let stub = Stub {
        delay: Duration::from_millis(1500),
        ..Stub::default()
    };
    let config = ServerConfig {
        header_read_timeout: Duration::from_millis(400),
        ..ServerConfig::default()
    };
    let r = start(config, Arc::new(stub));
    wait_ready(&r);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let addr = r.addr;
    let (status, served_for, closed_after) = rt.block_on(async move {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (mut client, conn) = h2::client::handshake(tcp).await.unwrap();
        let closed = tokio::spawn(async move {
            let _ = conn.await;
            std::time::Instant::now()
        });
        let t = std::time::Instant::now();
        let (status, _) = h2_post(&mut client, addr, "/v1/systemone", BODY.as_bytes()).await;
        let answered = std::time::Instant::now();
        let closed = tokio::time::timeout(Duration::from_secs(10), closed)
            .await
            .expect("the idle HTTP/2 connection was not closed")
            .unwrap();
        (status, answered - t, closed - answered)
    });
    assert_eq!(status, 200);
    assert!(
        served_for >= Duration::from_millis(1400),
        "answered after {served_for:?}: the stub sleeps 1.5 s"
    );
    assert!(
        closed_after >= Duration::from_millis(300),
        "closed {closed_after:?} after its answer: sooner than the idle timeout"
    );
}
