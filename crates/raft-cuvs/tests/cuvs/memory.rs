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
