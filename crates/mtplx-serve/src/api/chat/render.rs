//! The JSON pieces of a chat completion, whole or streamed: the assistant message (tool
//! calls parsed out), one tool call.

use serde_json::{json, Value};

use crate::api::drive::{Tools, Turn};
use crate::api::tools::{ParsedCall, ToolChoice};
use crate::job::Finish;

/// The assistant message for a generation's whole text, with tool calls parsed out when
/// the request had tools, and its `finish_reason`.
pub fn assistant_message(text: String, tools: Tools, finish: &Finish) -> (Value, &'static str) {
    let (content, calls) = Turn::new(tools, ToolChoice::Auto).read(text);
    let finish = if calls.is_empty() {
        finish.as_openai()
    } else {
        "tool_calls"
    };
    (message(content, &calls), finish)
}

/// The assistant message with `content` and, when there are any, `calls`.
pub fn message(content: Option<String>, calls: &[ParsedCall]) -> Value {
    let mut message = json!({ "role": "assistant", "content": content });
    if !calls.is_empty() {
        message["tool_calls"] = Value::Array(calls.iter().map(tool_call_json).collect());
    }
    message
}

/// An OpenAI `tool_calls` entry with a fresh id.
pub fn tool_call_json(call: &ParsedCall) -> Value {
    json!({
        "id": format!("call_{}", crate::util::random_hex()),
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
        let (m, finish) = assistant_message(text.into(), Tools::Offered, &Finish::StopToken);
        assert_eq!(finish, "tool_calls");
        assert!(m["content"].is_null());
        let call = &m["tool_calls"][0];
        assert_eq!(call["type"], "function");
        assert_eq!(call["function"]["name"], "f");
        assert_eq!(call["function"]["arguments"], "{\"a\":1}");
        assert!(call["id"].as_str().unwrap().starts_with("call_"));
        let (m, finish) = assistant_message(text.into(), Tools::Absent, &Finish::Length);
        assert_eq!((m["content"].as_str(), finish), (Some(text), "length"));
        assert!(m.get("tool_calls").is_none());
    }
}
