//! Routes: which handler answers which method and path.
//!
//! Generation routes go through the concurrency limit; the cheap ones (health, models,
//! metrics, token counting) never wait behind it.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{Method, Request, Response};
use tower::{Service, ServiceExt};

use crate::api;
use crate::body::Body;
use crate::error::{ApiError, ErrorFormat};
use crate::layers::concurrency::ConcurrencyLimit;
use crate::request_log::Record;
use crate::state::AppState;

/// A known route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    ChatCompletions,
    Completions,
    Messages,
    CountTokens,
    Responses,
    Models,
    Model(String),
    Health,
    Metrics,
    OpenApi,
    AdminSessions,
    AdminCacheClear,
    AdminSessionClear(String),
    AdminSsd,
}

impl Route {
    /// The route for `method` and `path`: 404 for unknown paths, 405 for known paths under
    /// another method.
    pub fn resolve(method: &Method, path: &str) -> Result<Route, ApiError> {
        let path = path
            .strip_suffix('/')
            .filter(|p| !p.is_empty())
            .unwrap_or(path);
        let (route, want) = match path {
            "/v1/chat/completions" | "/chat/completions" => (Route::ChatCompletions, Method::POST),
            "/v1/completions" | "/completions" => (Route::Completions, Method::POST),
            "/v1/messages" => (Route::Messages, Method::POST),
            "/v1/messages/count_tokens" => (Route::CountTokens, Method::POST),
            "/v1/responses" | "/responses" => (Route::Responses, Method::POST),
            "/v1/models" | "/models" => (Route::Models, Method::GET),
            "/health" | "/healthz" => (Route::Health, Method::GET),
            "/metrics" => (Route::Metrics, Method::GET),
            "/openapi.json" => (Route::OpenApi, Method::GET),
            "/admin/sessions" => (Route::AdminSessions, Method::GET),
            "/admin/cache/clear" => (Route::AdminCacheClear, Method::POST),
            "/admin/cache/ssd" => (Route::AdminSsd, Method::GET),
            p => {
                let session = p
                    .strip_prefix("/admin/sessions/")
                    .and_then(|rest| rest.strip_suffix("/clear"))
                    .filter(|id| !id.is_empty() && !id.contains('/'));
                match (p.strip_prefix("/v1/models/"), session) {
                    (Some(id), _) if !id.is_empty() => (Route::Model(id.to_owned()), Method::GET),
                    (_, Some(id)) => (Route::AdminSessionClear(id.to_owned()), Method::POST),
                    _ => return Err(ApiError::route_not_found(method, path)),
                }
            }
        };
        if *method == want || (want == Method::GET && *method == Method::HEAD) {
            Ok(route)
        } else {
            Err(ApiError::method_not_allowed(method, path))
        }
    }

    /// A label for metrics and the request log (bounded: never the raw path).
    pub fn label(&self) -> &'static str {
        match self {
            Route::ChatCompletions => api::chat::ENDPOINT,
            Route::Completions => api::completions::ENDPOINT,
            Route::Messages => api::anthropic::ENDPOINT,
            Route::CountTokens => api::anthropic::COUNT_ENDPOINT,
            Route::Responses => api::responses::ENDPOINT,
            Route::Models | Route::Model(_) => "/v1/models",
            Route::Health => "/health",
            Route::Metrics => "/metrics",
            Route::OpenApi => "/openapi.json",
            Route::AdminSessions => "/admin/sessions",
            Route::AdminCacheClear => "/admin/cache/clear",
            Route::AdminSessionClear(_) => "/admin/sessions/{id}/clear",
            Route::AdminSsd => "/admin/cache/ssd",
        }
    }

    /// Whether the route runs the model (and so counts against the concurrency limit).
    pub fn generates(&self) -> bool {
        matches!(
            self,
            Route::ChatCompletions | Route::Completions | Route::Messages | Route::Responses
        )
    }
}

/// The label of `path` for metrics, `other` when unknown.
pub fn label_of(method: &Method, path: &str) -> &'static str {
    Route::resolve(method, path).map_or("other", |r| r.label())
}

type BoxFuture = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

/// The generation handlers, behind the concurrency limit.
#[derive(Clone)]
pub struct Generate {
    state: AppState,
}

impl Service<Request<Body>> for Generate {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> BoxFuture {
        let state = self.state.clone();
        Box::pin(async move {
            let ctx = api::RequestCtx::of(&req);
            let Some(route) = req.extensions().get::<Route>().cloned() else {
                return Ok(ApiError::internal("no route was resolved").into_response());
            };
            let result = match route {
                Route::ChatCompletions => api::chat::handle(state.clone(), req).await,
                Route::Completions => api::completions::handle(state.clone(), req).await,
                Route::Messages => api::anthropic::handle(state.clone(), req).await,
                Route::Responses => api::responses::handle(state.clone(), req).await,
                _ => Err(ApiError::internal("not a generation route")),
            };
            Ok(result.unwrap_or_else(|e| {
                if let Some(log) = state.request_log() {
                    log.append(&Record::from_error(&ctx.request_id, route.label(), &e));
                }
                e.into_response_as(ErrorFormat::for_path(route.label()))
            }))
        })
    }
}

/// The innermost service: dispatches on the route.
#[derive(Clone)]
pub struct Router {
    state: AppState,
    generate: ConcurrencyLimit<Generate>,
}

impl Router {
    pub fn new(state: AppState) -> Self {
        let limit = state.settings().max_active_requests.max(1);
        Router {
            generate: ConcurrencyLimit::shared(
                Generate {
                    state: state.clone(),
                },
                state.slots().clone(),
                limit,
            ),
            state,
        }
    }
}

impl Service<Request<Body>> for Router {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut req: Request<Body>) -> BoxFuture {
        let state = self.state.clone();
        let route = match Route::resolve(req.method(), req.uri().path()) {
            Ok(r) => r,
            Err(e) => return Box::pin(async move { Ok(e.into_response()) }),
        };
        if route.generates() {
            req.extensions_mut().insert(route);
            let generate = self.generate.clone();
            return Box::pin(generate.oneshot(req));
        }
        Box::pin(async move {
            let result = match &route {
                Route::Models => Ok(api::models::list(&state)),
                Route::Model(id) => api::models::get(&state, id),
                Route::Health => Ok(api::models::health(&state)),
                Route::Metrics => Ok(api::models::metrics(&state)),
                Route::OpenApi => Ok(api::json_response(&crate::openapi::document())),
                Route::CountTokens => api::anthropic::count_tokens(state, req).await,
                Route::AdminSessions => Ok(api::admin::sessions(&state)),
                Route::AdminCacheClear => Ok(api::admin::clear(&state)),
                Route::AdminSessionClear(id) => api::admin::clear_session(&state, id),
                Route::AdminSsd => api::admin::ssd(&state),
                _ => Err(ApiError::internal(
                    "a generation route reached the cheap path",
                )),
            };
            Ok(result.unwrap_or_else(|e| e.into_response_as(ErrorFormat::for_path(route.label()))))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_resolve_by_method_and_path() {
        assert_eq!(
            Route::resolve(&Method::POST, "/v1/chat/completions").unwrap(),
            Route::ChatCompletions
        );
        assert_eq!(
            Route::resolve(&Method::GET, "/v1/models/").unwrap(),
            Route::Models
        );
        assert_eq!(
            Route::resolve(&Method::GET, "/v1/models/x").unwrap(),
            Route::Model("x".into())
        );
        assert_eq!(
            Route::resolve(&Method::GET, "/v1/chat/completions")
                .unwrap_err()
                .status,
            http::StatusCode::METHOD_NOT_ALLOWED
        );
        assert_eq!(
            Route::resolve(&Method::GET, "/nope").unwrap_err().status,
            http::StatusCode::NOT_FOUND
        );
        assert_eq!(label_of(&Method::GET, "/a/b/c"), "other");
        assert_eq!(
            Route::resolve(&Method::POST, "/admin/sessions/abc/clear").unwrap(),
            Route::AdminSessionClear("abc".into())
        );
        assert_eq!(
            Route::resolve(&Method::POST, "/admin/sessions//clear")
                .unwrap_err()
                .status,
            http::StatusCode::NOT_FOUND
        );
        assert_eq!(
            Route::resolve(&Method::GET, "/admin/cache/clear")
                .unwrap_err()
                .status,
            http::StatusCode::METHOD_NOT_ALLOWED
        );
        assert!(Route::Messages.generates() && !Route::CountTokens.generates());
    }
}
