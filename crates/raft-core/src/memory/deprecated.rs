//! The names of earlier issues for what the value API now says once: kept callable, with their
//! old behaviour, as thin aliases over [`MemoryResource`] and `memory::{current, set_current}`.
use super::current::{current, set_current};
use super::kind::MemoryResourceKind;
use super::resource::{MemoryResource, MemoryStatistics};
use crate::error::{Error, Result};
use std::sync::Mutex;

/// Which kind of RMM resource is current on `device` now.
///
/// # Errors
/// `Logic` for a device that does not exist; `Cuda` without a driver.
#[deprecated(note = "use raft::memory::current(device)?.kind(): the value API gives the resource itself, and its kind")]
pub fn current_memory_resource(device: usize) -> Result<MemoryResourceKind> {
    MemoryResource::current(device).map(|mr| mr.kind()).map_err(|e| e.with_who("current_memory_resource"))
}

/// Installs a new RMM resource of `kind` as `device`'s current. Allocations already made keep
/// their own resource.
///
/// # Errors
/// `Logic` for a device that does not exist or a kind that cannot be made on its own (all but
/// `Cuda`, `CudaAsync` and `Managed`); `Cuda` when CUDA refuses.
#[deprecated(note = "use raft::memory::set_current(device, &MemoryResource::managed(device)?) (or cuda, cuda_async, any \
                     resource built from them): every kind can be made, none is refused at run time")]
pub fn set_memory_resource(device: usize, kind: MemoryResourceKind) -> Result<()> {
    const WHO: &str = "set_memory_resource";
    let fresh = match kind {
        MemoryResourceKind::Cuda => MemoryResource::cuda(device),
        MemoryResourceKind::CudaAsync => MemoryResource::cuda_async(device),
        MemoryResourceKind::Managed => MemoryResource::managed(device),
        other => return Err(Error::logic(WHO, format!("cannot install {other} on its own"))),
    };
    fresh.and_then(|mr| set_current(device, &mr)).map(drop).map_err(|e| e.with_who(WHO))
}

/// Puts RMM's initial resource, a `cuda_memory_resource`, back on `device`.
#[deprecated(note = "use raft::memory::set_current(device, &MemoryResource::cuda(device)?): RMM's initial resource is a \
                     cuda_memory_resource, and every one compares equal to it")]
pub fn reset_memory_resource(device: usize) -> Result<()> {
    const WHO: &str = "reset_memory_resource";
    MemoryResource::cuda(device).and_then(|mr| set_current(device, &mr)).map(drop).map_err(|e| e.with_who(WHO))
}

/// One statistics adaptor at a time per process: two threads enabling at once would stack two.
static STATISTICS_LOCK: Mutex<()> = Mutex::new(());

/// Wraps `device`'s current resource in RMM's `statistics_resource_adaptor`, so that
/// [`memory_statistics`] can count bytes. Idempotent.
#[deprecated(note = "use raft::memory::set_current(device, &raft::memory::current(device)?.with_statistics()?), or \
                     RmmOptions { statistics: true, .. }: the adaptor is then a value you keep and read")]
pub fn enable_memory_statistics(device: usize) -> Result<()> {
    const WHO: &str = "enable_memory_statistics";
    let _one_at_a_time = STATISTICS_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let now = current(device).map_err(|e| e.with_who(WHO))?;
    if now.kind() == MemoryResourceKind::Statistics {
        return Ok(());
    }
    let counted = now.with_statistics().map_err(|e| e.with_who(WHO))?;
    set_current(device, &counted).map(drop).map_err(|e| e.with_who(WHO))
}

/// The byte counts of `device`'s statistics adaptor.
///
/// # Errors
/// `Logic` when [`enable_memory_statistics`] was not called for the device (or another
/// resource replaced the adaptor since).
#[deprecated(note = "use raft::memory::current(device)?.statistics(), or statistics() on the adaptor you made")]
pub fn memory_statistics(device: usize) -> Result<MemoryStatistics> {
    const WHO: &str = "memory_statistics";
    let now = current(device).map_err(|e| e.with_who(WHO))?;
    if now.kind() != MemoryResourceKind::Statistics {
        return Err(Error::logic(WHO, format!("statistics are not enabled on device {device}")));
    }
    now.statistics().map_err(|e| e.with_who(WHO))
}

/// `rmm.reinitialize(...)` for one device, as [`memory::reinitialize`](super::current::reinitialize).
#[deprecated(note = "use raft::memory::reinitialize: one name for it, beside memory::current and memory::set_current")]
pub fn reinitialize(device: usize, options: &super::options::RmmOptions) -> Result<MemoryResource> {
    super::current::reinitialize(device, options)
}
