//! Turning a conversation into prompt tokens through the model's chat template.
//!
//! When the request has tools and the template does not mention them (SmolLM2's does not),
//! the tools are described in a Hermes-style system prompt instead, and earlier tool calls
//! and results are written the way that prompt describes, so any model can be asked.

use mtplx_model::chat::{ChatMessage, ChatRequest, Role};
use mtplx_model::tokenizer::Special;
use serde_json::{Map, Value};

use super::tools::{CLOSE, OPEN};
use crate::error::ApiError;
use crate::state::AppState;

/// A conversation in the model crate's terms, plus tools and template variables.
#[derive(Debug, Clone, Default)]
pub struct Conversation {
    pub messages: Vec<ChatMessage>,
    /// OpenAI-style tool definitions (`{"type": "function", "function": {...}}`).
    pub tools: Option<Vec<Value>>,
    pub template_kwargs: Map<String, Value>,
    /// Text the server writes at the start of the assistant's turn (a forced tool call).
    pub assistant_prefix: String,
}

/// The prompt ids of `conv`, ending with the header of an assistant turn.
pub fn encode_chat(state: &AppState, conv: Conversation) -> Result<Vec<u32>, ApiError> {
    let bundle = state.bundle();
    let template = bundle.template.as_ref().ok_or_else(|| {
        ApiError::bad_request(
            "This model has no chat template; use /v1/completions with a raw prompt.",
        )
    })?;
    if conv.messages.is_empty() {
        return Err(ApiError::invalid_param(
            "messages",
            "`messages` must not be empty.",
        ));
    }
    let knows_tools = bundle
        .tokenizer
        .chat_template()
        .is_some_and(|t| t.contains("tools"));
    let tools = conv.tools.filter(|t| !t.is_empty());
    let (messages, tools) = match tools {
        Some(tools) if !knows_tools => (describe_tools(conv.messages, &tools), None),
        tools => (conv.messages, tools),
    };
    let req = ChatRequest {
        messages,
        tools,
        add_generation_prompt: true,
        template_kwargs: conv.template_kwargs,
    };
    let mut text = template.render(&req).map_err(|e| {
        ApiError::bad_request(format!("The chat template rejected the conversation: {e}"))
    })?;
    text.push_str(&conv.assistant_prefix);
    encode(state, &text)
}

/// The ids of `text`, special tokens allowed, BOS first when the model wants one.
pub fn encode_text(state: &AppState, text: &str) -> Result<Vec<u32>, ApiError> {
    let tok = &state.bundle().tokenizer;
    let mut ids = Vec::new();
    if tok.add_bos_token() {
        ids.extend(tok.bos_id());
    }
    ids.extend(encode(state, text)?);
    Ok(ids)
}

fn encode(state: &AppState, text: &str) -> Result<Vec<u32>, ApiError> {
    state
        .bundle()
        .tokenizer
        .encode(text, Special::Parse)
        .map_err(|e| ApiError::bad_request(format!("The prompt could not be tokenized: {e}")))
}

/// The Hermes tool preamble for `tools`.
pub fn tool_preamble(tools: &[Value]) -> String {
    let mut s = String::from(
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
         You are provided with function signatures within <tools></tools> XML tags:\n<tools>",
    );
    for t in tools {
        s.push('\n');
        s.push_str(&t.to_string());
    }
    s.push_str(
        "\n</tools>\n\nFor each function call, return a json object with function name and \
         arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n\
         {\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>",
    );
    s
}

/// Puts the tool preamble in the system message and writes tool calls and results as the
/// preamble describes them.
fn describe_tools(messages: Vec<ChatMessage>, tools: &[Value]) -> Vec<ChatMessage> {
    let preamble = tool_preamble(tools);
    let mut out = Vec::with_capacity(messages.len() + 1);
    let mut messages = messages.into_iter().peekable();
    match messages.peek() {
        Some(m) if m.role == Role::System => {
            let m = messages.next().expect("peeked");
            let text = m
                .content
                .as_ref()
                .map(|c| c.joined_text())
                .unwrap_or_default();
            out.push(ChatMessage::text(
                Role::System,
                format!("{text}\n\n{preamble}"),
            ));
        }
        _ => out.push(ChatMessage::text(Role::System, preamble)),
    }
    for m in messages {
        out.push(match m.role {
            Role::Tool => {
                let text = m
                    .content
                    .as_ref()
                    .map(|c| c.joined_text())
                    .unwrap_or_default();
                ChatMessage::text(
                    Role::User,
                    format!("<tool_response>\n{text}\n</tool_response>"),
                )
            }
            Role::Assistant if m.tool_calls.as_ref().is_some_and(|c| !c.is_empty()) => {
                let mut text = m
                    .content
                    .as_ref()
                    .map(|c| c.joined_text())
                    .unwrap_or_default();
                for call in m.tool_calls.iter().flatten() {
                    let args = match &call.function.arguments {
                        Value::String(s) => {
                            serde_json::from_str(s).unwrap_or(Value::String(s.clone()))
                        }
                        v => v.clone(),
                    };
                    let json = serde_json::json!({"name": call.function.name, "arguments": args});
                    if !text.is_empty() {
                        text.push('\n');
                    }
                    text.push_str(&format!("{OPEN}\n{json}\n{CLOSE}"));
                }
                ChatMessage::text(Role::Assistant, text)
            }
            _ => m,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use mtplx_model::chat::{FunctionCall, ToolCall, ToolCallKind};
    use serde_json::json;

    use super::*;

    #[test]
    fn tools_go_into_the_system_message_and_history_is_rewritten() {
        let tools = [json!({"type": "function", "function": {"name": "f"}})];
        let call = ToolCall {
            id: Some("c1".into()),
            kind: ToolCallKind::Function,
            function: FunctionCall {
                name: "f".into(),
                arguments: json!("{\"x\": 1}"),
            },
        };
        let messages = vec![
            ChatMessage::text(Role::System, "Be brief."),
            ChatMessage::text(Role::User, "hi"),
            ChatMessage {
                tool_calls: Some(vec![call]),
                content: None,
                ..ChatMessage::text(Role::Assistant, "")
            },
            ChatMessage::text(Role::Tool, "42"),
        ];
        let out = describe_tools(messages, &tools);
        assert_eq!(out.len(), 4);
        let text = |m: &ChatMessage| m.content.as_ref().unwrap().joined_text();
        assert!(text(&out[0]).starts_with("Be brief.\n\n# Tools"));
        let listed: Vec<serde_json::Value> = text(&out[0])
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        assert_eq!(listed, tools);
        let call = text(&out[2]);
        let inner = call
            .strip_prefix("<tool_call>\n")
            .and_then(|c| c.strip_suffix("\n</tool_call>"))
            .unwrap();
        let inner: serde_json::Value = serde_json::from_str(inner).unwrap();
        assert_eq!(inner, json!({"name": "f", "arguments": {"x": 1}}));
        assert_eq!(out[3].role, Role::User);
        assert_eq!(text(&out[3]), "<tool_response>\n42\n</tool_response>");
    }

    #[test]
    fn a_system_message_is_added_when_there_is_none() {
        let out = describe_tools(vec![ChatMessage::text(Role::User, "hi")], &[json!({})]);
        assert_eq!(out[0].role, Role::System);
        assert_eq!(out[1].role, Role::User);
    }
}
