//! Arbitrary bytes, arbitrary JSON and mangled valid requests at every POST route: never a
//! panic, never a 5xx. Case counts are small: valid-looking requests reach the real model
//! (with a tiny context window, so generations stay short).

mod serve_support;

use std::sync::OnceLock;

use http::Method;
use mtplx_serve::{AppState, Settings};
use proptest::prelude::*;
use proptest::test_runner::Config;
use serde_json::{json, Map, Value};
use serve_support::{call, request, settings, state_with, Reply};

const ROUTES: &[&str] = &[
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/responses",
];

const FIELDS: &[&str] = &[
    "model",
    "messages",
    "prompt",
    "input",
    "max_tokens",
    "max_completion_tokens",
    "max_output_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "stop_sequences",
    "stream",
    "stream_options",
    "tools",
    "tool_choice",
    "n",
    "system",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "instructions",
];

fn fixture() -> &'static (tokio::runtime::Runtime, AppState) {
    static F: OnceLock<(tokio::runtime::Runtime, AppState)> = OnceLock::new();
    F.get_or_init(|| {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let state = state_with(Settings {
            context_window: Some(96),
            ..settings()
        });
        (rt, state)
    })
}

fn send(path: &str, body: Vec<u8>) -> Reply {
    let (rt, state) = fixture();
    rt.block_on(call(state, request(Method::POST, path, body)))
}

fn check(r: &Reply) -> Result<(), TestCaseError> {
    prop_assert!(
        r.status.is_success() || r.status.is_client_error(),
        "status {}: {}",
        r.status,
        r.text()
    );
    let streaming = r.headers["content-type"] == "text/event-stream";
    if !streaming {
        prop_assert!(
            serde_json::from_slice::<Value>(&r.body).is_ok(),
            "not JSON: {}",
            r.text()
        );
    }
    Ok(())
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        proptest::sample::select(FIELDS).prop_map(str::to_owned),
        "[a-z_]{1,8}",
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        (-3i64..40).prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        ".{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((key(), inner), 0..4)
                .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// A valid request for `route`, then some fields replaced by arbitrary values.
fn mangled(route: &str, edits: Vec<(String, Value)>) -> Value {
    let mut base = match route {
        "/v1/completions" => json!({"prompt": "Hello", "max_tokens": 2}),
        "/v1/responses" => json!({"input": "Hello", "max_output_tokens": 2}),
        "/v1/messages" | "/v1/messages/count_tokens" => {
            json!({"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 2})
        }
        _ => json!({"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 2}),
    };
    for (k, v) in edits {
        base[k] = v;
    }
    base
}

proptest! {
    #![proptest_config(Config { cases: 48, failure_persistence: None, ..Config::default() })]

    #[test]
    fn arbitrary_bytes_are_refused_cleanly(
        route in proptest::sample::select(ROUTES),
        body in prop::collection::vec(any::<u8>(), 0..200),
    ) {
        let r = send(route, body);
        check(&r)?;
        prop_assert!(r.status.is_client_error() || r.status.is_success());
    }

    #[test]
    fn arbitrary_json_is_refused_cleanly(
        route in proptest::sample::select(ROUTES),
        body in json_value(),
    ) {
        check(&send(route, body.to_string().into_bytes()))?;
    }
}

proptest! {
    #![proptest_config(Config { cases: 24, failure_persistence: None, ..Config::default() })]

    #[test]
    fn mangled_valid_requests_never_fail_the_server(
        route in proptest::sample::select(ROUTES),
        edits in prop::collection::vec((key(), json_value()), 0..3),
    ) {
        let body = mangled(route, edits);
        check(&send(route, body.to_string().into_bytes()))?;
    }
}
