//! `cargo xtask package [--no-verify]`: `cargo package` of every library crate, in dependency
//! order, and checks of what a registry and docs.rs will get.
//!
//! The crates depend on each other by path and none is on crates.io yet: `cargo package -p X`
//! alone fails to resolve X's sibling dependencies. Several `-p` in one call work (cargo ≥ 1.90
//! packages them in dependency order and resolves each against the ones packaged before it, in a
//! local registry overlaid on crates.io's index), so this is one call with all of them. It then
//! builds each crate from its tarball (which compiles the shim, so it needs the native stack);
//! `--no-verify` only packages. Either way the crates.io index must be reachable to resolve the
//! external dependencies.
use crate::{cargo, workspace_root, Result};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

/// The published crates, each after the ones it depends on.
pub const PUBLISHED: &[&str] =
    &["raft-build", "raft-error", "raft-exit", "raft-sys", "rapids-raft-core", "raft-abi", "raft-comms", "raft-cuvs", "rapids-raft"];

/// Where the verifying builds go (emptied before each run; see `forget_unpacked_copies`).
const VERIFY_TARGET: &str = "target/package-verify";

/// Files the native crate cannot build without (its build script and shim read them; where the
/// stack is comes from the raft-build crate).
const RAFT_SYS_FILES: &[&str] = &[
    "build.rs",
    "build/probe.cpp",
    "src/fence.hpp",
    "src/shim/common.hpp",
    "src/shim/common.cpp",
    "src/shim/resources.cpp",
    "src/shim/memory.hpp",
    "src/shim/memory_resources.cpp",
    "src/shim/async_pools.cpp",
    "src/shim/buffers.cpp",
    "src/shim/exit.cpp",
    "include/raftrs.h",
    "src/bindings.rs",
    "src/load.rs",
];

/// The workspace's packages (`cargo metadata --no-deps`), by name.
fn packages() -> Result<BTreeMap<String, Value>> {
    let out = cargo()
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .current_dir(workspace_root())
        .output()
        .map_err(|e| format!("could not run cargo metadata: {e}"))?;
    if !out.status.success() {
        return Err(format!("cargo metadata failed:\n{}", String::from_utf8_lossy(&out.stderr)));
    }
    let meta: Value = serde_json::from_slice(&out.stdout).map_err(|e| format!("cargo metadata: {e}"))?;
    let list = meta["packages"].as_array().cloned().unwrap_or_default();
    Ok(list.into_iter().filter_map(|p| Some((p["name"].as_str()?.to_string(), p))).collect())
}

/// The workspace packages `name` depends on (normal and build dependencies), by package name.
fn local_deps(all: &BTreeMap<String, Value>, name: &str) -> BTreeSet<String> {
    all[name]["dependencies"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|d| d["kind"].as_str() != Some("dev"))
        .filter_map(|d| d["name"].as_str())
        .filter(|n| all.contains_key(*n))
        .map(str::to_string)
        .collect()
}

/// Checks the list against the workspace: every publishable member is in it, each after its
/// dependencies, and each that reaches raft-sys builds its docs.rs page with `doc-only`.
pub fn check_manifests() -> Result<()> {
    let all = packages()?;
    let publishable: BTreeSet<&str> =
        all.iter().filter(|(_, p)| !matches!(p["publish"].as_array(), Some(r) if r.is_empty())).map(|(n, _)| n.as_str()).collect();
    let listed: BTreeSet<&str> = PUBLISHED.iter().copied().collect();
    if publishable != listed {
        return Err(format!("publishable members {publishable:?} differ from xtask's PUBLISHED {listed:?}"));
    }
    let mut problems = Vec::new();
    for (i, name) in PUBLISHED.iter().enumerate() {
        for dep in local_deps(&all, name) {
            if !PUBLISHED[..i].contains(&dep.as_str()) {
                problems.push(format!("{name} depends on {dep}, which is not packaged before it"));
            }
        }
        let mut reach = local_deps(&all, name);
        let mut todo: Vec<String> = reach.iter().cloned().collect();
        while let Some(d) = todo.pop() {
            for dd in local_deps(&all, &d) {
                if reach.insert(dd.clone()) {
                    todo.push(dd);
                }
            }
        }
        let native = *name == "raft-sys" || reach.contains("raft-sys");
        let features = &all[*name]["metadata"]["docs"]["rs"]["features"];
        let doc_only = features.as_array().is_some_and(|f| f.iter().any(|x| x == "doc-only"));
        if native && !doc_only {
            problems.push(format!("{name} reaches raft-sys but has no [package.metadata.docs.rs] features = [\"doc-only\"]"));
        }
        if native && all[*name]["features"].get("doc-only").is_none() {
            problems.push(format!("{name} reaches raft-sys but has no doc-only feature"));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("\n"))
    }
}

/// The files `cargo package` would put in `name`'s tarball.
fn listed_files(name: &str) -> Result<Vec<String>> {
    let out = cargo()
        .args(["package", "--list", "--allow-dirty", "-p", name])
        .current_dir(workspace_root())
        .output()
        .map_err(|e| format!("could not run cargo package --list: {e}"))?;
    if !out.status.success() {
        return Err(format!("cargo package --list -p {name} failed:\n{}", String::from_utf8_lossy(&out.stderr)));
    }
    Ok(String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect())
}

/// Removes what an earlier `cargo package` left of these crates (target/package and what it
/// unpacked under `$CARGO_HOME/registry/src`):
/// cargo verifies each crate against its dependencies' tarballs from a local registry, but does
/// not unpack the same name and version again when a directory is there, so a verify would
/// build against the sources of an earlier run (seen here: a raft-sys without the latest entry
/// points). Only our own unpublished crates' directories are touched.
fn forget_unpacked_copies() -> Result<()> {
    let home = std::env::var_os("CARGO_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".cargo")))
        .ok_or("neither CARGO_HOME nor HOME is set")?;
    let version = env!("CARGO_PKG_VERSION");
    // The local registry cargo verifies from (target/package), and the target directory of the
    // verifying builds: cargo takes a registry crate of the same name, version and source as
    // unchanged and never rebuilds it, so a build left by an earlier run would be linked.
    for dir in ["target/package", VERIFY_TARGET] {
        let dir = workspace_root().join(dir);
        if dir.is_dir() {
            std::fs::remove_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
    }
    let Ok(registries) = std::fs::read_dir(home.join("registry/src")) else { return Ok(()) };
    for registry in registries.flatten() {
        for name in PUBLISHED {
            let dir = registry.path().join(format!("{name}-{version}"));
            if dir.is_dir() {
                std::fs::remove_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            }
        }
    }
    Ok(())
}

pub fn run(verify: bool) -> Result<()> {
    check_manifests()?;
    let files = listed_files("raft-sys")?;
    let missing: Vec<&&str> = RAFT_SYS_FILES.iter().filter(|f| !files.iter().any(|l| l == **f)).collect();
    if !missing.is_empty() {
        return Err(format!("raft-sys's package lacks {missing:?} (its `include` list in Cargo.toml)"));
    }
    forget_unpacked_copies()?;
    // --allow-dirty: this checks that the crates package, not that the tree is committed.
    let mut cmd = cargo();
    cmd.args(["package", "--allow-dirty", "--target-dir", VERIFY_TARGET]);
    if !verify {
        cmd.arg("--no-verify");
    }
    for name in PUBLISHED {
        cmd.args(["-p", name]);
    }
    crate::run(&mut cmd)?;
    let dir = workspace_root().join(VERIFY_TARGET).join("package");
    for name in PUBLISHED {
        let version = env!("CARGO_PKG_VERSION");
        let file = dir.join(format!("{name}-{version}.crate"));
        if !file.is_file() {
            return Err(format!("cargo package made no {}", file.display()));
        }
        // The manifest a registry gets: no path dependency left in it.
        let out = Command::new("tar")
            .arg("-xOzf")
            .arg(&file)
            .arg(format!("{name}-{version}/Cargo.toml"))
            .output()
            .map_err(|e| format!("could not run tar: {e}"))?;
        let manifest = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() || manifest.contains("path = \"../") {
            return Err(format!("{}: its Cargo.toml is missing or keeps a path dependency", file.display()));
        }
    }
    println!(
        "package: {} crates packaged in dependency order into {}{}",
        PUBLISHED.len(),
        dir.display(),
        if verify { " and built from their tarballs" } else { "" }
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_published_list_is_every_library_in_dependency_order_with_docs_rs_metadata() {
        super::check_manifests().unwrap();
    }
}
