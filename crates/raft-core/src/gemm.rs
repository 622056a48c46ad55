//! GEMM through a resources object's cuBLAS handle (made lazily by RAFT, bound to its stream).
use crate::error::{Error, Result};
use crate::matrix::{Layout, MatrixView, MatrixViewMut};
use crate::result::buffer::NativeBuffer;
use crate::result::gemm::{self, GemmScalar, Operand};

/// One operand as cuBLAS (column-major) sees it: a row-major `rows × cols` matrix with leading
/// dimension `ld` is, stored, the column-major `cols × rows` matrix of its transpose, with the
/// same leading dimension.
fn operand<'a>(
    buffer: &'a NativeBuffer,
    offset: usize,
    rows: usize,
    cols: usize,
    ld: usize,
    layout: Layout,
    want_transposed: bool,
) -> Operand<'a> {
    let stored_transposed = layout == Layout::RowMajor;
    let (stored_rows, stored_cols) = if stored_transposed { (cols, rows) } else { (rows, cols) };
    Operand { buffer, offset, stored_rows, stored_cols, ld, transposed: stored_transposed != want_transposed }
}

fn read<'a, T: GemmScalar>(m: &MatrixView<'a, T>, want_transposed: bool) -> Operand<'a> {
    let (buffer, offset) = m.read_parts();
    operand(buffer, offset, m.rows(), m.cols(), m.ld(), m.layout(), want_transposed)
}

/// `C = alpha · A · B + beta · C` on the resources of `c`'s array, through their cuBLAS handle
/// and on their stream. Any mix of layouts; any views, sub-matrices included (each is passed
/// with its own leading dimension). Returns once queued: [`sync`] to wait.
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
    let res = c.resources().clone();
    if a.resources() != &res || b.resources() != &res {
        return Err(Error::logic(WHO, "A, B and C must belong to the same resources"));
    }
    let (c_layout, c_ld) = (c.layout(), c.ld());
    cublas_handle_for_a_gemm(WHO, &res)?;
    res.with_native(WHO, |native| {
        let (c_buf, c_offset) = c.write_parts();
        if c_layout == Layout::ColMajor {
            let (oa, ob) = (read(&a, false), read(&b, false));
            let oc = operand(c_buf, c_offset, m, n, c_ld, Layout::ColMajor, false);
            gemm::gemm(WHO, native, m, n, k, alpha, &oa, &ob, beta, &oc)
        } else {
            // Row-major C is column-major Cᵀ = Bᵀ·Aᵀ.
            let (ob, oa) = (read(&b, true), read(&a, true));
            let oc = operand(c_buf, c_offset, n, m, c_ld, Layout::ColMajor, false);
            gemm::gemm(WHO, native, n, m, k, alpha, &ob, &oa, beta, &oc)
        }
    })
}

/// The resources' cuBLAS handle made before a GEMM queues (through `made_handle`: backpressure,
/// and a drain and one more try on `OutOfMemory`), not inside the shim's GEMM; a stream being
/// captured is refused first, as the GEMM itself would be, so no handle is made into a capture.
/// Once made, one look (the GEMM asks about the capture itself).
pub(crate) fn cublas_handle_for_a_gemm(who: &'static str, res: &crate::DeviceResources) -> Result<()> {
    use crate::handle_kind::HandleKind;
    if res.has_handle(HandleKind::Cublas).map_err(|e| e.with_who(who))? {
        return Ok(());
    }
    res.with_native(who, |native| gemm::refuse_capture_of_gemm(who, native.stream()))?;
    res.made_handle(who, HandleKind::Cublas).map(drop)
}
