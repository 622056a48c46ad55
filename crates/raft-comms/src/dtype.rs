//! The element types NCCL reduces and moves (`ncclDataType_t`) and the reductions
//! (`ncclRedOp_t`), as Rust types: a sealed trait, so no other type can claim an NCCL type.
use crate::sys;
use raft_core::DeviceScalar;

/// An element type NCCL knows: `f32`, `f64`, `i32`, `i64`, `u8` (`ncclFloat32`, `ncclFloat64`,
/// `ncclInt32`, `ncclInt64`, `ncclUint8`). Sealed: the mapping to NCCL's type is this crate's.
pub trait NcclType: DeviceScalar + sealed::Sealed {}

pub(crate) mod sealed {
    /// The NCCL type code (`RAFTCOMMS_DTYPE_*`) of an element type.
    pub trait Sealed {
        const CODE: i32;
    }
}

macro_rules! nccl_types {
    ($($t:ty => $code:expr),*) => {$(
        impl sealed::Sealed for $t {
            const CODE: i32 = $code;
        }
        impl NcclType for $t {}
    )*};
}
nccl_types!(u8 => sys::RAFTCOMMS_DTYPE_U8, i32 => sys::RAFTCOMMS_DTYPE_I32, i64 => sys::RAFTCOMMS_DTYPE_I64,
            f32 => sys::RAFTCOMMS_DTYPE_F32, f64 => sys::RAFTCOMMS_DTYPE_F64);

/// The code NCCL's type of `T` has in the shim.
pub(crate) fn code_of<T: NcclType>() -> i32 {
    <T as sealed::Sealed>::CODE
}

/// A reduction (`ncclRedOp_t`, RAFT's `raft::comms::op_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// `ncclSum`.
    Sum,
    /// `ncclProd`.
    Prod,
    /// `ncclMin`.
    Min,
    /// `ncclMax`.
    Max,
}

impl ReduceOp {
    pub(crate) fn code(self) -> i32 {
        match self {
            ReduceOp::Sum => sys::RAFTCOMMS_OP_SUM,
            ReduceOp::Prod => sys::RAFTCOMMS_OP_PROD,
            ReduceOp::Min => sys::RAFTCOMMS_OP_MIN,
            ReduceOp::Max => sys::RAFTCOMMS_OP_MAX,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_has_its_own_code() {
        let mut codes = vec![code_of::<u8>(), code_of::<i32>(), code_of::<i64>(), code_of::<f32>(), code_of::<f64>()];
        codes.sort();
        codes.dedup();
        assert_eq!(codes.len(), 5);
    }

    #[test]
    fn every_op_has_its_own_code() {
        let codes: Vec<i32> = [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max].iter().map(|o| o.code()).collect();
        assert_eq!(codes, [0, 1, 2, 3]);
    }
}
