//! The one skeleton the mtplx-specific layers share: a [`Guard`] looks at a request before
//! the inner service does and may refuse it with an [`ApiError`], rendered in the error
//! format of the request's path (OpenAI's, or Anthropic's under `/v1/messages`); what it
//! admitted may then touch the response.
//!
//! [`Refusal`] is the guard that makes a tower-http layer inside it speak the API's error
//! format: tower-http refuses with a bare status, and every response of that status that
//! comes back through the guard is rendered as the API error it stands for.

use std::convert::Infallible;
use std::future::{ready, Future};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response, StatusCode};
use tower::{Layer, Service};

use crate::body::Body;
use crate::error::{ApiError, ErrorFormat};

/// What a layer checks on the way in and does on the way out.
pub trait Guard: Clone + Send + 'static {
    /// What an admitted request carries to its response (a permit, a label, a format).
    type Admitted: Send + 'static;

    /// Admits `req` (it may add extensions or wrap the body), or refuses it.
    fn admit(&self, req: &mut Request<Body>) -> Result<Self::Admitted, ApiError>;

    /// The response the inner service gave an admitted request.
    fn finish(admitted: Self::Admitted, res: Response<Body>) -> Response<Body> {
        let _ = admitted;
        res
    }
}

/// The layer of a [`Guard`].
#[derive(Debug, Clone)]
pub struct GuardLayer<G> {
    guard: G,
}

impl<G> GuardLayer<G> {
    pub fn of(guard: G) -> Self {
        GuardLayer { guard }
    }
}

impl<S, G: Clone> Layer<S> for GuardLayer<G> {
    type Service = Guarded<S, G>;

    fn layer(&self, inner: S) -> Guarded<S, G> {
        Guarded::of(inner, self.guard.clone())
    }
}

/// A service behind a [`Guard`].
#[derive(Debug, Clone)]
pub struct Guarded<S, G> {
    inner: S,
    guard: G,
}

impl<S, G> Guarded<S, G> {
    pub fn of(inner: S, guard: G) -> Self {
        Guarded { inner, guard }
    }

    pub fn guard(&self) -> &G {
        &self.guard
    }
}

impl<S, G> Service<Request<Body>> for Guarded<S, G>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible>,
    S::Future: Send + 'static,
    G: Guard,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<Body>) -> Self::Future {
        match self.guard.admit(&mut req) {
            Err(e) => {
                let format = ErrorFormat::for_path(req.uri().path());
                Box::pin(ready(Ok(e.into_response_as(format))))
            }
            Ok(admitted) => {
                let fut = self.inner.call(req);
                Box::pin(async move { Ok(G::finish(admitted, fut.await?)) })
            }
        }
    }
}

/// Renders every response of `status` from inside as `error`, in the request's format.
#[derive(Debug, Clone)]
pub struct Refusal {
    status: StatusCode,
    error: Arc<ApiError>,
}

impl Refusal {
    /// Only the layer this guard wraps may answer `status` from inside it.
    pub fn new(status: StatusCode, error: ApiError) -> Self {
        Refusal {
            status,
            error: Arc::new(error),
        }
    }
}

impl Guard for Refusal {
    type Admitted = (ErrorFormat, Self);

    fn admit(&self, req: &mut Request<Body>) -> Result<Self::Admitted, ApiError> {
        Ok((ErrorFormat::for_path(req.uri().path()), self.clone()))
    }

    fn finish((format, refusal): Self::Admitted, res: Response<Body>) -> Response<Body> {
        if res.status() == refusal.status {
            ApiError::clone(&refusal.error).into_response_as(format)
        } else {
            res
        }
    }
}

#[cfg(test)]
mod tests {
    use tower::{ServiceBuilder, ServiceExt};

    use super::*;
    use crate::layers::testing::{body_text, echo};

    #[derive(Clone)]
    struct NoPosts;

    impl Guard for NoPosts {
        type Admitted = ();

        fn admit(&self, req: &mut Request<Body>) -> Result<(), ApiError> {
            match *req.method() {
                http::Method::POST => Err(ApiError::bad_request("no posts")),
                _ => Ok(()),
            }
        }
    }

    #[tokio::test]
    async fn refusals_are_in_the_format_of_the_path() {
        let svc = ServiceBuilder::new()
            .layer(GuardLayer::of(NoPosts))
            .service(echo());
        let req = |path| Request::post(path).body(Body::empty()).unwrap();
        let res = svc.clone().oneshot(req("/v1/messages")).await.unwrap();
        assert_eq!(res.status(), 400);
        assert!(body_text(res).await.contains("\"type\":\"error\""));
        let res = svc.clone().oneshot(req("/v1/completions")).await.unwrap();
        assert!(body_text(res).await.starts_with("{\"error\":"));
        let get = Request::get("/x").body(Body::from("ok")).unwrap();
        assert_eq!(body_text(svc.oneshot(get).await.unwrap()).await, "ok");
    }

    #[tokio::test]
    async fn a_refusal_renders_its_status_from_inside() {
        let teapot = tower::service_fn(|req: Request<Body>| async move {
            let mut res = Response::new(Body::from("bare"));
            if req.uri().path() != "/fine" {
                *res.status_mut() = StatusCode::IM_A_TEAPOT;
            }
            Ok::<_, Infallible>(res)
        });
        let refusal = Refusal::new(StatusCode::IM_A_TEAPOT, ApiError::internal("no tea"));
        let svc = GuardLayer::of(refusal).layer(teapot);
        let req = |path| Request::get(path).body(Body::empty()).unwrap();
        let res = svc.clone().oneshot(req("/v1/messages")).await.unwrap();
        assert_eq!(res.status(), 500);
        let text = body_text(res).await;
        assert!(
            text.contains("no tea") && text.contains("\"type\":\"error\""),
            "{text}"
        );
        let res = svc.oneshot(req("/fine")).await.unwrap();
        assert_eq!(body_text(res).await, "bare");
    }
}
