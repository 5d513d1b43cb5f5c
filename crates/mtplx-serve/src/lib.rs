//! The mtplx HTTP server: OpenAI- and Anthropic-compatible endpoints in front of one
//! model-owner engine thread, composed from tower layers.
//!
//! This is the only crate that knows HTTP and JSON wire types. It is thin: the model,
//! tokenizer, chat templates and sampling live in `mtplx-model`, the KV layouts in
//! `mtplx-kv`. A request flows through the layers of [`app`] (request id, tracing,
//! counting, timeout, auth, body limit, session), the [`router`], a handler in [`api`] that turns
//! the wire request into prompt tokens and a sampler, and the [`engine`], which streams
//! text back over a channel.
//!
//! The app is a plain tower service, so it can be tested without a socket:
//!
//! ```no_run
//! use std::sync::Arc;
//! use http::Request;
//! use http_body_util::{BodyExt, Full};
//! use bytes::Bytes;
//! use tower::ServiceExt;
//! use mtplx_serve::{app, AppState, Settings};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let bundle = mtplx_model::Bundle::load("model.gguf".as_ref(), Default::default())?;
//! let state = AppState::new(Arc::new(bundle), Settings::default())?;
//! let req = Request::get("/health").body(Full::new(Bytes::new()))?;
//! let res = app(state).oneshot(req).await?;
//! assert_eq!(res.status(), 200);
//! # Ok(()) }
//! ```

pub mod api;
pub mod body;
pub mod cache;
pub mod config;
pub mod device;
pub mod engine;
pub mod error;
pub mod gpu;
pub mod job;
pub mod layers;
pub mod metrics;
pub mod openapi;
pub mod request_log;
pub mod router;
pub mod server;
pub mod session;
pub mod state;
pub mod util;

use std::convert::Infallible;

use bytes::Bytes;
use http::{Request, Response};
use tower::{Service, ServiceBuilder};

pub use body::{Body, BoxError};
pub use config::Config;
pub use device::{Backend, Device, DeviceError, DeviceModel};
pub use engine::HeadSource;
pub use error::ApiError;
pub use server::{run, serve, ServeError};
pub use state::{AppState, Settings};

use layers::auth::AuthLayer;
use layers::body_limit::BodyLimitLayer;
use layers::count::CountLayer;
use layers::session::SessionLayer;
use layers::timeout::TimeoutLayer;
use router::Router;

/// The whole application as a tower service over any request body.
pub fn app<B>(
    state: AppState,
) -> impl Service<
    Request<B>,
    Response = Response<Body>,
    Error = Infallible,
    Future = impl Send + 'static,
> + Clone
       + Send
       + 'static
where
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let settings = state.settings();
    ServiceBuilder::new()
        .map_response(|res: Response<_>| res.map(Body::new))
        .map_request(|req: Request<B>| req.map(Body::new))
        .layer(layers::request_id::set())
        .layer(layers::trace::layer::<Body>())
        .layer(layers::request_id::propagate())
        .layer(CountLayer::new(state.metrics().clone()))
        .layer(TimeoutLayer::new(settings.request_timeout))
        .layer(AuthLayer::new(settings.api_key.clone()))
        .layer(BodyLimitLayer::new(settings.max_body_bytes))
        .layer(SessionLayer)
        .service(Router::new(state.clone()))
}
