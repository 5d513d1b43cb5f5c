//! The HTTP API: wire types and handlers, one module per endpoint family. Everything model
//! related goes through [`generate`] to the engine, and comes back through [`drive`], which
//! each family only renders.

pub mod admin;
pub mod anthropic;
pub mod chat;
pub mod completions;
pub mod drive;
pub mod extras;
pub mod generate;
pub mod models;
pub mod params;
pub mod prompt;
pub mod responses;
pub mod sse;
pub mod tools;

use std::time::Instant;

use http::{header, HeaderValue, Request, Response, StatusCode};
use http_body_util::BodyExt;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};

use crate::body::Body;
use crate::error::ApiError;
use crate::job::Summary;
use crate::state::AppState;

pub use crate::util::{random_hex, random_u64, unix_now};

/// What a handler knows about its request besides the body.
#[derive(Debug, Clone)]
pub struct RequestCtx {
    /// The `x-request-id` header (set by the request-id layer when the client sent none).
    pub request_id: String,
    pub received: Instant,
    /// The session a header named (see [`crate::layers::session`]).
    pub session: Option<crate::session::SessionHint>,
}

impl RequestCtx {
    pub fn of<B>(req: &Request<B>) -> Self {
        let request_id = req
            .headers()
            .get("x-request-id")
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty())
            .map_or_else(random_hex, str::to_owned);
        RequestCtx {
            request_id,
            received: Instant::now(),
            session: req
                .extensions()
                .get::<crate::session::SessionHint>()
                .cloned(),
        }
    }

    /// The request id as it may appear inside a response id (`[A-Za-z0-9-]`, at most 64).
    pub fn id_suffix(&self) -> String {
        let id: String = self
            .request_id
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
            .take(64)
            .collect();
        if id.is_empty() {
            random_hex()
        } else {
            id
        }
    }
}

/// Reads the body as JSON into `T`: unreadable or oversized bodies, malformed JSON and
/// wrong types are all 4xx. A body cut off by the body limit is a 413, which the limit's
/// layer renders again naming its limit ([`crate::layers::body_limit`]).
pub async fn read_json<T: DeserializeOwned>(body: Body) -> Result<T, ApiError> {
    let bytes = match body.collect().await {
        Ok(c) => c.to_bytes(),
        Err(e) => {
            return Err(match e.downcast_ref::<http_body_util::LengthLimitError>() {
                Some(_) => ApiError::body_cut_off(),
                None => ApiError::bad_request(format!("Could not read the request body: {e}")),
            })
        }
    };
    let value: Value = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(format!("The body is not valid JSON: {e}")))?;
    if !value.is_object() {
        return Err(ApiError::bad_request("The body must be a JSON object."));
    }
    serde_json::from_value(value)
        .map_err(|e| ApiError::bad_request(format!("Invalid request body: {e}")))
}

/// A 200 JSON response.
pub fn json_response(value: &impl Serialize) -> Response<Body> {
    match serde_json::to_vec(value) {
        Ok(bytes) => {
            let mut res = Response::new(Body::from(bytes));
            res.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            res
        }
        Err(e) => ApiError::internal(format!("could not encode the response: {e}")).into_response(),
    }
}

/// A 200 response with `content_type`.
pub fn text_response(text: String, content_type: &'static str) -> Response<Body> {
    let mut res = Response::new(Body::from(text));
    *res.status_mut() = StatusCode::OK;
    res.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    res
}

/// Checks the request's `model` against the served one (absent means the served one).
pub fn check_model(state: &AppState, requested: Option<&str>) -> Result<(), ApiError> {
    match requested {
        None | Some("") => Ok(()),
        Some(m) if m == state.model_id() || m.eq_ignore_ascii_case(state.model_id()) => Ok(()),
        Some(m) => Err(ApiError::model_not_found(m, state.model_id())),
    }
}

/// OpenAI's `usage` object.
pub fn openai_usage(s: &Summary) -> Value {
    json!({
        "prompt_tokens": s.prompt_tokens,
        "completion_tokens": s.completion_tokens,
        "total_tokens": s.prompt_tokens + s.completion_tokens,
        "prompt_tokens_details": { "cached_tokens": s.cached_tokens },
        "completion_tokens_details": { "reasoning_tokens": 0 },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn read_json_tells_malformed_from_mistyped() {
        #[derive(serde::Deserialize, Debug)]
        struct T {
            #[allow(dead_code)]
            n: u32,
        }
        let e = read_json::<T>(Body::from("{")).await.unwrap_err();
        assert!(e.message.contains("not valid JSON"), "{e}");
        let e = read_json::<T>(Body::from("[1]")).await.unwrap_err();
        assert!(e.message.contains("JSON object"), "{e}");
        let e = read_json::<T>(Body::from(r#"{"n": "x"}"#))
            .await
            .unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert!(e.message.contains("invalid type"), "{e}");
        assert!(read_json::<T>(Body::from(r#"{"n": 3}"#)).await.is_ok());
    }

    #[test]
    fn response_ids_keep_only_safe_characters() {
        let ctx = RequestCtx::of(
            &Request::builder()
                .header("x-request-id", "ab/c d-1")
                .body(())
                .unwrap(),
        );
        assert_eq!(ctx.id_suffix(), "abcd-1");
        assert_ne!(random_hex(), random_hex());
    }
}
