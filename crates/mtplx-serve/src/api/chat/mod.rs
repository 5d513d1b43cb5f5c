//! `POST /v1/chat/completions`.

mod stream;
pub mod wire;

use http::{Request, Response};
use serde_json::{json, Value};

use self::stream::ChatStream;
use self::wire::ChatCompletionRequest;
use super::generate::{self, Generation};
use super::params::{stop_strings, token_limit};
use super::prompt::{self, Conversation};
use super::tools::{parse_all, ParsedCall, ToolChoice};
use super::{check_model, json_response, openai_usage, read_json, sse, unix_now, RequestCtx};
use crate::body::Body;
use crate::engine::Finish;
use crate::error::ApiError;
use crate::state::AppState;

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

/// The assistant message for a generation's whole text, with tool calls parsed out when
/// the request had tools, and its `finish_reason`.
pub fn assistant_message(text: String, has_tools: bool, finish: &Finish) -> (Value, &'static str) {
    let (content, calls) = if has_tools {
        parse_all(&text)
    } else {
        (Some(text), Vec::new())
    };
    let mut message = json!({ "role": "assistant", "content": content });
    if calls.is_empty() {
        return (message, finish.as_openai());
    }
    message["tool_calls"] = Value::Array(calls.iter().map(tool_call_json).collect());
    (message, "tool_calls")
}

/// The assistant message of a forced call (`tool_choice` required or named), `None` when
/// the model did not complete the call's arguments (the text is then parsed as usual).
pub fn forced_message(choice: &ToolChoice, generated: &str) -> Option<Value> {
    let call = choice.forced_call(generated)?;
    Some(json!({
        "role": "assistant",
        "content": null,
        "tool_calls": [tool_call_json(&call)],
    }))
}

/// An OpenAI `tool_calls` entry with a fresh id.
pub fn tool_call_json(call: &ParsedCall) -> Value {
    json!({
        "id": format!("call_{}", super::random_hex()),
        "type": "function",
        "function": { "name": call.name, "arguments": call.arguments },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_calls_are_parsed_only_when_the_request_had_tools() {
        let text = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>";
        let (m, finish) = assistant_message(text.into(), true, &Finish::StopToken);
        assert_eq!(finish, "tool_calls");
        assert!(m["content"].is_null());
        let call = &m["tool_calls"][0];
        assert_eq!(call["type"], "function");
        assert_eq!(call["function"]["name"], "f");
        assert_eq!(call["function"]["arguments"], "{\"a\":1}");
        assert!(call["id"].as_str().unwrap().starts_with("call_"));
        let (m, finish) = assistant_message(text.into(), false, &Finish::Length);
        assert_eq!((m["content"].as_str(), finish), (Some(text), "length"));
        assert!(m.get("tool_calls").is_none());
    }
}
