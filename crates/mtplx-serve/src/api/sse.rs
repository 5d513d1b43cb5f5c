//! Server-sent events straight from the engine's channel.
//!
//! [`SseBody`] polls the engine's event receiver itself, with no task in between, so the
//! moment the client goes away and the body is dropped, the receiver is dropped and the
//! engine stops at its next step.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{header, HeaderValue, Response};
use hyper::body::Frame;
use serde::Serialize;
use tokio::sync::mpsc;

use crate::body::Body;
use crate::error::{ApiError, ErrorFormat};
use crate::job::{Event, Summary};

/// Turns engine events into wire frames for one endpoint's streaming format.
pub trait SseEncoder: Send + 'static {
    /// Frames before any text (e.g. the role chunk, `message_start`).
    fn open(&mut self) -> Vec<Bytes>;
    fn text(&mut self, text: String) -> Vec<Bytes>;
    /// The last frames of a generation that ended.
    fn done(&mut self, summary: Summary) -> Vec<Bytes>;
    /// The last frames of a generation that failed.
    fn failed(&mut self, message: String) -> Vec<Bytes>;
}

/// `data: <json>\n\n`.
pub fn data(value: &impl Serialize) -> Bytes {
    let json = serde_json::to_string(value).unwrap_or_else(|_| "null".into());
    Bytes::from(format!("data: {json}\n\n"))
}

/// `event: <name>\ndata: <json>\n\n`.
pub fn named(name: &str, value: &impl Serialize) -> Bytes {
    let json = serde_json::to_string(value).unwrap_or_else(|_| "null".into());
    Bytes::from(format!("event: {name}\ndata: {json}\n\n"))
}

/// `data: [DONE]\n\n`, OpenAI's end of stream.
pub fn done_marker() -> Bytes {
    Bytes::from_static(b"data: [DONE]\n\n")
}

/// OpenAI's end of a failed stream: the error, then `[DONE]`.
pub fn openai_failed(message: String) -> Vec<Bytes> {
    vec![
        data(&ApiError::internal(message).to_json(ErrorFormat::OpenAi)),
        done_marker(),
    ]
}

/// A streaming body fed by the engine.
pub struct SseBody<E> {
    events: Option<mpsc::Receiver<Event>>,
    encoder: E,
    queue: VecDeque<Bytes>,
}

impl<E: SseEncoder> SseBody<E> {
    pub fn new(events: mpsc::Receiver<Event>, mut encoder: E) -> Self {
        let queue = encoder.open().into();
        SseBody {
            events: Some(events),
            encoder,
            queue,
        }
    }
}

impl<E: SseEncoder + Unpin> hyper::body::Body for SseBody<E> {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        loop {
            if let Some(frame) = this.queue.pop_front() {
                return Poll::Ready(Some(Ok(Frame::data(frame))));
            }
            let Some(events) = this.events.as_mut() else {
                return Poll::Ready(None);
            };
            let frames = match events.poll_recv(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Event::Text(t))) => this.encoder.text(t),
                Poll::Ready(Some(Event::Done(s))) => {
                    this.events = None;
                    this.encoder.done(*s)
                }
                Poll::Ready(Some(Event::Failed(m))) => {
                    this.events = None;
                    this.encoder.failed(m)
                }
                Poll::Ready(None) => {
                    this.events = None;
                    this.encoder
                        .failed("The engine stopped before the generation ended.".into())
                }
            };
            this.queue.extend(frames);
        }
    }

    fn is_end_stream(&self) -> bool {
        self.events.is_none() && self.queue.is_empty()
    }
}

/// A `text/event-stream` response over the engine's events.
pub fn response<E: SseEncoder + Unpin>(
    events: mpsc::Receiver<Event>,
    encoder: E,
) -> Response<Body> {
    let mut res = Response::new(Body::new(SseBody::new(events, encoder)));
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    res
}

#[cfg(test)]
pub(crate) mod tests {
    use http_body_util::BodyExt;
    use serde_json::Value;

    use super::*;
    use crate::job::Finish;

    /// The `data:` payloads of frames (`[DONE]` as a string), for encoder tests.
    pub(crate) fn decode(frames: &[Bytes]) -> Vec<Value> {
        frames
            .iter()
            .filter_map(|f| {
                let text = std::str::from_utf8(f).unwrap();
                let data = text.lines().find_map(|l| l.strip_prefix("data: "))?;
                Some(serde_json::from_str(data).unwrap_or(Value::String(data.into())))
            })
            .collect()
    }

    struct Plain;

    impl SseEncoder for Plain {
        fn open(&mut self) -> Vec<Bytes> {
            vec![Bytes::from("open|")]
        }
        fn text(&mut self, text: String) -> Vec<Bytes> {
            vec![Bytes::from(text)]
        }
        fn done(&mut self, s: Summary) -> Vec<Bytes> {
            vec![Bytes::from(format!("|done {}", s.completion_tokens))]
        }
        fn failed(&mut self, m: String) -> Vec<Bytes> {
            vec![Bytes::from(format!("|failed {m}"))]
        }
    }

    #[tokio::test]
    async fn frames_follow_the_events() {
        let (tx, rx) = mpsc::channel(8);
        tx.send(Event::Text("a".into())).await.unwrap();
        tx.send(Event::Text("b".into())).await.unwrap();
        tx.send(Event::Done(Box::new(Summary::for_test(Finish::Length, 2))))
            .await
            .unwrap();
        let body = SseBody::new(rx, Plain).collect().await.unwrap().to_bytes();
        assert_eq!(body, "open|ab|done 2");
    }

    #[tokio::test]
    async fn a_vanished_engine_ends_the_stream_with_an_error() {
        let (tx, rx) = mpsc::channel(8);
        tx.send(Event::Text("a".into())).await.unwrap();
        drop(tx);
        let body = SseBody::new(rx, Plain).collect().await.unwrap().to_bytes();
        assert!(body.starts_with(b"open|a|failed"));
    }

    #[tokio::test]
    async fn dropping_the_body_closes_the_channel() {
        let (tx, rx) = mpsc::channel::<Event>(8);
        let body = SseBody::new(rx, Plain);
        assert!(!tx.is_closed());
        drop(body);
        assert!(tx.is_closed());
    }
}
