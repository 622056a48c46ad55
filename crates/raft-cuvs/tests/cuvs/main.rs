//! raft-cuvs's integration tests, in one binary: every test binary adds about a megabyte to
//! `cargo xtask gpu-bundle`, which must stay under 60 MiB.
//!
//! | module | runs on | what |
//! | --- | --- | --- |
//! | `loading` | any machine | cuVS loaded at run time: a clear error without it, nvJitLink, one RMM |
//! | `knn` | GPU | brute force equal to the exact CPU answer; the lent stream; argument checks first |
//! | `cagra` | GPU | CAGRA build + search on 100k × 128, recall@10 ≥ 0.95; a deep multi-CTA search past cuVS's 32-bit offsets; parameters cuVS crashes on refused (child) |
//! | `memory` | GPU (child process) | cuVS's allocations in raft-rs's memory statistics |
//! | `exit` | GPU (child processes) | an exit while a cuVS search runs as a job |
//!
//! GPU tests skip with a printed reason without a GPU or without cuVS; `RAFT_REQUIRE_GPU=1`
//! makes a missing GPU a failure, `RAFT_REQUIRE_CUVS=1` a missing cuVS.
#[macro_use]
mod common;
mod cagra;
mod exit;
mod knn;
mod loading;
mod memory;
