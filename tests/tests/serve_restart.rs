//! A conversation spilled to the SSD tier by one server process is restored by the next
//! one: two real `mtplx-serve` processes over the same SSD directory, the first killed with
//! SIGKILL (no shutdown path runs) once its spill is on disk.

mod serve_support;

use std::path::Path;

use mtplx_serve::cache::SsdMode;
use serde_json::{json, Value};
use serve_support::process::{newest_log_line, ssd_args, Server};
use serve_support::{answer, call, post_json, settings, state_with};

const CHAT: &str = "/v1/chat/completions";
const SYSTEM: &str = "You are a terse assistant. Answer in one short sentence.";
const QUESTION: &str = "Name a large animal that lives in the sea.";

fn turn(messages: &[(&str, &str)]) -> Value {
    let messages: Vec<Value> = messages
        .iter()
        .map(|(role, content)| json!({"role": role, "content": content}))
        .collect();
    json!({"messages": messages, "max_tokens": 12, "temperature": 0})
}

fn second_turn(first_answer: &str) -> Value {
    turn(&[
        ("system", SYSTEM),
        ("user", QUESTION),
        ("assistant", first_answer),
        ("user", "And one that lives in the desert?"),
    ])
}

/// A server over `ssd` with a bank of one entry (a second conversation spills the first).
fn start(dir: &Path, name: &str, ssd: &Path, log: &Path) -> Server {
    let args = ssd_args(
        ssd,
        log,
        &[
            "--context-window",
            "1024",
            "--session-bank-max-entries",
            "1",
        ],
    );
    Server::start(dir, name, &args)
}

#[tokio::test]
async fn a_conversation_spilled_by_a_killed_server_is_restored_by_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let ssd = dir.path().join("ssd");

    // Process 1: the conversation, then another that evicts (spills) it from the bank.
    let one = start(dir.path(), "one", &ssd, &dir.path().join("one.jsonl"));
    let first = one
        .chat(&turn(&[("system", SYSTEM), ("user", QUESTION)]), "conv-1")
        .await;
    let first = answer(&first.json());
    one.chat(&turn(&[("user", "Count from one to five.")]), "conv-2")
        .await;
    one.kill_once_spilled().await;

    // Process 2 over the same directory: the returning turn is restored from the SSD.
    let log = dir.path().join("two.jsonl");
    let two = start(dir.path(), "two", &ssd, &log);
    assert!(two.ssd_entries().await >= 1, "{}", two.log());
    let back = two.chat(&second_turn(&first), "conv-1").await;
    let cached = back.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0);
    assert!(
        cached > 20,
        "nothing restored from the SSD: {}",
        back.text()
    );
    let line = newest_log_line(&log).await;
    assert_eq!(line["session_restore_mode"], "ssd_clone", "{line}");
    assert_eq!(line["cache_source"], "ssd", "{line}");
    assert_eq!(line["ssd_cached_tokens"].as_u64(), Some(cached), "{line}");
    // Where the read's time went: a path, the bytes, and times that fit inside the restore.
    let read = &line["ssd_read"];
    assert!(
        ["streamed", "resident", "staged", "lent"].contains(&read["path"].as_str().unwrap_or("")),
        "{line}"
    );
    assert!(read["bytes"].as_u64().unwrap_or(0) > 0, "{line}");
    let restore_s = line["restore_s"].as_f64().unwrap();
    for part in [
        "manifest_s",
        "reading_s",
        "delivering_s",
        "awaiting_reads_s",
    ] {
        let s = read[part].as_f64().unwrap_or(-1.0);
        assert!((0.0..=restore_s).contains(&s), "{part} in {line}");
    }

    // The same turn computed cold, with the cache off.
    let mut off = settings();
    off.cache.ssd = SsdMode::Off;
    let cold = call(&state_with(off), post_json(CHAT, &second_turn(&first))).await;
    assert_eq!(cold.status, 200, "{}", cold.text());
    assert_eq!(
        answer(&back.json()),
        answer(&cold.json()),
        "the SSD restore changed the answer"
    );
}
