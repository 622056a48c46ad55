//! Devices: how many there are, the calling thread's current one, each device's primary
//! context (retained once, through cudarc), and a guard that puts the thread's CUDA context back.
use crate::error::{Error, ErrorKind, Result};
use crate::ffi::check;
use cudarc::driver::{result as cu, sys as cusys, CudaContext};
use raft_sys as sys;
use std::sync::{Arc, OnceLock};

/// Whether libcuda can be loaded. cudarc, loading the driver at run time, panics on its first
/// call when it cannot: every cudarc call of this crate is behind this answer.
pub(crate) fn driver_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: is_culib_present only tries to dlopen libcuda under its usual names.
    *PRESENT.get_or_init(|| unsafe { cusys::is_culib_present() })
}

/// A `Cuda` error raised because no driver is there, keeping the runtime's own words.
fn no_driver(who: &'static str, e: Error) -> Error {
    Error::new(ErrorKind::Cuda, who, format!("no CUDA driver: libcuda.so could not be loaded ({})", e.message()))
}

/// The number of CUDA devices (`cudaGetDeviceCount`): the first number that is not a device.
///
/// # Errors
/// `Cuda` when the runtime cannot count them, e.g. because no driver is installed.
pub fn device_count() -> Result<usize> {
    device_count_for("device_count")
}

pub(crate) fn device_count_for(who: &'static str) -> Result<usize> {
    // The count is fixed once the runtime has initialised (CUDA_VISIBLE_DEVICES is read once).
    static COUNT: OnceLock<usize> = OnceLock::new();
    if let Some(n) = COUNT.get() {
        return Ok(*n);
    }
    let mut n = 0i32;
    // SAFETY: writes one int through a valid pointer.
    let r = check(who, unsafe { sys::raftrs_device_count(&mut n) });
    match r {
        Ok(()) if n > 0 && !driver_present() => Err(Error::new(ErrorKind::Cuda, who, "libcuda.so could not be loaded")),
        Ok(()) => Ok(*COUNT.get_or_init(|| n as usize)),
        Err(e) if !driver_present() => Err(no_driver(who, e)),
        Err(e) => Err(e),
    }
}

/// The calling thread's current CUDA device (`cudaGetDevice`).
pub fn current_device() -> Result<usize> {
    current_device_for("current_device")
}

pub(crate) fn current_device_for(who: &'static str) -> Result<usize> {
    device_count_for(who)?; // the clearer error when there is no driver
    let mut d = 0i32;
    // SAFETY: writes one int through a valid pointer.
    check(who, unsafe { sys::raftrs_current_device(&mut d) })?;
    Ok(d as usize)
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
    let mut v = 0i32;
    // SAFETY: writes one int through a valid pointer; the device exists.
    check(WHO, unsafe { sys::raftrs_device_memory_pools_supported(device as i32, &mut v) })?;
    Ok(v != 0)
}

/// A device's primary context as cudarc knows it, with an idle stream that stays for the
/// process: cudarc synchronises the whole context (`cuCtxSynchronize`) whenever its stream count
/// goes from 0 to 1, which would otherwise happen on every `new()` after the last resources of
/// a device were released, stalling every other stream on it.
struct DeviceContext {
    ctx: Arc<CudaContext>,
    _anchor: Arc<cudarc::driver::CudaStream>,
}

/// The device's primary context as a cudarc context, retained once per process.
pub(crate) fn context(who: &'static str, device: usize) -> Result<Arc<CudaContext>> {
    static CONTEXTS: OnceLock<Vec<OnceLock<DeviceContext>>> = OnceLock::new();
    let count = check_device(who, device)?;
    let slots = CONTEXTS.get_or_init(|| (0..count).map(|_| OnceLock::new()).collect());
    if let Some(dc) = slots[device].get() {
        return Ok(dc.ctx.clone());
    }
    // CudaContext::new makes the context current on this thread: put the caller's back.
    let _keep = ContextGuard::save(who)?;
    let ctx = CudaContext::new(device).map_err(|e| Error::driver(who, e))?;
    let anchor = ctx.new_stream().map_err(|e| Error::driver(who, e))?;
    let made = slots[device].get_or_init(|| DeviceContext { ctx, _anchor: anchor }).ctx.clone();
    if device == 0 {
        RUNTIME_DEFAULT.store(made.cu_ctx() as usize, std::sync::atomic::Ordering::Release);
    }
    Ok(made)
}

/// Device 0's primary context: what the CUDA runtime binds to a thread that has none on its
/// first call. Leaving it bound on such a thread changes nothing the runtime would not do.
static RUNTIME_DEFAULT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Puts the calling thread's current CUDA context back when dropped: a library call must not
/// switch the user's thread to another device.
pub(crate) struct ContextGuard {
    previous: Option<cusys::CUcontext>,
    /// Library threads have no caller's context to protect: they keep whichever is bound.
    restore: bool,
}

impl ContextGuard {
    pub(crate) fn save(who: &'static str) -> Result<Self> {
        if !driver_present() {
            return Err(Error::new(ErrorKind::Cuda, who, "no CUDA driver: libcuda.so could not be loaded"));
        }
        static INIT: OnceLock<std::result::Result<(), cudarc::driver::DriverError>> = OnceLock::new();
        (*INIT.get_or_init(cu::init)).map_err(|e| Error::driver(who, e))?;
        if raft_exit::on_library_thread() {
            return Ok(ContextGuard { previous: None, restore: false });
        }
        let previous = cu::ctx::get_current().map_err(|e| Error::driver(who, e))?;
        Ok(ContextGuard { previous, restore: true })
    }
}

impl Drop for ContextGuard {
    fn drop(&mut self) {
        if !self.restore {
            return;
        }
        let now = cu::ctx::get_current().ok().flatten();
        let runtime_default = RUNTIME_DEFAULT.load(std::sync::atomic::Ordering::Acquire);
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
