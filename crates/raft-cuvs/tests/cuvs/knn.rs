//! Brute-force k-NN through cuVS on lent raft-rs resources (GPU; skips without one or without
//! cuVS, fails under `RAFT_REQUIRE_GPU=1`): the exact CPU answer, the lent stream and device,
//! arrays of other resources, released resources, and argument checks that refuse before cuVS is
//! even loaded.
use crate::common::{child_scenario, exact_knn, l2, report, rerun, Rng};
use raft_core::{DeviceMatrix, DeviceResources, DeviceVec, ErrorKind, Layout, MatrixView};
use raft_cuvs::{brute_force_knn, with_cuvs, BruteForceIndex, Metric, Neighbors};
use std::time::Duration;

const N_ROWS: usize = 2000;
const DIM: usize = 32;
const N_QUERIES: usize = 50;
const K: usize = 10;
const SEED: u64 = 0x5eed_0001;

/// `n` rows of `DIM` columns: all of `v`.
fn rows(v: &DeviceVec<f32>, n: usize) -> MatrixView<'_, f32> {
    v.matrix(n, DIM, Layout::RowMajor).unwrap()
}

/// `host` as an owned `n × DIM` matrix.
fn matrix(res: &DeviceResources, host: &[f32], n: usize) -> DeviceMatrix<f32> {
    DeviceMatrix::from_host(res, host, n, DIM, Layout::RowMajor).unwrap()
}

/// The test's data: `N_ROWS × DIM` rows and `N_QUERIES × DIM` queries, uniform in [0, 1).
fn data() -> (Vec<f32>, Vec<f32>) {
    let mut rng = Rng::new(SEED);
    (rng.uniform_vec(N_ROWS * DIM), rng.uniform_vec(N_QUERIES * DIM))
}

/// Checks a search's results against the exact answer: every query's `j`-th neighbour is a
/// distinct row at exactly (up to f32 rounding) the `j`-th smallest distance, and the reported
/// distance is that row's. Ties may come in either order; nothing else may differ.
fn assert_exact(ids: &[i64], distances: &[f32], dataset: &[f32], queries: &[f32], k: usize) {
    let exact = exact_knn(dataset, DIM, queries, k);
    let mut same_ids = 0;
    for (qi, (want_ids, want_d)) in exact.iter().enumerate() {
        let q = &queries[qi * DIM..][..DIM];
        let got = &ids[qi * k..][..k];
        let mut seen = std::collections::HashSet::new();
        for j in 0..k {
            let id = got[j];
            assert!((0..N_ROWS as i64).contains(&id), "query {qi}: id {id} out of range");
            assert!(seen.insert(id), "query {qi}: id {id} twice in {got:?}");
            let d = l2(&dataset[id as usize * DIM..][..DIM], q);
            let tol = 1e-4 * (1.0 + want_d[j]);
            assert!(
                (d - want_d[j]).abs() <= tol,
                "query {qi}, rank {j}: row {id} is at {d}, the exact {j}-th distance is {} (exact ids {want_ids:?}, got {got:?})",
                want_d[j]
            );
            let reported = distances[qi * k + j] as f64;
            assert!(
                (reported - d).abs() <= 1e-3 * (1.0 + d),
                "query {qi}, rank {j}: cuVS reports {reported} for row {id}, which is at {d}"
            );
            same_ids += usize::from(want_ids[j] as i64 == id);
        }
    }
    // Ties are rare in uniform data: nearly every id is the exact one, in place.
    assert!(same_ids * 100 >= exact.len() * k * 99, "only {same_ids} of {} ids in place", exact.len() * k);
}

#[test]
fn brute_force_equals_the_exact_cpu_answer() {
    require_gpu!();
    let (dataset, queries) = data();
    let res = DeviceResources::new().unwrap();
    let d = DeviceVec::from_host(&res, &dataset).unwrap();
    let q = DeviceVec::from_host(&res, &queries).unwrap();
    let Neighbors { neighbors: ids, distances } = brute_force_knn(&res, rows(&d, N_ROWS), rows(&q, N_QUERIES), K).unwrap();
    assert_eq!((ids.rows(), ids.cols(), distances.rows(), distances.cols()), (N_QUERIES, K, N_QUERIES, K));
    assert_eq!(ids.resources(), &res, "the results are arrays of the resources searched on");
    assert_exact(&ids.to_host().unwrap(), &distances.to_host().unwrap(), &dataset, &queries, K);
}

#[test]
fn an_index_searches_as_the_one_shot_call() {
    require_gpu!();
    let (dataset, queries) = data();
    let res = DeviceResources::new().unwrap();
    let index = BruteForceIndex::build(matrix(&res, &dataset, N_ROWS), Metric::L2Expanded).unwrap();
    assert_eq!((index.n_rows(), index.dim(), index.metric()), (N_ROWS, DIM, Metric::L2Expanded));
    let q = matrix(&res, &queries, N_QUERIES);
    for _ in 0..3 {
        let Neighbors { neighbors: ids, distances } = index.search(q.view(), K).unwrap();
        assert_exact(&ids.to_host().unwrap(), &distances.to_host().unwrap(), &dataset, &queries, K);
    }
    // A search from a job on the index's own resources (the index is Send + Sync).
    let index = std::sync::Arc::new(index);
    let job = {
        let index = index.clone();
        res.spawn(move || index.search(q.view(), 1).and_then(|found| found.neighbors.to_host())).unwrap()
    };
    let nearest = job.join().unwrap().unwrap();
    let exact = exact_knn(&dataset, DIM, &queries, 1);
    assert_eq!(nearest, exact.iter().map(|(ids, _)| ids[0] as i64).collect::<Vec<_>>());
    std::sync::Arc::try_unwrap(index).unwrap().release().unwrap();
}

#[test]
fn cuvs_runs_on_the_lent_stream_and_device() {
    require_gpu!();
    let a = DeviceResources::new().unwrap();
    let b = DeviceResources::new().unwrap();
    for res in [&a, &b] {
        let ours = res.stream().unwrap();
        let (stream, device) = with_cuvs(res, |cuvs| {
            assert_eq!(cuvs.device(), res.device());
            Ok((cuvs.stream()?, cuvs.device_id()?))
        })
        .unwrap();
        assert_eq!(stream.cu_stream(), ours.cu_stream(), "cuVS sees the resources' own stream");
        assert!(std::sync::Arc::ptr_eq(&stream, &ours), "as the very cudarc stream of the resources");
        assert_eq!(device, res.device() as i32);
        with_cuvs(res, |cuvs| cuvs.sync()).unwrap();
    }
    let handles: Vec<usize> = [&a, &b].iter().map(|r| with_cuvs(r, |c| Ok(c.as_raw())).unwrap()).collect();
    assert_ne!(handles[0], handles[1], "each resources object lends its own raft::resources");
    // Lent, not given: the resources still work after any number of lends.
    a.sync().unwrap();
    a.release().unwrap();
    let e = with_cuvs(&a, |_| Ok(())).unwrap_err();
    assert_eq!((e.kind(), e.who()), (ErrorKind::Logic, "raft_cuvs::with_cuvs"));
}

/// The sixteenth audit: a lend ran on whatever context the thread had. On a thread with none,
/// `CuvsResources::sync` (RAFT's `cudaStreamQuery`) made the runtime bind device 0's primary
/// context to the thread for good, and the closure saw no context of the resources' device.
/// Now the lend binds the resources' device and puts the thread's own context (none) back.
#[test]
fn a_lend_runs_on_the_resources_device_and_leaves_the_thread_s_context_as_it_was() {
    require_gpu!();
    let res = DeviceResources::new().unwrap();
    let ctx = res.context().cu_ctx() as usize;
    let (inside, after) = std::thread::spawn(move || {
        let none = cudarc::driver::result::ctx::get_current().unwrap();
        assert_eq!(none, None, "a fresh thread has no context");
        let inside = with_cuvs(&res, |c| {
            c.sync()?;
            Ok(cudarc::driver::result::ctx::get_current().unwrap().map(|c| c as usize))
        })
        .unwrap();
        (inside, cudarc::driver::result::ctx::get_current().unwrap().map(|c| c as usize))
    })
    .join()
    .unwrap();
    assert_eq!(inside, Some(ctx), "the closure runs on the resources' context");
    assert_eq!(after, None, "the thread's own context (none) is current again after the lend");
}

/// The closure's error is `with_cuvs`'s own, unchanged (no `??`).
#[test]
fn with_cuvs_returns_the_closures_error_as_its_own() {
    require_gpu!();
    let res = DeviceResources::new().unwrap();
    let e = with_cuvs(&res, |_| Err::<(), _>(raft_core::Error::logic("mine", "refused inside"))).unwrap_err();
    assert_eq!((e.kind(), e.who(), e.message()), (ErrorKind::Logic, "mine", "refused inside"));
}

/// A search takes any row-major view: here rows 100..150 of a larger array's matrix, searched
/// among rows 500..N_ROWS of another, and the ids are row numbers of the dataset view.
#[test]
fn views_of_rows_are_searched_in_place() {
    require_gpu!();
    let (dataset, queries) = data();
    let res = DeviceResources::new().unwrap();
    let d = DeviceVec::from_host(&res, &dataset).unwrap();
    let q = DeviceVec::from_host(&res, &queries).unwrap();
    let dv = rows(&d, N_ROWS).submatrix(500.., ..).unwrap();
    let qv = rows(&q, N_QUERIES).submatrix(10..30, ..).unwrap();
    let found = brute_force_knn(&res, dv, qv, K).unwrap();
    assert_eq!((found.neighbors.rows(), found.neighbors.cols()), (20, K));
    assert_exact(
        &found.neighbors.to_host().unwrap(),
        &found.distances.to_host().unwrap(),
        &dataset[500 * DIM..],
        &queries[10 * DIM..30 * DIM],
        K,
    );
}

#[test]
fn arrays_of_other_resources_are_ordered_before_and_after() {
    require_gpu!();
    let (dataset, queries) = data();
    let (ra, rb, rc) = (DeviceResources::new().unwrap(), DeviceResources::new().unwrap(), DeviceResources::new().unwrap());
    // Written on two other streams, searched on a third, with no sync in between: the search
    // waits for the copies, and returns only once done with the arrays.
    let d = DeviceVec::from_host(&ra, &dataset).unwrap();
    let q = DeviceVec::from_host(&rb, &queries).unwrap();
    let Neighbors { neighbors: ids, distances } = brute_force_knn(&rc, rows(&d, N_ROWS), rows(&q, N_QUERIES), K).unwrap();
    drop((d, q)); // freed on their own streams at once: the search is done with them
    assert_exact(&ids.to_host().unwrap(), &distances.to_host().unwrap(), &dataset, &queries, K);
}

#[test]
fn released_resources_are_refused_and_an_index_outliving_them_leaks_rather_than_frees_late() {
    require_gpu!();
    let (dataset, queries) = data();
    let res = DeviceResources::new().unwrap();
    let other = DeviceResources::new().unwrap();
    let d = DeviceVec::from_host(&other, &dataset).unwrap();
    let q = DeviceVec::from_host(&other, &queries).unwrap();
    let index = BruteForceIndex::build(matrix(&res, &dataset, N_ROWS), Metric::L2Expanded).unwrap();
    res.release().unwrap();
    let e = brute_force_knn(&res, rows(&d, N_ROWS), rows(&q, N_QUERIES), K).unwrap_err();
    assert_eq!((e.kind(), e.who()), (ErrorKind::Logic, "raft_cuvs::brute_force_knn"), "{e}");
    let e = index.search(rows(&q, N_QUERIES), K).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Logic, "{e}");
    let e = index.release().unwrap_err();
    assert!(e.message().contains("were released before this index"), "{e}");
    // The other resources are untouched.
    brute_force_knn(&other, rows(&d, N_ROWS), rows(&q, N_QUERIES), K).unwrap();
}

/// The child: cuVS cannot be loaded (`RAFT_CUVS_LIB` names nothing), and every bad argument must
/// still be refused as such, which proves the checks come before any native call.
fn refuse_before_loading() {
    let res = DeviceResources::new().unwrap();
    let d = DeviceVec::from_host(&res, &vec![0.5f32; 64 * 8]).unwrap(); // 64 × 8
    let q = DeviceVec::from_host(&res, &[0.5f32; 4 * 8]).unwrap(); // 4 × 8
    let (dv, qv) = (d.matrix(64, 8, Layout::RowMajor).unwrap(), q.matrix(4, 8, Layout::RowMajor).unwrap());
    report("dim", &brute_force_knn(&res, dv, q.matrix(8, 4, Layout::RowMajor).unwrap(), 1));
    // The soundness issue's lie (a huge shape over a small array) cannot even be described.
    report("rows", &d.matrix(4096, 4096, Layout::RowMajor));
    report("layout", &brute_force_knn(&res, d.matrix(64, 8, Layout::ColMajor).unwrap(), qv, 1));
    report("strided", &brute_force_knn(&res, dv, dv.submatrix(.., 0..4).unwrap().submatrix(0..4, ..).unwrap(), 1));
    report("k0", &brute_force_knn(&res, dv, qv, 0));
    report("k_over", &brute_force_knn(&res, dv, qv, 65));
    report(
        "index",
        &BruteForceIndex::build(DeviceMatrix::from_host(&res, &[1.0f32; 9], 3, 3, Layout::ColMajor).unwrap(), Metric::L2Expanded),
    );
    report(
        "cagra",
        &raft_cuvs::CagraIndex::build(DeviceMatrix::from_host(&res, &[1.0f32; 10], 1, 10, Layout::RowMajor).unwrap(), &Default::default()),
    );
    // Good arguments reach the loader: a clear error, no panic.
    report("good", &brute_force_knn(&res, dv, qv, 1));
}

#[test]
fn argument_checks_refuse_before_any_native_call() {
    if let Some(s) = child_scenario() {
        assert_eq!(s, "refuse");
        return refuse_before_loading();
    }
    require_gpu!();
    let c = rerun(
        concat!(module_path!(), "::argument_checks_refuse_before_any_native_call"),
        "refuse",
        &[("RAFT_CUVS_LIB", Some("/nonexistent/libcuvs_c.so"))],
        Duration::from_secs(60),
    );
    c.assert_code(0);
    for key in ["dim", "rows", "layout", "strided", "k0", "k_over", "index", "cagra"] {
        assert_eq!(c.result(key).as_deref(), Some("logic"), "{key}: {}", c.stdout);
    }
    assert!(c.message("rows").unwrap().contains("a 4096×4096 matrix needs 16777216 elements, the array has 512"), "{}", c.stdout);
    assert!(c.message("layout").unwrap().contains("cuVS takes row-major matrices"), "{}", c.stdout);
    assert!(c.message("strided").unwrap().contains("cuVS takes contiguous rows"), "{}", c.stdout);
    assert_eq!(c.message("k_over").unwrap(), "raft_cuvs::brute_force_knn: k = 65 is more than the 64 rows searched");
    assert_eq!(c.result("good").as_deref(), Some("cuda"));
    assert!(c.message("good").unwrap().contains("could not load cuVS's C library"), "{}", c.stdout);
}

/// An index dropped while its resources' stream is being captured into a CUDA graph is leaked,
/// not freed into the graph (the tenth audit): cuVS frees on the resources' stream, so the free
/// would become the graph's (a free node run at each launch, or an RMM pool's event recorded
/// into the capture, which another stream's allocation would then join). The release says so
/// (`Logic`) and the graph stays empty. (Before: the release returned `Ok` and the graph held
/// cuVS's frees.)
#[test]
fn an_index_dropped_while_the_stream_is_captured_is_leaked_not_freed_into_the_graph() {
    require_gpu!();
    use cudarc::driver::sys::CUstreamCaptureMode as Mode;
    let res = DeviceResources::new().unwrap();
    let (dataset, _) = data();
    let index = BruteForceIndex::build(matrix(&res, &dataset, N_ROWS), Metric::L2Expanded).unwrap();
    let stream = res.stream().unwrap();
    res.sync().unwrap();
    stream.begin_capture(Mode::CU_STREAM_CAPTURE_MODE_RELAXED).unwrap();
    let released = index.release();
    let (ended, nodes) = crate::common::end_capture_counting_nodes(&stream);
    let e = released.expect_err("an index was freed on a capturing stream");
    assert_eq!((e.kind(), e.who()), (ErrorKind::Logic, "BruteForceIndex::release"), "{e}");
    assert!(e.message().contains("captured into a CUDA graph") && e.message().contains("leaked"), "{e}");
    assert!(ended.is_ok(), "the capture was invalidated: {ended:?}");
    assert_eq!(nodes, 0, "the index's frees entered the graph");
    // The stream works on after the capture.
    let q = DeviceVec::from_host(&res, &dataset[..N_QUERIES * DIM]).unwrap();
    let d = DeviceVec::from_host(&res, &dataset).unwrap();
    brute_force_knn(&res, rows(&d, N_ROWS), rows(&q, N_QUERIES), K).unwrap();
}

/// cuVS's work is refused while the resources' stream is being captured into a CUDA graph (the
/// fifth audit): every call of this crate lends the resources through `with_cuvs`'s path, and
/// captured, cuVS's kernels would run at each launch of the graph, after the index and the
/// arrays may be gone. Nothing enters the graph; after the capture the lend and a search run.
/// (Before: the lend went ahead on the capturing stream.)
#[test]
fn cuvs_work_is_refused_while_the_stream_is_captured() {
    require_gpu!();
    use cudarc::driver::sys::{CUgraphInstantiate_flags as Flags, CUstreamCaptureMode as Mode};
    let res = DeviceResources::new().unwrap();
    let stream = res.stream().unwrap();
    stream.begin_capture(Mode::CU_STREAM_CAPTURE_MODE_RELAXED).unwrap();
    let refused = with_cuvs(&res, |_| Ok(()));
    let graph = stream.end_capture(Flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH);
    let e = refused.expect_err("cuVS was lent a capturing stream");
    assert_eq!((e.kind(), e.who()), (ErrorKind::Logic, "raft_cuvs::with_cuvs"), "{e}");
    assert!(e.message().contains("captured into a CUDA graph"), "{e}");
    drop(graph.unwrap());
    with_cuvs(&res, |_| Ok(())).unwrap();
    let (dataset, queries) = data();
    let d = DeviceVec::from_host(&res, &dataset).unwrap();
    let q = DeviceVec::from_host(&res, &queries).unwrap();
    brute_force_knn(&res, rows(&d, N_ROWS), rows(&q, N_QUERIES), K).unwrap();
}

/// The fifteenth audit: an input array of *other* resources whose stream is being captured into
/// a CUDA graph. Only the lent stream was asked; the array's own stream was asked inside
/// cudarc's infallible `DevicePtr`, which panics, so `search` panicked where `Logic` is promised,
/// and `brute_force_knn` panicked after building its temporary index, leaking it (its destroy
/// was skipped by the unwind). Now both return `Logic`, nothing enters the capture, and both
/// work after it. (Before: both panicked.)
#[test]
fn an_array_of_other_resources_on_a_captured_stream_is_refused_not_a_panic() {
    require_gpu!();
    use cudarc::driver::sys::CUstreamCaptureMode as Mode;
    use std::panic::{catch_unwind, AssertUnwindSafe};
    let (ra, rb) = (DeviceResources::new().unwrap(), DeviceResources::new().unwrap());
    let (dataset, queries) = data();
    let index = BruteForceIndex::build(matrix(&ra, &dataset, N_ROWS), Metric::L2Expanded).unwrap();
    let d = DeviceVec::from_host(&ra, &dataset).unwrap();
    let q = DeviceVec::from_host(&rb, &queries).unwrap();
    rb.sync().unwrap();
    let stream = rb.stream().unwrap();
    stream.begin_capture(Mode::CU_STREAM_CAPTURE_MODE_RELAXED).unwrap();
    let searched = catch_unwind(AssertUnwindSafe(|| index.search(rows(&q, N_QUERIES), K).map(drop)));
    let one_shot = catch_unwind(AssertUnwindSafe(|| brute_force_knn(&ra, rows(&d, N_ROWS), rows(&q, N_QUERIES), K).map(drop)));
    let (ended, nodes) = crate::common::end_capture_counting_nodes(&stream);
    for (who, got) in [("BruteForceIndex::search", searched), ("raft_cuvs::brute_force_knn", one_shot)] {
        let e = got.unwrap_or_else(|_| panic!("{who} panicked on an array whose stream is being captured")).expect_err(who);
        assert_eq!((e.kind(), e.who()), (ErrorKind::Logic, who), "{e}");
        assert!(e.message().contains("captured into a CUDA graph"), "{e}");
    }
    assert!(ended.is_ok(), "the capture was invalidated: {ended:?}");
    assert_eq!(nodes, 0, "work entered the capture");
    let found = index.search(rows(&q, N_QUERIES), K).unwrap();
    assert_exact(&found.neighbors.to_host().unwrap(), &found.distances.to_host().unwrap(), &dataset, &queries, K);
    brute_force_knn(&ra, rows(&d, N_ROWS), rows(&q, N_QUERIES), K).unwrap();
}

/// The child: a `with_cuvs` closure that begins a capture of the lent stream and leaves it open,
/// then ends as the scenario says (`ok`, `err`, `panic`).
fn capture_left_open_by_the_closure(ending: &str) {
    use cudarc::driver::sys::CUstreamCaptureMode as Mode;
    use std::panic::{catch_unwind, AssertUnwindSafe};
    crate::common::load_cuvs().as_ref().expect("cuVS");
    let res = DeviceResources::new().unwrap();
    res.sync().unwrap();
    let lent = catch_unwind(AssertUnwindSafe(|| {
        with_cuvs(&res, |cuvs| {
            cuvs.stream()?.begin_capture(Mode::CU_STREAM_CAPTURE_MODE_RELAXED).unwrap();
            match ending {
                "ok" => Ok(()),
                "err" => Err(raft_core::Error::logic("the closure", "its own error")),
                _ => panic!("the closure panics"),
            }
        })
    }));
    // Reached only when the lend let the open capture pass.
    println!("RESULT returned={}", if lent.is_ok() { "yes" } else { "panicked" });
}

/// A capture of the resources' stream begun inside `with_cuvs` and left open stops the process
/// however the closure ends (helper 112's open item): the check ran only after a closure that
/// returned `Ok`, so one that began the capture and then returned its error or panicked went
/// on with cuVS's work possibly in the graph. (Before: `err` and `panic` returned.)
#[test]
fn a_capture_left_open_in_with_cuvs_stops_the_process_however_the_closure_ends() {
    if let Some(s) = child_scenario() {
        return capture_left_open_by_the_closure(&s);
    }
    require_gpu!();
    for ending in ["ok", "err", "panic"] {
        let c = rerun(
            concat!(module_path!(), "::a_capture_left_open_in_with_cuvs_stops_the_process_however_the_closure_ends"),
            ending,
            &[],
            Duration::from_secs(60),
        );
        assert_eq!(c.result("returned"), None, "{ending}: the lend returned with a capture open\n{}\n{}", c.stdout, c.stderr);
        assert_eq!(c.signal, Some(libc::SIGABRT), "{ending}: {c:?}");
        assert!(c.stderr.contains("a CUDA graph capture began on the resources' stream while cuVS worked on it"), "{ending}: {}", c.stderr);
    }
}
