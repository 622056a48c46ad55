//! [`MemoryResource`]: one RMM resource as an owned Rust value, its constructors and adaptors,
//! the options and facts they take and give, and the tracking adaptors' leak report at exit.
use super::kind::MemoryResourceKind;
use crate::error::{Error, ErrorKind, Result};
use crate::result;
use crate::result::mr::{self, NativeMr};
use raft_sys as sys;
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

/// How an `rmm::mr::pool_memory_resource` grows ([`MemoryResource::pool`]). `None` is RMM's
/// default: for `initial`, half the free memory of the device (whichever device the calling
/// thread is on); for `maximum`, no limit.
///
/// `PoolOptions::initial(1 << 30).maximum(4 << 30)`, or `PoolOptions::default()`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct PoolOptions {
    /// Bytes taken from upstream at once (`initial_pool_size`).
    pub initial: Option<usize>,
    /// The most bytes the pool grows to (`maximum_pool_size`).
    pub maximum: Option<usize>,
}

impl PoolOptions {
    /// A pool of `bytes` at first, with no maximum.
    pub const fn initial(bytes: usize) -> Self {
        PoolOptions { initial: Some(bytes), maximum: None }
    }

    /// The same, growing to `bytes` at most.
    pub const fn maximum(self, bytes: usize) -> Self {
        PoolOptions { maximum: Some(bytes), ..self }
    }
}

/// How an `rmm::mr::cuda_async_memory_resource` (a cudaMallocAsync pool) starts and what it
/// keeps ([`MemoryResource::cuda_async_with`]); `None` is RMM's default.
///
/// `AsyncPoolOptions::initial(1 << 30).release_threshold(4 << 30)`, or `::default()`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct AsyncPoolOptions {
    /// Bytes reserved at once (`initial_pool_size`).
    pub initial: Option<usize>,
    /// Bytes the pool keeps when the stream synchronises (`release_threshold`).
    pub release_threshold: Option<usize>,
}

impl AsyncPoolOptions {
    /// A pool of `bytes` reserved at first.
    pub const fn initial(bytes: usize) -> Self {
        AsyncPoolOptions { initial: Some(bytes), release_threshold: None }
    }

    /// The same, keeping up to `bytes` when the stream synchronises.
    pub const fn release_threshold(self, bytes: usize) -> Self {
        AsyncPoolOptions { release_threshold: Some(bytes), ..self }
    }
}

/// The arena size of an `rmm::mr::arena_memory_resource` ([`MemoryResource::arena`]); `None`:
/// RMM's. `ArenaOptions::size(1 << 30)`, or `ArenaOptions::default()`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct ArenaOptions {
    /// Bytes of the global arena (`arena_size`).
    pub size: Option<usize>,
}

impl ArenaOptions {
    /// An arena of `bytes`.
    pub const fn size(bytes: usize) -> Self {
        ArenaOptions { size: Some(bytes) }
    }
}

/// What a limiting adaptor has let through ([`MemoryResource::limit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitUsage {
    /// Bytes allocated through it now.
    pub allocated: usize,
    /// Its limit.
    pub limit: usize,
}

/// The bytes of a CUDA async pool as the driver counts them ([`MemoryResource::async_pool_bytes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AsyncPoolBytes {
    /// Bytes the pool holds from the driver (`cudaMemPoolAttrReservedMemCurrent`).
    pub reserved: usize,
    /// Bytes of it allocated now (`cudaMemPoolAttrUsedMemCurrent`).
    pub in_use: usize,
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
    pub(crate) native: Arc<NativeMr>,
    pub(crate) kind: MemoryResourceKind,
}

static_assertions::assert_impl_all!(MemoryResource: Send, Sync, Clone);

/// Checks `device` and sets up its primary context (`device::context`, once per device): the
/// shim's device scope binds that context only once it is noted, so a resource made first, with
/// another library's context of the device current on the thread, would take its first block
/// (a pool's, an arena's) in that context, whose memory dies with it (the nineteenth audit).
fn on_device(who: &'static str, device: usize) -> Result<()> {
    crate::device::context(who, device).map(drop)
}

impl MemoryResource {
    pub(crate) fn wrap(who: &'static str, native: NativeMr) -> Result<Self> {
        let kind = MemoryResourceKind::from_raw(native.kind(who)?);
        Ok(MemoryResource { native: Arc::new(native), kind })
    }

    /// `device`'s current RMM resource (`rmm::mr::get_per_device_resource_ref`), shared. Like
    /// every constructor here it sets the device up first (its primary context, as resources
    /// of the device do), so it makes the device's context in a process that had none.
    ///
    /// # Errors
    /// `Logic` for a device that does not exist, or a resource that cannot be shared (its copy
    /// does not compare equal to it); `Cuda` without a driver.
    pub fn current(device: usize) -> Result<Self> {
        const WHO: &str = "MemoryResource::current";
        on_device(WHO, device)?;
        route_releases();
        Self::wrap(WHO, NativeMr::current(WHO, device)?)
    }

    pub(crate) fn made(who: &'static str, device: usize, kind: i32) -> Result<Self> {
        on_device(who, device)?;
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
    /// threshold (rmm.mr.CudaAsyncMemoryResource(initial_pool_size, release_threshold)):
    /// `cuda_async_with(0, AsyncPoolOptions::default().release_threshold(32 << 20))`.
    pub fn cuda_async_with(device: usize, options: AsyncPoolOptions) -> Result<Self> {
        const WHO: &str = "MemoryResource::cuda_async_with";
        on_device(WHO, device)?;
        route_releases();
        Self::wrap(WHO, reclaiming(|| NativeMr::cuda_async(WHO, device, options.initial, options.release_threshold))?)
    }

    /// A new `rmm::mr::pinned_host_memory_resource` for `device`: page-locked host memory the
    /// device reads and writes directly.
    pub fn pinned_host(device: usize) -> Result<Self> {
        const WHO: &str = "MemoryResource::pinned_host";
        on_device(WHO, device)?;
        route_releases();
        Self::wrap(WHO, NativeMr::pinned_host(WHO, device)?)
    }

    /// An `rmm::mr::pool_memory_resource` over this resource (rmm.mr.PoolMemoryResource):
    /// `upstream.pool(PoolOptions::initial(1 << 30).maximum(4 << 30))`; see [`PoolOptions`] for
    /// RMM's defaults.
    pub fn pool(&self, options: PoolOptions) -> Result<Self> {
        const WHO: &str = "MemoryResource::pool";
        Self::wrap(WHO, self.native.pool(WHO, options.initial, options.maximum)?)
    }

    /// An `rmm::mr::arena_memory_resource` over this resource (rmm.mr.ArenaMemoryResource):
    /// `upstream.arena(ArenaOptions::size(1 << 30))`, or `ArenaOptions::default()` for RMM's size.
    ///
    /// When the arena has no room left, RMM defragments it before giving up: a
    /// `cudaDeviceSynchronize` on the allocating thread, under the arena's lock, which waits for
    /// every stream of the device (other threads' work included) and holds the arena's other
    /// users meanwhile. Size the arena for the peak, or use a pool, where that wait would hurt.
    pub fn arena(&self, options: ArenaOptions) -> Result<Self> {
        const WHO: &str = "MemoryResource::arena";
        Self::wrap(WHO, self.native.arena(WHO, options.size)?)
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
    pub fn limit(&self) -> Result<LimitUsage> {
        let (allocated, limit) = self.native.limits("MemoryResource::limit")?;
        Ok(LimitUsage { allocated, limit })
    }

    /// The bytes of the CUDA async pool behind this resource (itself, or the upstream of its
    /// adaptors), as the driver counts them; `None` when there is no async pool behind it.
    ///
    /// # Errors
    /// `Cuda` when the driver cannot say.
    pub fn async_pool_bytes(&self) -> Result<Option<AsyncPoolBytes>> {
        let found = mr::async_pool_bytes("MemoryResource::async_pool_bytes", &self.native)?;
        Ok(found.map(|(reserved, in_use)| AsyncPoolBytes { reserved: reserved as usize, in_use: in_use as usize }))
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

/// Every native resource's last drop goes to the release threads; called before each
/// `NativeMr` is made (the result layer below cannot name the release layer).
pub(crate) fn route_releases() {
    mr::defer_releases_to(crate::release::enqueue);
}

/// Makes a resource; one that fails with `OutOfMemory` is made once more after the retired
/// async pools have given their unused memory back, where they held any.
pub(crate) fn reclaiming(make: impl Fn() -> Result<NativeMr>) -> Result<NativeMr> {
    match make() {
        Err(e) if e.kind() == ErrorKind::OutOfMemory && mr::reclaim_retired_pools() => make(),
        made => made,
    }
}

/// The resources layer's "release every live resources object": that layer sits above this
/// file, so it installs the step here ([`register_teardown_releasing`]) before its first object
/// is handed out.
static RELEASE_ALL_LIVE: OnceLock<fn()> = OnceLock::new();

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

/// The per-device defaults' teardown (`current.rs`, above this file, installs it): put back RMM's
/// initial resource where this library's pool is still current.
static DEFAULTS_TEARDOWN: OnceLock<fn()> = OnceLock::new();

/// Installs the per-device defaults' teardown step.
pub(crate) fn set_defaults_teardown(step: fn()) {
    let _ = DEFAULTS_TEARDOWN.set(step);
}

fn defaults_teardown() {
    if let Some(step) = DEFAULTS_TEARDOWN.get() {
        step();
    }
}

/// Registers this crate's exit teardown with `raft-exit` (once): release every live resources
/// object, report the allocations tracking adaptors still hold, then put back RMM's initial
/// resource where this library's pool is still current.
pub(crate) fn register_teardown() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        raft_exit::on_teardown(release_all_live);
        raft_exit::on_teardown(report_leaks);
        raft_exit::on_teardown(defaults_teardown);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn option_builders_say_what_they_set() {
        assert_eq!(PoolOptions::initial(1 << 30).maximum(4 << 30), PoolOptions { initial: Some(1 << 30), maximum: Some(4 << 30) });
        assert_eq!(PoolOptions::default().maximum(8), PoolOptions { initial: None, maximum: Some(8) });
        assert_eq!(AsyncPoolOptions::default().release_threshold(32), AsyncPoolOptions { initial: None, release_threshold: Some(32) });
        assert_eq!(AsyncPoolOptions::initial(64), AsyncPoolOptions { initial: Some(64), release_threshold: None });
        assert_eq!(ArenaOptions::size(5).size, Some(5));
    }
}
