//! `kev._kev.route_key`: what a fleet's front end routes a decision request by, read from the body the way
//! the server reads it (its `Content-Encoding` codings undone by kev-server's own decoder, the JSON read as
//! Python's `json.loads` does, `kev_contract::python_loads`). It never refuses: a body it cannot read has
//! no key (the replica it lands on answers it with the server's error).
//!
//! The key of a request is its pinned state's id (`x_state_id`), or a digest of its state as the contract
//! reads it (compact JSON of the parsed value) with the `model` it names. The prepared-state cache is keyed
//! by the adapter and the state's tokens, which are a function of the state and the options every replica
//! shares, so equal digests mean equal cache keys, without tokenizing in the front end.

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// What a request is routed by.
#[derive(Debug, Default, PartialEq)]
struct Key {
    /// The pinned state it names (`x_state_id`; a batch's first entry that names one).
    pin: Option<String>,
    /// The `model` it names (a batch entry's own, else the batch's).
    model: Option<String>,
    /// sha256 of the state's compact JSON (a batch's first entry's).
    state: Option<[u8; 32]>,
}

/// The route key of a request body: `(pin, model, state digest)`, each `None` where the body does not say.
/// `headers` are the request's (for `Content-Encoding`); `max_body` bounds the decoded body as the server
/// does. Runs with the GIL released.
#[pyfunction]
pub(crate) fn route_key<'py>(
    py: Python<'py>,
    headers: Vec<(Vec<u8>, Vec<u8>)>,
    body: Vec<u8>,
    max_body: usize,
) -> (Option<String>, Option<String>, Option<Bound<'py, PyBytes>>) {
    let key = py.detach(|| key_of(&headers, body, max_body));
    let state = key.state.map(|d| PyBytes::new(py, &d));
    (key.pin, key.model, state)
}

fn key_of(headers: &[(Vec<u8>, Vec<u8>)], body: Vec<u8>, max_body: usize) -> Key {
    let mut map = HeaderMap::new();
    for (name, value) in headers {
        if let (Ok(n), Ok(v)) = (HeaderName::from_bytes(name), HeaderValue::from_bytes(value)) {
            map.append(n, v);
        }
    }
    let Ok(bytes) = kev_server::decode_request_body(&map, body, max_body) else {
        return Key::default();
    };
    match kev_contract::python_loads(&bytes) {
        Ok(Value::Object(fields)) => of_object(&fields, None),
        _ => Key::default(),
    }
}

/// A request object's key; `outer_model` is a batch's `model`, which its entries inherit.
fn of_object(fields: &serde_json::Map<String, Value>, outer_model: Option<&str>) -> Key {
    let model = fields
        .get("model")
        .and_then(Value::as_str)
        .or(outer_model)
        .map(str::to_owned);
    // `/v1/systemone/batch`: its entries (or the `states` shorthand); the first pin any entry names wins,
    // else the first entry's state.
    if let Some(Value::Array(entries)) = fields.get("requests") {
        let keys: Vec<Key> = entries
            .iter()
            .filter_map(Value::as_object)
            .map(|e| of_object(e, model.as_deref()))
            .collect();
        if let Some(pinned) = keys.iter().position(|k| k.pin.is_some()) {
            return keys.into_iter().nth(pinned).unwrap_or_default();
        }
        return keys.into_iter().next().unwrap_or_default();
    }
    if let Some(Value::Array(states)) = fields.get("states") {
        return Key {
            pin: None,
            model,
            state: states.first().map(digest),
        };
    }
    // `/v1/systemone/permute`: the inner request's.
    if let Some(Value::Object(inner)) = fields.get("request") {
        return of_object(inner, model.as_deref());
    }
    Key {
        pin: fields
            .get(kev_server::STATE_ID_FIELD)
            .and_then(Value::as_str)
            .map(str::to_owned),
        model,
        state: fields.get("state").map(digest),
    }
}

fn digest(state: &Value) -> [u8; 32] {
    Sha256::digest(kev_contract::compact_json(state).as_bytes()).into()
}
