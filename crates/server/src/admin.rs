//! Adapters changed live: `GET /v1/adapters`, `POST /v1/adapters {name, dir}`, `DELETE /v1/adapters/{name}`, and
//! the `--adapters-file` read again on SIGHUP.
//!
//! **Secure by default**: the routes answer only an admin key — `KEV_ADMIN_KEY` / `--admin-key-file`, or a key
//! marked `"admin": true` in the `--api-keys` file — compared in constant time; with no admin key configured
//! they answer 403 saying how to enable them. They sit outside the API keys' bearer check (an admin key need not
//! be an API key) and each change writes an audit line.
//!
//! Adding reads and checks the directory on a blocking worker (the same checks and messages as at start: 422
//! `invalid_request_error` naming the problem, nothing disturbed), then installs the adapter between passes
//! (`kev_decide::adapters`): serving never stops. Removing answers at once; requests already admitted on the
//! adapter finish on it, new ones naming it get 404; its cache entries and pins go with it, its memory when its
//! last request is done. `/v1/models` lists, and `/metrics` (`kev_adapter_loaded{adapter}`,
//! `kev_adapter_bytes{adapter}`) reports, the adapters served at the moment of asking.
//!
//! The adapters file (`{"adapters": [{"name", "dir"}], "default"?}`) on SIGHUP: adapters it no longer lists are
//! removed, new ones added, ones whose directory changed loaded again; adapters added through the routes and
//! the default adapter are left alone (a file that does not read changes nothing).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use kev_contract::{ContractError, ErrorKind};
use serde_json::{Value, json};

use crate::error::ApiError;
use crate::wire::{error_response, invalid, json_response, parse_json, request_id};
use crate::{App, Decider};

/// The 403 of the admin routes when no admin key is configured.
pub(crate) fn admin_off() -> ApiError {
    ApiError::typed(
        ErrorKind::Forbidden,
        "the adapter admin routes are off: start kev serve with an admin key (KEV_ADMIN_KEY or --admin-key-file), or mark a key \"admin\": true in the --api-keys file",
    )
}

/// Who may use the admin routes: the admin key's holder (`admin`) or an admin key's name; else the error.
fn admin<D: Decider>(app: &App<D>, headers: &HeaderMap) -> Result<String, ApiError> {
    let file_admins = app.keys.as_ref().is_some_and(|k| k.has_admin());
    if app.config.admin_key.is_none() && !file_admins {
        return Err(admin_off());
    }
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| crate::wire::bearer_credentials(v.as_bytes()))
        .ok_or_else(ApiError::auth_missing)?;
    // Both compared, in constant time, whatever the first says.
    let is_admin_key = app
        .config
        .admin_key
        .as_ref()
        .is_some_and(|k| crate::keys::Keys::same_secret(given, k.as_bytes()));
    let key = app.keys.as_ref().and_then(|k| k.find(given));
    match (is_admin_key, key) {
        (true, _) => Ok("admin".into()),
        (false, Some(k)) if k.is_admin() => Ok(k.name().to_owned()),
        (false, Some(k)) => Err(ApiError::typed(
            ErrorKind::Forbidden,
            format!(
                "API key {:?} may not use the adapter admin routes (mark it \"admin\": true in the keys file)",
                k.name()
            ),
        )),
        (false, None) => Err(ApiError::auth_invalid()),
    }
}

/// An admin action's audit line and counter.
fn record<D: Decider>(
    app: &App<D>,
    who: &str,
    action: &str,
    adapter: &str,
    result: &Result<Value, ApiError>,
) {
    let status = result
        .as_ref()
        .map_or_else(|e| e.status().as_u16(), |_| 200);
    let outcome = if result.is_ok() { "ok" } else { "refused" };
    metrics::counter!("kev_adapter_changes_total", "action" => action.to_owned(), "result" => outcome)
        .increment(1);
    if let Some(audit) = &app.sinks.audit {
        audit.write(json!({
            "ts": crate::audit::timestamp(), "route": "/v1/adapters", "key": who, "action": action,
            "adapter": adapter, "status": status,
            "error_type": result.as_ref().err().map(|e| e.kind().error_type().as_str()),
        }));
    }
}

/// The adapters served, with their cards
#[utoipa::path(
    get,
    path = "/v1/adapters",
    responses((status = 200, description = "Every adapter served now, the default first", body = Object,
        example = json!({"adapters": [{"name": "support", "x_default": true}, {"name": "ops", "x_default": false}], "live": true}))),
)]
pub(crate) async fn list<D: Decider>(
    State(app): State<Arc<App<D>>>,
    headers: HeaderMap,
) -> Response {
    if let Err(e) = admin(&app, &headers) {
        return error_response(e, &request_id(&headers));
    }
    let adapters: Vec<Value> = app
        .decider
        .adapter_cards()
        .into_iter()
        .map(|(name, card)| named(&name, card))
        .collect();
    json_response(
        StatusCode::OK,
        &json!({"adapters": adapters, "live": app.decider.live_adapters()}),
    )
}

fn named(name: &str, card: Value) -> Value {
    let mut out = serde_json::Map::new();
    out.insert("name".into(), json!(name));
    if let Value::Object(m) = card {
        out.extend(m);
    }
    Value::Object(out)
}

/// `{name, dir}`, or the 422 listing what is wrong.
fn read_add(body: &[u8]) -> Result<(String, PathBuf), ApiError> {
    let v = parse_json(body)?;
    let mut errors = Vec::new();
    let text = |k: &str, errors: &mut Vec<_>| match v.get(k) {
        Some(Value::String(s)) if !s.trim().is_empty() => Some(s.clone()),
        Some(Value::String(_)) => {
            errors.push(invalid(
                &[k],
                "string_too_short",
                "String should have at least 1 character",
                v[k].clone(),
                None,
            ));
            None
        }
        Some(other) => {
            errors.push(invalid(
                &[k],
                "string_type",
                "Input should be a valid string",
                other.clone(),
                None,
            ));
            None
        }
        None => {
            errors.push(invalid(&[k], "missing", "Field required", v.clone(), None));
            None
        }
    };
    let name = text("name", &mut errors);
    let dir = text("dir", &mut errors);
    match (name, dir) {
        (Some(n), Some(d)) if errors.is_empty() => Ok((n, PathBuf::from(d))),
        _ => Err(ContractError::Invalid(errors).into()),
    }
}

/// Serve another adapter over the loaded base (admin)
#[utoipa::path(
    post,
    path = "/v1/adapters",
    request_body(content = Object, example = json!({"name": "ops", "dir": "/models/kev-ops"})),
    responses((status = 200, description = "Served from the next request on: its card", body = Object,
        example = json!({"name": "ops", "x_adapter": "ops", "x_default": false, "x_adapter_bytes": 123_456_789}))),
)]
pub(crate) async fn add<D: Decider>(
    State(app): State<Arc<App<D>>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let rid = request_id(&headers);
    let who = match admin(&app, &headers) {
        Ok(w) => w,
        Err(e) => return error_response(e, &rid),
    };
    let (name, dir) = match read_add(&body) {
        Ok(v) => v,
        Err(e) => return error_response(e, &rid),
    };
    let result = add_now(&app, name.clone(), dir).await;
    record(&app, &who, "add", &name, &result);
    match result {
        Ok(card) => json_response(StatusCode::OK, &named(&name, card)),
        Err(e) => error_response(e, &rid),
    }
}

/// Load and install an adapter on a blocking worker.
async fn add_now<D: Decider>(
    app: &Arc<App<D>>,
    name: String,
    dir: PathBuf,
) -> Result<Value, ApiError> {
    let decider = Arc::clone(&app.decider);
    tokio::task::spawn_blocking(move || decider.add_adapter(&name, &dir))
        .await
        .map_err(|_| ApiError::internal())?
}

/// Stop serving an adapter (admin)
#[utoipa::path(
    delete,
    path = "/v1/adapters/{name}",
    params(("name" = String, Path, description = "The adapter's name")),
    responses((status = 200, description = "Removed: requests in flight on it finish, new ones get 404", body = Object,
        example = json!({"name": "ops", "removed": true}))),
)]
pub(crate) async fn remove<D: Decider>(
    State(app): State<Arc<App<D>>>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Response {
    let rid = request_id(&headers);
    let who = match admin(&app, &headers) {
        Ok(w) => w,
        Err(e) => return error_response(e, &rid),
    };
    let decider = Arc::clone(&app.decider);
    let n = name.clone();
    let result = tokio::task::spawn_blocking(move || decider.remove_adapter(&n))
        .await
        .map_err(|_| ApiError::internal())
        .and_then(|r| r)
        .map(|()| json!({"name": name, "removed": true}));
    record(&app, &who, "remove", &name, &result);
    match result {
        Ok(v) => json_response(StatusCode::OK, &v),
        Err(e) => error_response(e, &rid),
    }
}

/// The `--adapters-file` adapters the server manages: name → directory, as last read.
#[derive(Debug, Default)]
pub(crate) struct FileAdapters {
    path: Option<PathBuf>,
    managed: BTreeMap<String, PathBuf>,
}

impl FileAdapters {
    /// The file's adapters as served at start (the default adapter, served whatever the file says later, is
    /// not managed).
    pub(crate) fn start(path: Option<PathBuf>, default: Option<&str>) -> Self {
        let managed = path
            .as_deref()
            .and_then(|p| kev_decide::AdapterDir::read_file(p).ok())
            .map(|(list, _)| {
                list.into_iter()
                    .filter(|a| Some(a.name.as_str()) != default)
                    .map(|a| (a.name, a.dir))
                    .collect()
            })
            .unwrap_or_default();
        FileAdapters { path, managed }
    }

    /// Read the file again and bring the served adapters to it (see the module docs). Returns how many
    /// changes were made; a file that does not read changes nothing.
    pub(crate) async fn sync<D: Decider>(&mut self, app: &Arc<App<D>>) -> usize {
        let Some(path) = self.path.clone() else {
            return 0;
        };
        let listed = match kev_decide::AdapterDir::read_file(&path) {
            Ok((list, _)) => list,
            Err(e) => {
                tracing::error!(error = %e, "SIGHUP: the adapters file does not read; the adapters served stay");
                return 0;
            }
        };
        let served: Vec<String> = app
            .decider
            .adapter_cards()
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        let default = served.first().cloned();
        let wanted: BTreeMap<String, PathBuf> = listed
            .into_iter()
            .filter(|a| Some(&a.name) != default.as_ref())
            .map(|a| (a.name, a.dir))
            .collect();
        let mut changes = 0;
        for (name, dir) in self.managed.clone() {
            if wanted.get(&name) != Some(&dir) && self.remove(app, &name).await {
                changes += 1;
            }
        }
        for (name, dir) in &wanted {
            if self.managed.get(name) == Some(dir) {
                continue;
            }
            if served.contains(name) && !self.managed.contains_key(name) {
                tracing::warn!(adapter = %name, "SIGHUP: the adapters file names an adapter added through /v1/adapters; left as it is");
                continue;
            }
            let result = add_now(app, name.clone(), dir.clone()).await;
            record(app, "adapters-file", "add", name, &result);
            match result {
                Ok(_) => {
                    self.managed.insert(name.clone(), dir.clone());
                    changes += 1;
                }
                Err(e) => {
                    tracing::error!(adapter = %name, error = %e.error_body().to_value(), "SIGHUP: adapter refused; nothing changed for it")
                }
            }
        }
        changes
    }

    async fn remove<D: Decider>(&mut self, app: &Arc<App<D>>, name: &str) -> bool {
        let decider = Arc::clone(&app.decider);
        let n = name.to_owned();
        let result = tokio::task::spawn_blocking(move || decider.remove_adapter(&n))
            .await
            .map_err(|_| ApiError::internal())
            .and_then(|r| r)
            .map(|()| json!({}));
        record(app, "adapters-file", "remove", name, &result);
        self.managed.remove(name);
        result.is_ok()
    }
}
