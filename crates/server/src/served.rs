//! The model the server serves: [`kev_decide::Kev`] is a [`Decider`] as it stands. A job is its
//! [`kev_decide::Task`], a pass is [`kev_decide::Kev::pass`] (the executor every front end uses), the
//! records ([`crate::Need`], [`crate::Step`], [`crate::Stats`]) are its own; a refusal becomes its HTTP answer
//! here, through the one status table ([`ApiError::from_wire`]).

use kev_decide::{Backend, Grant, Kev, Lane, Task};
use serde_json::Value;

use crate::error::ApiError;
use crate::{Admission, Decider, Need, Stats, Step};

/// An admitted job as the queue takes it, counted under its adapter
/// (`kev_adapter_requests_total{adapter}`, `kev_adapter_input_tokens_total{adapter}`).
fn admission<B>(kev: &Kev<B>, job: kev_decide::Job) -> Admission<Task<B::State>>
where
    B: Backend,
{
    let tokens = job.tokens();
    let name = kev.adapters()[job.adapter()].name().to_owned();
    metrics::counter!("kev_adapter_requests_total", "adapter" => name.clone()).increment(1);
    metrics::counter!("kev_adapter_input_tokens_total", "adapter" => name).increment(tokens as u64);
    Admission {
        tokens,
        job: kev.task(job),
    }
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
        let job = Kev::admit(self, body).map_err(|r| ApiError::from_wire(&r))?;
        Ok(admission(self, job))
    }

    fn admit_parts(&self, bodies: &[Vec<u8>]) -> Result<Vec<Admission<Self::Job>>, ApiError> {
        let jobs = Kev::admit_parts(self, bodies).map_err(|r| ApiError::from_wire(&r))?;
        Ok(jobs.into_iter().map(|job| admission(self, job)).collect())
    }

    fn admit_batch(
        &self,
        bodies: &[Vec<u8>],
    ) -> Result<Vec<Result<Admission<Self::Job>, ApiError>>, ApiError> {
        let jobs = Kev::admit_batch(self, bodies).map_err(|r| ApiError::from_wire(&r))?;
        Ok(jobs
            .into_iter()
            .map(|admitted| {
                admitted
                    .map(|job| admission(self, job))
                    .map_err(|r| ApiError::from_wire(&r))
            })
            .collect())
    }

    fn admit_pin(
        &self,
        body: &[u8],
        id: &str,
        owner: Option<&str>,
        ttl: std::time::Duration,
    ) -> Result<Admission<Self::Job>, ApiError> {
        if self.pinned().budget() == 0 {
            return Err(ApiError::typed(
                kev_contract::ErrorKind::NotFound,
                "pinning is off on this server (--pin-bytes 0)",
            ));
        }
        let job =
            Kev::admit_pin(self, body, id, owner, ttl).map_err(|r| ApiError::from_wire(&r))?;
        Ok(Admission {
            tokens: job.tokens(),
            job: self.task(job),
        })
    }

    fn pin_info(&self, id: &str, owner: Option<&str>) -> Option<Value> {
        let info = self.pinned().info(id, owner)?;
        let expires = info
            .expires_at
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Some(serde_json::json!({
            "id": info.id, "tokens": info.tokens, "bytes": info.bytes,
            "expires_at": expires, "ready": info.ready,
        }))
    }

    fn pin_refusal(&self, id: &str) -> Option<ApiError> {
        use kev_decide::pinned::PinRefused;
        Some(match self.pinned().take_refusal(id)? {
            PinRefused::TooLarge { bytes, budget } => ApiError::typed(
                kev_contract::ErrorKind::TooMuchWork,
                format!(
                    "this state's snapshot is {bytes} bytes, over the whole pinned-state budget of {budget} bytes (--pin-bytes)"
                ),
            ),
            PinRefused::Full { bytes, free } => ApiError::typed(
                kev_contract::ErrorKind::QueueFull,
                format!(
                    "the pinned-state budget is held by other pins: this state needs {bytes} bytes, {free} are free; unpin (DELETE /v1/systemone/states/ID) or wait for pins to expire"
                ),
            )
            .with_retry_after(60),
        })
    }

    fn pinned_state(&self, id: &str, owner: Option<&str>) -> Option<Value> {
        self.pinned().state(id, owner)
    }

    fn unpin(&self, id: &str, owner: Option<&str>) -> bool {
        self.pinned().remove(id, owner)
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
        (0..self.adapters().len())
            .map(|i| (self.adapters()[i].name().to_owned(), self.adapter_card(i)))
            .collect()
    }

    fn output_tokens(&self, answers: &Value) -> Option<usize> {
        self.tokenizer().output_tokens(answers).ok()
    }

    fn stats(&self) -> Stats {
        Kev::stats(self)
    }
}
