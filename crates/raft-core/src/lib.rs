//! Owns RAFT's device resources from Rust.
//!
//! [`DeviceResources`] wraps `raft::device_resources` built on a CUDA stream of its own (a
//! cudarc stream), with RAFT's lazily made cuBLAS, cuSOLVER and cuSPARSE handles, a job worker
//! thread, per-thread defaults ([`current_device_resources`]), RMM's per-device memory resource
//! ([`memory::current`]), typed device arrays ([`DeviceVec`]) and [`gemm`]. Errors are
//! [`Error`] with an [`ErrorKind`]; exit safety comes from `raft-exit`.
//!
//! This is the only crate that calls `raft-sys` for resources.
mod array;
mod array_copy;
mod copy;
mod current;
mod device;
pub mod dlpack;
mod gemm;
mod handle_kind;
mod handles;
mod holding;
mod host;
mod job;
mod lend;
mod live;
mod matrix;
pub mod memory;
#[cfg(feature = "ndarray")]
mod ndarray_io;
mod release;
mod resources;
mod result;
mod scoped;
mod stats;
mod views;
mod waits;

/// Errors: one type for the whole library (the `raft-error` crate).
pub mod error {
    pub use raft_error::{describe_driver_error, Error, ErrorKind, Reason, Result};
}

pub use array::{DeviceVec, HostCopy};
pub use copy::{DeviceToDevice, Staging, ToDevice, ToHost, Transfer};
pub use current::{current_device_resources, AsResources};
pub use device::{current_device, device_count, memory_pools_supported, stream_is_capturing, with_relaxed_capture};
pub use dlpack::{gemm_dlpack, DlpackElement, DlpackExport, DlpackTensor};
pub use error::{Error, ErrorKind, Reason, Result};
pub use gemm::gemm;
/// The `half` crate whose `f16` / `bf16` are element types here (the same version, for users).
pub use half;
pub use handle_kind::HandleKind;
pub use host::{HostSource, HostTarget, PageLocked, PinnedVec, RegisteredSlice};
pub use job::JobHandle;
pub use lend::RaftResourcesPtr;
pub use matrix::{DeviceMatrix, Layout, MatrixView, MatrixViewMut};
#[allow(deprecated)]
pub use memory::deprecated::reinitialize;
#[allow(deprecated)]
pub use memory::{current_memory_resource, enable_memory_statistics, memory_statistics, reset_memory_resource, set_memory_resource};
pub use memory::{
    installed_default, ArenaOptions, AsyncPoolBytes, AsyncPoolOptions, LimitUsage, MemoryResource, MemoryResourceKind, MemoryStatistics,
    PoolOptions, RmmOptions, TrackedAllocations,
};
pub use release::PendingReleases;
pub use resources::{DeviceResources, WeakResources};
pub use result::copy::CopyScope;
pub use result::gemm::GemmScalar;
pub use result::stores::HostStores;
pub use result::DeviceScalar;
pub use scoped::{with_device_resources, Scoped};
pub use stats::{pending_releases, stats, Stats};
pub use views::{DeviceView, DeviceViewMut};

/// The CUDA runtime actually loaded (`cudaRuntimeGetVersion`, e.g. 13020): works without a GPU.
pub fn runtime_version() -> Result<i32> {
    result::runtime_version("runtime_version")
}

/// The CUDA driver's version (`cudaDriverGetVersion`, e.g. 13000); 0 when no driver is installed.
pub fn driver_version() -> Result<i32> {
    result::driver_version("driver_version")
}
