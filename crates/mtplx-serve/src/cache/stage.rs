//! What the cache-path layers share: a [`Step`] prepares a job (names its session, admits
//! it, restores its cache) or refuses it, and [`StepLayer`] makes any step a tower layer
//! that then hands the job to the service inside.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tower::{Layer, Service};

use crate::error::ApiError;
use crate::job::Job;

/// One stage of the cache path.
pub trait Step: Clone + Send + Sync + 'static {
    /// Prepares `job` for the next stage, or refuses it.
    fn prepare(&self, job: Job) -> impl Future<Output = Result<Job, ApiError>> + Send;
}

/// A [`Step`] as a tower layer.
#[derive(Debug, Clone)]
pub struct StepLayer<T> {
    step: T,
}

impl<T> StepLayer<T> {
    pub fn new(step: T) -> Self {
        StepLayer { step }
    }
}

impl<T: Clone, S> Layer<S> for StepLayer<T> {
    type Service = StepService<T, S>;

    fn layer(&self, inner: S) -> Self::Service {
        StepService {
            step: self.step.clone(),
            inner,
        }
    }
}

/// A [`Step`] in front of `inner`.
#[derive(Debug, Clone)]
pub struct StepService<T, S> {
    step: T,
    inner: S,
}

impl<T, S> Service<Job> for StepService<T, S>
where
    T: Step,
    S: Service<Job, Error = ApiError> + Clone + Send + 'static,
    S::Future: Send,
{
    type Response = S::Response;
    type Error = ApiError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, ApiError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ApiError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, job: Job) -> Self::Future {
        let step = self.step.clone();
        // `inner` was made ready for this call: take it, and leave a clone for the next.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(async move {
            let job = step.prepare(job).await?;
            inner.call(job).await
        })
    }
}
