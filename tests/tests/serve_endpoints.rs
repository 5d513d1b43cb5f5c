//! The other endpoints: completions, models, health, metrics, openapi, request ids.

mod serve_support;

use mtplx_model::tokenizer::Special;
use serde_json::json;
use serve_support::{call, get, greedy_chat, post_json, state};

#[tokio::test]
async fn completions_continue_a_raw_prompt_streamed_or_not() {
    let state = state();
    let req = json!({"prompt": "The capital of France is", "temperature": 0, "max_tokens": 6});
    let r = call(&state, post_json("/v1/completions", &req)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["object"], "text_completion");
    let text = v["choices"][0]["text"].as_str().unwrap().to_owned();
    assert!(!text.is_empty());
    assert!(v["usage"]["prompt_tokens"].as_u64().unwrap() >= 5);

    let mut streamed = req.clone();
    streamed["stream"] = json!(true);
    let events = call(&state, post_json("/v1/completions", &streamed))
        .await
        .sse_data();
    assert_eq!(events.last().unwrap(), "[DONE]");
    let joined: String = events
        .iter()
        .filter_map(|e| e["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(joined, text);

    // Token ids work as a prompt too, and give the same continuation.
    let ids = state
        .bundle()
        .tokenizer
        .encode("The capital of France is", Special::Parse)
        .unwrap();
    let by_ids = json!({"prompt": ids, "temperature": 0, "max_tokens": 6});
    let v = call(&state, post_json("/v1/completions", &by_ids))
        .await
        .json();
    assert_eq!(v["choices"][0]["text"], text.as_str());
}

#[tokio::test]
async fn models_health_and_openapi_describe_the_server() {
    let state = state();
    let v = call(&state, get("/v1/models")).await.json();
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], state.model_id());
    assert_eq!(v["data"][0]["context_window"], 1024);
    let one = call(&state, get(&format!("/v1/models/{}", state.model_id()))).await;
    assert_eq!(one.status, 200);
    let missing = call(&state, get("/v1/models/gpt-9")).await;
    assert_eq!(missing.status, 404);
    assert_eq!(missing.error_code(), "model_not_found");
    let h = call(&state, get("/health")).await;
    assert_eq!(h.status, 200);
    assert_eq!(h.json()["status"], "ok");
    let doc = call(&state, get("/openapi.json")).await.json();
    assert_eq!(doc["openapi"], "3.1.0");
    assert!(doc["paths"]["/v1/chat/completions"]["post"].is_object());
}

#[tokio::test]
async fn metrics_count_requests_tokens_and_latencies() {
    let state = state();
    let ok = call(
        &state,
        post_json("/v1/chat/completions", &greedy_chat("Hi", 4)),
    )
    .await;
    let tokens = ok.json()["usage"]["completion_tokens"].as_u64().unwrap();
    let bad = call(
        &state,
        post_json("/v1/chat/completions", &json!({"messages": []})),
    )
    .await;
    assert_eq!(bad.status, 400);
    let r = call(&state, get("/metrics")).await;
    assert_eq!(r.status, 200);
    assert!(r.headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain"));
    let text = r.text();
    for line in [
        "mtplx_requests_total{route=\"/v1/chat/completions\",status=\"200\"} 1".to_string(),
        "mtplx_requests_total{route=\"/v1/chat/completions\",status=\"400\"} 1".to_string(),
        format!("mtplx_completion_tokens_total {tokens}"),
        "mtplx_ttft_seconds_count 1".to_string(),
        "# TYPE mtplx_decode_tokens_per_second histogram".to_string(),
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing `{line}` in\n{text}"
        );
    }
}

#[tokio::test]
async fn request_ids_are_echoed_and_name_the_completion() {
    let state = state();
    let mut req = post_json("/v1/chat/completions", &greedy_chat("Hi", 2));
    req.headers_mut()
        .insert("x-request-id", "test-req-42".parse().unwrap());
    let r = call(&state, req).await;
    assert_eq!(r.headers["x-request-id"], "test-req-42");
    assert_eq!(r.json()["id"], "chatcmpl-test-req-42");
    let r = call(&state, get("/health")).await;
    assert_eq!(r.headers["x-request-id"].len(), 36);
}
