//! What the server's HTTP tests share (`mod support;` in each): the stand-in decider, the contract's error and
//! answer shapes a stand-in returns, a server on a loopback port, and the HTTP client helpers. Each test
//! binary uses part of it.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kev_contract::{ContractError, ErrorDetail, LocItem, ResponseBody};
use kev_server::{
    AdapterTag, Admission, ApiError, Decider, JobInfo, Need, ServerConfig, Step, Urgency,
};
use serde_json::{Value, json};

/// The stand-in decider: answers each of a request's questions with a fixed noul, its work measured in tokens
/// and time. A request's work is its `tokens` field (default 10 per question), run `unit` tokens at least per
/// pass (default: all of it in one piece, or 64 when the body names `whole: false`); every pass sleeps `delay`
/// plus `per_token` per token (a pass on the long lane advances only while no short pass runs, as the engine's
/// lane does). It can be held before warm-up or made to panic on a model name.
#[derive(Default)]
pub struct Stub {
    /// Sleep per pass.
    pub delay: Duration,
    /// Sleep per token run.
    pub per_token: Duration,
    /// Warm-up waits for a message on this channel.
    pub hold_warm_up: Option<Mutex<std::sync::mpsc::Receiver<()>>>,
    /// Panic in a pass holding a job for this model.
    pub panic_on: Option<String>,
    /// The warm-up request the server answers through its pipeline before it is ready.
    pub warm_up_body: Option<Vec<u8>>,
    /// Jobs finished.
    pub runs: AtomicUsize,
    /// Tokens run.
    pub tokens_run: AtomicUsize,
    /// The models of the jobs of every pass, in order.
    pub passes: Mutex<Vec<Vec<String>>>,
    /// Answer 0.75 instead of 0.5 (a model that drifted: the canary must see it).
    pub drift: AtomicBool,
    /// Short passes running now: a pass on the long lane advances only while none does, as the engine's
    /// lane pauses at its safe points while a short pass holds the cores.
    pub short_running: AtomicUsize,
}

impl Stub {
    /// A stub whose every token costs `per_token`.
    pub fn new(per_token: Duration) -> Self {
        Stub {
            per_token,
            ..Stub::default()
        }
    }
}

/// A stand-in's job: what is left of it and how it answers. Its `model` names its adapter (for keys'
/// policies), its body's `x_priority` / `x_deadline_ms` its urgency.
pub struct Job {
    model: String,
    ids: Vec<String>,
    left: usize,
    unit: usize,
    urgency: Urgency,
    state: Value,
}

/// A stand-in's 422: the contract's validation error with these `detail` entries.
pub fn validation(body: Value) -> ApiError {
    let details = body["detail"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| ErrorDetail {
            kind: d["type"].as_str().unwrap().into(),
            loc: d["loc"]
                .as_array()
                .unwrap()
                .iter()
                .map(|l| match l.as_u64() {
                    Some(i) => LocItem::Index(i as usize),
                    None => LocItem::Key(l.as_str().unwrap().into()),
                })
                .collect(),
            msg: d["msg"].as_str().unwrap().into(),
            input: d["input"].clone(),
            ctx: None,
        })
        .collect();
    ApiError::from(ContractError::Invalid(details))
}

/// A stand-in's answer, typed as a decider returns it.
pub fn response(v: Value) -> ResponseBody {
    ResponseBody::new(
        v["model"].as_str().unwrap(),
        v["answers"].clone(),
        v["usage"]["input_tokens"].as_u64().unwrap() as usize,
        v["usage"]["output_tokens"].as_u64().unwrap() as usize,
    )
}

/// A finished pass step answering with this response (a stand-in computes no probabilities).
pub fn done(v: Value) -> Step {
    Step::Done(Ok(kev_decide::Decision {
        probabilities: Vec::new(),
        logits: Vec::new(),
        response: response(v),
        readout: Duration::ZERO,
    }))
}

/// The body's JSON, or the 422 a stand-in gives for a body that is not JSON.
pub fn parse_body(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body).map_err(|_| {
        validation(json!({"detail":[{"type":"json_invalid","loc":["body",0],"msg":"JSON decode error","input":{}}]}))
    })
}

impl Stub {
    /// A pass's `time` of work: slept; on the long lane, only while no short pass runs.
    fn work(&self, time: Duration) {
        let on_lane = std::thread::current()
            .name()
            .is_some_and(|n| n.starts_with("kev-long"));
        if !on_lane {
            self.short_running.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(time);
            self.short_running.fetch_sub(1, Ordering::SeqCst);
        } else {
            // Progress is the wall time slept while no short pass ran (a loaded machine's sleeps overshoot).
            let mut done = Duration::ZERO;
            while done < time {
                let free = self.short_running.load(Ordering::SeqCst) == 0;
                let t = std::time::Instant::now();
                std::thread::sleep(Duration::from_millis(1).min(time - done));
                if free && self.short_running.load(Ordering::SeqCst) == 0 {
                    done += t.elapsed();
                }
            }
        }
    }
}

impl Decider for Stub {
    type Job = Job;

    fn admit(&self, body: &[u8]) -> Result<Admission<Job>, ApiError> {
        let v = parse_body(body)?;
        let Some(qs) = v.get("questions").and_then(Value::as_object) else {
            return Err(validation(
                json!({"detail":[{"type":"missing","loc":["body","questions"],"msg":"Field required","input":v}]}),
            ));
        };
        let tokens = v
            .get("tokens")
            .and_then(Value::as_u64)
            .map_or(10 * qs.len(), |t| t as usize);
        let urgency = kev_decide::urgency::read(&v).map_err(|r| ApiError::from_wire(&r))?;
        let unit = match v.get("whole").and_then(Value::as_bool) {
            Some(false) => {
                let unit = v.get("unit").and_then(Value::as_u64).unwrap_or(64) as usize;
                tokens.min(unit.max(1))
            }
            _ => tokens,
        };
        Ok(Admission {
            tokens,
            job: Job {
                model: v
                    .get("model")
                    .and_then(Value::as_str)
                    .unwrap_or("kev-latest")
                    .into(),
                ids: qs.keys().cloned().collect(),
                left: tokens,
                unit,
                urgency,
                state: v.get("state").cloned().unwrap_or(Value::Null),
            },
        })
    }

    fn job_info(&self, job: &Job) -> JobInfo {
        JobInfo {
            adapter: Some(AdapterTag {
                name: job.model.clone(),
                sha256: Some(format!("sha-of-{}", job.model)),
            }),
            urgency: job.urgency,
        }
    }

    fn job_state(&self, job: &Job) -> Option<Value> {
        Some(job.state.clone())
    }

    fn need(&self, job: &Job) -> Need {
        Need {
            phase: job.left,
            unit: job.unit.min(job.left),
            remaining: job.left,
        }
    }

    fn pass(&self, grants: &mut [(&mut Job, usize)], _lane: kev_decide::Lane) -> Vec<Step> {
        let mut total = 0;
        let mut names = Vec::new();
        for (job, grant) in grants.iter_mut() {
            let take = (*grant).max(job.unit).min(job.left);
            job.left -= take;
            total += take;
            names.push(job.model.clone());
        }
        self.passes.lock().unwrap().push(names);
        self.tokens_run.fetch_add(total, Ordering::SeqCst);
        let finished = grants.iter().filter(|(job, _)| job.left == 0).count();
        self.runs.fetch_add(finished, Ordering::SeqCst);
        self.work(self.delay + self.per_token * total as u32);
        grants
            .iter()
            .map(|(job, _)| {
                if self.panic_on.as_deref() == Some(job.model.as_str()) {
                    panic!("stub engine failure");
                }
                if job.left > 0 {
                    return Step::Running;
                }
                let answers: serde_json::Map<String, Value> = job
                    .ids
                    .iter()
                    .map(|id| {
                        let p = if self.drift.load(Ordering::SeqCst) { 0.75 } else { 0.5 };
                        (id.clone(), json!({"type": "noul", "noul": p}))
                    })
                    .collect();
                done(json!({"model": job.model, "answers": answers, "usage": {"input_tokens": 10, "output_tokens": 5}}))
            })
            .collect()
    }

    fn warm_up(&self) -> Result<(), String> {
        if let Some(rx) = &self.hold_warm_up {
            let _ = rx.lock().unwrap().recv();
        }
        Ok(())
    }

    fn warm_up_request(&self) -> Option<Vec<u8>> {
        self.warm_up_body.clone()
    }

    fn model_card(&self) -> Value {
        json!({"description": "stub", "release_date": "2026-10-01", "x_backend": "stub"})
    }
}

/// A server on a loopback port, stopped when dropped.
pub struct Running {
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<(), kev_server::ServerError>>>,
}

impl Running {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// Whether the server has returned on its own (no stop asked), waiting up to `within` for it.
    pub fn ended_within(&self, within: std::time::Duration) -> bool {
        let until = std::time::Instant::now() + within;
        while std::time::Instant::now() < until {
            if self.thread.as_ref().is_none_or(|t| t.is_finished()) {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        false
    }

    /// Stop it and wait for the drain to finish.
    pub fn stop(mut self) -> Result<(), kev_server::ServerError> {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        self.thread.take().unwrap().join().unwrap()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Serve `decider` on a free loopback port (not waiting for readiness: see [`wait_ready`]).
pub fn start<D: Decider>(config: ServerConfig, decider: Arc<D>) -> Running {
    let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    std_listener.set_nonblocking(true).unwrap();
    let addr = std_listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(std_listener).unwrap();
            kev_server::serve_on(listener, config, decider, async move {
                let _ = rx.await;
            })
            .await
        })
    });
    Running {
        addr,
        stop: Some(tx),
        thread: Some(thread),
    }
}

/// [`start`], then wait until `/ready` answers 200.
pub fn start_ready<D: Decider>(config: ServerConfig, decider: Arc<D>) -> Running {
    let r = start(config, decider);
    wait_ready(&r);
    r
}

/// Wait (up to 5 s) until `/ready` answers 200.
pub fn wait_ready(r: &Running) {
    for _ in 0..500 {
        if let Ok(resp) = agent().get(&r.url("/ready")).call()
            && resp.status() == 200
        {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let last = agent().get(&r.url("/ready")).call();
    panic!("server never became ready: {last:?}");
}

pub fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(30))
        .build()
}

/// (status, response) whatever the status.
pub fn send(req: ureq::Request, body: &[u8]) -> (u16, ureq::Response) {
    match req.send_bytes(body) {
        Ok(r) => (r.status(), r),
        Err(ureq::Error::Status(code, r)) => (code, r),
        Err(e) => panic!("transport error: {e}"),
    }
}

/// A response's JSON body; every answer of the server is JSON, and says so.
pub fn json_of(r: ureq::Response) -> Value {
    let ct = r.header("content-type").unwrap_or("").to_string();
    let text = r.into_string().unwrap();
    assert!(
        ct.starts_with("application/json"),
        "content-type {ct:?} for {text}"
    );
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// A loopback OTLP receiver for the trace tests: `serve` runs on a listener of its own (a current-thread
/// runtime on a thread of its own, for the rest of the process); returns its `http://` URL.
pub fn serve_loopback<F, Fut>(serve: F) -> String
where
    F: FnOnce(tokio::net::TcpListener) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(
            async move { serve(tokio::net::TcpListener::from_std(listener).unwrap()).await },
        );
    });
    url
}

/// Every span of an OTLP export request's resources and scopes, appended to `out`.
pub fn keep_spans(
    out: &mut Vec<opentelemetry_proto::tonic::trace::v1::Span>,
    resources: Vec<opentelemetry_proto::tonic::trace::v1::ResourceSpans>,
) {
    for rs in resources {
        for ss in rs.scope_spans {
            out.extend(ss.spans);
        }
    }
}
