//! The model the server serves: [`kev_decide::Kev`] is a [`Decider`] as it stands. A job is its
//! [`kev_decide::Task`], a pass is [`kev_decide::Kev::pass`] (the executor every front end uses), the
//! records ([`crate::Need`], [`crate::Step`], [`crate::Stats`]) are its own; a refusal becomes its HTTP answer
//! here, through the one status table ([`ApiError::from_wire`]).

use kev_decide::pinned::PinInfo;
use kev_decide::{Backend, Body, Grant, Kev, Lane, PinOrder, Refusal, Task};
use serde_json::Value;

use crate::error::ApiError;
use crate::{AdapterTag, Admission, Decider, JobInfo, Need, Stats, Step};

/// An admitted job as the queue takes it, counted under its adapter
/// (`kev_adapter_requests_total{adapter}`, `kev_adapter_input_tokens_total{adapter}`).
fn admission<B>(kev: &Kev<B>, job: kev_decide::Job) -> Admission<Task<B::State>>
where
    B: Backend,
{
    let tokens = job.tokens();
    let name = job.adapter().name().to_owned();
    metrics::counter!("kev_adapter_requests_total", "adapter" => name.clone()).increment(1);
    metrics::counter!("kev_adapter_input_tokens_total", "adapter" => name).increment(tokens as u64);
    Admission {
        tokens,
        job: kev.task(job),
    }
}

/// A live adapter change refused, as HTTP answers it.
fn live_error(e: kev_decide::LiveError) -> ApiError {
    use kev_contract::ErrorKind;
    use kev_decide::LiveError;
    let kind = match &e {
        LiveError::NotOffered(_) | LiveError::Taken(_) | LiveError::Default(_) => {
            ErrorKind::Conflict
        }
        LiveError::Unknown(_) => ErrorKind::NotFound,
        LiveError::Refused(_) => ErrorKind::AdapterRefused,
    };
    ApiError::typed(kind, e.to_string())
}

/// A refusal's answer, with its `Retry-After` when waiting can help (a full pin budget).
fn refused(r: &Refusal) -> ApiError {
    let e = ApiError::from_wire(r);
    match r.retry_after() {
        Some(s) => e.with_retry_after(s),
        None => e,
    }
}

/// A pin as the API shows it: `{id, tokens, bytes, expires_at, ready}` (`ready` is always true: a pin
/// exists only once its prefix has run and its request was answered; kept for clients that read it).
fn pin_json(info: &PinInfo) -> Value {
    let expires = info
        .expires_at
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    serde_json::json!({
        "id": info.id, "tokens": info.tokens, "bytes": info.bytes,
        "expires_at": expires, "ready": true,
    })
}

/// The warm-up decision `/ready` waits for: one question of each kind, answered through the served path.
pub const WARM_UP_REQUEST: &[u8] = br#"{"state":"Warm-up: the engine answers one real decision before it is ready.","questions":{"ready":{"type":"noul","instructions":"Is the engine ready?"},"kind":{"type":"choice","instructions":"Which kind of text is this?","criteria":{"notice":null,"question":null}},"level":{"type":"score","instructions":"How formal is it?","criteria":["casual","neutral","formal"]}}}"#;

impl<B> Decider for Kev<B>
where
    B: Backend + Send + Sync + 'static,
    B::State: Send + Sync + 'static,
{
    type Job = Task<B::State>;

    fn admit(&self, body: &[u8]) -> Result<Admission<Self::Job>, ApiError> {
        let job = Kev::admit(self, body).map_err(|r| refused(&r))?;
        Ok(admission(self, job))
    }

    fn admit_parts(
        &self,
        parts: Vec<Body<'static>>,
        owner: Option<&str>,
    ) -> Result<Vec<Admission<Self::Job>>, ApiError> {
        let jobs = Kev::admit_parts_as(self, parts, owner).map_err(|r| refused(&r))?;
        Ok(jobs.into_iter().map(|job| admission(self, job)).collect())
    }

    fn admit_batch(
        &self,
        parts: Vec<Body<'static>>,
        owner: Option<&str>,
    ) -> Result<Vec<Result<Admission<Self::Job>, ApiError>>, ApiError> {
        let jobs = Kev::admit_batch_as(self, parts, owner).map_err(|r| refused(&r))?;
        Ok(jobs
            .into_iter()
            .map(|admitted| {
                admitted
                    .map(|job| admission(self, job))
                    .map_err(|r| refused(&r))
            })
            .collect())
    }

    fn pin_budget(&self) -> usize {
        self.pinned().budget()
    }

    fn admit_pin(
        &self,
        body: Body<'static>,
        order: &PinOrder,
    ) -> Result<Admission<Self::Job>, ApiError> {
        if self.pinned().budget() == 0 {
            return Err(ApiError::typed(
                kev_contract::ErrorKind::NotFound,
                "pinning is off on this server (--pin-bytes 0)",
            ));
        }
        let job = Kev::admit_pin(self, body, order).map_err(|r| refused(&r))?;
        Ok(Admission {
            tokens: job.tokens(),
            job: self.task(job),
        })
    }

    fn pin_commit(&self, id: &str) -> Result<Value, ApiError> {
        let info = self
            .pinned()
            .commit(id)
            .map_err(|r| refused(&Refusal::from(r)))?;
        Ok(pin_json(&info))
    }

    fn pin_abandon(&self, id: &str) {
        self.pinned().abandon(id);
    }

    fn pin_info(&self, id: &str, owner: Option<&str>) -> Option<Value> {
        Some(pin_json(&self.pinned().info(id, owner)?))
    }

    fn unpin(&self, id: &str, owner: Option<&str>) -> bool {
        self.pinned().remove(id, owner)
    }

    fn job_info(&self, job: &Self::Job) -> JobInfo {
        let job = job.job();
        let adapter = self.adapter_of(job);
        JobInfo {
            adapter: Some(AdapterTag {
                name: adapter.name().to_owned(),
                sha256: adapter.info().and_then(|i| i.adapter_sha256.clone()),
            }),
            urgency: job.urgency(),
        }
    }

    fn job_state(&self, job: &Self::Job) -> Option<Value> {
        Some(job.job().request().state().clone())
    }

    fn need(&self, job: &Self::Job) -> Need {
        Kev::need(self, job)
    }

    fn pass(&self, grants: &mut [(&mut Self::Job, usize)], lane: Lane) -> Vec<Step> {
        let mut grants: Vec<Grant<'_, B::State>> = grants
            .iter_mut()
            .map(|(task, tokens)| Grant {
                task: &mut **task,
                tokens: *tokens,
            })
            .collect();
        Kev::pass(self, &mut grants, lane)
    }

    fn warm_up_request(&self) -> Option<Vec<u8>> {
        Some(WARM_UP_REQUEST.to_vec())
    }

    fn model_card(&self) -> Value {
        self.card()
    }

    fn adapter_cards(&self) -> Vec<(String, Value)> {
        Kev::adapter_cards(self)
    }

    fn live_adapters(&self) -> bool {
        Kev::live_adapters(self)
    }

    fn add_adapter(&self, name: &str, dir: &std::path::Path) -> Result<Value, ApiError> {
        Kev::add_adapter(self, name, dir.to_owned()).map_err(live_error)
    }

    fn remove_adapter(&self, name: &str) -> Result<(), ApiError> {
        Kev::remove_adapter(self, name).map_err(live_error)
    }

    fn output_tokens(&self, answers: &Value) -> Option<usize> {
        self.tokenizer().output_tokens(answers).ok()
    }

    fn stats(&self) -> Stats {
        Kev::stats(self)
    }
}
