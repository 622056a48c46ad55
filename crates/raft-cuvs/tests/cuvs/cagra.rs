//! CAGRA build and search through cuVS on lent raft-rs resources (GPU; skips without one or
//! without cuVS, fails under `RAFT_REQUIRE_GPU=1`): recall@10 against the exact CPU answer.
use crate::common::{child_scenario, exact_knn, report, rerun, Rng};
use raft_core::{DeviceMatrix, DeviceResources, ErrorKind, Layout};
use raft_cuvs::{CagraIndex, CagraIndexParams, CagraSearchParams};

/// Rows of low intrinsic dimension, like real embeddings (SIFT's is about 10-20): `A·z + ε`
/// with a fixed `dim × 16` matrix `A`, `z` standard normal in 16 dimensions and a little noise
/// in all `dim`. (In uniform 128-dimensional noise every row is nearly equidistant from every
/// query, and any graph search's recall says more about the data than about the search.)
fn embeddings(rng: &mut Rng, a: &[f32], dim: usize, n: usize) -> Vec<f32> {
    const LATENT: usize = 16;
    let mut out = Vec::with_capacity(n * dim);
    for _ in 0..n {
        let z: Vec<f32> = (0..LATENT).map(|_| rng.normal()).collect();
        for row in a.chunks_exact(LATENT) {
            out.push(row.iter().zip(&z).map(|(x, y)| x * y).sum::<f32>() + 0.05 * rng.normal());
        }
    }
    out
}

fn mixing(rng: &mut Rng, dim: usize) -> Vec<f32> {
    (0..dim * 16).map(|_| rng.normal() / 4.0).collect()
}

/// recall@k of `ids` (`n × k`, for the first `n` queries) against the exact answer.
fn recall(ids: &[i64], dataset: &[f32], dim: usize, queries: &[f32], n: usize, k: usize) -> f64 {
    let exact = exact_knn(dataset, dim, &queries[..n * dim], k);
    let mut hits = 0;
    for (qi, (want, _)) in exact.iter().enumerate() {
        let got = &ids[qi * k..][..k];
        hits += want.iter().filter(|w| got.contains(&(**w as i64))).count();
    }
    hits as f64 / (n * k) as f64
}

#[test]
fn cagra_recall_at_10_on_100k_by_128_is_at_least_0_95() {
    require_gpu!();
    const N_ROWS: usize = 100_000;
    const DIM: usize = 128;
    const N_QUERIES: usize = 1000;
    const CHECKED: usize = 200; // queries checked against the exact CPU answer
    const K: usize = 10;
    let mut rng = Rng::new(0x5eed_0002);
    let a = mixing(&mut rng, DIM);
    let dataset = embeddings(&mut rng, &a, DIM, N_ROWS);
    let queries = embeddings(&mut rng, &a, DIM, N_QUERIES);

    let res = DeviceResources::new().unwrap();
    let started = std::time::Instant::now();
    let index =
        CagraIndex::build(DeviceMatrix::from_host(&res, &dataset, N_ROWS, DIM, Layout::RowMajor).unwrap(), &CagraIndexParams::default())
            .unwrap();
    let built = started.elapsed();
    assert_eq!((index.n_rows(), index.dim(), index.graph_degree()), (N_ROWS, DIM, 64));
    let q = DeviceMatrix::from_host(&res, &queries, N_QUERIES, DIM, Layout::RowMajor).unwrap();
    // itopk_size 128 (cuVS's default is 64): the accuracy knob, with room above k.
    let params = CagraSearchParams { itopk_size: Some(128), ..Default::default() };
    let found = index.search(q.view(), K, &params).unwrap();
    assert_eq!((found.neighbors.rows(), found.neighbors.cols()), (N_QUERIES, K));
    let (ids, distances) = (found.neighbors, found.distances);
    let ids = ids.to_host().unwrap();
    let distances = distances.to_host().unwrap();
    assert!(ids.iter().all(|i| (0..N_ROWS as i64).contains(i)), "ids out of range");
    assert!(distances.chunks_exact(K).all(|row| row.windows(2).all(|w| w[0] <= w[1])), "each row nearest first");
    let r = recall(&ids, &dataset, DIM, &queries, CHECKED, K);
    eprintln!("CAGRA 100000×128: built in {:.2} s, recall@10 = {r:.4} over {CHECKED} queries", built.as_secs_f64());
    assert!(r >= 0.95, "recall@10 = {r:.4} < 0.95");
    index.release().unwrap();
}

#[test]
fn rows_that_are_not_16_byte_multiples_are_copied_into_cagra_s_layout() {
    require_gpu!();
    const N_ROWS: usize = 5000;
    const DIM: usize = 30; // 120-byte rows: cuVS needs a padded copy
    const N_QUERIES: usize = 100;
    const K: usize = 10;
    let mut rng = Rng::new(0x5eed_0003);
    let a = mixing(&mut rng, DIM);
    let dataset = embeddings(&mut rng, &a, DIM, N_ROWS);
    let queries = embeddings(&mut rng, &a, DIM, N_QUERIES);
    let res = DeviceResources::new().unwrap();
    let params = CagraIndexParams { graph_degree: Some(32), intermediate_graph_degree: Some(64), ..Default::default() };
    let index = CagraIndex::build(DeviceMatrix::from_host(&res, &dataset, N_ROWS, DIM, Layout::RowMajor).unwrap(), &params).unwrap();
    assert_eq!(index.graph_degree(), 32);
    let q = DeviceMatrix::from_host(&res, &queries, N_QUERIES, DIM, Layout::RowMajor).unwrap();
    let ids = index.search(q.view(), K, &CagraSearchParams::default()).unwrap().neighbors;
    let r = recall(&ids.to_host().unwrap(), &dataset, DIM, &queries, N_QUERIES, K);
    eprintln!("CAGRA 5000×30 (padded copy): recall@10 = {r:.4}");
    assert!(r >= 0.9, "recall@10 = {r:.4}");
}

#[test]
fn cagra_refuses_what_does_not_match_before_any_native_call() {
    require_gpu!();
    let res = DeviceResources::new().unwrap();
    let mut rng = Rng::new(7);
    let index = CagraIndex::build(
        DeviceMatrix::from_host(&res, &rng.uniform_vec(1000 * 16), 1000, 16, Layout::RowMajor).unwrap(),
        &Default::default(),
    )
    .unwrap();
    let q = DeviceMatrix::from_host(&res, &rng.uniform_vec(3 * 8), 3, 8, Layout::RowMajor).unwrap();
    let e = index.search(q.view(), 10, &Default::default()).unwrap_err(); // 8 columns against 16
    assert_eq!((e.kind(), e.who()), (ErrorKind::Logic, "CagraIndex::search"), "{e}");
    let q = DeviceMatrix::from_host(&res, &rng.uniform_vec(16), 1, 16, Layout::RowMajor).unwrap();
    let q = q.view();
    assert_eq!(index.search(q, 0, &Default::default()).unwrap_err().kind(), ErrorKind::Logic);
    assert_eq!(index.search(q, 1001, &Default::default()).unwrap_err().kind(), ErrorKind::Logic);
    let bad = CagraIndexParams { metric: Some(raft_cuvs::Metric::L1), ..Default::default() };
    let e = CagraIndex::build(DeviceMatrix::from_host(&res, &rng.uniform_vec(32), 2, 16, Layout::RowMajor).unwrap(), &bad).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Logic);
    // cuVS's own refusals come back as errors too: k above the (rounded up) itopk_size.
    let e = index.search(q, 100, &CagraSearchParams { itopk_size: Some(32), ..Default::default() }).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Logic, "{e}");
    assert!(e.message().starts_with("cuVS: "), "{e}");
}

const SEARCH_WIDTH_ZERO: &str = concat!(module_path!(), "::search_width_zero_is_a_logic_error_not_a_sigfpe");

/// The child: a built index searched with `search_width: Some(0)`, then with other values cuVS
/// would crash or hang on, each outcome printed (cuVS 26.08 divides `itopk_size` by the width
/// before checking it: SIGFPE, exit status 136, before this fix).
fn search_with_bad_params() {
    crate::common::load_cuvs().as_ref().expect("cuVS");
    let res = DeviceResources::new().unwrap();
    let mut rng = Rng::new(0x5eed_0006);
    let index = CagraIndex::build(
        DeviceMatrix::from_host(&res, &rng.uniform_vec(1000 * 16), 1000, 16, Layout::RowMajor).unwrap(),
        &Default::default(),
    )
    .unwrap();
    let q = DeviceMatrix::from_host(&res, &rng.uniform_vec(4 * 16), 4, 16, Layout::RowMajor).unwrap();
    let q = q.view();
    let zero = CagraSearchParams { search_width: Some(0), ..Default::default() };
    report("zero", &index.search(q, 10, &zero));
    // Single-CTA forced: the kernel whose plan divides by the width.
    let single = CagraSearchParams { search_width: Some(0), algo: Some(raft_cuvs::CagraSearchAlgo::SingleCta), ..Default::default() };
    report("single", &index.search(q, 10, &single));
    let wedge = CagraSearchParams { min_iterations: Some(u32::MAX as usize), ..Default::default() };
    report("wedge", &index.search(q, 10, &wedge));
    let batch = CagraSearchParams { max_queries: Some(1 << 32), ..Default::default() };
    report("batch", &index.search(q, 10, &batch));
    // The index still searches afterwards.
    report("after", &index.search(q, 10, &CagraSearchParams::default()).and_then(|found| found.neighbors.to_host()));
}

#[test]
fn search_width_zero_is_a_logic_error_not_a_sigfpe() {
    if let Some(s) = child_scenario() {
        assert_eq!(s, "bad-params");
        return search_with_bad_params();
    }
    require_gpu!();
    // In a child: before the fix the process died of SIGFPE (or held the stream for hours on
    // u32::MAX iterations), which would take this whole test binary with it.
    let c = rerun(SEARCH_WIDTH_ZERO, "bad-params", &[], std::time::Duration::from_secs(120));
    assert_eq!(c.signal, None, "the child died of signal {:?}\nstdout:\n{}\nstderr:\n{}", c.signal, c.stdout, c.stderr);
    c.assert_code(0);
    for key in ["zero", "single", "wedge", "batch"] {
        assert_eq!(c.result(key).as_deref(), Some("logic"), "{key}: {}\n{}", c.stdout, c.stderr);
        assert_eq!(c.result(&format!("{key}_who")).as_deref(), Some("CagraIndex::search"), "{key}");
    }
    assert_eq!(c.message("zero").as_deref(), Some("CagraIndex::search: search_width must be at least 1"));
    assert_eq!(c.result("after").as_deref(), Some("ok"), "{}", c.stdout);
}

/// The fifteenth audit, as `knn::an_array_of_other_resources_on_a_captured_stream_is_refused_not_a_panic`
/// for CAGRA: queries of other resources whose stream is being captured are refused (`Logic`),
/// not a panic; after the capture they are searched. (Before: a panic.)
#[test]
fn queries_of_other_resources_on_a_captured_stream_are_refused_not_a_panic() {
    require_gpu!();
    use cudarc::driver::sys::CUstreamCaptureMode as Mode;
    let (ra, rb) = (DeviceResources::new().unwrap(), DeviceResources::new().unwrap());
    let mut rng = Rng::new(11);
    let index = CagraIndex::build(
        DeviceMatrix::from_host(&ra, &rng.uniform_vec(1000 * 16), 1000, 16, Layout::RowMajor).unwrap(),
        &Default::default(),
    )
    .unwrap();
    let q = DeviceMatrix::from_host(&rb, &rng.uniform_vec(3 * 16), 3, 16, Layout::RowMajor).unwrap();
    rb.sync().unwrap();
    let stream = rb.stream().unwrap();
    stream.begin_capture(Mode::CU_STREAM_CAPTURE_MODE_RELAXED).unwrap();
    let got = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| index.search(q.view(), 5, &Default::default()).map(drop)));
    let (ended, nodes) = crate::common::end_capture_counting_nodes(&stream);
    let e = got.expect("CagraIndex::search panicked on queries whose stream is being captured").expect_err("searched");
    assert_eq!((e.kind(), e.who()), (ErrorKind::Logic, "CagraIndex::search"), "{e}");
    assert!(e.message().contains("captured into a CUDA graph"), "{e}");
    assert!(ended.is_ok(), "the capture was invalidated: {ended:?}");
    assert_eq!(nodes, 0, "work entered the capture");
    let found = index.search(q.view(), 5, &Default::default()).unwrap();
    assert_eq!(found.neighbors.to_host().unwrap().len(), 15);
}

/// Row numbers an `n_queries × k` answer holds outside `0..n_rows`, as (query, row number).
fn outside_the_dataset(ids: &[i64], k: usize, n_rows: usize) -> Vec<(usize, i64)> {
    ids.iter().enumerate().filter(|(_, id)| !(0..n_rows as i64).contains(id)).map(|(i, id)| (i / k, *id)).collect()
}

/// Queries for the NaN tests: query 0 all NaN, query 1 all +inf, query 2 the dataset's row
/// `row`, the rest finite.
fn queries_with_nan_and_infinity(rng: &mut Rng, a: &[f32], dim: usize, n: usize, row: &[f32]) -> Vec<f32> {
    let mut queries = embeddings(rng, a, dim, n);
    queries[..dim].fill(f32::NAN);
    queries[dim..2 * dim].fill(f32::INFINITY);
    queries[2 * dim..3 * dim].copy_from_slice(row);
    queries
}

/// The seventeenth audit's open question (helper 79: some cuVS CAGRA out-of-bounds bugs were
/// driven by data values): a dataset with rows of NaN, of infinities and hundreds of exact
/// duplicates, searched with finite, NaN and infinite queries. The build and the searches end
/// (an answer or an error, never a crash or a hang), and every row number a finite query gets
/// is a row of the dataset. Run 215 ran it also under compute-sanitizer memcheck, which sees
/// cuVS's own accesses: cuVS 26.08 refuses this build cleanly ("too many invalid or duplicated
/// neighbor nodes"), with no memory error, so with that cuVS only the refusal is checked (the
/// search is the next test's). Named `…_ends_and_names_rows_of_the_dataset` until the
/// twenty-eighth session (run 215).
#[test]
fn cagra_on_rows_of_nan_infinities_and_duplicates_ends_cleanly() {
    require_gpu!();
    const N_ROWS: usize = 4000;
    const DIM: usize = 32;
    const K: usize = 10;
    let mut rng = Rng::new(0x5eed_0017);
    let a = mixing(&mut rng, DIM);
    let mut dataset = embeddings(&mut rng, &a, DIM, N_ROWS);
    let dup: Vec<f32> = dataset[..DIM].to_vec();
    for (i, row) in dataset.chunks_exact_mut(DIM).enumerate() {
        match i {
            100..=109 => row.fill(f32::NAN),
            110..=119 => row.fill(f32::INFINITY),
            120..=129 => row.fill(f32::NEG_INFINITY),
            130..=139 => row[i % DIM] = f32::NAN, // one NaN element
            1000..=1499 => row.copy_from_slice(&dup),
            _ => {}
        }
    }
    let queries = queries_with_nan_and_infinity(&mut rng, &a, DIM, 64, &dup);
    let res = DeviceResources::new().unwrap();
    let params = CagraIndexParams { graph_degree: Some(32), intermediate_graph_degree: Some(64), ..Default::default() };
    let built = CagraIndex::build(DeviceMatrix::from_host(&res, &dataset, N_ROWS, DIM, Layout::RowMajor).unwrap(), &params);
    let index = match built {
        Ok(index) => index,
        Err(e) => {
            // An error is an answer too (cuVS may refuse such data): it must be a clean one.
            eprintln!("CAGRA on NaN/inf rows: build refused: {e}");
            assert_ne!(e.kind(), ErrorKind::OutOfMemory, "{e}");
            res.sync().unwrap();
            return;
        }
    };
    let q = DeviceMatrix::from_host(&res, &queries, 64, DIM, Layout::RowMajor).unwrap();
    match index.search(q.view(), K, &CagraSearchParams::default()) {
        Ok(found) => {
            let outside = outside_the_dataset(&found.neighbors.to_host().unwrap(), K, N_ROWS);
            eprintln!(
                "CAGRA on NaN/inf rows: {} row numbers outside the dataset, by query: {:?}",
                outside.len(),
                &outside[..outside.len().min(12)]
            );
            assert!(outside.iter().all(|(query, _)| *query < 2), "a finite query got a row number outside the dataset: {outside:?}");
        }
        Err(e) => eprintln!("CAGRA on NaN/inf rows: search refused: {e}"),
    }
    res.sync().unwrap();
    index.release().unwrap();
}

/// The search the test above could not reach (cuVS refuses that build), tried over datasets of
/// fewer and fewer bad values: six rows of NaN or infinities, one row of +infinity, one NaN
/// element. Each build either succeeds, and then every search (finite, NaN and infinite queries,
/// default and wide) ends and every row number a finite query gets is a row of the dataset, or
/// is refused with cuVS's own logic error about the kNN graph's invalid neighbours (run 219:
/// cuVS 26.08.1 refused the six rows so, no memory error under memcheck; the test had required
/// that build to succeed). Any other error, a crash or a hang fails it.
/// `crates/raft-cuvs/gpu/run.sh DIR memcheck` runs it (and the test above) under
/// compute-sanitizer memcheck, which sees cuVS's own accesses.
#[test]
fn cagra_over_a_few_rows_of_nan_and_infinity_is_refused_cleanly_or_searches_within_the_dataset() {
    require_gpu!();
    const N_ROWS: usize = 4000;
    const DIM: usize = 32;
    const K: usize = 10;
    type Spoil = fn(usize, &mut [f32]);
    let cases: [(&str, Spoil); 3] = [
        ("six rows", |i, row| match i {
            100 | 2100 => row.fill(f32::NAN),
            200 => row.fill(f32::INFINITY),
            300 => row.fill(f32::NEG_INFINITY),
            400 | 3400 => row[i % DIM] = f32::NAN,
            _ => {}
        }),
        ("one infinite row", |i, row| {
            if i == 2100 {
                row.fill(f32::INFINITY)
            }
        }),
        ("one NaN element", |i, row| {
            if i == 3400 {
                row[5] = f32::NAN
            }
        }),
    ];
    let res = DeviceResources::new().unwrap();
    let mut searched = Vec::new();
    for (case, spoil) in cases {
        let mut rng = Rng::new(0x5eed_0028);
        let a = mixing(&mut rng, DIM);
        let mut dataset = embeddings(&mut rng, &a, DIM, N_ROWS);
        for (i, row) in dataset.chunks_exact_mut(DIM).enumerate() {
            spoil(i, row);
        }
        let row7 = dataset[7 * DIM..8 * DIM].to_vec();
        let queries = queries_with_nan_and_infinity(&mut rng, &a, DIM, 64, &row7);
        let params = CagraIndexParams { graph_degree: Some(32), intermediate_graph_degree: Some(64), ..Default::default() };
        let index = match CagraIndex::build(DeviceMatrix::from_host(&res, &dataset, N_ROWS, DIM, Layout::RowMajor).unwrap(), &params) {
            Ok(index) => index,
            Err(e) => {
                eprintln!("CAGRA over {case}: build refused: {}", e.message().lines().next().unwrap_or(""));
                assert_eq!(e.kind(), ErrorKind::Logic, "{case}: {e}");
                assert!(e.message().contains("invalid or duplicated neighbor nodes"), "{case}: not cuVS's refusal of the kNN graph: {e}");
                continue;
            }
        };
        searched.push(case);
        let q = DeviceMatrix::from_host(&res, &queries, 64, DIM, Layout::RowMajor).unwrap();
        for (what, search) in [
            ("default", CagraSearchParams::default()),
            ("wide", CagraSearchParams { itopk_size: Some(128), search_width: Some(8), ..Default::default() }),
        ] {
            match index.search(q.view(), K, &search) {
                Ok(found) => {
                    let ids = found.neighbors.to_host().unwrap();
                    let outside = outside_the_dataset(&ids, K, N_ROWS);
                    eprintln!(
                        "CAGRA over {case} ({what}): built; {} row numbers outside the dataset: {:?}",
                        outside.len(),
                        &outside[..outside.len().min(12)]
                    );
                    assert!(
                        outside.iter().all(|(query, _)| *query < 2),
                        "{case} ({what}): a finite query got a row number outside the dataset: {outside:?}"
                    );
                }
                Err(e) => {
                    // A refusal is a clean answer; a crash or a hang is not (the harness sees those).
                    eprintln!("CAGRA over {case} ({what}): search refused: {e}");
                    assert_ne!(e.kind(), ErrorKind::OutOfMemory, "{e}");
                }
            }
        }
        res.sync().unwrap();
        index.release().unwrap();
    }
    // Said loudly: with every build refused, no search over such data was examined.
    eprintln!("CAGRA over NaN and infinite rows: searched {} of 3 datasets: {searched:?}", searched.len());
}

/// Helper 106's finding, as the reviews (helpers 107, 108) made it testable: cuVS 26.08's
/// multi-CTA kernel finds a query's traversed-node table at `table size × query` in 32-bit
/// arithmetic, and the tables are filled once per batch. itopk_size 512 and `max_iterations`
/// 65536 give 2^21 entries a query, past 2^32 at query 2048: in one batch of 2248, query
/// 2048 + q shares query q's table, and with the same query vector it finds every node q
/// traversed marked already. The search lowers its batch to keep every offset within 2^32; this
/// checks the repeated queries' answer against the exact one (before the lowering, their recall).
///
/// Run 220 (an H100) found what the tables really take: cuVS 26.08's multi-CTA search sizes its
/// table vector of 32-bit entries with a byte count (`hashmap.resize(hashmap_size)`, where
/// `hashmap_size` already holds `sizeof(INDEX_T)`), 16 bytes an entry, so any batch at the wrap
/// asks RAFT's workspace for 64 GiB (2^32 entries), 70 GiB for 2248 queries before the lowering.
/// RAFT's workspace is a quarter of the device's free memory (19.8 GiB on the H100, about 35 GiB
/// on the H200): there the search is refused as `OutOfMemory` by the workspace's limit, with or
/// without the lowering, and this search can return no wrong answer there. The test says so and skips visibly
/// then; it checks the answers where a workspace holds the tables (a device of 256 GiB).
#[test]
fn a_deep_multi_cta_search_answers_queries_past_cuvs_32_bit_offsets_as_well_as_the_first() {
    require_gpu!();
    const N_ROWS: usize = 20_000;
    const DIM: usize = 32;
    const WRAP: usize = 2048; // 2^32 / 2^21
    const AGAIN: usize = 200; // the first queries, again from query WRAP on
    const K: usize = 10;
    let mut rng = Rng::new(0x5eed_0106);
    let a = mixing(&mut rng, DIM);
    let dataset = embeddings(&mut rng, &a, DIM, N_ROWS);
    let first = embeddings(&mut rng, &a, DIM, WRAP);
    let queries = [first.as_slice(), &first[..AGAIN * DIM]].concat();
    let res = DeviceResources::new().unwrap();
    let index =
        CagraIndex::build(DeviceMatrix::from_host(&res, &dataset, N_ROWS, DIM, Layout::RowMajor).unwrap(), &CagraIndexParams::default())
            .unwrap();
    let deep = CagraSearchParams {
        itopk_size: Some(512),
        max_iterations: Some(65536),
        algo: Some(raft_cuvs::CagraSearchAlgo::MultiCta),
        ..Default::default()
    };
    let started = std::time::Instant::now();
    let q = DeviceMatrix::from_host(&res, &queries, WRAP + AGAIN, DIM, Layout::RowMajor).unwrap();
    let ids = match index.search(q.view(), K, &deep) {
        Ok(found) => found.neighbors.to_host().unwrap(),
        // Only the workspace's own limit (the message of RMM's limiting adaptor), below the
        // 64 GiB the tables take, is a skip: any other failure, out-of-memory included, and a
        // workspace that should have held them, fail the test. Written past the harness's
        // capture (as `common::gpu`'s skips), so a passing run's log shows it.
        Err(e) if e.kind() == ErrorKind::OutOfMemory && workspace_limit(e.message()).is_some_and(|limit| limit < 1 << 36) => {
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "SKIP cagra::a_deep_multi_cta_search_answers_queries_past_cuvs_32_bit_offsets_as_well_as_the_first: RAFT's \
                 workspace cannot hold cuVS's multi-CTA tables at the 32-bit wrap (64 GiB at 16 bytes an entry): {e}"
            );
            index.release().unwrap();
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let took = started.elapsed();
    let r_first = recall(&ids, &dataset, DIM, &first, AGAIN, K);
    let r_again = recall(&ids[WRAP * K..], &dataset, DIM, &first, AGAIN, K);
    eprintln!(
        "CAGRA deep multi-CTA search, {} queries in one call ({:.2} s): recall@10 of the first {AGAIN} {r_first:.4}, \
         of the same queries again from query {WRAP} {r_again:.4}",
        WRAP + AGAIN,
        took.as_secs_f64()
    );
    assert!(r_first >= 0.95 && r_again >= 0.95, "recall@10: first {r_first:.4}, again {r_again:.4}");
    index.release().unwrap();
}

/// The limit RMM's `limiting_resource_adaptor` names in a refusal ("Exceeded memory limit N"),
/// RAFT's workspace being one.
fn workspace_limit(message: &str) -> Option<u64> {
    let (_, rest) = message.split_once("limiting_resource_adaptor")?;
    let (_, rest) = rest.split_once("Exceeded memory limit ")?;
    rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

/// The skip above reads the limit from run 220's refusal as RMM words it (CPU).
#[test]
fn the_workspace_limit_is_read_from_rmm_s_refusal() {
    let run220 =
        "cuVS: std::bad_alloc: out_of_memory: RMM failure at:/__w/rmm/rmm/cpp/src/mr/detail/limiting_resource_adaptor_impl.cpp:61: \
                  Exceeded memory limit 21254373376; Allocated bytes 8192; Requested bytes 68719476736\n";
    assert_eq!(workspace_limit(run220), Some(21_254_373_376));
    assert_eq!(workspace_limit("cuVS: std::bad_alloc: out_of_memory: CUDA error at: cuda_memory_resource.hpp"), None);
}
