//! The sizes of one `cargo xtask train-mtp` run.

use std::path::PathBuf;

/// Sizes of one run.
#[derive(Debug, Clone, clap::Args)]
pub struct TrainArgs {
    /// Where to write the head.
    #[arg(long, default_value = "models/mtp/smollm2-135m-mtp.safetensors")]
    pub out: PathBuf,
    /// Output rows of the drafting head (most frequent tokens).
    #[arg(long, default_value_t = 8192)]
    pub shortlist: usize,
    /// Optimiser steps.
    #[arg(long, default_value_t = 150)]
    pub steps: usize,
    /// Windows per step.
    #[arg(long, default_value_t = 8)]
    pub batch: usize,
    /// Positions per window.
    #[arg(long, default_value_t = 128)]
    pub window: usize,
    #[arg(long, default_value_t = 1e-3)]
    pub lr: f64,
    /// Code-editing turns built from source files.
    #[arg(long, default_value_t = 60)]
    pub code_turns: usize,
    /// Tokens each chat prompt's answer is generated to.
    #[arg(long, default_value_t = 64)]
    pub answer_tokens: usize,
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Skip training: only measure the acceptance of the head at `--out`.
    #[arg(long)]
    pub eval_only: bool,
}
