//! `POST /v1/chat/completions` with the real default model, through the app (no socket).

mod serve_support;

use serde_json::{json, Value};
use serve_support::{call, greedy_chat, post_json, state};

const CHAT: &str = "/v1/chat/completions";

#[tokio::test]
async fn greedy_chat_knows_the_capital_of_france() {
    let state = state();
    let r = call(
        &state,
        post_json(CHAT, &greedy_chat("What is the capital of France?", 24)),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let content = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(content.contains("Paris"), "{content}");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], state.model_id());
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    let u = &v["usage"];
    let (p, c) = (
        u["prompt_tokens"].as_u64().unwrap(),
        u["completion_tokens"].as_u64().unwrap(),
    );
    assert!(p > 5 && c > 0 && c <= 24, "{u}");
    assert_eq!(u["total_tokens"].as_u64().unwrap(), p + c);
    assert_eq!(u["prompt_tokens_details"]["cached_tokens"], 0);
}

/// The content of every `delta` in a chat stream, concatenated.
fn streamed_content(events: &[Value]) -> String {
    events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
        .collect()
}

#[tokio::test]
async fn streamed_chunks_add_up_to_the_non_streamed_answer() {
    let state = state();
    let mut req = greedy_chat("Name three colours.", 20);
    let whole = call(&state, post_json(CHAT, &req)).await.json();
    req["stream"] = json!(true);
    req["stream_options"] = json!({"include_usage": true});
    let r = call(&state, post_json(CHAT, &req)).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["content-type"], "text/event-stream");
    let events = r.sse_data();
    assert_eq!(events.last().unwrap(), "[DONE]");
    assert_eq!(events[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(events[..events.len() - 1]
        .iter()
        .all(|e| e["object"] == "chat.completion.chunk" && e["id"] == events[0]["id"]));
    assert_eq!(
        streamed_content(&events),
        whole["choices"][0]["message"]["content"].as_str().unwrap()
    );
    let finish: Vec<&Value> = events
        .iter()
        .map(|e| &e["choices"][0]["finish_reason"])
        .filter(|f| !f.is_null())
        .collect();
    assert_eq!(finish, [&whole["choices"][0]["finish_reason"]]);
    let usage = &events[events.len() - 2]["usage"];
    assert_eq!(usage, &whole["usage"]);
}

#[tokio::test]
async fn a_stop_string_cuts_the_text_before_it() {
    let state = state();
    let q = "What is the capital of France?";
    let full = call(&state, post_json(CHAT, &greedy_chat(q, 24)))
        .await
        .json();
    let full = full["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    let at = full
        .find("Paris")
        .expect("the unstopped answer names Paris");
    for stop in [json!("Paris"), json!(["nothing-like-this", "Paris"])] {
        let mut req = greedy_chat(q, 24);
        req["stop"] = stop;
        let v = call(&state, post_json(CHAT, &req)).await.json();
        assert_eq!(v["choices"][0]["message"]["content"], full[..at]);
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
    }
}

#[tokio::test]
async fn token_limits_end_the_answer_with_length() {
    let state = state();
    for field in ["max_tokens", "max_completion_tokens"] {
        let mut req = greedy_chat("Write a long story about a dragon.", 1000);
        req.as_object_mut().unwrap().remove("max_tokens");
        req[field] = json!(3);
        let v = call(&state, post_json(CHAT, &req)).await.json();
        assert_eq!(v["usage"]["completion_tokens"], 3, "{field}");
        assert_eq!(v["choices"][0]["finish_reason"], "length", "{field}");
    }
}

#[tokio::test]
async fn seeded_sampling_repeats_and_all_sampling_fields_are_taken() {
    let state = state();
    let req = json!({
        "messages": [{"role": "user", "content": "Tell me a fact."}],
        "temperature": 1.0, "top_p": 0.9, "top_k": 40, "min_p": 0.05,
        "presence_penalty": 0.5, "frequency_penalty": 0.5, "repetition_penalty": 1.1,
        "seed": 7, "max_tokens": 10,
    });
    let a = call(&state, post_json(CHAT, &req)).await;
    let b = call(&state, post_json(CHAT, &req)).await;
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(
        a.json()["choices"][0]["message"]["content"],
        b.json()["choices"][0]["message"]["content"]
    );
}

#[tokio::test]
async fn tools_are_accepted_and_plain_answers_stay_content() {
    let state = state();
    let mut req = greedy_chat("Say hello.", 12);
    req["tools"] = json!([{
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather for a city",
                     "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
    }]);
    req["tool_choice"] = json!("auto");
    let v = call(&state, post_json(CHAT, &req)).await.json();
    let choice = &v["choices"][0];
    let calls = choice["message"]["tool_calls"]
        .as_array()
        .map_or(0, Vec::len);
    // Whatever the small model says, the reply is well formed: either text, or parsed
    // calls with finish_reason tool_calls.
    if calls == 0 {
        assert!(choice["message"]["content"].is_string(), "{v}");
        assert_ne!(choice["finish_reason"], "tool_calls");
    } else {
        assert_eq!(choice["finish_reason"], "tool_calls");
    }
    // The tool preamble made the prompt longer than the same request without tools.
    let plain = call(&state, post_json(CHAT, &greedy_chat("Say hello.", 1)))
        .await
        .json();
    assert!(
        v["usage"]["prompt_tokens"].as_u64() > plain["usage"]["prompt_tokens"].as_u64(),
        "{v}"
    );
}

fn weather_request(choice: Value, stream: bool) -> Value {
    let mut req = greedy_chat("What is the weather like in Paris today?", 40);
    req["tools"] = json!([{
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather for a city",
                     "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
    }, {
        "type": "function",
        "function": {"name": "get_time", "description": "The time in a city",
                     "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
    }]);
    req["tool_choice"] = choice;
    req["stream"] = json!(stream);
    req
}

#[tokio::test]
async fn a_named_tool_choice_forces_a_call_to_that_function() {
    let state = state();
    let choice = json!({"type": "function", "function": {"name": "get_time"}});
    let r = call(
        &state,
        post_json(CHAT, &weather_request(choice.clone(), false)),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let c = &v["choices"][0];
    assert_eq!(c["finish_reason"], "tool_calls", "{v}");
    let call0 = &c["message"]["tool_calls"][0]["function"];
    assert_eq!(call0["name"], "get_time", "{v}");
    let args: Value = serde_json::from_str(call0["arguments"].as_str().unwrap()).unwrap();
    assert!(args.is_object(), "{v}");

    // Streamed, the same call arrives as a tool_calls delta.
    let s = call(&state, post_json(CHAT, &weather_request(choice, true))).await;
    let events = s.sse_data();
    let streamed: Vec<&Value> = events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["tool_calls"].get(0))
        .collect();
    assert_eq!(streamed.len(), 1, "{}", s.text());
    assert_eq!(streamed[0]["function"]["name"], "get_time");
    assert_eq!(streamed[0]["function"]["arguments"], call0["arguments"]);

    // `required` with one tool calls it; unknown names are refused.
    let mut one = weather_request(json!("required"), false);
    one["tools"].as_array_mut().unwrap().truncate(1);
    let v = call(&state, post_json(CHAT, &one)).await.json();
    assert_eq!(
        v["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "get_weather",
        "{v}"
    );
    let bad = json!({"type": "function", "function": {"name": "launch"}});
    let r = call(&state, post_json(CHAT, &weather_request(bad, false))).await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["param"], "tool_choice");
}
