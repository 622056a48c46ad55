//! Seed 2.2.3 "The default memory resource" and RMM memory resources as owned values.
//!
//! The default-resource rule applies to the first resources made on a device: each of its cases
//! runs in a fresh process (`scenarios`). The owned-resource cases run here, one at a time
//! ([`one_at_a_time`]): they replace device 0's resource, which the others read. What happens
//! at exit runs in a child process of its own (`tls-exit`).
use raft::{memory, DeviceResources, DeviceVec, ErrorKind, MemoryResource, MemoryResourceKind};
use raft_tests::{require_gpu, run_scenario, Child, OutputWithin};
use std::io::Write;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Mutex, MutexGuard, Once};
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(60);
const MIB: usize = 1 << 20;

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

/// The default pool replaced by `set_current` gives its memory back once the caller's handle of
/// it goes (the fifth audit, M1: the library's own copy, kept for the exit, held it reserved until
/// the exit, and a later large allocation of another resource failed for want of it). In a
/// process of its own: the current resource is process-wide.
#[test]
fn the_default_pool_gives_its_memory_back_once_replaced_and_let_go() {
    require_gpu!();
    if !raft::memory_pools_supported(0).unwrap() {
        eprintln!("the_default_pool_gives_its_memory_back_once_replaced_and_let_go: skipped: no async pools");
        return;
    }
    let c = run_scenario!("mr-default-replaced", &[], LIMIT);
    c.assert_code(0);
    assert_eq!(c.result("was_default").as_deref(), Some("true"), "{}", c.stderr);
    let back: usize = c.result("mib_back").and_then(|v| v.parse().ok()).expect("mib_back");
    assert!(back >= 900, "only {back} MiB of the pool's 1 GiB came back once it was replaced and let go");
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
    let _one = one_at_a_time();
    let r = raft::DeviceResources::new().unwrap();
    let counted = memory::current(0).unwrap().with_statistics().unwrap();
    memory::set_current(0, &counted).unwrap();
    assert_eq!(memory::current(0).unwrap().kind(), raft::MemoryResourceKind::Statistics);
    let before = counted.statistics().unwrap();
    let v = raft::DeviceVec::<u8>::zeros(&r, 8 << 20).unwrap();
    let during = counted.statistics().unwrap();
    assert!(during.current_bytes - before.current_bytes >= 8 << 20, "{before:?} -> {during:?}");
    assert!(during.peak_bytes >= during.current_bytes);
    drop(v);
    r.sync().unwrap();
    // A free that may block (cudaFree under the adaptor, if an earlier test left that resource
    // current) runs on a release thread: wait for it before reading the counts.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while raft::stats().releases_pending > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let after = counted.statistics().unwrap();
    assert_eq!(after.current_bytes, before.current_bytes);
}

#[test]
fn queries_on_a_device_that_does_not_exist_are_logic_errors() {
    require_gpu!();
    let n = raft::device_count().unwrap();
    let e = memory::current(n).unwrap_err();
    assert_eq!(e.kind(), raft::ErrorKind::Logic);
    assert_eq!(e.to_string(), format!("raft::memory::current: no device {n} among {n}"));
    let e = MemoryResource::cuda(n).unwrap_err();
    assert_eq!(e.to_string(), format!("MemoryResource::cuda: no device {n} among {n}"));
}

/// The names of earlier issues (issue 34, item 3: deprecated aliases of the value API) still do
/// what they did, with their own names in errors: one check per alias. Without a driver, each
/// reports the missing driver as itself; with a GPU, each changes or reads device 0's resource.
#[test]
#[allow(deprecated)]
fn the_deprecated_memory_aliases_still_work() {
    if !raft_tests::gpu() {
        let calls: [(&str, raft::Result<()>); 6] = [
            ("current_memory_resource", raft::current_memory_resource(0).map(drop)),
            ("set_memory_resource", raft::set_memory_resource(0, MemoryResourceKind::Managed)),
            ("reset_memory_resource", raft::reset_memory_resource(0)),
            ("enable_memory_statistics", raft::enable_memory_statistics(0)),
            ("memory_statistics", raft::memory_statistics(0).map(drop)),
            ("raft::memory::reinitialize", raft::reinitialize(0, &raft::RmmOptions::default()).map(drop)),
        ];
        for (who, outcome) in calls {
            let e = outcome.unwrap_err();
            assert_eq!((e.who(), e.kind(), e.reason()), (who, ErrorKind::Cuda, raft::Reason::NoDriver), "{e}");
        }
        return;
    }
    let _one = one_at_a_time();
    let _restore = Restore::device_0();
    let n = raft::device_count().unwrap();
    assert_eq!(raft::current_memory_resource(n).unwrap_err().to_string(), format!("current_memory_resource: no device {n} among {n}"));
    let e = raft::set_memory_resource(0, MemoryResourceKind::Other).unwrap_err();
    assert_eq!(e.to_string(), "set_memory_resource: cannot install another memory resource on its own");
    raft::set_memory_resource(0, MemoryResourceKind::Managed).unwrap();
    assert_eq!(raft::current_memory_resource(0).unwrap(), MemoryResourceKind::Managed);
    raft::reset_memory_resource(0).unwrap();
    assert_eq!(raft::current_memory_resource(0).unwrap(), MemoryResourceKind::Cuda);
    assert_eq!(raft::memory_statistics(0).unwrap_err().to_string(), "memory_statistics: statistics are not enabled on device 0");
    raft::enable_memory_statistics(0).unwrap();
    raft::enable_memory_statistics(0).unwrap(); // idempotent: one adaptor, not two
    let counted = memory::current(0).unwrap();
    assert_eq!(counted.kind(), MemoryResourceKind::Statistics);
    let res = DeviceResources::on_device(0).unwrap();
    let v = DeviceVec::<u8>::new(&res, MIB).unwrap();
    assert!(raft::memory_statistics(0).unwrap().current_bytes >= MIB as i64);
    drop(v);
    let previous = raft::reinitialize(0, &raft::RmmOptions { statistics: true, ..Default::default() }).unwrap();
    assert!(previous.same_as(&counted).unwrap(), "reinitialize returns the resource it replaced");
    res.sync().unwrap();
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

// ---- owned resources: allocations keep what frees them (issue 13 defect 2, issue 15) --------

/// Issue 13, defect 2: on d3ada27 an array kept a reference into RMM's per-device map, and each
/// of these three calls destroyed what it referred to; reads and frees then went through a
/// destroyed object. Now every array holds (a shared copy of) the resource that made it.
#[test]
fn arrays_stay_valid_and_free_cleanly_after_the_resource_that_made_them_was_replaced() {
    require_gpu!();
    if !pools_on_device_0() {
        return;
    }
    let _one = one_at_a_time();
    let _restore = Restore::device_0();
    let warned = warnings_so_far();
    let res = DeviceResources::on_device(0).unwrap();
    type Call = fn() -> raft::Result<()>;
    // Each step: what is made current first (a fresh resource that only RMM's map holds; none:
    // the one the previous step installed), an array from it, then the call that replaces it
    // and the kind current after.
    let steps: [(Option<MemoryResourceKind>, &str, Call, MemoryResourceKind); 3] = [
        (Some(MemoryResourceKind::CudaAsync), "set_current(0, cuda)", set_cuda, MemoryResourceKind::Cuda),
        (None, "set_current(0, cuda) again (the old reset_memory_resource)", set_cuda, MemoryResourceKind::Cuda),
        (
            Some(MemoryResourceKind::CudaAsync),
            "set_current(0, current.with_statistics())",
            || memory::set_current(0, &memory::current(0)?.with_statistics()?).map(drop),
            MemoryResourceKind::Statistics,
        ),
    ];
    let mut arrays: Vec<(String, Vec<u32>, DeviceVec<u32>)> = Vec::new();
    for (i, (install, call, replace, after)) in steps.into_iter().enumerate() {
        if let Some(kind) = install {
            assert_eq!(kind, MemoryResourceKind::CudaAsync);
            memory::set_current(0, &MemoryResource::cuda_async(0).unwrap()).unwrap();
        }
        let made_by = memory::current(0).unwrap().kind();
        let host: Vec<u32> = (0..(MIB / 4) as u32).map(|e| e.wrapping_mul(2_654_435_761) ^ i as u32).collect();
        let array = DeviceVec::from_host(&res, &host).unwrap();
        replace().unwrap();
        assert_eq!(memory::current(0).unwrap().kind(), after, "{call} did not replace the {made_by:?} resource");
        arrays.push((format!("the array from the {made_by:?} resource that {call} replaced"), host, array));
        // Every array so far, after every replacement since it was made.
        for (what, host, array) in &arrays {
            assert!(array.to_host().unwrap() == *host, "{what}: other contents after {call}");
        }
    }
    // Free one here and the others on another thread, after one more replacement there.
    let (_, _, first) = arrays.remove(0);
    drop(first);
    let elsewhere = std::thread::spawn(move || {
        set_cuda().unwrap();
        drop(arrays);
    });
    elsewhere.join().expect("the thread that freed the arrays");
    res.sync().unwrap();
    // cudaFree may block: those frees run on the release thread.
    wait_until("the frees queued on the release thread are done", || raft::stats().releases_pending == 0);
    assert_eq!(warnings_since(warned), Vec::<String>::new(), "a free reported an error");
    let again = DeviceVec::from_host(&res, &[7u32; 1024]).unwrap();
    assert_eq!(again.to_host().unwrap(), vec![7u32; 1024], "the resources serve no more after the frees");
}

/// The free goes through the adaptor that made the allocation although RMM's map has let the
/// adaptor go: its counts come back to zero.
#[test]
fn a_free_goes_through_the_adaptor_that_made_it_after_the_device_s_resource_was_reset() {
    require_gpu!();
    if !pools_on_device_0() {
        return;
    }
    let _one = one_at_a_time();
    let _restore = Restore::device_0();
    let res = DeviceResources::on_device(0).unwrap();
    let stats = MemoryResource::cuda_async(0).unwrap().with_statistics().unwrap();
    raft::memory::set_current(0, &stats).unwrap();
    let array = DeviceVec::<u8>::new(&res, MIB).unwrap();
    let during = stats.statistics().unwrap();
    assert!(during.current_bytes >= MIB as i64, "the array did not come from the current resource: {during:?}");
    set_cuda().unwrap();
    assert!(!MemoryResource::current(0).unwrap().same_as(&stats).unwrap(), "RMM's map still holds the adaptor");
    drop(array);
    wait_until("the adaptor counts the array's free", || stats.statistics().unwrap().current_bytes == 0);
    let after = stats.statistics().unwrap();
    assert!(after.peak_bytes >= MIB as i64, "{after:?}");
    res.sync().unwrap();
}

#[test]
fn new_in_allocates_from_the_resource_given_and_not_from_the_current_one() {
    require_gpu!();
    let _one = one_at_a_time();
    let _restore = Restore::device_0();
    let res = DeviceResources::on_device(0).unwrap();
    // Counts what the device's current resource serves meanwhile: nothing.
    let current = MemoryResource::current(0).unwrap().with_statistics().unwrap();
    raft::memory::set_current(0, &current).unwrap();
    let given = MemoryResource::managed(0).unwrap().with_statistics().unwrap();
    let host: Vec<f32> = (0..MIB / 4).map(|i| i as f32).collect();
    let mut array = DeviceVec::<f32>::new_in(&res, host.len(), &given).unwrap();
    array.copy_from_host(&host).unwrap();
    assert!(array.to_host().unwrap() == host, "the managed array read back other contents");
    let counted = given.statistics().unwrap();
    assert!(counted.current_bytes >= MIB as i64, "the resource given did not serve the array: {counted:?}");
    assert_eq!(current.statistics().unwrap().peak_bytes, 0, "the current resource served the array");
    drop(array);
    wait_until("the resource given counts the array's free", || given.statistics().unwrap().current_bytes == 0);
    assert_eq!(current.statistics().unwrap().peak_bytes, 0, "the current resource served the free");
}

#[test]
fn new_in_refuses_a_resource_of_another_device() {
    require_gpu!();
    // (One device: no resource of another device to refuse.)
    if raft_tests::gpus_or_skip(2).is_none() {
        return;
    }
    let _one = one_at_a_time();
    for (here, there) in [(0, 1), (1, 0)] {
        let res = DeviceResources::on_device(here).unwrap();
        let other = MemoryResource::cuda(there).unwrap();
        assert_eq!(other.device(), there);
        let e = DeviceVec::<f32>::new_in(&res, 16, &other).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Logic, "{e}");
        let text = e.to_string();
        assert!(text.starts_with("DeviceVec::new_in: ") && text.contains(&format!("device {there}")), "{text}");
        let e = raft::memory::set_current(here, &other).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Logic, "{e}");
    }
}

/// `current` hands out the device's resource itself (shared, RMM's equality holds and the
/// counts are one), never a copy; a fresh pool of the same kind is another resource.
#[test]
fn current_shares_the_device_s_resource_and_a_fresh_pool_is_another_one() {
    require_gpu!();
    if !pools_on_device_0() {
        return;
    }
    let _one = one_at_a_time();
    let _restore = Restore::device_0();
    let res = DeviceResources::on_device(0).unwrap();
    let stats = MemoryResource::cuda_async(0).unwrap().with_statistics().unwrap();
    raft::memory::set_current(0, &stats).unwrap();
    let (a, b) = (MemoryResource::current(0).unwrap(), MemoryResource::current(0).unwrap());
    assert_eq!((a.kind(), a.device()), (MemoryResourceKind::Statistics, 0));
    assert!(a.same_as(&b).unwrap(), "two current(0) are not the same resource");
    assert!(a.same_as(&stats).unwrap(), "current(0) is not the resource made current");
    let fresh = MemoryResource::cuda_async(0).unwrap();
    assert!(!a.same_as(&fresh).unwrap(), "a fresh cudaMallocAsync pool equals the current one");
    assert!(!fresh.same_as(&MemoryResource::cuda_async(0).unwrap()).unwrap(), "two fresh pools are equal");
    // Shared, not copied: what one handle allocates, the others count.
    let array = DeviceVec::<u8>::new_in(&res, MIB, &a).unwrap();
    assert!(stats.statistics().unwrap().current_bytes >= MIB as i64);
    assert_eq!(b.statistics().unwrap(), stats.statistics().unwrap());
    drop(array);
    wait_until("the shared adaptor counts the free", || stats.statistics().unwrap().current_bytes == 0);
}

// ---- at exit (child processes: tls-exit) ----------------------------------------------------

/// The exit teardown as a user of `tls-exit MODE` sees it: the status, the teardown's log line.
fn teardown_child(mode: &str) -> Option<Child> {
    if !pools_on_device_0() {
        return None;
    }
    let c = tls_exit(mode);
    c.assert_code(0);
    assert!(c.stderr.contains("tearing down"), "the exit teardown did not run:\n{}", c.stderr);
    Some(c)
}

/// The control of the two below: what the teardown does where it must act.
#[test]
fn the_exit_teardown_puts_back_rmm_s_initial_resource_where_this_library_s_pool_is_current() {
    require_gpu!();
    let Some(c) = teardown_child("library-pool") else { return };
    assert_eq!(c.result("installed").as_deref(), Some("true"), "{}", c.stdout);
    assert_eq!(c.result("before_exit").as_deref(), Some("CudaAsync"), "{}", c.stdout);
    assert_eq!(c.result("teardown_current").as_deref(), Some("Cuda"), "{}", c.stdout);
}

#[test]
fn the_exit_teardown_leaves_a_cuda_async_pool_the_user_installed_before_the_first_resources() {
    require_gpu!();
    let Some(c) = teardown_child("user-async-before") else { return };
    assert_eq!(c.result("installed").as_deref(), Some("false"), "the first resources replaced the user's pool: {}", c.stdout);
    assert_eq!(c.result("teardown_current").as_deref(), Some("CudaAsync"), "{}", c.stdout);
    assert_eq!(c.result("user_kept").as_deref(), Some("true"), "{}", c.stdout);
}

/// Issue 13, "Departures": d3ada27's teardown reset any `CudaAsync` resource once this library
/// had installed its pool, so it reset this one, the user's.
#[test]
fn the_exit_teardown_leaves_a_cuda_async_pool_the_user_installed_after_the_first_resources() {
    require_gpu!();
    let Some(c) = teardown_child("user-async-after") else { return };
    assert_eq!(c.result("installed").as_deref(), Some("true"), "{}", c.stdout);
    assert_eq!(c.result("before_exit").as_deref(), Some("CudaAsync"), "{}", c.stdout);
    assert_eq!(c.result("teardown_current").as_deref(), Some("CudaAsync"), "{}", c.stdout);
    assert_eq!(c.result("user_kept").as_deref(), Some("true"), "{}", c.stdout);
}

/// valgrind's false positive on this glibc's dynamic loader (its own `strncmp` reads whole
/// words past short `strdup`ed strings while expanding `$ORIGIN` in a RUNPATH): nothing of ours.
const LD_SO_SUPPRESSION: &str = "{\n   ld.so strncmp word reads in is_dst\n   Memcheck:Addr8\n   fun:strncmp\n   fun:is_dst\n}\n";

/// Issue 13, defect 5, on the CPU: glibc runs the exiting thread's thread-local destructors
/// before the exit handlers, and a failing shim call writes the shim's thread-local message. On
/// d3ada27 that message was a `std::string`: the handler's failure wrote into the string's freed
/// buffer (valgrind: "Invalid write of size 8 … inside a block of size 119 free'd … by
/// __call_tls_dtors"; a debug build aborts reading the message back). It must be a plain array.
#[test]
fn a_failing_shim_call_from_an_exit_handler_writes_no_destroyed_thread_local() {
    let plain = tls_exit("last-error");
    plain.assert_code(0);
    if let Some(reason) = plain.stdout.lines().find_map(|l| l.strip_prefix("SKIP ")) {
        skip(reason);
        return;
    }
    assert_eq!(plain.result("registered").as_deref(), Some("true"), "{}", plain.stdout);
    assert_eq!(plain.result("at_exit").as_deref(), Some("failed"), "the handler's shim call did not fail:\n{}", plain.stdout);
    let line = |prefix: &str| plain.stdout.lines().find_map(|l| l.strip_prefix(prefix)).map(str::to_string);
    // The handler read its own call's message back, whole: the same failure as main's.
    assert_eq!(line("AT_EXIT "), line("MAIN "), "{}", plain.stdout);
    if !Command::new("valgrind").arg("--version").output().is_ok_and(|o| o.status.success()) {
        // CI installs valgrind and sets RAFT_REQUIRE_VALGRIND=1: there a missing one fails.
        assert_ne!(std::env::var("RAFT_REQUIRE_VALGRIND").as_deref(), Ok("1"), "RAFT_REQUIRE_VALGRIND=1 but valgrind is not installed");
        skip("valgrind is not installed: the binary ran without it only");
        return;
    }
    if std::env::var_os("ASAN_OPTIONS").is_some() {
        // scripts/asan-bundle.sh's run sets it: valgrind cannot run an AddressSanitizer build
        // (ASan's own checks cover the child's run above instead).
        skip("an AddressSanitizer run (ASAN_OPTIONS set): the binary ran without valgrind only");
        return;
    }
    let supp = std::env::temp_dir().join(format!("raft-tls-exit-{}.supp", std::process::id()));
    std::fs::write(&supp, LD_SO_SUPPRESSION).expect("write the suppression file");
    let mut cmd = Command::new("valgrind");
    cmd.arg("--error-exitcode=99").arg("--leak-check=no").arg(format!("--suppressions={}", supp.display()));
    cmd.arg(tls_exit_exe()).arg("last-error");
    let c = run_child(cmd, Duration::from_secs(300));
    let _ = std::fs::remove_file(&supp);
    for bad in ["Invalid write", "Invalid read", "Invalid free"] {
        assert!(!c.stderr.contains(bad), "valgrind reports an {bad}:\n{}", c.stderr);
    }
    c.assert_code(0);
    assert_eq!(c.result("at_exit").as_deref(), Some("failed"), "{}", c.stdout);
}

/// A failure callback far down a chain still refuses a pool, arena, binning or thread-safe
/// resource over it (issue 33, finding 3): the shim's walk down the chain stopped after 32
/// levels, so before the fix each of these over 40 statistics adaptors over the callback was
/// accepted (the test fails with "pool over 40 adaptors over a failure callback: accepted"), and
/// the callback would then run under the pool's lock.
#[test]
fn a_failure_callback_deep_down_the_chain_still_refuses_a_pool_over_it() {
    require_gpu!();
    let mut chain = MemoryResource::cuda(0).unwrap().with_limit(64 * MIB).unwrap().with_failure_callback(|_| false).unwrap();
    for _ in 0..40 {
        chain = chain.with_statistics().unwrap();
    }
    for (what, made) in [
        ("pool", chain.pool(raft::PoolOptions::initial(32 * MIB))),
        ("arena", chain.arena(raft::ArenaOptions::size(64 * MIB))),
        ("binning", chain.binning(10, 12)),
        ("thread_safe", chain.thread_safe()),
    ] {
        let e = made.err().unwrap_or_else(|| panic!("{what} over 40 adaptors over a failure callback: accepted"));
        assert_eq!(e.kind(), ErrorKind::Logic, "{what}: {e}");
        assert!(e.message().contains("failure-callback"), "{what}: {e}");
    }
    // The deep chain itself serves, and its limit still becomes `OutOfMemory`.
    let res = DeviceResources::on_device(0).unwrap();
    assert_eq!(DeviceVec::<u8>::new_in(&res, MIB, &chain).unwrap().len(), MIB);
    assert_eq!(DeviceVec::<u8>::new_in(&res, 128 * MIB, &chain).unwrap_err().kind(), ErrorKind::OutOfMemory);
}

/// `pool(None, ..)` takes half the free memory of the pool's own device, whichever device the
/// calling thread is on (issue 33, finding 4). Device 0 is mostly filled first, so half of its
/// free memory is far below half of device 1's: before the fix the pool for device 1, made from
/// a thread on device 0, took about 20% of device 1's free memory instead of 50%.
#[test]
fn a_pool_of_default_size_takes_half_the_free_memory_of_its_own_device() {
    require_gpu!();
    // The pool is made for device 1 from a thread on device 0.
    if raft_tests::gpus_or_skip(2).is_none() {
        return;
    }
    let _one = one_at_a_time();
    let (r0, r1) = (DeviceResources::on_device(0).unwrap(), DeviceResources::on_device(1).unwrap());
    let (free0, _) = r0.context().mem_get_info().unwrap();
    // cudaMalloc'd (not the async pool, which would keep it reserved after the test).
    let filler = DeviceVec::<u8>::new_in(&r0, free0 / 10 * 6, &MemoryResource::cuda(0).unwrap()).unwrap();
    let (free0_filled, _) = r0.context().mem_get_info().unwrap();
    let cuda1 = MemoryResource::cuda(1).unwrap();
    let (free1, _) = r1.context().mem_get_info().unwrap();
    r0.context().bind_to_thread().unwrap();
    assert_eq!(raft::current_device().unwrap(), 0, "the thread is on device 0 when the pool is made");
    let pool = cuda1.pool(raft::PoolOptions::default()).unwrap();
    let (free1_after, _) = r1.context().mem_get_info().unwrap();
    let taken = free1.saturating_sub(free1_after);
    eprintln!(
        "device 0: {} MiB free after filling; device 1: {} MiB free, the pool took {} MiB",
        free0_filled / MIB,
        free1 / MIB,
        taken / MIB
    );
    let share = taken as f64 / free1 as f64;
    assert!((0.45..=0.55).contains(&share), "the pool took {:.0}% of device 1's free memory, not half", share * 100.0);
    drop(pool);
    drop(filler);
}

// ---- helpers -------------------------------------------------------------------------------

/// Tests of this process that replace device 0's current resource, or count what it serves, run
/// one at a time: RMM's per-device map is one for the whole process.
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Puts device 0's resource back as it was when dropped, also when the test fails.
struct Restore(Option<MemoryResource>);

impl Restore {
    fn device_0() -> Self {
        Restore(Some(MemoryResource::current(0).expect("device 0's current resource")))
    }
}

impl Drop for Restore {
    fn drop(&mut self) {
        let Some(previous) = self.0.take() else { return };
        // A cuda_memory_resource is stateless: RMM's initial one stands for any of them.
        let put_back =
            if previous.kind() == MemoryResourceKind::Cuda { set_cuda() } else { raft::memory::set_current(0, &previous).map(drop) };
        if let Err(e) = put_back {
            let _ = writeln!(std::io::stderr(), "could not put device 0's memory resource back: {e}");
        }
    }
}

/// Makes a new `cuda_memory_resource` device 0's current: RMM's initial resource is one, and
/// every one compares equal to it.
fn set_cuda() -> raft::Result<()> {
    memory::set_current(0, &MemoryResource::cuda(0)?).map(drop)
}

/// Prints a visible skip line for the running test (past the harness's capture).
fn skip(reason: &str) {
    let test = std::thread::current().name().unwrap_or("?").to_string();
    let _ = writeln!(std::io::stderr(), "SKIP {test}: {reason}");
}

/// Whether device 0 can make cudaMallocAsync pools (skips visibly when not).
fn pools_on_device_0() -> bool {
    let pools = raft::memory_pools_supported(0).unwrap();
    if !pools {
        skip("device 0 has no memory-pool support: no cudaMallocAsync pool to make");
    }
    pools
}

/// Polls `done` for up to 10 s: a free through a resource that may block (cudaFree) runs on
/// the release thread.
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "not so after 10 s: {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Warnings logged through `log` (an array's failed free is logged on target `raft`: `Drop`
/// returns nothing).
static WARNINGS: Mutex<Vec<String>> = Mutex::new(Vec::new());

struct Capture;

impl log::Log for Capture {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::Level::Warn
    }

    fn log(&self, r: &log::Record<'_>) {
        if self.enabled(r.metadata()) {
            let line = format!("{} {}: {}", r.level(), r.target(), r.args());
            let _ = writeln!(std::io::stderr(), "{line}");
            WARNINGS.lock().unwrap_or_else(|e| e.into_inner()).push(line);
        }
    }

    fn flush(&self) {}
}

/// The number of warnings logged so far; captures them from the first call on.
fn warnings_so_far() -> usize {
    static CAPTURE: Capture = Capture;
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        if log::set_logger(&CAPTURE).is_ok() {
            log::set_max_level(log::LevelFilter::Warn);
        }
    });
    WARNINGS.lock().unwrap_or_else(|e| e.into_inner()).len()
}

fn warnings_since(n: usize) -> Vec<String> {
    WARNINGS.lock().unwrap_or_else(|e| e.into_inner())[n..].to_vec()
}

/// The `tls-exit` binary: the one cargo built, else `../bin/tls-exit` beside this test binary
/// (the GPU bundle's layout).
fn tls_exit_exe() -> PathBuf {
    let built = PathBuf::from(env!("CARGO_BIN_EXE_tls-exit"));
    if built.exists() {
        return built;
    }
    let me = std::env::current_exe().expect("current exe");
    me.parent().and_then(|d| d.parent()).map(|d| d.join("bin/tls-exit")).expect("bundle layout")
}

/// `tls-exit MODE` with the library's debug log.
fn tls_exit(mode: &str) -> Child {
    let mut cmd = Command::new(tls_exit_exe());
    cmd.arg(mode).env("RUST_LOG", "raft=debug");
    run_child(cmd, LIMIT)
}

/// Runs `cmd` to its end, reading its output meanwhile (valgrind writes a lot); kills it and
/// fails after `limit` (`raft_tests::OutputWithin`).
fn run_child(mut cmd: Command, limit: Duration) -> Child {
    use std::os::unix::process::ExitStatusExt;
    let start = Instant::now();
    let out = cmd.output_within(limit);
    Child {
        code: out.status.code(),
        signal: out.status.signal(),
        elapsed: start.elapsed(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The review of issue 30: the default path keeps a copy of the device's current resource. When
/// the current resource is replaced through this crate, that copy must go with it: kept, it held
/// a replaced 8 GiB pool (its memory taken from the device) until the next default allocation,
/// which may never come. Here none comes: the pool's memory must be back once it is replaced
/// and every handle of it dropped.
#[test]
fn a_replaced_current_pool_is_let_go_without_another_allocation() {
    require_gpu!();
    let _one = one_at_a_time();
    let res = DeviceResources::new().unwrap();
    const BIG: usize = 8 << 30;
    let free = || res.context().mem_get_info().unwrap().0;
    let before = free();
    let big = MemoryResource::cuda(0).unwrap().pool(raft::PoolOptions::initial(BIG)).unwrap();
    let original = memory::set_current(0, &big).unwrap();
    drop(DeviceVec::<u8>::new(&res, 4096).unwrap()); // the default path now keeps a copy of `big`
    res.sync().unwrap();
    let held = free();
    assert!(before - held >= BIG - (256 << 20), "set-up: the pool took {} bytes, not {BIG}", before - held);
    drop(memory::set_current(0, &original).unwrap());
    drop(big);
    let deadline = Instant::now() + Duration::from_secs(10);
    while free() < before - (256 << 20) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let after = free();
    assert!(
        after >= before - (256 << 20),
        "the replaced pool still holds {} bytes 10 s after its last handle went (free before {before}, with the pool {held}, after {after})",
        before.saturating_sub(after)
    );
}
