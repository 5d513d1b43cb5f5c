//! `POST /v1/messages` and `/v1/messages/count_tokens` (Anthropic). Errors on these
//! routes are rendered in Anthropic's shape.

mod render;
mod stream;
pub mod wire;

use http::{Request, Response};
use serde_json::{json, Value};

use self::stream::MessagesStream;
use self::wire::MessagesRequest;
use super::generate::{self, Generation};
use super::params::token_limit;
use super::tools::parse_all;
use super::{check_model, json_response, prompt, read_json, sse, RequestCtx};
use crate::body::Body;
use crate::error::ApiError;
use crate::state::AppState;

pub use render::{stop_reason, tool_use_block, usage};

pub const ENDPOINT: &str = "/v1/messages";
pub const COUNT_ENDPOINT: &str = "/v1/messages/count_tokens";

pub async fn handle(state: AppState, req: Request<Body>) -> Result<Response<Body>, ApiError> {
    let ctx = RequestCtx::of(&req);
    let body: MessagesRequest = read_json(req.into_body()).await?;
    check_model(&state, body.model.as_deref())?;
    let max_tokens = token_limit("max_tokens", body.max_tokens)?
        .ok_or_else(|| ApiError::invalid_param("max_tokens", "`max_tokens` is required."))?;
    let sampler = body.sampling().sampler()?;
    let conversation = body.conversation()?;
    let has_tools = conversation.tools.is_some();
    let prompt = prompt::encode_chat(&state, conversation)?;
    let prompt_tokens = prompt.len();
    let events = generate::submit(
        &state,
        &ctx,
        ENDPOINT,
        Generation {
            prompt,
            sampler,
            max_tokens: Some(max_tokens),
            stop: body.stop_sequences.clone().unwrap_or_default(),
            ignore_eos: false,
            extras: body.extras.clone(),
        },
    )
    .await?;
    let id = format!("msg_{}", ctx.id_suffix());
    let model = state.model_id().to_owned();
    if body.stream.unwrap_or(false) {
        let encoder = MessagesStream::new(id, model, prompt_tokens, has_tools);
        return Ok(sse::response(events, encoder));
    }
    let done = generate::collect(events).await?;
    let (text, calls) = if has_tools {
        parse_all(&done.text)
    } else {
        (Some(done.text), Vec::new())
    };
    let mut content: Vec<Value> = Vec::new();
    if text.is_some() || calls.is_empty() {
        content.push(json!({ "type": "text", "text": text.unwrap_or_default() }));
    }
    content.extend(calls.iter().map(tool_use_block));
    let (reason, sequence) = stop_reason(&done.summary.finish, !calls.is_empty());
    Ok(json_response(&json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage(&done.summary),
    })))
}

pub async fn count_tokens(state: AppState, req: Request<Body>) -> Result<Response<Body>, ApiError> {
    let body: MessagesRequest = read_json(req.into_body()).await?;
    check_model(&state, body.model.as_deref())?;
    let prompt = prompt::encode_chat(&state, body.conversation()?)?;
    Ok(json_response(&json!({ "input_tokens": prompt.len() })))
}
