//! Where a test of the tree is built, for `cargo xtask claims`'s second half (claims_run.rs):
//! every Cargo package of the repository (crates/, tests/, models/, xtask/, with the workspace
//! whose root manifest is nearest above it), its targets as Cargo finds them (`src/lib.rs`,
//! `src/main.rs`, `src/bin/`, `tests/`, `examples/`, `benches/`, by the conventions, then the
//! manifest's `[lib]`, `[[test]]`, `[[bin]]`, ... tables with their `required-features`), and the
//! files each target compiles: its root, then every file a `mod name;` reaches (`#[path]`
//! followed), each with the attributes of the declarations on the way (their `cfg`s gate it). A
//! file that no declaration reaches is in no target. Each file's tests carry their own attributes
//! and their inline modules'. A package's `test_*.py` files are targets of their own, with the
//! tests their `__main__` runs.
use crate::Result;
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Component, Path, PathBuf};

#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Kind {
    Lib,
    Bin,
    Test,
    Example,
    Bench,
    Python,
}

/// A target of a Cargo package (or a Python test file).
#[derive(Debug)]
pub(crate) struct Target {
    pub(crate) workspace: String,
    pub(crate) package: String,
    pub(crate) kind: Kind,
    pub(crate) name: String,
    pub(crate) required: Vec<String>,
}

/// An attribute's tokens, inside its brackets.
pub(crate) type Attr = Vec<String>;

/// A Rust file's tests and `mod` declarations.
#[derive(Default, Debug)]
pub(crate) struct Parsed {
    /// `#![...]` at its top.
    pub(crate) inner: Vec<Attr>,
    /// Each test: its name, with its own attributes and its inline modules'.
    pub(crate) tests: Vec<(String, Vec<Attr>)>,
    /// Each `mod name;`: the name, the inline modules around it, its and their attributes.
    pub(crate) mods: Vec<(String, Vec<String>, Vec<Attr>)>,
}

#[derive(Default)]
pub(crate) struct Layout {
    pub(crate) targets: Vec<Target>,
    /// Each file's targets, with the attributes of the `mod` declarations down to it.
    pub(crate) places: BTreeMap<String, Vec<(usize, Vec<Attr>)>>,
    pub(crate) parsed: BTreeMap<String, Parsed>,
    /// Each Python test file: whether its `__main__` runs every `test_`, else those it calls.
    pub(crate) python: BTreeMap<String, (bool, BTreeSet<String>)>,
}

impl Layout {
    pub(crate) fn scan(root: &Path) -> Result<Layout> {
        let mut layout = Layout::default();
        let mut manifests = Vec::new();
        for top in ["crates", "tests", "models", "xtask"] {
            walk(&root.join(top), &mut |p| {
                if p.file_name().is_some_and(|n| n == "Cargo.toml") {
                    manifests.push(p.to_path_buf());
                }
            });
        }
        manifests.sort();
        for manifest in manifests {
            let text = fs::read_to_string(&manifest).map_err(|e| format!("{}: {e}", manifest.display()))?;
            let dir = manifest.parent().unwrap_or(root);
            if let Some(package) = Manifest::read(&text) {
                layout.add_package(root, dir, &package)?;
            }
        }
        Ok(layout)
    }

    fn add_package(&mut self, root: &Path, dir: &Path, manifest: &Manifest) -> Result<()> {
        let rel = |p: &Path| p.strip_prefix(root).unwrap_or(p).to_string_lossy().into_owned();
        let workspace = dir
            .ancestors()
            .take_while(|d| d.starts_with(root))
            .find(|d| fs::read_to_string(d.join("Cargo.toml")).is_ok_and(|t| t.contains("[workspace]")));
        let workspace = workspace.map(rel).unwrap_or_default();
        for (kind, name, path, required) in manifest.targets(dir) {
            let index = self.targets.len();
            self.targets.push(Target { workspace: workspace.clone(), package: manifest.package.clone(), kind, name, required });
            self.add_module(root, &path, true, index, Vec::new(), &mut BTreeSet::new())?;
        }
        let mut python = Vec::new();
        walk(dir, &mut |p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if name.starts_with("test_") && name.ends_with(".py") {
                python.push(p.to_path_buf());
            }
        });
        for file in python {
            let text = fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
            let name = rel(&file);
            self.places.entry(name.clone()).or_default().push((self.targets.len(), Vec::new()));
            self.targets.push(Target {
                workspace: workspace.clone(),
                package: manifest.package.clone(),
                kind: Kind::Python,
                name: name.clone(),
                required: vec![],
            });
            self.python.insert(name, python_main(&text));
        }
        Ok(())
    }

    /// Adds `file` (and the files its `mod` declarations name) to a target.
    fn add_module(
        &mut self,
        root: &Path,
        file: &Path,
        owns_dir: bool,
        target: usize,
        gates: Vec<Attr>,
        seen: &mut BTreeSet<PathBuf>,
    ) -> Result<()> {
        if !file.is_file() || !seen.insert(file.to_path_buf()) {
            return Ok(());
        }
        let rel = file.strip_prefix(root).unwrap_or(file).to_string_lossy().into_owned();
        if !self.parsed.contains_key(&rel) {
            let text = fs::read_to_string(file).map_err(|e| format!("{rel}: {e}"))?;
            self.parsed.insert(rel.clone(), parse(&tokens(&text)));
        }
        let parsed = &self.parsed[&rel];
        let mut gates = gates;
        gates.extend(parsed.inner.iter().cloned());
        self.places.entry(rel.clone()).or_default().push((target, gates.clone()));
        let dir = file.parent().unwrap_or(root);
        let stem = file.file_stem().and_then(|s| s.to_str()).unwrap_or("");
        let base = if owns_dir { dir.to_path_buf() } else { dir.join(stem) };
        let mods = parsed.mods.clone();
        for (name, inline, attrs) in mods {
            let inner: PathBuf = inline.iter().collect();
            let path_attr =
                attrs.iter().find(|a| a.first().is_some_and(|t| t == "path") && a.get(1).is_some_and(|t| t == "=")).and_then(|a| a.get(2));
            let (child, owns) = match path_attr {
                Some(p) if inline.is_empty() => (normal(&dir.join(unquote(p))), true),
                Some(p) => (normal(&base.join(&inner).join(unquote(p))), true),
                None => {
                    let flat = base.join(&inner).join(format!("{name}.rs"));
                    if flat.is_file() {
                        (flat, false)
                    } else {
                        (base.join(&inner).join(&name).join("mod.rs"), true)
                    }
                }
            };
            let mut down = gates.clone();
            down.extend(attrs);
            self.add_module(root, &child, owns, target, down, seen)?;
        }
        Ok(())
    }
}

pub(crate) fn unquote(s: &str) -> &str {
    s.trim_start_matches('r').trim_matches('#').trim_matches('"')
}

/// A path with its `..` and `.` taken out.
fn normal(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// A package's manifest: its name and the targets its tables declare.
struct Manifest {
    package: String,
    lib: Option<(String, Option<String>)>,
    /// `[[test]]`, `[[bin]]`, ...: kind, name, path, required features.
    declared: Vec<(Kind, String, Option<String>, Vec<String>)>,
}

impl Manifest {
    /// None for a manifest with no `[package]` (a virtual workspace's).
    fn read(text: &str) -> Option<Manifest> {
        let mut header = "";
        let mut package = None;
        let mut lib: Option<(String, Option<String>)> = None;
        let mut declared: Vec<(Kind, String, Option<String>, Vec<String>)> = Vec::new();
        for line in text.lines().map(str::trim) {
            if line.starts_with('[') {
                header = line;
                let kind = match line {
                    "[[test]]" => Some(Kind::Test),
                    "[[bin]]" => Some(Kind::Bin),
                    "[[example]]" => Some(Kind::Example),
                    "[[bench]]" => Some(Kind::Bench),
                    _ => None,
                };
                declared.extend(kind.map(|k| (k, String::new(), None, Vec::new())));
                continue;
            }
            let Some((key, value)) = line.split_once('=') else { continue };
            let (key, value) = (key.trim(), value.trim());
            let quoted = value.trim_matches('"').to_string();
            match (header, key) {
                ("[package]", "name") => package = Some(quoted),
                ("[lib]", "name") => lib.get_or_insert_default().0 = quoted,
                ("[lib]", "path") => lib.get_or_insert_default().1 = Some(quoted),
                ("[[test]]" | "[[bin]]" | "[[example]]" | "[[bench]]", _) => {
                    let Some(last) = declared.last_mut() else { continue };
                    match key {
                        "name" => last.1 = quoted,
                        "path" => last.2 = Some(quoted),
                        "required-features" => {
                            let list = value.trim_matches(['[', ']']).split(',').map(|f| f.trim().trim_matches('"').to_string());
                            last.3 = list.filter(|f| !f.is_empty()).collect();
                        }
                        _ => {}
                    }
                }
                _ => {}
            }
        }
        Some(Manifest { package: package?, lib, declared })
    }

    /// Every target: Cargo's conventions, then the declared tables (by name, over the found ones).
    fn targets(&self, dir: &Path) -> Vec<(Kind, String, PathBuf, Vec<String>)> {
        let mut out = Vec::new();
        let lib_name =
            self.lib.as_ref().map(|(n, _)| n.clone()).filter(|n| !n.is_empty()).unwrap_or_else(|| self.package.replace('-', "_"));
        let lib_path = self.lib.as_ref().and_then(|(_, p)| p.clone()).map_or_else(|| dir.join("src/lib.rs"), |p| dir.join(p));
        if lib_path.is_file() {
            out.push((Kind::Lib, lib_name, lib_path, Vec::new()));
        }
        if dir.join("src/main.rs").is_file() {
            out.push((Kind::Bin, self.package.clone(), dir.join("src/main.rs"), Vec::new()));
        }
        for (kind, sub) in [(Kind::Bin, "src/bin"), (Kind::Test, "tests"), (Kind::Example, "examples"), (Kind::Bench, "benches")] {
            let Ok(entries) = fs::read_dir(dir.join(sub)) else { continue };
            let mut found: Vec<(String, PathBuf)> = Vec::new();
            for entry in entries.flatten() {
                let path = entry.path();
                let name = path.file_stem().and_then(|s| s.to_str()).unwrap_or("").to_string();
                if path.extension().is_some_and(|e| e == "rs") {
                    found.push((name, path));
                } else if path.join("main.rs").is_file() {
                    found.push((name, path.join("main.rs")));
                }
            }
            found.sort();
            out.extend(found.into_iter().map(|(name, path)| (kind, name, path, Vec::new())));
        }
        for (kind, name, path, required) in &self.declared {
            let at = out.iter().position(|(k, n, _, _)| k == kind && n == name);
            let path = path.as_ref().map(|p| dir.join(p));
            match at {
                Some(i) => {
                    out[i].3 = required.clone();
                    if let Some(p) = path {
                        out[i].2 = p;
                    }
                }
                None => {
                    let sub = match kind {
                        Kind::Bin => "src/bin",
                        Kind::Example => "examples",
                        Kind::Bench => "benches",
                        _ => "tests",
                    };
                    out.push((*kind, name.clone(), path.unwrap_or_else(|| dir.join(sub).join(format!("{name}.rs"))), required.clone()));
                }
            }
        }
        out
    }
}

/// A Python test file's `__main__`: whether it runs every `test_` (collecting them), else the
/// names it calls.
fn python_main(text: &str) -> (bool, BTreeSet<String>) {
    let Some(at) = text.find("if __name__ == \"__main__\":").or_else(|| text.find("if __name__ == '__main__':")) else {
        return (false, BTreeSet::new());
    };
    let main = &text[at..];
    let all = main.contains("startswith(\"test_\")") || main.contains("startswith('test_')");
    let called = main
        .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '('))
        .filter_map(|w| w.strip_suffix('('))
        .filter(|w| w.starts_with("test_"))
        .map(str::to_string)
        .collect();
    (all, called)
}

/// The tokens of Rust source: identifiers, literals (strings with their quotes) and single
/// punctuation characters; comments dropped.
pub(crate) fn tokens(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let at = |i: usize| chars.get(i).copied().unwrap_or('\0');
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c == '/' && at(i + 1) == '/' {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c == 'r' && (at(i + 1) == '"' || (at(i + 1) == '#' && matches!(at(i + 2), '"' | '#'))) {
            let start = i;
            let hashes = chars[i + 1..].iter().take_while(|&&c| c == '#').count();
            i += 2 + hashes;
            let close: String = std::iter::once('"').chain(std::iter::repeat_n('#', hashes)).collect();
            while i < chars.len() && !chars[i..].iter().take(close.len()).copied().eq(close.chars()) {
                i += 1;
            }
            i = (i + close.len()).min(chars.len());
            out.push(chars[start..i].iter().collect());
        } else if c == '"' {
            let start = i;
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i = (i + 1).min(chars.len());
            out.push(chars[start..i].iter().collect());
        } else if c == '\'' && (at(i + 1) == '\\' || at(i + 2) == '\'') {
            // A char literal (a lifetime's tick is punctuation).
            i += if at(i + 1) == '\\' { 2 } else { 1 };
            while i < chars.len() && chars[i] != '\'' {
                i += 1;
            }
            i += 1;
            out.push("'c'".into());
        } else if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push(chars[start..i].iter().collect());
        } else {
            out.push(c.to_string());
            i += 1;
        }
    }
    out
}

/// A file's tests (a function under `#[test]` or `#[tokio::test]`), inner attributes and `mod`
/// declarations, each with the attributes that gate it.
fn parse(tokens: &[String]) -> Parsed {
    let mut parsed = Parsed::default();
    // (name, attributes, brace depth inside it).
    let mut inline: Vec<(String, Vec<Attr>, usize)> = Vec::new();
    let mut pending: Vec<Attr> = Vec::new();
    let mut depth = 0;
    let mut i = 0;
    let around = |inline: &[(String, Vec<Attr>, usize)]| inline.iter().flat_map(|(_, a, _)| a.iter().cloned()).collect::<Vec<Attr>>();
    while i < tokens.len() {
        let t = tokens[i].as_str();
        i += 1;
        match t {
            "#" => {
                let inner = tokens.get(i).is_some_and(|t| t == "!");
                let open = i + usize::from(inner);
                if tokens.get(open).is_none_or(|t| t != "[") {
                    continue;
                }
                let mut level = 0;
                let mut end = open;
                while end < tokens.len() {
                    level += match tokens[end].as_str() {
                        "[" => 1,
                        "]" => -1,
                        _ => 0,
                    };
                    if level == 0 {
                        break;
                    }
                    end += 1;
                }
                let attr: Attr = tokens[open + 1..end.min(tokens.len())].to_vec();
                i = end + 1;
                match (inner, inline.last_mut()) {
                    (true, Some(m)) => m.1.push(attr),
                    (true, None) => parsed.inner.push(attr),
                    (false, _) => pending.push(attr),
                }
            }
            "mod" => {
                let name = tokens.get(i).cloned().unwrap_or_default();
                i += 1;
                match tokens.get(i).map(String::as_str) {
                    Some("{") => {
                        i += 1;
                        depth += 1;
                        inline.push((name, std::mem::take(&mut pending), depth));
                    }
                    _ => {
                        let mut attrs = around(&inline);
                        attrs.append(&mut pending);
                        parsed.mods.push((name, inline.iter().map(|(n, _, _)| n.clone()).collect(), attrs));
                    }
                }
            }
            "fn" => {
                let name = tokens.get(i).cloned().unwrap_or_default();
                let test =
                    pending.iter().any(|a| a == &["test"] || a.starts_with(&["tokio".into(), ":".into(), ":".into(), "test".into()]));
                if test {
                    let mut attrs = around(&inline);
                    attrs.append(&mut pending);
                    parsed.tests.push((name, attrs));
                }
                pending.clear();
            }
            "{" => {
                depth += 1;
                pending.clear();
            }
            "}" => {
                if inline.last().is_some_and(|m| m.2 == depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
                pending.clear();
            }
            ";" => pending.clear(),
            _ => {}
        }
    }
    parsed
}

pub(crate) fn walk(dir: &Path, f: &mut dyn FnMut(&Path)) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    let mut paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    paths.sort();
    for path in paths {
        if path.is_dir() {
            if !path.file_name().is_some_and(|n| n == "target" || n == ".git" || n == "node_modules") {
                walk(&path, f);
            }
        } else {
            f(&path);
        }
    }
}

/// A fresh directory with the given files (for the tests of this check).
#[cfg(test)]
pub(crate) fn temp_tree(label: &str, files: &[(String, String)]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("claims-run-{label}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    for (path, text) in files {
        let path = dir.join(path);
        fs::create_dir_all(path.parent().expect("a file's directory")).expect("a temporary directory");
        fs::write(path, text).expect("a temporary file");
    }
    dir
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tests_mods_and_their_attributes_are_read_past_comments_literals_and_lifetimes() {
        let source = r##"#![cfg(unix)]
// #[test] fn a_commented_test() {}
/* #[test] fn a_block_commented_test() {} */
const BRACE: char = '{';
const TEXT: &str = r#"}" #[test] fn in_a_raw_string() {}"#;
fn borrow<'a>(s: &'a str) -> &'a str { s }
#[cfg(feature = "x")]
pub(crate) mod declared;
mod inline {
    #![cfg(test)]
    mod nested;
    #[test]
    #[ignore = "a } in a string"]
    fn an_inline_test() {}
}
#[tokio::test]
async fn an_async_test() {}
"##;
        let parsed = parse(&tokens(source));
        assert_eq!(parsed.inner, [tokens("cfg(unix)")]);
        let tests: Vec<(&str, usize)> = parsed.tests.iter().map(|(n, a)| (n.as_str(), a.len())).collect();
        assert_eq!(tests, [("an_inline_test", 3), ("an_async_test", 1)]);
        assert_eq!(parsed.tests[0].1[0], tokens("cfg(test)"));
        let mods: Vec<(&str, Vec<String>, usize)> = parsed.mods.iter().map(|(n, i, a)| (n.as_str(), i.clone(), a.len())).collect();
        assert_eq!(mods, [("declared", vec![], 1), ("nested", vec!["inline".to_string()], 1)]);
    }

    #[test]
    fn targets_follow_cargos_conventions_and_the_manifests_tables() {
        let manifest = "[package]\nname = \"raft-cuvs\"\n\n[dependencies]\nname = \"not-a-target\"\n\n[[test]]\nname = \"bindings\"\nrequired-features = [\"regenerate-bindings\"]\n";
        let files: Vec<(String, String)> = [
            "src/lib.rs",
            "src/bin/tool.rs",
            "src/bin/big/main.rs",
            "tests/bindings.rs",
            "tests/cuvs/main.rs",
            "tests/common/mod.rs",
            "examples/knn.rs",
        ]
        .iter()
        .map(|f| (f.to_string(), String::new()))
        .chain([("Cargo.toml".to_string(), manifest.to_string())])
        .collect();
        let root = temp_tree("targets", &files);
        let found: Vec<(Kind, String, Vec<String>)> =
            Manifest::read(manifest).unwrap().targets(&root).into_iter().map(|(k, n, _, r)| (k, n, r)).collect();
        let want = [
            (Kind::Lib, "raft_cuvs", vec![]),
            (Kind::Bin, "big", vec![]),
            (Kind::Bin, "tool", vec![]),
            (Kind::Test, "bindings", vec!["regenerate-bindings".to_string()]),
            (Kind::Test, "cuvs", vec![]),
            (Kind::Example, "knn", vec![]),
        ];
        let want: Vec<(Kind, String, Vec<String>)> = want.into_iter().map(|(k, n, r)| (k, n.to_string(), r)).collect();
        assert_eq!(found, want);
        assert!(Manifest::read("[workspace]\nmembers = []\n").is_none());
        fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn a_python_main_runs_what_it_calls_or_collects() {
        let calls = "def test_a():\n    pass\n\nif __name__ == \"__main__\":\n    test_a()\n";
        assert_eq!(python_main(calls), (false, ["test_a".to_string()].into()));
        let collects = "if __name__ == \"__main__\":\n    tests = [f for n, f in globals().items() if n.startswith(\"test_\")]\n";
        assert!(python_main(collects).0);
        assert_eq!(python_main("def test_a():\n    pass\n"), (false, BTreeSet::new()));
    }
}
