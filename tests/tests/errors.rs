//! Seed 2.2.4 "Errors": dispatching on the kind, recovering `who` from the message, and the
//! out-of-memory kind with the process carrying on.
use raft::{current_device_resources, DeviceResources, DeviceVec, ErrorKind};
use raft_tests::require_gpu;

#[derive(Debug, PartialEq)]
enum Advice {
    Ok,
    FreeMemoryAndRetry,
    FixTheCall,
    Report,
}

fn describe_failure<T>(thunk: impl FnOnce() -> raft::Result<T>) -> Advice {
    match thunk() {
        Ok(_) => Advice::Ok,
        Err(e) => match e.kind() {
            ErrorKind::OutOfMemory => Advice::FreeMemoryAndRetry,
            ErrorKind::Logic => Advice::FixTheCall,
            _ => Advice::Report,
        },
    }
}

#[test]
fn dispatching_on_the_kind() {
    require_gpu!();
    assert_eq!(describe_failure(|| current_device_resources(0)), Advice::Ok);
    assert_eq!(describe_failure(|| DeviceResources::on_device(99)), Advice::FixTheCall);
    let r = DeviceResources::new().unwrap();
    assert_eq!(describe_failure(|| DeviceVec::<u8>::new(&r, 1 << 50)), Advice::FreeMemoryAndRetry);
}

#[test]
fn recovering_the_procedure_name_from_the_message() {
    require_gpu!();
    let finished = raft::with_device_resources(DeviceResources::new().unwrap(), |r| r.clone());
    let e = finished.sync().unwrap_err();
    let who = e.to_string().split(": ").next().unwrap().to_string();
    assert_eq!(who, "DeviceResources::sync");
    assert_eq!(who, e.who());
}

#[test]
fn out_of_memory_leaves_the_process_and_the_memory_usable() {
    require_gpu!();
    let r = DeviceResources::new().unwrap();
    let (free, total) = r.context().mem_get_info().unwrap();
    for bytes in [total + (1 << 30), 1usize << 50, usize::MAX / 2] {
        let e = DeviceVec::<u8>::new(&r, bytes).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::OutOfMemory, "{bytes} bytes: {e}");
        assert_eq!(e.who(), "DeviceVec::new");
    }
    assert_eq!(DeviceVec::<f64>::new(&r, usize::MAX).unwrap_err().kind(), ErrorKind::OutOfMemory);
    // The memory is usable again: a GiB allocates, is written and read back.
    assert!(free > 1 << 30);
    let n = 1 << 30;
    let mut v = DeviceVec::<u8>::zeros(&r, n).unwrap();
    let host = vec![7u8; n];
    v.copy_from_host(&host).unwrap();
    assert_eq!(v.to_host().unwrap()[n - 1], 7);
    // A job that fails with it reports it.
    let rr = r.clone();
    let e = r.spawn(move || DeviceVec::<u8>::new(&rr, 1 << 50).map(|_| ())).unwrap().join().unwrap().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::OutOfMemory);
}

#[test]
fn bad_arguments_are_logic_errors_not_panics() {
    require_gpu!();
    let r = DeviceResources::new().unwrap();
    let mut v = DeviceVec::<f32>::zeros(&r, 4).unwrap();
    assert_eq!(v.copy_from_host(&[1.0; 3]).unwrap_err().to_string(), "DeviceVec::copy_from_host: expected 4 elements, given 3");
    assert_eq!(v.matrix(3, 3, raft::Layout::RowMajor).unwrap_err().kind(), ErrorKind::Logic);
    r.release().unwrap();
    let e = v.to_host().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Logic);
    assert!(e.to_string().ends_with("the device resources on device 0 were released"), "{e}");
    assert_eq!(DeviceVec::<f32>::zeros(&r, 4).unwrap_err().kind(), ErrorKind::Logic);
}
