//! Concurrency limit: at most `max` requests in flight; one more gets a 503 with
//! `Retry-After` at once instead of waiting. A request stays in flight until its response
//! body ends or is dropped, so a long stream holds its slot to the end.

mod body;

use std::sync::Arc;

use http::{Request, Response};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

pub use body::PermitBody;

use super::guard::{Guard, GuardLayer, Guarded};
use crate::body::Body;
use crate::error::ApiError;

/// Seconds a refused client is told to wait.
pub const RETRY_AFTER_S: u64 = 1;

/// The slots requests take; clones share them.
#[derive(Debug, Clone)]
pub struct Slots {
    slots: Arc<Semaphore>,
    max: usize,
}

impl Slots {
    pub fn new(max: usize) -> Self {
        Slots::shared(Arc::new(Semaphore::new(max)), max)
    }

    pub fn shared(slots: Arc<Semaphore>, max: usize) -> Self {
        Slots { slots, max }
    }
}

/// The services this layer makes share its slots.
pub type ConcurrencyLimitLayer = GuardLayer<Slots>;
/// Clones share one semaphore.
pub type ConcurrencyLimit<S> = Guarded<S, Slots>;

impl ConcurrencyLimitLayer {
    pub fn new(max: usize) -> Self {
        GuardLayer::of(Slots::new(max))
    }
}

impl<S> ConcurrencyLimit<S> {
    pub fn new(inner: S, max: usize) -> Self {
        Guarded::of(inner, Slots::new(max))
    }

    /// A limit over `slots`, which other services may share (every app built from one
    /// [`crate::AppState`] shares its slots).
    pub fn shared(inner: S, slots: Arc<Semaphore>, max: usize) -> Self {
        Guarded::of(inner, Slots::shared(slots, max))
    }

    /// Requests in flight now.
    pub fn active(&self) -> usize {
        let s = self.guard();
        s.max - s.slots.available_permits()
    }
}

impl Guard for Slots {
    type Admitted = OwnedSemaphorePermit;

    fn admit(&self, _: &mut Request<Body>) -> Result<OwnedSemaphorePermit, ApiError> {
        self.slots.clone().try_acquire_owned().map_err(|_| {
            ApiError::overloaded(
                format!(
                    "Too many active requests (the limit is {}); retry in {RETRY_AFTER_S} s.",
                    self.max
                ),
                RETRY_AFTER_S,
            )
        })
    }

    fn finish(permit: OwnedSemaphorePermit, res: Response<Body>) -> Response<Body> {
        res.map(|b| Body::new(PermitBody::new(b, permit)))
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
