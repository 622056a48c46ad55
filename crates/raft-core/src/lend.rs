//! Lending RAFT's own `raft::resources` object to C and C++ code that takes it (cuVS's
//! `cuvsResources_t`, RAFT's comms, a user's RAFT algorithm) without giving the resources up.
use crate::error::Result;
use crate::resources::DeviceResources;
use crate::result::ContextGuard;
use std::ffi::c_void;
use std::marker::PhantomData;
use std::ptr::NonNull;

/// A `raft::resources*` lent for the duration of [`DeviceResources::with_raft_resources`]: the
/// resources cannot be released meanwhile (a release from another thread waits for the lend to
/// end), and the value cannot leave the closure (it is neither `Send` nor `'static`).
///
/// Using the pointer is the caller's `unsafe`: hand it only to code that treats it as a borrowed
/// `raft::resources` (never deletes it, never keeps it past the closure), on any thread while the
/// closure runs. Through a shared lend ([`DeviceResources::with_raft_resources`]) the object is
/// only read (RAFT's `get_*` accessors, algorithms): other threads may use it at the same time.
/// Changes (`raft::resource::set_*`, and RAFT calls that switch the shared cuBLAS handle to
/// device pointer mode for their duration: see [`DeviceResources::with_raft_resources`]) need the
/// exclusive lend, [`DeviceResources::with_raft_resources_mut`].
///
/// ```compile_fail
/// # fn f(res: &raft_core::DeviceResources) -> raft_core::Result<()> {
/// let ptr = res.with_raft_resources(|p| p)?; // error: the lent pointer cannot leave the closure
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy)]
pub struct RaftResourcesPtr<'a> {
    ptr: NonNull<c_void>,
    _borrow: PhantomData<&'a DeviceResources>,
    _not_send: PhantomData<*mut c_void>,
}

impl RaftResourcesPtr<'_> {
    /// The `raft::resources*` (a `cuvsResources_t` is this pointer as an integer).
    pub fn as_ptr(&self) -> *mut c_void {
        self.ptr.as_ptr()
    }
}

impl DeviceResources {
    /// Runs `f` with the `raft::resources*` behind these resources: their stream, their lazily
    /// made cuBLAS / cuSOLVER / cuSPARSE handles (made through this library's checked factories,
    /// which report a failed create as an error), their device. Nothing is copied: RAFT code
    /// given the pointer works on these very resources, on their stream.
    ///
    /// The lend is shared: other threads may use (and lend) the resources meanwhile, so the C++
    /// code given the pointer may only read the object; changing it (`raft::resource::set_*`)
    /// needs [`with_raft_resources_mut`](Self::with_raft_resources_mut). So does RAFT code that
    /// switches the resources' cuBLAS handle to device pointer mode while it runs (RAFT's
    /// `DevicePointerMode = true` calls: `raft::linalg::axpy` with a device scalar, `gemv` /
    /// `axpy` instantiated with `true`, anything under `cublas_device_pointer_mode<true>`, such as
    /// cuVS's ScaNN build): the handle is shared, and another thread's GEMM on these resources
    /// meanwhile would have its host scalars read as device addresses. (RAFT's GEMMs, through
    /// cuBLASLt's per-call descriptors, and cuVS's brute-force and CAGRA calls leave the mode at
    /// host: the twentieth audit read both sources for it.)
    ///
    /// `f` runs with the resources' device current on the thread (their primary context), and
    /// the thread's own context is put back after it, whatever `f` switched to (a thread that had
    /// none may keep device 0's, which the runtime would bind there anyway): RAFT code works on
    /// the current device.
    ///
    /// RAFT's and cuVS's allocations made through the pointer (the workspace RAFT keeps in the
    /// object, an index's arrays) hold a reference into RMM's map entry for the device: from the
    /// first lend until these resources are released, the device's current resource is not
    /// replaced ([`memory::set_current`](crate::memory::set_current) is refused).
    ///
    /// A release of these resources from inside `f`, on this thread, is refused with a `Logic`
    /// error (it would wait for the lend, which waits for it); on another thread it waits until
    /// the lend ends. At exit, the teardown waits up to a second for a lend on another thread,
    /// then leaves the native object to the OS.
    ///
    /// # Errors
    /// `Logic` on released resources.
    pub fn with_raft_resources<R>(&self, f: impl FnOnce(RaftResourcesPtr<'_>) -> R) -> Result<R> {
        const WHO: &str = "DeviceResources::with_raft_resources";
        self.with_native(WHO, |native| {
            // C++ code reaches the stream through RAFT's object (`result/exposure.rs`).
            native.capture_flag().raise();
            let ptr = native.raft_resources(WHO)?;
            // RAFT works on the thread's current device (its workspace is made lazily from that
            // device's RMM entry): the resources' own for the lend, the caller's back after it,
            // read again then (the closure's code may have switched it: `cudaSetDevice`).
            let _keep = ContextGuard::save(WHO)?;
            crate::result::bind(WHO, self.context())?;
            Ok(f(RaftResourcesPtr { ptr, _borrow: PhantomData, _not_send: PhantomData }))
        })
    }

    /// Runs `f` with the `raft::resources*` lent exclusively: no other use of these resources
    /// through this library (a lend, an allocation, a sync, a job's use of them) runs meanwhile
    /// on any other thread (uses that `f` itself makes on this thread go ahead: they are part of
    /// the lend, and run between `f`'s own steps). For C++ code that changes the object, such as `raft::resource::set_comms`:
    /// RAFT replaces a resource cell there, which its documentation allows only with no
    /// concurrent use of the object (a reader meanwhile races the cell's replacement and can be
    /// left with a reference into the freed cell). Never the cells this library keeps in step
    /// with its own: the stream (`set_cuda_stream`, `set_stream_view`), the stream pool, the
    /// library handles and the workspace resource. Every check of this library (array order,
    /// captures, `sync`, releases) is made against the resources' stream, while RAFT's code
    /// (its GEMM, cuVS) runs on the cell's: changed, their work would race the arrays' frees.
    /// That is part of the caller's `unsafe` contract for the pointer.
    /// [`with_raft_resources`](Self::with_raft_resources) is for reading (RAFT's `get_*`
    /// accessors, algorithms). Work already queued on the stream, and a stream or handle taken
    /// out earlier (`stream()`, `cublas_handle()`), are not held back: they never read RAFT's
    /// object.
    ///
    /// Waits for a moment with no use in progress (polling: other threads' uses are never held
    /// back while it waits, so a use that waits for another cannot deadlock with it; under a
    /// steady stream of uses from many threads the wait can be long), then holds new uses back
    /// until `f` returns. Like [`with_raft_resources`](Self::with_raft_resources), it counts as
    /// a lend to RAFT for [`memory::set_current`](crate::memory::set_current).
    ///
    /// # Errors
    /// `Logic` on released resources, when called inside a use of the same resources on this
    /// thread (a lend, a memory failure callback), which it would wait for, and where the wait
    /// would never end: a use in progress is held by a thread that waits for this one (a join
    /// of the job making this call, or a wait for resources this thread holds).
    pub fn with_raft_resources_mut<R>(&self, f: impl FnOnce(RaftResourcesPtr<'_>) -> R) -> Result<R> {
        const WHO: &str = "DeviceResources::with_raft_resources_mut";
        self.with_native_exclusive(WHO, |native| {
            // C++ code reaches the stream through RAFT's object (`result/exposure.rs`).
            native.capture_flag().raise();
            let ptr = native.raft_resources(WHO)?;
            // RAFT works on the thread's current device (its workspace is made lazily from that
            // device's RMM entry): the resources' own for the lend, the caller's back after it,
            // read again then (the closure's code may have switched it: `cudaSetDevice`).
            let _keep = ContextGuard::save(WHO)?;
            crate::result::bind(WHO, self.context())?;
            Ok(f(RaftResourcesPtr { ptr, _borrow: PhantomData, _not_send: PhantomData }))
        })
    }
}
