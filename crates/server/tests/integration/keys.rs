//! Named API keys (`ServerConfig::api_keys`, `kev_server::keys`): each key's limits give that key its own 429s
//! (requests per second, tokens per minute, requests in flight) while the others are answered; a key removed
//! from the file is refused from its next request once the file is read again; `/metrics` counts per key name.
//! Key names here are unique to each test: the metrics recorder is the process's.

use crate::support;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kev_server::ServerConfig;
use kev_server::keys::Keys;
use serde_json::json;
use support::{Running, Stub, agent, json_of, send, start_ready};

/// A keys file in a temporary directory of the test's own (removed when the directory is dropped).
fn keys_file(test: &str, entries: serde_json::Value) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::Builder::new()
        .prefix(&format!("kev-server-keys-{test}-"))
        .tempdir()
        .unwrap();
    let p = dir.path().join("keys.json");
    std::fs::write(&p, json!({ "keys": entries }).to_string()).unwrap();
    (dir, p)
}

fn serve(keys: &Arc<Keys>, stub: Stub) -> Running {
    let config = ServerConfig {
        api_keys: Some(Arc::clone(keys)),
        ..ServerConfig::default()
    };
    start_ready(config, Arc::new(stub))
}

/// (status, body, Retry-After) of a one-question request of `tokens` tokens under `key`.
fn ask(r: &Running, key: &str, tokens: usize) -> (u16, serde_json::Value, Option<String>) {
    let body = json!({"state": "x", "tokens": tokens, "questions": {"q": {"type": "noul"}}});
    let (status, resp) = send(
        agent()
            .post(&r.url("/v1/systemone"))
            .set("content-type", "application/json")
            .set("authorization", &format!("Bearer {key}")),
        body.to_string().as_bytes(),
    );
    let retry = resp.header("retry-after").map(String::from);
    (status, json_of(resp), retry)
}

fn metric(r: &Running, line_start: &str) -> f64 {
    let (_, resp) = send(agent().get(&r.url("/metrics")), b"");
    resp.into_string()
        .unwrap()
        .lines()
        .find(|l| l.starts_with(line_start))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

#[test]
fn each_key_gets_its_own_429s_and_the_others_are_answered() {
    let (_dir, p) = keys_file(
        "own",
        json!([
            {"name": "slow-rps", "key": "k-rps-secret", "requests_per_second": 0.2},
            {"name": "tpm", "key": "k-tpm-secret", "tokens_per_minute": 100},
            {"name": "free", "key": "k-free-secret"},
        ]),
    );
    let keys = Arc::new(Keys::read(&p).unwrap());
    let r = serve(&keys, Stub::default());

    // One request per 5 s: the first is answered, the next ones refused with this key's 429.
    assert_eq!(ask(&r, "k-rps-secret", 10).0, 200);
    for _ in 0..3 {
        let (status, v, retry) = ask(&r, "k-rps-secret", 10);
        assert_eq!(status, 429, "{v}");
        assert_eq!(v["detail"]["error_type"], "rate_limit_error", "{v}");
        let msg = v["detail"]["message"].as_str().unwrap();
        assert!(
            msg.contains("\"slow-rps\"") && msg.contains("per second"),
            "{msg}"
        );
        assert!(!msg.contains("k-rps-secret"), "the secret leaked: {msg}");
        let retry: u64 = retry.expect("Retry-After").parse().unwrap();
        assert!((1..=5).contains(&retry), "{retry}");
        // Meanwhile the other keys are answered.
        assert_eq!(ask(&r, "k-free-secret", 10).0, 200);
    }

    // 100 tokens a minute: in while not in debt, then refused until the debt is paid back.
    assert_eq!(ask(&r, "k-tpm-secret", 80).0, 200);
    assert_eq!(ask(&r, "k-tpm-secret", 80).0, 200);
    let (status, v, retry) = ask(&r, "k-tpm-secret", 1);
    assert_eq!(status, 429, "{v}");
    assert!(
        v["detail"]["message"]
            .as_str()
            .unwrap()
            .contains("tokens per minute")
    );
    let retry: u64 = retry.unwrap().parse().unwrap();
    assert!(
        (30..=37).contains(&retry),
        "60 tokens of debt at 100/min: {retry}"
    );
    assert_eq!(ask(&r, "k-free-secret", 1000).0, 200);

    // Per-key counters; a refused request is counted and costs no tokens.
    assert_eq!(
        metric(
            &r,
            "kev_key_requests_total{key=\"slow-rps\",status=\"429\"}"
        ),
        3.0
    );
    assert_eq!(
        metric(&r, "kev_key_requests_total{key=\"free\",status=\"200\"}"),
        4.0
    );
    assert_eq!(metric(&r, "kev_key_input_tokens_total{key=\"tpm\"}"), 160.0);
    assert_eq!(
        metric(
            &r,
            "kev_key_rejected_total{key=\"tpm\",limit=\"tokens_per_minute\"}"
        ),
        1.0
    );
    // An unknown key is a 401, whatever the limits of the others.
    assert_eq!(ask(&r, "k-nobody", 10).0, 401);
}

#[test]
fn a_key_at_its_concurrency_limit_gets_429_until_a_request_finishes() {
    let (_dir, p) = keys_file(
        "conc",
        json!([{"name": "one-at-a-time", "key": "k-conc-secret", "concurrent": 1}]),
    );
    let keys = Arc::new(Keys::read(&p).unwrap());
    let r = Arc::new(serve(&keys, Stub::new(Duration::from_millis(1))));
    // 1,500 tokens at 1 ms: the first request holds the key's one slot for 1.5 s.
    let first = {
        let r = Arc::clone(&r);
        std::thread::spawn(move || ask(&r, "k-conc-secret", 1500).0)
    };
    std::thread::sleep(Duration::from_millis(300));
    let (status, v, retry) = ask(&r, "k-conc-secret", 10);
    assert_eq!(status, 429, "{v}");
    assert!(
        v["detail"]["message"]
            .as_str()
            .unwrap()
            .contains("in flight"),
        "{v}"
    );
    assert_eq!(retry.as_deref(), Some("1"));
    assert_eq!(first.join().unwrap(), 200);
    assert_eq!(ask(&r, "k-conc-secret", 10).0, 200);
}

#[test]
fn a_key_removed_from_the_file_is_refused_once_it_is_read_again() {
    let (_dir, p) = keys_file(
        "revoke",
        json!([
            {"name": "leaving", "key": "k-leaving-secret"},
            {"name": "staying", "key": "k-staying-secret", "requests_per_second": 0.2},
        ]),
    );
    let keys = Arc::new(Keys::read(&p).unwrap());
    let r = serve(&keys, Stub::default());
    assert_eq!(ask(&r, "k-leaving-secret", 10).0, 200);
    assert_eq!(ask(&r, "k-staying-secret", 10).0, 200);
    std::fs::write(
        &p,
        json!({"keys": [{"name": "staying", "key": "k-staying-secret", "requests_per_second": 0.2},
                        {"name": "new", "key": "k-new-secret"}]})
        .to_string(),
    )
    .unwrap();
    assert_eq!(keys.reload().unwrap(), 2);
    assert_eq!(ask(&r, "k-leaving-secret", 10).0, 401);
    assert_eq!(ask(&r, "k-new-secret", 10).0, 200);
    // The key that stayed kept its bucket: its second request within 5 s is still refused.
    assert_eq!(ask(&r, "k-staying-secret", 10).0, 429);
}

/// A 429 given before a large body is read (here the key's own `concurrent` limit, refused in the key layer)
/// still reaches a client that is sending its body: the body is read and thrown away while the answer goes
/// out, so the socket is not closed on unread data (a reset would destroy the answer before it is read).
#[test]
fn an_early_429_reaches_a_client_sending_a_large_body() {
    use std::io::{Read, Write};
    let (_dir, p) = keys_file(
        "early-429",
        json!([{"name": "one", "key": "k-one", "concurrent": 1}]),
    );
    let keys = Arc::new(Keys::read(&p).unwrap());
    let config = ServerConfig {
        api_keys: Some(Arc::clone(&keys)),
        min_body_rate: 0,
        ..ServerConfig::default()
    };
    let r = start_ready(config, Arc::new(Stub::new(Duration::ZERO)));
    let head = |len: usize| {
        format!(
            "POST /v1/systemone HTTP/1.1\r\nhost: x\r\nauthorization: Bearer k-one\r\n\
             content-type: application/json\r\ncontent-length: {len}\r\nconnection: close\r\n\r\n"
        )
    };
    // The key's one concurrent request: its body never comes.
    let mut held = std::net::TcpStream::connect(r.addr).unwrap();
    held.write_all(head(100).as_bytes()).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    for round in 0..3 {
        let mut s = std::net::TcpStream::connect(r.addr).unwrap();
        let mut w = s.try_clone().unwrap();
        let body = vec![b' '; 4 << 20];
        let writer = std::thread::spawn(move || {
            let _ = w.write_all(head(body.len()).as_bytes());
            let _ = w.write_all(&body);
        });
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut all = Vec::new();
        let _ = s.read_to_end(&mut all);
        let text = String::from_utf8_lossy(&all);
        assert!(
            text.starts_with("HTTP/1.1 429"),
            "round {round}: the answer was lost: {text:?}"
        );
        assert!(text.contains("rate_limit_error"), "round {round}: {text}");
        writer.join().unwrap();
    }
    drop(held);
}
