//! Running cargo and fetching the default model: what several tasks need.

use std::process::Command;

use anyhow::{bail, Context, Result};
use mtplx_model::store::{ModelStore, DEFAULT_MODEL};

/// Fetches and verifies the default model into the store; returns its path.
pub fn fetch_model() -> Result<std::path::PathBuf> {
    let store = ModelStore::from_env();
    let path = store
        .ensure(&DEFAULT_MODEL, &mut |line| eprintln!("[model] {line}"))
        .context("fetching the default model")?;
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
