//! The server with its model on an NVIDIA GPU (`--device cuda`), as an operator runs it
//! (real `mtplx-serve` processes, driven over a socket) on the default model: greedy
//! answers are the reference's tokens; a conversation restored from RAM, and from the SSD
//! tier after a restart, answers byte for byte as a cold GPU server does; speculative
//! decoding (prompt lookup then the MTP head, on the GPU) gives plain decoding's text; and
//! a prompt as long as the model's window runs.
//!
//! Needs an NVIDIA GPU. Without one each test says it was skipped and passes, unless
//! `MTPLX_CUDA_TESTS=1` is set (the device runs set it), which makes a missing device a
//! failure.
#![cfg(feature = "cuda")]

mod serve_support;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use mtplx_model::tokenizer::{Special, SpecialText};
use serde::Deserialize;
use serde_json::{json, Value};
use serve_support::process::{newest_log_line, ssd_args, Server};
use serve_support::{answer, log_lines};

const COMPLETIONS: &str = "/v1/completions";

/// Whether device 0 opens: without it each test says it was skipped and passes, unless
/// `MTPLX_CUDA_TESTS` is set (then a missing device fails it).
fn gpu() -> bool {
    static GPU: OnceLock<bool> = OnceLock::new();
    *GPU.get_or_init(|| match mtplx_serve::gpu::open(0) {
        Ok(name) => {
            eprintln!("device: {name}");
            true
        }
        Err(e) if std::env::var_os("MTPLX_CUDA_TESTS").is_some() => {
            panic!("MTPLX_CUDA_TESTS is set but there is no usable device: {e}")
        }
        Err(e) => {
            eprintln!("skipped, no CUDA device: {e}");
            false
        }
    })
}

/// `args` as a server's arguments, the device first.
fn on_gpu(args: &[&str]) -> Vec<OsString> {
    ["--device", "cuda"]
        .iter()
        .chain(args)
        .map(OsString::from)
        .collect()
}

#[derive(Deserialize)]
struct Golden {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    prompt_ids: Vec<u32>,
    /// The reference's greedy tokens (32 at most, the stop token included when it came).
    generated_ids: Vec<u32>,
    stopped_on_eos: bool,
}

fn golden() -> Golden {
    let p =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/golden/smollm2-135m-q4_1.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

/// A greedy raw completion of `prompt` (token ids) in `mode` (`ar`, `mtp`).
fn completion(prompt: &[u32], max_tokens: usize, mode: &str) -> Value {
    json!({
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "generation_mode": mode,
    })
}

#[tokio::test]
async fn greedy_answers_on_the_gpu_are_the_reference_tokens_plain_and_speculative() {
    if !gpu() {
        return;
    }
    // K/V in f16 (the default), then in f32.
    for dtype in ["f16", "f32"] {
        reference_answers(dtype).await;
    }
}

async fn reference_answers(dtype: &str) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log.jsonl");
    let mut args = vec![
        "--ssd-session-cache",
        "off",
        "--request-log-jsonl",
        log.to_str().unwrap(),
        // Always draft, so the `mtp` answers are speculative ones.
        "--adaptive-policy",
        "none",
    ];
    if dtype != "f16" {
        args.extend(["--kv-dtype", dtype]);
    }
    let server = Server::start(dir.path(), "gpu", &on_gpu(&args));
    let line = server.startup_line();
    assert!(line.contains("| device cuda:0 ("), "{line}");
    assert!(line.contains(&format!("kv {dtype} Device")), "{line}");
    // The server answers in text: the reference's tokens are compared as the text they
    // decode to, and their count (the stop token included) as the completion's.
    let tokenizer = &serve_support::bundle().tokenizer;
    for case in golden().cases {
        let want = tokenizer
            .decode(&case.generated_ids, SpecialText::Skip)
            .unwrap();
        let finish = if case.stopped_on_eos {
            "stop"
        } else {
            "length"
        };
        for mode in ["ar", "mtp"] {
            let what = format!("{} ({mode}, {dtype} K/V)", case.name);
            let r = server
                .post(COMPLETIONS, &completion(&case.prompt_ids, 32, mode))
                .await;
            assert_eq!(r.status, 200, "{what}: {}\n{}", r.text(), server.log());
            let v = r.json();
            assert_eq!(v["choices"][0]["text"], want.as_str(), "{what}");
            assert_eq!(v["choices"][0]["finish_reason"], finish, "{what}");
            assert_eq!(
                v["usage"]["completion_tokens"].as_u64(),
                Some(case.generated_ids.len() as u64),
                "{what}"
            );
        }
    }
    // The speculative answers were drafted (by the head on the GPU, or prompt lookup) and
    // some drafts accepted: speculation ran, it did not fall back to plain steps.
    let drafted: Vec<Value> = log_lines(&log)
        .into_iter()
        .filter(|l| l["generation_mode"] == "mtp")
        .collect();
    assert!(!drafted.is_empty());
    let accepted: u64 = drafted
        .iter()
        .flat_map(|l| {
            l["accepted_by_depth"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .map(|a| a.as_u64().unwrap())
        .sum();
    assert!(accepted > 0, "no draft accepted: {drafted:?}");
}

const SYSTEM: &str = "You are a terse assistant. Answer in one short sentence.";
const QUESTION: &str = "Name a large animal that lives in the sea.";

fn turn(messages: &[(&str, &str)], mode: &str) -> Value {
    let messages: Vec<Value> = messages
        .iter()
        .map(|(role, content)| json!({"role": role, "content": content}))
        .collect();
    json!({"messages": messages, "max_tokens": 16, "temperature": 0, "generation_mode": mode})
}

fn second_turn(first_answer: &str, mode: &str) -> Value {
    turn(
        &[
            ("system", SYSTEM),
            ("user", QUESTION),
            ("assistant", first_answer),
            ("user", "And one that lives in the desert?"),
        ],
        mode,
    )
}

/// A GPU server over the SSD tier `ssd` with a bank of one entry (a second conversation
/// spills the first), its request log at `log`.
fn with_ssd(dir: &Path, name: &str, ssd: &Path, log: &Path) -> Server {
    let mut args = on_gpu(&[]);
    args.extend(ssd_args(ssd, log, &["--session-bank-max-entries", "1"]));
    Server::start(dir, name, &args)
}

fn cached_tokens(v: &Value) -> u64 {
    v["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0)
}

#[tokio::test]
async fn a_conversation_restored_from_ram_and_from_the_ssd_answers_as_a_cold_gpu_server() {
    if !gpu() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ssd = dir.path().join("ssd");

    // Process 1: the conversation; its second turn restored from RAM (decoded
    // speculatively); another conversation evicts it (spilled to the SSD tier); killed.
    let log = dir.path().join("one.jsonl");
    let one = with_ssd(dir.path(), "one", &ssd, &log);
    let first = one
        .chat(
            &turn(&[("system", SYSTEM), ("user", QUESTION)], "mtp"),
            "conv-1",
        )
        .await;
    let first = answer(&first.json());
    let from_ram = one.chat(&second_turn(&first, "mtp"), "conv-1").await;
    assert!(cached_tokens(&from_ram.json()) > 20, "{}", from_ram.text());
    let line = newest_log_line(&log).await;
    assert_eq!(line["cache_source"], "ram", "{line}");
    one.chat(
        &turn(&[("user", "Count from one to five.")], "mtp"),
        "conv-2",
    )
    .await;
    one.kill_once_spilled().await;

    // Process 2 over the same directory: the returning turn comes back from the SSD.
    let log = dir.path().join("two.jsonl");
    let two = with_ssd(dir.path(), "two", &ssd, &log);
    let from_ssd = two.chat(&second_turn(&first, "mtp"), "conv-1").await;
    assert!(cached_tokens(&from_ssd.json()) > 20, "{}", from_ssd.text());
    let line = newest_log_line(&log).await;
    assert_eq!(line["cache_source"], "ssd", "{line}");
    drop(two);

    // Process 3, no cache: the same turn computed cold, plainly.
    let cold = Server::start(dir.path(), "cold", &on_gpu(&["--ssd-session-cache", "off"]));
    let cold = cold.chat(&second_turn(&first, "ar"), "conv-cold").await;
    assert_eq!(cached_tokens(&cold.json()), 0, "{}", cold.text());
    let cold = answer(&cold.json());
    assert_eq!(
        answer(&from_ram.json()),
        cold,
        "the RAM restore changed the answer"
    );
    assert_eq!(
        answer(&from_ssd.json()),
        cold,
        "the SSD restore changed the answer"
    );
}

/// Prompt tokens of the long-prompt test: as many as the default model's window holds
/// with room for the answer. SmolLM2-135M's window is 8,192 positions (its RoPE goes no
/// further and `--context-window` only narrows it), so a 16K prompt does not fit this
/// model: this is the largest it takes.
const LONG_PROMPT: usize = 8_000;

#[tokio::test]
async fn a_prompt_as_long_as_the_window_runs_on_the_gpu() {
    if !gpu() {
        return;
    }
    let tokenizer = &serve_support::bundle().tokenizer;
    let mut text = String::new();
    for i in 0.. {
        if i % 64 == 0 && tokenizer.encode(&text, Special::AsText).unwrap().len() > LONG_PROMPT {
            break;
        }
        text.push_str(&format!(
            "Entry {i}: the harbour log records ship {} arriving with {} crates of cargo.\n",
            i * 7 % 113,
            i * 13 % 97
        ));
    }
    let mut prompt = tokenizer.encode(&text, Special::AsText).unwrap();
    prompt.truncate(LONG_PROMPT);
    let question = tokenizer
        .encode(
            "\nHow many crates did ship 5 bring? Answer:",
            Special::AsText,
        )
        .unwrap();
    prompt.splice(prompt.len() - question.len().., question);

    let dir = tempfile::tempdir().unwrap();
    let args = on_gpu(&["--ssd-session-cache", "off", "--context-window", "8192"]);
    let server = Server::start(dir.path(), "long", &args);
    let mut answers = Vec::new();
    for mode in ["ar", "mtp"] {
        let r = server
            .post(COMPLETIONS, &completion(&prompt, 24, mode))
            .await;
        assert_eq!(r.status, 200, "{mode}: {}\n{}", r.text(), server.log());
        let v = r.json();
        assert_eq!(
            v["usage"]["prompt_tokens"].as_u64(),
            Some(LONG_PROMPT as u64)
        );
        assert!(
            v["usage"]["completion_tokens"].as_u64().unwrap() >= 1,
            "{v}"
        );
        answers.push(v["choices"][0]["text"].as_str().unwrap().to_owned());
    }
    assert_eq!(
        answers[0], answers[1],
        "speculation changed the long answer"
    );
}
