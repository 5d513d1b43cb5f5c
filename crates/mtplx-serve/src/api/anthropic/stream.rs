//! The Messages event stream: `message_start`, content blocks, `message_delta`,
//! `message_stop`.

use bytes::Bytes;
use serde_json::json;

use super::render::{stop_reason, tool_use_block, usage};
use crate::api::sse::{named, SseEncoder};
use crate::api::tools::{Piece, ToolCallParser};
use crate::error::{ApiError, ErrorFormat};
use crate::job::Summary;

pub struct MessagesStream {
    id: String,
    model: String,
    prompt_tokens: usize,
    tools: Option<ToolCallParser>,
    /// Index of the next content block.
    next_block: usize,
    /// Whether a text block is open (at index `next_block - 1`).
    text_open: bool,
    calls: usize,
}

impl MessagesStream {
    pub fn new(id: String, model: String, prompt_tokens: usize, tools: bool) -> Self {
        MessagesStream {
            id,
            model,
            prompt_tokens,
            tools: tools.then(ToolCallParser::new),
            next_block: 0,
            text_open: false,
            calls: 0,
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

    fn pieces(&mut self, pieces: Vec<Piece>, out: &mut Vec<Bytes>) {
        for p in pieces {
            match p {
                Piece::Text(t) => self.text_delta(t, out),
                Piece::Call(call) => {
                    self.close_text(out);
                    let mut block = tool_use_block(&call);
                    let input = block["input"].to_string();
                    block["input"] = json!({});
                    let index = self.next_block;
                    self.next_block += 1;
                    self.calls += 1;
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
        }
    }
}

impl SseEncoder for MessagesStream {
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

    fn text(&mut self, text: String) -> Vec<Bytes> {
        let mut out = Vec::new();
        match self.tools.as_mut() {
            None => self.text_delta(text, &mut out),
            Some(parser) => {
                let pieces = parser.push(&text);
                self.pieces(pieces, &mut out);
            }
        }
        out
    }

    fn done(&mut self, summary: Summary) -> Vec<Bytes> {
        let mut out = Vec::new();
        if let Some(parser) = self.tools.as_mut() {
            let pieces = parser.finish();
            self.pieces(pieces, &mut out);
        }
        if self.next_block == 0 {
            self.text_delta(String::new(), &mut out);
        }
        self.close_text(&mut out);
        let (reason, sequence) = stop_reason(&summary.finish, self.calls > 0);
        out.push(named(
            "message_delta",
            &json!({
                "type": "message_delta",
                "delta": { "stop_reason": reason, "stop_sequence": sequence },
                "usage": usage(&summary),
            }),
        ));
        out.push(named("message_stop", &json!({ "type": "message_stop" })));
        out
    }

    fn failed(&mut self, message: String) -> Vec<Bytes> {
        vec![named(
            "error",
            &ApiError::internal(message).to_json(ErrorFormat::Anthropic),
        )]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::sse::tests::decode;
    use crate::job::Finish;

    #[test]
    fn tool_calls_stream_as_tool_use_blocks() {
        let mut enc = MessagesStream::new("msg_1".into(), "m".into(), 12, true);
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
        let mut enc = MessagesStream::new("msg_1".into(), "m".into(), 3, false);
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
