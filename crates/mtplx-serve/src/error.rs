//! [`ApiError`]: every way a request can fail, rendered as the OpenAI error JSON
//! (`{"error": {"message", "type", "param", "code"}}`) with the matching status.

use http::{header, HeaderValue, Response, StatusCode};
use serde_json::json;

use crate::body::Body;

/// A request that failed. Handlers return it with `?`; [`ApiError::into_response`] renders
/// it. Bad input is always a 4xx: a 500 means a bug or a failing model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    /// OpenAI's `type`: `invalid_request_error`, `authentication_error`, ...
    pub kind: &'static str,
    pub message: String,
    /// The request field at fault, when known.
    pub param: Option<String>,
    /// A machine-readable code (`context_length_exceeded`, `model_not_found`, ...).
    pub code: Option<&'static str>,
    /// Seconds after which a retry may succeed (`Retry-After`).
    pub retry_after: Option<u64>,
    /// For a 507: `refusal_reason` and `retry_when`.
    /// Boxed: it is rare, and keeps `Result<_, ApiError>` small.
    pub refusal: Option<Box<(&'static str, &'static str)>>,
}

/// The JSON shape an error is rendered in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ErrorFormat {
    /// `{"error": {"message", "type", "param", "code"}}`.
    #[default]
    OpenAi,
    /// `{"type": "error", "error": {"type", "message"}}`.
    Anthropic,
}

impl ErrorFormat {
    /// Anthropic's shape under `/v1/messages`, OpenAI's elsewhere.
    pub fn for_path(path: &str) -> Self {
        if path.starts_with("/v1/messages") {
            ErrorFormat::Anthropic
        } else {
            ErrorFormat::OpenAi
        }
    }
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            kind,
            message: message.into(),
            param: None,
            code: None,
            retry_after: None,
            refusal: None,
        }
    }

    /// 400: the request is malformed or asks for something invalid.
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// 400 naming the field at fault.
    pub fn invalid_param(param: &str, message: impl Into<String>) -> Self {
        ApiError {
            param: Some(param.to_owned()),
            code: Some("invalid_value"),
            ..ApiError::bad_request(message)
        }
    }

    /// 400: the prompt (plus at least one new token) does not fit the context window.
    pub fn context_length_exceeded(prompt_tokens: usize, context: usize) -> Self {
        ApiError {
            param: Some("messages".into()),
            code: Some("context_length_exceeded"),
            ..ApiError::bad_request(format!(
                "This model's maximum context length is {context} tokens. However, your \
                 prompt is {prompt_tokens} tokens, leaving no room for a completion."
            ))
        }
    }

    /// 404: the request names a model this server does not serve.
    pub fn model_not_found(model: &str, served: &str) -> Self {
        ApiError {
            param: Some("model".into()),
            code: Some("model_not_found"),
            ..ApiError::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                format!("The model `{model}` does not exist. This server serves `{served}`."),
            )
        }
    }

    /// 404: no such route.
    pub fn route_not_found(method: &http::Method, path: &str) -> Self {
        ApiError {
            code: Some("unknown_url"),
            ..ApiError::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                format!("Unknown request URL: {method} {path}"),
            )
        }
    }

    /// 405: the route exists under another method.
    pub fn method_not_allowed(method: &http::Method, path: &str) -> Self {
        ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            format!("Method {method} is not allowed on {path}"),
        )
    }

    /// 413: the body is larger than the server accepts.
    pub fn payload_too_large(limit: usize) -> Self {
        ApiError {
            code: Some("request_too_large"),
            ..ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                format!("The request body is larger than the limit of {limit} bytes."),
            )
        }
    }

    /// 413: the body was cut off at a limit this code does not know (the body-limit layer
    /// renders it again with its limit).
    pub fn body_cut_off() -> Self {
        ApiError {
            code: Some("request_too_large"),
            ..ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                "The request body is larger than the limit.",
            )
        }
    }

    /// 401: the API key is missing or wrong.
    pub fn unauthorized() -> Self {
        ApiError {
            code: Some("invalid_api_key"),
            ..ApiError::new(
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                "Missing or incorrect API key. Send it as `Authorization: Bearer KEY` or \
                 `x-api-key: KEY`.",
            )
        }
    }

    /// 503: the server is stopping and takes no new generation.
    pub fn shutting_down() -> Self {
        ApiError {
            code: Some("server_shutting_down"),
            retry_after: Some(5),
            ..ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "The server is shutting down; retry once it is back.",
            )
        }
    }

    /// 503: the server is at its limit of active requests.
    pub fn overloaded(message: impl Into<String>, retry_after: u64) -> Self {
        ApiError {
            code: Some("server_overloaded"),
            retry_after: Some(retry_after),
            ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message)
        }
    }

    /// 507: the request's projected peak memory does not fit, even after the session bank
    /// shed what it could. Nothing committed was lost.
    pub fn insufficient_memory(r: &mtplx_bank::Refusal) -> Self {
        use mtplx_bank::RetryWhen;
        let hint = match r.retry_when {
            RetryWhen::AfterActiveRequests => "retry when the requests running now have finished",
            RetryWhen::ReduceRequest => "shorten the prompt or lower max_tokens",
            RetryWhen::AfterSpills => {
                "retry when the conversations being written to the SSD have been written"
            }
        };
        let retry_after = match r.retry_when {
            RetryWhen::AfterActiveRequests | RetryWhen::AfterSpills => Some(5),
            RetryWhen::ReduceRequest => None,
        };
        ApiError {
            code: Some(r.refusal_reason.as_str()),
            retry_after,
            refusal: Some(Box::new((r.refusal_reason.as_str(), r.retry_when.as_str()))),
            ..ApiError::new(
                StatusCode::INSUFFICIENT_STORAGE,
                "server_error",
                format!(
                    "Not enough memory for this request: it needs about {} MiB at its peak \
                     against a limit of {} MiB; {hint}.",
                    r.needed_bytes >> 20,
                    r.limit_bytes >> 20
                ),
            )
        }
    }

    /// 504: the response did not start within the request timeout.
    pub fn timeout(seconds: f64) -> Self {
        ApiError {
            code: Some("request_timeout"),
            ..ApiError::new(
                StatusCode::GATEWAY_TIMEOUT,
                "server_error",
                format!("The request did not complete within {seconds} s."),
            )
        }
    }

    /// 500: the model or the server failed.
    pub fn internal(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// The JSON body in `format`.
    pub fn to_json(&self, format: ErrorFormat) -> serde_json::Value {
        match format {
            ErrorFormat::OpenAi => {
                let mut v = json!({
                    "error": {
                        "message": self.message,
                        "type": self.kind,
                        "param": self.param,
                        "code": self.code,
                    }
                });
                if let Some((reason, when)) = self.refusal.as_deref() {
                    v["error"]["refusal_reason"] = json!(reason);
                    v["error"]["retry_when"] = json!(when);
                }
                v
            }
            ErrorFormat::Anthropic => {
                let mut v = json!({
                    "type": "error",
                    "error": { "type": self.anthropic_kind(), "message": self.message },
                });
                if let Some((reason, when)) = self.refusal.as_deref() {
                    v["error"]["refusal_reason"] = json!(reason);
                    v["error"]["retry_when"] = json!(when);
                }
                v
            }
        }
    }

    /// Anthropic's error type for this status.
    fn anthropic_kind(&self) -> &'static str {
        match self.status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::PAYLOAD_TOO_LARGE => "request_too_large",
            StatusCode::SERVICE_UNAVAILABLE => "overloaded_error",
            s if s.is_client_error() => "invalid_request_error",
            _ => "api_error",
        }
    }

    /// The OpenAI rendering.
    pub fn into_response(self) -> Response<Body> {
        self.into_response_as(ErrorFormat::OpenAi)
    }

    /// The rendering in `format`, with `Retry-After` when set.
    pub fn into_response_as(self, format: ErrorFormat) -> Response<Body> {
        let mut res = Response::new(Body::from(self.to_json(format).to_string()));
        *res.status_mut() = self.status;
        let headers = res.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Some(secs) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        res
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}: {}",
            self.status.as_u16(),
            self.kind,
            self.message
        )
    }
}

impl std::error::Error for ApiError {}

impl From<serde_json::Error> for ApiError {
    fn from(e: serde_json::Error) -> Self {
        ApiError::bad_request(format!("Invalid request body: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;

    #[tokio::test]
    async fn renders_the_openai_shape_with_status_and_retry_after() {
        let res = ApiError::overloaded("busy", 2).into_response();
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(res.headers()[header::RETRY_AFTER], "2");
        let body = res.into_body().collect().await.unwrap().to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["error"]["message"], "busy");
        assert_eq!(v["error"]["type"], "server_error");
        assert_eq!(v["error"]["code"], "server_overloaded");
        assert!(v["error"]["param"].is_null());
    }

    #[test]
    fn context_errors_carry_their_code() {
        let e = ApiError::context_length_exceeded(10, 8);
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(e.code, Some("context_length_exceeded"));
        let v = e.to_json(ErrorFormat::Anthropic);
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], "invalid_request_error");
    }
}
