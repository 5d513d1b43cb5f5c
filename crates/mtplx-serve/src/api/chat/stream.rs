//! The `chat.completion.chunk` stream.

use bytes::Bytes;
use serde_json::{json, Value};

use crate::api::sse::{data, done_marker, SseEncoder};
use crate::api::tools::{Piece, ToolCallParser, ToolChoice};
use crate::api::{openai_usage, unix_now};
use crate::error::ApiError;
use crate::job::Summary;

pub struct ChatStream {
    id: String,
    model: String,
    created: u64,
    include_usage: bool,
    /// Present when the request had tools: calls are parsed out of the text.
    tools: Option<ToolCallParser>,
    /// A forced call (`tool_choice` required or named): the text is held and read by
    /// structure at the end.
    forced: Option<(ToolChoice, String)>,
}

impl ChatStream {
    pub fn new(
        id: String,
        model: String,
        tools: bool,
        include_usage: bool,
        choice: ToolChoice,
    ) -> Self {
        ChatStream {
            id,
            model,
            created: unix_now(),
            include_usage,
            tools: tools.then(ToolCallParser::new),
            forced: choice.forces_a_call().then(|| (choice, String::new())),
        }
    }

    fn chunk(&self, delta: Value, finish: Option<&str>) -> Bytes {
        data(&json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{
                "index": 0,
                "delta": delta,
                "logprobs": null,
                "finish_reason": finish,
            }],
        }))
    }

    fn pieces(&self, pieces: Vec<Piece>, calls_before: usize) -> Vec<Bytes> {
        let mut index = calls_before;
        pieces
            .into_iter()
            .map(|p| match p {
                Piece::Text(t) => self.chunk(json!({ "content": t }), None),
                Piece::Call(c) => {
                    let mut call = super::render::tool_call_json(&c);
                    call["index"] = json!(index);
                    index += 1;
                    self.chunk(json!({ "tool_calls": [call] }), None)
                }
            })
            .collect()
    }
}

impl SseEncoder for ChatStream {
    fn open(&mut self) -> Vec<Bytes> {
        vec![self.chunk(json!({ "role": "assistant", "content": "" }), None)]
    }

    fn text(&mut self, text: String) -> Vec<Bytes> {
        if let Some((_, held)) = self.forced.as_mut() {
            held.push_str(&text);
            return Vec::new();
        }
        match self.tools.as_mut() {
            None => vec![self.chunk(json!({ "content": text }), None)],
            Some(parser) => {
                let before = parser.calls();
                let pieces = parser.push(&text);
                self.pieces(pieces, before)
            }
        }
    }

    fn done(&mut self, summary: Summary) -> Vec<Bytes> {
        let mut out = Vec::new();
        let mut calls = 0;
        if let Some((choice, held)) = self.forced.take() {
            match choice.forced_call(&held) {
                Some(call) => {
                    calls = 1;
                    out = self.pieces(vec![Piece::Call(call)], 0);
                }
                // Not completed: what the model wrote goes through the usual parser.
                None => {
                    let text = choice.forced_prefix() + &held;
                    out = self.text(text);
                }
            }
        }
        if let Some(parser) = self.tools.as_mut() {
            let before = parser.calls();
            let pieces = parser.finish();
            calls = calls.max(parser.calls());
            out.extend(self.pieces(pieces, before));
        }
        let finish = if calls > 0 {
            "tool_calls"
        } else {
            summary.finish.as_openai()
        };
        out.push(self.chunk(json!({}), Some(finish)));
        if self.include_usage {
            out.push(data(&json!({
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "choices": [],
                "usage": openai_usage(&summary),
            })));
        }
        out.push(done_marker());
        out
    }

    fn failed(&mut self, message: String) -> Vec<Bytes> {
        vec![
            data(&ApiError::internal(message).to_json(Default::default())),
            done_marker(),
        ]
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;
    use crate::api::sse::tests::decode;
    use crate::job::Finish;

    #[test]
    fn tool_calls_stream_as_tool_call_deltas() {
        let mut enc = ChatStream::new("id".into(), "m".into(), true, true, ToolChoice::Auto);
        let mut frames = enc.open();
        for piece in [
            "Sure. <tool",
            "_call>{\"name\": \"f\", ",
            "\"arguments\": {}}</tool_call>",
        ] {
            frames.extend(enc.text(piece.into()));
        }
        frames.extend(enc.done(Summary::for_test(Finish::StopToken, 9)));
        let events = decode(&frames);
        let content: String = events
            .iter()
            .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(content, "Sure.");
        let calls: Vec<&Value> = events
            .iter()
            .filter_map(|e| e["choices"][0]["delta"]["tool_calls"].get(0))
            .collect();
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0]["index"], 0);
        assert_eq!(calls[0]["function"]["name"], "f");
        assert_eq!(calls[0]["function"]["arguments"], "{}");
        let finish: Vec<&Value> = events
            .iter()
            .map(|e| &e["choices"][0]["finish_reason"])
            .filter(|f| !f.is_null())
            .collect();
        assert_eq!(finish, [&json!("tool_calls")]);
        assert_eq!(events[events.len() - 2]["usage"]["completion_tokens"], 9);
        assert_eq!(events.last().unwrap(), "[DONE]");
    }

    #[test]
    fn without_tools_the_markup_is_plain_content() {
        let mut enc = ChatStream::new("id".into(), "m".into(), false, false, ToolChoice::Auto);
        let frames = enc.text("<tool_call>{}</tool_call>".into());
        assert_eq!(
            decode(&frames)[0]["choices"][0]["delta"]["content"],
            "<tool_call>{}</tool_call>"
        );
    }
}
