//! The workspace as the checks see it: its member crates, their source files, and what a
//! broken rule reports.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// One broken rule.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Violation {
    pub rule: &'static str,
    pub what: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.rule, self.what)
    }
}

/// The workspace's root (the folder above `xtask/`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

/// A member crate: its name, its folder.
#[derive(Debug, Clone)]
pub struct Member {
    pub name: String,
    pub dir: PathBuf,
}

/// The workspace's members, from its `Cargo.toml`.
pub fn members(root: &Path) -> Result<Vec<Member>> {
    let text = fs::read_to_string(root.join("Cargo.toml"))?;
    let start = text
        .find("members")
        .context("no members in the workspace's Cargo.toml")?;
    let list = &text[start..];
    let list = &list[list.find('[').context("members list")? + 1..];
    let list = &list[..list.find(']').context("members list end")?];
    let mut out = Vec::new();
    for m in list.split(',') {
        let rel = m.trim().trim_matches('"');
        if rel.is_empty() {
            continue;
        }
        let dir = root.join(rel);
        let name = package_name(&fs::read_to_string(dir.join("Cargo.toml"))?)
            .with_context(|| format!("no package name in {rel}/Cargo.toml"))?;
        out.push(Member { name, dir });
    }
    Ok(out)
}

fn package_name(manifest: &str) -> Option<String> {
    manifest
        .lines()
        .skip_while(|l| l.trim() != "[package]")
        .find_map(|l| l.trim().strip_prefix("name"))
        .and_then(|rest| rest.split('"').nth(1))
        .map(str::to_owned)
}

/// Every `.rs` file below `dir`, sorted.
pub fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            let name = e.file_name();
            if p.is_dir() {
                if name != "target"
                    && name != "fixtures"
                    && !name.to_string_lossy().starts_with('.')
                {
                    stack.push(p);
                }
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}
