//! The JSON pieces a Responses object is made of, whole or streamed: what it echoes from
//! the request, its status, usage, message and function-call items.

use serde_json::{json, Value};

use crate::api::random_hex;
use crate::api::tools::ParsedCall;
use crate::job::{Finish, Summary};

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
