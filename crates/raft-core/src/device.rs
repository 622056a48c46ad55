//! Devices: how many there are, the calling thread's current one, and each device's primary
//! context (retained once, through cudarc).
use crate::error::{Error, ErrorKind, Result};
use crate::result::{self, ContextGuard};
use cudarc::driver::{CudaContext, CudaStream};
use std::sync::{Arc, OnceLock};

/// The number of CUDA devices (`cudaGetDeviceCount`): the first number that is not a device.
/// A machine with a driver and no device has 0.
///
/// # Errors
/// `Cuda` when the runtime cannot count them, e.g. because no driver is installed or the native
/// stack could not be loaded (the message says which library and what to set).
pub fn device_count() -> Result<usize> {
    device_count_for("device_count")
}

pub(crate) fn device_count_for(who: &'static str) -> Result<usize> {
    // The count is fixed once the runtime has initialised (CUDA_VISIBLE_DEVICES is read once).
    static COUNT: OnceLock<usize> = OnceLock::new();
    if let Some(n) = COUNT.get() {
        return Ok(*n);
    }
    match result::device_count(who) {
        Ok(n) if n > 0 && !result::driver_present() => Err(Error::no_driver(who, "no CUDA driver: libcuda.so could not be loaded")),
        Ok(n) => Ok(*COUNT.get_or_init(|| n)),
        Err(e) if e.kind() == ErrorKind::Cuda && !result::driver_present() && !e.message().contains(raft_sys::SHIM_FILE) => {
            Err(Error::no_driver(who, format!("no CUDA driver: libcuda.so could not be loaded ({})", e.message())))
        }
        Err(e) => Err(e),
    }
}

/// The calling thread's current CUDA device (`cudaGetDevice`).
pub fn current_device() -> Result<usize> {
    current_device_for("current_device")
}

pub(crate) fn current_device_for(who: &'static str) -> Result<usize> {
    current_device_bound(who).map(|(device, _)| device)
}

/// The calling thread's current device, and the thread's current context when it is that
/// device's primary context, retained here (then the caller knows what the thread is bound to
/// without asking the driver again).
pub(crate) fn current_device_bound(who: &'static str) -> Result<(usize, Option<usize>)> {
    let count = device_count_for(who)?; // the clearer error when there is no driver
    if count == 0 {
        return Err(Error::new(ErrorKind::Cuda, who, "no CUDA device"));
    }
    // A thread on a primary context this library retained is on that context's device: the
    // runtime answers with the current context's device, so this skips its call (~0.1 µs of
    // every `new()`).
    if let Some((device, ctx)) = result::current_context().and_then(|ctx| Some((retained_device(ctx)?, ctx))) {
        return Ok((device, Some(ctx)));
    }
    Ok((result::current_device(who)?, None))
}

/// Primary contexts retained so far, per device (see [`context`]).
static CONTEXTS: OnceLock<Vec<OnceLock<DeviceContext>>> = OnceLock::new();

/// The device whose primary context (retained here) is `ctx`.
fn retained_device(ctx: usize) -> Option<usize> {
    CONTEXTS.get()?.iter().position(|slot| slot.get().is_some_and(|dc| dc.ctx.cu_ctx() as usize == ctx))
}

/// Checks that `device` exists: the `Logic` error `who: no device D among N` otherwise.
pub(crate) fn check_device(who: &'static str, device: usize) -> Result<usize> {
    let count = device_count_for(who)?;
    if device >= count {
        return Err(Error::logic(who, format!("no device {device} among {count}")));
    }
    Ok(count)
}

/// Whether the device supports stream-ordered memory pools (`cudaDevAttrMemoryPoolsSupported`).
pub fn memory_pools_supported(device: usize) -> Result<bool> {
    const WHO: &str = "memory_pools_supported";
    check_device(WHO, device)?;
    result::memory_pools_supported(WHO, device)
}

/// A device's primary context as cudarc knows it, with an idle stream that stays for the
/// process: cudarc synchronises the whole context (`cuCtxSynchronize`) whenever its stream count
/// goes from 0 to 1, which would otherwise happen on every `new()` after the last resources of
/// a device were released, stalling every other stream on it.
struct DeviceContext {
    ctx: Arc<CudaContext>,
    _anchor: Arc<CudaStream>,
}

/// The device's primary context as a cudarc context, retained once per process.
/// Refused once the library is closed (`raft_exit::closed`: after the exit's teardown, or in a
/// fork's child), as the shim's gate (`result::api`) is: every new resources object starts here.
pub(crate) fn context(who: &'static str, device: usize) -> Result<Arc<CudaContext>> {
    if raft_exit::closed() {
        return Err(raft_exit::refusal(who));
    }
    let count = check_device(who, device)?;
    let slots = CONTEXTS.get_or_init(|| (0..count).map(|_| OnceLock::new()).collect());
    if let Some(dc) = slots[device].get() {
        return Ok(dc.ctx.clone());
    }
    // A fork's child from here on is marked (`raft_exit::watch_forks`).
    raft_exit::watch_forks();
    // Retaining makes the context current on this thread: put the caller's back.
    let _keep = ContextGuard::save(who)?;
    let mut ctx = result::retain_primary(who, device)?;
    let anchor = result::first_stream(who, &mut ctx)?;
    // The private object that records other streams' uses of arrays (`result/foreign.rs`).
    result::foreign::make_records_context(who, device)?;
    let made: &'static DeviceContext = slots[device].get_or_init(|| DeviceContext { ctx, _anchor: anchor });
    if device == 0 {
        result::note_runtime_default(&made.ctx);
    }
    result::note_primary(who, device, &made.ctx);
    Ok(made.ctx.clone())
}

/// Whether `stream` is being captured into a CUDA graph (`cuStreamIsCapturing`). Unlike
/// cudarc's `CudaStream::capture_status`, it binds no context and leaves cudarc's recorded
/// context error where it is. What the crates above raft-core ask before queuing work that must
/// never enter a graph (a collective, cuVS's kernels).
///
/// # Errors
/// `Cuda` when the driver cannot say (a sticky error of earlier work on the context).
pub fn stream_is_capturing(stream: &CudaStream) -> Result<bool> {
    result::capturing("raft::stream_is_capturing", stream)
}

/// Runs `f` with the calling thread's stream-capture mode relaxed, then puts the mode back.
///
/// While any thread captures a stream in global mode (PyTorch's default; cudarc's
/// `begin_capture` takes the mode), the driver refuses the calls it deems unsafe on every other
/// thread in global mode (waits, event queries, `cudaFree`, `cudaMalloc`) and invalidates that
/// capture. Work that never touches the
/// capturing stream may make such calls in relaxed mode: this library's own waits and frees do,
/// and the crates above run foreign work in it (cuVS's, which allocates, frees and waits inside
/// its calls). Queue nothing in `f` on a stream that may be captured: refuse such a stream first
/// ([`stream_is_capturing`]). Without a CUDA driver `f` simply runs.
pub fn with_relaxed_capture<R>(f: impl FnOnce() -> R) -> R {
    if !result::driver_present() {
        return f();
    }
    result::relaxed(f)
}
