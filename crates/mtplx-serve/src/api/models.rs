//! `GET /v1/models`, `GET /v1/models/{id}`, `GET /health`, `GET /metrics`.

use http::Response;
use serde_json::{json, Value};

use super::{json_response, text_response};
use crate::body::Body;
use crate::error::ApiError;
use crate::state::AppState;

fn model_json(state: &AppState) -> Value {
    json!({
        "id": state.model_id(),
        "object": "model",
        "created": state.started(),
        "owned_by": "mtplx",
        "context_window": state.context_window(),
    })
}

pub fn list(state: &AppState) -> Response<Body> {
    json_response(&json!({ "object": "list", "data": [model_json(state)] }))
}

pub fn get(state: &AppState, id: &str) -> Result<Response<Body>, ApiError> {
    super::check_model(state, Some(id))?;
    Ok(json_response(&model_json(state)))
}

pub fn health(state: &AppState) -> Response<Body> {
    json_response(&json!({
        "status": "ok",
        "model": state.model_id(),
        "context_window": state.context_window(),
    }))
}

pub fn metrics(state: &AppState) -> Response<Body> {
    let mut text = state.metrics().render();
    text.push_str(&format!(
        "# HELP mtplx_active_requests Generation requests in flight.\n\
         # TYPE mtplx_active_requests gauge\nmtplx_active_requests {}\n",
        state.active_requests()
    ));
    text_response(text, "text/plain; version=0.0.4; charset=utf-8")
}
