//! Request ids: every request gets an `x-request-id` (a UUID unless the client sent one),
//! which handlers, logs and the response carry.

use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};

/// The header.
pub const HEADER: &str = "x-request-id";

/// Sets `x-request-id` on requests that lack it.
pub fn set() -> SetRequestIdLayer<MakeRequestUuid> {
    SetRequestIdLayer::x_request_id(MakeRequestUuid)
}

/// Copies the request's `x-request-id` to the response.
pub fn propagate() -> PropagateRequestIdLayer {
    PropagateRequestIdLayer::x_request_id()
}

#[cfg(test)]
mod tests {
    use http::Request;
    use tower::{ServiceBuilder, ServiceExt};

    use super::*;
    use crate::body::Body;
    use crate::layers::testing::echo;

    #[tokio::test]
    async fn adds_an_id_or_keeps_the_clients() {
        let svc = ServiceBuilder::new()
            .layer(set())
            .layer(propagate())
            .service(echo());
        let res = svc
            .clone()
            .oneshot(Request::new(Body::empty()))
            .await
            .unwrap();
        let id = res.headers()[HEADER].to_str().unwrap();
        assert_eq!(id.len(), 36, "a UUID: {id}");
        let req = Request::builder()
            .header(HEADER, "mine-1")
            .body(Body::empty())
            .unwrap();
        let res = svc.oneshot(req).await.unwrap();
        assert_eq!(res.headers()[HEADER], "mine-1");
    }
}
