//! RAFT's lazily made library handles (cuBLAS, cuSOLVER dense and sparse, cuSPARSE), typed as
//! cudarc knows them, for FFI users and cudarc's own wrappers; and what they hold, for the
//! backpressure on pending releases.
use crate::error::{ErrorKind, Result};
use crate::release::{self, Held};
use crate::resources::DeviceResources;
use crate::result::{HandleCode, NativeResources};
use cudarc::{cublas, cusolver, cusparse};
use raft_sys as sys;

/// A library handle of RAFT's, as the C APIs of cuBLAS, cuSOLVER and cuSPARSE know it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HandleKind {
    /// `cublasHandle_t`.
    Cublas,
    /// `cusolverDnHandle_t` (dense).
    CusolverDn,
    /// `cusolverSpHandle_t` (sparse).
    CusolverSp,
    /// `cusparseHandle_t`.
    Cusparse,
}

impl HandleKind {
    /// All kinds.
    pub const ALL: [HandleKind; 4] = [HandleKind::Cublas, HandleKind::CusolverDn, HandleKind::CusolverSp, HandleKind::Cusparse];

    /// Device memory one handle of this kind holds, as pending releases count it. cuBLAS:
    /// about 65 MiB (measured on the H200; `release-bench` prints every kind's). The cuSOLVER
    /// handles are counted as a cuBLAS handle and cuSPARSE as 4 MiB until that measurement
    /// says otherwise: an estimate on the high side only makes backpressure start earlier.
    pub(crate) const fn held_bytes(self) -> u64 {
        const MIB: u64 = 1 << 20;
        match self {
            HandleKind::Cublas | HandleKind::CusolverDn | HandleKind::CusolverSp => 65 * MIB,
            HandleKind::Cusparse => 4 * MIB,
        }
    }

    pub(crate) fn code(self) -> HandleCode {
        HandleCode(match self {
            HandleKind::Cublas => sys::RAFTRS_HANDLE_CUBLAS,
            HandleKind::CusolverDn => sys::RAFTRS_HANDLE_CUSOLVER_DN,
            HandleKind::CusolverSp => sys::RAFTRS_HANDLE_CUSOLVER_SP,
            HandleKind::Cusparse => sys::RAFTRS_HANDLE_CUSPARSE,
        })
    }
}

impl DeviceResources {
    /// The resources' handle of one kind, made by RAFT on first use on the resources' device
    /// and bound to their stream, as an untyped pointer (see the typed accessors below). Valid
    /// until the resources are released; using it is the caller's `unsafe`.
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
        let device = self.device();
        if release::over_limits(device) && !self.has_handle(kind).unwrap_or(true) {
            release::make_room(device);
        }
        match self.with_native(who, |n| n.handle(who, kind.code())) {
            Err(e) if e.kind() == ErrorKind::OutOfMemory && release::drain_device(device, release::OOM_WAIT) => {
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

/// What releasing `native` will free, for the ledger of pending releases: its stream, and each
/// handle RAFT made on it.
pub(crate) fn held_by(native: &NativeResources) -> Held {
    const WHO: &str = "DeviceResources::drop";
    let mut held = Held { streams: 1, handles: 0, bytes: 0 };
    for kind in HandleKind::ALL.into_iter().filter(|k| native.has_handle(WHO, k.code()).unwrap_or(false)) {
        held.handles += 1;
        held.bytes += kind.held_bytes();
    }
    held
}
