//! `cargo xtask peer --server`: mtplx's server against llama.cpp's `llama-server`, through one
//! client, on the files users run, side by side in one run.
//!
//! - Both servers are release builds: `mtplx-serve` from this workspace, `llama-server` from
//!   the same `llama-cpp-python` sdist as the peer step (`peer.rs`).
//! - The client is `tools/bench/peer_server.py` (the `openai` SDK, or with `--client http` a
//!   plain HTTP client; streaming chat
//!   completions, temperature 0, a fresh prompt every round, medians of `--reps` rounds); it
//!   runs one server at a time with `--threads` threads and an 8,192-token window.
//! - The files: the default model and the Qwen2.5-Coder-0.5B-Instruct Q4_K_M file, both from
//!   the model store, or `--model` alone.
//! - mtplx's engine is measured at each context right after the mtplx server's rounds there,
//!   at the prompt length the server reported (decode after prefilling that many tokens, in
//!   process, the same threads, the server idle), so the table also says how much of its
//!   engine's speed the server keeps, from figures taken minutes apart at most. (Measured
//!   once after the whole run instead, the server kept 0.85-0.89 of its engine on a machine
//!   whose speed drifts by 15% in a day; measured back to back, 0.91-0.98.)
//! - The table is printed and written to `docs/bench/peer-server.md`, the raw JSON of every
//!   round to `docs/bench/raw/peer-server.json`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};
use mtplx_kv::KvDtype;
use serde_json::{json, Value};

use crate::peer::{
    ensure_llama, mtplx_command, run_cmd, workspace_root, Client, PeerArgs, KV_BYTES, READ_GBS,
    STATE_BYTES,
};

/// One context length of one file: the medians the client measured and the engine's decode.
#[derive(Debug, Clone, PartialEq)]
struct Row {
    context: usize,
    prompt_tokens: usize,
    ttft_mtplx: f64,
    ttft_llama: f64,
    decode_mtplx: f64,
    decode_llama: f64,
    /// mtplx's engine in process: decode tok/s after `prompt_tokens` of context.
    decode_engine: Option<f64>,
    /// The bytes a decode step at this context reads (weights, K/V of `prompt_tokens`
    /// positions, a recurrent state) and the read bandwidth (GB/s): the best the engine's
    /// threads measured beside any of the file's contexts (on a shared machine the reads
    /// swing by a third between minutes; the best is what the memory can give): the
    /// server's decode as a share of the bound they set.
    step_bytes: Option<f64>,
    read_gbs: Option<f64>,
}

impl Row {
    /// Prefill tok/s from the time to the first token.
    fn prefill(&self, ttft: f64) -> f64 {
        self.prompt_tokens as f64 / ttft.max(1e-9)
    }

    /// The server's decode over the bandwidth bound (the step's bytes ÷ the read
    /// bandwidth), where both were measured.
    fn of_bound(&self) -> Option<f64> {
        let (bytes, gbs) = (self.step_bytes?, self.read_gbs?);
        (bytes > 0.0 && gbs > 0.0).then(|| self.decode_mtplx * bytes / (gbs * 1e9))
    }
}

/// Runs the comparison on `files`: both servers, then the engine, per file.
pub fn run(args: &PeerArgs, files: &[PathBuf]) -> Result<()> {
    let llama = ensure_llama("llama-server")?;
    let serve = crate::run::build_serve(true, &[])?;
    if args.client == Client::Sdk {
        ensure_openai()?;
    }
    let script = workspace_root().join("tools/bench/peer_server.py");
    let mut sections = Vec::new();
    let mut raw = Vec::new();
    for file in files {
        let stem = file
            .file_stem()
            .map_or("model".into(), |s| s.to_string_lossy().into_owned());
        let work = workspace_root()
            .join("target/peer-server")
            .join(format!("{stem}-{}", args.kv_dtype));
        std::fs::create_dir_all(&work)?;
        eprintln!("[peer-server] {}: both servers, one client", file.display());
        let contexts: Vec<String> = args.contexts.iter().map(usize::to_string).collect();
        // The engine in the server's own K/V layout (paged, its default), so that the two
        // differ by the server alone. SmolLM2 at 6.7K tokens on a 2-core Xeon: the server
        // decoded at 0.88 of the engine in a contiguous cache, and at 0.97 of one in the
        // paged layout (decode_at_context against the server's request log).
        let engine_args = PeerArgs {
            prompts: vec![512],
            reps: 1,
            kv_layout: crate::peer::EngineLayout::Paged,
            ..args.clone()
        };
        run_cmd(
            Command::new("python3")
                .arg(&script)
                .arg(&serve)
                .arg(&llama)
                .arg(file)
                .args(["--threads", &args.threads.to_string()])
                .args(["--contexts", &contexts.join(",")])
                .args(["--rounds", &args.reps.to_string()])
                .args(["--gen", &args.gen.to_string()])
                .args(["--client", args.client.name()])
                .arg(format!("--mtplx-args=--kv-dtype {}", args.kv_dtype))
                .arg(format!("--llama-args={}", llama_cache(args.kv_dtype)))
                .arg(format!(
                    "--engine={}",
                    serde_json::to_string(&mtplx_command(&engine_args))?
                ))
                .env("MTPLX_TEST_MODEL", file)
                .arg("--work")
                .arg(&work),
            "the server comparison (tools/bench/peer_server.py)",
        )?;
        let json_path = work.join("peer_server.json");
        let measured: Value = serde_json::from_str(
            &std::fs::read_to_string(&json_path)
                .with_context(|| format!("reading {}", json_path.display()))?,
        )?;
        let rows = rows_of(&measured)?;
        // The engine's figures at an empty context, from its first measurement.
        let engine = &measured["table"][0]["engine_figures"];
        let figure = |k: &str| engine[k].as_f64().map_or("-".into(), |v| format!("{v:.1}"));
        let weight_bytes = engine["weight_bytes"].as_f64().unwrap_or(0.0);
        let name = file
            .file_name()
            .map_or(stem.clone(), |s| s.to_string_lossy().into_owned());
        let table = table(&rows);
        println!(
            "\n{name}, {} threads, medians of {} rounds\n{table}",
            args.threads, args.reps
        );
        sections.push(format!(
            "## {name}\n\n{:.1} MB of weights per token in mtplx; its engine alone: pp512 \
             {} tok/s, tg{} at an empty context {} tok/s.\n\n{table}",
            weight_bytes / 1e6,
            figure("pp512"),
            args.gen,
            figure(&format!("tg{}", args.gen)),
        ));
        raw.push(json!({"file": name, "measured": measured}));
    }
    let docs = workspace_root().join("docs/bench");
    std::fs::create_dir_all(docs.join("raw"))?;
    let name = report_name(args.kv_dtype, args.client);
    std::fs::write(docs.join(format!("{name}.md")), report(args, &sections))?;
    std::fs::write(
        docs.join(format!("raw/{name}.json")),
        serde_json::to_string_pretty(&Value::Array(raw))?,
    )?;
    eprintln!("[peer-server] written to docs/bench/{name}.md and raw/{name}.json");
    Ok(())
}

/// The report's file name: `peer-server` with the server's default K/V (f16), else
/// `peer-server-kv-<type>`.
fn report_name(kv: KvDtype, client: Client) -> String {
    let base = match kv {
        KvDtype::F16 => "peer-server".into(),
        other => format!("peer-server-kv-{other}"),
    };
    match client {
        Client::Sdk => base,
        Client::Http => format!("{base}-http"),
    }
}

/// llama.cpp's server flags for the K/V cache that matches mtplx's `kv`: its default (f16)
/// for the float types, the same ggml block for the quantized ones (a quantized V cache
/// needs flash attention there).
fn llama_cache(kv: KvDtype) -> String {
    match kv {
        KvDtype::F32 | KvDtype::F16 | KvDtype::Bf16 => String::new(),
        KvDtype::Q8 => "-fa on -ctk q8_0 -ctv q8_0".into(),
        KvDtype::Q4 => "-fa on -ctk q4_1 -ctv q4_1".into(),
    }
}

/// The rows of the client's JSON (`table` of `peer_server.py`).
fn rows_of(measured: &Value) -> Result<Vec<Row>> {
    let table = measured["table"]
        .as_array()
        .context("the client's JSON has no table")?;
    let best_read = table
        .iter()
        .filter_map(|t| t["engine_figures"][READ_GBS].as_f64())
        .reduce(f64::max);
    table
        .iter()
        .map(|t| {
            let f = |k: &str| {
                t[k].as_f64()
                    .with_context(|| format!("the client's row has no `{k}`: {t}"))
            };
            Ok(Row {
                context: f("context")? as usize,
                prompt_tokens: f("prompt_tokens")? as usize,
                ttft_mtplx: f("ttft_mtplx")?,
                ttft_llama: f("ttft_llama")?,
                decode_mtplx: f("decode_mtplx")?,
                decode_llama: f("decode_llama")?,
                decode_engine: t["decode_engine"].as_f64(),
                step_bytes: step_bytes(t),
                read_gbs: best_read,
            })
        })
        .collect()
}

/// The bytes a decode step reads at a row's context, from the engine's figures there:
/// weights, K/V of the prompt's positions, a recurrent state.
fn step_bytes(t: &Value) -> Option<f64> {
    let e = &t["engine_figures"];
    let positions = t["prompt_tokens"].as_f64()?;
    Some(
        e["weight_bytes"].as_f64()?
            + e[KV_BYTES].as_f64()? * positions
            + e[STATE_BYTES].as_f64().unwrap_or(0.0),
    )
}

/// The Markdown table: above 1, mtplx is faster; `server/engine` is the share of the
/// engine's own decode that the server delivers.
fn table(rows: &[Row]) -> String {
    let mut s = String::from(
        "| context | prompt tokens | prefill mtplx | prefill llama.cpp | ratio | decode mtplx \
         | decode llama.cpp | ratio | mtplx engine decode | server / engine \
         | server decode / bound |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    for r in rows {
        let (pm, pl) = (r.prefill(r.ttft_mtplx), r.prefill(r.ttft_llama));
        let engine = r.decode_engine.map_or(("-".into(), "-".into()), |e| {
            (format!("{e:.1}"), format!("{:.2}", r.decode_mtplx / e))
        });
        s.push_str(&format!(
            "| {} | {} | {pm:.1} tok/s ({:.2} s) | {pl:.1} tok/s ({:.2} s) | {:.2}x | {:.1} tok/s \
             | {:.1} tok/s | {:.2}x | {} tok/s | {} | {} |\n",
            r.context,
            r.prompt_tokens,
            r.ttft_mtplx,
            r.ttft_llama,
            pm / pl,
            r.decode_mtplx,
            r.decode_llama,
            r.decode_mtplx / r.decode_llama,
            engine.0,
            engine.1,
            r.of_bound()
                .map_or("-".into(), |b| format!("{:.0}%", 100.0 * b)),
        ));
    }
    s
}

fn report(args: &PeerArgs, sections: &[String]) -> String {
    let out = |cmd: &mut Command| {
        cmd.output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    };
    let date = out(Command::new("date").args(["-u", "+%F %H:%M UTC"]));
    let commit = out(Command::new("git").args(["describe", "--always", "--dirty"]));
    let cpu = crate::run::cpu_model().unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let contexts: Vec<String> = args.contexts.iter().map(usize::to_string).collect();
    format!(
        "# mtplx's server against llama.cpp's, one client\n\n\
         Written by `cargo xtask peer --server --threads {} --contexts {} --reps {} --gen {} \
         --kv-dtype {} --client {}` on {date}, commit `{commit}`, {cpu} ({cores} cores). K/V: mtplx \
         `{}`, llama.cpp `{}`. Both servers run alone, one \
         after the other, with {} compute threads and an 8,192-token window; the client \
         (`tools/bench/peer_server.py`, {}) streams `/v1/chat/completions` at \
         temperature 0 with a fresh prompt every round (`cache_prompt: false` for \
         llama.cpp, `generation_mode: \"ar\"` for mtplx). Prefill is prompt tokens over the \
         time to the first token; decode is streamed tokens over the time after it; medians \
         of the rounds. Ratios are mtplx / llama.cpp (above 1: mtplx is faster) and hold \
         within this run only. The engine column is mtplx's model in process at the same \
         context (no HTTP; the server's paged K/V layout), measured right after the server's \
         rounds at that context, so \
         `server / engine` is the share of its speed the server keeps. The bound is the \
         bytes a decode step reads at that context (the weights, the K/V of the prompt's \
         positions, a recurrent state) over the best read bandwidth the engine's threads \
         measured beside the file's contexts (a 1 GiB buffer, best of five passes each \
         time); `server decode / bound` is the server's decode over it. Raw figures: `raw/{}.json`.{}\n\n{}",
        args.threads,
        contexts.join(","),
        args.reps,
        args.gen,
        args.kv_dtype,
        args.client.name(),
        args.kv_dtype,
        match llama_cache(args.kv_dtype).as_str() {
            "" => "f16 (its default)".to_string(),
            flags => flags.to_string(),
        },
        args.threads,
        match args.client {
            Client::Sdk => "the `openai` SDK",
            Client::Http => "a plain HTTP client that parses each chunk's JSON and nothing more",
        },
        report_name(args.kv_dtype, args.client),
        crate::peer::llama_build_note(),
        sections.join("\n"),
    )
}

/// The client's one dependency, the `openai` SDK, installed for this user if missing.
pub(crate) fn ensure_openai() -> Result<()> {
    let has = |py: &Path| {
        Command::new(py)
            .args(["-c", "import openai"])
            .status()
            .is_ok_and(|s| s.success())
    };
    let py = Path::new("python3");
    if !has(py) {
        eprintln!("[peer-server] installing the openai SDK (pip install --user openai)");
        run_cmd(
            Command::new(py).args(["-m", "pip", "install", "--user", "openai"]),
            "pip install openai",
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_reads_the_clients_medians_and_divides_the_right_way() {
        let measured = json!({"table": [{"context": 500, "prompt_tokens": 520,
            "ttft_mtplx": 1.0, "ttft_llama": 2.0, "decode_mtplx": 150.0,
            "decode_llama": 100.0}]});
        let mut rows = rows_of(&measured).unwrap();
        assert_eq!(rows[0].prompt_tokens, 520);
        assert_eq!(rows[0].decode_engine, None);
        rows[0].decode_engine = Some(200.0);
        let t = table(&rows);
        // Prefill 520 tok/s against 260: mtplx twice as fast; decode 1.5x; the server keeps
        // 0.75 of its engine.
        assert!(
            t.contains("| 520.0 tok/s (1.00 s) | 260.0 tok/s (2.00 s) | 2.00x |"),
            "{t}"
        );
        assert!(
            t.contains("| 150.0 tok/s | 100.0 tok/s | 1.50x | 200.0 tok/s | 0.75 | - |"),
            "{t}"
        );
        assert!(rows_of(&json!({"table": [{"context": 1}]})).is_err());
        // The engine's decode, measured by the client between the server's rounds.
        let with_engine = json!({"table": [{"context": 500, "prompt_tokens": 520,
            "ttft_mtplx": 1.0, "ttft_llama": 2.0, "decode_mtplx": 150.0,
            "decode_llama": 100.0, "decode_engine": 160.0}]});
        assert_eq!(rows_of(&with_engine).unwrap()[0].decode_engine, Some(160.0));
        // The bound: 100 MB of weights + 520 positions x 0.1 MB of K/V + 8 MB of state =
        // 160 MB a step; at 40 GB/s that is 250 tok/s, of which 150 is 60%.
        let with_bound = json!({"table": [{"context": 500, "prompt_tokens": 520,
            "ttft_mtplx": 1.0, "ttft_llama": 2.0, "decode_mtplx": 150.0,
            "decode_llama": 100.0, "engine_figures": {"weight_bytes": 100e6,
            "kv_bytes_per_token": 0.1e6, "state_bytes": 8e6, "read_gbs": 40.0}}]});
        let rows = rows_of(&with_bound).unwrap();
        assert_eq!(rows[0].step_bytes, Some(160e6));
        assert!((rows[0].of_bound().unwrap() - 0.6).abs() < 1e-12);
        assert!(table(&rows).ends_with("| 60% |\n"), "{}", table(&rows));
        // Every row's bound takes the best read of the file's rows: 40 GB/s here, not the
        // second row's 20.
        let mut two = with_bound.clone();
        let mut second = two["table"][0].clone();
        second["engine_figures"]["read_gbs"] = json!(20.0);
        two["table"].as_array_mut().unwrap().push(second);
        let rows = rows_of(&two).unwrap();
        assert_eq!(rows[1].read_gbs, Some(40.0));
        assert!((rows[1].of_bound().unwrap() - 0.6).abs() < 1e-12);
    }
}
