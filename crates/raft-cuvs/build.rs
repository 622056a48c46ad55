//! Where cuVS may be, as the build sees it: baked into the crate (`RAFT_CUVS_ROOTS`) for the
//! run-time loader (`src/sys/libcuvs.rs`, through raft-sys's `load`), which looks there after its
//! own knobs. Nothing is linked:
//! libcuvs_c.so is loaded at first use, so a binary starts without it. The roots and their order
//! are `raft_build::cuvs_roots`'s (`RAFT_CUVS_PREFIX`, beside raft-sys's stack where
//! `cargo xtask deps --cuvs` unpacks cuVS, the stack's root, `CONDA_PREFIX`).
use std::env;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let roots = raft_build::cuvs_roots_from_env();
    let joined = env::join_paths(&roots).unwrap_or_default();
    println!("cargo:rustc-env=RAFT_CUVS_ROOTS={}", joined.to_string_lossy());
}
