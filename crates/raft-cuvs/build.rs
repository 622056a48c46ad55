//! Where cuVS may be, as the build sees it: baked into the crate (`RAFT_CUVS_ROOTS`) for the
//! run-time loader (`src/sys/load.rs`), which looks there after its own knobs. Nothing is linked:
//! libcuvs_c.so is loaded at first use, so a binary starts without it.
use std::env;
use std::path::PathBuf;

/// Reads a knob and reruns the build when it changes.
fn env_var_rerun(name: &str) -> Option<String> {
    println!("cargo:rerun-if-env-changed={name}");
    env::var(name).ok().filter(|v| !v.is_empty())
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let mut roots: Vec<PathBuf> = Vec::new();
    // An install of the user's: unpacked wheels (libcuvs/lib64/libcuvs_c.so) or a conda-style
    // prefix (lib/libcuvs_c.so).
    if let Some(prefix) = env_var_rerun("RAFT_CUVS_PREFIX") {
        roots.push(prefix.into());
    }
    // raft-sys's stack root (`cargo:root`): the base prefix of `cargo xtask deps`, beside which
    // `cargo xtask deps --cuvs` unpacks cuVS (xtask/src/deps.rs, `cuvs_prefix`), or a Python
    // environment's site-packages, where `pip install libcuvs-cu13` puts `libcuvs/` beside
    // `libraft/`. Absent in doc-only builds.
    if let Ok(root) = env::var("DEP_RAFTRS_ROOT") {
        let root = PathBuf::from(root);
        if let Some(parent) = root.parent() {
            roots.push(parent.join("cuvs"));
        }
        roots.push(root);
    }
    if let Some(conda) = env_var_rerun("CONDA_PREFIX") {
        roots.push(conda.into());
    }
    let joined = env::join_paths(&roots).unwrap_or_default();
    println!("cargo:rustc-env=RAFT_CUVS_ROOTS={}", joined.to_string_lossy());
}
