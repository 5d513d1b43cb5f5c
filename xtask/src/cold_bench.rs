//! `cargo xtask cold-bench`: the SSD tier's figures, measured side by side in one run on
//! the disk under `--dir`: restore throughput (direct into the sink's rows, and staged
//! through `write_rows`) against a raw sequential read of the same blob files, with the
//! page cache dropped (`posix_fadvise(DONTNEED)`) and warm; write throughput; and the
//! shares of restore time the blake3 verification (the part not hidden behind I/O) and the
//! manifest take. The figures are printed by `crates/mtplx-cold/benches/cold.rs`.

use std::path::PathBuf;

use anyhow::Result;

#[derive(clap::Args)]
pub struct ColdBenchArgs {
    /// A directory on the disk to measure (default: the system temp dir).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Only the side-by-side summary: criterion runs each benchmark once.
    #[arg(long)]
    quick: bool,
    /// The element type of the stored rows (f32, f16, bf16, q8, q4; default the bench's f32).
    #[arg(long)]
    kv_dtype: Option<String>,
}

pub fn run(args: &ColdBenchArgs) -> Result<()> {
    let mut env = Vec::new();
    if let Some(dir) = &args.dir {
        env.push(("MTPLX_BENCH_DIR", dir.display().to_string()));
    }
    if let Some(dtype) = &args.kv_dtype {
        env.push(("MTPLX_BENCH_KV_DTYPE", dtype.clone()));
    }
    let extra: Vec<String> = if args.quick {
        vec!["--".into(), "--test".into()]
    } else {
        Vec::new()
    };
    crate::run::cargo(
        &["bench", "-p", "mtplx-cold", "--bench", "cold"],
        &extra,
        &env,
    )
}
