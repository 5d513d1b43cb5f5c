//! A conversation the server answered is never lost between RAM and SSD (issue 15): real
//! server processes, streaming clients, temperature 0.
//!
//! - An evicted conversation that returns at once (its spill maybe still in the writer) or
//!   after a pause restores its whole previous turn, not the neighbour's system prompt.
//! - A stop (SIGTERM) writes what RAM holds; a kill (SIGKILL) after the idle write loses
//!   nothing either; the next process restores the turn from the SSD, and the answer is the
//!   cold one.
//! - On a small file system the cap follows the free space, a spill that can't be written is
//!   logged and counted, and its conversation is still served from RAM.

mod serve_support;

use std::ffi::OsString;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use mtplx_serve::cache::SsdMode;
use serde_json::{json, Value};
use serve_support::process::{eventually_async, ssd_args, Server, Streamed};
use serve_support::{call, log_lines, post_json, settings, state_with};

/// A system prompt of about 600 tokens shared by every conversation (longer than a 512-token
/// block prefix, so the neighbour's share of it is a candidate, as in the seeds).
fn system_prompt() -> String {
    let mut s = String::from(
        "You are a careful code reviewer working inside an agent. Follow these rules.\n",
    );
    for i in 1..=24 {
        s.push_str(&format!(
            "Rule {i}: when a function named step_{i} changes state, check its callers and \
             report them.\n"
        ));
    }
    s
}

/// A file to review: about 700 tokens, different for each `salt`.
fn file(salt: u32) -> String {
    (0..20)
        .map(|i| {
            let k = salt * 97 + i;
            format!(
                "fn f{k}(x: u32) -> u32 {{ x.wrapping_mul({}) ^ {} }}\n",
                k * 31,
                k * 7
            )
        })
        .collect()
}

fn messages(turns: &[(&str, String)]) -> Value {
    let m: Vec<Value> = turns
        .iter()
        .map(|(role, content)| json!({"role": role, "content": content}))
        .collect();
    json!({"messages": m, "max_tokens": 32, "temperature": 0})
}

fn first_turn(salt: u32) -> Vec<(&'static str, String)> {
    vec![
        ("system", system_prompt()),
        ("user", format!("Review this file:\n{}", file(salt))),
    ]
}

fn next_turn(salt: u32, answer: &str) -> Vec<(&'static str, String)> {
    let mut t = first_turn(salt);
    t.push(("assistant", answer.to_owned()));
    t.push(("user", "Which function would you rename first?".to_owned()));
    t
}

/// The request log's last line, once the streamed answer is done (the engine writes it
/// before it sends the end of the stream).
fn last_line(log: &Path) -> Value {
    log_lines(log).pop().expect("a request-log line")
}

/// Tokens a turn's commit holds: its prompt and its answer but the last token (whose K/V
/// is computed only when it is fed back).
fn committed(line: &Value) -> u64 {
    line["prompt_tokens"].as_u64().unwrap() + line["completion_tokens"].as_u64().unwrap() - 1
}

fn assert_restored_whole(back: &Value, before: &Value) {
    let cached = back["cached_tokens"].as_u64().unwrap();
    assert!(
        cached >= committed(before),
        "restored {cached} tokens, the previous turn committed {}: {back}",
        committed(before)
    );
}

async fn stream(server: &Server, turns: &[(&str, String)], session: &str) -> Streamed {
    let s = server.stream_chat(&messages(turns), session).await;
    assert_eq!(s.status, 200, "{}\n{}", s.body, server.log());
    assert!(!s.text.is_empty());
    s
}

/// The seeds' scenario: A, then B with the same system prompt (evicting A from a one-entry
/// bank), then A's next turn after `pause`; idle sessions written after `idle_write_s`.
async fn returning_conversation(pause: Duration, idle_write_s: &str) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("requests.jsonl");
    let args = ssd_args(
        &dir.path().join("ssd"),
        &log,
        &[
            "--context-window",
            "2048",
            "--session-bank-max-entries",
            "1",
            "--ssd-session-cache-idle-write-s",
            idle_write_s,
        ],
    );
    let server = Server::start(dir.path(), "server", &args);

    let a = stream(&server, &first_turn(1), "conv-a").await;
    let a_line = last_line(&log);
    assert_eq!(a_line["session_restore_mode"], "cold", "{a_line}");
    let b = stream(&server, &first_turn(2), "conv-b").await;
    let b_line = last_line(&log);
    assert_eq!(
        b_line["session_restore_mode"], "block_prefix_boundary_clone",
        "B shares A's system prompt: {b_line}"
    );
    tokio::time::sleep(pause).await;
    let back = stream(&server, &next_turn(1, &a.text), "conv-a").await;
    let line = last_line(&log);
    assert_restored_whole(&line, &a_line);
    let mode = line["session_restore_mode"].as_str().unwrap();
    assert!(matches!(mode, "clone" | "ssd_clone"), "{line}");
    eprintln!(
        "pause {:?}: A cold TTFT {:.3} s ({} tokens), B {:.3} s, A again {:.3} s ({mode}, {} \
         cached{}): {:.3} of the cold TTFT",
        pause,
        a.ttft.as_secs_f64(),
        a_line["prompt_tokens"],
        b.ttft.as_secs_f64(),
        back.ttft.as_secs_f64(),
        line["cached_tokens"],
        if line["ram_entry_state"] == "spill_queued" {
            ", its spill still queued"
        } else {
            ""
        },
        back.ttft.as_secs_f64() / a.ttft.as_secs_f64()
    );
}

/// No idle write: A is first written when B evicts it, so A returns while that spill may
/// still be in the writer (the failure the seeds fix).
#[tokio::test]
async fn an_evicted_conversation_returning_at_once_restores_its_own_turn() {
    returning_conversation(Duration::ZERO, "3600").await;
}

/// The default idle write: A is on the SSD before B evicts it.
#[tokio::test]
async fn an_evicted_conversation_returning_after_a_pause_restores_its_own_turn() {
    returning_conversation(Duration::from_secs(2), "3").await;
}

/// How the first server process ends.
enum Stop {
    /// SIGTERM: the flush writes what RAM holds.
    Term,
    /// SIGKILL once the idle write has committed the conversation.
    KillAfterIdleWrite,
}

async fn survives(stop: Stop) {
    let dir = tempfile::tempdir().unwrap();
    let ssd = dir.path().join("ssd");
    let idle = match stop {
        // Only the stop can write it: the idle write would come after an hour.
        Stop::Term => "3600",
        Stop::KillAfterIdleWrite => "0.5",
    };
    let more = [
        "--context-window",
        "2048",
        "--ssd-session-cache-idle-write-s",
        idle,
    ];
    let one_log = dir.path().join("one.jsonl");
    let mut one = Server::start(dir.path(), "one", &ssd_args(&ssd, &one_log, &more));
    let first = stream(&one, &first_turn(3), "conv").await;
    let first_line = last_line(&one_log);
    match stop {
        Stop::Term => {
            assert_eq!(one.ssd_entries().await, 0, "written before the stop");
            one.signal("TERM");
            let status = one.wait_exit();
            assert!(status.success(), "exit status {status}:\n{}", one.log());
            let log = one.log();
            assert!(
                log.contains("1 conversation(s) written to the SSD tier"),
                "the stop does not say what it wrote:\n{log}"
            );
        }
        Stop::KillAfterIdleWrite => {
            eventually_async("the idle write", || async { one.ssd_entries().await >= 1 }).await;
            one.signal("KILL");
            one.wait_exit();
        }
    }

    let two_log = dir.path().join("two.jsonl");
    let two = Server::start(dir.path(), "two", &ssd_args(&ssd, &two_log, &more));
    let turn = next_turn(3, &first.text);
    let back = stream(&two, &turn, "conv").await;
    let line = last_line(&two_log);
    assert_eq!(line["session_restore_mode"], "ssd_clone", "{line}");
    assert_eq!(line["cache_source"], "ssd", "{line}");
    assert_restored_whole(&line, &first_line);

    // The same turn computed cold, with the cache off.
    let mut off = settings();
    off.context_window = Some(2048);
    off.cache.ssd = SsdMode::Off;
    let cold = call(
        &state_with(off),
        post_json("/v1/chat/completions", &messages(&turn)),
    )
    .await;
    assert_eq!(cold.status, 200, "{}", cold.text());
    assert_eq!(
        back.text,
        cold.json()["choices"][0]["message"]["content"]
            .as_str()
            .unwrap(),
        "the SSD restore changed the answer"
    );
}

#[tokio::test]
async fn a_conversation_in_ram_survives_sigterm() {
    survives(Stop::Term).await;
}

#[tokio::test]
async fn a_conversation_survives_sigkill_after_its_idle_write() {
    survives(Stop::KillAfterIdleWrite).await;
}

#[tokio::test]
async fn a_generation_running_at_sigterm_is_stopped_and_its_conversation_kept() {
    let dir = tempfile::tempdir().unwrap();
    let ssd = dir.path().join("ssd");
    let more = [
        "--context-window",
        "2048",
        "--ssd-session-cache-idle-write-s",
        "3600",
        "--shutdown-flush-s",
        "2",
    ];
    let one_log = dir.path().join("one.jsonl");
    let mut one = Server::start(dir.path(), "one", &ssd_args(&ssd, &one_log, &more));
    let mut long = messages(&first_turn(7));
    long["max_tokens"] = json!(600);
    long["ignore_eos"] = json!(true);
    // Once the answer has started, the operator stops the server.
    let streamed = one
        .stream_chat_with(&long, "conv", || one.signal("TERM"))
        .await;
    assert_eq!(streamed.status, 200);
    assert!(
        streamed.body.contains("shutting down"),
        "the stream does not say why it ended: {}",
        streamed.body
    );
    let status = one.wait_exit();
    assert!(status.success(), "exit status {status}:\n{}", one.log());
    let stopped = last_line(&one_log);
    assert_eq!(stopped["status"], 503, "{stopped}");
    assert_eq!(stopped["error_code"], "server_shutting_down", "{stopped}");
    assert!(
        stopped["completion_tokens"].as_u64() < Some(600),
        "{stopped}"
    );
    assert!(
        one.log()
            .contains("1 conversation(s) written to the SSD tier"),
        "{}",
        one.log()
    );

    // Its prompt and what it had generated are restored by the next process.
    let two_log = dir.path().join("two.jsonl");
    let two = Server::start(dir.path(), "two", &ssd_args(&ssd, &two_log, &more));
    stream(&two, &next_turn(7, &streamed.text), "conv").await;
    let line = last_line(&two_log);
    assert_eq!(line["session_restore_mode"], "ssd_clone", "{line}");
    assert!(
        line["cached_tokens"].as_u64() >= stopped["prompt_tokens"].as_u64(),
        "{line}"
    );
}

/// A tmpfs mounted for the test, unmounted when dropped.
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Result<Tmpfs, String> {
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output()
            .map_err(|e| format!("running mount: {e}"))?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).trim().to_owned());
        }
        Ok(Tmpfs(dir.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[tokio::test]
async fn on_a_small_disk_the_cap_follows_the_free_space_and_a_failed_spill_stays_in_ram() {
    let dir = tempfile::tempdir().unwrap();
    let ssd = dir.path().join("ssd");
    let _tmpfs = match Tmpfs::mount(&ssd, "40m") {
        Ok(t) => t,
        Err(why) => {
            eprintln!("skipped: can't mount a 40 MB tmpfs here ({why})");
            return;
        }
    };
    let log = dir.path().join("requests.jsonl");
    let args: Vec<OsString> = ssd_args(
        &ssd,
        &log,
        &[
            "--context-window",
            "2048",
            "--session-bank-max-entries",
            "1",
        ],
    );
    let server = Server::start(dir.path(), "server", &args);

    // The cap is a quarter of what the store may use, not the configured 16-100 GB.
    let cap = |v: &Value| v["cap_bytes"].as_u64().unwrap();
    let report = server.get_json("/admin/cache/ssd").await;
    let free = report["free_bytes"].as_u64().unwrap();
    assert!(free <= 40 << 20, "{report}");
    assert_eq!(
        cap(&report),
        (free + report["used_bytes"].as_u64().unwrap()) / 4
    );
    assert!(cap(&report) < report["configured_cap_bytes"].as_u64().unwrap());
    // Another program fills half the disk: the cap follows.
    std::fs::write(ssd.join("filler"), vec![7u8; 20 << 20]).unwrap();
    let filled = server.get_json("/admin/cache/ssd").await;
    assert!(
        cap(&filled) <= cap(&report) - (4 << 20),
        "{report} then {filled}"
    );

    // A's state (46 KB a token) is larger than the cap: when B evicts it, the spill can't
    // be written, and A stays in RAM.
    let a = stream(&server, &first_turn(5), "conv-a").await;
    let a_line = last_line(&log);
    stream(&server, &first_turn(6), "conv-b").await;
    let back = stream(&server, &next_turn(5, &a.text), "conv-a").await;
    assert!(!back.text.is_empty());
    let line = last_line(&log);
    assert_eq!(line["session_restore_mode"], "clone", "{line}");
    assert_eq!(line["cache_source"], "ram", "{line}");
    assert_restored_whole(&line, &a_line);

    let log_text = server.log();
    assert!(
        log_text.contains("the SSD tier could not take a conversation")
            && log_text.contains("too_large"),
        "the failed spill is not in the log:\n{log_text}"
    );
    let metrics = server.get("/metrics").await.text();
    let failures = metrics
        .lines()
        .find_map(|l| l.strip_prefix("mtplx_bank_spill_failures_total{reason=\"too_large\"} "))
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or(0);
    assert!(failures >= 1, "not in /metrics:\n{metrics}");
    let report = server.get_json("/admin/cache/ssd").await;
    assert_eq!(report["entries"], 0, "{report}");
    assert!(
        report["bank"]["failures_by_reason"]["too_large"].as_u64() >= Some(1),
        "{report}"
    );
    assert_eq!(report["bank"]["entries_lost"], 0, "{report}");
}
