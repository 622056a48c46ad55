//! Seed 2.2.1 "Device resources" and 2.2.2 "Devices", one test per example, plus what the seed
//! implies: many threads at once, defaults released elsewhere, drops with queued jobs, cudarc
//! work on the resources' stream, lazy handles.
use raft::{current_device_resources, with_device_resources, AsResources, DeviceResources, ErrorKind, HandleKind};
use raft_tests::require_gpu;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Barrier};
use std::time::{Duration, Instant};

#[test]
fn each_call_makes_independent_resources_with_their_own_stream() {
    require_gpu!();
    let loader = DeviceResources::new().unwrap();
    let trainer = DeviceResources::new().unwrap();
    assert_ne!(loader, trainer);
    assert_eq!(loader, loader.clone(), "Clone gives the same resources");
    assert_eq!([loader.device(), trainer.device()], [0, 0]);
    let (a, b) = (loader.stream().unwrap(), trainer.stream().unwrap());
    assert_ne!(a.cu_stream(), b.cu_stream());
    // Their own streams: neither the legacy (null) nor the per-thread default stream.
    for s in [a.cu_stream(), b.cu_stream()] {
        assert!(!s.is_null());
        assert_ne!(s as usize, 0x2, "cudaStreamPerThread");
        assert_ne!(s as usize, 0x1, "cudaStreamLegacy");
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
    let _still_a_value: &DeviceResources = &finished;
}

#[test]
fn naming_the_device_in_a_log_line_and_checking_two_share_one() {
    require_gpu!();
    let loader = DeviceResources::new().unwrap();
    let trainer = DeviceResources::new().unwrap();
    assert_eq!(format!("training on cuda:{}", trainer.device()), "training on cuda:0");
    let same_device = |a: &DeviceResources, b: &DeviceResources| a.device() == b.device();
    assert!(same_device(&loader, &trainer));
}

#[test]
fn timing_gpu_work_which_returns_once_queued() {
    require_gpu!();
    let trainer = DeviceResources::new().unwrap();
    let milliseconds_on = |r: &DeviceResources, thunk: &dyn Fn()| {
        let start = Instant::now();
        thunk();
        r.sync().unwrap();
        start.elapsed().as_secs_f64() * 1e3
    };
    let ms = milliseconds_on(&trainer, &|| {});
    assert!(ms.is_finite() && ms >= 0.0);
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
    assert_eq!(placed, (0..4).map(|i| i % count).collect::<Vec<_>>());
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
    let weak = std::thread::spawn(|| current_device_resources(0).unwrap().downgrade()).join().unwrap();
    assert!(weak.upgrade().is_none(), "the ended thread's default was dropped with it");
    // Dropping the last handle queued its release on the library thread; it drains.
    let deadline = Instant::now() + Duration::from_secs(10);
    while raft::stats().releases_pending > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(raft::stats().releases_pending, 0);
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
fn resources_do_not_switch_the_callers_current_device_context() {
    require_gpu!();
    use cudarc::driver::result::ctx;
    // A thread whose current context is device 0's primary one keeps it through every call.
    let d0 = DeviceResources::on_device(0).unwrap();
    d0.context().bind_to_thread().unwrap();
    let before = ctx::get_current().unwrap();
    assert_eq!(before, Some(d0.context().cu_ctx()));
    let last = raft::device_count().unwrap() - 1;
    let other = DeviceResources::on_device(last).unwrap();
    other.cublas_handle().unwrap();
    let mut v = raft::DeviceVec::<f32>::zeros(&other, 16).unwrap();
    v.copy_from_host(&[1.0; 16]).unwrap();
    drop(v);
    other.release().unwrap();
    assert_eq!(ctx::get_current().unwrap(), before);
    assert_eq!(raft::current_device().unwrap(), 0);
    // A thread with no context gets none, or device 0's primary one (what the runtime binds on
    // first use), never another device's.
    let (bound, device) = std::thread::spawn(move || {
        let r = DeviceResources::on_device(last).unwrap();
        r.cublas_handle().unwrap();
        r.release().unwrap();
        (ctx::get_current().unwrap().map(|c| c as usize), raft::current_device().unwrap())
    })
    .join()
    .unwrap();
    assert!(bound.is_none() || bound == Some(d0.context().cu_ctx() as usize), "{bound:?}");
    assert_eq!(device, 0);
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
        raft::current_memory_resource(0).map(|_| ()).unwrap_err(),
    ];
    for e in errors {
        assert_eq!(e.kind(), ErrorKind::Cuda, "{e}");
        assert!(e.message().contains("driver"), "the message says the driver is missing: {e}");
    }
    assert_eq!(DeviceResources::new().unwrap_err().who(), "DeviceResources::new");
}

#[test]
fn a_long_job_delays_only_its_own_resources_release() {
    require_gpu!();
    let slow = DeviceResources::new().unwrap();
    let gate = Arc::new(std::sync::Barrier::new(2));
    let g = gate.clone();
    let job = slow.spawn(move || g.wait()).unwrap();
    drop(slow); // its release waits behind the job, on its own worker
    let before = raft::stats().releases_done;
    let quick = DeviceResources::new().unwrap();
    drop(quick); // no worker: the release thread releases it now
    let deadline = Instant::now() + Duration::from_secs(5);
    while raft::stats().releases_done == before && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(raft::stats().releases_done > before, "the quick release was not held up by the slow job");
    assert!(!job.is_finished(), "the slow job was still running all along");
    gate.wait();
    job.join().unwrap();
}
