//! `generation_mode`: speculative decoding through the server gives the same text as plain
//! decoding, reports what it drafted, and `ar` / `--depth 0` turn it off.

mod serve_support;

use serde_json::{json, Value};
use serve_support::{call, log_lines, post_json, settings, state_with};

const CHAT: &str = "/v1/chat/completions";

/// A prompt whose answer copies from the context, so prompt lookup has drafts to offer.
fn copy_prompt(mode: &str) -> Value {
    let code = "fn add(a: i32, b: i32) -> i32 {\n    a + b\n}\n\nfn sub(a: i32, b: i32) -> i32 {\n    a - b\n}\n";
    json!({
        "messages": [{"role": "user", "content": format!(
            "Repeat this Rust code exactly, then stop:\n\n{code}")}],
        "max_tokens": 48,
        "temperature": 0,
        "generation_mode": mode,
    })
}

#[tokio::test]
async fn speculative_and_plain_decoding_give_the_same_text() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log.jsonl");
    let state = state_with(mtplx_serve::Settings {
        request_log: Some(log.clone()),
        ..settings()
    });
    let plain = call(&state, post_json(CHAT, &copy_prompt("ar"))).await;
    let spec = call(&state, post_json(CHAT, &copy_prompt("mtp"))).await;
    assert_eq!(plain.status, 200, "{}", plain.text());
    assert_eq!(spec.status, 200, "{}", spec.text());
    let text = |v: &Value| {
        v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert_eq!(text(&spec.json()), text(&plain.json()));
    assert_eq!(spec.json()["usage"], plain.json()["usage"]);

    let lines = log_lines(&log);
    assert_eq!(lines[0]["generation_mode"], "ar");
    assert_eq!(lines[0]["verify_calls"], 0);
    assert_eq!(lines[1]["generation_mode"], "mtp");
    assert_eq!(lines[1]["proposer"], "lookup");
    let drafted = lines[1]["drafted_by_depth"].as_array().unwrap();
    let accepted = lines[1]["accepted_by_depth"].as_array().unwrap();
    assert!(
        !drafted.is_empty(),
        "the copy prompt drafted nothing: {}",
        lines[1]
    );
    assert!(
        accepted.iter().any(|a| a.as_u64().unwrap() > 0),
        "no draft accepted on a copying answer: {}",
        lines[1]
    );
    assert!(lines[1]["verify_calls"].as_u64().unwrap() > 0);
    let metrics = call(&state, serve_support::get("/metrics")).await.text();
    assert!(
        metrics.contains("mtplx_spec_accepted_tokens_total{depth=\"1\"}"),
        "{metrics}"
    );
}

#[tokio::test]
async fn depth_zero_turns_speculation_off_and_bad_modes_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log.jsonl");
    let mut s = settings();
    s.request_log = Some(log.clone());
    s.speculation.depth = 0;
    let state = state_with(s);
    let r = call(&state, post_json(CHAT, &copy_prompt("mtp"))).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(log_lines(&log)[0]["generation_mode"], "ar");

    let bad = call(&state, post_json(CHAT, &copy_prompt("turbo"))).await;
    assert_eq!(bad.status, 400);
    assert_eq!(bad.json()["error"]["param"], "generation_mode");
}

/// A chat answer (nothing to copy): the shipped MTP head drafts, and the text is the plain
/// decoder's, greedy and with a fixed seed.
fn chat_prompt(mode: &str, temperature: f64) -> Value {
    json!({
        "messages": [{"role": "user", "content": "Explain what a compiler does."}],
        "max_tokens": 40,
        "temperature": temperature,
        "seed": 11,
        "generation_mode": mode,
    })
}

#[tokio::test]
async fn the_mtp_head_drafts_through_the_server_and_changes_no_token() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log.jsonl");
    let mut s = mtplx_serve::Settings {
        request_log: Some(log.clone()),
        ..settings()
    };
    s.speculation.head =
        mtplx_serve::HeadSource::File(mtplx_serve::config::SHIPPED_MTP_HEAD.into());
    let state = state_with(s);
    let text = |v: &Value| {
        v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    for temperature in [0.0, 0.8] {
        let plain = call(&state, post_json(CHAT, &chat_prompt("ar", temperature))).await;
        let spec = call(&state, post_json(CHAT, &chat_prompt("mtp", temperature))).await;
        assert_eq!(plain.status, 200, "{}", plain.text());
        assert_eq!(spec.status, 200, "{}", spec.text());
        assert_eq!(
            text(&spec.json()),
            text(&plain.json()),
            "temperature {temperature}"
        );
    }
    let lines = log_lines(&log);
    let greedy = &lines[1];
    assert_eq!(greedy["proposer"], "lookup+mtp");
    let accepted: u64 = greedy["accepted_by_depth"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_u64().unwrap())
        .sum();
    assert!(
        accepted > 0,
        "the head's drafts were never accepted on a chat answer: {greedy}"
    );
}
