//! Pinned states (`kev_decide::pinned`): `POST /v1/systemone/states {model?, state, ttl_s?}` runs a state's
//! prefix once — through the one admission pipeline, as a request of one question whose answer is not used —
//! and keeps its snapshot under a new id until `ttl_s` (default 3,600, at most 86,400) has passed since it was
//! answered, or it is unpinned; it answers `{id, tokens, bytes, expires_at, ready, usage}`. A pin exists only
//! once its request is answered 200: one cancelled, abandoned, timed out or refused leaves nothing (its
//! reservation is dropped with its handler, [`Unanswered`]). A `/v1/systemone` (or `/separate`, or a batch
//! entry) naming it in the extension field `x_state_id` gets that state put in by admission (a `state` of its
//! own must be the same) and runs only its question rows; `GET` / `DELETE /v1/systemone/states/{id}` read and
//! unpin it. Pins belong to the API key that made them (or to nobody when auth is off): another key's requests
//! neither find nor remove them (404). Pinned bytes have their own budget (`--pin-bytes`), shared between the
//! keys (`keys::Keys::pin_share`): a snapshot over its key's share is a 413, one that does not fit beside the
//! key's other pins (or everyone's, in the budget) a 429 whose `Retry-After` says when the earliest of them
//! expires.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use kev_contract::ContractError;
use serde_json::{Value, json};

use kev_decide::{PinOrder, PinRefusal};

use crate::error::ApiError;
use crate::pipeline::{Admitted, Answers, Route, handle};
use crate::wire::{KeyPass, error_response, json_response, request_id};
use crate::wire::{invalid, parse_json};
use crate::{App, Body, Decider};

/// Longest a pin may live (s).
pub const MAX_TTL_S: u64 = 86_400;

/// A pin's life when the request does not say (s).
pub const DEFAULT_TTL_S: u64 = 3_600;

fn owner_of(request: &axum::extract::Request) -> Option<String> {
    request
        .extensions()
        .get::<KeyPass>()
        .map(|k| k.0.key().name().to_owned())
}

/// Pin a state: run its prefix once and keep it for later requests
#[utoipa::path(
    post,
    path = "/v1/systemone/states",
    request_body(content = crate::schemas::PinRequest, example = json!({"state": "A long contract …", "ttl_s": 600})),
    responses((status = 200, description = "The pinned state", body = crate::schemas::PinnedState,
        example = json!({"id": "3f2a…", "tokens": 1518, "bytes": 157286400, "expires_at": 1796400000, "ready": true,
                         "usage": {"input_tokens": 1540}}))),
)]
pub(crate) async fn pin<D: Decider>(
    State(app): State<Arc<App<D>>>,
    request: axum::extract::Request,
) -> Response {
    let owner = owner_of(&request);
    let share = app
        .keys
        .as_ref()
        .and_then(|k| k.pin_share(owner.as_deref()?, app.decider.pin_budget()));
    let ticket = Arc::new(Ticket {
        decider: Arc::clone(&app.decider),
        id: format!(
            "{}{}",
            app.config.pin_id_prefix,
            uuid::Uuid::new_v4().simple()
        ),
        phase: std::sync::Mutex::new((false, false)),
    });
    let route = Pin {
        ticket: Arc::clone(&ticket),
        owner,
        share,
    };
    // Whatever ends this handler before its 200 — a refusal, the queue deadline, the request timeout, a
    // hang-up — drops the reservation with it, even one admission makes after the handler is gone.
    let _unanswered = Unanswered(ticket);
    handle(app, route, request).await
}

/// A pin request's id and what has become of it: `(handler gone, reserved)`. Whichever of the two comes
/// second drops the reservation (`Decider::pin_abandon`; a pin already answered stays): admission runs on a
/// blocking worker that a hang-up does not stop, so it may reserve after the handler is gone.
struct Ticket<D: Decider> {
    decider: Arc<D>,
    id: String,
    phase: std::sync::Mutex<(bool, bool)>,
}

impl<D: Decider> Ticket<D> {
    fn phase(&self) -> std::sync::MutexGuard<'_, (bool, bool)> {
        self.phase.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Admission reserved the pin: kept while its handler waits, dropped at once if it is gone.
    fn reserved(&self) -> Result<(), ApiError> {
        let mut phase = self.phase();
        phase.1 = true;
        if phase.0 {
            self.decider.pin_abandon(&self.id);
            return Err(ApiError::draining());
        }
        Ok(())
    }
}

/// The handler's hold on its [`Ticket`]: dropped with the handler.
struct Unanswered<D: Decider>(Arc<Ticket<D>>);

impl<D: Decider> Drop for Unanswered<D> {
    fn drop(&mut self) {
        let mut phase = self.0.phase();
        phase.0 = true;
        if phase.1 {
            self.0.decider.pin_abandon(&self.0.id);
        }
    }
}

/// A pinned state, as its owner sees it
#[utoipa::path(
    get,
    path = "/v1/systemone/states/{id}",
    params(("id" = String, Path, description = "The id `POST /v1/systemone/states` answered")),
    responses((status = 200, description = "The pinned state", body = crate::schemas::PinnedState)),
)]
pub(crate) async fn pin_get<D: Decider>(
    State(app): State<Arc<App<D>>>,
    Path(id): Path<String>,
    request: axum::extract::Request,
) -> Response {
    let owner = owner_of(&request);
    match app.decider.pin_info(&id, owner.as_deref()) {
        Some(v) => json_response(StatusCode::OK, &v),
        None => error_response(no_such_pin(id), &request_id(request.headers())),
    }
}

/// Unpin a state
#[utoipa::path(
    delete,
    path = "/v1/systemone/states/{id}",
    params(("id" = String, Path, description = "The id `POST /v1/systemone/states` answered")),
    responses((status = 200, description = "Unpinned", body = Object, example = json!({"id": "3f2a…", "deleted": true}))),
)]
pub(crate) async fn pin_delete<D: Decider>(
    State(app): State<Arc<App<D>>>,
    Path(id): Path<String>,
    request: axum::extract::Request,
) -> Response {
    let owner = owner_of(&request);
    if app.decider.unpin(&id, owner.as_deref()) {
        json_response(StatusCode::OK, &json!({"id": id, "deleted": true}))
    } else {
        error_response(no_such_pin(id), &request_id(request.headers()))
    }
}

/// The 404 of a pin that is not (or no longer, or not for this key) there; a long id is not quoted whole.
fn no_such_pin(id: String) -> ApiError {
    ApiError::from_wire(&PinRefusal::NotFound(id))
}

/// `POST /v1/systemone/states`: one part, admitted as a pin.
struct Pin<D: Decider> {
    ticket: Arc<Ticket<D>>,
    owner: Option<String>,
    share: Option<usize>,
}

impl<D: Decider> Clone for Pin<D> {
    fn clone(&self) -> Self {
        Pin {
            ticket: Arc::clone(&self.ticket),
            owner: self.owner.clone(),
            share: self.share,
        }
    }
}

/// `ttl_s` of a pin body: 422 unless a whole number of seconds in 1..=86,400.
fn ttl_of(body: &Value) -> Result<Duration, ApiError> {
    let Some(v) = body.get("ttl_s") else {
        return Ok(Duration::from_secs(DEFAULT_TTL_S));
    };
    match v.as_u64() {
        Some(s) if (1..=MAX_TTL_S).contains(&s) => Ok(Duration::from_secs(s)),
        _ => Err(ContractError::Invalid(vec![invalid(
            &["ttl_s"],
            "int_range",
            "Input should be a whole number of seconds from 1 to 86400",
            v.clone(),
            Some(json!({"ge": 1, "le": MAX_TTL_S})),
        )])
        .into()),
    }
}

impl<D: Decider> Route<D> for Pin<D> {
    type Plan = ();

    fn split(
        &self,
        _: &D,
        _: Option<&str>,
        bytes: Vec<u8>,
    ) -> Result<(Vec<Body<'static>>, ()), ApiError> {
        // Read once: `admit` takes its `ttl_s`, `Kev::admit_pin` its state, model and `x_logits`.
        Ok((vec![Body::Value(parse_json(&bytes)?)], ()))
    }

    fn admit(
        &self,
        decider: &D,
        _: Option<&str>,
        parts: Vec<Body<'static>>,
    ) -> Result<Admitted<D::Job>, ApiError> {
        let Some(Body::Value(body)) = parts.into_iter().next() else {
            return Err(ApiError::internal());
        };
        let order = PinOrder {
            id: self.ticket.id.clone(),
            owner: self.owner.clone(),
            ttl: ttl_of(&body)?,
            share: self.share,
        };
        let admitted = decider.admit_pin(Body::Value(body), &order)?;
        self.ticket.reserved()?;
        Ok(vec![Ok(admitted)])
    }

    fn merge(&self, decider: &D, _: (), answers: Answers) -> Result<Value, ApiError> {
        // Answered: the pin exists from now on, and its TTL runs from now.
        let mut info = decider.pin_commit(&self.ticket.id)?;
        let input: usize = answers
            .parts
            .iter()
            .map(|p| p.body.usage().input_tokens)
            .sum();
        info["usage"] = json!({"input_tokens": input});
        Ok(info)
    }
}
