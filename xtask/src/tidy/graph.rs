//! Import cycles between the files of a crate: each file's references (`use` trees and
//! `crate::` / `super::` / `self::` / child-module paths in code, outside `#[cfg(test)]`
//! modules), resolved through `pub use` re-exports to the file that defines what they name,
//! and the strongly connected sets of the resulting graph.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::Result;

use super::workspace::{rust_files, Member, Violation};

/// A crate's source files as modules: module path (segments below the crate root) → file.
fn module_files(src: &Path) -> BTreeMap<Vec<String>, PathBuf> {
    let mut out = BTreeMap::new();
    for f in rust_files(src) {
        let rel = f.strip_prefix(src).expect("below src");
        let mut segs: Vec<String> = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        let last = segs.pop().expect("a file name");
        match last.as_str() {
            "lib.rs" | "main.rs" if segs.is_empty() => {}
            "mod.rs" => {}
            other => segs.push(other.trim_end_matches(".rs").to_owned()),
        }
        // A binary's own modules (src/bin/...) are not the library's.
        if segs.first().is_some_and(|s| s == "bin") {
            continue;
        }
        out.insert(segs, f);
    }
    out
}

/// The code of a file without its `#[cfg(test)]` modules (tests may import anything).
fn without_test_modules(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = String::new();
    let mut i = 0;
    while i < lines.len() {
        let l = lines[i].trim();
        let next = lines.get(i + 1).map_or("", |n| n.trim());
        let test_cfg = l.starts_with("#[cfg(") && l.contains("test");
        if test_cfg && (next.starts_with("mod ") || next.contains(" mod ")) {
            // Skip the module: its braces balance at the line that closes it.
            let mut depth = 0i32;
            let mut opened = false;
            i += 1;
            while i < lines.len() {
                for c in lines[i].chars() {
                    match c {
                        '{' => {
                            depth += 1;
                            opened = true
                        }
                        '}' => depth -= 1,
                        _ => {}
                    }
                }
                i += 1;
                if opened && depth <= 0 {
                    break;
                }
            }
            continue;
        }
        // Comments (docs mention paths that are not imports).
        if !l.starts_with("//") {
            out.push_str(lines[i]);
            out.push('\n');
        }
        i += 1;
    }
    out
}

/// Expands a `use` tree (`a::{b, c::{d, e}}`) into full paths.
fn expand_use(tree: &str) -> Vec<String> {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        let path = tree.split(" as ").next().unwrap_or(tree).trim();
        return vec![path.to_owned()];
    };
    let prefix = tree[..open].trim_end_matches("::").trim();
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts
        .into_iter()
        .filter(|p| !p.trim().is_empty())
        .flat_map(expand_use)
        .map(|p| match (prefix.is_empty(), p.as_str()) {
            (true, _) => p,
            (false, "self") => prefix.to_owned(),
            (false, _) => format!("{prefix}::{p}"),
        })
        .collect()
}

/// A file's references to other modules of its crate: `use` trees (with whether each is a
/// `pub use` re-export, and its alias) and `crate::` / `super::` / `self::` paths in code.
struct FileRefs {
    /// (path, re-exported as this name if a `pub use`).
    uses: Vec<(String, Option<String>)>,
    paths: Vec<String>,
}

fn file_refs(code: &str) -> FileRefs {
    let mut uses = Vec::new();
    let mut rest = code;
    let mut in_code = String::new();
    // `use` statements, up to their `;`.
    while let Some(at) = find_use(rest) {
        in_code.push_str(&rest[..at.0]);
        let stmt_end = rest[at.1..].find(';').map_or(rest.len(), |e| at.1 + e);
        let tree: String = rest[at.1..stmt_end]
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        for p in expand_use(&tree) {
            let alias = at.2.then(|| {
                let name = tree_alias(&tree, &p);
                name.unwrap_or_else(|| p.rsplit("::").next().unwrap_or(&p).to_owned())
            });
            uses.push((p, alias));
        }
        rest = &rest[(stmt_end + 1).min(rest.len())..];
    }
    in_code.push_str(rest);
    // Paths in code: `crate::…`, `super::…`, `self::…`, and `child::…` (the resolver keeps
    // the ones whose first segment is a module of the crate).
    let mut paths = Vec::new();
    let bytes = in_code.as_bytes();
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut i = 0;
    while i < bytes.len() {
        let starts = (bytes[i].is_ascii_lowercase() || bytes[i] == b'_')
            && (i == 0 || !(word(bytes[i - 1]) || bytes[i - 1] == b':'));
        if !starts {
            i += 1;
            continue;
        }
        let mut end = i;
        while end < bytes.len() && (word(bytes[end]) || bytes[end] == b':') {
            end += 1;
        }
        let path = in_code[i..end].trim_end_matches(':');
        if path.contains("::") {
            paths.push(path.to_owned());
        }
        i = end.max(i + 1);
    }
    FileRefs { uses, paths }
}

/// The next `use` statement in `code`: (its start, where its tree starts, whether `pub`).
fn find_use(code: &str) -> Option<(usize, usize, bool)> {
    let mut offset = 0;
    for line in code.split_inclusive('\n') {
        let t = line.trim_start();
        let indent = line.len() - t.len();
        for (prefix, public) in [
            ("use ", false),
            ("pub use ", true),
            ("pub(crate) use ", true),
            ("pub(super) use ", true),
        ] {
            if t.starts_with(prefix) {
                let start = offset + indent;
                return Some((start, start + prefix.len(), public));
            }
        }
        offset += line.len();
    }
    None
}

/// The `as` alias of `path` in a `use` tree, if it has one.
fn tree_alias(tree: &str, path: &str) -> Option<String> {
    let last = path.rsplit("::").next()?;
    let needle = format!("{last} as ");
    tree.find(&needle).map(|i| {
        tree[i + needle.len()..]
            .split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .next()
            .unwrap_or_default()
            .to_owned()
    })
}

/// The module graph of one crate: which file refers to which, and by which path (the
/// first one seen).
pub struct Graph {
    pub edges: BTreeMap<PathBuf, BTreeMap<PathBuf, String>>,
}

/// Builds the file graph of the crate whose sources are in `src`.
pub fn graph(src: &Path) -> Result<Graph> {
    let modules = module_files(src);
    let mut refs = BTreeMap::new();
    for (segs, file) in &modules {
        let code = without_test_modules(&fs::read_to_string(file)?);
        refs.insert(segs.clone(), file_refs(&code));
    }
    // Re-exports: (module, name) → the path it stands for, as written in that module.
    let mut reexports: HashMap<(Vec<String>, String), String> = HashMap::new();
    for (segs, r) in &refs {
        for (path, alias) in &r.uses {
            if let Some(name) = alias {
                reexports.insert((segs.clone(), name.clone()), path.clone());
            }
        }
    }
    let resolver = Resolver {
        modules: &modules,
        reexports: &reexports,
    };
    let mut edges: BTreeMap<PathBuf, BTreeMap<PathBuf, String>> = BTreeMap::new();
    for (segs, r) in &refs {
        let from = modules[segs].clone();
        let targets = edges.entry(from.clone()).or_default();
        let all = r.uses.iter().map(|(p, _)| p).chain(r.paths.iter());
        for p in all {
            if let Some(to) = resolver.resolve(segs, p, 0) {
                if to != from {
                    targets.entry(to).or_insert_with(|| p.clone());
                }
            }
        }
    }
    Ok(Graph { edges })
}

struct Resolver<'a> {
    modules: &'a BTreeMap<Vec<String>, PathBuf>,
    reexports: &'a HashMap<(Vec<String>, String), String>,
}

impl Resolver<'_> {
    /// The file that defines what `path`, written in module `here`, names; `None` for
    /// paths outside the crate.
    fn resolve(&self, here: &[String], path: &str, depth: usize) -> Option<PathBuf> {
        if depth > 16 {
            return None;
        }
        let segs: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
        let mut abs: Vec<String> = Vec::new();
        let mut rest = &segs[..];
        match rest.first().copied() {
            Some("crate") => rest = &rest[1..],
            Some("self") => {
                abs = here.to_vec();
                rest = &rest[1..];
            }
            Some("super") => {
                abs = here.to_vec();
                while rest.first() == Some(&"super") {
                    abs.pop();
                    rest = &rest[1..];
                }
            }
            Some(first) => {
                // A relative path: a child module of `here`, else an external crate.
                let mut child = here.to_vec();
                child.push(first.to_owned());
                if !self.modules.contains_key(&child) {
                    return None;
                }
                abs = here.to_vec();
            }
            None => return None,
        }
        // Walk down through modules that are files.
        let mut i = 0;
        while i < rest.len() {
            let mut next = abs.clone();
            next.push(rest[i].to_owned());
            if !self.modules.contains_key(&next) {
                break;
            }
            abs = next;
            i += 1;
        }
        if let Some(name) = rest.get(i) {
            if let Some(target) = self.reexports.get(&(abs.clone(), (*name).to_owned())) {
                let mut more = target.clone();
                for s in &rest[i + 1..] {
                    more.push_str("::");
                    more.push_str(s);
                }
                // A re-export of something outside the crate is no edge.
                return self.resolve(&abs, &more, depth + 1);
            }
        }
        self.modules.get(&abs).cloned()
    }
}

/// The import cycles of a graph: each strongly connected set of two or more files.
pub fn cycles(g: &Graph) -> Vec<Vec<PathBuf>> {
    // Tarjan's algorithm, iteratively.
    let nodes: Vec<&PathBuf> = g.edges.keys().collect();
    let index_of: HashMap<&PathBuf, usize> =
        nodes.iter().enumerate().map(|(i, n)| (*n, i)).collect();
    let succ: Vec<Vec<usize>> = nodes
        .iter()
        .map(|n| {
            g.edges[*n]
                .keys()
                .filter_map(|t| index_of.get(t).copied())
                .collect()
        })
        .collect();
    let n = nodes.len();
    let (mut index, mut low, mut on) = (vec![usize::MAX; n], vec![0; n], vec![false; n]);
    let (mut stack, mut next, mut out) = (Vec::new(), 0, Vec::new());
    for root in 0..n {
        if index[root] != usize::MAX {
            continue;
        }
        let mut work = vec![(root, 0usize)];
        while let Some(&mut (v, ref mut child)) = work.last_mut() {
            if *child == 0 {
                index[v] = next;
                low[v] = next;
                next += 1;
                stack.push(v);
                on[v] = true;
            }
            if let Some(&w) = succ[v].get(*child) {
                *child += 1;
                if index[w] == usize::MAX {
                    work.push((w, 0));
                } else if on[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            work.pop();
            if let Some(&(parent, _)) = work.last() {
                low[parent] = low[parent].min(low[v]);
            }
            if low[v] == index[v] {
                let mut set = Vec::new();
                while let Some(w) = stack.pop() {
                    on[w] = false;
                    set.push(nodes[w].clone());
                    if w == v {
                        break;
                    }
                }
                if set.len() > 1 {
                    set.sort();
                    out.push(set);
                }
            }
        }
    }
    out.sort();
    out
}

/// Cycles in every member crate's `src/` (tests, benches and examples are their own crates).
pub fn check_cycles(members: &[Member]) -> Result<Vec<Violation>> {
    let mut out = Vec::new();
    for m in members {
        let src = m.dir.join("src");
        if !src.is_dir() {
            continue;
        }
        let g = graph(&src)?;
        for cycle in cycles(&g) {
            let short = |f: &Path| f.strip_prefix(&src).unwrap_or(f).display().to_string();
            let files: Vec<String> = cycle.iter().map(|f| short(f)).collect();
            // The edges inside the cycle, with the path that makes each.
            let inside: Vec<String> = cycle
                .iter()
                .flat_map(|from| {
                    g.edges[from]
                        .iter()
                        .filter(|(to, _)| cycle.contains(to))
                        .map(move |(to, via)| format!("{} → {} ({via})", short(from), short(to)))
                })
                .collect();
            out.push(Violation {
                rule: "import cycle",
                what: format!(
                    "{}: {}\n    {}",
                    m.name,
                    files.join(" ↔ "),
                    inside.join("\n    ")
                ),
            });
        }
    }
    Ok(out)
}
