//! cuVS's resources handle (`cuvsResources_t`) borrowed from a [`DeviceResources`]: the very
//! `raft::resources` object behind them, lent, never given up: the lend and the calls on a lent
//! handle (the handle's type is in `lent.rs`).
use crate::lent::CuvsResources;
use crate::result;
use cudarc::driver::CudaStream;
use raft_core::{DeviceResources, Error, ErrorKind, Result};
use std::sync::Arc;

impl CuvsResources<'_> {
    /// The stream cuVS runs on, as cudarc's `CudaStream`: the lending resources' own (the
    /// same shape as `DeviceResources::stream`), after asking cuVS (`cuvsStreamGet`) that it is.
    ///
    /// # Errors
    /// `Cuda` when cuVS fails; `Generic` if cuVS reported another stream (never: nothing here
    /// moves lent resources to another stream).
    pub fn stream(&self) -> Result<Arc<CudaStream>> {
        const WHO: &str = "CuvsResources::stream";
        let seen = result::stream_get(WHO, self)?;
        let ours = self.stream.cu_stream() as usize;
        if seen != ours {
            return Err(Error::new(
                ErrorKind::Generic,
                WHO,
                format!("cuVS runs on stream {seen:#x}, not the lending resources' {ours:#x}"),
            ));
        }
        Ok(self.stream.clone())
    }

    /// The device cuVS sees (`cuvsDeviceIdGet`).
    pub fn device_id(&self) -> Result<i32> {
        result::device_id("CuvsResources::device_id", self)
    }

    /// Waits for the stream (`cuvsStreamSync`: RAFT's `sync_stream`).
    ///
    /// # Errors
    /// `Logic` while the stream is being captured into a CUDA graph (the driver would refuse the
    /// wait and invalidate the capture); `Cuda` when cuVS fails.
    pub fn sync(&self) -> Result<()> {
        const WHO: &str = "CuvsResources::sync";
        if raft_core::stream_is_capturing(self.stream).unwrap_or(false) {
            return Err(raft_core::Error::logic(
                WHO,
                "the stream is being captured into a CUDA graph: a wait for it is refused (the driver would invalidate the \
                 capture); wait before the capture begins or after it ends",
            ));
        }
        result::stream_sync(WHO, self)
    }
}

/// Runs `f` with `res` lent to cuVS as a [`CuvsResources`]: cuVS's C API then works on these very
/// resources (their stream, handles and memory resource) for the closure's duration. The
/// closure's `Result` is this call's: `?` inside, one `?` outside.
///
/// ```no_run
/// # fn main() -> raft_core::Result<()> {
/// let res = raft_core::DeviceResources::new()?;
/// let (stream, device) = raft_cuvs::with_cuvs(&res, |cuvs| Ok((cuvs.stream()?, cuvs.device_id()?)))?;
/// assert_eq!(stream.cu_stream(), res.stream()?.cu_stream());
/// # let _ = device; Ok(()) }
/// ```
///
/// cuVS is loaded first (at the first call in the process, see [`crate::load`]): a missing
/// `libcuvs_c.so` is this call's `Cuda` error, before `f` runs.
///
/// `f` runs with the resources' device current on the thread (its primary context, which cuVS's
/// and RAFT's runtime calls work on), and the thread's own context (or none) is current again
/// after the call.
///
/// Inside `f`, calls on `res` from the same thread (`res.stream()`, `res.sync()`,
/// `DeviceVec::new(&res, ..)`) are nested uses of the lend and go ahead; `res.release()` there is
/// refused (`Logic`: it would wait for the lend). Uses of `res` that `f` hands to other threads
/// are refused (`Logic`, released) once a release on another thread has begun to take the
/// resources, rather than waiting for the lend that waits for them.
///
/// A capture of the resources' stream into a CUDA graph must not be open when this is called
/// (`Logic`: cuVS's work would run at each launch of the graph, after the index and the arrays
/// may be gone), nor be begun by `f` and left open: the process stops then, as it does for a copy,
/// however `f` ends (its error or its panic included).
/// `f` runs in the thread's own capture mode: while another thread captures a stream in global
/// mode, the driver refuses what cuVS's calls in `f` allocate, free or wait for through a
/// resource that is not stream-ordered (`cudaMalloc`), and that capture is invalidated. Wrap
/// such calls in [`raft_core::with_relaxed_capture`] when that can happen (and begin no capture
/// there). This crate's own calls (`brute_force_knn`, the indexes' builds, searches and drops)
/// run relaxed.
///
/// The lent [`CuvsResources`] cannot leave `f`:
///
/// ```compile_fail,E0521
/// # fn f(res: &raft_core::DeviceResources) {
/// let mut out = None;
/// let _ = raft_cuvs::with_cuvs(res, |cuvs| {
///     out = Some(cuvs); // error: borrowed data escapes the closure
///     Ok(())
/// });
/// # drop(out); }
/// ```
///
/// # Errors
/// `Cuda` when cuVS cannot be loaded; `Logic` on released resources or a capturing stream; else
/// the closure's error.
pub fn with_cuvs<R>(res: &DeviceResources, f: impl FnOnce(CuvsResources<'_>) -> Result<R>) -> Result<R> {
    const WHO: &str = "raft_cuvs::with_cuvs";
    result::api(WHO)?;
    lend_in(WHO, res, false, f)
}

/// Lends `res` to the crate's own cuVS calls in `f`, with the thread's capture mode relaxed (see
/// [`lend_in`]).
pub(crate) fn lend<R>(who: &'static str, res: &DeviceResources, f: impl FnOnce(CuvsResources<'_>) -> Result<R>) -> Result<R> {
    lend_in(who, res, true, f)
}

/// Lends `res` to `f` and flattens its result: [`with_cuvs`] (the user's closure, in the thread's
/// own capture mode) and the crate's own calls (`relaxed`: cuVS allocates, frees and waits inside
/// its calls, which another thread's global capture would otherwise see refused, the frees
/// leaking, and be invalidated by; the twelfth audit). The lend's own failure (released
/// resources) is `who`'s; the closure's errors are its own.
fn lend_in<R>(who: &'static str, res: &DeviceResources, relaxed: bool, f: impl FnOnce(CuvsResources<'_>) -> Result<R>) -> Result<R> {
    let device = res.device();
    // Taken before the lend: inside it, calls that take the resources may wait on a release.
    let stream = res.stream().map_err(|e| e.with_who(who))?;
    refuse_capture(who, &stream)?;
    // cuVS and RAFT call the runtime, which works on the thread's current device (and, on a
    // thread with none, makes device 0's primary context current for good): the resources'
    // device for the lend, and the thread's own context back after it (the sixteenth audit:
    // `CuvsResources::sync` and a `with_cuvs` closure ran on whatever was current).
    let _bound = crate::result::bind_device(who, res)?;
    // Checked on every way out of the lend, an error or a panic of `f` included (declared after
    // `_bound`, so it runs with the device still bound).
    let _checked = CaptureCheck { who, stream: &stream };
    // The stream itself was refused above if captured; the mode only decides what the driver
    // refuses beside other threads' captures.
    let run = || res.with_raft_resources(|lend| f(CuvsResources::lent(lend, device, &stream)));
    if relaxed { raft_core::with_relaxed_capture(run) } else { run() }.map_err(|e| e.with_who(who))?
}

/// Stops the process when a capture of the lent stream is open as the lend ends, however it
/// ends: a capture begun meanwhile (by `f`, or on another thread) may have taken cuVS's kernels
/// into its graph, which would then use the index and the arrays at each launch, after they may
/// be gone; raft-core's copies stop the process so too. A closure that began one and then
/// failed or panicked has queued the same work (the check ran only after a success before).
struct CaptureCheck<'a> {
    who: &'static str,
    stream: &'a Arc<CudaStream>,
}

impl Drop for CaptureCheck<'_> {
    fn drop(&mut self) {
        if raft_core::stream_is_capturing(self.stream).unwrap_or(false) {
            raft_exit::abort_with(format_args!(
                "{}: a CUDA graph capture began on the resources' stream while cuVS worked on it; aborting",
                self.who
            ));
        }
    }
}

/// cuVS's work queued on a stream being captured into a CUDA graph would run at each launch of
/// the graph, after the index and the arrays may be gone: refused (`Logic`) before the lend, as
/// raft-core refuses copies and GEMMs.
fn refuse_capture(who: &'static str, stream: &CudaStream) -> Result<()> {
    match raft_core::stream_is_capturing(stream) {
        Ok(false) => Ok(()),
        Ok(true) => Err(raft_core::Error::logic(
            who,
            "the resources' stream is being captured into a CUDA graph: the graph would run cuVS's work at each launch, \
             after the index and the arrays may be gone; call it before the capture begins or after it ends",
        )),
        Err(e) => Err(e.with_who(who)),
    }
}

/// Destroys a cuVS object that holds device memory of `res`'s (an index, a padded copy): while
/// `res` is lent, so that a release waits for it, with their device bound. Once the exit has
/// decided it makes no call (the object is leaked to the OS, as raft-core leaks at exit); on
/// released resources it is leaked too, since its buffers were ordered on their stream, which is
/// gone, and the `Logic` error says so.
///
/// cuVS frees the object's memory on the resources' stream: while that stream is being captured
/// into a CUDA graph the frees would become the graph's (through the async pool a free node run
/// at each launch; through an RMM pool its stream's event recorded into the graph, which a
/// later allocation on another stream waits for and so joins the capture). The object is then
/// leaked (`Logic`), as raft-core leaks an array dropped on a capturing stream; a capture begun
/// during the destruction stops the process, as a lend's does.
pub(crate) fn destroy_lent(who: &'static str, res: &DeviceResources, destroy: impl FnOnce() -> Result<()>) -> Result<()> {
    if !raft_exit::native_release_allowed() {
        return Ok(());
    }
    if res.is_released() {
        return Err(released_first(who, res));
    }
    let _bound = result::bind_device(who, res)?;
    let stream = res.stream().map_err(|_| released_first(who, res))?;
    match raft_core::stream_is_capturing(&stream) {
        Ok(false) => {}
        Ok(true) => {
            return Err(raft_core::Error::logic(
                who,
                "the resources' stream is being captured into a CUDA graph: cuVS would free the index's memory into the graph; \
                 it is leaked (drop the index before the capture begins or after it ends)",
            ))
        }
        // Not known to be free of a capture: leaked rather than freed into one.
        Err(e) => return Err(e.with_who(who)),
    }
    // Relaxed, as a lend is: cuVS's frees (`cudaFree` through `cuda_memory_resource`) are
    // otherwise refused during another thread's global capture, and RMM drops the refusal.
    let out = raft_core::with_relaxed_capture(|| res.with_raft_resources(|_| destroy())).map_err(|_| released_first(who, res))?;
    if raft_core::stream_is_capturing(&stream).unwrap_or(false) {
        raft_exit::abort_with(format_args!(
            "{who}: a CUDA graph capture began on the resources' stream while cuVS freed an index on it; aborting"
        ));
    }
    out
}

fn released_first(who: &'static str, res: &DeviceResources) -> raft_core::Error {
    raft_core::Error::logic(
        who,
        format!("the resources on device {} were released before this index: its device memory is leaked", res.device()),
    )
}
