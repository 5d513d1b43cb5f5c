//! Project tasks: `cargo xtask <task>`.
//!
//! - `fetch-model`: fetch and verify the default model into the store.
//! - `test`: fetch the model, then run the whole test suite (what CI runs).
//! - `bench`: an agent session replayed against real servers, mtplx beside its re-prefill
//!   baseline and llama.cpp's server, one client, one run; report and plots under
//!   `target/bench/` (`bench/`). `bench --criterion`: the criterion benches, then the peer
//!   step (`peer.rs`): llama.cpp's llama-bench on the same file and threads. `peer` runs
//!   the peer step alone; `peer --server` compares the two servers through one client
//!   (`peer_server.rs`).
//! - `cold-bench`: the SSD tier's restore, write and overhead figures (`cold_bench.rs`).
//! - `train-mtp`: train the default model's MTP head (`train_mtp/`).
//! - `mtp-corpus`: the tokenized corpus of the GPU recipe for the MTP head (`mtp_corpus.rs`).
//! - `tidy`: the rules a machine can check (`tidy/`); its tests run with the others.
//! - `make-hybrid`: a small seeded Qwen3-Next checkpoint under the published names
//!   (`make_hybrid.rs`).
//! - `make-shaped`: a GGUF file of a published shape (Llama-3-8B) with seeded random
//!   weights in Q4_0 or Q4_K_M, for speed benchmarks (`make_shaped.rs`).

use anyhow::Result;
use clap::{Parser, Subcommand};

use mtplx_model::store::QWEN_CODER_05B_Q4_K_M;
use run::{cargo, fetch_known, fetch_model};

mod bench;
mod cold_bench;
mod gpu_bench;
mod make_hybrid;
mod make_shaped;
mod mtp_corpus;
mod peer;
mod peer_server;
mod run;
mod tidy;
mod train_mtp;

#[derive(Parser)]
#[command(name = "xtask", about = "mtplx project tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// The SSD tier's restore-vs-raw-read, write and overhead figures.
    ColdBench(cold_bench::ColdBenchArgs),
    /// Train the MTP head of the default model by self-distillation (trunk frozen, CPU).
    TrainMtp(train_mtp::TrainArgs),
    /// Tokenize the MTP head's training corpus for the GPU recipe (xtask/mtp_gpu).
    MtpCorpus(mtp_corpus::CorpusArgs),
    /// Fetch and verify the default model into $MTPLX_HOME/models.
    FetchModel,
    /// Fetch the default model, then run every test of the workspace.
    Test {
        /// Extra arguments passed to `cargo test`.
        #[arg(trailing_var_arg = true)]
        args: Vec<String>,
    },
    /// llama.cpp's llama-bench on the same file and threads, beside mtplx's own figures.
    Peer(peer::PeerArgs),
    /// Write a small seeded Qwen3-Next checkpoint under the published names.
    MakeHybrid(make_hybrid::MakeHybridArgs),
    /// Write a GGUF file of a published shape (Llama-3-8B) with seeded random weights,
    /// quantized as llama.cpp quantizes it (Q4_0, Q4_K_M): for speed benchmarks.
    MakeShaped(make_shaped::MakeShapedArgs),
    /// The tidy checks (dependency allow-lists, file sizes, module docs, the hasher, import
    /// cycles): prints every violation.
    Tidy,
    /// An agent session replayed against the servers (mtplx, its re-prefill baseline,
    /// llama.cpp's server), one client, one run: target/bench/report.md with its plots.
    /// `--criterion` runs the criterion suites and llama-bench instead.
    Bench(bench::BenchArgs),
    /// Issue 19's GPU benchmark against llama.cpp's CUDA server, in steps that each fit one
    /// call of the GPU machine: `pack` here, `run STEP` there, `report` here; `plan` lists
    /// the steps.
    GpuBench(gpu_bench::GpuBenchArgs),
}

fn main() -> Result<()> {
    match Cli::parse().task {
        Task::ColdBench(args) => cold_bench::run(&args)?,
        Task::TrainMtp(args) => train_mtp::run(&fetch_model()?, &args)?,
        Task::MtpCorpus(args) => {
            let b = mtplx_model::Bundle::load(&fetch_model()?, mtplx_model::WeightFormat::Native)?;
            mtp_corpus::run(&b, &args)?
        }
        Task::Peer(args) if args.server => {
            let files = match &args.model {
                Some(m) => vec![m.clone()],
                None => vec![fetch_model()?, fetch_known(&QWEN_CODER_05B_Q4_K_M)?],
            };
            peer_server::run(&args, &files)?
        }
        Task::Peer(args) => match (&args.model, std::env::var_os("MTPLX_TEST_MODEL")) {
            (Some(m), _) => peer::run(m, &args)?,
            (None, Some(m)) if args.mtplx_only => peer::run(m.as_ref(), &args)?,
            _ => peer::run(&fetch_model()?, &args)?,
        },
        Task::Tidy => tidy::run()?,
        Task::GpuBench(args) => gpu_bench::run(&args)?,
        Task::MakeHybrid(args) => {
            let gguf = match &args.tokenizer_from {
                Some(path) => path.clone(),
                None => fetch_model()?,
            };
            make_hybrid::run(&args, Some(&gguf))?
        }
        Task::MakeShaped(args) => {
            let tokenizer = match &args.tokenizer_from {
                Some(path) => path.clone(),
                None => fetch_model()?,
            };
            make_shaped::run(&args, &tokenizer)?
        }
        Task::FetchModel => {
            fetch_model()?;
        }
        Task::Test { args } => {
            let model = fetch_model()?;
            let env = [("MTPLX_TEST_MODEL", model.display().to_string())];
            // With the CUDA backend built in (its libraries load at run time, so it builds
            // everywhere; one build for all): without a device its tests check that it
            // fails cleanly and skip the rest.
            cargo(
                &[
                    "test",
                    "--workspace",
                    "--features",
                    "mtplx-model/cuda,mtplx-spec/cuda,mtplx-serve/cuda,mtplx-tests/cuda",
                ],
                &args,
                &env,
            )?;
        }
        Task::Bench(args) if !args.criterion => {
            let model = match &args.model {
                Some(m) => m.clone(),
                None => fetch_model()?,
            };
            bench::run(&args, &model)?
        }
        Task::Bench(bench::BenchArgs { args, .. }) => {
            let model = fetch_model()?;
            let env = [
                ("MTPLX_TEST_MODEL", model.display().to_string()),
                ("RAYON_NUM_THREADS", "2".to_string()),
            ];
            cargo(&["bench", "--workspace"], &args, &env)?;
            peer::run(&model, &peer::PeerArgs::default())?;
        }
    }
    Ok(())
}
