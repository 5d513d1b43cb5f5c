//! A few tests over a real socket (127.0.0.1:0), with a raw HTTP/1.1 client, so what is
//! checked is what goes over the wire.

mod serve_support;

use mtplx_serve::Settings;
use serde_json::json;
use serve_support::socket::{fetch, send, start};
use serve_support::{eventually, greedy_chat, settings, state, state_with};
use tokio::io::AsyncReadExt;

#[tokio::test]
async fn health_and_a_greedy_chat_over_tcp() {
    let addr = start(state()).await;
    let r = fetch(addr, "GET", "/health", &[], b"").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["status"], "ok");
    assert!(r.headers.contains_key("x-request-id"));
    let body = greedy_chat("What is the capital of France?", 24).to_string();
    let r = fetch(
        addr,
        "POST",
        "/v1/chat/completions",
        &[("content-type", "application/json")],
        body.as_bytes(),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.headers["content-type"], "application/json");
    let content = r.json()["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(content.contains("Paris"), "{content}");
}

#[tokio::test]
async fn streams_are_chunked_server_sent_events() {
    let addr = start(state()).await;
    let mut req = greedy_chat("Say hello.", 8);
    req["stream"] = json!(true);
    let r = fetch(
        addr,
        "POST",
        "/v1/chat/completions",
        &[],
        req.to_string().as_bytes(),
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["content-type"], "text/event-stream");
    assert_eq!(r.headers["transfer-encoding"], "chunked");
    let events = r.sse_data();
    assert_eq!(events.last().unwrap(), "[DONE]");
    assert!(events.len() >= 3);
}

#[tokio::test]
async fn a_client_that_hangs_up_cancels_its_generation() {
    let state = state();
    let addr = start(state.clone()).await;
    let mut req = greedy_chat("Write a long story about a dragon.", 900);
    req["stream"] = json!(true);
    req["ignore_eos"] = json!(true);
    let mut conn = send(
        addr,
        "POST",
        "/v1/chat/completions",
        &[],
        req.to_string().as_bytes(),
    )
    .await;
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while seen.windows(8).filter(|w| w == b"content\"").count() < 3 {
        let n = conn.read(&mut buf).await.unwrap();
        assert!(n > 0, "the stream ended early");
        seen.extend_from_slice(&buf[..n]);
    }
    drop(conn);
    let metrics = state.metrics().clone();
    eventually("the engine to notice the hang-up", || {
        metrics.generations("cancelled") == 1
    })
    .await;
    let steps = metrics
        .decode_steps
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(steps < 900, "the generation ran to the end: {steps} steps");
}

#[tokio::test]
async fn keys_and_bad_bodies_over_tcp() {
    let addr = start(state_with(Settings {
        api_key: Some("k-123".into()),
        max_body_bytes: 256,
        ..settings()
    }))
    .await;
    let r = fetch(addr, "GET", "/v1/models", &[], b"").await;
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["error"]["code"], "invalid_api_key");
    let r = fetch(
        addr,
        "GET",
        "/v1/models",
        &[("authorization", "Bearer k-123")],
        b"",
    )
    .await;
    assert_eq!(r.status, 200);
    let auth = [("x-api-key", "k-123")];
    let r = fetch(
        addr,
        "POST",
        "/v1/chat/completions",
        &auth,
        b"{\"messages\": [",
    )
    .await;
    assert_eq!(r.status, 400);
    let r = fetch(addr, "POST", "/v1/chat/completions", &auth, &[b'x'; 1000]).await;
    assert_eq!(r.status, 413);
}

#[tokio::test]
async fn hanging_up_on_a_non_streamed_request_cancels_it_too() {
    let state = state();
    let addr = start(state.clone()).await;
    let mut req = greedy_chat("Write a long story about a dragon.", 900);
    req["ignore_eos"] = json!(true);
    let conn = send(
        addr,
        "POST",
        "/v1/chat/completions",
        &[],
        req.to_string().as_bytes(),
    )
    .await;
    let metrics = state.metrics().clone();
    let steps = || {
        metrics
            .decode_steps
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    eventually("the generation to start", || steps() > 2).await;
    drop(conn);
    eventually("the engine to notice the hang-up", || {
        metrics.generations("cancelled") == 1
    })
    .await;
    assert!(
        steps() < 900,
        "the generation ran to the end: {} steps",
        steps()
    );
}
