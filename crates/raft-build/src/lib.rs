//! Where the native stack of raft-rs (RAFT, RMM, rapids-logger, the CUDA 13.2 runtime and
//! libraries, NCCL, and cuVS beside them) is, and what it must hold: one copy of these rules for
//! the build scripts of `raft-sys`, `raft-comms`, `raft-cuvs` and the test crate, and for
//! `cargo xtask deps`, so the build and the cache it reads never disagree.
//!
//! A build-time crate: it has no dependency beyond std, and links nothing. Its functions print
//! `cargo:rerun-if-env-changed` for each knob they read when they run inside a build script.
//!
//! - [`pins`]: the pinned release and wheels, [`pip_line`], the libraries the shim links.
//! - [`cache`]: the knobs ([`env_var_rerun`]) and the `cargo xtask deps` cache.
//! - [`stack`]: [`Stack`] and [`find`], in `RAFT_SYS_PREFIX`, the cache, a Python environment,
//!   `CONDA_PREFIX`; [`Stack::from_dep_metadata`] for crates that build after `raft-sys`.
//! - [`cuvs`]: where cuVS may be, relative to the stack ([`cuvs_roots`]).

// It reads paths and environment variables: nothing here needs `unsafe`.
#![forbid(unsafe_code)]

pub mod cache;
pub mod cuvs;
pub mod pins;
pub mod stack;

pub use cache::{cache_dir, cache_prefix, env_var_rerun};
pub use cuvs::{cuvs_beside, cuvs_roots, cuvs_roots_from_env};
pub use pins::{pip_line, LIBRARIES, NCCL_WHEEL, PINNED, WHEELS};
pub use stack::{find, Stack};
