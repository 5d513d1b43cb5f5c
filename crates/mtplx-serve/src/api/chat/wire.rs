//! The request of `POST /v1/chat/completions`, as OpenAI clients send it.

use mtplx_model::chat::{
    ChatMessage, ContentPart, FunctionCall, MessageContent, Role, ToolCall, ToolCallKind,
};
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::api::params::{SamplingParams, StopParam};
use crate::error::ApiError;

/// Unknown fields are ignored, as OpenAI-compatible servers do.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatCompletionRequest {
    pub model: Option<String>,
    pub messages: Vec<WireMessage>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub max_tokens: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub seed: Option<i64>,
    pub stop: Option<StopParam>,
    pub n: Option<i64>,
    pub logprobs: Option<bool>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    /// Extra template variables (`enable_thinking`, ...), as vLLM takes them.
    pub chat_template_kwargs: Option<Map<String, Value>>,
    /// Generate past end-of-turn tokens (a vLLM extension, for benchmarks).
    pub ignore_eos: Option<bool>,
    #[serde(flatten)]
    pub extras: crate::api::extras::RequestExtras,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    pub include_usage: Option<bool>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct WireMessage {
    pub role: String,
    pub content: Option<WireContent>,
    pub tool_calls: Option<Vec<WireToolCall>>,
    pub tool_call_id: Option<String>,
    pub name: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum WireContent {
    Text(String),
    Parts(Vec<WirePart>),
}

#[derive(Debug, Clone, Deserialize)]
pub struct WirePart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct WireToolCall {
    pub id: Option<String>,
    pub function: WireFunction,
}

#[derive(Debug, Clone, Deserialize)]
pub struct WireFunction {
    pub name: String,
    #[serde(default)]
    pub arguments: Value,
}

impl ChatCompletionRequest {
    pub fn sampling(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            min_p: self.min_p,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            repetition_penalty: self.repetition_penalty,
            seed: self.seed,
        }
    }

    /// The tools the template should see: none when `tool_choice` is `"none"`.
    pub fn active_tools(&self) -> Option<Vec<Value>> {
        if self.tool_choice.as_ref().and_then(Value::as_str) == Some("none") {
            return None;
        }
        self.tools.clone().filter(|t| !t.is_empty())
    }
}

/// Text parts of a content list; anything else (images, audio) is refused.
pub fn content_parts(parts: &[WirePart], param: &str) -> Result<Vec<ContentPart>, ApiError> {
    parts
        .iter()
        .map(|p| match (p.kind.as_str(), &p.text) {
            ("text" | "input_text" | "output_text", Some(text)) => {
                Ok(ContentPart::Text { text: text.clone() })
            }
            (kind, _) => Err(ApiError::invalid_param(
                param,
                format!("Content parts of type `{kind}` are not supported; only text is."),
            )),
        })
        .collect()
}

impl WireMessage {
    /// The message in the model crate's terms.
    pub fn into_chat(self) -> Result<ChatMessage, ApiError> {
        let content = match self.content {
            None => None,
            Some(WireContent::Text(t)) => Some(MessageContent::Text(t)),
            Some(WireContent::Parts(p)) => {
                Some(MessageContent::Parts(content_parts(&p, "messages")?))
            }
        };
        let tool_calls = self.tool_calls.map(|calls| {
            calls
                .into_iter()
                .map(|c| ToolCall {
                    id: c.id,
                    kind: ToolCallKind::Function,
                    function: FunctionCall {
                        name: c.function.name,
                        arguments: c.function.arguments,
                    },
                })
                .collect()
        });
        Ok(ChatMessage {
            role: Role::from(self.role.as_str()),
            content,
            tool_calls,
            tool_call_id: self.tool_call_id,
            name: self.name,
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn messages_convert_with_parts_and_tool_calls() {
        let m: WireMessage = serde_json::from_value(json!({
            "role": "assistant",
            "content": [{"type": "text", "text": "a"}],
            "tool_calls": [{"id": "c", "type": "function",
                            "function": {"name": "f", "arguments": "{}"}}]
        }))
        .unwrap();
        let m = m.into_chat().unwrap();
        assert_eq!(m.role, Role::Assistant);
        assert_eq!(m.content.unwrap().joined_text(), "a");
        assert_eq!(m.tool_calls.unwrap()[0].function.name, "f");
    }

    #[test]
    fn image_parts_are_refused() {
        let m: WireMessage = serde_json::from_value(json!({
            "role": "user",
            "content": [{"type": "image_url", "image_url": {"url": "x"}}]
        }))
        .unwrap();
        let e = m.into_chat().unwrap_err();
        assert!(e.message.contains("image_url"));
    }

    #[test]
    fn tool_choice_none_hides_the_tools() {
        let r: ChatCompletionRequest = serde_json::from_value(json!({
            "messages": [], "tools": [{"type": "function"}], "tool_choice": "none"
        }))
        .unwrap();
        assert!(r.active_tools().is_none());
    }
}
