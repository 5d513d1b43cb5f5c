//! `POST /v1/messages` and `/v1/messages/count_tokens` (Anthropic), through the app.

mod serve_support;

use serde_json::{json, Value};
use serve_support::{call, post_json, state};

fn messages(content: &str, max_tokens: u32) -> Value {
    json!({
        "model": "SmolLM2-135M-Instruct",
        "max_tokens": max_tokens,
        "temperature": 0,
        "messages": [{"role": "user", "content": content}],
    })
}

#[tokio::test]
async fn messages_answer_whole_and_streamed_alike() {
    let state = state();
    let req = messages("What is the capital of France?", 24);
    let r = call(&state, post_json("/v1/messages", &req)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["type"], "message");
    assert_eq!(v["role"], "assistant");
    assert!(v["id"].as_str().unwrap().starts_with("msg_"));
    let text = v["content"][0]["text"].as_str().unwrap().to_owned();
    assert!(text.contains("Paris"), "{text}");
    assert_eq!(v["stop_reason"], "end_turn");
    assert!(v["usage"]["input_tokens"].as_u64().unwrap() > 5);
    assert_eq!(v["usage"]["cache_read_input_tokens"], 0);

    let mut streamed = req.clone();
    streamed["stream"] = json!(true);
    let r = call(&state, post_json("/v1/messages", &streamed)).await;
    assert_eq!(r.headers["content-type"], "text/event-stream");
    let raw = r.text();
    let names: Vec<&str> = raw
        .lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect();
    assert_eq!(names.first(), Some(&"message_start"));
    assert_eq!(&names[names.len() - 2..], ["message_delta", "message_stop"]);
    let events = r.sse_data();
    let joined: String = events
        .iter()
        .filter(|e| e["type"] == "content_block_delta")
        .filter_map(|e| e["delta"]["text"].as_str())
        .collect();
    assert_eq!(joined, text);
    let delta = events
        .iter()
        .find(|e| e["type"] == "message_delta")
        .unwrap();
    assert_eq!(delta["delta"]["stop_reason"], "end_turn");
    assert_eq!(delta["usage"]["output_tokens"], v["usage"]["output_tokens"]);
}

#[tokio::test]
async fn stop_sequences_and_limits_set_the_stop_reason() {
    let state = state();
    let mut req = messages("What is the capital of France?", 24);
    req["stop_sequences"] = json!(["Paris"]);
    let v = call(&state, post_json("/v1/messages", &req)).await.json();
    assert_eq!(v["stop_reason"], "stop_sequence");
    assert_eq!(v["stop_sequence"], "Paris");
    assert!(!v["content"][0]["text"].as_str().unwrap().contains("Paris"));
    let v = call(
        &state,
        post_json("/v1/messages", &messages("Tell me a long story.", 2)),
    )
    .await
    .json();
    assert_eq!(v["stop_reason"], "max_tokens");
    assert_eq!(v["usage"]["output_tokens"], 2);
}

#[tokio::test]
async fn count_tokens_matches_the_prompt_the_model_sees() {
    let state = state();
    let req = json!({
        "model": "SmolLM2-135M-Instruct",
        "system": "You are terse.",
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
    });
    let counted = call(&state, post_json("/v1/messages/count_tokens", &req)).await;
    assert_eq!(counted.status, 200, "{}", counted.text());
    let n = counted.json()["input_tokens"].as_u64().unwrap();
    let mut gen = req.clone();
    gen["max_tokens"] = json!(1);
    let v = call(&state, post_json("/v1/messages", &gen)).await.json();
    assert_eq!(v["usage"]["input_tokens"].as_u64().unwrap(), n);
}

#[tokio::test]
async fn errors_come_in_anthropic_shape() {
    let state = state();
    let mut no_max = messages("hi", 1);
    no_max.as_object_mut().unwrap().remove("max_tokens");
    let r = call(&state, post_json("/v1/messages", &no_max)).await;
    assert_eq!(r.status, 400);
    let v = r.json();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("max_tokens"));
    let mut unknown = messages("hi", 1);
    unknown["model"] = json!("claude-opus-4");
    let r = call(&state, post_json("/v1/messages", &unknown)).await;
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["error"]["type"], "not_found_error");
    let image = json!({"max_tokens": 1, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]});
    let r = call(&state, post_json("/v1/messages", &image)).await;
    assert_eq!(r.status, 400);
}
