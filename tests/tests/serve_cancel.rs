//! A client that goes away cancels its generation within one decode step.

mod serve_support;

use mtplx_model::tokenizer::Special;
use std::sync::atomic::Ordering;
use std::time::Duration;

use http_body_util::BodyExt;
use mtplx_serve::engine::EVENT_BUFFER;
use mtplx_serve::Settings;
use serde_json::json;
use serve_support::{eventually, greedy_chat, post_json, settings, state_with};
use tower::ServiceExt;

#[tokio::test]
async fn dropping_a_stream_stops_the_engine_within_a_step() {
    let state = state_with(settings());
    let mut req = greedy_chat("Write a long story about a dragon.", 900);
    req["stream"] = json!(true);
    req["ignore_eos"] = json!(true);
    let res = mtplx_serve::app(state.clone())
        .oneshot(post_json("/v1/chat/completions", &req))
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let mut body = res.into_body();
    let mut text_events = 0;
    while text_events < 3 {
        let frame = body.frame().await.expect("stream ended early").unwrap();
        let data = frame.into_data().unwrap();
        if std::str::from_utf8(&data)
            .unwrap()
            .contains("\"content\":\"")
        {
            text_events += 1;
        }
    }
    drop(body);
    let metrics = state.metrics().clone();
    eventually("the engine to record the cancellation", || {
        metrics.generations("cancelled") == 1
    })
    .await;
    // The role chunk has empty content and is not counted; every other text event is one
    // step. Beyond what was read: the events buffered in the channel, one blocked send,
    // and at most one step after the drop.
    let steps = metrics.decode_steps.load(Ordering::Relaxed) as usize;
    let read = text_events - 1;
    assert!(
        steps <= read + EVENT_BUFFER + 2,
        "{steps} decode steps after reading {read} tokens"
    );
    assert_eq!(metrics.generations("length"), 0);
    // What was computed before the client left is kept for the conversation.
    let sessions = state.tier().bank().sessions();
    assert_eq!(sessions.len(), 1, "the cancelled turn was not committed");
    let prompt = state
        .bundle()
        .tokenizer
        .encode("Write a long story about a dragon.", Special::AsText)
        .unwrap()
        .len();
    assert!(
        sessions[0].longest_tokens > prompt + read,
        "committed {} tokens",
        sessions[0].longest_tokens
    );
}

#[tokio::test]
async fn a_timed_out_request_cancels_its_generation() {
    let state = state_with(Settings {
        request_timeout: Duration::from_millis(300),
        ..settings()
    });
    let mut req = greedy_chat("Write a long story about a dragon.", 900);
    req["ignore_eos"] = json!(true);
    let r = serve_support::call(&state, post_json("/v1/chat/completions", &req)).await;
    assert_eq!(r.status, 504, "{}", r.text());
    assert_eq!(r.error_code(), "request_timeout");
    let metrics = state.metrics().clone();
    eventually("the engine to record the cancellation", || {
        metrics.generations("cancelled") == 1
    })
    .await;
    let steps = metrics.decode_steps.load(Ordering::Relaxed);
    assert!(steps < 900, "the generation ran to the end: {steps} steps");
}
