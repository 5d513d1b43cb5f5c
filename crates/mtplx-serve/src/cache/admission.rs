//! Admission for a [`Job`]: its projected peak (weights, the requests already admitted, its
//! own KV for prompt + `max_tokens`, prefill activations) against the memory limit. The
//! bank sheds entries (spilling them) before a refusal; a refusal is HTTP 507 with
//! `refusal_reason` and `retry_when`, and loses nothing committed.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use mtplx_bank::MemoryEstimate;
use tower::{Layer, Service};

use super::CacheTier;
use crate::engine::Job;
use crate::error::ApiError;

/// The estimate for `job` with `in_flight` bytes already reserved.
pub fn estimate(tier: &CacheTier, job: &Job, in_flight: u64) -> MemoryEstimate {
    MemoryEstimate {
        weights_bytes: tier.weights_bytes(),
        in_flight_bytes: in_flight,
        kv_bytes: MemoryEstimate::kv_bytes_for(tier.shape(), job.prompt.len(), job.max_tokens),
        activation_bytes: tier.activation_bytes(),
    }
}

#[derive(Debug, Clone)]
pub struct AdmissionLayer {
    tier: CacheTier,
}

impl AdmissionLayer {
    pub fn new(tier: CacheTier) -> Self {
        AdmissionLayer { tier }
    }
}

impl<S> Layer<S> for AdmissionLayer {
    type Service = AdmissionStage<S>;

    fn layer(&self, inner: S) -> Self::Service {
        AdmissionStage {
            tier: self.tier.clone(),
            inner,
        }
    }
}

#[derive(Debug, Clone)]
pub struct AdmissionStage<S> {
    tier: CacheTier,
    inner: S,
}

impl<S> Service<Job> for AdmissionStage<S>
where
    S: Service<Job, Error = ApiError> + Clone + Send + 'static,
    S::Future: Send,
{
    type Response = S::Response;
    type Error = ApiError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, ApiError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ApiError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut job: Job) -> Self::Future {
        let tier = self.tier.clone();
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(async move {
            let est = estimate(&tier, &job, tier.reserved());
            let protect = job.resolved.as_ref().map(|r| r.id.clone());
            let bank = tier.bank().clone();
            // Shedding may queue spills and take the bank's lock: not on the runtime.
            let decision = tokio::task::spawn_blocking(move || bank.admit(&est, protect.as_ref()))
                .await
                .map_err(|e| ApiError::internal(format!("admission failed: {e}")))?;
            match decision {
                Ok(_) => {
                    job.reservation = Some(tier.reserve(est.request_bytes()));
                    inner.call(job).await
                }
                Err(refusal) => Err(ApiError::insufficient_memory(&refusal)),
            }
        })
    }
}
