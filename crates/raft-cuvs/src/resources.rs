//! cuVS's resources handle (`cuvsResources_t`) borrowed from a [`DeviceResources`]: the very
//! `raft::resources` object behind them, lent, never given up.
use crate::result;
use raft_core::{DeviceResources, RaftResourcesPtr, Result};

/// A `cuvsResources_t` lent by a [`DeviceResources`] for the duration of [`with_cuvs`]: cuVS
/// works on those resources themselves (their stream, their cuBLAS and other handles, RMM's
/// memory resource of their device), and nothing is copied.
///
/// cuVS's `cuvsResources_t` is a `raft::resources*` as an integer (`cuvsResourcesCreate` does
/// `new raft::resources{}` and every C function casts the handle back; cuVS 26.08's
/// `c/src/core/c_api.cpp`): this handle is the pointer to the `raft::device_resources` the
/// [`DeviceResources`] owns. It cannot outlive the lend (it borrows it, and is neither `Send` nor
/// `'static`), the resources cannot be released meanwhile (a release from another thread waits
/// for the lend to end), and nothing ever calls `cuvsResourcesDestroy` on it.
///
/// For cuVS calls of your own, [`as_raw`](Self::as_raw) gives the handle; passing it to cuVS is
/// your `unsafe`, with this contract: never `cuvsResourcesDestroy` it (the resources are not
/// cuVS's), never `cuvsStreamSet` it (it would move these resources to another stream, behind
/// raft-rs's back: their arrays, syncs and release all assume their own stream), and use it only
/// inside the closure.
///
/// # Thread safety
/// Neither `Send` nor `Sync`: it stays on the thread of [`with_cuvs`].
#[derive(Debug, Clone, Copy)]
pub struct CuvsResources<'a> {
    lend: RaftResourcesPtr<'a>,
    device: usize,
}

static_assertions::assert_not_impl_any!(CuvsResources<'static>: Send, Sync);

impl<'a> CuvsResources<'a> {
    pub(crate) fn lent(lend: RaftResourcesPtr<'a>, device: usize) -> Self {
        CuvsResources { lend, device }
    }

    /// The handle, for cuVS's C functions (see the contract above).
    pub fn as_raw(&self) -> crate::sys::cuvsResources_t {
        self.lend.as_ptr() as crate::sys::cuvsResources_t
    }

    pub(crate) fn raw(&self) -> crate::sys::cuvsResources_t {
        self.as_raw()
    }

    /// The device of the lending resources.
    pub fn device(&self) -> usize {
        self.device
    }

    /// The stream cuVS runs on (`cuvsStreamGet`): the lending resources' own, as a raw
    /// `CUstream` (compare with `DeviceResources::stream()?.cu_stream()`).
    pub fn stream(&self) -> Result<usize> {
        result::stream_get("CuvsResources::stream", self)
    }

    /// The device cuVS sees (`cuvsDeviceIdGet`).
    pub fn device_id(&self) -> Result<i32> {
        result::device_id("CuvsResources::device_id", self)
    }

    /// Waits for the stream (`cuvsStreamSync`: RAFT's `sync_stream`).
    pub fn sync(&self) -> Result<()> {
        result::stream_sync("CuvsResources::sync", self)
    }
}

/// Runs `f` with `res` lent to cuVS as a [`CuvsResources`]: cuVS's C API then works on these very
/// resources (their stream, handles and memory resource) for the closure's duration.
///
/// cuVS is loaded first (at the first call in the process, see [`crate::load`]): a missing
/// `libcuvs_c.so` is this call's `Cuda` error, before `f` runs.
///
/// Inside `f`, do not call methods of `res` (or its arrays' constructors, or this crate's calls on
/// `res`, or drop an index living on `res`) that take the resources themselves (`res.stream()`,
/// `res.sync()`, `DeviceVec::new(&res, ..)`, `res.release()`): the
/// lend holds the resources' read lock, and a release waiting on another thread would make such a
/// nested call wait for the lend to end, which waits for the call. Take what you need before.
///
/// # Errors
/// `Cuda` when cuVS cannot be loaded; `Logic` on released resources.
pub fn with_cuvs<R>(res: &DeviceResources, f: impl FnOnce(CuvsResources<'_>) -> R) -> Result<R> {
    const WHO: &str = "raft_cuvs::with_cuvs";
    result::api(WHO)?;
    let device = res.device();
    res.with_raft_resources(|lend| f(CuvsResources::lent(lend, device))).map_err(|e| e.with_who(WHO))
}

/// Lends `res` to `f` and flattens its result: the crate's own calls.
pub(crate) fn lend<R>(who: &'static str, res: &DeviceResources, f: impl FnOnce(CuvsResources<'_>) -> Result<R>) -> Result<R> {
    let device = res.device();
    res.with_raft_resources(|lend| f(CuvsResources::lent(lend, device))).map_err(|e| e.with_who(who))?
}

/// Destroys a cuVS object that holds device memory of `res`'s (an index, a padded copy): while
/// `res` is lent, so that a release waits for it, with their device bound. Once the exit has
/// decided it makes no call (the object is leaked to the OS, as raft-core leaks at exit); on
/// released resources it is leaked too, since its buffers were ordered on their stream, which is
/// gone, and the `Logic` error says so.
pub(crate) fn destroy_lent(who: &'static str, res: &DeviceResources, destroy: impl FnOnce() -> Result<()>) -> Result<()> {
    if !raft_exit::native_release_allowed() {
        return Ok(());
    }
    if res.is_released() {
        return Err(released_first(who, res));
    }
    let _bound = result::bind_device(who, res)?;
    res.with_raft_resources(|_| destroy()).map_err(|_| released_first(who, res))?
}

fn released_first(who: &'static str, res: &DeviceResources) -> raft_core::Error {
    raft_core::Error::logic(
        who,
        format!("the resources on device {} were released before this index: its device memory is leaked", res.device()),
    )
}
