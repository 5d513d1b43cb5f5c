//! Concurrency limit: at most `max` requests in flight; one more gets a 503 with
//! `Retry-After` at once instead of waiting. A request stays in flight until its response
//! body ends or is dropped, so a long stream holds its slot to the end.

mod body;

use std::convert::Infallible;
use std::future::{ready, Future};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tokio::sync::Semaphore;
use tower::{Layer, Service};

pub use body::PermitBody;

use crate::body::Body;
use crate::error::{ApiError, ErrorFormat};

/// Seconds a refused client is told to wait.
pub const RETRY_AFTER_S: u64 = 1;

#[derive(Debug, Clone)]
pub struct ConcurrencyLimitLayer {
    max: usize,
}

impl ConcurrencyLimitLayer {
    pub fn new(max: usize) -> Self {
        ConcurrencyLimitLayer { max }
    }
}

impl<S> Layer<S> for ConcurrencyLimitLayer {
    type Service = ConcurrencyLimit<S>;

    fn layer(&self, inner: S) -> ConcurrencyLimit<S> {
        ConcurrencyLimit::new(inner, self.max)
    }
}

/// Clones share one semaphore.
#[derive(Debug, Clone)]
pub struct ConcurrencyLimit<S> {
    inner: S,
    slots: Arc<Semaphore>,
    max: usize,
}

impl<S> ConcurrencyLimit<S> {
    pub fn new(inner: S, max: usize) -> Self {
        ConcurrencyLimit::shared(inner, Arc::new(Semaphore::new(max)), max)
    }

    /// A limit over `slots`, which other services may share (every app built from one
    /// [`crate::AppState`] shares its slots).
    pub fn shared(inner: S, slots: Arc<Semaphore>, max: usize) -> Self {
        ConcurrencyLimit { inner, slots, max }
    }

    /// Requests in flight now.
    pub fn active(&self) -> usize {
        self.max - self.slots.available_permits()
    }
}

impl<S> Service<Request<Body>> for ConcurrencyLimit<S>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let Ok(permit) = self.slots.clone().try_acquire_owned() else {
            let format = ErrorFormat::for_path(req.uri().path());
            let e = ApiError::overloaded(
                format!(
                    "Too many active requests (the limit is {}); retry in {RETRY_AFTER_S} s.",
                    self.max
                ),
                RETRY_AFTER_S,
            );
            return Box::pin(ready(Ok(e.into_response_as(format))));
        };
        let fut = self.inner.call(req);
        Box::pin(async move {
            let res = fut.await?;
            Ok(res.map(|b| Body::new(PermitBody::new(b, permit))))
        })
    }
}

#[cfg(test)]
mod tests {
    use http::header;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    use super::*;
    use crate::layers::testing::echo;

    #[tokio::test]
    async fn limits_built_over_the_same_slots_share_them() {
        let slots = Arc::new(Semaphore::new(1));
        let a = ConcurrencyLimit::shared(echo(), slots.clone(), 1);
        let b = ConcurrencyLimit::shared(echo(), slots, 1);
        let _held = a.oneshot(Request::new(Body::from("a"))).await.unwrap();
        let refused = b.oneshot(Request::new(Body::empty())).await.unwrap();
        assert_eq!(refused.status(), 503);
    }

    #[tokio::test]
    async fn refuses_beyond_the_limit_until_a_body_is_done() {
        let svc = ConcurrencyLimit::new(echo(), 1);
        let held = svc
            .clone()
            .oneshot(Request::new(Body::from("a")))
            .await
            .unwrap();
        assert_eq!(svc.active(), 1);
        let refused = svc
            .clone()
            .oneshot(Request::new(Body::empty()))
            .await
            .unwrap();
        assert_eq!(refused.status(), 503);
        assert_eq!(refused.headers()[header::RETRY_AFTER], "1");
        assert_eq!(held.into_body().collect().await.unwrap().to_bytes(), "a");
        assert_eq!(svc.active(), 0);
        let again = svc
            .clone()
            .oneshot(Request::new(Body::empty()))
            .await
            .unwrap();
        assert_eq!(again.status(), 200);
        drop(again);
        assert_eq!(svc.active(), 0);
    }
}
