//! The argument checks every call makes before any native call (before cuVS is even loaded):
//! shapes and layouts (the views themselves are checked against their arrays by raft-core), `k`
//! against the rows, devices against the resources'.
//! cuVS takes shapes on trust from the DLPack tensors, so these are what keeps its kernels inside
//! the arrays.
use raft_core::{Error, Layout, MatrixView, Result};

/// A matrix cuVS can take: neither side zero, its elements within DLPack's `int64_t`, and
/// row-major without gaps between rows (cuVS reads DLPack tensors of null strides: C order).
/// The view itself was checked against its array when made.
pub(crate) fn matrix(who: &'static str, what: &str, rows: usize, cols: usize, layout: Layout, contiguous: bool) -> Result<()> {
    if rows == 0 || cols == 0 {
        return Err(Error::logic(who, format!("{what}: a {rows}×{cols} matrix is empty")));
    }
    if rows.checked_mul(cols).is_none_or(|n| i64::try_from(n).is_err()) {
        return Err(Error::logic(who, format!("{what}: a {rows}×{cols} matrix does not fit DLPack's 64-bit shape")));
    }
    if layout != Layout::RowMajor {
        return Err(Error::logic(who, format!("{what}: cuVS takes row-major matrices, this one is {layout:?}")));
    }
    if !contiguous {
        return Err(Error::logic(
            who,
            format!("{what}: cuVS takes contiguous rows, this view's rows have gaps (a leading dimension above its {cols} columns)"),
        ));
    }
    Ok(())
}

/// [`matrix`] of a view.
pub(crate) fn view(who: &'static str, what: &str, m: &MatrixView<'_, f32>) -> Result<()> {
    matrix(who, what, m.rows(), m.cols(), m.layout(), m.is_contiguous())
}

/// The output of `n_queries` searches for `k` neighbours among `n_rows`: `k` from 1 to `n_rows`,
/// and `n_queries × k` elements that fit.
pub(crate) fn k_of(who: &'static str, k: usize, n_rows: usize, n_queries: usize) -> Result<usize> {
    if k == 0 {
        return Err(Error::logic(who, "k must be at least 1"));
    }
    if k > n_rows {
        return Err(Error::logic(who, format!("k = {k} is more than the {n_rows} rows searched")));
    }
    // cuVS's select_k takes k as a C int.
    if k > i32::MAX as usize {
        return Err(Error::logic(who, format!("k = {k} is above cuVS's {}", i32::MAX)));
    }
    n_queries
        .checked_mul(k)
        .filter(|n| i64::try_from(*n).is_ok())
        .ok_or_else(|| Error::logic(who, format!("{n_queries} queries × k = {k} results do not fit in memory")))
}

/// CAGRA's search walks `n_queries` in batches of at most 65535 with a 32-bit query offset, and
/// finds each batch's queries and results at `offset × dim` and `offset × k` in 32-bit
/// arithmetic: past 2^32 it would search the wrong queries and write the wrong rows. (cuVS
/// 26.08's `cagra_search.cuh`: `query_dim * qid` and `topk * qid` are products of `uint32_t`s,
/// widened only when added to the pointer, so the `dim` factor is as binding as `k`'s.)
pub(crate) fn cagra_batches(who: &'static str, n_queries: usize, k: usize, dim: usize) -> Result<()> {
    const LIMIT: u128 = u32::MAX as u128;
    let widest = k.max(dim) as u128;
    if n_queries as u128 * widest > LIMIT || n_queries as u128 + 65535 > LIMIT {
        return Err(Error::logic(
            who,
            format!("{n_queries} queries × {} (k or dim) pass cuVS's 32-bit offsets of CAGRA search: search them in parts", k.max(dim)),
        ));
    }
    Ok(())
}

/// An array of device `array` used with resources of device `res`.
pub(crate) fn same_device(who: &'static str, what: &str, array: usize, res: usize) -> Result<()> {
    if array != res {
        return Err(Error::logic(who, format!("{what} is on device {array}, the resources on device {res}")));
    }
    Ok(())
}

/// The whole check of a k-NN search of `queries` among the rows of `dataset`; returns the
/// number of results (`n_queries × k`).
pub(crate) fn knn(who: &'static str, dataset: &MatrixView<'_, f32>, queries: &MatrixView<'_, f32>, k: usize) -> Result<usize> {
    view(who, "dataset", dataset)?;
    view(who, "queries", queries)?;
    same_dim(who, dataset.cols(), queries.cols())?;
    k_of(who, k, dataset.rows(), queries.rows())
}

/// Queries of `queries` columns against rows of `dim`.
pub(crate) fn same_dim(who: &'static str, dim: usize, queries: usize) -> Result<()> {
    if dim != queries {
        return Err(Error::logic(who, format!("queries of {queries} columns against rows of {dim}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use raft_core::ErrorKind;

    fn refused(r: Result<usize>) -> String {
        let e = r.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Logic);
        e.to_string()
    }

    fn refused_unit(r: Result<()>) -> String {
        let e = r.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Logic);
        e.to_string()
    }

    #[test]
    fn a_row_major_contiguous_matrix_passes() {
        assert!(matrix("w", "dataset", 2000, 32, Layout::RowMajor, true).is_ok());
        assert!(same_dim("w", 32, 32).is_ok());
        assert_eq!(k_of("w", 10, 2000, 50).unwrap(), 500);
        assert_eq!(k_of("w", 4, 4, 1).unwrap(), 4, "k may be every row");
    }

    #[test]
    fn layouts_cuvs_cannot_read_and_empty_or_huge_shapes_are_refused() {
        assert_eq!(
            refused_unit(matrix("w", "dataset", 4, 3, Layout::ColMajor, true)),
            "w: dataset: cuVS takes row-major matrices, this one is ColMajor"
        );
        assert_eq!(
            refused_unit(matrix("w", "queries", 4, 3, Layout::RowMajor, false)),
            "w: queries: cuVS takes contiguous rows, this view's rows have gaps (a leading dimension above its 3 columns)"
        );
        assert_eq!(refused_unit(matrix("w", "dataset", 0, 32, Layout::RowMajor, true)), "w: dataset: a 0×32 matrix is empty");
        assert_eq!(refused_unit(matrix("w", "queries", 0, 32, Layout::RowMajor, true)), "w: queries: a 0×32 matrix is empty");
        refused_unit(matrix("w", "dataset", usize::MAX, 2, Layout::RowMajor, true));
        refused_unit(matrix("w", "dataset", 1 << 62, 4, Layout::RowMajor, true));
        assert_eq!(refused_unit(same_dim("w", 32, 33)), "w: queries of 33 columns against rows of 32");
    }

    #[test]
    fn k_must_be_between_one_and_the_rows() {
        assert_eq!(refused(k_of("w", 0, 2, 1)), "w: k must be at least 1");
        assert_eq!(refused(k_of("w", 3, 2, 1)), "w: k = 3 is more than the 2 rows searched");
        refused(k_of("w", 2, 4, usize::MAX));
        assert_eq!(refused(k_of("w", 1 << 31, usize::MAX, 1)), "w: k = 2147483648 is above cuVS's 2147483647");
        assert!(k_of("w", i32::MAX as usize, usize::MAX, 1).is_ok());
    }

    #[test]
    fn cagra_batches_stay_within_cuvs_32_bit_offsets() {
        assert!(cagra_batches("w", 1_000_000, 10, 128).is_ok());
        assert!(cagra_batches("w", (u32::MAX as usize) / 128, 10, 128).is_ok());
        let e = cagra_batches("w", (u32::MAX as usize) / 128 + 1, 10, 128).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Logic);
        assert!(cagra_batches("w", 1 << 26, 100, 4).is_err(), "n_queries × k past 2^32");
        assert!(cagra_batches("w", u32::MAX as usize - 10, 1, 1).is_err(), "the batch offset itself wraps");
    }

    #[test]
    fn arrays_of_another_device_are_refused() {
        assert!(same_device("w", "queries", 0, 0).is_ok());
        assert_eq!(same_device("w", "queries", 1, 0).unwrap_err().to_string(), "w: queries is on device 1, the resources on device 0");
    }
}
