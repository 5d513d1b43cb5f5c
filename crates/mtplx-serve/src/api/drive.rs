//! The one stream driver every API family renders.
//!
//! A [`Turn`] consumes what the engine writes for one request and decides, once for all
//! families, what the answer is made of: text to show, the tool calls parsed out of it (or
//! a forced call read by structure, see [`ToolChoice::forced_call`]), and how it ended
//! ([`Ending`]: the stop, with the engine's [`Summary`] for the usage). A family only
//! renders: its [`Render`] turns each decided piece into its wire frames, and a whole
//! answer into its JSON. [`answer`] is the split every handler makes after queueing its
//! job: stream the events, or collect them to the end.

use bytes::Bytes;
use http::Response;
use serde_json::Value;

use super::json_response;
use super::sse::{self, SseEncoder};
use super::tools::{ParsedCall, Piece, ToolCallParser, ToolChoice};
use crate::body::Body;
use crate::error::ApiError;
use crate::job::{EngineReply, Event, Finish, Summary};

/// Whether the request offered tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tools {
    /// Calls are parsed out of the text.
    Offered,
    /// No tools: call markup is plain text.
    Absent,
}

impl Tools {
    pub fn offered(offered: bool) -> Self {
        if offered {
            Tools::Offered
        } else {
            Tools::Absent
        }
    }
}

/// How the client asked for the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// One JSON object once the generation ended.
    Whole,
    /// Server-sent events as the text arrives.
    Stream,
}

impl Delivery {
    /// The request's `stream` field.
    pub fn asked(stream: Option<bool>) -> Self {
        if stream.unwrap_or(false) {
            Delivery::Stream
        } else {
            Delivery::Whole
        }
    }
}

/// Whether a stream ends with a usage chunk (OpenAI's `stream_options.include_usage`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamUsage {
    Included,
    Omitted,
}

impl StreamUsage {
    /// The request's `include_usage`.
    pub fn asked(include_usage: Option<bool>) -> Self {
        if include_usage.unwrap_or(false) {
            StreamUsage::Included
        } else {
            StreamUsage::Omitted
        }
    }
}

/// A decided piece of the answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Out {
    /// Text to show.
    Text(String),
    /// A complete tool call; `index` counts the calls before it.
    Call { index: usize, call: ParsedCall },
}

/// Why the answer stopped, as every family reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop<'a> {
    /// The answer made tool calls.
    ToolCalls,
    /// The generation's own end.
    Finished(&'a Finish),
}

/// How a turn ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Ending {
    /// Counts and timings (the usage) and the generation's end.
    pub summary: Summary,
    /// Tool calls in the answer.
    pub tool_calls: usize,
}

impl Ending {
    pub fn stop(&self) -> Stop<'_> {
        if self.tool_calls > 0 {
            Stop::ToolCalls
        } else {
            Stop::Finished(&self.summary.finish)
        }
    }
}

/// A whole answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Whole {
    /// The text: all of it without tools; with tools, trimmed when there were calls and
    /// `None` when empty.
    pub content: Option<String>,
    pub calls: Vec<ParsedCall>,
    pub ending: Ending,
}

/// The driver's state for one request.
#[derive(Debug)]
pub struct Turn {
    /// Present when the request offered tools.
    parser: Option<ToolCallParser>,
    /// A forced call (`tool_choice` required or named): the text is held and read by
    /// structure at the end.
    forced: Option<(ToolChoice, String)>,
    calls: usize,
}

impl Turn {
    pub fn new(tools: Tools, choice: ToolChoice) -> Self {
        Turn {
            parser: (tools == Tools::Offered).then(ToolCallParser::new),
            forced: choice.forces_a_call().then(|| (choice, String::new())),
            calls: 0,
        }
    }

    /// A turn that only passes text on.
    pub fn plain() -> Self {
        Turn::new(Tools::Absent, ToolChoice::Auto)
    }

    /// Feeds new text; returns what is decided.
    pub fn push(&mut self, text: String) -> Vec<Out> {
        if let Some((_, held)) = self.forced.as_mut() {
            held.push_str(&text);
            return Vec::new();
        }
        match self.parser.as_mut() {
            None => vec![Out::Text(text)],
            Some(parser) => {
                let pieces = parser.push(&text);
                self.outs(pieces)
            }
        }
    }

    /// Ends the text: what was still undecided.
    pub fn finish(&mut self) -> Vec<Out> {
        let mut out = Vec::new();
        if let Some((choice, held)) = self.forced.take() {
            match choice.forced_call(&held) {
                Some(call) => out = self.outs(vec![Piece::Call(call)]),
                // Not completed: what the model wrote goes through the usual parser.
                None => out = self.push(choice.forced_prefix() + &held),
            }
        }
        if let Some(parser) = self.parser.as_mut() {
            let pieces = parser.finish();
            out.extend(self.outs(pieces));
        }
        out
    }

    /// How the turn ended, once [`Turn::finish`] was called.
    pub fn end(&self, summary: Summary) -> Ending {
        Ending {
            summary,
            tool_calls: self.calls,
        }
    }

    /// A whole text read at once: its content and calls (see [`Whole::content`]).
    pub fn read(&mut self, text: String) -> (Option<String>, Vec<ParsedCall>) {
        let mut outs = self.push(text);
        outs.extend(self.finish());
        let mut content = String::new();
        let mut calls = Vec::new();
        for out in outs {
            match out {
                Out::Text(t) => content.push_str(&t),
                Out::Call { call, .. } => calls.push(call),
            }
        }
        if self.parser.is_none() {
            return (Some(content), calls);
        }
        if !calls.is_empty() {
            content = content.trim().to_owned();
        }
        ((!content.is_empty()).then_some(content), calls)
    }

    fn outs(&mut self, pieces: Vec<Piece>) -> Vec<Out> {
        pieces
            .into_iter()
            .map(|p| match p {
                Piece::Text(t) => Out::Text(t),
                Piece::Call(call) => {
                    let index = self.calls;
                    self.calls += 1;
                    Out::Call { index, call }
                }
            })
            .collect()
    }
}

/// How one API family writes an answer.
pub trait Render: Send + 'static {
    /// Frames before any text (the role chunk, `message_start`, ...).
    fn open(&mut self) -> Vec<Bytes>;
    /// The frames of one decided piece.
    fn out(&mut self, out: Out, frames: &mut Vec<Bytes>);
    /// The last frames of an answer that ended.
    fn done(&mut self, ending: &Ending, frames: &mut Vec<Bytes>);
    /// The last frames of a generation that failed.
    fn failed(&mut self, message: String) -> Vec<Bytes>;
    /// The whole answer's JSON.
    fn whole(self, whole: Whole) -> Value;
}

/// A streamed answer: the turn, and the family rendering it.
pub struct Stream<R> {
    turn: Turn,
    render: R,
}

impl<R: Render> Stream<R> {
    pub fn of(turn: Turn, render: R) -> Self {
        Stream { turn, render }
    }

    pub fn open(&mut self) -> Vec<Bytes> {
        self.render.open()
    }

    pub fn text(&mut self, text: String) -> Vec<Bytes> {
        let mut frames = Vec::new();
        for out in self.turn.push(text) {
            self.render.out(out, &mut frames);
        }
        frames
    }

    pub fn done(&mut self, summary: Summary) -> Vec<Bytes> {
        let mut frames = Vec::new();
        for out in self.turn.finish() {
            self.render.out(out, &mut frames);
        }
        let ending = self.turn.end(summary);
        self.render.done(&ending, &mut frames);
        frames
    }

    pub fn failed(&mut self, message: String) -> Vec<Bytes> {
        self.render.failed(message)
    }
}

impl<R: Render> SseEncoder for Stream<R> {
    fn open(&mut self) -> Vec<Bytes> {
        Stream::open(self)
    }

    fn text(&mut self, text: String) -> Vec<Bytes> {
        Stream::text(self, text)
    }

    fn done(&mut self, summary: Summary) -> Vec<Bytes> {
        Stream::done(self, summary)
    }

    fn failed(&mut self, message: String) -> Vec<Bytes> {
        Stream::failed(self, message)
    }
}

/// Waits for the end of a generation and reads its whole text.
pub async fn collect(mut events: EngineReply, mut turn: Turn) -> Result<Whole, ApiError> {
    let mut text = String::new();
    while let Some(event) = events.recv().await {
        match event {
            Event::Text(t) => text.push_str(&t),
            Event::Done(summary) => {
                let (content, calls) = turn.read(text);
                return Ok(Whole {
                    content,
                    calls,
                    ending: turn.end(*summary),
                });
            }
            Event::Failed(message) => return Err(ApiError::internal(message)),
        }
    }
    Err(ApiError::internal(
        "The engine stopped before the generation ended.",
    ))
}

/// The answer to a queued job, as the client asked for it.
pub async fn answer<R: Render + Unpin>(
    events: EngineReply,
    delivery: Delivery,
    turn: Turn,
    render: R,
) -> Result<Response<Body>, ApiError> {
    match delivery {
        Delivery::Stream => Ok(sse::response(events, Stream::of(turn, render))),
        Delivery::Whole => Ok(json_response(&render.whole(collect(events, turn).await?))),
    }
}

#[cfg(test)]
mod tests {
    use tokio::sync::mpsc;

    use super::*;

    fn call(name: &str, args: &str) -> ParsedCall {
        ParsedCall::new(name, args)
    }

    #[test]
    fn calls_are_numbered_and_end_the_answer_as_tool_calls() {
        let mut turn = Turn::new(Tools::Offered, ToolChoice::Auto);
        let mut outs = turn.push("Hi <tool_call>{\"name\": \"f\"}</tool_call>".into());
        outs.extend(turn.push("<tool_call>{\"name\": \"g\"}".into()));
        outs.extend(turn.finish());
        assert_eq!(
            outs,
            [
                Out::Text("Hi".into()),
                Out::Call {
                    index: 0,
                    call: call("f", "{}")
                },
                Out::Call {
                    index: 1,
                    call: call("g", "{}")
                },
            ]
        );
        let ending = turn.end(Summary::for_test(Finish::StopToken, 3));
        assert_eq!(ending.stop(), Stop::ToolCalls);
        let plain = Turn::plain().end(Summary::for_test(Finish::Length, 3));
        assert_eq!(plain.stop(), Stop::Finished(&Finish::Length));
    }

    #[test]
    fn a_forced_call_is_held_and_read_by_structure() {
        let choice = ToolChoice::Named("f".into());
        let mut turn = Turn::new(Tools::Offered, choice.clone());
        assert_eq!(turn.push("{\"a\": 1}}\nchatter".into()), []);
        assert_eq!(
            turn.finish(),
            [Out::Call {
                index: 0,
                call: call("f", "{\"a\":1}")
            }]
        );
        // Never completed: the prefix and the text are parsed as usual.
        let mut turn = Turn::new(Tools::Offered, choice);
        assert_eq!(
            turn.read("\"x".into()),
            (
                Some(format!(
                    "{}\"x",
                    ToolChoice::Named("f".into()).forced_prefix()
                )),
                vec![]
            )
        );
    }

    #[test]
    fn whole_text_keeps_empty_content_only_without_tools() {
        assert_eq!(
            Turn::plain().read(String::new()),
            (Some(String::new()), vec![])
        );
        let mut tools = Turn::new(Tools::Offered, ToolChoice::Auto);
        assert_eq!(tools.read(String::new()), (None, vec![]));
        let markup = "<tool_call>{\"name\": \"f\"}</tool_call>".to_string();
        assert_eq!(Turn::plain().read(markup.clone()), (Some(markup), vec![]));
    }

    #[tokio::test]
    async fn collecting_reads_the_whole_text_or_fails() {
        let (tx, rx) = mpsc::channel(8);
        tx.send(Event::Text("a <tool_".into())).await.unwrap();
        tx.send(Event::Text("call>{\"name\": \"f\"}</tool_call>".into()))
            .await
            .unwrap();
        tx.send(Event::Done(Box::new(Summary::for_test(
            Finish::StopToken,
            4,
        ))))
        .await
        .unwrap();
        let whole = collect(rx, Turn::new(Tools::Offered, ToolChoice::Auto))
            .await
            .unwrap();
        assert_eq!(whole.content.as_deref(), Some("a"));
        assert_eq!(whole.calls, [call("f", "{}")]);
        assert_eq!(whole.ending.tool_calls, 1);
        let (tx, rx) = mpsc::channel(8);
        tx.send(Event::Failed("boom".into())).await.unwrap();
        let e = collect(rx, Turn::plain()).await.unwrap_err();
        assert_eq!((e.status.as_u16(), e.message.as_str()), (500, "boom"));
        let (tx, rx) = mpsc::channel::<Event>(8);
        drop(tx);
        assert!(collect(rx, Turn::plain()).await.is_err());
    }
}
