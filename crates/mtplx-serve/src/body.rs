//! The one response body type every route and layer returns.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::{Frame, SizeHint};

/// Errors a body can end with.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A boxed HTTP body: a full buffer, a stream of server-sent events, or a request body on
/// its way in. Like axum's `Body`, so layers can wrap any body and still return this type.
pub struct Body(UnsyncBoxBody<Bytes, BoxError>);

impl Body {
    /// Wraps any body.
    pub fn new<B>(body: B) -> Self
    where
        B: hyper::body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        Body(body.map_err(Into::into).boxed_unsync())
    }

    pub fn empty() -> Self {
        Body::new(Empty::<Bytes>::new())
    }

    pub fn full(bytes: impl Into<Bytes>) -> Self {
        Body::new(Full::new(bytes.into()))
    }
}

impl Default for Body {
    fn default() -> Self {
        Body::empty()
    }
}

impl From<String> for Body {
    fn from(s: String) -> Self {
        Body::full(s)
    }
}

impl From<&'static str> for Body {
    fn from(s: &'static str) -> Self {
        Body::full(s)
    }
}

impl From<Vec<u8>> for Body {
    fn from(v: Vec<u8>) -> Self {
        Body::full(v)
    }
}

impl From<Bytes> for Body {
    fn from(b: Bytes) -> Self {
        Body::full(b)
    }
}

impl hyper::body::Body for Body {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Pin::new(&mut self.0).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.0.size_hint()
    }
}

impl std::fmt::Debug for Body {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Body")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn full_bodies_collect_to_their_bytes() {
        let b = Body::from("hello");
        assert_eq!(b.collect().await.unwrap().to_bytes(), "hello");
        let b = Body::empty();
        assert!(hyper::body::Body::is_end_stream(&b));
    }
}
