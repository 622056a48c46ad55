//! Memory-pool and RMM stress scenarios (`raw-pool-streams`, `pool-*`): many threads making and
//! dropping async pools beside live streams, kept apart from the exit scenarios they outgrew.
use std::time::{Duration, Instant};

use crate::common::settle_releases;
use crate::env_f64;

/// The `raw-pool-streams` scenario (see its comment in `main`): the driver API alone.
///
/// `SCENARIO_MODE` picks what the worker threads do each round, all on device 0's primary
/// context (`SCENARIO_THREADS` workers × `SCENARIO_ROUNDS` rounds):
/// - `inline`: on a stream each worker keeps for the whole run, a fresh async pool, 1 MiB from
///   it, a memset, a stream-ordered free, and the pool destroyed at once by the worker (its free
///   still queued); then 1 MiB from the device's default pool, a memset, a free and a stream
///   sync. No context-wide wait anywhere.
/// - `ctxsync`: no pool is made; the workers do the default-pool part only while
///   `SCENARIO_SYNCERS` (2) threads call `cuCtxSynchronize` in a loop.
/// - `inline-ctxsync`: `inline` beside the context-wide waits of `ctxsync` (what this library
///   did on the default path: a pool destroyed by the array that freed into it, release
///   threads waiting for the device meanwhile).
/// - `streamsync-ctxsync`: as `inline-ctxsync`, but each worker waits for its own stream before
///   destroying the pool (nothing of the pool queued anywhere when it dies).
/// - `handoff`: runs 37–38's pattern: per round a stream (a spare one when `SCENARIO_REUSE=1`),
///   the pool part, then the pool to a destroyer thread (which first waits for the context when
///   `SCENARIO_DEVICE_SYNC=1`) and the stream to a releaser thread (which syncs it, then
///   destroys it or keeps it for reuse).
///
/// Pools are made with a 64 MiB maximum (the default, the whole device, made `cuMemPoolCreate`
/// fail with out-of-memory once several were alive, GPU run 41). Prints
/// `RESULT mode=… rounds=…`; a failing call panics with its name and result.
pub(crate) fn raw_pool_streams() {
    use cudarc::driver::sys::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::mpsc;
    use std::sync::Mutex;
    fn ok(what: &str, rc: CUresult) {
        assert_eq!(rc, CUresult::CUDA_SUCCESS, "{what}");
    }
    let mode = std::env::var("SCENARIO_MODE").unwrap_or_else(|_| "handoff".into());
    let threads = env_f64("SCENARIO_THREADS", 8.0) as usize;
    let rounds = env_f64("SCENARIO_ROUNDS", 200.0) as usize;
    let syncers = env_f64("SCENARIO_SYNCERS", 2.0) as usize;
    let reuse = env_f64("SCENARIO_REUSE", 0.0) != 0.0;
    let device_sync = env_f64("SCENARIO_DEVICE_SYNC", 0.0) != 0.0;
    let (make_pools, ctx_syncs, stream_sync_first, handoff) = match mode.as_str() {
        "inline" => (true, false, false, false),
        "ctxsync" => (false, true, false, false),
        "inline-ctxsync" => (true, true, false, false),
        "streamsync-ctxsync" => (true, true, true, false),
        "handoff" => (true, false, false, true),
        "pool-limit" => return raw_pool_limit(),
        other => panic!("SCENARIO_MODE {other:?}: inline, ctxsync, inline-ctxsync, streamsync-ctxsync or handoff"),
    };
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: plain driver calls with out-pointers to locals; device 0 exists (a GPU run).
    unsafe {
        ok("cuInit", cuInit(0));
        let mut dev: CUdevice = 0;
        ok("cuDeviceGet", cuDeviceGet(&mut dev, 0));
        ok("cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain(&mut ctx, dev));
    }
    let ctx = ctx as usize;
    // SAFETY: binds the retained primary context (alive for the process) to the calling thread.
    let bind = move || ok("cuCtxSetCurrent", unsafe { cuCtxSetCurrent(ctx as CUcontext) });
    // SAFETY (both helpers): out-pointers to locals; the context is bound by the caller.
    let new_stream = || {
        let mut st: CUstream = std::ptr::null_mut();
        ok("cuStreamCreate", unsafe { cuStreamCreate(&mut st, CUstream_flags::CU_STREAM_NON_BLOCKING as u32) });
        st
    };
    let new_pool = || {
        // SAFETY: zeroed props are a valid start (no handle types, device 0, no flags).
        let mut props: CUmemPoolProps = unsafe { std::mem::zeroed() };
        props.allocType = CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        props.location.type_ = CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        props.location.__bindgen_anon_1.id = 0;
        props.maxSize = 64 << 20;
        let mut pool: CUmemoryPool = std::ptr::null_mut();
        ok("cuMemPoolCreate", unsafe { cuMemPoolCreate(&mut pool, &props) });
        pool
    };
    let spare: Mutex<Vec<usize>> = Mutex::new(Vec::new());
    let stop = AtomicBool::new(false);
    let (pool_tx, pool_rx) = mpsc::channel::<usize>();
    let (stream_tx, stream_rx) = mpsc::channel::<usize>();
    std::thread::scope(|s| {
        let (spare, stop) = (&spare, &stop);
        s.spawn(move || {
            bind();
            for pool in pool_rx {
                if device_sync {
                    // SAFETY: the context is bound to this thread.
                    ok("cuCtxSynchronize (destroyer)", unsafe { cuCtxSynchronize() });
                }
                // SAFETY: the pool was made by a worker, which no longer uses it.
                ok("cuMemPoolDestroy (destroyer)", unsafe { cuMemPoolDestroy(pool as CUmemoryPool) });
            }
        });
        s.spawn(move || {
            bind();
            for stream in stream_rx {
                // SAFETY: the stream was made by a worker, which no longer uses it.
                ok("cuStreamSynchronize (releaser)", unsafe { cuStreamSynchronize(stream as CUstream) });
                if reuse {
                    spare.lock().unwrap().push(stream);
                } else {
                    // SAFETY: as above; destroyed once (never kept when destroyed).
                    ok("cuStreamDestroy", unsafe { cuStreamDestroy_v2(stream as CUstream) });
                }
            }
        });
        if ctx_syncs {
            for _ in 0..syncers {
                s.spawn(move || {
                    bind();
                    while !stop.load(Ordering::Relaxed) {
                        // SAFETY: the context is bound to this thread.
                        ok("cuCtxSynchronize (syncer)", unsafe { cuCtxSynchronize() });
                    }
                });
            }
        }
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                let (pool_tx, stream_tx) = (pool_tx.clone(), stream_tx.clone());
                s.spawn(move || {
                    bind();
                    let own = (!handoff).then(new_stream);
                    for _ in 0..rounds {
                        let stream = match own {
                            Some(st) => st,
                            None => match spare.lock().unwrap().pop() {
                                Some(st) => st as CUstream,
                                None => new_stream(),
                            },
                        };
                        // SAFETY: each pointer is used only on this thread's stream, between its
                        // allocation and its stream-ordered free; a pool is destroyed once, by
                        // this thread or (handed over) by the destroyer, after its last free is
                        // queued; the stream is handed over only in `handoff` mode, after its
                        // last use here.
                        unsafe {
                            if make_pools {
                                let pool = new_pool();
                                let mut ptr: CUdeviceptr = 0;
                                ok("cuMemAllocFromPoolAsync", cuMemAllocFromPoolAsync(&mut ptr, 1 << 20, pool, stream));
                                ok("cuMemsetD8Async", cuMemsetD8Async(ptr, 0, 1 << 20, stream));
                                ok("cuMemFreeAsync (pool)", cuMemFreeAsync(ptr, stream));
                                if handoff {
                                    pool_tx.send(pool as usize).unwrap();
                                } else {
                                    if stream_sync_first {
                                        ok("cuStreamSynchronize (before destroy)", cuStreamSynchronize(stream));
                                    }
                                    ok("cuMemPoolDestroy", cuMemPoolDestroy(pool));
                                }
                            }
                            if !handoff {
                                let mut ptr: CUdeviceptr = 0;
                                ok("cuMemAllocAsync", cuMemAllocAsync(&mut ptr, 1 << 20, stream));
                                ok("cuMemsetD8Async (default pool)", cuMemsetD8Async(ptr, 0, 1 << 20, stream));
                                ok("cuMemFreeAsync", cuMemFreeAsync(ptr, stream));
                                ok("cuStreamSynchronize", cuStreamSynchronize(stream));
                            }
                        }
                        if handoff {
                            stream_tx.send(stream as usize).unwrap();
                        }
                    }
                    if let Some(st) = own {
                        // SAFETY: this thread's own stream, last used above.
                        ok("cuStreamDestroy (own)", unsafe { cuStreamDestroy_v2(st) });
                    }
                })
            })
            .collect();
        drop((pool_tx, stream_tx));
        let mut failed = None;
        for w in workers {
            if let Err(e) = w.join() {
                failed = Some(e);
            }
        }
        stop.store(true, Ordering::Relaxed);
        if let Some(e) = failed {
            std::panic::resume_unwind(e);
        }
    });
    println!("RESULT mode={mode} rounds={} reuse={} device_sync={}", threads * rounds, u8::from(reuse), u8::from(device_sync));
}

/// `raw-pool-streams` with `SCENARIO_MODE=pool-limit`: how many async pools can be alive at once
/// on device 0, each with 1 MiB taken from it, when made with the default maximum (0: the
/// driver's default) and, separately, with `maxSize` 64 MiB. Prints both counts (stopping at
/// 4096).
fn raw_pool_limit() {
    use cudarc::driver::sys::*;
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: plain driver calls with out-pointers to locals; device 0 exists (a GPU run).
    unsafe {
        assert_eq!(cuInit(0), CUresult::CUDA_SUCCESS);
        assert_eq!(cuDevicePrimaryCtxRetain(&mut ctx, 0), CUresult::CUDA_SUCCESS);
        assert_eq!(cuCtxSetCurrent(ctx), CUresult::CUDA_SUCCESS);
    }
    for max in [0usize, 64 << 20] {
        let mut made = Vec::new();
        let mut failure = String::from("none");
        while made.len() < 4096 {
            // SAFETY: zeroed props are a valid start; out-pointers to locals; each pool and
            // allocation is destroyed below, after a context-wide wait.
            unsafe {
                let mut props: CUmemPoolProps = std::mem::zeroed();
                props.allocType = CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
                props.location.type_ = CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
                props.maxSize = max;
                let mut pool: CUmemoryPool = std::ptr::null_mut();
                let rc = cuMemPoolCreate(&mut pool, &props);
                if rc != CUresult::CUDA_SUCCESS {
                    failure = format!("cuMemPoolCreate:{rc:?}");
                    break;
                }
                let mut ptr: CUdeviceptr = 0;
                let rc = cuMemAllocFromPoolAsync(&mut ptr, 1 << 20, pool, std::ptr::null_mut());
                if rc != CUresult::CUDA_SUCCESS {
                    failure = format!("cuMemAllocFromPoolAsync:{rc:?}");
                    cuMemPoolDestroy(pool);
                    break;
                }
                made.push((pool, ptr));
            }
        }
        let n = made.len();
        // SAFETY: every pointer and pool was made above and is freed / destroyed once, after the
        // context has finished the allocations.
        unsafe {
            assert_eq!(cuCtxSynchronize(), CUresult::CUDA_SUCCESS);
            for (pool, ptr) in made {
                cuMemFreeAsync(ptr, std::ptr::null_mut());
                assert_eq!(cuCtxSynchronize(), CUresult::CUDA_SUCCESS);
                cuMemPoolDestroy(pool);
            }
        }
        println!("RESULT max_size_mib={} pools_alive={n} stopped_by={failure}", max >> 20);
    }
}

/// The pattern of the rmm tests' rare crash (run 33: a release thread faulted in
/// cuStreamSynchronize waiting for a dropped resources' stream while other release
/// threads destroyed memory resources): threads that each make resources and a CUDA
/// async pool, free an array of it on the stream, then drop the pool and the resources,
/// so that pool destructions and stream waits meet on the release threads.
pub(crate) fn pool_destroy_race() {
    let threads = env_f64("SCENARIO_THREADS", 8.0) as usize;
    let rounds = env_f64("SCENARIO_ROUNDS", 200.0) as usize;
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(move || {
                for _ in 0..rounds {
                    let res = raft::DeviceResources::new().expect("resources");
                    let mr = raft::MemoryResource::cuda_async_with(0, raft::AsyncPoolOptions::default().release_threshold(32 << 20))
                        .expect("pool");
                    let mut v = raft::DeviceVec::<u8>::new_in(&res, 1 << 20, &mr).expect("array");
                    v.fill_zero().expect("memset");
                    drop(v);
                    drop(mr);
                    drop(res);
                }
            });
        }
    });
    println!("RESULT rounds={}", threads * rounds);
}

/// Eight threads, each on a stream of its own: each round an async pool whose last copy
/// is an array freed (stream-ordered) on a stream that then goes on working. The pool's
/// Rust handle is dropped first and its release waited for, so the array's copy is the
/// last. Prints how many pools were made, retired and reused once every release has run,
/// what trimming the retired pools then gave back and left, and the device memory taken
/// at the end against the start (device-wide: other processes' too).
pub(crate) fn pool_last_copy_in_array() {
    let threads = env_f64("SCENARIO_THREADS", 8.0) as usize;
    let rounds = env_f64("SCENARIO_ROUNDS", 100.0) as usize;
    let settle = settle_releases;
    let first = raft::DeviceResources::new().expect("resources");
    let free = || first.context().mem_get_info().expect("cuMemGetInfo").0;
    let mut w = raft::DeviceVec::<u8>::new(&first, 1 << 20).expect("array");
    w.fill_zero().expect("memset");
    drop(w);
    first.sync().expect("sync");
    settle();
    let before = free();
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(move || {
                let res = raft::DeviceResources::new().expect("resources");
                for _ in 0..rounds {
                    let mr = raft::MemoryResource::cuda_async_with(0, raft::AsyncPoolOptions::default().release_threshold(32 << 20))
                        .expect("pool");
                    let mut v = raft::DeviceVec::<u8>::new_in(&res, 1 << 20, &mr).expect("array");
                    v.fill_zero().expect("memset");
                    drop(mr);
                    settle();
                    drop(v);
                    let mut w = raft::DeviceVec::<u8>::new(&res, 1 << 20).expect("array");
                    w.fill_zero().expect("memset");
                    drop(w);
                    res.sync().expect("sync");
                }
                res.release().expect("release");
            });
        }
    });
    settle();
    // Every stream that freed into the pools has been waited for (each round syncs,
    // each thread's resources are released): the retired pools hold nothing after a trim.
    let trim = raft::memory::trim_retired_pools().expect("trim");
    let s = raft::stats();
    let taken = before.saturating_sub(free());
    println!(
        "RESULT rounds={} pools_made={} pools_retired={} pools_reused={} trimmed_mib={} still_held={} taken_mib={}",
        threads * rounds,
        s.async_pools_made,
        s.async_pools_retired,
        s.async_pools_reused,
        trim.released >> 20,
        trim.still_held,
        taken >> 20
    );
}

/// A retired pool handed out again must behave as a new one with the settings asked for:
/// a pool made with a 64 MiB initial size and release threshold 0, used and dropped
/// (retired: threshold 0, trimmed), then one asked for with the same initial size and the
/// default threshold ("never"): it must be the retired pool (reused), primed again, and
/// keep its 64 MiB across a synchronisation.
pub(crate) fn pool_reuse_settings() {
    const MIB: usize = 1 << 20;
    let res = raft::DeviceResources::new().expect("resources");
    let settle = settle_releases;
    let start = raft::stats();
    let a = raft::MemoryResource::cuda_async_with(0, raft::AsyncPoolOptions::initial(64 * MIB).release_threshold(0)).expect("pool a");
    let mut v = raft::DeviceVec::<u8>::new_in(&res, MIB, &a).expect("array");
    v.fill_zero().expect("memset");
    drop(v);
    res.sync().expect("sync");
    drop(a);
    settle();
    let mid = raft::stats();
    let b = raft::MemoryResource::cuda_async_with(0, raft::AsyncPoolOptions::initial(64 * MIB)).expect("pool b");
    res.sync().expect("sync");
    // A device-wide wait: any release a synchronisation triggers has happened.
    res.context().synchronize().expect("context sync");
    let end = raft::stats();
    let raft::AsyncPoolBytes { reserved, in_use: used } = b.async_pool_bytes().expect("pool bytes").expect("an async pool");
    println!(
        "RESULT made={} retired={} reused={} reserved_mib={} used={}",
        end.async_pools_made - start.async_pools_made,
        mid.async_pools_retired - start.async_pools_retired,
        end.async_pools_reused - start.async_pools_reused,
        reserved / MIB,
        used
    );
    drop(b);
    res.release().expect("release");
}

/// The fifteenth audit: async pools asked for with an initial size the device cannot give (64
/// TiB), four times: each call fails (`OutOfMemory`), and every pool made or reused for it is
/// retired, none left made and never destroyed. Prints `RESULT kinds=… made=… retired=…
/// reused=…` (counted from after the first resources).
pub(crate) fn pool_priming_fails() {
    let res = raft::DeviceResources::new().expect("resources");
    let start = raft::stats();
    let kinds: Vec<String> = (0..4)
        .map(|_| match raft::MemoryResource::cuda_async_with(0, raft::AsyncPoolOptions::initial(1 << 46)) {
            Ok(_) => "made".to_string(),
            Err(e) => format!("{:?}", e.kind()),
        })
        .collect();
    settle_releases();
    let end = raft::stats();
    println!(
        "RESULT kinds={} made={} retired={} reused={}",
        kinds.join(","),
        end.async_pools_made - start.async_pools_made,
        end.async_pools_retired - start.async_pools_retired,
        end.async_pools_reused - start.async_pools_reused
    );
    res.release().expect("release");
}

/// Async pools made and dropped while the resources whose streams freed into them live
/// on and keep working (each thread's resources last the whole run): what a user does
/// who tries pool settings in a loop.
pub(crate) fn pool_dies_beside_live_streams() {
    let threads = env_f64("SCENARIO_THREADS", 8.0) as usize;
    let rounds = env_f64("SCENARIO_ROUNDS", 200.0) as usize;
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(move || {
                let res = raft::DeviceResources::new().expect("resources");
                let host: Vec<u8> = (0..16 << 20).map(|i| (i % 251) as u8).collect();
                for _ in 0..rounds {
                    let mr = raft::MemoryResource::cuda_async_with(0, raft::AsyncPoolOptions::default().release_threshold(32 << 20))
                        .expect("pool");
                    let mut v = raft::DeviceVec::<u8>::new_in(&res, 1 << 20, &mr).expect("array");
                    v.fill_zero().expect("memset");
                    drop(v);
                    drop(mr);
                    let mut w = raft::DeviceVec::<u8>::new(&res, 1 << 20).expect("array");
                    w.fill_zero().expect("memset");
                    res.sync().expect("sync");
                    // Staged copies on this stream, which freed into the pool just
                    // dropped.
                    let staged = raft::DeviceVec::from_host(&res, &host).expect("staged upload");
                    assert!(staged.to_host().expect("staged download") == host, "staged round trip");
                }
                res.release().expect("release");
            });
        }
    });
    println!("RESULT rounds={}", threads * rounds);
}

/// A device's current resource replaced by a fresh async pool and back, 200 times, while
/// arrays made from it through the default path (no resource given) are dropped after
/// the pool's last Rust handle: the array's own copy then destroys the pool. Seven
/// threads keep allocating from whatever is current, syncing, on long-lived resources.
///
/// For the diagnosis of its hang (GPU run 39): SCENARIO_WORKER_ROUNDS bounds the workers
/// (so a replacer that is only starved while they run still finishes, late), and
/// SCENARIO_WORKER_PAUSE_US pauses them between rounds; the replacer prints its slowest
/// round.
pub(crate) fn pool_dies_default_path() {
    let rounds = env_f64("SCENARIO_ROUNDS", 200.0) as usize;
    let worker_rounds = env_f64("SCENARIO_WORKER_ROUNDS", f64::INFINITY);
    let pause = Duration::from_secs_f64(env_f64("SCENARIO_WORKER_PAUSE_US", 0.0) / 1e6);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let stop = &stop;
    std::thread::scope(|s| {
        for _ in 0..7 {
            s.spawn(move || {
                let res = raft::DeviceResources::new().expect("resources");
                let mut done = 0.0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) && done < worker_rounds {
                    done += 1.0;
                    if !pause.is_zero() {
                        std::thread::sleep(pause);
                    }
                    let mut w = raft::DeviceVec::<u8>::new(&res, 1 << 20).expect("array");
                    w.fill_zero().expect("memset");
                    drop(w);
                    res.sync().expect("sync");
                }
                res.release().expect("release");
            });
        }
        s.spawn(move || {
            // The workers stop when this thread ends, also by a panic: a failure here is
            // then a failure of the scenario, not a hang.
            struct StopOnDrop<'a>(&'a std::sync::atomic::AtomicBool);
            impl Drop for StopOnDrop<'_> {
                fn drop(&mut self) {
                    self.0.store(true, std::sync::atomic::Ordering::Relaxed);
                }
            }
            let _stop_workers = StopOnDrop(stop);
            let res = raft::DeviceResources::new().expect("resources");
            let mut slowest = Duration::ZERO;
            for _ in 0..rounds {
                let round = Instant::now();
                let pool =
                    raft::MemoryResource::cuda_async_with(0, raft::AsyncPoolOptions::default().release_threshold(32 << 20)).expect("pool");
                let previous = raft::memory::set_current(0, &pool).expect("set_current");
                let mut v = raft::DeviceVec::<u8>::new(&res, 1 << 20).expect("array");
                v.fill_zero().expect("memset");
                raft::memory::set_current(0, &previous).expect("set_current back");
                drop(pool);
                drop(v);
                let mut w = raft::DeviceVec::<u8>::new(&res, 1 << 20).expect("array");
                w.fill_zero().expect("memset");
                res.sync().expect("sync");
                slowest = slowest.max(round.elapsed());
            }
            println!("RESULT slowest_round_ms={:.1}", slowest.as_secs_f64() * 1e3);
            res.release().expect("release");
        });
    });
    println!("RESULT rounds={rounds}");
}
