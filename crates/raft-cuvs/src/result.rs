//! The result layer: one checked function per cuVS entry point this crate calls, holding its
//! FFI `unsafe` and the status check (the message of a failed call is read on the same thread,
//! right after it); only the load-time checks are elsewhere (`sys/libcuvs.rs`).
//!
//! As in cudarc's `sys` / `result` / `safe` split. The native objects cuVS makes are owned here
//! by small types ([`BruteForceRaw`], [`CagraRaw`], [`DatasetRaw`], [`CagraIndexParamsRaw`],
//! [`CagraSearchParamsRaw`]). Those that hold device memory (indexes, an owning dataset) have no
//! `Drop`: their memory is freed in stream order on the stream of the resources they were built
//! with, so the safe types above destroy them explicitly, while those resources are lent
//! (`resources.rs`'s `destroy_lent`, called from `brute_force.rs` and `cagra.rs`); one forgotten
//! is leaked, never freed late. Functions whose arguments carry a
//! contract the types cannot express (a dataset that must outlive an index, shapes that must
//! agree) are `unsafe fn`, with the contract in `# Safety`; the safe types check it first.
use crate::dlpack::Tensor;
use crate::lent::CuvsResources;
use crate::sys;
use raft_core::{Error, ErrorKind, Result};
use std::ffi::CStr;
use std::ptr::NonNull;

/// The loaded C API, or the `Cuda` error saying why it is not there (the kind raft-core gives a
/// missing shim).
/// Refused once the library is closed (`raft_exit::closed`: after the exit's teardown, or in a
/// fork's child), as raft-core's shim gate is.
pub(crate) fn api(who: &'static str) -> Result<&'static sys::CuvsApi> {
    if raft_exit::closed() {
        return Err(raft_exit::refusal(who));
    }
    sys::api().map_err(|e| Error::library_missing(who, e.clone()))
}

/// Turns a status into a result; a failure's message is read at once, on this thread.
fn check(who: &'static str, api: &sys::CuvsApi, status: sys::cuvsError_t) -> Result<()> {
    if status == sys::cuvsError_t::CUVS_SUCCESS {
        return Ok(());
    }
    let text = last_error(api);
    Err(Error::new(classify(&text), who, format!("cuVS: {text}")))
}

fn last_error(api: &sys::CuvsApi) -> String {
    // SAFETY: returns NULL or a NUL-terminated thread-local string that stays valid until the
    // next cuVS call on this thread; it is copied before any.
    let text = unsafe { api.cuvsGetLastErrorText() };
    if text.is_null() {
        return "the call failed without a message".into();
    }
    // SAFETY: as above.
    unsafe { CStr::from_ptr(text) }.to_string_lossy().into_owned()
}

/// The kind of a cuVS failure, from its message (cuVS's C API passes on only the text of the
/// C++ exception): RMM's and the runtime's out-of-memory texts are `OutOfMemory`, CUDA's are
/// `Cuda`, RAFT's failed expectations (a bad argument) are `Logic`.
pub(crate) fn classify(message: &str) -> ErrorKind {
    let m = message.to_ascii_lowercase();
    if m.contains("out_of_memory") || m.contains("out of memory") || m.contains("bad_alloc") || m.contains("memoryallocation") {
        ErrorKind::OutOfMemory
    } else if m.contains("cuda error") || m.contains("cuda call") || m.contains("cudaerror") || m.contains("cuda_error") {
        ErrorKind::Cuda
    } else if m.starts_with("raft failure") || m.contains("expected") {
        ErrorKind::Logic
    } else {
        ErrorKind::Generic
    }
}

/// cuVS's version (`cuvsVersionGet`).
pub(crate) fn version(who: &'static str) -> Result<crate::version::Version> {
    let api = api(who)?;
    let (mut major, mut minor, mut patch) = (0, 0, 0);
    // SAFETY: writes three integers through valid pointers; makes no CUDA call.
    check(who, api, unsafe { api.cuvsVersionGet(&mut major, &mut minor, &mut patch) })?;
    Ok(crate::version::Version { major, minor, patch })
}

/// The stream of `res` as cuVS sees it (`cuvsStreamGet`).
pub(crate) fn stream_get(who: &'static str, res: &CuvsResources<'_>) -> Result<usize> {
    let api = api(who)?;
    let mut stream: sys::cudaStream_t = std::ptr::null_mut();
    // SAFETY: the handle is live for the borrow of `res`; writes one pointer.
    check(who, api, unsafe { api.cuvsStreamGet(res.raw(), &mut stream) })?;
    Ok(stream as usize)
}

/// `cuvsStreamSync`: RAFT's `sync_stream` on `res`.
pub(crate) fn stream_sync(who: &'static str, res: &CuvsResources<'_>) -> Result<()> {
    let api = api(who)?;
    // SAFETY: the handle is live for the borrow of `res`. Relaxed: RAFT's polls of the stream are
    // otherwise refused during another thread's global capture, which they invalidate.
    check(who, api, raft_core::with_relaxed_capture(|| unsafe { api.cuvsStreamSync(res.raw()) }))
}

/// The device of `res` as cuVS sees it (`cuvsDeviceIdGet`).
pub(crate) fn device_id(who: &'static str, res: &CuvsResources<'_>) -> Result<i32> {
    let api = api(who)?;
    let mut device = -1;
    // SAFETY: the handle is live for the borrow of `res`; writes one integer.
    check(who, api, unsafe { api.cuvsDeviceIdGet(res.raw(), &mut device) })?;
    Ok(device)
}

/// The calling thread bound to the resources' device for a cuVS call (cuVS launches its kernels
/// on their stream, which must belong to the current device); the thread's previous context is
/// put back when dropped.
pub(crate) struct DeviceBound {
    previous: Option<cudarc::driver::sys::CUcontext>,
}

/// Makes `res`'s device (its primary context) current on this thread until the guard drops.
/// `res` exists, so the driver was found and initialised when it was made.
pub(crate) fn bind_device(who: &'static str, res: &raft_core::DeviceResources) -> Result<DeviceBound> {
    let previous = cudarc::driver::result::ctx::get_current().map_err(|e| Error::driver(who, e))?;
    if previous != Some(res.context().cu_ctx()) {
        // Not cudarc's `bind_to_thread`, which fails with whatever error code any holder of the
        // context object stored in it (`record_err`) as if this call had failed.
        // SAFETY: the resources' primary context, retained while `res` lives (borrowed here and
        // held by the caller across the guard's life).
        unsafe { cudarc::driver::result::ctx::set_current(res.context().cu_ctx()) }.map_err(|e| Error::driver(who, e))?;
    }
    Ok(DeviceBound { previous })
}

impl Drop for DeviceBound {
    fn drop(&mut self) {
        let now = cudarc::driver::result::ctx::get_current().ok().flatten();
        if now != self.previous {
            // SAFETY: puts back the context that was current on this thread a moment ago (or
            // none); a failure only leaves the thread on the resources' device.
            let _ = unsafe { cudarc::driver::result::ctx::set_current(self.previous.unwrap_or(std::ptr::null_mut())) };
        }
    }
}

/// The filter of an unfiltered search.
fn no_filter() -> sys::cuvsFilter {
    sys::cuvsFilter { addr: 0, type_: sys::cuvsFilterType::NO_FILTER }
}

// ---- brute force ------------------------------------------------------------------------------

/// A cuVS brute-force index (`cuvsBruteForceIndex_t`): made empty, built once, destroyed once.
pub(crate) struct BruteForceRaw {
    ptr: NonNull<sys::cuvsBruteForceIndex>,
}

// SAFETY: the index is a heap object of cuVS's that no thread owns; search only reads it
// (cuVS's `search` takes the index `const`), and destroy takes `self` by value.
unsafe impl Send for BruteForceRaw {}
// SAFETY: as above: shared use is search only.
unsafe impl Sync for BruteForceRaw {}

impl BruteForceRaw {
    pub(crate) fn create(who: &'static str) -> Result<Self> {
        let api = api(who)?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: writes a new, empty index (host memory only) through a valid pointer.
        check(who, api, unsafe { api.cuvsBruteForceIndexCreate(&mut raw) })?;
        Ok(BruteForceRaw { ptr: NonNull::new(raw).ok_or_else(|| Error::new(ErrorKind::Generic, who, "cuVS returned no index"))? })
    }

    /// `cuvsBruteForceBuild` over `dataset` (L2 and the other metrics; f32 rows).
    ///
    /// # Safety
    /// cuVS keeps a view of the dataset: the array `dataset` describes must stay alive and
    /// unwritten until this index is destroyed, and the index must be searched and destroyed only
    /// while `res`'s resources live (its buffers are ordered on their stream).
    pub(crate) unsafe fn build(
        &mut self,
        who: &'static str,
        res: &CuvsResources<'_>,
        dataset: &mut Tensor<'_>,
        metric: sys::cuvsDistanceType,
    ) -> Result<()> {
        let api = api(who)?;
        // SAFETY: the handle is live for the borrow of `res`; the tensor describes exactly its
        // array (checked when made) and is valid while borrowed; the caller keeps the array alive
        // for the index's life.
        check(who, api, unsafe { api.cuvsBruteForceBuild(res.raw(), dataset.as_mut_ptr(), metric, 0.0, self.ptr.as_ptr()) })
    }

    /// `cuvsBruteForceSearch`, unfiltered: the `k = neighbors.cols()` nearest rows of each query.
    ///
    /// # Safety
    /// The index was built, with `dim` columns, and its dataset is still alive (see
    /// [`build`](Self::build)); `queries` has `dim` columns; `neighbors` and `distances` have as
    /// many rows as `queries` and the same number of columns, at most the dataset's rows.
    pub(crate) unsafe fn search(
        &self,
        who: &'static str,
        res: &CuvsResources<'_>,
        queries: &mut Tensor<'_>,
        neighbors: &mut Tensor<'_>,
        distances: &mut Tensor<'_>,
    ) -> Result<()> {
        debug_assert!(queries.rows() == neighbors.rows() && neighbors.rows() == distances.rows() && neighbors.cols() == distances.cols());
        let api = api(who)?;
        // SAFETY: the handle is live for the borrow of `res`; the tensors describe exactly their
        // arrays and their shapes agree (the caller's contract); the index is built and its
        // dataset alive (the caller's contract).
        check(who, api, unsafe {
            api.cuvsBruteForceSearch(
                res.raw(),
                self.ptr.as_ptr(),
                queries.as_mut_ptr(),
                neighbors.as_mut_ptr(),
                distances.as_mut_ptr(),
                no_filter(),
            )
        })
    }

    /// `cuvsBruteForceIndexDestroy`: frees the index's buffers in stream order. Call it while
    /// the resources it was built with live.
    pub(crate) fn destroy(self, who: &'static str) -> Result<()> {
        let api = api(who)?;
        // SAFETY: made by cuvsBruteForceIndexCreate and destroyed once (takes `self`).
        check(who, api, unsafe { api.cuvsBruteForceIndexDestroy(self.ptr.as_ptr()) })
    }
}

// ---- CAGRA ------------------------------------------------------------------------------------

/// `cuvsCagraIndexParams`, made with cuVS's defaults; host memory only, so `Drop` destroys it.
pub(crate) struct CagraIndexParamsRaw {
    ptr: NonNull<sys::cuvsCagraIndexParams>,
}

impl CagraIndexParamsRaw {
    pub(crate) fn create(who: &'static str) -> Result<Self> {
        let api = api(who)?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: writes new parameters through a valid pointer.
        check(who, api, unsafe { api.cuvsCagraIndexParamsCreate(&mut raw) })?;
        Ok(CagraIndexParamsRaw {
            ptr: NonNull::new(raw).ok_or_else(|| Error::new(ErrorKind::Generic, who, "cuVS returned no parameters"))?,
        })
    }

    /// The parameters, to read or change (plain data, owned by this value).
    pub(crate) fn get_mut(&mut self) -> &mut sys::cuvsCagraIndexParams {
        // SAFETY: a live, exclusively owned C struct of this exact layout (checked by the
        // bindings' layout tests).
        unsafe { self.ptr.as_mut() }
    }
}

impl Drop for CagraIndexParamsRaw {
    fn drop(&mut self) {
        let Ok(api) = api("CagraIndexParams::drop") else { return };
        // cuvsCagraIndexParamsDestroy frees `graph_build_params` by the type `build_algo` names,
        // and cuvsCagraIndexParamsCreate made it for IVF_PQ: put that back first (a build with
        // another algorithm never reads it).
        self.get_mut().build_algo = sys::cuvsCagraGraphBuildAlgo::IVF_PQ;
        // SAFETY: made by cuvsCagraIndexParamsCreate, destroyed once; host memory only.
        if let Err(e) = check("CagraIndexParams::drop", api, unsafe { api.cuvsCagraIndexParamsDestroy(self.ptr.as_ptr()) }) {
            // Guarded (helper 115): a build drops its parameters before the index owns what cuVS
            // made, which a logger's panic here would leak; a search's alike.
            raft_exit::log_guarded(|| log::warn!(target: "raft", "{e}"));
        }
    }
}

/// `cuvsCagraSearchParams`, made with cuVS's defaults; host memory only, so `Drop` destroys it.
pub(crate) struct CagraSearchParamsRaw {
    ptr: NonNull<sys::cuvsCagraSearchParams>,
}

impl CagraSearchParamsRaw {
    pub(crate) fn create(who: &'static str) -> Result<Self> {
        let api = api(who)?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: writes new parameters through a valid pointer.
        check(who, api, unsafe { api.cuvsCagraSearchParamsCreate(&mut raw) })?;
        Ok(CagraSearchParamsRaw {
            ptr: NonNull::new(raw).ok_or_else(|| Error::new(ErrorKind::Generic, who, "cuVS returned no parameters"))?,
        })
    }

    pub(crate) fn get_mut(&mut self) -> &mut sys::cuvsCagraSearchParams {
        // SAFETY: a live, exclusively owned C struct of this exact layout.
        unsafe { self.ptr.as_mut() }
    }
}

impl Drop for CagraSearchParamsRaw {
    fn drop(&mut self) {
        let Ok(api) = api("CagraSearchParams::drop") else { return };
        // SAFETY: made by cuvsCagraSearchParamsCreate, destroyed once; host memory only.
        if let Err(e) = check("CagraSearchParams::drop", api, unsafe { api.cuvsCagraSearchParamsDestroy(self.ptr.as_ptr()) }) {
            // Guarded (helper 115): a build drops its parameters before the index owns what cuVS
            // made, which a logger's panic here would leak; a search's alike.
            raft_exit::log_guarded(|| log::warn!(target: "raft", "{e}"));
        }
    }
}

/// A dataset handle (`cuvsDataset_t`) in CAGRA's padded row layout: a view of a caller's array
/// (`cuvsDatasetMakePaddedView`, when the rows are already 16-byte aligned) or a padded copy that
/// it owns (`cuvsDatasetMakePadded`, in device memory).
pub(crate) struct DatasetRaw {
    ptr: NonNull<sys::cuvsDataset>,
}

// SAFETY: a heap object of cuVS's that no thread owns; only read after it is made; destroy takes
// `self` by value.
unsafe impl Send for DatasetRaw {}
// SAFETY: as above.
unsafe impl Sync for DatasetRaw {}

impl DatasetRaw {
    /// A padded view of `dataset` (no copy). cuVS refuses rows that are not already padded.
    ///
    /// # Safety
    /// The array `dataset` describes must stay alive and unwritten until this handle and every
    /// index built from it are destroyed.
    pub(crate) unsafe fn padded_view(who: &'static str, res: &CuvsResources<'_>, dataset: &mut Tensor<'_>) -> Result<Self> {
        let api = api(who)?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: the handle is live for the borrow of `res`; the tensor is valid while borrowed
        // and describes exactly its array; the caller keeps the array alive.
        check(who, api, unsafe { api.cuvsDatasetMakePaddedView(res.raw(), dataset.as_mut_ptr(), &mut raw) })?;
        Ok(DatasetRaw { ptr: NonNull::new(raw).ok_or_else(|| Error::new(ErrorKind::Generic, who, "cuVS returned no dataset"))? })
    }

    /// A padded copy of `dataset` in device memory, owned by the handle (the copy is queued on
    /// `res`'s stream; `dataset` is only read by it).
    pub(crate) fn padded_copy(who: &'static str, res: &CuvsResources<'_>, dataset: &mut Tensor<'_>) -> Result<Self> {
        let api = api(who)?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: the handle is live for the borrow of `res`; the tensor is valid while borrowed
        // and describes exactly its array, which the copy (queued on `res`'s stream) reads before
        // the tensor's guard lets the array go.
        check(who, api, unsafe {
            api.cuvsDatasetMakePadded(res.raw(), dataset.as_mut_ptr(), sys::cuvsDatasetMemType_t::CUVS_DATASET_MEM_TYPE_DEVICE, &mut raw)
        })?;
        Ok(DatasetRaw { ptr: NonNull::new(raw).ok_or_else(|| Error::new(ErrorKind::Generic, who, "cuVS returned no dataset"))? })
    }

    /// `cuvsDatasetDestroy`: a view only frees its host record; an owned copy frees its device
    /// memory in stream order. Call it after every index built from it is destroyed.
    pub(crate) fn destroy(self, who: &'static str) -> Result<()> {
        let api = api(who)?;
        // SAFETY: made by a cuvsDatasetMake* function, destroyed once (takes `self`).
        check(who, api, unsafe { api.cuvsDatasetDestroy(self.ptr.as_ptr()) })
    }
}

/// A cuVS CAGRA index (`cuvsCagraIndex_t`): made empty, built once, destroyed once.
pub(crate) struct CagraRaw {
    ptr: NonNull<sys::cuvsCagraIndex>,
}

// SAFETY: the index is a heap object of cuVS's that no thread owns; search only reads it (cuVS's
// `search` takes the index `const` and guards its lazily made search descriptors), and destroy
// takes `self` by value. Searches always run on the one stream of the index's own resources:
// cuVS 26.08's known race between streams (rapidsai/cuvs#2237) does not arise.
unsafe impl Send for CagraRaw {}
// SAFETY: as above: shared use is search only.
unsafe impl Sync for CagraRaw {}

impl CagraRaw {
    pub(crate) fn create(who: &'static str) -> Result<Self> {
        let api = api(who)?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: writes a new, empty index (host memory only) through a valid pointer.
        check(who, api, unsafe { api.cuvsCagraIndexCreate(&mut raw) })?;
        Ok(CagraRaw { ptr: NonNull::new(raw).ok_or_else(|| Error::new(ErrorKind::Generic, who, "cuVS returned no index"))? })
    }

    /// `cuvsCagraBuild` from a padded dataset handle.
    ///
    /// # Safety
    /// `dataset`, and the array it views, must outlive this index; the index must be searched and
    /// destroyed only while `res`'s resources live.
    pub(crate) unsafe fn build(
        &mut self,
        who: &'static str,
        res: &CuvsResources<'_>,
        params: &mut CagraIndexParamsRaw,
        dataset: &DatasetRaw,
    ) -> Result<()> {
        let api = api(who)?;
        // SAFETY: the handle is live for the borrow of `res`; params, dataset and index are live
        // objects of cuVS's; the caller keeps the dataset alive for the index's life.
        check(who, api, unsafe { api.cuvsCagraBuild(res.raw(), params.ptr.as_ptr(), dataset.ptr.as_ptr(), self.ptr.as_ptr()) })
    }

    /// A size of the built index: `cuvsCagraIndexGetDims`, `GetSize` or `GetGraphDegree`.
    pub(crate) fn dims(&self, who: &'static str) -> Result<(i64, i64, i64)> {
        let api = api(who)?;
        let (mut dim, mut size, mut degree) = (0, 0, 0);
        // SAFETY: a live, built index; each call writes one integer.
        unsafe {
            check(who, api, api.cuvsCagraIndexGetDims(self.ptr.as_ptr(), &mut dim))?;
            check(who, api, api.cuvsCagraIndexGetSize(self.ptr.as_ptr(), &mut size))?;
            check(who, api, api.cuvsCagraIndexGetGraphDegree(self.ptr.as_ptr(), &mut degree))?;
        }
        Ok((dim, size, degree))
    }

    /// `cuvsCagraSearch`, unfiltered.
    ///
    /// # Safety
    /// As [`BruteForceRaw::search`]: the index is built and its dataset alive; `queries` has the
    /// index's columns; `neighbors` and `distances` have as many rows as `queries` and the same
    /// number of columns.
    pub(crate) unsafe fn search(
        &self,
        who: &'static str,
        res: &CuvsResources<'_>,
        params: &mut CagraSearchParamsRaw,
        queries: &mut Tensor<'_>,
        neighbors: &mut Tensor<'_>,
        distances: &mut Tensor<'_>,
    ) -> Result<()> {
        debug_assert!(queries.rows() == neighbors.rows() && neighbors.rows() == distances.rows() && neighbors.cols() == distances.cols());
        let api = api(who)?;
        // SAFETY: the handle is live for the borrow of `res`; the tensors describe exactly their
        // arrays and their shapes agree, the index is built and its dataset alive (the caller's
        // contract); params is a live object of cuVS's.
        check(who, api, unsafe {
            api.cuvsCagraSearch(
                res.raw(),
                params.ptr.as_ptr(),
                self.ptr.as_ptr(),
                queries.as_mut_ptr(),
                neighbors.as_mut_ptr(),
                distances.as_mut_ptr(),
                no_filter(),
            )
        })
    }

    /// `cuvsCagraIndexDestroy`: frees the index's buffers in stream order. Call it while the
    /// resources it was built with live.
    pub(crate) fn destroy(self, who: &'static str) -> Result<()> {
        let api = api(who)?;
        // SAFETY: made by cuvsCagraIndexCreate and destroyed once (takes `self`).
        check(who, api, unsafe { api.cuvsCagraIndexDestroy(self.ptr.as_ptr()) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_are_classified_by_their_text() {
        // Texts of the kinds cuVS 26.08 passes on (RMM's, RAFT's CUDA check, RAFT_EXPECTS).
        assert_eq!(
            classify("std::bad_alloc: out_of_memory: CUDA error at: rmm/mr/cuda_async_view_memory_resource.hpp"),
            ErrorKind::OutOfMemory
        );
        assert_eq!(
            classify("CUDA error encountered at: file=raft/util/cudart_utils.hpp line=148: call='cudaMemcpyAsync(...)', Reason=cudaErrorIllegalAddress"),
            ErrorKind::Cuda
        );
        assert_eq!(classify("RAFT failure at file=cagra.cpp line=12: queries should have device compatible memory"), ErrorKind::Logic);
        assert_eq!(classify("unknown exception"), ErrorKind::Generic);
    }
}
