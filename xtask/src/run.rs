//! Running cargo and fetching models from the store: what several tasks need.

use std::process::Command;

use anyhow::{bail, Context, Result};
use mtplx_model::store::{KnownModel, ModelStore, DEFAULT_MODEL};

/// Fetches and verifies the default model into the store; returns its path.
pub fn fetch_model() -> Result<std::path::PathBuf> {
    fetch_known(&DEFAULT_MODEL)
}

/// Fetches and verifies a known model into the store; returns its path.
pub fn fetch_known(model: &KnownModel) -> Result<std::path::PathBuf> {
    let path = ModelStore::from_env()
        .ensure(model, &mut |line| eprintln!("[model] {line}"))
        .with_context(|| format!("fetching {}", model.id))?;
    eprintln!("[model] {} verified", path.display());
    Ok(path)
}

/// Runs `cargo args extra` with `envs`; fails if it does.
pub fn cargo(args: &[&str], extra: &[String], envs: &[(&str, String)]) -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args(args)
        .args(extra)
        .envs(envs.iter().map(|(k, v)| (*k, v.as_str())))
        .status()
        .context("running cargo")?;
    if !status.success() {
        bail!("cargo {} failed: {status}", args.join(" "));
    }
    Ok(())
}
