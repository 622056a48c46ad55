//! RAFT's lazily made library handles (cuBLAS, cuSOLVER dense and sparse, cuSPARSE), typed as
//! cudarc knows them, for FFI users and cudarc's own wrappers. Making one runs the backpressure on
//! pending releases first, and an out-of-memory failure runs or waits for them and retries once.
//! What a handle holds, for that ledger, is `handle_kind.rs`'s (`held_by`, `held_bytes`).
use crate::error::{ErrorKind, Result};
use crate::handle_kind::HandleKind;
use crate::release;
use crate::resources::DeviceResources;
use cudarc::{cublas, cusolver, cusparse};

impl DeviceResources {
    /// The resources' handle of one kind, made by RAFT on first use on the resources' device
    /// and bound to their stream, as an untyped pointer (see the typed accessors below). Valid
    /// until the resources are released; using it is the caller's `unsafe`.
    ///
    /// The handle is the resources' own, shared by every thread that uses them: each of these
    /// accessors binds it to the resources' stream again, and the library's GEMMs set its
    /// pointer mode to host. Using it, leave its stream, pointer mode, math mode and workspace
    /// as they are (or put them back with no other use of the resources running, which
    /// [`with_raft_resources_mut`](Self::with_raft_resources_mut) does not ensure for a handle
    /// taken earlier): work queued on another stream of your own is ordered with neither the
    /// resources' stream nor their arrays. Once the resources are released the handle goes to
    /// later resources of the device (it is kept, not destroyed: a destroy would synchronise
    /// the device, breaking other threads' stream captures); the library binds it to the next
    /// resources' stream (cuBLAS's workspace goes back to its own with it) and puts every other
    /// setting of the handle's API back to what a fresh handle has: cuBLAS's pointer, math and
    /// atomics modes, SM count target and FP64 emulation settings (the bit count's device
    /// address among them), cuSOLVER's deterministic and math modes and emulation settings,
    /// cuSPARSE's pointer mode. A handle that refuses them is never reused.
    ///
    /// # Errors
    /// `Logic` on released resources; `OutOfMemory` when the library cannot allocate the handle
    /// (a cuBLAS handle takes about 65 MiB of device memory) even after the releases pending on
    /// the device ran; `Cuda` when it fails otherwise.
    pub fn handle(&self, kind: HandleKind) -> Result<*mut std::ffi::c_void> {
        self.handle_for("DeviceResources::handle", kind)
    }

    /// The handle, made on first use. A first use on a device whose pending releases hold too
    /// much runs some of them first (backpressure: a new handle is memory a release will have
    /// to free); one that fails with `OutOfMemory` runs or waits for the device's pending
    /// releases and tries once more, so memory only waiting to be freed is never reported as
    /// missing.
    fn handle_for(&self, who: &'static str, kind: HandleKind) -> Result<*mut std::ffi::c_void> {
        // A handle carries the stream (`cublasGetStream`): its handle leaves the library
        // (`result/exposure.rs`).
        self.capture_flag().raise();
        self.made_handle(who, kind)
    }

    /// The handle, made on first use as [`handle_for`](Self::handle_for) makes it, for the
    /// library's own calls through it (a GEMM), where it does not leave the library: the stream
    /// stays private. Every way to a handle goes through here, so none skips the backpressure or
    /// the retry (the fifteenth audit: a first GEMM made its handle inside the shim's GEMM).
    pub(crate) fn made_handle(&self, who: &'static str, kind: HandleKind) -> Result<*mut std::ffi::c_void> {
        let device = self.device();
        if release::over_limits(device) && !self.has_handle(kind).unwrap_or(true) {
            release::make_room(device);
        }
        match self.with_native(who, |n| n.handle(who, kind.code())) {
            Err(e) if e.kind() == ErrorKind::OutOfMemory && release::drain_device(device, true) => {
                self.with_native(who, |n| n.handle(who, kind.code()))
            }
            made => made,
        }
    }

    /// `cublasHandle_t` (see [`handle`](Self::handle)).
    pub fn cublas_handle(&self) -> Result<cublas::sys::cublasHandle_t> {
        Ok(self.handle_for("DeviceResources::cublas_handle", HandleKind::Cublas)?.cast())
    }

    /// `cusolverDnHandle_t` (see [`handle`](Self::handle)).
    pub fn cusolver_dn_handle(&self) -> Result<cusolver::sys::cusolverDnHandle_t> {
        Ok(self.handle_for("DeviceResources::cusolver_dn_handle", HandleKind::CusolverDn)?.cast())
    }

    /// `cusolverSpHandle_t` (see [`handle`](Self::handle)).
    pub fn cusolver_sp_handle(&self) -> Result<cusolver::sys::cusolverSpHandle_t> {
        Ok(self.handle_for("DeviceResources::cusolver_sp_handle", HandleKind::CusolverSp)?.cast())
    }

    /// `cusparseHandle_t` (see [`handle`](Self::handle)).
    pub fn cusparse_handle(&self) -> Result<cusparse::sys::cusparseHandle_t> {
        Ok(self.handle_for("DeviceResources::cusparse_handle", HandleKind::Cusparse)?.cast())
    }

    /// Whether RAFT has made the handle of `kind` yet (they are made on first use).
    ///
    /// # Errors
    /// `Logic` on released resources.
    pub fn has_handle(&self, kind: HandleKind) -> Result<bool> {
        const WHO: &str = "DeviceResources::has_handle";
        self.with_native(WHO, |n| n.has_handle(WHO, kind.code()))
    }
}
