//! Session resolution for a [`Job`]: the id a header or the body named, else the session
//! whose stored conversation the prompt continues (longest token prefix), else a new
//! `anon-…` id. Then waits for that session's lock: one job per session at a time.

use mtplx_bank::SessionId;

use super::stage::{Step, StepLayer};
use super::CacheTier;
use crate::error::ApiError;
use crate::job::{Job, Resolved};
use crate::session::SessionSource;

/// Names the session of `job` (without waiting for its lock).
pub fn resolve(tier: &CacheTier, job: &Job) -> (SessionId, SessionSource) {
    if let Some(hint) = &job.session {
        return (SessionId::new(hint.id()), hint.source());
    }
    match tier.bank().session_by_prefix(tier.identity(), &job.prompt) {
        Some(id) => (id, SessionSource::PrefixMatch),
        None => (
            SessionId::new(format!("anon-{}", crate::util::random_hex())),
            SessionSource::Anonymous,
        ),
    }
}

/// Names the session and waits for its turn.
#[derive(Debug, Clone)]
pub struct SessionStep {
    tier: CacheTier,
}

/// The session stage as a layer.
pub type SessionLayer = StepLayer<SessionStep>;

impl SessionStep {
    pub fn layer(tier: CacheTier) -> SessionLayer {
        StepLayer::new(SessionStep { tier })
    }
}

impl Step for SessionStep {
    async fn prepare(&self, mut job: Job) -> Result<Job, ApiError> {
        let (id, source) = resolve(&self.tier, &job);
        let guard = self.tier.locks().acquire(&id).await;
        // Checked with the lock held: a stop that finds no session busy has seen every job
        // that will run.
        if self.tier.is_closed() {
            return Err(ApiError::shutting_down());
        }
        job.resolved = Some(Resolved { id, source, guard });
        Ok(job)
    }
}
