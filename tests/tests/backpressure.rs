//! Releases that keep up (issue 19): resources holding cuBLAS handles dropped in a tight loop on
//! several threads, far more handles made than fit on the card, never run out of memory, and
//! the releases pending stay bounded throughout; with backpressure switched off (a child
//! process), memory held only by pending releases is reclaimed before any `OutOfMemory`.
use raft::{DeviceResources, DeviceVec, ErrorKind};
use raft_tests::require_gpu;
use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What `release-bench` measured a cuBLAS handle to hold, and what the ledger counts.
const HANDLE_BYTES: u64 = 65 << 20;
/// Threads making and dropping resources.
const THREADS: usize = 8;
/// The child process's phase, when this binary runs as one.
const CHILD: &str = "RAFT_BACKPRESSURE_CHILD";

/// One GPU test of this file at a time: each fills the card, or holds most of it pending.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn say(line: String) {
    let _ = std::io::Write::write_all(&mut std::io::stderr(), format!("{line}\n").as_bytes());
}

/// Waits until nothing is pending; how long it took.
fn settle(limit: Duration) -> Duration {
    let t = Instant::now();
    loop {
        let s = raft::stats();
        if s.pending.releases == 0 && s.releases_pending == 0 {
            return t.elapsed();
        }
        assert!(t.elapsed() < limit, "releases still pending after {limit:?}: {s:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// How many handles fit on device 0's memory (its total).
fn handles_that_fit() -> u64 {
    let r = DeviceResources::new().unwrap();
    let total = r.context().total_mem().unwrap() as u64;
    total / HANDLE_BYTES
}

/// `THREADS` threads make resources, take their cuBLAS handle and drop them, until `target`
/// handles were made or `limit` passed. Returns (made, every error seen).
fn churn(target: u64, limit: Duration) -> (u64, Vec<raft::Error>) {
    let made = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(Mutex::new(Vec::new()));
    let until = Instant::now() + limit;
    let threads: Vec<_> = (0..THREADS)
        .map(|_| {
            let (made, errors) = (made.clone(), errors.clone());
            std::thread::spawn(move || {
                while made.load(Ordering::Relaxed) < target && Instant::now() < until {
                    let r = match DeviceResources::new() {
                        Ok(r) => r,
                        Err(e) => {
                            errors.lock().unwrap().push(e);
                            return;
                        }
                    };
                    if let Err(e) = r.cublas_handle() {
                        errors.lock().unwrap().push(e);
                        return;
                    }
                    made.fetch_add(1, Ordering::Relaxed);
                    drop(r); // the last handle: its release is queued, Drop never blocks
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
    let errors = std::mem::take(&mut *errors.lock().unwrap());
    (made.load(Ordering::Relaxed), errors)
}

#[test]
fn handles_dropped_faster_than_released_never_run_out_of_memory_and_stay_bounded() {
    require_gpu!();
    let _serial = serial();
    settle(Duration::from_secs(30));
    let fit = handles_that_fit();
    let target = fit * 3 / 2;
    // Sample what is pending every millisecond while the threads churn.
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let (mut bytes, mut releases, mut samples) = (0u64, 0usize, 0usize);
            while !stop.load(Ordering::Relaxed) {
                let p = raft::stats().pending;
                bytes = bytes.max(p.bytes);
                releases = releases.max(p.releases);
                samples += 1;
                std::thread::sleep(Duration::from_millis(1));
            }
            (bytes, releases, samples)
        })
    };
    let before = raft::stats();
    let t = Instant::now();
    let (made, errors) = churn(target, Duration::from_secs(50));
    let took = t.elapsed();
    stop.store(true, Ordering::Relaxed);
    let (most_bytes, most_releases, samples) = sampler.join().unwrap();
    let drain = settle(Duration::from_secs(30));
    let after = raft::stats();
    say(format!(
        "BACKPRESSURE {made} cuBLAS handles made and dropped on {THREADS} threads in {took:.2?} ({fit} fit on the card); \
         at most {most_releases} releases / {} MiB pending over {samples} samples (limits {} / {} MiB); \
         {} releases run by the making threads; drained {drain:.3?} after the load stopped; errors: {errors:?}",
        most_bytes >> 20,
        after.pending_releases_limit,
        after.pending_bytes_limit >> 20,
        after.releases_helped - before.releases_helped,
    ));
    let oom = errors.iter().filter(|e| e.kind() == ErrorKind::OutOfMemory).count();
    assert_eq!(oom, 0, "no OutOfMemory while the memory was only pending release: {errors:?}");
    assert!(errors.is_empty(), "{errors:?}");
    // The target is 1.5x the card; the hard line is the card itself (a release path too slow
    // for the target within the time shows in the line printed above).
    assert!(made > fit, "more handles than fit on the card were made: {made} in {took:?} ({fit} fit, target {target})");
    // Each making thread may queue one release after its last look at the ledger.
    let slack = 2 * THREADS;
    assert!(
        most_bytes <= after.pending_bytes_limit + slack as u64 * HANDLE_BYTES,
        "pending bytes bounded: at most {most_bytes} against the limit {}",
        after.pending_bytes_limit
    );
    assert!(
        most_releases <= after.pending_releases_limit + slack,
        "pending releases bounded: at most {most_releases} against the limit {}",
        after.pending_releases_limit
    );
    assert!(samples > 10, "the sampler ran: {samples} samples");
    assert_eq!(after.pending, Default::default(), "nothing pending once drained");
}

// ---- backpressure off: out of memory only after the pending releases ran -------------------

/// Runs this test binary again as a child, only `test`, with backpressure off and a single
/// release thread (which the child stalls), and returns its stderr after checking it passed.
fn child(test: &str) -> String {
    let exe = std::env::current_exe().expect("current exe");
    let mut cmd = Command::new(exe);
    cmd.args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env("RAFT_RELEASE_THREADS", "1")
        .env("RAFT_RELEASE_THREADS_MAX", "1")
        .env("RAFT_RELEASE_PENDING_MAX", "1000000000")
        .env("RAFT_RELEASE_PENDING_MIB", "1000000000")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut c = cmd.spawn().expect("spawn the child");
    let mut pipe = c.stderr.take().unwrap();
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = pipe.read_to_string(&mut s);
        s
    });
    let mut pipe = c.stdout.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = pipe.read_to_string(&mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        if let Some(s) = c.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > Duration::from_secs(120) {
            let _ = c.kill();
            let _ = c.wait();
            panic!("child {test} hung:\n{}\n{}", out.join().unwrap(), err.join().unwrap());
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let (out, err) = (out.join().unwrap(), err.join().unwrap());
    say(format!("child {test}:\n{err}"));
    assert!(status.success(), "child {test} failed ({status:?}):\n{out}\n{err}");
    assert!(out.contains("1 passed"), "the child ran its test:\n{out}");
    err
}

/// While set, the release thread is held in a release (see `stall_the_release_thread`).
static STALLED: AtomicBool = AtomicBool::new(false);

extern "C" fn stall(_: *mut std::ffi::c_void) {
    while STALLED.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Holds the one release thread in a release until `STALLED` is cleared: resources whose
/// stream runs a host function waiting for it are dropped, and their release waits for their
/// stream. Every later release then runs only if a making thread runs it. Returns once the
/// release thread has taken the stalled one.
fn stall_the_release_thread() {
    STALLED.store(true, Ordering::Release);
    let r = DeviceResources::new().unwrap();
    let stream = r.stream().unwrap();
    // SAFETY: `stall` touches no CUDA state; the stream is alive (held by `stream`).
    let rc = unsafe { cudarc::driver::sys::cuLaunchHostFunc(stream.cu_stream(), Some(stall), std::ptr::null_mut()) };
    assert_eq!(rc, cudarc::driver::sys::CUresult::CUDA_SUCCESS);
    drop(stream);
    drop(r);
    let t = Instant::now();
    while raft::stats().pending.queued > 0 {
        assert!(t.elapsed() < Duration::from_secs(5), "the release thread took the stalled release");
        std::thread::sleep(Duration::from_micros(100));
    }
}

#[test]
#[ignore = "deadlocks by construction (GPU run 20): the stall is a host function spinning on a stream, and cublasDestroy, run by the making thread, synchronises the whole device, so it waits for that stall; needs a stall that does not occupy the device"]
fn without_backpressure_handle_creation_waits_for_the_pending_releases_before_any_out_of_memory() {
    require_gpu!();
    if std::env::var_os(CHILD).is_none() {
        let _serial = serial();
        let err = child("without_backpressure_handle_creation_waits_for_the_pending_releases_before_any_out_of_memory");
        assert!(err.contains("OOM-CHILD handles"), "{err}");
        return;
    }
    // The child: one release thread, held in a release throughout, and no backpressure: the
    // card fills with handles only waiting to be released, which only the making threads can
    // release, when their handle creation runs out of memory.
    let fit = handles_that_fit();
    stall_the_release_thread();
    let before = raft::stats();
    let t = Instant::now();
    let (made, errors) = churn(fit * 3 / 2, Duration::from_secs(45));
    let after = raft::stats();
    STALLED.store(false, Ordering::Release);
    say(format!(
        "OOM-CHILD handles: {made} made in {:.2?} ({fit} fit); {} releases run by the making threads; errors: {errors:?}",
        t.elapsed(),
        after.releases_helped - before.releases_helped
    ));
    assert!(errors.is_empty(), "no error, OutOfMemory least of all, while memory was only pending release: {errors:?}");
    assert!(made > fit, "more handles made than fit on the card: {made} of {fit}");
    assert!(after.releases_helped > before.releases_helped, "the making threads ran pending releases when memory ran out");
    settle(Duration::from_secs(30));
}

#[test]
#[ignore = "deadlocks by construction (GPU run 20): the stall is a host function spinning on a stream, and cublasDestroy, run by the making thread, synchronises the whole device, so it waits for that stall; needs a stall that does not occupy the device"]
fn without_backpressure_an_allocation_waits_for_the_pending_releases_before_any_out_of_memory() {
    require_gpu!();
    if std::env::var_os(CHILD).is_none() {
        let _serial = serial();
        let err = child("without_backpressure_an_allocation_waits_for_the_pending_releases_before_any_out_of_memory");
        assert!(err.contains("OOM-CHILD array"), "{err}");
        return;
    }
    // The child: the release thread stalled, then handles filling about 60% of the free memory
    // dropped (pending), then an allocation that fits only once a third of them are freed.
    let r = DeviceResources::new().unwrap();
    let ctx = r.context().clone();
    let (free, _) = ctx.mem_get_info().unwrap();
    let n = (free as u64 * 6 / 10 / HANDLE_BYTES) as usize;
    stall_the_release_thread();
    let held: Vec<_> = (0..n)
        .map(|_| {
            let h = DeviceResources::new().unwrap();
            h.cublas_handle().unwrap();
            h
        })
        .collect();
    drop(held);
    let pending = raft::stats().pending;
    let (free_now, _) = ctx.mem_get_info().unwrap();
    let want = free_now + (pending.bytes / 3) as usize;
    let t = Instant::now();
    let got = DeviceVec::<u8>::new(&r, want);
    STALLED.store(false, Ordering::Release);
    say(format!(
        "OOM-CHILD array: {n} handles pending ({} MiB), {} MiB free, {} MiB asked: {:?} after {:.2?}",
        pending.bytes >> 20,
        free_now >> 20,
        want >> 20,
        got.as_ref().map(|_| "allocated"),
        t.elapsed()
    ));
    assert!(pending.handles * 2 > n, "most handles were still pending when the allocation ran: {pending:?}");
    let v = got.expect("allocated once the pending releases had run, not OutOfMemory");
    drop(v);
    settle(Duration::from_secs(30));
}
