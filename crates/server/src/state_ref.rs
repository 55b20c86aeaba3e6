//! A request naming a pinned state (`x_state_id`, see `states`): the pinned state put in as its `state`
//! before the request is admitted, for whichever route reads it.

use kev_contract::{ContractError, ErrorKind};
use serde_json::Value;

use crate::Decider;
use crate::error::ApiError;
use crate::wire::invalid;

/// The request extension that names a pinned state.
pub const STATE_ID_FIELD: &str = "x_state_id";

/// The 404 of a pin that is not (or no longer, or not for this key) there.
pub(crate) fn no_such_pin(id: &str) -> ApiError {
    ApiError::typed(
        ErrorKind::NotFound,
        format!(
            "no pinned state {id:?}: it expired, was unpinned, or was pinned under another API key"
        ),
    )
}

/// A request body with its `x_state_id` resolved: the pinned state put in as its `state` (for `owner`'s pins
/// only). A body without the field is returned as it is; an unknown id is a 404, a `state` of its own that
/// differs from the pinned one a 422.
pub(crate) fn resolve<D: Decider>(
    decider: &D,
    owner: Option<&str>,
    body: Vec<u8>,
) -> Result<Vec<u8>, ApiError> {
    let needle = format!("\"{STATE_ID_FIELD}\"");
    if !body.windows(needle.len()).any(|w| w == needle.as_bytes()) {
        return Ok(body);
    }
    // A body that does not read is left for the route to refuse, with its own error.
    let Ok(Value::Object(mut fields)) = kev_contract::python_loads(&body) else {
        return Ok(body);
    };
    let Some(id) = fields.get(STATE_ID_FIELD) else {
        return Ok(body);
    };
    let Some(id) = id.as_str().map(str::to_owned) else {
        return Err(ContractError::Invalid(vec![invalid(
            &[STATE_ID_FIELD],
            "string_type",
            "Input should be a valid string",
            id.clone(),
            None,
        )])
        .into());
    };
    let state = decider
        .pinned_state(&id, owner)
        .ok_or_else(|| no_such_pin(&id))?;
    if fields.get("state").is_some_and(|s| *s != state) {
        return Err(ApiError::unanswerable(format!(
            "the request's state is not the state pinned as {id:?}: send one of the two"
        )));
    }
    fields.insert("state".into(), state);
    Ok(kev_contract::compact_json(&Value::Object(fields)).into_bytes())
}
