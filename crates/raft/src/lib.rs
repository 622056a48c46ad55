//! NVIDIA RAPIDS RAFT's resource layer, from Rust.
//!
//! Every GPU algorithm in RAFT and cuVS stands on `raft::device_resources`: a CUDA stream,
//! lazily made cuBLAS / cuSOLVER / cuSPARSE handles, and RMM's memory resources. This crate
//! gives them to Rust programs, including those that use [`cudarc`] directly: the stream of a
//! [`DeviceResources`] *is* a cudarc stream.
//!
//! | layer | crate | holds |
//! | --- | --- | --- |
//! | C++ shim + raw bindings | `raft-sys` | `raftrs_*` C functions over RAFT/RMM in `libraftrs_shim.so`, loaded at first use; every C++ exception caught |
//! | errors | `raft-error` | [`Error`], [`ErrorKind`] |
//! | resources | `rapids-raft-core` (`raft_core`) | [`DeviceResources`], [`current_device_resources`], [`DeviceVec`], [`gemm`], [`MemoryResource`] and [`memory`], [`PinnedVec`] and copies, [`DeviceResources::with_raft_resources`] |
//! | exit safety | `raft-exit` (as [`exit`]) | exit waits, jobs and releases in flight, the atexit hook |
//! | versions | `raft-abi` | [`version`], [`abi`], [`Abi::mismatches`], [`require_raft_release`] |
//! | NCCL (feature `comms`) | `raft-comms` | communicators in the resources, collectives on `DeviceVec`s, `raft-run` |
//! | cuVS (feature `cuvs`) | `raft-cuvs` | brute force and CAGRA on lent resources |
//! | facade | `rapids-raft` (`raft`) | these re-exports, `raft-doctor` |
//!
//! # Quick start
//! ```no_run
//! use raft::{DeviceResources, DeviceVec, Layout};
//! # fn main() -> raft::Result<()> {
//! let res = DeviceResources::new()?;               // own non-blocking stream, no handles yet
//! let a = DeviceVec::from_host(&res, &[1.0f32, 2.0, 3.0, 4.0])?;
//! let b = DeviceVec::from_host(&res, &[1.0f32, 0.0, 0.0, 1.0])?;
//! let mut c = DeviceVec::<f32>::zeros(&res, 4)?;
//! raft::gemm(1.0, a.matrix(2, 2, Layout::RowMajor)?, b.matrix(2, 2, Layout::RowMajor)?, 0.0,
//!            c.matrix_mut(2, 2, Layout::RowMajor)?)?; // cuBLAS handle made now, on res's stream
//! res.sync()?;
//! assert_eq!(c.to_host()?, [1.0, 2.0, 3.0, 4.0]);
//! let job = res.spawn(|| 6 * 7)?;                  // runs on res's worker thread
//! assert_eq!(job.join()?, 42);
//! res.release()?;                                  // or let the last handle drop
//! # Ok(()) }
//! ```
//!
//! # Errors
//! Every fallible call returns [`Error`]: [`ErrorKind::OutOfMemory`], [`ErrorKind::Cuda`]
//! (including "no driver"), [`ErrorKind::Logic`] (refused before reaching the GPU) or
//! [`ErrorKind::Generic`]; `Display` is `who: message`. A finer [`Reason`] (`err.reason()`:
//! released, invalid argument, timeout, library missing, no driver, …), the native code
//! (`cuda_code()`, `nccl_code()`) and `source()` tell a program what it can do about it.
//!
//! # Exit
//! A process may exit (main returns, or `std::process::exit` from any thread) while jobs run:
//! the exit waits for them up to their exit wait (see [`exit`]), then tears down or, when a job
//! outlives its bound, leaks the native objects to the OS rather than destroy them under it.
//! Code that runs after the teardown (an `atexit` handler registered before the library's first
//! job runs after it) is refused every new object with [`Reason::Exiting`] ([`exit::closed`]).
pub use cudarc;
pub use raft_abi::{abi, raft_release, require_raft_release, running, version, Abi, AbiField, Release, Running};
pub use raft_core::{
    current_device, current_device_resources, device_count, driver_version, gemm, installed_default, memory, memory_pools_supported,
    runtime_version, stats, stream_is_capturing, with_device_resources, with_relaxed_capture, ArenaOptions, AsResources, AsyncPoolBytes,
    AsyncPoolOptions, DeviceMatrix, DeviceResources, DeviceScalar, DeviceVec, DeviceView, DeviceViewMut, Error, ErrorKind, GemmScalar,
    HandleKind, JobHandle, Layout, LimitUsage, MatrixView, MatrixViewMut, MemoryResource, MemoryResourceKind, MemoryStatistics,
    PendingReleases, PoolOptions, RaftResourcesPtr, Reason, Result, RmmOptions, Scoped, Stats, TrackedAllocations, WeakResources,
};
/// Names of earlier issues, kept as deprecated aliases of the value API ([`memory`]).
#[allow(deprecated)]
pub use raft_core::{
    current_memory_resource, enable_memory_statistics, memory_statistics, reinitialize, reset_memory_resource, set_memory_resource,
};
pub use raft_core::{
    CopyScope, DeviceToDevice, HostSource, HostStores, HostTarget, PageLocked, PinnedVec, RegisteredSlice, Staging, ToDevice, ToHost,
    Transfer,
};
// Element types and interop (issue 31).
pub use raft_core::{dlpack, gemm_dlpack, half, DlpackElement, DlpackExport, DlpackTensor};

#[cfg(feature = "comms")]
pub use raft_comms as comms;
#[cfg(feature = "cuvs")]
pub use raft_cuvs as cuvs;

/// Exiting while jobs run: the exit wait and the state of the exit (`raft-exit`).
pub mod exit {
    pub use raft_exit::{
        closed, current_exit_wait, default_exit_wait, jobs_in_flight, phase, releases_in_flight, set_default_exit_wait, spawn_thread,
        with_exit_wait, ExitDecided, ExitWait, InvalidExitWait, Phase, DEFAULT_EXIT_WAIT,
    };
}
