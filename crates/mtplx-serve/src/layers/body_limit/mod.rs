//! Body limit: a request whose `Content-Length` is over the limit is refused at once with
//! a 413; a body without a length is cut off at the limit, and the handler reading it
//! answers 413 (see [`crate::api::read_json`]).

mod body;

use std::convert::Infallible;
use std::future::{ready, Future};
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{header, Request, Response};
use tower::{Layer, Service};

pub use body::{BodyTooLarge, Limited};

use crate::body::Body;
use crate::error::{ApiError, ErrorFormat};

#[derive(Debug, Clone, Copy)]
pub struct BodyLimitLayer {
    limit: usize,
}

impl BodyLimitLayer {
    pub fn new(limit: usize) -> Self {
        BodyLimitLayer { limit }
    }
}

impl<S> Layer<S> for BodyLimitLayer {
    type Service = BodyLimit<S>;

    fn layer(&self, inner: S) -> BodyLimit<S> {
        BodyLimit {
            inner,
            limit: self.limit,
        }
    }
}

#[derive(Debug, Clone)]
pub struct BodyLimit<S> {
    inner: S,
    limit: usize,
}

impl<S> Service<Request<Body>> for BodyLimit<S>
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
        let declared = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > self.limit as u64) {
            let format = ErrorFormat::for_path(req.uri().path());
            let res = ApiError::payload_too_large(self.limit).into_response_as(format);
            return Box::pin(ready(Ok(res)));
        }
        let limit = self.limit;
        let req = req.map(|b| Body::new(Limited::new(b, limit)));
        Box::pin(self.inner.call(req))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use bytes::Bytes;
    use hyper::body::Frame;
    use tower::{ServiceBuilder, ServiceExt};

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
    async fn bodies_within_the_limit_pass() {
        let res = svc().oneshot(Request::post("/x").body(Body::from("12345678")).unwrap());
        let res = res.await.unwrap();
        assert_eq!(res.status(), 200);
        assert_eq!(body_text(res).await, "12345678");
    }
}
