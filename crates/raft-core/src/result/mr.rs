//! RMM memory resources as the shim owns them (`NativeMr`): made, adapted, installed, and
//! destroyed off the dropping thread through the queue the memory layer installs; the async
//! pools' counts and trimming. Apart from `mod.rs`, which keeps the helpers every file here uses.
use super::{api, check, ContextGuard};
use crate::error::{Error, ErrorKind, Result};
use raft_sys as sys;
use std::ffi::c_void;
use std::ptr::NonNull;

/// CUDA async pools the shim made, retired (last copy gone) and reused, for `raft::stats()`
/// (zeros without a shim).
pub(crate) fn async_pools() -> (u64, u64, u64) {
    const WHO: &str = "raft::stats";
    let Ok(api) = api(WHO) else { return (0, 0, 0) };
    let (mut made, mut retired, mut reused) = (0u64, 0u64, 0u64);
    // SAFETY: writes three integers; reads three atomics, no CUDA call.
    match check(WHO, api, unsafe { api.raftrs_mr_async_pools(&mut made, &mut retired, &mut reused) }) {
        Ok(()) => (made, retired, reused),
        Err(_) => (0, 0, 0),
    }
}

/// The bytes reserved and in use of the CUDA async pool behind `mr`, if there is one.
pub(crate) fn async_pool_bytes(who: &'static str, mr: &NativeMr) -> Result<Option<(u64, u64)>> {
    let api = api(who)?;
    let _keep = ContextGuard::save(who)?;
    let (mut found, mut reserved, mut used) = (0i32, 0u64, 0u64);
    // SAFETY: `mr` is alive for the borrow; writes an int and two integers.
    check(who, api, unsafe { api.raftrs_mr_async_pool_bytes(mr.ptr.as_ptr(), &mut found, &mut reserved, &mut used) })?;
    Ok((found != 0).then_some((reserved, used)))
}

/// Gives the unused memory of every retired async pool back to the driver now: the bytes
/// released and the bytes still held (memory whose stream-ordered free has not run yet).
pub(crate) fn trim_retired(who: &'static str) -> Result<(u64, u64)> {
    let api = api(who)?;
    let _keep = ContextGuard::save(who)?;
    let (mut released, mut held) = (0u64, 0u64);
    // SAFETY: writes two integers; the shim touches only the pools it keeps.
    check(who, api, unsafe { api.raftrs_mr_trim_retired(&mut released, &mut held) })?;
    Ok((released, held))
}

/// For an allocation or a new async pool that failed with `OutOfMemory`: [`trim_retired`] (a
/// pool retired a moment ago gives its memory back only at the next synchronisation). Never
/// waits: the caller's thread must not block behind other threads' work (another rank's
/// collective, say). Returns whether any memory went back (then a retry may succeed).
pub(crate) fn reclaim_retired_pools() -> bool {
    match trim_retired("raft::memory (retired async pools)") {
        Ok((released, _)) => released > 0,
        Err(e) => {
            log::debug!(target: "raft", "{e}");
            false
        }
    }
}

/// One owned RMM memory resource (a shared copy: see `raftrs_mr` in the shim's header). Dropping
/// the last handle to a pool destroys the pool, on its device; a CUDA async pool is retired
/// instead, never destroyed (see `async_pool_guard` in the shim).
pub(crate) struct NativeMr {
    pub(super) ptr: NonNull<sys::raftrs_mr>,
    device: usize,
}

// SAFETY: RMM's resources are thread-safe (their allocate/deallocate lock or are stateless); the
// handle is only read through `&self`, and destroyed once in Drop.
unsafe impl Send for NativeMr {}
// SAFETY: as above.
unsafe impl Sync for NativeMr {}

fn mr_out(who: &'static str, api: &sys::RaftrsShim, raw: *mut sys::raftrs_mr) -> Result<NativeMr> {
    let ptr = NonNull::new(raw).ok_or_else(|| Error::new(ErrorKind::Generic, who, "the shim returned no memory resource"))?;
    let mut device = 0;
    // SAFETY: `ptr` was just made by the shim.
    check(who, api, unsafe { api.raftrs_mr_device(ptr.as_ptr(), &mut device) })?;
    Ok(NativeMr { ptr, device: device.max(0) as usize })
}

impl NativeMr {
    /// Owns a handle the shim just made for `device` (`raftrs_mr_allocate_held`'s fresh copy of
    /// that device's current resource). Infallible on purpose: the block allocated from the copy
    /// is freed through it (`Owner::Held`), so a failure here would leave both without an owner
    /// (the review's finding 7: asking the shim for the device, as `mr_out` does, could fail
    /// after the allocation).
    pub(crate) fn from_shim(ptr: NonNull<sys::raftrs_mr>, device: usize) -> NativeMr {
        NativeMr { ptr, device }
    }

    /// A shared handle to `device`'s current RMM resource.
    pub(crate) fn current(who: &'static str, device: usize) -> Result<NativeMr> {
        let api = api(who)?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` receives a new handle; the shim checks the device.
        check(who, api, unsafe { api.raftrs_mr_current(device as i32, &mut raw) })?;
        mr_out(who, api, raw)
    }

    /// A new resource of `kind` (`RAFTRS_MR_CUDA`, `_CUDA_ASYNC`, `_MANAGED`) on `device`.
    pub(crate) fn new(who: &'static str, device: usize, kind: i32) -> Result<NativeMr> {
        let api = api(who)?;
        let _keep = ContextGuard::save(who)?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: plain values; `raw` receives a new handle; the shim refuses other kinds.
        check(who, api, unsafe { api.raftrs_mr_new(device as i32, kind, &mut raw) })?;
        mr_out(who, api, raw)
    }

    /// A statistics adaptor over (a shared copy of) `self`.
    pub(crate) fn statistics_over(&self, who: &'static str) -> Result<NativeMr> {
        let api = api(who)?;
        let _keep = ContextGuard::save(who)?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: `self` is alive for the borrow; `raw` receives a new handle.
        check(who, api, unsafe { api.raftrs_mr_new_statistics(self.ptr.as_ptr(), &mut raw) })?;
        mr_out(who, api, raw)
    }

    /// A new `pinned_host_memory_resource` for `device`.
    pub(crate) fn pinned_host(who: &'static str, device: usize) -> Result<NativeMr> {
        let api = api(who)?;
        let _keep = ContextGuard::save(who)?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: plain values; `raw` receives a new handle.
        check(who, api, unsafe { api.raftrs_mr_new_pinned_host(device as i32, &mut raw) })?;
        mr_out(who, api, raw)
    }

    /// A new `cuda_async_memory_resource` with optional initial size and release threshold.
    pub(crate) fn cuda_async(
        who: &'static str,
        device: usize,
        initial: Option<usize>,
        release_threshold: Option<usize>,
    ) -> Result<NativeMr> {
        let api = api(who)?;
        let _keep = ContextGuard::save(who)?;
        let mut raw = std::ptr::null_mut();
        let (i, r) = (signed(who, initial)?, signed(who, release_threshold)?);
        // SAFETY: plain values; `raw` receives a new handle.
        check(who, api, unsafe { api.raftrs_mr_new_cuda_async(device as i32, i, r, &mut raw) })?;
        mr_out(who, api, raw)
    }

    /// An adaptor or pool over (a shared copy of) `self`, made by `make` through the shim.
    pub(crate) fn adapt(
        &self,
        who: &'static str,
        make: impl FnOnce(&sys::RaftrsShim, *const sys::raftrs_mr, *mut *mut sys::raftrs_mr) -> sys::raftrs_status,
    ) -> Result<NativeMr> {
        let api = api(who)?;
        register_deferred_hook(api); // before any pool-like resource exists
        let _keep = ContextGuard::save(who)?;
        let mut raw = std::ptr::null_mut();
        check(who, api, make(api, self.ptr.as_ptr(), &mut raw))?;
        mr_out(who, api, raw)
    }

    /// `pool_memory_resource` over `self`.
    pub(crate) fn pool(&self, who: &'static str, initial: Option<usize>, maximum: Option<usize>) -> Result<NativeMr> {
        let (i, m) = (signed(who, initial)?, signed(who, maximum)?);
        // SAFETY: `up` is alive (borrowed from self) and `out` receives a new handle.
        self.adapt(who, |api, up, out| unsafe { api.raftrs_mr_new_pool(up, i, m, out) })
    }

    /// `arena_memory_resource` over `self`.
    pub(crate) fn arena(&self, who: &'static str, size: Option<usize>) -> Result<NativeMr> {
        let s = signed(who, size)?;
        // SAFETY: as for `pool`.
        self.adapt(who, |api, up, out| unsafe { api.raftrs_mr_new_arena(up, s, out) })
    }

    /// `binning_memory_resource` over `self` (the shim checks the exponents).
    pub(crate) fn binning(&self, who: &'static str, min_exponent: u8, max_exponent: u8) -> Result<NativeMr> {
        // SAFETY: as for `pool`.
        self.adapt(who, |api, up, out| unsafe { api.raftrs_mr_new_binning(up, min_exponent as i32, max_exponent as i32, out) })
    }

    /// `limiting_resource_adaptor` over `self`.
    pub(crate) fn limiting(&self, who: &'static str, limit: usize) -> Result<NativeMr> {
        // SAFETY: as for `pool`.
        self.adapt(who, |api, up, out| unsafe { api.raftrs_mr_new_limiting(up, limit, out) })
    }

    /// `tracking_resource_adaptor` over `self`.
    pub(crate) fn tracking(&self, who: &'static str) -> Result<NativeMr> {
        // SAFETY: as for `pool`.
        self.adapt(who, |api, up, out| unsafe { api.raftrs_mr_new_tracking(up, out) })
    }

    /// `thread_safe_resource_adaptor` over `self`.
    pub(crate) fn thread_safe(&self, who: &'static str) -> Result<NativeMr> {
        // SAFETY: as for `pool`.
        self.adapt(who, |api, up, out| unsafe { api.raftrs_mr_new_thread_safe(up, out) })
    }

    /// `logging_resource_adaptor` over `self`, writing RMM's CSV to `path`.
    pub(crate) fn logging(&self, who: &'static str, path: &std::path::Path, auto_flush: bool) -> Result<NativeMr> {
        use std::os::unix::ffi::OsStrExt;
        let c_path = std::ffi::CString::new(path.as_os_str().as_bytes())
            .map_err(|_| Error::logic(who, format!("the log path {} contains a NUL byte", path.display())))?;
        // SAFETY: as for `pool`; `c_path` is a NUL-terminated string alive for the call (RMM
        // copies it into a std::string).
        self.adapt(who, |api, up, out| unsafe { api.raftrs_mr_new_logging(up, c_path.as_ptr(), auto_flush as i32, out) })
    }

    /// `failure_callback_resource_adaptor` over `self`, calling `callback` with the bytes of a
    /// failed allocation: `true` retries. A panic in the callback is caught (and means "give up").
    pub(crate) fn failure_callback(&self, who: &'static str, callback: Box<FailureCallback>) -> Result<NativeMr> {
        extern "C" fn call(bytes: usize, arg: *mut c_void) -> i32 {
            // SAFETY: `arg` is the Box<Box<FailureCallback>> leaked below, alive until drop_arg
            // (the shim keeps it as long as the adaptor), and shared only immutably (`Fn + Sync`).
            let f = unsafe { &*(arg as *const Box<FailureCallback>) };
            match super::catch_forgetting(|| f(bytes)) {
                Some(retry) => retry as i32,
                None => {
                    // A logger may panic too: inside the catch, as nothing may unwind from here.
                    super::catch_forgetting(
                        || log::warn!(target: "raft", "a memory failure callback panicked: the allocation of {bytes} bytes fails"),
                    );
                    0
                }
            }
        }
        extern "C" fn drop_arg(arg: *mut c_void) {
            // SAFETY: the shim calls this exactly once, for the pointer leaked below.
            let callback = unsafe { Box::from_raw(arg as *mut Box<FailureCallback>) };
            // A value the closure captured may panic in its drop: caught here, as in `call`, for
            // a panic must not cross into the shim's C++ destructor (the process would abort).
            if super::catch_forgetting(|| drop(callback)).is_none() {
                super::catch_forgetting(|| log::warn!(target: "raft", "dropping a memory failure callback panicked"));
            }
        }
        let mut arg = Some(Box::into_raw(Box::new(callback)) as *mut c_void);
        let made = self.adapt(who, |api, up, out| {
            let arg = arg.take().expect("handed to the shim once");
            // SAFETY: as for `pool`; the shim owns `arg` from here on and frees it with
            // `drop_arg` exactly once, also when the call fails.
            unsafe { api.raftrs_mr_new_failure_callback(up, Some(call), arg, Some(drop_arg), out) }
        });
        // Never handed to the shim (no shim, no context to save): dropped here, as the shim would.
        if let Some(arg) = arg {
            drop_arg(arg);
        }
        made
    }

    /// Count and bytes of a tracking adaptor's live allocations.
    pub(crate) fn tracking_counts(&self, who: &'static str) -> Result<(usize, usize)> {
        let api = api(who)?;
        let (mut count, mut bytes) = (0, 0);
        // SAFETY: `self` is alive for the borrow; writes two integers.
        check(who, api, unsafe { api.raftrs_mr_tracking(self.ptr.as_ptr(), &mut count, &mut bytes) })?;
        Ok((count, bytes))
    }

    /// RMM's text report of a tracking adaptor's live allocations.
    pub(crate) fn tracking_report(&self, who: &'static str) -> Result<String> {
        let api = api(who)?;
        let mut needed = 0;
        // SAFETY: a null buffer of capacity 0 only asks for the length.
        check(who, api, unsafe { api.raftrs_mr_tracking_report(self.ptr.as_ptr(), std::ptr::null_mut(), 0, &mut needed) })?;
        let mut buf = vec![0u8; needed.max(1) + 1024]; // room for allocations made meanwhile
                                                       // SAFETY: `buf` holds `buf.len()` writable bytes; the shim writes at most that, NUL-terminated.
        check(who, api, unsafe { api.raftrs_mr_tracking_report(self.ptr.as_ptr(), buf.as_mut_ptr().cast(), buf.len(), &mut needed) })?;
        let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
        Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
    }

    /// Allocated bytes and limit of a limiting adaptor.
    pub(crate) fn limits(&self, who: &'static str) -> Result<(usize, usize)> {
        let api = api(who)?;
        let (mut allocated, mut limit) = (0, 0);
        // SAFETY: `self` is alive for the borrow; writes two integers.
        check(who, api, unsafe { api.raftrs_mr_limits(self.ptr.as_ptr(), &mut allocated, &mut limit) })?;
        Ok((allocated, limit))
    }

    /// Allocation counts (current, peak, total) and total bytes of a statistics adaptor.
    pub(crate) fn statistics_counts(&self, who: &'static str) -> Result<(i64, i64, i64, i64)> {
        let api = api(who)?;
        let (mut current, mut peak, mut total, mut total_bytes) = (0, 0, 0, 0);
        // SAFETY: `self` is alive for the borrow; writes integers.
        check(who, api, unsafe { api.raftrs_mr_statistics_counts(self.ptr.as_ptr(), &mut current, &mut peak, &mut total) })?;
        // SAFETY: as above.
        check(who, api, unsafe { api.raftrs_mr_statistics_total_bytes(self.ptr.as_ptr(), &mut total_bytes) })?;
        Ok((current, peak, total, total_bytes))
    }

    /// Makes this resource its device's current; returns the one it replaced. Refused while
    /// RAFT or cuVS code may hold a reference into the map's entry (`lent::entry_free_to_replace`).
    pub(crate) fn set_current(&self, who: &'static str) -> Result<NativeMr> {
        let api = api(who)?;
        let _entry = super::lent::entry_free_to_replace(who, self.device())?;
        let mut previous = std::ptr::null_mut();
        // SAFETY: `self` is alive for the borrow; `previous` receives the replaced resource.
        check(who, api, unsafe { api.raftrs_mr_set_current(self.ptr.as_ptr(), &mut previous) })?;
        forget_current(self.device());
        mr_out(who, api, previous)
    }

    /// Puts RMM's initial resource back on `device`; returns the one it replaced.
    pub(crate) fn reset_current(who: &'static str, device: usize) -> Result<NativeMr> {
        let api = api(who)?;
        let _entry = super::lent::entry_free_to_replace(who, device)?;
        let _keep = ContextGuard::save(who)?;
        let mut previous = std::ptr::null_mut();
        // SAFETY: `previous` receives the replaced resource; the shim checks the device.
        check(who, api, unsafe { api.raftrs_mr_reset_current(device as i32, &mut previous) })?;
        forget_current(device);
        mr_out(who, api, previous)
    }

    /// The `RAFTRS_MR_*` kind.
    pub(crate) fn kind(&self, who: &'static str) -> Result<i32> {
        let api = api(who)?;
        let mut k = 0;
        // SAFETY: `self` is alive for the borrow.
        check(who, api, unsafe { api.raftrs_mr_kind(self.ptr.as_ptr(), &mut k) })?;
        Ok(k)
    }

    pub(crate) fn device(&self) -> usize {
        self.device
    }

    /// RMM's equality: memory from one can be freed by the other.
    pub(crate) fn same_as(&self, who: &'static str, other: &NativeMr) -> Result<bool> {
        let api = api(who)?;
        let mut eq = 0;
        // SAFETY: both are alive for the borrows.
        check(who, api, unsafe { api.raftrs_mr_equal(self.ptr.as_ptr(), other.ptr.as_ptr(), &mut eq) })?;
        Ok(eq != 0)
    }

    /// Current and peak bytes of a statistics adaptor.
    pub(crate) fn statistics(&self, who: &'static str) -> Result<(i64, i64)> {
        let api = api(who)?;
        let (mut current, mut peak) = (0, 0);
        // SAFETY: `self` is alive for the borrow; writes two integers.
        check(who, api, unsafe { api.raftrs_mr_statistics(self.ptr.as_ptr(), &mut current, &mut peak) })?;
        Ok((current, peak))
    }
}

/// A memory-resource handle on its way to destruction, owned by the closure that destroys it.
struct DoomedMr(NonNull<sys::raftrs_mr>);

// SAFETY: the handle is owned exclusively by the closure that destroys it (its `NativeMr` is gone)
// and RMM's resources may be destroyed from any thread (the shim makes their device current).
unsafe impl Send for DoomedMr {}

impl DoomedMr {
    fn destroy(self) {
        const WHO: &str = "MemoryResource::drop";
        let Ok(api) = api(WHO) else { return };
        let _keep = ContextGuard::save(WHO);
        // SAFETY: the handle is destroyed exactly once (self is consumed); buffers made from the
        // resource hold their own copy of it or the `Arc<NativeMr>` whose drop got here, so none
        // is left dangling.
        let status = unsafe { api.raftrs_mr_destroy(self.0.as_ptr()) };
        if let Err(e) = check(WHO, api, status) {
            log::warn!(target: "raft", "{e}");
        }
    }
}

/// Tells the shim where a pool, arena or binning resource goes when its last copy is let go on
/// a thread that must not wait (an array's `Drop`) while frees into it are still queued: onto a
/// release thread, which waits for those streams and then destroys it (the shim's fence.hpp).
fn register_deferred_hook(api: &sys::RaftrsShim) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    let mut refused = None;
    ONCE.call_once(|| {
        // SAFETY: `deferred_hook` is an `extern "C"` function that never unwinds (it catches every
        // panic) and lives as long as the process.
        refused = check("MemoryResource::pool", api, unsafe { api.raftrs_mr_on_deferred(Some(deferred_hook)) }).err();
    });
    // Logged once the `Once` is done: inside it, a logger that makes a pool re-entered it (a
    // deadlock, the twenty-second audit). Guarded, as `register_stream_keeper`'s.
    if let Some(e) = refused {
        raft_exit::log_guarded(|| log::warn!(target: "raft", "{e}: pools will be waited for where their last copy goes"));
    }
}

/// Called by the shim, inside the destructor of a resource's last copy, when its wait is deferred.
extern "C" fn deferred_hook(device: i32) {
    super::catch_forgetting(|| {
        if !raft_exit::native_release_allowed() {
            return; // the exit has decided: the deferred resources are left to the OS
        }
        if raft_exit::phase() == raft_exit::Phase::TearingDown {
            drain_deferred();
            return;
        }
        let device = usize::try_from(device).ok();
        let label = raft_exit::Label { what: "release of memory resource", id: raft_exit::next_id(), device };
        defer(label, Box::new(drain_deferred));
    });
}

/// Where a memory resource's destruction is sent: the release threads' queue. They live above
/// this layer, so the layer that makes the resources installs their queue here
/// ([`defer_releases_to`]) before it makes the first one.
pub(crate) type Defer = fn(raft_exit::Label, Box<dyn FnOnce() + Send + 'static>);

static DEFER: std::sync::OnceLock<Defer> = std::sync::OnceLock::new();

/// Installs the queue that destroys memory resources off the dropping thread (first call wins;
/// every caller installs the same one).
pub(crate) fn defer_releases_to(queue: Defer) {
    let _ = DEFER.set(queue);
    // A memory resource's first use reaches CUDA through the shim, not always through a device
    // context of this crate: a fork's child from here on is marked (the review of the
    // eighteenth audit).
    raft_exit::watch_forks();
}

/// Sends `release` to the installed queue (also the staging buffers' frees, `staging.rs`: their
/// memory comes from a pinned resource, so the queue is installed). Unset only if a resource
/// were made without the memory layer (none is): then it runs here, as in the exit teardown.
pub(super) fn defer(label: raft_exit::Label, release: Box<dyn FnOnce() + Send + 'static>) {
    match DEFER.get() {
        Some(queue) => queue(label, release),
        None => release(),
    }
}

/// Waits for the deferred resources' streams and destroys them (on a release thread).
fn drain_deferred() {
    const WHO: &str = "MemoryResource::drop";
    let Ok(api) = api(WHO) else { return };
    let _keep = ContextGuard::save(WHO);
    let mut drained = 0u64;
    // SAFETY: writes one integer; the shim owns the deferred resources.
    if let Err(e) = check(WHO, api, unsafe { api.raftrs_mr_drain_deferred(&mut drained) }) {
        log::warn!(target: "raft", "{e}");
    }
}

impl Drop for NativeMr {
    /// Destroying the last handle of a pool runs RMM's destructor, which waits for the GPU and
    /// calls cudaFree: that happens on a release thread, never on the dropping one (in the exit
    /// teardown, inline, while CUDA is still up). A CUDA async pool is never destroyed: its last
    /// copy retires it for reuse (see `async_pool_guard` in the shim).
    fn drop(&mut self) {
        if !raft_exit::native_release_allowed() {
            return; // the exit has decided: leaked to the OS, no CUDA call
        }
        let doomed = DoomedMr(self.ptr);
        if raft_exit::phase() == raft_exit::Phase::TearingDown {
            doomed.destroy();
            return;
        }
        let label = raft_exit::Label { what: "release of memory resource", id: raft_exit::next_id(), device: Some(self.device) };
        defer(label, Box::new(move || doomed.destroy()));
    }
}

/// What a failure-callback adaptor calls with the bytes of a failed allocation; `true` retries.
pub(crate) type FailureCallback = dyn Fn(usize) -> bool + Send + Sync + 'static;

/// A size for the shim, whose "none" is a negative number.
fn signed(who: &'static str, v: Option<usize>) -> Result<i64> {
    match v {
        None => Ok(-1),
        Some(n) => i64::try_from(n).map_err(|_| Error::logic(who, format!("{n} bytes is more than any device holds"))),
    }
}

/// Gives the unused memory of the CUDA async pool behind `mr` (the device's current resource
/// when `None`) back to the driver; `true` when there was such a pool. RMM's async resource keeps
/// what it reserved (its release threshold is "never"): after an allocation failed, that memory
/// is better left to other processes and libraries.
pub(crate) fn trim_async_pool(who: &'static str, device: usize, mr: Option<&NativeMr>) -> Result<bool> {
    let api = api(who)?;
    let _keep = ContextGuard::save(who)?;
    let mut trimmed = 0i32;
    let raw = mr.map_or(std::ptr::null(), |m| m.ptr.as_ptr() as *const sys::raftrs_mr);
    // SAFETY: `raw` is null or a live resource borrowed for the call; writes one int. The shim
    // makes the device current around the call.
    let trim = check(who, api, unsafe { api.raftrs_mr_trim_async(device as i32, raw, &mut trimmed) });
    trim.map(|()| trimmed != 0)
}

/// One device's kept copy of its current resource (see [`current_cache`]).
pub(crate) struct KeptCurrent {
    /// This crate's copy of the resource RMM's map held at the last default allocation that found
    /// it changed.
    pub(crate) slot: std::sync::Mutex<Option<std::sync::Arc<NativeMr>>>,
    /// Bumped by [`forget_current`]: a default allocation that made a fresh copy keeps it only
    /// when no replacement through this crate came between its start and its end (otherwise the
    /// copy, of the replaced resource, would be put back after the forgetting).
    pub(crate) generation: std::sync::atomic::AtomicU64,
}

/// Per device, the kept copy of the current resource (see `NativeBuffer::create_held`).
pub(crate) fn current_cache(device: usize) -> Option<&'static KeptCurrent> {
    use std::sync::{Mutex, OnceLock};
    static CACHE: OnceLock<Vec<KeptCurrent>> = OnceLock::new();
    CACHE
        .get_or_init(|| {
            let n = super::device_count("DeviceVec::new").unwrap_or(0);
            (0..n).map(|_| KeptCurrent { slot: Mutex::new(None), generation: Default::default() }).collect()
        })
        .get(device)
}

/// Lets go of the kept copy of `device`'s current resource: the map's entry was replaced through
/// this crate, or the exit tears it down. Kept, the copy would hold the replaced resource (a
/// pool and its memory, the streams its fence holds) until the next default allocation on the
/// device, which may never come (the review of issue 30).
pub(crate) fn forget_current(device: usize) {
    let old = current_cache(device).and_then(|kept| {
        let mut slot = kept.slot.lock().unwrap_or_else(|e| e.into_inner());
        // Under the lock: an allocation storing its fresh copy reads the generation there too.
        kept.generation.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        slot.take()
    });
    drop(old); // outside the lock: the last handle of a resource queues its release
}
