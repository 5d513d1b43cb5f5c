//! A Responses answer as it is written: the event stream (`response.created`, output items
//! and their deltas, `response.completed`), or one response object whole.

use bytes::Bytes;
use serde_json::{json, Value};

use super::render::{function_call_item, message_item, status_of, Meta};
use crate::api::drive::{Ending, Out, Render, Stream, Tools, Turn, Whole};
use crate::api::random_hex;
use crate::api::sse::named;
use crate::api::tools::{ParsedCall, ToolChoice};

/// The message item being written.
struct OpenMessage {
    id: String,
    text: String,
}

pub struct ResponsesRender {
    meta: Meta,
    sequence: u64,
    /// Finished output items.
    output: Vec<Value>,
    message: Option<OpenMessage>,
}

/// The streamed Responses answer.
pub type ResponsesStream = Stream<ResponsesRender>;

impl ResponsesStream {
    pub fn new(meta: Meta, tools: Tools) -> Self {
        Stream::of(
            Turn::new(tools, ToolChoice::Auto),
            ResponsesRender::new(meta),
        )
    }
}

impl ResponsesRender {
    pub fn new(meta: Meta) -> Self {
        ResponsesRender {
            meta,
            sequence: 0,
            output: Vec::new(),
            message: None,
        }
    }

    fn event(&mut self, kind: &str, mut fields: Value) -> Bytes {
        fields["type"] = json!(kind);
        fields["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        named(kind, &fields)
    }

    fn text_delta(&mut self, text: String, out: &mut Vec<Bytes>) {
        let index = self.output.len();
        if self.message.is_none() {
            let id = format!("msg_{}", random_hex());
            let item = message_item(&id, "", "in_progress");
            out.push(self.event(
                "response.output_item.added",
                json!({ "output_index": index, "item": item }),
            ));
            out.push(self.event(
                "response.content_part.added",
                json!({
                    "item_id": id, "output_index": index, "content_index": 0,
                    "part": { "type": "output_text", "text": "", "annotations": [] },
                }),
            ));
            self.message = Some(OpenMessage {
                id,
                text: String::new(),
            });
        }
        let m = self.message.as_mut().expect("opened above");
        m.text.push_str(&text);
        let id = m.id.clone();
        out.push(self.event(
            "response.output_text.delta",
            json!({
                "item_id": id, "output_index": index, "content_index": 0, "delta": text,
            }),
        ));
    }

    fn close_message(&mut self, out: &mut Vec<Bytes>) {
        let Some(m) = self.message.take() else {
            return;
        };
        let index = self.output.len();
        let part = json!({ "type": "output_text", "text": m.text, "annotations": [] });
        out.push(self.event(
            "response.output_text.done",
            json!({
                "item_id": m.id, "output_index": index, "content_index": 0, "text": m.text,
            }),
        ));
        out.push(self.event(
            "response.content_part.done",
            json!({
                "item_id": m.id, "output_index": index, "content_index": 0, "part": part,
            }),
        ));
        let item = message_item(&m.id, &m.text, "completed");
        out.push(self.event(
            "response.output_item.done",
            json!({ "output_index": index, "item": item }),
        ));
        self.output.push(item);
    }

    fn function_call(&mut self, call: &ParsedCall, out: &mut Vec<Bytes>) {
        self.close_message(out);
        let index = self.output.len();
        let mut item = function_call_item(call, "in_progress");
        let id = item["id"].clone();
        out.push(self.event(
            "response.output_item.added",
            json!({ "output_index": index, "item": item }),
        ));
        out.push(self.event(
            "response.function_call_arguments.delta",
            json!({
                "item_id": id, "output_index": index, "delta": call.arguments,
            }),
        ));
        out.push(self.event(
            "response.function_call_arguments.done",
            json!({
                "item_id": id, "output_index": index, "arguments": call.arguments,
            }),
        ));
        item["arguments"] = json!(call.arguments);
        item["status"] = json!("completed");
        out.push(self.event(
            "response.output_item.done",
            json!({ "output_index": index, "item": item }),
        ));
        self.output.push(item);
    }
}

impl Render for ResponsesRender {
    fn open(&mut self) -> Vec<Bytes> {
        let response = self.meta.response("in_progress", &[], None);
        vec![
            self.event("response.created", json!({ "response": response })),
            self.event("response.in_progress", json!({ "response": response })),
        ]
    }

    fn out(&mut self, out: Out, frames: &mut Vec<Bytes>) {
        match out {
            Out::Text(t) => self.text_delta(t, frames),
            Out::Call { call, .. } => self.function_call(&call, frames),
        }
    }

    fn done(&mut self, ending: &Ending, out: &mut Vec<Bytes>) {
        self.close_message(out);
        let summary = &ending.summary;
        let status = status_of(&summary.finish);
        let response = self.meta.response(status, &self.output, Some(summary));
        let kind = if status == "completed" {
            "response.completed"
        } else {
            "response.incomplete"
        };
        out.push(self.event(kind, json!({ "response": response })));
    }

    fn failed(&mut self, message: String) -> Vec<Bytes> {
        vec![self.event(
            "error",
            json!({ "code": "server_error", "message": message, "param": null }),
        )]
    }

    fn whole(self, whole: Whole) -> Value {
        let mut output = Vec::new();
        if let Some(text) = whole.content.filter(|t| !t.is_empty()) {
            output.push(message_item(
                &format!("msg_{}", random_hex()),
                &text,
                "completed",
            ));
        }
        output.extend(
            whole
                .calls
                .iter()
                .map(|c| function_call_item(c, "completed")),
        );
        let summary = &whole.ending.summary;
        self.meta
            .response(status_of(&summary.finish), &output, Some(summary))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::sse::tests::decode;
    use crate::job::{Finish, Summary};

    fn meta() -> Meta {
        Meta {
            id: "resp_1".into(),
            created_at: 0,
            model: "m".into(),
            instructions: None,
            max_output_tokens: None,
            temperature: None,
            top_p: None,
            tools: json!([]),
            tool_choice: json!("auto"),
            metadata: json!({}),
        }
    }

    #[test]
    fn text_then_a_function_call_become_two_output_items() {
        let mut enc = ResponsesStream::new(meta(), Tools::Offered);
        let mut frames = enc.open();
        frames.extend(enc.text("On it.".into()));
        frames.extend(
            enc.text("<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": 2}}</tool_call>".into()),
        );
        frames.extend(enc.done(Summary::for_test(Finish::StopToken, 7)));
        let events = decode(&frames);
        let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(
            kinds,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        let done = &events.last().unwrap()["response"];
        assert_eq!(done["output"][0]["content"][0]["text"], "On it.");
        assert_eq!(done["output"][1]["type"], "function_call");
        assert_eq!(done["output"][1]["name"], "f");
        assert_eq!(done["output"][1]["arguments"], "{\"x\":2}");
        assert_eq!(done["usage"]["output_tokens"], 7);
        let seq: Vec<u64> = events
            .iter()
            .map(|e| e["sequence_number"].as_u64().unwrap())
            .collect();
        assert_eq!(seq, (0..events.len() as u64).collect::<Vec<_>>());
    }

    #[test]
    fn a_cut_answer_is_incomplete() {
        let mut enc = ResponsesStream::new(meta(), Tools::Absent);
        let mut frames = enc.text("abc".into());
        frames.extend(enc.done(Summary::for_test(Finish::Length, 3)));
        let last = decode(&frames).pop().unwrap();
        assert_eq!(last["type"], "response.incomplete");
        assert_eq!(
            last["response"]["incomplete_details"]["reason"],
            "max_output_tokens"
        );
    }
}
