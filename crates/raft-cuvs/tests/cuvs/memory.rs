//! cuVS's allocations in raft-rs's memory statistics (GPU; skips without one or without cuVS,
//! fails under `RAFT_REQUIRE_GPU=1`): one RMM in the process, so the statistics adaptor raft-rs
//! installs as the device's resource counts what cuVS allocates on lent resources. Run in a child
//! process (this binary re-run with `RAFT_CUVS_CHILD`): statistics are per device, for the whole
//! process, and the other tests' allocations would count too.
use crate::common::{child_scenario, rerun, Rng};
use raft_core::{memory, DeviceMatrix, DeviceResources, DeviceVec, Layout, MemoryResourceKind};
use raft_cuvs::{brute_force_knn, CagraIndex, CagraIndexParams};

#[test]
fn cuvs_allocations_are_counted_by_raft_memory_statistics() {
    if let Some(s) = child_scenario() {
        assert_eq!(s, "statistics");
        return counted();
    }
    require_gpu!();
    let test = concat!(module_path!(), "::cuvs_allocations_are_counted_by_raft_memory_statistics");
    let c = rerun(test, "statistics", &[], std::time::Duration::from_secs(300));
    eprintln!(
        "{}",
        c.stderr.lines().filter(|l| l.contains("before") || l.contains("after") || l.contains("built")).collect::<Vec<_>>().join("\n")
    );
    c.assert_code(0);
}

/// The child: statistics enabled on the device, then cuVS's searches and builds counted.
fn counted() {
    require_gpu!();
    const N_ROWS: usize = 20_000;
    const DIM: usize = 64;
    const N_QUERIES: usize = 500;
    const K: usize = 10;
    let mut rng = Rng::new(0x5eed_0004);
    let res = DeviceResources::new().unwrap(); // installs raft-rs's default pool on the device
    let device = res.device();
    let dataset = rng.uniform_vec(N_ROWS * DIM);
    let d = DeviceVec::from_host(&res, &dataset).unwrap();
    let q = DeviceVec::from_host(&res, &rng.uniform_vec(N_QUERIES * DIM)).unwrap();
    res.sync().unwrap();

    // From now on the device's RMM resource counts; cuVS has not touched these resources yet,
    // so RAFT's workspace resource (made at cuVS's first use) stands on the counting one too.
    let counting = memory::current(device).unwrap().with_statistics().unwrap();
    memory::set_current(device, &counting).unwrap();
    assert_eq!(memory::current(device).unwrap().kind(), MemoryResourceKind::Statistics);
    let before = counting.statistics().unwrap();
    let found =
        brute_force_knn(&res, d.matrix(N_ROWS, DIM, Layout::RowMajor).unwrap(), q.matrix(N_QUERIES, DIM, Layout::RowMajor).unwrap(), K)
            .unwrap();
    res.sync().unwrap();
    let after = counting.statistics().unwrap();
    let ours = (N_QUERIES * K * (8 + 4)) as i64; // the two result arrays raft-cuvs allocates
    eprintln!("brute force: before {before:?}\n             after  {after:?}");
    assert!(after.total_count - before.total_count > 2, "cuVS's own allocations were not counted: {before:?} -> {after:?}");
    assert!(after.total_bytes - before.total_bytes > ours, "only raft-cuvs's {ours} bytes were counted: {before:?} -> {after:?}");
    // cuVS's temporaries (at least the norms of the rows and a distance tile) were live at once
    // with the results: the peak grew past what raft-cuvs allocated.
    assert!(after.peak_bytes > before.current_bytes + ours, "the peak did not grow past raft-cuvs's own: {before:?} -> {after:?}");
    drop(found);

    // A CAGRA index keeps its graph (rows × degree × 4 bytes) in device memory from the same
    // resource: counted while the index lives, and given back when it is released.
    let before = counting.statistics().unwrap();
    let index =
        CagraIndex::build(DeviceMatrix::from_host(&res, &dataset, N_ROWS, DIM, Layout::RowMajor).unwrap(), &CagraIndexParams::default())
            .unwrap();
    res.sync().unwrap();
    let built = counting.statistics().unwrap();
    let graph = (N_ROWS * index.graph_degree() * 4) as i64;
    let rows = (N_ROWS * DIM * 4) as i64; // the dataset array the index owns (raft-rs's)
    eprintln!("CAGRA: before {before:?}\n       built  {built:?}");
    assert!(built.current_bytes - before.current_bytes >= rows + graph, "the graph is not counted: {before:?} -> {built:?}");
    index.release().unwrap();
    res.sync().unwrap();
    let released = counting.statistics().unwrap();
    assert!(released.current_bytes <= built.current_bytes - graph, "the graph was not given back: {built:?} -> {released:?}");
}

/// An index's memory freed while another thread captures an unrelated stream in global mode (the
/// twelfth audit): cuVS frees it on the dropping thread through the device's resource; with
/// `cuda_memory_resource` that is a `cudaFree`, which the driver refuses in the thread's own
/// global mode during such a capture, and RMM drops the refusal: the memory never went back.
/// Now cuVS's calls run with the capture mode relaxed. In a child process: the device's resource
/// is replaced for the whole process. (Before: `release()` returned `Ok`, the memory stayed
/// taken and the other capture was invalidated: run 181.)
#[test]
fn an_index_freed_while_another_thread_captures_in_global_mode_gives_its_memory_back() {
    if let Some(s) = child_scenario() {
        assert_eq!(s, "freed-under-capture");
        return freed_under_capture();
    }
    require_gpu!();
    let test = concat!(module_path!(), "::an_index_freed_while_another_thread_captures_in_global_mode_gives_its_memory_back");
    let c = rerun(test, "freed-under-capture", &[], std::time::Duration::from_secs(300));
    eprintln!("{}", c.stderr.lines().filter(|l| l.contains("free") || l.contains("capture")).collect::<Vec<_>>().join("\n"));
    c.assert_code(0);
}

/// The child: a brute-force index whose norms (`N_ROWS` floats) come from `cudaMalloc`, dropped
/// during another thread's global capture; the dataset it owns comes from a pool that keeps
/// its memory, so the device's free memory moves by the norms alone.
fn freed_under_capture() {
    use raft_core::{MemoryResource, PoolOptions};
    use raft_cuvs::{BruteForceIndex, Metric};
    require_gpu!();
    const N_ROWS: usize = 1 << 24;
    const DIM: usize = 2;
    const NORMS: usize = N_ROWS * 4;
    let res = DeviceResources::new().unwrap();
    let device = res.device();
    let ctx = res.context().clone();
    let cuda = MemoryResource::cuda(device).unwrap();
    let pool = cuda.pool(PoolOptions::initial(N_ROWS * DIM * 4 + (64 << 20))).unwrap();
    let mut data = DeviceVec::<f32>::new_in(&res, N_ROWS * DIM, &pool).unwrap();
    data.fill_zero().unwrap();
    let dataset = DeviceMatrix::from_vec(data, N_ROWS, DIM, Layout::RowMajor).unwrap();
    memory::set_current(device, &cuda).unwrap();
    let index = BruteForceIndex::build(dataset, Metric::L2Expanded).unwrap();
    res.sync().unwrap();
    let (free_before, _) = ctx.mem_get_info().unwrap();
    let (released, other) = while_another_thread_captures_globally(&ctx, || index.release());
    let (free_after, _) = ctx.mem_get_info().unwrap();
    eprintln!("the index's release: {released:?}; the other thread's capture: {other:?}; free {free_before} -> {free_after}");
    released.unwrap();
    other.unwrap_or_else(|e| panic!("the index's release invalidated another thread's capture: {e}"));
    assert!(
        free_after >= free_before + NORMS / 2,
        "the index's {NORMS} bytes of norms freed during another thread's global capture did not go back: {free_before} bytes free \
         before the release, {free_after} after"
    );
    drop(pool);
}

/// Runs `body` while another thread captures an unrelated stream of `ctx` in global mode (the mode
/// PyTorch's captures default to), then ends that capture: `body`'s result and whether the capture
/// stayed valid (its graph could be made). As raft-tests' `capture.rs` does.
fn while_another_thread_captures_globally<R>(
    ctx: &std::sync::Arc<cudarc::driver::CudaContext>,
    body: impl FnOnce() -> R,
) -> (R, Result<(), String>) {
    use cudarc::driver::sys::{CUgraphInstantiate_flags as Flags, CUstreamCaptureMode as Mode};
    let unrelated = ctx.new_stream().unwrap();
    let (begun_tx, begun_rx) = std::sync::mpsc::channel();
    let (end_tx, end_rx) = std::sync::mpsc::channel::<()>();
    let capturer = std::thread::spawn(move || {
        unrelated.begin_capture(Mode::CU_STREAM_CAPTURE_MODE_GLOBAL).unwrap();
        begun_tx.send(()).unwrap();
        let _ = end_rx.recv_timeout(std::time::Duration::from_secs(60));
        unrelated.end_capture(Flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH).map(drop).map_err(|e| e.to_string())
    });
    begun_rx.recv_timeout(std::time::Duration::from_secs(10)).expect("the other thread began its capture");
    let out = body();
    end_tx.send(()).unwrap();
    (out, capturer.join().unwrap())
}

/// A brute-force search while another thread captures an unrelated stream in global mode, with
/// `cuda_memory_resource` current (the twelfth audit's review): cuVS's temporaries come from
/// `cudaMalloc` and go back with `cudaFree` inside the lend, which the driver refused in the
/// thread's own global mode. The crate's lends run relaxed: the search succeeds, and the capture
/// stays valid. In a child process: the device's resource is replaced for the whole process.
#[test]
fn a_search_while_another_thread_captures_in_global_mode_succeeds_and_leaves_that_capture_valid() {
    if let Some(s) = child_scenario() {
        assert_eq!(s, "search-under-capture");
        return search_under_capture();
    }
    require_gpu!();
    let test = concat!(module_path!(), "::a_search_while_another_thread_captures_in_global_mode_succeeds_and_leaves_that_capture_valid");
    let c = rerun(test, "search-under-capture", &[], std::time::Duration::from_secs(300));
    eprintln!("{}", c.stderr.lines().filter(|l| l.contains("search") || l.contains("capture")).collect::<Vec<_>>().join("\n"));
    c.assert_code(0);
}

fn search_under_capture() {
    use raft_core::MemoryResource;
    require_gpu!();
    const N_ROWS: usize = 20_000;
    const DIM: usize = 32;
    const N_QUERIES: usize = 100;
    let mut rng = Rng::new(0x5eed_0005);
    let res = DeviceResources::new().unwrap();
    let device = res.device();
    let ctx = res.context().clone();
    let d = DeviceVec::from_host(&res, &rng.uniform_vec(N_ROWS * DIM)).unwrap();
    let q = DeviceVec::from_host(&res, &rng.uniform_vec(N_QUERIES * DIM)).unwrap();
    res.sync().unwrap();
    memory::set_current(device, &MemoryResource::cuda(device).unwrap()).unwrap();
    let (found, other) = while_another_thread_captures_globally(&ctx, || {
        brute_force_knn(&res, d.matrix(N_ROWS, DIM, Layout::RowMajor)?, q.matrix(N_QUERIES, DIM, Layout::RowMajor)?, 10)
    });
    eprintln!("the search: {:?}; the other thread's capture: {other:?}", found.as_ref().map(|_| ()));
    found.unwrap_or_else(|e| panic!("a search during another thread's global capture: {e}"));
    other.unwrap_or_else(|e| panic!("the search invalidated another thread's capture: {e}"));
}
