//! Issue 13, "sound by construction": the defects that made safe code deadlock, lose errors or
//! misreport out of memory, and the fault injections (device memory exhausted by cuBLAS handles,
//! a kernel fault on the resources' stream).
//!
//! Every test here takes [`serial`] first: cudarc keeps one error slot per device context, shared
//! by the whole process, and one test fills the device's memory on purpose, so these tests must
//! not overlap each other (other test files run in processes of their own).
use cudarc::driver::sys::CUresult;
use cudarc::driver::DriverError;
use raft::{with_device_resources, DeviceResources, ErrorKind};
use raft_tests::{require_gpu, run_scenario, Child};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long a release may take before the test calls it a deadlock.
const HANG: Duration = Duration::from_secs(20);

/// Runs the tests of this file one at a time (see the module comment). Every test takes it: run
/// 178 saw four child-process tests that did not start while `cublas-oom` held the device's
/// memory, and their children's `DeviceResources::new` fail with `CUDA_ERROR_OUT_OF_MEMORY`.
fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `body` on a helper thread and waits up to [`HANG`] for it: a deadlock fails the test
/// instead of hanging the suite (the stuck thread is left behind; the process still exits).
fn within_limit<T: Send + 'static>(what: &str, body: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(body());
    });
    match rx.recv_timeout(HANG) {
        Ok(v) => v,
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("{what}: still blocked after {HANG:?}: a deadlock"),
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("{what}: the helper thread panicked"),
    }
}

/// How a job ends the scope of its own resources.
#[derive(Debug, Clone, Copy)]
enum JobRelease {
    Explicit,
    ScopeEnd,
}

/// Defect 3 (d3ada27 deadlocked here: `Inner::release` held `releasing` while it joined the
/// worker, and the job's own release waited for `releasing`). A job queued on `r` sleeps, then
/// releases a clone of `r`, while another thread is already releasing `r`: both releases
/// return `Ok`, and `r` ends released.
fn a_job_releases_its_resources_while_another_thread_does(how: JobRelease) {
    let outcome = within_limit("a job releasing its own resources during their release", move || {
        let r = DeviceResources::new().unwrap();
        let inner = r.clone();
        let (started_tx, started_rx) = mpsc::channel();
        let job = r
            .spawn(move || {
                started_tx.send(()).unwrap();
                std::thread::sleep(Duration::from_millis(300));
                // The release of the test thread began during the sleep: it waits for this job.
                let saw_release_in_progress = inner.is_released();
                let released = match how {
                    JobRelease::Explicit => inner.release(),
                    JobRelease::ScopeEnd => {
                        with_device_resources(inner, |_| ());
                        Ok(())
                    }
                };
                (saw_release_in_progress, released)
            })
            .unwrap();
        started_rx.recv().unwrap();
        let outer = r.release();
        let job = job.join();
        (outer, job, r.is_released(), r.stream().map(|_| ()))
    });
    let (outer, job, released, stream) = outcome;
    assert_eq!(outer, Ok(()), "{how:?}: the release of the test thread");
    let (saw_release_in_progress, inner) = job.expect("the job ran to its end");
    assert!(saw_release_in_progress, "{how:?}: the job's release overlapped the other thread's, as this test means");
    assert_eq!(inner, Ok(()), "{how:?}: the job's own release");
    assert!(released, "{how:?}");
    assert_eq!(stream.unwrap_err().kind(), ErrorKind::Logic, "{how:?}: the stream is gone");
}

#[test]
fn a_job_releasing_its_own_resources_while_another_thread_releases_them_does_not_deadlock() {
    require_gpu!();
    let _serial = serial();
    a_job_releases_its_resources_while_another_thread_does(JobRelease::Explicit);
}

#[test]
fn a_job_ending_a_scope_of_its_own_resources_while_another_thread_releases_them_does_not_deadlock() {
    require_gpu!();
    let _serial = serial();
    a_job_releases_its_resources_while_another_thread_does(JobRelease::ScopeEnd);
}

/// A second `release()` from a thread that is not the worker returns only once the first has
/// finished: after it returns, the queued job has ended and the stream is gone. (Returning at
/// once would let a caller believe the GPU memory and the stream are free while they are not.)
#[test]
fn a_second_release_from_another_thread_waits_for_the_first_to_finish() {
    require_gpu!();
    let _serial = serial();
    let r = DeviceResources::new().unwrap();
    let job_done = Arc::new(AtomicBool::new(false));
    let (started_tx, started_rx) = mpsc::channel();
    let done = job_done.clone();
    let job = r
        .spawn(move || {
            started_tx.send(()).unwrap();
            std::thread::sleep(Duration::from_millis(300));
            done.store(true, Ordering::SeqCst);
        })
        .unwrap();
    started_rx.recv_timeout(HANG).expect("the job started");
    let first = {
        let r = r.clone();
        std::thread::spawn(move || r.release())
    };
    // The first release has begun (it marks the resources released first, then waits for the job).
    let deadline = Instant::now() + HANG;
    while !r.is_released() {
        assert!(Instant::now() < deadline, "the first release never began");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(!job_done.load(Ordering::SeqCst), "the job still sleeps: the first release is still waiting for it");
    let (second, job_was_done, stream) = {
        let r = r.clone();
        let job_done = job_done.clone();
        within_limit("the second release", move || {
            let second = r.release();
            (second, job_done.load(Ordering::SeqCst), r.stream().map(|_| ()))
        })
    };
    assert_eq!(second, Ok(()));
    assert!(job_was_done, "the second release returned before the first had waited for the job");
    let e = stream.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Logic, "the stream was destroyed before the second release returned: {e}");
    assert_eq!(within_limit("the first release", move || first.join().unwrap()), Ok(()));
    job.join().unwrap();
    assert!(r.is_released());
}

/// Defect 4: cudarc records a failure met while destroying the stream in the device's shared
/// `CudaContext`. The release that met it must return it, and leave nothing for the next,
/// unrelated call (on d3ada27, `release()` returned `Ok` and the next `DeviceResources::new()`
/// failed with the recorded error).
#[test]
fn an_error_recorded_during_a_release_is_returned_by_it_and_not_left_for_the_next_new() {
    require_gpu!();
    let _serial = serial();
    // Releases queued by earlier drops could take the recorded error before `release` does.
    let deadline = Instant::now() + HANG;
    while raft::exit::releases_in_flight() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    let r = DeviceResources::new().unwrap();
    // What cudarc does when one of its `Drop`s fails (here by hand: a failure cannot be provoked).
    r.context().record_err::<()>(Err(DriverError(CUresult::CUDA_ERROR_INVALID_VALUE)));
    let e = r.release().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Cuda, "{e}");
    assert_eq!(e.who(), "DeviceResources::release", "{e}");
    assert!(e.message().contains("CUDA_ERROR_INVALID_VALUE"), "the error names what cudarc recorded: {e}");
    assert!(r.is_released(), "released all the same");
    assert_eq!(r.context().check_err(), Ok(()), "nothing is left in the device's context");
    let next = DeviceResources::new().expect("the next, unrelated resources are not failed by the earlier error");
    next.sync().unwrap();
    next.release().unwrap();
}

/// The value of a child's `MESSAGE key=…` line: an error's full `Display`, spaces and all.
fn message(c: &Child, key: &str) -> String {
    let prefix = format!("MESSAGE {key}=");
    c.stdout.lines().find_map(|l| l.strip_prefix(&prefix)).map(str::to_string).unwrap_or_default()
}

/// Defect 7 and the fault injection "exhaust device memory with cuBLAS handles" (child scenario
/// `cublas-oom`): most of the device's memory is taken by one array, then resources take cuBLAS
/// handles (about 65 MiB of device memory each) until one fails. That failure is
/// `OutOfMemory` (d3ada27 reported `Cuda` for `CUBLAS_STATUS_ALLOC_FAILED`); once everything is
/// released, new resources take a handle and multiply matrices again.
#[test]
fn exhausting_device_memory_with_cublas_handles_is_out_of_memory_and_recoverable() {
    require_gpu!();
    let _serial = serial();
    let c = run_scenario!("cublas-oom", &[], Duration::from_secs(300));
    c.assert_code(0);
    let context = format!("stdout:\n{}\nstderr:\n{}", c.stdout, c.stderr);
    assert_eq!(c.result("kind").as_deref(), Some("out-of-memory"), "the failure: {}\n{context}", message(&c, "oom"));
    assert_ne!(c.result("handles").as_deref(), Some("0"), "the failure came after some handles were made\n{context}");
    assert_eq!(c.result("release_errors").as_deref(), Some("0"), "{context}");
    assert_eq!(c.result("recovered").as_deref(), Some("yes"), "after the release: {}\n{context}", message(&c, "recovery"));
}

/// Whether an error text names the illegal-address fault (the driver's or the runtime's name).
fn names_the_fault(text: &str) -> bool {
    text.contains("CUDA_ERROR_ILLEGAL_ADDRESS") || text.contains("cudaErrorIllegalAddress")
}

/// Fault injection "kernel fault" (child scenario `kernel-fault`): a kernel stores through a null
/// pointer on the resources' stream. Every later call (`sync`, `DeviceVec::zeros`,
/// `DeviceVec::from_host`, `release`, `DeviceResources::new`) returns a `Cuda` error naming the
/// fault, under the API the user called; nothing panics or hangs, and the process ends with the
/// status its `main` returned (7), not a signal.
///
/// What a user can and cannot recover after such a fault: the fault is *sticky*. It corrupts the
/// device's CUDA context for the rest of the process, so nothing on that device can be used again
/// in this process: not these resources, not other resources of the device, not new ones, not
/// allocations or copies. What stays is the error itself (its kind and the fault's name, to log
/// or report) and the process's host state; the library still lets `main` return and the process
/// exit with its own status. The only recovery is to exit and start a new process (a supervisor's
/// restart, a job retry).
#[test]
fn a_kernel_fault_makes_every_later_call_a_cuda_error_and_the_process_exits_with_its_own_status() {
    require_gpu!();
    let _serial = serial();
    // Killed (a hang) only well past the bound asserted below, so that the bound can fail on
    // its own (it was 30 s under a 30 s kill: it could not).
    let c = run_scenario!("kernel-fault", &[], Duration::from_secs(60));
    let context = format!("stdout:\n{}\nstderr:\n{}", c.stdout, c.stderr);
    assert_eq!(c.signal, None, "ended by a signal\n{context}");
    c.assert_code(7);
    // CUDA's start, the fault and six calls that fail at once, and an exit that skips nothing
    // it waits for: seconds, not tens of them.
    assert!(c.elapsed < Duration::from_secs(10), "the faulted process took {:?} to end\n{context}", c.elapsed);
    assert!(!c.stderr.contains("panicked"), "no panic\n{context}");
    assert_eq!(c.result("launch").as_deref(), Some("ok"), "the faulting kernel was queued: {}\n{context}", message(&c, "launch"));
    for (key, who) in [
        ("sync", "DeviceResources::sync"),
        ("zeros", "DeviceVec::zeros"),
        ("from_host", "DeviceVec::from_host"),
        ("release", "DeviceResources::release"),
        ("new", "DeviceResources::new"),
    ] {
        let text = message(&c, key);
        assert_eq!(c.result(key).as_deref(), Some("cuda"), "{key}: {text}\n{context}");
        assert_eq!(c.result(&format!("{key}_who")).as_deref(), Some(who), "{key}: {text}");
        assert!(names_the_fault(&text), "{key} names the fault: {text}");
    }
    assert_eq!(c.result("released").as_deref(), Some("true"), "a failed release still releases\n{context}");
}

/// Audit finding 4b (issue 33): a job of `a` releasing `b` while a job of `b` releases `a`. Each
/// release waited for the other's worker, forever (the child hung until killed). Now the second
/// sees the circle and leaves the rest of its release to the worker it would have waited for.
#[test]
fn two_jobs_releasing_each_other_s_resources_both_return() {
    require_gpu!();
    let _serial = serial();
    let c = run_scenario!("jobs-release-each-other", &[], Duration::from_secs(60));
    c.assert_code(0);
    assert_eq!(c.result("release_a").as_deref(), Some("true"), "{c:?}");
    assert_eq!(c.result("release_b").as_deref(), Some("true"), "{c:?}");
    assert_eq!(c.result("released_a").as_deref(), Some("true"), "{c:?}");
    assert_eq!(c.result("released_b").as_deref(), Some("true"), "{c:?}");
}

/// Two jobs joining each other: the second join is refused with `Logic` (before: both waited
/// forever and the child reported a timeout), so its job ends and the first join returns.
#[test]
fn two_jobs_joining_each_other_refuse_the_second_join() {
    require_gpu!();
    let _serial = serial();
    let c = run_scenario!("jobs-join-each-other", &[], Duration::from_secs(60));
    c.assert_code(0);
    assert_eq!(c.result("outcome").as_deref(), Some("done"), "{c:?}");
    let outcomes = [c.result("a").unwrap_or_default(), c.result("b").unwrap_or_default()];
    let refused = outcomes.iter().filter(|o| o.starts_with("Logic:") && o.contains("never_end")).count();
    let joined = outcomes.iter().filter(|o| o.as_str() == "ok:()").count();
    assert_eq!((refused, joined), (1, 1), "one join refused, the other returned: {outcomes:?}\n{c:?}");
}

/// A job of `a` releasing `b` while a job of `b` joins that job of `a`: neither waits forever.
#[test]
fn a_release_and_a_join_waiting_for_each_other_both_end() {
    require_gpu!();
    let _serial = serial();
    let c = run_scenario!("release-and-join-cross", &[], Duration::from_secs(60));
    c.assert_code(0);
    assert_eq!(c.result("outcome").as_deref(), Some("done"), "{c:?}");
    assert_eq!(c.result("a").as_deref(), Some("ok:()"), "{c:?}");
    let b = c.result("b").unwrap_or_default();
    assert!(b == "ok:()" || (b.starts_with("Logic:") && b.contains("never_end")), "{b}\n{c:?}");
    assert_eq!(c.result("b_released").as_deref(), Some("true"), "{c:?}");
}

/// The sixteenth session's audit, 1a: a job releasing its own resources while the thread that
/// spawned it holds a lend of them and joins it. Before: the release waited for the lend, the
/// lend for the join, the join for the job, and the child hung until killed. Now the release
/// returns, the rest of it finishes once the lend ends, and a second release waits for that.
#[test]
fn a_job_releasing_its_resources_while_a_lend_of_them_joins_it_ends() {
    require_gpu!();
    let _serial = serial();
    let c = run_scenario!("job-releases-while-a-lend-joins-it", &[], Duration::from_secs(60));
    c.assert_code(0);
    assert_eq!(c.result("joined").as_deref(), Some("ok:()"), "{c:?}");
    assert_eq!(c.result("second").as_deref(), Some("ok:()"), "{c:?}");
    assert_eq!(c.result("released").as_deref(), Some("true"), "{c:?}");
    // A result's value ends at its first space: the message is checked in the whole output.
    assert_eq!(c.result("sync").as_deref(), Some("Logic:DeviceResources::sync:"), "{c:?}");
    assert!(c.stdout.contains("sync: the device resources on device 0 were released"), "{c:?}");
}

/// The audit's 1b: inside a lend, a helper thread's use of the same resources while a release
/// on a third thread waits for the lend. Before: std's `RwLock` queued the helper's read behind
/// the release's write, the lend waited for the helper, and the child hung. Now the release
/// polls instead of queueing and refuses uses begun after it: the helper gets `Logic`
/// (released), the lend ends, and so does the release.
#[test]
fn a_use_inside_a_lend_is_not_held_behind_a_release_waiting_for_that_lend() {
    require_gpu!();
    let _serial = serial();
    let c = run_scenario!("use-inside-a-lend-behind-a-release", &[], Duration::from_secs(60));
    c.assert_code(0);
    assert_eq!(c.result("used").as_deref(), Some("Logic:DeviceResources::sync:"), "{c:?}");
    assert!(c.stdout.contains("sync: the device resources on device 0 were released"), "{c:?}");
    assert_eq!(c.result("release").as_deref(), Some("ok:()"), "{c:?}");
    assert_eq!(c.result("released").as_deref(), Some("true"), "{c:?}");
}

/// The audit's 2 and 3: main returns while a lend on one thread never ends and a release on
/// another waits for it. Before: the exit teardown waited for that release for ever (the child
/// hung until killed). Now it waits a bounded time and, since a thread is still inside the
/// lend (possibly in RAFT's or cuVS's code), ends the process with main's status without the
/// C++ static destructors.
#[test]
fn an_exit_with_a_release_waiting_for_an_endless_lend_ends_without_the_destructors() {
    require_gpu!();
    let _serial = serial();
    let c = run_scenario!("release-behind-a-lend-at-exit", &[], Duration::from_secs(60));
    c.assert_code(0);
    assert!(c.result("main_end_ms").is_some(), "{c:?}");
    assert!(c.stderr.contains("without the static destructors"), "the exit ended the process itself\n{c:?}");
    assert!(c.elapsed < Duration::from_secs(20), "the exit took {:?}\n{c:?}", c.elapsed);
}

/// The review of the seventh audit's fixes, 1: a release handed to a thread of its own (a job
/// of other resources releases `r` a second time while the first release waits for a lend)
/// must not make the first releaser's later join of that job a refused circle.
#[test]
fn a_release_finished_elsewhere_leaves_a_later_join_of_the_second_releaser_free() {
    require_gpu!();
    let _serial = serial();
    let c = run_scenario!("release-handed-off-then-join", &[], Duration::from_secs(60));
    c.assert_code(0);
    assert_eq!(c.result("first").as_deref(), Some("ok:()"), "{c:?}");
    assert_eq!(c.result("joined").as_deref(), Some("ok:()"), "the job's second release returned and its join was not refused\n{c:?}");
    assert_eq!(c.result("again").as_deref(), Some("ok:()"), "{c:?}");
    assert_eq!(c.result("released").as_deref(), Some("true"), "{c:?}");
}

/// The review's 2: a second release inside a lend's join, while a first release waits for that
/// lend, returns rather than waiting for the first: everything ends.
#[test]
fn a_second_release_that_a_lend_waits_for_does_not_wait_for_the_first() {
    require_gpu!();
    let _serial = serial();
    let c = run_scenario!("second-release-inside-a-lend-join", &[], Duration::from_secs(60));
    c.assert_code(0);
    assert_eq!(c.result("second").as_deref(), Some("ok:()"), "{c:?}");
    assert_eq!(c.result("first").as_deref(), Some("ok:()"), "{c:?}");
    assert_eq!(c.result("released").as_deref(), Some("true"), "{c:?}");
}

/// The eighth round: two threads, each inside a lend of one resources object, release the
/// other's. Before: each release polled for the other's lend for ever (the child hung). Now the
/// second to poll sees the circle and leaves its rest to a thread of its own: both return, the
/// lends end, and both objects are released.
#[test]
fn two_releases_crossing_inside_lends_both_end() {
    require_gpu!();
    let _serial = serial();
    let c = run_scenario!("releases-cross-inside-lends", &[], Duration::from_secs(60));
    c.assert_code(0);
    assert_eq!(c.result("a").as_deref(), Some("ok:()"), "{c:?}");
    assert_eq!(c.result("b").as_deref(), Some("ok:()"), "{c:?}");
    for k in ["again1", "again2"] {
        assert_eq!(c.result(k).as_deref(), Some("ok:()"), "{k}\n{c:?}");
    }
    assert_eq!(c.result("released1").as_deref(), Some("true"), "{c:?}");
    assert_eq!(c.result("released2").as_deref(), Some("true"), "{c:?}");
}

/// The same cross with exclusive lends: one of the two is refused (`Logic`) rather than both
/// polling for ever, and the other then runs.
#[test]
fn two_exclusive_lends_crossing_inside_lends_end_with_one_refused() {
    require_gpu!();
    let _serial = serial();
    let c = run_scenario!("exclusive-lends-cross-inside-lends", &[], Duration::from_secs(60));
    c.assert_code(0);
    let (a, b) = (c.result("a").unwrap_or_default(), c.result("b").unwrap_or_default());
    let refused = |s: &str| s.starts_with("Logic:DeviceResources::with_raft_resources_mut");
    assert!(
        (a == "ok:()" && refused(&b)) || (b == "ok:()" && refused(&a)),
        "exactly one exclusive lend ran, the other was refused: a={a} b={b}\n{c:?}"
    );
    assert!(c.stdout.contains("waits for this one"), "the refusal says why\n{c:?}");
}

/// A release and an exclusive lend crossing: both end, whichever gives way.
#[test]
fn a_release_and_an_exclusive_lend_crossing_inside_lends_both_end() {
    require_gpu!();
    let _serial = serial();
    let c = run_scenario!("release-and-exclusive-cross-inside-lends", &[], Duration::from_secs(60));
    c.assert_code(0);
    assert_eq!(c.result("a").as_deref(), Some("ok:()"), "the release returns either way\n{c:?}");
    let b = c.result("b").unwrap_or_default();
    assert!(b == "ok:()" || b.starts_with("Logic:DeviceResources::with_raft_resources_mut"), "b={b}\n{c:?}");
    assert_eq!(c.result("released1").as_deref(), Some("true"), "{c:?}");
}

/// The eighth audit: RAFT's and cuVS's allocations (an index's graph, a lent `raft::resources`'s
/// workspace) hold a reference into RMM's map entry, whose object `set_per_device_resource`
/// replaces in place: an index freed after a replacement freed through the new resource (or an
/// object of another type). Before: the replacement was accepted beside a lend's resources. Now
/// it is refused (`Logic`) until those resources are released.
#[test]
fn the_current_resource_is_not_replaced_while_resources_lent_to_raft_are_alive() {
    require_gpu!();
    let _serial = serial();
    let c = run_scenario!("set-current-beside-a-lend", &[], Duration::from_secs(60));
    c.assert_code(0);
    assert_eq!(c.result("refused").as_deref(), Some("Logic:raft::memory::set_current:"), "{c:?}");
    assert!(c.stdout.contains("were lent to RAFT or cuVS"), "the refusal says why\n{c:?}");
    assert_eq!(c.result("reinit").as_deref(), Some("Logic:raft::memory::reinitialize:"), "{c:?}");
    assert_eq!(c.result("again").as_deref(), Some("ok:()"), "allowed once the lent resources are released\n{c:?}");
}

/// The review of the eighth round, M1: an exclusive lend in a job that a lend of the same
/// resources joins. Before: the exclusive lend polled for ever, and the join with it (the child
/// was killed). Now it is refused (`Logic`) once it sees the join, and everything ends.
#[test]
fn an_exclusive_lend_that_a_lend_of_its_resources_joins_is_refused() {
    require_gpu!();
    let _serial = serial();
    let c = run_scenario!("exclusive-lend-in-a-job-joined-inside-a-lend", &[], Duration::from_secs(60));
    c.assert_code(0);
    let got = c.result("exclusive").unwrap_or_default();
    assert!(got.starts_with("Logic:DeviceResources::with_raft_resources_mut"), "{got}\n{c:?}");
    assert!(c.stdout.contains("waits for this one"), "the refusal says why\n{c:?}");
}

/// The fourteenth audit: inside an exclusive lend, a job of the same resources that uses them
/// (`sync`; `release`) is joined. The job's use waited in the read lock behind the lend's write
/// lock, unseen by the wait records, while the lend waited for the job: both for ever (the
/// child was killed). Now the use polls and is refused (`Logic`, "waits for this one") once it
/// sees the join; a release is handed on and done once the lend ends.
#[test]
fn a_use_in_a_job_joined_inside_an_exclusive_lend_is_refused_and_everything_ends() {
    require_gpu!();
    let _serial = serial();
    let c = run_scenario!("a-use-in-a-job-joined-inside-an-exclusive-lend", &[], Duration::from_secs(60));
    c.assert_code(0);
    let used = c.result("used").unwrap_or_default();
    assert!(used.starts_with("Logic:DeviceResources::sync"), "used={used}\n{c:?}");
    assert!(c.stdout.contains("waits for this one"), "the refusal says why\n{c:?}");
    assert_eq!(c.result("again").as_deref(), Some("ok:()"), "{c:?}");
    let c = run_scenario!("a-use-in-a-job-joined-inside-an-exclusive-lend", &[("RELEASE", "1")], Duration::from_secs(60));
    c.assert_code(0);
    let used = c.result("used").unwrap_or_default();
    assert!(used == "ok:()" || used.starts_with("Logic:DeviceResources::release"), "used={used}\n{c:?}");
    assert_eq!(c.result("again").as_deref(), Some("ok:()"), "{c:?}");
    assert_eq!(c.result("released").as_deref(), Some("true"), "{c:?}");
    // The review of the fix: behind a lend on another thread that waits for nothing here, the
    // job's use waits for the lend's end (about 300 ms) and succeeds, though this thread joins
    // it (the first version refused it: it asked whether any thread awaited the job's).
    let c = run_scenario!("a-use-in-a-job-joined-inside-an-exclusive-lend", &[("ELSEWHERE", "1")], Duration::from_secs(60));
    c.assert_code(0);
    assert_eq!(c.result("used").as_deref(), Some("ok:()"), "{c:?}");
    assert_eq!(c.result("lend").as_deref(), Some("ok:()"), "{c:?}");
}

/// The review's M2: an exclusive lend that releases other resources while a lend of those waits
/// for the first resources' read lock. Before: both waited for ever. Now both end; the release
/// returns `Ok` either way and the released resources are released.
#[test]
fn an_exclusive_lend_releasing_what_a_waiting_use_lends_ends() {
    require_gpu!();
    let _serial = serial();
    let c = run_scenario!("exclusive-lend-releasing-beside-a-plain-use", &[], Duration::from_secs(60));
    c.assert_code(0);
    assert_eq!(c.result("release").as_deref(), Some("ok:()"), "{c:?}");
    let sync = c.result("sync").unwrap_or_default();
    assert!(sync == "ok:()" || sync.starts_with("Logic:DeviceResources::sync"), "sync={sync}\n{c:?}");
    assert_eq!(c.result("again").as_deref(), Some("ok:()"), "{c:?}");
    assert_eq!(c.result("released").as_deref(), Some("true"), "{c:?}");
}

/// The fourteenth audit (child scenario `stored-error-unregister`): an error code stored in the
/// library's context object (safe code can store one: `res.context().record_err(..)`; cudarc's
/// own drops store theirs there) was returned by the library's next bind of the object, as if
/// that call had failed. Stored inside a `RegisteredSlice::scope`, `CUDA_ERROR_ILLEGAL_ADDRESS`
/// read as "the context is dead" and the unregistration skipped the driver: the slice came back
/// page-locked to safe code (a later copy from it would run truly asynchronously, past the
/// slice's end of life), and registering it again failed as already page-locked;
/// `CUDA_ERROR_INVALID_VALUE` stopped the process. Now the library binds through the driver
/// alone: both scopes succeed, and the stored code stays for cudarc's next call to report.
#[test]
fn an_error_stored_in_the_context_object_neither_skips_an_unregistration_nor_stops_the_process() {
    require_gpu!();
    let _serial = serial();
    for stored in ["illegal-address", "invalid-value"] {
        let c = run_scenario!("stored-error-unregister", &[("STORED_ERROR", stored)], Duration::from_secs(60));
        let context = format!("{stored}\nstdout:\n{}\nstderr:\n{}", c.stdout, c.stderr);
        assert_eq!(c.signal, None, "ended by a signal\n{context}");
        c.assert_code(0);
        assert_eq!(c.result("first").as_deref(), Some("ok"), "the first scope: {}\n{context}", message(&c, "first"));
        assert_eq!(
            c.result("again").as_deref(),
            Some("ok"),
            "the slice was left page-locked: registering it again: {}\n{context}",
            message(&c, "again")
        );
    }
}

/// The fourteenth audit (child scenario `failure-callback-payload-panics`): a memory failure
/// callback that panics with a payload whose own `Drop` panics. The payload was dropped inside
/// the `extern "C"` trampoline the shim calls, where that second panic cannot unwind: the
/// process aborted. Now a caught panic's payload is forgotten: the allocation fails as out of
/// memory, as the callback's documentation promises, and the process ends normally.
#[test]
fn a_failure_callback_panicking_with_a_payload_that_panics_when_dropped_fails_the_allocation() {
    require_gpu!();
    let _serial = serial();
    let c = run_scenario!("failure-callback-payload-panics", &[], Duration::from_secs(60));
    let context = format!("stdout:\n{}\nstderr:\n{}", c.stdout, c.stderr);
    assert_eq!(c.signal, None, "ended by a signal (an abort)\n{context}");
    c.assert_code(0);
    assert_eq!(c.result("alloc").as_deref(), Some("out-of-memory"), "the allocation: {}\n{context}", message(&c, "alloc"));
}
