//! Admission for a [`Job`]: its projected peak (weights, the requests already admitted, its
//! own KV for prompt + `max_tokens`, prefill activations) against the memory limit. The
//! bank sheds entries (spilling them) before a refusal; a refusal is HTTP 507 with
//! `refusal_reason` and `retry_when`, and loses nothing committed.

use mtplx_bank::MemoryEstimate;

use super::stage::{Step, StepLayer};
use super::CacheTier;
use crate::error::ApiError;
use crate::job::Job;

/// The estimate for `job` with `in_flight` bytes already reserved.
pub fn estimate(tier: &CacheTier, job: &Job, in_flight: u64) -> MemoryEstimate {
    MemoryEstimate {
        weights_bytes: tier.weights_bytes(),
        in_flight_bytes: in_flight,
        kv_bytes: tier.shape().bytes_for(
            job.prompt.len().saturating_add(job.max_tokens),
            tier.factory().dtype(),
        ),
        activation_bytes: tier.activation_bytes(),
    }
}

/// Admits the job against the memory limit, or refuses it with a 507.
#[derive(Debug, Clone)]
pub struct AdmissionStep {
    tier: CacheTier,
}

/// The admission stage as a layer.
pub type AdmissionLayer = StepLayer<AdmissionStep>;

impl AdmissionStep {
    pub fn layer(tier: CacheTier) -> AdmissionLayer {
        StepLayer::new(AdmissionStep { tier })
    }
}

impl Step for AdmissionStep {
    async fn prepare(&self, mut job: Job) -> Result<Job, ApiError> {
        let tier = &self.tier;
        let est = estimate(tier, &job, tier.reserved());
        let protect = job.resolved.as_ref().map(|r| r.id.clone());
        let bank = tier.bank().clone();
        // Shedding may queue spills and takes the bank's lock: not on the runtime.
        let decision = tokio::task::spawn_blocking(move || bank.admit(&est, protect.as_ref()))
            .await
            .map_err(|e| ApiError::internal(format!("admission failed: {e}")))?;
        match decision {
            Ok(_) => {
                job.reservation = Some(tier.reserve(est.request_bytes()));
                Ok(job)
            }
            Err(refusal) => Err(ApiError::insufficient_memory(&refusal)),
        }
    }
}
