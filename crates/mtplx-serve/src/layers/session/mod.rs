//! Session resolution from headers: the first of `x-mtplx-session-id`,
//! `x-session-affinity`, `x-session-id`, `x-openwebui-chat-id`, `X-Claude-Code-Session-Id`
//! that holds a usable id becomes a [`SessionHint`] in the request's extensions.
//!
//! The rest of the order lives where its data is: the handler reads the body's
//! `metadata.session_id` / `conversation_id` / `user` ([`crate::api::extras`]) when no
//! header named a session, and the engine falls back to the longest token-prefix match
//! against known sessions, then to a fresh `anon-…` id.

use std::task::{Context, Poll};

use http::Request;
use tower::{Layer, Service};

pub use crate::session::{SessionHint, SessionSource};

/// Headers that name a session, in priority order.
pub const HEADERS: [(&str, SessionSource); 5] = [
    ("x-mtplx-session-id", SessionSource::Header),
    ("x-session-affinity", SessionSource::Header),
    ("x-session-id", SessionSource::Header),
    ("x-openwebui-chat-id", SessionSource::Header),
    ("x-claude-code-session-id", SessionSource::Header),
];

/// The hint the headers of `req` give, if any.
pub fn from_headers<B>(req: &Request<B>) -> Option<SessionHint> {
    HEADERS.iter().find_map(|(name, source)| {
        req.headers()
            .get(*name)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| SessionHint::new(v, *source))
    })
}

/// Adds [`SessionHint`] to requests whose headers name a session.
#[derive(Debug, Clone, Copy, Default)]
pub struct SessionLayer;

impl<S> Layer<S> for SessionLayer {
    type Service = SessionService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        SessionService { inner }
    }
}

#[derive(Debug, Clone)]
pub struct SessionService<S> {
    inner: S,
}

impl<S, B> Service<Request<B>> for SessionService<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> S::Future {
        if let Some(hint) = from_headers(&req) {
            req.extensions_mut().insert(hint);
        }
        self.inner.call(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;
    use tower::ServiceExt;

    async fn seen(req: Request<()>) -> Option<SessionHint> {
        let svc = SessionLayer.layer(tower::service_fn(|r: Request<()>| async move {
            Ok::<_, Infallible>(r.extensions().get::<SessionHint>().cloned())
        }));
        svc.oneshot(req).await.unwrap()
    }

    #[tokio::test]
    async fn headers_are_read_in_priority_order() {
        let req = Request::builder()
            .header("x-session-id", "low")
            .header("x-mtplx-session-id", "high")
            .body(())
            .unwrap();
        assert_eq!(seen(req).await.unwrap().id(), "high");
        let req = Request::builder()
            .header("X-Claude-Code-Session-Id", "cc-1")
            .body(())
            .unwrap();
        assert_eq!(seen(req).await.unwrap().id(), "cc-1");
        let req = Request::builder()
            .header("x-mtplx-session-id", "  ")
            .header("x-session-affinity", "aff")
            .body(())
            .unwrap();
        assert_eq!(seen(req).await.unwrap().id(), "aff");
        assert!(seen(Request::new(())).await.is_none());
    }
}
