//! The JSON pieces of a chat completion, whole or streamed: the assistant message (tool
//! calls parsed out), a forced call's message, one tool call.

use serde_json::{json, Value};

use crate::api::tools::{parse_all, ParsedCall, ToolChoice};
use crate::job::Finish;

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
