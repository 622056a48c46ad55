//! `cargo xtask install-line [--check]`: the README's `pip install` line, generated from the pins
//! in `crates/raft-build/src/pins.rs` (the build script's and `cargo xtask deps`'s one source),
//! and the resolver check that keeps those pins installable.
//!
//! `cargo xtask deps` downloads with `--no-deps`, which never asks whether pip's resolver accepts
//! the set: the pins once named an nvJitLink that libraft-cu13's own requirements refuse, and the
//! README's line failed in every fresh virtualenv while the cache built fine. [`resolve`] runs the
//! resolver over the fetched wheels (offline) and fails unless it installs exactly the pins.
use crate::stack::pip_line;
use crate::Result;
use std::path::Path;
use std::process::Command;

/// The platforms of the wheels (manylinux x86-64), for `pip download` and the resolver alike.
pub const PLATFORMS: &[&str] = &[
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_18_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux_2_12_x86_64",
    "manylinux2010_x86_64",
];

/// The one line of README.md that installs the stack (the line starting `pip install
/// libraft-cu13`); an error unless there is exactly one.
pub fn readme_line(readme: &str) -> Result<String> {
    let lines: Vec<&str> = readme.lines().map(str::trim).filter(|l| l.starts_with("pip install libraft-cu13")).collect();
    match lines.as_slice() {
        [one] => Ok(one.to_string()),
        [] => Err("README.md has no `pip install libraft-cu13…` line".into()),
        more => Err(format!("README.md has {} `pip install libraft-cu13…` lines; CI checks one", more.len())),
    }
}

/// `install-line`: prints the line; with `--check`, fails when README.md's differs.
pub fn run(check: bool) -> Result<()> {
    let want = pip_line();
    if !check {
        println!("{want}");
        return Ok(());
    }
    let path = crate::workspace_root().join("README.md");
    let readme = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let have = readme_line(&readme)?;
    if have != want {
        return Err(format!(
            "README.md's install line is not the pinned stack's (crates/raft-build/src/pins.rs).\n  README: {have}\n  pinned: {want}\n\
             Replace it with the output of `cargo xtask install-line`."
        ));
    }
    println!("README.md's install line is the pinned stack's");
    Ok(())
}

/// Runs pip's resolver, offline, over the wheels in `dir` for `pins` (CPython 3.12 on x86-64
/// Linux, whatever this machine's Python is; nothing is installed) and fails unless every
/// requirement is met and it would install exactly `pins`: no conflict, nothing missing, nothing
/// more. `what` names the set in the error.
pub fn resolve(python: &str, dir: &Path, pins: &[(&str, &str)], what: &str) -> Result<()> {
    let target = std::env::temp_dir().join(format!("raft-rs-resolve-{}", std::process::id()));
    let mut pip = Command::new(python);
    pip.args(["-m", "pip", "install", "--quiet", "--dry-run", "--ignore-installed", "--no-index", "--report", "-"]);
    // --target only because pip takes the platform options with it; --dry-run writes nothing.
    pip.arg("--target").arg(&target).args(["--only-binary=:all:", "--python-version", "3.12"]);
    for platform in PLATFORMS {
        pip.args(["--platform", platform]);
    }
    pip.arg("--find-links").arg(dir);
    pip.args(pins.iter().map(|(n, v)| format!("{n}=={v}")));
    let out = pip.output().map_err(|e| format!("could not start {python} -m pip: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "pip's resolver refuses the pinned {what} (what `pip install` would do in a fresh virtualenv):\n{}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let installed = report_installs(&out.stdout)?;
    let mut want: Vec<String> = pins.iter().map(|(n, v)| format!("{}=={v}", normalize(n))).collect();
    want.sort();
    if installed != want {
        let extra: Vec<&String> = installed.iter().filter(|p| !want.contains(p)).collect();
        let missing: Vec<&String> = want.iter().filter(|p| !installed.contains(p)).collect();
        return Err(format!(
            "pip's resolver installs more or other than the pinned {what}: it adds {extra:?} and leaves out {missing:?}; \
             pin exactly what it installs in crates/raft-build/src/pins.rs"
        ));
    }
    Ok(())
}

/// `name==version` of each package in pip's JSON installation report, sorted.
fn report_installs(report: &[u8]) -> Result<Vec<String>> {
    let bad = || format!("could not read pip's installation report: {}", String::from_utf8_lossy(report));
    let json: serde_json::Value = serde_json::from_slice(report).map_err(|_| bad())?;
    let mut names = Vec::new();
    for item in json["install"].as_array().ok_or_else(bad)? {
        let (name, version) = (item["metadata"]["name"].as_str(), item["metadata"]["version"].as_str());
        names.push(format!("{}=={}", normalize(name.ok_or_else(bad)?), version.ok_or_else(bad)?));
    }
    names.sort();
    Ok(names)
}

/// PEP 503's normal form: `Foo_Bar.baz` and `foo-bar-baz` are one project.
fn normalize(name: &str) -> String {
    name.to_ascii_lowercase().replace(['_', '.'], "-")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The README's install line is generated from the pins: a hand edit of either fails here
    /// (and so in `cargo xtask test` and CI).
    #[test]
    fn readme_install_line_is_the_pinned_stack() {
        let readme = std::fs::read_to_string(crate::workspace_root().join("README.md")).unwrap();
        assert_eq!(readme_line(&readme).unwrap(), pip_line(), "run `cargo xtask install-line` and paste its output into README.md");
    }

    #[test]
    fn readme_line_wants_exactly_one() {
        assert!(readme_line("no line here").is_err());
        let two = format!("{0}\n{0}\n", pip_line());
        assert!(readme_line(&two).is_err());
        assert_eq!(readme_line(&format!("```sh\n  {}\ncargo run\n", pip_line())).unwrap(), pip_line());
    }

    /// NCCL is one of the pins (libraft asks for it), so `deps` and the line both bring `nccl.h`.
    #[test]
    fn nccl_is_pinned_with_the_stack() {
        assert!(crate::stack::WHEELS.contains(&crate::stack::NCCL_WHEEL));
    }
}
