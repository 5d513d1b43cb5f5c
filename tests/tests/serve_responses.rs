//! `POST /v1/responses` (stateless), through the app.

mod serve_support;

use serde_json::{json, Value};
use serve_support::{call, post_json, state};

fn output_text(response: &Value) -> String {
    response["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["type"] == "message")
        .flat_map(|i| i["content"].as_array().unwrap())
        .filter_map(|c| c["text"].as_str())
        .collect()
}

#[tokio::test]
async fn responses_answer_whole_and_streamed_alike() {
    let state = state();
    let req = json!({
        "model": "SmolLM2-135M-Instruct",
        "instructions": "Answer in one sentence.",
        "input": "What is the capital of France?",
        "temperature": 0,
        "max_output_tokens": 24,
    });
    let r = call(&state, post_json("/v1/responses", &req)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["object"], "response");
    assert!(v["id"].as_str().unwrap().starts_with("resp_"));
    let text = output_text(&v);
    assert!(text.contains("Paris"), "{v}");
    assert_eq!(v["status"], "completed");
    let u = &v["usage"];
    assert_eq!(
        u["total_tokens"].as_u64(),
        Some(u["input_tokens"].as_u64().unwrap() + u["output_tokens"].as_u64().unwrap())
    );

    let mut streamed = req.clone();
    streamed["stream"] = json!(true);
    let events = call(&state, post_json("/v1/responses", &streamed))
        .await
        .sse_data();
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(&kinds[..2], ["response.created", "response.in_progress"]);
    assert_eq!(kinds.last(), Some(&"response.completed"));
    let seq: Vec<u64> = events
        .iter()
        .map(|e| e["sequence_number"].as_u64().unwrap())
        .collect();
    assert_eq!(seq, (0..events.len() as u64).collect::<Vec<_>>());
    let joined: String = events
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .filter_map(|e| e["delta"].as_str())
        .collect();
    assert_eq!(joined, text);
    let done = events.last().unwrap();
    assert_eq!(output_text(&done["response"]), text);
}

#[tokio::test]
async fn item_lists_with_function_calls_are_accepted() {
    let state = state();
    let req = json!({
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "What is the weather in Paris?"}]},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny, 21 C"}
        ],
        "tools": [{"type": "function", "name": "get_weather", "description": "Weather for a city",
                   "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}],
        "temperature": 0,
        "max_output_tokens": 3,
    });
    let r = call(&state, post_json("/v1/responses", &req)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["tools"][0]["name"], "get_weather");
    assert!(matches!(
        v["status"].as_str(),
        Some("completed" | "incomplete")
    ));
    assert!(v["usage"]["output_tokens"].as_u64().unwrap() <= 3);
}

#[tokio::test]
async fn stateful_requests_and_hosted_tools_are_400() {
    let state = state();
    let r = call(
        &state,
        post_json(
            "/v1/responses",
            &json!({"input": "hi", "previous_response_id": "resp_x"}),
        ),
    )
    .await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["param"], "previous_response_id");
    let r = call(
        &state,
        post_json(
            "/v1/responses",
            &json!({"input": "hi", "tools": [{"type": "web_search"}]}),
        ),
    )
    .await;
    assert_eq!(r.status, 400);
    let r = call(
        &state,
        post_json(
            "/v1/responses",
            &json!({"input": "hi", "max_output_tokens": 0}),
        ),
    )
    .await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["param"], "max_output_tokens");
    let r = call(&state, post_json("/v1/responses", &json!({"input": []}))).await;
    assert_eq!(r.status, 400);
}
