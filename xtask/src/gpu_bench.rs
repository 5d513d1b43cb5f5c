//! `cargo xtask gpu-bench`: issue 19's GPU benchmark, mtplx's server against llama.cpp's
//! CUDA server on the same GGUF files, in steps that each fit one call of the lent GPU
//! machine (10 minutes a command, 64 MiB carried, no Rust toolchain and no network there):
//!
//! - `cargo xtask gpu-bench pack [DIR]` (here): builds and packs what the GPU machine needs
//!   into `DIR` (default `.gl`, which git ignores): the CUDA server, this xtask, the CUDA unit
//!   tests, a tokenizer source and llama.cpp's trimmed source (`tools/bench/gpu_pack.sh`).
//! - `DIR/xtask gpu-bench run STEP` (there, carrying `DIR`): one step of [`PLAN`] through
//!   `tools/bench/gpu_run.sh`, which writes the Llama-3-8B-shaped files with seeded random
//!   weights (speed needs no trained weights), builds llama.cpp, runs the unit tests, then
//!   each server alone with one client (`tools/bench/gpu_server.py`). Results: `$OUT/gpu-run.tgz`,
//!   and after a build llama.cpp's binaries as `$OUT/llama-bin.tar.xz`: put it in `DIR` and
//!   later steps skip the build (about 5 of a call's 10 minutes).
//! - `cargo xtask gpu-bench report FILE|DIR ...` (here): the steps' results as one markdown
//!   report against the goals, for `docs/bench/h200.md`, with the device, the copy
//!   bandwidth of the same run and the exact knobs of each step.
//! - `cargo xtask gpu-bench plan`: the steps and what each measures.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::peer::ratio;

/// What to do.
#[derive(Debug, Clone, clap::Args)]
pub struct GpuBenchArgs {
    #[command(subcommand)]
    pub cmd: GpuBenchCmd,
}

#[derive(Debug, Clone, clap::Subcommand)]
pub enum GpuBenchCmd {
    /// Here: build and pack what the GPU machine needs (carry the folder in the device call).
    Pack {
        #[arg(default_value = ".gl")]
        dir: PathBuf,
    },
    /// There: one step of the plan (`plan` lists them), from the repository root.
    Run {
        step: String,
        /// The packed folder.
        #[arg(long, default_value = ".gl")]
        dir: PathBuf,
        /// Print the command instead of running it.
        #[arg(long)]
        dry_run: bool,
    },
    /// Here: the markdown report of results (`gpu-run.tgz` files or their extracted `res`
    /// folders), printed, and written to `--out` when given.
    Report {
        #[arg(required = true)]
        inputs: Vec<PathBuf>,
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// The steps and what each measures.
    Plan,
}

/// A `gpu_run.sh` knob and its value.
type Knob = (&'static str, &'static str);

/// One step: a device call's worth of the benchmark, as `gpu_run.sh`'s knobs: a set it
/// shares with the steps like it, then its own.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Step {
    pub name: &'static str,
    pub measures: &'static str,
    pub shared: &'static [Knob],
    pub own: &'static [Knob],
}

impl Step {
    /// Every knob the step sets.
    pub fn knobs(&self) -> impl Iterator<Item = &'static Knob> {
        self.shared.iter().chain(self.own)
    }
}

/// The 8B files at 512, 4K and 8K tokens, against llama.cpp. Prompt sizes are words of the
/// client's text, about 1.03 tokens each with the default model's tokenizer (the shaped
/// files carry it): 24, 490, 3,980 and 7,900 words are about 25, 505, 4,100 and 8,140
/// prompt tokens, so decode at an empty context and at 8K, and prefill at 512 and 4,096.
const UP_TO_8K: &[Knob] = &[
    ("SIZES", "24,490,3980,7900"),
    ("CONTEXT", "16384"),
    ("LLAMA_CTX", "16384"),
    ("ROUNDS", "2"),
    ("GEN", "64"),
    ("LLAMA", "1"),
];

/// The Q4_K_M file at about 32K tokens (31,500 words).
const AT_32K: &[Knob] = &[
    ("FILES", "q4_k_m"),
    ("SIZES", "31500"),
    ("CONTEXT", "34816"),
    ("ROUNDS", "1"),
    ("GEN", "64"),
];

/// The measurements, a step a call.
pub const PLAN: &[Step] = &[
    Step {
        name: "unit",
        measures: "the CUDA unit tests on the device (no files, no servers)",
        shared: &[],
        own: &[("FILES", ""), ("KERNELS", "builtin")],
    },
    Step {
        name: "8b-q4_k_m",
        measures: "Llama-3-8B-shaped Q4_K_M: prefill at ~512 and ~4,096 tokens, decode at \
                   an empty context and at ~8K; mtplx and llama.cpp",
        shared: UP_TO_8K,
        own: &[("FILES", "q4_k_m")],
    },
    Step {
        name: "8b-q4_0",
        measures: "the same on the Q4_0 file",
        shared: UP_TO_8K,
        own: &[("FILES", "q4_0")],
    },
    Step {
        name: "default",
        measures: "the default model's shape and formats (SmolLM2-135M, Q4_1 with a Q8_0 \
                   tied embedding, seeded weights: its file is too large for a call): decode \
                   at an empty context and at ~4K, prefill at ~512 and ~4,096; mtplx and \
                   llama.cpp",
        shared: &[],
        own: &[
            ("FILES", "q4_1"),
            ("SHAPE", "smollm2-135m"),
            ("SIZES", "24,490,3980"),
            ("CONTEXT", "8192"),
            ("LLAMA_CTX", "8192"),
            ("ROUNDS", "2"),
            ("GEN", "128"),
            ("LLAMA", "1"),
        ],
    },
    Step {
        name: "decode-ab",
        measures: "the decode kernels that have switches (products reading x rounded once, \
                   attention sharing a decode step's tile over its warps): the unit tests with \
                   both off, then Q4_K_M through the server with each off against the \
                   default; llama.cpp beside them",
        shared: &[],
        own: &[
            ("FILES", "q4_k_m"),
            ("SIZES", "490,3980,7900"),
            ("CONTEXT", "16384"),
            ("LLAMA_CTX", "16384"),
            ("ROUNDS", "1"),
            ("GEN", "32"),
            ("LLAMA", "1"),
            (
                "KERNELS",
                "builtin builtin%MTPLX_CUDA_DECODE_ROUNDED=0 builtin%MTPLX_CUDA_ATTEND_SPLIT=0",
            ),
            (
                "TEST_ENV",
                "MTPLX_CUDA_DECODE_ROUNDED=0,MTPLX_CUDA_ATTEND_SPLIT=0",
            ),
        ],
    },
    Step {
        name: "8b-32k",
        measures: "Q4_K_M at ~32K tokens on mtplx: prefill and decode, and the returning \
                   conversation (restored from SSD after a SIGKILL against its re-prefill)",
        shared: AT_32K,
        own: &[("RETURNING", "1")],
    },
    Step {
        name: "8b-32k-llama",
        measures: "the same sizes on llama.cpp, and its re-prefill of the returning \
                   conversation (a call of its own: with its build, 32K on both servers \
                   does not fit one)",
        shared: AT_32K,
        own: &[("LLAMA_CTX", "34816"), ("LLAMA", "1"), ("PARTS", "llama")],
    },
];

pub fn run(args: &GpuBenchArgs) -> Result<()> {
    match &args.cmd {
        GpuBenchCmd::Pack { dir } => {
            let status = Command::new("bash")
                .arg("tools/bench/gpu_pack.sh")
                .arg("--llama")
                .arg(dir)
                .current_dir(crate::peer::workspace_root())
                .status()
                .context("running tools/bench/gpu_pack.sh")?;
            if !status.success() {
                bail!("gpu_pack.sh failed ({status})");
            }
        }
        GpuBenchCmd::Run { step, dir, dry_run } => {
            let step = find(step)?;
            if *dry_run {
                println!("{}", describe(step, dir));
                return Ok(());
            }
            let mut cmd = Command::new("bash");
            cmd.arg("tools/bench/gpu_run.sh")
                .arg(dir)
                .env("STEP", step.name)
                .envs(step.knobs().copied());
            let status = cmd.status().context("running tools/bench/gpu_run.sh")?;
            if !status.success() {
                bail!("gpu_run.sh failed ({status})");
            }
        }
        GpuBenchCmd::Report { inputs, out } => {
            let runs = inputs.iter().map(|p| load(p)).collect::<Result<Vec<_>>>()?;
            let md = report(&runs);
            print!("{md}");
            if let Some(out) = out {
                std::fs::write(out, &md).with_context(|| format!("writing {}", out.display()))?;
            }
        }
        GpuBenchCmd::Plan => {
            for s in PLAN {
                println!(
                    "{:<10} {}\n           {}\n",
                    s.name,
                    s.measures,
                    describe(s, Path::new(".gl"))
                );
            }
        }
    }
    Ok(())
}

/// The step called `name`.
fn find(name: &str) -> Result<&'static Step> {
    PLAN.iter().find(|s| s.name == name).with_context(|| {
        let names: Vec<_> = PLAN.iter().map(|s| s.name).collect();
        format!("no step {name}: one of {}", names.join(", "))
    })
}

/// The step as the shell command it runs.
fn describe(step: &Step, dir: &Path) -> String {
    let mut s = format!("STEP={}", step.name);
    for (k, v) in step.knobs() {
        write!(s, " {k}=\"{v}\"").unwrap();
    }
    write!(s, " bash tools/bench/gpu_run.sh {}", dir.display()).unwrap();
    s
}

/// One step's results: `run.json` (device, bandwidth, knobs) and the client's JSON per file.
#[derive(Debug, Clone)]
pub struct RunResult {
    pub run: Value,
    /// (file name without `.json`, the client's object), in name order.
    pub files: Vec<(String, Value)>,
    /// (kernel source, exit status) of the CUDA unit tests the step ran (`tests-*.rc`).
    pub tests: Vec<(String, String)>,
}

/// Reads a `gpu-run.tgz` (extracted into a temporary folder) or a `res` folder.
fn load(path: &Path) -> Result<RunResult> {
    if path.is_dir() {
        return load_dir(path);
    }
    let tmp = std::env::temp_dir().join(format!(
        "mtplx-gpu-bench-{}-{}",
        std::process::id(),
        path.file_name().unwrap_or_default().to_string_lossy()
    ));
    std::fs::create_dir_all(&tmp)?;
    let status = Command::new("tar")
        .arg("xzf")
        .arg(path)
        .arg("-C")
        .arg(&tmp)
        .status();
    let loaded = match status {
        Ok(s) if s.success() => load_dir(&tmp.join("res")),
        Ok(s) => Err(anyhow::anyhow!(
            "{}: not a gpu-run.tgz ({s})",
            path.display()
        )),
        Err(e) => Err(e).with_context(|| format!("extracting {}", path.display())),
    };
    let _ = std::fs::remove_dir_all(&tmp);
    loaded
}

fn load_dir(dir: &Path) -> Result<RunResult> {
    let read = |p: &Path| -> Result<Value> {
        let text =
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
        serde_json::from_str(&text).with_context(|| format!("{}: not JSON", p.display()))
    };
    let run = read(&dir.join("run.json"))?;
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    paths.sort();
    let (mut files, mut tests) = (Vec::new(), Vec::new());
    for p in paths.iter().filter(|p| !p.ends_with("run.json")) {
        let stem = p.file_stem().unwrap_or_default().to_string_lossy();
        match p.extension().and_then(|x| x.to_str()) {
            Some("json") => files.push((stem.into_owned(), read(p)?)),
            Some("rc") => {
                let source = stem.strip_prefix("tests-").unwrap_or(&stem).to_string();
                tests.push((source, std::fs::read_to_string(p)?.trim().to_string()));
            }
            _ => {}
        }
    }
    Ok(RunResult { run, files, tests })
}

/// The weights a decode step of mtplx's server reads, from its start-up line (`N MiB read a
/// token`). Servers before it logged only what they hold (`weights N MiB`), which counts an
/// embedding table a token reads one row of: no bound is made from that.
fn weight_bytes(startup: &str) -> Option<f64> {
    let end = startup.find(" MiB read a token")?;
    let mib: f64 = startup[..end].rsplit(' ').next()?.parse().ok()?;
    Some(mib * 1024.0 * 1024.0)
}

/// The client's median row for `server` at `words`.
fn row<'a>(file: &'a Value, server: &str, words: u64) -> Option<&'a Value> {
    file["contexts"]
        .as_array()?
        .iter()
        .find(|r| r["server"] == server && r["words"].as_u64() == Some(words))
}

fn secs(x: Option<f64>) -> String {
    x.map_or("-".into(), |x| format!("{x:.2} s"))
}

fn num(x: Option<f64>, unit: &str) -> String {
    x.map_or("-".into(), |x| format!("{x:.1}{unit}"))
}

/// The markdown report of `runs`: each step's device, bandwidth, commit and knobs; then per
/// result file (`q4_k_m-builtin`: a file and kernel source), merged across the steps that
/// ran it, a table of each prompt size (prefill and decode of both servers, ratios, mtplx's
/// decode against the bound of weight bytes per token over the copy bandwidth of the run
/// that measured it) and the returning conversation where a step ran it. Figures only: each
/// goal is judged by the number beside it.
pub fn report(runs: &[RunResult]) -> String {
    let mut md = String::new();
    for r in runs {
        let run = &r.run;
        let knobs: Vec<String> = run["knobs"]
            .as_object()
            .map(|o| {
                o.iter()
                    .filter(|(k, _)| k.as_str() != "STEP")
                    .map(|(k, v)| format!("{k}=\"{}\"", v.as_str().unwrap_or("")))
                    .collect()
            })
            .unwrap_or_default();
        writeln!(
            md,
            "- Step `{}`, {} on {}, commit `{}`, copy bandwidth {} (read + write): `{} bash \
             tools/bench/gpu_run.sh .gl`.",
            run["knobs"]["STEP"].as_str().unwrap_or("(none)"),
            run["date"].as_str().unwrap_or("?"),
            run["device"].as_str().unwrap_or("?"),
            run["commit"].as_str().unwrap_or("?"),
            run["copy_tb_s"]
                .as_f64()
                .map_or("not measured".into(), |b| format!("{b:.2} TB/s")),
            knobs.join(" ")
        )
        .unwrap();
        for (source, rc) in &r.tests {
            let verdict = if rc == "0" { "passed" } else { "FAILED" };
            writeln!(
                md,
                "  CUDA unit tests, kernels `{source}`: {verdict} (exit {rc})."
            )
            .unwrap();
        }
    }
    md.push('\n');
    // The result files by name, in the order first seen, each with the runs it came from.
    let mut groups: Vec<(&str, Vec<(&RunResult, &Value)>)> = Vec::new();
    for r in runs {
        for (name, file) in &r.files {
            match groups.iter_mut().find(|(n, _)| n == name) {
                Some((_, g)) => g.push((r, file)),
                None => groups.push((name, vec![(r, file)])),
            }
        }
    }
    for (name, group) in groups {
        let model = group[0].1["model"].as_str().unwrap_or("?");
        write!(md, "**{name}** (`{model}`)").unwrap();
        let bytes = group
            .iter()
            .find_map(|(_, file)| weight_bytes(file["startup"].as_str().unwrap_or("")));
        match bytes {
            Some(b) => write!(md, ": mtplx reads {:.2} GB of weights a token", b / 1e9).unwrap(),
            None => {
                md.push_str(": the server did not log the weight bytes a token reads (no bound)")
            }
        }
        md.push_str("\n\n");
        // Each size's rows, with the bandwidth of the run that measured them.
        let rows = |server: &str, words: u64| {
            group.iter().find_map(|(r, file)| {
                row(file, server, words).map(|row| (row, r.run["copy_tb_s"].as_f64()))
            })
        };
        let mut words: Vec<u64> = group
            .iter()
            .flat_map(|(_, file)| file["contexts"].as_array().into_iter().flatten())
            .filter_map(|r| r["words"].as_u64())
            .collect();
        words.sort_unstable();
        words.dedup();
        if !words.is_empty() {
            md.push_str(
                "| prompt tokens | prefill mtplx | prefill llama.cpp | ratio | decode mtplx \
                 | decode llama.cpp | ratio | mtplx decode / bound | mtplx end_s |\n\
                 | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
            );
        }
        for w in words {
            let (m, l) = (rows("mtplx ar", w), rows("llama.cpp", w));
            let get =
                |r: Option<(&Value, Option<f64>)>, k: &str| r.and_then(|(r, _)| r[k].as_f64());
            let tokens = m
                .or(l)
                .and_then(|(r, _)| r["prompt_tokens"].as_u64())
                .unwrap_or(0);
            let (dm, dl) = (get(m, "decode_tok_s"), get(l, "decode_tok_s"));
            let (pm, pl) = (get(m, "prefill_tok_s"), get(l, "prefill_tok_s"));
            // Weights only: the K/V read per token is left out of the bound.
            let bound = match (bytes, m.and_then(|(_, bw)| bw)) {
                (Some(b), Some(bw)) => Some(bw * 1e12 / b),
                _ => None,
            };
            let share = match (dm, bound) {
                (Some(d), Some(b)) => format!("{:.0}% of {b:.0} tok/s", 100.0 * d / b),
                _ => "-".into(),
            };
            writeln!(
                md,
                "| {tokens} | {} | {} | {} | {} | {} | {} | {share} | {} |",
                num(pm, " tok/s"),
                num(pl, " tok/s"),
                ratio(pm, pl),
                num(dm, " tok/s"),
                num(dl, " tok/s"),
                ratio(dm, dl),
                get(m, "end_s").map_or("-".into(), |e| format!("{e:.3} s")),
            )
            .unwrap();
        }
        // The returning conversation: mtplx's figures and llama.cpp's re-prefill may come
        // from different steps.
        let ret = |k: &str| {
            group
                .iter()
                .find_map(|(_, file)| file["returning"][k].as_f64())
        };
        // Every llama.cpp run re-prefills the conversation of its step's largest size: only
        // a step of the size mtplx's returning conversation was built from counts.
        let largest = |file: &Value| {
            file["contexts"]
                .as_array()
                .and_then(|c| c.iter().filter_map(|r| r["words"].as_u64()).max())
        };
        let home = group
            .iter()
            .find(|(_, file)| file["returning"]["restored_after_sigkill_ttft_s"].is_f64())
            .and_then(|(_, file)| largest(file));
        let llama_reprefill = group
            .iter()
            .filter(|(_, file)| largest(file) == home)
            .find_map(|(_, file)| file["returning"]["llama_reprefill_ttft_s"].as_f64());
        if let Some(t) = ret("restored_after_sigkill_ttft_s") {
            let same = group
                .iter()
                .find_map(|(_, file)| file["returning"]["same_answer"].as_bool());
            let tokens = group
                .iter()
                .find_map(|(_, file)| file["returning"]["prompt_tokens"].as_u64())
                .unwrap_or(0);
            writeln!(
                md,
                "\nReturning conversation of {tokens} tokens: restored from SSD after a SIGKILL \
                 {t:.2} s to the first token; mtplx re-prefilling it {}; llama.cpp \
                 re-prefilling it {} ({} against mtplx's re-prefill, {} against \
                 llama.cpp's); same answer as the re-prefill: {}.",
                secs(ret("reprefill_ttft_s")),
                secs(llama_reprefill),
                ratio(ret("reprefill_ttft_s"), Some(t)),
                ratio(llama_reprefill, Some(t)),
                same.map_or("-".into(), |s| s.to_string())
            )
            .unwrap();
        }
        md.push('\n');
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_step_is_found_by_name_and_sets_only_known_knobs() {
        let known = [
            "FILES",
            "KERNELS",
            "SIZES",
            "ROUNDS",
            "GEN",
            "CONTEXT",
            "LLAMA_CTX",
            "LLAMA",
            "RETURNING",
            "PARTS",
            "SHAPE",
            "TEST_ENV",
        ];
        let script =
            std::fs::read_to_string(crate::peer::workspace_root().join("tools/bench/gpu_run.sh"))
                .unwrap();
        for s in PLAN {
            assert_eq!(find(s.name).unwrap(), s);
            let names: Vec<_> = s.knobs().map(|(k, _)| *k).collect();
            let mut unique = names.clone();
            unique.sort_unstable();
            unique.dedup();
            assert_eq!(unique.len(), names.len(), "{}: a knob set twice", s.name);
            for (k, _) in s.knobs() {
                assert!(known.contains(k), "{}: {k}", s.name);
                // The script reads the knob (and lists it for run.json).
                assert!(
                    script.contains(&format!("${{{k}")),
                    "gpu_run.sh never reads {k}"
                );
                assert!(
                    script.contains(&format!("\"{k}\"")),
                    "run.json leaves out {k}"
                );
            }
            // A 32K step's window holds its prompt (about 1.03 tokens a word) and answer.
            let get = |k: &str| s.knobs().find(|(n, _)| *n == k).map(|(_, v)| *v);
            if let (Some(sizes), Some(ctx)) = (get("SIZES"), get("CONTEXT")) {
                let words: usize = sizes.split(',').map(|w| w.parse().unwrap()).max().unwrap();
                let ctx: usize = ctx.parse().unwrap();
                assert!(
                    words * 11 / 10 + 64 < ctx,
                    "{}: {words} words in {ctx}",
                    s.name
                );
                if get("LLAMA").is_some() {
                    assert_eq!(get("LLAMA_CTX"), Some(&*ctx.to_string()));
                }
            }
        }
        assert!(find("nope").unwrap_err().to_string().contains("8b-q4_k_m"));
    }

    #[test]
    fn the_report_puts_both_servers_side_by_side_against_the_bound() {
        // Two steps of one file: mtplx with its returning conversation, then llama.cpp.
        let (one, two) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let run = |step: &str, bw: f64| {
            json!({"date": "2026-12-06 01:00 UTC", "device": "NVIDIA H100 80GB HBM3, 81559 MiB",
                   "copy_tb_s": bw, "commit": "abc1234",
                   "knobs": {"STEP": step, "FILES": "q4_k_m", "SIZES": "490"}})
        };
        let mtplx = json!({
            "model": "q4_k_m.gguf",
            "startup": "mtplx serving q4_k_m | weights 6406.5 MiB (weights=file-blocks), 4768.4 MiB read a token | kv f16",
            "contexts": [{"server": "mtplx ar", "words": 490, "prompt_tokens": 505,
                          "prefill_tok_s": 1000.0, "decode_tok_s": 300.0, "end_s": 0.002}],
            "returning": {"prompt_tokens": 32400, "restored_after_sigkill_ttft_s": 0.5,
                          "reprefill_ttft_s": 20.0, "same_answer": true}
        });
        let llama = json!({
            "model": "q4_k_m.gguf",
            "contexts": [{"server": "llama.cpp", "words": 490, "prompt_tokens": 503,
                          "prefill_tok_s": 4000.0, "decode_tok_s": 200.0}],
            "returning": {"llama_reprefill_ttft_s": 5.0}
        });
        // A step of smaller prompts first: its llama.cpp re-prefill is of another
        // conversation and must not be taken.
        let small = json!({
            "model": "q4_k_m.gguf",
            "contexts": [{"server": "llama.cpp", "words": 24, "prompt_tokens": 33,
                          "prefill_tok_s": 900.0, "decode_tok_s": 250.0}],
            "returning": {"llama_reprefill_ttft_s": 0.1}
        });
        let zero = tempfile::tempdir().unwrap();
        for (dir, run, file) in [
            (&zero, run("8b-q4_k_m", 3.0), small),
            (&one, run("8b-32k", 3.0), mtplx),
            (&two, run("8b-32k-llama", 2.0), llama),
        ] {
            std::fs::write(dir.path().join("run.json"), run.to_string()).unwrap();
            std::fs::write(dir.path().join("q4_k_m-builtin.json"), file.to_string()).unwrap();
        }
        std::fs::write(one.path().join("tests-builtin.rc"), "0\n").unwrap();
        std::fs::write(two.path().join("tests-builtin.rc"), "101\n").unwrap();
        let runs = [
            load(zero.path()).unwrap(),
            load(one.path()).unwrap(),
            load(two.path()).unwrap(),
        ];
        let md = report(&runs);
        assert!(
            md.contains("- Step `8b-32k`, 2026-12-06 01:00 UTC on NVIDIA H100"),
            "{md}"
        );
        assert!(md.contains("3.00 TB/s") && md.contains("2.00 TB/s"), "{md}");
        assert!(md.contains("kernels `builtin`: passed (exit 0)"), "{md}");
        assert!(md.contains("kernels `builtin`: FAILED (exit 101)"), "{md}");
        assert!(
            md.contains("mtplx reads 5.00 GB of weights a token"),
            "{md}"
        );
        // One table for the file; the bound from mtplx's own run: 3.0 TB/s over 5.0 GB is
        // 600 tok/s, and 300 is half of it.
        assert_eq!(md.matches("| prompt tokens |").count(), 1, "{md}");
        assert!(
            md.contains("| 505 | 1000.0 tok/s | 4000.0 tok/s | 0.25x | 300.0 tok/s | 200.0 tok/s | 1.50x | 50% of 600 tok/s | 0.002 s |"),
            "{md}"
        );
        assert!(
            md.contains("0.50 s to the first token; mtplx re-prefilling it 20.00 s; llama.cpp re-prefilling it 5.00 s"),
            "{md}"
        );
        assert!(
            md.contains("40.00x against mtplx's re-prefill, 10.00x against llama.cpp's"),
            "{md}"
        );
        assert!(md.contains("same answer as the re-prefill: true"), "{md}");
        assert!(
            md.contains("FILES=\"q4_k_m\" SIZES=\"490\" bash tools/bench/gpu_run.sh"),
            "{md}"
        );
    }

    #[test]
    fn only_the_bytes_a_token_reads_make_a_bound() {
        let old = "mtplx serving q4_k_m | weights 6406.5 MiB (weights=file-blocks) | kv f16";
        assert_eq!(weight_bytes(old), None);
        let new = "mtplx serving q4_k_m | weights 6406.5 MiB (weights=file-blocks), 4768.4 MiB \
                   read a token | kv f16";
        assert_eq!(weight_bytes(new), Some(4768.4 * 1024.0 * 1024.0));
    }

    #[test]
    fn a_missing_or_broken_result_is_an_error_not_an_empty_report() {
        let dir = tempfile::tempdir().unwrap();
        assert!(load(dir.path()).is_err());
        std::fs::write(dir.path().join("run.json"), "{").unwrap();
        assert!(load(dir.path())
            .unwrap_err()
            .to_string()
            .contains("not JSON"));
        let not_tgz = dir.path().join("x.tgz");
        std::fs::write(&not_tgz, "no").unwrap();
        assert!(load(&not_tgz).is_err());
    }
}
