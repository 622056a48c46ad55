//! `cargo xtask layers`: the module graph of every crate, read from its own `crate::`, `super::`
//! and `self::` paths; fails on a circle of files, on a source file over the size limit, and in
//! raft-core on a file that names one of a higher layer than ARCHITECTURE.md's table gives it
//! (or that the table does not place): the table is the layering, checked.
//!
//! A node is a file (inline modules belong to their file). An edge F → G means F names G's
//! module or an item in it. The crate root (`lib.rs`) is the facade: its own `mod` and `pub use`
//! lines are not edges, and a path through it (`crate::Error`) is followed to the module it
//! re-exports. The check prints each crate's layers bottom-up (a file's layer is one above the
//! highest file it names), so the order in the tree can be read from the output.
//!
//! Known debts are listed in `xtask/layers-known.txt` (one line each, `cycle <crate>: <files>`
//! or `size <path>`); what is not listed fails, and a listed debt that no longer holds fails too,
//! so the list can only shrink.
use crate::{workspace_root, Result};
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The largest hand-written source file allowed (generated bindings are exempt).
pub const MAX_LINES: usize = 900;

pub fn run(verbose: bool) -> Result<()> {
    let root = workspace_root();
    let mut found = BTreeSet::new();
    for krate in crates(&root)? {
        let graph = Graph::read(&krate)?;
        let sccs = graph.cycles();
        for scc in &sccs {
            found.insert(format!("cycle {}: {}", graph.name, scc.join(" ")));
        }
        println!("{}: {} files, {} edges, {} circles", graph.name, graph.files.len(), graph.edge_count(), sccs.len());
        if verbose || !sccs.is_empty() {
            for (level, files) in graph.layers().iter().enumerate() {
                println!("  layer {level}: {}", files.join(" "));
            }
        }
        if graph.name == "raft-core" {
            let architecture = fs::read_to_string(root.join("ARCHITECTURE.md")).map_err(|e| format!("ARCHITECTURE.md: {e}"))?;
            let declared = declared_layers(&architecture);
            if declared.is_empty() {
                return Err("layers: ARCHITECTURE.md has no raft-core layer table (`| layer | files | role |`)".into());
            }
            for problem in graph.against_declared(&declared) {
                println!("  {problem}");
                found.insert(problem);
            }
        }
        for scc in &sccs {
            println!("  circle: {}", scc.join(" → "));
            for a in scc {
                let names: Vec<&str> = graph.edges[a].iter().filter(|b| scc.contains(b)).map(String::as_str).collect();
                println!("    {a} names {}", names.join(", "));
            }
        }
    }
    let mut largest = (0, String::new());
    for (path, lines) in source_sizes(&root)? {
        if lines > largest.0 {
            largest = (lines, path.clone());
        }
        if lines > MAX_LINES {
            found.insert(format!("size {path}"));
        }
    }
    println!("largest hand-written source file: {} ({} lines; limit {MAX_LINES})", largest.1, largest.0);

    let known_path = root.join("xtask/layers-known.txt");
    let known: BTreeSet<String> = fs::read_to_string(&known_path)
        .unwrap_or_default()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(String::from)
        .collect();
    let new: Vec<&String> = found.difference(&known).collect();
    let gone: Vec<&String> = known.difference(&found).collect();
    if !known.is_empty() {
        println!("{} known debts (xtask/layers-known.txt) remain", known.len() - gone.len());
    }
    let mut problems = Vec::new();
    for n in &new {
        problems.push(format!("new: {n}"));
    }
    for g in &gone {
        problems.push(format!("paid, remove it from xtask/layers-known.txt: {g}"));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!("layers:\n  {}", problems.join("\n  ")))
    }
}

/// raft-core's layers as ARCHITECTURE.md's table under "### `crates/raft-core`" declares them:
/// each file (as `result/copy.rs`) with its layer's number, bottom first, and its name. A row
/// whose first cell is empty belongs to the layer above it in the table.
fn declared_layers(architecture: &str) -> BTreeMap<String, (usize, String)> {
    let mut out = BTreeMap::new();
    let Some(start) = architecture.find("### `crates/raft-core`") else { return out };
    let section = &architecture[start..];
    let section = &section[..section[3..].find("\n### ").map_or(section.len(), |e| e + 3)];
    let mut layer: Option<(usize, String)> = None;
    for line in section.lines().filter(|l| l.starts_with('|')) {
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        let [name, files, ..] = cells[..] else { continue };
        let Some(file) = files.strip_prefix('`').and_then(|f| f.split('`').next()) else { continue };
        if !name.is_empty() {
            let next = layer.as_ref().map_or(0, |(n, _)| n + 1);
            layer = Some((next, name.to_string()));
        }
        if let Some(l) = &layer {
            out.insert(file.to_string(), l.clone());
        }
    }
    out
}

/// Every library crate of the workspace (a `src/lib.rs` under `crates/`), and `xtask` itself.
fn crates(root: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let dir = root.join("crates");
    for entry in fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))? {
        let path = entry.map_err(|e| e.to_string())?.path();
        if path.join("src/lib.rs").is_file() {
            out.push(path);
        }
    }
    out.push(root.join("tests"));
    out.sort();
    Ok(out)
}

/// Line counts of the hand-written sources (Rust, C, C++, shell, Python) under `crates/`,
/// `tests/` and `xtask/`; checked-in bindgen output is exempt.
fn source_sizes(root: &Path) -> Result<Vec<(String, usize)>> {
    let mut out = Vec::new();
    for top in ["crates", "tests", "xtask"] {
        walk(&root.join(top), &mut |p| {
            let rel = p.strip_prefix(root).unwrap_or(p).to_string_lossy().into_owned();
            let ext = p.extension().and_then(|e| e.to_str()).unwrap_or("");
            let generated = p.file_name().is_some_and(|n| n == "bindings.rs");
            if generated || !matches!(ext, "rs" | "c" | "cpp" | "h" | "hpp" | "sh" | "py") || rel.contains("/target/") {
                return;
            }
            if let Ok(text) = fs::read_to_string(p) {
                out.push((rel, text.lines().count()));
            }
        })?;
    }
    Ok(out)
}

fn walk(dir: &Path, f: &mut dyn FnMut(&Path)) -> Result<()> {
    let Ok(entries) = fs::read_dir(dir) else { return Ok(()) };
    for entry in entries {
        let path = entry.map_err(|e| e.to_string())?.path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n == "target" || n == "stubs") {
                continue;
            }
            walk(&path, f)?;
        } else {
            f(&path);
        }
    }
    Ok(())
}

/// One crate's files and the edges between them.
struct Graph {
    name: String,
    /// Module path (`result::copy`, `` for the root) → file (`result/copy.rs`).
    files: BTreeMap<String, String>,
    /// File → files it names.
    edges: BTreeMap<String, BTreeSet<String>>,
}

impl Graph {
    fn read(krate: &Path) -> Result<Graph> {
        let src = krate.join("src");
        let name = krate.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let mut files = BTreeMap::new();
        walk(&src, &mut |p| {
            let rel = p.strip_prefix(&src).unwrap_or(p).to_string_lossy().into_owned();
            // Binaries are crate roots of their own; build helpers are not modules.
            if !rel.ends_with(".rs") || rel.starts_with("bin/") {
                return;
            }
            files.insert(module_of(&rel), rel);
        })?;
        let mut texts = BTreeMap::new();
        for (module, rel) in &files {
            let text = fs::read_to_string(src.join(rel)).map_err(|e| format!("{rel}: {e}"))?;
            texts.insert(module.clone(), strip(&text));
        }
        // Declared modules only: a file no `mod` line reaches is not part of the crate.
        let root_exports = exports(texts.get("").map(String::as_str).unwrap_or(""));
        let mut edges: BTreeMap<String, BTreeSet<String>> = files.values().map(|f| (f.clone(), BTreeSet::new())).collect();
        for (module, text) in &texts {
            if module.is_empty() {
                continue; // the facade
            }
            let from = &files[module];
            for path in paths(text) {
                let child = format!("{module}::{}", path[0]);
                let abs = if files.contains_key(&child) {
                    // `use crew::Crew` / `crew::run()` in `result/mod.rs`: a child module.
                    child.split("::").map(String::from).chain(path[1..].iter().cloned()).collect()
                } else if let Some(abs) = absolute(module, &path) {
                    abs
                } else {
                    continue;
                };
                // `crate::Staging::default()`: an item the facade re-exports, followed to its module.
                let abs = match (abs.first(), abs.first().and_then(|first| root_exports.get(first))) {
                    (Some(first), Some(origin)) if !files.contains_key(first) => origin.iter().chain(&abs[1..]).cloned().collect(),
                    _ => abs,
                };
                if let Some(target) = longest_module(&files, &abs) {
                    let to = &files[&target];
                    if to != from && !target.is_empty() {
                        edges.get_mut(from).expect("every file has an entry").insert(to.clone());
                    }
                }
            }
        }
        Ok(Graph { name, files, edges })
    }

    /// Against declared layers: every edge that goes up (a file naming one of a higher layer),
    /// and every file the declaration does not place (the crate root, the facade, apart).
    fn against_declared(&self, declared: &BTreeMap<String, (usize, String)>) -> Vec<String> {
        // A module's own tests (`release/tests.rs`) are of its layer.
        let layer_of = |file: &str| {
            declared.get(file).or_else(|| file.strip_suffix("/tests.rs").and_then(|dir| declared.get(&format!("{dir}/mod.rs"))))
        };
        let mut out = Vec::new();
        for (from, tos) in &self.edges {
            if from == "lib.rs" {
                continue;
            }
            let Some((lf, nf)) = layer_of(from) else {
                out.push(format!("unplaced {}: {from} is in no layer of ARCHITECTURE.md's table", self.name));
                continue;
            };
            for to in tos {
                if let Some((lt, nt)) = layer_of(to).filter(|(lt, _)| lt > lf) {
                    out.push(format!("upward {}: {from} ({nf}, layer {lf}) names {to} ({nt}, layer {lt})", self.name));
                }
            }
        }
        out
    }

    fn edge_count(&self) -> usize {
        self.edges.values().map(BTreeSet::len).sum()
    }

    /// Strongly connected components of more than one file (Tarjan), each sorted.
    fn cycles(&self) -> Vec<Vec<String>> {
        struct T<'a> {
            g: &'a Graph,
            index: BTreeMap<&'a str, usize>,
            low: BTreeMap<&'a str, usize>,
            stack: Vec<&'a str>,
            on: BTreeSet<&'a str>,
            out: Vec<Vec<String>>,
        }
        fn visit<'a>(t: &mut T<'a>, v: &'a str) {
            let i = t.index.len();
            t.index.insert(v, i);
            t.low.insert(v, i);
            t.stack.push(v);
            t.on.insert(v);
            for w in &t.g.edges[v] {
                let w = w.as_str();
                if !t.index.contains_key(w) {
                    visit(t, w);
                    let lw = t.low[w];
                    let lv = t.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(lw);
                } else if t.on.contains(w) {
                    let iw = t.index[w];
                    let lv = t.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(iw);
                }
            }
            if t.low[v] == t.index[v] {
                let mut scc = Vec::new();
                while let Some(w) = t.stack.pop() {
                    t.on.remove(w);
                    scc.push(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if scc.len() > 1 {
                    scc.sort();
                    t.out.push(scc);
                }
            }
        }
        let mut t = T { g: self, index: BTreeMap::new(), low: BTreeMap::new(), stack: Vec::new(), on: BTreeSet::new(), out: Vec::new() };
        for v in self.edges.keys() {
            if !t.index.contains_key(v.as_str()) {
                visit(&mut t, v);
            }
        }
        t.out.sort();
        t.out
    }

    /// Files by layer: 0 names no other file; a circle shares one layer.
    fn layers(&self) -> Vec<Vec<String>> {
        let mut comp: BTreeMap<&str, usize> = BTreeMap::new();
        let cycles = self.cycles();
        for (i, scc) in cycles.iter().enumerate() {
            for f in scc {
                comp.insert(f, i);
            }
        }
        let mut level: BTreeMap<String, usize> = BTreeMap::new();
        // Longest path over the condensation; circles are finite, so iterate to a fixed point.
        for _ in 0..=self.edges.len() {
            let mut changed = false;
            for (a, bs) in &self.edges {
                let mut l = 0;
                for b in bs {
                    let same = comp.contains_key(a.as_str()) && comp.get(a.as_str()) == comp.get(b.as_str());
                    if !same {
                        l = l.max(level.get(b).copied().unwrap_or(0) + 1);
                    }
                }
                if let Some(&c) = comp.get(a.as_str()) {
                    for f in &cycles[c] {
                        l = l.max(level.get(f).copied().unwrap_or(0));
                    }
                }
                if level.get(a) != Some(&l) {
                    changed = true;
                    level.insert(a.clone(), l);
                }
            }
            if !changed {
                break;
            }
        }
        let mut out: Vec<Vec<String>> = Vec::new();
        for (f, l) in level {
            if out.len() <= l {
                out.resize(l + 1, Vec::new());
            }
            out[l].push(f);
        }
        out
    }
}

/// `a/b.rs` and `a/b/mod.rs` → `a::b`; `lib.rs` → ``.
fn module_of(rel: &str) -> String {
    let rel = rel.trim_end_matches(".rs");
    let rel = rel.strip_suffix("/mod").unwrap_or(rel);
    if rel == "lib" {
        String::new()
    } else {
        rel.replace('/', "::")
    }
}

/// The longest prefix of `abs` that is a file's module.
fn longest_module(files: &BTreeMap<String, String>, abs: &[String]) -> Option<String> {
    (0..=abs.len()).rev().map(|n| abs[..n].join("::")).find(|m| files.contains_key(m))
}

/// A path as written in `module` (`crate::a::b`, `super::x`, `self::y`) made absolute (without
/// `crate`); `None` for paths into other crates.
fn absolute(module: &str, path: &[String]) -> Option<Vec<String>> {
    // In `a/b.rs` and in `a/b/mod.rs` (module a::b), `self` is a::b and `super` is a.
    let mut here: Vec<String> = if module.is_empty() { Vec::new() } else { module.split("::").map(String::from).collect() };
    let mut rest = path;
    match path.first().map(String::as_str) {
        Some("crate") => {
            here.clear();
            rest = &path[1..];
        }
        Some("self") => rest = &path[1..],
        Some("super") => {
            while rest.first().map(String::as_str) == Some("super") {
                here.pop()?;
                rest = &rest[1..];
            }
        }
        _ => return None,
    }
    here.extend(rest.iter().cloned());
    Some(here)
}

/// The names the crate root re-exports from its own modules: `pub use a::b::{C, D}` → C → a::b::C.
fn exports(root: &str) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    for tree in use_trees(root) {
        for path in tree {
            let Some(last) = path.last() else { continue };
            if path.first().map(String::as_str) == Some("crate") {
                out.insert(last.clone(), path[1..].to_vec());
            } else if path.len() > 1 {
                // `pub use array::X`: a module of this crate, or an external crate (then the
                // caller's lookup finds no file and draws no edge).
                out.insert(last.clone(), path.clone());
            }
        }
    }
    out
}

/// Every path of two or more segments in the text: those of `use` trees expanded, and those
/// written inline in code (`crate::a::f()`, `super::X`, `child::g()`).
fn paths(text: &str) -> Vec<Vec<String>> {
    let mut out: Vec<Vec<String>> = use_trees(text).into_iter().flatten().collect();
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let starts_word = i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_' || b[i - 1] == b':');
        if starts_word && (b[i].is_ascii_alphabetic() || b[i] == b'_') {
            let (path, end) = read_path(text, i);
            if path.len() > 1 {
                out.push(path);
            }
            i = end.max(i + 1);
        } else {
            i += 1;
        }
    }
    out
}

/// Reads `ident(::ident)*` from `start`; returns it and the index after it.
fn read_path(text: &str, start: usize) -> (Vec<String>, usize) {
    let b = text.as_bytes();
    let mut i = start;
    let mut parts = Vec::new();
    loop {
        let s = i;
        while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
            i += 1;
        }
        if s == i {
            break;
        }
        parts.push(text[s..i].to_string());
        let mut j = i;
        while j < b.len() && b[j].is_ascii_whitespace() {
            j += 1;
        }
        if text[j..].starts_with("::") {
            j += 2;
            while j < b.len() && b[j].is_ascii_whitespace() {
                j += 1;
            }
            if j < b.len() && (b[j].is_ascii_alphabetic() || b[j] == b'_') {
                i = j;
                continue;
            }
        }
        break;
    }
    (parts, i)
}

/// The `use` declarations of the text, each expanded to its leaf paths.
fn use_trees(text: &str) -> Vec<Vec<Vec<String>>> {
    let mut out = Vec::new();
    let b = text.as_bytes();
    let mut i = 0;
    while let Some(pos) = text[i..].find("use ") {
        let at = i + pos;
        i = at + 4;
        let word_start = at == 0 || !(b[at - 1].is_ascii_alphanumeric() || b[at - 1] == b'_');
        if !word_start {
            continue;
        }
        let Some(end) = text[i..].find(';') else { break };
        let body: String = text[i..i + end].chars().filter(|c| !c.is_whitespace()).collect();
        let mut leaves = Vec::new();
        expand(&body, Vec::new(), &mut leaves);
        leaves.retain(|l| l.len() > 1 || l.first().is_some_and(|s| s != "crate" && s != "super" && s != "self"));
        out.push(leaves);
        i += end;
    }
    out
}

/// `a::{b, c::{d, e}}` → [a::b, a::c::d, a::c::e]; `as` renames and globs keep their prefix.
fn expand(tree: &str, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
    let tree = tree.trim_start_matches("::");
    if let Some(open) = tree.find('{') {
        let mut base = prefix.clone();
        base.extend(tree[..open].split("::").filter(|s| !s.is_empty()).map(String::from));
        let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
        let mut depth = 0;
        let mut start = 0;
        for (k, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    expand(&inner[start..k], base.clone(), out);
                    start = k + 1;
                }
                _ => {}
            }
        }
        if start < inner.len() {
            expand(&inner[start..], base, out);
        }
    } else {
        let tree = tree.split("as").next().unwrap_or(tree);
        let mut path = prefix;
        path.extend(tree.split("::").filter(|s| !s.is_empty() && *s != "*" && *s != "self").map(String::from));
        if !path.is_empty() {
            out.push(path);
        }
    }
}

/// The text with comments, string and char literals blanked (their paths are not imports).
pub(crate) fn strip(text: &str) -> String {
    lex(text, false)
}

/// The text with comments blanked (nested block comments too); string, raw string and char
/// literals blanked as well, or kept as written with `keep_literals` (for `cargo xtask claims`,
/// whose scenario names and bench rows are words of the code), and skipped over either way, so
/// a `//` inside one is no comment.
pub(crate) fn lex(text: &str, keep_literals: bool) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let literal = |out: &mut String, start: usize, end: usize, blank: &str| {
        out.push_str(if keep_literals { &text[start..end.min(b.len())] } else { blank });
    };
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            if keep_literals {
                out.push(' ');
            }
        } else if b[i] == b'r' && (b[i..].starts_with(b"r\"") || b[i..].starts_with(b"r#")) && (i == 0 || !b[i - 1].is_ascii_alphanumeric())
        {
            let hashes = b[i + 1..].iter().copied().take_while(|&c| c == b'#').count();
            if text.as_bytes().get(i + 1 + hashes) == Some(&b'"') {
                let start = i;
                let close = format!("\"{}", "#".repeat(hashes));
                let from = i + 2 + hashes;
                i = text[from..].find(&close).map_or(b.len(), |k| from + k + close.len());
                literal(&mut out, start, i, "\"\"");
            } else {
                out.push('r');
                i += 1;
            }
        } else if b[i] == b'"' {
            let start = i;
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i = (i + 1).min(b.len());
            literal(&mut out, start, i, "\"\"");
        } else if b[i] == b'\'' && i + 2 < b.len() && (b[i + 2] == b'\'' || b[i + 1] == b'\\') {
            // A char literal ('a', '\n', '\''); lifetimes ('a) are left alone.
            let start = i;
            let mut j = i + 1;
            if b[j] == b'\\' {
                j += 2;
            } else {
                j += 1;
            }
            while j < b.len() && b[j] != b'\'' {
                j += 1;
            }
            i = (j + 1).min(b.len());
            literal(&mut out, start, i, "' '");
        } else {
            let c = text[i..].chars().next().expect("in bounds");
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lexer_blanks_or_keeps_literals_and_drops_comments_whatever_their_characters() {
        let text = "a /* 2 × 3 /* nested é */ still */ b // x × y\nc \"s // not a comment ×\" r#\"raw\"# 'q' 'l";
        assert_eq!(lex(text, false), "a  b \nc \"\" \"\" ' ' 'l");
        assert_eq!(lex(text, true), "a   b \nc \"s // not a comment ×\" r#\"raw\"# 'q' 'l");
        assert_eq!(strip(text), lex(text, false));
    }

    #[test]
    fn use_trees_expand_to_their_leaves() {
        let t = use_trees("use crate::{a::{B, c}, d as e};\nuse super::f::*;");
        assert_eq!(t[0], vec![vec!["crate", "a", "B"], vec!["crate", "a", "c"], vec!["crate", "d"]]);
        assert_eq!(t[1], vec![vec!["super", "f"]]);
    }

    #[test]
    fn comments_and_strings_are_not_paths() {
        let text = strip("// crate::a::b\nlet s = \"crate::c\"; /* crate::d */ crate::e::f();");
        let p = paths(&text);
        assert!(p.contains(&vec!["crate".to_string(), "e".to_string(), "f".to_string()]));
        assert!(!p.iter().any(|p| p.iter().any(|s| s == "a" || s == "c" || s == "d")));
    }

    #[test]
    fn relative_paths_resolve_from_their_file() {
        assert_eq!(absolute("result::copy", &["super".into(), "X".into()]), Some(vec!["result".to_string(), "X".to_string()]));
        assert_eq!(absolute("a", &["super".into(), "super".into()]), None);
        assert_eq!(absolute("a", &["crate".into(), "b".into()]), Some(vec!["b".to_string()]));
    }

    #[test]
    fn paths_through_the_facade_and_to_children_are_edges() {
        let dir = std::env::temp_dir().join(format!("layers-test-{}", std::process::id()));
        let src = dir.join("src");
        fs::create_dir_all(src.join("r")).unwrap();
        fs::write(src.join("lib.rs"), "mod a; mod b; mod r;\npub use b::Staging;\npub use r::X;").unwrap();
        fs::write(src.join("a.rs"), "fn f() { crate::Staging::default(); }").unwrap();
        fs::write(src.join("b.rs"), "// crate::a::f\npub struct Staging;").unwrap();
        fs::write(src.join("r/mod.rs"), "mod c;\npub use c::X;\nfn g() { c::h(); }").unwrap();
        fs::write(src.join("r/c.rs"), "pub struct X; pub fn h() { super::super::b::Staging; }").unwrap();
        let g = Graph::read(&dir).unwrap();
        let _ = fs::remove_dir_all(&dir);
        let names = |f: &str| g.edges[f].iter().cloned().collect::<Vec<_>>();
        assert_eq!(names("a.rs"), vec!["b.rs"]);
        assert!(names("b.rs").is_empty());
        assert_eq!(names("r/mod.rs"), vec!["r/c.rs"]);
        assert_eq!(names("r/c.rs"), vec!["b.rs"]);
        assert!(g.cycles().is_empty());
    }

    #[test]
    fn a_file_naming_one_of_a_higher_declared_layer_is_found_and_an_unplaced_file_too() {
        let table = "### `crates/raft-core`\n\n| layer | files | role |\n| --- | --- | --- |\n\
                     | low | `a.rs` | x |\n| | `b.rs` | y |\n| high | `c.rs` | z |\n\n### `crates/raft-comms`\n| x | `d.rs` | w |\n";
        let declared = declared_layers(table);
        assert_eq!(declared.len(), 3, "{declared:?}");
        assert_eq!(declared["b.rs"], (0, "low".to_string()));
        assert_eq!(declared["c.rs"], (1, "high".to_string()));
        let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (a, b) in [("a.rs", "b.rs"), ("b.rs", "a.rs"), ("c.rs", "a.rs"), ("a.rs", "c.rs"), ("e.rs", "a.rs"), ("lib.rs", "c.rs")] {
            edges.entry(a.to_string()).or_default().insert(b.to_string());
        }
        let g = Graph { name: "raft-core".into(), files: BTreeMap::new(), edges };
        assert_eq!(
            g.against_declared(&declared),
            vec![
                "upward raft-core: a.rs (low, layer 0) names c.rs (high, layer 1)".to_string(),
                "unplaced raft-core: e.rs is in no layer of ARCHITECTURE.md's table".to_string(),
            ]
        );
    }

    #[test]
    fn a_circle_of_files_is_found_and_a_chain_is_not() {
        let g = |pairs: &[(&str, &str)]| {
            let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
            for (a, b) in pairs {
                edges.entry(a.to_string()).or_default().insert(b.to_string());
                edges.entry(b.to_string()).or_default();
            }
            Graph { name: "t".into(), files: BTreeMap::new(), edges }
        };
        let chain = g(&[("a.rs", "b.rs"), ("b.rs", "c.rs")]);
        assert!(chain.cycles().is_empty());
        assert_eq!(chain.layers(), vec![vec!["c.rs".to_string()], vec!["b.rs".to_string()], vec!["a.rs".to_string()]]);
        let circle = g(&[("a.rs", "b.rs"), ("b.rs", "c.rs"), ("c.rs", "a.rs"), ("d.rs", "a.rs")]);
        assert_eq!(circle.cycles(), vec![vec!["a.rs".to_string(), "b.rs".to_string(), "c.rs".to_string()]]);
    }
}

/// The check itself, so `cargo test` (and so `cargo xtask test` and CI) catches a new circle.
#[cfg(test)]
#[test]
fn the_workspace_has_no_new_circle_and_no_new_oversized_file() {
    run(false).unwrap();
}
