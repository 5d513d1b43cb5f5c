//! The request of `POST /v1/responses`, as OpenAI clients send it (stateless: no
//! `previous_response_id`, nothing stored).

use mtplx_model::chat::{ChatMessage, FunctionCall, MessageContent, Role, ToolCall, ToolCallKind};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::api::chat::wire::{content_parts, WirePart};
use crate::api::params::SamplingParams;
use crate::api::prompt::Conversation;
use crate::error::ApiError;

#[derive(Debug, Clone, Deserialize)]
pub struct ResponsesRequest {
    pub model: Option<String>,
    pub input: Input,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<i64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub tools: Option<Vec<Tool>>,
    pub tool_choice: Option<Value>,
    pub stream: Option<bool>,
    pub previous_response_id: Option<String>,
    /// `metadata` (echoed back), `user`, `generation_mode`.
    #[serde(flatten)]
    pub extras: crate::api::extras::RequestExtras,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Input {
    Text(String),
    Items(Vec<Item>),
}

/// An input item: a message (with or without `type`), a function call or its output.
#[derive(Debug, Clone, Deserialize)]
pub struct Item {
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub role: Option<String>,
    pub content: Option<ItemContent>,
    pub call_id: Option<String>,
    pub name: Option<String>,
    pub arguments: Option<String>,
    pub output: Option<Value>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum ItemContent {
    Text(String),
    Parts(Vec<WirePart>),
}

#[derive(Debug, Clone, Deserialize)]
pub struct Tool {
    #[serde(rename = "type")]
    pub kind: String,
    pub name: Option<String>,
    pub description: Option<String>,
    pub parameters: Option<Value>,
}

impl ResponsesRequest {
    pub fn sampling(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            ..SamplingParams::default()
        }
    }

    /// Function tools in the chat template's shape; other tool kinds are refused.
    pub fn openai_tools(&self) -> Result<Option<Vec<Value>>, ApiError> {
        if self.tool_choice.as_ref().and_then(Value::as_str) == Some("none") {
            return Ok(None);
        }
        let mut tools = Vec::new();
        for t in self.tools.iter().flatten() {
            if t.kind != "function" {
                return Err(ApiError::invalid_param(
                    "tools",
                    format!(
                        "Tools of type `{}` are not supported; only client-executed functions are.",
                        t.kind
                    ),
                ));
            }
            let name = t.name.clone().ok_or_else(|| {
                ApiError::invalid_param("tools", "A function tool needs a `name`.")
            })?;
            tools.push(json!({
                "type": "function",
                "function": {
                    "name": name,
                    "description": t.description.clone().unwrap_or_default(),
                    "parameters": t.parameters.clone().unwrap_or_else(|| json!({"type": "object"})),
                },
            }));
        }
        Ok((!tools.is_empty()).then_some(tools))
    }

    pub fn conversation(&self) -> Result<Conversation, ApiError> {
        if self.previous_response_id.is_some() {
            return Err(ApiError::invalid_param(
                "previous_response_id",
                "This server is stateless: send the whole conversation in `input`.",
            ));
        }
        let mut messages = Vec::new();
        if let Some(i) = self.instructions.as_ref().filter(|i| !i.is_empty()) {
            messages.push(ChatMessage::text(Role::System, i.clone()));
        }
        match &self.input {
            Input::Text(t) => messages.push(ChatMessage::text(Role::User, t.clone())),
            Input::Items(items) => {
                for item in items {
                    push_item(item, &mut messages)?;
                }
            }
        }
        if messages.iter().all(|m| m.role == Role::System) {
            return Err(ApiError::invalid_param(
                "input",
                "`input` must not be empty.",
            ));
        }
        Ok(Conversation {
            messages,
            tools: self.openai_tools()?,
            template_kwargs: Default::default(),
            assistant_prefix: String::new(),
        })
    }
}

fn push_item(item: &Item, out: &mut Vec<ChatMessage>) -> Result<(), ApiError> {
    match item.kind.as_deref() {
        None | Some("message") => {
            let role = match item.role.as_deref() {
                Some("developer" | "system") => Role::System,
                Some("user") => Role::User,
                Some("assistant") => Role::Assistant,
                other => {
                    return Err(ApiError::invalid_param(
                        "input",
                        format!("Unknown message role {other:?}."),
                    ))
                }
            };
            let content = match &item.content {
                None => String::new(),
                Some(ItemContent::Text(t)) => t.clone(),
                Some(ItemContent::Parts(p)) => {
                    MessageContent::Parts(content_parts(p, "input")?).joined_text()
                }
            };
            out.push(ChatMessage::text(role, content));
        }
        Some("function_call") => {
            let call = ToolCall {
                id: item.call_id.clone(),
                kind: ToolCallKind::Function,
                function: FunctionCall {
                    name: item.name.clone().unwrap_or_default(),
                    arguments: Value::String(item.arguments.clone().unwrap_or_else(|| "{}".into())),
                },
            };
            // Consecutive calls belong to one assistant turn.
            match out.last_mut() {
                Some(m) if m.role == Role::Assistant && m.tool_calls.is_some() => {
                    m.tool_calls.get_or_insert_with(Vec::new).push(call);
                }
                _ => out.push(ChatMessage {
                    content: None,
                    tool_calls: Some(vec![call]),
                    ..ChatMessage::text(Role::Assistant, "")
                }),
            }
        }
        Some("function_call_output") => {
            let output = match &item.output {
                Some(Value::String(s)) => s.clone(),
                Some(v) => v.to_string(),
                None => String::new(),
            };
            out.push(ChatMessage {
                tool_call_id: item.call_id.clone(),
                ..ChatMessage::text(Role::Tool, output)
            });
        }
        Some("reasoning") => {}
        Some(kind) => {
            return Err(ApiError::invalid_param(
                "input",
                format!("Input items of type `{kind}` are not supported."),
            ))
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_become_a_conversation() {
        let r: ResponsesRequest = serde_json::from_value(json!({
            "instructions": "Be brief.",
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
                {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{}"},
                {"type": "function_call", "call_id": "c2", "name": "time", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "sunny"}
            ],
            "tools": [{"type": "function", "name": "weather", "parameters": {"type": "object"}}]
        }))
        .unwrap();
        let c = r.conversation().unwrap();
        let roles: Vec<&str> = c.messages.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool"]);
        assert_eq!(c.messages[2].tool_calls.as_ref().unwrap().len(), 2);
        assert_eq!(c.tools.unwrap()[0]["function"]["name"], "weather");
    }

    #[test]
    fn stored_state_and_hosted_tools_are_refused() {
        let r: ResponsesRequest =
            serde_json::from_value(json!({"input": "hi", "previous_response_id": "resp_1"}))
                .unwrap();
        assert_eq!(
            r.conversation().unwrap_err().param.as_deref(),
            Some("previous_response_id")
        );
        let r: ResponsesRequest =
            serde_json::from_value(json!({"input": "hi", "tools": [{"type": "web_search"}]}))
                .unwrap();
        assert!(r.conversation().unwrap_err().message.contains("web_search"));
    }
}
