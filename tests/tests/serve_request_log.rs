//! The request log: one JSON line per generation request with a fixed schema, numbers and
//! hashes only, never the prompt or the answer.

mod serve_support;

use mtplx_serve::Settings;
use serde_json::{json, Value};
use serve_support::{call, greedy_chat, post_json, settings, state_with};

/// Every field and its JSON type (`number?` = number or null).
const SCHEMA: &[(&str, &str)] = &[
    ("ts", "number"),
    ("request_id", "string"),
    ("endpoint", "string"),
    ("status", "number"),
    ("error_code", "string?"),
    ("prompt_hash", "string?"),
    ("prompt_tokens", "number"),
    ("cached_tokens", "number"),
    ("new_prefill_tokens", "number"),
    ("completion_tokens", "number"),
    ("ttft_s", "number?"),
    ("prompt_tps", "number?"),
    ("decode_tok_s", "number?"),
    ("finish_reason", "string?"),
    ("cache_source", "string"),
    ("session_restore_mode", "string"),
    ("cache_miss_reason", "string?"),
    ("ssd_cached_tokens", "number?"),
    ("entry_prefix_len", "number?"),
    ("ram_entry_state", "string?"),
    ("prefix_divergence_token", "number?"),
    ("refused_candidates", "string?"),
    ("restore_s", "number?"),
    ("ssd_read", "object?"),
    ("session_source", "string?"),
    ("session_hash", "string?"),
    ("bank_committed", "bool?"),
    ("refusal_reason", "string?"),
    ("retry_when", "string?"),
    ("generation_mode", "string?"),
    ("proposer", "string?"),
    ("drafted_by_depth", "array"),
    ("accepted_by_depth", "array"),
    ("verify_calls", "number"),
    ("mean_acceptance_length", "number?"),
];

fn type_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Bool(_) => "bool",
        Value::Array(a) if a.iter().all(Value::is_u64) => "array",
        Value::Object(_) => "object",
        _ => "other",
    }
}

fn check_schema(line: &Value) {
    let obj = line.as_object().unwrap();
    let mut keys: Vec<&str> = obj.keys().map(String::as_str).collect();
    let mut want: Vec<&str> = SCHEMA.iter().map(|(k, _)| *k).collect();
    keys.sort_unstable();
    want.sort_unstable();
    assert_eq!(keys, want, "{line}");
    for (k, ty) in SCHEMA {
        let got = type_of(&obj[*k]);
        let ok = match ty.strip_suffix('?') {
            Some(base) => got == base || got == "null",
            None => got == *ty,
        };
        assert!(ok, "{k}: {got} is not {ty} in {line}");
    }
}

#[tokio::test]
async fn lines_follow_the_schema_and_never_hold_text() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("logs/request-log-test.jsonl");
    let state = state_with(Settings {
        request_log: Some(path.clone()),
        ..settings()
    });
    let secret = "zebra-marmalade-7731";
    let mut req = greedy_chat(&format!("Repeat after me: {secret}"), 12);
    let mut r = post_json("/v1/chat/completions", &req);
    r.headers_mut()
        .insert("x-request-id", "log-ok".parse().unwrap());
    let ok = call(&state, r).await;
    assert_eq!(ok.status, 200);
    let answer = ok.json()["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    req["model"] = json!("unknown-model");
    let mut r = post_json("/v1/chat/completions", &req);
    r.headers_mut()
        .insert("x-request-id", "log-404".parse().unwrap());
    assert_eq!(call(&state, r).await.status, 404);
    let r = call(
        &state,
        post_json(
            "/v1/completions",
            &json!({"prompt": secret, "max_tokens": 2, "temperature": 0}),
        ),
    )
    .await;
    assert_eq!(r.status, 200);

    let text = std::fs::read_to_string(&path).unwrap();
    assert!(!text.contains(secret), "the prompt leaked into the log");
    assert!(
        answer.len() < 8 || !text.contains(answer.trim()),
        "the answer leaked"
    );
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3, "{text}");
    lines.iter().for_each(check_schema);

    let ok = &lines[0];
    assert_eq!(ok["request_id"], "log-ok");
    assert_eq!(ok["endpoint"], "/v1/chat/completions");
    assert_eq!(ok["status"], 200);
    assert!(ok["prompt_tokens"].as_u64().unwrap() > 10);
    assert_eq!(ok["new_prefill_tokens"], ok["prompt_tokens"]);
    assert_eq!(ok["cached_tokens"], 0);
    assert!(ok["completion_tokens"].as_u64().unwrap() >= 1);
    assert!(ok["ttft_s"].as_f64().unwrap() > 0.0);
    assert!(ok["prompt_tps"].as_f64().unwrap() > 0.0);
    assert_eq!(ok["prompt_hash"].as_str().unwrap().len(), 32);
    assert_eq!(
        (
            &ok["cache_source"],
            &ok["session_restore_mode"],
            &ok["cache_miss_reason"]
        ),
        (&json!("none"), &json!("cold"), &json!("new_session"))
    );

    let refused = &lines[1];
    assert_eq!(refused["request_id"], "log-404");
    assert_eq!(refused["status"], 404);
    assert_eq!(refused["error_code"], "model_not_found");
    assert_eq!(refused["completion_tokens"], 0);

    assert_eq!(lines[2]["endpoint"], "/v1/completions");
    assert_eq!(lines[2]["completion_tokens"], 2);
    assert_eq!(lines[2]["finish_reason"], "length");
}
