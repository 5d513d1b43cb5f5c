//! The peer step of `cargo xtask bench`: llama.cpp's own `llama-bench`, built from the
//! `llama-cpp-python` sdist on PyPI, run on the same GGUF file with the same threads, in the
//! same run as mtplx's own decode and prefill figures, so the ratios are honest and anyone
//! can reproduce them.
//!
//! - The sdist is fetched with `pip download` and built once with cmake (Release, no curl,
//!   no web UI) under `target/peer/`; later runs reuse the binary.
//! - mtplx is measured by this same binary rebuilt in release (`peer --mtplx-only`), with
//!   `MTPLX_THREADS` set to the same thread count: prefill of `p` tokens into an empty
//!   cache in chunks of 512 (llama-bench's micro-batch), decode of `n` tokens from an empty
//!   context (llama-bench's `tg`), mean of `reps` runs after one warm-up.
//! - Memory bandwidth is measured by the same release process (the kernel pool's threads
//!   reading a 1 GiB buffer), and decode is reported as GB/s of weights streamed: the
//!   model's weight bytes × tokens per second.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use mtplx_kv::{CacheFactory, Sequence};
use mtplx_model::{prefill, ForwardOutput, LanguageModel, Model, Want};

/// The llama.cpp release the peer is built from (vendored by this sdist).
const SDIST: &str = "llama-cpp-python==0.3.36";
const SDIST_DIR: &str = "llama_cpp_python-0.3.36";

#[derive(Args, Debug, Clone)]
pub struct PeerArgs {
    /// Threads for both engines.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Prompt lengths to prefill.
    #[arg(long, value_delimiter = ',', default_values_t = [512, 2048])]
    pub prompts: Vec<usize>,
    /// Tokens to decode from an empty context.
    #[arg(long, default_value_t = 128)]
    pub gen: usize,
    /// Repetitions of each measurement (the mean is reported).
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// The GGUF file both engines run [default: the default model, fetched].
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Also decode `--gen` tokens at each of these context depths (tokens prefilled first,
    /// in one growing cache): the engine's own decode at a context, what `--server` sets to
    /// the servers' prompt lengths to compare the server with its engine.
    #[arg(long, value_delimiter = ',')]
    pub depths: Vec<usize>,
    /// Measure through the servers instead: mtplx-serve against llama.cpp's llama-server,
    /// one client, on the default file and the Qwen2.5-Coder Q4_K_M file (or `--model`);
    /// printed and written to docs/bench/peer-server.md (`peer_server.rs`).
    #[arg(long)]
    pub server: bool,
    /// Prompt lengths of the server comparison, in tokens (about).
    #[arg(long, value_delimiter = ',', default_values_t = [500, 2000, 4000, 6500])]
    pub contexts: Vec<usize>,
    /// The element type mtplx keeps K/V in (the engine's caches and the server's
    /// `--kv-dtype`); with `q8` or `q4`, llama.cpp's server keeps its cache in the matching
    /// `q8_0` or `q4_1` (with flash attention, which a quantized V cache needs there).
    #[arg(long, default_value = "f16")]
    pub kv_dtype: mtplx_kv::KvDtype,
    /// The K/V layout of mtplx's engine measurement: contiguous against llama-bench;
    /// `--server` measures the engine in the server's own default, paged.
    #[arg(long, value_enum, default_value = "contiguous")]
    pub kv_layout: EngineLayout,
    /// The client of the server comparison: `sdk`, the `openai` SDK (what most agents
    /// use), or `http`, a plain HTTP client that reads the stream's lines and parses each
    /// chunk's JSON and nothing more (on a machine with as many cores as compute threads,
    /// the client's own CPU slows whichever server it reads).
    #[arg(long, value_enum, default_value = "sdk")]
    pub client: Client,
    /// Measure mtplx only and print one JSON line (what the peer step runs in release).
    #[arg(long, hide = true)]
    pub mtplx_only: bool,
}

/// The client of `--server` (`--client`).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Client {
    Sdk,
    Http,
}

impl Client {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Client::Sdk => "sdk",
            Client::Http => "http",
        }
    }
}

/// A host K/V layout for the engine measurement (`--kv-layout`).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineLayout {
    Contiguous,
    Paged,
    Segmented,
}

impl EngineLayout {
    fn factory(self) -> CacheFactory {
        match self {
            EngineLayout::Contiguous => CacheFactory::contiguous(),
            EngineLayout::Paged => CacheFactory::paged(),
            EngineLayout::Segmented => CacheFactory::segmented(),
        }
    }
}

impl Default for PeerArgs {
    fn default() -> Self {
        PeerArgs {
            threads: 2,
            prompts: vec![512, 2048],
            gen: 128,
            reps: 3,
            model: None,
            depths: Vec::new(),
            server: false,
            contexts: vec![500, 2000, 4000, 6500],
            kv_dtype: mtplx_kv::KvDtype::F16,
            kv_layout: EngineLayout::Contiguous,
            client: Client::Sdk,
            mtplx_only: false,
        }
    }
}

/// Tokens per second of each test, keyed like llama-bench's (`pp512`, `tg128`).
#[derive(Debug, Default)]
pub(crate) struct Figures(Vec<(String, f64)>);

impl Figures {
    pub(crate) fn get(&self, test: &str) -> Option<f64> {
        self.0.iter().find(|(t, _)| t == test).map(|(_, v)| *v)
    }
}

/// Runs the peer step: builds llama-bench if needed, measures both engines and prints the
/// comparison.
pub fn run(model: &Path, args: &PeerArgs) -> Result<()> {
    if args.mtplx_only {
        let (figures, weight_bytes) = measure_mtplx(model, args)?;
        let obj: serde_json::Map<String, serde_json::Value> = figures
            .0
            .iter()
            .map(|(k, v)| (k.clone(), serde_json::json!(v)))
            .chain([("weight_bytes".to_string(), serde_json::json!(weight_bytes))])
            .collect();
        println!("{}", serde_json::Value::Object(obj));
        return Ok(());
    }
    let bench = ensure_llama("llama-bench")?;
    let (ours, weight_bytes) = mtplx_in_release(model, args)?;
    let bandwidth = ours.get(READ_GBS).context("no read bandwidth from mtplx")?;
    eprintln!(
        "[peer] memory bandwidth ({} threads): {bandwidth:.1} GB/s",
        args.threads
    );
    let theirs = run_llama_bench(&bench, model, args)?;
    let tests: Vec<String> = args
        .prompts
        .iter()
        .map(|p| format!("pp{p}"))
        .chain([format!("tg{}", args.gen)])
        .collect();
    println!(
        "\npeer comparison: {} , {} threads, {:.1} MB of weights per token",
        model.display(),
        args.threads,
        weight_bytes as f64 / 1e6
    );
    println!(
        "{:<8} {:>12} {:>12} {:>8}",
        "test", "mtplx t/s", "llama t/s", "ratio"
    );
    for t in &tests {
        let (a, b) = (ours.get(t), theirs.get(t));
        let fmt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
        println!("{t:<8} {:>12} {:>12} {:>8}", fmt(a), fmt(b), ratio(a, b));
    }
    let tg = format!("tg{}", args.gen);
    for (name, f) in [("mtplx", &ours), ("llama.cpp", &theirs)] {
        if let Some(tps) = f.get(&tg) {
            let gbs = tps * weight_bytes as f64 / 1e9;
            println!(
                "{name:<10} decode streams {gbs:.1} GB/s of weights = {:.0}% of the measured \
                 {bandwidth:.1} GB/s",
                100.0 * gbs / bandwidth
            );
        }
    }
    Ok(())
}

pub(crate) fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

pub(crate) fn run_cmd(cmd: &mut Command, what: &str) -> Result<()> {
    let status = cmd.status().with_context(|| format!("running {what}"))?;
    if !status.success() {
        bail!("{what} failed: {status}");
    }
    Ok(())
}

/// Where llama.cpp is fetched and built: `$MTPLX_PEER_DIR`, else `target/peer/`.
fn peer_dir() -> PathBuf {
    std::env::var_os("MTPLX_PEER_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target/peer"))
}

/// `build/bin/<target>` (`llama-bench`, `llama-server`) under [`peer_dir`] (`build-noamx/`
/// on a CPU with AMX: [`isa_flags`]), fetched and built on first use.
pub(crate) fn ensure_llama(target: &str) -> Result<PathBuf> {
    let dir = peer_dir();
    let isa = this_cpu_isa_flags();
    // A build without AMX has a folder of its own (a native build may already be there).
    let build = dir.join(if isa.is_empty() {
        "build"
    } else {
        "build-noamx"
    });
    let bin = build.join("bin").join(target);
    if bin.exists() {
        return Ok(bin);
    }
    std::fs::create_dir_all(&dir)?;
    let src = dir.join(SDIST_DIR);
    if !src.join("vendor/llama.cpp/CMakeLists.txt").exists() {
        eprintln!("[peer] fetching the {SDIST} sdist");
        // `--no-binary` for this package only: with `:all:` pip also builds the sdist's
        // build requirements (cmake itself) from source just to read its metadata.
        run_cmd(
            Command::new("python3")
                .args(["-m", "pip", "download", "--no-deps", "--no-binary"])
                .arg("llama-cpp-python")
                .arg(SDIST)
                .arg("-d")
                .arg(&dir),
            "pip download",
        )?;
        let tarball = dir.join(format!("{SDIST_DIR}.tar.gz"));
        run_cmd(
            Command::new("tar")
                .arg("xzf")
                .arg(&tarball)
                .arg("-C")
                .arg(&dir),
            "unpacking the sdist",
        )?;
    }
    let has_cmake = Command::new("cmake")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_cmake {
        bail!(
            "building llama.cpp needs cmake, which is not on PATH: `python3 -m pip install cmake`"
        );
    }
    eprintln!("[peer] building {target} (cmake, Release; several minutes on 2 cores)");
    if !isa.is_empty() {
        eprintln!("[peer] this CPU has AMX: llama.cpp built for its other extensions ({isa:?})");
    }
    run_cmd(
        Command::new("cmake")
            .arg("-S")
            .arg(src.join("vendor/llama.cpp"))
            .arg("-B")
            .arg(&build)
            .args([
                "-DCMAKE_BUILD_TYPE=Release",
                "-DLLAMA_CURL=OFF",
                "-DLLAMA_BUILD_UI=OFF",
                "-DLLAMA_USE_PREBUILT_UI=OFF",
                "-DBUILD_SHARED_LIBS=OFF",
            ])
            .args(&isa),
        "cmake configure",
    )?;
    let jobs = std::thread::available_parallelism().map_or(2, |n| n.get());
    run_cmd(
        Command::new("cmake")
            .arg("--build")
            .arg(&build)
            .args(["--config", "Release", "--target", target, "-j"])
            .arg(jobs.to_string()),
        "cmake build",
    )?;
    if !bin.exists() {
        bail!("the build finished but {} is missing", bin.display());
    }
    Ok(bin)
}

/// The CMake options that build llama.cpp for this CPU (`cpuinfo`, `/proc/cpuinfo`'s text)
/// without its AMX code: none (ggml's own `GGML_NATIVE`) on a CPU without AMX. ggml's AMX
/// matrix product, which a native build chooses on an AMX CPU, crashes at the first decode
/// on this project's AMX machines (a segfault in `ggml_backend_amx_mul_mat`); turning it off
/// at run time (`--no-repack`) also turns off the repacked Q4_0 / Q4_K products that the
/// other extensions give, which would understate llama.cpp on K-quant files. So the build
/// names this CPU's extensions one by one, AMX left out.
fn isa_flags(cpuinfo: &str) -> Vec<String> {
    let flags: std::collections::HashSet<&str> = cpuinfo
        .lines()
        .find(|l| l.starts_with("flags"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, f)| f.split_whitespace().collect())
        .unwrap_or_default();
    if !flags.contains("amx_int8") {
        return Vec::new();
    }
    let mut out = vec!["-DGGML_NATIVE=OFF".to_string()];
    for (flag, option) in [
        ("avx", "GGML_AVX"),
        ("avx2", "GGML_AVX2"),
        ("bmi2", "GGML_BMI2"),
        ("fma", "GGML_FMA"),
        ("f16c", "GGML_F16C"),
        ("avx_vnni", "GGML_AVX_VNNI"),
        ("avx512f", "GGML_AVX512"),
        ("avx512vbmi", "GGML_AVX512_VBMI"),
        ("avx512_vnni", "GGML_AVX512_VNNI"),
        ("avx512_bf16", "GGML_AVX512_BF16"),
    ] {
        let on = if flags.contains(flag) { "ON" } else { "OFF" };
        out.push(format!("-D{option}={on}"));
    }
    out
}

/// [`isa_flags`] for the CPU this runs on.
fn this_cpu_isa_flags() -> Vec<String> {
    isa_flags(&std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default())
}

/// What a report says of the llama.cpp build on this CPU: nothing for a native one.
pub(crate) fn llama_build_note() -> String {
    let isa = this_cpu_isa_flags();
    if isa.is_empty() {
        return String::new();
    }
    format!(
        " llama.cpp is built without its AMX code on this AMX CPU (ggml's AMX matrix product \
         crashes at the first decode on these machines), for each of its other extensions: \
         `{}`.",
        isa.join(" ")
    )
}

/// Runs llama-bench (`-o csv`) and reads the mean tokens per second of each test.
fn run_llama_bench(bin: &Path, model: &Path, args: &PeerArgs) -> Result<Figures> {
    let prompts: Vec<String> = args.prompts.iter().map(usize::to_string).collect();
    let out = Command::new(bin)
        .arg("-m")
        .arg(model)
        .args(["-t", &args.threads.to_string()])
        .args(["-p", &prompts.join(",")])
        .args(["-n", &args.gen.to_string()])
        .args(["-r", &args.reps.to_string()])
        .args(["-o", "csv"])
        .output()
        .context("running llama-bench")?;
    if !out.status.success() {
        bail!(
            "llama-bench failed: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    parse_csv(&String::from_utf8_lossy(&out.stdout))
}

fn parse_csv(text: &str) -> Result<Figures> {
    let split = |l: &str| -> Vec<String> {
        l.split(',')
            .map(|f| f.trim().trim_matches('"').to_string())
            .collect()
    };
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let header = split(lines.next().context("llama-bench printed nothing")?);
    let col = |name: &str| {
        header
            .iter()
            .position(|h| h == name)
            .with_context(|| format!("llama-bench's CSV has no `{name}` column"))
    };
    let (np, ng, ts) = (col("n_prompt")?, col("n_gen")?, col("avg_ts")?);
    let mut figures = Figures::default();
    for l in lines {
        let f = split(l);
        let (p, g): (usize, usize) = (f[np].parse()?, f[ng].parse()?);
        let test = if g == 0 {
            format!("pp{p}")
        } else {
            format!("tg{g}")
        };
        figures.0.push((test, f[ts].parse()?));
    }
    Ok(figures)
}

/// Runs this binary in release with `--mtplx-only` and reads its JSON line.
pub(crate) fn mtplx_in_release(model: &Path, args: &PeerArgs) -> Result<(Figures, usize)> {
    let argv = mtplx_command(args);
    let out = Command::new(&argv[0])
        .args(&argv[1..])
        .args(depths(&args.depths))
        .env("MTPLX_TEST_MODEL", model)
        .env("MTPLX_THREADS", args.threads.to_string())
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("running mtplx's measurement")?;
    if !out.status.success() {
        bail!("mtplx's measurement failed: {}", out.status);
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().context("no figures from mtplx")?;
    let v: serde_json::Value = serde_json::from_str(line)?;
    let obj = v.as_object().context("figures are a JSON object")?;
    let mut figures = Figures::default();
    let mut weight_bytes = 0;
    for (k, v) in obj {
        if k == "weight_bytes" {
            weight_bytes = v.as_u64().unwrap_or(0) as usize;
        } else if let Some(x) = v.as_f64() {
            figures.0.push((k.clone(), x));
        }
    }
    Ok((figures, weight_bytes))
}

/// The command line of mtplx's measurement in a release build (`peer --mtplx-only`), less
/// its depths; it reads the model from `MTPLX_TEST_MODEL` and prints its figures as one JSON
/// line.
pub(crate) fn mtplx_command(args: &PeerArgs) -> Vec<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let prompts: Vec<String> = args.prompts.iter().map(usize::to_string).collect();
    let run = "run --release --quiet --package xtask -- peer --mtplx-only";
    let mut argv: Vec<String> = std::iter::once(cargo)
        .chain(run.split(' ').map(String::from))
        .collect();
    for (flag, value) in [
        ("--threads", args.threads.to_string()),
        ("--prompts", prompts.join(",")),
        ("--gen", args.gen.to_string()),
        ("--reps", args.reps.to_string()),
        ("--kv-dtype", args.kv_dtype.to_string()),
        ("--kv-layout", layout_name(args.kv_layout)),
    ] {
        argv.extend([flag.to_string(), value]);
    }
    argv
}

/// The flag value clap reads back as `layout`.
fn layout_name(layout: EngineLayout) -> String {
    use clap::ValueEnum;
    layout
        .to_possible_value()
        .expect("every layout has a name")
        .get_name()
        .to_string()
}

/// `--depths a,b` when there are any.
fn depths(d: &[usize]) -> Vec<String> {
    if d.is_empty() {
        return Vec::new();
    }
    let list: Vec<String> = d.iter().map(usize::to_string).collect();
    vec!["--depths".into(), list.join(",")]
}

/// A deterministic token stream that looks like text to the model.
fn tokens(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| 100 + (i * 7919) % 20_000).collect()
}

/// mtplx's own figures on the weights the server would choose for the file: as its
/// `MTPLX_WEIGHTS` says, else [`mtplx_model::Bundle::default_format`]; in this process.
fn measure_mtplx(model_path: &Path, args: &PeerArgs) -> Result<(Figures, usize)> {
    let format = match std::env::var("MTPLX_WEIGHTS") {
        Ok(w) => mtplx_model::WeightFormat::parse(&w)
            .with_context(|| format!("MTPLX_WEIGHTS={w}: native, native-q8, f32 or quantized"))?,
        Err(_) => mtplx_model::Bundle::default_format(model_path)?,
    };
    let model = Model::load(model_path, format)?;
    let shape = model.state_shape();
    let factory = args.kv_layout.factory().with_dtype(args.kv_dtype)?;
    let mut figures = Figures::default();
    let mean = |f: &mut dyn FnMut() -> Result<f64>| -> Result<f64> {
        f()?; // warm-up
        let mut sum = 0.0;
        for _ in 0..args.reps.max(1) {
            sum += f()?;
        }
        Ok(sum / args.reps.max(1) as f64)
    };
    for &p in &args.prompts {
        let prompt = tokens(p);
        let tps = mean(&mut || {
            let mut cache = Sequence::new(&factory, &shape);
            let t = Instant::now();
            prefill(&model, &prompt, &mut cache, 512)?;
            Ok(p as f64 / t.elapsed().as_secs_f64())
        })?;
        eprintln!("[peer] mtplx pp{p}: {tps:.1} tok/s");
        figures.0.push((format!("pp{p}"), tps));
    }
    let n = args.gen;
    let tps = mean(&mut || {
        let mut cache = Sequence::new(&factory, &shape);
        let mut out = ForwardOutput::default();
        let t = Instant::now();
        let mut tok = 1u32;
        for _ in 0..n {
            model.forward_into(&[tok], &mut cache, Want::Last, &mut out)?;
            tok = mtplx_model::sampling::argmax(out.last_logits());
        }
        Ok(n as f64 / t.elapsed().as_secs_f64())
    })?;
    eprintln!("[peer] mtplx tg{n}: {tps:.1} tok/s");
    figures.0.push((format!("tg{n}"), tps));
    // Decode at depth: one cache grows through the depths in order (the prefill of each
    // step is the warm-up of its decode).
    let mut sorted = args.depths.clone();
    sorted.sort_unstable();
    let mut cache = Sequence::new(&factory, &shape);
    let mut out = ForwardOutput::default();
    let mut len = 0usize;
    for d in sorted {
        if d > len {
            prefill(&model, &tokens(d - len), &mut cache, 512)?;
            len = d;
        }
        let t = Instant::now();
        let mut tok = 1u32;
        for _ in 0..n {
            model.forward_into(&[tok], &mut cache, Want::Last, &mut out)?;
            tok = mtplx_model::sampling::argmax(out.last_logits());
        }
        len += n;
        let tps = n as f64 / t.elapsed().as_secs_f64();
        eprintln!("[peer] mtplx tg{n}@{d}: {tps:.1} tok/s");
        figures.0.push((format!("tg{n}@{d}"), tps));
    }
    // What a decode step reads besides the weights, and what the memory gives, for the
    // bound (`peer --server`'s table): K/V bytes a cached token, a recurrent state's bytes.
    figures.0.push((
        KV_BYTES.into(),
        shape.kv.bytes_per_token(args.kv_dtype) as f64,
    ));
    figures
        .0
        .push((STATE_BYTES.into(), shape.recurrent_bytes() as f64));
    let gbs = read_bandwidth();
    eprintln!("[peer] mtplx's pool reads {gbs:.1} GB/s");
    figures.0.push((READ_GBS.into(), gbs));
    Ok((figures, model.weight_bytes()))
}

/// The release measurement's figure names: the read bandwidth (GB/s), K/V bytes a cached
/// token, a recurrent state's bytes.
pub(crate) const READ_GBS: &str = "read_gbs";
pub(crate) const KV_BYTES: &str = "kv_bytes_per_token";
pub(crate) const STATE_BYTES: &str = "state_bytes";

/// Read bandwidth in GB/s as the kernels see it: the kernel pool's threads (`MTPLX_THREADS`)
/// each folding its part of a 1 GiB buffer, best of five passes. Measured in the release
/// process beside the model's own figures (`--mtplx-only`): the debug xtask's summing loop
/// had read 34.6 GB/s where this machine's kernels streamed 37-42.
fn read_bandwidth() -> f64 {
    let pool = mtplx_kernels::pool::Pool::global();
    let words = (1usize << 30) / 8;
    let buf: Vec<u64> = (0..words as u64).collect();
    let threads = pool.threads();
    let part = words / threads;
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        pool.run(threads, &|p| {
            std::hint::black_box(
                buf[p * part..(p + 1) * part]
                    .iter()
                    .fold(0u64, |a, &b| a ^ b),
            );
        });
        best = best.min(t.elapsed().as_secs_f64());
    }
    (part * threads * 8) as f64 / best / 1e9
}

/// `a / b` as a ratio (`1.50x`), or `-` where either is missing or `b` is not positive.
pub(crate) fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}x", a / b),
        _ => "-".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The engine's command line names its layout as clap reads it back.
    #[test]
    fn the_engine_command_names_its_layout_as_clap_reads_it() {
        use clap::ValueEnum;
        for layout in EngineLayout::value_variants() {
            let args = PeerArgs {
                kv_layout: *layout,
                ..PeerArgs::default()
            };
            let argv = mtplx_command(&args);
            let at = argv.iter().position(|a| a == "--kv-layout").unwrap();
            assert_eq!(EngineLayout::from_str(&argv[at + 1], false), Ok(*layout));
        }
    }

    #[test]
    fn llama_cpp_is_built_without_amx_where_the_cpu_has_it() {
        let plain = "processor\t: 0\nflags\t\t: fpu sse avx avx2 fma f16c bmi2 avx512f\n";
        assert!(isa_flags(plain).is_empty(), "native where there is no AMX");
        let amx =
            "flags\t\t: avx avx2 fma f16c bmi2 avx512f avx512vbmi avx512_vnni amx_tile amx_int8\n";
        let got = isa_flags(amx);
        assert_eq!(got[0], "-DGGML_NATIVE=OFF");
        for on in [
            "-DGGML_AVX512=ON",
            "-DGGML_AVX512_VNNI=ON",
            "-DGGML_AVX512_VBMI=ON",
        ] {
            assert!(got.iter().any(|f| f == on), "{on} in {got:?}");
        }
        for off in ["-DGGML_AVX512_BF16=OFF", "-DGGML_AVX_VNNI=OFF"] {
            assert!(got.iter().any(|f| f == off), "{off} in {got:?}");
        }
        assert!(got.iter().all(|f| !f.contains("AMX")));
    }

    #[test]
    fn reads_llama_bench_csv() {
        let csv = "build_commit,n_threads,n_prompt,n_gen,avg_ts,stddev_ts\n\
                   \"0c1e570\",\"2\",\"512\",\"0\",\"277.5\",\"1.2\"\n\
                   \"0c1e570\",\"2\",\"0\",\"128\",\"115.25\",\"0.5\"\n";
        let f = parse_csv(csv).unwrap();
        assert_eq!(f.get("pp512"), Some(277.5));
        assert_eq!(f.get("tg128"), Some(115.25));
        assert_eq!(f.get("pp2048"), None);
    }
}
