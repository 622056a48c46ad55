//! The kinds of RAFT's library handles and what each holds: below the resources object, which
//! counts them into the ledger of pending releases when it is dropped, and the accessors
//! (`handles.rs`) that make them.
use crate::release::Held;
use crate::result::{HandleCode, NativeResources};
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
