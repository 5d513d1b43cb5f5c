//! `POST /v1/messages` and `/v1/messages/count_tokens` (Anthropic).

use http::{Request, Response};

use crate::body::Body;
use crate::error::ApiError;
use crate::state::AppState;

pub const ENDPOINT: &str = "/v1/messages";
pub const COUNT_ENDPOINT: &str = "/v1/messages/count_tokens";

pub async fn handle(_state: AppState, _req: Request<Body>) -> Result<Response<Body>, ApiError> {
    Err(ApiError::bad_request("todo"))
}

pub async fn count_tokens(_state: AppState, _req: Request<Body>) -> Result<Response<Body>, ApiError> {
    Err(ApiError::bad_request("todo"))
}
