//! raft-bench: what this binding adds on top of RAFT, measured side by side with raw C++ RAFT
//! (bench/baseline.cpp, same headers, same process, same clock) and with cudarc.
//!
//! Each case: warm-up, then many samples; a sample times a batch of calls with `Instant` and
//! divides by the batch size; the table shows the median, min and max per call. Prints a
//! Markdown table and writes JSON to the path given as the first argument (default
//! `raft-bench.json`).
use raft::{current_device_resources, DeviceResources, DeviceVec, Layout};
use std::cell::Cell;
use std::ffi::c_void;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::Instant;

use raft_tests::baseline::*;

#[derive(Clone, Copy, Debug, serde::Serialize)]
struct Stat {
    median_ns: f64,
    min_ns: f64,
    max_ns: f64,
    samples: usize,
}

/// Times `f` `batch` times per sample, `samples` samples after `warmup` calls.
fn measure(warmup: usize, samples: usize, batch: usize, mut f: impl FnMut()) -> Stat {
    for _ in 0..warmup {
        f();
    }
    let mut per: Vec<f64> = (0..samples)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..batch {
                f();
            }
            t.elapsed().as_nanos() as f64 / batch as f64
        })
        .collect();
    per.sort_by(f64::total_cmp);
    Stat { median_ns: per[per.len() / 2], min_ns: per[0], max_ns: per[per.len() - 1], samples }
}

/// Several functions measured in turns of `TURN` (50) calls each (every call timed), so that
/// drifts of the machine (clock, other tenants) reach all of them alike, while each runs warm
/// within its turn as a loop would (run 65 alternated single calls: that cools each one's
/// caches for the other's and read pool allocations 1.43x where loops read 1.13x).
fn measure_turns<const N: usize>(warmup: usize, samples: usize, mut fs: [&mut dyn FnMut(); N]) -> [Stat; N] {
    const TURN: usize = 50;
    for f in fs.iter_mut() {
        for _ in 0..warmup {
            f();
        }
    }
    let mut per: [Vec<f64>; N] = std::array::from_fn(|_| Vec::with_capacity(samples));
    for _ in 0..samples.div_ceil(TURN) {
        for (f, v) in fs.iter_mut().zip(per.iter_mut()) {
            for _ in 0..TURN {
                let t = Instant::now();
                f();
                v.push(t.elapsed().as_nanos() as f64);
            }
        }
    }
    per.map(stat_of)
}

fn stat_of(mut v: Vec<f64>) -> Stat {
    v.sort_by(f64::total_cmp);
    Stat { median_ns: v[v.len() / 2], min_ns: v[0], max_ns: v[v.len() - 1], samples: v.len() }
}

#[derive(serde::Serialize)]
struct Row {
    case: String,
    ours: String,
    ours_stat: Stat,
    baselines: Vec<(String, Stat)>,
    /// ours / the baseline named in `against`.
    ratio: Option<f64>,
    against: String,
    target: String,
    met: Option<bool>,
}

fn fmt_ns(ns: f64) -> String {
    if ns >= 1e6 {
        format!("{:.2} ms", ns / 1e6)
    } else if ns >= 1e3 {
        format!("{:.2} µs", ns / 1e3)
    } else {
        format!("{ns:.1} ns")
    }
}

fn show(s: &Stat) -> String {
    format!("{} [{}, {}]", fmt_ns(s.median_ns), fmt_ns(s.min_ns), fmt_ns(s.max_ns))
}

struct Table {
    rows: Vec<Row>,
    notes: Vec<String>,
}

impl Table {
    /// A row with a target: `ok(ours, against)` says whether it is met.
    #[allow(clippy::too_many_arguments)]
    fn add(
        &mut self,
        case: &str,
        ours: &str,
        s: Stat,
        baselines: Vec<(&str, Stat)>,
        against: &str,
        target: &str,
        ok: impl Fn(f64, f64) -> bool,
    ) {
        // A row marked reported is never judged met or not (`report`).
        assert!(!target.starts_with("reported"), "{case}: a reported row takes `report`, not a target");
        self.push(case, ours, s, baselines, against, target, Some(&ok));
    }

    /// A row reported without a target (the ratio to `against` is shown, nothing is met).
    fn report(&mut self, case: &str, ours: &str, s: Stat, baselines: Vec<(&str, Stat)>, against: &str, target: &str) {
        self.push(case, ours, s, baselines, against, target, None);
    }

    #[allow(clippy::too_many_arguments)]
    fn push(
        &mut self,
        case: &str,
        ours: &str,
        s: Stat,
        baselines: Vec<(&str, Stat)>,
        against: &str,
        target: &str,
        ok: Option<&dyn Fn(f64, f64) -> bool>,
    ) {
        let base = baselines.iter().find(|(n, _)| *n == against).map(|(_, b)| b.median_ns);
        let ratio = base.map(|b| s.median_ns / b);
        let met = base.and_then(|b| ok.map(|ok| ok(s.median_ns, b)));
        eprintln!("  {case}: {} {}", show(&s), ratio.map(|r| format!("({r:.2}x {against})")).unwrap_or_default());
        self.rows.push(Row {
            case: case.into(),
            ours: ours.into(),
            ours_stat: s,
            baselines: baselines.into_iter().map(|(n, b)| (n.to_string(), b)).collect(),
            ratio,
            against: against.into(),
            target: target.into(),
            met,
        });
    }
}

/// As many spin-loop hints as `JobHandle::join` gives before parking (crates/raft-core/src/job.rs).
const JOIN_SPINS: usize = 2000;

/// A job's completion as `JobHandle` keeps it: an atomic flag the worker sets under a mutex,
/// and a condvar for a caller that stopped spinning.
struct Done {
    flag: AtomicBool,
    lock: Mutex<()>,
    cv: Condvar,
}

/// Job round trips without the library, waited for as `join` waits: a request over mpsc to a
/// thread waiting in `recv` (as the worker does), which sets the request's flag; the caller
/// spins `JOIN_SPINS` hints on the flag, then parks on the condvar. Measured in turns with
/// `ours` (the goal row's two sides see the same drifts of the machine): [ours, this].
fn spinning_round_trip_in_turns(warmup: usize, samples: usize, ours: &mut dyn FnMut()) -> [Stat; 2] {
    let (tx, rx) = mpsc::channel::<Arc<Done>>();
    let worker = std::thread::spawn(move || {
        while let Ok(done) = rx.recv() {
            black_box(1);
            let guard = done.lock.lock().unwrap();
            done.flag.store(true, Ordering::Release);
            drop(guard);
            done.cv.notify_all();
        }
    });
    let mut spinning = || {
        let done = Arc::new(Done { flag: AtomicBool::new(false), lock: Mutex::new(()), cv: Condvar::new() });
        tx.send(done.clone()).unwrap();
        for _ in 0..JOIN_SPINS {
            if done.flag.load(Ordering::Acquire) {
                return;
            }
            std::hint::spin_loop();
        }
        let mut guard = done.lock.lock().unwrap();
        while !done.flag.load(Ordering::Acquire) {
            guard = done.cv.wait(guard).unwrap();
        }
    };
    let stats = measure_turns(warmup, samples, [ours, &mut spinning]);
    drop(tx);
    worker.join().unwrap();
    stats
}

/// Round trips over two mpsc channels to a thread waiting in `recv`; the caller blocks in
/// `recv` too (std's short backoff, then parked: no spin of its own).
fn parked_round_trip(warmup: usize, samples: usize) -> Stat {
    let (req_tx, req_rx) = mpsc::channel::<u32>();
    let (rep_tx, rep_rx) = mpsc::channel::<u32>();
    let parked = std::thread::spawn(move || {
        while let Ok(v) = req_rx.recv() {
            rep_tx.send(v).unwrap();
        }
    });
    let s = measure(warmup, samples, 1, || {
        req_tx.send(1).unwrap();
        rep_rx.recv().unwrap();
    });
    drop(req_tx);
    parked.join().unwrap();
    s
}

fn fail(message: &str) -> ! {
    eprintln!("{message}");
    std::process::exit(2)
}

/// `raft-bench --shim-load`: a fresh process times its first `raft_sys::shim()` (loading
/// libraftrs_shim.so and the RAPIDS/CUDA libraries it needs) and prints the nanoseconds.
fn shim_load_child() -> ! {
    let t0 = Instant::now();
    let loaded = raft_sys::shim().is_ok();
    let ns = t0.elapsed().as_nanos();
    println!("{ns} {loaded}");
    std::process::exit(if loaded { 0 } else { 1 })
}

/// The first call's cost of loading the shim, over `n` fresh processes.
fn shim_load(n: usize) -> Stat {
    let exe = std::env::current_exe().expect("current exe");
    let samples: Vec<f64> = (0..n)
        .filter_map(|_| {
            let out = std::process::Command::new(&exe).arg("--shim-load").output().ok()?;
            let text = String::from_utf8_lossy(&out.stdout);
            let mut parts = text.split_whitespace();
            let ns: f64 = parts.next()?.parse().ok()?;
            (parts.next() == Some("true")).then_some(ns)
        })
        .collect();
    if samples.is_empty() {
        fail("the shim did not load in a child process");
    }
    stat_of(samples)
}

/// The multi-stream pattern of rapidsai/rmm#2039: allocations of mixed sizes made and freed on
/// several streams (one resources object each) through one resource. A statistics adaptor under
/// the resource counts what it takes from cudaMalloc (its footprint), one over it what is live;
/// the footprint's peak over the live peak is the fragmentation overhead. Same seeded sequence
/// for every resource and stream count.
fn fragmentation(t: &mut Table) {
    const ROUNDS: usize = 2000;
    let sizes = [64usize << 10, 1 << 20, 3 << 20, 16 << 20, 48 << 20];
    let mut seed: u64 = 0x2039;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let plan: Vec<(usize, usize, bool)> = (0..ROUNDS)
        .map(|_| {
            let n = next();
            (sizes[(n % sizes.len() as u64) as usize], (n >> 8) as usize, (n >> 16) % 3 != 0)
        })
        .collect();
    for streams in [1usize, 2, 4] {
        let all: Vec<DeviceResources> = (0..streams).map(|_| DeviceResources::on_device(0).unwrap()).collect();
        for (name, make) in [
            (
                "pool",
                (|up: &raft::MemoryResource| up.pool(Some(0), None)) as fn(&raft::MemoryResource) -> raft::Result<raft::MemoryResource>,
            ),
            ("arena", |up: &raft::MemoryResource| up.arena(Some(8 << 30))),
            ("cuda_async", |_up: &raft::MemoryResource| raft::MemoryResource::cuda_async(0)),
        ] {
            let upstream = raft::MemoryResource::cuda(0).unwrap().with_statistics().unwrap();
            let mr = make(&upstream).unwrap();
            let top = mr.with_statistics().unwrap();
            let mut live: Vec<DeviceVec<u8>> = Vec::new();
            for &(bytes, pick, keep) in &plan {
                let res = &all[pick % streams];
                if keep || live.is_empty() {
                    live.push(DeviceVec::<u8>::new_in(res, bytes, &top).unwrap());
                }
                if live.len() > 64 || !keep {
                    let victim = pick % live.len();
                    drop(live.swap_remove(victim));
                }
            }
            drop(live);
            all.iter().for_each(|r| r.sync().unwrap());
            let live_peak = top.statistics().unwrap().peak_bytes as f64;
            // cuda_async takes from the driver's pool, not through `upstream`: its footprint is
            // not seen there, and the row says so.
            let footprint = upstream.statistics().unwrap().peak_bytes as f64;
            let note = if name == "arena" {
                format!(
                    "{name}, {streams} stream(s): live peak {:.0} MiB; the arena takes its whole 8 GiB from cudaMalloc at once ({:.0} MiB), so its overhead is that reservation, not fragmentation",
                    live_peak / (1u64 << 20) as f64,
                    footprint / (1u64 << 20) as f64
                )
            } else if name == "cuda_async" {
                format!(
                    "{name}, {streams} stream(s): live peak {:.0} MiB (footprint inside the driver's pool: not counted here)",
                    live_peak / (1u64 << 20) as f64
                )
            } else {
                format!(
                    "{name}, {streams} stream(s): live peak {:.0} MiB, taken from cudaMalloc at peak {:.0} MiB: {:.2}x",
                    live_peak / (1u64 << 20) as f64,
                    footprint / (1u64 << 20) as f64,
                    footprint / live_peak.max(1.0)
                )
            };
            eprintln!("  fragmentation (rmm#2039 pattern): {note}");
            t.notes.push(format!("fragmentation (rmm#2039 pattern, {ROUNDS} allocations of 64 KiB-48 MiB): {note}"));
        }
        all.iter().for_each(|r| r.release().unwrap());
    }
}

fn main() {
    if std::env::args().nth(1).as_deref() == Some("--shim-load") {
        shim_load_child();
    }
    let out = std::env::args().nth(1).unwrap_or_else(|| "raft-bench.json".into());
    let mut t = Table { rows: Vec::new(), notes: Vec::new() };
    // Issue 14: the shim is loaded at first use. What that first use costs (a fresh process
    // each sample), and what a call through the loaded bindings costs against a linked call.
    let load = shim_load(10);
    t.report(
        "first call: loading libraftrs_shim.so + RAFT/RMM/CUDA libraries (fresh process each)",
        "raft_sys::shim() first call",
        load,
        vec![],
        "",
        "reported",
    );
    let api = raft_sys::shim().unwrap_or_else(|e| fail(&e.to_string()));
    let through_loaded = measure(1000, 200, 1000, || {
        let mut v = 0;
        // SAFETY: writes one int through a valid pointer.
        std::hint::black_box(unsafe { api.raftrs_runtime_version(&mut v) });
    });
    let through_result = measure(1000, 200, 1000, || {
        std::hint::black_box(raft::runtime_version().ok());
    });
    let linked = measure(1000, 200, 1000, || {
        let mut v = 0;
        // SAFETY: writes one int through a valid pointer.
        std::hint::black_box(unsafe { bl_runtime_version(&mut v) });
    });
    t.report(
        "per call: shim entry point through the loaded bindings vs a linked call (cudaRuntimeGetVersion)",
        "RaftrsShim fn pointer",
        through_loaded,
        vec![("linked C++ call", linked), ("raft::runtime_version (result layer)", through_result)],
        "linked C++ call",
        "reported",
    );
    match raft::device_count() {
        Ok(n) if n > 0 => eprintln!("raft-bench on {n} device(s)"),
        Ok(_) => fail("raft-bench needs a GPU: no CUDA device"),
        Err(e) => fail(&format!("raft-bench needs a GPU: {e}")),
    }

    // First cuBLAS handle in the process: ours first, so ours pays the library load.
    let r0 = DeviceResources::new().expect("resources");
    let t0 = Instant::now();
    r0.cublas_handle().expect("cublas");
    let process_first = t0.elapsed().as_nanos() as f64;
    t.notes.push(format!("first cuBLAS handle of the process (library load included): {}", fmt_ns(process_first)));
    r0.release().unwrap();

    // Scale first, while the memory pool holds nothing from the other cases: resources alive
    // at once.
    let ctx = r0.context().clone();
    let mut scale = Vec::new();
    // Device memory of resources without handles, for every count, before any handle exists
    // (freed handles return memory lazily and would blur these small numbers).
    let mut no_handles = Vec::new();
    for count in [1usize, 10, 100, 1000] {
        ctx.synchronize().unwrap();
        let (before, _) = ctx.mem_get_info().unwrap();
        let all: Vec<DeviceResources> = (0..count).map(|_| DeviceResources::new().unwrap()).collect();
        ctx.synchronize().unwrap();
        let (after, _) = ctx.mem_get_info().unwrap();
        no_handles.push(before as i64 - after as i64);
        all.iter().for_each(|r| r.release().unwrap());
    }
    for (i, count) in [1usize, 10, 100, 1000].into_iter().enumerate() {
        ctx.synchronize().unwrap();
        let (before, _) = ctx.mem_get_info().unwrap();
        let s = Instant::now();
        let all: Vec<DeviceResources> = (0..count).map(|_| DeviceResources::new().unwrap()).collect();
        let ours_ns = s.elapsed().as_nanos() as i64;
        let s = Instant::now();
        for one in &all {
            one.cublas_handle().unwrap();
        }
        let handles_ns = s.elapsed().as_nanos() as i64;
        ctx.synchronize().unwrap();
        let (with_handles, _) = ctx.mem_get_info().unwrap();
        for one in &all {
            one.release().unwrap();
        }
        let (mut cpp_ns, mut cpp_bytes, mut cpp_h_ns, mut cpp_h_bytes) = (0i64, 0i64, 0i64, 0i64);
        // SAFETY: out-pointers to locals.
        unsafe {
            bl_scale(count as i32, 0, &mut cpp_ns, &mut cpp_bytes);
            bl_scale(count as i32, 1, &mut cpp_h_ns, &mut cpp_h_bytes);
        }
        // Wall time of a process that makes `count` resources and exits holding them (torn down).
        let exe = std::env::current_exe().unwrap().with_file_name("scenarios");
        let exit_ms = if exe.exists() {
            let s = Instant::now();
            let st = std::process::Command::new(&exe)
                .arg("many-resources")
                .env("SCENARIO_COUNT", count.to_string())
                .env("RUST_LOG", "off")
                .stdout(std::process::Stdio::null())
                .status()
                .unwrap();
            assert!(st.success());
            Some(s.elapsed().as_secs_f64() * 1e3)
        } else {
            None
        };
        scale.push(serde_json::json!({
            "count": count,
            "ours_create_ms": ours_ns as f64 / 1e6, "ours_bytes_no_handles": no_handles[i],
            "ours_cublas_ms": handles_ns as f64 / 1e6, "ours_bytes_with_cublas": before as i64 - with_handles as i64,
            "cpp_create_ms": cpp_ns as f64 / 1e6, "cpp_bytes_no_handles": cpp_bytes,
            "cpp_create_with_cublas_ms": cpp_h_ns as f64 / 1e6, "cpp_bytes_with_cublas": cpp_h_bytes,
            "process_with_count_resources_wall_ms": exit_ms,
        }));
    }

    // 1. create + release, no handles.
    // In turns with the C++ baseline (each sample runs both).
    let [ours, cpp] = measure_turns(
        200,
        2000,
        [
            &mut || DeviceResources::new().unwrap().release().unwrap(),
            // SAFETY: plain C function of the baseline.
            &mut || assert_eq!(unsafe { bl_create_release() }, 0),
        ],
    );
    // The same with the stream handed out (so release drains it: one cuStreamQuery when idle),
    // against the same C++ (which never waits), in turns.
    let [used, cpp_again] = measure_turns(
        200,
        2000,
        [
            &mut || {
                let res = DeviceResources::new().unwrap();
                black_box(res.stream().unwrap());
                res.release().unwrap()
            },
            // SAFETY: plain C function of the baseline.
            &mut || assert_eq!(unsafe { bl_create_release() }, 0),
        ],
    );
    t.report(
        "create + stream() + release (release drains a stream handed out)",
        "DeviceResources::new + stream + release",
        used,
        vec![("C++ stream + raft::device_resources + destroy (never waits)", cpp_again)],
        "C++ stream + raft::device_resources + destroy (never waits)",
        "reported",
    );
    t.add(
        "create + release, no handles (in turns)",
        "DeviceResources::new + release",
        ours,
        vec![("C++ stream + raft::device_resources + destroy", cpp)],
        "C++ stream + raft::device_resources + destroy",
        "<= 1.25x",
        |a, b| a <= 1.25 * b,
    );
    // Where create + release's time goes: the stream alone on each side, and the shim's RAFT
    // object made and destroyed directly on a cudarc stream (no Rust bookkeeping, no sync).
    // SAFETY: plain C function of the baseline.
    let cpp_stream = measure(200, 2000, 1, || assert_eq!(unsafe { bl_stream_create_destroy() }, 0));
    let rs_ctx = raft::DeviceResources::new().unwrap().context().clone();
    let cudarc_stream = measure(200, 2000, 1, || drop(rs_ctx.new_stream().unwrap()));
    let api = raft_sys::shim().unwrap_or_else(|e| fail(&e.to_string()));
    let held = rs_ctx.new_stream().unwrap();
    let shim_object = measure(200, 2000, 1, || {
        let mut res = std::ptr::null_mut();
        // SAFETY: the stream is alive (held above); the object is destroyed right after, before
        // the stream.
        unsafe {
            assert_eq!(api.raftrs_resources_create(0, held.cu_stream() as *mut std::ffi::c_void, &mut res), 0);
            assert_eq!(api.raftrs_resources_destroy(res), 0);
        }
    });
    // Draining an idle stream, as release does: asking (cuStreamQuery) against waiting.
    let idle = rs_ctx.new_stream().unwrap();
    // SAFETY: the stream is alive (held) for the calls.
    let query_idle = measure(200, 5000, 1, || {
        assert_eq!(unsafe { cudarc::driver::sys::cuStreamQuery(idle.cu_stream()) }, cudarc::driver::sys::CUresult::CUDA_SUCCESS)
    });
    let sync_idle = measure(200, 5000, 1, || idle.synchronize().unwrap());
    t.report(
        "create + release, where the time goes",
        "the shim's RAFT object create + destroy on a live stream, called directly",
        shim_object,
        vec![
            ("DeviceResources::new + release", ours),
            ("C++ stream + raft::device_resources + destroy", cpp),
            ("C++ stream create + destroy alone", cpp_stream),
            ("cudarc new_stream + drop alone", cudarc_stream),
            ("cuStreamQuery of an idle stream (release asks first)", query_idle),
            ("cuStreamSynchronize of an idle stream", sync_idle),
        ],
        "C++ stream + raft::device_resources + destroy",
        "reported",
    );

    // The two halves apart, ours and C++ alternating in one loop: new() against stream + RAFT
    // object; release() + drop against destroying both.
    let (mut ours_new, mut ours_release, mut ours_drop, mut cpp_make, mut cpp_destroy) = (vec![], vec![], vec![], vec![], vec![]);
    for i in 0..2200 {
        let t = Instant::now();
        let res = DeviceResources::new().unwrap();
        let made = t.elapsed().as_nanos() as f64;
        let t = Instant::now();
        res.release().unwrap();
        let released = t.elapsed().as_nanos() as f64;
        let t = Instant::now();
        drop(res);
        let dropped = t.elapsed().as_nanos() as f64;
        let mut o = std::ptr::null_mut();
        let t = Instant::now();
        // SAFETY: plain C functions of the baseline; `o` is destroyed right after.
        assert_eq!(unsafe { bl_make(&mut o) }, 0);
        let cpp_made = t.elapsed().as_nanos() as f64;
        let t = Instant::now();
        // SAFETY: `o` came from bl_make, destroyed once.
        assert_eq!(unsafe { bl_destroy(o) }, 0);
        let cpp_destroyed = t.elapsed().as_nanos() as f64;
        if i >= 200 {
            ours_new.push(made);
            ours_release.push(released);
            ours_drop.push(dropped);
            cpp_make.push(cpp_made);
            cpp_destroy.push(cpp_destroyed);
        }
    }
    t.report(
        "create + release, the halves",
        "DeviceResources::new alone",
        stat_of(ours_new),
        vec![
            ("C++ stream + raft::device_resources made", stat_of(cpp_make)),
            ("ours: release()", stat_of(ours_release)),
            ("ours: drop of the released handle", stat_of(ours_drop)),
            ("C++ both destroyed", stat_of(cpp_destroy)),
        ],
        "C++ stream + raft::device_resources made",
        "reported",
    );

    // 2. sync of an empty stream.
    let r = DeviceResources::new().unwrap();
    let stream = r.stream().unwrap();
    // In turns (each turn runs all three), as every goal row with a baseline: measured one
    // after the other, a drift of the machine between them reads as a ratio.
    let [ours, cuda_rt, cudarc_s] = measure_turns(
        1000,
        5000,
        [
            &mut || r.sync().unwrap(),
            // SAFETY: the stream is alive while `stream` is held.
            &mut || assert_eq!(unsafe { bl_stream_sync(stream.cu_stream() as *mut c_void) }, 0),
            &mut || stream.synchronize().unwrap(),
        ],
    );
    let faster = if cuda_rt.median_ns <= cudarc_s.median_ns { "cudaStreamSynchronize" } else { "cudarc synchronize" };
    t.add(
        "sync of an empty stream (in turns)",
        "DeviceResources::sync",
        ours,
        vec![("cudaStreamSynchronize", cuda_rt), ("cudarc synchronize", cudarc_s)],
        faster,
        "<= 1.10x the faster",
        |a, b| a <= 1.10 * b,
    );

    // 3. default lookup, already made.
    current_device_resources(0).unwrap();
    let ours = measure(1000, 2000, 1000, || drop(black_box(current_device_resources(black_box(0)).unwrap())));
    thread_local! { static PLAIN: Cell<u64> = const { Cell::new(7) }; }
    let tls = measure(1000, 2000, 1000, || {
        black_box(PLAIN.with(Cell::get));
    });
    t.add(
        "default lookup (made already)",
        "current_device_resources(0)",
        ours,
        vec![("thread-local read", tls)],
        "thread-local read",
        "<= 20 ns",
        |a, _| a <= 20.0,
    );

    // 4. job round trip (no-op job). Ours sends the job over mpsc to the resources' worker,
    // waiting in `recv`, and `join` spins before it parks: compared like with like (the same
    // waits, without the library), then, reported only, against waits that block at once.
    let ours_job = format!("spawn + join: mpsc to the worker waiting in recv; join spins {JOIN_SPINS} hints on the job's flag, then parks");
    let spinning_label = format!(
        "spinning round trip: mpsc to a thread waiting in recv, which sets a flag; the caller spins {JOIN_SPINS} hints on it, then parks"
    );
    const BLOCKING: &str = "blocking round trip: mpsc to a thread waiting in recv and back; the caller blocks in recv";
    const SPAWN: &str = "std::thread::spawn + join";
    let [ours, spinning] = spinning_round_trip_in_turns(200, 5000, &mut || r.spawn(|| black_box(1)).unwrap().join().map(drop).unwrap());
    let parked = parked_round_trip(200, 5000);
    let spawn_join = measure(50, 1000, 1, || std::thread::spawn(|| black_box(1)).join().map(drop).unwrap());
    t.add(
        "job round trip (no-op job), same wait: spin, then park (in turns)",
        &ours_job,
        ours,
        vec![(&spinning_label, spinning)],
        &spinning_label,
        "<= 1.10x",
        |a, b| a <= 1.10 * b,
    );
    t.report(
        "job round trip (no-op job), against waits that block at once (unlike: ours spins first)",
        &ours_job,
        ours,
        vec![(BLOCKING, parked), (SPAWN, spawn_join)],
        BLOCKING,
        "reported",
    );

    // 5. 1 MiB allocate + free.
    let mib = 1 << 20;
    // Ours and the C++ rows in turns (each sample runs each); cudaMalloc's row apart (slow).
    let [ours, cpp_async, cpp_lookup] = measure_turns(
        200,
        5000,
        [
            &mut || drop(DeviceVec::<u8>::new(&r, mib).unwrap()),
            // SAFETY: plain C functions of the baseline.
            &mut || assert_eq!(unsafe { bl_alloc_free_async(mib) }, 0),
            // SAFETY: as above.
            &mut || assert_eq!(unsafe { bl_alloc_free_per_device(mib) }, 0),
        ],
    );
    // SAFETY: as above.
    let cpp_cuda = measure(50, 1000, 1, || assert_eq!(unsafe { bl_alloc_free_cuda(mib) }, 0));
    t.add(
        "1 MiB allocate + free (in turns)",
        "DeviceVec::new + drop (default resource)",
        ours,
        vec![
            ("C++ cuda_async_memory_resource", cpp_async),
            ("C++ through get_per_device_resource_ref", cpp_lookup),
            ("C++ cuda_memory_resource", cpp_cuda),
        ],
        "C++ cuda_async_memory_resource",
        "<= 1.10x pool, >= 2x faster than cudaMalloc",
        move |a, b| a <= 1.10 * b && 2.0 * a <= cpp_cuda.median_ns,
    );
    // Where the allocation's time goes: the shim's create + destroy called directly (its C++
    // side: device scope, RMM's map lock and resource copy, allocate, free) against the same
    // C++ lookup, and the context guard the result layer adds around each call.
    let stream = r.stream().unwrap();
    let api = raft_sys::shim().unwrap_or_else(|e| fail(&e.to_string()));
    let mut shim_direct = || {
        let (mut buf, mut data, mut ordered) = (std::ptr::null_mut(), std::ptr::null_mut(), 0);
        let s = stream.cu_stream() as *mut std::ffi::c_void;
        // SAFETY: the stream is alive (held above); out-pointers are locals; the buffer is freed
        // right after, on the same stream.
        unsafe {
            assert_eq!(api.raftrs_buffer_create(0, std::ptr::null(), s, mib, &mut buf, &mut data, &mut ordered), 0);
            assert_eq!(api.raftrs_buffer_destroy(buf, s), 0);
        }
    };
    // The shim and the C++ steps in turns.
    let [shim_direct, cpp_copied, cpp_copied_heap] = measure_turns(
        200,
        5000,
        [
            &mut shim_direct,
            // SAFETY: plain C functions of the baseline.
            &mut || assert_eq!(unsafe { bl_alloc_free_copied(mib, 0) }, 0),
            // SAFETY: as above.
            &mut || assert_eq!(unsafe { bl_alloc_free_copied(mib, 1) }, 0),
        ],
    );
    // The C++ pool's own memory pool below RMM: the runtime's calls directly, the driver's.
    let [cpp_pool_again, cpp_runtime, cpp_driver] = measure_turns(
        200,
        5000,
        [
            // SAFETY: plain C functions of the baseline.
            &mut || assert_eq!(unsafe { bl_alloc_free_async(mib) }, 0),
            // SAFETY: as above.
            &mut || assert_eq!(unsafe { bl_alloc_free_async_runtime(mib) }, 0),
            // SAFETY: as above.
            &mut || assert_eq!(unsafe { bl_alloc_free_async_driver(mib) }, 0),
        ],
    );
    t.report(
        "1 MiB allocate + free, below RMM (in turns; every column C++)",
        "C++ cuda_async_memory_resource (as the goal row's baseline)",
        cpp_pool_again,
        vec![
            ("its pool through cudaMallocFromPoolAsync + cudaFreeAsync", cpp_runtime),
            ("its pool through cuMemAllocFromPoolAsync + cuMemFreeAsync", cpp_driver),
        ],
        "its pool through cuMemAllocFromPoolAsync + cuMemFreeAsync",
        "reported",
    );
    let guard_pair = measure(200, 5000, 1, || {
        // What ContextGuard::save + drop cost: two cuCtxGetCurrent, twice per allocation.
        let c = cudarc::driver::result::ctx::get_current().unwrap();
        black_box(cudarc::driver::result::ctx::get_current().unwrap() == c);
    });
    t.report(
        "1 MiB allocate + free, where the time goes",
        "the shim's buffer create + destroy, called directly (in turns with the two C++ step rows)",
        shim_direct,
        vec![
            ("C++ through get_per_device_resource_ref", cpp_lookup),
            ("C++, the shim's steps but its device switches: copy + equality check under RMM's lock", cpp_copied),
            ("C++, the same with the copy in a heap object", cpp_copied_heap),
            ("DeviceVec::new + drop", ours),
            ("two cuCtxGetCurrent", guard_pair),
        ],
        "C++ through get_per_device_resource_ref",
        "reported",
    );

    // Issue 15: the same allocation through RMM's pool and arena, made from Rust, against C++
    // calling the same kind of resource (each over cudaMalloc, made once, warm).
    let pool = raft::MemoryResource::cuda(0).unwrap().pool(Some(256 << 20), None).unwrap();
    let arena = raft::MemoryResource::cuda(0).unwrap().arena(Some(1 << 30)).unwrap();
    for (label, mr, cpp) in [
        ("1 MiB allocate + free, pool over cudaMalloc (in turns)", &pool, bl_alloc_free_pool as unsafe extern "C" fn(usize) -> i32),
        ("1 MiB allocate + free, arena over cudaMalloc (in turns)", &arena, bl_alloc_free_arena as unsafe extern "C" fn(usize) -> i32),
    ] {
        let [ours, base] = measure_turns(
            200,
            5000,
            [
                &mut || drop(DeviceVec::<u8>::new_in(&r, mib, mr).unwrap()),
                // SAFETY: plain C functions of the baseline.
                &mut || assert_eq!(unsafe { cpp(mib) }, 0),
            ],
        );
        t.add(
            label,
            "DeviceVec::new_in + drop",
            ours,
            vec![("C++, the same resource kind", base)],
            "C++, the same resource kind",
            "<= 1.10x",
            |a, b| a <= 1.10 * b,
        );
    }
    drop((pool, arena));
    fragmentation(&mut t);

    // 6. first cuBLAS handle of new resources (the library is loaded by now); ours and C++
    // alternate so that both see the same state of the device.
    let (mut ours_h, mut cpp_h, mut new_then_handle, mut new_alone) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..100 {
        let s = Instant::now();
        let res = DeviceResources::new().unwrap();
        new_then_handle.push(s.elapsed().as_nanos() as f64);
        let s = Instant::now();
        res.cublas_handle().unwrap();
        ours_h.push(s.elapsed().as_nanos() as f64);
        res.release().unwrap();
        // SAFETY: plain C function of the baseline.
        cpp_h.push(unsafe { bl_first_cublas_ns() } as f64);
        let s = Instant::now();
        let res = DeviceResources::new().unwrap();
        new_alone.push(s.elapsed().as_nanos() as f64);
        res.release().unwrap();
    }
    t.add(
        "first cuBLAS handle of new resources",
        "cublas_handle() after new()",
        stat_of(ours_h),
        vec![("C++ get_cublas_handle first call", stat_of(cpp_h))],
        "C++ get_cublas_handle first call",
        "<= 1.05x",
        |a, b| a <= 1.05 * b,
    );
    let (with_h, alone) = (stat_of(new_then_handle), stat_of(new_alone));
    t.notes.push(format!(
        "new() alone, in the same loop: {} when a cuBLAS handle is taken afterwards, {} when none is: handles are lazy, new() does not pay for them",
        show(&with_h),
        show(&alone)
    ));

    // 6b. create + release while many other resources are alive: does the cost grow with the
    // number of live streams, and does raw C++ RAFT see the same?
    for alive in [0usize, 2000, 8000] {
        // Both sides' others alive at once (`alive` of ours and `alive` held by C++), and the
        // three measured in turns of 50 (run 73 measured them one after the other, 200 samples,
        // and the 0-alive row swung from 1.23x to 1.55x between runs).
        let others: Vec<DeviceResources> = (0..alive).map(|_| DeviceResources::new().unwrap()).collect();
        // SAFETY: plain C functions of the baseline.
        assert_eq!(unsafe { bl_hold(alive as i32) }, 0);
        let [ours, cpp, cudarc_only] = measure_turns(
            50,
            1000,
            [
                &mut || DeviceResources::new().unwrap().release().unwrap(),
                // SAFETY: as above.
                &mut || assert_eq!(unsafe { bl_create_release() }, 0),
                &mut || drop(r.context().new_stream().unwrap()),
            ],
        );
        // SAFETY: as above.
        unsafe { bl_unhold() };
        others.iter().for_each(|o| o.release().unwrap());
        drop(others);
        // Reported: the ratio is shown against the 1.25x of the goal row, never judged met.
        t.report(
            &format!("create + release with {alive} other resources alive on each side (in turns)"),
            "DeviceResources::new + release",
            ours,
            vec![("C++ stream + raft::device_resources + destroy", cpp), ("cudarc new_stream + drop", cudarc_only)],
            "C++ stream + raft::device_resources + destroy",
            "reported (the goal row's bound is 1.25x)",
        );
    }

    // 7. cudarc alone.
    let cudarc_new = measure(200, 2000, 1, || drop(ctx.new_stream().unwrap()));
    t.report("cudarc new_stream + drop", "CudaContext::new_stream + drop", cudarc_new, vec![], "", "reported");

    // 8. GEMM 8192³ fp32 through our handle, and through cudarc's cuBLAS on the same stream.
    let n = 8192usize;
    let flops = 2.0 * (n as f64).powi(3);
    let host: Vec<f32> = (0..n * n).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect();
    let a = DeviceVec::from_host(&r, &host).unwrap();
    let b = DeviceVec::from_host(&r, &host).unwrap();
    let mut c = DeviceVec::<f32>::zeros(&r, n * n).unwrap();
    let blas = cudarc::cublas::CudaBlas::new(stream.clone()).unwrap();
    let a_c = stream.clone_htod(&host).unwrap();
    let b_c = stream.clone_htod(&host).unwrap();
    let mut c_c = stream.alloc_zeros::<f32>(n * n).unwrap();
    let cfg = cudarc::cublas::GemmConfig {
        transa: cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_N,
        transb: cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_N,
        m: n as i32,
        n: n as i32,
        k: n as i32,
        alpha: 1.0f32,
        lda: n as i32,
        ldb: n as i32,
        beta: 0.0,
        ldc: n as i32,
    };
    // In turns: one turn of 50 calls each (about a second a side on an H200).
    let [ours, theirs] = measure_turns(
        3,
        50,
        [
            &mut || {
                raft::gemm(
                    1.0f32,
                    a.matrix(n, n, Layout::ColMajor).unwrap(),
                    b.matrix(n, n, Layout::ColMajor).unwrap(),
                    0.0,
                    c.matrix_mut(n, n, Layout::ColMajor).unwrap(),
                )
                .unwrap();
                r.sync().unwrap();
            },
            &mut || {
                // SAFETY: the three buffers hold n×n floats, as the config says.
                unsafe { cudarc::cublas::Gemm::gemm(&blas, cfg, &a_c, &b_c, &mut c_c) }.unwrap();
                stream.synchronize().unwrap();
            },
        ],
    );
    t.add(
        "GEMM 8192³ fp32 (sync included, in turns)",
        "raft::gemm on the resources' handle",
        ours,
        vec![("cudarc CudaBlas::gemm, same stream", theirs)],
        "cudarc CudaBlas::gemm, same stream",
        "~1.0x (same cuBLAS)",
        |a, b| a <= 1.05 * b,
    );
    t.notes.push(format!(
        "GEMM 8192³ fp32: ours {:.1} TFLOP/s, cudarc {:.1} TFLOP/s",
        flops / ours.median_ns / 1e3,
        flops / theirs.median_ns / 1e3
    ));
    drop((a, b, c, a_c, b_c, c_c, blas));

    // 9. allocate + copy + free, 1 MiB and 1 GiB.
    for (label, bytes) in [("1 MiB", 1usize << 20), ("1 GiB", 1usize << 30)] {
        let host = vec![1u8; bytes];
        let reps = if bytes > 1 << 24 { 5 } else { 500 };
        let s = measure(2, reps, 1, || drop(DeviceVec::from_host(&r, &host).unwrap()));
        t.report(&format!("allocate + copy in + free, {label}"), "DeviceVec::from_host + drop", s, vec![], "", "reported");
        t.notes.push(format!("{label} from_host: {:.2} GB/s host to device (pageable memory)", bytes as f64 / s.median_ns));
    }

    // Output.
    println!("| case | this project | median [min, max] per call | baseline(s) | ratio | target | met |");
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    for row in &t.rows {
        let bases: Vec<String> = row.baselines.iter().map(|(n, s)| format!("{n}: {}", show(s))).collect();
        println!(
            "| {} | {} | {} | {} | {} | {} | {} |",
            row.case,
            row.ours,
            show(&row.ours_stat),
            if bases.is_empty() { "—".into() } else { bases.join("; ") },
            row.ratio.map(|r| format!("{r:.2}x")).unwrap_or_else(|| "—".into()),
            row.target,
            match row.met {
                Some(true) => "yes",
                Some(false) => "NO",
                None => "—",
            }
        );
    }
    println!();
    println!("| resources alive | ours: create all | C++: create all | ours: device memory, no handles | ours: with a cuBLAS handle each | C++: with a cuBLAS handle each | process wall (make, exit) |");
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    for s in &scale {
        println!(
            "| {} | {:.2} ms | {:.2} ms | {:.1} MiB | {:.1} MiB | {:.1} MiB | {} |",
            s["count"],
            s["ours_create_ms"].as_f64().unwrap(),
            s["cpp_create_ms"].as_f64().unwrap(),
            s["ours_bytes_no_handles"].as_f64().unwrap() / 1048576.0,
            s["ours_bytes_with_cublas"].as_f64().unwrap() / 1048576.0,
            s["cpp_bytes_with_cublas"].as_f64().unwrap() / 1048576.0,
            s["process_with_count_resources_wall_ms"].as_f64().map(|v| format!("{v:.0} ms")).unwrap_or_else(|| "—".into()),
        );
    }
    println!();
    for n in &t.notes {
        println!("- {n}");
    }
    let json = serde_json::json!({ "rows": t.rows, "scale": scale, "notes": t.notes });
    std::fs::write(&out, serde_json::to_string_pretty(&json).unwrap()).unwrap();
    eprintln!("wrote {out}");
}
