//! Restore for a [`Job`]: the bank's lookup (RAM and SSD candidates ranked by the prompt
//! tokens they cover, from metadata) and the winner built into a cache in the engine's
//! layout, on a blocking thread so the engine keeps generating meanwhile. Candidates not
//! served are released by the lookup itself, before the prefill.

use std::time::Instant;

use mtplx_bank::{LookupQuery, RestoreMode, Source};

use super::stage::{Step, StepLayer};
use super::CacheTier;
use crate::error::ApiError;
use crate::job::{Job, RestoreOutcome};

/// Looks up and restores `job`'s prompt (blocking: may read the SSD).
pub fn restore(tier: &CacheTier, job: &Job) -> RestoreOutcome {
    let start = Instant::now();
    let plan = tier.bank().lookup(&LookupQuery {
        identity: tier.identity(),
        prompt: &job.prompt,
        session: job.resolved.as_ref().map(|r| &r.id),
        floor: 0,
    });
    let mut out = match plan.restore(tier.factory(), tier.shape()) {
        Ok(restored) => {
            let e = &restored.explanation;
            let cached = e.cached_tokens;
            RestoreOutcome {
                mode: e.mode.to_string(),
                source: e.source().as_str().to_string(),
                miss_reason: e.miss.as_ref().map(|m| m.name()),
                fields: e.log_fields(),
                cache: (cached > 0).then_some(restored.cache),
                restore_s: 0.0,
            }
        }
        // A stored state that can't be built here (another shape: a bug, not bad input)
        // is a miss with a reason; the prompt is computed cold.
        Err(e) => {
            tracing::warn!("restore failed, computing cold: {e}");
            RestoreOutcome {
                mode: RestoreMode::Cold.to_string(),
                source: Source::None.as_str().to_string(),
                miss_reason: Some("restore_error".into()),
                ..RestoreOutcome::default()
            }
        }
    };
    out.restore_s = start.elapsed().as_secs_f64();
    out
}

/// Restores the job's cache from the bank (or the SSD tier behind it).
#[derive(Debug, Clone)]
pub struct RestoreStep {
    tier: CacheTier,
}

/// The restore stage as a layer.
pub type RestoreLayer = StepLayer<RestoreStep>;

impl RestoreStep {
    pub fn layer(tier: CacheTier) -> RestoreLayer {
        StepLayer::new(RestoreStep { tier })
    }
}

impl Step for RestoreStep {
    async fn prepare(&self, job: Job) -> Result<Job, ApiError> {
        let tier = self.tier.clone();
        let (mut job, outcome) = tokio::task::spawn_blocking(move || {
            let outcome = restore(&tier, &job);
            (job, outcome)
        })
        .await
        .map_err(|e| ApiError::internal(format!("restore failed: {e}")))?;
        job.restore = Some(outcome);
        Ok(job)
    }
}
