//! Timeout: a response that has not started within the limit becomes a 504 in the API's
//! error shape, and the dropped handler cancels its generation.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use tower::{Layer, Service};

use crate::body::Body;
use crate::error::{ApiError, ErrorFormat};

#[derive(Debug, Clone, Copy)]
pub struct TimeoutLayer {
    limit: Duration,
}

impl TimeoutLayer {
    pub fn new(limit: Duration) -> Self {
        TimeoutLayer { limit }
    }
}

impl<S> Layer<S> for TimeoutLayer {
    type Service = Timeout<S>;

    fn layer(&self, inner: S) -> Timeout<S> {
        Timeout {
            inner,
            limit: self.limit,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Timeout<S> {
    inner: S,
    limit: Duration,
}

impl<S> Service<Request<Body>> for Timeout<S>
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
        let format = ErrorFormat::for_path(req.uri().path());
        let limit = self.limit;
        let fut = self.inner.call(req);
        Box::pin(async move {
            match tokio::time::timeout(limit, fut).await {
                Ok(res) => res,
                Err(_) => Ok(ApiError::timeout(limit.as_secs_f64()).into_response_as(format)),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use tower::{ServiceBuilder, ServiceExt};

    use super::*;
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
