//! A Messages answer as it is written: the event stream (`message_start`, content blocks,
//! `message_delta`, `message_stop`), or one `message` whole.

use bytes::Bytes;
use serde_json::{json, Value};

use super::render::{stop_reason, tool_use_block, usage};
use crate::api::drive::{Ending, Out, Render, Stream, Tools, Turn, Whole};
use crate::api::sse::named;
use crate::api::tools::{ParsedCall, ToolChoice};
use crate::error::{ApiError, ErrorFormat};

pub struct MessagesRender {
    id: String,
    model: String,
    prompt_tokens: usize,
    /// Index of the next content block.
    next_block: usize,
    /// Whether a text block is open (at index `next_block - 1`).
    text_open: bool,
}

/// The streamed Messages answer.
pub type MessagesStream = Stream<MessagesRender>;

impl MessagesRender {
    pub fn new(id: String, model: String, prompt_tokens: usize) -> Self {
        MessagesRender {
            id,
            model,
            prompt_tokens,
            next_block: 0,
            text_open: false,
        }
    }

    fn text_delta(&mut self, text: String, out: &mut Vec<Bytes>) {
        if !self.text_open {
            out.push(named(
                "content_block_start",
                &json!({
                    "type": "content_block_start",
                    "index": self.next_block,
                    "content_block": { "type": "text", "text": "" },
                }),
            ));
            self.text_open = true;
            self.next_block += 1;
        }
        out.push(named(
            "content_block_delta",
            &json!({
                "type": "content_block_delta",
                "index": self.next_block - 1,
                "delta": { "type": "text_delta", "text": text },
            }),
        ));
    }

    fn close_text(&mut self, out: &mut Vec<Bytes>) {
        if self.text_open {
            out.push(named(
                "content_block_stop",
                &json!({
                    "type": "content_block_stop", "index": self.next_block - 1,
                }),
            ));
            self.text_open = false;
        }
    }

    fn tool_use(&mut self, call: &ParsedCall, out: &mut Vec<Bytes>) {
        self.close_text(out);
        let mut block = tool_use_block(call);
        let input = block["input"].to_string();
        block["input"] = json!({});
        let index = self.next_block;
        self.next_block += 1;
        out.push(named(
            "content_block_start",
            &json!({
                "type": "content_block_start", "index": index, "content_block": block,
            }),
        ));
        out.push(named(
            "content_block_delta",
            &json!({
                "type": "content_block_delta",
                "index": index,
                "delta": { "type": "input_json_delta", "partial_json": input },
            }),
        ));
        out.push(named(
            "content_block_stop",
            &json!({
                "type": "content_block_stop", "index": index,
            }),
        ));
    }
}

impl MessagesStream {
    pub fn new(id: String, model: String, prompt_tokens: usize, tools: Tools) -> Self {
        Stream::of(
            Turn::new(tools, ToolChoice::Auto),
            MessagesRender::new(id, model, prompt_tokens),
        )
    }
}

impl Render for MessagesRender {
    fn open(&mut self) -> Vec<Bytes> {
        vec![
            named(
                "message_start",
                &json!({
                    "type": "message_start",
                    "message": {
                        "id": self.id,
                        "type": "message",
                        "role": "assistant",
                        "model": self.model,
                        "content": [],
                        "stop_reason": null,
                        "stop_sequence": null,
                        "usage": {
                            "input_tokens": self.prompt_tokens,
                            "output_tokens": 0,
                            "cache_creation_input_tokens": 0,
                            "cache_read_input_tokens": 0,
                        },
                    },
                }),
            ),
            named("ping", &json!({ "type": "ping" })),
        ]
    }

    fn out(&mut self, out: Out, frames: &mut Vec<Bytes>) {
        match out {
            Out::Text(t) => self.text_delta(t, frames),
            Out::Call { call, .. } => self.tool_use(&call, frames),
        }
    }

    fn done(&mut self, ending: &Ending, out: &mut Vec<Bytes>) {
        if self.next_block == 0 {
            self.text_delta(String::new(), out);
        }
        self.close_text(out);
        let (reason, sequence) = stop_reason(ending.stop());
        out.push(named(
            "message_delta",
            &json!({
                "type": "message_delta",
                "delta": { "stop_reason": reason, "stop_sequence": sequence },
                "usage": usage(&ending.summary),
            }),
        ));
        out.push(named("message_stop", &json!({ "type": "message_stop" })));
    }

    fn failed(&mut self, message: String) -> Vec<Bytes> {
        vec![named(
            "error",
            &ApiError::internal(message).to_json(ErrorFormat::Anthropic),
        )]
    }

    fn whole(self, whole: Whole) -> Value {
        let Whole {
            content: text,
            calls,
            ending,
        } = whole;
        let mut content: Vec<Value> = Vec::new();
        if text.is_some() || calls.is_empty() {
            content.push(json!({ "type": "text", "text": text.unwrap_or_default() }));
        }
        content.extend(calls.iter().map(tool_use_block));
        let (reason, sequence) = stop_reason(ending.stop());
        json!({
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": reason,
            "stop_sequence": sequence,
            "usage": usage(&ending.summary),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::sse::tests::decode;
    use crate::job::{Finish, Summary};

    #[test]
    fn tool_calls_stream_as_tool_use_blocks() {
        let mut enc = MessagesStream::new("msg_1".into(), "m".into(), 12, Tools::Offered);
        let mut frames = enc.open();
        frames.extend(enc.text("Checking. <tool_call>{\"name\": \"weather\", \"arguments\": {\"city\": \"Paris\"}}</tool_call>".into()));
        frames.extend(enc.done(Summary::for_test(Finish::StopToken, 20)));
        let events = decode(&frames);
        let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(
            kinds,
            [
                "message_start",
                "ping",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop",
            ]
        );
        assert_eq!(events[0]["message"]["usage"]["input_tokens"], 12);
        assert_eq!(events[3]["delta"]["text"], "Checking.");
        assert_eq!(events[5]["index"], 1);
        assert_eq!(events[5]["content_block"]["type"], "tool_use");
        assert_eq!(events[5]["content_block"]["name"], "weather");
        let input: serde_json::Value =
            serde_json::from_str(events[6]["delta"]["partial_json"].as_str().unwrap()).unwrap();
        assert_eq!(input, json!({"city": "Paris"}));
        assert_eq!(events[8]["delta"]["stop_reason"], "tool_use");
    }

    #[test]
    fn an_empty_answer_still_has_one_text_block() {
        let mut enc = MessagesStream::new("msg_1".into(), "m".into(), 3, Tools::Absent);
        let mut frames = enc.open();
        frames.extend(enc.done(Summary::for_test(Finish::Length, 1)));
        let events = decode(&frames);
        assert_eq!(events[2]["content_block"]["type"], "text");
        assert_eq!(
            events[events.len() - 2]["delta"]["stop_reason"],
            "max_tokens"
        );
    }
}
