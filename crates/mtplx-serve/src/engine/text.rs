//! What a generation's tokens become for its client: text, detokenized as it streams, cut
//! at the request's stop strings, sent as [`Event::Text`]. The generation driver's
//! [`Observer`] for the engine.

use std::ops::ControlFlow;
use std::sync::atomic::Ordering;

use mtplx_model::stop::StopMatcher;
use mtplx_model::tokenizer::{StreamDecoder, TokenizerError};
use mtplx_spec::Observer;
use tokio::sync::mpsc;

use super::config::StopSignal;
use crate::job::{Event, Finish};
use crate::metrics::Metrics;

/// One generation's text on its way to the client.
pub(super) struct TextOut<'a> {
    decoder: StreamDecoder,
    stops: StopMatcher,
    stop_strings: &'a [String],
    /// What was fed to the stop matcher and what it let through, to name the stop string
    /// that ended the text.
    fed: String,
    emitted: String,
    tx: &'a mpsc::Sender<Event>,
    signal: &'a StopSignal,
    metrics: &'a Metrics,
    /// Why [`Observer::token`] ended the generation, or the detokenizer's error.
    ended: Option<Result<Finish, TokenizerError>>,
}

impl<'a> TextOut<'a> {
    pub fn new(
        decoder: StreamDecoder,
        stop_strings: &'a [String],
        tx: &'a mpsc::Sender<Event>,
        signal: &'a StopSignal,
        metrics: &'a Metrics,
    ) -> Self {
        TextOut {
            decoder,
            stops: StopMatcher::new(stop_strings.iter().cloned()),
            stop_strings,
            fed: String::new(),
            emitted: String::new(),
            tx,
            signal,
            metrics,
            ended: None,
        }
    }

    /// Sends `text` (nothing if empty); false if the client has gone.
    fn send(&mut self, text: String) -> bool {
        if text.is_empty() {
            return true;
        }
        self.emitted.push_str(&text);
        self.tx.blocking_send(Event::Text(text)).is_ok()
    }

    fn stop_sequence(&self) -> Finish {
        Finish::StopSequence(matched_stop(self.stop_strings, &self.fed, &self.emitted))
    }

    /// Why the text ended, when [`Observer::token`] ended it.
    pub fn take_ended(&mut self) -> Option<Result<Finish, TokenizerError>> {
        self.ended.take()
    }

    /// The generation ended for `finish` (a stop token, the length, the window): sends the
    /// text still held back (an unfinished character, a possible stop string's start) and
    /// says how it really ended (the tail may complete a stop string; the client may have
    /// gone).
    pub fn finish(&mut self, finish: Finish) -> Finish {
        let tail = self.decoder.finish();
        self.fed.push_str(&tail);
        let mut out = self.stops.push(&tail);
        if self.stops.stopped() {
            self.send(out);
            return self.stop_sequence();
        }
        out.push_str(&self.stops.finish());
        if self.send(out) {
            finish
        } else {
            Finish::Cancelled
        }
    }
}

impl Observer for TextOut<'_> {
    fn cancelled(&self) -> bool {
        self.tx.is_closed() || self.signal.is_stopped()
    }

    fn token(&mut self, token: u32) -> ControlFlow<()> {
        let piece = match self.decoder.push(token) {
            Ok(Some(piece)) => piece,
            Ok(None) => return ControlFlow::Continue(()),
            Err(e) => {
                self.ended = Some(Err(e));
                return ControlFlow::Break(());
            }
        };
        self.fed.push_str(&piece);
        let out = self.stops.push(&piece);
        if !self.send(out) {
            self.ended = Some(Ok(Finish::Cancelled));
            return ControlFlow::Break(());
        }
        if self.stops.stopped() {
            self.ended = Some(Ok(self.stop_sequence()));
            return ControlFlow::Break(());
        }
        ControlFlow::Continue(())
    }

    fn stepped(&mut self) {
        self.metrics.decode_steps.fetch_add(1, Ordering::Relaxed);
    }
}

/// The stop string that starts where the emitted text ends.
fn matched_stop(stops: &[String], fed: &str, emitted: &str) -> String {
    let rest = fed.get(emitted.len()..).unwrap_or_default();
    stops
        .iter()
        .filter(|s| !s.is_empty())
        .find(|s| rest.starts_with(s.as_str()))
        .cloned()
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_stop_string_that_cut_the_text() {
        let stops = ["END".to_string(), "\n\n".to_string()];
        assert_eq!(matched_stop(&stops, "abc\n\nxEND", "abc"), "\n\n");
        assert_eq!(matched_stop(&stops, "abENDc", "ab"), "END");
    }
}
