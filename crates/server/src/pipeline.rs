//! The admission pipeline: the one way every decision route (`/v1/systemone`, `/v1/systemone/permute`,
//! `/v1/systemone/separate`) takes a request to the engine and back. A route says only what its body asks the
//! model — the request bodies of its **parts** — and how their answers make its response ([`Route`]); the guards
//! are the pipeline's, in this order, for every route:
//!
//! 1. draining → 503; not ready → 503; a multipart body → 415; an unknown `Content-Encoding` → 415; a declared
//!    `Content-Length` over the body limit → 413 at once (nothing held; the body is thrown away as it comes);
//! 2. a full queue answers 429 before the body is read ([`crate::queue::Queue::has_room`]), and a body-read
//!    permit (twice the queue depth; none left → 429) bounds the bodies being read at once;
//! 3. the body, within the body-read timeout (408), the rate floor (408) and the body limit (413); then
//!    **a queue slot** ([`crate::queue::Queue::reserve`]), one per request whatever its parts (429 if the
//!    queue filled while the body arrived). A client dribbling its body holds a body permit, never a slot:
//!    `--queue-depth` of them leave the queue to everyone else;
//! 4. **an admission permit** (about one per core; none within the queue deadline → 529);
//! 5. on a blocking worker: the content codings undone (each output held to the body limit), [`Route::split`]
//!    (the route's own checks and its parts, each read once), [`Route::admit`] — by default
//!    [`Decider::admit_parts`]: every part validated and compiled (a part naming a pinned state, `x_state_id`,
//!    gets the caller's), the per-request work caps held for the parts together (413 naming the cap), all or
//!    nothing; a batch ([`Decider::admit_batch`]) admits each part on its own instead, a refused one answered
//!    in its place; then the key's policy: a part answered by an adapter the key may not use is a 403 (the
//!    request's, or in its place for a batch), and the request's priority and deadline are settled
//!    (`crate::urgency`);
//! 6. the parts submitted together on the request's slot ([`crate::queue::Queue::submit`]) and their answers
//!    awaited ([`crate::queue::Queue::answer`]): 529 if none has started at the queue deadline; a hang-up or the
//!    request timeout (408) drops the handler and stops every part before its next pass;
//! 7. [`Route::merge`] → 200.
//!
//! A new decision route is one more [`Route`]: its parts get every guard above without a line of its own
//! (`/v1/systemone/batch` is one, in `batch.rs`).

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body as HttpBody;
use axum::extract::MatchedPath;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::Response;
use serde_json::{Value, json};

use crate::conn::Peer;
use crate::error::ApiError;
use crate::permits::{BodyPermit, NoPermit};
use crate::queue::Answered;
use crate::trail::Trail;
use crate::urgency::{PriorityPolicy, Submit};
use crate::wire::{KeyPass, error_response, json_response, request_id};
use crate::{Admission, App, Body, Decider, Priority, Urgency};

/// The admission of a route's parts: one per part, in order, each admitted or refused.
pub(crate) type Admitted<J> = Vec<Result<Admission<J>, ApiError>>;

/// What a decision route makes of a request.
pub(crate) trait Route<D: Decider>: Clone + Send + 'static {
    /// What [`Route::merge`] needs from [`Route::split`].
    type Plan: Send + 'static;

    /// The decoded body → its parts (at least one), each read once ([`Body`]: the bytes as sent, or values
    /// read out of the body), and the plan; the route's own checks answer here. `owner` is the key the
    /// request came in under. Runs on a blocking worker holding an admission permit.
    fn split(
        &self,
        decider: &D,
        owner: Option<&str>,
        body: Vec<u8>,
    ) -> Result<(Vec<Body<'static>>, Self::Plan), ApiError>;

    /// Admit the parts. The default holds them to the per-request caps together, all or nothing (the parts of
    /// one request); a route of independent requests admits each on its own, and a refused part is answered
    /// in its place ([`Answers::refused`]). Runs on the same blocking worker, after [`Route::split`]. A part
    /// naming a pinned state gets `owner`'s (admission reads `x_state_id`).
    fn admit(
        &self,
        decider: &D,
        owner: Option<&str>,
        parts: Vec<Body<'static>>,
    ) -> Result<Admitted<D::Job>, ApiError> {
        Ok(decider
            .admit_parts(parts, owner)?
            .into_iter()
            .map(Ok)
            .collect())
    }

    /// The parts' answers, in order → the response body.
    fn merge(&self, decider: &D, plan: Self::Plan, answers: Answers) -> Result<Value, ApiError>;

    /// Whether its parts are independent requests, each refused in its place (a batch's entries), rather than
    /// one request's parts, refused together.
    fn independent_parts(&self) -> bool {
        false
    }
}

/// A request's answers: one per admitted part, in order, the refused parts' errors, and the time from their
/// submission to the last answer.
pub(crate) struct Answers {
    /// One per admitted part, in part order (every part, unless [`Route::admit`] refused some).
    pub parts: Vec<Answered>,
    /// The parts [`Route::admit`] refused, by part index, in order (empty for an all-or-nothing route).
    pub refused: Vec<(usize, ApiError)>,
    /// From the parts' submission to the last answer.
    pub elapsed: Duration,
}

/// Milliseconds to one decimal, as `x_latency_ms` reports them.
pub(crate) fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 10_000.0).round() / 10.0
}

/// `POST /v1/systemone`: the request is its only part; its answer gets the engine time as `x_latency_ms`.
#[derive(Clone, Copy)]
pub(crate) struct SystemOne;

impl<D: Decider> Route<D> for SystemOne {
    type Plan = ();

    fn split(
        &self,
        _: &D,
        _: Option<&str>,
        body: Vec<u8>,
    ) -> Result<(Vec<Body<'static>>, ()), ApiError> {
        Ok((vec![Body::bytes(body)], ()))
    }

    fn merge(&self, _: &D, _: (), answers: Answers) -> Result<Value, ApiError> {
        let part = answers
            .parts
            .into_iter()
            .next()
            .ok_or_else(ApiError::internal)?;
        let latency = ms(part.compute);
        Ok(part.body.extra("x_latency_ms", json!(latency)).to_value())
    }
}

/// The handler of every decision route: the pipeline, its answer or error, and a `Server-Timing` header.
pub(crate) async fn handle<D: Decider, R: Route<D>>(
    app: Arc<App<D>>,
    route: R,
    request: axum::extract::Request,
) -> Response {
    let started = Instant::now();
    let (parts, body) = request.into_parts();
    let headers = parts.headers;
    // The key the request was let in under (`http::bearer_key`), charged with the tokens it is admitted for.
    let key = parts.extensions.get::<KeyPass>().cloned();
    let peer = parts.extensions.get::<Peer>().map(|p| p.0);
    let rid = request_id(&headers);
    let path = parts
        .extensions
        .get::<MatchedPath>()
        .map_or_else(|| parts.uri.path().to_owned(), |p| p.as_str().to_owned());
    let key_name = key.as_ref().map(|KeyPass(p)| p.key().name().to_owned());
    let mut trail = Trail::start(Some(Arc::clone(&app.sinks)), started, &path, &rid, key_name);
    trail.span = crate::telemetry::request_span(&headers, parts.method.as_str(), &path, &rid);
    let (answer, unread) = serve(&app, route, &headers, body, (peer, key), &rid, &mut trail).await;
    // An answer given before the body was read (429, 503, 415, and 413 for a declared length over the limit)
    // must reach a client that sends its whole body before it reads: the body is read and thrown away, at
    // most the limit plus what a 413 after reading lingers for, for at most 2 s.
    if let Some(body) = unread {
        discard_in_background(body, app.config.max_body + LINGER_BYTES);
    }
    let error_type = answer
        .as_ref()
        .err()
        .map(|e| e.kind().error_type().as_str());
    let mut resp = match answer {
        Ok(v) => json_response(StatusCode::OK, &v),
        Err(e) => error_response(e, &rid),
    };
    let elapsed_ms = started.elapsed().as_secs_f64() * 1000.0;
    if let Ok(v) = HeaderValue::from_str(&format!("app;dur={elapsed_ms:.1}")) {
        resp.headers_mut()
            .insert(HeaderName::from_static("server-timing"), v);
    }
    if let Some(p) = trail.priority {
        resp.headers_mut().insert(
            HeaderName::from_static(crate::urgency::PRIORITY_HEADER),
            HeaderValue::from_static(p.name()),
        );
    }
    trail.finish(resp.status().as_u16(), error_type);
    resp
}

/// Steps 1–3, then [`admit_and_answer`]; a refusal given before the body was read comes back with the body.
async fn serve<D: Decider, R: Route<D>>(
    app: &Arc<App<D>>,
    route: R,
    headers: &HeaderMap,
    body: HttpBody,
    (peer, key): (Option<IpAddr>, Option<KeyPass>),
    rid: &str,
    trail: &mut Trail,
) -> (Result<Value, ApiError>, Option<HttpBody>) {
    // What the headers say of its urgency (422 for a value that is not one). The priority known before the
    // body (the header's, else its key's default, within its key's maximum) is what its queue slot is taken
    // for: only a request known to be high before its body is read may use the slots beyond the depth.
    let header = match crate::urgency::from_headers(headers) {
        Ok(u) => u,
        Err(e) => return (Err(e), Some(body)),
    };
    let known = policy_of(key.as_ref()).apply(header.priority);
    let key_name = key.as_ref().map(|KeyPass(p)| p.key().name());
    let (codings, reading) = match before_the_body(app, headers, known, (peer, key_name)) {
        Ok(v) => v,
        Err(e) => return (Err(e), Some(body)),
    };
    let wait = app
        .config
        .body_read_timeout
        .max(app.config.header_read_timeout);
    let floor = BodyRate {
        window: app.config.body_rate_window,
        bytes_per_s: app.config.min_body_rate,
    };
    let raw = match tokio::time::timeout(wait, read_body(body, app.config.max_body, floor)).await {
        Ok(Ok(raw)) => raw,
        Ok(Err(e)) => return (Err(e), None),
        Err(_) => return (Err(ApiError::body_timeout()), None),
    };
    drop(reading);
    let slot = match app.queue.reserve(known) {
        Ok(slot) => slot,
        Err(e) => return (Err(e), None),
    };
    let request = Request {
        raw,
        codings,
        key,
        header,
        internal: false,
    };
    (
        admit_and_answer(app, route, slot, request, rid, trail).await,
        None,
    )
}

/// The priority policy of the key a request came in under (none: no say).
fn policy_of(key: Option<&KeyPass>) -> PriorityPolicy {
    key.map(|KeyPass(p)| p.key().policy().priority)
        .unwrap_or_default()
}

/// A request whose body has arrived, as the pipeline takes it to admission.
struct Request {
    /// The body as it came.
    raw: Vec<u8>,
    /// Its content codings, in the order they were applied.
    codings: Vec<Coding>,
    /// The key it came in under.
    key: Option<KeyPass>,
    /// What its headers say of its urgency.
    header: Urgency,
    /// The server's own decision (warm-up, canary), not a client's ([`crate::urgency::Submit::internal`]).
    internal: bool,
}

/// An answer given before the body was read must still reach the client: closing a socket with unread data
/// makes the kernel send a reset, which can destroy the answer before the client reads it (a 4 MB body
/// refused 429 arrived as a connection reset). So the unread body is read and thrown away — at most `max`
/// bytes and for at most 2 s — while the answer is written; past either bound the connection closes.
pub(crate) fn discard_in_background(body: HttpBody, max: usize) {
    tokio::spawn(async move {
        use http_body_util::BodyExt;
        let mut body = body;
        let mut seen = 0usize;
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            while let Some(Ok(frame)) = body.frame().await {
                if let Ok(data) = frame.into_data() {
                    seen += data.len();
                    if seen > max {
                        break;
                    }
                }
            }
        })
        .await;
    });
}

/// Steps 1–2 up to the body: draining, readiness, media type, codings, the declared length, room in the
/// queue, a body-read permit (shared between peer addresses and keys, `crate::permits`).
fn before_the_body<'a, D: Decider>(
    app: &'a Arc<App<D>>,
    headers: &HeaderMap,
    known: Priority,
    (peer, key): (Option<IpAddr>, Option<&str>),
) -> Result<(Vec<Coding>, BodyPermit<'a>), ApiError> {
    if app.draining.load(std::sync::atomic::Ordering::SeqCst) {
        return Err(ApiError::draining());
    }
    if !app.is_ready() {
        return Err(ApiError::not_ready());
    }
    if let Some(ct) = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        && ct
            .trim_start()
            .to_ascii_lowercase()
            .starts_with("multipart/")
    {
        return Err(ApiError::unsupported_media(
            "Kev is text-only: multipart bodies (image assets) are not supported; send the request as application/json",
        ));
    }
    let codings = content_codings(headers)?;
    // A declared length over the limit is refused before anything is held or read.
    if let Some(len) = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u128>().ok())
        && len > app.config.max_body as u128
    {
        return Err(ApiError::too_large(app.config.max_body));
    }
    // A full queue answers 429 before the body is even read; the slot itself is taken once the body is in,
    // so a slow body holds only its read permit.
    app.queue.has_room(known)?;
    let reading = app.bodies.try_take(peer, key).map_err(|why| {
        app.queue
            .stats()
            .rejected_bodies
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        match why {
            NoPermit::AllHeld => ApiError::bodies_full(app.bodies.capacity(), 1),
            NoPermit::OverShare => ApiError::bodies_over_share(app.bodies.capacity(), 1),
        }
    })?;
    Ok((codings, reading))
}

/// `/v1/systemone`'s answer to a body the server holds (the warm-up and canary decisions): steps 2 and 4–7, as
/// a request that arrived over HTTP, at `priority` (nothing recorded: no histogram, audit line or span).
pub(crate) async fn answer_body<D: Decider>(
    app: &Arc<App<D>>,
    body: Vec<u8>,
    rid: &str,
    priority: Priority,
) -> Result<Value, ApiError> {
    let slot = app.queue.reserve(priority)?;
    let request = Request {
        raw: body,
        codings: Vec::new(),
        key: None,
        header: Urgency {
            priority: Some(priority),
            deadline: None,
        },
        internal: true,
    };
    let mut trail = Trail::start(None, Instant::now(), "", rid, None);
    admit_and_answer(app, SystemOne, slot, request, rid, &mut trail).await
}

/// Steps 4–7: permit, decode, split, admit every part, submit them together, await and merge their answers.
async fn admit_and_answer<D: Decider, R: Route<D>>(
    app: &Arc<App<D>>,
    route: R,
    slot: crate::queue::Slot<D::Job>,
    request: Request,
    rid: &str,
    trail: &mut Trail,
) -> Result<Value, ApiError> {
    let Request {
        raw,
        codings,
        key,
        header,
        internal,
    } = request;
    // An admission permit (about one per core) before decoding, parsing or tokenizing.
    let wait = app.queue.deadline();
    let permit = tokio::time::timeout(wait, app.permits.acquire())
        .await
        .map_err(|_| ApiError::overloaded(wait.as_millis(), 1))?
        .map_err(|_| ApiError::draining())?;
    let decider = Arc::clone(&app.decider);
    let max_body = app.config.max_body;
    let splitter = route.clone();
    let owner = key.as_ref().map(|KeyPass(p)| p.key().name().to_owned());
    let admitting = Instant::now();
    let (plan, admitted, took) = tokio::task::spawn_blocking(move || {
        let bytes = decode_body(raw, &codings, max_body)?;
        let (parts, plan) = splitter.split(&decider, owner.as_deref(), bytes)?;
        let admitted = splitter.admit(&decider, owner.as_deref(), parts)?;
        Ok::<_, ApiError>((plan, admitted, admitting.elapsed()))
    })
    .await
    .map_err(|_| ApiError::internal())??;
    drop(permit);
    trail.admission = Some((admitting, took));
    let (parts, refused, mut how) = settle(app, &route, admitted, key.as_ref(), header, trail)?;
    how.internal = internal;
    if let Some(KeyPass(pass)) = &key {
        pass.key()
            .charge(parts.iter().map(|(_, tokens)| tokens).sum());
    }
    let submitted = Instant::now();
    trail.submitted = Some(submitted);
    let mut parts = if parts.is_empty() {
        // Every part refused (a batch of bad entries): nothing to run; the slot is released by its drop.
        Vec::new()
    } else {
        let ticket = app.queue.submit(slot, parts, how)?;
        metrics::gauge!("kev_queue_depth").set(app.queue.depth() as f64);
        app.queue.answer(ticket, rid).await?
    };
    let elapsed = submitted.elapsed();
    trail.answered(&mut parts);
    let (input, output) = parts.iter().fold((0, 0), |(i, o), p| {
        (
            i + p.body.usage().input_tokens,
            o + p.body.usage().output_tokens,
        )
    });
    metrics::counter!("kev_input_tokens_total").increment(input as u64);
    metrics::counter!("kev_output_tokens_total").increment(output as u64);
    route.merge(
        &app.decider,
        plan,
        Answers {
            parts,
            refused,
            elapsed,
        },
    )
}

/// A request's admitted parts under its key's policy: the parts to run, the parts refused in their place (a
/// batch's), and how it is queued (its priority and deadline, its span). A part answered by an adapter the key
/// may not use is a 403 — the whole request's, or a batch entry's in its place.
#[allow(clippy::type_complexity)]
fn settle<D: Decider, R: Route<D>>(
    app: &App<D>,
    route: &R,
    admitted: Admitted<D::Job>,
    key: Option<&KeyPass>,
    header: Urgency,
    trail: &mut Trail,
) -> Result<(Vec<(D::Job, usize)>, Vec<(usize, ApiError)>, Submit), ApiError> {
    let mut parts = Vec::with_capacity(admitted.len());
    let mut refused = Vec::new();
    let mut asked = Vec::with_capacity(admitted.len());
    let wants_states = trail.wants_states();
    for (i, a) in admitted.into_iter().enumerate() {
        let a = match a {
            Ok(a) => a,
            Err(e) => {
                refused.push((i, e));
                continue;
            }
        };
        let info = app.decider.job_info(&a.job);
        if let (Some(KeyPass(pass)), Some(adapter)) = (key, &info.adapter)
            && !pass.key().may_use(&adapter.name)
        {
            let e = ApiError::adapter_forbidden(pass.key().name(), &adapter.name);
            if !route.independent_parts() {
                return Err(e);
            }
            refused.push((i, e));
            continue;
        }
        if let Some(adapter) = &info.adapter {
            trail.adapter(adapter);
        }
        if wants_states && let Some(state) = app.decider.job_state(&a.job) {
            trail.states.push(state);
        }
        asked.push(info.urgency);
        parts.push((a.job, a.tokens));
    }
    trail.parts = parts.len();
    let (priority, deadline) = crate::urgency::settle(asked, header, policy_of(key), trail.arrived);
    trail.priority = Some(priority);
    trail.deadline_ms = deadline.map(|d| d.ms);
    let how = Submit {
        priority,
        deadline,
        span: trail.span.clone(),
        internal: false,
    };
    Ok((parts, refused, how))
}

/// Past the limit, read (and drop) this much more before answering 413, so a client still sending its
/// body gets the 413 instead of a connection reset.
const LINGER_BYTES: usize = 16 << 20;

/// The slowest a body may arrive: at least `bytes_per_s` over any `window` (0: no floor).
#[derive(Debug, Clone, Copy)]
pub(crate) struct BodyRate {
    pub window: Duration,
    pub bytes_per_s: usize,
}

/// The rate floor as a bucket of credit: it starts with a window's worth, every byte that arrives adds one
/// (never past a window's worth), and it drains at the floor rate; empty, the body is cut. So a body must
/// keep up with the floor over any window, and a stall is cut within a window whatever came before it (a
/// client that sends 480 KB at once and stops is cut a window later, not at the body timeout).
struct Credit {
    rate: f64,
    cap: f64,
    left: f64,
    at: tokio::time::Instant,
}

impl Credit {
    fn new(floor: BodyRate, now: tokio::time::Instant) -> Self {
        let rate = floor.bytes_per_s as f64;
        let cap = rate * floor.window.as_secs_f64().max(0.001);
        Credit {
            rate,
            cap,
            left: cap,
            at: now,
        }
    }

    /// When the credit runs out if nothing more arrives.
    fn due(&self) -> tokio::time::Instant {
        self.at + Duration::from_secs_f64(self.left / self.rate)
    }

    fn arrived(&mut self, bytes: usize, now: tokio::time::Instant) {
        let spent = now.saturating_duration_since(self.at).as_secs_f64() * self.rate;
        self.left = ((self.left - spent).max(0.0) + bytes as f64).min(self.cap);
        self.at = now;
    }
}

/// Read a request body, at most `limit` bytes (413 past it), held to the rate floor ([`Credit`]): a client
/// that dribbles its body, or stalls after a burst, is answered 408 within a window instead of after the
/// whole body timeout.
pub(crate) async fn read_body(
    body: HttpBody,
    limit: usize,
    floor: BodyRate,
) -> Result<Vec<u8>, ApiError> {
    use http_body_util::BodyExt;
    let mut body = body;
    let mut buf = Vec::new();
    let mut seen = 0usize;
    let mut credit =
        (floor.bytes_per_s > 0).then(|| Credit::new(floor, tokio::time::Instant::now()));
    loop {
        let next = body.frame();
        let frame = match &credit {
            None => next.await,
            Some(c) => match tokio::time::timeout_at(c.due(), next).await {
                Ok(f) => f,
                Err(_) => return Err(ApiError::body_timeout()),
            },
        };
        let Some(frame) = frame else { break };
        let frame = frame
            .map_err(|e| ApiError::bad_body(format!("could not read the request body: {e}")))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if let Some(c) = &mut credit {
            c.arrived(data.len(), tokio::time::Instant::now());
        }
        seen += data.len();
        if seen > limit {
            buf = Vec::new();
            if seen > limit + LINGER_BYTES {
                break;
            }
        } else {
            buf.extend_from_slice(&data);
        }
    }
    if seen > limit {
        return Err(ApiError::too_large(limit));
    }
    Ok(buf)
}

/// A content coding the server decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Coding {
    Gzip,
    Zstd,
    Deflate,
}

/// The codings of `Content-Encoding`, in the order they were applied (names case-insensitive, RFC 9110
/// §8.4.1; `identity` skipped; several headers or comma-separated lists stack). 415 naming the first
/// coding the server does not decode.
pub(crate) fn content_codings(headers: &HeaderMap) -> Result<Vec<Coding>, ApiError> {
    let mut out = Vec::new();
    for value in headers.get_all(header::CONTENT_ENCODING) {
        let text = value.to_str().map_err(|_| {
            ApiError::unsupported_media(
                "unreadable Content-Encoding: send identity, gzip, zstd or deflate",
            )
        })?;
        for name in text.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let coding = match name.to_ascii_lowercase().as_str() {
                "identity" => continue,
                "gzip" | "x-gzip" => Coding::Gzip,
                "zstd" => Coding::Zstd,
                "deflate" => Coding::Deflate,
                _ => {
                    return Err(ApiError::unsupported_media(format!(
                        "unsupported Content-Encoding {name:?}: send identity, gzip, zstd or deflate (stacked codings are decoded in order)"
                    )));
                }
            };
            out.push(coding);
        }
    }
    Ok(out)
}

/// A request body as the decision routes read it: its `Content-Encoding` codings undone (415 for one the
/// server does not decode, 400 for data that is not what it says, 413 past `limit`). For a front end that
/// must look into a body before it reaches a server (`kev.serve` routes by the state it names) with the
/// server's own reading of the header and the codings.
pub fn decode_request_body(
    headers: &HeaderMap,
    raw: Vec<u8>,
    limit: usize,
) -> Result<Vec<u8>, ApiError> {
    decode_body(raw, &content_codings(headers)?, limit)
}

/// Undo the codings, last applied first, each output held to `limit` bytes (413 past it, so a
/// decompression bomb costs at most `limit` bytes of work per coding).
pub(crate) fn decode_body(
    raw: Vec<u8>,
    codings: &[Coding],
    limit: usize,
) -> Result<Vec<u8>, ApiError> {
    use std::io::Read;
    let mut data = raw;
    for coding in codings.iter().rev() {
        let mut out = Vec::new();
        let cap = limit as u64 + 1;
        let read = match coding {
            Coding::Gzip => flate2::read::MultiGzDecoder::new(&data[..])
                .take(cap)
                .read_to_end(&mut out),
            Coding::Deflate => flate2::read::ZlibDecoder::new(&data[..])
                .take(cap)
                .read_to_end(&mut out),
            Coding::Zstd => zstd::stream::read::Decoder::new(&data[..])
                .and_then(|d| d.take(cap).read_to_end(&mut out)),
        };
        if read.is_err() {
            return Err(ApiError::bad_body(
                format!("the request body is not valid {coding:?} data (Content-Encoding)")
                    .to_lowercase(),
            ));
        }
        if out.len() > limit {
            return Err(ApiError::too_large(limit));
        }
        data = out;
    }
    Ok(data)
}
