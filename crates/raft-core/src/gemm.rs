//! GEMM through a resources object's cuBLAS handle (made lazily by RAFT, bound to its stream).
use crate::array::{DeviceScalar, Layout, MatrixView, MatrixViewMut};
use crate::error::{Error, Result};
use crate::ffi::check;
use raft_sys as sys;

/// Element types cuBLAS multiplies: `f32` (cublasSgemm) and `f64` (cublasDgemm).
pub trait GemmScalar: DeviceScalar + sealed::Sealed {
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn raw_gemm(
        res: *mut sys::raftrs_resources,
        ta: i32,
        tb: i32,
        m: i64,
        n: i64,
        k: i64,
        alpha: Self,
        a: *const Self,
        lda: i64,
        b: *const Self,
        ldb: i64,
        beta: Self,
        c: *mut Self,
        ldc: i64,
    ) -> sys::raftrs_status;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
}

impl GemmScalar for f32 {
    unsafe fn raw_gemm(
        res: *mut sys::raftrs_resources,
        ta: i32,
        tb: i32,
        m: i64,
        n: i64,
        k: i64,
        alpha: f32,
        a: *const f32,
        lda: i64,
        b: *const f32,
        ldb: i64,
        beta: f32,
        c: *mut f32,
        ldc: i64,
    ) -> sys::raftrs_status {
        // SAFETY: forwarded; the caller upholds raftrs_gemm_f32's contract.
        unsafe { sys::raftrs_gemm_f32(res, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc) }
    }
}

impl GemmScalar for f64 {
    unsafe fn raw_gemm(
        res: *mut sys::raftrs_resources,
        ta: i32,
        tb: i32,
        m: i64,
        n: i64,
        k: i64,
        alpha: f64,
        a: *const f64,
        lda: i64,
        b: *const f64,
        ldb: i64,
        beta: f64,
        c: *mut f64,
        ldc: i64,
    ) -> sys::raftrs_status {
        // SAFETY: forwarded; the caller upholds raftrs_gemm_f64's contract.
        unsafe { sys::raftrs_gemm_f64(res, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc) }
    }
}

/// One operand as cuBLAS (column-major) sees it: its pointer, whether to transpose, its lead.
fn operand<T: DeviceScalar>(m: &MatrixView<'_, T>, want_transposed: bool) -> (*const T, i32, i64) {
    // Column-major storage of a row-major matrix is its transpose.
    let stored_transposed = m.layout == Layout::RowMajor;
    let ld = if stored_transposed { m.cols } else { m.rows }.max(1) as i64;
    (m.data.as_ptr(), (stored_transposed != want_transposed) as i32, ld)
}

/// `C = alpha · A · B + beta · C` on the resources of `c`'s array, through their cuBLAS handle
/// and on their stream. Any mix of layouts. Returns once queued: [`sync`] to wait.
///
/// [`sync`]: crate::DeviceResources::sync
///
/// # Errors
/// `Logic` when the shapes do not chain (`A` is m×k, `B` k×n, `C` m×n), the arrays belong to
/// different resources, or the resources were released; `Cuda` when cuBLAS fails.
pub fn gemm<T: GemmScalar>(alpha: T, a: MatrixView<'_, T>, b: MatrixView<'_, T>, beta: T, c: MatrixViewMut<'_, T>) -> Result<()> {
    const WHO: &str = "gemm";
    let (m, k, n) = (a.rows, a.cols, b.cols);
    if b.rows != k || c.rows != m || c.cols != n {
        return Err(Error::logic(
            WHO,
            format!("shapes do not chain: A {}×{}, B {}×{}, C {}×{}", a.rows, a.cols, b.rows, b.cols, c.rows, c.cols),
        ));
    }
    let res = c.data.resources().clone();
    if a.data.resources() != &res || b.data.resources() != &res {
        return Err(Error::logic(WHO, "A, B and C must belong to the same resources"));
    }
    let c_ptr = c.data.as_mut_ptr();
    let _keep = crate::device::ContextGuard::save(WHO)?;
    res.with_live(WHO, |live| {
        let status = if c.layout == Layout::ColMajor {
            let (pa, ta, lda) = operand(&a, false);
            let (pb, tb, ldb) = operand(&b, false);
            // SAFETY: pointers address arrays of the shapes checked above, kept alive by the
            // borrows; the native resources are alive under the read lock.
            unsafe { T::raw_gemm(live.raw(), ta, tb, m as i64, n as i64, k as i64, alpha, pa, lda, pb, ldb, beta, c_ptr, m.max(1) as i64) }
        } else {
            // Row-major C is column-major Cᵀ = Bᵀ·Aᵀ.
            let (pb, tb, ldb) = operand(&b, true);
            let (pa, ta, lda) = operand(&a, true);
            // SAFETY: as above, with the operands swapped.
            unsafe { T::raw_gemm(live.raw(), tb, ta, n as i64, m as i64, k as i64, alpha, pb, ldb, pa, lda, beta, c_ptr, n.max(1) as i64) }
        };
        check(WHO, status)
    })
}
