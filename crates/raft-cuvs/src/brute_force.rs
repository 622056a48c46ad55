//! Exact k-nearest-neighbour search with cuVS's brute force (`cuvsBruteForceBuild` /
//! `cuvsBruteForceSearch`): one call ([`brute_force_knn`]) or an index kept for many searches
//! ([`BruteForceIndex`]).
use crate::check;
use crate::distance::Metric;
use crate::dlpack::Tensor;
use crate::lent::CuvsResources;
use crate::resources::{destroy_lent, lend};
use crate::result::{self, BruteForceRaw};
use cudarc::driver::CudaStream;
use raft_core::{DeviceResources, DeviceVec, Result};

/// Neighbour ids (row numbers of the dataset) and distances of a search, `n_queries × k` each,
/// row-major, each row nearest first.
pub type Neighbors = (DeviceVec<i64>, DeviceVec<f32>);

/// The `k` nearest rows of `dataset` (`n_rows × dim`, row-major) to each row of `queries`
/// (`n_queries × dim`), in squared Euclidean distance ([`Metric::L2Expanded`]), computed by cuVS
/// on `res` (their stream, cuBLAS handle and memory resource).
///
/// Every shape is checked against the arrays before any native call: `n_rows × dim` must be
/// `dataset.len()`, `n_queries × dim` must be `queries.len()`, `1 ≤ k ≤ n_rows`, and both arrays
/// must be on `res`'s device. The results are new arrays of `res`, ordered on its stream (their
/// [`to_host`](DeviceVec::to_host) waits for the search). Arrays of other resources are ordered
/// too: `res`'s stream waits for their pending work first, and this call waits for the search
/// before it returns.
///
/// # Errors
/// `Logic` for shapes that do not match the arrays, a bad `k`, arrays of another device, or
/// released resources; `Cuda` when cuVS cannot be loaded or CUDA fails; `OutOfMemory`.
///
/// ```no_run
/// # fn main() -> raft_core::Result<()> {
/// use raft_core::{DeviceResources, DeviceVec};
/// let res = DeviceResources::new()?;
/// let dataset = DeviceVec::from_host(&res, &[0.0f32, 0.0, 1.0, 0.0, 0.0, 5.0])?; // 3 rows × 2
/// let queries = DeviceVec::from_host(&res, &[0.9f32, 0.1])?;                      // 1 row × 2
/// let (ids, distances) = raft_cuvs::brute_force_knn(&res, &dataset, 3, 2, &queries, 1, 2)?;
/// assert_eq!(ids.to_host()?, [1, 0]);
/// # let _ = distances; Ok(()) }
/// ```
pub fn brute_force_knn(
    res: &DeviceResources,
    dataset: &DeviceVec<f32>,
    n_rows: usize,
    dim: usize,
    queries: &DeviceVec<f32>,
    n_queries: usize,
    k: usize,
) -> Result<Neighbors> {
    const WHO: &str = "raft_cuvs::brute_force_knn";
    let results = check::knn(WHO, dataset.len(), n_rows, dim, queries.len(), n_queries, k)?;
    check::same_device(WHO, "the dataset", dataset.resources().device(), res.device())?;
    check::same_device(WHO, "the queries", queries.resources().device(), res.device())?;
    result::api(WHO)?;
    let stream = res.stream().map_err(|e| e.with_who(WHO))?;
    let (mut neighbors, mut distances) = outputs(WHO, res, results)?;
    let _bound = result::bind_device(WHO, res)?;
    lend(WHO, res, |cuvs| {
        let mut index = BruteForceRaw::create(WHO)?;
        let searched = (|| {
            let mut rows = Tensor::input(WHO, dataset, n_rows, dim, &stream)?;
            // SAFETY: the index views `dataset`, borrowed for this whole call, and never written
            // meanwhile (a shared borrow); it is searched only just below and destroyed before
            // this closure returns, while `res` is lent.
            unsafe { index.build(WHO, &cuvs, &mut rows, Metric::L2Expanded.raw()) }?;
            search_into(WHO, &cuvs, &stream, &index, queries, n_queries, dim, k, &mut neighbors, &mut distances)
        })();
        let destroyed = index.destroy(WHO);
        searched.and(destroyed)
    })?;
    Ok((neighbors, distances))
}

/// The two result arrays of `results` elements each, on `res`.
fn outputs(who: &'static str, res: &DeviceResources, results: usize) -> Result<Neighbors> {
    let neighbors = DeviceVec::<i64>::new(res, results).map_err(|e| e.with_who(who))?;
    let distances = DeviceVec::<f32>::new(res, results).map_err(|e| e.with_who(who))?;
    Ok((neighbors, distances))
}

/// Searches a built index with `queries`, writing `neighbors` and `distances`.
#[allow(clippy::too_many_arguments)]
fn search_into(
    who: &'static str,
    cuvs: &CuvsResources<'_>,
    stream: &CudaStream,
    index: &BruteForceRaw,
    queries: &DeviceVec<f32>,
    n_queries: usize,
    dim: usize,
    k: usize,
    neighbors: &mut DeviceVec<i64>,
    distances: &mut DeviceVec<f32>,
) -> Result<()> {
    let mut queries = Tensor::input(who, queries, n_queries, dim, stream)?;
    let mut neighbors = Tensor::output(who, neighbors, n_queries, k, stream)?;
    let mut distances = Tensor::output(who, distances, n_queries, k, stream)?;
    // SAFETY: every caller built `index` with `dim` columns over a dataset that is still alive, of
    // at least `k` rows (checked); the tensors were just made with `n_queries` rows each, `dim`
    // columns for the queries and `k` for both outputs, each exactly its array.
    unsafe { index.search(who, cuvs, &mut queries, &mut neighbors, &mut distances) }
}

/// A cuVS brute-force index over a dataset it owns, for many exact searches.
///
/// The index lives on its dataset's resources ([`resources`](Self::resources)): it was built on
/// their stream, its searches run there, and it holds a clone of them, so they are not dropped
/// before it. cuVS keeps a view of the dataset, which the index owns and never hands out
/// mutably. Dropping the index destroys cuVS's index while the resources are lent (a release on
/// another thread waits for it). Release the index before releasing its resources explicitly:
/// an index found with released resources can no longer free its device memory, which is then
/// leaked (with a warning), never freed on a destroyed stream.
///
/// # Thread safety
/// `Send + Sync`: searches from several threads run on the index's resources, in turn on their
/// stream.
pub struct BruteForceIndex {
    raw: Option<BruteForceRaw>,
    dataset: DeviceVec<f32>,
    n_rows: usize,
    dim: usize,
    metric: Metric,
    resources: DeviceResources,
}

static_assertions::assert_impl_all!(BruteForceIndex: Send, Sync);

impl BruteForceIndex {
    /// Builds an index over `dataset` (`n_rows × dim`, row-major) for `metric`, on the
    /// dataset's resources.
    ///
    /// # Errors
    /// `Logic` when `n_rows × dim` is not `dataset.len()` or the resources were released; `Cuda`
    /// when cuVS cannot be loaded or fails.
    pub fn build(dataset: DeviceVec<f32>, n_rows: usize, dim: usize, metric: Metric) -> Result<Self> {
        const WHO: &str = "BruteForceIndex::build";
        check::matrix(WHO, "dataset", dataset.len(), n_rows, dim)?;
        result::api(WHO)?;
        let res = dataset.resources().clone();
        let stream = res.stream().map_err(|e| e.with_who(WHO))?;
        let _bound = result::bind_device(WHO, &res)?;
        let raw = lend(WHO, &res, |cuvs| {
            let mut raw = BruteForceRaw::create(WHO)?;
            let mut rows = Tensor::input(WHO, &dataset, n_rows, dim, &stream)?;
            // SAFETY: the index views `dataset`, which the BruteForceIndex made below owns, never
            // writes and drops only after destroying the index (Drop, `release`), which happens
            // while these resources are lent.
            match unsafe { raw.build(WHO, &cuvs, &mut rows, metric.raw()) } {
                Ok(()) => Ok(raw),
                Err(e) => {
                    if let Err(d) = raw.destroy(WHO) {
                        log::warn!(target: "raft", "{d}");
                    }
                    Err(e)
                }
            }
        })?;
        Ok(BruteForceIndex { raw: Some(raw), dataset, n_rows, dim, metric, resources: res })
    }

    /// The `k` nearest rows to each row of `queries` (`n_queries × dim`), as
    /// [`brute_force_knn`] (same checks, results on the index's resources).
    pub fn search(&self, queries: &DeviceVec<f32>, n_queries: usize, k: usize) -> Result<Neighbors> {
        const WHO: &str = "BruteForceIndex::search";
        check::matrix(WHO, "queries", queries.len(), n_queries, self.dim)?;
        let results = check::k_of(WHO, k, self.n_rows, n_queries)?;
        check::same_device(WHO, "the queries", queries.resources().device(), self.resources.device())?;
        let raw = self.raw.as_ref().expect("an index holds its cuVS index until dropped");
        let stream = self.resources.stream().map_err(|e| e.with_who(WHO))?;
        let (mut neighbors, mut distances) = outputs(WHO, &self.resources, results)?;
        let _bound = result::bind_device(WHO, &self.resources)?;
        lend(WHO, &self.resources, |cuvs| {
            search_into(WHO, &cuvs, &stream, raw, queries, n_queries, self.dim, k, &mut neighbors, &mut distances)
        })?;
        Ok((neighbors, distances))
    }

    /// The resources the index lives on (its dataset's).
    pub fn resources(&self) -> &DeviceResources {
        &self.resources
    }

    /// The dataset (read-only: cuVS views it).
    pub fn dataset(&self) -> &DeviceVec<f32> {
        &self.dataset
    }

    /// Rows of the dataset.
    pub fn n_rows(&self) -> usize {
        self.n_rows
    }

    /// Columns of the dataset.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// The metric the index was built for.
    pub fn metric(&self) -> Metric {
        self.metric
    }

    /// Destroys cuVS's index now, with its error (`Drop` does the same and logs it).
    ///
    /// # Errors
    /// `Logic` when the resources were released first (the index's memory is then leaked);
    /// `Cuda` when cuVS fails.
    pub fn release(mut self) -> Result<()> {
        self.destroy("BruteForceIndex::release")
    }

    fn destroy(&mut self, who: &'static str) -> Result<()> {
        let Some(raw) = self.raw.take() else { return Ok(()) };
        destroy_lent(who, &self.resources, || raw.destroy(who))
    }
}

impl Drop for BruteForceIndex {
    fn drop(&mut self) {
        if let Err(e) = self.destroy("BruteForceIndex::drop") {
            log::warn!(target: "raft", "{e}");
        }
    }
}

impl std::fmt::Debug for BruteForceIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BruteForceIndex")
            .field("n_rows", &self.n_rows)
            .field("dim", &self.dim)
            .field("metric", &self.metric)
            .field("device", &self.resources.device())
            .finish()
    }
}
