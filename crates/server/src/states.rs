//! Pinned states (`kev_decide::pinned`): `POST /v1/systemone/states {model?, state, ttl_s?}` runs a state's
//! prefix once — through the one admission pipeline, as a request of one question whose answer is not used —
//! and keeps its snapshot under a new id until `ttl_s` (default 3,600, at most 86,400) passes or it is unpinned;
//! it answers `{id, tokens, bytes, expires_at, ready, usage}`. A `/v1/systemone` (or `/separate`) request naming
//! it in the extension field `x_state_id` gets that state put in (a `state` of its own must be the same) and
//! runs only its question rows; `GET` / `DELETE /v1/systemone/states/{id}` read and unpin it. Pins belong to the
//! API key that made them (or to nobody when auth is off): another key's requests neither find nor remove them
//! (404). Pinned bytes have their own budget (`--pin-bytes`): a snapshot over the whole budget is a 413, one
//! that does not fit beside the others a 429 (retry after unpinning).

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use kev_contract::ContractError;
use serde_json::{Value, json};

use crate::error::ApiError;
use crate::pipeline::{Admitted, Answers, Route, handle};
use crate::state_ref::no_such_pin;
use crate::wire::{KeyPass, error_response, json_response, request_id};
use crate::wire::{invalid, parse_json};
use crate::{App, Decider};

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
    let route = Pin {
        id: format!(
            "{}{}",
            app.config.pin_id_prefix,
            uuid::Uuid::new_v4().simple()
        ),
        owner: owner_of(&request),
    };
    handle(app, route, request).await
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
        None => error_response(no_such_pin(&id), &request_id(request.headers())),
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
        error_response(no_such_pin(&id), &request_id(request.headers()))
    }
}

/// `POST /v1/systemone/states`: one part, admitted as a pin.
#[derive(Clone)]
struct Pin {
    id: String,
    owner: Option<String>,
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

impl<D: Decider> Route<D> for Pin {
    type Plan = ();

    fn split(&self, _: &D, bytes: Vec<u8>) -> Result<(Vec<Vec<u8>>, ()), ApiError> {
        // One part, the body as sent: `admit` reads its `ttl_s`, `Kev::admit_pin` its state.
        Ok((vec![bytes], ()))
    }

    fn admit(
        &self,
        decider: &D,
        _: Option<&str>,
        bodies: &[Vec<u8>],
    ) -> Result<Admitted<D::Job>, ApiError> {
        let body = bodies.first().ok_or_else(ApiError::internal)?;
        let ttl = ttl_of(&parse_json(body)?)?;
        Ok(vec![Ok(decider.admit_pin(
            body,
            &self.id,
            self.owner.as_deref(),
            ttl,
        )?)])
    }

    fn merge(&self, decider: &D, _: (), answers: Answers) -> Result<Value, ApiError> {
        if let Some(e) = decider.pin_refusal(&self.id) {
            return Err(e);
        }
        let mut info = decider
            .pin_info(&self.id, self.owner.as_deref())
            .ok_or_else(ApiError::internal)?;
        let input: usize = answers
            .parts
            .iter()
            .map(|p| p.body.usage().input_tokens)
            .sum();
        info["usage"] = json!({"input_tokens": input});
        Ok(info)
    }
}
