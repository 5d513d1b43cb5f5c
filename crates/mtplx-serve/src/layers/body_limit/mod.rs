//! Body limit, by tower-http's `RequestBodyLimit`: a request whose `Content-Length` is over
//! the limit is refused at once with a 413; a body without a length is cut off at the
//! limit, and the handler reading it answers 413 (see [`crate::api::read_json`]). A
//! [`Refusal`] renders both in the API's error shape, naming the limit.

use http::{Request, Response, StatusCode};
use tower::util::{MapRequest, MapResponse};
use tower::Layer;
use tower_http::body::Limited;
use tower_http::limit::{RequestBodyLimit, ResponseBody};

use super::guard::{Guarded, Refusal};
use crate::body::Body;
use crate::error::ApiError;

#[derive(Debug, Clone, Copy)]
pub struct BodyLimitLayer {
    limit: usize,
}

impl BodyLimitLayer {
    pub fn new(limit: usize) -> Self {
        BodyLimitLayer { limit }
    }
}

type ToBody = fn(Request<Limited<Body>>) -> Request<Body>;
type FromLimit = fn(Response<ResponseBody<Body>>) -> Response<Body>;

/// tower-http's limit over `S`, its refusals in the API's error shape.
pub type BodyLimit<S> =
    Guarded<MapResponse<RequestBodyLimit<MapRequest<S, ToBody>>, FromLimit>, Refusal>;

impl<S> Layer<S> for BodyLimitLayer {
    type Service = BodyLimit<S>;

    fn layer(&self, inner: S) -> BodyLimit<S> {
        let to_body: ToBody = |req| req.map(Body::new);
        let from_limit: FromLimit = |res| res.map(Body::new);
        let limited = RequestBodyLimit::new(MapRequest::new(inner, to_body), self.limit);
        let too_large = ApiError::payload_too_large(self.limit);
        Guarded::of(
            MapResponse::new(limited, from_limit),
            Refusal::new(StatusCode::PAYLOAD_TOO_LARGE, too_large),
        )
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::convert::Infallible;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use bytes::Bytes;
    use hyper::body::Frame;
    use tower::{Service, ServiceBuilder, ServiceExt};

    use super::*;
    use crate::layers::testing::{body_text, echo};

    fn svc() -> impl Service<Request<Body>, Response = Response<Body>, Error = Infallible> {
        ServiceBuilder::new()
            .layer(BodyLimitLayer::new(8))
            .service(echo())
    }

    /// Frames with no declared length (a chunked upload).
    struct Chunks(VecDeque<Bytes>);

    impl hyper::body::Body for Chunks {
        type Data = Bytes;
        type Error = Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            Poll::Ready(self.0.pop_front().map(|b| Ok(Frame::data(b))))
        }
    }

    #[tokio::test]
    async fn declared_lengths_over_the_limit_are_refused() {
        let req = Request::post("/v1/completions")
            .header("content-length", "9")
            .body(Body::from("123456789"))
            .unwrap();
        let res = svc().oneshot(req).await.unwrap();
        assert_eq!(res.status(), 413);
        assert!(body_text(res).await.contains("8 bytes"));
    }

    #[tokio::test]
    async fn streamed_bodies_are_cut_at_the_limit() {
        let chunks = Chunks(["12345", "6789"].map(Bytes::from).into());
        let req = Request::post("/x").body(Body::new(chunks)).unwrap();
        let res = svc().oneshot(req).await.unwrap();
        assert_eq!(res.status(), 413);
        let chunks = Chunks(["1234", "5678"].map(Bytes::from).into());
        let req = Request::post("/x").body(Body::new(chunks)).unwrap();
        let res = svc().oneshot(req).await.unwrap();
        assert_eq!(body_text(res).await, "12345678");
    }

    #[tokio::test]
    async fn a_cut_off_body_names_the_limit_in_the_paths_shape() {
        let chunks = Chunks(["12345", "6789"].map(Bytes::from).into());
        let req = Request::post("/v1/messages")
            .body(Body::new(chunks))
            .unwrap();
        let text = body_text(svc().oneshot(req).await.unwrap()).await;
        assert!(text.contains("limit of 8 bytes"), "{text}");
        assert!(text.contains("\"type\":\"error\""), "{text}");
    }

    #[tokio::test]
    async fn bodies_within_the_limit_pass() {
        let res = svc().oneshot(Request::post("/x").body(Body::from("12345678")).unwrap());
        let res = res.await.unwrap();
        assert_eq!(res.status(), 200);
        assert_eq!(body_text(res).await, "12345678");
    }
}
