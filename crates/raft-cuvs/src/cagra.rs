//! Approximate nearest-neighbour search with cuVS's CAGRA graph index (`cuvsCagraBuild` /
//! `cuvsCagraSearch`).
use crate::brute_force::Neighbors;
use crate::cagra_kernels::{limit_batches, CagraSearchAlgo, MAX_ITOPK_SINGLE_CTA, MAX_QUERIES};
use crate::check;
use crate::distance::Metric;
use crate::dlpack::Tensor;
use crate::resources::{destroy_lent, lend};
use crate::result::{self, CagraIndexParamsRaw, CagraRaw, CagraSearchParamsRaw, DatasetRaw};
use crate::sys;
use raft_core::{DeviceMatrix, DeviceResources, DeviceVec, Error, MatrixView, Result};

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
    /// [`Metric::L2Expanded`] or [`Metric::InnerProduct`] (L2). [`Metric::CosineExpanded`] is
    /// refused: cuVS 26.08 would search a later cosine index at a dropped one's address with
    /// the dropped index's freed norms.
    pub metric: Option<Metric>,
    /// Degree of the k-NN graph before pruning, at most 1024 (128). Lowered, with a warning, to
    /// `n_rows − 1` on smaller datasets, as cuVS does.
    pub intermediate_graph_degree: Option<usize>,
    /// Degree of the final graph (64). Lowered, with a warning, to the intermediate degree
    /// when above it, as cuVS does.
    pub graph_degree: Option<usize>,
    /// How the k-NN graph is built (IVF-PQ).
    pub build_algo: Option<CagraBuildAlgo>,
    /// NN-Descent's iterations, 1 to 1024 (20).
    pub nn_descent_niter: Option<usize>,
}

/// cuVS's defaults for what [`CagraIndexParams`] leaves `None`.
const DEFAULT_INTERMEDIATE_DEGREE: usize = 128;
const DEFAULT_GRAPH_DEGREE: usize = 64;
/// cuVS's graph optimisation sorts each node's intermediate neighbours in one thread block and
/// refuses more than 1024 of them, after the whole intermediate graph was built.
const MAX_INTERMEDIATE_DEGREE: usize = 1024;
/// CAGRA's node ids are 32-bit with the top bit marking a visited node: 2^31 − 1 rows at most.
const MAX_ROWS: usize = i32::MAX as usize;
/// A search keeps each query in shared memory (and cuVS packs its size in 24 bits): 65536
/// floats (256 KiB) are more than any GPU's thread block holds.
const MAX_DIM: usize = 1 << 16;
/// NN-Descent converges in tens of iterations; each is a pass over the whole graph.
const MAX_NN_DESCENT_NITER: usize = 1024;

impl CagraIndexParams {
    /// Every refusal before cuVS sees the parameters: values cuVS loops on, overflows 32-bit
    /// node ids with, or refuses only after building the whole intermediate graph. Degrees it
    /// lowers itself are not refused (see [`graph_degrees`]).
    fn check(&self, who: &'static str, n_rows: usize, dim: usize) -> Result<()> {
        if let Some(m) = self.metric {
            if m == Metric::CosineExpanded {
                // cuVS keeps each search's dataset descriptor in the resources, keyed by the
                // dataset's address and shape but not by the norms the cosine descriptor points
                // to: a later cosine index whose dataset lands at a dropped one's address is
                // searched with the dropped index's freed norms (the eighth audit; cuVS's
                // `factory.cuh`, `cagra_search.cuh`).
                return Err(Error::logic(
                    who,
                    "CAGRA's CosineExpanded is refused: cuVS 26.08 caches a cosine search's descriptor by the dataset's address without its norms, so a later index at a freed one's address would read freed memory; normalise the rows and use InnerProduct",
                ));
            }
            if !matches!(m, Metric::L2Expanded | Metric::InnerProduct) {
                return Err(Error::logic(who, format!("CAGRA does not measure {m:?}: use L2Expanded or InnerProduct")));
            }
        }
        if self.graph_degree == Some(0) || self.intermediate_graph_degree == Some(0) {
            return Err(Error::logic(who, "graph degrees must be at least 1"));
        }
        // One row has no neighbour: cuVS would build a graph of degree 0.
        if !(2..=MAX_ROWS).contains(&n_rows) {
            return Err(Error::logic(who, format!("CAGRA indexes 2 to {MAX_ROWS} rows (32-bit node ids), not {n_rows}")));
        }
        if dim > MAX_DIM {
            return Err(Error::logic(
                who,
                format!("CAGRA searches rows of at most {MAX_DIM} columns (a query lives in shared memory), not {dim}"),
            ));
        }
        let asked =
            (self.intermediate_graph_degree.unwrap_or(DEFAULT_INTERMEDIATE_DEGREE), self.graph_degree.unwrap_or(DEFAULT_GRAPH_DEGREE));
        let (intermediate, _) = graph_degrees(asked.0, asked.1, n_rows);
        if intermediate > MAX_INTERMEDIATE_DEGREE {
            return Err(Error::logic(who, format!("intermediate_graph_degree = {intermediate} is above cuVS's {MAX_INTERMEDIATE_DEGREE}")));
        }
        if let Some(n) = self.nn_descent_niter {
            if n == 0 || n > MAX_NN_DESCENT_NITER {
                return Err(Error::logic(who, format!("nn_descent_niter = {n}: from 1 to {MAX_NN_DESCENT_NITER}")));
            }
        }
        Ok(())
    }

    /// Writes the parameters given over cuVS's defaults in `raw`, then lowers the degrees as
    /// cuVS would for `n_rows` rows (so the values cuVS gets are the ones it uses); returns what
    /// was lowered, for the log.
    fn apply(&self, raw: &mut sys::cuvsCagraIndexParams, n_rows: usize) -> Option<String> {
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
        let asked = (raw.intermediate_graph_degree, raw.graph_degree);
        let (intermediate, graph) = graph_degrees(asked.0, asked.1, n_rows);
        (raw.intermediate_graph_degree, raw.graph_degree) = (intermediate, graph);
        (asked != (intermediate, graph)).then(|| {
            format!(
                "intermediate_graph_degree {} and graph_degree {} lowered to {intermediate} and {graph} for {n_rows} rows, as cuVS does",
                asked.0, asked.1
            )
        })
    }
}

/// cuVS 26.08's own adjustment of the degrees (`check_graph_degree` in `cagra_build.cuh`, on
/// every build path): a node has at most `n_rows − 1` neighbours, and the graph is pruned from
/// the intermediate one. Applied here, before cuVS, so that one set of parameters works on any
/// dataset and setting only the intermediate degree is enough.
fn graph_degrees(intermediate: usize, graph: usize, n_rows: usize) -> (usize, usize) {
    let intermediate = intermediate.min(n_rows.saturating_sub(1));
    (intermediate, graph.min(intermediate))
}

/// CAGRA's search parameters: `None` keeps cuVS's default (in brackets). cuVS's persistent
/// search is not offered.
///
/// [`CagraIndex::search`] refuses (`Logic`), before cuVS sees them, values cuVS would crash,
/// hang or overflow 32-bit arithmetic on: `search_width` or `itopk_size` 0, `itopk_size` above
/// 512 with [`CagraSearchAlgo::SingleCta`], `itopk_size + search_width × graph degree` above
/// 2^24, `max_queries` above 65535, iterations above 65536, a `team_size` or
/// `thread_block_size` not listed below, and `num_random_samplings` outside 1..=1024. A
/// `min_iterations` above a non-zero `max_iterations` raises the maximum to it, with a warning,
/// as cuVS does.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CagraSearchParams {
    /// Queries searched at once, at most 65535 (0: automatic).
    pub max_queries: Option<usize>,
    /// Intermediate results kept per query, at least `k`: the main accuracy knob (64).
    pub itopk_size: Option<usize>,
    /// Most iterations, at most 65536 (0: automatic); raised to `min_iterations` when below it.
    pub max_iterations: Option<usize>,
    /// The kernel (single-CTA, what cuVS's C API gives; `Auto` lets cuVS choose by batch).
    pub algo: Option<CagraSearchAlgo>,
    /// Threads per distance: 4, 8, 16 or 32 (0: automatic).
    pub team_size: Option<usize>,
    /// Graph nodes taken as starting points per iteration, at least 1 (1).
    pub search_width: Option<usize>,
    /// Fewest iterations, at most 65536 (0).
    pub min_iterations: Option<usize>,
    /// Thread block size: 0 (automatic), 64, 128, 256, 512 or 1024.
    pub thread_block_size: Option<usize>,
    /// Random samplings of the initial nodes, 1 to 1024 (1).
    pub num_random_samplings: Option<u32>,
    /// Bit mask of the initial random seed node selection (0x128394).
    pub rand_xor_mask: Option<u64>,
}

/// `itopk_size + search_width × graph_degree` candidates per query: cuVS sizes shared memory
/// and buffers from it in 32-bit arithmetic, 8 bytes per candidate.
const MAX_CANDIDATES: u64 = 1 << 24;
/// A search expands at least one new node per iteration, stops when none is left, and needs
/// far fewer than this; `min_iterations` past it holds the stream (u32::MAX did for hours).
const MAX_ITERATIONS: usize = 1 << 16;
/// Each sampling is one more distance per initial node, for every query.
const MAX_RANDOM_SAMPLINGS: u32 = 1024;

impl CagraSearchParams {
    /// Every refusal before cuVS sees the parameters, for an index of `graph_degree`: cuVS
    /// divides by `search_width` before checking it (SIGFPE at 0), truncates several values to
    /// 32 bits (`max_queries` of 2^32 loops forever), and runs `min_iterations` whatever they are.
    /// What cuVS adjusts in ordinary use, [`apply`](Self::apply) adjusts the same way.
    fn check(&self, who: &'static str, graph_degree: usize) -> Result<()> {
        let refuse = |what: String| Err(Error::logic(who, what));
        let search_width = self.search_width.unwrap_or(1);
        if search_width == 0 {
            return refuse("search_width must be at least 1".into());
        }
        let itopk = self.itopk_size.unwrap_or(64);
        if itopk == 0 {
            return refuse("itopk_size must be at least 1 (and at least k)".into());
        }
        // The single-CTA kernel is the default (cuVS's C API leaves `algo` 0): refused here with
        // a message that says so rather than by cuVS (the review, helper 108).
        if matches!(self.algo, None | Some(CagraSearchAlgo::SingleCta)) && itopk > MAX_ITOPK_SINGLE_CTA {
            return refuse(format!(
                "itopk_size = {itopk} is above the single-CTA kernel's {MAX_ITOPK_SINGLE_CTA} (the default kernel; Auto, \
                 MultiCta and MultiKernel take more)"
            ));
        }
        // In u128: neither product can wrap.
        let candidates = (itopk as u128).next_multiple_of(32) + search_width as u128 * graph_degree.max(1) as u128;
        if candidates > MAX_CANDIDATES as u128 {
            return refuse(format!(
                "itopk_size = {itopk} + search_width = {search_width} × graph degree {graph_degree} is {candidates} candidates per query, above {MAX_CANDIDATES}"
            ));
        }
        if let Some(q) = self.max_queries.filter(|q| *q > MAX_QUERIES) {
            return refuse(format!("max_queries = {q} is above CUDA's {MAX_QUERIES} blocks of a grid's second dimension"));
        }
        for (name, n) in [("max_iterations", self.max_iterations), ("min_iterations", self.min_iterations)] {
            if let Some(n) = n.filter(|n| *n > MAX_ITERATIONS) {
                return refuse(format!("{name} = {n} is above {MAX_ITERATIONS}"));
            }
        }
        if let Some(t) = self.team_size.filter(|t| ![0, 4, 8, 16, 32].contains(t)) {
            return refuse(format!("team_size = {t}: 0 (automatic), 4, 8, 16 or 32"));
        }
        if let Some(b) = self.thread_block_size.filter(|b| ![0, 64, 128, 256, 512, 1024].contains(b)) {
            return refuse(format!("thread_block_size = {b}: 0 (automatic), 64, 128, 256, 512 or 1024"));
        }
        if let Some(n) = self.num_random_samplings.filter(|n| *n == 0 || *n > MAX_RANDOM_SAMPLINGS) {
            return refuse(format!("num_random_samplings = {n}: from 1 to {MAX_RANDOM_SAMPLINGS}"));
        }
        Ok(())
    }

    /// Writes the parameters given over cuVS's defaults in `raw`, then raises `max_iterations` to
    /// `min_iterations` as cuVS would (`adjust_search_params` in `search_plan.cuh`); returns what
    /// was raised, for the log.
    fn apply(&self, raw: &mut sys::cuvsCagraSearchParams) -> Option<String> {
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
            raw.algo = a.raw();
        }
        if let Some(n) = self.num_random_samplings {
            raw.num_random_samplings = n;
        }
        if let Some(m) = self.rand_xor_mask {
            raw.rand_xor_mask = m;
        }
        // 0 is "automatic", which cuVS resolves itself (to min_iterations when that is set).
        (raw.max_iterations > 0 && raw.min_iterations > raw.max_iterations).then(|| {
            let raised = format!("max_iterations {} raised to min_iterations {}, as cuVS does", raw.max_iterations, raw.min_iterations);
            raw.max_iterations = raw.min_iterations;
            raised
        })
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
    dataset: DeviceMatrix<f32>,
    graph_degree: usize,
    resources: DeviceResources,
}

static_assertions::assert_impl_all!(CagraIndex: Send, Sync);

impl CagraIndex {
    /// Builds a CAGRA index over the rows of `dataset` (row-major), on the dataset's
    /// resources. Rows of a multiple of 4 floats are used in place; others are copied into
    /// CAGRA's padded layout first. Degrees the dataset cannot have (see [`CagraIndexParams`])
    /// are lowered with a warning, as cuVS would; [`graph_degree`](Self::graph_degree) says
    /// what was built.
    ///
    /// # Errors
    /// `Logic` for a column-major dataset, a metric CAGRA does not take,
    /// parameters outside cuVS's limits (fewer than 2 or more than 2^31 − 1 rows, more than 65536
    /// columns, a degree of 0, an intermediate degree above 1024 after lowering it to
    /// `n_rows − 1`, `nn_descent_niter` outside 1..=1024), or on released resources; `Cuda` when cuVS cannot be loaded or fails; `OutOfMemory`.
    pub fn build(dataset: DeviceMatrix<f32>, params: &CagraIndexParams) -> Result<Self> {
        const WHO: &str = "CagraIndex::build";
        let (n_rows, dim) = (dataset.rows(), dataset.cols());
        check::view(WHO, "dataset", &dataset.view())?;
        params.check(WHO, n_rows, dim)?;
        result::api(WHO)?;
        let res = dataset.resources().clone();
        let stream = res.stream().map_err(|e| e.with_who(WHO))?;
        let _bound = result::bind_device(WHO, &res)?;
        let view = dataset.view();
        let whole = view.as_slice();
        // Said once the index owns what was built: a logger that panics inside the lend leaked
        // the padded copy of the dataset (the twenty-second audit), and it ran in the lend's
        // relaxed capture mode.
        let (mut lowered, mut unsaid) = (None, Vec::new());
        let built = lend(WHO, &res, |cuvs| {
            let mut tensor = Tensor::input(WHO, &whole, n_rows, dim, &stream)?;
            let rows = if (dim * std::mem::size_of::<f32>()).is_multiple_of(16) {
                // SAFETY: the view is of `dataset`, which the CagraIndex made below owns, never
                // writes and drops only after destroying this view and the index.
                unsafe { DatasetRaw::padded_view(WHO, &cuvs, &mut tensor) }?
            } else {
                DatasetRaw::padded_copy(WHO, &cuvs, &mut tensor)?
            };
            let built = (|| {
                let mut cparams = CagraIndexParamsRaw::create(WHO)?;
                lowered = params.apply(cparams.get_mut(), n_rows);
                let mut raw = CagraRaw::create(WHO)?;
                // SAFETY: `rows` (and the array it may view) is kept by the CagraIndex made
                // below until after the index is destroyed, while these resources are lent.
                match unsafe { raw.build(WHO, &cuvs, &mut cparams, &rows) } {
                    Ok(()) => Ok(raw),
                    Err(e) => {
                        unsaid.extend(raw.destroy(WHO).err());
                        Err(e)
                    }
                }
            })();
            match built {
                Ok(raw) => Ok((raw, rows)),
                Err(e) => {
                    unsaid.extend(rows.destroy(WHO).err());
                    Err(e)
                }
            }
        });
        let say = |lowered: Option<String>, unsaid: Vec<Error>| {
            if let Some(lowered) = lowered {
                log::warn!(target: "raft", "{WHO}: {lowered}");
            }
            for d in unsaid {
                log::warn!(target: "raft", "{d}");
            }
        };
        let (raw, rows) = match built {
            Ok(built) => built,
            Err(e) => {
                say(lowered, unsaid);
                return Err(e);
            }
        };
        let mut index = CagraIndex { raw: Some(raw), rows: Some(rows), dataset, graph_degree: 0, resources: res.clone() };
        say(lowered, unsaid);
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

    /// The `k` approximate nearest rows to each row of `queries` (row-major, contiguous, the
    /// dataset's columns), with `params`, on the index's resources: neighbour ids and distances,
    /// `n_queries × k` each,
    /// nearest first. cuVS refuses a `k` above the (rounded up) `itopk_size`.
    ///
    /// # Errors
    /// `Logic` for queries that do not match (layout, columns, the index's device), a
    /// bad `k`, parameters outside cuVS's limits (see [`CagraSearchParams`]), more queries than
    /// cuVS's 32-bit batch offsets reach (`n_queries × max(k, dim)` above 2^32), released
    /// resources, or a stream being captured into a CUDA graph (the index's, or the queries' of
    /// other resources); `Cuda` / `OutOfMemory` from cuVS. Its working tables come from RAFT's
    /// workspace, a quarter of the device's free memory: cuVS 26.08's multi-CTA kernel takes 16
    /// bytes a table entry (run 220), so a deep multi-CTA search over a large batch (the table
    /// grows with `itopk_size` and `max_iterations`) is refused as `OutOfMemory` there; a lower
    /// `max_queries` takes less.
    pub fn search(&self, queries: MatrixView<'_, f32>, k: usize, params: &CagraSearchParams) -> Result<Neighbors> {
        const WHO: &str = "CagraIndex::search";
        check::view(WHO, "queries", &queries)?;
        check::same_dim(WHO, self.dim(), queries.cols())?;
        let n_queries = queries.rows();
        let results = check::k_of(WHO, k, self.n_rows(), n_queries)?;
        check::same_device(WHO, "the queries", queries.resources().device(), self.resources.device())?;
        params.check(WHO, self.graph_degree)?;
        check::cagra_batches(WHO, n_queries, k, self.dim())?;
        let raw = self.raw.as_ref().expect("an index holds its cuVS index until dropped");
        let stream = self.resources.stream().map_err(|e| e.with_who(WHO))?;
        let mut neighbors = DeviceVec::<i64>::new(&self.resources, results).map_err(|e| e.with_who(WHO))?;
        let mut distances = DeviceVec::<f32>::new(&self.resources, results).map_err(|e| e.with_who(WHO))?;
        let _bound = result::bind_device(WHO, &self.resources)?;
        let sm = || {
            let count =
                self.resources.context().attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
            count.ok().and_then(|n| usize::try_from(n).ok())
        };
        // Said after the lend, as the build's: not in its relaxed capture mode, and a logger's
        // panic meets no half-made call.
        let (mut raised, mut lowered) = (None, None);
        let searched = lend(WHO, &self.resources, |cuvs| {
            let mut cparams = CagraSearchParamsRaw::create(WHO)?;
            raised = params.apply(cparams.get_mut());
            lowered = limit_batches(cparams.get_mut(), self.graph_degree, self.n_rows(), n_queries, sm);
            let (qs, mut ns, mut ds) = (queries.as_slice(), neighbors.view_mut(), distances.view_mut());
            let mut q = Tensor::input(WHO, &qs, n_queries, self.dim(), &stream)?;
            let mut n = Tensor::output(WHO, &mut ns, n_queries, k, &stream)?;
            let mut d = Tensor::output(WHO, &mut ds, n_queries, k, &stream)?;
            // SAFETY: the index was built with `dim` columns over `n_rows` ≥ k rows, and its
            // dataset is kept alive by `self`; the tensors have `n_queries` rows each, `dim`
            // columns for the queries, `k` for the outputs, each exactly its array.
            unsafe { raw.search(WHO, &cuvs, &mut cparams, &mut q, &mut n, &mut d) }
        });
        if let Some(raised) = raised {
            log::warn!(target: "raft", "{WHO}: {raised}");
        }
        if let Some(lowered) = lowered {
            log::debug!(target: "raft", "{WHO}: {lowered}");
        }
        searched?;
        crate::brute_force::finish(WHO, n_queries, k, neighbors, distances)
    }

    /// The resources the index lives on (its dataset's).
    pub fn resources(&self) -> &DeviceResources {
        &self.resources
    }

    /// The dataset (read-only: cuVS may view it).
    pub fn dataset(&self) -> &DeviceMatrix<f32> {
        &self.dataset
    }

    /// Rows indexed.
    pub fn n_rows(&self) -> usize {
        self.dataset.rows()
    }

    /// Columns of each row.
    pub fn dim(&self) -> usize {
        self.dataset.cols()
    }

    /// The degree of the graph cuVS built.
    pub fn graph_degree(&self) -> usize {
        self.graph_degree
    }

    /// Destroys cuVS's index (and its padded rows) now, with the error (`Drop` does the same and
    /// logs it).
    ///
    /// # Errors
    /// `Logic` when the resources were released first, or while their stream is being captured
    /// into a CUDA graph (the index's memory is then leaked: cuVS would free it into the graph);
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
            .field("n_rows", &self.n_rows())
            .field("dim", &self.dim())
            .field("graph_degree", &self.graph_degree)
            .field("device", &self.resources.device())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cagra_kernels::query_stride;
    use raft_core::ErrorKind;

    fn refused(r: Result<()>) -> String {
        let e = r.expect_err("refused");
        assert_eq!((e.kind(), e.who()), (ErrorKind::Logic, "t"), "{e}");
        e.message().to_string()
    }

    fn build(p: CagraIndexParams) -> Result<()> {
        p.check("t", 1000, 128)
    }

    fn search(p: CagraSearchParams) -> Result<()> {
        p.check("t", 64)
    }

    /// What `cuvsCagraIndexParamsCreate` gives (cuVS 26.08's defaults).
    fn raw_index_defaults() -> sys::cuvsCagraIndexParams {
        sys::cuvsCagraIndexParams {
            metric: Metric::L2Expanded.raw(),
            intermediate_graph_degree: DEFAULT_INTERMEDIATE_DEGREE,
            graph_degree: DEFAULT_GRAPH_DEGREE,
            build_algo: sys::cuvsCagraGraphBuildAlgo::IVF_PQ,
            nn_descent_niter: 20,
            graph_build_params: std::ptr::null_mut(),
        }
    }

    /// The degrees cuVS gets for `p` on `n_rows` rows, and the warning (checked first).
    fn degrees(p: CagraIndexParams, n_rows: usize) -> ((usize, usize), Option<String>) {
        p.check("t", n_rows, 8).expect("checked");
        let mut raw = raw_index_defaults();
        let warning = p.apply(&mut raw, n_rows);
        ((raw.intermediate_graph_degree, raw.graph_degree), warning)
    }

    /// What `cuvsCagraSearchParamsCreate` gives (cuVS 26.08's defaults).
    fn raw_search_defaults() -> sys::cuvsCagraSearchParams {
        sys::cuvsCagraSearchParams {
            max_queries: 0,
            itopk_size: 64,
            max_iterations: 0,
            // cuvsCagraSearchParamsCreate names only itopk_size, search_width, the fill rate, the
            // samplings, the mask and the persistent fields: the rest is 0, so SINGLE_CTA and
            // HASH (c/src/neighbors/cagra.cpp; helper 108 read them from the pinned library).
            algo: sys::cuvsCagraSearchAlgo::SINGLE_CTA,
            team_size: 0,
            search_width: 1,
            min_iterations: 0,
            thread_block_size: 0,
            hashmap_mode: sys::cuvsCagraHashMode::HASH,
            hashmap_min_bitlen: 0,
            hashmap_max_fill_rate: 0.5,
            num_random_samplings: 1,
            rand_xor_mask: 0x128394,
            persistent: false,
            persistent_lifetime: 2.0,
            persistent_device_usage: 1.0,
        }
    }

    /// The iterations cuVS gets for `p`, and the warning (checked first).
    fn iterations(p: CagraSearchParams) -> ((usize, usize), Option<String>) {
        search(p).expect("checked");
        let mut raw = raw_search_defaults();
        let warning = p.apply(&mut raw);
        ((raw.min_iterations, raw.max_iterations), warning)
    }

    #[test]
    fn cagra_takes_two_metrics() {
        let ok = CagraIndexParams { metric: Some(Metric::InnerProduct), ..Default::default() };
        assert!(build(ok).is_ok());
        assert!(build(CagraIndexParams { metric: Some(Metric::L2Expanded), ..Default::default() }).is_ok());
        refused(build(CagraIndexParams { metric: Some(Metric::L1), ..Default::default() }));
        // The eighth audit: cuVS's descriptor cache would search a later cosine index with a
        // dropped one's freed norms.
        let cosine = refused(build(CagraIndexParams { metric: Some(Metric::CosineExpanded), ..Default::default() }));
        assert!(cosine.contains("without its norms"), "{cosine}");
        refused(build(CagraIndexParams { graph_degree: Some(0), ..Default::default() }));
    }

    #[test]
    fn build_parameters_within_cuvs_limits_pass() {
        assert!(build(CagraIndexParams::default()).is_ok());
        let p = CagraIndexParams {
            graph_degree: Some(32),
            intermediate_graph_degree: Some(64),
            nn_descent_niter: Some(20),
            ..Default::default()
        };
        assert!(build(p).is_ok());
        // Defaults on a small dataset: cuVS lowers both degrees to n_rows − 1 itself.
        assert!(CagraIndexParams::default().check("t", 10, 4).is_ok());
        assert!(CagraIndexParams { intermediate_graph_degree: Some(1024), graph_degree: Some(1024), ..Default::default() }
            .check("t", 2000, 4)
            .is_ok());
    }

    #[test]
    fn only_an_intermediate_degree_lowers_the_default_graph_degree_to_it() {
        let p = CagraIndexParams { intermediate_graph_degree: Some(32), ..Default::default() };
        let (lowered, warning) = degrees(p, 1000);
        assert_eq!(lowered, (32, 32));
        assert_eq!(
            warning.as_deref(),
            Some("intermediate_graph_degree 32 and graph_degree 64 lowered to 32 and 32 for 1000 rows, as cuVS does")
        );
        // An explicit graph degree above the (default) intermediate one too.
        assert_eq!(degrees(CagraIndexParams { graph_degree: Some(200), ..Default::default() }, 1000).0, (128, 128));
        assert_eq!(
            degrees(CagraIndexParams { graph_degree: Some(64), intermediate_graph_degree: Some(32), ..Default::default() }, 1000).0,
            (32, 32)
        );
    }

    #[test]
    fn degrees_the_rows_cannot_have_are_lowered_explicit_or_not() {
        // The same parameters on a large dataset and on a small test set.
        let p = CagraIndexParams { intermediate_graph_degree: Some(100), graph_degree: Some(50), ..Default::default() };
        assert_eq!(degrees(p, 1000), ((100, 50), None));
        let (lowered, warning) = degrees(p, 40);
        assert_eq!(lowered, (39, 39));
        assert_eq!(
            warning.as_deref(),
            Some("intermediate_graph_degree 100 and graph_degree 50 lowered to 39 and 39 for 40 rows, as cuVS does")
        );
        assert_eq!(degrees(CagraIndexParams { intermediate_graph_degree: Some(100), ..Default::default() }, 100).0, (99, 64));
        assert_eq!(degrees(CagraIndexParams { graph_degree: Some(50), ..Default::default() }, 50).0, (49, 49));
        assert_eq!(degrees(CagraIndexParams::default(), 10).0, (9, 9));
        assert_eq!(degrees(CagraIndexParams::default(), 2).0, (1, 1));
        // Above cuVS's limit of 1024 only before the lowering: cuVS takes it.
        assert_eq!(degrees(CagraIndexParams { intermediate_graph_degree: Some(2048), ..Default::default() }, 500).0, (499, 64));
    }

    #[test]
    fn build_parameters_cuvs_would_loop_on_or_refuse_late_are_refused() {
        let p = |f: fn(&mut CagraIndexParams)| {
            let mut p = CagraIndexParams::default();
            f(&mut p);
            p
        };
        assert_eq!(
            refused(p(|p| p.intermediate_graph_degree = Some(2048)).check("t", 5000, 8)),
            "intermediate_graph_degree = 2048 is above cuVS's 1024"
        );
        refused(p(|p| p.intermediate_graph_degree = Some(usize::MAX)).check("t", MAX_ROWS, 8));
        refused(build(p(|p| p.intermediate_graph_degree = Some(0))));
        refused(build(p(|p| p.nn_descent_niter = Some(0))));
        refused(build(p(|p| p.nn_descent_niter = Some(usize::MAX))));
        // One row has no neighbour; 2^31 rows overflow CAGRA's node ids.
        refused(CagraIndexParams::default().check("t", 1, 8));
        refused(CagraIndexParams::default().check("t", 1 << 31, 1));
        refused(CagraIndexParams::default().check("t", 1000, (1 << 16) + 1));
    }

    #[test]
    fn search_parameters_within_cuvs_limits_pass() {
        assert!(search(CagraSearchParams::default()).is_ok());
        let p = CagraSearchParams {
            max_queries: Some(65535),
            itopk_size: Some(512),
            max_iterations: Some(100),
            algo: Some(CagraSearchAlgo::SingleCta),
            team_size: Some(8),
            search_width: Some(4),
            min_iterations: Some(100),
            thread_block_size: Some(256),
            num_random_samplings: Some(2),
            rand_xor_mask: Some(u64::MAX),
        };
        assert!(search(p).is_ok());
        // Multi-CTA and multi-kernel searches take larger itopk sizes.
        assert!(
            search(CagraSearchParams { itopk_size: Some(4096), algo: Some(CagraSearchAlgo::MultiKernel), ..Default::default() }).is_ok()
        );
        // max_iterations 0 is "automatic", under any min_iterations.
        assert!(search(CagraSearchParams { max_iterations: Some(0), min_iterations: Some(10), ..Default::default() }).is_ok());
    }

    #[test]
    fn min_iterations_above_max_iterations_raise_it() {
        let (raised, warning) = iterations(CagraSearchParams { min_iterations: Some(20), max_iterations: Some(10), ..Default::default() });
        assert_eq!(raised, (20, 20));
        assert_eq!(warning.as_deref(), Some("max_iterations 10 raised to min_iterations 20, as cuVS does"));
        let limit = Some(MAX_ITERATIONS);
        assert_eq!(
            iterations(CagraSearchParams { min_iterations: limit, max_iterations: Some(1), ..Default::default() }).0,
            (1 << 16, 1 << 16)
        );
        // Consistent or automatic iterations are passed on as they are.
        assert_eq!(
            iterations(CagraSearchParams { min_iterations: Some(10), max_iterations: Some(20), ..Default::default() }),
            ((10, 20), None)
        );
        assert_eq!(iterations(CagraSearchParams { min_iterations: Some(10), ..Default::default() }), ((10, 0), None));
        assert_eq!(iterations(CagraSearchParams::default()), ((0, 0), None));
    }

    /// What cuVS gets for `p` over `n_queries` on a degree-`degree` index of a million rows, on a
    /// device of 132 multiprocessors (an H100's or H200's): the stride of the kernel it runs
    /// (multi-CTA's for an unresolved `Auto`), the batch and the kernel named.
    fn batch_of(p: CagraSearchParams, degree: usize, n_queries: usize) -> (u64, usize, sys::cuvsCagraSearchAlgo) {
        p.check("t", degree).expect("checked");
        let mut raw = raw_search_defaults();
        p.apply(&mut raw);
        limit_batches(&mut raw, degree, 1_000_000, n_queries, || Some(132));
        let batch = if raw.max_queries > 0 { raw.max_queries } else { n_queries.min(MAX_QUERIES) };
        let kernel = match raw.algo {
            sys::cuvsCagraSearchAlgo::SINGLE_CTA => CagraSearchAlgo::SingleCta,
            sys::cuvsCagraSearchAlgo::MULTI_KERNEL => CagraSearchAlgo::MultiKernel,
            _ => CagraSearchAlgo::MultiCta,
        };
        (query_stride(&raw, kernel, degree, 1_000_000), batch, raw.algo)
    }

    fn batch(p: CagraSearchParams, n_queries: usize) -> (u64, usize) {
        let (stride, batch, _) = batch_of(p, 64, n_queries);
        (stride, batch)
    }

    /// Helper 106: cuVS 26.08's CAGRA kernels find a query's visited-node table (single-CTA,
    /// in global memory in the `HASH` mode cuVS's C API gives; multi-kernel), traversed-node table
    /// and intermediate results (multi-CTA) and result buffers (multi-kernel) at `stride × query`
    /// in 32-bit arithmetic over buffers sized in 64 bits: past 2^32 the later queries of a batch
    /// share the earlier ones' tables and results, a silent wrong answer. Batches are lowered so
    /// that no offset passes 2^32; ordinary searches keep cuVS's batch.
    #[test]
    fn batches_keep_cuvs_per_query_offsets_within_32_bits() {
        use sys::cuvsCagraSearchAlgo as A;
        // A wide single-CTA search (the default kernel) of 100 iterations: a visited table of
        // 2^20 entries per query, so 4096 queries at once.
        let wide = CagraSearchParams { search_width: Some(64), max_iterations: Some(100), ..Default::default() };
        assert_eq!(batch_of(wide, 64, 8192), (1 << 20, 4096, A::SINGLE_CTA));
        // A multi-CTA search of itopk 65536: 2048 CTAs per query, a traversed table of 2^18.
        let deep = CagraSearchParams { itopk_size: Some(65536), algo: Some(CagraSearchAlgo::MultiCta), ..Default::default() };
        let (stride, queries) = batch(deep, 100_000);
        assert_eq!(stride, 1 << 18);
        assert!(stride * queries as u64 <= 1 << 32, "{queries} queries of {stride} pass 2^32");
        // A batch the user chose is lowered too; ordinary searches keep cuVS's batch: the default
        // (itopk 64, 4 + 64 iterations over a million rows) has a table of 2^14 entries a query.
        let chosen = CagraSearchParams { max_queries: Some(65535), ..deep };
        assert_eq!(batch(chosen, 100_000).1, 16384);
        assert_eq!(batch_of(CagraSearchParams::default(), 64, 100_000), (1 << 14, MAX_QUERIES, A::SINGLE_CTA));
        let high_recall =
            CagraSearchParams { itopk_size: Some(1024), search_width: Some(4), algo: Some(CagraSearchAlgo::Auto), ..Default::default() };
        assert_eq!(batch(high_recall, 100_000).1, MAX_QUERIES);
        // The default kernel at itopk 512 (the review, helper 108: `HASH` mode keeps no small
        // table): 512 + 64 × 516 nodes, a table of 2^17 entries, 32768 queries at once.
        let itopk_512 = CagraSearchParams { itopk_size: Some(512), ..Default::default() };
        assert_eq!(batch_of(itopk_512, 64, 65535), (1 << 17, 32768, A::SINGLE_CTA));
        // The multi-kernel search (the review, helper 107: not counted at first): its visited
        // table, always in global memory, and its result buffers.
        let multi_kernel = CagraSearchParams { algo: Some(CagraSearchAlgo::MultiKernel), ..wide };
        assert_eq!(batch_of(multi_kernel, 64, 65535), (1 << 20, 4096, A::MULTI_KERNEL));
        // Were the hash mode AUTO (this crate never sets it), a small table would not count.
        let mut raw = raw_search_defaults();
        raw.hashmap_mode = sys::cuvsCagraHashMode::AUTO_HASH;
        assert_eq!(query_stride(&raw, CagraSearchAlgo::SingleCta, 64, 1_000_000), 0);
        assert_eq!(query_stride(&raw, CagraSearchAlgo::MultiKernel, 64, 1_000_000), 256);
    }

    /// The review (helper 107): `Auto` was counted as both kernels, and a batch lowered below
    /// twice the multiprocessors makes cuVS's `Auto` pick the multi-CTA kernel, which refuses
    /// searches the single-CTA kernel takes. `Auto` is resolved as cuVS does (with the batch
    /// before lowering) and the kernel named where a batch is lowered; the device is asked only
    /// where a batch may be lowered.
    #[test]
    fn auto_is_resolved_as_cuvs_does_and_a_lowered_batch_keeps_its_kernel() {
        use sys::cuvsCagraSearchAlgo as A;
        let shared = CagraSearchParams {
            search_width: Some(126),
            max_iterations: Some(65536),
            algo: Some(CagraSearchAlgo::Auto),
            ..Default::default()
        };
        // 100 000 queries: cuVS's Auto picks the single-CTA kernel, whose table (64 + 126 × 32 ×
        // 65536 nodes) has 2^29 entries a query: 8 queries at once, still single-CTA.
        assert_eq!(batch_of(shared, 32, 100_000), (1 << 29, 8, A::SINGLE_CTA));
        // 263 queries, below twice 132 multiprocessors: the multi-CTA kernel (126 CTAs a query,
        // 2^24 entries), lowered to 256 and named.
        assert_eq!(batch_of(shared, 32, 263), (1 << 24, 256, A::MULTI_CTA));
        // Without the device's count, both kernels are counted and nothing is named.
        let mut raw = raw_search_defaults();
        shared.apply(&mut raw);
        assert!(limit_batches(&mut raw, 32, 1_000_000, 100_000, || None).is_some());
        assert_eq!((raw.max_queries, raw.algo), (8, A::AUTO));
        // An ordinary Auto search never asks the device.
        let mut raw = raw_search_defaults();
        CagraSearchParams { algo: Some(CagraSearchAlgo::Auto), ..Default::default() }.apply(&mut raw);
        assert_eq!(limit_batches(&mut raw, 64, 1_000_000, 100_000, || panic!("asked")), None);
    }

    #[test]
    fn search_width_zero_is_refused_before_cuvs_divides_by_it() {
        assert_eq!(refused(search(CagraSearchParams { search_width: Some(0), ..Default::default() })), "search_width must be at least 1");
    }

    #[test]
    fn search_parameters_cuvs_would_crash_hang_or_truncate_on_are_refused() {
        let p = |f: fn(&mut CagraSearchParams)| {
            let mut p = CagraSearchParams::default();
            f(&mut p);
            search(p)
        };
        refused(p(|p| p.itopk_size = Some(0)));
        refused(p(|p| (p.itopk_size, p.algo) = (Some(1024), Some(CagraSearchAlgo::SingleCta))));
        // The default kernel is the single-CTA one (cuVS's C API leaves `algo` 0: helper 108).
        assert!(refused(p(|p| p.itopk_size = Some(1024))).contains("the default kernel"));
        assert!(p(|p| (p.itopk_size, p.algo) = (Some(1024), Some(CagraSearchAlgo::Auto))).is_ok());
        // Widths whose products pass 32 bits in cuVS's buffer sizes.
        refused(p(|p| p.search_width = Some(usize::MAX)));
        refused(p(|p| p.search_width = Some(1 << 32)));
        refused(p(|p| (p.itopk_size, p.algo) = (Some(usize::MAX), Some(CagraSearchAlgo::MultiKernel))));
        refused(p(|p| p.itopk_size = Some((1 << 32) + 64)));
        // 2^32 is 0 in cuVS's 32-bit batch size: its batch loop never advances.
        refused(p(|p| p.max_queries = Some(1 << 32)));
        refused(p(|p| p.max_queries = Some(65536)));
        // u32::MAX iterations held the stream for hours.
        assert_eq!(refused(p(|p| p.min_iterations = Some(u32::MAX as usize))), "min_iterations = 4294967295 is above 65536");
        refused(p(|p| p.max_iterations = Some(usize::MAX)));
        for t in [1, 2, 3, 5, 64, (1 << 32) + 8] {
            let s = CagraSearchParams { team_size: Some(t), ..Default::default() };
            refused(search(s));
        }
        for b in [1, 32, 100, 2048, (1 << 32) + 64] {
            let s = CagraSearchParams { thread_block_size: Some(b), ..Default::default() };
            refused(search(s));
        }
        refused(p(|p| p.num_random_samplings = Some(0)));
        refused(p(|p| p.num_random_samplings = Some(u32::MAX)));
    }
}
