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
//!    (the route's own checks and its parts), [`Route::admit`] — by default [`Decider::admit_parts`]: every
//!    part validated and compiled, the per-request work caps held for the parts together (413 naming the cap),
//!    all or nothing; a batch ([`Decider::admit_batch`]) admits each part on its own instead, a refused one
//!    answered in its place;
//! 6. the parts submitted together on the request's slot ([`crate::queue::Queue::submit`]) and their answers
//!    awaited ([`crate::queue::Queue::answer`]): 529 if none has started at the queue deadline; a hang-up or the
//!    request timeout (408) drops the handler and stops every part before its next pass;
//! 7. [`Route::merge`] → 200.
//!
//! A new decision route is one more [`Route`]: its parts get every guard above without a line of its own
//! (`/v1/systemone/batch` is one, in `batch.rs`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::Response;
use serde_json::{Value, json};

use crate::error::ApiError;
use crate::queue::Answered;
use crate::wire::{KeyPass, error_response, json_response, request_id};
use crate::{Admission, App, Decider};

/// The admission of a route's parts: one per part, in order, each admitted or refused.
pub(crate) type Admitted<J> = Vec<Result<Admission<J>, ApiError>>;

/// What a decision route makes of a request.
pub(crate) trait Route<D: Decider>: Clone + Send + 'static {
    /// What [`Route::merge`] needs from [`Route::split`].
    type Plan: Send + 'static;

    /// The decoded body → the request bodies of its parts (at least one) and the plan; the route's own checks
    /// answer here. Runs on a blocking worker holding an admission permit.
    fn split(&self, decider: &D, body: Vec<u8>) -> Result<(Vec<Vec<u8>>, Self::Plan), ApiError>;

    /// Admit the parts. The default holds them to the per-request caps together, all or nothing (the parts of
    /// one request); a route of independent requests admits each on its own, and a refused part is answered
    /// in its place ([`Answers::refused`]). Runs on the same blocking worker, after [`Route::split`].
    ///
    /// `owner` is the key the request came in under (a route whose entries may name a pinned state resolves
    /// them as that key's).
    fn admit(
        &self,
        decider: &D,
        owner: Option<&str>,
        bodies: &[Vec<u8>],
    ) -> Result<Admitted<D::Job>, ApiError> {
        let _ = owner;
        Ok(decider.admit_parts(bodies)?.into_iter().map(Ok).collect())
    }

    /// The parts' answers, in order → the response body.
    fn merge(&self, decider: &D, plan: Self::Plan, answers: Answers) -> Result<Value, ApiError>;
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

    fn split(&self, _: &D, body: Vec<u8>) -> Result<(Vec<Vec<u8>>, ()), ApiError> {
        Ok((vec![body], ()))
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
    let rid = request_id(&headers);
    let (answer, unread) = serve(&app, route, &headers, body, key, &rid).await;
    // An answer given before the body was read (429, 503, 415, and 413 for a declared length over the limit)
    // must reach a client that sends its whole body before it reads: the body is read and thrown away, at
    // most the limit plus what a 413 after reading lingers for, for at most 2 s.
    if let Some(body) = unread {
        discard_in_background(body, app.config.max_body + LINGER_BYTES);
    }
    let mut resp = match answer {
        Ok(v) => json_response(StatusCode::OK, &v),
        Err(e) => error_response(e, &rid),
    };
    let elapsed_ms = started.elapsed().as_secs_f64() * 1000.0;
    if let Ok(v) = HeaderValue::from_str(&format!("app;dur={elapsed_ms:.1}")) {
        resp.headers_mut()
            .insert(HeaderName::from_static("server-timing"), v);
    }
    resp
}

/// Steps 1–3, then [`admit_and_answer`]; a refusal given before the body was read comes back with the body.
async fn serve<D: Decider, R: Route<D>>(
    app: &Arc<App<D>>,
    route: R,
    headers: &HeaderMap,
    body: Body,
    key: Option<KeyPass>,
    rid: &str,
) -> (Result<Value, ApiError>, Option<Body>) {
    let (codings, reading) = match before_the_body(app, headers) {
        Ok(v) => v,
        Err(e) => return (Err(e), Some(body)),
    };
    let wait = app
        .config
        .body_read_timeout
        .max(app.config.header_read_timeout);
    let floor = BodyRate {
        grace: app.config.body_grace,
        bytes_per_s: app.config.min_body_rate,
    };
    let raw = match tokio::time::timeout(wait, read_body(body, app.config.max_body, floor)).await {
        Ok(Ok(raw)) => raw,
        Ok(Err(e)) => return (Err(e), None),
        Err(_) => return (Err(ApiError::body_timeout()), None),
    };
    drop(reading);
    let slot = match app.queue.reserve() {
        Ok(slot) => slot,
        Err(e) => return (Err(e), None),
    };
    (
        admit_and_answer(app, route, slot, raw, codings, key, rid).await,
        None,
    )
}

/// An answer given before the body was read must still reach the client: closing a socket with unread data
/// makes the kernel send a reset, which can destroy the answer before the client reads it (a 4 MB body
/// refused 429 arrived as a connection reset). So the unread body is read and thrown away — at most `max`
/// bytes and for at most 2 s — while the answer is written; past either bound the connection closes.
pub(crate) fn discard_in_background(body: Body, max: usize) {
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
/// queue, a body-read permit.
fn before_the_body<'a, D: Decider>(
    app: &'a Arc<App<D>>,
    headers: &HeaderMap,
) -> Result<(Vec<Coding>, tokio::sync::SemaphorePermit<'a>), ApiError> {
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
    app.queue.has_room()?;
    let reading = app.bodies.try_acquire().map_err(|_| {
        app.queue
            .stats()
            .rejected_bodies
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        ApiError::bodies_full(crate::body_permits(app.queue.capacity()), 1)
    })?;
    Ok((codings, reading))
}

/// `/v1/systemone`'s answer to a body the server holds (the warm-up request): steps 2 and 4–7, as a request
/// that arrived over HTTP.
pub(crate) async fn answer_body<D: Decider>(
    app: &Arc<App<D>>,
    body: Vec<u8>,
    rid: &str,
) -> Result<Value, ApiError> {
    let slot = app.queue.reserve()?;
    admit_and_answer(app, SystemOne, slot, body, Vec::new(), None, rid).await
}

/// Steps 4–7: permit, decode, split, admit every part, submit them together, await and merge their answers.
async fn admit_and_answer<D: Decider, R: Route<D>>(
    app: &Arc<App<D>>,
    route: R,
    slot: crate::queue::Slot<D::Job>,
    raw: Vec<u8>,
    codings: Vec<Coding>,
    key: Option<KeyPass>,
    rid: &str,
) -> Result<Value, ApiError> {
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
    let (plan, admitted) = tokio::task::spawn_blocking(move || {
        let bytes = decode_body(raw, &codings, max_body)?;
        // A pinned state named by `x_state_id` (the requester's own) becomes the request's state.
        let bytes = crate::state_ref::resolve(&*decider, owner.as_deref(), bytes)?;
        let (bodies, plan) = splitter.split(&decider, bytes)?;
        let admitted = splitter.admit(&decider, owner.as_deref(), &bodies)?;
        Ok::<_, ApiError>((plan, admitted))
    })
    .await
    .map_err(|_| ApiError::internal())??;
    drop(permit);
    let mut parts = Vec::with_capacity(admitted.len());
    let mut refused = Vec::new();
    for (i, a) in admitted.into_iter().enumerate() {
        match a {
            Ok(a) => parts.push((a.job, a.tokens)),
            Err(e) => refused.push((i, e)),
        }
    }
    if let Some(KeyPass(pass)) = &key {
        pass.key()
            .charge(parts.iter().map(|(_, tokens)| tokens).sum());
    }
    let submitted = Instant::now();
    let parts = if parts.is_empty() {
        // Every part refused (a batch of bad entries): nothing to run; the slot is released by its drop.
        Vec::new()
    } else {
        let ticket = app.queue.submit(slot, parts)?;
        metrics::gauge!("kev_queue_depth").set(app.queue.depth() as f64);
        app.queue.answer(ticket, rid).await?
    };
    let elapsed = submitted.elapsed();
    // Per request: its wait is its first part's, its engine time its longest part's.
    let queued = parts.iter().map(|p| p.queued).min().unwrap_or_default();
    let compute = parts.iter().map(|p| p.compute).max().unwrap_or_default();
    metrics::histogram!("kev_queue_wait_seconds").record(queued.as_secs_f64());
    metrics::histogram!("kev_compute_seconds").record(compute.as_secs_f64());
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

/// Past the limit, read (and drop) this much more before answering 413, so a client still sending its
/// body gets the 413 instead of a connection reset.
const LINGER_BYTES: usize = 16 << 20;

/// The slowest a body may arrive: after `grace`, on average at least `bytes_per_s` (0: no floor).
#[derive(Debug, Clone, Copy)]
pub(crate) struct BodyRate {
    pub grace: Duration,
    pub bytes_per_s: usize,
}

/// Read a request body, at most `limit` bytes (413 past it), held to a rate floor: a client that dribbles its body (a slow-loris holding a queue slot)
/// is answered 408 once it falls behind `grace + received / rate`, instead of after the whole body timeout.
pub(crate) async fn read_body(
    body: Body,
    limit: usize,
    floor: BodyRate,
) -> Result<Vec<u8>, ApiError> {
    use http_body_util::BodyExt;
    let mut body = body;
    let mut buf = Vec::new();
    let mut seen = 0usize;
    let start = tokio::time::Instant::now();
    loop {
        let next = body.frame();
        let frame = if floor.bytes_per_s == 0 {
            next.await
        } else {
            let due = start
                + floor.grace
                + Duration::from_secs_f64(seen as f64 / floor.bytes_per_s as f64);
            match tokio::time::timeout_at(due, next).await {
                Ok(f) => f,
                Err(_) => return Err(ApiError::body_timeout()),
            }
        };
        let Some(frame) = frame else { break };
        let frame = frame
            .map_err(|e| ApiError::bad_body(format!("could not read the request body: {e}")))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
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
