//! Seed 2.2.4 "Errors": dispatching on the kind, recovering `who` from the message, the
//! out-of-memory kind with the process carrying on, `who` naming the API the user called, and
//! texts that say in words what failed.
use raft::{current_device_resources, DeviceResources, DeviceVec, Error, ErrorKind};
use raft_tests::{require_gpu, run_scenario};
use std::time::Duration;

#[derive(Debug, PartialEq)]
enum Advice {
    Ok,
    FreeMemoryAndRetry,
    FixTheCall,
    Report,
}

/// One GPU test of this file at a time: one of them fills the card on purpose, and the others
/// (a child process among them) must not start under it.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
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
    let _serial = serial();
    assert_eq!(describe_failure(|| current_device_resources(0)), Advice::Ok);
    assert_eq!(describe_failure(|| DeviceResources::on_device(99)), Advice::FixTheCall);
    let r = DeviceResources::new().unwrap();
    assert_eq!(describe_failure(|| DeviceVec::<u8>::new(&r, 1 << 50)), Advice::FreeMemoryAndRetry);
}

#[test]
fn recovering_the_procedure_name_from_the_message() {
    require_gpu!();
    let _serial = serial();
    let finished = raft::with_device_resources(DeviceResources::new().unwrap(), |r| r.clone());
    let e = finished.sync().unwrap_err();
    let who = e.to_string().split(": ").next().unwrap().to_string();
    assert_eq!(who, "DeviceResources::sync");
    assert_eq!(who, e.who());
}

#[test]
fn out_of_memory_leaves_the_process_and_the_memory_usable() {
    require_gpu!();
    let _serial = serial();
    let r = DeviceResources::new().unwrap();
    let (free, total) = r.context().mem_get_info().unwrap();
    for bytes in [total + (1 << 30), 1usize << 50, usize::MAX / 2] {
        let e = DeviceVec::<u8>::new(&r, bytes).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::OutOfMemory, "{bytes} bytes: {e}");
        assert_eq!(e.who(), "DeviceVec::new");
        // A failed allocation leaves the device's memory to others (another process's context
        // needs some): RMM's async pool keeps what it reserved (its release threshold is
        // "never"), so runs 22, 24 and 28 saw the next child process fail to make a context.
        let (after, _) = r.context().mem_get_info().unwrap();
        eprintln!("after a failed {bytes}-byte allocation: {} MiB free of {} MiB (before: {} MiB)", after >> 20, total >> 20, free >> 20);
        assert!(after + (2 << 30) >= free, "{bytes} bytes: {} MiB free after, {} MiB before", after >> 20, free >> 20);
    }
    // A byte count that overflows is a wrong length, not memory short (issue 33).
    assert_eq!(DeviceVec::<f64>::new(&r, usize::MAX).unwrap_err().kind(), ErrorKind::Logic);
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
    let _serial = serial();
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

/// SPEC 2.2.4: `who` is the API the user called, not a helper it went through (d3ada27 named
/// `fill_zero` / `copy_from_host` for a failure inside `zeros` / `from_host`; the kernel-fault
/// scenario of soundness.rs checks that path too).
#[test]
fn array_constructors_report_themselves_as_who() {
    require_gpu!();
    let _serial = serial();
    let r = DeviceResources::new().unwrap();
    r.release().unwrap();
    let host = [1.0f32; 4];
    let outcomes = [
        ("DeviceVec::zeros", DeviceVec::<f32>::zeros(&r, 4).map(drop)),
        ("DeviceVec::from_host", DeviceVec::from_host(&r, &host).map(drop)),
        ("DeviceVec::new", DeviceVec::<f32>::new(&r, 4).map(drop)),
    ];
    for (who, outcome) in outcomes {
        let e = outcome.unwrap_err();
        assert_eq!(e.who(), who, "{e}");
        assert_eq!(e.kind(), ErrorKind::Logic, "{e}");
        assert_eq!(e.to_string(), format!("{who}: the device resources on device 0 were released"));
    }
}

/// A bad `RAFT_EXIT_WAIT` refuses the job with `who` = `DeviceResources::spawn` (not
/// `RAFT_EXIT_WAIT`), naming the variable and the value in the message; a scoped wait, or a
/// default set in code, still lets jobs be made. The variable is read once per process: a
/// child process.
#[test]
fn a_bad_raft_exit_wait_makes_spawn_fail_as_device_resources_spawn() {
    require_gpu!();
    let _serial = serial();
    let c = run_scenario!("spawn-bad-exit-wait", &[("RAFT_EXIT_WAIT", "-1")], Duration::from_secs(60));
    c.assert_code(0);
    let text = c.stdout.lines().find_map(|l| l.strip_prefix("MESSAGE spawn=")).unwrap_or_default().to_string();
    assert_eq!(c.result("spawn").as_deref(), Some("logic"), "{text}\n{}", c.stderr);
    assert_eq!(c.result("spawn_who").as_deref(), Some("DeviceResources::spawn"), "{text}");
    assert!(text.starts_with("DeviceResources::spawn: "), "{text}");
    assert!(text.contains("RAFT_EXIT_WAIT") && text.ends_with("expected a non-negative real number of seconds, given -1"), "{text}");
    assert_eq!(c.result("scoped").as_deref(), Some("ok"), "a scoped wait overrides the environment");
    assert_eq!(c.result("after_default").as_deref(), Some("ok"), "a default set in code overrides the environment");
}

/// A C expression in an error text (`cudaGetDeviceCount(&n)`): an address-of, or a name
/// directly followed by its argument list. Prose has a space before its parentheses.
fn c_expression(text: &str) -> Option<&str> {
    if let Some(at) = text.find("(&") {
        return Some(&text[text[..at].rfind(' ').map_or(0, |s| s + 1)..]);
    }
    let bytes = text.as_bytes();
    (1..bytes.len())
        .find(|&i| bytes[i] == b'(' && (bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_'))
        .map(|i| &text[text[..i].rfind(' ').map_or(0, |s| s + 1)..])
}

fn assert_plain_words(e: &Error) {
    let text = e.to_string();
    assert!(!text.contains("cudaGetDeviceCount("), "{text}");
    assert_eq!(c_expression(&text), None, "a C expression in the error text: {text}");
}

/// Error texts say in words what failed and keep the CUDA error's name, never the shim's C
/// expressions (d3ada27: `cudaGetDeviceCount(&n): cudaErrorInsufficientDriver …`). Without a
/// driver (CI) this is `device_count`'s error and the constructors that count devices first;
/// with a GPU, the errors a user meets most (a device that does not exist, released resources,
/// out of memory). A driver with no device answers `Ok(0)`: not reachable on either machine.
#[test]
fn error_texts_say_in_words_what_failed_and_keep_the_cuda_error_name() {
    assert_eq!(c_expression("counting the devices failed: cudaErrorInsufficientDriver: CUDA driver version is insufficient"), None);
    assert!(c_expression("cudaGetDeviceCount(&n): cudaErrorInsufficientDriver").is_some());
    assert!(c_expression("call='cudaStreamSynchronize(stream)'").is_some());
    match raft::device_count() {
        Err(e) => {
            assert_eq!(e.kind(), ErrorKind::Cuda, "{e}");
            assert_eq!(e.who(), "device_count", "{e}");
            assert!(e.message().contains("counting the devices failed"), "says in words what failed: {e}");
            assert!(e.message().contains("cudaErrorInsufficientDriver"), "keeps the CUDA error's name: {e}");
            assert_plain_words(&e);
            for (who, e) in [
                ("DeviceResources::new", DeviceResources::new().map(drop).unwrap_err()),
                ("DeviceResources::on_device", DeviceResources::on_device(0).map(drop).unwrap_err()),
                ("current_device_resources", current_device_resources(0).map(drop).unwrap_err()),
            ] {
                assert_eq!(e.who(), who, "{e}");
                assert!(e.message().contains("cudaErrorInsufficientDriver"), "{e}");
                assert_plain_words(&e);
            }
        }
        Ok(_) => {
            let r = DeviceResources::new().unwrap();
            let oom = DeviceVec::<u8>::new(&r, 1 << 50).map(drop).unwrap_err();
            assert_eq!(oom.kind(), ErrorKind::OutOfMemory, "{oom}");
            let absent = DeviceResources::on_device(999).map(drop).unwrap_err();
            r.release().unwrap();
            for e in [oom, absent, r.sync().unwrap_err(), r.stream().map(drop).unwrap_err()] {
                assert_plain_words(&e);
            }
        }
    }
}
