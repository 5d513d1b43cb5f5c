//! `cargo xtask bench`: a long agent session replayed against real server processes on
//! loopback, mtplx beside its re-prefill baseline and llama.cpp's server, from one client, in
//! one run; a JSON results file, a Markdown report and PNG plots under `target/bench/`.
//!
//! - The client is `tools/bench/agent_replay.py` (the `openai` SDK, streaming): it writes the
//!   scenario from the seed, runs each part against a fresh server process and records every
//!   turn (see its docstring for the scenario and the parts).
//! - This side builds what the client drives (`mtplx-serve`; llama.cpp's `llama-server`
//!   from the peer step's sdist), reads the results back ([`report`]), checks the invariants
//!   (and fails the command if one is broken), writes the report and draws the plots
//!   ([`plot`]).
//! - `--quick`: a few turns of small prompts, no peer, the server built in the dev profile
//!   the tests use: the scenarios complete and their invariants hold (CI runs it); its
//!   timings mean nothing.
//! - `--publish`: the report and its plots are also copied to `docs/bench/cpu.md` and
//!   `docs/bench/cpu/`, where the README's figures link.
//! - `--criterion`: the criterion suites and llama-bench instead, as before this command
//!   replayed sessions.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;

use crate::peer::{ensure_llama, run_cmd, workspace_root};
use crate::run::{build_serve, cpu_model};

pub mod plot;
pub mod report;

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// A few turns of small prompts, no peer: checks that the scenarios complete and their
    /// invariants hold (restore modes, byte-identical repeats, no 5xx), never timings.
    #[arg(long)]
    pub quick: bool,
    /// Turns of the main session (the side session takes one after every second) [default:
    /// 24, or 4 with --quick].
    #[arg(long)]
    pub turns: Option<usize>,
    /// Seed of the scenario (tool results, think times).
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Compute threads of each server.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Tokens each turn may generate.
    #[arg(long, default_value_t = 48)]
    pub gen: usize,
    /// Context window of the servers, which the main session grows to near.
    #[arg(long, default_value_t = 8192)]
    pub window: usize,
    /// The GGUF file [default: the default model, fetched].
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Leave llama.cpp's server out.
    #[arg(long)]
    pub no_peer: bool,
    /// Run only these parts (replay, reprefill, decoding, peer), keeping the others from
    /// target/bench/results.json when it holds the same scenario.
    #[arg(long, value_delimiter = ',')]
    pub parts: Vec<String>,
    /// Copy the report and plots to docs/bench/cpu.md and docs/bench/cpu/.
    #[arg(long)]
    pub publish: bool,
    /// Run the criterion suites (the default model on 2 threads) and llama-bench instead.
    #[arg(long)]
    pub criterion: bool,
    /// Extra arguments passed to `cargo bench` with --criterion.
    #[arg(trailing_var_arg = true)]
    pub args: Vec<String>,
}

/// Runs the replay and writes `target/bench/{results.json,report.md,*.png}`.
pub fn run(args: &BenchArgs, model: &Path) -> Result<()> {
    let started = Instant::now();
    let out = workspace_root().join("target/bench");
    let work = out.join("work");
    if work.exists() {
        std::fs::remove_dir_all(&work).with_context(|| format!("clearing {}", work.display()))?;
    }
    std::fs::create_dir_all(&work)?;
    eprintln!("[bench] building mtplx-serve");
    // Release for a measured run; for `--quick`, the dev profile and the `cuda` feature
    // `cargo xtask test` builds with (optimised too, with overflow checks), so that CI
    // reuses the test build's crates.
    let serve = if args.quick {
        build_serve(false, &["cuda"])?
    } else {
        build_serve(true, &[])?
    };
    let llama = if args.quick || args.no_peer {
        None
    } else {
        Some(ensure_llama("llama-server")?)
    };
    crate::peer_server::ensure_openai()?;
    let results_path = out.join("results.json");
    let turns = args.turns.unwrap_or(if args.quick { 4 } else { 24 });
    let mut cmd = Command::new("python3");
    cmd.arg(workspace_root().join("tools/bench/agent_replay.py"))
        .arg("--serve")
        .arg(&serve)
        .arg("--model")
        .arg(model)
        .arg("--work")
        .arg(&work)
        .arg("--out")
        .arg(&results_path)
        .args(["--turns", &turns.to_string()])
        .args(["--seed", &args.seed.to_string()])
        .args(["--threads", &args.threads.to_string()])
        .args(["--gen", &args.gen.to_string()])
        .args(["--window", &args.window.to_string()]);
    if args.quick {
        cmd.arg("--quick");
    }
    let mut parts = if args.parts.is_empty() {
        vec!["replay", "reprefill", "decoding", "peer"]
    } else {
        cmd.arg("--keep");
        args.parts.iter().map(String::as_str).collect()
    };
    match &llama {
        Some(l) => {
            cmd.arg("--llama").arg(l);
        }
        None => parts.retain(|p| *p != "peer"),
    }
    cmd.args(["--parts", &parts.join(",")]);
    run_cmd(&mut cmd, "the agent replay (tools/bench/agent_replay.py)")?;

    let text = std::fs::read_to_string(&results_path)
        .with_context(|| format!("reading {}", results_path.display()))?;
    let value: serde_json::Value = serde_json::from_str(&text)?;
    let results = report::Results::from_json(&value)?;
    let checks = report::checks(&results);
    let mut plots = Vec::new();
    for (name, kind, draw) in [
        (
            "ttft.png",
            "ttft",
            plot::ttft as fn(&report::Results, &Path) -> Result<()>,
        ),
        ("decode.png", "decode", plot::decode),
        ("rss.png", "rss", plot::rss),
    ] {
        draw(&results, &out.join(name))?;
        plots.push((name.to_string(), kind.to_string()));
    }
    let cx = report::Header {
        date: today(),
        commit: commit(),
        machine: machine(),
        model: model
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
        command: command_line(args),
        quick: args.quick,
        plots,
    };
    let md = report::markdown(&results, &checks, &cx);
    std::fs::write(out.join("report.md"), &md)?;
    for c in &checks {
        eprintln!(
            "[bench] {} {}: {}",
            if c.ok { "ok    " } else { "FAILED" },
            c.name,
            c.detail
        );
    }
    eprintln!(
        "[bench] report: {} ({:.0} s)",
        out.join("report.md").display(),
        started.elapsed().as_secs_f64()
    );
    if args.publish {
        publish(&out, &md)?;
    }
    report::require(&checks)
}

/// `docs/bench/cpu.md` and its plots under `docs/bench/cpu/`.
fn publish(out: &Path, md: &str) -> Result<()> {
    let docs = workspace_root().join("docs/bench");
    let dir = docs.join("cpu");
    std::fs::create_dir_all(&dir)?;
    for name in ["ttft.png", "decode.png", "rss.png"] {
        std::fs::copy(out.join(name), dir.join(name))?;
    }
    std::fs::copy(out.join("results.json"), docs.join("raw/agent-replay.json"))?;
    let md = md
        .replace("](ttft.png)", "](cpu/ttft.png)")
        .replace("](decode.png)", "](cpu/decode.png)")
        .replace("](rss.png)", "](cpu/rss.png)");
    std::fs::write(docs.join("cpu.md"), md)?;
    eprintln!("[bench] published to {}", docs.join("cpu.md").display());
    Ok(())
}

fn output(cmd: &mut Command) -> Option<String> {
    let out = cmd.output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn today() -> String {
    output(Command::new("date").args(["-u", "+%Y-%m-%d %H:%M UTC"])).unwrap_or_default()
}

fn commit() -> String {
    let root = workspace_root();
    let head =
        output(
            Command::new("git")
                .arg("-C")
                .arg(&root)
                .args(["rev-parse", "--short", "HEAD"]),
        )
        .unwrap_or_else(|| "unknown".into());
    // Prose (the Markdown files) changes no figure: only other files make the tree dirty.
    let dirty = output(Command::new("git").arg("-C").arg(&root).args([
        "status",
        "--porcelain",
        "--untracked-files=no",
        "--",
        ".",
        ":(exclude)*.md",
    ]))
    .is_some_and(|s| !s.is_empty());
    if dirty {
        format!("{head}, with uncommitted changes")
    } else {
        head
    }
}

/// The processor, its cores and the memory, from /proc.
fn machine() -> String {
    let cpu = cpu_model().unwrap_or_else(|| "an unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            let kb: u64 = s
                .lines()
                .find(|l| l.starts_with("MemTotal"))?
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            Some(format!("{:.0} GiB", kb as f64 / (1 << 20) as f64))
        })
        .unwrap_or_default();
    format!("{cpu}, {cores} cores, {mem}")
}

fn command_line(args: &BenchArgs) -> String {
    let mut s = String::from("cargo xtask bench");
    if args.quick {
        s.push_str(" --quick");
    }
    if let Some(t) = args.turns {
        s.push_str(&format!(" --turns {t}"));
    }
    if args.seed != 7 {
        s.push_str(&format!(" --seed {}", args.seed));
    }
    if args.no_peer {
        s.push_str(" --no-peer");
    }
    s
}
