//! RMM memory resources as owned Rust values, RMM's per-device resource, and the default this
//! library installs.
//!
//! RMM's current resource is per device and shared by every library in the process. The first
//! resources made on a device replace RMM's initial `cuda_memory_resource` (cudaMalloc, which
//! synchronises the device) with `cuda_async_memory_resource` (a cudaMallocAsync pool). Any
//! other resource installed, before or after, is left alone; a plain `cuda_memory_resource`
//! installed beforehand equals the initial one and is replaced. A device without memory-pool
//! support keeps the initial resource.
//!
//! Every allocation holds (a shared copy of) the resource that made it: replacing a device's
//! resource, from Rust or from any other library in the process, never invalidates a live
//! [`DeviceVec`](crate::DeviceVec). One limit: a resource another library installs *by
//! reference* (C++ `rmm::mr::set_current_device_resource_ref` with an object it owns, Python
//! `rmm.mr.set_current_device_resource`) is copied as that reference, and the object behind it
//! lives only as long as that library keeps it: it must outlive the arrays allocated from it,
//! as RMM requires of every user of that object.
use crate::device::check_device;
use crate::error::{Error, ErrorKind, Result};
use crate::result;
use crate::result::mr::{self, NativeMr};
use raft_sys as sys;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Once, OnceLock};

/// The largest bin exponent [`MemoryResource::binning`] takes: RMM makes each bin's size as the
/// C++ `int` `1 << exponent`, which overflows from 31 on (undefined behaviour; in practice a
/// bin of about 2^64 bytes). Each bin also takes 128 blocks from upstream when made, so bins
/// near this bound already ask for hundreds of GiB.
pub const MAX_BIN_EXPONENT: u8 = 30;

/// Refuses bin exponents RMM cannot build bins from (see [`MAX_BIN_EXPONENT`]), before any
/// native call.
fn check_bin_exponents(who: &'static str, min_exponent: u8, max_exponent: u8) -> Result<()> {
    if min_exponent > max_exponent || max_exponent > MAX_BIN_EXPONENT {
        return Err(Error::logic(
            who,
            format!("bin exponents must satisfy min <= max <= {MAX_BIN_EXPONENT}, given {min_exponent} and {max_exponent}"),
        ));
    }
    Ok(())
}

/// Which kind of RMM memory resource a [`MemoryResource`] is.
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
    /// `rmm::mr::pool_memory_resource`: a coalescing pool over another resource.
    Pool,
    /// `rmm::mr::arena_memory_resource`: per-thread arenas over another resource.
    Arena,
    /// `rmm::mr::binning_memory_resource`: fixed-size bins over another resource.
    Binning,
    /// `rmm::mr::limiting_resource_adaptor`: refuses allocations past a byte limit.
    Limiting,
    /// `rmm::mr::tracking_resource_adaptor`: remembers every live allocation.
    Tracking,
    /// `rmm::mr::logging_resource_adaptor`: RMM's CSV log of every allocation and free.
    Logging,
    /// `rmm::mr::failure_callback_resource_adaptor`: a callback decides whether to retry.
    FailureCallback,
    /// `rmm::mr::thread_safe_resource_adaptor`: a mutex around another resource.
    ThreadSafe,
    /// `rmm::mr::pinned_host_memory_resource`: page-locked host memory the device reaches.
    PinnedHost,
}

impl MemoryResourceKind {
    fn from_raw(v: i32) -> Self {
        match v {
            sys::RAFTRS_MR_CUDA => MemoryResourceKind::Cuda,
            sys::RAFTRS_MR_CUDA_ASYNC => MemoryResourceKind::CudaAsync,
            sys::RAFTRS_MR_MANAGED => MemoryResourceKind::Managed,
            sys::RAFTRS_MR_STATISTICS => MemoryResourceKind::Statistics,
            sys::RAFTRS_MR_POOL => MemoryResourceKind::Pool,
            sys::RAFTRS_MR_ARENA => MemoryResourceKind::Arena,
            sys::RAFTRS_MR_BINNING => MemoryResourceKind::Binning,
            sys::RAFTRS_MR_LIMITING => MemoryResourceKind::Limiting,
            sys::RAFTRS_MR_TRACKING => MemoryResourceKind::Tracking,
            sys::RAFTRS_MR_LOGGING => MemoryResourceKind::Logging,
            sys::RAFTRS_MR_FAILURE_CALLBACK => MemoryResourceKind::FailureCallback,
            sys::RAFTRS_MR_THREAD_SAFE => MemoryResourceKind::ThreadSafe,
            sys::RAFTRS_MR_PINNED_HOST => MemoryResourceKind::PinnedHost,
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
            MemoryResourceKind::Pool => "rmm::mr::pool_memory_resource",
            MemoryResourceKind::Arena => "rmm::mr::arena_memory_resource",
            MemoryResourceKind::Binning => "rmm::mr::binning_memory_resource",
            MemoryResourceKind::Limiting => "rmm::mr::limiting_resource_adaptor",
            MemoryResourceKind::Tracking => "rmm::mr::tracking_resource_adaptor",
            MemoryResourceKind::Logging => "rmm::mr::logging_resource_adaptor",
            MemoryResourceKind::FailureCallback => "rmm::mr::failure_callback_resource_adaptor",
            MemoryResourceKind::ThreadSafe => "rmm::mr::thread_safe_resource_adaptor",
            MemoryResourceKind::PinnedHost => "rmm::mr::pinned_host_memory_resource",
        })
    }
}

/// One RMM device memory resource, owned (an `rmm` resource held in a
/// `cuda::mr::any_resource`). `Clone` shares the same resource: RMM 26.08's pools and adaptors
/// are shared handles, so every clone, every allocation made from it and RMM's per-device map
/// keep the one pool alive, and it goes when the last of them does.
///
/// # Thread safety
/// `Send + Sync`: RMM's resources allocate and free from any thread.
#[derive(Clone)]
pub struct MemoryResource {
    native: Arc<NativeMr>,
    kind: MemoryResourceKind,
}

static_assertions::assert_impl_all!(MemoryResource: Send, Sync, Clone);

impl MemoryResource {
    fn wrap(who: &'static str, native: NativeMr) -> Result<Self> {
        let kind = MemoryResourceKind::from_raw(native.kind(who)?);
        Ok(MemoryResource { native: Arc::new(native), kind })
    }

    /// `device`'s current RMM resource (`rmm::mr::get_per_device_resource_ref`), shared.
    ///
    /// # Errors
    /// `Logic` for a device that does not exist, or a resource that cannot be shared (its copy
    /// does not compare equal to it); `Cuda` without a driver.
    pub fn current(device: usize) -> Result<Self> {
        const WHO: &str = "MemoryResource::current";
        check_device(WHO, device)?;
        route_releases();
        Self::wrap(WHO, NativeMr::current(WHO, device)?)
    }

    fn made(who: &'static str, device: usize, kind: i32) -> Result<Self> {
        check_device(who, device)?;
        route_releases();
        Self::wrap(who, reclaiming(|| NativeMr::new(who, device, kind))?)
    }

    /// A new `rmm::mr::cuda_memory_resource` (cudaMalloc / cudaFree) for `device`.
    pub fn cuda(device: usize) -> Result<Self> {
        Self::made("MemoryResource::cuda", device, sys::RAFTRS_MR_CUDA)
    }

    /// A new `rmm::mr::cuda_async_memory_resource` (a cudaMallocAsync pool) for `device`.
    ///
    /// # Errors
    /// `Logic` when the device has no memory-pool support.
    pub fn cuda_async(device: usize) -> Result<Self> {
        Self::made("MemoryResource::cuda_async", device, sys::RAFTRS_MR_CUDA_ASYNC)
    }

    /// A new `rmm::mr::managed_memory_resource` (cudaMallocManaged) for `device`.
    pub fn managed(device: usize) -> Result<Self> {
        Self::made("MemoryResource::managed", device, sys::RAFTRS_MR_MANAGED)
    }

    /// A new `rmm::mr::cuda_async_memory_resource` with an initial pool size and a release
    /// threshold (bytes the pool keeps when the stream synchronises), each `None` for RMM's
    /// default (rmm.mr.CudaAsyncMemoryResource(initial_pool_size, release_threshold)).
    pub fn cuda_async_with(device: usize, initial_pool_size: Option<usize>, release_threshold: Option<usize>) -> Result<Self> {
        const WHO: &str = "MemoryResource::cuda_async_with";
        check_device(WHO, device)?;
        route_releases();
        Self::wrap(WHO, reclaiming(|| NativeMr::cuda_async(WHO, device, initial_pool_size, release_threshold))?)
    }

    /// A new `rmm::mr::pinned_host_memory_resource` for `device`: page-locked host memory the
    /// device reads and writes directly.
    pub fn pinned_host(device: usize) -> Result<Self> {
        const WHO: &str = "MemoryResource::pinned_host";
        check_device(WHO, device)?;
        route_releases();
        Self::wrap(WHO, NativeMr::pinned_host(WHO, device)?)
    }

    /// An `rmm::mr::pool_memory_resource` over this resource: `initial` bytes at once (`None`:
    /// half the free memory of this resource's device, RMM's default, whichever device the
    /// calling thread is on), growing up to `maximum` (`None`: no limit).
    pub fn pool(&self, initial: Option<usize>, maximum: Option<usize>) -> Result<Self> {
        const WHO: &str = "MemoryResource::pool";
        Self::wrap(WHO, self.native.pool(WHO, initial, maximum)?)
    }

    /// An `rmm::mr::arena_memory_resource` over this resource (`None`: RMM's arena size).
    pub fn arena(&self, arena_size: Option<usize>) -> Result<Self> {
        const WHO: &str = "MemoryResource::arena";
        Self::wrap(WHO, self.native.arena(WHO, arena_size)?)
    }

    /// An `rmm::mr::binning_memory_resource` over this resource with bins of 2^`min_exponent`
    /// to 2^`max_exponent` bytes; larger allocations go to this resource.
    ///
    /// # Errors
    /// `Logic` unless `min_exponent <= max_exponent <=` [`MAX_BIN_EXPONENT`] (30).
    pub fn binning(&self, min_exponent: u8, max_exponent: u8) -> Result<Self> {
        const WHO: &str = "MemoryResource::binning";
        check_bin_exponents(WHO, min_exponent, max_exponent)?;
        Self::wrap(WHO, self.native.binning(WHO, min_exponent, max_exponent)?)
    }

    /// An `rmm::mr::limiting_resource_adaptor`: allocations past `limit` bytes in all fail with
    /// `OutOfMemory` (rmm.mr.LimitingResourceAdaptor).
    pub fn with_limit(&self, limit: usize) -> Result<Self> {
        const WHO: &str = "MemoryResource::with_limit";
        Self::wrap(WHO, self.native.limiting(WHO, limit)?)
    }

    /// An `rmm::mr::statistics_resource_adaptor` over this resource: allocations through it
    /// are counted ([`statistics`](Self::statistics)) and served by this one.
    pub fn with_statistics(&self) -> Result<Self> {
        const WHO: &str = "MemoryResource::with_statistics";
        Self::wrap(WHO, self.native.statistics_over(WHO)?)
    }

    /// An `rmm::mr::tracking_resource_adaptor`: every live allocation is remembered
    /// ([`tracked`](Self::tracked), [`tracking_report`](Self::tracking_report)); at exit, the
    /// allocations still live are reported on log target `raft` (warn).
    pub fn with_tracking(&self) -> Result<Self> {
        const WHO: &str = "MemoryResource::with_tracking";
        let made = Self::wrap(WHO, self.native.tracking(WHO)?)?;
        push_pruned(&mut TRACKED.lock().unwrap_or_else(|e| e.into_inner()), Arc::downgrade(&made.native));
        // The report runs in the exit teardown: make sure there is one, also in a process that
        // never makes a job or a release. RMM's per-device map is made first, so that at exit
        // it is destroyed after the hook has run (exit handlers run in reverse order).
        register_teardown();
        let _ = result::rmm_map_address(WHO);
        raft_exit::register_exit_hook();
        Ok(made)
    }

    /// An `rmm::mr::logging_resource_adaptor`: RMM's CSV log of every allocation and free, to
    /// `path` (flushed at every event when `auto_flush`).
    pub fn with_logging(&self, path: impl AsRef<std::path::Path>, auto_flush: bool) -> Result<Self> {
        const WHO: &str = "MemoryResource::with_logging";
        Self::wrap(WHO, self.native.logging(WHO, path.as_ref(), auto_flush)?)
    }

    /// An `rmm::mr::thread_safe_resource_adaptor`: one lock around this resource.
    pub fn thread_safe(&self) -> Result<Self> {
        const WHO: &str = "MemoryResource::thread_safe";
        Self::wrap(WHO, self.native.thread_safe(WHO)?)
    }

    /// An `rmm::mr::failure_callback_resource_adaptor`: when an allocation fails for lack of
    /// memory, `callback(bytes)` runs (on the allocating thread) and returns whether to retry,
    /// e.g. after freeing a cache. A panic in it is caught and means "give up". A pool, arena,
    /// binning or thread-safe resource cannot be put over it (a `Logic` error): they hold their
    /// own lock while taking memory from upstream, so the callback would run under that lock and
    /// a free through the same resource would lock it again. Put the callback on top instead.
    pub fn with_failure_callback<F>(&self, callback: F) -> Result<Self>
    where
        F: Fn(usize) -> bool + Send + Sync + 'static,
    {
        const WHO: &str = "MemoryResource::with_failure_callback";
        Self::wrap(WHO, self.native.failure_callback(WHO, Box::new(callback))?)
    }

    /// Which kind of resource this is.
    pub fn kind(&self) -> MemoryResourceKind {
        self.kind
    }

    /// The device it was made for.
    pub fn device(&self) -> usize {
        self.native.device()
    }

    /// The byte counts of a statistics adaptor.
    ///
    /// # Errors
    /// `Logic` when this is not a statistics adaptor.
    pub fn statistics(&self) -> Result<MemoryStatistics> {
        const WHO: &str = "MemoryResource::statistics";
        if self.kind != MemoryResourceKind::Statistics {
            return Err(Error::logic(WHO, format!("{} counts nothing: use with_statistics()", self.kind)));
        }
        let (current_bytes, peak_bytes) = self.native.statistics(WHO)?;
        let (current_count, peak_count, total_count, total_bytes) = self.native.statistics_counts(WHO)?;
        Ok(MemoryStatistics { current_bytes, peak_bytes, total_bytes, current_count, peak_count, total_count })
    }

    /// The live allocations of a tracking adaptor (readable from any thread while they live).
    ///
    /// # Errors
    /// `Logic` when this is not a tracking adaptor.
    pub fn tracked(&self) -> Result<TrackedAllocations> {
        const WHO: &str = "MemoryResource::tracked";
        let (count, bytes) = self.native.tracking_counts(WHO)?;
        Ok(TrackedAllocations { count, bytes })
    }

    /// RMM's text report of a tracking adaptor's live allocations (address, size, stream).
    pub fn tracking_report(&self) -> Result<String> {
        self.native.tracking_report("MemoryResource::tracking_report")
    }

    /// Bytes allocated through a limiting adaptor now, and its limit.
    pub fn limit(&self) -> Result<(usize, usize)> {
        self.native.limits("MemoryResource::limit")
    }

    /// The CUDA async pool behind this resource (itself, or the upstream of its adaptors):
    /// `(reserved, in_use)` bytes as the driver counts them (`cudaMemPoolAttrReservedMemCurrent`,
    /// `cudaMemPoolAttrUsedMemCurrent`); `None` when there is no async pool behind it.
    ///
    /// # Errors
    /// `Cuda` when the driver cannot say.
    pub fn async_pool_bytes(&self) -> Result<Option<(usize, usize)>> {
        Ok(mr::async_pool_bytes("MemoryResource::async_pool_bytes", &self.native)?.map(|(r, u)| (r as usize, u as usize)))
    }

    /// Whether memory from one can be freed by the other (RMM's resource equality).
    pub fn same_as(&self, other: &MemoryResource) -> Result<bool> {
        self.native.same_as("MemoryResource::same_as", &other.native)
    }

    pub(crate) fn native(&self) -> &NativeMr {
        &self.native
    }

    /// The shared handle itself: an array allocated from it holds a clone (issue 30).
    pub(crate) fn native_arc(&self) -> &Arc<NativeMr> {
        &self.native
    }
}

impl std::fmt::Debug for MemoryResource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryResource").field("kind", &self.kind).field("device", &self.device()).finish()
    }
}

/// `device`'s current RMM resource, shared (see [`MemoryResource::current`]).
pub fn current(device: usize) -> Result<MemoryResource> {
    MemoryResource::current(device).map_err(|e| e.with_who("raft::memory::current"))
}

/// Makes `resource` `device`'s current RMM resource (`rmm::mr::set_per_device_resource`) and
/// returns the one it replaced. Allocations already made keep their own resource alive.
///
/// # Errors
/// `Logic` when `resource` was made for another device, or the device does not exist.
pub fn set_current(device: usize, resource: &MemoryResource) -> Result<MemoryResource> {
    const WHO: &str = "raft::memory::set_current";
    check_device(WHO, device)?;
    if resource.device() != device {
        return Err(Error::logic(WHO, format!("a memory resource of device {} cannot serve device {device}", resource.device())));
    }
    MemoryResource::wrap(WHO, resource.native.set_current(WHO)?)
}

/// What [`trim_retired_pools`] did: bytes given back to the driver, and bytes the retired pools
/// still hold (memory whose stream-ordered free has not run yet: it goes back at the next
/// synchronisation, or the next trim).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RetiredPoolsTrim {
    pub released: usize,
    pub still_held: usize,
}

/// Gives the unused memory of every retired CUDA async pool back to the driver now, without
/// waiting for anything (the closest thing to `torch.cuda.empty_cache()` for pools this library
/// made and let go).
///
/// An async pool whose last copy (handle, array, adaptor, RMM's map entry) has gone is never
/// destroyed: the driver crashes or hangs when a pool is destroyed while a stream-ordered free
/// into it is still queued on a stream that goes on working (GPU runs 42, 45, 46, 48). It is
/// retired instead: its release threshold set to 0 and trimmed, and the next async pool made on
/// its device is that pool again (see [`crate::Stats::async_pools_reused`]). Allocations that fail
/// with `OutOfMemory` trim them on their own before their retry.
///
/// # Errors
/// `Cuda` when the driver refuses a trim (every pool is still tried).
pub fn trim_retired_pools() -> Result<RetiredPoolsTrim> {
    let (released, held) = mr::trim_retired("raft::memory::trim_retired_pools")?;
    Ok(RetiredPoolsTrim { released: released as usize, still_held: held as usize })
}

/// The address of RMM's per-device resource map as this library binds it. Every library in the
/// process that uses RMM (librmm itself, cuVS, a Python extension) should see the same address:
/// then a resource one of them installs is the one the others allocate from.
pub fn rmm_map_address() -> Result<usize> {
    result::rmm_map_address("raft::memory::rmm_map_address")
}

/// Which kind of RMM resource is current on `device` now.
///
/// # Errors
/// `Logic` for a device that does not exist; `Cuda` without a driver.
pub fn current_memory_resource(device: usize) -> Result<MemoryResourceKind> {
    const WHO: &str = "current_memory_resource";
    check_device(WHO, device)?;
    route_releases();
    Ok(MemoryResource::wrap(WHO, NativeMr::current(WHO, device)?)?.kind)
}

/// Installs a new RMM resource of `kind` as `device`'s current. Allocations already made keep
/// their own resource.
///
/// # Errors
/// `Logic` for a device that does not exist or a kind that cannot be made on its own
/// (`Statistics`, `Other`); `Cuda` when CUDA refuses.
pub fn set_memory_resource(device: usize, kind: MemoryResourceKind) -> Result<()> {
    const WHO: &str = "set_memory_resource";
    let raw = match kind {
        MemoryResourceKind::Cuda => sys::RAFTRS_MR_CUDA,
        MemoryResourceKind::CudaAsync => sys::RAFTRS_MR_CUDA_ASYNC,
        MemoryResourceKind::Managed => sys::RAFTRS_MR_MANAGED,
        other => return Err(Error::logic(WHO, format!("cannot install {other} on its own"))),
    };
    let fresh = MemoryResource::made(WHO, device, raw)?;
    fresh.native.set_current(WHO).map(drop)
}

/// Puts RMM's initial `cuda_memory_resource` back on `device` (`rmm::mr::reset_per_device_resource`).
pub fn reset_memory_resource(device: usize) -> Result<()> {
    const WHO: &str = "reset_memory_resource";
    check_device(WHO, device)?;
    route_releases();
    NativeMr::reset_current(WHO, device).map(drop)
}

/// Every native resource's last drop goes to the release threads; called before each
/// `NativeMr` is made (the result layer below cannot name the release layer).
fn route_releases() {
    mr::defer_releases_to(crate::release::enqueue);
}

/// Wraps `device`'s current resource in RMM's `statistics_resource_adaptor`, so that
/// [`memory_statistics`] can count bytes. Idempotent.
pub fn enable_memory_statistics(device: usize) -> Result<()> {
    const WHO: &str = "enable_memory_statistics";
    let _one_at_a_time = STATISTICS_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let current = MemoryResource::current(device).map_err(|e| e.with_who(WHO))?;
    if current.kind == MemoryResourceKind::Statistics {
        return Ok(());
    }
    let counted = current.with_statistics().map_err(|e| e.with_who(WHO))?;
    counted.native.set_current(WHO).map(drop)
}

static STATISTICS_LOCK: Mutex<()> = Mutex::new(());

/// What a statistics adaptor counted (`rmm.statistics`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryStatistics {
    /// Bytes allocated now.
    pub current_bytes: i64,
    /// The most bytes allocated at once since statistics were enabled.
    pub peak_bytes: i64,
    /// Bytes allocated in all.
    pub total_bytes: i64,
    /// Allocations live now.
    pub current_count: i64,
    /// The most allocations live at once.
    pub peak_count: i64,
    /// Allocations made in all.
    pub total_count: i64,
}

/// The live allocations of a tracking adaptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrackedAllocations {
    /// How many.
    pub count: usize,
    /// Their bytes in all.
    pub bytes: usize,
}

/// Tracking adaptors made from Rust, for the leak report at exit.
static TRACKED: Mutex<Vec<std::sync::Weak<NativeMr>>> = Mutex::new(Vec::new());

/// Adds `new`, first forgetting the adaptors already gone: a process that makes tracking
/// adaptors in a loop keeps only the live ones.
fn push_pruned<T>(list: &mut Vec<std::sync::Weak<T>>, new: std::sync::Weak<T>) {
    list.retain(|w| w.strong_count() > 0);
    list.push(new);
}

/// Logs (warn, target `raft`) the allocations still live in every tracking adaptor.
fn report_leaks() {
    let tracked: Vec<Arc<NativeMr>> = TRACKED.lock().unwrap_or_else(|e| e.into_inner()).iter().filter_map(|w| w.upgrade()).collect();
    for t in tracked {
        let Ok((count, bytes)) = t.tracking_counts("exit") else { continue };
        if count > 0 {
            let report = t.tracking_report("exit").unwrap_or_default();
            log::warn!(target: "raft", "exit: {count} allocations ({bytes} bytes) still live in a tracking resource on device {}:\n{report}", t.device());
        }
    }
}

/// The byte counts of `device`'s statistics adaptor.
///
/// # Errors
/// `Logic` when [`enable_memory_statistics`] was not called for the device (or another
/// resource replaced the adaptor since).
pub fn memory_statistics(device: usize) -> Result<MemoryStatistics> {
    const WHO: &str = "memory_statistics";
    let current = MemoryResource::current(device).map_err(|e| e.with_who(WHO))?;
    if current.kind != MemoryResourceKind::Statistics {
        return Err(Error::logic(WHO, format!("statistics are not enabled on device {device}")));
    }
    current.statistics().map_err(|e| e.with_who(WHO))
}

struct PerDevice {
    once: Once,
    installed: AtomicBool,
    /// The pool this library installed, to recognise it at exit (and only it).
    ours: Mutex<Option<MemoryResource>>,
}

fn per_device() -> &'static [PerDevice] {
    static DEVICES: OnceLock<Vec<PerDevice>> = OnceLock::new();
    DEVICES.get_or_init(|| {
        let n = crate::device::device_count_for("memory").unwrap_or(0);
        (0..n).map(|_| PerDevice { once: Once::new(), installed: AtomicBool::new(false), ours: Mutex::new(None) }).collect()
    })
}

/// Applies the default-resource rule on the first resources of `device` (once per process):
/// the `RAFT_RMM_*` setup when any of those variables is set, else the async pool. A bad
/// `RAFT_RMM_*` value is the `Logic` error of every `new()`.
pub(crate) fn ensure_default(who: &'static str, device: usize) -> Result<()> {
    route_releases(); // the default path's copies of the current resource are released there too
    if per_device().get(device).is_some_and(|slot| slot.once.is_completed()) {
        return Ok(()); // applied already (so the variables read well: they are read once)
    }
    let configured = RmmOptions::from_env().map_err(|e| e.with_who(who))?;
    let Some(slot) = per_device().get(device) else { return Ok(()) };
    slot.once.call_once(|| {
        let installed = match &configured {
            Some(options) if still_initial(device) => reinitialize(device, options).map(|_| true),
            Some(_) => Ok(false),
            None => result::install_default(who, device),
        };
        match installed {
            Ok(true) => {
                *slot.ours.lock().unwrap_or_else(|e| e.into_inner()) = MemoryResource::current(device).ok();
                slot.installed.store(true, Ordering::Release);
            }
            Ok(false) => {}
            Err(e) => log::warn!(target: "raft", "keeping the memory resource of device {device}: {e}"),
        }
    });
    Ok(())
}

/// Whether RMM's initial resource is still current on `device` (nobody chose another).
fn still_initial(device: usize) -> bool {
    let initial = MemoryResource::cuda(device);
    match (MemoryResource::current(device), initial) {
        (Ok(current), Ok(initial)) => current.kind == MemoryResourceKind::Cuda && current.same_as(&initial).unwrap_or(false),
        _ => false,
    }
}

/// A whole RMM setup for one device, as `rmm.reinitialize(...)` and dask-cuda's `rmm_*` options
/// describe it: which base resource, a pool or the async allocator over it, and adaptors.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RmmOptions {
    /// A `pool_memory_resource` over the base (`pool_allocator=True`, `rmm_pool_size` set).
    pub pool: bool,
    /// The pool's (or the async pool's) initial size in bytes (`initial_pool_size`,
    /// `rmm_pool_size`); `None`: RMM's default.
    pub initial_pool_size: Option<usize>,
    /// The pool's maximum size in bytes (`maximum_pool_size`, `rmm_maximum_pool_size`).
    pub maximum_pool_size: Option<usize>,
    /// Managed memory as the base (`managed_memory=True`, `rmm_managed_memory`).
    pub managed: bool,
    /// `cuda_async_memory_resource` (cudaMallocAsync) instead of a pool (`rmm_async`).
    pub async_pool: bool,
    /// Bytes the async pool keeps when the stream synchronises (`rmm_release_threshold`).
    pub release_threshold: Option<usize>,
    /// RMM's CSV log of every allocation, to this file (`logging=True, log_file_name=…`;
    /// dask-cuda's `rmm_log_directory` names a directory: the file is `rmm_log_dev<N>.csv` there).
    pub log_file: Option<std::path::PathBuf>,
    /// A tracking adaptor on top (`rmm_track_allocations`).
    pub track_allocations: bool,
    /// A statistics adaptor on top (`rmm.statistics.enable_statistics()`).
    pub statistics: bool,
}

/// Parses `8GiB`, `512 MB`, `1.5GB`, `1073741824` (binary and decimal units, as dask-cuda does).
fn parse_bytes(text: &str) -> Option<usize> {
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (number, unit) = (t[..split].trim(), t[split..].trim().to_ascii_lowercase());
    let value: f64 = number.parse().ok()?;
    let scale: f64 = match unit.as_str() {
        "" | "b" => 1.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        "kib" | "k" => 1024.0,
        "mib" | "m" => 1024f64.powi(2),
        "gib" | "g" => 1024f64.powi(3),
        "tib" | "t" => 1024f64.powi(4),
        _ => return None,
    };
    let bytes = value * scale;
    (bytes.is_finite() && bytes >= 0.0 && bytes < usize::MAX as f64).then_some(bytes as usize)
}

impl RmmOptions {
    /// The `RAFT_RMM_*` variables, read once per process: `RAFT_RMM_POOL_SIZE`,
    /// `RAFT_RMM_MAXIMUM_POOL_SIZE`, `RAFT_RMM_RELEASE_THRESHOLD` (bytes: `8GiB`, `500MB`, a
    /// number), `RAFT_RMM_POOL`, `RAFT_RMM_MANAGED`, `RAFT_RMM_ASYNC`, `RAFT_RMM_TRACK_ALLOCATIONS`,
    /// `RAFT_RMM_STATISTICS` (`1`/`0`, `true`/`false`), `RAFT_RMM_LOG_DIRECTORY` (a directory:
    /// `rmm_log_dev<N>.csv` in it). `None` when none is set.
    ///
    /// # Errors
    /// `Logic`, naming the variable, for a value that does not parse.
    pub fn from_env() -> Result<Option<RmmOptions>> {
        static FROM_ENV: OnceLock<Result<Option<RmmOptions>>> = OnceLock::new();
        FROM_ENV.get_or_init(|| Self::from_vars(|name| std::env::var(name).ok())).clone()
    }

    /// The same from any lookup (tests, config files).
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Option<RmmOptions>> {
        const WHO: &str = "RmmOptions::from_env";
        let mut any = false;
        let mut get = |name: &str| {
            let v = get(name).filter(|v| !v.trim().is_empty());
            any |= v.is_some();
            v
        };
        let size = |name: &str, v: Option<String>| -> Result<Option<usize>> {
            v.map(|t| {
                parse_bytes(&t).ok_or_else(|| {
                    Error::logic(WHO, format!("{name}: expected a size in bytes (e.g. 8GiB, 500MB, 1073741824), given {t:?}"))
                })
            })
            .transpose()
        };
        let flag = |name: &str, v: Option<String>| -> Result<bool> {
            match v.as_deref().map(|t| t.trim().to_ascii_lowercase()) {
                None => Ok(false),
                Some(t) if ["1", "true", "yes", "on"].contains(&t.as_str()) => Ok(true),
                Some(t) if ["0", "false", "no", "off"].contains(&t.as_str()) => Ok(false),
                Some(t) => Err(Error::logic(WHO, format!("{name}: expected 1 or 0 (true or false), given {t:?}"))),
            }
        };
        let pool_size = size("RAFT_RMM_POOL_SIZE", get("RAFT_RMM_POOL_SIZE"))?;
        let options = RmmOptions {
            pool: flag("RAFT_RMM_POOL", get("RAFT_RMM_POOL"))? || pool_size.is_some(),
            initial_pool_size: pool_size,
            maximum_pool_size: size("RAFT_RMM_MAXIMUM_POOL_SIZE", get("RAFT_RMM_MAXIMUM_POOL_SIZE"))?,
            managed: flag("RAFT_RMM_MANAGED", get("RAFT_RMM_MANAGED"))?,
            async_pool: flag("RAFT_RMM_ASYNC", get("RAFT_RMM_ASYNC"))?,
            release_threshold: size("RAFT_RMM_RELEASE_THRESHOLD", get("RAFT_RMM_RELEASE_THRESHOLD"))?,
            log_file: get("RAFT_RMM_LOG_DIRECTORY").map(std::path::PathBuf::from),
            track_allocations: flag("RAFT_RMM_TRACK_ALLOCATIONS", get("RAFT_RMM_TRACK_ALLOCATIONS"))?,
            statistics: flag("RAFT_RMM_STATISTICS", get("RAFT_RMM_STATISTICS"))?,
        };
        if options.pool && options.async_pool {
            return Err(Error::logic(WHO, "RAFT_RMM_ASYNC and RAFT_RMM_POOL (or RAFT_RMM_POOL_SIZE) exclude each other"));
        }
        Ok(any.then_some(options))
    }

    /// The resource this setup describes, on `device` (the log file of a directory setting is
    /// `rmm_log_dev<device>.csv`).
    pub fn build(&self, device: usize) -> Result<MemoryResource> {
        let mut mr = if self.async_pool {
            MemoryResource::cuda_async_with(device, self.initial_pool_size, self.release_threshold)?
        } else {
            let base = if self.managed { MemoryResource::managed(device)? } else { MemoryResource::cuda(device)? };
            if self.pool {
                base.pool(self.initial_pool_size, self.maximum_pool_size)?
            } else {
                base
            }
        };
        if self.track_allocations {
            mr = mr.with_tracking()?;
        }
        if let Some(log) = &self.log_file {
            let path = if log.is_dir() { log.join(format!("rmm_log_dev{device}.csv")) } else { log.clone() };
            mr = mr.with_logging(path, false)?;
        }
        if self.statistics {
            mr = mr.with_statistics()?;
        }
        Ok(mr)
    }
}

/// Makes a resource; one that fails with `OutOfMemory` is made once more after the retired
/// async pools have given their unused memory back, where they held any.
fn reclaiming(make: impl Fn() -> Result<NativeMr>) -> Result<NativeMr> {
    match make() {
        Err(e) if e.kind() == ErrorKind::OutOfMemory && mr::reclaim_retired_pools() => make(),
        made => made,
    }
}

/// `rmm.reinitialize(...)` for one device: builds the resource `options` describe and makes it
/// `device`'s current; returns the one it replaced. Arrays already allocated keep theirs.
pub fn reinitialize(device: usize, options: &RmmOptions) -> Result<MemoryResource> {
    const WHO: &str = "raft::memory::reinitialize";
    let mr = options.build(device).map_err(|e| e.with_who(WHO))?;
    set_current(device, &mr).map_err(|e| e.with_who(WHO))
}

/// Whether this library installed the async pool on `device`.
pub fn installed_default(device: usize) -> bool {
    per_device().get(device).is_some_and(|s| s.installed.load(Ordering::Acquire))
}

/// The exit teardown: where the pool this library installed is still current, puts RMM's
/// initial resource back; then lets go of the pool, destroying it while CUDA is still up. A
/// resource the user installed is left as it is.
fn teardown() {
    for (device, slot) in per_device().iter().enumerate() {
        let ours = slot.ours.lock().unwrap_or_else(|e| e.into_inner()).take();
        let Some(ours) = ours else { continue };
        let still_current = MemoryResource::current(device).and_then(|c| c.same_as(&ours)).unwrap_or(false);
        if still_current {
            let _ = reset_memory_resource(device);
        }
        drop(ours);
    }
}

/// The resources layer's "release every live resources object": that layer sits above this
/// file, so it installs the step here ([`register_teardown_releasing`]) before its first object
/// is handed out.
static RELEASE_ALL_LIVE: std::sync::OnceLock<fn()> = std::sync::OnceLock::new();

/// [`register_teardown`], with the step that releases every live resources object.
pub(crate) fn register_teardown_releasing(release_all_live: fn()) {
    let _ = RELEASE_ALL_LIVE.set(release_all_live);
    register_teardown();
}

/// The teardown's first step: the installed one (none in a process that made no resources
/// object, which then has none to release).
fn release_all_live() {
    if let Some(step) = RELEASE_ALL_LIVE.get() {
        step();
    }
}

/// Registers this crate's exit teardown with `raft-exit` (once): release every live resources
/// object, then put back RMM's initial resource where this library's pool is still current.
pub(crate) fn register_teardown() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        raft_exit::on_teardown(release_all_live);
        raft_exit::on_teardown(report_leaks);
        raft_exit::on_teardown(teardown);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let owned: Vec<(String, String)> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |name| owned.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    }

    #[test]
    fn sizes_parse_like_dask_cuda() {
        assert_eq!(parse_bytes("8GiB"), Some(8 << 30));
        assert_eq!(parse_bytes("500MB"), Some(500_000_000));
        assert_eq!(parse_bytes("1.5 GB"), Some(1_500_000_000));
        assert_eq!(parse_bytes("1073741824"), Some(1 << 30));
        assert_eq!(parse_bytes("12 parsecs"), None);
        assert_eq!(parse_bytes("-1GB"), None);
        assert_eq!(parse_bytes(""), None);
    }

    #[test]
    fn the_tracking_registry_keeps_only_live_adaptors() {
        let mut list = Vec::new();
        let kept = Arc::new(0);
        push_pruned(&mut list, Arc::downgrade(&kept));
        for i in 0..100 {
            let gone = Arc::new(i);
            push_pruned(&mut list, Arc::downgrade(&gone));
        }
        assert_eq!(list.len(), 2, "the registry grew with adaptors long gone");
        assert!(list[0].upgrade().is_some());
    }

    #[test]
    fn bin_exponents_past_30_are_refused_before_any_native_call() {
        for max in 31..=u8::MAX {
            let e = check_bin_exponents("MemoryResource::binning", 10, max).unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::Logic);
            assert_eq!(e.to_string(), format!("MemoryResource::binning: bin exponents must satisfy min <= max <= 30, given 10 and {max}"));
        }
        assert_eq!(check_bin_exponents("x", 12, 11).unwrap_err().kind(), crate::ErrorKind::Logic);
        for (min, max) in [(0, 0), (10, 20), (0, 30), (30, 30)] {
            check_bin_exponents("x", min, max).unwrap();
        }
    }

    #[test]
    fn no_variable_means_no_setup() {
        assert_eq!(RmmOptions::from_vars(vars(&[])).unwrap(), None);
    }

    #[test]
    fn variables_describe_a_pool_with_adaptors() {
        let o = RmmOptions::from_vars(vars(&[
            ("RAFT_RMM_POOL_SIZE", "2GiB"),
            ("RAFT_RMM_MAXIMUM_POOL_SIZE", "4GiB"),
            ("RAFT_RMM_MANAGED", "true"),
            ("RAFT_RMM_TRACK_ALLOCATIONS", "1"),
        ]))
        .unwrap()
        .unwrap();
        assert!(o.pool && o.managed && o.track_allocations && !o.async_pool && !o.statistics);
        assert_eq!((o.initial_pool_size, o.maximum_pool_size), (Some(2 << 30), Some(4 << 30)));
    }

    #[test]
    fn a_bad_value_is_a_logic_error_naming_the_variable() {
        let e = RmmOptions::from_vars(vars(&[("RAFT_RMM_POOL_SIZE", "lots")])).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Logic);
        assert!(e.to_string().contains("RAFT_RMM_POOL_SIZE") && e.to_string().contains("\"lots\""), "{e}");
        let e = RmmOptions::from_vars(vars(&[("RAFT_RMM_ASYNC", "maybe")])).unwrap_err();
        assert!(e.to_string().contains("RAFT_RMM_ASYNC"), "{e}");
        let e = RmmOptions::from_vars(vars(&[("RAFT_RMM_ASYNC", "1"), ("RAFT_RMM_POOL", "1")])).unwrap_err();
        assert!(e.to_string().contains("exclude each other"), "{e}");
    }
}
