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

/// Headers that name a session, in priority order.
pub const HEADERS: [(&str, SessionSource); 5] = [
    ("x-mtplx-session-id", SessionSource::Header),
    ("x-session-affinity", SessionSource::Header),
    ("x-session-id", SessionSource::Header),
    ("x-openwebui-chat-id", SessionSource::Header),
    ("x-claude-code-session-id", SessionSource::Header),
];

/// Longest session id accepted; longer ones are hashed down to this.
pub const MAX_ID_LEN: usize = 128;

/// Where a request's session id came from (the request log's `session_source`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SessionSource {
    Header,
    MetadataSessionId,
    MetadataConversationId,
    MetadataUserId,
    User,
    /// The longest token-prefix match against known sessions.
    PrefixMatch,
    /// Nothing matched: a new `anon-…` session.
    Anonymous,
}

impl SessionSource {
    pub fn as_str(self) -> &'static str {
        match self {
            SessionSource::Header => "header",
            SessionSource::MetadataSessionId => "metadata.session_id",
            SessionSource::MetadataConversationId => "metadata.conversation_id",
            SessionSource::MetadataUserId => "metadata.user_id",
            SessionSource::User => "user",
            SessionSource::PrefixMatch => "prefix_match",
            SessionSource::Anonymous => "anonymous",
        }
    }
}

/// A client-named session id, trimmed, non-empty, printable ASCII, at most
/// [`MAX_ID_LEN`] bytes (longer or non-ASCII ids are replaced by a blake3 digest, so any
/// string names a stable session without putting arbitrary bytes in logs).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SessionHint {
    id: String,
    source: SessionSource,
}

impl SessionHint {
    /// `None` for an empty (or all-whitespace) id.
    pub fn new(raw: &str, source: SessionSource) -> Option<SessionHint> {
        let raw = raw.trim();
        if raw.is_empty() {
            return None;
        }
        let plain = raw.len() <= MAX_ID_LEN && raw.bytes().all(|b| b.is_ascii_graphic());
        let id = if plain {
            raw.to_owned()
        } else {
            format!("h-{}", &blake3::hash(raw.as_bytes()).to_hex()[..32])
        };
        Some(SessionHint { id, source })
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn source(&self) -> SessionSource {
        self.source
    }
}

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

    #[test]
    fn odd_ids_become_stable_digests() {
        let long = "x".repeat(500);
        let a = SessionHint::new(&long, SessionSource::User).unwrap();
        let b = SessionHint::new(&long, SessionSource::User).unwrap();
        assert_eq!(a, b);
        assert!(a.id().starts_with("h-") && a.id().len() == 34);
        let spaced = SessionHint::new("my chat", SessionSource::User).unwrap();
        assert_ne!(spaced.id(), "my chat");
        assert_eq!(
            SessionHint::new(" ok-1 ", SessionSource::Header)
                .unwrap()
                .id(),
            "ok-1"
        );
        assert!(SessionHint::new("", SessionSource::Header).is_none());
    }
}
