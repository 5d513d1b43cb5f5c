//! A hybrid (Qwen3-Next) model served end to end, over HTTP, from the folder `cargo xtask
//! make-hybrid` writes (seeded weights under the published names, the default model's
//! tokenizer and chat template), loaded by the same `Bundle::load` a user's folder goes
//! through.
//!
//! - The seeds' scenario: two conversations share a long system prompt, the bank holds
//!   one; the first returns after its eviction, to a restarted server, and is restored
//!   `ssd_clone` from its own full state (not from the neighbour's system prompt in RAM),
//!   with the answer of a cold prefill, byte for byte.
//! - A conversation whose checkpoints all lie below `--ssd-session-cache-min-prefix-tokens`
//!   is refused from the manifest (`ssd_prefix_boundary_below_floor`): nothing is read from
//!   the SSD tier and the prompt is computed.
//! - The same across two real server processes (`--model DIR`), the first killed with
//!   SIGKILL once its spill is on disk.
//! - A follow-up turn from RAM restores the recurrent state at the previous turn's end, and
//!   `/admin/sessions` and `/metrics` report checkpoint bytes.
//! - The checkpoint's own MTP head (`mtp.*`) drafts in `mtp` mode without being named, and
//!   changes no token, greedy or seeded; `--mtp-head none` leaves prompt lookup alone.

mod serve_support;

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use mtplx_model::hybrid::synthetic;
use mtplx_model::{Bundle, WeightFormat};
use mtplx_serve::cache::SsdMode;
use mtplx_serve::{AppState, Settings};
use serde_json::json;
use serve_support::process::{newest_log_line, ssd_args, Server};
use serve_support::{answer, cached_tokens, call, chat, get, log_lines, post_json, with_session};

const CHAT: &str = "/v1/chat/completions";

/// The synthetic hybrid model's folder and the model loaded from it, once per test binary.
fn hybrid_model() -> &'static (PathBuf, Arc<Bundle>) {
    static MODEL: OnceLock<(PathBuf, Arc<Bundle>)> = OnceLock::new();
    MODEL.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap().keep().join("tiny-qwen3-next");
        let tokenizer = &serve_support::bundle().tokenizer;
        synthetic::write(&dir, &synthetic::config(), 7, Some(tokenizer)).unwrap();
        let bundle = Bundle::load(&dir, WeightFormat::Native).expect("load the hybrid model");
        assert!(bundle.template.is_some(), "the chat template came along");
        (dir, Arc::new(bundle))
    })
}

fn hybrid() -> Arc<Bundle> {
    hybrid_model().1.clone()
}

fn state_with(settings: Settings) -> AppState {
    AppState::new(hybrid(), settings).expect("start the engine")
}

/// A long system prompt (some 700 tokens): what agent conversations share.
fn system() -> String {
    (0..60)
        .map(|i| format!("Rule {i}: answer tool call {i} with the file it names."))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Logged, a bank of one entry over an SSD tier at `ssd` written at every commit.
fn one_entry_over(dir: &Path, ssd: &Path) -> Settings {
    let mut s = Settings {
        context_window: Some(4096),
        request_log: Some(dir.join("log.jsonl")),
        ..Settings::default()
    };
    s.cache.ssd = SsdMode::On;
    s.cache.ssd_dir = ssd.to_path_buf();
    s.cache.ssd_free_disk_floor = Some(0);
    s.cache.bank.max_entries = 1;
    s
}

/// Drops a server and waits until its SSD store has closed (its directory lock released).
async fn stop(state: AppState, ssd: &Path) {
    drop(state);
    serve_support::eventually("the SSD store to close", || {
        !mtplx_cold::storage::FsStorage::in_use(ssd).expect("probe the SSD directory lock")
    })
    .await;
}

#[tokio::test]
async fn a_returning_hybrid_conversation_is_restored_from_its_own_state_on_the_ssd() {
    let dir = tempfile::tempdir().unwrap();
    let ssd = dir.path().join("ssd");
    let system = system();
    let q1 = "Which file does tool call 3 name?";
    let q2 = "Which file does tool call 41 name?";
    let s = one_entry_over(dir.path(), &ssd);

    // Server one: two conversations over the same system prompt; the second evicts (spills)
    // the first. One token each: the bank keeps exactly the prompt's state.
    let one = state_with(s.clone());
    let first = call(
        &one,
        with_session(&chat(&[("system", &system), ("user", q1)], 1), "c1"),
    )
    .await;
    assert_eq!(first.status, 200, "{}", first.text());
    let a1 = answer(&first.json());
    let prompt1 = first.json()["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(prompt1 > 600, "a long prompt: {prompt1} tokens");
    let other = call(
        &one,
        with_session(&chat(&[("system", &system), ("user", q2)], 1), "c2"),
    )
    .await;
    assert_eq!(other.status, 200, "{}", other.text());
    let done = one.tier().bank().wait_for_spills();
    assert!(done.written >= 1 && done.failed == 0, "{done:?}");
    stop(one, &ssd).await;

    // Server two, over the same SSD directory: conversation 2 is in RAM again (a neighbour
    // that shares the system prompt), then conversation 1 returns.
    let two = state_with(s);
    let again = call(
        &two,
        with_session(&chat(&[("system", &system), ("user", q2)], 1), "c2"),
    )
    .await;
    assert_eq!(again.status, 200);
    let turn2 = chat(
        &[
            ("system", &system),
            ("user", q1),
            ("assistant", &a1),
            ("user", "And tool call 4?"),
        ],
        8,
    );
    let back = call(&two, with_session(&turn2, "c1")).await;
    assert_eq!(back.status, 200, "{}", back.text());
    let lines = log_lines(&dir.path().join("log.jsonl"));
    let last = lines.last().unwrap();
    assert_eq!(last["session_restore_mode"], "ssd_clone", "{last}");
    assert_eq!(last["cache_source"], "ssd", "{last}");
    assert_eq!(
        cached_tokens(&back.json()),
        prompt1,
        "restored at its own prompt's end, not at the shared system prompt: {last}"
    );
    assert!(
        last["refused_candidates"]
            .as_str()
            .is_some_and(|r| r.contains("lower_coverage")),
        "the RAM neighbour was considered and lost on coverage: {last}"
    );

    // The same turn computed cold: the same answer, byte for byte.
    let cold = call(&state_with(Settings::default()), post_json(CHAT, &turn2)).await;
    assert_eq!(cached_tokens(&cold.json()), 0);
    assert_eq!(
        answer(&back.json()),
        answer(&cold.json()),
        "the restore changed the answer"
    );
}

#[tokio::test]
async fn a_hybrid_state_below_the_floor_is_refused_from_the_manifest() {
    let dir = tempfile::tempdir().unwrap();
    let ssd = dir.path().join("ssd");
    let state = state_with(one_entry_over(dir.path(), &ssd));
    // Short conversations: every checkpoint lies below the default floor of 512 tokens.
    let short = chat(&[("user", "Name a colour.")], 1);
    assert_eq!(call(&state, with_session(&short, "s1")).await.status, 200);
    let other = chat(&[("user", "Name a number.")], 1);
    assert_eq!(call(&state, with_session(&other, "s2")).await.status, 200);
    assert!(state.tier().bank().wait_for_spills().written >= 1);
    let back = chat(
        &[
            ("user", "Name a colour."),
            ("assistant", "Red."),
            ("user", "Another?"),
        ],
        4,
    );
    let reply = call(&state, with_session(&back, "s1")).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(cached_tokens(&reply.json()), 0);
    let lines = log_lines(&dir.path().join("log.jsonl"));
    let last = lines.last().unwrap();
    assert_eq!(last["session_restore_mode"], "cold", "{last}");
    assert_eq!(
        last["cache_miss_reason"], "ssd_prefix_boundary_below_floor",
        "{last}"
    );
    // Refused from metadata: no restore from the SSD tier was attempted.
    let stats = state.tier().bank().stats();
    assert!(
        stats
            .restores
            .keys()
            .all(|m| !m.as_str().starts_with("ssd")),
        "{:?}",
        stats.restores
    );
    assert_eq!(stats.ssd_restore_failures, 0);
}

#[tokio::test]
async fn a_follow_up_turn_continues_from_the_recurrent_state_in_ram() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Settings {
        context_window: Some(4096),
        request_log: Some(dir.path().join("log.jsonl")),
        ..Settings::default()
    };
    s.cache.min_prefix_tokens = 0;
    let state = state_with(s);
    let q = "Summarise the rules.";
    let system = system();
    let one = call(
        &state,
        with_session(&chat(&[("system", &system), ("user", q)], 1), "f"),
    )
    .await;
    assert_eq!(one.status, 200, "{}", one.text());
    let a = answer(&one.json());
    let prompt1 = one.json()["usage"]["prompt_tokens"].as_u64().unwrap();
    let turn2 = chat(
        &[
            ("system", &system),
            ("user", q),
            ("assistant", &a),
            ("user", "More."),
        ],
        6,
    );
    let two = call(&state, with_session(&turn2, "f")).await;
    assert_eq!(two.status, 200, "{}", two.text());
    assert_eq!(
        cached_tokens(&two.json()),
        prompt1,
        "restored at the first turn's end"
    );
    let lines = log_lines(&dir.path().join("log.jsonl"));
    assert_eq!(lines[1]["session_restore_mode"], "clone", "{}", lines[1]);
    let cold = call(&state_with(Settings::default()), post_json(CHAT, &turn2)).await;
    assert_eq!(answer(&two.json()), answer(&cold.json()));

    let sessions = call(&state, get("/admin/sessions")).await.json();
    let entry = &sessions["data"][0];
    assert!(entry["checkpoint_bytes"].as_u64().unwrap() > 0, "{entry}");
    let positions: Vec<u64> = entry["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_u64().unwrap())
        .collect();
    assert!(!positions.is_empty() && positions.len() <= mtplx_bank::MAX_CHECKPOINTS);
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "{positions:?}");
    let metrics = call(&state, get("/metrics")).await.text();
    let bytes = metrics
        .lines()
        .find_map(|l| l.strip_prefix("mtplx_bank_checkpoint_bytes "))
        .expect("the checkpoint bytes gauge");
    assert!(bytes.trim().parse::<u64>().unwrap() > 0, "{bytes}");
}

#[tokio::test]
async fn a_hybrid_conversation_spilled_by_a_killed_server_process_is_restored_by_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let ssd = dir.path().join("ssd");
    let folder = &hybrid_model().0;
    let start = |name: &str, log: &Path| {
        let args = ssd_args(
            &ssd,
            log,
            &[
                "--context-window",
                "4096",
                "--session-bank-max-entries",
                "1",
                "--ssd-session-cache-min-prefix-tokens",
                "512",
            ],
        );
        Server::start_model(dir.path(), name, folder, &args)
    };
    let system = system();
    let q = "Which file does tool call 7 name?";
    let one = start("one", &dir.path().join("one.jsonl"));
    let first = one
        .chat(&chat(&[("system", &system), ("user", q)], 1), "p1")
        .await;
    assert_eq!(first.status, 200, "{}", first.text());
    let a = answer(&first.json());
    let prompt1 = first.json()["usage"]["prompt_tokens"].as_u64().unwrap();
    one.chat(&chat(&[("user", "Count from one to five.")], 1), "p2")
        .await;
    one.kill_once_spilled().await;

    let log = dir.path().join("two.jsonl");
    let two = start("two", &log);
    let turn2 = chat(
        &[
            ("system", &system),
            ("user", q),
            ("assistant", &a),
            ("user", "And 8?"),
        ],
        6,
    );
    let back = two.chat(&turn2, "p1").await;
    assert_eq!(back.status, 200, "{}", back.text());
    assert_eq!(cached_tokens(&back.json()), prompt1, "{}", back.text());
    let line = newest_log_line(&log).await;
    assert_eq!(line["session_restore_mode"], "ssd_clone", "{line}");
    let cold = call(&state_with(Settings::default()), post_json(CHAT, &turn2)).await;
    assert_eq!(
        answer(&back.json()),
        answer(&cold.json()),
        "the restore changed the answer"
    );
}

/// Every generation endpoint serves the hybrid model (named as clients name it, by its
/// folder), whole and streamed; `/v1/models` lists it.
#[tokio::test]
async fn every_endpoint_serves_the_hybrid_model() {
    let state = state_with(Settings::default());
    let id = "tiny-qwen3-next";
    let models = call(&state, get("/v1/models")).await.json();
    assert_eq!(models["data"][0]["id"], id, "{models}");
    let requests = [
        (
            "/v1/chat/completions",
            json!({"model": id, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0}),
        ),
        (
            "/v1/completions",
            json!({"model": id, "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}),
        ),
        (
            "/v1/completions",
            json!({"model": id, "prompt": [1, 2, 3, 4, 5], "max_tokens": 4, "temperature": 0}),
        ),
        (
            "/v1/messages",
            json!({"model": id, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0}),
        ),
        (
            "/v1/responses",
            json!({"model": id, "input": "Hi", "max_output_tokens": 4, "temperature": 0}),
        ),
    ];
    for (path, body) in requests {
        let whole = call(&state, post_json(path, &body)).await;
        assert_eq!(whole.status, 200, "{path}: {}", whole.text());
        let mut streamed = body.clone();
        streamed["stream"] = json!(true);
        let events = call(&state, post_json(path, &streamed)).await;
        assert_eq!(events.status, 200, "{path} streamed: {}", events.text());
        assert!(
            events.sse_data().len() >= 2,
            "{path} streamed: {}",
            events.text()
        );
    }
}

/// The checkpoint's MTP head drafts through the server by default (no `--mtp-head`), and
/// the answer is the plain decoding's, greedy and seeded.
#[tokio::test]
async fn the_checkpoints_own_mtp_head_drafts_and_changes_no_token() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log.jsonl");
    let settings = Settings {
        request_log: Some(log.clone()),
        ..Settings::default()
    };
    assert_eq!(
        settings.speculation.head,
        mtplx_serve::HeadSource::Checkpoint
    );
    let state = state_with(settings);
    let request = |mode: &str, temperature: f64| {
        json!({
            "messages": [{"role": "user", "content": "Explain what a compiler does."}],
            "max_tokens": 24,
            "temperature": temperature,
            "seed": 11,
            "generation_mode": mode,
        })
    };
    for temperature in [0.0, 0.8] {
        let plain = call(&state, post_json(CHAT, &request("ar", temperature))).await;
        let spec = call(&state, post_json(CHAT, &request("mtp", temperature))).await;
        assert_eq!(spec.status, 200, "{}", spec.text());
        assert_eq!(
            answer(&spec.json()),
            answer(&plain.json()),
            "T={temperature}"
        );
    }
    let lines = log_lines(&log);
    let greedy = &lines[1];
    assert_eq!(greedy["proposer"], "lookup+mtp", "{greedy}");
    let drafted: u64 = greedy["drafted_by_depth"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_u64().unwrap())
        .sum();
    assert!(drafted > 0, "nothing drafted: {greedy}");

    // `--mtp-head none`: prompt lookup alone.
    let mut off = Settings {
        request_log: Some(dir.path().join("off.jsonl")),
        ..Settings::default()
    };
    off.speculation.head = mtplx_serve::HeadSource::Off;
    let state = state_with(off);
    let spec = call(&state, post_json(CHAT, &request("mtp", 0.0))).await;
    assert_eq!(spec.status, 200, "{}", spec.text());
    let lines = log_lines(&dir.path().join("off.jsonl"));
    assert_eq!(lines[0]["proposer"], "lookup", "{}", lines[0]);
}
