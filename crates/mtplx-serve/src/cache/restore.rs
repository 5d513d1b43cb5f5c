//! Restore for a [`Job`]: the bank's lookup (RAM and SSD candidates ranked by the prompt
//! tokens they cover, from metadata) and the winner built into a sequence in the engine's
//! layout, on a blocking thread so the engine keeps generating meanwhile. Candidates not
//! served are released by the lookup itself, before the prefill.

use std::time::Instant;

use mtplx_bank::{Explanation, LookupQuery, MissReason};

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
        floor: tier.min_prefix_tokens(),
    });
    let (sequence, explanation, ssd) = match plan.restore(tier.factory(), tier.shape()) {
        Ok(restored) => {
            let cached = restored.explanation.cached_tokens > 0;
            let sequence = cached.then_some(restored.sequence);
            (sequence, restored.explanation, restored.ssd_report)
        }
        // A stored state that can't be built here (another shape: a bug, not bad input)
        // is a miss with a reason; the prompt is computed cold.
        Err(e) => {
            tracing::warn!("restore failed, computing cold: {e}");
            let miss = Some(MissReason::RestoreFailed);
            (None, Explanation::cold(job.prompt.len(), miss), None)
        }
    };
    RestoreOutcome {
        sequence,
        explanation,
        restore_s: start.elapsed().as_secs_f64(),
        ssd,
    }
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
