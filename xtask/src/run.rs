//! Running cargo, fetching models from the store, naming the machine: what several tasks
//! need.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Context, Result};
use mtplx_model::store::{KnownModel, ModelStore, DEFAULT_MODEL};

use crate::peer::{run_cmd, workspace_root};

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

/// Builds `mtplx-serve` (release, or the dev profile) with `features`; returns its path.
pub fn build_serve(release: bool, features: &[&str]) -> Result<PathBuf> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--quiet", "-p", "mtplx-serve"]);
    if release {
        cmd.arg("--release");
    }
    if !features.is_empty() {
        cmd.args(["--features", &features.join(",")]);
    }
    run_cmd(&mut cmd, "building mtplx-serve")?;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"));
    let bin = target
        .join(if release { "release" } else { "debug" })
        .join("mtplx-serve");
    if !bin.exists() {
        bail!("the build finished but {} is missing", bin.display());
    }
    Ok(bin)
}

/// The processor's model name, from /proc/cpuinfo.
pub fn cpu_model() -> Option<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("model name"))?;
    Some(line.split(':').nth(1)?.trim().to_owned())
}
