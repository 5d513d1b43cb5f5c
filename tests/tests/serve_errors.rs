//! Bad input gets the OpenAI error JSON with the right status, never a 500, and the server
//! keeps serving afterwards.

mod serve_support;

use http::Method;
use http_body_util::BodyExt;
use mtplx_serve::Settings;
use serde_json::{json, Value};
use serve_support::{
    call, get, greedy_chat, post_json, request, settings, state, state_with, Reply,
};

const CHAT: &str = "/v1/chat/completions";

fn assert_error(r: &Reply, status: u16, code: Option<&str>) {
    assert_eq!(r.status.as_u16(), status, "{}", r.text());
    assert_eq!(r.headers["content-type"], "application/json");
    let e = &r.json()["error"];
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{e}");
    assert!(e["type"].is_string(), "{e}");
    assert!(e.get("param").is_some() && e.get("code").is_some(), "{e}");
    if let Some(code) = code {
        assert_eq!(e["code"], code);
    }
}

#[tokio::test]
async fn malformed_json_and_wrong_types_are_400() {
    let state = state();
    for body in ["{", "not json", "[]", "null", "{\"messages\": \"hi\"}"] {
        let r = call(&state, request(Method::POST, CHAT, body)).await;
        assert_error(&r, 400, None);
    }
    for (field, value) in [
        ("temperature", json!("hot")),
        ("max_tokens", json!(1.5)),
        ("stop", json!(5)),
        ("seed", json!("x")),
        ("stream", json!("yes")),
        ("messages", json!([{"content": "no role"}])),
    ] {
        let mut req = greedy_chat("hi", 4);
        req[field] = value;
        let r = call(&state, post_json(CHAT, &req)).await;
        assert_error(&r, 400, None);
    }
    let r = call(&state, post_json("/v1/completions", &json!({"prompt": 5}))).await;
    assert_error(&r, 400, None);
}

#[tokio::test]
async fn out_of_range_parameters_are_400_naming_the_field() {
    let state = state();
    for (field, value) in [
        ("max_tokens", json!(0)),
        ("max_tokens", json!(-5)),
        ("max_completion_tokens", json!(0)),
        ("temperature", json!(-1)),
        ("top_p", json!(1.5)),
        ("top_k", json!(-7)),
        ("n", json!(2)),
    ] {
        let mut req = greedy_chat("hi", 4);
        req[field] = value;
        let r = call(&state, post_json(CHAT, &req)).await;
        assert_error(&r, 400, None);
        assert_eq!(r.json()["error"]["param"], field);
    }
    let r = call(&state, post_json(CHAT, &json!({"messages": []}))).await;
    assert_error(&r, 400, None);
    assert_eq!(r.json()["error"]["param"], "messages");
    let r = call(
        &state,
        post_json("/v1/completions", &json!({"prompt": "a", "max_tokens": 0})),
    )
    .await;
    assert_error(&r, 400, None);
}

#[tokio::test]
async fn unknown_models_are_404() {
    let state = state();
    let mut req = greedy_chat("hi", 4);
    req["model"] = json!("gpt-4o");
    let r = call(&state, post_json(CHAT, &req)).await;
    assert_error(&r, 404, Some("model_not_found"));
    assert_eq!(r.json()["error"]["param"], "model");
    let r = call(
        &state,
        post_json("/v1/completions", &json!({"model": "x", "prompt": "a"})),
    )
    .await;
    assert_error(&r, 404, Some("model_not_found"));
}

#[tokio::test]
async fn prompts_over_the_context_window_are_400_context_length_exceeded() {
    let state = state_with(Settings {
        context_window: Some(64),
        ..settings()
    });
    let long = "word ".repeat(200);
    let r = call(&state, post_json(CHAT, &greedy_chat(&long, 4))).await;
    assert_error(&r, 400, Some("context_length_exceeded"));
    let r = call(
        &state,
        post_json("/v1/completions", &json!({"prompt": long})),
    )
    .await;
    assert_error(&r, 400, Some("context_length_exceeded"));
    // A prompt that fits gets its max_tokens capped to the room left, not refused.
    let r = call(&state, post_json(CHAT, &greedy_chat("Hi", 100_000))).await;
    assert_eq!(r.status, 200, "{}", r.text());
}

#[tokio::test]
async fn bodies_over_the_limit_are_413_declared_or_not() {
    let state = state_with(Settings {
        max_body_bytes: 1024,
        ..settings()
    });
    let big = greedy_chat(&"x".repeat(4000), 4).to_string();
    let mut declared = request(Method::POST, CHAT, big.clone());
    declared
        .headers_mut()
        .insert("content-length", big.len().to_string().parse().unwrap());
    assert_error(
        &call(&state, declared).await,
        413,
        Some("request_too_large"),
    );
    let undeclared = request(Method::POST, CHAT, big);
    assert_error(
        &call(&state, undeclared).await,
        413,
        Some("request_too_large"),
    );
}

#[tokio::test]
async fn a_wrong_or_missing_key_is_401() {
    let state = state_with(Settings {
        api_key: Some("sekrit".into()),
        ..settings()
    });
    let req = || post_json(CHAT, &greedy_chat("Hi", 1));
    assert_error(&call(&state, req()).await, 401, Some("invalid_api_key"));
    let mut wrong = req();
    wrong
        .headers_mut()
        .insert("authorization", "Bearer nope".parse().unwrap());
    assert_error(&call(&state, wrong).await, 401, Some("invalid_api_key"));
    assert_error(&call(&state, get("/v1/models")).await, 401, None);
    let mut right = req();
    right
        .headers_mut()
        .insert("authorization", "Bearer sekrit".parse().unwrap());
    assert_eq!(call(&state, right).await.status, 200);
    let mut anthropic_style = get("/v1/models");
    anthropic_style
        .headers_mut()
        .insert("x-api-key", "sekrit".parse().unwrap());
    assert_eq!(call(&state, anthropic_style).await.status, 200);
    assert_eq!(call(&state, get("/health")).await.status, 200);
}

#[tokio::test]
async fn too_many_active_requests_is_503_with_retry_after() {
    let state = state_with(Settings {
        max_active_requests: 1,
        ..settings()
    });
    let app = mtplx_serve::app(state.clone());
    let mut long = greedy_chat("Write a long story.", 500);
    long["stream"] = json!(true);
    long["ignore_eos"] = json!(true);
    use tower::ServiceExt;
    let held = app.clone().oneshot(post_json(CHAT, &long)).await.unwrap();
    assert_eq!(held.status(), 200);
    let r = call(&state, post_json(CHAT, &greedy_chat("Hi", 1))).await;
    assert_error(&r, 503, Some("server_overloaded"));
    assert_eq!(r.headers["retry-after"], "1");
    // Cheap routes are not limited.
    assert_eq!(call(&state, get("/health")).await.status, 200);
    // Ending the first stream frees its slot.
    let mut body = held.into_body();
    let first = body.frame().await.unwrap().unwrap();
    assert!(first.is_data());
    drop(body);
    let r = call(&state, post_json(CHAT, &greedy_chat("Hi", 1))).await;
    assert_eq!(r.status, 200, "{}", r.text());
}

#[tokio::test]
async fn unknown_routes_are_404_and_wrong_methods_405() {
    let state = state();
    assert_error(
        &call(&state, get("/v2/nothing")).await,
        404,
        Some("unknown_url"),
    );
    assert_error(&call(&state, get(CHAT)).await, 405, None);
    assert_error(
        &call(&state, request(Method::DELETE, "/v1/models", "")).await,
        405,
        None,
    );
}

#[tokio::test]
async fn errors_lose_nothing_the_next_request_is_served() {
    let state = state();
    for body in [
        "{",
        "{\"messages\": []}",
        "{\"messages\": [{\"role\": \"user\", \"content\": 5}]}",
    ] {
        let r = call(&state, request(Method::POST, CHAT, body)).await;
        assert_eq!(r.status, 400);
    }
    let r = call(
        &state,
        post_json(CHAT, &greedy_chat("What is the capital of France?", 16)),
    )
    .await;
    assert_eq!(r.status, 200);
    let content: Value = r.json()["choices"][0]["message"]["content"].clone();
    assert!(content.as_str().unwrap().contains("Paris"), "{content}");
    assert_eq!(state.metrics().requests(CHAT, 400), 3);
}
