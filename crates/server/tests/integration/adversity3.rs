//! Serving under adversity, round three (issue 56), over stand-in deciders: clients that never read their
//! answers (an HTTP/2 window of 0, HTTP/1.1 requests pipelined and never read) lose their connections after
//! the header-read timeout; one address cannot take every connection; the drain deadline bounds the exit;
//! a body that stalls after a burst is cut within the rate window; clients that reconnect after each 408 do
//! not keep every body permit; long work gets its share of a machine saturated with short requests; a batch's
//! own bad `x_logits` is a 422.

use crate::support;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use kev_server::ServerConfig;
use serde_json::{Value, json};
use support::{Running, Stub, agent, json_of, send};

fn start(config: ServerConfig, stub: Arc<Stub>) -> Running {
    support::start_ready(config, stub)
}

fn short(name: &str, tokens: usize) -> Vec<u8> {
    json!({"model": name, "state": "x", "tokens": tokens, "questions": {"q": {"type": "noul"}}})
        .to_string()
        .into_bytes()
}

fn post(r: &Running, path: &str, b: &[u8]) -> (u16, ureq::Response) {
    send(
        agent()
            .post(&r.url(path))
            .set("content-type", "application/json"),
        b,
    )
}

/// A TCP connection to `addr` from the loopback address `from` (127.0.0.x: another peer to the server).
fn connect_from(from: [u8; 4], addr: SocketAddr) -> std::net::TcpStream {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let s = tokio::net::TcpSocket::new_v4().unwrap();
        s.bind(SocketAddr::from((from, 0))).unwrap();
        let stream = s.connect(addr).await.unwrap();
        let std = stream.into_std().unwrap();
        std.set_nonblocking(false).unwrap();
        std
    })
}

/// The status of the answer on `s` and its JSON body (`None` if the server closed without one).
fn answer_on(s: &mut std::net::TcpStream) -> Option<(u16, Value)> {
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let mut all = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => all.extend_from_slice(&buf[..n]),
        }
        let text = String::from_utf8_lossy(&all);
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let len = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length: ")
                        .map(str::to_owned)
                })
                .and_then(|v| v.trim().parse::<usize>().ok());
            if len.is_some_and(|n| body.len() >= n) {
                break;
            }
        }
    }
    let text = String::from_utf8_lossy(&all).into_owned();
    let status = text.get(9..12)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    Some((status, serde_json::from_str(body).unwrap_or(Value::Null)))
}

/// How long a plain `GET /health` takes to be answered (`None`: not within 12 s).
fn health_within(r: &Running) -> Option<Duration> {
    let t = Instant::now();
    let client = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(12))
        .build();
    match client.get(&r.url("/health")).call() {
        Ok(resp) if resp.status() == 200 => Some(t.elapsed()),
        _ => None,
    }
}

fn holding_config(cap: usize) -> ServerConfig {
    ServerConfig {
        max_connections: cap,
        max_connections_per_ip: Some(cap),
        header_read_timeout: Duration::from_millis(500),
        ..ServerConfig::default()
    }
}

#[test]
fn http2_clients_that_never_read_lose_their_connections() {
    // Four connections (the whole cap) whose streams have a flow-control window of 0, each asking for the
    // API document (118 KB) and never reading it, answering the server's pings all the while.
    let r = start(holding_config(4), Arc::new(Stub::new(Duration::ZERO)));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let addr = r.addr;
    let held = rt.block_on(async move {
        let mut held = Vec::new();
        for _ in 0..4 {
            let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
            let (mut client, conn) = h2::client::Builder::new()
                .initial_window_size(0)
                .handshake::<_, bytes::Bytes>(tcp)
                .await
                .unwrap();
            tokio::spawn(async move {
                let _ = conn.await;
            });
            let req = http::Request::get(format!("http://{addr}/openapi.json"))
                .body(())
                .unwrap();
            let (resp, _) = client.send_request(req, true).unwrap();
            held.push((client, resp));
        }
        held
    });
    std::thread::sleep(Duration::from_millis(200));
    // Their answers never move: each connection is closed after the header-read timeout (500 ms), and a
    // normal client gets in.
    let took = health_within(&r);
    assert!(
        took.is_some_and(|t| t < Duration::from_secs(5)),
        "a normal request beside 4 non-reading HTTP/2 clients: {took:?}"
    );
    drop(held);
}

#[test]
fn pipelining_http1_clients_that_never_read_lose_their_connections() {
    let r = start(holding_config(4), Arc::new(Stub::new(Duration::ZERO)));
    // Four connections, each pipelining 300 requests for the API document (35 MB of answers, far past what
    // the sockets buffer) and reading none.
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..4)
        .map(|_| {
            let mut s = std::net::TcpStream::connect(r.addr).unwrap();
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let one = b"GET /openapi.json HTTP/1.1\r\nhost: x\r\n\r\n";
                for _ in 0..300 {
                    if stop.load(Ordering::SeqCst) || s.write_all(one).is_err() {
                        break;
                    }
                }
                // Hold the socket (unread) until the test is done or the server closes it.
                while !stop.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(50));
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let took = health_within(&r);
    stop.store(true, Ordering::SeqCst);
    assert!(
        took.is_some_and(|t| t < Duration::from_secs(5)),
        "a normal request beside 4 pipelining clients that never read: {took:?}"
    );
    for w in writers {
        let _ = w.join();
    }
}

#[test]
fn one_address_cannot_take_every_connection() {
    let config = ServerConfig {
        max_connections: 8,
        max_connections_per_ip: Some(2),
        header_read_timeout: Duration::from_secs(3),
        ..ServerConfig::default()
    };
    let r = start(config, Arc::new(Stub::new(Duration::ZERO)));
    // 127.0.0.2 holds its two connections (sending nothing: each holds its slot for the header timeout).
    let held: Vec<_> = (0..2)
        .map(|_| connect_from([127, 0, 0, 2], r.addr))
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    // A third from the same address is answered 429 at once and closed.
    let mut third = connect_from([127, 0, 0, 2], r.addr);
    third
        .write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        .unwrap();
    let t = Instant::now();
    let (status, v) = answer_on(&mut third).expect("an answer");
    assert_eq!(status, 429, "{v}");
    assert_eq!(v["detail"]["error_type"], "rate_limit_error", "{v}");
    assert!(
        v["detail"]["message"]
            .as_str()
            .unwrap()
            .contains("--max-connections-per-ip"),
        "{v}"
    );
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    // Another address is served at once.
    let mut other = connect_from([127, 0, 0, 3], r.addr);
    other
        .write_all(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .unwrap();
    assert_eq!(answer_on(&mut other).map(|(s, _)| s), Some(200));
    drop(held);
}

#[test]
fn the_drain_deadline_bounds_the_exit_and_answers_what_is_in_flight() {
    // A long request of 12 s (500 ms pieces) in flight when the server is told to stop, with a 1 s drain.
    let config = ServerConfig {
        drain_timeout: Duration::from_secs(1),
        ..ServerConfig::default()
    };
    let stub = Arc::new(Stub::new(Duration::from_millis(1)));
    let r = start(config, Arc::clone(&stub));
    let url = r.url("/v1/systemone");
    let long = std::thread::spawn(move || {
        let body = json!({"model": "long", "state": "x", "tokens": 12_000, "whole": false, "unit": 500,
                          "questions": {"q": {"type": "noul"}}});
        let (status, resp) = send(
            agent().post(&url).set("content-type", "application/json"),
            body.to_string().as_bytes(),
        );
        (status, json_of(resp))
    });
    std::thread::sleep(Duration::from_millis(500));
    let t = Instant::now();
    r.stop().unwrap();
    let took = t.elapsed();
    // The deadline (1 s) plus the grace (1 s) plus the wait for the engine's pass (at most 1 s).
    let bound = Duration::from_secs(1) + kev_server::DRAIN_GRACE + kev_server::queue::SHUTDOWN_WAIT;
    assert!(
        took < bound + Duration::from_millis(700),
        "the server returned {took:?} after the stop (bound {bound:?})"
    );
    let (status, v) = long.join().unwrap();
    assert_eq!(status, 503, "{v}");
    assert_eq!(v["detail"]["error_type"], "unavailable_error", "{v}");
    assert!(
        stub.tokens_run.load(Ordering::SeqCst) < 12_000,
        "the long request ran to its end"
    );
}

#[test]
fn a_body_that_stalls_after_a_burst_is_cut_within_the_rate_window() {
    // The floor is 16 KiB/s over any 2 s: 480 KB at once, then nothing, is cut about 2 s later — not after
    // the 10 s body timeout, nor after the 30 s an average since the start would allow.
    let config = ServerConfig {
        body_read_timeout: Duration::from_secs(10),
        ..ServerConfig::default()
    };
    let r = start(config, Arc::new(Stub::new(Duration::ZERO)));
    let mut s = std::net::TcpStream::connect(r.addr).unwrap();
    write!(
        s,
        "POST /v1/systemone HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 1000000\r\n\r\n"
    )
    .unwrap();
    s.write_all(&[b' '; 480_000]).unwrap();
    let t = Instant::now();
    let (status, v) = answer_on(&mut s).expect("an answer");
    assert_eq!(status, 408, "{v}");
    assert_eq!(v["detail"]["error_type"], "timeout_error", "{v}");
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "a stalled body was cut after {:?}",
        t.elapsed()
    );
}

#[test]
fn clients_that_reconnect_after_each_408_leave_body_permits_to_others() {
    // Queue depth 4: 8 body permits. Eight clients at 127.0.0.2 send headers only, and each time they are cut
    // (408, 1 s rate window) connect again at once. A normal client at 127.0.0.1 keeps getting answers.
    let config = ServerConfig {
        queue_depth: 4,
        body_rate_window: Duration::from_secs(1),
        ..ServerConfig::default()
    };
    let r = start(config, Arc::new(Stub::new(Duration::ZERO)));
    let stop = Arc::new(AtomicBool::new(false));
    let cut = Arc::new(AtomicUsize::new(0));
    let attackers: Vec<_> = (0..8)
        .map(|_| {
            let (addr, stop, cut) = (r.addr, Arc::clone(&stop), Arc::clone(&cut));
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    let mut s = connect_from([127, 0, 0, 2], addr);
                    let _ = s.write_all(
                        b"POST /v1/systemone HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n",
                    );
                    if answer_on(&mut s).is_some_and(|(st, _)| st == 408) {
                        cut.fetch_add(1, Ordering::SeqCst);
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(4) {
        let (status, _) = post(&r, "/v1/systemone", &short("normal", 10));
        *statuses.entry(status).or_default() += 1;
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::SeqCst);
    for a in attackers {
        let _ = a.join();
    }
    let ok = statuses.get(&200).copied().unwrap_or(0);
    let all: usize = statuses.values().sum();
    assert!(
        cut.load(Ordering::SeqCst) >= 8,
        "the header-only clients were not cycling ({} cut)",
        cut.load(Ordering::SeqCst)
    );
    assert!(
        ok * 10 >= all * 9,
        "the normal client beside reconnecting header-only clients: {statuses:?}"
    );
}

#[test]
fn long_work_gets_its_share_of_a_machine_saturated_with_short_requests() {
    // A long request of 1 s of work alone (1,000 tokens at 1 ms), on a lane that advances only while no
    // short pass runs, beside three clients sending 40 ms short requests back to back. With the lane's
    // share of 0.2 it should finish in about 1 s / 0.2 = 5 s.
    let stub = Arc::new(Stub::new(Duration::from_millis(1)));
    let config = ServerConfig {
        pass_tokens: 512,
        ..ServerConfig::default()
    };
    let r = start(config, Arc::clone(&stub));
    let stop = Arc::new(AtomicBool::new(false));
    let shorts: Vec<_> = (0..3)
        .map(|i| {
            let (url, stop) = (r.url("/v1/systemone"), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut n = 0;
                while !stop.load(Ordering::SeqCst) {
                    let (status, _) = send(
                        agent().post(&url).set("content-type", "application/json"),
                        &short(&format!("s{i}"), 40),
                    );
                    assert_eq!(status, 200);
                    n += 1;
                }
                n
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    let body = json!({"model": "long", "state": "x", "tokens": 1000, "whole": false, "unit": 64,
                      "questions": {"q": {"type": "noul"}}});
    let (status, _) = post(&r, "/v1/systemone", body.to_string().as_bytes());
    let took = t.elapsed();
    stop.store(true, Ordering::SeqCst);
    let answered: usize = shorts.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(status, 200);
    assert!(
        answered > 50,
        "the short clients did not saturate ({answered} answered)"
    );
    let bound = Duration::from_secs_f64(1.0 / 0.2);
    assert!(
        took < bound * 2,
        "the long request took {took:?} under saturation (its solo time over the share: {bound:?})"
    );
    let (_, resp) = send(agent().get(&r.url("/metrics")), b"");
    let text = resp.into_string().unwrap();
    assert!(text.contains("kev_long_lane_share 0.2"), "{text}");
}

#[test]
fn a_batch_with_a_bad_x_logits_of_its_own_is_a_422() {
    let r = start(ServerConfig::default(), Arc::new(Stub::new(Duration::ZERO)));
    let batch = json!({"requests": [{"state": "x", "questions": {"q": {"type": "noul"}}}], "x_logits": "1"});
    let (status, resp) = post(&r, "/v1/systemone/batch", batch.to_string().as_bytes());
    let v = json_of(resp);
    assert_eq!(status, 422, "{v}");
    assert_eq!(v["detail"][0]["type"], "bool_type", "{v}");
    assert_eq!(v["detail"][0]["loc"], json!(["body", "x_logits"]), "{v}");
}
