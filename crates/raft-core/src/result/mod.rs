//! The result layer: one checked function per shim entry point (and per raw cudarc call this
//! crate makes), holding all of the crate's FFI `unsafe`, the context guard and the status check.
//!
//! As in cudarc's `sys` / `result` / `safe` split: above this module, the safe types
//! (`DeviceResources`, `DeviceVec`, `MemoryResource`, …) hold no `unsafe` but their `Send` /
//! `Sync` reasons. Native objects are owned here by small handle types ([`NativeResources`],
//! [`NativeBuffer`], [`NativeMr`]) whose only ways to reach a raw pointer check what they hand
//! over: a buffer's extent, a matrix's leading dimension, a copy's length. A handle keeps alive
//! what its native object needs (the stream of a resources object or buffer, the memory
//! resource of a buffer), so no order of drops can leave a dangling reference.
use crate::error::{Error, ErrorKind, Result};
use cudarc::driver::{result as cu, sys as cusys, CudaContext, CudaStream};
use raft_sys as sys;
use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
pub(crate) mod copy;
pub(crate) mod crew;
pub(crate) mod foreign;
pub(crate) mod registration;
pub(crate) mod staging;
pub(crate) mod stores;

// The shim's statuses are the ones `ErrorKind::from_shim_status` knows.
static_assertions::const_assert_eq!(sys::RAFTRS_STATUS_OUT_OF_MEMORY, 1);
static_assertions::const_assert_eq!(sys::RAFTRS_STATUS_CUDA, 2);
static_assertions::const_assert_eq!(sys::RAFTRS_STATUS_LOGIC, 3);
// The shim refuses to compile against another handle size; the build facts say the same.
static_assertions::const_assert_eq!(sys::RAFTRS_EXPECTED_HANDLE_SIZE as usize, sys::build_info::HANDLE_SIZE);

/// The loaded shim, or the `Cuda` error saying why it is not there.
pub(crate) fn api(who: &'static str) -> Result<&'static sys::RaftrsShim> {
    sys::shim().map_err(|e| Error::new(ErrorKind::Cuda, who, e.message().to_string()))
}

/// Turns a shim status into a result; the thread-local message is read and cleared at once.
fn check(who: &'static str, api: &sys::RaftrsShim, status: sys::raftrs_status) -> Result<()> {
    if status == sys::RAFTRS_STATUS_OK {
        return Ok(());
    }
    Err(Error::new(ErrorKind::from_shim_status(status), who, sys::take_last_error(api)))
}

/// Whether an error only says that CUDA is already shutting down (the driver deinitialised, the
/// runtime unloading): at exit the work it was about is gone with it.
pub(crate) fn already_gone(e: &Error) -> bool {
    let m = e.message();
    m.contains("CUDA_ERROR_DEINITIALIZED") || m.contains("cudaErrorCudartUnloading")
}

// ---- the driver and the calling thread's context ------------------------------------------

/// Whether libcuda can be loaded. cudarc, loading the driver at run time, panics on its first
/// call when it cannot: every cudarc call of this crate is behind this answer.
pub(crate) fn driver_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: is_culib_present only tries to dlopen libcuda under its usual names.
    *PRESENT.get_or_init(|| unsafe { cusys::is_culib_present() })
}

fn no_driver(who: &'static str) -> Error {
    Error::new(ErrorKind::Cuda, who, "no CUDA driver: libcuda.so could not be loaded")
}

/// The calling thread's current context as a number (`cuCtxGetCurrent`); `None` when it has
/// none, without a driver, or when the driver cannot say.
pub(crate) fn current_context() -> Option<usize> {
    if !driver_present() {
        return None;
    }
    cu::ctx::get_current().ok().flatten().map(|c| c as usize)
}

/// Device 0's primary context: what the CUDA runtime binds to a thread that has none on its
/// first call. Leaving it bound on such a thread changes nothing the runtime would not do.
static RUNTIME_DEFAULT: AtomicUsize = AtomicUsize::new(0);

pub(crate) fn note_runtime_default(ctx: &CudaContext) {
    RUNTIME_DEFAULT.store(ctx.cu_ctx() as usize, Ordering::Release);
}

/// Tells the shim that `ctx` is `device`'s primary context, retained for the process (the
/// caller keeps it in a static): the shim's device switches then cost one driver read when the
/// thread is on it already. Only speed depends on this: a failure is ignored.
pub(crate) fn note_primary(who: &'static str, device: usize, ctx: &'static CudaContext) {
    let Ok(api) = api(who) else { return };
    // SAFETY: stores a handle value, no CUDA call; the context stays retained for the life of
    // the process (`ctx` is borrowed for 'static from the per-device table that never drops it).
    let _ = check(who, api, unsafe { api.raftrs_note_primary_context(device as i32, ctx.cu_ctx() as *mut c_void) });
}

/// Puts the calling thread's current CUDA context back when dropped: a library call must not
/// switch the user's thread to another device.
pub(crate) struct ContextGuard {
    previous: Option<cusys::CUcontext>,
    /// Library threads have no caller's context to protect: they keep whichever is bound.
    restore: bool,
    /// Made by [`bind`](Self::bind), which switched the thread to `bound`: dropping puts
    /// `previous` back without reading the current context first.
    switched: bool,
    bound: usize,
}

impl ContextGuard {
    pub(crate) fn save(who: &'static str) -> Result<Self> {
        if !driver_present() {
            return Err(no_driver(who));
        }
        static INIT: OnceLock<std::result::Result<(), cudarc::driver::DriverError>> = OnceLock::new();
        (*INIT.get_or_init(cu::init)).map_err(|e| Error::driver(who, e))?;
        if raft_exit::on_library_thread() {
            return Ok(ContextGuard { previous: None, restore: false, switched: false, bound: 0 });
        }
        let previous = cu::ctx::get_current().map_err(|e| Error::driver(who, e))?;
        Ok(ContextGuard { previous, restore: true, switched: false, bound: 0 })
    }
}

impl ContextGuard {
    /// Binds `ctx` on the calling thread for the guard's life, reading the current context once:
    /// when it is `ctx` already (the common case), nothing is set now or when dropped; otherwise
    /// `ctx` is set now and the previous context put back when dropped, without reading it
    /// again. For sequences whose every step leaves `ctx` current (cudarc binds the stream's own
    /// context, the shim puts back the exact context it found): a step that binds another
    /// context must bind `ctx` again before the guard drops.
    pub(crate) fn bind(who: &'static str, ctx: &CudaContext) -> Result<Self> {
        let mut guard = ContextGuard::save(who)?;
        if raft_exit::on_library_thread() {
            bind(who, ctx)?;
            return Ok(guard);
        }
        if guard.previous == Some(ctx.cu_ctx()) {
            guard.restore = false;
            return Ok(guard);
        }
        // SAFETY: `ctx` is a primary context retained by cudarc for as long as the borrowed
        // `CudaContext` lives (the caller holds it across the guard's life).
        unsafe { cu::ctx::set_current(ctx.cu_ctx()) }.map_err(|e| Error::driver(who, e))?;
        guard.switched = true;
        guard.bound = ctx.cu_ctx() as usize;
        Ok(guard)
    }
}

impl Drop for ContextGuard {
    fn drop(&mut self) {
        if !self.restore {
            return;
        }
        if self.switched {
            // Made by `bind`: the thread is on the context it set. A thread that had none keeps
            // device 0's primary context (see below); any other goes back to its own.
            let keep = self.previous.is_none() && self.bound == RUNTIME_DEFAULT.load(Ordering::Acquire);
            if !keep {
                // SAFETY: restores a context that was current on this thread a moment ago (or
                // none); a failure leaves the thread on the library's context, only less tidy.
                let _ = unsafe { cu::ctx::set_current(self.previous.unwrap_or(std::ptr::null_mut())) };
            }
            return;
        }
        let now = cu::ctx::get_current().ok().flatten();
        let runtime_default = RUNTIME_DEFAULT.load(Ordering::Acquire);
        // A thread that had no context keeps device 0's primary one, as the runtime would bind
        // it anyway: restoring "none" only makes the next runtime call bind it again.
        if self.previous.is_none() && now.is_some_and(|c| c as usize == runtime_default) {
            return;
        }
        if now != self.previous {
            // SAFETY: restores a context that was current on this thread a moment ago (or none);
            // a failure leaves the thread on the library's context, which is only less tidy.
            let _ = unsafe { cu::ctx::set_current(self.previous.unwrap_or(std::ptr::null_mut())) };
        }
    }
}

/// Waits for a stream (`cuStreamSynchronize`) without binding any context to the thread, with
/// the thread's capture mode relaxed (see [`relaxed`]).
pub(crate) fn stream_sync(who: &'static str, stream: &CudaStream) -> Result<()> {
    // SAFETY: the stream is alive for the borrow; synchronising needs no current context.
    relaxed(|| unsafe { cu::stream::synchronize(stream.cu_stream()) }).map_err(|e| Error::driver(who, e))
}

/// Runs `wait` with the calling thread's stream-capture mode set to relaxed
/// (`cuThreadExchangeStreamCaptureMode`), then puts the thread's own mode back. The waits that
/// end a borrow of memory a copy uses must not be refused: while this thread captures a stream
/// in global or thread-local mode, or another thread captures one in global mode, the driver
/// otherwise refuses them at once (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`) with the copy still
/// running, and also invalidates this thread's capture (measured on the H200 by this session's
/// second review). Relaxed, the wait runs and the capture stays valid.
pub(crate) fn relaxed<R>(wait: impl FnOnce() -> R) -> R {
    let mut mode = cusys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    // SAFETY: exchanges the calling thread's capture mode through a pointer to a local; needs
    // no context.
    let swapped = unsafe { cusys::cuThreadExchangeStreamCaptureMode(&mut mode) } == cusys::CUresult::CUDA_SUCCESS;
    let out = wait();
    if swapped {
        // SAFETY: as above; puts back the mode the first exchange returned.
        unsafe { cusys::cuThreadExchangeStreamCaptureMode(&mut mode) };
    }
    out
}

/// Refuses a copy (with host memory, or between device arrays) on a stream being captured into a
/// CUDA graph (`cuStreamBeginCapture`, e.g. cudarc's `begin_capture` on the resources' stream):
/// the copy would be recorded into the graph rather than run, and run at each launch of the
/// graph, after the memory's borrow (or the array) has ended (a wait on the stream or on an
/// event recorded during the capture waits for nothing). Each stream whose work the copy joins
/// is asked.
pub(crate) fn refuse_capture<'s>(who: &'static str, streams: impl IntoIterator<Item = &'s CudaStream>) -> Result<()> {
    for stream in streams {
        let mut status = cusys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: the stream is alive for the borrow; the call writes one status and needs no
        // current context.
        let rc = unsafe { cusys::cuStreamIsCapturing(stream.cu_stream(), &mut status) };
        if rc != cusys::CUresult::CUDA_SUCCESS {
            return Err(Error::driver(who, cudarc::driver::DriverError(rc)));
        }
        if status != cusys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
            return Err(Error::logic(
                who,
                "the stream is being captured into a CUDA graph: the copy would run at each launch of the graph, after \
                 the memory it uses may be gone; copy before the capture begins or after it ends",
            ));
        }
    }
    Ok(())
}

/// Drains a stream that is usually idle: asks first (`cuStreamQuery`) and waits
/// (`cuStreamSynchronize`) only while work is still running. Either way, a failure of the
/// stream's work is returned. Binds no context.
pub(crate) fn stream_drain(who: &'static str, stream: &CudaStream) -> Result<()> {
    // SAFETY: the stream is alive for the borrow; a query needs no current context.
    match unsafe { cusys::cuStreamQuery(stream.cu_stream()) } {
        cusys::CUresult::CUDA_SUCCESS => Ok(()),
        cusys::CUresult::CUDA_ERROR_NOT_READY => stream_sync(who, stream),
        rc => Err(Error::driver(who, cudarc::driver::DriverError(rc))),
    }
}

/// Waits for a stream and takes any failure cudarc recorded in its context (cudarc keeps the
/// errors of its `Drop`s there; left there, the next unrelated call would fail with it).
pub(crate) fn take_recorded(who: &'static str, ctx: &CudaContext) -> Result<()> {
    ctx.check_err().map_err(|e| Error::driver(who, e))
}

// ---- the CUDA runtime, through the shim ----------------------------------------------------

/// `cudaGetDeviceCount`: 0 when a driver is there but no device.
pub(crate) fn device_count(who: &'static str) -> Result<usize> {
    let api = api(who)?;
    let mut n = 0i32;
    // SAFETY: writes one int through a valid pointer.
    check(who, api, unsafe { api.raftrs_device_count(&mut n) })?;
    Ok(n.max(0) as usize)
}

/// `cudaGetDevice`.
pub(crate) fn current_device(who: &'static str) -> Result<usize> {
    let api = api(who)?;
    let mut d = 0i32;
    // SAFETY: writes one int through a valid pointer.
    check(who, api, unsafe { api.raftrs_current_device(&mut d) })?;
    Ok(d.max(0) as usize)
}

/// `cudaRuntimeGetVersion`.
pub(crate) fn runtime_version(who: &'static str) -> Result<i32> {
    let api = api(who)?;
    let mut v = 0;
    // SAFETY: writes one int through a valid pointer.
    check(who, api, unsafe { api.raftrs_runtime_version(&mut v) })?;
    Ok(v)
}

/// `cudaDriverGetVersion` (0 without a driver).
pub(crate) fn driver_version(who: &'static str) -> Result<i32> {
    let api = api(who)?;
    let mut v = 0;
    // SAFETY: writes one int through a valid pointer.
    check(who, api, unsafe { api.raftrs_driver_version(&mut v) })?;
    Ok(v)
}

/// `cudaDevAttrMemoryPoolsSupported` of an existing device.
pub(crate) fn memory_pools_supported(who: &'static str, device: usize) -> Result<bool> {
    let api = api(who)?;
    let mut v = 0;
    // SAFETY: writes one int; the shim refuses a device that does not exist.
    check(who, api, unsafe { api.raftrs_device_memory_pools_supported(device as i32, &mut v) })?;
    Ok(v != 0)
}

/// The address of RMM's per-device resource map as the shim binds it.
pub(crate) fn rmm_map_address(who: &'static str) -> Result<usize> {
    let api = api(who)?;
    let mut p = std::ptr::null_mut();
    // SAFETY: writes one pointer; the map is a plain C++ static, no CUDA call.
    check(who, api, unsafe { api.raftrs_rmm_map_address(&mut p) })?;
    Ok(p as usize)
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

// ---- raft::device_resources ----------------------------------------------------------------

/// Which handle of RAFT's (`RAFTRS_HANDLE_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HandleCode(pub(crate) i32);

/// The shim's `raft::device_resources`, with the stream it was built on: the stream lives at
/// least as long as the native object (it is dropped after it, in [`destroy`](Self::destroy)).
pub(crate) struct NativeResources {
    ptr: NonNull<sys::raftrs_resources>,
    stream: Arc<CudaStream>,
}

// SAFETY: raft::device_resources may be used from any thread; its lazily made handles are
// created under atomics (RAFT's resource cells). Destruction takes `self` by value, so no other
// reference can exist then.
unsafe impl Send for NativeResources {}
// SAFETY: as above; shared use only reads the object or goes through RAFT's atomic cells.
unsafe impl Sync for NativeResources {}

impl NativeResources {
    /// Builds RAFT's resources for `device` on `stream` (no handle is made yet). The caller's
    /// guard (the proof it holds one) puts its context back afterwards.
    pub(crate) fn create(who: &'static str, device: usize, stream: Arc<CudaStream>, _guard: &ContextGuard) -> Result<Self> {
        let api = api(who)?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: the stream is a live CUstream of this device (a CUstream is a cudaStream_t),
        // kept alive by `stream`, which the new object holds; `raw` receives a new object or
        // stays null on failure.
        check(who, api, unsafe { api.raftrs_resources_create(device as i32, stream.cu_stream() as *mut c_void, &mut raw) })?;
        let ptr = NonNull::new(raw).ok_or_else(|| Error::new(ErrorKind::Generic, who, "the shim returned no resources"))?;
        Ok(NativeResources { ptr, stream })
    }

    pub(crate) fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// `raft::resource::sync_stream` (polls the stream).
    pub(crate) fn sync_raft(&self, who: &'static str) -> Result<()> {
        let api = api(who)?;
        let _keep = ContextGuard::save(who)?;
        // SAFETY: the native resources are alive for the borrow.
        check(who, api, unsafe { api.raftrs_resources_sync(self.ptr.as_ptr()) })
    }

    /// The handle of `kind`, made by RAFT on first use on the resources' device.
    pub(crate) fn handle(&self, who: &'static str, kind: HandleCode) -> Result<*mut c_void> {
        let api = api(who)?;
        let _keep = ContextGuard::save(who)?;
        let mut out = std::ptr::null_mut();
        // SAFETY: the native resources are alive for the borrow; the shim makes the resources'
        // device current around the call and refuses an unknown kind.
        check(who, api, unsafe { api.raftrs_resources_handle(self.ptr.as_ptr(), kind.0, &mut out) })?;
        Ok(out)
    }

    /// The `raft::resources*` behind these resources (for foreign RAFT code; see `lend.rs`).
    pub(crate) fn raft_resources(&self, who: &'static str) -> Result<NonNull<c_void>> {
        let api = api(who)?;
        let mut out = std::ptr::null_mut();
        // SAFETY: the native resources are alive for the borrow; `out` receives a pointer into
        // them, which the caller may only use while it holds that borrow.
        check(who, api, unsafe { api.raftrs_resources_native(self.ptr.as_ptr(), &mut out) })?;
        NonNull::new(out).ok_or_else(|| Error::new(ErrorKind::Generic, who, "the shim returned no resources"))
    }

    /// Whether RAFT made the handle of `kind` yet.
    pub(crate) fn has_handle(&self, who: &'static str, kind: HandleCode) -> Result<bool> {
        let api = api(who)?;
        let mut out = 0;
        // SAFETY: the native resources are alive for the borrow.
        check(who, api, unsafe { api.raftrs_resources_has_handle(self.ptr.as_ptr(), kind.0, &mut out) })?;
        Ok(out != 0)
    }

    /// Waits for the stream, destroys the handles and RAFT's object, then lets the stream go,
    /// and returns any failure cudarc recorded meanwhile: the caller gets every error of its own
    /// release, and none is left for the next unrelated call.
    ///
    /// `used`: whether the stream was ever handed out; if not, nothing can be queued on it and
    /// it is not drained (the one driver call a release of unused resources would add to what
    /// C++ RAFT's destructor does).
    pub(crate) fn destroy(self, who: &'static str, used: bool) -> Result<()> {
        let api = api(who)?;
        // The stream's own context bound for the whole release (a release thread otherwise
        // keeps whichever context its last release left, maybe another device's, or none); the
        // shim and cudarc's stream drop below both leave it current.
        let keep = ContextGuard::bind(who, self.stream.context());
        // Drained whether or not the context could be bound (draining needs none): RAFT's
        // handles are destroyed only after the stream's work.
        let drain = if used { stream_drain(who, &self.stream) } else { Ok(()) };
        let drained = drain.and(keep.as_ref().map(|_| ()).map_err(Clone::clone));
        // SAFETY: `ptr` came from raftrs_resources_create and is destroyed exactly once (self is
        // consumed); its stream is still alive (dropped just below, after it).
        let destroyed = check(who, api, unsafe { api.raftrs_resources_destroy(self.ptr.as_ptr()) });
        let ctx = self.stream.context().clone();
        drop(self.stream);
        let recorded = take_recorded(who, &ctx);
        let tolerate = |r: Result<()>| r.or_else(|e| if already_gone(&e) { Ok(()) } else { Err(e) });
        tolerate(drained).and(tolerate(destroyed)).and(tolerate(recorded))
    }

    /// Leaks the native object and its stream to the OS: no CUDA call (at exit, once the exit
    /// has decided).
    pub(crate) fn leak(self) {
        std::mem::forget(self);
    }
}

/// The default-resource rule on `device` (see `raftrs_mr_install_default`): whether this call
/// installed the async pool.
pub(crate) fn install_default(who: &'static str, device: usize) -> Result<bool> {
    let api = api(who)?;
    let _keep = ContextGuard::save(who)?;
    let mut installed = 0;
    // SAFETY: writes one int; the shim checks the device.
    check(who, api, unsafe { api.raftrs_mr_install_default(device as i32, &mut installed) })?;
    Ok(installed != 0)
}

// ---- memory resources and buffers -----------------------------------------------------------

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
    ptr: NonNull<sys::raftrs_mr>,
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
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(bytes))) {
                Ok(retry) => retry as i32,
                Err(_) => {
                    log::warn!(target: "raft", "a memory failure callback panicked: the allocation of {bytes} bytes fails");
                    0
                }
            }
        }
        extern "C" fn drop_arg(arg: *mut c_void) {
            // SAFETY: the shim calls this exactly once, for the pointer leaked below.
            drop(unsafe { Box::from_raw(arg as *mut Box<FailureCallback>) });
        }
        let arg = Box::into_raw(Box::new(callback)) as *mut c_void;
        // SAFETY: as for `pool`; the shim owns `arg` from here on and frees it with `drop_arg`
        // exactly once, also when the call fails.
        self.adapt(who, |api, up, out| unsafe { api.raftrs_mr_new_failure_callback(up, Some(call), arg, Some(drop_arg), out) })
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

    /// Makes this resource its device's current; returns the one it replaced.
    pub(crate) fn set_current(&self, who: &'static str) -> Result<NativeMr> {
        let api = api(who)?;
        let mut previous = std::ptr::null_mut();
        // SAFETY: `self` is alive for the borrow; `previous` receives the replaced resource.
        check(who, api, unsafe { api.raftrs_mr_set_current(self.ptr.as_ptr(), &mut previous) })?;
        mr_out(who, api, previous)
    }

    /// Puts RMM's initial resource back on `device`; returns the one it replaced.
    pub(crate) fn reset_current(who: &'static str, device: usize) -> Result<NativeMr> {
        let api = api(who)?;
        let _keep = ContextGuard::save(who)?;
        let mut previous = std::ptr::null_mut();
        // SAFETY: `previous` receives the replaced resource; the shim checks the device.
        check(who, api, unsafe { api.raftrs_mr_reset_current(device as i32, &mut previous) })?;
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
        // resource hold their own copy of it, so none is left dangling.
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
    ONCE.call_once(|| {
        // SAFETY: `deferred_hook` is an `extern "C"` function that never unwinds (it catches every
        // panic) and lives as long as the process.
        if let Err(e) = check("MemoryResource::pool", api, unsafe { api.raftrs_mr_on_deferred(Some(deferred_hook)) }) {
            log::warn!(target: "raft", "{e}: pools will be waited for where their last copy goes");
        }
    });
}

/// Called by the shim, inside the destructor of a resource's last copy, when its wait is deferred.
extern "C" fn deferred_hook(device: i32) {
    let _ = std::panic::catch_unwind(|| {
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
}

/// Sends `release` to the installed queue. Unset only if a resource were made without the
/// memory layer (none is): then it runs here, as in the exit teardown.
fn defer(label: raft_exit::Label, release: Box<dyn FnOnce() + Send + 'static>) {
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

/// Element types that may live in device memory: `Copy`, nothing to drop, every bit pattern a
/// value (so bytes copied from the device are always a valid `T`), no padding (so every byte a
/// copy reads is initialised).
///
/// # Safety
/// Implement only for types where any bit pattern is a valid value, which have no padding
/// bytes (as bytemuck's `Pod` requires), and which own no resources.
pub unsafe trait DeviceScalar: Copy + Default + Send + Sync + 'static {}

macro_rules! scalars {
    ($($t:ty),*) => {$(
        // SAFETY: a primitive number: any bit pattern is a value, nothing to drop.
        unsafe impl DeviceScalar for $t {}
    )*};
}
scalars!(f32, f64, i8, i16, i32, i64, u8, u16, u32, u64);

/// The most bytes one allocation may ask for: 2^48 (256 TiB), what a 48-bit virtual address
/// space spans, and more than any device's memory or any host's page-locked memory. A larger
/// size is refused as `OutOfMemory` before it reaches RMM, whose resources round sizes up (to
/// 256 bytes; the pinned host resource also adds a header) with arithmetic that wraps near
/// `usize::MAX`: `usize::MAX` bytes became a 0-byte block of a pool, and the pinned resource
/// allocated 256 bytes for `usize::MAX - 7` (issue 33). The shim refuses the same sizes
/// (`max_allocation_bytes` in shim.cpp).
pub(crate) const MAX_ALLOCATION_BYTES: usize = 1 << 48;

/// Sizes within this of `usize::MAX` are a `Logic` error rather than `OutOfMemory`: rounding them
/// up to an allocator's alignment wraps around, so they are not sizes at all. The shim's
/// `rounding_slack` is the same.
pub(crate) const ROUNDING_SLACK: usize = 4096;

/// Refuses an allocation of `bytes` that no resource can serve (see [`MAX_ALLOCATION_BYTES`]),
/// before any CUDA call.
pub(crate) fn check_allocation(who: &'static str, bytes: usize) -> Result<()> {
    if bytes > usize::MAX - ROUNDING_SLACK {
        return Err(Error::logic(who, format!("{bytes} bytes: rounding the size up to an allocation's alignment wraps around")));
    }
    if bytes > MAX_ALLOCATION_BYTES {
        return Err(Error::new(
            ErrorKind::OutOfMemory,
            who,
            format!("{bytes} bytes is more than any device or host memory holds (at most 2^48 bytes in one allocation)"),
        ));
    }
    Ok(())
}

/// The bytes of `len` elements of `T`, refused as [`check_allocation`] refuses them; a product
/// that overflows is a `Logic` error (the length is wrong, not the memory short).
pub(crate) fn allocation_bytes<T>(who: &'static str, len: usize) -> Result<usize> {
    let size = std::mem::size_of::<T>();
    let bytes =
        len.checked_mul(size).ok_or_else(|| Error::logic(who, format!("{len} elements of {size} bytes: the byte count overflows")))?;
    check_allocation(who, bytes)?;
    Ok(bytes)
}

/// Device bytes from an RMM resource, ordered on one stream, holding (a shared copy of) the
/// resource that frees them and the stream they are ordered on.
pub(crate) struct NativeBuffer {
    ptr: NonNull<sys::raftrs_buffer>,
    data: *mut c_void,
    bytes: usize,
    device: usize,
    stream_ordered: bool,
    stream: Arc<CudaStream>,
}

// SAFETY: the buffer is a pointer, a size and an owned resource copy; the device memory is only
// touched by the GPU in stream order, through the checked calls below. Freeing consumes `self`.
unsafe impl Send for NativeBuffer {}
// SAFETY: shared use only reads the fields or queues reads of the device memory.
unsafe impl Sync for NativeBuffer {}

impl NativeBuffer {
    /// `bytes` from `mr`, or from `device`'s current resource, on `stream`. Every allocation of
    /// the crate, device or page-locked, comes through here: a size no resource can serve is
    /// refused here whoever asked (and again by the shim).
    pub(crate) fn create(who: &'static str, device: usize, mr: Option<&NativeMr>, stream: &Arc<CudaStream>, bytes: usize) -> Result<Self> {
        check_allocation(who, bytes)?;
        let api = api(who)?;
        // No context guard: the shim makes the device current around the call and puts the
        // caller's exact context back (its device_scope); nothing here binds one.
        let mut raw = std::ptr::null_mut();
        let (mut data, mut ordered) = (std::ptr::null_mut(), 0);
        let mr_ptr = mr.map_or(std::ptr::null(), |m| m.ptr.as_ptr() as *const _);
        // SAFETY: the stream is alive (borrowed, and held by the new buffer); `mr` is alive for
        // the borrow and the buffer keeps its own copy of it; the out-pointers are locals.
        let made = check(who, api, unsafe {
            api.raftrs_buffer_create(device as i32, mr_ptr, stream.cu_stream() as *mut c_void, bytes, &mut raw, &mut data, &mut ordered)
        });
        made?;
        let ptr = NonNull::new(raw).ok_or_else(|| Error::new(ErrorKind::Generic, who, "the shim returned no buffer"))?;
        let stream_ordered = ordered != 0;
        Ok(NativeBuffer { ptr, data, bytes, device, stream_ordered, stream: stream.clone() })
    }

    pub(crate) fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Whether freeing never blocks (the async pool): then `Drop` may free inline.
    pub(crate) fn frees_stream_ordered(&self) -> bool {
        self.stream_ordered
    }

    /// The device address (for cudarc's `DevicePtr` and FFI; dereferencing it is the user's
    /// `unsafe`).
    pub(crate) fn address(&self) -> u64 {
        self.data as u64
    }

    /// Sets every byte to zero, stream-ordered; returns once done.
    pub(crate) fn zero(&mut self, who: &'static str) -> Result<()> {
        let api = api(who)?;
        let _keep = ContextGuard::save(who)?;
        // SAFETY: `data` holds exactly `bytes` bytes of device memory owned by this buffer, on
        // its own stream (alive: held by the buffer).
        check(who, api, unsafe {
            api.raftrs_memset_async(self.device as i32, self.data, 0, self.bytes, self.stream.cu_stream() as *mut c_void)
        })?;
        stream_sync(who, &self.stream)
    }

    /// Copies `host` into the buffer; refused unless it is exactly the buffer's size. Returns
    /// once the copy is done, so the borrow of `host` covers it.
    pub(crate) fn copy_from_host<T: DeviceScalar>(&mut self, who: &'static str, host: &[T]) -> Result<()> {
        let bytes = std::mem::size_of_val(host);
        if bytes != self.bytes {
            return Err(Error::logic(who, format!("a copy of {bytes} bytes into an array of {} bytes", self.bytes)));
        }
        let api = api(who)?;
        refuse_capture(who, [&*self.stream])?;
        let _keep = ContextGuard::save(who)?;
        // SAFETY: both ranges hold `bytes` bytes (checked above); the host slice is borrowed until
        // the copy has finished (waited for below; the stream is not being captured, checked
        // above); the stream is the buffer's own.
        let queued = check(who, api, unsafe {
            api.raftrs_memcpy_async(
                self.device as i32,
                self.data,
                host.as_ptr() as *const c_void,
                bytes,
                self.stream.cu_stream() as *mut c_void,
            )
        });
        // Wait even when queueing failed half-way: the host borrow must outlive any copy.
        let waited = stream_sync(who, &self.stream);
        queued.and(waited)
    }

    /// Copies the buffer into `host`; refused unless it is exactly the buffer's size. Returns
    /// once the copy is done.
    pub(crate) fn copy_to_host<T: DeviceScalar>(&self, who: &'static str, host: &mut [T]) -> Result<()> {
        let bytes = std::mem::size_of_val(host);
        if bytes != self.bytes {
            return Err(Error::logic(who, format!("a copy of an array of {} bytes into {bytes} bytes", self.bytes)));
        }
        let api = api(who)?;
        refuse_capture(who, [&*self.stream])?;
        let _keep = ContextGuard::save(who)?;
        // SAFETY: both ranges hold `bytes` bytes (checked above); the host slice is borrowed
        // mutably until the copy has finished (waited for below; the stream is not being
        // captured, checked above); any bit pattern is a valid T (DeviceScalar).
        let queued = check(who, api, unsafe {
            api.raftrs_memcpy_async(
                self.device as i32,
                host.as_mut_ptr() as *mut c_void,
                self.data,
                bytes,
                self.stream.cu_stream() as *mut c_void,
            )
        });
        let waited = stream_sync(who, &self.stream);
        queued.and(waited)
    }

    /// Lets device `peer` access this buffer's memory where it comes from a CUDA async pool (see
    /// `copy::enable_peer_access`).
    pub(crate) fn grant_peer(&self, who: &'static str, peer: usize) -> Result<()> {
        let api = api(who)?;
        let _keep = ContextGuard::save(who)?;
        let mut granted = 0i32;
        // SAFETY: the buffer is alive for the borrow; writes one int; the shim checks `peer`.
        check(who, api, unsafe { api.raftrs_buffer_grant_peer(self.ptr.as_ptr(), peer as i32, &mut granted) })
    }

    /// Frees the buffer stream-ordered on its own stream, through the resource that made it.
    /// A resource whose free is not stream-ordered (cudaFree, cudaFreeHost, the arena's large
    /// blocks, unknown resources) gets the buffer only once its stream has finished with it:
    /// CUDA documents that cudaFree *may* synchronise, not that it does (the CUDA 13 runtime
    /// documentation of cudaFree), so the wait is made here (such frees run on release threads).
    pub(crate) fn free(self, who: &'static str) -> Result<()> {
        let api = api(who)?;
        // Page-locked host buffers name the legacy default stream (null) and are only ever
        // used by copies that wait for themselves: nothing to wait for there.
        let waits = !self.stream_ordered && !self.stream.cu_stream().is_null();
        // Binding a context is the only thing here that changes the caller's (the shim restores
        // its own switch): guarded where it happens, not on the stream-ordered fast path.
        let _keep = if waits { ContextGuard::save(who).ok() } else { None };
        if waits {
            let waited = bind(who, self.stream.context()).and_then(|()| stream_sync(who, &self.stream));
            if let Err(e) = waited {
                if !already_gone(&e) {
                    // The stream failed (a fault): its work is over, the free may proceed.
                    log::debug!(target: "raft", "{e}");
                }
            }
        }
        // SAFETY: the buffer is freed exactly once (self is consumed), on the stream it is
        // ordered on (alive: held by self until after the call).
        let status = unsafe { api.raftrs_buffer_destroy(self.ptr.as_ptr(), self.stream.cu_stream() as *mut c_void) };
        // The stream's last handle may go here (`into_inner` tells exactly one holder it is the
        // last): cudarc binds the stream's context to destroy it, so a guard puts the caller's
        // context back.
        let NativeBuffer { stream, .. } = self;
        if let Some(last) = Arc::into_inner(stream) {
            let _restore = if _keep.is_none() { ContextGuard::save(who).ok() } else { None };
            drop(last);
        }
        check(who, api, status).or_else(|e| if already_gone(&e) { Ok(()) } else { Err(e) })
    }

    /// Leaks the memory to the OS (at exit, once the exit has decided).
    pub(crate) fn leak(self) {
        std::mem::forget(self);
    }
}

// ---- cuBLAS through the resources' handle ---------------------------------------------------

/// One GEMM operand as cuBLAS (column-major) reads it: `rows × cols` (after `op`), stored
/// column-major with leading dimension `ld`, `transposed` meaning cuBLAS applies `op = T`.
pub(crate) struct Operand<'a> {
    pub(crate) buffer: &'a NativeBuffer,
    /// Rows and columns of the matrix as stored (before cuBLAS's `op`).
    pub(crate) stored_rows: usize,
    pub(crate) stored_cols: usize,
    pub(crate) ld: usize,
    pub(crate) transposed: bool,
}

impl Operand<'_> {
    /// Refuses an operand whose elements, as cuBLAS will address them, leave its buffer:
    /// element (r, c) lies at `c * ld + r`, so the last is `(cols - 1) * ld + rows - 1`.
    fn check<T>(&self, who: &'static str, name: &str) -> Result<()> {
        if self.ld < self.stored_rows.max(1) {
            return Err(Error::logic(who, format!("{name}: leading dimension {} is below its {} rows", self.ld, self.stored_rows)));
        }
        let elements = self.buffer.bytes / std::mem::size_of::<T>();
        let needed = if self.stored_rows == 0 || self.stored_cols == 0 {
            Some(0)
        } else {
            (self.stored_cols - 1).checked_mul(self.ld).and_then(|n| n.checked_add(self.stored_rows))
        };
        match needed {
            Some(n) if n <= elements => Ok(()),
            _ => Err(Error::logic(
                who,
                format!(
                    "{name}: a {}×{} matrix with leading dimension {} needs more than the {elements} elements of its array",
                    self.stored_rows, self.stored_cols, self.ld
                ),
            )),
        }
    }
}

/// Element types cuBLAS multiplies here: `f32` (cublasSgemm) and `f64` (cublasDgemm).
pub trait GemmScalar: DeviceScalar + sealed::Sealed {}
impl GemmScalar for f32 {}
impl GemmScalar for f64 {}

mod sealed {
    pub trait Sealed {
        #[allow(clippy::too_many_arguments)]
        fn status(api: &raft_sys::RaftrsShim, args: &super::GemmArgs<'_>, alpha: Self, beta: Self) -> raft_sys::raftrs_status
        where
            Self: Sized;
    }
}

#[doc(hidden)]
pub struct GemmArgs<'a> {
    res: &'a NativeResources,
    m: usize,
    n: usize,
    k: usize,
    a: &'a Operand<'a>,
    b: &'a Operand<'a>,
    c: &'a NativeBuffer,
    ldc: usize,
}

macro_rules! gemm_scalar {
    ($t:ty, $call:ident) => {
        impl sealed::Sealed for $t {
            fn status(api: &sys::RaftrsShim, g: &GemmArgs<'_>, alpha: $t, beta: $t) -> sys::raftrs_status {
                // SAFETY: every operand's extent was checked against its buffer by `gemm`, which
                // holds the borrows (C exclusively) for the call; the resources are alive for the
                // borrow.
                unsafe {
                    api.$call(
                        g.res.ptr.as_ptr(),
                        g.a.transposed as i32,
                        g.b.transposed as i32,
                        g.m as i64,
                        g.n as i64,
                        g.k as i64,
                        alpha,
                        g.a.buffer.data as *const $t,
                        g.a.ld as i64,
                        g.b.buffer.data as *const $t,
                        g.b.ld as i64,
                        beta,
                        g.c.data as *mut $t,
                        g.ldc as i64,
                    )
                }
            }
        }
    };
}
gemm_scalar!(f32, raftrs_gemm_f32);
gemm_scalar!(f64, raftrs_gemm_f64);

/// Column-major `C = alpha · op(A) · op(B) + beta · C` (C is m×n with leading dimension
/// `ldc`) through the resources' cuBLAS handle, on their stream. Every extent is checked
/// against its buffer first: a shape cuBLAS would read or write past an array is a `Logic`
/// error, never a call.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm<T: GemmScalar>(
    who: &'static str,
    res: &NativeResources,
    m: usize,
    n: usize,
    k: usize,
    alpha: T,
    a: &Operand<'_>,
    b: &Operand<'_>,
    beta: T,
    c: &mut NativeBuffer,
    ldc: usize,
) -> Result<()> {
    let (ar, ac) = if a.transposed { (a.stored_cols, a.stored_rows) } else { (a.stored_rows, a.stored_cols) };
    let (br, bc) = if b.transposed { (b.stored_cols, b.stored_rows) } else { (b.stored_rows, b.stored_cols) };
    if (ar, ac, br, bc) != (m, k, k, n) {
        return Err(Error::logic(who, format!("shapes do not chain: op(A) {ar}×{ac}, op(B) {br}×{bc}, C {m}×{n}")));
    }
    a.check::<T>(who, "A")?;
    b.check::<T>(who, "B")?;
    Operand { buffer: c, stored_rows: m, stored_cols: n, ld: ldc, transposed: false }.check::<T>(who, "C")?;
    for s in [&a.buffer.stream, &b.buffer.stream, &c.stream] {
        if s.cu_stream() != res.stream.cu_stream() {
            return Err(Error::logic(who, "A, B and C must be ordered on the resources' stream"));
        }
    }
    let api = api(who)?;
    let _keep = ContextGuard::save(who)?;
    let args = GemmArgs { res, m, n, k, a, b, c, ldc };
    check(who, api, T::status(api, &args, alpha, beta))
}

// ---- cudarc: contexts and streams ----------------------------------------------------------

/// Retains `device`'s primary context through cudarc (makes it current on this thread: the
/// caller holds a [`ContextGuard`]).
pub(crate) fn retain_primary(who: &'static str, device: usize) -> Result<Arc<CudaContext>> {
    if !driver_present() {
        return Err(no_driver(who));
    }
    CudaContext::new(device).map_err(|e| Error::driver(who, e))
}

/// A new non-blocking stream on `ctx` (cudarc binds the context: the caller holds a guard).
pub(crate) fn new_stream(who: &'static str, ctx: &Arc<CudaContext>) -> Result<Arc<CudaStream>> {
    ctx.new_stream().map_err(|e| Error::driver(who, e))
}

/// Binds `ctx` on the calling (library) thread.
pub(crate) fn bind(who: &'static str, ctx: &CudaContext) -> Result<()> {
    ctx.bind_to_thread().map_err(|e| Error::driver(who, e))
}
