//! The tidy checks: the rules of `ARCHITECTURE.md` and `STYLE.md` that a machine can hold,
//! so a broken rule fails `cargo xtask test` the day it is broken (as rust-analyzer's
//! `xtask/src/tidy.rs` does):
//!
//! - each crate's dependencies are within its allow-list ([`ALLOWED`]), and an allowed
//!   exception is used only where [`CONFINED`] says;
//! - no source file is over [`MAX_LINES`] lines;
//! - every source file starts with a `//!` doc;
//! - nothing names the standard library's unstable-across-releases hasher;
//! - no two files of a crate import each other, directly or around a loop (`graph.rs`).
//!
//! `cargo xtask tidy` prints every violation; the tests below fail on any.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Result};

mod graph;
mod workspace;

use graph::check_cycles;
pub use workspace::{members, rust_files, workspace_root, Member, Violation};

/// Longest source file, in lines.
pub const MAX_LINES: usize = 800;

/// Each crate's normal (non-dev) dependencies: what ARCHITECTURE.md's invariants allow.
/// candle only in `mtplx-model`; tokio, hyper, tower and HTTP only in `mtplx-serve`; the
/// SSD tier's crate only under the bank; `mtplx-kv` knows no model, file or tensor library.
pub const ALLOWED: &[(&str, &[&str])] = &[
    ("mtplx-kernels", &["half", "bytemuck", "thiserror"]),
    (
        "mtplx-kv",
        &["mtplx-kernels", "half", "bytemuck", "thiserror"],
    ),
    (
        "mtplx-model",
        &[
            "mtplx-kernels",
            "mtplx-kv",
            "candle-core",
            "candle-nn",
            "tokenizers",
            "minijinja",
            "minijinja-contrib",
            "safetensors",
            "memmap2",
            "half",
            "sha2",
            "blake3",
            "zip",
            "thiserror",
            "serde",
            "serde_json",
            "cudarc",
            // Only for the CUDA backend's restore staging (copies on several threads).
            "rayon",
        ],
    ),
    ("mtplx-spec", &["mtplx-model", "mtplx-kv", "thiserror"]),
    (
        "mtplx-cold",
        // rayon: a restore's reads and checksums on several threads (blake3 uses it too).
        &["thiserror", "blake3", "rayon", "redb", "libc", "half"],
    ),
    ("mtplx-bank", &["mtplx-kv", "mtplx-cold", "thiserror"]),
    (
        "mtplx-serve",
        &[
            "mtplx-model",
            "mtplx-kv",
            "mtplx-spec",
            "mtplx-bank",
            "tokio",
            "hyper",
            "hyper-util",
            "http",
            "http-body-util",
            "bytes",
            "tower",
            "tower-http",
            "clap",
            "tracing",
            "tracing-subscriber",
            "serde",
            "serde_json",
            "thiserror",
            "blake3",
        ],
    ),
    (
        "mtplx-tests",
        &["mtplx-serve", "clap", "tokio", "tracing-subscriber"],
    ),
    (
        "xtask",
        &[
            "mtplx-model",
            "mtplx-kv",
            "mtplx-spec",
            // Only for `peer.rs`: the read bandwidth through the kernels' own thread pool.
            "mtplx-kernels",
            // Only for `train_mtp/` (see CONFINED).
            "candle-core",
            "candle-nn",
            "half",
            "anyhow",
            "clap",
            "serde_json",
            // Only for `bench/plot.rs`: the report's PNG plots and their font.
            "plotters",
            "dejavu",
        ],
    ),
];

/// Dependencies a crate may use in one folder only: (crate, the dependency's Rust name, the
/// folder under the crate). candle outside `mtplx-model` only in `xtask`'s MTP-head trainer:
/// training needs autograd and an optimiser, which the inference crates must not carry, and
/// the trained head is read back through `mtplx-model`'s own loader (`MtpHead::load`).
pub const CONFINED: &[(&str, &str, &str)] = &[
    ("xtask", "candle_core", "src/train_mtp"),
    ("xtask", "candle_nn", "src/train_mtp"),
    ("xtask", "mtplx_kernels", "src/peer.rs"),
    ("xtask", "plotters", "src/bench/plot.rs"),
    ("xtask", "dejavu", "src/bench/plot.rs"),
];

/// Files that name a [`CONFINED`] dependency outside its folder.
pub fn check_confined(members: &[Member]) -> Vec<Violation> {
    let mut out = Vec::new();
    for m in members {
        for &(_, dep, folder) in CONFINED.iter().filter(|(c, ..)| *c == m.name) {
            let home = m.dir.join(folder);
            for f in rust_files(&m.dir) {
                if f.starts_with(&home) {
                    continue;
                }
                let text = fs::read_to_string(&f).unwrap_or_default();
                if text.contains(&format!("{dep}::")) {
                    let rel = f.strip_prefix(&m.dir).unwrap_or(&f).display().to_string();
                    out.push(Violation {
                        rule: "dependencies",
                        what: format!("{}: {rel} uses {dep}, allowed only under {folder}/", m.name),
                    });
                }
            }
        }
    }
    out
}

/// The normal dependencies a manifest names (`[dependencies]` and target-specific ones).
pub fn dependencies(manifest: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut inside = false;
    for line in manifest.lines() {
        let l = line.trim();
        if l.starts_with('[') {
            inside = l == "[dependencies]"
                || (l.starts_with("[target.") && l.ends_with(".dependencies]"));
            continue;
        }
        if !inside || l.is_empty() || l.starts_with('#') {
            continue;
        }
        let key = l.split(['=', '.', ' ']).next().unwrap_or_default().trim();
        if !key.is_empty() {
            out.push(key.to_owned());
        }
    }
    out
}

/// Dependencies outside each crate's allow-list; crates the list does not name.
pub fn check_dependencies(members: &[Member]) -> Result<Vec<Violation>> {
    let allowed: HashMap<&str, &[&str]> = ALLOWED.iter().copied().collect();
    let mut out = Vec::new();
    for m in members {
        let manifest = fs::read_to_string(m.dir.join("Cargo.toml"))?;
        let Some(list) = allowed.get(m.name.as_str()) else {
            out.push(Violation {
                rule: "dependencies",
                what: format!("{} has no allow-list in xtask/src/tidy.rs", m.name),
            });
            continue;
        };
        for dep in dependencies(&manifest) {
            if !list.contains(&dep.as_str()) {
                out.push(Violation {
                    rule: "dependencies",
                    what: format!(
                        "{} depends on {dep}, which its allow-list does not name",
                        m.name
                    ),
                });
            }
        }
    }
    Ok(out)
}

/// Files over [`MAX_LINES`], files without a `//!` doc, and files naming the unstable
/// hasher, among `files` (shown relative to `root`).
pub fn check_files(root: &Path, files: &[PathBuf]) -> Result<Vec<Violation>> {
    // Spelled in two pieces so this file does not trip its own check.
    let hasher = ["Default", "Hasher"].concat();
    let mut out = Vec::new();
    for f in files {
        let text = fs::read_to_string(f)?;
        let rel = f.strip_prefix(root).unwrap_or(f).display().to_string();
        let lines = text.lines().count();
        if lines > MAX_LINES {
            out.push(Violation {
                rule: "file size",
                what: format!("{rel} has {lines} lines (at most {MAX_LINES})"),
            });
        }
        let first = text.lines().map(str::trim).find(|l| !l.is_empty());
        if !first.is_some_and(|l| l.starts_with("//!")) {
            out.push(Violation {
                rule: "module doc",
                what: format!("{rel} does not start with a `//!` doc"),
            });
        }
        if text.contains(&hasher) {
            out.push(Violation {
                rule: "hasher",
                what: format!("{rel} names {hasher} (not stable across Rust releases: use blake3)"),
            });
        }
    }
    Ok(out)
}

/// Every violation in the workspace at `root`.
pub fn check(root: &Path) -> Result<Vec<Violation>> {
    let members = members(root)?;
    let mut out = check_dependencies(&members)?;
    out.extend(check_confined(&members));
    let files: Vec<PathBuf> = members.iter().flat_map(|m| rust_files(&m.dir)).collect();
    out.extend(check_files(root, &files)?);
    out.extend(check_cycles(&members)?);
    out.sort();
    Ok(out)
}

/// `cargo xtask tidy`: prints every violation; fails if there is one.
pub fn run() -> Result<()> {
    let found = check(&workspace_root())?;
    for v in &found {
        println!("{v}");
    }
    if !found.is_empty() {
        bail!("{} tidy violation(s)", found.len());
    }
    println!("tidy: no violations");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::graph::{cycles, graph};
    use super::*;

    fn for_rule(rule: &str) -> Vec<String> {
        check(&workspace_root())
            .unwrap()
            .into_iter()
            .filter(|v| v.rule == rule)
            .map(|v| v.what)
            .collect()
    }

    #[test]
    fn every_source_file_has_a_module_doc() {
        let found = for_rule("module doc");
        assert!(found.is_empty(), "{found:#?}");
    }

    #[test]
    fn no_two_files_of_a_crate_import_each_other() {
        let found = for_rule("import cycle");
        assert!(found.is_empty(), "{found:#?}");
    }

    #[test]
    fn every_crate_depends_only_on_what_its_allow_list_names() {
        let found = for_rule("dependencies");
        assert!(found.is_empty(), "{found:#?}");
    }

    #[test]
    fn no_source_file_is_over_the_line_limit() {
        let found = for_rule("file size");
        assert!(found.is_empty(), "{found:#?}");
    }

    #[test]
    fn nothing_names_the_unstable_hasher() {
        let found = for_rule("hasher");
        assert!(found.is_empty(), "{found:#?}");
    }

    /// A crate written to a temporary folder: (relative path, content) pairs.
    fn planted(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (path, text) in files {
            let p = dir.path().join(path);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, text).unwrap();
        }
        dir
    }

    #[test]
    fn a_planted_cycle_is_found_through_re_exports_and_a_layered_crate_passes() {
        let cyclic = planted(&[
            (
                "src/lib.rs",
                "//! Root.\nmod a;\nmod b;\npub use a::Thing;\n",
            ),
            (
                "src/a.rs",
                "//! A.\nuse crate::b::Other;\npub struct Thing;\n",
            ),
            // `b` reaches `a` through the root's re-export.
            ("src/b.rs", "//! B.\npub struct Other(crate::Thing);\n"),
        ]);
        // A parent that calls into a child that uses the parent's own item.
        let parent_child = planted(&[
            ("src/lib.rs", "//! Root.\nmod store;\n"),
            (
                "src/store/mod.rs",
                "//! Store.\nmod read;\npub struct Inner;\nfn get(i: &Inner) { read::restore(i) }\n",
            ),
            ("src/store/read.rs", "//! Read.\nuse super::Inner;\npub fn restore(_: &Inner) {}\n"),
        ]);
        assert_eq!(
            cycles(&graph(&parent_child.path().join("src")).unwrap()).len(),
            1
        );
        let g = graph(&cyclic.path().join("src")).unwrap();
        let found = cycles(&g);
        assert_eq!(found.len(), 1, "{found:?}");
        let names: Vec<_> = found[0]
            .iter()
            .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["a.rs", "b.rs"]);

        let layered = planted(&[
            ("src/lib.rs", "//! Root.\nmod a;\nmod b;\npub use a::Thing;\n"),
            ("src/a.rs", "//! A.\npub struct Thing;\n"),
            (
                "src/b/mod.rs",
                "//! B.\nmod c;\nuse super::Thing;\npub use c::{Deep, Other as O};\n",
            ),
            ("src/b/c.rs", "//! C.\nuse crate::{a::Thing};\npub struct Deep(Thing);\n#[cfg(test)]\nmod tests {\n    use crate::b::O;\n}\n"),
        ]);
        assert!(cycles(&graph(&layered.path().join("src")).unwrap()).is_empty());
    }

    #[test]
    fn planted_file_and_dependency_violations_are_found() {
        let long: String = std::iter::once("//! Long.\n".to_owned())
            .chain((0..MAX_LINES).map(|i| format!("// {i}\n")))
            .collect();
        let bad = planted(&[
            ("long.rs", long.as_str()),
            ("undocumented.rs", "fn main() {}\n"),
            (
                "hashes.rs",
                &format!(
                    "//! Hashes.\nuse std::collections::hash_map::{};\n",
                    ["Default", "Hasher"].concat()
                ),
            ),
        ]);
        let files = rust_files(bad.path());
        let mut rules: Vec<&str> = check_files(bad.path(), &files)
            .unwrap()
            .iter()
            .map(|v| v.rule)
            .collect();
        rules.sort();
        assert_eq!(rules, ["file size", "hasher", "module doc"]);

        let manifest = "[package]\nname = \"mtplx-kv\"\n\n[dependencies]\nthiserror.workspace = true\ncandle-core = \"0.11\"\n\n[dev-dependencies]\nproptest.workspace = true\n";
        let krate = planted(&[("Cargo.toml", manifest)]);
        let found = check_dependencies(&[Member {
            name: "mtplx-kv".into(),
            dir: krate.path().to_path_buf(),
        }])
        .unwrap();
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].what.contains("candle-core"), "{found:?}");

        // An allowed exception used outside its folder.
        // (Spelled with `format!` so this file does not trip the check itself.)
        let head = format!("//! Head.\nuse {}::Tensor;\n", "candle_core");
        let peer = format!("//! Peer.\nfn f(_: {}::Linear) {{}}\n", "candle_nn");
        let xtask = planted(&[("src/train_mtp/head.rs", &head), ("src/peer.rs", &peer)]);
        let found = check_confined(&[Member {
            name: "xtask".into(),
            dir: xtask.path().to_path_buf(),
        }]);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].what.contains("src/peer.rs uses candle_nn"),
            "{found:?}"
        );
    }
}
