//! The chat completion as it is written: `chat.completion.chunk`s when streamed, one
//! `chat.completion` whole.

use bytes::Bytes;
use serde_json::{json, Value};

use crate::api::drive::{Ending, Out, Render, Stop, Stream, StreamUsage, Tools, Turn, Whole};
use crate::api::sse::{data, done_marker, openai_failed};
use crate::api::tools::ToolChoice;
use crate::api::{openai_usage, unix_now};

pub struct ChatRender {
    id: String,
    model: String,
    created: u64,
    usage: StreamUsage,
}

/// The streamed chat completion.
pub type ChatStream = Stream<ChatRender>;

impl ChatRender {
    pub fn new(id: String, model: String, usage: StreamUsage) -> Self {
        ChatRender {
            id,
            model,
            created: unix_now(),
            usage,
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
}

impl ChatStream {
    pub fn new(
        id: String,
        model: String,
        tools: Tools,
        usage: StreamUsage,
        choice: ToolChoice,
    ) -> Self {
        Stream::of(Turn::new(tools, choice), ChatRender::new(id, model, usage))
    }
}

/// OpenAI's `finish_reason`.
fn finish_reason(ending: &Ending) -> &'static str {
    match ending.stop() {
        Stop::ToolCalls => "tool_calls",
        Stop::Finished(finish) => finish.as_openai(),
    }
}

impl Render for ChatRender {
    fn open(&mut self) -> Vec<Bytes> {
        vec![self.chunk(json!({ "role": "assistant", "content": "" }), None)]
    }

    fn out(&mut self, out: Out, frames: &mut Vec<Bytes>) {
        frames.push(match out {
            Out::Text(t) => self.chunk(json!({ "content": t }), None),
            Out::Call { index, call } => {
                let mut call = super::render::tool_call_json(&call);
                call["index"] = json!(index);
                self.chunk(json!({ "tool_calls": [call] }), None)
            }
        });
    }

    fn done(&mut self, ending: &Ending, frames: &mut Vec<Bytes>) {
        frames.push(self.chunk(json!({}), Some(finish_reason(ending))));
        if self.usage == StreamUsage::Included {
            frames.push(data(&json!({
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "choices": [],
                "usage": openai_usage(&ending.summary),
            })));
        }
        frames.push(done_marker());
    }

    fn failed(&mut self, message: String) -> Vec<Bytes> {
        openai_failed(message)
    }

    fn whole(self, whole: Whole) -> Value {
        let message = super::render::message(whole.content, &whole.calls);
        json!({
            "id": self.id,
            "object": "chat.completion",
            "created": unix_now(),
            "model": self.model,
            "choices": [{
                "index": 0,
                "message": message,
                "logprobs": null,
                "finish_reason": finish_reason(&whole.ending),
            }],
            "usage": openai_usage(&whole.ending.summary),
            "system_fingerprint": null,
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;
    use crate::api::sse::tests::decode;
    use crate::job::{Finish, Summary};

    #[test]
    fn tool_calls_stream_as_tool_call_deltas() {
        let mut enc = ChatStream::new(
            "id".into(),
            "m".into(),
            Tools::Offered,
            StreamUsage::Included,
            ToolChoice::Auto,
        );
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
        let mut enc = ChatStream::new(
            "id".into(),
            "m".into(),
            Tools::Absent,
            StreamUsage::Omitted,
            ToolChoice::Auto,
        );
        let frames = enc.text("<tool_call>{}</tool_call>".into());
        assert_eq!(
            decode(&frames)[0]["choices"][0]["delta"]["content"],
            "<tool_call>{}</tool_call>"
        );
    }
}
