//! RMM's per-device memory resource: the default this library installs, and queries.
//!
//! RMM's current resource is per device and shared by every library in the process. The first
//! resources made on a device replace RMM's initial `cuda_memory_resource` (cudaMalloc, which
//! synchronises the device) with `cuda_async_memory_resource` (a cudaMallocAsync pool). Any
//! other resource installed, before or after, is left alone; a plain `cuda_memory_resource`
//! installed beforehand equals the initial one and is replaced. A device without memory-pool
//! support keeps the initial resource.
use crate::device::{check_device, device_count_for, ContextGuard};
use crate::error::Result;
use crate::ffi::check;
use raft_sys as sys;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Once, OnceLock};

/// Which RMM memory resource is current on a device.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemoryResourceKind {
    /// `rmm::mr::cuda_memory_resource`: RMM's initial resource, cudaMalloc/cudaFree.
    Cuda,
    /// `rmm::mr::cuda_async_memory_resource`: a stream-ordered cudaMallocAsync pool.
    CudaAsync,
    /// `rmm::mr::managed_memory_resource`: cudaMallocManaged.
    Managed,
    /// `rmm::mr::statistics_resource_adaptor` over another resource.
    Statistics,
    /// Any other resource a library or the user installed.
    Other,
}

impl MemoryResourceKind {
    fn from_raw(v: i32) -> Self {
        match v {
            sys::RAFTRS_MR_CUDA => MemoryResourceKind::Cuda,
            sys::RAFTRS_MR_CUDA_ASYNC => MemoryResourceKind::CudaAsync,
            sys::RAFTRS_MR_MANAGED => MemoryResourceKind::Managed,
            sys::RAFTRS_MR_STATISTICS => MemoryResourceKind::Statistics,
            _ => MemoryResourceKind::Other,
        }
    }
}

impl std::fmt::Display for MemoryResourceKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            MemoryResourceKind::Cuda => "rmm::mr::cuda_memory_resource",
            MemoryResourceKind::CudaAsync => "rmm::mr::cuda_async_memory_resource",
            MemoryResourceKind::Managed => "rmm::mr::managed_memory_resource",
            MemoryResourceKind::Statistics => "rmm::mr::statistics_resource_adaptor",
            MemoryResourceKind::Other => "another memory resource",
        })
    }
}

/// The RMM resource current on `device` now.
///
/// # Errors
/// `Logic` for a device that does not exist; `Cuda` without a driver.
pub fn current_memory_resource(device: usize) -> Result<MemoryResourceKind> {
    const WHO: &str = "current_memory_resource";
    check_device(WHO, device)?;
    let mut kind = 0;
    // SAFETY: writes one int; the device exists.
    check(WHO, unsafe { sys::raftrs_mr_current(device as i32, &mut kind) })?;
    Ok(MemoryResourceKind::from_raw(kind))
}

/// Installs a new RMM resource of `kind` as `device`'s current (`rmm::mr::set_per_device_resource`).
/// Allocations already made keep their own resource.
///
/// # Errors
/// `Logic` for a device that does not exist or a kind that cannot be made on its own
/// (`Statistics`, `Other`); `Cuda` when CUDA refuses (e.g. no memory pools for `CudaAsync`).
pub fn set_memory_resource(device: usize, kind: MemoryResourceKind) -> Result<()> {
    const WHO: &str = "set_memory_resource";
    check_device(WHO, device)?;
    let _keep = ContextGuard::save(WHO)?;
    let raw = match kind {
        MemoryResourceKind::Cuda => sys::RAFTRS_MR_CUDA,
        MemoryResourceKind::CudaAsync => sys::RAFTRS_MR_CUDA_ASYNC,
        MemoryResourceKind::Managed => sys::RAFTRS_MR_MANAGED,
        other => return Err(crate::Error::logic(WHO, format!("cannot install {other} on its own"))),
    };
    // SAFETY: plain values; the shim catches every exception.
    check(WHO, unsafe { sys::raftrs_mr_set(device as i32, raw) })
}

/// Puts RMM's initial `cuda_memory_resource` back on `device` (`rmm::mr::reset_per_device_resource`).
pub fn reset_memory_resource(device: usize) -> Result<()> {
    const WHO: &str = "reset_memory_resource";
    check_device(WHO, device)?;
    let _keep = ContextGuard::save(WHO)?;
    // SAFETY: plain value; the shim catches every exception.
    check(WHO, unsafe { sys::raftrs_mr_reset(device as i32) })
}

/// Wraps `device`'s current resource in RMM's `statistics_resource_adaptor`, so that
/// [`memory_statistics`] can count bytes. Idempotent.
pub fn enable_memory_statistics(device: usize) -> Result<()> {
    const WHO: &str = "enable_memory_statistics";
    check_device(WHO, device)?;
    let _keep = ContextGuard::save(WHO)?;
    // SAFETY: plain value; the shim catches every exception.
    check(WHO, unsafe { sys::raftrs_mr_enable_statistics(device as i32) })
}

/// Bytes allocated through a device's statistics adaptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryStatistics {
    /// Bytes allocated now.
    pub current_bytes: i64,
    /// The most bytes allocated at once since statistics were enabled.
    pub peak_bytes: i64,
}

/// The byte counts of `device`'s statistics adaptor.
///
/// # Errors
/// `Logic` when [`enable_memory_statistics`] was not called for the device (or another
/// resource replaced the adaptor since).
pub fn memory_statistics(device: usize) -> Result<MemoryStatistics> {
    const WHO: &str = "memory_statistics";
    check_device(WHO, device)?;
    let (mut current_bytes, mut peak_bytes) = (0, 0);
    // SAFETY: writes two integers through valid pointers.
    check(WHO, unsafe { sys::raftrs_mr_statistics(device as i32, &mut current_bytes, &mut peak_bytes) })?;
    Ok(MemoryStatistics { current_bytes, peak_bytes })
}

struct PerDevice {
    once: Once,
    installed: AtomicBool,
}

fn per_device() -> &'static [PerDevice] {
    static DEVICES: OnceLock<Vec<PerDevice>> = OnceLock::new();
    DEVICES.get_or_init(|| {
        let n = device_count_for("memory").unwrap_or(0);
        (0..n).map(|_| PerDevice { once: Once::new(), installed: AtomicBool::new(false) }).collect()
    })
}

/// Applies the default-resource rule on the first resources of `device` (once per process).
pub(crate) fn ensure_default(device: usize) {
    let Some(slot) = per_device().get(device) else { return };
    slot.once.call_once(|| {
        let mut installed = 0;
        // SAFETY: writes one int; the shim catches every exception.
        match check("DeviceResources::new", unsafe { sys::raftrs_mr_install_default(device as i32, &mut installed) }) {
            Ok(()) => slot.installed.store(installed != 0, Ordering::Release),
            Err(e) => log::warn!(target: "raft", "keeping RMM's default memory resource on device {device}: {e}"),
        }
    });
}

/// Whether this library installed the async pool on `device`.
pub fn installed_default(device: usize) -> bool {
    per_device().get(device).is_some_and(|s| s.installed.load(Ordering::Acquire))
}

/// The exit teardown: puts RMM's initial resource back where this library installed the pool
/// and it is still current, destroying the pool while CUDA is still up.
pub(crate) fn teardown() {
    for (device, slot) in per_device().iter().enumerate() {
        if slot.installed.load(Ordering::Acquire) && current_memory_resource(device) == Ok(MemoryResourceKind::CudaAsync) {
            let _ = reset_memory_resource(device);
        }
    }
}
