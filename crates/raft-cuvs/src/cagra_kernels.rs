//! CAGRA's search kernels: which one runs ([`CagraSearchAlgo`], `Auto` resolved as cuVS
//! resolves it) and how many queries cuVS may give it at once, so that no query's working
//! tables and results are found past cuVS's 32-bit offsets (the twenty-second audit, helpers 106
//! and 107).
use crate::sys;

/// Which CAGRA search kernel runs (cuVS's `cuvsCagraSearchAlgo`).
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CagraSearchAlgo {
    /// One thread block per query: large batches; an `itopk_size` up to 512. The default (what
    /// cuVS's C API gives).
    SingleCta,
    /// Several thread blocks per query: small batches.
    MultiCta,
    /// Several kernels.
    MultiKernel,
    /// cuVS chooses by `itopk_size` and batch: single-CTA for an `itopk_size` up to 512 and a
    /// batch of at least twice the device's multiprocessors, else multi-CTA (the default of
    /// cuVS's C++ and Python APIs; its C API's, and so this crate's, is single-CTA).
    Auto,
}

/// CUDA's grid y-dimension: cuVS launches one row of blocks per query of a batch, and picks
/// at most this many itself.
pub(crate) const MAX_QUERIES: usize = 65535;
/// The single-CTA kernel's largest internal top-k (cuVS refuses more, and so does `Auto` when it
/// picks that kernel for a large batch).
pub(crate) const MAX_ITOPK_SINGLE_CTA: usize = 512;

impl CagraSearchAlgo {
    pub(crate) fn raw(self) -> sys::cuvsCagraSearchAlgo {
        match self {
            CagraSearchAlgo::SingleCta => sys::cuvsCagraSearchAlgo::SINGLE_CTA,
            CagraSearchAlgo::MultiCta => sys::cuvsCagraSearchAlgo::MULTI_CTA,
            CagraSearchAlgo::MultiKernel => sys::cuvsCagraSearchAlgo::MULTI_KERNEL,
            CagraSearchAlgo::Auto => sys::cuvsCagraSearchAlgo::AUTO,
        }
    }
}

/// The widest per-query stride, in elements, that cuVS 26.08's CAGRA `kernel` (not `Auto`)
/// multiplies by a query's number within a batch in 32-bit arithmetic, for `raw` (as
/// [`CagraSearchParams::apply`] wrote it) on an index of `graph_degree` over `n_rows` rows (0:
/// none that grows with the parameters). The buffers are sized in 64 bits, so past 2^32 the
/// later queries of a batch silently share the earlier ones' tables and results (wrong
/// answers):
/// - single-CTA: a query's visited-node table, in global memory when it does not fit shared
///   memory, at `table size × query` (`search_single_cta_jit.cuh`);
/// - multi-CTA: the traversed-node table the same way, and the intermediate results at
///   `32 × CTAs per query × query` (`search_multi_cta_jit.cuh`); the table is filled once per
///   batch, so sharing it is wrong whatever the timing;
/// - multi-kernel: the visited-node table (always in global memory) and the result buffers,
///   `2 × itopk + width × degree` a query (`search_multi_jit.cuh`, `topk_core.cuh`).
///
/// The tables are sized as `calc_hashmap_params` in `search_plan.cuh` does (fill rate 0.5; at
/// least 2^11 entries, or 2^8 for the small table of at most 2^13, which `HASH` mode never
/// uses), from an upper bound of the iterations (`adjust_search_params`).
pub(crate) fn query_stride(raw: &sys::cuvsCagraSearchParams, kernel: CagraSearchAlgo, graph_degree: usize, n_rows: usize) -> u64 {
    let width = raw.search_width.max(1) as u64;
    let itopk = raw.itopk_size as u64;
    let itopk32 = itopk.next_multiple_of(32);
    let degree = graph_degree.max(1) as u64;
    // cuVS's automatic max_iterations: a base, plus one per step of the graph's reach until it
    // covers the rows.
    let (mut reach, mut steps, factor) = (1u128, 0u64, (degree / 2).max(2) as u128);
    while reach < n_rows as u128 {
        reach *= factor;
        steps += 1;
    }
    let (max, min) = (raw.max_iterations as u64, raw.min_iterations as u64);
    let iterations = |base: u64| if max == 0 { base + steps } else { max }.max(min);
    // The smallest table of at least 2^`bits` entries that holds `nodes` at half its size.
    let table = |nodes: u64, mut bits: u32| {
        while nodes > (1u64 << bits) / 2 {
            bits += 1;
        }
        1u64 << bits
    };
    // The single-CTA and multi-kernel searches keep a small table (reset every few iterations)
    // while `itopk + width × degree` fits half of 2^13 entries (in shared memory for the former),
    // unless the hash mode is `HASH`: what cuVS's C API gives (`cuvsCagraSearchParamsCreate`
    // leaves `hashmap_mode` 0) and this crate keeps, so every table is the full one (the review,
    // helper 108).
    let small = raw.hashmap_mode != sys::cuvsCagraHashMode::HASH && itopk32 + width * degree <= 1 << 12;
    match kernel {
        CagraSearchAlgo::SingleCta if small => 0,
        CagraSearchAlgo::SingleCta => table(itopk32 + width * degree * iterations(itopk / width), 11),
        CagraSearchAlgo::MultiKernel => {
            let visited =
                if small { table(itopk32 + width * degree, 8) } else { table(itopk32 + width * degree * iterations(itopk / width), 11) };
            visited.max(2 * itopk32 + width * degree)
        }
        CagraSearchAlgo::MultiCta | CagraSearchAlgo::Auto => {
            let ctas = width.max(itopk.div_ceil(32));
            (32 * ctas).max(table(ctas * iterations(32).max(32), 11))
        }
    }
}

/// Lowers the batch cuVS searches at once (`raw.max_queries`, 0: `min(n_queries, 65535)`) so
/// that [`query_stride`] × the batch stays within 2^32; returns what was lowered, for the log.
/// `Auto` is resolved first as `search_plan_impl_base` does (the single-CTA kernel for an
/// itopk_size up to 512 and a batch of at least twice the device's `num_sm` multiprocessors, asked
/// only when a batch may be lowered; else multi-CTA) and, where the batch is lowered, that kernel
/// is named in `raw`: a smaller batch must not make cuVS pick the other one (the review, helper
/// 107: it refused some searches so). Without `num_sm` both kernels are counted.
pub(crate) fn limit_batches(
    raw: &mut sys::cuvsCagraSearchParams,
    graph_degree: usize,
    n_rows: usize,
    n_queries: usize,
    num_sm: impl FnOnce() -> Option<usize>,
) -> Option<String> {
    let batch = if raw.max_queries > 0 { raw.max_queries } else { n_queries.min(MAX_QUERIES) };
    let limit_of = |stride: u64| usize::try_from((1u64 << 32) / stride.max(1)).unwrap_or(usize::MAX).max(1);
    let stride_of = |kernel| query_stride(raw, kernel, graph_degree, n_rows);
    let kernel = match raw.algo {
        sys::cuvsCagraSearchAlgo::SINGLE_CTA => Some(CagraSearchAlgo::SingleCta),
        sys::cuvsCagraSearchAlgo::MULTI_CTA => Some(CagraSearchAlgo::MultiCta),
        sys::cuvsCagraSearchAlgo::MULTI_KERNEL => Some(CagraSearchAlgo::MultiKernel),
        // Auto: nothing to resolve where neither kernel it may pick needs a smaller batch.
        _ if batch <= limit_of(stride_of(CagraSearchAlgo::SingleCta).max(stride_of(CagraSearchAlgo::MultiCta))) => return None,
        _ => num_sm().map(|sm| {
            if raw.itopk_size <= MAX_ITOPK_SINGLE_CTA && batch >= 2 * sm {
                CagraSearchAlgo::SingleCta
            } else {
                CagraSearchAlgo::MultiCta
            }
        }),
    };
    let stride = match kernel {
        Some(k) => stride_of(k),
        None => stride_of(CagraSearchAlgo::SingleCta).max(stride_of(CagraSearchAlgo::MultiCta)),
    };
    let limit = limit_of(stride);
    (batch > limit).then(|| {
        raw.max_queries = limit;
        let pinned = match kernel {
            Some(k) if raw.algo == sys::cuvsCagraSearchAlgo::AUTO => {
                raw.algo = k.raw();
                format!(" (the kernel cuVS chose for the whole batch, {k:?}, kept)")
            }
            _ => String::new(),
        };
        format!(
            "{batch} queries at once lowered to {limit}{pinned}: cuVS's kernels offset each query's tables and results by \
             {stride} elements in 32-bit arithmetic"
        )
    })
}
