//! `POST /v1/responses` (OpenAI Responses, stateless).

use http::{Request, Response};

use crate::body::Body;
use crate::error::ApiError;
use crate::state::AppState;

pub const ENDPOINT: &str = "/v1/responses";

pub async fn handle(_state: AppState, _req: Request<Body>) -> Result<Response<Body>, ApiError> {
    Err(ApiError::bad_request("todo"))
}
