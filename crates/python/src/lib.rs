//! `kev._kev`: the native half of the `kev` Python package. It holds one loaded model
//! ([`kev_decide::Kev`]) and answers request bodies through exactly the calls `kev decide` and `kev serve`
//! make: the arguments parsed into [`kev_decide::Settings`] (every service option — calibration, date facts,
//! caps, truncation — is applied by the library, as for `kev serve`), [`kev_decide::load_cpu`] to load,
//! `Kev::admit` to validate and compile, `Kev::run` (the executor's passes, filled up to the pass budget) to
//! answer; the card is the library's (`Kev::card`). Bodies cross the boundary as bytes and answers as compact
//! JSON text (the server's exact response bytes); the Python half (`python/kev/__init__.py`) turns them into
//! dicts and exceptions. The GIL is released while the model loads and while requests run.
//!
//! [`server::Server`] is `kev serve` in-process over the same loaded model (kev-server's own application,
//! without a socket): what a Ray Serve replica answers HTTP requests with (`kev.serve`). [`route::route_key`]
//! is what its front end routes a request by.

mod route;
mod server;

use std::path::PathBuf;
use std::sync::Arc;

use kev_decide::{Calibration, Caps, Job, Kev, LoadSpec, Settings, Source, WeightForm};
use kev_engine::{Arm, CpuBackend};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use serde_json::Value;

/// The model names `/v1/models` lists first; `info` is that card.
const CARD_NAME: &str = "kev-latest";

/// A loaded model.
#[pyclass(frozen, module = "kev._kev")]
struct Engine {
    /// Shared with the in-process servers started over it ([`server::Server`]).
    kev: Arc<Kev<CpuBackend>>,
    /// The names the model answers to, as `kev serve` names it (`kev_decide::served_names`).
    names: Vec<String>,
    card: String,
    /// A pool of its own when `threads` was given; otherwise rayon's global pool (`RAYON_NUM_THREADS`).
    pool: Option<rayon::ThreadPool>,
}

impl Engine {
    fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        match &self.pool {
            Some(pool) => pool.install(f),
            None => f(),
        }
    }
}

/// One answer: the HTTP status the server would send and its body as compact JSON.
type Answer = (u16, String);

fn text(v: &Value) -> String {
    kev_contract::compact_json(v)
}

/// What `kev decide` writes for a failure of ours on an accepted request.
fn internal(e: &kev_decide::DecideError) -> Answer {
    use kev_contract::WireError;
    (e.kind().status(), text(&e.error_body().to_value()))
}

/// `Model(...)`'s arguments, passed by the Python half as one dict (`python/kev/__init__.py` documents them).
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
struct EngineOptions {
    model_dir: Option<PathBuf>,
    base: Option<PathBuf>,
    kev: Option<PathBuf>,
    weights: String,
    precision: Option<String>,
    cache_bytes: Option<usize>,
    pass_tokens: Option<usize>,
    threads: Option<usize>,
    truncate_state: bool,
    calibration: Option<PathBuf>,
    date_facts: bool,
    max_questions: Option<usize>,
    max_options: Option<usize>,
    max_input_tokens: Option<usize>,
    max_batch_requests: Option<usize>,
    max_batch_input_tokens: Option<usize>,
    pin_bytes: Option<usize>,
    adapters: Option<Vec<(String, PathBuf)>>,
    strict_models: bool,
    demo: bool,
    aliases: Option<Vec<String>>,
    release: Option<String>,
}

impl EngineOptions {
    fn adapter_dirs(&self) -> Vec<kev_decide::AdapterDir> {
        self.adapters
            .iter()
            .flatten()
            .map(|(name, dir)| kev_decide::AdapterDir {
                name: name.clone(),
                dir: dir.clone(),
            })
            .collect()
    }

    /// The model's files: a prepared directory, the release directories, or kev-mini (`demo`).
    fn source(&self, py: Python<'_>, adapters: &[kev_decide::AdapterDir]) -> PyResult<Source> {
        let named = (&self.model_dir, &self.base, &self.kev, adapters.first());
        Ok(match named {
            // A published release from the kev cache (or model_dir), prepared first when absent: what
            // `kev serve --release NAME [--model-dir DIR]` serves.
            (dir, None, None, None) if self.release.is_some() && !self.demo => {
                let name = self.release.clone().unwrap_or_default();
                let release: kev_release::Release = name.parse().map_err(PyValueError::new_err)?;
                let prepared = py.detach(|| kev_prepare::prepared_release(release, dir.clone()));
                Source::Prepared(prepared.map_err(|e| {
                    PyRuntimeError::new_err(format!(
                        "preparing the pinned {}: {e}\n{}",
                        release.pins().name,
                        kev_prepare::offline_hint()
                    ))
                })?)
            }
            _ if self.release.is_some() => {
                return Err(PyValueError::new_err(
                    "release=NAME serves a published release (prepared into model_dir, or the kev cache); it \
                     does not combine with base, kev, adapters or demo",
                ));
            }
            (None, None, None, None) if self.demo => {
                let (base, kev) =
                    kev_decide::demo_release().map_err(|e| PyValueError::new_err(e.to_string()))?;
                Source::Release { base, kev }
            }
            (Some(dir), None, None, None) => Source::Prepared(dir.clone()),
            (None, Some(base), Some(kev), None) => Source::Release {
                base: base.clone(),
                kev: kev.clone(),
            },
            (None, Some(base), None, Some(first)) => Source::Release {
                base: base.clone(),
                kev: first.dir.clone(),
            },
            _ => {
                return Err(PyValueError::new_err(
                    "name a model: model_dir=DIR (prepared by `kev prepare`), or base=DIR with kev=DIR or \
                     adapters={name: DIR, ...} (release), or demo=True alone (kev-mini)",
                ));
            }
        })
    }

    /// The service settings, as `kev serve`'s flags make them (crates/cli/src/loading.rs).
    fn settings(&self) -> PyResult<Settings> {
        let calibration = match &self.calibration {
            None => None,
            Some(path) => Some(Arc::new(
                Calibration::read(path).map_err(|e| PyValueError::new_err(e.to_string()))?,
            )),
        };
        let defaults = Settings::default();
        let caps = Caps::default();
        Ok(Settings {
            limits: kev_tokenize::Limits {
                truncate_state: self.truncate_state,
                ..kev_tokenize::Limits::KEV
            },
            caps: Caps {
                max_questions: self.max_questions.unwrap_or(caps.max_questions),
                max_options: self.max_options.unwrap_or(caps.max_options),
                max_input_tokens: self.max_input_tokens.unwrap_or(caps.max_input_tokens),
                max_batch_requests: self.max_batch_requests.unwrap_or(caps.max_batch_requests),
                max_batch_input_tokens: self
                    .max_batch_input_tokens
                    .unwrap_or(caps.max_batch_input_tokens),
            },
            pass_tokens: self.pass_tokens.unwrap_or(defaults.pass_tokens).max(1),
            cache_bytes: self.cache_bytes,
            pin_bytes: self.pin_bytes.unwrap_or(defaults.pin_bytes),
            date_facts: self.date_facts,
            calibration,
            strict_models: self.strict_models,
            ..defaults
        })
    }
}

#[pymethods]
impl Engine {
    #[new]
    fn new(py: Python<'_>, options: EngineOptions) -> PyResult<Self> {
        let adapters = options.adapter_dirs();
        let source = options.source(py, &adapters)?;
        let form: WeightForm = options.weights.parse().map_err(PyValueError::new_err)?;
        // The library's own parser and wording (`kev serve --precision` says the same).
        let arm: Option<Arm> = match options.precision.as_deref() {
            None => None,
            Some(p) => Some(
                p.parse()
                    .map_err(|e| PyValueError::new_err(format!("precision: {e}")))?,
            ),
        };
        let settings = options.settings()?;
        let EngineOptions {
            threads,
            demo,
            aliases,
            ..
        } = options;
        let pool = match threads {
            None => None,
            Some(n) => Some(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(n.max(1))
                    .build()
                    .map_err(|e| PyRuntimeError::new_err(format!("starting {n} threads: {e}")))?,
            ),
        };
        let spec = LoadSpec {
            source,
            form,
            arm,
            settings,
        };
        let more = adapters.get(1..).unwrap_or(&[]);
        let load = || kev_decide::load_cpu_adapters(&spec, more);
        let loaded = py.detach(|| match &pool {
            Some(p) => p.install(load),
            None => load(),
        });
        let (mut kev, info) = loaded.map_err(|e| {
            PyRuntimeError::new_err(format!("loading {}: {e}", describe(&spec.source)))
        })?;
        // Named as `kev serve` names it (crates/cli/src/cmd/serve.rs): the demo's card says it is the demo,
        // the default adapter answers to `kev-latest`, `jev-latest`, the size and the aliases.
        if demo {
            kev = kev.with_info(kev_decide::ModelInfo {
                demo: true,
                ..info.clone()
            });
        }
        let names = kev_decide::served_names(&info.base, demo, &aliases.unwrap_or_default());
        let default_name = match adapters.first() {
            Some(first) => first.name.clone(),
            None => kev.adapters()[0].name().to_owned(),
        };
        let kev = kev.with_default_names(&default_name, &names);
        let mut card = serde_json::Map::new();
        card.insert("name".into(), Value::String(CARD_NAME.into()));
        if let Value::Object(fields) = kev.card() {
            card.extend(fields);
        }
        Ok(Engine {
            kev: Arc::new(kev),
            names,
            card: text(&Value::Object(card)),
            pool,
        })
    }

    /// Answer request bodies; one `(status, body JSON)` per body, in order.
    fn decide(&self, py: Python<'_>, bodies: Vec<Vec<u8>>) -> Vec<Answer> {
        py.detach(|| self.install(|| self.answer(&bodies)))
    }

    /// What a request compiles to: `(200, rows JSON)` or the refusal.
    fn rows(&self, py: Python<'_>, body: Vec<u8>) -> PyResult<Answer> {
        let out = py.detach(|| {
            kev_decide::rows::rows(self.kev.tokenizer(), &body, &self.kev.settings().limits)
        });
        match out {
            Ok(Ok(v)) => Ok((200, text(&v))),
            Ok(Err(refused)) => Ok((refused.status(), text(&refused.body()))),
            Err(e) => Err(PyRuntimeError::new_err(e.to_string())),
        }
    }

    /// The `/v1/models` card (JSON).
    #[getter]
    fn card(&self) -> &str {
        &self.card
    }

    /// Counters since load.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.kev.stats();
        let d = PyDict::new(py);
        d.set_item("rows", s.rows)?;
        d.set_item("passes", s.passes)?;
        d.set_item("cache_hits", s.cache.hits)?;
        d.set_item("cache_misses", s.cache.misses)?;
        d.set_item("cache_bytes", s.cache.bytes)?;
        Ok(d)
    }
}

impl Engine {
    /// Admit every body, then answer the admitted jobs together (`Kev::run` fills each pass up to the pass
    /// token budget, in arrival order).
    fn answer(&self, bodies: &[Vec<u8>]) -> Vec<Answer> {
        let admitted: Vec<Result<Job, Answer>> = bodies
            .iter()
            .map(|b| self.kev.admit(b).map_err(|r| (r.status(), text(&r.body()))))
            .collect();
        let jobs: Vec<&Job> = admitted.iter().filter_map(|a| a.as_ref().ok()).collect();
        let results = self.kev.run(&jobs);
        let mut results = results.into_iter();
        admitted
            .into_iter()
            .map(|a| match a {
                Err(refused) => refused,
                Ok(_) => match results.next() {
                    Some(Ok(decision)) => (200, text(&decision.body())),
                    Some(Err(e)) => internal(&e),
                    None => internal(&kev_decide::DecideError::Unanswered("no result")),
                },
            })
            .collect()
    }
}

fn describe(source: &Source) -> String {
    match source {
        Source::Prepared(d) => d.display().to_string(),
        Source::Release { base, kev } => format!("{} + {}", base.display(), kev.display()),
    }
}

#[pymodule]
fn _kev(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Engine>()?;
    m.add_class::<server::Server>()?;
    m.add_function(wrap_pyfunction!(route::route_key, m)?)?;
    m.add_function(wrap_pyfunction!(server::error_answer, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
