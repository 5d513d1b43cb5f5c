//! Timeout, by tower-http's `Timeout`: a response that has not started within the limit
//! becomes a 504, which a [`Refusal`] renders in the API's error shape; the dropped handler
//! cancels its generation.

use std::time::Duration;

use http::StatusCode;
use tower::Layer;

use super::guard::{Guarded, Refusal};
use crate::error::ApiError;

#[derive(Debug, Clone, Copy)]
pub struct TimeoutLayer {
    limit: Duration,
}

impl TimeoutLayer {
    pub fn new(limit: Duration) -> Self {
        TimeoutLayer { limit }
    }
}

/// tower-http's timeout over `S`, its 504 in the API's error shape.
pub type Timeout<S> = Guarded<tower_http::timeout::Timeout<S>, Refusal>;

impl<S> Layer<S> for TimeoutLayer {
    type Service = Timeout<S>;

    fn layer(&self, inner: S) -> Timeout<S> {
        let status = StatusCode::GATEWAY_TIMEOUT;
        Guarded::of(
            tower_http::timeout::Timeout::with_status_code(inner, status, self.limit),
            Refusal::new(status, ApiError::timeout(self.limit.as_secs_f64())),
        )
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use http::{Request, Response};
    use tower::{ServiceBuilder, ServiceExt};

    use super::*;
    use crate::body::Body;
    use crate::layers::testing::{body_text, echo};

    #[tokio::test(start_paused = true)]
    async fn slow_responses_become_504() {
        let slow = tower::service_fn(|_: Request<Body>| async {
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok::<_, Infallible>(Response::new(Body::empty()))
        });
        let svc = ServiceBuilder::new()
            .layer(TimeoutLayer::new(Duration::from_secs(5)))
            .service(slow);
        let res = svc.oneshot(Request::new(Body::empty())).await.unwrap();
        assert_eq!(res.status(), 504);
        assert!(body_text(res).await.contains("request_timeout"));
    }

    #[tokio::test(start_paused = true)]
    async fn fast_responses_pass() {
        let svc = ServiceBuilder::new()
            .layer(TimeoutLayer::new(Duration::from_secs(5)))
            .service(echo());
        let res = svc.oneshot(Request::new(Body::from("ok"))).await.unwrap();
        assert_eq!(res.status(), 200);
        assert_eq!(body_text(res).await, "ok");
    }
}
