//! Tower layers, outermost first in [`crate::app`]: request id, tracing, request counting,
//! timeout, auth, body limit, session; the concurrency limit wraps only the generation
//! routes. Each is its own module with its own tests.
//!
//! tower-http does the generic work: request ids, tracing, the body limit and the timeout.
//! The mtplx-specific layers (auth, counting, the concurrency limit) are each a [`guard`]
//! on one skeleton, and a [`guard::Refusal`] renders tower-http's refusals (a bare 413 or
//! 504) in the API's error shape.

pub mod auth;
pub mod body_limit;
pub mod concurrency;
pub mod count;
pub mod guard;
pub mod request_id;
pub mod session;
pub mod timeout;
pub mod trace;

#[cfg(test)]
pub(crate) mod testing {
    //! Small services for the layers' tests.

    use std::convert::Infallible;

    use http::{Request, Response};
    use http_body_util::BodyExt;

    use crate::body::Body;

    /// Echoes the request body back.
    pub fn echo() -> impl tower::Service<
        Request<Body>,
        Response = Response<Body>,
        Error = Infallible,
        Future = impl Send,
    > + Clone {
        tower::service_fn(|req: Request<Body>| async move {
            let res = match req.into_body().collect().await {
                Ok(c) => Response::new(Body::from(c.to_bytes())),
                Err(e) => crate::api::read_json::<()>(Body::new(ErrBody(Some(e))))
                    .await
                    .map_or_else(|e| e.into_response(), |_| Response::new(Body::empty())),
            };
            Ok::<_, Infallible>(res)
        })
    }

    /// A body that fails with a given error, to reuse `read_json`'s mapping.
    struct ErrBody(Option<crate::body::BoxError>);

    impl hyper::body::Body for ErrBody {
        type Data = bytes::Bytes;
        type Error = crate::body::BoxError;

        fn poll_frame(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Result<hyper::body::Frame<bytes::Bytes>, Self::Error>>>
        {
            std::task::Poll::Ready(self.0.take().map(Err))
        }
    }

    pub async fn body_text(res: Response<Body>) -> String {
        let bytes = res.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(bytes.to_vec()).unwrap()
    }
}
