//! Tracing: one span per request (method, path, request id), with the status and latency
//! logged when the response starts, through tower-http's `TraceLayer`.

use http::Request;
use tower_http::classify::{ServerErrorsAsFailures, SharedClassifier};
use tower_http::trace::TraceLayer;
use tracing::Span;

use super::request_id::HEADER;

/// The span for a request.
pub fn make_span<B>(req: &Request<B>) -> Span {
    let id = req
        .headers()
        .get(HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-");
    tracing::info_span!("request", method = %req.method(), path = %req.uri().path(), request_id = %id)
}

/// The tracing layer's type: HTTP classification, spans from [`make_span`].
pub type Trace<B> = TraceLayer<SharedClassifier<ServerErrorsAsFailures>, fn(&Request<B>) -> Span>;

/// The tracing layer.
pub fn layer<B>() -> Trace<B> {
    TraceLayer::new_for_http().make_span_with(make_span as fn(&Request<B>) -> Span)
}

#[cfg(test)]
mod tests {
    use tower::{ServiceBuilder, ServiceExt};

    use super::*;
    use crate::body::Body;
    use crate::layers::testing::echo;

    #[tokio::test]
    async fn passes_requests_and_responses_through() {
        let svc = ServiceBuilder::new().layer(layer()).service(echo());
        let res = svc.oneshot(Request::new(Body::from("hi"))).await.unwrap();
        assert_eq!(res.status(), 200);
        use http_body_util::BodyExt;
        assert_eq!(res.into_body().collect().await.unwrap().to_bytes(), "hi");
    }
}
