//! GEMM through a resources object's cuBLAS handle (made lazily by RAFT, bound to its stream).
use crate::array::{Layout, MatrixView, MatrixViewMut};
use crate::error::{Error, Result};
use crate::result::gemm::{self, GemmScalar, Operand};

/// One operand as cuBLAS (column-major) sees it: a row-major `rows × cols` matrix is, stored,
/// the column-major `cols × rows` matrix of its transpose.
fn operand<'a, T: GemmScalar>(m: &MatrixView<'a, T>, want_transposed: bool) -> Operand<'a> {
    let stored_transposed = m.layout() == Layout::RowMajor;
    let (stored_rows, stored_cols) = if stored_transposed { (m.cols(), m.rows()) } else { (m.rows(), m.cols()) };
    Operand {
        buffer: m.data().native(),
        stored_rows,
        stored_cols,
        ld: stored_rows.max(1),
        transposed: stored_transposed != want_transposed,
    }
}

/// `C = alpha · A · B + beta · C` on the resources of `c`'s array, through their cuBLAS handle
/// and on their stream. Any mix of layouts. Returns once queued: [`sync`] to wait.
///
/// [`sync`]: crate::DeviceResources::sync
///
/// # Errors
/// `Logic` when the shapes do not chain (`A` is m×k, `B` k×n, `C` m×n), the arrays belong to
/// different resources, or the resources were released; `Cuda` when cuBLAS fails.
pub fn gemm<T: GemmScalar>(alpha: T, a: MatrixView<'_, T>, b: MatrixView<'_, T>, beta: T, mut c: MatrixViewMut<'_, T>) -> Result<()> {
    const WHO: &str = "gemm";
    let (m, k, n) = (a.rows(), a.cols(), b.cols());
    if b.rows() != k || c.rows() != m || c.cols() != n {
        return Err(Error::logic(
            WHO,
            format!("shapes do not chain: A {}×{}, B {}×{}, C {}×{}", a.rows(), a.cols(), b.rows(), b.cols(), c.rows(), c.cols()),
        ));
    }
    let res = c.data_mut().resources().clone();
    if a.data().resources() != &res || b.data().resources() != &res {
        return Err(Error::logic(WHO, "A, B and C must belong to the same resources"));
    }
    let c_layout = c.layout();
    res.with_native(WHO, |native| {
        let c_buf = c.data_mut().native_mut();
        if c_layout == Layout::ColMajor {
            let (oa, ob) = (operand(&a, false), operand(&b, false));
            gemm::gemm(WHO, native, m, n, k, alpha, &oa, &ob, beta, c_buf, m.max(1))
        } else {
            // Row-major C is column-major Cᵀ = Bᵀ·Aᵀ.
            let (ob, oa) = (operand(&b, true), operand(&a, true));
            gemm::gemm(WHO, native, n, m, k, alpha, &ob, &oa, beta, c_buf, n.max(1))
        }
    })
}
