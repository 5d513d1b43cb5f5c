//! Request counting: every response is counted in [`Metrics`] by route label and status,
//! including the ones that outer layers (auth, body limit) produce.

use std::sync::Arc;

use http::{Request, Response};

use super::guard::{Guard, GuardLayer, Guarded};
use crate::body::Body;
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::router::label_of;

/// Where requests are counted.
#[derive(Debug, Clone)]
pub struct Counter {
    metrics: Arc<Metrics>,
}

pub type CountLayer = GuardLayer<Counter>;
pub type Count<S> = Guarded<S, Counter>;

impl CountLayer {
    pub fn new(metrics: Arc<Metrics>) -> Self {
        GuardLayer::of(Counter { metrics })
    }
}

impl Guard for Counter {
    type Admitted = (Arc<Metrics>, &'static str);

    fn admit(&self, req: &mut Request<Body>) -> Result<Self::Admitted, ApiError> {
        let label = label_of(req.method(), req.uri().path());
        Ok((self.metrics.clone(), label))
    }

    fn finish((metrics, label): Self::Admitted, res: Response<Body>) -> Response<Body> {
        metrics.count_request(label, res.status().as_u16());
        res
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
