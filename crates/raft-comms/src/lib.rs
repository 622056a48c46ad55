//! NCCL communicators in RAFT's resources: collectives on [`DeviceVec`]s
//! across the GPUs of one process or of many processes, and what RAFT's and cuVS's multi-GPU C++
//! code reaches through `raft::resource::get_comms`.
//!
//! | piece | what it is |
//! | --- | --- |
//! | C++ shim (`libraftcomms_shim.so`) | RAFT's `raft::comms::comms_iface` over NCCL alone (no UCX), the `raftcomms_*` C functions; opens libnccl at run time |
//! | [`Communicator`] | one rank's `ncclComm_t` on a [`DeviceResources`]: collectives, [`split`](Communicator::split), [`install`](Communicator::install), [`sync`](Communicator::sync), release |
//! | [`group_scope`] (safe), [`group`] (unsafe) | `ncclGroupStart` / `ncclGroupEnd`: one thread driving a whole clique; `g.on(&comm).allreduce_in_place(..)` |
//! | [`UniqueId`], [`Launch`] | the rendezvous: rank 0's id over TCP; where a process stands, from torchrun's, Open MPI's, PMI's or Slurm's environment variables |
//! | [`counts`] | the count checks every collective makes before NCCL is called |
//! | `raft-run` (a binary) | `raft-run -n 2 ./prog args…`: a local launcher setting `RANK`, `WORLD_SIZE`, … |
//!
//! # One process, several GPUs
//! ```no_run
//! use raft_core::{DeviceResources, DeviceVec};
//! use raft_comms::{Communicator, ReduceOp};
//! # fn main() -> raft_core::Result<()> {
//! let resources = [DeviceResources::on_device(0)?, DeviceResources::on_device(1)?];
//! let comms = Communicator::clique(&resources)?; // eager, on this thread, in one NCCL group
//! let mut parts: Vec<DeviceVec<f32>> =
//!     resources.iter().map(|r| DeviceVec::from_host(r, &[1.0, 2.0])).collect::<raft_core::Result<_>>()?;
//! // One NCCL group: every GPU's call is queued together when the closure returns. The arrays
//! // and communicators are borrowed until then, so none can be freed under NCCL.
//! raft_comms::group_scope(|g| {
//!     comms.iter().zip(parts.iter_mut()).try_for_each(|(c, p)| g.on(c).allreduce_in_place(p, ReduceOp::Sum))
//! })?;
//! comms.iter().try_for_each(|c| c.sync())?;
//! assert_eq!(parts[0].to_host()?, [2.0, 4.0]);
//! # Ok(()) }
//! ```
//!
//! # Several processes, one GPU each
//! Started by `raft-run -n 2 ./prog` (or torchrun, or a cluster's launcher setting `RANK`,
//! `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`):
//! ```no_run
//! use raft_core::{DeviceResources, DeviceVec};
//! use raft_comms::{Communicator, Launch, ReduceOp};
//! # fn main() -> raft_core::Result<()> {
//! let launch = Launch::from_env()?;
//! let res = DeviceResources::on_device(launch.device()?)?;
//! let comm = Communicator::from_env(&res)?; // rank 0 serves the unique id over TCP
//! let mut v = DeviceVec::from_host(&res, &[comm.rank() as f64; 3])?;
//! comm.allreduce_in_place(&mut v, ReduceOp::Sum)?;
//! comm.sync()?;
//! comm.install(&res)?; // RAFT's C++ code given `res` now sees it through get_comms
//! # Ok(()) }
//! ```
//!
//! # NCCL
//! The shim is built against `nccl.h` (`cargo xtask deps` puts the `nvidia-nccl-cu13` wheel,
//! one of the base pins, in the cache; or `RAFT_COMMS_NCCL_PREFIX`); without it this crate still
//! builds and the first call says so. libnccl (2.18 or newer) is opened at the first call:
//! `RAFT_COMMS_NCCL_LIB` (a path), else `libnccl.so.2` through `LD_LIBRARY_PATH`, the NCCL found
//! at build time, the system's. A program that never makes a communicator never loads either.
//! cudarc's own `nccl` feature is not used (it panics when libnccl is missing).
//!
//! # What is checked, and what cannot be
//! Safe code cannot hand NCCL a count that does not fit the arrays given, an array of another
//! stream, or a rank that does not exist: every collective checks before NCCL is called.
//! What a rank cannot check alone is that the *other* ranks make the matching call with matching
//! counts (NCCL's contract, as MPI's): a mismatch is a program error that this library turns into
//! a timeout and an abort, not a hang — see `docs/COMMS.md`.
mod collectives;
mod communicator;
pub mod counts;
mod dtype;
mod group;
mod launch;
mod load;
mod rendezvous;
mod result;
mod scope;
mod secret;
mod shared;
mod sys;
mod unique_id;
mod watchdog;

pub use communicator::Communicator;
pub use dtype::{NcclType, ReduceOp};
pub use group::group;
pub use launch::{timeout_from_env, Launch, DEFAULT_TIMEOUT};
pub use scope::{group_scope, GroupScope, ScopedComm};
pub use secret::{Secret, JOB_VAR, MIN_DISTINCT_SECRET_BYTES, MIN_SECRET_BYTES, SECRET_VAR};
pub use unique_id::UniqueId;

use raft_core::{DeviceResources, DeviceVec};
use raft_error::{Error, Result};
use std::path::PathBuf;

/// What is loaded: NCCL's version and file, the header version the shim was built with, and
/// the shim's file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NcclInfo {
    /// The loaded libnccl's version, e.g. (2, 28, 9).
    pub version: (u32, u32, u32),
    /// The file libnccl was loaded from.
    pub library: PathBuf,
    /// The version of the `nccl.h` the shim was compiled against.
    pub header_version: (u32, u32, u32),
    /// The shim's file.
    pub shim: PathBuf,
}

fn split_version(code: i32) -> (u32, u32, u32) {
    let c = code.max(0) as u32;
    (c / 10000, (c % 10000) / 100, c % 100)
}

/// Loads the shim and libnccl (if not yet) and says what was loaded.
///
/// # Errors
/// `Cuda` (a missing library, as everywhere in raft-rs) saying what is missing (the shim, the
/// NCCL headers at build time, libnccl) and what to install or set.
pub fn nccl_info() -> Result<NcclInfo> {
    const WHO: &str = "raft_comms::nccl_info";
    let (version, library, shim) = load::nccl_facts(WHO)?;
    Ok(NcclInfo {
        version: split_version(version),
        library: PathBuf::from(library),
        header_version: split_version(result::header_nccl_version(WHO)?),
        shim,
    })
}

/// Why this build has no NCCL shim (the NCCL headers were missing at build time, or a
/// documentation build), or `None` when it has one.
pub fn build_note() -> Option<&'static str> {
    load::build_note()
}

/// What RAFT's `raft::resource::get_comms` sees in `resources`: `(rank, size)` of the installed
/// communicator, or `None`.
///
/// # Errors
/// `Logic` on released resources; `Cuda` when the shim cannot be loaded.
pub fn installed(resources: &DeviceResources) -> Result<Option<(usize, usize)>> {
    const WHO: &str = "raft_comms::installed";
    resources.with_raft_resources(|raft| result::installed(WHO, raft)).map_err(|e| e.with_who(WHO))?
}

/// Collectives made the way RAFT's and cuVS's C++ code makes them: through
/// `raft::resource::get_comms(res)` of resources a communicator was [installed](Communicator::install)
/// into, then RAFT's `sync_stream`. For checking an installation, and for code that must see
/// exactly what the C++ algorithms see.
pub mod through_raft {
    use super::*;

    /// `recv = op` over the ranks' `send`, through RAFT's `comms_t::allreduce`, then RAFT's
    /// `sync_stream` (bounded by the communicator's timeout). The arrays belong to `resources`.
    ///
    /// # Errors
    /// `Logic` when nothing is installed, lengths differ, arrays of other resources, or the
    /// communicator has ended; `Generic` when the collective fails.
    pub fn allreduce<T: NcclType>(resources: &DeviceResources, send: &DeviceVec<T>, recv: &mut DeviceVec<T>, op: ReduceOp) -> Result<()> {
        const WHO: &str = "through_raft::allreduce";
        crate::group::refuse_inside(WHO)?;
        let stream = resources.stream().map_err(|e| e.with_who(WHO))?;
        if installed(resources)?.is_none() {
            return Err(Error::logic(WHO, "no communicator is installed in these resources (Communicator::install)"));
        }
        resources
            .with_raft_resources(|raft| {
                // As every other collective (`Shared::enqueue`): not into a CUDA graph.
                crate::shared::refuse_capture(WHO, &stream)?;
                let done = result::raft_allreduce(WHO, raft, send, recv, op, &stream);
                if raft_core::stream_is_capturing(&stream).unwrap_or(false) {
                    raft_exit::abort_with(format_args!(
                        "{WHO}: a CUDA graph capture began on the stream while a collective was queued on it; aborting"
                    ));
                }
                done
            })
            .map_err(|e| e.with_who(WHO))?
    }
}

#[cfg(test)]
mod tests {
    /// The crate's files, for the layout checks below.
    const FILES: [(&str, &str); 18] = [
        ("lib.rs", include_str!("lib.rs")),
        ("collectives.rs", include_str!("collectives.rs")),
        ("communicator.rs", include_str!("communicator.rs")),
        ("counts.rs", include_str!("counts.rs")),
        ("dtype.rs", include_str!("dtype.rs")),
        ("group.rs", include_str!("group.rs")),
        ("launch.rs", include_str!("launch.rs")),
        ("load.rs", include_str!("load.rs")),
        ("rendezvous.rs", include_str!("rendezvous.rs")),
        ("result.rs", include_str!("result.rs")),
        ("scope.rs", include_str!("scope.rs")),
        ("secret.rs", include_str!("secret.rs")),
        ("shared.rs", include_str!("shared.rs")),
        ("sys.rs", include_str!("sys.rs")),
        ("unique_id.rs", include_str!("unique_id.rs")),
        ("watchdog.rs", include_str!("watchdog.rs")),
        ("bin/comms-bench.rs", include_str!("bin/comms-bench.rs")),
        ("bin/raft-run.rs", include_str!("bin/raft-run.rs")),
    ];

    #[test]
    fn every_file_says_why_it_exists_and_every_unsafe_block_why_it_is_sound() {
        for (name, text) in FILES {
            assert!(text.starts_with("//!"), "{name} does not start with a `//!` line");
            let (block, imp) = (["unsafe", " {"].concat(), ["unsafe", " impl"].concat());
            let lines: Vec<&str> = text.lines().collect();
            for (i, line) in lines.iter().enumerate() {
                let code = line.split("//").next().unwrap_or("");
                if !code.contains(&block) && !code.contains(&imp) {
                    continue;
                }
                let above = lines[..i].iter().rev().take_while(|l| {
                    let t = l.trim_start();
                    t.starts_with("//") || t.starts_with("#[")
                });
                let ok = line.contains("SAFETY:") || above.into_iter().any(|l| l.contains("// SAFETY:"));
                assert!(ok, "{name}:{}: `unsafe` without a `// SAFETY:` line: {line}", i + 1);
            }
        }
    }

    #[test]
    fn only_the_result_layer_and_the_loader_call_the_shim() {
        // The safe types hold no FFI: `unsafe` appears only where the shim is called or loaded
        // (result.rs, load.rs, sys.rs) and in raft-run's signal handling.
        let allowed = ["result.rs", "load.rs", "sys.rs", "bin/raft-run.rs"];
        for (name, text) in FILES {
            if allowed.contains(&name) {
                continue;
            }
            let block = ["unsafe", " {"].concat();
            assert!(!text.lines().any(|l| l.split("//").next().unwrap_or("").contains(&block)), "{name} has an unsafe block");
        }
    }
}
