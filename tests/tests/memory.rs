//! Seed 2.2.3 "The default memory resource": each case in a fresh process, since the rule
//! applies to the first resources made on a device.
use raft_tests::{require_gpu, run_scenario};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);

#[test]
fn the_first_resources_replace_rmm_s_default_with_the_async_pool() {
    require_gpu!();
    let c = run_scenario!("mr-default", &[], LIMIT);
    c.assert_code(0);
    assert_eq!(c.result("before").as_deref(), Some("Cuda"));
    let pools = raft::memory_pools_supported(0).unwrap();
    assert_eq!(c.result("after").as_deref(), Some(if pools { "CudaAsync" } else { "Cuda" }));
    assert_eq!(c.result("installed").as_deref(), Some(if pools { "true" } else { "false" }));
}

#[test]
fn a_resource_the_user_installed_before_is_left_alone() {
    require_gpu!();
    let c = run_scenario!("mr-user-before", &[], LIMIT);
    c.assert_code(0);
    assert_eq!(c.result("after").as_deref(), Some("Managed"));
    assert_eq!(c.result("installed").as_deref(), Some("false"));
}

#[test]
fn a_plain_cuda_memory_resource_installed_before_looks_like_the_default_and_is_replaced() {
    require_gpu!();
    let c = run_scenario!("mr-cuda-before", &[], LIMIT);
    c.assert_code(0);
    assert_eq!(c.result("after").as_deref(), Some("CudaAsync"));
    assert_eq!(c.result("installed").as_deref(), Some("true"));
}

#[test]
fn a_resource_installed_after_the_first_resources_is_left_alone() {
    require_gpu!();
    let c = run_scenario!("mr-user-after", &[], LIMIT);
    c.assert_code(0);
    assert_eq!(c.result("after").as_deref(), Some("Managed"));
}

#[test]
fn allocations_use_the_current_resource_and_statistics_count_them() {
    require_gpu!();
    let r = raft::DeviceResources::new().unwrap();
    raft::enable_memory_statistics(0).unwrap();
    assert_eq!(raft::current_memory_resource(0).unwrap(), raft::MemoryResourceKind::Statistics);
    let before = raft::memory_statistics(0).unwrap();
    let v = raft::DeviceVec::<u8>::zeros(&r, 8 << 20).unwrap();
    let during = raft::memory_statistics(0).unwrap();
    assert!(during.current_bytes - before.current_bytes >= 8 << 20, "{before:?} -> {during:?}");
    assert!(during.peak_bytes >= during.current_bytes);
    drop(v);
    r.sync().unwrap();
    let after = raft::memory_statistics(0).unwrap();
    assert_eq!(after.current_bytes, before.current_bytes);
}

#[test]
fn queries_on_a_device_that_does_not_exist_are_logic_errors() {
    require_gpu!();
    let n = raft::device_count().unwrap();
    let e = raft::current_memory_resource(n).unwrap_err();
    assert_eq!(e.kind(), raft::ErrorKind::Logic);
    assert_eq!(e.to_string(), format!("current_memory_resource: no device {n} among {n}"));
    assert_eq!(raft::set_memory_resource(0, raft::MemoryResourceKind::Other).unwrap_err().kind(), raft::ErrorKind::Logic);
}

#[test]
fn a_free_that_may_block_runs_on_a_release_thread_and_the_pool_frees_inline() {
    require_gpu!();
    let c = run_scenario!("array-frees", &[], LIMIT);
    c.assert_code(0);
    assert_eq!(c.result("pool_inline").as_deref(), Some("true"));
    assert_eq!(c.result("cuda_on_release_thread").as_deref(), Some("true"));
    assert_eq!(c.result("live_arrays").as_deref(), Some("0"));
}

#[test]
fn arrays_dropped_as_the_process_exits_are_released_before_the_teardown() {
    require_gpu!();
    let c = run_scenario!("array-drop-at-exit", &[], LIMIT);
    c.assert_code(0);
    assert_eq!(c.signal, None);
    assert!(c.stderr.contains("tearing down"), "{}", c.stderr);
}
