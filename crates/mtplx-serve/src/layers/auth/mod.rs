//! API key auth: with a key configured, every request but `GET /health` must carry it as
//! `Authorization: Bearer KEY` or `x-api-key: KEY` (Anthropic clients), else 401.

use std::sync::Arc;

use http::{header, Method, Request};

use super::guard::{Guard, GuardLayer, Guarded};
use crate::body::Body;
use crate::error::ApiError;

/// The key every request must present, if any.
#[derive(Debug, Clone)]
pub struct ApiKey {
    key: Option<Arc<str>>,
}

pub type AuthLayer = GuardLayer<ApiKey>;
pub type Auth<S> = Guarded<S, ApiKey>;

impl AuthLayer {
    /// `None` lets everything through.
    pub fn new(key: Option<String>) -> Self {
        GuardLayer::of(ApiKey {
            key: key.filter(|k| !k.is_empty()).map(Arc::from),
        })
    }
}

/// Compares without stopping at the first difference.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The key the request presents, if any.
fn presented<B>(req: &Request<B>) -> Option<&[u8]> {
    let h = req.headers();
    if let Some(v) = h.get(header::AUTHORIZATION) {
        let v = v.as_bytes();
        let scheme = v.get(..7)?;
        return scheme
            .eq_ignore_ascii_case(b"bearer ")
            .then(|| v[7..].trim_ascii());
    }
    h.get("x-api-key").map(|v| v.as_bytes().trim_ascii())
}

fn exempt<B>(req: &Request<B>) -> bool {
    matches!(*req.method(), Method::GET | Method::HEAD) && req.uri().path() == "/health"
}

impl Guard for ApiKey {
    type Admitted = ();

    fn admit(&self, req: &mut Request<Body>) -> Result<(), ApiError> {
        match &self.key {
            Some(key)
                if !exempt(req) && !presented(req).is_some_and(|p| same(p, key.as_bytes())) =>
            {
                Err(ApiError::unauthorized())
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use tower::{ServiceBuilder, ServiceExt};

    use super::*;
    use crate::layers::testing::echo;

    async fn status(key: Option<&str>, req: Request<Body>) -> u16 {
        let svc = ServiceBuilder::new()
            .layer(AuthLayer::new(key.map(str::to_owned)))
            .service(echo());
        svc.oneshot(req).await.unwrap().status().as_u16()
    }

    fn post(header: Option<(&str, &str)>) -> Request<Body> {
        let mut b = Request::post("/v1/chat/completions");
        if let Some((k, v)) = header {
            b = b.header(k, v);
        }
        b.body(Body::empty()).unwrap()
    }

    #[tokio::test]
    async fn checks_bearer_and_x_api_key() {
        let k = Some("s3cret");
        assert_eq!(status(k, post(None)).await, 401);
        assert_eq!(
            status(k, post(Some(("authorization", "Bearer nope")))).await,
            401
        );
        assert_eq!(
            status(k, post(Some(("authorization", "Basic s3cret")))).await,
            401
        );
        assert_eq!(status(k, post(Some(("x-api-key", "s3cret0")))).await, 401);
        assert_eq!(
            status(k, post(Some(("authorization", "Bearer s3cret")))).await,
            200
        );
        assert_eq!(
            status(k, post(Some(("authorization", "bearer s3cret")))).await,
            200
        );
        assert_eq!(status(k, post(Some(("x-api-key", "s3cret")))).await, 200);
    }

    #[tokio::test]
    async fn health_is_open_and_no_key_means_no_check() {
        let health = Request::get("/health").body(Body::empty()).unwrap();
        assert_eq!(status(Some("k"), health).await, 200);
        let models = Request::get("/v1/models").body(Body::empty()).unwrap();
        assert_eq!(status(Some("k"), models).await, 401);
        assert_eq!(status(None, post(None)).await, 200);
    }

    #[tokio::test]
    async fn anthropic_routes_get_anthropic_errors() {
        let svc = ServiceBuilder::new()
            .layer(AuthLayer::new(Some("k".into())))
            .service(echo());
        let req = Request::post("/v1/messages").body(Body::empty()).unwrap();
        let res = svc.oneshot(req).await.unwrap();
        let text = crate::layers::testing::body_text(res).await;
        assert!(text.contains("\"type\":\"error\""), "{text}");
    }
}
