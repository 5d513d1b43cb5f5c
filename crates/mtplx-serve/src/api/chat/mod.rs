//! `POST /v1/chat/completions`.

mod render;
mod stream;
pub mod wire;

use http::{Request, Response};
use serde_json::json;

use self::stream::ChatStream;
use self::wire::ChatCompletionRequest;
use super::generate::{self, Generation};
use super::params::{stop_strings, token_limit};
use super::prompt::{self, Conversation};
use super::tools::ToolChoice;
use super::{check_model, json_response, openai_usage, read_json, sse, unix_now, RequestCtx};
use crate::body::Body;
use crate::error::ApiError;
use crate::state::AppState;

pub use render::{assistant_message, forced_message, tool_call_json};

pub const ENDPOINT: &str = "/v1/chat/completions";

pub async fn handle(state: AppState, req: Request<Body>) -> Result<Response<Body>, ApiError> {
    let ctx = RequestCtx::of(&req);
    let body: ChatCompletionRequest = read_json(req.into_body()).await?;
    check_model(&state, body.model.as_deref())?;
    if body.messages.is_empty() {
        return Err(ApiError::invalid_param(
            "messages",
            "`messages` must not be empty.",
        ));
    }
    if body.n.is_some_and(|n| n != 1) {
        return Err(ApiError::invalid_param("n", "Only `n: 1` is supported."));
    }
    if body.logprobs == Some(true) {
        return Err(ApiError::invalid_param(
            "logprobs",
            "`logprobs` is not supported.",
        ));
    }
    let sampler = body.sampling().sampler()?;
    let max_tokens = match token_limit("max_completion_tokens", body.max_completion_tokens)? {
        Some(n) => Some(n),
        None => token_limit("max_tokens", body.max_tokens)?,
    };
    let choice = ToolChoice::parse(body.tool_choice.as_ref(), body.tools.as_deref())?;
    let tools = body.active_tools();
    let forced = choice.forced_prefix();
    let streaming = body.stream.unwrap_or(false);
    let include_usage = body
        .stream_options
        .as_ref()
        .and_then(|o| o.include_usage)
        .unwrap_or(false);
    let ignore_eos = body.ignore_eos.unwrap_or(false);
    let mut stop = stop_strings(body.stop.clone());
    if choice.forces_a_call() {
        // The call is read by structure; nothing after it is wanted.
        stop.push(super::tools::CLOSE.to_owned());
    }
    let extras = body.extras.clone();
    let template_kwargs = body.chat_template_kwargs.clone().unwrap_or_default();
    let messages = body
        .messages
        .into_iter()
        .map(wire::WireMessage::into_chat)
        .collect::<Result<Vec<_>, _>>()?;
    let has_tools = tools.is_some();
    let prompt = prompt::encode_chat(
        &state,
        Conversation {
            messages,
            tools,
            template_kwargs,
            assistant_prefix: forced.clone(),
        },
    )?;
    let events = generate::submit(
        &state,
        &ctx,
        ENDPOINT,
        Generation {
            prompt,
            sampler,
            max_tokens,
            stop,
            ignore_eos,
            extras,
        },
    )
    .await?;
    let id = format!("chatcmpl-{}", ctx.id_suffix());
    let model = state.model_id().to_owned();
    if streaming {
        let encoder = ChatStream::new(id, model, has_tools, include_usage, choice);
        return Ok(sse::response(events, encoder));
    }
    let done = generate::collect(events).await?;
    let (message, finish) = match forced_message(&choice, &done.text) {
        Some(m) => (m, "tool_calls"),
        None => assistant_message(forced + &done.text, has_tools, &done.summary.finish),
    };
    Ok(json_response(&json!({
        "id": id,
        "object": "chat.completion",
        "created": unix_now(),
        "model": model,
        "choices": [{
            "index": 0,
            "message": message,
            "logprobs": null,
            "finish_reason": finish,
        }],
        "usage": openai_usage(&done.summary),
        "system_fingerprint": null,
    })))
}
