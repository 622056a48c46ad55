//! `cargo xtask claims`, second half: every test a live claim names must be one that a script
//! of the repository runs. The first half (claims.rs) resolves each name to a `#[test]` (or a
//! `def test_`) of the tree; a test that no script runs proves nothing, so this half asks, for
//! each test a live claim names (not the dated records: history), whether some row of
//! [`RUNNERS`] runs it, and prints each that none does, with its document, line and why.
//!
//! **The rule.** A test is run where some row runs it: the row builds the test's Cargo workspace,
//! selects its package and its target (a kind of target, or a target by name), enables every
//! feature the target's `required-features` and every `cfg` around the test (its own, its inline
//! modules', its file's `#![cfg]` and every `mod` declaration from the target's root down to its
//! file) asks, and runs it as it is marked: an `#[ignore]`d test (`cfg_attr(P, ignore)` where
//! `P` holds) only by a row that passes `--ignored` or `--include-ignored`. A Python test is run
//! where a row runs its file and the file's `__main__` calls it (or collects every `test_`). A
//! GPU test that skips without a GPU counts as run where a row runs it; whether a GPU proved it is
//! a recorded run's business (docs/gpu-runs.md). The names resolve as Cargo resolves them: the
//! targets found by Cargo's conventions (`src/lib.rs`, `src/main.rs`, `src/bin/`, `tests/`,
//! `examples/`, `benches/`) and the manifests' `[lib]`/`[[test]]`/... tables; a file no `mod`
//! reaches is in no target.
//!
//! **The table** ([`RUNNERS`]) is data, not read from the scripts: each row names what it runs,
//! and the texts its scripts must hold for the row to be true. The check reads those texts in
//! the scripts, with the lists they spell out (comms.sh's binaries, the GPU bundle's excluded
//! crates, the facade features the workspace build unifies), and every script that runs
//! `cargo … test` must be a row's or one of [`SUBSETS`]: a script that changes what it runs fails
//! the check until the table follows. Only the widest runs are rows: Miri, ASan, valgrind and the
//! GPU session's soak and sanitizer steps run subsets of rows' tests and add none.
//!
//! **Failed, not printed.** On the tree when this was written every test a live claim named (110
//! names of 167 in live claims) was run, the one `#[ignore]`d among them by comms.sh's
//! `--ignored` probe; so a named test that no script runs fails the check, listing each.
use crate::claims_targets::{unquote, walk, Attr, Kind, Layout, Target};
use crate::Result;
use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

/// One test name of a live claim and the tests of the tree it resolved to (file, function).
pub(crate) struct Named<'a> {
    pub doc: &'a str,
    pub line: usize,
    pub text: &'a str,
    pub tests: Vec<(&'a str, &'a str)>,
}

enum Packages {
    All,
    Except(&'static [&'static str]),
    Only(&'static [&'static str]),
}

enum Targets {
    Kinds(&'static [Kind]),
    /// Cargo targets by name (a library's harness is its lib name: `raft_comms`).
    Named(&'static [&'static str]),
    /// Python test files, by path.
    Files(&'static [&'static str]),
}

#[derive(PartialEq)]
enum Ignored {
    Skipped,
    /// `--ignored`: only the ignored ones.
    Only,
}

/// What one script (one step of it) runs.
struct Runner {
    name: &'static str,
    /// The directory of the Cargo workspace's root manifest (`""`: the repository's).
    workspace: &'static str,
    packages: Packages,
    targets: Targets,
    /// The features the build enables, package by package (none has default features: `stale`).
    features: &'static [(&'static str, &'static [&'static str])],
    ignored: Ignored,
    /// (file, text): what the scripts say that makes this row true (read by every check: `stale`).
    evidence: &'static [(&'static str, &'static str)],
}

/// What `cargo test --workspace` enables: raft-tests asks the facade for `ndarray`, `comms` and
/// `cuvs`, and one build unifies the features of every package it selects (`cargo metadata`'s
/// resolve says the same).
const WORKSPACE_FEATURES: &[(&str, &[&str])] = &[("rapids-raft", &["comms", "cuvs", "ndarray"]), ("rapids-raft-core", &["ndarray"])];

/// The crates `cargo xtask gpu-bundle` leaves out of the bundle (they carry bundles of their own).
const BUNDLE_EXCLUDES: &[&str] = &["xtask", "raft-comms", "raft-cuvs"];

/// The binaries comms.sh runs (`./comms.sh tests`).
const COMMS_BINARIES: &[&str] = &[
    "comms_counts",
    "comms_groups",
    "comms_rendezvous",
    "comms_launcher",
    "raft_comms",
    "comms_clique",
    "comms_splits",
    "comms_processes",
];

/// Scripts that run tests, each a subset of the rows' (what they run, the rows run too).
const SUBSETS: &[&str] = &[
    // `cargo miri test` of raft-error, raft-exit, raft-build, raft-abi and raft-core's libraries
    // and raft-tests's dlpack: the first row's.
    "scripts/miri.sh",
    // The raft-tests, raft-core and raft-exit harnesses under ASan: the first row's.
    "scripts/asan-bundle.sh",
    // Every harness of `cargo test --workspace` under valgrind: the first row's.
    "scripts/valgrind-cpu.sh",
];

const RUNNERS: &[Runner] = &[
    Runner {
        name: ".ci/run: cargo xtask test (cargo test --workspace)",
        workspace: "",
        packages: Packages::All,
        targets: Targets::Kinds(&[Kind::Lib, Kind::Bin, Kind::Test]),
        features: WORKSPACE_FEATURES,
        ignored: Ignored::Skipped,
        evidence: &[(".ci/run", "\ncargo xtask test\n"), ("xtask/src/main.rs", "args([\"test\", \"--workspace\"]).args(&args[1..])")],
    },
    Runner {
        name: ".ci/run: crates/raft-cuvs/bindings.sh --check",
        workspace: "",
        packages: Packages::Only(&["raft-cuvs"]),
        targets: Targets::Named(&["bindings"]),
        features: &[("raft-cuvs", &["regenerate-bindings"])],
        ignored: Ignored::Skipped,
        evidence: &[
            (".ci/run", "crates/raft-cuvs/bindings.sh --check"),
            ("crates/raft-cuvs/bindings.sh", "cargo test -p raft-cuvs --features regenerate-bindings --test bindings -- --nocapture"),
        ],
    },
    Runner {
        name: ".ci/run: python3 crates/raft-py/tests/test_cpu.py",
        workspace: "",
        packages: Packages::Only(&["raft-py"]),
        targets: Targets::Files(&["crates/raft-py/tests/test_cpu.py"]),
        features: &[],
        ignored: Ignored::Skipped,
        evidence: &[(".ci/run", "python3 crates/raft-py/tests/test_cpu.py")],
    },
    Runner {
        name: ".ci/run: scripts/models.sh (the loom models)",
        workspace: "models",
        packages: Packages::All,
        targets: Targets::Kinds(&[Kind::Lib, Kind::Bin, Kind::Test]),
        features: &[],
        ignored: Ignored::Skipped,
        evidence: &[(".ci/run", "\nscripts/models.sh\n"), ("scripts/models.sh", "cargo test --quiet --release -- --test-threads=1")],
    },
    Runner {
        name: ".ci/run: tests/downstream/check.sh (the user's crate's test)",
        workspace: "tests/downstream",
        packages: Packages::Only(&["raft-downstream"]),
        targets: Targets::Kinds(&[Kind::Test]),
        features: &[],
        ignored: Ignored::Skipped,
        evidence: &[
            (".ci/run", "\ntests/downstream/check.sh\n"),
            ("tests/downstream/check.sh", "m[\"target\"][\"kind\"] == [\"test\"]"),
            ("tests/downstream/check.sh", "run \"${bare[@]}\" \"$test_exe\" --nocapture"),
        ],
    },
    Runner {
        name: "scripts/gpu-session.sh tests (cargo xtask gpu-bundle's tests/)",
        workspace: "",
        packages: Packages::Except(BUNDLE_EXCLUDES),
        // Harnesses only: a bin's own harness is left out of the bundle.
        targets: Targets::Kinds(&[Kind::Lib, Kind::Test]),
        features: WORKSPACE_FEATURES,
        ignored: Ignored::Skipped,
        evidence: &[
            ("scripts/gpu-session.sh", "tests) \"$b/run.sh\" tests"),
            ("xtask/src/bundle.rs", "&[\"test\", \"--workspace\", \"--release\", \"--no-run\""),
            ("xtask/src/bundle.rs", "if harnesses_only && (!is_test || kinds.iter().any(|k| k == \"bin\"))"),
            ("xtask/src/bundle.rs", "for t in \"$here\"/tests/*; do"),
        ],
    },
    Runner {
        name: "scripts/gpu-session.sh python (run-gpu.sh test: test_torch.py)",
        workspace: "",
        packages: Packages::Only(&["raft-py"]),
        targets: Targets::Files(&["crates/raft-py/tests/test_torch.py"]),
        features: &[],
        ignored: Ignored::Skipped,
        evidence: &[
            ("scripts/gpu-session.sh", "\"$b/python/run-gpu.sh\" test"),
            ("scripts/build-raft-py.sh", "cp crates/raft-py/tests/test_torch.py"),
            ("crates/raft-py/run-gpu.sh", "test) exec \"$py\" \"$here/test_torch.py\""),
        ],
    },
    Runner {
        name: "crates/raft-comms/scripts/comms-bundle.sh, then comms.sh tests",
        workspace: "",
        packages: Packages::Only(&["raft-comms"]),
        targets: Targets::Named(COMMS_BINARIES),
        features: &[],
        ignored: Ignored::Skipped,
        evidence: &[("crates/raft-comms/scripts/comms-bundle.sh", "cargo test --release -p raft-comms --no-run")],
    },
    Runner {
        name: "comms.sh tests: comms_groups --ignored (reported, not counted)",
        workspace: "",
        packages: Packages::Only(&["raft-comms"]),
        targets: Targets::Named(&["comms_groups"]),
        features: &[],
        ignored: Ignored::Only,
        evidence: &[("crates/raft-comms/scripts/comms-bundle.sh", "\"$here/tests/comms_groups\" --ignored")],
    },
    Runner {
        name: "crates/raft-cuvs/gpu/pack.sh, then run.sh (every raft-cuvs harness)",
        workspace: "",
        packages: Packages::Only(&["raft-cuvs"]),
        targets: Targets::Kinds(&[Kind::Lib, Kind::Bin, Kind::Test]),
        features: &[],
        ignored: Ignored::Skipped,
        evidence: &[
            ("crates/raft-cuvs/gpu/pack.sh", "cargo test --release -p raft-cuvs --no-run"),
            ("crates/raft-cuvs/gpu/run.sh", "for t in \"$b\"/tests/*; do"),
        ],
    },
];

/// Prints each test a live claim names that no row runs (`-v`: the rows that run each); returns
/// how many such names there are.
pub(crate) fn report(root: &Path, named: &[Named], verbose: bool) -> Result<usize> {
    let stale = stale(root);
    if !stale.is_empty() {
        return Err(format!(
            "claims: the table of what the scripts run (xtask/src/claims_run.rs) no longer holds:\n  {}",
            stale.join("\n  ")
        ));
    }
    let layout = Layout::scan(root)?;
    let mut unrun = 0;
    for n in named {
        let mut runs = BTreeSet::new();
        let mut why = Vec::new();
        for (file, name) in &n.tests {
            match runners_of(&layout, file, name) {
                Ok(by) => runs.extend(by),
                Err(reason) => why.push(format!("{file}: {reason}")),
            }
        }
        if !why.is_empty() {
            unrun += 1;
            println!("{}:{}: `{}`: NOT RUN by any script: {}", n.doc, n.line, n.text, why.join("; "));
        } else if verbose {
            println!("{}:{}: `{}`: run by {}", n.doc, n.line, n.text, runs.into_iter().collect::<Vec<_>>().join(", "));
        }
    }
    println!(
        "claims: {} test names in live claims, {} run by a script of the repository, {unrun} by none",
        named.len(),
        named.len() - unrun
    );
    Ok(unrun)
}

/// The rows that run the test `name` of `file`, or why none does.
fn runners_of(layout: &Layout, file: &str, name: &str) -> std::result::Result<Vec<&'static str>, String> {
    let places = layout.places.get(file).map(Vec::as_slice).unwrap_or_default();
    if places.is_empty() {
        return Err("its file is in no target (no `mod` declaration reaches it)".into());
    }
    let mut by = Vec::new();
    let mut why = BTreeSet::new();
    for (index, gates) in places {
        let target = &layout.targets[*index];
        let covering: Vec<&Runner> = RUNNERS.iter().filter(|r| covers(r, target)).collect();
        if covering.is_empty() {
            why.insert(format!("no script runs {}", describe(target)));
        }
        for runner in covering {
            match runs(layout, runner, target, file, name, gates) {
                Ok(()) => by.push(runner.name),
                Err(reason) if reason.is_empty() => {}
                Err(reason) => {
                    why.insert(format!("{reason} (where {} runs {})", runner.name, describe(target)));
                }
            }
        }
    }
    if by.is_empty() {
        Err(why.into_iter().collect::<Vec<_>>().join("; "))
    } else {
        Ok(by)
    }
}

/// Whether `runner`, which runs `target`, runs the test `name` of `file` in it.
fn runs(layout: &Layout, runner: &Runner, target: &Target, file: &str, name: &str, gates: &[Attr]) -> std::result::Result<(), String> {
    let features: &[&str] = runner.features.iter().find(|(p, _)| *p == target.package).map_or(&[], |(_, f)| f);
    let missing: Vec<&String> = target.required.iter().filter(|f| !features.contains(&f.as_str())).collect();
    if !missing.is_empty() {
        return Err(format!("its target needs the feature `{}` (required-features), not enabled", join(&missing)));
    }
    if target.kind == Kind::Python {
        let (all, called) = &layout.python[file];
        return if *all || called.contains(name) { Ok(()) } else { Err("the file's `__main__` does not call it".into()) };
    }
    let tests = layout.parsed.get(file).map(|p| p.tests.iter().filter(|(n, _)| n == name).collect::<Vec<_>>()).unwrap_or_default();
    let Some((_, attrs)) = tests.first() else { return Err("no such `#[test]` in the file".into()) };
    let mut ignored = false;
    for attr in gates.iter().chain(attrs.iter()) {
        match attr.first().map(String::as_str) {
            Some("cfg") if !holds(&attr[1..], features)? => return Err(format!("behind `{}`, false there", attr.join(""))),
            Some("cfg_attr") => {
                let mut at = 2;
                let applies = predicate(attr, &mut at, features)?;
                ignored |= applies && attr[at..].windows(2).any(|w| w[0] == "," && w[1] == "ignore");
            }
            Some("ignore") => ignored = true,
            _ => {}
        }
    }
    match (ignored, &runner.ignored) {
        (true, Ignored::Skipped) => Err("`#[ignore]`d, and run without `--ignored`".into()),
        // (Not a reason worth printing: the test's other rows decide.)
        (false, Ignored::Only) => Err(String::new()),
        _ => Ok(()),
    }
}

fn describe(target: &Target) -> String {
    let kind = format!("{:?}", target.kind).to_lowercase();
    let workspace = if target.workspace.is_empty() { String::new() } else { format!(" (workspace {})", target.workspace) };
    format!("{}'s {kind} target `{}`{workspace}", target.package, target.name)
}

fn join(items: &[&String]) -> String {
    items.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("`, `")
}

/// Whether a row selects this target at all (its features and marks aside).
fn covers(runner: &Runner, target: &Target) -> bool {
    let package = match runner.packages {
        Packages::All => true,
        Packages::Except(out) => !out.contains(&target.package.as_str()),
        Packages::Only(only) => only.contains(&target.package.as_str()),
    };
    let selected = match runner.targets {
        Targets::Kinds(kinds) => kinds.contains(&target.kind),
        Targets::Named(names) => target.kind != Kind::Python && names.contains(&target.name.as_str()),
        Targets::Files(files) => target.kind == Kind::Python && files.contains(&target.name.as_str()),
    };
    runner.workspace == target.workspace && package && selected
}

/// Whether the `cfg` predicate in parentheses at the start of `tokens` holds.
fn holds(tokens: &[String], features: &[&str]) -> std::result::Result<bool, String> {
    predicate(tokens, &mut 1, features)
}

/// One predicate at `tokens[*at]` (`cfg_attr`'s first argument, or `cfg`'s only one).
fn predicate(tokens: &[String], at: &mut usize, features: &[&str]) -> std::result::Result<bool, String> {
    let word = tokens.get(*at).cloned().unwrap_or_default();
    *at += 1;
    let next = tokens.get(*at).map(String::as_str);
    if matches!(word.as_str(), "not" | "all" | "any") && next == Some("(") {
        *at += 1;
        let mut values = Vec::new();
        while *at < tokens.len() && tokens[*at] != ")" {
            if tokens[*at] == "," {
                *at += 1;
                continue;
            }
            values.push(predicate(tokens, at, features)?);
        }
        *at += 1;
        return Ok(match word.as_str() {
            "not" => !values.first().copied().unwrap_or(false),
            "all" => values.iter().all(|v| *v),
            _ => values.iter().any(|v| *v),
        });
    }
    if next == Some("=") {
        let value = unquote(tokens.get(*at + 1).map(String::as_str).unwrap_or(""));
        *at += 2;
        return match word.as_str() {
            "feature" => Ok(features.contains(&value)),
            "target_os" => Ok(value == "linux"),
            "target_family" => Ok(value == "unix"),
            _ => Err(format!("behind `cfg({word} = \"{value}\")`, which the checker does not decide")),
        };
    }
    match word.as_str() {
        "test" | "unix" => Ok(true),
        "miri" | "windows" => Ok(false),
        _ => Err(format!("behind `cfg({word})`, which the checker does not decide")),
    }
}

/// What in the scripts no longer matches the table: a row's text missing, a list the scripts
/// spell out that differs, a script running tests that is neither a row's nor a subset.
fn stale(root: &Path) -> Vec<String> {
    let read = |file: &str| fs::read_to_string(root.join(file)).unwrap_or_default();
    let mut out = Vec::new();
    for runner in RUNNERS {
        for (file, text) in runner.evidence {
            if !read(file).contains(text) {
                out.push(format!("{file} no longer holds `{}` (row: {})", text.trim(), runner.name));
            }
        }
    }
    let comms = read("crates/raft-comms/scripts/comms-bundle.sh");
    let listed = comms
        .lines()
        .find_map(|l| l.trim().strip_prefix("for t in comms_"))
        .map(|l| format!("comms_{}", l.split(';').next().unwrap_or("")));
    let listed: BTreeSet<&str> = listed.as_deref().unwrap_or("").split_whitespace().collect();
    if listed != COMMS_BINARIES.iter().copied().collect() {
        out.push(format!("comms.sh's `tests` runs {listed:?}, the table says {COMMS_BINARIES:?}"));
    }
    let bundle = read("xtask/src/bundle.rs");
    let excluded: BTreeSet<&str> = bundle.split("\"--exclude\", \"").skip(1).filter_map(|r| r.split('"').next()).collect();
    if excluded != BUNDLE_EXCLUDES.iter().copied().collect() {
        out.push(format!("cargo xtask gpu-bundle excludes {excluded:?}, the table says {BUNDLE_EXCLUDES:?}"));
    }
    let facade = read("tests/Cargo.toml")
        .lines()
        .find(|l| l.starts_with("raft = {"))
        .map(|l| l.split("features = [").nth(1).unwrap_or("").to_string());
    let facade: BTreeSet<String> = facade
        .unwrap_or_default()
        .split(']')
        .next()
        .unwrap_or("")
        .split(',')
        .map(|f| f.trim().trim_matches('"').to_string())
        .filter(|f| !f.is_empty())
        .collect();
    let said: BTreeSet<String> = WORKSPACE_FEATURES[0].1.iter().map(|f| f.to_string()).collect();
    if facade != said || !read("crates/raft/Cargo.toml").contains("ndarray = [\"raft-core/ndarray\"]") {
        out.push(format!("raft-tests asks the facade for {facade:?} (and its ndarray for raft-core's), the table says {said:?}"));
    }
    for top in ["crates", "tests", "models", "xtask"] {
        walk(&root.join(top), &mut |p| {
            let text = if p.ends_with("Cargo.toml") { fs::read_to_string(p).unwrap_or_default() } else { String::new() };
            if text.lines().any(|l| l.trim_start().starts_with("default = [")) {
                out.push(format!("{} declares default features, which the table's rows do not list", p.display()));
            }
        });
    }
    let rows: BTreeSet<&str> = RUNNERS.iter().flat_map(|r| r.evidence.iter().map(|(f, _)| *f)).collect();
    let mut scripts = vec![root.join(".ci/run")];
    for top in ["scripts", "crates", "tests"] {
        walk(&root.join(top), &mut |p| {
            if p.extension().is_some_and(|e| e == "sh") {
                scripts.push(p.to_path_buf());
            }
        });
    }
    for script in scripts {
        let rel = script.strip_prefix(root).unwrap_or(&script).to_string_lossy().into_owned();
        let text = fs::read_to_string(&script).unwrap_or_default();
        let runs_tests = text
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .any(|l| l.contains("cargo ") && (l.contains(" test ") || l.ends_with(" test")));
        if runs_tests && !rows.contains(rel.as_str()) && !SUBSETS.contains(&rel.as_str()) {
            out.push(format!("{rel} runs `cargo … test`, and is neither a row's script nor one of SUBSETS"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::claims_targets::temp_tree as tree_of;

    #[test]
    fn the_table_holds_what_the_repositorys_scripts_say() {
        assert_eq!(stale(&crate::workspace_root()), Vec::<String>::new());
    }

    #[test]
    fn a_script_that_changes_what_it_runs_makes_the_table_stale() {
        let mut files: Vec<(String, String)> = Vec::new();
        for runner in RUNNERS {
            for (file, text) in runner.evidence {
                match files.iter_mut().find(|(f, _)| f == file) {
                    Some((_, all)) => all.push_str(&format!("\n{text}\n")),
                    None => files.push((file.to_string(), format!("\n{text}\n"))),
                }
            }
        }
        let comms = files.iter_mut().find(|(f, _)| f.ends_with("comms-bundle.sh")).unwrap();
        comms.1.push_str(&format!("  for t in {}; do\n", COMMS_BINARIES.join(" ")));
        let bundle = files.iter_mut().find(|(f, _)| f == "xtask/src/bundle.rs").unwrap();
        bundle.1.push_str(r#""--exclude", "xtask", "--exclude", "raft-comms", "--exclude", "raft-cuvs""#);
        files.push(("tests/Cargo.toml".into(), "raft = { workspace = true, features = [\"ndarray\", \"comms\", \"cuvs\"] }\n".into()));
        files.push(("crates/raft/Cargo.toml".into(), "ndarray = [\"raft-core/ndarray\"]\n".into()));
        files.push(("scripts/miri.sh".into(), "cargo +nightly miri test -p raft-error\n".into()));
        let root = tree_of("stale", &files);
        assert_eq!(stale(&root), Vec::<String>::new());

        // comms.sh drops a binary, the bundle stops excluding raft-cuvs, a new script runs tests.
        let comms_sh = root.join("crates/raft-comms/scripts/comms-bundle.sh");
        let text = fs::read_to_string(&comms_sh).unwrap().replace(" comms_splits", "");
        fs::write(&comms_sh, text).unwrap();
        let bundle_rs = root.join("xtask/src/bundle.rs");
        let text = fs::read_to_string(&bundle_rs).unwrap().replace(r#", "--exclude", "raft-cuvs""#, "");
        fs::write(&bundle_rs, text).unwrap();
        fs::write(root.join("scripts/soak-more.sh"), "# runs\ncargo test -p raft-tests --test soak\n").unwrap();
        let found = stale(&root);
        assert_eq!(found.len(), 3, "{found:?}");
        assert!(found[0].starts_with("comms.sh's `tests` runs"), "{found:?}");
        assert!(found[1].starts_with("cargo xtask gpu-bundle excludes"), "{found:?}");
        assert!(found[2].starts_with("scripts/soak-more.sh runs `cargo … test`"), "{found:?}");
        fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn a_test_is_run_only_where_a_row_builds_selects_and_runs_it_as_marked() {
        let lib = "mod plain;\n#[cfg(feature = \"doc-only\")]\nmod gated;\n#[cfg(all(test, feature = \"comms\"))]\nmod with_comms;\n\n#[cfg(test)]\nmod tests {\n    #[test]\n    fn a_unit_test() {}\n    #[test]\n    #[ignore = \"slow\"]\n    fn an_ignored_test() {}\n    #[test]\n    #[cfg_attr(miri, ignore)]\n    fn ignored_under_miri_only() {}\n    #[test]\n    #[cfg(nightly_only)]\n    fn behind_an_unknown_cfg() {}\n}\n";
        let test = |name: &str| format!("#[test]\nfn {name}() {{}}\n");
        let files: Vec<(String, String)> = [
            ("Cargo.toml", "[workspace]\nmembers = [\"crates/raft\"]\n".to_string()),
            ("crates/raft/Cargo.toml", "[package]\nname = \"rapids-raft\"\n\n[lib]\nname = \"raft\"\n".into()),
            ("crates/raft/src/lib.rs", lib.into()),
            ("crates/raft/src/plain.rs", test("in_a_declared_file")),
            ("crates/raft/src/gated.rs", test("behind_a_feature_no_row_enables")),
            ("crates/raft/src/with_comms.rs", test("behind_a_feature_the_workspace_unifies")),
            ("crates/raft/src/orphan.rs", test("in_no_module")),
            ("crates/raft/examples/demo.rs", format!("fn main() {{}}\n{}", test("of_an_example"))),
            ("crates/raft-comms/Cargo.toml", "[package]\nname = \"raft-comms\"\n".into()),
            ("crates/raft-comms/tests/comms_groups.rs", "#[test]\n#[ignore]\nfn an_open_probe() {}\n".into()),
            ("crates/raft-comms/tests/comms_stack.rs", "#[test]\n#[ignore]\nfn ignored_where_no_row_passes_ignored() {}\n".into()),
            ("crates/raft-cuvs/Cargo.toml", "[package]\nname = \"raft-cuvs\"\n\n[[test]]\nname = \"bindings\"\nrequired-features = [\"regenerate-bindings\"]\n\n[[test]]\nname = \"other\"\nrequired-features = [\"doc-only\"]\n".into()),
            ("crates/raft-cuvs/tests/bindings.rs", "#[path = \"../src/sys/headers.rs\"]\nmod headers;\n".into()),
            ("crates/raft-cuvs/src/sys/headers.rs", test("reached_through_a_path_attribute")),
            ("crates/raft-cuvs/tests/other.rs", test("needing_a_feature_no_row_enables")),
            ("crates/raft-py/Cargo.toml", "[package]\nname = \"raft-py\"\n".into()),
            ("crates/raft-py/tests/test_torch.py", "def test_called():\n    pass\n\ndef test_not_called():\n    pass\n\nif __name__ == \"__main__\":\n    test_called()\n".into()),
        ]
        .into_iter()
        .map(|(f, t)| (f.to_string(), t))
        .collect();
        let root = tree_of("rows", &files);
        let layout = Layout::scan(&root).unwrap();
        let run = |file: &str, name: &str| runners_of(&layout, file, name);
        let ci = RUNNERS[0].name;
        assert_eq!(run("crates/raft/src/lib.rs", "a_unit_test").unwrap(), [ci, RUNNERS[5].name]);
        assert_eq!(run("crates/raft/src/lib.rs", "ignored_under_miri_only").unwrap().len(), 2);
        assert_eq!(run("crates/raft/src/plain.rs", "in_a_declared_file").unwrap().len(), 2);
        assert_eq!(run("crates/raft/src/with_comms.rs", "behind_a_feature_the_workspace_unifies").unwrap().len(), 2);
        assert_eq!(run("crates/raft-comms/tests/comms_groups.rs", "an_open_probe").unwrap(), [RUNNERS[8].name]);
        assert_eq!(run("crates/raft-cuvs/src/sys/headers.rs", "reached_through_a_path_attribute").unwrap(), [RUNNERS[1].name]);
        assert_eq!(run("crates/raft-py/tests/test_torch.py", "test_called").unwrap(), [RUNNERS[6].name]);
        let why = |file: &str, name: &str| run(file, name).unwrap_err();
        assert!(why("crates/raft/src/lib.rs", "an_ignored_test").starts_with("`#[ignore]`d, and run without `--ignored`"));
        assert!(why("crates/raft/src/lib.rs", "behind_an_unknown_cfg")
            .starts_with("behind `cfg(nightly_only)`, which the checker does not decide"));
        assert!(why("crates/raft/src/gated.rs", "behind_a_feature_no_row_enables")
            .starts_with("behind `cfg(feature=\"doc-only\")`, false there"));
        assert_eq!(why("crates/raft/src/orphan.rs", "in_no_module"), "its file is in no target (no `mod` declaration reaches it)");
        assert_eq!(why("crates/raft/examples/demo.rs", "of_an_example"), "no script runs rapids-raft's example target `demo`");
        assert!(why("crates/raft-comms/tests/comms_stack.rs", "ignored_where_no_row_passes_ignored").starts_with("`#[ignore]`d"));
        assert!(why("crates/raft-cuvs/tests/other.rs", "needing_a_feature_no_row_enables")
            .starts_with("its target needs the feature `doc-only`"));
        assert!(why("crates/raft-py/tests/test_torch.py", "test_not_called").starts_with("the file's `__main__` does not call it"));
        fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn cfg_predicates_hold_as_the_rows_features_say() {
        let holds_in = |attr: &str, features: &[&str]| {
            let tokens = crate::claims_targets::tokens(attr);
            holds(&tokens[1..], features)
        };
        assert_eq!(holds_in("cfg(feature = \"comms\")", &["comms"]), Ok(true));
        assert_eq!(holds_in("cfg(not(feature = \"comms\"))", &["comms"]), Ok(false));
        assert_eq!(holds_in("cfg(all(test, unix, not(miri)))", &[]), Ok(true));
        assert_eq!(holds_in("cfg(any(miri, target_os = \"windows\"))", &[]), Ok(false));
        assert!(holds_in("cfg(loom)", &[]).is_err());
    }
}
