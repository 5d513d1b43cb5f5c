//! The JSON pieces a Messages response is made of, whole or streamed: the stop reason, the
//! usage, a tool-use block.

use serde_json::{json, Value};

use crate::api::drive::Stop;
use crate::api::random_hex;
use crate::api::tools::ParsedCall;
use crate::job::{Finish, Summary};

/// Anthropic's `stop_reason` and `stop_sequence`.
pub fn stop_reason(stop: Stop<'_>) -> (&'static str, Value) {
    match stop {
        Stop::ToolCalls => ("tool_use", Value::Null),
        Stop::Finished(Finish::StopSequence(s)) => ("stop_sequence", json!(s)),
        Stop::Finished(Finish::Length | Finish::ContextFull) => ("max_tokens", Value::Null),
        Stop::Finished(Finish::StopToken | Finish::Cancelled) => ("end_turn", Value::Null),
    }
}

/// Anthropic's `usage`.
pub fn usage(s: &Summary) -> Value {
    json!({
        "input_tokens": s.prompt_tokens - s.cached_tokens,
        "output_tokens": s.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": s.cached_tokens,
    })
}

/// A `tool_use` block with a fresh id.
pub fn tool_use_block(call: &ParsedCall) -> Value {
    json!({
        "type": "tool_use",
        "id": format!("toolu_{}", random_hex()),
        "name": call.name,
        "input": call.arguments_value(),
    })
}
