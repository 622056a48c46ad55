//! The lent `cuvsResources_t` itself: a type that names only the raw layer, so that the result
//! layer can take it and the calls on it (`resources.rs`) stay above.
use cudarc::driver::CudaStream;
use raft_core::RaftResourcesPtr;
use std::sync::Arc;

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
///
/// [`DeviceResources`]: raft_core::DeviceResources
/// [`with_cuvs`]: crate::with_cuvs
#[derive(Debug, Clone, Copy)]
pub struct CuvsResources<'a> {
    lend: RaftResourcesPtr<'a>,
    device: usize,
    /// The lending resources' stream, taken before the lend (see `with_cuvs`).
    pub(crate) stream: &'a Arc<CudaStream>,
}

static_assertions::assert_not_impl_any!(CuvsResources<'static>: Send, Sync);

impl<'a> CuvsResources<'a> {
    pub(crate) fn lent(lend: RaftResourcesPtr<'a>, device: usize, stream: &'a Arc<CudaStream>) -> Self {
        CuvsResources { lend, device, stream }
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
}
