//! Lending the `raft::resources` behind a `DeviceResources` to C++ RAFT code (what cuVS's
//! `cuvsResources_t` and RAFT's comms take): the same stream and handles, no copy.
use raft::{DeviceResources, ErrorKind};
use raft_tests::baseline::{bl_lent_cublas, bl_lent_stream};
use raft_tests::require_gpu;

#[test]
fn raft_code_on_the_lent_resources_sees_their_stream_and_handles() {
    require_gpu!();
    let res = DeviceResources::new().unwrap();
    let ours = res.stream().unwrap().cu_stream() as usize;
    let (stream, cublas) = res
        .with_raft_resources(|raft_res| {
            // SAFETY: C++ RAFT accessors on a raft::resources* that is alive for the closure.
            unsafe { (bl_lent_stream(raft_res.as_ptr()) as usize, bl_lent_cublas(raft_res.as_ptr()) as usize) }
        })
        .unwrap();
    assert_eq!(stream, ours, "RAFT's get_cuda_stream on the lent resources is their stream");
    assert_eq!(cublas, res.cublas_handle().unwrap() as usize, "one cuBLAS handle, made once, shared");
    res.release().unwrap();
    let e = res.with_raft_resources(|_| ()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Logic);
}

#[test]
fn a_release_from_another_thread_waits_for_the_lend_to_end() {
    require_gpu!();
    let res = DeviceResources::new().unwrap();
    let other = res.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    res.with_raft_resources(|_| {
        let t = std::thread::spawn(move || {
            other.release().unwrap();
            tx.send(()).unwrap();
        });
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(rx.try_recv().is_err(), "the release did not wait for the lend");
        t
    })
    .unwrap()
    .join()
    .unwrap();
    rx.recv_timeout(std::time::Duration::from_secs(10)).expect("the release ends once the lend ended");
    assert!(res.is_released());
}

#[test]
fn a_release_from_inside_the_lend_on_the_same_thread_is_refused_not_a_deadlock() {
    require_gpu!();
    let res = DeviceResources::new().unwrap();
    let inner = res.with_raft_resources(|_| res.release()).unwrap();
    let e = inner.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Logic, "{e}");
    assert!(e.message().contains("in use on this thread"), "{e}");
    assert!(!res.is_released());
    res.release().unwrap();
    assert!(res.is_released());
}

/// The exclusive lend (for C++ code that changes RAFT's object, `raft::resource::set_*`) waits
/// for a shared lend on another thread, holds new uses back until it ends, is refused inside a
/// use on its own thread (it would wait for itself) and on released resources; and RAFT's
/// accessors see the same object through it.
#[test]
fn the_exclusive_lend_waits_for_other_uses_and_holds_new_ones_back() {
    require_gpu!();
    let res = DeviceResources::new().unwrap();
    let ours = res.stream().unwrap().cu_stream() as usize;
    // SAFETY: a C++ RAFT accessor on a raft::resources* that is alive for the closure.
    let seen = res.with_raft_resources_mut(|raft_res| unsafe { bl_lent_stream(raft_res.as_ptr()) as usize }).unwrap();
    assert_eq!(seen, ours);
    let (entered, ended) = (std::sync::Barrier::new(2), std::sync::Mutex::new(None::<std::time::Instant>));
    std::thread::scope(|s| {
        s.spawn(|| {
            res.with_raft_resources(|_| {
                entered.wait();
                std::thread::sleep(std::time::Duration::from_millis(200));
                *ended.lock().unwrap() = Some(std::time::Instant::now());
            })
            .unwrap();
        });
        entered.wait();
        let started = res.with_raft_resources_mut(|_| std::time::Instant::now()).unwrap();
        let lend_end = ended.lock().unwrap().expect("the exclusive lend ran beside another thread's lend");
        assert!(lend_end <= started);
    });
    // New uses wait for it: a sync from another thread starts only after the exclusive lend.
    let (tx, rx) = std::sync::mpsc::channel();
    res.with_raft_resources_mut(|_| {
        let other = res.clone();
        let t = std::thread::spawn(move || {
            other.sync().unwrap();
            tx.send(()).unwrap();
        });
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(rx.try_recv().is_err(), "a sync ran inside the exclusive lend");
        t
    })
    .unwrap()
    .join()
    .unwrap();
    rx.recv_timeout(std::time::Duration::from_secs(10)).expect("the sync runs once the exclusive lend ended");
    let e = res.with_raft_resources(|_| res.with_raft_resources_mut(|_| ())).unwrap().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Logic, "{e}");
    assert!(e.message().contains("would wait for itself"), "{e}");
    res.release().unwrap();
    let e = res.with_raft_resources_mut(|_| ()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Logic, "{e}");
    assert!(e.message().contains("released"), "{e}");
}

/// The nineteenth audit (helper 86): RAFT code works on the thread's current device (it makes
/// its workspace from that device's RMM entry), yet `with_raft_resources` ran the closure on
/// whatever context the thread had: none on a fresh thread, another library's, or another
/// device's (whose lend count then did not protect the entry RAFT held). The closure now runs
/// on the resources' own primary context, and the thread's context is put back after it, for
/// the shared and the exclusive lend alike.
#[test]
fn a_lend_runs_on_the_resources_context_and_puts_the_thread_s_own_back() {
    require_gpu!();
    use cudarc::driver::sys;
    let current = || {
        let mut c: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: writes the thread's current context into a local.
        unsafe { sys::cuCtxGetCurrent(&mut c) }.result().unwrap();
        c as usize
    };
    let res = DeviceResources::new().unwrap();
    let primary = res.context().cu_ctx() as usize;
    std::thread::scope(|s| {
        // A fresh thread: no context of its own.
        s.spawn(|| {
            assert_eq!(current(), 0, "a fresh thread has no context");
            let inside = res.with_raft_resources(|_| current()).unwrap();
            assert_eq!(inside, primary, "the shared lend ran on no context of the resources'");
            let inside = res.with_raft_resources_mut(|_| current()).unwrap();
            assert_eq!(inside, primary, "the exclusive lend ran on no context of the resources'");
        });
        // A thread on another library's context of the device.
        s.spawn(|| {
            let mut foreign: sys::CUcontext = std::ptr::null_mut();
            // SAFETY: makes a new context of the device current on this thread; destroyed below,
            // once the lends (which must not use it) are over.
            unsafe { sys::cuCtxCreate_v4(&mut foreign, std::ptr::null_mut(), 0, res.device() as i32) }.result().unwrap();
            let inside = res.with_raft_resources(|_| current()).unwrap();
            let after = current();
            // SAFETY: the context made above, current on this thread; nothing uses it.
            unsafe { sys::cuCtxDestroy_v2(foreign) }.result().unwrap();
            assert_eq!(inside, primary, "the lend ran in another library's context");
            assert_eq!(after, foreign as usize, "the thread's own context was not put back");
        });
    });
}
