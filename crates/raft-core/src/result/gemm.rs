//! GEMM through the resources' cuBLAS handle (`gemm`, `GemmScalar`): the shim call and the
//! operands it checks, above the buffers it reads and writes.
use super::buffer::NativeBuffer;
use super::{api, check, ContextGuard, DeviceScalar, NativeResources};
use crate::error::{Error, Result};
use raft_sys as sys;

/// One GEMM operand as cuBLAS (column-major) reads it: `rows × cols` (after `op`), stored
/// column-major from element `offset` of its buffer with leading dimension `ld`, `transposed`
/// meaning cuBLAS applies `op = T`.
pub(crate) struct Operand<'a> {
    pub(crate) buffer: &'a NativeBuffer,
    /// Where the matrix starts in the buffer, in elements (a sub-matrix's first element).
    pub(crate) offset: usize,
    /// Rows and columns of the matrix as stored (before cuBLAS's `op`).
    pub(crate) stored_rows: usize,
    pub(crate) stored_cols: usize,
    pub(crate) ld: usize,
    pub(crate) transposed: bool,
}

impl Operand<'_> {
    /// The first element's address (inside the buffer once [`check`](Self::check)ed).
    fn ptr<T>(&self) -> *const T {
        (self.buffer.data as *const T).wrapping_add(self.offset)
    }

    /// Refuses an operand whose elements, as cuBLAS will address them, leave its buffer:
    /// element (r, c) lies at `offset + c * ld + r`, so the last is
    /// `offset + (cols - 1) * ld + rows - 1`.
    fn check<T>(&self, who: &'static str, name: &str) -> Result<()> {
        if self.ld < self.stored_rows.max(1) {
            return Err(Error::logic(who, format!("{name}: leading dimension {} is below its {} rows", self.ld, self.stored_rows)));
        }
        let elements = self.buffer.bytes / std::mem::size_of::<T>();
        let needed = if self.stored_rows == 0 || self.stored_cols == 0 {
            Some(0)
        } else {
            (self.stored_cols - 1).checked_mul(self.ld).and_then(|n| n.checked_add(self.stored_rows))
        };
        let needed = needed.and_then(|n| n.checked_add(self.offset));
        match needed {
            Some(n) if n <= elements => Ok(()),
            _ => Err(Error::logic(
                who,
                format!(
                    "{name}: a {}×{} matrix with leading dimension {} from element {} needs more than the {elements} elements of its array",
                    self.stored_rows, self.stored_cols, self.ld, self.offset
                ),
            )),
        }
    }
}

/// Element types cuBLAS multiplies here: `f32` (cublasSgemm) and `f64` (cublasDgemm).
pub trait GemmScalar: DeviceScalar + sealed::Sealed {}
impl GemmScalar for f32 {}
impl GemmScalar for f64 {}

mod sealed {
    pub trait Sealed {
        #[allow(clippy::too_many_arguments)]
        fn status(api: &raft_sys::RaftrsShim, args: &super::GemmArgs<'_>, alpha: Self, beta: Self) -> raft_sys::raftrs_status
        where
            Self: Sized;
    }
}

#[doc(hidden)]
pub struct GemmArgs<'a> {
    res: &'a NativeResources,
    m: usize,
    n: usize,
    k: usize,
    a: &'a Operand<'a>,
    b: &'a Operand<'a>,
    c: &'a Operand<'a>,
}

macro_rules! gemm_scalar {
    ($t:ty, $call:ident) => {
        impl sealed::Sealed for $t {
            fn status(api: &sys::RaftrsShim, g: &GemmArgs<'_>, alpha: $t, beta: $t) -> sys::raftrs_status {
                // SAFETY: every operand's extent (from its offset, with its leading dimension) was
                // checked against its buffer by `gemm`, whose caller holds the borrows (C's
                // elements exclusively) for the call; the resources are alive for the borrow.
                unsafe {
                    api.$call(
                        g.res.ptr.as_ptr(),
                        g.a.transposed as i32,
                        g.b.transposed as i32,
                        g.m as i64,
                        g.n as i64,
                        g.k as i64,
                        alpha,
                        g.a.ptr::<$t>(),
                        g.a.ld as i64,
                        g.b.ptr::<$t>(),
                        g.b.ld as i64,
                        beta,
                        g.c.ptr::<$t>() as *mut $t,
                        g.c.ld as i64,
                    )
                }
            }
        }
    };
}
gemm_scalar!(f32, raftrs_gemm_f32);
gemm_scalar!(f64, raftrs_gemm_f64);

/// Column-major `C = alpha · op(A) · op(B) + beta · C` (C is m×n, not transposed) through the
/// resources' cuBLAS handle, on their stream. Every extent is checked against its buffer first:
/// a shape cuBLAS would read or write past an array is a `Logic` error, never a call. The
/// caller holds C's elements exclusively.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm<T: GemmScalar>(
    who: &'static str,
    res: &NativeResources,
    m: usize,
    n: usize,
    k: usize,
    alpha: T,
    a: &Operand<'_>,
    b: &Operand<'_>,
    beta: T,
    c: &Operand<'_>,
) -> Result<()> {
    let (ar, ac) = if a.transposed { (a.stored_cols, a.stored_rows) } else { (a.stored_rows, a.stored_cols) };
    let (br, bc) = if b.transposed { (b.stored_cols, b.stored_rows) } else { (b.stored_rows, b.stored_cols) };
    if (ar, ac, br, bc) != (m, k, k, n) {
        return Err(Error::logic(who, format!("shapes do not chain: op(A) {ar}×{ac}, op(B) {br}×{bc}, C {m}×{n}")));
    }
    if (c.stored_rows, c.stored_cols, c.transposed) != (m, n, false) {
        return Err(Error::logic(who, format!("C is {}×{}, the product {m}×{n}", c.stored_rows, c.stored_cols)));
    }
    a.check::<T>(who, "A")?;
    b.check::<T>(who, "B")?;
    c.check::<T>(who, "C")?;
    for s in [&a.buffer.stream, &b.buffer.stream, &c.buffer.stream] {
        if s.cu_stream() != res.stream.cu_stream() {
            return Err(Error::logic(who, "A, B and C must be ordered on the resources' stream"));
        }
    }
    let api = api(who)?;
    let _keep = ContextGuard::save(who)?;
    let args = GemmArgs { res, m, n, k, a, b, c };
    check(who, api, T::status(api, &args, alpha, beta))
}
