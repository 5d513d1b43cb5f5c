//! The K/V element type (`--kv-dtype`, `--kv-quant`) through the server: for each setting
//! (f32, f16, bf16, q8, q4), a returning
//! conversation restored from the RAM bank and, once evicted, from the SSD tier, decoded
//! speculatively, answers byte for byte what a cold server with that setting answers
//! plainly; and an SSD entry written by a server keeping another type is not reused, with
//! the miss named (`ssd_kv_format_mismatch`).

mod serve_support;

use std::path::Path;

use mtplx_kv::KvDtype;
use mtplx_serve::cache::SsdMode;
use mtplx_serve::Settings;
use serde_json::Value;
use serve_support::{
    answer, cached_tokens, call, chat, log_lines, post_json, settings, state_with, stop,
    with_session,
};

const CHAT: &str = "/v1/chat/completions";
const SYSTEM: &str = "You are a terse assistant. Answer in one short sentence.";
const QUESTION: &str = "Name a large animal that lives in the sea.";

fn first_turn() -> Value {
    chat(&[("system", SYSTEM), ("user", QUESTION)], 12)
}

fn second_turn(first_answer: &str) -> Value {
    chat(
        &[
            ("system", SYSTEM),
            ("user", QUESTION),
            ("assistant", first_answer),
            ("user", "And one that lives in the desert?"),
        ],
        12,
    )
}

/// A server keeping K/V as `dtype`, SSD tier under `dir/ssd`, a bank of one entry (a second
/// conversation spills the first), a request log at `dir/log.jsonl`.
fn with_ssd(dir: &Path, dtype: KvDtype) -> Settings {
    let mut s = Settings {
        request_log: Some(dir.join("log.jsonl")),
        ..settings()
    };
    s.cache.kv_dtype = dtype;
    s.cache.ssd = SsdMode::On;
    s.cache.ssd_dir = dir.join("ssd");
    s.cache.ssd_free_disk_floor = Some(0);
    s.cache.bank.max_entries = 1;
    s
}

/// `body` with `generation_mode` set (`ar`: plain decoding; `mtp`: speculative).
fn mode(mut body: Value, mode: &str) -> Value {
    body["generation_mode"] = mode.into();
    body
}

fn last_log(dir: &Path) -> Value {
    log_lines(&dir.join("log.jsonl"))
        .pop()
        .expect("a request log line")
}

#[tokio::test]
async fn every_kv_dtype_answers_the_same_cold_from_ram_and_from_the_ssd() {
    for dtype in KvDtype::ALL {
        let dir = tempfile::tempdir().unwrap();
        let s = with_ssd(dir.path(), dtype);
        let state = state_with(s.clone());
        assert_eq!(state.tier().factory().dtype(), dtype);
        let one = call(&state, with_session(&mode(first_turn(), "mtp"), "s-1")).await;
        assert_eq!(one.status, 200, "{dtype}: {}", one.text());
        let first = answer(&one.json());

        // Back from RAM, decoded speculatively; then, once another conversation has
        // evicted it (spilled to the SSD tier), the same turn back from the SSD.
        let second = mode(second_turn(&first), "mtp");
        let from_ram = call(&state, with_session(&second, "s-1")).await;
        assert_eq!(from_ram.status, 200, "{dtype}: {}", from_ram.text());
        assert!(cached_tokens(&from_ram.json()) > 20, "{dtype}");
        assert_eq!(last_log(dir.path())["cache_source"], "ram", "{dtype}");
        let other = chat(&[("user", "Count from one to five.")], 8);
        assert_eq!(call(&state, with_session(&other, "s-2")).await.status, 200);
        let done = state.tier().bank().wait_for_spills();
        assert!(done.written >= 1 && done.failed == 0, "{dtype}: {done:?}");
        let from_ssd = call(&state, with_session(&second, "s-1")).await;
        assert_eq!(from_ssd.status, 200, "{dtype}: {}", from_ssd.text());
        assert!(
            cached_tokens(&from_ssd.json()) > 20,
            "{dtype}: {}",
            from_ssd.text()
        );
        assert_eq!(last_log(dir.path())["cache_source"], "ssd", "{dtype}");
        stop(state, &s.cache.ssd_dir).await;

        let mut off = settings();
        off.cache.kv_dtype = dtype;
        off.cache.ssd = SsdMode::Off;
        let cold = call(
            &state_with(off),
            post_json(CHAT, &mode(second_turn(&first), "ar")),
        )
        .await;
        assert_eq!(cold.status, 200, "{dtype}: {}", cold.text());
        assert_eq!(cached_tokens(&cold.json()), 0);
        let cold = answer(&cold.json());
        assert_eq!(answer(&from_ssd.json()), cold, "{dtype}: the SSD path");
        assert_eq!(answer(&from_ram.json()), cold, "{dtype}: the RAM path");
    }
}

#[tokio::test]
async fn an_ssd_entry_of_another_kv_dtype_is_a_named_miss_not_a_restore() {
    // A float type read by another, and one read by a server quantizing its K/V.
    for (wrote, reads) in [(KvDtype::F32, KvDtype::F16), (KvDtype::F16, KvDtype::Q8)] {
        another_kv_dtype_is_a_named_miss(wrote, reads).await;
    }
}

async fn another_kv_dtype_is_a_named_miss(wrote: KvDtype, reads: KvDtype) {
    let dir = tempfile::tempdir().unwrap();
    let written = with_ssd(dir.path(), wrote);
    let state = state_with(written.clone());
    let one = call(&state, with_session(&first_turn(), "s-1")).await;
    assert_eq!(one.status, 200, "{}", one.text());
    let first = answer(&one.json());
    let other = chat(&[("user", "Count from one to five.")], 8);
    assert_eq!(call(&state, with_session(&other, "s-2")).await.status, 200);
    let done = state.tier().bank().wait_for_spills();
    assert!(done.written >= 1 && done.failed == 0, "{done:?}");
    stop(state, &written.cache.ssd_dir).await;

    // The same directory, the same model, K/V kept in another type.
    let reader = with_ssd(dir.path(), reads);
    let restarted = state_with(reader.clone());
    let back = call(&restarted, with_session(&second_turn(&first), "s-1")).await;
    assert_eq!(back.status, 200, "{}", back.text());
    assert_eq!(cached_tokens(&back.json()), 0, "{reads}: {}", back.text());
    let line = last_log(dir.path());
    assert_eq!(
        line["cache_miss_reason"], "ssd_kv_format_mismatch",
        "{wrote} read as {reads}: {line}"
    );
    stop(restarted, &reader.cache.ssd_dir).await;

    let mut off = settings();
    off.cache.kv_dtype = reads;
    off.cache.ssd = SsdMode::Off;
    let cold = call(&state_with(off), post_json(CHAT, &second_turn(&first))).await;
    assert_eq!(answer(&back.json()), answer(&cold.json()), "{reads}");
}
