//! RMM's resources as Rust values (issue 15): every base resource and adaptor allocates, frees
//! and reports; limits become `OutOfMemory` and recover; a failure callback frees a cache and
//! the retry succeeds; tracking and logging see what happened; `reinitialize` and `RAFT_RMM_*`.
use raft::{memory, DeviceResources, DeviceVec, ErrorKind, MemoryResource, MemoryResourceKind, RmmOptions};
use raft_tests::OutputWithin;
use raft_tests::{require_gpu, run_scenario};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

const MIB: usize = 1 << 20;

/// Tests that change device 0's current resource run one at a time (they read it back).
fn current_resource_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Allocates `bytes` from `mr` on `res`, writes and reads it back, and frees it.
fn round_trip(res: &DeviceResources, mr: &MemoryResource, bytes: usize) {
    let host: Vec<u8> = (0..bytes).map(|i| (i * 7 % 251) as u8).collect();
    let mut v = DeviceVec::<u8>::new_in(res, bytes, mr).unwrap_or_else(|e| panic!("{:?}: {e}", mr.kind()));
    v.copy_from_host(&host).unwrap();
    assert_eq!(v.to_host().unwrap(), host, "{:?}", mr.kind());
}

#[test]
fn every_base_resource_and_adaptor_allocates_frees_and_reports_its_kind() {
    require_gpu!();
    let res = DeviceResources::on_device(0).unwrap();
    let cuda = MemoryResource::cuda(0).unwrap();
    let made: Vec<(MemoryResource, MemoryResourceKind)> = vec![
        (cuda.clone(), MemoryResourceKind::Cuda),
        (MemoryResource::cuda_async(0).unwrap(), MemoryResourceKind::CudaAsync),
        (
            MemoryResource::cuda_async_with(0, raft::AsyncPoolOptions::initial(64 * MIB).release_threshold(32 * MIB)).unwrap(),
            MemoryResourceKind::CudaAsync,
        ),
        (MemoryResource::managed(0).unwrap(), MemoryResourceKind::Managed),
        (MemoryResource::pinned_host(0).unwrap(), MemoryResourceKind::PinnedHost),
        (cuda.pool(raft::PoolOptions::initial(64 * MIB).maximum(256 * MIB)).unwrap(), MemoryResourceKind::Pool),
        (cuda.arena(raft::ArenaOptions::size(64 * MIB)).unwrap(), MemoryResourceKind::Arena),
        (cuda.binning(10, 20).unwrap(), MemoryResourceKind::Binning),
        (cuda.with_limit(64 * MIB).unwrap(), MemoryResourceKind::Limiting),
        (cuda.with_statistics().unwrap(), MemoryResourceKind::Statistics),
        (cuda.with_tracking().unwrap(), MemoryResourceKind::Tracking),
        (cuda.thread_safe().unwrap(), MemoryResourceKind::ThreadSafe),
        (cuda.with_failure_callback(|_| false).unwrap(), MemoryResourceKind::FailureCallback),
    ];
    for (mr, kind) in &made {
        assert_eq!(mr.kind(), *kind);
        assert_eq!(mr.device(), 0);
        round_trip(&res, mr, 3 * MIB + 5);
    }
    // Adaptors compose: a pool over managed memory, counted and tracked.
    let stacked = MemoryResource::managed(0)
        .unwrap()
        .pool(raft::PoolOptions::initial(32 * MIB))
        .unwrap()
        .with_tracking()
        .unwrap()
        .with_statistics()
        .unwrap();
    round_trip(&res, &stacked, MIB);
    let s = stacked.statistics().unwrap();
    assert_eq!((s.current_bytes, s.current_count, s.total_count), (0, 0, 1));
    assert!(s.peak_bytes >= MIB as i64 && s.total_bytes >= MIB as i64, "{s:?}");
}

#[test]
fn statistics_and_tracking_are_readable_from_other_threads_while_arrays_live() {
    require_gpu!();
    let res = DeviceResources::on_device(0).unwrap();
    let tracked = MemoryResource::cuda_async(0).unwrap().with_tracking().unwrap();
    let counted = tracked.with_statistics().unwrap();
    let arrays: Vec<DeviceVec<f32>> = (1..=4).map(|i| DeviceVec::new_in(&res, i * 1000, &counted).unwrap()).collect();
    let (t, c) = (tracked.clone(), counted.clone());
    let seen = std::thread::spawn(move || (t.tracked().unwrap(), c.statistics().unwrap(), t.tracking_report().unwrap())).join().unwrap();
    let bytes: usize = (1..=4).map(|i| i * 1000 * 4).sum();
    assert_eq!(seen.0.count, 4);
    assert!(seen.0.bytes >= bytes, "{:?}", seen.0);
    assert_eq!(seen.1.current_count, 4);
    assert!(!seen.2.is_empty(), "RMM's report lists the live allocations");
    drop(arrays);
    assert_eq!(tracked.tracked().unwrap().count, 0);
    assert_eq!(counted.statistics().unwrap().current_bytes, 0);
}

#[test]
fn a_limit_becomes_out_of_memory_and_freeing_recovers() {
    require_gpu!();
    let res = DeviceResources::on_device(0).unwrap();
    let limited = MemoryResource::cuda_async(0).unwrap().with_limit(8 * MIB).unwrap();
    let first = DeviceVec::<u8>::new_in(&res, 6 * MIB, &limited).unwrap();
    let e = DeviceVec::<u8>::new_in(&res, 6 * MIB, &limited).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::OutOfMemory, "{e}");
    assert_eq!(e.who(), "DeviceVec::new_in");
    let raft::LimitUsage { allocated, limit } = limited.limit().unwrap();
    assert_eq!(limit, 8 * MIB);
    assert!(allocated >= 6 * MIB);
    drop(first);
    DeviceVec::<u8>::new_in(&res, 6 * MIB, &limited).expect("the limit has room again once the first array is gone");
}

#[test]
fn a_failure_callback_frees_a_cache_and_the_retry_succeeds() {
    require_gpu!();
    let res = DeviceResources::on_device(0).unwrap();
    let limited = MemoryResource::cuda_async(0).unwrap().with_limit(8 * MIB).unwrap();
    // A cache the callback can empty: arrays held for later use.
    let cache: Arc<Mutex<Vec<DeviceVec<u8>>>> = Arc::new(Mutex::new(Vec::new()));
    let calls = Arc::new(AtomicUsize::new(0));
    let (c, n) = (cache.clone(), calls.clone());
    let mr = limited
        .with_failure_callback(move |_bytes| {
            n.fetch_add(1, Ordering::SeqCst);
            let mut held = c.lock().unwrap();
            let freed = !held.is_empty();
            held.clear();
            freed // retry only when something was freed
        })
        .unwrap();
    cache.lock().unwrap().push(DeviceVec::new_in(&res, 6 * MIB, &mr).unwrap());
    let v = DeviceVec::<u8>::new_in(&res, 6 * MIB, &mr).expect("the callback emptied the cache and the retry fit");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert!(cache.lock().unwrap().is_empty());
    // Nothing left to free: the callback says no, the allocation is out of memory.
    let e = DeviceVec::<u8>::new_in(&res, 6 * MIB, &mr).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::OutOfMemory, "{e}");
    // Asked again at least once; twice when the allocation was retried after the device's
    // pending releases ran (out of memory only after they had their chance).
    assert!(calls.load(Ordering::SeqCst) >= 2, "{}", calls.load(Ordering::SeqCst));
    drop(v);
}

#[test]
fn a_panicking_failure_callback_is_caught_and_means_out_of_memory() {
    require_gpu!();
    let res = DeviceResources::on_device(0).unwrap();
    let mr = MemoryResource::cuda_async(0).unwrap().with_limit(MIB).unwrap().with_failure_callback(|_| panic!("callback bug")).unwrap();
    let e = DeviceVec::<u8>::new_in(&res, 2 * MIB, &mr).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::OutOfMemory, "{e}");
    round_trip(&res, &mr, MIB / 2); // the adaptor still works
}

#[test]
fn logging_writes_rmms_csv() {
    require_gpu!();
    let res = DeviceResources::on_device(0).unwrap();
    let path = std::env::temp_dir().join(format!("raft-rmm-log-{}.csv", std::process::id()));
    let _ = std::fs::remove_file(&path);
    {
        let logged = MemoryResource::cuda_async(0).unwrap().with_logging(&path, true).unwrap();
        round_trip(&res, &logged, 12345);
    } // the adaptor (and its log) goes with its last handle
    let csv = std::fs::read_to_string(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    let lines: Vec<&str> = csv.lines().collect();
    assert!(lines.first().is_some_and(|h| h.contains("Action") && h.contains("Size")), "a CSV header: {csv}");
    assert!(lines.iter().any(|l| l.contains("allocate") && l.contains("12345")), "{csv}");
    assert!(lines.iter().any(|l| l.contains("free") && l.contains("12345")), "{csv}");
}

#[test]
fn set_current_returns_the_previous_and_arrays_keep_theirs() {
    require_gpu!();
    let _one = current_resource_lock();
    let res = DeviceResources::on_device(0).unwrap();
    let before = memory::current(0).unwrap();
    let counted = MemoryResource::cuda_async(0).unwrap().with_statistics().unwrap();
    let previous = memory::set_current(0, &counted).unwrap();
    assert!(previous.same_as(&before).unwrap());
    let v = DeviceVec::<f32>::from_host(&res, &[1.0, 2.0, 3.0]).unwrap(); // from `counted`
    assert_eq!(counted.statistics().unwrap().current_count, 1);
    // Replace it again: the array still holds `counted`, and frees through it.
    memory::set_current(0, &before).unwrap();
    assert_eq!(v.to_host().unwrap(), [1.0, 2.0, 3.0]);
    drop(v);
    assert_eq!(counted.statistics().unwrap().current_count, 0);
    // A resource of another device is refused: that refusal, not "no device 1" (issue 33, 14).
    // (One GPU: no device 1 to refuse it for.)
    if raft_tests::gpus_or_skip(2).is_none() {
        return;
    }
    let e = memory::set_current(1, &counted).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Logic, "{e}");
    assert_eq!(e.to_string(), "raft::memory::set_current: a memory resource of device 0 cannot serve device 1");
}

#[test]
fn reinitialize_builds_what_the_options_describe() {
    require_gpu!();
    let _one = current_resource_lock();
    let res = DeviceResources::on_device(0).unwrap();
    let options = RmmOptions {
        allocator: memory::Allocator::Pool(memory::Base::Device, raft::PoolOptions::initial(64 * MIB).maximum(512 * MIB)),
        statistics: true,
        ..Default::default()
    };
    let previous = memory::reinitialize(0, &options).unwrap();
    let now = memory::current(0).unwrap();
    assert_eq!(now.kind(), MemoryResourceKind::Statistics);
    let v = DeviceVec::<u8>::zeros(&res, 4 * MIB).unwrap();
    assert_eq!(now.statistics().unwrap().current_bytes, 4 * MIB as i64);
    drop(v);
    memory::set_current(0, &previous).unwrap();
}

#[test]
fn a_pool_on_one_device_and_an_async_resource_on_another_stay_on_their_devices() {
    require_gpu!();
    if raft_tests::gpus_or_skip(2).is_none() {
        return;
    }
    let ordinal = raft_tests::device_of::<u8>;
    // Made from device 0's thread context: each resource must still allocate on its own device
    // (NVIDIA/raft#3077 made the pool on whatever device was current).
    let pool1 = MemoryResource::cuda(1).unwrap().pool(raft::PoolOptions::initial(64 * MIB)).unwrap();
    let async0 = MemoryResource::cuda_async(0).unwrap();
    let (r0, r1) = (DeviceResources::on_device(0).unwrap(), DeviceResources::on_device(1).unwrap());
    let a = DeviceVec::<u8>::new_in(&r1, MIB, &pool1).unwrap();
    let b = DeviceVec::<u8>::new_in(&r0, MIB, &async0).unwrap();
    assert_eq!((ordinal(&a), ordinal(&b)), (1, 0));
    assert_eq!(DeviceVec::<u8>::new_in(&r0, MIB, &pool1).unwrap_err().kind(), ErrorKind::Logic);
}

#[test]
fn the_tracking_report_at_exit_names_a_leaked_array() {
    require_gpu!();
    let exe = raft_tests::scenarios_exe(env!("CARGO_BIN_EXE_rmm-exit"));
    let exe = if exe.file_name().is_some_and(|n| n == "scenarios") { exe.with_file_name("rmm-exit") } else { exe };
    let out = std::process::Command::new(exe).env("RUST_LOG", "raft=warn").output_within(std::time::Duration::from_secs(120));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let leaked = stdout.lines().find_map(|l| l.strip_prefix("LEAKED ")).expect("the child names its leaked array").trim().to_string();
    assert!(stderr.contains("still live in a tracking resource"), "{stderr}");
    assert!(stderr.to_lowercase().contains(&leaked.to_lowercase()), "the report names the leaked array's address {leaked}:\n{stderr}");
}

#[test]
fn a_pool_over_a_failure_callback_is_refused_since_the_callback_would_run_under_the_pool_lock() {
    require_gpu!();
    let cb = MemoryResource::cuda(0).unwrap().with_limit(64 * MIB).unwrap().with_failure_callback(|_| false).unwrap();
    for (what, made) in [
        ("pool", cb.pool(raft::PoolOptions::initial(32 * MIB))),
        ("arena", cb.arena(raft::ArenaOptions::size(64 * MIB))),
        ("binning", cb.binning(10, 20)),
        ("thread_safe", cb.thread_safe()),
        // Also further down the chain, and through the device's current resource.
        ("pool over statistics over it", cb.with_statistics().unwrap().pool(raft::PoolOptions::initial(32 * MIB))),
    ] {
        let e = made.err().unwrap_or_else(|| panic!("{what}: accepted"));
        assert_eq!(e.kind(), ErrorKind::Logic, "{what}: {e}");
        assert!(e.message().contains("failure-callback"), "{what}: {e}");
    }
    // The other way round is fine: the callback on top sees the pool's failures.
    let top =
        MemoryResource::cuda(0).unwrap().pool(raft::PoolOptions::initial(32 * MIB)).unwrap().with_failure_callback(|_| false).unwrap();
    let res = DeviceResources::on_device(0).unwrap();
    round_trip(&res, &top, MIB);
}

/// The exit hook registered before RMM's per-device map exists: at exit the map is destroyed
/// before this library's teardown runs, which then leaves it alone (before the fix it looked the
/// device's resource up in the destroyed map: GPU run 24 caught the `rmm` test binary dying of
/// SIGSEGV there under cuda-gdb, in `copy_current` under `memory::teardown`). A use after free
/// does not crash every time (run 25: these eight children did not crash with the old shim).
#[test]
fn an_exit_hook_registered_before_rmms_map_never_reads_the_destroyed_map() {
    require_gpu!();
    for i in 0..8 {
        let c = run_scenario!("hook-before-rmm-map", &[], std::time::Duration::from_secs(60));
        assert_eq!(c.result("made").as_deref(), Some("ok"), "run {i}: {}", c.stderr);
        c.assert_code(0);
    }
}

/// Pools destroyed on release threads while other release threads wait for the streams that
/// freed into them (the pattern of the crash run 33 caught: a release thread faulting in
/// `cuStreamSynchronize`): 8 threads × 200 rounds of resources + async pool + array, dropped,
/// in a child process, three times. The child must end normally.
#[test]
fn pools_destroyed_beside_stream_waits_never_crash() {
    require_gpu!();
    for i in 0..3 {
        let c = run_scenario!("pool-destroy-race", &[], std::time::Duration::from_secs(120));
        c.assert_code(0);
        assert_eq!(c.result("rounds").as_deref(), Some("1600"), "run {i}: {}", c.stderr);
    }
}

/// An async pool made current and replaced again, its Rust handle dropped before the arrays
/// made from it through the default path (the last array's own copy then lets the pool go),
/// while seven threads keep allocating from whatever is current.
///
/// History: with pools destroyed when their last copy went, this hung (GPU run 39, 3 of 6 runs;
/// run 41, 2 of 3; cuda-gdb: every thread inside libcuda). With pools buried and destroyed later
/// by release threads, 3 of 3 clean on their own (run 47) but a hang and a SIGSEGV inside the
/// whole `rmm` binary (runs 47, 48). Since pools are retired and reused, never destroyed: see
/// docs/gpu-runs.md for the runs after.
#[test]
fn a_replaced_current_pool_destroyed_by_its_last_array_never_crashes() {
    require_gpu!();
    for i in 0..3 {
        let c = run_scenario!("pool-dies-default-path", &[], std::time::Duration::from_secs(60));
        c.assert_code(0);
        assert_eq!(c.result("rounds").as_deref(), Some("200"), "run {i}: {}", c.stderr);
    }
}

/// The driver hazard behind the test above, through this library: eight threads, each round an
/// async pool whose last copy is an array, freed (stream-ordered) on a stream that then goes on
/// working. The driver crashes when such a pool is destroyed with the free still queued (GPU
/// run 42, `raw-pool-streams` in `inline` mode: 4 of 4 runs). Hung 2 of 3 times with pools
/// destroyed at their last copy (run 44), and 1 of 1 with the burial inside the whole binary
/// (run 48: releases still pending after 30 s). Now every pool is retired and the next round's
/// pool is a retired one again: 800 pools asked for, a handful made, and once the streams are
/// done the retired pools hold nothing after `trim_retired_pools` (the device's free memory is
/// no measure here: the binary's other tests run children beside this one, run 49).
#[test]
fn an_async_pool_whose_last_copy_is_a_freed_array_never_crashes() {
    require_gpu!();
    for i in 0..3 {
        let c = run_scenario!("pool-last-copy-in-array", &[], std::time::Duration::from_secs(60));
        c.assert_code(0);
        assert_eq!(c.result("rounds").as_deref(), Some("800"), "run {i}: {}", c.stderr);
        let count = |k: &str| -> u64 {
            let v = c.result(k).unwrap_or_else(|| panic!("run {i}: no {k} in {}", c.stdout));
            v.parse().unwrap_or_else(|_| panic!("run {i}: {k}={v} is no count"))
        };
        let (made, retired, reused) = (count("pools_made"), count("pools_retired"), count("pools_reused"));
        assert!(retired >= 800, "run {i}: every pool retired: {}", c.stdout);
        assert!(made <= 16, "run {i}: retired pools reused, not made anew: {}", c.stdout);
        // 800 pools asked for, and the default one the first resources install.
        assert_eq!(made + reused, 801, "run {i}: every pool asked for was made or reused: {}", c.stdout);
        assert_eq!(count("still_held"), 0, "run {i}: retired pools give all their memory back: {}", c.stdout);
    }
}

/// A retired pool handed out again behaves as a new one with the settings asked for: made with a
/// 64 MiB initial size and release threshold 0, used, dropped (retired: threshold 0, trimmed),
/// then asked for again with the default threshold ("never"): it is the same pool (one made, one
/// reused) and it holds its 64 MiB primed across a device-wide synchronisation, with nothing in
/// use. Fails if reuse kept the retired threshold of 0 (the memory would go back at the sync) or
/// skipped the priming.
#[test]
fn a_reused_async_pool_takes_the_settings_asked_for() {
    require_gpu!();
    let c = run_scenario!("pool-reuse-settings", &[], std::time::Duration::from_secs(60));
    c.assert_code(0);
    let count = |k: &str| -> u64 {
        let v = c.result(k).unwrap_or_else(|| panic!("no {k} in {}: {}", c.stdout, c.stderr));
        v.parse().unwrap_or_else(|_| panic!("{k}={v} is no count"))
    };
    // Counted from after the first resources (which install the default pool): a is made,
    // retired, and b is a again.
    assert_eq!((count("made"), count("retired"), count("reused")), (1, 1, 1), "{}", c.stdout);
    assert!(count("reserved_mib") >= 64, "the reused pool keeps its primed 64 MiB: {}", c.stdout);
    assert_eq!(count("used"), 0, "{}", c.stdout);
}

/// The fifteenth audit: an async pool whose initial size cannot be had (64 TiB) was made by RMM's
/// constructor, which primes before it completes; the priming threw, no destructor ran, and the
/// pool was never destroyed nor retired: one more lost at every such call, until the driver had
/// none left. Now the pool is made, guarded, then primed: a failed priming retires it, and the
/// next call reuses it. In a child process (`pool-priming-fails`): four calls, each
/// `OutOfMemory`, each retiring the pool it tried (one made, then reused: the counts of made and
/// reused pools count completed ones, so a failed reuse shows as a retirement only). (Before:
/// none retired, and none counted as made either: the lost pools' constructors never
/// completed.)
#[test]
fn an_async_pool_whose_initial_size_cannot_be_had_is_retired_not_lost() {
    require_gpu!();
    let c = run_scenario!("pool-priming-fails", &[], std::time::Duration::from_secs(60));
    c.assert_code(0);
    let count = |k: &str| -> u64 {
        let v = c.result(k).unwrap_or_else(|| panic!("no {k} in {}: {}", c.stdout, c.stderr));
        v.parse().unwrap_or_else(|_| panic!("{k}={v} is no count"))
    };
    assert_eq!(c.result("kinds").as_deref(), Some("OutOfMemory,OutOfMemory,OutOfMemory,OutOfMemory"), "{}", c.stdout);
    assert!(count("retired") >= 4, "the pool of a failed call was not retired (lost): {}", c.stdout);
    assert!(count("made") <= 1, "a retired pool was not reused by the next call: {}", c.stdout);
}

/// Async pools made and dropped in a loop while the resources whose streams freed into them
/// stay alive and keep allocating, syncing and releasing (8 threads × 200 pools). Reusing such a
/// stream for later resources crashed or hung the driver (GPU runs 36-38); this is the
/// long-lived shape of the same thing, with staged copies each round.
#[test]
fn pools_dropped_while_their_streams_live_on_never_crash() {
    require_gpu!();
    for i in 0..3 {
        let c = run_scenario!("pool-dies-beside-live-streams", &[], std::time::Duration::from_secs(120));
        c.assert_code(0);
        assert_eq!(c.result("rounds").as_deref(), Some("1600"), "run {i}: {}", c.stderr);
    }
}
