//! release-bench: where a release's time goes, and how many releases a second the library
//! keeps up with, against native destruction of the same objects in the same run (issue 19).
//!
//! The native side is Rust calling the driver and cuBLAS directly through cudarc's raw layer
//! (`cuStreamCreate`/`cuStreamSynchronize`/`cuStreamDestroy`, `cublasCreate`/`cublasSetStream`/
//! `cublasDestroy`), which is as native as C++ calling them; RAFT's object is deleted through the
//! shim's destroy entry point (a try/catch and a device scope around `delete`), and, once per run
//! for reference, through the C++ baseline (`bl_hold`/`bl_unhold`). A C++ file of its own would
//! need tests/build.rs to compile it.
//!
//! Prints a Markdown table and writes JSON to the first argument (default
//! `release-bench.json`). `release-bench --drop-child N H` is the child a drop-throughput row
//! runs with `RAFT_RELEASE_THREADS` set: it makes N resources (with a cuBLAS handle when H is
//! 1), drops them all, and prints how long the release threads took.
use raft::{DeviceResources, HandleKind};
use raft_tests::baseline::{bl_hold, bl_unhold};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use cudarc::cublas::result as blas;
use cudarc::driver::{result as cu, sys as cusys, CudaContext};

#[derive(Clone, Copy, Debug, serde::Serialize)]
struct Stat {
    median_ns: f64,
    min_ns: f64,
    max_ns: f64,
    samples: usize,
}

fn stat_of(mut v: Vec<f64>) -> Stat {
    assert!(!v.is_empty(), "no samples");
    v.sort_by(f64::total_cmp);
    Stat { median_ns: v[v.len() / 2], min_ns: v[0], max_ns: v[v.len() - 1], samples: v.len() }
}

fn fmt_ns(ns: f64) -> String {
    if ns.abs() >= 1e6 {
        format!("{:.2} ms", ns / 1e6)
    } else if ns.abs() >= 1e3 {
        format!("{:.2} µs", ns / 1e3)
    } else {
        format!("{ns:.1} ns")
    }
}

fn show(s: &Stat) -> String {
    format!("{} [{}, {}]", fmt_ns(s.median_ns), fmt_ns(s.min_ns), fmt_ns(s.max_ns))
}

/// One row: ours against native, either per call (a `Stat`, lower is better) or a rate
/// (releases per second, higher is better).
#[derive(serde::Serialize)]
struct Row {
    case: String,
    ours: String,
    ours_value: String,
    native: String,
    native_value: String,
    /// For times: ours / native. For rates: native / ours (above 1: ours is slower either way).
    slowdown: Option<f64>,
    ours_stat: Option<Stat>,
    native_stat: Option<Stat>,
    ours_per_s: Option<f64>,
    native_per_s: Option<f64>,
}

#[derive(Default)]
struct Table {
    rows: Vec<Row>,
    notes: Vec<String>,
}

impl Table {
    fn times(&mut self, case: &str, ours: &str, o: Stat, native: &str, n: Option<Stat>) {
        let slowdown = n.map(|n| o.median_ns / n.median_ns);
        eprintln!("  {case}: {} vs {}", show(&o), n.as_ref().map(show).unwrap_or_default());
        self.rows.push(Row {
            case: case.into(),
            ours: ours.into(),
            ours_value: show(&o),
            native: native.into(),
            native_value: n.as_ref().map(show).unwrap_or_else(|| "—".into()),
            slowdown,
            ours_stat: Some(o),
            native_stat: n,
            ours_per_s: None,
            native_per_s: None,
        });
    }

    fn rates(&mut self, case: &str, ours: &str, o: f64, native: &str, n: Option<f64>) {
        let slowdown = n.map(|n| n / o);
        eprintln!("  {case}: {o:.0}/s vs {}", n.map(|n| format!("{n:.0}/s")).unwrap_or_default());
        self.rows.push(Row {
            case: case.into(),
            ours: ours.into(),
            ours_value: format!("{o:.0} /s"),
            native: native.into(),
            native_value: n.map(|n| format!("{n:.0} /s")).unwrap_or_else(|| "—".into()),
            slowdown,
            ours_stat: None,
            native_stat: None,
            ours_per_s: Some(o),
            native_per_s: n,
        });
    }

    fn note(&mut self, text: String) {
        eprintln!("  note: {text}");
        self.notes.push(text);
    }
}

fn fail(message: &str) -> ! {
    eprintln!("{message}");
    std::process::exit(2)
}

/// Times `f` on each item separately.
fn each<T>(items: Vec<T>, mut f: impl FnMut(T)) -> Stat {
    stat_of(
        items
            .into_iter()
            .map(|x| {
                let t = Instant::now();
                f(x);
                t.elapsed().as_nanos() as f64
            })
            .collect(),
    )
}

/// Runs `f` on every item, spread over `threads` threads started together (each bound to
/// `ctx` first); returns the wall time from the start to the last item.
fn spread<T: Send>(ctx: &Arc<CudaContext>, items: Vec<T>, threads: usize, f: impl Fn(T) + Sync) -> Duration {
    let per = items.len().div_ceil(threads).max(1);
    let mut chunks: Vec<Vec<T>> = Vec::new();
    let mut it = items.into_iter().peekable();
    while it.peek().is_some() {
        chunks.push(it.by_ref().take(per).collect());
    }
    let barrier = Barrier::new(chunks.len() + 1);
    std::thread::scope(|s| {
        let handles: Vec<_> = chunks
            .into_iter()
            .map(|chunk| {
                let (barrier, f, ctx) = (&barrier, &f, ctx.clone());
                s.spawn(move || {
                    ctx.bind_to_thread().unwrap();
                    barrier.wait();
                    chunk.into_iter().for_each(f);
                })
            })
            .collect();
        barrier.wait();
        let t = Instant::now();
        handles.into_iter().for_each(|h| h.join().unwrap());
        t.elapsed()
    })
}

// ---- native objects: a stream, a cuBLAS handle on it, RAFT's object on it ------------------

/// A stream and (optionally) a cuBLAS handle made with the raw driver and cuBLAS calls, and
/// (optionally) RAFT's `device_resources` on the stream (made through the shim, no handle in it).
struct Native {
    stream: cusys::CUstream,
    cublas: Option<cudarc::cublas::sys::cublasHandle_t>,
    raft: Option<*mut raft_sys::raftrs_resources>,
}

// SAFETY: plain handles, each used by one thread at a time (moved, never shared).
unsafe impl Send for Native {}

fn native(api: &raft_sys::RaftrsShim, with_cublas: bool, with_raft: bool) -> Native {
    let stream = cu::stream::create(cu::stream::StreamKind::NonBlocking).unwrap();
    let cublas = with_cublas.then(|| {
        let h = blas::create_handle().unwrap();
        // SAFETY: both handles were just made and are alive.
        unsafe { blas::set_stream(h, stream as _) }.unwrap();
        h
    });
    let raft = with_raft.then(|| {
        let mut raw = std::ptr::null_mut();
        // SAFETY: the stream is alive until `destroy_native`, after RAFT's object.
        assert_eq!(unsafe { api.raftrs_resources_create(0, stream as *mut c_void, &mut raw) }, 0);
        raw
    });
    Native { stream, cublas, raft }
}

/// Native destruction, in the order the library's release runs it.
fn destroy_native(api: &raft_sys::RaftrsShim, n: Native) {
    // SAFETY: each handle is destroyed exactly once, RAFT's object and the cuBLAS handle before
    // the stream they use.
    unsafe {
        cu::stream::synchronize(n.stream).unwrap();
        if let Some(h) = n.cublas {
            blas::destroy_handle(h).unwrap();
        }
        if let Some(r) = n.raft {
            assert_eq!(api.raftrs_resources_destroy(r), 0);
        }
        cu::stream::destroy(n.stream).unwrap();
    }
}

/// Objects of ours: resources, with a cuBLAS handle when asked.
fn ours(n: usize, with_cublas: bool) -> Vec<DeviceResources> {
    (0..n)
        .map(|_| {
            let r = DeviceResources::new().unwrap();
            if with_cublas {
                r.cublas_handle().unwrap();
            }
            r
        })
        .collect()
}

/// Waits until no release is pending; the time it took.
fn settle(limit: Duration) -> Duration {
    let t = Instant::now();
    while raft::stats().pending.releases > 0 || raft::stats().releases_pending > 0 {
        if t.elapsed() > limit {
            fail(&format!("releases still pending after {limit:?}: {:?}", raft::stats()));
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    t.elapsed()
}

/// `--drop-child N H`: N resources (with cuBLAS handles when H = 1) dropped at once; prints
/// `RESULT drop_ns=… drain_ns=… run_ns=… wait_ns=… threads=…`.
fn drop_child(n: usize, with_cublas: bool) -> ! {
    let all = ours(n, with_cublas);
    settle(Duration::from_secs(60));
    let before = raft::stats();
    let t = Instant::now();
    drop(all);
    let drop_ns = t.elapsed().as_nanos();
    let drained = t.elapsed() + settle(Duration::from_secs(120));
    let after = raft::stats();
    let done = (after.releases_done - before.releases_done).max(1) as u128;
    println!(
        "RESULT drop_ns={} drain_ns={} run_ns={} wait_ns={} threads={}",
        drop_ns / n as u128,
        drained.as_nanos(),
        (after.release_time - before.release_time).as_nanos() / done,
        (after.release_wait - before.release_wait).as_nanos() / done,
        after.release_threads
    );
    std::process::exit(0)
}

struct ChildResult {
    drop_ns: f64,
    drain_ns: f64,
    run_ns: f64,
    wait_ns: f64,
}

fn run_drop_child(n: usize, with_cublas: bool, threads: usize) -> ChildResult {
    let exe = std::env::current_exe().expect("current exe");
    let out = std::process::Command::new(exe)
        .args(["--drop-child", &n.to_string(), if with_cublas { "1" } else { "0" }])
        .env("RAFT_RELEASE_THREADS", threads.to_string())
        .env("RAFT_RELEASE_THREADS_MAX", threads.to_string())
        // No backpressure: this row measures the release threads alone.
        .env("RAFT_RELEASE_PENDING_MAX", "1000000000")
        .env("RAFT_RELEASE_PENDING_MIB", "1000000000")
        .output()
        .expect("spawn the drop child");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("RESULT "))
        .unwrap_or_else(|| fail(&format!("the drop child failed ({:?}):\n{text}\n{}", out.status, String::from_utf8_lossy(&out.stderr))));
    let get = |k: &str| -> f64 {
        line.split_whitespace().find_map(|kv| kv.strip_prefix(k).and_then(|v| v.strip_prefix('='))).and_then(|v| v.parse().ok()).unwrap()
    };
    ChildResult { drop_ns: get("drop_ns"), drain_ns: get("drain_ns"), run_ns: get("run_ns"), wait_ns: get("wait_ns") }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--drop-child") {
        let n = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1000);
        drop_child(n, args.get(3).map(String::as_str) == Some("1"));
    }
    let out = args.get(1).cloned().unwrap_or_else(|| "release-bench.json".into());
    match raft::device_count() {
        Ok(n) if n > 0 => eprintln!("release-bench on {n} device(s)"),
        Ok(_) => fail("release-bench needs a GPU: no CUDA device"),
        Err(e) => fail(&format!("release-bench needs a GPU: {e}")),
    }
    let api = raft_sys::shim().unwrap_or_else(|e| fail(&e.to_string()));
    let mut t = Table::default();

    // Warm-up: libraries loaded, the context made and bound on this thread.
    let r0 = DeviceResources::new().unwrap();
    r0.cublas_handle().unwrap();
    let ctx = r0.context().clone();
    r0.release().unwrap();
    ctx.bind_to_thread().unwrap();
    destroy_native(api, native(api, true, true));

    // What each handle kind holds on the device (the ledger counts cuBLAS and both cuSOLVER
    // kinds as 65 MiB, cuSPARSE as 4 MiB).
    for (kind, name) in [
        (HandleKind::Cublas, "cuBLAS"),
        (HandleKind::CusolverDn, "cuSOLVER dense"),
        (HandleKind::CusolverSp, "cuSOLVER sparse"),
        (HandleKind::Cusparse, "cuSPARSE"),
    ] {
        const N: usize = 16;
        let all = ours(N, false);
        ctx.synchronize().unwrap();
        let (before, _) = ctx.mem_get_info().unwrap();
        for r in &all {
            r.handle(kind).unwrap();
        }
        ctx.synchronize().unwrap();
        let (after, _) = ctx.mem_get_info().unwrap();
        all.iter().for_each(|r| r.release().unwrap());
        t.note(format!("device memory per {name} handle: {:.1} MiB", (before as f64 - after as f64) / N as f64 / 1048576.0));
    }

    // ---- 1. Where a release's time goes, one thread, each object timed on its own ----------
    const K: usize = 300;
    // Stream sync of an idle stream: ours as the release calls it, against the raw call.
    let r = DeviceResources::new().unwrap();
    let s = r.stream().unwrap();
    let ours_sync = stat_of((0..2000).map(|_| time(|| r.sync().unwrap())).collect());
    // SAFETY: the stream is alive while `s` is held.
    let raw_sync = stat_of((0..2000).map(|_| time(|| unsafe { cu::stream::synchronize(s.cu_stream()) }.unwrap())).collect());
    t.times("part: stream sync (idle stream)", "DeviceResources::sync", ours_sync, "cuStreamSynchronize", Some(raw_sync));
    drop(s);
    r.release().unwrap();

    // RAFT's object with a cuBLAS handle in it, destroyed by the shim (what the release calls),
    // against the same without a handle: the difference is the handle's destruction, against
    // a raw cublasDestroy.
    let with = (0..K).map(|_| native(api, false, true)).collect::<Vec<_>>();
    for n in &with {
        let mut h = std::ptr::null_mut();
        // SAFETY: RAFT's object is alive; the handle is made on its stream.
        assert_eq!(unsafe { api.raftrs_resources_handle(n.raft.unwrap(), raft_sys::RAFTRS_HANDLE_CUBLAS, &mut h) }, 0);
    }
    ctx.synchronize().unwrap();
    let mut streams = Vec::new();
    let shim_with = each(with, |n| {
        // SAFETY: destroyed once; its stream outlives it (destroyed below).
        assert_eq!(unsafe { api.raftrs_resources_destroy(n.raft.unwrap()) }, 0);
        streams.push(n.stream);
    });
    let without = (0..K).map(|_| native(api, false, true)).collect::<Vec<_>>();
    let shim_without = each(without, |n| {
        // SAFETY: as above.
        assert_eq!(unsafe { api.raftrs_resources_destroy(n.raft.unwrap()) }, 0);
        streams.push(n.stream);
    });
    // SAFETY: streams of destroyed objects, each destroyed once.
    let raw_stream_destroy = each(std::mem::take(&mut streams), |s| unsafe { cu::stream::destroy(s) }.unwrap());
    let raw_cublas = (0..K).map(|_| native(api, true, false)).collect::<Vec<_>>();
    ctx.synchronize().unwrap();
    let mut left = Vec::new();
    let raw_cublas_destroy = each(raw_cublas, |n| {
        // SAFETY: destroyed once.
        unsafe { blas::destroy_handle(n.cublas.unwrap()) }.unwrap();
        left.push(n.stream);
    });
    // SAFETY: as above.
    left.into_iter().for_each(|s| unsafe { cu::stream::destroy(s) }.unwrap());
    let handle_part = derived(shim_with.median_ns - shim_without.median_ns, K);
    t.times(
        "part: cuBLAS handle destruction",
        "shim destroy of RAFT's object holding a cuBLAS handle, minus one holding none",
        handle_part,
        "cublasDestroy (raw)",
        Some(raw_cublas_destroy),
    );
    // RAFT's object without handles: the shim against C++ deleting the same (with its stream).
    let shim_plus_stream = derived(shim_without.median_ns + raw_stream_destroy.median_ns, K);
    let cpp_each: Vec<f64> = (0..10)
        .map(|_| {
            // SAFETY: plain C functions of the baseline, called from this one thread.
            assert_eq!(unsafe { bl_hold(K as i32) }, 0);
            let t0 = Instant::now();
            // SAFETY: as above.
            unsafe { bl_unhold() };
            t0.elapsed().as_nanos() as f64 / K as f64
        })
        .collect();
    t.times(
        "part: RAFT object destruction, no handle (+ its stream)",
        "raftrs_resources_destroy + cuStreamDestroy",
        shim_plus_stream,
        "C++ delete raft::device_resources + cudaStreamDestroy (baseline.cpp, mean per object of 10 batches)",
        Some(stat_of(cpp_each)),
    );
    // Stream destruction: cudarc's CudaStream drop (rebinds the context, records a failure),
    // which the release uses, against the raw call.
    let cudarc_streams: Vec<_> = (0..K).map(|_| ctx.new_stream().unwrap()).collect();
    let cudarc_drop = each(cudarc_streams, drop);
    let raw: Vec<_> = (0..K).map(|_| cu::stream::create(cu::stream::StreamKind::NonBlocking).unwrap()).collect();
    // SAFETY: each destroyed once.
    let raw_drop = each(raw, |s| unsafe { cu::stream::destroy(s) }.unwrap());
    t.times("part: stream destruction", "cudarc CudaStream drop", cudarc_drop, "cuStreamDestroy (raw)", Some(raw_drop));

    // The whole release on the calling thread, without and with a cuBLAS handle, and with a
    // worker to join; against native destruction of the same objects.
    let whole = each(ours(K, false), |r| r.release().unwrap());
    let natives: Vec<_> = (0..K).map(|_| native(api, false, true)).collect();
    let native_whole = each(natives, |n| destroy_native(api, n));
    t.times(
        "release, no handle, calling thread",
        "DeviceResources::release",
        whole,
        "cuStreamSynchronize + delete raft::device_resources + cuStreamDestroy",
        Some(native_whole),
    );
    let bookkeeping = derived(whole.median_ns - (ours_sync.median_ns + shim_without.median_ns + cudarc_drop.median_ns), K);
    t.times(
        "part: the library's own bookkeeping (locks, state machine, context guard, recorded-error check)",
        "release − (sync + shim destroy + stream drop), medians",
        bookkeeping,
        "—",
        None,
    );
    let all = ours(K, true);
    ctx.synchronize().unwrap();
    let whole_h = each(all, |r| r.release().unwrap());
    let natives: Vec<_> = (0..K).map(|_| native(api, true, true)).collect();
    ctx.synchronize().unwrap();
    let native_h = each(natives, |n| destroy_native(api, n));
    t.times(
        "release with a cuBLAS handle, calling thread",
        "DeviceResources::release",
        whole_h,
        "cuStreamSynchronize + cublasDestroy + delete raft::device_resources + cuStreamDestroy",
        Some(native_h),
    );
    let with_worker: Vec<_> = ours(K, false).into_iter().inspect(|r| r.spawn(|| ()).unwrap().join().unwrap()).collect();
    let whole_w = each(with_worker, |r| r.release().unwrap());
    let joins = stat_of(
        (0..K)
            .map(|_| {
                let (tx, rx) = std::sync::mpsc::channel::<()>();
                let th = std::thread::spawn(move || while rx.recv().is_ok() {});
                tx.send(()).unwrap();
                time(|| {
                    drop(tx);
                    th.join().unwrap();
                })
            })
            .collect(),
    );
    t.times(
        "part: worker join (release of resources that ran a job, minus one that did not)",
        "release with a worker − release without, medians",
        derived(whole_w.median_ns - whole.median_ns, K),
        "std: close a channel and join a thread waiting in recv",
        Some(joins),
    );
    // Drop itself: what the dropping thread pays (never the GPU): the ledger, the exit token,
    // the queue.
    let all = ours(K, true);
    let drops = each(all, drop);
    settle(Duration::from_secs(60));
    t.times("drop of the last handle (the dropping thread's cost)", "DeviceResources drop", drops, "—", None);

    // ---- 2. Releases per second on 1 and 8 threads ------------------------------------------
    const KT: usize = 400; // with cuBLAS handles: 26 GB at once
    for threads in [1usize, 8] {
        for with_cublas in [false, true] {
            let what = if with_cublas { "with a cuBLAS handle" } else { "no handle" };
            let n = if with_cublas { KT } else { 4 * KT };
            let all = ours(n, with_cublas);
            ctx.synchronize().unwrap();
            let wall = spread(&ctx, all, threads, |r| r.release().unwrap());
            let natives: Vec<_> = (0..n).map(|_| native(api, with_cublas, true)).collect();
            ctx.synchronize().unwrap();
            let native_wall = spread(&ctx, natives, threads, |x| destroy_native(api, x));
            t.rates(
                &format!("releases per second, {what}, {threads} thread(s) calling release()"),
                "DeviceResources::release on each thread",
                n as f64 / wall.as_secs_f64(),
                "native destruction of the same objects on as many threads",
                Some(n as f64 / native_wall.as_secs_f64()),
            );
            // The same objects dropped: the release threads alone (a child process with
            // RAFT_RELEASE_THREADS set, no backpressure), against native on as many threads.
            let child = run_drop_child(n, with_cublas, threads);
            t.rates(
                &format!("releases per second, {what}, dropped, {threads} release thread(s)"),
                "drop; the release threads run them",
                n as f64 / (child.drain_ns / 1e9),
                "native destruction on as many threads (row above)",
                Some(n as f64 / native_wall.as_secs_f64()),
            );
            t.note(format!(
                "dropped, {what}, {threads} release thread(s): drop {} per object on the dropping thread; a release ran {} and waited {} in the queue (means)",
                fmt_ns(child.drop_ns),
                fmt_ns(child.run_ns),
                fmt_ns(child.wait_ns)
            ));
        }
    }

    // ---- 3. A burst of drops, default settings: how long until nothing is pending ----------
    settle(Duration::from_secs(60));
    let before = raft::stats();
    let burst: Vec<_> = (0..2000)
        .map(|i| {
            let r = DeviceResources::new().unwrap();
            if i % 10 == 0 {
                r.cublas_handle().unwrap();
            }
            r
        })
        .collect();
    let t0 = Instant::now();
    drop(burst);
    let drained = t0.elapsed() + settle(Duration::from_secs(120));
    let after = raft::stats();
    t.note(format!(
        "burst: 2000 resources (200 with a cuBLAS handle) dropped at once drained in {} ({:.0} releases/s; release threads now {}, helped {})",
        fmt_ns(drained.as_nanos() as f64),
        2000.0 / drained.as_secs_f64(),
        after.release_threads,
        after.releases_helped - before.releases_helped
    ));

    // ---- 4. Backpressure under load: 8 threads make, take a handle, drop, for 3 s ----------
    let stop = Arc::new(AtomicBool::new(false));
    let made = Arc::new(AtomicUsize::new(0));
    let before = raft::stats();
    let sampler = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let (mut most_bytes, mut most_releases) = (0u64, 0usize);
            while !stop.load(Ordering::Relaxed) {
                let p = raft::stats().pending;
                most_bytes = most_bytes.max(p.bytes);
                most_releases = most_releases.max(p.releases);
                std::thread::sleep(Duration::from_millis(1));
            }
            (most_bytes, most_releases)
        })
    };
    let t0 = Instant::now();
    let workers: Vec<_> = (0..8)
        .map(|_| {
            let (stop, made) = (stop.clone(), made.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let r = DeviceResources::new().unwrap();
                    r.cublas_handle().unwrap();
                    drop(r);
                    made.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(3));
    stop.store(true, Ordering::Relaxed);
    workers.into_iter().for_each(|w| w.join().unwrap());
    let load = t0.elapsed();
    let drain = settle(Duration::from_secs(60));
    let (most_bytes, most_releases) = sampler.join().unwrap();
    let after = raft::stats();
    let n = made.load(Ordering::Relaxed);
    t.rates(
        "resources with a cuBLAS handle made and dropped per second, 8 threads, default backpressure",
        "new + cublas_handle + drop",
        n as f64 / load.as_secs_f64(),
        "—",
        None,
    );
    t.note(format!(
        "under that load: at most {most_releases} releases / {:.0} MiB pending (limits {} / {:.0} MiB per device); {} releases run by the making threads; drained {} after the load stopped",
        most_bytes as f64 / 1048576.0,
        after.pending_releases_limit,
        after.pending_bytes_limit as f64 / 1048576.0,
        after.releases_helped - before.releases_helped,
        fmt_ns(drain.as_nanos() as f64)
    ));

    // Output.
    println!("| case | ours | ours: median [min, max] or rate | native | native | ours slower by |");
    println!("| --- | --- | --- | --- | --- | --- |");
    for row in &t.rows {
        println!(
            "| {} | {} | {} | {} | {} | {} |",
            row.case,
            row.ours,
            row.ours_value,
            row.native,
            row.native_value,
            row.slowdown.map(|r| format!("{r:.2}x")).unwrap_or_else(|| "—".into())
        );
    }
    println!();
    for n in &t.notes {
        println!("- {n}");
    }
    let json = serde_json::json!({ "rows": t.rows, "notes": t.notes });
    std::fs::write(&out, serde_json::to_string_pretty(&json).unwrap()).unwrap_or_else(|e| fail(&format!("{out}: {e}")));
    eprintln!("wrote {out}");
}

/// A difference of medians, shown as a median alone.
fn derived(median_ns: f64, samples: usize) -> Stat {
    Stat { median_ns, min_ns: median_ns, max_ns: median_ns, samples }
}

fn time(f: impl FnOnce()) -> f64 {
    let t = Instant::now();
    f();
    t.elapsed().as_nanos() as f64
}
