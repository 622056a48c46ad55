//! `cargo xtask claims [-v] [--root DIR]`: every test the documents name as a claim's proof
//! must be a test of the tree. The project's rule is that each claim in the README and docs
//! names the test (or the recorded run) that proves it; tests get renamed and the documents
//! drift, so this check reads the documents' backticked names, resolves each against the
//! `#[test]` functions of the repository, and fails listing each name that resolves to none,
//! with the document and line (`-v` prints every name's verdict).
//!
//! **What is a test name.** A backticked word (outside fenced code blocks; a span may run onto
//! the next line) of the form `[segment::]*name`, where `name` is lower snake_case starting with
//! a letter, of four words at least (three underscores), or of two where a segment is the stem
//! of a file of tests (`crew::worker_hand_over`); a trailing `…` (or `...`) makes it a prefix
//! (`a_job_longer_than_its_bound_…`), a `…` segment is a module left out. Segments may be
//! modules, test binaries or file paths (`tests/tests/exit.rs::name`, `test_cpu.py::test_x`).
//! A path with a type segment (`DeviceResources::with_raft_resources_mut`) or a call (`name()`)
//! is not a test name.
//!
//! **What resolves.** A function under `#[test]` in any `.rs` file of crates/, tests/ (with
//! tests/downstream), models/, xtask/ (`target` directories skipped), or a `def test_…` of a
//! `test_*.py` file. A name with segments resolves loosely: its last segment must be the
//! function's name and at least one other segment must be a word of the function's place (a
//! directory or file stem of its path, `-` read as `_`, or an inline `mod` around it; `tests`,
//! `src` and `crates` count only where no other segment is given), so
//! `exit::a_job_that_calls_exit_skips_the_teardown_at_once` is `tests/tests/exit.rs`'s and
//! `deps::tests::name` is `xtask/src/deps.rs`'s `mod tests`. A name that is no test is, in this
//! order: an identifier of the code now (outside comments; string literals count: scenario
//! names, bench rows, named checks), so not a test; a test of the history (see below); a word
//! of the code's comments or of its history that never was a test (RMM's
//! `stream_ordered_memory_resource`, a removed API function), so not a test; a piece of a test's
//! name inside a command line (`comms_clique a_group_on_one_thread`: a `cargo test` filter);
//! unresolved if a segment names a file of tests or the name is a near miss of a test's
//! (misspelled, cut, lengthened: the check fails); else unknown, printed but not failed (a
//! long name of something outside the repository, such as a dask-cuda option).
//!
//! **Scope: live claims and records.** The documents read are README.md, ARCHITECTURE.md and
//! `docs/*.md` (not docs/runs/, raw output). Part of them are records of the past:
//! `docs/gpu-runs.md` is a log of runs ("Run 12: 2026-11-29, commit 524b02e"),
//! `docs/BENCHMARKS.md` a list of sessions, `docs/RELIABILITY.md` after its first table a list
//! of dated audits, CUVS.md's "On the GPU (run 26, 2026-11-30)" one run. A record naming a test
//! by the name it had that day is history, not a broken claim: at 779e54b, 9 of the records'
//! 504 names were such (6 renamed or removed since, 3 moved to another file, all in
//! gpu-runs.md), each a `#[test]` of its day, and no live claim's was. So the rule is by
//! heading, the same in every document: a section whose heading holds a date (`2026-11-29`) is
//! a record, with the sections under it; everything else is a live claim: the README (its
//! changelog too: it says what users see now, and its tests prove it), ARCHITECTURE.md,
//! API/MEMORY/COMMS/CUVS, RELIABILITY's opening table and undated sections, BENCHMARKS' method.
//! A live claim's test must be in the tree now, in the place its segments name. A record's may
//! instead be a test of the repository's history (one pass of `git log -p` over everything but
//! the documents: a `fn` with `#[test]` among the four lines above it in its hunk, or a
//! `def test_`), where its segments named it then; a record naming a test that never existed
//! fails like a live claim. A test of the history is printed (`-v`) with the commit that removed
//! it and the most alike test that commit added.
//! Where the history is not all there (a shallow clone, a source archive), a record's name
//! that the tree does not resolve is printed as unknown, not failed; a live claim's still fails.
//!
//! **Run by a script.** A live claim's test must also be one a script of the repository runs
//! (not `#[ignore]`d, feature-gated or in a binary no script runs): claims_run.rs, its table.
use crate::{claims_run, layers, workspace_root, Result};
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Checks the documents of `root` (the workspace's by default) against its tree and history.
pub fn run(verbose: bool, root: Option<PathBuf>) -> Result<()> {
    let root = root.unwrap_or_else(workspace_root);
    let tree = Tree::scan(&root)?;
    let history = History::read(&root);
    let report = check(&root, &tree, &history)?;
    let count = |f: fn(&Verdict) -> bool| report.verdicts.iter().filter(|(_, v)| f(v)).count();
    let (live, record) = report.verdicts.iter().fold((0, 0), |(l, r), (m, _)| if m.record { (l, r + 1) } else { (l + 1, r) });
    println!(
        "claims: {} test-like names in the documents ({live} in live claims, {record} in records): {} tests of the tree, {} filters of test names, {} tests of the history in records, {} names of the code, {} unknown, {} unresolved; {} tests in the tree",
        live + record,
        count(|v| matches!(v, Verdict::Test)),
        count(|v| matches!(v, Verdict::Filter)),
        count(|v| matches!(v, Verdict::Historical(_))),
        count(|v| matches!(v, Verdict::Code(_))),
        count(|v| matches!(v, Verdict::Unknown)),
        count(Verdict::fails),
        tree.tests.len(),
    );
    for (m, v) in &report.verdicts {
        let shown = match v {
            Verdict::Test | Verdict::Filter | Verdict::Code(_) | Verdict::Historical(_) => verbose,
            Verdict::Unknown | Verdict::Unresolved(_) => true,
        };
        if shown {
            println!("{}:{}: `{}`: {}", m.doc, m.line, m.text, v.describe());
        }
    }
    // The second half (claims_run.rs): each test a live claim names is one a script runs.
    let live_tests = report.verdicts.iter().filter(|(m, v)| !m.record && *v == Verdict::Test);
    let named: Vec<claims_run::Named> = live_tests
        .map(|(m, _)| {
            let tests = resolved(m, &tree).iter().map(|t| (t.file.as_str(), t.name.as_str())).collect();
            claims_run::Named { doc: &m.doc, line: m.line, text: &m.text, tests }
        })
        .collect();
    let unrun = claims_run::report(&root, &named, verbose)?;
    match (count(Verdict::fails), unrun) {
        (0, 0) => Ok(()),
        (0, n) => Err(format!("claims: {n} test names in live claims name tests that no script of the repository runs")),
        (failed, _) => Err(format!("claims: {failed} test names in the documents resolve to no test")),
    }
}

/// This file: its examples name tests the way the documents do, so its words are not the code's.
const SELF: &str = "xtask/src/claims.rs";

/// One backticked test name in a document.
#[derive(Debug, Clone)]
struct Mention {
    doc: String,
    line: usize,
    /// As written.
    text: String,
    /// The segments before the name, as words (`tests/tests/exit.rs` gives `tests`, `exit`).
    places: Vec<String>,
    name: String,
    /// Written with a trailing `…`: any test whose name starts so.
    prefix: bool,
    /// In a dated section: a record of the past.
    record: bool,
    /// One word of a longer span (a command line such as `comms_clique a_group_on_one_thread`).
    in_command: bool,
}

#[derive(Default)]
struct Report {
    verdicts: Vec<(Mention, Verdict)>,
}

fn check(root: &Path, tree: &Tree, history: &History) -> Result<Report> {
    let mut report = Report::default();
    for doc in documents(root)? {
        let text = fs::read_to_string(root.join(&doc)).map_err(|e| format!("{doc}: {e}"))?;
        // Four words at least, or two with a segment that names a file of tests (`crew::worker_hand_over`).
        let test_like = |m: &Mention| m.name.matches('_').count() >= 3 || m.places.iter().any(|p| tree.test_files.contains(p));
        for m in mentions(&doc, &text).into_iter().filter(test_like) {
            let verdict = classify(&m, tree, history);
            report.verdicts.push((m, verdict));
        }
    }
    Ok(report)
}

/// What a name is, in this order: a test of the tree (in a place its segments name); a test of
/// the tree elsewhere (a record's may have been in the named place once); an identifier of the
/// code now; a test of the history (a record's is history, a live claim's is stale); a name of
/// the code's comments or history (not a test: the native stack's, or a former API's); a part
/// of a test's name in a command line (a `cargo test` filter); a name with a test file's segment, or a near miss
/// of a test's name (a misspelled test); else unknown (printed, not failed).
fn classify(m: &Mention, tree: &Tree, history: &History) -> Verdict {
    let verdict = classify_with(m, tree, history);
    // A record is checked against the history, which a shallow clone or a source archive lacks:
    // there its unresolved names are printed, not failed (a live claim's still fail).
    if m.record && !history.complete && verdict.fails() {
        return Verdict::Unknown;
    }
    verdict
}

/// Whether a test of that name is the one named (or one the prefix names).
fn is_named(m: &Mention, name: &str) -> bool {
    if m.prefix {
        name.starts_with(&m.name)
    } else {
        name == m.name
    }
}

/// Whether a test of these place words is where the name's segments put it (`tests`, `src` and
/// `crates` name nearly every test: a segment besides them must match).
fn is_placed(m: &Mention, places: &BTreeSet<String>) -> bool {
    let mut specific = m.places.iter().filter(|p| !matches!(p.as_str(), "tests" | "src" | "crates")).peekable();
    m.places.is_empty()
        || if specific.peek().is_none() { m.places.iter().any(|p| places.contains(p)) } else { specific.any(|p| places.contains(p)) }
}

/// The tests of the tree a name resolves to: of its name, in a place its segments name.
fn resolved<'t>(m: &Mention, tree: &'t Tree) -> Vec<&'t TestFn> {
    tree.tests.iter().filter(|t| is_named(m, &t.name) && is_placed(m, &t.places)).collect()
}

fn classify_with(m: &Mention, tree: &Tree, history: &History) -> Verdict {
    let named = |name: &str| is_named(m, name);
    let placed = |places: &BTreeSet<String>| is_placed(m, places);
    let same: Vec<&TestFn> = tree.tests.iter().filter(|t| named(&t.name)).collect();
    if !resolved(m, tree).is_empty() {
        return Verdict::Test;
    }
    let past = history.tests.iter().find(|(name, _)| named(name));
    if !same.is_empty() {
        let files: Vec<&str> = same.iter().map(|t| t.file.as_str()).collect();
        let was_placed = past.is_some_and(|(_, life)| life.files.iter().any(|f| placed(&place_words(f, &[]))));
        return if m.record && was_placed {
            Verdict::Historical(format!("moved since to {}", files.join(", ")))
        } else {
            Verdict::Unresolved(format!("the test of that name is in {}, which no segment names", files.join(", ")))
        };
    }
    if !m.prefix && tree.code.contains(&m.name) {
        return Verdict::Code("an identifier of the code");
    }
    if let Some((name, life)) = past {
        let note = life.describe(name);
        let was_placed = life.files.iter().any(|f| placed(&place_words(f, &[])));
        return if m.record && was_placed { Verdict::Historical(note) } else { Verdict::Unresolved(format!("no such test now; {note}")) };
    }
    if !m.prefix && (tree.comments.contains(&m.name) || history.idents.contains(&m.name)) {
        return Verdict::Code("a name of the code's comments or of its history, never a test");
    }
    if m.in_command && m.places.is_empty() && tree.tests.iter().any(|t| t.name.contains(&m.name)) {
        return Verdict::Filter;
    }
    let test_place = m.places.iter().find(|p| tree.test_files.contains(p.as_str()));
    if let Some(place) = test_place {
        return Verdict::Unresolved(format!("no test of that name, now or in the history, though `{place}` is a test file"));
    }
    if let Some(near) = tree.tests.iter().find(|t| near_miss(&t.name, &m.name)) {
        return Verdict::Unresolved(format!("no such test, now or in the history; misspelled `{}` ({})?", near.name, near.file));
    }
    Verdict::Unknown
}

/// Whether `b` looks like `a` misspelled, cut, lengthened or reworded: a small edit distance,
/// one inside the other, or three quarters of the longer one's words shared.
fn near_miss(a: &str, b: &str) -> bool {
    let words = a.split('_').count().max(b.split('_').count());
    distance(a, b) <= 2 + b.len() / 16 || a.contains(b) || b.contains(a) || likeness(a, b) * 4 >= words * 3
}

/// The edit distance of two names (bytes).
fn distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for i in 1..=a.len() {
        let mut diagonal = row[0];
        row[0] = i;
        for j in 1..=b.len() {
            let above = row[j];
            row[j] = (diagonal + usize::from(a[i - 1] != b[j - 1])).min(row[j - 1] + 1).min(above + 1);
            diagonal = above;
        }
    }
    row[b.len()]
}

/// README.md, ARCHITECTURE.md and docs/*.md, in that order.
fn documents(root: &Path) -> Result<Vec<String>> {
    let mut docs: Vec<String> = ["README.md", "ARCHITECTURE.md"].iter().filter(|d| root.join(d).is_file()).map(|d| d.to_string()).collect();
    let mut more = Vec::new();
    if let Ok(entries) = fs::read_dir(root.join("docs")) {
        for entry in entries {
            let name = entry.map_err(|e| e.to_string())?.file_name().to_string_lossy().into_owned();
            if name.ends_with(".md") {
                more.push(format!("docs/{name}"));
            }
        }
    }
    more.sort();
    docs.extend(more);
    Ok(docs)
}

/// Whether a heading holds a date (`2026-11-29`).
fn dated(heading: &str) -> bool {
    let b = heading.as_bytes();
    (0..b.len().saturating_sub(9)).any(|i| {
        let d = |k: usize| b[i + k].is_ascii_digit();
        d(0) && d(1) && d(2) && d(3) && b[i + 4] == b'-' && d(5) && d(6) && b[i + 7] == b'-' && d(8) && d(9)
    })
}

/// The test names a document's backticked spans hold, each with its line and whether it is in a
/// record (a section under a dated heading). A span may run onto the next lines of its paragraph
/// (a name broken after a `_` joins without a space); an opening backtick whose paragraph ends
/// first is a literal one.
fn mentions(doc: &str, text: &str) -> Vec<Mention> {
    let mut out = Vec::new();
    let mut fenced = false;
    // (level, dated) of the headings around the current line.
    let mut headings: Vec<(usize, bool)> = Vec::new();
    // The span open at the end of the previous line: its first line, its text so far, record.
    let mut open: Option<(usize, String, bool)> = None;
    let mut spans: Vec<(usize, String, bool)> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            open = None;
            continue;
        }
        if fenced || line.trim().is_empty() {
            open = None;
            continue;
        }
        let level = line.bytes().take_while(|&c| c == b'#').count();
        if level > 0 && line.as_bytes().get(level) == Some(&b' ') {
            headings.retain(|&(l, _)| l < level);
            headings.push((level, dated(line)));
            open = None;
        }
        let record = headings.iter().any(|&(_, d)| d);
        let mut parts = line.split('`');
        let first = parts.next().unwrap_or("");
        let mut inside = match open.take() {
            Some((at, mut so_far, rec)) => {
                if !so_far.ends_with('_') {
                    so_far.push(' ');
                }
                so_far.push_str(first.trim_start());
                open = Some((at, so_far, rec));
                true
            }
            None => false,
        };
        for part in parts {
            if inside {
                spans.extend(open.take());
            } else {
                open = Some((i + 1, part.to_string(), record));
            }
            inside = !inside;
        }
        if !inside {
            open = None;
        }
    }
    for (line, span, record) in spans {
        let in_command = span.split_whitespace().count() > 1;
        for word in span.split_whitespace() {
            if let Some((places, name, prefix)) = test_name(word) {
                out.push(Mention { doc: doc.into(), line, text: word.into(), places, name, prefix, record, in_command });
            }
        }
    }
    out
}

/// `word` as a name of snake_case words (two at least; `check` asks for more): the place words
/// before it, the name, whether it is a prefix.
fn test_name(word: &str) -> Option<(Vec<String>, String, bool)> {
    let word = word.trim_end_matches([',', ';', ':', '.', ')']).trim_start_matches('(');
    let (word, prefix) = match word.strip_suffix('…').or_else(|| word.strip_suffix("...")) {
        Some(w) => (w.trim_end_matches('_'), true),
        None => (word, false),
    };
    let mut segments: Vec<&str> = word.split("::").collect();
    let name = segments.pop()?.to_string();
    let snake = name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.bytes().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_');
    if !snake || !name.contains('_') || name.contains("__") {
        return None;
    }
    let mut places = Vec::new();
    for segment in segments {
        // `…::name`: a module left out.
        if segment == "…" || segment == "..." {
            continue;
        }
        // A type (`DeviceResources::`), a generic or anything but a path makes it no test's.
        let path_like = segment.bytes().all(|c| c.is_ascii_alphanumeric() || b"_./-".contains(&c));
        if segment.is_empty() || segment.starts_with(|c: char| c.is_ascii_uppercase()) || !path_like {
            return None;
        }
        for part in segment.split('/').filter(|p| !p.is_empty() && *p != ".") {
            let part = part.strip_suffix(".rs").or_else(|| part.strip_suffix(".py")).unwrap_or(part);
            places.push(part.replace('-', "_"));
        }
    }
    Some((places, name, prefix))
}

/// A test function of the tree.
#[derive(Debug)]
struct TestFn {
    name: String,
    file: String,
    /// The words of its place: directories and file stem (`-` as `_`), inline modules around it.
    places: BTreeSet<String>,
}

#[derive(Debug, PartialEq)]
enum Verdict {
    /// A test of the tree, in the place named.
    Test,
    /// Part of a test's name: a `cargo test` filter.
    Filter,
    /// Not a test: a name the code holds otherwise, now or in its history.
    Code(&'static str),
    /// In a record: a test of the history (renamed, moved or removed since).
    Historical(String),
    /// A name neither the tree nor its history holds, and like no test's: printed, not failed.
    Unknown,
    /// A test name that resolves to no test: the check fails.
    Unresolved(String),
}

impl Verdict {
    fn fails(&self) -> bool {
        matches!(self, Verdict::Unresolved(_))
    }

    fn describe(&self) -> String {
        match self {
            Verdict::Test => "a test".into(),
            Verdict::Filter => "part of a test's name (a filter)".into(),
            Verdict::Code(what) => format!("not a test: {what}"),
            Verdict::Historical(note) => format!("a record's test of the past: {note}"),
            Verdict::Unknown => "unknown: no test, no name of the code or its history, like no test's (not failed)".into(),
            Verdict::Unresolved(why) => format!("UNRESOLVED: {why}"),
        }
    }
}

/// The tests of the tree, and every identifier its sources hold outside comments.
#[derive(Default)]
struct Tree {
    tests: Vec<TestFn>,
    /// The stems of the files that hold tests (`exit`, `comms_clique`, `deps`).
    test_files: BTreeSet<String>,
    /// Identifiers of the sources outside comments (string literals included).
    code: BTreeSet<String>,
    /// Identifiers of the sources' comments only.
    comments: BTreeSet<String>,
}

impl Tree {
    fn scan(root: &Path) -> Result<Tree> {
        let mut tree = Tree::default();
        for top in ["crates", "tests", "models", "xtask", "scripts", ".ci"] {
            walk(&root.join(top), &mut |p| {
                let rel = p.strip_prefix(root).unwrap_or(p).to_string_lossy().into_owned();
                let ext = p.extension().and_then(|e| e.to_str()).unwrap_or("");
                let Ok(text) = fs::read_to_string(p) else { return };
                tree.add(&rel, ext, &text);
            })?;
        }
        Ok(tree)
    }

    fn add(&mut self, rel: &str, ext: &str, text: &str) {
        let before = self.tests.len();
        let code = match ext {
            "rs" => {
                self.tests.extend(rust_tests(rel, &layers::strip(text)));
                uncommented(text)
            }
            "c" | "cc" | "cpp" | "cu" | "h" | "hpp" => uncommented(text),
            "py" | "sh" | "toml" | "txt" | "json" | "" => {
                let stem = Path::new(rel).file_stem().and_then(|s| s.to_str()).unwrap_or("");
                let mut kept = String::new();
                for line in text.lines().filter(|l| !l.trim_start().starts_with('#')) {
                    if let Some(rest) = line.trim_start().strip_prefix("def test_").filter(|_| ext == "py" && stem.starts_with("test_")) {
                        let name = format!("test_{}", ident_at(rest));
                        self.tests.push(TestFn { name, file: rel.into(), places: place_words(rel, &[]) });
                    }
                    kept.push_str(line);
                    kept.push('\n');
                }
                kept
            }
            _ => return,
        };
        // This file's examples are documents' names, not the code's.
        if rel == SELF {
            return;
        }
        if self.tests.len() > before {
            let path = rel.rsplit_once('.').map_or(rel, |(p, _)| p);
            self.test_files.insert(path.rsplit('/').next().unwrap_or(path).replace('-', "_"));
        }
        let code: BTreeSet<String> = identifiers(&code).collect();
        self.comments.extend(identifiers(text).filter(|w| !code.contains(w)));
        self.code.extend(code);
    }
}

/// The `#[test]` functions of a Rust file whose comments, strings and chars are blanked.
fn rust_tests(rel: &str, code: &str) -> Vec<TestFn> {
    let mut out = Vec::new();
    // (module, brace depth inside it).
    let mut mods: Vec<(String, usize)> = Vec::new();
    let mut depth = 0;
    let mut pending_test = false;
    let mut pending_mod: Option<String> = None;
    let mut words = Tokens { text: code, at: 0 };
    while let Some(token) = words.next() {
        match token {
            "{" => {
                depth += 1;
                if let Some(name) = pending_mod.take() {
                    mods.push((name, depth));
                }
            }
            "}" => {
                if mods.last().is_some_and(|&(_, d)| d == depth) {
                    mods.pop();
                }
                depth = depth.saturating_sub(1);
            }
            ";" => pending_mod = None,
            "#" => {
                let rest = &code[words.at..];
                let attr = rest.trim_start();
                if attr.starts_with("[test]") || attr.starts_with("[tokio::test") {
                    pending_test = true;
                }
            }
            "mod" => pending_mod = words.next().map(str::to_string),
            "fn" => {
                if let Some(name) = words.next() {
                    if std::mem::take(&mut pending_test) {
                        let inner: Vec<String> = mods.iter().map(|(m, _)| m.clone()).collect();
                        out.push(TestFn { name: name.into(), file: rel.into(), places: place_words(rel, &inner) });
                    }
                }
            }
            _ => {}
        }
    }
    out
}

/// Identifiers and single punctuation characters of a text, in order.
struct Tokens<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Iterator for Tokens<'a> {
    type Item = &'a str;
    fn next(&mut self) -> Option<&'a str> {
        let rest = &self.text[self.at..];
        let start = self.at + rest.find(|c: char| !c.is_whitespace())?;
        let c = self.text[start..].chars().next()?;
        let len = if c.is_alphanumeric() || c == '_' { ident_at(&self.text[start..]).len() } else { c.len_utf8() };
        self.at = start + len;
        Some(&self.text[start..start + len])
    }
}

fn ident_at(text: &str) -> &str {
    let end = text.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(text.len());
    &text[..end]
}

fn identifiers(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !(c.is_alphanumeric() || c == '_')).filter(|w| w.contains('_')).map(str::to_string)
}

/// A file's place words: its directories and stem (`-` as `_`), then its inline modules.
fn place_words(rel: &str, inner: &[String]) -> BTreeSet<String> {
    let path = rel.strip_suffix(".rs").or_else(|| rel.strip_suffix(".py")).unwrap_or(rel);
    path.split('/').map(|p| p.replace('-', "_")).chain(inner.iter().cloned()).collect()
}

/// The text with comments blanked, string literals kept (their words, scenario names and bench
/// rows, are identifiers of the code too) and skipped over, so a `//` in one is no comment: the
/// layer check's lexer, keeping literals.
fn uncommented(text: &str) -> String {
    layers::lex(text, true)
}

fn walk(dir: &Path, f: &mut dyn FnMut(&Path)) -> Result<()> {
    let Ok(entries) = fs::read_dir(dir) else { return Ok(()) };
    for entry in entries {
        let path = entry.map_err(|e| e.to_string())?.path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n == "target" || n == ".git" || n == "node_modules") {
                continue;
            }
            walk(&path, f)?;
        } else {
            f(&path);
        }
    }
    Ok(())
}

/// The repository's history of tests: one pass of `git log -p` over everything but the
/// documents (the records in docs/ name tests, they do not define them).
#[derive(Default)]
struct History {
    /// Whether the whole history was read (not a shallow clone, not a source archive).
    complete: bool,
    /// Every test function ever added or removed.
    tests: BTreeMap<String, Life>,
    /// Every identifier of an added or removed line.
    idents: BTreeSet<String>,
}

/// One test's history.
#[derive(Default, Debug)]
struct Life {
    /// The files it was in.
    files: BTreeSet<String>,
    /// The newest commit that removed it without adding it back (not a move).
    removed: Option<Removal>,
}

/// A commit that removed a test: the commit, the test's file, the tests (and files) it added.
#[derive(Debug)]
struct Removal {
    commit: String,
    file: String,
    added: Vec<(String, String)>,
}

impl Life {
    fn describe(&self, name: &str) -> String {
        let Some(Removal { commit, file, added }) = &self.removed else {
            return format!("`{name}` was a test of {}", self.files.iter().cloned().collect::<Vec<_>>().join(", "));
        };
        // The most alike test that commit added, of the same file first.
        let best = added
            .iter()
            .filter(|(_, f)| f == file)
            .chain(added.iter().filter(|(_, f)| f != file))
            .max_by_key(|(a, f)| (likeness(name, a), f == file));
        match best.filter(|(a, _)| likeness(name, a) * 3 >= name.split('_').count()) {
            Some((new, f)) => format!("`{name}` removed from {file} in {commit}, which added `{new}` ({f})"),
            None => format!("`{name}` removed from {file} in {commit}"),
        }
    }
}

impl History {
    /// Empty where git or the history is not there (a source archive).
    fn read(root: &Path) -> History {
        let out = Command::new("git")
            .current_dir(root)
            .args([
                "log",
                "-p",
                "--no-renames",
                "--no-ext-diff",
                "--format=commit %h",
                "HEAD",
                "--",
                ".",
                ":(exclude)docs",
                ":(exclude)*.md",
                &format!(":(exclude){SELF}"),
            ])
            .output();
        let shallow = Command::new("git")
            .current_dir(root)
            .args(["rev-parse", "--is-shallow-repository"])
            .output()
            .map_or(true, |o| !o.status.success() || String::from_utf8_lossy(&o.stdout).trim() != "false");
        match out {
            Ok(out) if out.status.success() => {
                let mut history = History::parse(&String::from_utf8_lossy(&out.stdout));
                history.complete = !shallow;
                if shallow {
                    eprintln!("claims: a shallow clone: the records' names missing from the tree are printed, not failed");
                }
                history
            }
            _ => {
                eprintln!("claims: no git history here; names are checked against the tree only");
                History::default()
            }
        }
    }

    /// `git log -p` output, newest commit first. A function is a test where `#[test]` is among
    /// the four lines of its hunk above it, or it is a `def test_` of a `test_*.py` file.
    fn parse(log: &str) -> History {
        let mut history = History { complete: true, ..History::default() };
        let mut commit = String::new();
        let mut file = String::new();
        // Of the current commit: tests removed and added, with their files.
        let mut removed: Vec<(String, String)> = Vec::new();
        let mut added: Vec<(String, String)> = Vec::new();
        let mut above: Vec<&str> = Vec::new();
        for line in log.lines().chain(["commit end"]) {
            if let Some(c) = line.strip_prefix("commit ") {
                for (name, f) in removed.drain(..) {
                    let life = history.tests.entry(name.clone()).or_default();
                    life.files.insert(f.clone());
                    if life.removed.is_none() && !added.iter().any(|(a, _)| *a == name) {
                        life.removed = Some(Removal { commit: commit.clone(), file: f, added: added.clone() });
                    }
                }
                for (name, f) in added.drain(..) {
                    history.tests.entry(name).or_default().files.insert(f);
                }
                commit = c.trim().to_string();
                continue;
            }
            if let Some(f) = line.strip_prefix("+++ b/").or_else(|| line.strip_prefix("--- a/")) {
                file = f.to_string();
                above.clear();
                continue;
            }
            if line.starts_with("+++ ") || line.starts_with("--- ") || line.starts_with("diff ") || line.starts_with("index ") {
                continue;
            }
            if line.starts_with("@@") {
                above.clear();
                continue;
            }
            if let Some((sign, name)) = defined(line) {
                let python = file.ends_with(".py") && file.rsplit('/').next().is_some_and(|f| f.starts_with("test_"));
                let test = if python { name.starts_with("test_") } else { above.iter().rev().take(4).any(|l| l.contains("#[test]")) };
                if test {
                    let list = if sign == '+' { &mut added } else { &mut removed };
                    list.push((name, file.clone()));
                }
            }
            if line.starts_with(['+', '-']) {
                history.idents.extend(identifiers(&line[1..]));
            }
            above.push(line);
        }
        history
    }
}

/// A diff line that adds or removes a function: its sign and name.
fn defined(line: &str) -> Option<(char, String)> {
    let sign = line.chars().next().filter(|c| *c == '+' || *c == '-')?;
    let body = line[1..].trim_start();
    let body = body.strip_prefix("pub(crate) ").or_else(|| body.strip_prefix("pub ")).unwrap_or(body);
    let body = body.strip_prefix("async ").unwrap_or(body);
    let rest = body.strip_prefix("fn ").or_else(|| body.strip_prefix("def "))?;
    let name = ident_at(rest);
    (!name.is_empty()).then(|| (sign, name.to_string()))
}

/// How many words two snake_case names share.
fn likeness(a: &str, b: &str) -> usize {
    let a: BTreeSet<&str> = a.split('_').collect();
    b.split('_').collect::<BTreeSet<&str>>().intersection(&a).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory with the given files.
    fn tree_of(label: &str, files: &[(&str, &str)]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("claims-test-{label}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        for (path, text) in files {
            let path = dir.join(path);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, text).unwrap();
        }
        dir
    }

    fn failures(root: &Path, history: &History) -> Vec<(String, String)> {
        let report = check(root, &Tree::scan(root).unwrap(), history).unwrap();
        report.verdicts.iter().filter(|(_, v)| v.fails()).map(|(m, v)| (format!("{}:{}", m.doc, m.line), v.describe())).collect()
    }

    /// A whole history with no test in it (a repository of one commit).
    fn empty_history() -> History {
        History { complete: true, ..History::default() }
    }

    const README: &str = "# Title\n\nA job calling exit ends at once\n(`exit::a_job_calling_exit_ends_at_once`).\n";
    const RUNS: &str = "# Runs\n\n## Run 1: 2026-11-29, commit abc\n\n- `tests/tests/exit.rs::a_job_calling_exit_ends_at_once` passed.\n";

    #[test]
    fn a_named_test_that_is_missing_fails_with_its_line_and_passes_once_present() {
        let without = "#[test]\nfn something_else_entirely_here() {}\n";
        let root = tree_of("missing", &[("README.md", README), ("docs/gpu-runs.md", RUNS), ("tests/tests/exit.rs", without)]);
        let failed = failures(&root, &empty_history());
        assert_eq!(failed.len(), 2, "{failed:?}");
        assert_eq!(failed[0].0, "README.md:4");
        assert!(failed[0].1.contains("`exit` is a test file"), "{failed:?}");
        assert_eq!(failed[1].0, "docs/gpu-runs.md:5");

        // Without the history (a shallow clone), the record's name is printed, not failed; the
        // live claim's still fails.
        let failed = failures(&root, &History::default());
        assert_eq!(failed.iter().map(|f| f.0.as_str()).collect::<Vec<_>>(), ["README.md:4"], "{failed:?}");

        let with = "#[test]\nfn something_else_entirely_here() {}\n\n#[test]\n#[ignore]\nfn a_job_calling_exit_ends_at_once() {}\n";
        fs::write(root.join("tests/tests/exit.rs"), with).unwrap();
        assert!(failures(&root, &empty_history()).is_empty());
        fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn a_renamed_test_is_stale_in_a_live_claim_and_history_in_a_record() {
        let now = "#[test]\nfn a_job_calling_exit_skips_the_teardown() {}\n";
        let root = tree_of("renamed", &[("README.md", README), ("docs/gpu-runs.md", RUNS), ("tests/tests/exit.rs", now)]);
        let log = "commit 1234567\ndiff --git a/tests/tests/exit.rs b/tests/tests/exit.rs\n--- a/tests/tests/exit.rs\n+++ b/tests/tests/exit.rs\n@@ -1,2 +1,2 @@\n #[test]\n-fn a_job_calling_exit_ends_at_once() {}\n+fn a_job_calling_exit_skips_the_teardown() {}\ncommit 0abcdef\ndiff --git a/tests/tests/exit.rs b/tests/tests/exit.rs\n--- /dev/null\n+++ b/tests/tests/exit.rs\n@@ -0,0 +1,2 @@\n+#[test]\n+fn a_job_calling_exit_ends_at_once() {}\n";
        let history = History::parse(log);
        let failed = failures(&root, &history);
        assert_eq!(failed.len(), 1, "{failed:?}");
        assert_eq!(failed[0].0, "README.md:4");
        assert!(
            failed[0].1.contains("removed from tests/tests/exit.rs in 1234567, which added `a_job_calling_exit_skips_the_teardown`"),
            "{failed:?}"
        );
        let report = check(&root, &Tree::scan(&root).unwrap(), &history).unwrap();
        assert!(matches!(report.verdicts[1].1, Verdict::Historical(_)), "{:?}", report.verdicts);
        fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn names_of_the_api_and_of_in_file_modules_resolve_as_what_they_are() {
        let lib = "pub fn current_device_resources_of_the_thread() {}\n\n#[cfg(test)]\nmod tests {\n    use super::*;\n\n    #[test]\n    fn sizes_parse_like_dask_cuda() { let _ = \"{\"; }\n}\n";
        let readme = "`raft::current_device_resources_of_the_thread`, `DeviceResources::with_the_raft_resources_mut`,\n`deps::tests::sizes_parse_like_dask_cuda`, `sizes_parse_like_dask…`, `layers::tests::sizes_parse_like_dask_cuda`\n";
        let root = tree_of("api", &[("README.md", readme), ("xtask/src/deps.rs", lib)]);
        let report = check(&root, &Tree::scan(&root).unwrap(), &empty_history()).unwrap();
        let verdicts: Vec<&Verdict> = report.verdicts.iter().map(|(_, v)| v).collect();
        assert_eq!(verdicts.len(), 4, "the type's method is not a test name: {verdicts:?}");
        assert!(matches!(verdicts[0], Verdict::Code(_)));
        assert_eq!(verdicts[1], &Verdict::Test);
        assert_eq!(verdicts[2], &Verdict::Test);
        assert!(matches!(verdicts[3], Verdict::Unresolved(why) if why.contains("xtask/src/deps.rs")), "{verdicts:?}");
        fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn spans_run_across_lines_fences_are_skipped_and_dated_sections_are_records() {
        let doc = "# Doc\n\n`a_first_name_of_a_test` and `a_test_broken_\n  across_two_lines` end.\n\n```\n`not_a_name_in_a_fence`\n```\n\n## Run 3: 2026-11-30\n\n### Details\n\n`a_name_in_a_record_section` and `comms_clique a_group_on_one`\n\n## Method\n\n`a_name_in_a_live_section`\n";
        let found: Vec<(usize, String, bool, bool)> =
            mentions("d.md", doc).into_iter().map(|m| (m.line, m.name, m.record, m.in_command)).collect();
        let expect = [
            (3, "a_first_name_of_a_test", false, false),
            (3, "a_test_broken_across_two_lines", false, false),
            (14, "a_name_in_a_record_section", true, false),
            (14, "comms_clique", true, true),
            (14, "a_group_on_one", true, true),
            (18, "a_name_in_a_live_section", false, false),
        ];
        let expect: Vec<(usize, String, bool, bool)> = expect.iter().map(|(l, n, r, c)| (*l, n.to_string(), *r, *c)).collect();
        assert_eq!(found, expect);
    }

    #[test]
    fn test_names_take_paths_and_prefixes_and_leave_types_and_calls() {
        let parsed = |w: &str| test_name(w).map(|(p, n, pre)| (p.join("/"), n, pre));
        assert_eq!(parsed("tests/tests/exit.rs::a_b_c_d"), Some(("tests/tests/exit".into(), "a_b_c_d".into(), false)));
        assert_eq!(parsed("(raft-py/test_cpu.py::test_a_b_c),"), Some(("raft_py/test_cpu".into(), "test_a_b_c".into(), false)));
        assert_eq!(parsed("a_job_longer_than_its_bound_…"), Some((String::new(), "a_job_longer_than_its_bound".into(), true)));
        assert_eq!(parsed("…::a_b_c_d"), Some((String::new(), "a_b_c_d".into(), false)));
        assert_eq!(parsed("DeviceResources::with_raft_resources_mut"), None);
        assert_eq!(parsed("raft::a_b_c_d()"), None);
        assert_eq!(parsed("RAFT_EXIT_WAIT_SECS"), None);
        assert_eq!(parsed("__dlpack_device__"), None);
    }

    #[test]
    fn near_misses_are_told_from_other_names() {
        assert!(near_miss("malformed_tags_never_panic", "malformed_tags_never_panics"));
        assert!(near_miss("malformed_tags_never_panic_at_all", "malformed_tags_never_panic"));
        assert!(!near_miss("a_long_job_delays_only_its_own_resources_release", "stream_ordered_memory_resource"));
        assert_eq!(distance("kitten", "sitting"), 3);
    }
}
