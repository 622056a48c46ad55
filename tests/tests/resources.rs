//! Seed 2.2.1 "Device resources" and 2.2.2 "Devices", one test per example, plus what the seed
//! implies: many threads at once, defaults released elsewhere, drops with queued jobs, cudarc
//! work on the resources' stream, lazy handles.
use raft::{current_device_resources, with_device_resources, AsResources, DeviceResources, ErrorKind, HandleKind};
use raft_tests::require_gpu;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Barrier};
use std::time::{Duration, Instant};

/// `CU_STREAM_LEGACY` and `CU_STREAM_PER_THREAD` of cuda.h: the two default-stream handles.
const CU_STREAM_LEGACY: usize = 0x1;
const CU_STREAM_PER_THREAD: usize = 0x2;

/// The flags the stream was created with (`cuStreamGetFlags`).
fn stream_flags(stream: &cudarc::driver::CudaStream) -> u32 {
    use cudarc::driver::sys::{cuStreamGetFlags, CUresult};
    stream.context().bind_to_thread().unwrap();
    let mut flags = 0;
    // SAFETY: the stream is alive (borrowed); the call writes one unsigned int.
    let rc = unsafe { cuStreamGetFlags(stream.cu_stream(), &mut flags) };
    assert_eq!(rc, CUresult::CUDA_SUCCESS);
    flags
}

#[test]
fn each_call_makes_independent_resources_with_their_own_stream() {
    require_gpu!();
    use cudarc::driver::sys::CUstream_flags::CU_STREAM_NON_BLOCKING;
    let loader = DeviceResources::new().unwrap();
    let trainer = DeviceResources::new().unwrap();
    assert_ne!(loader, trainer);
    assert_eq!(loader, loader.clone(), "Clone gives the same resources");
    assert_eq!([loader.device(), trainer.device()], [0, 0]);
    let default = current_device_resources(0).unwrap();
    let elsewhere = std::thread::spawn(|| DeviceResources::new().unwrap()).join().unwrap();
    let streams: Vec<_> = [&loader, &trainer, &default, &elsewhere].iter().map(|r| r.stream().unwrap()).collect();
    for (i, s) in streams.iter().enumerate() {
        for t in &streams[i + 1..] {
            assert_ne!(s.cu_stream(), t.cu_stream(), "each resources object has a stream of its own");
        }
        // Neither the legacy (null) nor the per-thread default stream, and created non-blocking:
        // it never waits for the legacy default stream of libraries that still use it.
        assert!(!s.cu_stream().is_null());
        assert_ne!(s.cu_stream() as usize, CU_STREAM_LEGACY);
        assert_ne!(s.cu_stream() as usize, CU_STREAM_PER_THREAD);
        let flags = stream_flags(s);
        assert_eq!(flags & CU_STREAM_NON_BLOCKING as u32, CU_STREAM_NON_BLOCKING as u32, "stream {i} has flags {flags:#x}");
    }
}

#[test]
fn device_count_is_the_first_number_that_is_not_a_device() {
    require_gpu!();
    let n = raft::device_count().unwrap();
    assert!(n >= 1);
    let e = DeviceResources::on_device(n).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Logic);
    assert_eq!(e.to_string(), format!("DeviceResources::on_device: no device {n} among {n}"));
    let e = DeviceResources::on_device(usize::MAX).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Logic);
}

#[test]
fn accepting_a_device_number_or_resources() {
    require_gpu!();
    fn as_resources(where_: impl AsResources) -> DeviceResources {
        where_.as_resources().unwrap()
    }
    let loader = DeviceResources::new().unwrap();
    assert_eq!(as_resources(0usize), current_device_resources(0).unwrap());
    assert_eq!(as_resources(&loader), loader);
    assert_eq!(as_resources(loader.clone()), loader);
}

#[test]
fn released_resources_are_still_resources() {
    require_gpu!();
    let finished = with_device_resources(DeviceResources::new().unwrap(), |r| r.clone());
    assert!(finished.is_released());
    assert_eq!(finished.device(), 0, "device() still answers after release");
    // Still resources: an API taking `impl AsResources` gets them back as they are (not the
    // thread's default), identity still holds, and releasing again is a no-op.
    fn as_resources(where_: impl AsResources) -> DeviceResources {
        where_.as_resources().unwrap()
    }
    let back = as_resources(&finished);
    assert_eq!(back, finished);
    assert!(back.is_released());
    assert_ne!(back, current_device_resources(0).unwrap());
    assert_eq!(finished.release(), Ok(()));
    assert_eq!(finished.to_string(), "device-resources on cuda:0 (released)");
}

#[test]
fn naming_the_device_in_a_log_line_and_checking_two_share_one() {
    require_gpu!();
    let loader = DeviceResources::new().unwrap();
    let trainer = DeviceResources::new().unwrap();
    // The number in the log line is the device the resources' stream really is on.
    let ordinal = trainer.stream().unwrap().context().ordinal();
    assert_eq!(format!("training on cuda:{}", trainer.device()), format!("training on cuda:{ordinal}"));
    assert!(trainer.to_string().contains(&format!("cuda:{ordinal}")), "{trainer}");
    let same_device = |a: &DeviceResources, b: &DeviceResources| a.device() == b.device();
    assert!(same_device(&loader, &trainer));
    // Released resources still name their device.
    let finished = with_device_resources(DeviceResources::new().unwrap(), |r| r.clone());
    assert!(same_device(&finished, &loader));
    // And resources on another device do not share it (several GPUs only).
    let count = raft::device_count().unwrap();
    if count > 1 {
        let other = DeviceResources::on_device(count - 1).unwrap();
        assert!(!same_device(&other, &loader));
        assert_eq!(other.stream().unwrap().context().ordinal(), count - 1);
    }
}

/// Stream work of `arg` milliseconds: a host function (it makes no CUDA call, as host functions
/// must not), which runs in stream order like a kernel.
unsafe extern "C" fn sleep_on_stream(arg: *mut std::ffi::c_void) {
    std::thread::sleep(Duration::from_millis(arg as u64));
}

#[test]
fn timing_gpu_work_which_returns_once_queued() {
    require_gpu!();
    const WORK_MS: u64 = 300;
    let trainer = DeviceResources::new().unwrap();
    let milliseconds_on = |r: &DeviceResources, thunk: &dyn Fn()| {
        let start = Instant::now();
        thunk();
        r.sync().unwrap();
        start.elapsed().as_secs_f64() * 1e3
    };
    let stream = trainer.stream().unwrap();
    stream.context().bind_to_thread().unwrap();
    let queued_ms = std::cell::Cell::new(f64::NAN);
    let ms = milliseconds_on(&trainer, &|| {
        let start = Instant::now();
        // SAFETY: the stream is alive (held above); `sleep_on_stream` makes no CUDA call and
        // reads its argument as a number.
        unsafe {
            cudarc::driver::result::stream::launch_host_function(stream.cu_stream(), sleep_on_stream, WORK_MS as *mut std::ffi::c_void)
        }
        .unwrap();
        queued_ms.set(start.elapsed().as_secs_f64() * 1e3);
    });
    // Queueing returns at once; sync() waits for the work, so the timing includes it.
    assert!(queued_ms.get() < WORK_MS as f64 / 3.0, "queueing took {} ms", queued_ms.get());
    assert!(ms >= WORK_MS as f64, "the timing ({ms} ms) covers the {WORK_MS} ms of stream work");
    let idle = milliseconds_on(&trainer, &|| {});
    assert!(idle < ms, "an empty thunk times less ({idle} ms) than the work ({ms} ms)");
}

#[test]
fn waiting_in_a_thread_of_its_own() {
    require_gpu!();
    let trainer = DeviceResources::new().unwrap();
    let r = trainer.clone();
    let message = trainer
        .spawn(move || {
            r.sync().unwrap();
            "the trainer's stream has drained"
        })
        .unwrap()
        .join()
        .unwrap();
    assert_eq!(message, "the trainer's stream has drained");
    // The same, awaited: the executor thread is never blocked on the stream.
    let r = trainer.clone();
    let awaited = pollster::block_on(trainer.spawn(move || r.sync()).unwrap()).unwrap();
    assert_eq!(awaited, Ok(()));
}

#[test]
fn sync_on_released_resources_is_a_logic_error_with_the_seed_text() {
    require_gpu!();
    let finished = with_device_resources(DeviceResources::new().unwrap(), |r| r.clone());
    let e = finished.sync().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Logic);
    assert_eq!(e.to_string(), "DeviceResources::sync: the device resources on device 0 were released");
    assert_eq!(e.who(), "DeviceResources::sync");
}

#[test]
fn each_thread_gets_its_own_default() {
    require_gpu!();
    fn worker_resources() -> DeviceResources {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || tx.send(current_device_resources(0).unwrap()).unwrap());
        rx.recv().unwrap()
    }
    let a = worker_resources();
    let b = worker_resources();
    assert_ne!(a, b);
    assert_ne!(a, current_device_resources(0).unwrap());
    assert_eq!(current_device_resources(0).unwrap(), current_device_resources(0).unwrap(), "same thread, same resources");
}

#[test]
fn releasing_the_default_makes_the_next_call_create_a_new_one() {
    require_gpu!();
    let before = current_device_resources(0).unwrap();
    with_device_resources(before.clone(), |r| r.sync().unwrap());
    assert!(before.is_released());
    assert!(before.to_string().ends_with("(released)"), "{before}");
    let after = current_device_resources(0).unwrap();
    assert_ne!(before, after);
    assert!(!after.is_released());
}

#[test]
fn scoped_resources_are_released_and_unscoped_are_not() {
    require_gpu!();
    let unscoped = DeviceResources::new().unwrap();
    let scoped = with_device_resources(DeviceResources::new().unwrap(), |r| r.clone());
    assert_eq!(
        [unscoped.to_string(), scoped.to_string()],
        ["device-resources on cuda:0".to_string(), "device-resources on cuda:0 (released)".to_string()]
    );
}

#[test]
fn released_even_when_the_body_fails() {
    require_gpu!();
    let seen = std::cell::RefCell::new(None);
    let run_batch = |items: &[i32]| -> Result<usize, String> {
        with_device_resources(DeviceResources::new().unwrap(), |r| {
            *seen.borrow_mut() = Some(r.clone());
            for item in items {
                if *item < 0 {
                    return Err(format!("run_batch: bad item {item}"));
                }
            }
            r.sync().unwrap();
            Ok(items.len())
        })
    };
    assert_eq!(run_batch(&[1, 2, 3]), Ok(3));
    assert!(seen.borrow_mut().take().unwrap().is_released());
    assert_eq!(run_batch(&[1, -2, 3]), Err("run_batch: bad item -2".to_string()));
    assert!(seen.borrow_mut().take().unwrap().is_released());
}

#[test]
fn released_even_when_the_body_panics() {
    require_gpu!();
    let r = DeviceResources::new().unwrap();
    let inside = r.clone();
    let outcome = std::panic::catch_unwind(move || with_device_resources(inside, |_| panic!("body failed")));
    assert!(outcome.is_err());
    assert!(r.is_released());
}

#[test]
fn several_bindings_are_released_together() {
    require_gpu!();
    let (left, right) =
        with_device_resources((DeviceResources::new().unwrap(), DeviceResources::new().unwrap()), |(l, r)| (l.clone(), r.clone()));
    assert!(left.is_released() && right.is_released());
    assert_eq!(left.sync().unwrap_err().to_string(), "DeviceResources::sync: the device resources on device 0 were released");
    let many = with_device_resources(vec![DeviceResources::new().unwrap(), DeviceResources::new().unwrap()], |v| v.clone());
    assert!(many.iter().all(DeviceResources::is_released));
}

#[test]
fn release_is_explicit_idempotent_and_leaves_device() {
    require_gpu!();
    let r = DeviceResources::new().unwrap();
    r.release().unwrap();
    r.release().unwrap();
    assert!(r.is_released());
    assert_eq!(r.device(), 0);
    for e in [r.stream().map(|_| ()).unwrap_err(), r.cublas_handle().map(|_| ()).unwrap_err(), r.spawn(|| ()).map(|_| ()).unwrap_err()] {
        assert_eq!(e.kind(), ErrorKind::Logic, "{e}");
        assert!(e.to_string().ends_with("the device resources on device 0 were released"), "{e}");
    }
}

#[test]
fn spreading_workers_round_robin_and_resources_for_every_device() {
    require_gpu!();
    let count = raft::device_count().unwrap();
    let device_for_worker = |i: usize| i % count;
    let placed: Vec<usize> = (0..4).map(device_for_worker).collect();
    if count == 1 {
        assert_eq!(placed, [0, 0, 0, 0], "the seed's answer on one GPU");
    }
    // Every placement is a device that exists: each worker's resources are made there, and are
    // really on it; four workers cover min(4, count) devices.
    let workers: Vec<DeviceResources> = placed.iter().map(|&d| DeviceResources::on_device(d).unwrap()).collect();
    for (i, w) in workers.iter().enumerate() {
        assert_eq!(w.device(), placed[i]);
        assert_eq!(w.stream().unwrap().context().ordinal(), placed[i], "worker {i}");
    }
    let covered: std::collections::HashSet<usize> = workers.iter().map(DeviceResources::device).collect();
    assert_eq!(covered.len(), count.min(4));
    let per_device: Vec<DeviceResources> = (0..count).map(|d| DeviceResources::on_device(d).unwrap()).collect();
    assert_eq!(per_device.iter().map(DeviceResources::device).collect::<Vec<_>>(), (0..count).collect::<Vec<_>>());
    for r in &per_device {
        // Each is really on its device: its stream's context is that device's.
        assert_eq!(r.context().ordinal(), r.device());
        assert_eq!(r.stream().unwrap().context().ordinal(), r.device());
    }
}

#[test]
fn sixteen_threads_take_their_defaults_at_once() {
    require_gpu!();
    let barrier = Arc::new(Barrier::new(16));
    let threads: Vec<_> = (0..16)
        .map(|_| {
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                barrier.wait();
                let first = current_device_resources(0).unwrap();
                let again = current_device_resources(0).unwrap();
                assert_eq!(first, again);
                first.sync().unwrap();
                first
            })
        })
        .collect();
    let all: Vec<DeviceResources> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    for (i, a) in all.iter().enumerate() {
        for b in &all[i + 1..] {
            assert_ne!(a, b);
        }
    }
}

#[test]
fn a_default_released_on_another_thread_is_replaced_on_its_own() {
    require_gpu!();
    let (to_main, from_worker) = mpsc::channel();
    let (to_worker, from_main) = mpsc::channel::<()>();
    let worker = std::thread::spawn(move || {
        let first = current_device_resources(0).unwrap();
        to_main.send(first.clone()).unwrap();
        from_main.recv().unwrap(); // main released it
        assert!(first.is_released());
        let second = current_device_resources(0).unwrap();
        assert_ne!(first, second);
        second.sync().unwrap();
    });
    let theirs = from_worker.recv().unwrap();
    theirs.release().unwrap();
    to_worker.send(()).unwrap();
    worker.join().unwrap();
}

#[test]
fn a_thread_s_defaults_are_released_when_it_ends() {
    require_gpu!();
    let (weak, stream) = std::thread::spawn(|| {
        let r = current_device_resources(0).unwrap();
        (r.downgrade(), Arc::downgrade(&r.stream().unwrap()))
    })
    .join()
    .unwrap();
    assert!(weak.upgrade().is_none(), "the ended thread's default was dropped with it");
    // Dropping the last handle queued its release on a library thread: the stream goes with it
    // (only the native resources hold it). Watched on this object alone, not on the process-wide
    // counters that sibling tests move too.
    let deadline = Instant::now() + Duration::from_secs(10);
    while stream.upgrade().is_some() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(stream.upgrade().is_none(), "the ended thread's default was released");
}

#[test]
fn resources_dropped_while_jobs_are_queued_still_run_them() {
    require_gpu!();
    let ran = Arc::new(AtomicUsize::new(0));
    let r = DeviceResources::new().unwrap();
    let handles: Vec<_> = (0..3)
        .map(|_| {
            let ran = ran.clone();
            r.spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                ran.fetch_add(1, Ordering::SeqCst)
            })
            .unwrap()
        })
        .collect();
    drop(r); // the last handle: released on the release thread, after the queued jobs
    let order: Vec<usize> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(order, [0, 1, 2], "jobs run in order, all of them");
    assert_eq!(ran.load(Ordering::SeqCst), 3);
}

#[test]
fn jobs_run_on_the_worker_and_a_panic_comes_back_as_an_error() {
    require_gpu!();
    let r = DeviceResources::new().unwrap();
    let name = r.spawn(|| std::thread::current().name().map(str::to_string)).unwrap().join().unwrap();
    assert_eq!(name.as_deref(), Some("raft-worker-0"));
    let e = r.spawn(|| panic!("boom")).unwrap().join().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Generic);
    assert!(e.to_string().contains("boom"), "{e}");
    assert_eq!(r.spawn(|| 1 + 1).unwrap().join().unwrap(), 2, "the worker survives a panicking job");
}

/// The sixteenth audit: a worker bound its resources' context once, and a job that left another
/// context current (another library's, or none) left it to the next job of the same resources,
/// whose `DeviceResources::new()`, `current_device()` and lent RAFT code then followed it. Now
/// every job starts on the resources' context. (Before: the second job saw no context.)
#[test]
fn each_job_starts_on_its_resources_context_whatever_the_job_before_left() {
    require_gpu!();
    let r = DeviceResources::new().unwrap();
    let ctx = r.context().cu_ctx() as usize;
    let current = || cudarc::driver::result::ctx::get_current().unwrap().map(|c| c as usize);
    assert_eq!(r.spawn(current).unwrap().join().unwrap(), Some(ctx), "the first job");
    // Another library's code in a job that leaves no context current.
    // SAFETY: unbinding the thread's context touches no memory; nothing here uses it after.
    r.spawn(|| unsafe { cudarc::driver::result::ctx::set_current(std::ptr::null_mut()) }.unwrap()).unwrap().join().unwrap();
    assert_eq!(r.spawn(current).unwrap().join().unwrap(), Some(ctx), "the next job starts on the resources' context");
}

/// A detached job whose result panics when dropped (the thirteenth audit): the worker dropped
/// the result outside the job's catch, the panic ended the worker thread, and the jobs queued
/// behind it were dropped unrun, their joins waiting for ever. Now the panic is caught on the
/// worker, which goes on. (Before: the bounded join below timed out.)
#[test]
fn a_detached_job_whose_result_panics_when_dropped_leaves_the_worker_running() {
    require_gpu!();
    struct Bomb;
    impl Drop for Bomb {
        fn drop(&mut self) {
            panic!("a detached job's result panicked when dropped");
        }
    }
    let r = DeviceResources::new().unwrap();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    // Detached before it ends: the worker then holds its result's last copy.
    drop(r.spawn(move || {
        let _ = go_rx.recv_timeout(Duration::from_secs(30));
        Bomb
    }));
    let next = r.spawn(|| 1 + 1).unwrap();
    go_tx.send(()).unwrap();
    let (got_tx, got_rx) = mpsc::channel();
    std::thread::spawn(move || got_tx.send(next.join().map_err(|e| e.to_string())));
    let got = got_rx.recv_timeout(Duration::from_secs(30));
    assert_eq!(got, Ok(Ok(2)), "the job queued behind the detached one never ended");
    assert_eq!(r.spawn(|| 3).unwrap().join().unwrap(), 3, "the worker is still running");
}

#[test]
fn a_job_may_release_its_own_resources() {
    require_gpu!();
    let r = DeviceResources::new().unwrap();
    let inner = r.clone();
    r.spawn(move || inner.release()).unwrap().join().unwrap().unwrap();
    assert!(r.is_released());
}

#[test]
fn cudarc_work_on_the_resources_stream_is_seen_by_sync() {
    require_gpu!();
    use cudarc::driver::sys::{cuStreamQuery, CUresult};
    let r = DeviceResources::new().unwrap();
    let stream = r.stream().unwrap();
    let n = 64 << 20; // 256 MiB of f32: long enough to still run when the call returns
    let host: Vec<f32> = (0..n).map(|i| (i % 1000) as f32).collect();
    let src = stream.clone_htod(&host).unwrap();
    let mut dst = stream.alloc_zeros::<f32>(n).unwrap();
    for _ in 0..8 {
        stream.memcpy_dtod(&src, &mut dst).unwrap();
    }
    r.sync().unwrap();
    // SAFETY: the stream is alive (we hold it); cuStreamQuery only reads its state.
    assert_eq!(unsafe { cuStreamQuery(stream.cu_stream()) }, CUresult::CUDA_SUCCESS, "sync() waited for cudarc's copies");
    let back = stream.clone_dtoh(&dst).unwrap();
    assert_eq!(back[12345], host[12345]);
    assert_eq!(back[n - 1], host[n - 1]);
}

#[test]
fn handles_are_made_on_first_use_only() {
    require_gpu!();
    let r = DeviceResources::new().unwrap();
    for k in HandleKind::ALL {
        assert!(!r.has_handle(k).unwrap(), "{k:?} exists before use");
    }
    let cublas = r.cublas_handle().unwrap();
    assert!(!cublas.is_null());
    assert!(r.has_handle(HandleKind::Cublas).unwrap());
    assert!(!r.has_handle(HandleKind::Cusparse).unwrap());
    assert_eq!(r.cublas_handle().unwrap(), cublas, "one handle per resources");
    for k in [HandleKind::CusolverDn, HandleKind::CusolverSp, HandleKind::Cusparse] {
        assert!(!r.handle(k).unwrap().is_null());
        assert!(r.has_handle(k).unwrap());
    }
    let other = DeviceResources::new().unwrap();
    assert_ne!(other.cublas_handle().unwrap(), cublas);
}

#[test]
fn debug_and_display_show_the_device_and_state() {
    require_gpu!();
    let r = DeviceResources::new().unwrap();
    assert_eq!(r.to_string(), "device-resources on cuda:0");
    assert!(format!("{r:?}").contains("device: 0, released: false"), "{r:?}");
    r.release().unwrap();
    assert_eq!(r.to_string(), "device-resources on cuda:0 (released)");
    assert!(format!("{r:?}").contains("released: true"));
}

#[test]
fn without_a_driver_every_constructor_is_a_cuda_error() {
    if raft::device_count().is_ok() {
        let _ = std::io::Write::write_all(
            &mut std::io::stderr(),
            b"SKIP without_a_driver_every_constructor_is_a_cuda_error: a driver is present\n",
        );
        return;
    }
    let errors = [
        raft::device_count().map(|_| ()).unwrap_err(),
        DeviceResources::new().map(|_| ()).unwrap_err(),
        DeviceResources::on_device(0).map(|_| ()).unwrap_err(),
        current_device_resources(0).map(|_| ()).unwrap_err(),
        0usize.as_resources().map(|_| ()).unwrap_err(),
        raft::memory::current(0).map(|_| ()).unwrap_err(),
        raft::memory::trim_retired_pools().map(|_| ()).unwrap_err(),
    ];
    for e in errors {
        assert_eq!(e.kind(), ErrorKind::Cuda, "{e}");
        assert!(e.message().contains("driver"), "the message says the driver is missing: {e}");
    }
    assert_eq!(DeviceResources::new().unwrap_err().who(), "DeviceResources::new");
    // No async pool can be made without a driver: none counted.
    let s = raft::stats();
    assert_eq!((s.async_pools_made, s.async_pools_retired, s.async_pools_reused), (0, 0, 0));
    // Nothing to relax without a driver: the closure runs (cudarc would panic on a first call).
    assert_eq!(raft::with_relaxed_capture(|| 7), 7);
}

#[test]
fn a_long_job_delays_only_its_own_resources_release() {
    require_gpu!();
    // Each release is watched on its own object: the stream goes when its resources are
    // released (only the native resources hold it), whatever sibling tests release meanwhile.
    let gone = |stream: &std::sync::Weak<cudarc::driver::CudaStream>, within: Duration| {
        let deadline = Instant::now() + within;
        while stream.upgrade().is_some() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        stream.upgrade().is_none()
    };
    let slow = DeviceResources::new().unwrap();
    let slow_stream = Arc::downgrade(&slow.stream().unwrap());
    let (open, gate) = mpsc::channel::<()>();
    // The job waits for the gate (or for this test to end, when the sender drops).
    let job = slow.spawn(move || gate.recv_timeout(Duration::from_secs(30))).unwrap();
    drop(slow); // its release waits behind the job, on its own worker
    let quick = DeviceResources::new().unwrap();
    let quick_stream = Arc::downgrade(&quick.stream().unwrap());
    drop(quick); // no worker: a release thread releases it now
    assert!(gone(&quick_stream, Duration::from_secs(5)), "the quick release was not held up by the slow job");
    assert!(!job.is_finished(), "the slow job was still running all along");
    assert!(slow_stream.upgrade().is_some(), "the slow resources wait for their job");
    open.send(()).unwrap();
    assert_eq!(job.join().unwrap(), Ok(()));
    assert!(gone(&slow_stream, Duration::from_secs(10)), "released once the job ended");
}

/// Work queued with cudarc on the stream `stream()` handed out is drained by `release()` (a
/// release skips the drain only for resources whose stream nobody was ever handed).
#[test]
fn release_drains_work_queued_on_the_stream_it_handed_out() {
    require_gpu!();
    let r = DeviceResources::new().unwrap();
    let s = r.stream().unwrap();
    // Device copies of 256 MiB (~0.12 ms each on an H200), queued until the last is still
    // running when release begins: 20 were once all done by the time the host asked (run 139,
    // a host delayed by more than their ~2.5 ms), so the batch doubles until the premise holds.
    let n = 64 << 20;
    let src = s.alloc_zeros::<f32>(n).unwrap();
    let mut dst = s.alloc_zeros::<f32>(n).unwrap();
    s.synchronize().unwrap();
    let mut batch = 20;
    let done = loop {
        for _ in 0..batch {
            s.memcpy_dtod(&src, &mut dst).unwrap();
        }
        let done = s.record_event(None).unwrap();
        if !done.is_complete() {
            break done;
        }
        assert!(batch < 2560, "{batch} copies were done before the host could ask: the premise cannot be set up");
        batch *= 2;
    };
    r.release().unwrap();
    assert!(done.is_complete(), "release returned before the work queued on its stream had finished");
}

/// Issue 33 item 3: a memory failure callback runs inside the allocation's use of the resources;
/// one that calls `sync` on them while another thread releases them deadlocked (the release
/// waited for the write lock behind the allocation, and the callback's second read lock waited
/// behind the release). Now the callback's call runs inside the outer use and returns.
#[test]
fn a_failure_callback_syncing_its_resources_during_a_release_returns() {
    require_gpu!();
    let res = DeviceResources::new().unwrap();
    let (entered_tx, entered_rx) = mpsc::channel::<()>();
    let (synced_tx, synced_rx) = mpsc::channel::<raft::Result<()>>();
    let inside = res.clone();
    let once = Arc::new(AtomicUsize::new(0));
    let (entered_tx, synced_tx) = (std::sync::Mutex::new(entered_tx), std::sync::Mutex::new(synced_tx));
    let mr = raft::memory::current(0)
        .unwrap()
        .with_limit(1 << 20)
        .unwrap()
        .with_failure_callback(move |_| {
            if once.fetch_add(1, Ordering::SeqCst) == 0 {
                let _ = entered_tx.lock().unwrap().send(());
                // Let the releasing thread reach its wait for the write lock.
                std::thread::sleep(Duration::from_millis(300));
                let _ = synced_tx.lock().unwrap().send(inside.sync());
            }
            false
        })
        .unwrap();
    let releaser = {
        let res = res.clone();
        std::thread::spawn(move || {
            entered_rx.recv().unwrap();
            res.release()
        })
    };
    let allocating = {
        let res = res.clone();
        std::thread::spawn(move || raft::DeviceVec::<u8>::new_in(&res, 2 << 20, &mr).map(drop))
    };
    let synced = synced_rx.recv_timeout(Duration::from_secs(20)).expect("the callback's sync deadlocked against the release");
    synced.unwrap();
    // Out of memory, or (its retry made after the release) released resources.
    let kind = allocating.join().unwrap().unwrap_err().kind();
    assert!(matches!(kind, ErrorKind::OutOfMemory | ErrorKind::Logic), "{kind:?}");
    releaser.join().unwrap().unwrap();
    assert!(res.is_released());
}

/// A failure callback runs inside the allocation's use of its resources, also on a chain made
/// here with no current resource in it: a release of those resources from the callback is
/// refused with `Logic` (it would wait for its own allocation), never a hang. (Run 136: a build
/// that left that use unrecorded for such chains hung here.)
#[test]
fn a_release_inside_a_failure_callback_is_refused_not_hung() {
    require_gpu!();
    let res = DeviceResources::new().unwrap();
    let inside = res.clone();
    let (tx, rx) = mpsc::channel::<raft::Result<()>>();
    let tx = std::sync::Mutex::new(tx);
    let mr = raft::MemoryResource::cuda(0)
        .unwrap()
        .with_limit(1 << 20)
        .unwrap()
        .with_failure_callback(move |_| {
            let _ = tx.lock().unwrap().send(inside.release());
            false
        })
        .unwrap();
    let allocating = {
        let res = res.clone();
        std::thread::spawn(move || raft::DeviceVec::<u8>::new_in(&res, 2 << 20, &mr).map(drop))
    };
    let released = match rx.recv_timeout(Duration::from_secs(20)) {
        Ok(released) => released,
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("a release inside the callback waited for its own allocation"),
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("the allocation ended without running the failure callback"),
    };
    let e = released.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Logic, "{e}");
    assert!(e.to_string().contains("in use on this thread"), "{e}");
    assert_eq!(allocating.join().unwrap().unwrap_err().kind(), ErrorKind::OutOfMemory);
    assert!(!res.is_released());
}

/// Issue 33 item 4: a job joining a later job of its own resources waited for a job queued
/// behind itself: a hang. It is refused with `Logic`, and both jobs still run.
#[test]
fn a_job_joining_a_later_job_of_its_own_resources_is_refused() {
    require_gpu!();
    let res = DeviceResources::new().unwrap();
    let inner = res.clone();
    let outer = res.spawn(move || {
        let later = inner.spawn(|| 7).unwrap();
        later.join()
    });
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || tx.send(outer.unwrap().join()));
    let joined = rx.recv_timeout(Duration::from_secs(20)).expect("a job joining a later job of its own resources hung");
    let e = joined.unwrap().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Logic, "{e}");
    assert!(e.to_string().starts_with("JobHandle::join: "), "{e}");
    res.release().unwrap();
}
