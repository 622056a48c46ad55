//! Approximate nearest-neighbour search with cuVS's CAGRA graph index (`cuvsCagraBuild` /
//! `cuvsCagraSearch`).
use crate::brute_force::Neighbors;
use crate::check;
use crate::distance::Metric;
use crate::dlpack::Tensor;
use crate::resources::{destroy_lent, lend};
use crate::result::{self, CagraIndexParamsRaw, CagraRaw, CagraSearchParamsRaw, DatasetRaw};
use crate::sys;
use raft_core::{DeviceResources, DeviceVec, Error, Result};

/// How CAGRA builds the k-NN graph it prunes (cuVS's `cuvsCagraGraphBuildAlgo`).
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CagraBuildAlgo {
    /// cuVS chooses.
    AutoSelect,
    /// IVF-PQ (cuVS's default), with its default parameters.
    IvfPq,
    /// NN-Descent (experimental in cuVS), iterations from [`CagraIndexParams::nn_descent_niter`].
    NnDescent,
    /// Iterative CAGRA search and optimisation (experimental in cuVS).
    IterativeCagraSearch,
}

/// CAGRA's build parameters: `None` keeps cuVS's default (in brackets).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CagraIndexParams {
    /// [`Metric::L2Expanded`], [`Metric::InnerProduct`] or [`Metric::CosineExpanded`] (L2).
    pub metric: Option<Metric>,
    /// Degree of the k-NN graph before pruning (128).
    pub intermediate_graph_degree: Option<usize>,
    /// Degree of the final graph (64).
    pub graph_degree: Option<usize>,
    /// How the k-NN graph is built (IVF-PQ).
    pub build_algo: Option<CagraBuildAlgo>,
    /// NN-Descent's iterations (20).
    pub nn_descent_niter: Option<usize>,
}

impl CagraIndexParams {
    fn check(&self, who: &'static str) -> Result<()> {
        if let Some(m) = self.metric {
            if !matches!(m, Metric::L2Expanded | Metric::InnerProduct | Metric::CosineExpanded) {
                return Err(Error::logic(who, format!("CAGRA does not measure {m:?}: use L2Expanded, InnerProduct or CosineExpanded")));
            }
        }
        if self.graph_degree == Some(0) || self.intermediate_graph_degree == Some(0) {
            return Err(Error::logic(who, "graph degrees must be at least 1"));
        }
        Ok(())
    }

    fn apply(&self, raw: &mut sys::cuvsCagraIndexParams) {
        if let Some(m) = self.metric {
            raw.metric = m.raw();
        }
        if let Some(d) = self.intermediate_graph_degree {
            raw.intermediate_graph_degree = d;
        }
        if let Some(d) = self.graph_degree {
            raw.graph_degree = d;
        }
        if let Some(a) = self.build_algo {
            // CagraIndexParamsRaw puts IVF_PQ back before cuVS frees the parameters (their
            // `graph_build_params` were made for it); the other algorithms never read them.
            raw.build_algo = match a {
                CagraBuildAlgo::AutoSelect => sys::cuvsCagraGraphBuildAlgo::AUTO_SELECT,
                CagraBuildAlgo::IvfPq => sys::cuvsCagraGraphBuildAlgo::IVF_PQ,
                CagraBuildAlgo::NnDescent => sys::cuvsCagraGraphBuildAlgo::NN_DESCENT,
                CagraBuildAlgo::IterativeCagraSearch => sys::cuvsCagraGraphBuildAlgo::ITERATIVE_CAGRA_SEARCH,
            };
        }
        if let Some(n) = self.nn_descent_niter {
            raw.nn_descent_niter = n;
        }
    }
}

/// Which CAGRA search kernel runs (cuVS's `cuvsCagraSearchAlgo`).
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CagraSearchAlgo {
    /// One thread block per query: large batches.
    SingleCta,
    /// Several thread blocks per query: small batches.
    MultiCta,
    /// Several kernels.
    MultiKernel,
    /// cuVS chooses (its default).
    Auto,
}

/// CAGRA's search parameters: `None` keeps cuVS's default (in brackets). cuVS's persistent
/// search is not offered.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CagraSearchParams {
    /// Queries searched at once (0: automatic).
    pub max_queries: Option<usize>,
    /// Intermediate results kept per query, at least `k`: the main accuracy knob (64).
    pub itopk_size: Option<usize>,
    /// Most iterations (0: automatic).
    pub max_iterations: Option<usize>,
    /// The kernel (automatic).
    pub algo: Option<CagraSearchAlgo>,
    /// Threads per distance: 4, 8, 16 or 32 (0: automatic).
    pub team_size: Option<usize>,
    /// Graph nodes taken as starting points per iteration (1).
    pub search_width: Option<usize>,
    /// Fewest iterations (0).
    pub min_iterations: Option<usize>,
    /// Thread block size: 0 (automatic), 64, 128, 256, 512 or 1024.
    pub thread_block_size: Option<usize>,
    /// Random samplings of the initial nodes (1).
    pub num_random_samplings: Option<u32>,
    /// Bit mask of the initial random seed node selection (0x128394).
    pub rand_xor_mask: Option<u64>,
}

impl CagraSearchParams {
    fn apply(&self, raw: &mut sys::cuvsCagraSearchParams) {
        let set = |field: &mut usize, value: Option<usize>| {
            if let Some(v) = value {
                *field = v;
            }
        };
        set(&mut raw.max_queries, self.max_queries);
        set(&mut raw.itopk_size, self.itopk_size);
        set(&mut raw.max_iterations, self.max_iterations);
        set(&mut raw.team_size, self.team_size);
        set(&mut raw.search_width, self.search_width);
        set(&mut raw.min_iterations, self.min_iterations);
        set(&mut raw.thread_block_size, self.thread_block_size);
        if let Some(a) = self.algo {
            raw.algo = match a {
                CagraSearchAlgo::SingleCta => sys::cuvsCagraSearchAlgo::SINGLE_CTA,
                CagraSearchAlgo::MultiCta => sys::cuvsCagraSearchAlgo::MULTI_CTA,
                CagraSearchAlgo::MultiKernel => sys::cuvsCagraSearchAlgo::MULTI_KERNEL,
                CagraSearchAlgo::Auto => sys::cuvsCagraSearchAlgo::AUTO,
            };
        }
        if let Some(n) = self.num_random_samplings {
            raw.num_random_samplings = n;
        }
        if let Some(m) = self.rand_xor_mask {
            raw.rand_xor_mask = m;
        }
    }
}

/// A CAGRA index over a dataset it owns.
///
/// As [`BruteForceIndex`](crate::BruteForceIndex): it lives on its dataset's resources (built on
/// their stream, searched there, holding a clone of them), cuVS keeps a view of the dataset (or,
/// when its rows are not a multiple of 16 bytes, a padded copy the index owns), and dropping it
/// destroys cuVS's index while the resources are lent. Release the index before releasing its
/// resources explicitly; an index found with released resources leaks its device memory (with a
/// warning) rather than free it on a destroyed stream.
///
/// # Thread safety
/// `Send + Sync`: searches from several threads run on the index's resources, in turn on their
/// one stream (cuVS 26.08's race between searches on several streams of one resources object,
/// rapidsai/cuvs#2237, does not arise).
pub struct CagraIndex {
    raw: Option<CagraRaw>,
    /// The padded dataset the index reads: a view of `dataset`, or a copy it owns. Destroyed
    /// after `raw`.
    rows: Option<DatasetRaw>,
    dataset: DeviceVec<f32>,
    n_rows: usize,
    dim: usize,
    graph_degree: usize,
    resources: DeviceResources,
}

static_assertions::assert_impl_all!(CagraIndex: Send, Sync);

impl CagraIndex {
    /// Builds a CAGRA index over `dataset` (`n_rows × dim`, row-major), on the dataset's
    /// resources. Rows of a multiple of 4 floats are used in place; others are copied into
    /// CAGRA's padded layout first.
    ///
    /// # Errors
    /// `Logic` when `n_rows × dim` is not `dataset.len()`, for a metric CAGRA does not take, or
    /// on released resources; `Cuda` when cuVS cannot be loaded or fails; `OutOfMemory`.
    pub fn build(dataset: DeviceVec<f32>, n_rows: usize, dim: usize, params: &CagraIndexParams) -> Result<Self> {
        const WHO: &str = "CagraIndex::build";
        check::matrix(WHO, "dataset", dataset.len(), n_rows, dim)?;
        params.check(WHO)?;
        result::api(WHO)?;
        let res = dataset.resources().clone();
        let stream = res.stream().map_err(|e| e.with_who(WHO))?;
        let _bound = result::bind_device(WHO, &res)?;
        let (raw, rows) = lend(WHO, &res, |cuvs| {
            let mut tensor = Tensor::input(WHO, &dataset, n_rows, dim, &stream)?;
            let rows = if (dim * std::mem::size_of::<f32>()) % 16 == 0 {
                // SAFETY: the view is of `dataset`, which the CagraIndex made below owns, never
                // writes and drops only after destroying this view and the index.
                unsafe { DatasetRaw::padded_view(WHO, &cuvs, &mut tensor) }?
            } else {
                DatasetRaw::padded_copy(WHO, &cuvs, &mut tensor)?
            };
            let built = (|| {
                let mut cparams = CagraIndexParamsRaw::create(WHO)?;
                params.apply(cparams.get_mut());
                let mut raw = CagraRaw::create(WHO)?;
                // SAFETY: `rows` (and the array it may view) is kept by the CagraIndex made
                // below until after the index is destroyed, while these resources are lent.
                match unsafe { raw.build(WHO, &cuvs, &mut cparams, &rows) } {
                    Ok(()) => Ok(raw),
                    Err(e) => {
                        if let Err(d) = raw.destroy(WHO) {
                            log::warn!(target: "raft", "{d}");
                        }
                        Err(e)
                    }
                }
            })();
            match built {
                Ok(raw) => Ok((raw, rows)),
                Err(e) => {
                    if let Err(d) = rows.destroy(WHO) {
                        log::warn!(target: "raft", "{d}");
                    }
                    Err(e)
                }
            }
        })?;
        let mut index = CagraIndex { raw: Some(raw), rows: Some(rows), dataset, n_rows, dim, graph_degree: 0, resources: res.clone() };
        let (built_dim, size, degree) = index.raw.as_ref().expect("just built").dims(WHO)?;
        if built_dim != dim as i64 || size != n_rows as i64 {
            return Err(Error::new(
                raft_core::ErrorKind::Generic,
                WHO,
                format!("cuVS built an index of {size}×{built_dim} from a {n_rows}×{dim} dataset"),
            ));
        }
        index.graph_degree = usize::try_from(degree).unwrap_or(0);
        Ok(index)
    }

    /// The `k` approximate nearest rows to each row of `queries` (`n_queries × dim`), with
    /// `params`, on the index's resources: neighbour ids and distances, `n_queries × k` each,
    /// nearest first. cuVS refuses a `k` above the (rounded up) `itopk_size`.
    ///
    /// # Errors
    /// `Logic` for queries that do not match (`n_queries × dim` elements, the index's device), a
    /// bad `k`, or released resources; `Cuda` / `OutOfMemory` from cuVS.
    pub fn search(&self, queries: &DeviceVec<f32>, n_queries: usize, k: usize, params: &CagraSearchParams) -> Result<Neighbors> {
        const WHO: &str = "CagraIndex::search";
        check::matrix(WHO, "queries", queries.len(), n_queries, self.dim)?;
        let results = check::k_of(WHO, k, self.n_rows, n_queries)?;
        check::same_device(WHO, "the queries", queries.resources().device(), self.resources.device())?;
        let raw = self.raw.as_ref().expect("an index holds its cuVS index until dropped");
        let stream = self.resources.stream().map_err(|e| e.with_who(WHO))?;
        let mut neighbors = DeviceVec::<i64>::new(&self.resources, results).map_err(|e| e.with_who(WHO))?;
        let mut distances = DeviceVec::<f32>::new(&self.resources, results).map_err(|e| e.with_who(WHO))?;
        let _bound = result::bind_device(WHO, &self.resources)?;
        lend(WHO, &self.resources, |cuvs| {
            let mut cparams = CagraSearchParamsRaw::create(WHO)?;
            params.apply(cparams.get_mut());
            let mut q = Tensor::input(WHO, queries, n_queries, self.dim, &stream)?;
            let mut n = Tensor::output(WHO, &mut neighbors, n_queries, k, &stream)?;
            let mut d = Tensor::output(WHO, &mut distances, n_queries, k, &stream)?;
            // SAFETY: the index was built with `dim` columns over `n_rows` ≥ k rows, and its
            // dataset is kept alive by `self`; the tensors have `n_queries` rows each, `dim`
            // columns for the queries, `k` for the outputs, each exactly its array.
            unsafe { raw.search(WHO, &cuvs, &mut cparams, &mut q, &mut n, &mut d) }
        })?;
        Ok((neighbors, distances))
    }

    /// The resources the index lives on (its dataset's).
    pub fn resources(&self) -> &DeviceResources {
        &self.resources
    }

    /// The dataset (read-only: cuVS may view it).
    pub fn dataset(&self) -> &DeviceVec<f32> {
        &self.dataset
    }

    /// Rows indexed.
    pub fn n_rows(&self) -> usize {
        self.n_rows
    }

    /// Columns of each row.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// The degree of the graph cuVS built.
    pub fn graph_degree(&self) -> usize {
        self.graph_degree
    }

    /// Destroys cuVS's index (and its padded rows) now, with the error (`Drop` does the same and
    /// logs it).
    ///
    /// # Errors
    /// `Logic` when the resources were released first (the index's memory is then leaked);
    /// `Cuda` when cuVS fails.
    pub fn release(mut self) -> Result<()> {
        self.destroy("CagraIndex::release")
    }

    fn destroy(&mut self, who: &'static str) -> Result<()> {
        let (raw, rows) = (self.raw.take(), self.rows.take());
        if raw.is_none() && rows.is_none() {
            return Ok(());
        }
        destroy_lent(who, &self.resources, || {
            let index = raw.map_or(Ok(()), |r| r.destroy(who));
            // The rows after the index that reads them; a view only frees its host record.
            let rows = rows.map_or(Ok(()), |r| r.destroy(who));
            index.and(rows)
        })
    }
}

impl Drop for CagraIndex {
    fn drop(&mut self) {
        if let Err(e) = self.destroy("CagraIndex::drop") {
            log::warn!(target: "raft", "{e}");
        }
    }
}

impl std::fmt::Debug for CagraIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CagraIndex")
            .field("n_rows", &self.n_rows)
            .field("dim", &self.dim)
            .field("graph_degree", &self.graph_degree)
            .field("device", &self.resources.device())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cagra_takes_three_metrics() {
        let ok = CagraIndexParams { metric: Some(Metric::InnerProduct), ..Default::default() };
        assert!(ok.check("t").is_ok());
        let e = CagraIndexParams { metric: Some(Metric::L1), ..Default::default() }.check("t").unwrap_err();
        assert_eq!(e.kind(), raft_core::ErrorKind::Logic);
        assert!(CagraIndexParams { graph_degree: Some(0), ..Default::default() }.check("t").is_err());
    }
}
