//! Seed 2.2.4 "Errors": dispatching on the kind, recovering `who` from the message, the
//! out-of-memory kind with the process carrying on, `who` naming the API the user called, and
//! texts that say in words what failed.
use raft::{current_device_resources, DeviceResources, DeviceVec, Error, ErrorKind, Reason};
use raft_tests::OutputWithin;
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

/// Issue 34, item 5: each reason a program acts on, reached by a real failing call. Without a
/// driver (CI): the CUDA runtime's code 35 as `NoDriver`, on every constructor; with a GPU: a
/// device that does not exist, a bad size and released resources (`InvalidArgument`,
/// `Released`), out of memory. On both: a bad value refused before any native call.
#[test]
fn each_reason_is_reached_by_a_real_failing_call() {
    let bad_wait: Error = raft::exit::with_exit_wait(-1.0, || ()).unwrap_err().into();
    assert_eq!((bad_wait.kind(), bad_wait.reason()), (ErrorKind::Logic, Reason::InvalidArgument), "{bad_wait}");
    let bad_size = raft::RmmOptions::from_vars(|name| (name == "RAFT_RMM_POOL_SIZE").then(|| "lots".to_string())).unwrap_err();
    assert_eq!(bad_size.reason(), Reason::InvalidArgument, "{bad_size}");
    match raft::device_count() {
        Err(e) => {
            for e in [
                e,
                DeviceResources::new().map(drop).unwrap_err(),
                DeviceResources::on_device(5).map(drop).unwrap_err(),
                raft::memory::current(0).map(drop).unwrap_err(),
            ] {
                assert_eq!((e.kind(), e.reason(), e.cuda_code()), (ErrorKind::Cuda, Reason::NoDriver, Some(35)), "{e}");
                assert_eq!(e.nccl_code(), None);
            }
        }
        Ok(n) => {
            let _serial = serial();
            let absent = DeviceResources::on_device(n).map(drop).unwrap_err();
            assert_eq!((absent.kind(), absent.reason(), absent.cuda_code()), (ErrorKind::Logic, Reason::InvalidArgument, None));
            let r = DeviceResources::new().unwrap();
            let too_big = DeviceVec::<f64>::new(&r, usize::MAX).map(drop).unwrap_err();
            assert_eq!((too_big.kind(), too_big.reason()), (ErrorKind::Logic, Reason::InvalidArgument), "{too_big}");
            let oom = DeviceVec::<u8>::new(&r, 1 << 50).map(drop).unwrap_err();
            assert_eq!((oom.kind(), oom.reason()), (ErrorKind::OutOfMemory, Reason::OutOfMemory), "{oom}");
            r.release().unwrap();
            for e in [r.sync().unwrap_err(), DeviceVec::<f32>::zeros(&r, 4).map(drop).unwrap_err()] {
                assert_eq!((e.kind(), e.reason()), (ErrorKind::Logic, Reason::Released), "{e}");
            }
        }
    }
}

/// A shim that is not there is `Cuda` / `LibraryMissing` with the loader's error as the source,
/// as a missing libnccl (raft-comms' `a_missing_shim_is_a_cuda_error_naming_the_variable`) or
/// libcuvs (raft-cuvs' `without_libcuvs_the_first_call_is_a_clear_error`) is. A child process:
/// the shim is loaded once per process.
#[test]
fn a_missing_shim_is_a_missing_library() {
    const CHILD: &str = "RAFT_TEST_MISSING_SHIM_CHILD";
    const MISSING: &str = "/nonexistent/raft/libraftrs_shim.so";
    if std::env::var_os(CHILD).is_some() {
        for e in [raft::device_count().unwrap_err(), DeviceResources::new().map(drop).unwrap_err(), raft::runtime_version().unwrap_err()] {
            assert_eq!((e.kind(), e.reason(), e.cuda_code()), (ErrorKind::Cuda, Reason::LibraryMissing, None), "{e}");
            assert!(e.message().contains(&format!("{MISSING} (absent)")), "{e}");
            let source = std::error::Error::source(&e).expect("the loader's error is the source");
            assert_eq!(source.to_string(), e.message());
        }
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "a_missing_shim_is_a_missing_library", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env("RAFT_RS_SHIM", MISSING)
        .output_within(std::time::Duration::from_secs(120));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.contains("1 passed"), "{text}");
}

/// Issue 34, item 5: a panicking job keeps its payload. `join` reports it as a `Generic` error
/// (reason `Panicked`) with the panic's text; `join_unwind` resumes the very payload on the
/// caller, so a program can downcast it or let it unwind on (before, `join` was the only way,
/// and the payload was dropped on the worker thread).
#[test]
fn a_panicking_job_keeps_its_payload_for_resume_unwind() {
    require_gpu!();
    let _serial = serial();
    #[derive(Debug, PartialEq)]
    struct Payload(&'static str, u32);
    let r = DeviceResources::new().unwrap();
    let e = r.spawn(|| -> u32 { panic!("job failed") }).unwrap().join().unwrap_err();
    assert_eq!((e.kind(), e.reason()), (ErrorKind::Generic, Reason::Panicked), "{e}");
    assert!(e.message().ends_with("panicked: job failed"), "{e}");
    let job = r.spawn(|| -> u32 { std::panic::panic_any(Payload("custom", 7)) }).unwrap();
    let payload = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job.join_unwind())).unwrap_err();
    assert_eq!(payload.downcast_ref::<Payload>(), Some(&Payload("custom", 7)));
    // The worker goes on after both.
    assert_eq!(r.spawn(|| 6 * 7).unwrap().join_unwind().unwrap(), 42);
}
