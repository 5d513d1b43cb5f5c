//! A conversation spilled to the SSD tier by one server process is restored by the next
//! one: two real `mtplx-serve` processes over the same SSD directory, the first killed with
//! SIGKILL (no shutdown path runs) once its spill is on disk.

mod serve_support;

use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mtplx_serve::cache::SsdMode;
use serde_json::{json, Value};
use serve_support::socket::fetch;
use serve_support::{call, log_lines, model_path, post_json, settings, state_with, Reply};

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

fn answer(v: &Value) -> String {
    v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_else(|| panic!("no answer in {v}"))
        .to_owned()
}

/// A server process, killed (SIGKILL) when dropped if it is still running.
struct Server {
    child: Child,
    addr: SocketAddr,
    stderr: PathBuf,
}

impl Server {
    /// Starts the server binary on a free port with the SSD tier in `ssd`, a bank of one
    /// entry (a second conversation spills the first) and its request log at `log`; waits
    /// for the address it prints.
    fn start(dir: &Path, name: &str, ssd: &Path, log: &Path) -> Server {
        let stdout = dir.join(format!("{name}.stdout"));
        let stderr = dir.join(format!("{name}.stderr"));
        let child = Command::new(env!("CARGO_BIN_EXE_mtplx-serve-under-test"))
            .arg("--model")
            .arg(model_path())
            .args(["--port", "0", "--context-window", "1024"])
            .args(["--ssd-session-cache", "on", "--ssd-session-cache-dir"])
            .arg(ssd)
            // A test machine's disk may be fuller than the production floor allows.
            .args(["--ssd-session-cache-free-disk-floor", "0"])
            .args(["--session-bank-max-entries", "1"])
            .arg("--request-log-jsonl")
            .arg(log)
            .env("MTPLX_HOME", dir.join("home"))
            .stdin(Stdio::null())
            .stdout(File::create(&stdout).unwrap())
            .stderr(File::create(&stderr).unwrap())
            .spawn()
            .expect("start the server binary");
        let mut server = Server {
            child,
            addr: "0.0.0.0:0".parse().unwrap(),
            stderr,
        };
        let started = Instant::now();
        server.addr = loop {
            let out = std::fs::read_to_string(&stdout).unwrap_or_default();
            if let Some(addr) = out
                .split_once("on http://")
                .and_then(|(_, rest)| rest.split_whitespace().next())
            {
                break addr.parse().expect("the address the server printed");
            }
            if let Some(status) = server.child.try_wait().unwrap() {
                panic!("{name} exited ({status}) before serving:\n{}", server.log());
            }
            // A liveness bound, not a timing assertion.
            assert!(
                started.elapsed() < Duration::from_secs(300),
                "{name} did not start:\n{}",
                server.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        server
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    async fn chat(&self, body: &Value, session: &str) -> Reply {
        let r = fetch(
            self.addr,
            "POST",
            CHAT,
            &[
                ("content-type", "application/json"),
                ("x-mtplx-session-id", session),
            ],
            body.to_string().as_bytes(),
        )
        .await;
        assert_eq!(r.status, 200, "{}\n{}", r.text(), self.log());
        r
    }

    /// Entries in the SSD tier's manifest (committed, so durable).
    async fn ssd_entries(&self) -> u64 {
        let r = fetch(self.addr, "GET", "/admin/cache/ssd", &[], b"").await;
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["entries"].as_u64().unwrap_or(0)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn eventually_async<F: std::future::Future<Output = bool>>(
    what: &str,
    mut cond: impl FnMut() -> F,
) {
    let start = Instant::now();
    while !cond().await {
        assert!(
            start.elapsed() < Duration::from_secs(300),
            "gave up waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_conversation_spilled_by_a_killed_server_is_restored_by_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let ssd = dir.path().join("ssd");

    // Process 1: the conversation, then another that evicts (spills) it from the bank.
    let one = Server::start(dir.path(), "one", &ssd, &dir.path().join("one.jsonl"));
    let first = one
        .chat(&turn(&[("system", SYSTEM), ("user", QUESTION)]), "conv-1")
        .await;
    let first = answer(&first.json());
    one.chat(&turn(&[("user", "Count from one to five.")]), "conv-2")
        .await;
    eventually_async("the first conversation's spill to be committed", || async {
        one.ssd_entries().await >= 1
    })
    .await;
    let mut one = one;
    one.child.kill().expect("SIGKILL the first server");
    one.child.wait().unwrap();

    // Process 2 over the same directory: the returning turn is restored from the SSD.
    let log = dir.path().join("two.jsonl");
    let two = Server::start(dir.path(), "two", &ssd, &log);
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
    let line = {
        let mut lines = Vec::new();
        eventually_async("the request log line", || {
            lines = log_lines(&log);
            std::future::ready(!lines.is_empty())
        })
        .await;
        lines.pop().unwrap()
    };
    assert_eq!(line["session_restore_mode"], "ssd_clone", "{line}");
    assert_eq!(line["cache_source"], "ssd", "{line}");
    assert_eq!(line["ssd_cached_tokens"].as_u64(), Some(cached), "{line}");

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
