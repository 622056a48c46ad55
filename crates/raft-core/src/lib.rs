//! Owns RAFT's device resources from Rust.
//!
//! [`DeviceResources`] wraps `raft::device_resources` built on a CUDA stream of its own (a
//! cudarc stream), with RAFT's lazily made cuBLAS, cuSOLVER and cuSPARSE handles, a job worker
//! thread, per-thread defaults ([`current_device_resources`]), RMM's per-device memory resource
//! ([`current_memory_resource`]), typed device arrays ([`DeviceVec`]) and [`gemm`]. Errors are
//! [`Error`] with an [`ErrorKind`]; exit safety comes from `raft-exit`.
//!
//! This is the only crate that calls `raft-sys` for resources.
mod array;
mod current;
mod device;
mod error;
mod ffi;
mod gemm;
mod job;
mod memory;
mod release;
mod resources;
mod stats;

pub use array::{DeviceScalar, DeviceVec, HostCopy, Layout, MatrixView, MatrixViewMut};
pub use current::current_device_resources;
pub use device::{current_device, device_count, memory_pools_supported};
pub use error::{Error, ErrorKind, Result};
pub use gemm::{gemm, GemmScalar};
pub use job::JobHandle;
pub use memory::{
    current_memory_resource, enable_memory_statistics, installed_default, memory_statistics, reset_memory_resource, set_memory_resource,
    MemoryResourceKind, MemoryStatistics,
};
pub use resources::{with_device_resources, AsResources, DeviceResources, HandleKind, Scoped, WeakResources};
pub use stats::{stats, Stats};

/// The CUDA runtime actually loaded (`cudaRuntimeGetVersion`, e.g. 13020): works without a GPU.
pub fn runtime_version() -> Result<i32> {
    let mut v = 0;
    // SAFETY: writes one int.
    ffi::check("runtime_version", unsafe { raft_sys::raftrs_runtime_version(&mut v) })?;
    Ok(v)
}

/// The CUDA driver's version (`cudaDriverGetVersion`, e.g. 13000); 0 when no driver is installed.
pub fn driver_version() -> Result<i32> {
    let mut v = 0;
    // SAFETY: writes one int.
    ffi::check("driver_version", unsafe { raft_sys::raftrs_driver_version(&mut v) })?;
    Ok(v)
}

/// Registers this crate's exit teardown with `raft-exit` (once): release every live resources
/// object, then put back RMM's initial resource where this library installed the pool.
pub(crate) fn register_teardown() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        raft_exit::on_teardown(resources::release_all_live);
        raft_exit::on_teardown(memory::teardown);
    });
}
