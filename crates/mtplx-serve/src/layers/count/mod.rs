//! Request counting: every response is counted in [`Metrics`] by route label and status,
//! including the ones that outer layers (auth, body limit) produce.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower::{Layer, Service};

use crate::body::Body;
use crate::metrics::Metrics;
use crate::router::label_of;

#[derive(Debug, Clone)]
pub struct CountLayer {
    metrics: Arc<Metrics>,
}

impl CountLayer {
    pub fn new(metrics: Arc<Metrics>) -> Self {
        CountLayer { metrics }
    }
}

impl<S> Layer<S> for CountLayer {
    type Service = Count<S>;

    fn layer(&self, inner: S) -> Count<S> {
        Count {
            inner,
            metrics: self.metrics.clone(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Count<S> {
    inner: S,
    metrics: Arc<Metrics>,
}

impl<S> Service<Request<Body>> for Count<S>
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
        let label = label_of(req.method(), req.uri().path());
        let metrics = self.metrics.clone();
        let fut = self.inner.call(req);
        Box::pin(async move {
            let res = fut.await?;
            metrics.count_request(label, res.status().as_u16());
            Ok(res)
        })
    }
}

#[cfg(test)]
mod tests {
    use tower::{ServiceBuilder, ServiceExt};

    use super::*;
    use crate::layers::testing::echo;

    #[tokio::test]
    async fn counts_by_route_and_status() {
        let metrics = Arc::new(Metrics::default());
        let svc = ServiceBuilder::new()
            .layer(CountLayer::new(metrics.clone()))
            .service(echo());
        for path in ["/health", "/health", "/some/unknown/path"] {
            let req = Request::get(path).body(Body::empty()).unwrap();
            svc.clone().oneshot(req).await.unwrap();
        }
        assert_eq!(metrics.requests("/health", 200), 2);
        assert_eq!(metrics.requests("other", 200), 1);
    }
}
