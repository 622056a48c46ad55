//! RAFT's lazily made library handles (cuBLAS, cuSOLVER dense and sparse, cuSPARSE), typed as
//! cudarc knows them, for FFI users and cudarc's own wrappers.
use crate::error::Result;
use crate::resources::DeviceResources;
use crate::result::HandleCode;
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

    fn code(self) -> HandleCode {
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
    /// (a cuBLAS handle takes about 65 MiB of device memory); `Cuda` when it fails otherwise.
    pub fn handle(&self, kind: HandleKind) -> Result<*mut std::ffi::c_void> {
        self.handle_for("DeviceResources::handle", kind)
    }

    fn handle_for(&self, who: &'static str, kind: HandleKind) -> Result<*mut std::ffi::c_void> {
        self.with_native(who, |n| n.handle(who, kind.code()))
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
