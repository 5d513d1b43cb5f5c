//! Session resolution for a [`Job`]: the id a header or the body named, else the session
//! whose stored conversation the prompt continues (longest token prefix), else a new
//! `anon-…` id. Then waits for that session's lock: one job per session at a time.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use mtplx_bank::SessionId;
use tower::{Layer, Service};

use super::locks::SessionGuard;
use super::CacheTier;
use crate::engine::Job;
use crate::layers::session::SessionSource;

/// The session a job runs under, and its turn.
#[derive(Debug)]
pub struct Resolved {
    pub id: SessionId,
    pub source: SessionSource,
    /// Held until the job is dropped (after its commit).
    pub guard: SessionGuard,
}

/// Names the session of `job` (without waiting for its lock).
pub fn resolve(tier: &CacheTier, job: &Job) -> (SessionId, SessionSource) {
    if let Some(hint) = &job.session {
        return (SessionId::new(hint.id()), hint.source());
    }
    match tier.bank().session_by_prefix(tier.identity(), &job.prompt) {
        Some(id) => (id, SessionSource::PrefixMatch),
        None => (
            SessionId::new(format!("anon-{}", crate::api::random_hex())),
            SessionSource::Anonymous,
        ),
    }
}

#[derive(Debug, Clone)]
pub struct SessionLayer {
    tier: CacheTier,
}

impl SessionLayer {
    pub fn new(tier: CacheTier) -> Self {
        SessionLayer { tier }
    }
}

impl<S> Layer<S> for SessionLayer {
    type Service = SessionStage<S>;

    fn layer(&self, inner: S) -> Self::Service {
        SessionStage {
            tier: self.tier.clone(),
            inner,
        }
    }
}

#[derive(Debug, Clone)]
pub struct SessionStage<S> {
    tier: CacheTier,
    inner: S,
}

impl<S> Service<Job> for SessionStage<S>
where
    S: Service<Job> + Clone + Send + 'static,
    S::Future: Send,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut job: Job) -> Self::Future {
        let tier = self.tier.clone();
        // The inner service was made ready for this call; take it and leave a fresh clone.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(async move {
            let (id, source) = resolve(&tier, &job);
            let guard = tier.locks().acquire(&id).await;
            job.resolved = Some(Resolved { id, source, guard });
            inner.call(job).await
        })
    }
}
