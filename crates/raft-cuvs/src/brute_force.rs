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
use raft_core::{DeviceMatrix, DeviceResources, DeviceVec, Layout, MatrixView, Result};

/// The result of a search: for each query (a row), its `k` nearest rows of the dataset, nearest
/// first. Both matrices are `n_queries × k`, row-major, on the resources searched, ordered on
/// their stream (their [`to_host`](DeviceMatrix::to_host) waits for the search).
#[derive(Debug)]
pub struct Neighbors {
    /// Row numbers of the dataset.
    pub neighbors: DeviceMatrix<i64>,
    /// Their distances, in the metric searched.
    pub distances: DeviceMatrix<f32>,
}

/// The `k` nearest rows of `dataset` to each row of `queries`, in squared Euclidean distance
/// ([`Metric::L2Expanded`]), computed by cuVS on `res` (their stream, cuBLAS handle and memory
/// resource).
///
/// Both are row-major matrix views with contiguous rows (any [`MatrixView`]: a whole array, a
/// range of rows of one, a [`DeviceMatrix`]); checked before any native call: as many columns
/// each, `1 ≤ k ≤ dataset rows`, both on `res`'s device. Arrays of other resources are ordered
/// too: `res`'s stream waits for their pending work first, and their own streams wait (on the
/// device, through an event) for the search before their next write or free; the call itself
/// returns once the search is queued.
///
/// # Errors
/// `Logic` for a column-major or strided view, columns that differ, a bad `k`, arrays of another
/// device, released resources, or a stream being captured into a CUDA graph (`res`'s, or that
/// of an array of other resources); `Cuda` when cuVS cannot be loaded or CUDA fails;
/// `OutOfMemory`.
///
/// ```no_run
/// # fn main() -> raft_core::Result<()> {
/// use raft_core::{DeviceMatrix, DeviceResources, Layout};
/// let res = DeviceResources::new()?;
/// let dataset = DeviceMatrix::from_host(&res, &[0.0f32, 0.0, 1.0, 0.0, 0.0, 5.0], 3, 2, Layout::RowMajor)?;
/// let queries = DeviceMatrix::from_host(&res, &[0.9f32, 0.1], 1, 2, Layout::RowMajor)?;
/// let found = raft_cuvs::brute_force_knn(&res, dataset.view(), queries.view(), 2)?;
/// assert_eq!(found.neighbors.to_host()?, [1, 0]);
/// # Ok(()) }
/// ```
pub fn brute_force_knn(res: &DeviceResources, dataset: MatrixView<'_, f32>, queries: MatrixView<'_, f32>, k: usize) -> Result<Neighbors> {
    const WHO: &str = "raft_cuvs::brute_force_knn";
    let results = check::knn(WHO, &dataset, &queries, k)?;
    check::same_device(WHO, "the dataset", dataset.resources().device(), res.device())?;
    check::same_device(WHO, "the queries", queries.resources().device(), res.device())?;
    result::api(WHO)?;
    let stream = res.stream().map_err(|e| e.with_who(WHO))?;
    let (mut neighbors, mut distances) = outputs(WHO, res, results)?;
    let _bound = result::bind_device(WHO, res)?;
    let (n_rows, dim) = (dataset.rows(), dataset.cols());
    let rows = dataset.as_slice();
    lend(WHO, res, |cuvs| {
        let mut index = BruteForceRaw::create(WHO)?;
        let searched = (|| {
            let mut rows = Tensor::input(WHO, &rows, n_rows, dim, &stream)?;
            // SAFETY: the index views `dataset`, borrowed for this whole call, and never written
            // meanwhile (a shared borrow); it is searched only just below and destroyed before
            // this closure returns, while `res` is lent.
            unsafe { index.build(WHO, &cuvs, &mut rows, Metric::L2Expanded.raw()) }?;
            search_into(WHO, &cuvs, &stream, &index, &queries, k, &mut neighbors, &mut distances)
        })();
        let destroyed = index.destroy(WHO);
        searched.and(destroyed)
    })?;
    finish(WHO, queries.rows(), k, neighbors, distances)
}

/// The two result arrays of `results` elements each, on `res`.
fn outputs(who: &'static str, res: &DeviceResources, results: usize) -> Result<(DeviceVec<i64>, DeviceVec<f32>)> {
    let neighbors = DeviceVec::<i64>::new(res, results).map_err(|e| e.with_who(who))?;
    let distances = DeviceVec::<f32>::new(res, results).map_err(|e| e.with_who(who))?;
    Ok((neighbors, distances))
}

/// The result arrays as `n_queries × k` matrices.
pub(crate) fn finish(
    who: &'static str,
    n_queries: usize,
    k: usize,
    neighbors: DeviceVec<i64>,
    distances: DeviceVec<f32>,
) -> Result<Neighbors> {
    let neighbors = DeviceMatrix::from_vec(neighbors, n_queries, k, Layout::RowMajor).map_err(|e| e.with_who(who))?;
    let distances = DeviceMatrix::from_vec(distances, n_queries, k, Layout::RowMajor).map_err(|e| e.with_who(who))?;
    Ok(Neighbors { neighbors, distances })
}

/// Searches a built index with `queries` (checked: row-major, contiguous, the index's columns),
/// writing `neighbors` and `distances` (`n_queries × k` elements each).
#[allow(clippy::too_many_arguments)]
fn search_into(
    who: &'static str,
    cuvs: &CuvsResources<'_>,
    stream: &CudaStream,
    index: &BruteForceRaw,
    queries: &MatrixView<'_, f32>,
    k: usize,
    neighbors: &mut DeviceVec<i64>,
    distances: &mut DeviceVec<f32>,
) -> Result<()> {
    let (n_queries, dim) = (queries.rows(), queries.cols());
    let q = queries.as_slice();
    let (mut n, mut d) = (neighbors.view_mut(), distances.view_mut());
    let mut queries = Tensor::input(who, &q, n_queries, dim, stream)?;
    let mut neighbors = Tensor::output(who, &mut n, n_queries, k, stream)?;
    let mut distances = Tensor::output(who, &mut d, n_queries, k, stream)?;
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
    dataset: DeviceMatrix<f32>,
    metric: Metric,
    resources: DeviceResources,
}

static_assertions::assert_impl_all!(BruteForceIndex: Send, Sync);

impl BruteForceIndex {
    /// Builds an index over `dataset` (row-major; its rows are what is searched) for `metric`,
    /// on the dataset's resources.
    ///
    /// # Errors
    /// `Logic` for a column-major or empty dataset, or released resources; `Cuda` when cuVS
    /// cannot be loaded or fails.
    pub fn build(dataset: DeviceMatrix<f32>, metric: Metric) -> Result<Self> {
        const WHO: &str = "BruteForceIndex::build";
        check::view(WHO, "dataset", &dataset.view())?;
        result::api(WHO)?;
        let res = dataset.resources().clone();
        let stream = res.stream().map_err(|e| e.with_who(WHO))?;
        let _bound = result::bind_device(WHO, &res)?;
        let (n_rows, dim) = (dataset.rows(), dataset.cols());
        let view = dataset.view();
        let rows = view.as_slice();
        let raw = lend(WHO, &res, |cuvs| {
            // The tensor first: its failure (a capture query) leaves no cuVS index behind.
            let mut rows = Tensor::input(WHO, &rows, n_rows, dim, &stream)?;
            let mut raw = BruteForceRaw::create(WHO)?;
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
        Ok(BruteForceIndex { raw: Some(raw), dataset, metric, resources: res })
    }

    /// The `k` nearest rows to each row of `queries` (row-major, contiguous, as many columns as
    /// the dataset), as [`brute_force_knn`] (same checks, results on the index's resources).
    pub fn search(&self, queries: MatrixView<'_, f32>, k: usize) -> Result<Neighbors> {
        const WHO: &str = "BruteForceIndex::search";
        check::view(WHO, "queries", &queries)?;
        check::same_dim(WHO, self.dim(), queries.cols())?;
        let results = check::k_of(WHO, k, self.n_rows(), queries.rows())?;
        check::same_device(WHO, "the queries", queries.resources().device(), self.resources.device())?;
        let raw = self.raw.as_ref().expect("an index holds its cuVS index until dropped");
        let stream = self.resources.stream().map_err(|e| e.with_who(WHO))?;
        let (mut neighbors, mut distances) = outputs(WHO, &self.resources, results)?;
        let _bound = result::bind_device(WHO, &self.resources)?;
        lend(WHO, &self.resources, |cuvs| search_into(WHO, &cuvs, &stream, raw, &queries, k, &mut neighbors, &mut distances))?;
        finish(WHO, queries.rows(), k, neighbors, distances)
    }

    /// The resources the index lives on (its dataset's).
    pub fn resources(&self) -> &DeviceResources {
        &self.resources
    }

    /// The dataset (read-only: cuVS views it).
    pub fn dataset(&self) -> &DeviceMatrix<f32> {
        &self.dataset
    }

    /// Rows of the dataset.
    pub fn n_rows(&self) -> usize {
        self.dataset.rows()
    }

    /// Columns of the dataset.
    pub fn dim(&self) -> usize {
        self.dataset.cols()
    }

    /// The metric the index was built for.
    pub fn metric(&self) -> Metric {
        self.metric
    }

    /// Destroys cuVS's index now, with its error (`Drop` does the same and logs it).
    ///
    /// # Errors
    /// `Logic` when the resources were released first, or while their stream is being captured
    /// into a CUDA graph (the index's memory is then leaked: cuVS would free it into the graph);
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
            .field("n_rows", &self.n_rows())
            .field("dim", &self.dim())
            .field("metric", &self.metric)
            .field("device", &self.resources.device())
            .finish()
    }
}
