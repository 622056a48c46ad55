//! The result layer: one checked function per shim entry point (and per raw cudarc call this
//! crate makes), holding all of the crate's FFI `unsafe`, the context guard and the status check.
//!
//! As in cudarc's `sys` / `result` / `safe` split: above this module, the safe types
//! (`DeviceResources`, `DeviceVec`, `MemoryResource`, …) hold no `unsafe` of their own: every
//! `unsafe impl` is here, and above it there are only the `unsafe fn`s that forward a caller's
//! contract down (DLPack's imports and `order_before_stream`, `DeviceVec::as_raw`,
//! `PinnedVec::as_slice` / `as_mut_slice`, `RegisteredSlice::new` / `as_slice` /
//! `as_mut_slice`) and `with_native`'s nested use in `resources.rs` (ARCHITECTURE.md lists
//! them). Native objects are owned here by small handle types ([`NativeResources`],
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
pub(crate) mod buffer;
pub(crate) mod copy;
pub(crate) mod crew;
pub(crate) mod dlpack;
pub(crate) mod exposure;
pub(crate) mod foreign;
pub(crate) mod gemm;
pub(crate) mod lent;
pub(crate) mod mr;
pub(crate) mod peers;
pub(crate) mod registration;
pub(crate) mod staging;
pub(crate) mod stores;

// The shim's statuses are the ones `ErrorKind::from_shim_status` knows.
static_assertions::const_assert_eq!(sys::RAFTRS_STATUS_OUT_OF_MEMORY, 1);
static_assertions::const_assert_eq!(sys::RAFTRS_STATUS_CUDA, 2);
static_assertions::const_assert_eq!(sys::RAFTRS_STATUS_LOGIC, 3);
// The shim refuses to compile against another handle size; the build facts say the same.
static_assertions::const_assert_eq!(sys::RAFTRS_EXPECTED_HANDLE_SIZE as usize, sys::build_info::HANDLE_SIZE);

/// The loaded shim, or the `Cuda` error saying why it is not there. Refused once the library
/// is closed (`raft_exit::closed`: the exit's teardown has run or was skipped, or this is a
/// fork's child): a call made then (a user's exit handler registered before the library's hook
/// runs after it) would make native objects under the static destructors that follow, or touch
/// RMM's map and the CUDA runtime after theirs. One relaxed load, in place of the fork flag's.
#[inline]
pub(crate) fn api(who: &'static str) -> Result<&'static sys::RaftrsShim> {
    if raft_exit::closed() {
        return Err(raft_exit::refusal(who));
    }
    sys::shim().map_err(|e| Error::library_missing(who, e.clone()))
}

/// Turns a shim status into a result; the thread-local message is read and cleared at once.
#[inline]
fn check(who: &'static str, api: &sys::RaftrsShim, status: sys::raftrs_status) -> Result<()> {
    if status == sys::RAFTRS_STATUS_OK {
        return Ok(());
    }
    failed(who, api, status)
}

/// The error of a failed shim call (out of line: `check`'s success path stays small).
#[cold]
fn failed(who: &'static str, api: &sys::RaftrsShim, status: sys::raftrs_status) -> Result<()> {
    Err(Error::new(ErrorKind::from_shim_status(status), who, sys::take_last_error(api)))
}

/// Whether an error only says that CUDA is already shutting down (the driver deinitialised, the
/// runtime unloading): at exit the work it was about is gone with it.
pub(crate) fn already_gone(e: &Error) -> bool {
    let m = e.message();
    m.contains("CUDA_ERROR_DEINITIALIZED") || m.contains("cudaErrorCudartUnloading")
}

/// The rule for a wait that a borrow's end depends on (the caller's borrow of the memory a copy
/// uses ends when it returns), as a copy scope keeps it: a wait that failed because the context is
/// dead lets the borrow end (nothing it queued runs any more); any other failure (a capture
/// refusing it) says nothing about the copy, which may still use the memory: the process stops
/// rather than end the borrow under it.
pub(crate) fn waited_for_borrow(who: &'static str, waited: Result<()>) -> Result<()> {
    if let Err(e) = &waited {
        if !context_is_dead(e) {
            in_flight_under_borrow(who, e)?;
        }
    }
    waited
}

/// A copy that may still run while the borrow of its memory is about to end: stops the process.
#[cold]
pub(crate) fn in_flight_under_borrow(who: &'static str, e: &Error) -> Result<()> {
    raft_exit::abort_with(format_args!(
        "{who}: {e}: a copy may still use borrowed memory and could not be waited for; aborting rather than end the borrow"
    ))
}

/// Whether a failure means the context can run no work any more (a sticky fault of one of its
/// kernels, or a context or driver gone): then nothing it queued still touches memory, and a
/// borrow that waited for such work may end. Any other failed wait (a capture refusing it, a bad
/// handle) says nothing about the work, which may still run.
pub(crate) fn context_is_dead(e: &Error) -> bool {
    const DEAD: [&str; 15] = [
        // A fatal error of the device or its link (an Xid), or a context reset under the
        // process (a third party's cudaDeviceReset): no work of the context runs any more.
        "CUDA_ERROR_UNKNOWN",
        "CUDA_ERROR_NVLINK_UNCORRECTABLE",
        "CUDA_ERROR_EXTERNAL_DEVICE",
        "CUDA_ERROR_INVALID_CONTEXT",
        "CUDA_ERROR_CONTEXT_IS_DESTROYED",
        "CUDA_ERROR_ILLEGAL_ADDRESS",
        "CUDA_ERROR_LAUNCH_FAILED",
        "CUDA_ERROR_ILLEGAL_INSTRUCTION",
        "CUDA_ERROR_MISALIGNED_ADDRESS",
        "CUDA_ERROR_INVALID_ADDRESS_SPACE",
        "CUDA_ERROR_INVALID_PC",
        "CUDA_ERROR_HARDWARE_STACK_ERROR",
        "CUDA_ERROR_ASSERT",
        "CUDA_ERROR_ECC_UNCORRECTABLE",
        "CUDA_ERROR_LAUNCH_TIMEOUT",
    ];
    already_gone(e) || DEAD.iter().any(|d| e.message().contains(d))
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
    Error::no_driver(who, "no CUDA driver: libcuda.so could not be loaded")
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

thread_local! {
    /// A user's job runs on this (library) thread now: its calls put the context back as on a
    /// user's thread ([`as_caller`]).
    static IN_USER_JOB: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs a user's job on a library thread (a resources' worker) as a caller: every library call
/// in it puts the thread's context back, as on the user's own threads, so a call on objects of
/// another device leaves the rest of the job on its resources' device (the nineteenth audit:
/// the worker stayed on the other device, and a `DeviceResources::new()` later in the job, or
/// RAFT code lent there, followed it).
pub(crate) fn as_caller<R>(job: impl FnOnce() -> R) -> R {
    struct Reset(bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            IN_USER_JOB.with(|c| c.set(self.0));
        }
    }
    let _reset = Reset(IN_USER_JOB.with(|c| c.replace(true)));
    job()
}

/// Whether a library call on this thread needs no caller's context put back: a library thread,
/// outside a user's job.
fn no_caller_here() -> bool {
    raft_exit::on_library_thread() && !IN_USER_JOB.with(std::cell::Cell::get)
}

/// Puts the calling thread's current CUDA context back when dropped: a library call must not
/// switch the user's thread to another device.
pub(crate) struct ContextGuard {
    previous: Option<cusys::CUcontext>,
    /// Library threads have no caller's context to protect: they keep whichever is bound (but a
    /// user's job running on one is a caller: [`as_caller`]).
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
        if no_caller_here() {
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
        if no_caller_here() {
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

impl ContextGuard {
    /// The guard [`bind`](Self::bind) gives when the thread is on `ctx` already (nothing to put
    /// back when dropped), for a caller that has just read the thread's context and found `ctx`
    /// (nothing since could change it): no second read, except in debug builds, which check.
    pub(crate) fn bound_already(ctx: &CudaContext) -> Self {
        debug_assert_eq!(current_context(), Some(ctx.cu_ctx() as usize), "the thread left the context its caller read");
        ContextGuard { previous: Some(ctx.cu_ctx()), restore: false, switched: false, bound: 0 }
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

/// A wait for `stream` that the caller asked for (`DeviceResources::sync`, a DLPack export's
/// `synchronize`): refused (`Logic`) while the stream is being captured into a CUDA graph, where
/// the driver would refuse it and invalidate the capture.
pub(crate) fn requested_sync(who: &'static str, stream: &CudaStream) -> Result<()> {
    refuse_captured_wait(who, stream)?;
    stream_sync(who, stream)
}

/// The refusal of a requested wait (`requested_sync`, RAFT's `sync_stream`) on a stream being
/// captured into a CUDA graph.
pub(crate) fn refuse_captured_wait(who: &'static str, stream: &CudaStream) -> Result<()> {
    if capturing(who, stream).unwrap_or(false) {
        return Err(Error::logic(
            who,
            "the stream is being captured into a CUDA graph: a wait for it is refused (the driver would invalidate the \
             capture); wait before the capture begins or after it ends",
        ));
    }
    Ok(())
}

/// Runs `wait` with the calling thread's stream-capture mode set to relaxed
/// (`cuThreadExchangeStreamCaptureMode`), then puts the thread's own mode back. The waits that
/// end a borrow of memory a copy uses must not be refused: while this thread captures a stream
/// in global or thread-local mode, or another thread captures one in global mode, the driver
/// otherwise refuses them at once (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`) with the copy still
/// running, and also invalidates this thread's capture (measured on the H200 by this session's
/// second review). Relaxed, the wait runs and the capture stays valid.
pub(crate) fn relaxed<R>(wait: impl FnOnce() -> R) -> R {
    /// The thread's own mode, put back when dropped: also when `wait` unwinds (a panic caught
    /// further up must not leave the thread relaxed).
    struct Restore(Option<cusys::CUstreamCaptureMode>);
    impl Drop for Restore {
        fn drop(&mut self) {
            if let Some(mut mode) = self.0.take() {
                // SAFETY: exchanges the calling thread's capture mode through a pointer to a
                // local; needs no context. Puts back the mode the first exchange returned.
                unsafe { cusys::cuThreadExchangeStreamCaptureMode(&mut mode) };
            }
        }
    }
    let mut mode = cusys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    // SAFETY: as in `Restore`.
    let swapped = unsafe { cusys::cuThreadExchangeStreamCaptureMode(&mut mode) } == cusys::CUresult::CUDA_SUCCESS;
    let _restore = Restore(swapped.then_some(mode));
    wait()
}

/// Whether `stream` is being captured into a CUDA graph (`cuStreamIsCapturing`): binds no
/// context and leaves cudarc's recorded context error alone (cudarc's `capture_status` does both).
pub(crate) fn capturing(who: &'static str, stream: &CudaStream) -> Result<bool> {
    // SAFETY: the stream is alive for the borrow.
    unsafe { capturing_handle(who, stream.cu_stream()) }
}

/// [`capturing`] for a raw stream handle (1 and 2: the legacy and per-thread default streams of
/// the thread's current context).
///
/// # Safety
/// `stream` is a live stream (or 1 or 2) for the duration of the call.
pub(crate) unsafe fn capturing_handle(who: &'static str, stream: cusys::CUstream) -> Result<bool> {
    let mut status = cusys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: the stream is live (the caller's contract); the call writes one status and needs
    // no current context for a stream of its own (the default streams, 1 and 2, are the current
    // context's: the caller binds the one it means).
    let rc = unsafe { cusys::cuStreamIsCapturing(stream, &mut status) };
    if rc != cusys::CUresult::CUDA_SUCCESS {
        return Err(Error::driver(who, cudarc::driver::DriverError(rc)));
    }
    Ok(status != cusys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}

/// After work was queued on `stream`: whether a capture began meanwhile (on another thread), which
/// may have taken the work into its graph. A failed query (a sticky error of earlier work) is no
/// capture: the work's own result reports it.
pub(crate) fn captured_meanwhile(stream: &CudaStream) -> bool {
    capturing("captured_meanwhile", stream).unwrap_or(false)
}

/// How long a release thread waits for a capture of a stream to end before it keeps what the
/// stream's work may use for the process's life instead ([`capture_ended`]): captures that build
/// a graph of queued work usually end within milliseconds.
const CAPTURE_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Before something the work on `stream` may use is freed or destroyed after a wait for that
/// work: whether the stream is free of any capture. A capturing stream cannot be waited for (the
/// driver refuses, and invalidates the capture), and work queued before the capture began may
/// still run, so the caller keeps the thing (leaks it, for the process's life) when this says
/// `false`. A library thread (a release thread) waits for the capture to end, [`CAPTURE_WAIT`]
/// at most; any other thread, and a user's job on a worker, asks once (it may be the one
/// capturing: it would wait for itself).
/// The exit's decision ends the wait. A failed query (a dead context) is no capture: the wait's
/// own failure then says so.
pub(crate) fn capture_ended(who: &'static str, stream: &CudaStream) -> bool {
    // A user's job on a worker is a caller too: it may be the one capturing.
    let wait = if no_caller_here() { CAPTURE_WAIT } else { std::time::Duration::ZERO };
    let give_up = std::time::Instant::now() + wait;
    while capturing(who, stream).unwrap_or(false) {
        if std::time::Instant::now() >= give_up || !raft_exit::native_release_allowed() {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    true
}

/// Refuses a copy (with host memory, or between device arrays) on a stream being captured into a
/// CUDA graph (`cuStreamBeginCapture`, e.g. cudarc's `begin_capture` on the resources' stream):
/// the copy would be recorded into the graph rather than run, and run at each launch of the
/// graph, after the memory's borrow (or the array) has ended (a wait on the stream or on an
/// event recorded during the capture waits for nothing). Each stream whose work the copy joins
/// is asked.
pub(crate) fn refuse_capture<'s>(who: &'static str, streams: impl IntoIterator<Item = &'s CudaStream>) -> Result<()> {
    for stream in streams {
        if capturing(who, stream)? {
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
    // Relaxed, as the wait after it: another thread's capture in global mode would otherwise
    // make the driver refuse the query (and invalidate that capture).
    // SAFETY: the stream is alive for the borrow; a query needs no current context.
    match relaxed(|| unsafe { cusys::cuStreamQuery(stream.cu_stream()) }) {
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

/// Destroys the library handles that released resources of `device` left to be reused
/// (`raftrs_handles_trim`); how many. For the out-of-memory path only, on a thread of its own
/// (`release::drain_device`): each destroy synchronises the device. 0 when the shim is missing
/// or refuses (no such device).
pub(crate) fn trim_kept_handles(device: usize) -> usize {
    const WHO: &str = "the out-of-memory retry";
    // Never once the exit has decided: the static destructors may be running (as every destroy).
    if !raft_exit::native_release_allowed() {
        return 0;
    }
    let Ok(api) = api(WHO) else { return 0 };
    let mut destroyed = 0;
    // SAFETY: writes one int through a valid pointer; the shim refuses a device that does not
    // exist, and destroys only handles no resources object holds (they were let go).
    match check(WHO, api, unsafe { api.raftrs_handles_trim(device as i32, &mut destroyed) }) {
        Ok(()) => usize::try_from(destroyed).unwrap_or(0),
        Err(_) => 0,
    }
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

// ---- raft::device_resources ----------------------------------------------------------------

/// Which handle of RAFT's (`RAFTRS_HANDLE_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HandleCode(pub(crate) i32);

/// The shim's `raft::device_resources`, with the stream it was built on: the stream lives at
/// least as long as the native object (it is dropped after it, in [`destroy`](Self::destroy)).
pub(crate) struct NativeResources {
    /// Whether a capture may begin on the stream (`exposure.rs`); first, so that it leaves the
    /// registry before the stream can be destroyed however the object goes.
    capture: exposure::Registration,
    ptr: NonNull<sys::raftrs_resources>,
    stream: Arc<CudaStream>,
    device: usize,
    /// Lent to RAFT or cuVS code at least once (`raft_resources`): counted in
    /// `lent::count_lent_to_raft` until destroyed.
    lent: std::sync::atomic::AtomicBool,
}

// SAFETY: raft::device_resources may be used from any thread: RAFT makes its lazy resources
// (the handles, the workspace) under the object's own mutex (`raft::resources::get_resource`
// locks it). Destruction takes `self` by value, so no other reference can exist then.
unsafe impl Send for NativeResources {}
// SAFETY: shared use from several threads at once: RAFT's lookups lock as above. The one state
// written through `&self` is the shared cuBLAS handle's stream and pointer mode, set before each
// of this library's GEMMs (the shim's `raftrs_gemm_f32` / `_f64`, `result::gemm`'s f16 / bf16)
// and by RAFT's own calls under a lend; cuBLAS allows one handle to be used from several threads
// at once (its documentation's thread-safety section), and every such writer stores the same
// values (the resources' own stream, host pointer mode), so no GEMM runs with another's
// settings. Changing them through the raw handle is an `unsafe` use bound by
// `DeviceResources::handle`'s documented contract (leave them as they are). (The twentieth
// audit, helper 95: this comment said "only reads", which the GEMMs' settings contradicted.)
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
        Ok(NativeResources { capture: exposure::register(&stream), ptr, stream, device, lent: std::sync::atomic::AtomicBool::new(false) })
    }

    /// The stream, for this library's own calls on it. Where its handle leaves the library
    /// (a public getter, a lend, a handle), the caller raises [`capture_flag`](Self::capture_flag)
    /// first (`exposure.rs`).
    pub(crate) fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Whether a capture may begin on the stream (see `exposure.rs`).
    pub(crate) fn capture_flag(&self) -> &Arc<exposure::CaptureFlag> {
        self.capture.flag()
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
        // Before RAFT sees the object: from here on its code may hold references into the
        // device's RMM map entry, which is then not replaced (`lent::count_lent_to_raft`).
        lent::count_lent_to_raft(self.device, &self.lent);
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
    ///
    /// A stream that cannot be drained because it is being captured into a CUDA graph (or whose
    /// drain failed for any reason but a dead context) keeps everything: RAFT's object, its
    /// handles' workspaces and the stream are left to the OS (`Logic`), as a block freed on a
    /// capturing stream is; work queued before the capture may still use them.
    pub(crate) fn destroy(self, who: &'static str, used: bool) -> Result<()> {
        let api = api(who)?;
        // Asked before the drain, whose query and wait the driver refuses on a capturing stream
        // (invalidating the capture); a release thread waits for the capture to end a while.
        if used && !capture_ended(who, &self.stream) {
            self.leak();
            return Err(Error::logic(
                who,
                "the stream is being captured into a CUDA graph: the resources' native objects (RAFT's handles and \
                 their workspaces, the stream) are not destroyed, as work queued before the capture may still use \
                 them, and stay until the process ends; release resources before a capture of their stream begins \
                 or after it ends",
            ));
        }
        // The stream's own context bound for the whole release (a release thread otherwise
        // keeps whichever context its last release left, maybe another device's, or none); the
        // shim and cudarc's stream drop below both leave it current.
        let keep = ContextGuard::bind(who, self.stream.context());
        // Drained whether or not the context could be bound (draining needs none): RAFT's
        // handles are destroyed only after the stream's work.
        let drain = if used { stream_drain(who, &self.stream) } else { Ok(()) };
        if let Err(e) = &drain {
            if !already_gone(e) && !context_is_dead(e) {
                // A capture begun since the question (or another failed wait) says nothing about
                // the work still queued: kept, as above.
                drop(keep);
                self.leak();
                return drain;
            }
        }
        let drained = drain.and(keep.as_ref().map(|_| ()).map_err(Clone::clone));
        // SAFETY: `ptr` came from raftrs_resources_create and is destroyed exactly once (self is
        // consumed); its stream is still alive (dropped just below, after it).
        let destroyed = check(who, api, unsafe { api.raftrs_resources_destroy(self.ptr.as_ptr()) });
        if self.lent.load(Ordering::Acquire) {
            lent::count_out_lent_to_raft(self.device);
        }
        let ctx = self.stream.context().clone();
        drop(self.capture); // out of the registry (its flag raised) before the stream can go
        drop(self.stream);
        let recorded = take_recorded(who, &ctx);
        let tolerate = |r: Result<()>| r.or_else(|e| if already_gone(&e) { Ok(()) } else { Err(e) });
        tolerate(drained).and(tolerate(destroyed)).and(tolerate(recorded))
    }

    /// Leaks the native object and its stream to the OS: no CUDA call (at exit, once the exit
    /// has decided).
    pub(crate) fn leak(self) {
        // Never used again (the exit has decided, or nothing can finish the release): what
        // RAFT code holds of the map's entry is never called.
        if self.lent.load(Ordering::Acquire) {
            lent::count_out_lent_to_raft(self.device);
        }
        std::mem::forget(self);
    }
}

/// The default-resource rule on `device` (see `raftrs_mr_install_default`): whether this call
/// installed the async pool.
pub(crate) fn install_default(who: &'static str, device: usize) -> Result<bool> {
    let api = api(who)?;
    let _keep = ContextGuard::save(who)?;
    // Not while RAFT code may hold a reference into the map's entry (`lent::count_lent_to_raft`):
    // the entry then keeps what it holds.
    lent::unless_lent_to_raft(device, || {
        let mut installed = 0;
        // SAFETY: writes one int; the shim checks the device.
        check(who, api, unsafe { api.raftrs_mr_install_default(device as i32, &mut installed) })?;
        Ok(installed != 0)
    })
}

/// Element types that may live in device memory: `Copy`, nothing to drop, every bit pattern a
/// value (so bytes copied from the device are always a valid `T`), no padding (so every byte a
/// copy reads is initialised), aligned to at most 256 bytes (what RMM's allocations are aligned
/// to; arrays of a type aligned to more are refused with `Logic`).
///
/// # Safety
/// Implement only for types where any bit pattern is a valid value, which have no padding
/// bytes (as bytemuck's `Pod` requires), which own no resources, and whose alignment is at most
/// 256 bytes.
pub unsafe trait DeviceScalar: Copy + Default + Send + Sync + 'static {}

macro_rules! scalars {
    ($($t:ty),*) => {$(
        // SAFETY: a primitive number: any bit pattern is a value, nothing to drop.
        unsafe impl DeviceScalar for $t {}
    )*};
}
scalars!(f32, f64, i8, i16, i32, i64, u8, u16, u32, u64);
// SAFETY: `half::f16` and `half::bf16` are `#[repr(transparent)]` over a `u16`: every bit
// pattern is a value (NaNs included), no padding, nothing to drop.
unsafe impl DeviceScalar for half::f16 {}
// SAFETY: as above.
unsafe impl DeviceScalar for half::bf16 {}

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

/// The first stream of `ctx`, a context object the caller has just made with
/// [`retain_primary`] and holds alone: cudarc's `new_stream` synchronises the whole context
/// (`cuCtxSynchronize`) when an object's stream count goes from 0 to 1, so that work the
/// object queued on the legacy stream while untracked is done before streams share its arrays.
/// A fresh object has queued nothing, so the wait orders nothing of it; it would only wait for
/// every other library's work on the device, and the driver refuses it (in every capture mode)
/// while any stream of the context is being captured. Made here with tracking off for the one
/// call, which skips only that wait; an object someone else holds takes cudarc's path.
pub(crate) fn first_stream(who: &'static str, ctx: &mut Arc<CudaContext>) -> Result<Arc<CudaStream>> {
    if Arc::get_mut(ctx).is_none() || ctx.is_in_multi_stream_mode() || !ctx.is_event_tracking() {
        return new_stream(who, ctx);
    }
    // SAFETY: cudarc's contract for switching tracking is about the `CudaSlice`s made while it
    // is off (they record no uses). `ctx` is held by this caller alone (`get_mut`: no other
    // strong or weak handle), and the `&mut` borrow keeps it so until this returns: no slice
    // of it is made between the two switches, and none exists from before (nobody else ever
    // held the object). Tracking is on again before the object is shared.
    unsafe { ctx.disable_event_tracking() };
    let made = ctx.new_stream();
    // SAFETY: as above: no slice of `ctx` was made while tracking was off.
    unsafe { ctx.enable_event_tracking() };
    made.map_err(|e| Error::driver(who, e))
}

/// Runs `f`, catching a panic: `Some` of what it returned, `None` when it panicked. A payload
/// of `panic!` (a `String` or a `&str`, whose drop cannot panic) is dropped; any other is
/// forgotten: its own `Drop` may panic (`panic_any` of such a value), which from inside an
/// `extern "C"` function aborts the process and ends a library thread's loop (the fourteenth
/// audit; the thirteenth found it in `job.rs`). Forgetting leaks that one value.
pub(crate) fn catch_forgetting<R>(f: impl FnOnce() -> R) -> Option<R> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => Some(r),
        Err(payload) => {
            if payload.is::<String>() || payload.is::<&'static str>() {
                drop(payload);
            } else {
                std::mem::forget(payload);
            }
            None
        }
    }
}

/// Binds `ctx` on the calling thread, when it is not current already.
///
/// Not cudarc's `bind_to_thread`: its first step takes (and clears) the error code stored in
/// the object, which cudarc's own drops store and which any holder of the object can store with
/// the safe `record_err` (the library's context object is reachable from `context()`,
/// `stream().context()`). Returned from here, such a code read as the failure of the library's
/// next call: a stored `CUDA_ERROR_ILLEGAL_ADDRESS` said "the context is dead", and the callers
/// that may then skip a wait or an unregistration (nothing of a dead context runs any more) did,
/// handing page-locked memory back to safe code (the fourteenth audit). Only the driver's
/// answers to these two calls fail this function.
pub(crate) fn bind(who: &'static str, ctx: &CudaContext) -> Result<()> {
    let current = cu::ctx::get_current().map_err(|e| Error::driver(who, e))?;
    if current != Some(ctx.cu_ctx()) {
        // SAFETY: `ctx` is a context cudarc retained for as long as the borrowed `CudaContext`
        // lives (the caller holds it across its use of the binding).
        unsafe { cu::ctx::set_current(ctx.cu_ctx()) }.map_err(|e| Error::driver(who, e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_dead_context_lets_a_failed_wait_end_a_borrow() {
        let e = |m: &str| Error::new(ErrorKind::Cuda, "t", m);
        for dead in [
            "CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access",
            "CUDA_ERROR_DEINITIALIZED: x",
            "cudaErrorCudartUnloading",
            "CUDA_ERROR_UNKNOWN: unknown error",
            "CUDA_ERROR_INVALID_CONTEXT: invalid device context",
        ] {
            assert!(context_is_dead(&e(dead)), "{dead}");
        }
        for alive in [
            "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: operation not permitted when stream is capturing",
            "CUDA_ERROR_CAPTURED_EVENT: x",
            "CUDA_ERROR_INVALID_HANDLE: x",
            "CUDA_ERROR_INVALID_VALUE: x",
        ] {
            assert!(!context_is_dead(&e(alive)), "{alive}");
        }
    }
}
