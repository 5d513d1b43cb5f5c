//! What a chat template renders: plain types the server converts its wire types into.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A conversation to render into a prompt.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<ChatMessage>,
    /// Tool definitions as JSON Schema objects, usually
    /// `{"type": "function", "function": {"name", "description", "parameters"}}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<Value>>,
    /// End the prompt with the header of an assistant turn, so the model writes one.
    #[serde(default)]
    pub add_generation_prompt: bool,
    /// Further template variables (`enable_thinking`, `date_string`, ...).
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub template_kwargs: Map<String, Value>,
}

/// Who speaks a message.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Role {
    System,
    User,
    Assistant,
    /// The result of a tool call.
    Tool,
    /// Any other role a template may know (`developer`, `ipython`, ...).
    Other(String),
}

impl Role {
    pub fn as_str(&self) -> &str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
            Role::Other(s) => s,
        }
    }
}

impl From<&str> for Role {
    fn from(s: &str) -> Self {
        match s {
            "system" => Role::System,
            "user" => Role::User,
            "assistant" => Role::Assistant,
            "tool" => Role::Tool,
            other => Role::Other(other.to_owned()),
        }
    }
}

impl Serialize for Role {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Role {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(|s| Role::from(s.as_str()))
    }
}

/// One message of the conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: Role,
    /// `None` for an assistant message that only calls tools.
    #[serde(default)]
    pub content: Option<MessageContent>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
    /// For a [`Role::Tool`] message: the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// For a [`Role::Tool`] message, the tool's name; for others, the speaker's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    /// A message of plain text.
    pub fn text(role: Role, content: impl Into<String>) -> Self {
        ChatMessage {
            role,
            content: Some(MessageContent::Text(content.into())),
            tool_calls: None,
            tool_call_id: None,
            name: None,
        }
    }
}

/// Message content: a string, or a list of parts (OpenAI's content array).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

impl MessageContent {
    /// The text parts joined by newlines (what a template that expects a string gets).
    pub fn joined_text(&self) -> String {
        match self {
            MessageContent::Text(s) => s.clone(),
            MessageContent::Parts(parts) => parts
                .iter()
                .map(|ContentPart::Text { text }| text.as_str())
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }
}

/// One part of a content list.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentPart {
    Text { text: String },
}

/// A call the assistant made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", default)]
    pub kind: ToolCallKind,
    pub function: FunctionCall,
}

/// The kind of a tool call; OpenAI has only functions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolCallKind {
    #[default]
    Function,
}

/// The function a tool call invokes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    pub name: String,
    /// The arguments: a JSON object, or the JSON text of one as OpenAI sends it. Templates
    /// get an object whenever the text parses as one (Hugging Face templates expect a
    /// mapping and write it with `tojson`).
    pub arguments: Value,
}
