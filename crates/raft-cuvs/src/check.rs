//! The argument checks every call makes before any native call (before cuVS is even loaded):
//! shapes against the arrays' lengths, `k` against the rows, devices against the resources'.
//! cuVS takes shapes on trust from the DLPack tensors, so these are what keeps its kernels inside
//! the arrays.
use raft_core::{Error, Result};

/// `rows × cols` must be exactly an array of `len` elements, with neither side zero.
pub(crate) fn matrix(who: &'static str, what: &str, len: usize, rows: usize, cols: usize) -> Result<()> {
    if rows == 0 || cols == 0 {
        return Err(Error::logic(who, format!("{what}: a {rows}×{cols} matrix is empty")));
    }
    if rows.checked_mul(cols) != Some(len) {
        return Err(Error::logic(
            who,
            format!("{what}: a {rows}×{cols} matrix needs {} elements, the array has {len}", rows.saturating_mul(cols)),
        ));
    }
    if i64::try_from(len).is_err() {
        return Err(Error::logic(who, format!("{what}: {len} elements do not fit DLPack's 64-bit shape")));
    }
    Ok(())
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

/// The whole check of a k-NN search of `n_queries × dim` queries among `n_rows × dim` rows;
/// returns the number of results (`n_queries × k`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn knn(
    who: &'static str,
    dataset_len: usize,
    n_rows: usize,
    dim: usize,
    queries_len: usize,
    n_queries: usize,
    k: usize,
) -> Result<usize> {
    matrix(who, "dataset", dataset_len, n_rows, dim)?;
    matrix(who, "queries", queries_len, n_queries, dim)?;
    k_of(who, k, n_rows, n_queries)
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

    #[test]
    fn a_consistent_search_passes() {
        assert_eq!(knn("w", 2000 * 32, 2000, 32, 50 * 32, 50, 10).unwrap(), 500);
        assert_eq!(knn("w", 12, 4, 3, 3, 1, 4).unwrap(), 4, "k may be every row");
    }

    #[test]
    fn shapes_that_do_not_match_the_arrays_are_refused() {
        assert_eq!(
            refused(knn("w", 2000 * 32, 2000, 33, 50 * 32, 50, 10)),
            "w: dataset: a 2000×33 matrix needs 66000 elements, the array has 64000"
        );
        assert_eq!(
            refused(knn("w", 2000 * 32, 2000, 32, 50 * 32, 51, 10)),
            "w: queries: a 51×32 matrix needs 1632 elements, the array has 1600"
        );
        assert_eq!(refused(knn("w", 0, 0, 32, 32, 1, 1)), "w: dataset: a 0×32 matrix is empty");
        assert_eq!(refused(knn("w", 64, 2, 32, 0, 0, 1)), "w: queries: a 0×32 matrix is empty");
        // The lie of the soundness issue: a huge shape over a small array.
        refused(knn("w", 4, 4096, 4096, 4, 1, 1));
        refused(knn("w", 4, usize::MAX, 2, 2, 1, 1));
    }

    #[test]
    fn k_must_be_between_one_and_the_rows() {
        assert_eq!(refused(knn("w", 64, 2, 32, 32, 1, 0)), "w: k must be at least 1");
        assert_eq!(refused(knn("w", 64, 2, 32, 32, 1, 3)), "w: k = 3 is more than the 2 rows searched");
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
