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
