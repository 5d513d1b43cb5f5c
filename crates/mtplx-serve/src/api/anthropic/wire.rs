//! The request of `POST /v1/messages` (and `count_tokens`), as Anthropic clients send it.

use mtplx_model::chat::{ChatMessage, FunctionCall, MessageContent, Role, ToolCall, ToolCallKind};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::api::params::SamplingParams;
use crate::api::prompt::Conversation;
use crate::error::ApiError;

#[derive(Debug, Clone, Deserialize)]
pub struct MessagesRequest {
    pub model: Option<String>,
    pub messages: Vec<Message>,
    pub system: Option<TextOrBlocks>,
    pub max_tokens: Option<i64>,
    pub stop_sequences: Option<Vec<String>>,
    pub stream: Option<bool>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub tools: Option<Vec<Tool>>,
    pub tool_choice: Option<ToolChoice>,
    #[serde(flatten)]
    pub extras: crate::api::extras::RequestExtras,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Message {
    pub role: String,
    pub content: TextOrBlocks,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum TextOrBlocks {
    Text(String),
    Blocks(Vec<Block>),
}

/// A content block. Unknown kinds are refused with a 400 when converted.
#[derive(Debug, Clone, Deserialize)]
pub struct Block {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
    pub id: Option<String>,
    pub name: Option<String>,
    pub input: Option<Value>,
    pub tool_use_id: Option<String>,
    pub content: Option<Box<TextOrBlocks>>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Tool {
    pub name: String,
    pub description: Option<String>,
    pub input_schema: Option<Value>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ToolChoice {
    #[serde(rename = "type")]
    pub kind: String,
}

impl TextOrBlocks {
    /// The text of text blocks, joined; other blocks are refused.
    pub fn text(&self, param: &str) -> Result<String, ApiError> {
        match self {
            TextOrBlocks::Text(t) => Ok(t.clone()),
            TextOrBlocks::Blocks(blocks) => blocks
                .iter()
                .map(|b| match (b.kind.as_str(), &b.text) {
                    ("text", Some(t)) => Ok(t.as_str()),
                    (kind, _) => Err(unsupported(kind, param)),
                })
                .collect::<Result<Vec<_>, _>>()
                .map(|parts| parts.join("\n")),
        }
    }
}

fn unsupported(kind: &str, param: &str) -> ApiError {
    ApiError::invalid_param(
        param,
        format!("Content blocks of type `{kind}` are not supported here."),
    )
}

impl MessagesRequest {
    pub fn sampling(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            ..SamplingParams::default()
        }
    }

    /// Tools in OpenAI's shape, for the template; none when `tool_choice` is `none`.
    pub fn openai_tools(&self) -> Option<Vec<Value>> {
        if self.tool_choice.as_ref().is_some_and(|c| c.kind == "none") {
            return None;
        }
        let tools: Vec<Value> = self
            .tools
            .iter()
            .flatten()
            .map(|t| {
                json!({
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description.clone().unwrap_or_default(),
                        "parameters": t.input_schema.clone().unwrap_or_else(|| json!({"type": "object"})),
                    },
                })
            })
            .collect();
        (!tools.is_empty()).then_some(tools)
    }

    /// The conversation in the model crate's terms.
    pub fn conversation(&self) -> Result<Conversation, ApiError> {
        if self.messages.is_empty() {
            return Err(ApiError::invalid_param(
                "messages",
                "`messages` must not be empty.",
            ));
        }
        let mut messages = Vec::new();
        if let Some(system) = &self.system {
            messages.push(ChatMessage::text(Role::System, system.text("system")?));
        }
        for m in &self.messages {
            let role = match m.role.as_str() {
                "user" => Role::User,
                "assistant" => Role::Assistant,
                other => {
                    return Err(ApiError::invalid_param(
                        "messages",
                        format!("Unknown role `{other}`: use `user` or `assistant` (and `system` at the top level)."),
                    ))
                }
            };
            match &m.content {
                TextOrBlocks::Text(t) => messages.push(ChatMessage::text(role, t.clone())),
                TextOrBlocks::Blocks(blocks) => convert_blocks(role, blocks, &mut messages)?,
            }
        }
        Ok(Conversation {
            messages,
            tools: self.openai_tools(),
            template_kwargs: Default::default(),
            assistant_prefix: String::new(),
        })
    }
}

/// One Anthropic message becomes one chat message, plus a tool message per `tool_result`.
fn convert_blocks(
    role: Role,
    blocks: &[Block],
    out: &mut Vec<ChatMessage>,
) -> Result<(), ApiError> {
    let mut text = Vec::new();
    let mut calls = Vec::new();
    for b in blocks {
        match b.kind.as_str() {
            "text" => text.push(b.text.clone().unwrap_or_default()),
            "thinking" | "redacted_thinking" => {}
            "tool_use" if role == Role::Assistant => calls.push(ToolCall {
                id: b.id.clone(),
                kind: ToolCallKind::Function,
                function: FunctionCall {
                    name: b.name.clone().unwrap_or_default(),
                    arguments: b.input.clone().unwrap_or_else(|| json!({})),
                },
            }),
            "tool_result" if role == Role::User => {
                let content = match b.content.as_deref() {
                    None => String::new(),
                    Some(c) => c.text("messages")?,
                };
                out.push(ChatMessage {
                    tool_call_id: b.tool_use_id.clone(),
                    ..ChatMessage::text(Role::Tool, content)
                });
            }
            kind => return Err(unsupported(kind, "messages")),
        }
    }
    if !text.is_empty() || !calls.is_empty() {
        out.push(ChatMessage {
            content: (!text.is_empty()).then(|| MessageContent::Text(text.join("\n"))),
            tool_calls: (!calls.is_empty()).then_some(calls),
            ..ChatMessage::text(role, "")
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: Value) -> MessagesRequest {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn system_tool_use_and_tool_results_convert() {
        let r = parse(json!({
            "max_tokens": 5,
            "system": [{"type": "text", "text": "Be brief."}],
            "messages": [
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "t1", "name": "weather", "input": {"city": "Paris"}}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": "sunny"},
                    {"type": "text", "text": "Thanks"}
                ]}
            ],
            "tools": [{"name": "weather", "input_schema": {"type": "object"}}]
        }));
        let c = r.conversation().unwrap();
        let roles: Vec<&str> = c.messages.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool", "user"]);
        assert_eq!(
            c.messages[2].tool_calls.as_ref().unwrap()[0].function.name,
            "weather"
        );
        assert_eq!(c.messages[3].tool_call_id.as_deref(), Some("t1"));
        assert_eq!(c.tools.unwrap()[0]["function"]["name"], "weather");
    }

    #[test]
    fn images_and_unknown_roles_are_refused() {
        let r = parse(json!({"messages": [{"role": "user", "content": [{"type": "image"}]}]}));
        assert!(r.conversation().unwrap_err().message.contains("image"));
        let r = parse(json!({"messages": [{"role": "system", "content": "x"}]}));
        assert_eq!(r.conversation().unwrap_err().status, 400);
    }
}
