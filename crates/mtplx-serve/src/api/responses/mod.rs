//! `POST /v1/responses` (OpenAI Responses): stateless, text and client-executed function
//! tools, streamed as typed events or returned whole.

mod stream;
pub mod wire;

use http::{Request, Response};
use serde_json::{json, Value};

use self::stream::ResponsesStream;
use self::wire::ResponsesRequest;
use super::generate::{self, Generation};
use super::params::token_limit;
use super::tools::{parse_all, ParsedCall};
use super::{check_model, json_response, prompt, random_hex, read_json, sse, unix_now, RequestCtx};
use crate::body::Body;
use crate::engine::{Finish, Summary};
use crate::error::ApiError;
use crate::state::AppState;

pub const ENDPOINT: &str = "/v1/responses";

/// What the response object echoes back from the request.
#[derive(Debug, Clone)]
pub struct Meta {
    pub id: String,
    pub created_at: u64,
    pub model: String,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<usize>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub tools: Value,
    pub tool_choice: Value,
    pub metadata: Value,
}

impl Meta {
    /// The response object with `status`, `output` and, when finished, `usage`.
    pub fn response(&self, status: &str, output: &[Value], done: Option<&Summary>) -> Value {
        let incomplete = (status == "incomplete").then(|| json!({ "reason": "max_output_tokens" }));
        json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": null,
            "incomplete_details": incomplete,
            "instructions": self.instructions,
            "max_output_tokens": self.max_output_tokens,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": true,
            "previous_response_id": null,
            "reasoning": { "effort": null, "summary": null },
            "store": false,
            "temperature": self.temperature,
            "text": { "format": { "type": "text" } },
            "tool_choice": self.tool_choice,
            "tools": self.tools,
            "top_p": self.top_p,
            "truncation": "disabled",
            "usage": done.map(usage),
            "user": null,
            "metadata": self.metadata,
        })
    }
}

/// `completed`, or `incomplete` when the token limit cut the answer.
pub fn status_of(finish: &Finish) -> &'static str {
    match finish {
        Finish::Length | Finish::ContextFull => "incomplete",
        _ => "completed",
    }
}

pub fn usage(s: &Summary) -> Value {
    json!({
        "input_tokens": s.prompt_tokens,
        "input_tokens_details": { "cached_tokens": s.cached_tokens },
        "output_tokens": s.completion_tokens,
        "output_tokens_details": { "reasoning_tokens": 0 },
        "total_tokens": s.prompt_tokens + s.completion_tokens,
    })
}

pub fn message_item(id: &str, text: &str, status: &str) -> Value {
    let content = if status == "in_progress" {
        json!([])
    } else {
        json!([{ "type": "output_text", "text": text, "annotations": [] }])
    };
    json!({
        "type": "message",
        "id": id,
        "status": status,
        "role": "assistant",
        "content": content,
    })
}

pub fn function_call_item(call: &ParsedCall, status: &str) -> Value {
    json!({
        "type": "function_call",
        "id": format!("fc_{}", random_hex()),
        "call_id": format!("call_{}", random_hex()),
        "name": call.name,
        "arguments": if status == "in_progress" { "" } else { call.arguments.as_str() },
        "status": status,
    })
}

pub async fn handle(state: AppState, req: Request<Body>) -> Result<Response<Body>, ApiError> {
    let ctx = RequestCtx::of(&req);
    let body: ResponsesRequest = read_json(req.into_body()).await?;
    check_model(&state, body.model.as_deref())?;
    let max_tokens = token_limit("max_output_tokens", body.max_output_tokens)?;
    let sampler = body.sampling().sampler()?;
    let conversation = body.conversation()?;
    let has_tools = conversation.tools.is_some();
    let prompt = prompt::encode_chat(&state, conversation)?;
    let events = generate::submit(
        &state,
        &ctx,
        ENDPOINT,
        Generation {
            prompt,
            sampler,
            max_tokens,
            stop: Vec::new(),
            ignore_eos: false,
            extras: body.extras.clone(),
        },
    )
    .await?;
    let meta = Meta {
        id: format!("resp_{}", ctx.id_suffix()),
        created_at: unix_now(),
        model: state.model_id().to_owned(),
        instructions: body.instructions.clone(),
        max_output_tokens: max_tokens,
        temperature: body.temperature,
        top_p: body.top_p,
        tools: serde_json::to_value(
            body.tools
                .iter()
                .flatten()
                .map(|t| {
                    json!({
                        "type": t.kind, "name": t.name, "description": t.description,
                        "parameters": t.parameters, "strict": false,
                    })
                })
                .collect::<Vec<_>>(),
        )
        .unwrap_or_default(),
        tool_choice: body.tool_choice.clone().unwrap_or(json!("auto")),
        metadata: body.extras.metadata.clone().unwrap_or(json!({})),
    };
    if body.stream.unwrap_or(false) {
        return Ok(sse::response(events, ResponsesStream::new(meta, has_tools)));
    }
    let done = generate::collect(events).await?;
    let (text, calls) = if has_tools {
        parse_all(&done.text)
    } else {
        (Some(done.text), Vec::new())
    };
    let mut output = Vec::new();
    if let Some(text) = text.filter(|t| !t.is_empty()) {
        output.push(message_item(
            &format!("msg_{}", random_hex()),
            &text,
            "completed",
        ));
    }
    output.extend(calls.iter().map(|c| function_call_item(c, "completed")));
    let status = status_of(&done.summary.finish);
    Ok(json_response(&meta.response(
        status,
        &output,
        Some(&done.summary),
    )))
}
