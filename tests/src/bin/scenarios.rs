//! Child-process scenarios for the integration tests: each runs in a fresh process, because it
//! is about what happens once per process (the exit, the first resources on a device).
//! `scenarios NAME` runs one; it prints `RESULT key=value ...` lines for the parent to check.
use std::process::ExitCode;
use std::time::{Duration, Instant};

fn env_f64(name: &str, default: f64) -> f64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The `raw-pool-streams` scenario (see its comment in `main`): the driver API alone.
///
/// `SCENARIO_MODE` picks what the worker threads do each round, all on device 0's primary
/// context (`SCENARIO_THREADS` workers × `SCENARIO_ROUNDS` rounds):
/// - `inline`: on a stream each worker keeps for the whole run, a fresh async pool, 1 MiB from
///   it, a memset, a stream-ordered free, and the pool destroyed at once by the worker (its free
///   still queued); then 1 MiB from the device's default pool, a memset, a free and a stream
///   sync. No context-wide wait anywhere.
/// - `ctxsync`: no pool is made; the workers do the default-pool part only while
///   `SCENARIO_SYNCERS` (2) threads call `cuCtxSynchronize` in a loop.
/// - `inline-ctxsync`: `inline` beside the context-wide waits of `ctxsync` (what this library
///   did on the default path: a pool destroyed by the array that freed into it, release
///   threads waiting for the device meanwhile).
/// - `streamsync-ctxsync`: as `inline-ctxsync`, but each worker waits for its own stream before
///   destroying the pool (nothing of the pool queued anywhere when it dies).
/// - `handoff`: runs 37–38's pattern: per round a stream (a spare one when `SCENARIO_REUSE=1`),
///   the pool part, then the pool to a destroyer thread (which first waits for the context when
///   `SCENARIO_DEVICE_SYNC=1`) and the stream to a releaser thread (which syncs it, then
///   destroys it or keeps it for reuse).
///
/// Pools are made with a 64 MiB maximum (the default, the whole device, made `cuMemPoolCreate`
/// fail with out-of-memory once several were alive, GPU run 41). Prints
/// `RESULT mode=… rounds=…`; a failing call panics with its name and result.
fn raw_pool_streams() {
    use cudarc::driver::sys::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::mpsc;
    use std::sync::Mutex;
    fn ok(what: &str, rc: CUresult) {
        assert_eq!(rc, CUresult::CUDA_SUCCESS, "{what}");
    }
    let mode = std::env::var("SCENARIO_MODE").unwrap_or_else(|_| "handoff".into());
    let threads = env_f64("SCENARIO_THREADS", 8.0) as usize;
    let rounds = env_f64("SCENARIO_ROUNDS", 200.0) as usize;
    let syncers = env_f64("SCENARIO_SYNCERS", 2.0) as usize;
    let reuse = env_f64("SCENARIO_REUSE", 0.0) != 0.0;
    let device_sync = env_f64("SCENARIO_DEVICE_SYNC", 0.0) != 0.0;
    let (make_pools, ctx_syncs, stream_sync_first, handoff) = match mode.as_str() {
        "inline" => (true, false, false, false),
        "ctxsync" => (false, true, false, false),
        "inline-ctxsync" => (true, true, false, false),
        "streamsync-ctxsync" => (true, true, true, false),
        "handoff" => (true, false, false, true),
        "pool-limit" => return raw_pool_limit(),
        other => panic!("SCENARIO_MODE {other:?}: inline, ctxsync, inline-ctxsync, streamsync-ctxsync or handoff"),
    };
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: plain driver calls with out-pointers to locals; device 0 exists (a GPU run).
    unsafe {
        ok("cuInit", cuInit(0));
        let mut dev: CUdevice = 0;
        ok("cuDeviceGet", cuDeviceGet(&mut dev, 0));
        ok("cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain(&mut ctx, dev));
    }
    let ctx = ctx as usize;
    // SAFETY: binds the retained primary context (alive for the process) to the calling thread.
    let bind = move || ok("cuCtxSetCurrent", unsafe { cuCtxSetCurrent(ctx as CUcontext) });
    // SAFETY (both helpers): out-pointers to locals; the context is bound by the caller.
    let new_stream = || {
        let mut st: CUstream = std::ptr::null_mut();
        ok("cuStreamCreate", unsafe { cuStreamCreate(&mut st, CUstream_flags::CU_STREAM_NON_BLOCKING as u32) });
        st
    };
    let new_pool = || {
        // SAFETY: zeroed props are a valid start (no handle types, device 0, no flags).
        let mut props: CUmemPoolProps = unsafe { std::mem::zeroed() };
        props.allocType = CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        props.location.type_ = CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        props.location.__bindgen_anon_1.id = 0;
        props.maxSize = 64 << 20;
        let mut pool: CUmemoryPool = std::ptr::null_mut();
        ok("cuMemPoolCreate", unsafe { cuMemPoolCreate(&mut pool, &props) });
        pool
    };
    let spare: Mutex<Vec<usize>> = Mutex::new(Vec::new());
    let stop = AtomicBool::new(false);
    let (pool_tx, pool_rx) = mpsc::channel::<usize>();
    let (stream_tx, stream_rx) = mpsc::channel::<usize>();
    std::thread::scope(|s| {
        let (spare, stop) = (&spare, &stop);
        s.spawn(move || {
            bind();
            for pool in pool_rx {
                if device_sync {
                    // SAFETY: the context is bound to this thread.
                    ok("cuCtxSynchronize (destroyer)", unsafe { cuCtxSynchronize() });
                }
                // SAFETY: the pool was made by a worker, which no longer uses it.
                ok("cuMemPoolDestroy (destroyer)", unsafe { cuMemPoolDestroy(pool as CUmemoryPool) });
            }
        });
        s.spawn(move || {
            bind();
            for stream in stream_rx {
                // SAFETY: the stream was made by a worker, which no longer uses it.
                ok("cuStreamSynchronize (releaser)", unsafe { cuStreamSynchronize(stream as CUstream) });
                if reuse {
                    spare.lock().unwrap().push(stream);
                } else {
                    // SAFETY: as above; destroyed once (never kept when destroyed).
                    ok("cuStreamDestroy", unsafe { cuStreamDestroy_v2(stream as CUstream) });
                }
            }
        });
        if ctx_syncs {
            for _ in 0..syncers {
                s.spawn(move || {
                    bind();
                    while !stop.load(Ordering::Relaxed) {
                        // SAFETY: the context is bound to this thread.
                        ok("cuCtxSynchronize (syncer)", unsafe { cuCtxSynchronize() });
                    }
                });
            }
        }
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                let (pool_tx, stream_tx) = (pool_tx.clone(), stream_tx.clone());
                s.spawn(move || {
                    bind();
                    let own = (!handoff).then(new_stream);
                    for _ in 0..rounds {
                        let stream = match own {
                            Some(st) => st,
                            None => match spare.lock().unwrap().pop() {
                                Some(st) => st as CUstream,
                                None => new_stream(),
                            },
                        };
                        // SAFETY: each pointer is used only on this thread's stream, between its
                        // allocation and its stream-ordered free; a pool is destroyed once, by
                        // this thread or (handed over) by the destroyer, after its last free is
                        // queued; the stream is handed over only in `handoff` mode, after its
                        // last use here.
                        unsafe {
                            if make_pools {
                                let pool = new_pool();
                                let mut ptr: CUdeviceptr = 0;
                                ok("cuMemAllocFromPoolAsync", cuMemAllocFromPoolAsync(&mut ptr, 1 << 20, pool, stream));
                                ok("cuMemsetD8Async", cuMemsetD8Async(ptr, 0, 1 << 20, stream));
                                ok("cuMemFreeAsync (pool)", cuMemFreeAsync(ptr, stream));
                                if handoff {
                                    pool_tx.send(pool as usize).unwrap();
                                } else {
                                    if stream_sync_first {
                                        ok("cuStreamSynchronize (before destroy)", cuStreamSynchronize(stream));
                                    }
                                    ok("cuMemPoolDestroy", cuMemPoolDestroy(pool));
                                }
                            }
                            if !handoff {
                                let mut ptr: CUdeviceptr = 0;
                                ok("cuMemAllocAsync", cuMemAllocAsync(&mut ptr, 1 << 20, stream));
                                ok("cuMemsetD8Async (default pool)", cuMemsetD8Async(ptr, 0, 1 << 20, stream));
                                ok("cuMemFreeAsync", cuMemFreeAsync(ptr, stream));
                                ok("cuStreamSynchronize", cuStreamSynchronize(stream));
                            }
                        }
                        if handoff {
                            stream_tx.send(stream as usize).unwrap();
                        }
                    }
                    if let Some(st) = own {
                        // SAFETY: this thread's own stream, last used above.
                        ok("cuStreamDestroy (own)", unsafe { cuStreamDestroy_v2(st) });
                    }
                })
            })
            .collect();
        drop((pool_tx, stream_tx));
        let mut failed = None;
        for w in workers {
            if let Err(e) = w.join() {
                failed = Some(e);
            }
        }
        stop.store(true, Ordering::Relaxed);
        if let Some(e) = failed {
            std::panic::resume_unwind(e);
        }
    });
    println!("RESULT mode={mode} rounds={} reuse={} device_sync={}", threads * rounds, u8::from(reuse), u8::from(device_sync));
}

/// `raw-pool-streams` with `SCENARIO_MODE=pool-limit`: how many async pools can be alive at once
/// on device 0, each with 1 MiB taken from it, when made with the default maximum (0: the
/// driver's default) and, separately, with `maxSize` 64 MiB. Prints both counts (stopping at
/// 4096).
fn raw_pool_limit() {
    use cudarc::driver::sys::*;
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: plain driver calls with out-pointers to locals; device 0 exists (a GPU run).
    unsafe {
        assert_eq!(cuInit(0), CUresult::CUDA_SUCCESS);
        assert_eq!(cuDevicePrimaryCtxRetain(&mut ctx, 0), CUresult::CUDA_SUCCESS);
        assert_eq!(cuCtxSetCurrent(ctx), CUresult::CUDA_SUCCESS);
    }
    for max in [0usize, 64 << 20] {
        let mut made = Vec::new();
        let mut failure = String::from("none");
        while made.len() < 4096 {
            // SAFETY: zeroed props are a valid start; out-pointers to locals; each pool and
            // allocation is destroyed below, after a context-wide wait.
            unsafe {
                let mut props: CUmemPoolProps = std::mem::zeroed();
                props.allocType = CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
                props.location.type_ = CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
                props.maxSize = max;
                let mut pool: CUmemoryPool = std::ptr::null_mut();
                let rc = cuMemPoolCreate(&mut pool, &props);
                if rc != CUresult::CUDA_SUCCESS {
                    failure = format!("cuMemPoolCreate:{rc:?}");
                    break;
                }
                let mut ptr: CUdeviceptr = 0;
                let rc = cuMemAllocFromPoolAsync(&mut ptr, 1 << 20, pool, std::ptr::null_mut());
                if rc != CUresult::CUDA_SUCCESS {
                    failure = format!("cuMemAllocFromPoolAsync:{rc:?}");
                    cuMemPoolDestroy(pool);
                    break;
                }
                made.push((pool, ptr));
            }
        }
        let n = made.len();
        // SAFETY: every pointer and pool was made above and is freed / destroyed once, after the
        // context has finished the allocations.
        unsafe {
            assert_eq!(cuCtxSynchronize(), CUresult::CUDA_SUCCESS);
            for (pool, ptr) in made {
                cuMemFreeAsync(ptr, std::ptr::null_mut());
                assert_eq!(cuCtxSynchronize(), CUresult::CUDA_SUCCESS);
                cuMemPoolDestroy(pool);
            }
        }
        println!("RESULT max_size_mib={} pools_alive={n} stopped_by={failure}", max >> 20);
    }
}

/// A job that runs `secs`: on real resources (GPU work, syncing its stream) when
/// `SCENARIO_GPU=1`, else a CPU job registered with raft-exit like the library's own.
fn job(secs: f64) -> Box<dyn FnOnce() + Send> {
    let until = Instant::now() + Duration::from_secs_f64(secs);
    if std::env::var("SCENARIO_GPU").as_deref() == Ok("1") {
        let res = raft::DeviceResources::new().expect("resources");
        let handle = res
            .spawn({
                let res = res.clone();
                move || {
                    let mut v = raft::DeviceVec::<f32>::zeros(&res, 1 << 20).expect("array");
                    while Instant::now() < until {
                        v.fill_zero().expect("memset");
                        res.sync().expect("sync");
                    }
                    println!("RESULT job=finished job_end_ms={}", now_ms());
                }
            })
            .expect("spawn");
        Box::new(move || drop(handle))
    } else {
        let bound = raft_exit::current_exit_wait().expect("exit wait");
        let token = raft_exit::JobToken::register(raft_exit::Label { what: "job", id: raft_exit::next_id(), device: None }, bound);
        std::thread::spawn(move || {
            raft_exit::mark_library_thread();
            std::thread::sleep(until.saturating_duration_since(Instant::now()));
            println!("RESULT job=finished job_end_ms={}", now_ms());
            drop(token);
        });
        Box::new(|| {})
    }
}

/// Work on a CUDA stream that takes `arg` milliseconds (a host function: it runs in stream
/// order and makes no CUDA call, as host functions must not). A release of the stream's
/// resources waits for it, as for any GPU work queued there.
unsafe extern "C" fn stream_work(arg: *mut std::ffi::c_void) {
    use std::io::Write;
    std::thread::sleep(Duration::from_millis(arg as u64));
    let _ = writeln!(std::io::stdout(), "RESULT stream_work=finished");
}

/// Wall-clock milliseconds since the epoch, for exit latencies measured by the parent.
/// Waits until no release is pending (30 s at most, then panics): a dropped memory resource's
/// handle is destroyed on a release thread, so its pool's last copy may go a moment later.
fn settle_releases() {
    let until = Instant::now() + Duration::from_secs(30);
    while raft::stats().pending.releases > 0 || raft::stats().releases_pending > 0 {
        assert!(Instant::now() < until, "releases still pending after 30 s");
        std::thread::sleep(Duration::from_micros(200));
    }
}

fn now_ms() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis()
}

fn mr(device: usize) -> String {
    format!("{:?}", raft::current_memory_resource(device).expect("memory resource"))
}

/// A user's logger that panics on warnings (and writes the rest to stderr): the exit hook logs
/// its skipped teardown at `warn`, so the panic happens inside the hook.
struct PanickingLogger;

impl log::Log for PanickingLogger {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        if record.level() <= log::Level::Warn {
            panic!("the user's logger panicked on: {}", record.args());
        }
        eprintln!("{} {}: {}", record.level(), record.target(), record.args());
    }

    fn flush(&self) {}
}

static PANICKING_LOGGER: PanickingLogger = PanickingLogger;

extern "C" {
    /// The C library's `atexit`, as a user (a coverage tool, a profiler) would call it.
    fn atexit(handler: extern "C" fn()) -> std::ffi::c_int;
}

/// An exit handler of the user's, registered before the first job: it runs only when the exit
/// goes on to the C library's handlers and the static destructors.
extern "C" fn user_exit_handler() {
    use std::io::Write;
    let mut out = std::io::stdout();
    let _ = out.write_all(b"RESULT user_atexit=ran\n");
    let _ = out.flush();
}

/// Prints one call's outcome for the parent: `RESULT key=<kind> key_who=<who>` and the error's
/// full text as `MESSAGE key=<who: message>` (or `RESULT key=ok`).
fn report<T>(key: &str, outcome: &raft::Result<T>) {
    match outcome {
        Ok(_) => println!("RESULT {key}=ok"),
        Err(e) => {
            println!("RESULT {key}={} {key}_who={}", e.kind(), e.who());
            println!("MESSAGE {key}={e}");
        }
    }
}

/// Fault injection, defect 7: resources take cuBLAS handles until device memory runs out (all but
/// 2 GiB of it is taken first by arrays, so that it takes a few dozen handles, not two thousand).
/// The failure must be `OutOfMemory`; once everything is released, new resources take a handle
/// and multiply matrices again.
fn cublas_oom() {
    const HEADROOM: usize = 2 << 30;
    const CHUNK: usize = 16 << 30;
    const MOST_RESOURCES: usize = 4096;
    let first = raft::DeviceResources::new().expect("resources");
    let free = || first.context().mem_get_info().expect("cuMemGetInfo").0;
    println!("RESULT free_mib={}", free() >> 20);
    // cudaMalloc'd, not from the pool (the pool keeps what it frees; cudaFree gives it back), in
    // chunks: one allocation of nearly all the memory may not find a range that large.
    let cuda = raft::MemoryResource::cuda(first.device()).expect("a cuda_memory_resource");
    let mut filler = Vec::new();
    while free() > HEADROOM + (256 << 20) {
        match raft::DeviceVec::<u8>::new_in(&first, (free() - HEADROOM).min(CHUNK), &cuda) {
            Ok(v) => filler.push(v),
            Err(e) => {
                println!("MESSAGE filler={e}");
                break;
            }
        }
    }
    println!("RESULT filled_free_mib={}", free() >> 20);
    let mut all = vec![first];
    let mut failure = None;
    for _ in 0..MOST_RESOURCES {
        let r = match raft::DeviceResources::new() {
            Ok(r) => r,
            Err(e) => {
                failure = Some(("new", e));
                break;
            }
        };
        let handle = r.cublas_handle();
        all.push(r);
        if let Err(e) = handle {
            failure = Some(("cublas", e));
            break;
        }
    }
    let handles = all.iter().filter(|r| r.has_handle(raft::HandleKind::Cublas).unwrap_or(false)).count();
    match &failure {
        Some((step, e)) => {
            println!("RESULT kind={} step={step} handles={handles}", e.kind());
            println!("MESSAGE oom={e}");
        }
        None => println!("RESULT kind=none handles={handles}"),
    }
    let release_errors = all.iter().map(raft::DeviceResources::release).filter(|r| r.is_err()).count();
    println!("RESULT release_errors={release_errors}");
    drop(all);
    drop(filler);
    // The filler's cudaFree runs on a library release thread: wait for it.
    let deadline = Instant::now() + Duration::from_secs(60);
    while (raft::exit::releases_in_flight() > 0 || raft::stats().live_arrays > 0) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let recovered = (|| -> raft::Result<bool> {
        let r = raft::DeviceResources::new()?;
        r.cublas_handle()?;
        let a = raft::DeviceVec::from_host(&r, &[1.0f32, 2.0, 3.0, 4.0])?;
        let b = raft::DeviceVec::from_host(&r, &[0.0f32, 1.0, 1.0, 0.0])?;
        let mut c = raft::DeviceVec::<f32>::zeros(&r, 4)?;
        let layout = raft::Layout::RowMajor;
        raft::gemm(1.0, a.matrix(2, 2, layout)?, b.matrix(2, 2, layout)?, 0.0, c.matrix_mut(2, 2, layout)?)?;
        r.sync()?;
        let product = c.to_host()?;
        r.release()?;
        Ok(product == [2.0, 1.0, 4.0, 3.0])
    })();
    report("recovery", &recovered);
    println!("RESULT recovered={}", if recovered == Ok(true) { "yes" } else { "no" });
}

/// A kernel that stores through a null pointer: an illegal-address fault. PTX, loaded by the
/// driver (the workspace's cudarc has no NVRTC). Volatile, so no compiler drops the store.
const FAULT_PTX: &std::ffi::CStr = c".version 7.0
.target sm_75
.address_size 64

.visible .entry fault()
{
    .reg .b32 %r<2>;
    .reg .b64 %rd<2>;

    mov.u64 %rd1, 0;
    mov.u32 %r1, 1;
    st.volatile.global.u32 [%rd1], %r1;
    ret;
}
";

/// Queues the faulting kernel on `stream` (the module is never unloaded: the context it lives in
/// is lost with the fault anyway).
fn launch_fault(stream: &raft::cudarc::driver::CudaStream) -> raft::Result<()> {
    use raft::cudarc::driver::result as cu;
    const WHO: &str = "launch_fault";
    let driver = |e| raft::Error::driver(WHO, e);
    stream.context().bind_to_thread().map_err(driver)?;
    // SAFETY: the image is a NUL-terminated PTX text, read by the driver up to its NUL.
    let module = unsafe { cu::module::load_data(FAULT_PTX.as_ptr().cast()) }.map_err(driver)?;
    let name = std::ffi::CString::new("fault").expect("no NUL in the name");
    // SAFETY: `module` was just loaded and is never unloaded.
    let function = unsafe { cu::module::get_function(module, name) }.map_err(driver)?;
    // SAFETY: `fault` takes no parameters and the stream is alive (borrowed). Its store faults
    // in the GPU's memory management unit (nothing is mapped at address 0): no memory is
    // written, the device's context is lost, which is what this scenario is about.
    unsafe { cu::launch_kernel(function, (1, 1, 1), (1, 1, 1), 0, stream.cu_stream(), &mut []) }.map_err(driver)
}

/// Fault injection "kernel fault": after an illegal-address kernel on the resources' stream,
/// every call reports the fault as a `Cuda` error; `main` then returns 7 (see soundness.rs).
fn kernel_fault() -> ExitCode {
    let res = raft::DeviceResources::new().expect("resources");
    let stream = res.stream().expect("stream");
    report("launch", &launch_fault(&stream));
    drop(stream);
    report("sync", &res.sync());
    report("zeros", &raft::DeviceVec::<f32>::zeros(&res, 4));
    report("from_host", &raft::DeviceVec::from_host(&res, &[1.0f32, 2.0, 3.0, 4.0]));
    report("release", &res.release());
    println!("RESULT released={}", res.is_released());
    report("new", &raft::DeviceResources::new());
    println!("RESULT main_end_ms={}", now_ms());
    ExitCode::from(7)
}

/// A bad `RAFT_EXIT_WAIT` (set by the parent) refuses a job, under the API the user called; a
/// scoped wait, or a default set in code, still lets jobs be made.
fn spawn_bad_exit_wait() {
    let res = raft::DeviceResources::new().expect("resources");
    report("spawn", &res.spawn(|| ()));
    let scoped = raft::exit::with_exit_wait(1.0, || res.spawn(|| 6 * 7).and_then(raft::JobHandle::join)).expect("a valid wait");
    report("scoped", &scoped);
    raft::exit::set_default_exit_wait(1.0).expect("a valid wait");
    report("after_default", &res.spawn(|| ()).and_then(raft::JobHandle::join));
    res.release().expect("release");
}

fn main() -> ExitCode {
    let name = std::env::args().nth(1).unwrap_or_default();
    if name == "logger-panics-at-exit" {
        log::set_logger(&PANICKING_LOGGER).expect("the first logger");
        log::set_max_level(log::LevelFilter::Trace);
    } else {
        env_logger::Builder::new().parse_filters(&std::env::var("RUST_LOG").unwrap_or_else(|_| "raft=debug".into())).init();
    }
    let wait = env_f64("SCENARIO_WAIT", 10.0);
    let secs = env_f64("SCENARIO_JOB_SECS", 0.5);
    if std::env::var_os("SCENARIO_WAIT").is_some() {
        raft::exit::set_default_exit_wait(wait).expect("a valid wait");
    }
    println!("RESULT start_ms={}", std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis());
    if let Some(every) = std::env::var("SCENARIO_WATCH").ok().and_then(|v| v.parse::<f64>().ok()) {
        // For hang probes: the library's counts every `every` seconds (a hung run's last lines).
        std::thread::spawn(move || loop {
            std::thread::sleep(Duration::from_secs_f64(every));
            let s = raft::stats();
            println!(
                "WATCH releases_pending={} release_threads={} busy_for_ms={} pools_made={} pools_retired={} pools_reused={} live_arrays={}",
                s.releases_pending,
                s.release_threads,
                s.release_busy_for.as_millis(),
                s.async_pools_made,
                s.async_pools_retired,
                s.async_pools_reused,
                s.live_arrays
            );
        });
    }
    match name.as_str() {
        // Exit while a job runs; main returns.
        "job-then-return" => {
            let _keep = job(secs);
        }
        // The user's logger panics inside the exit hook (at its warning of a skipped teardown),
        // while a job outlives its bound; a user's exit handler registered before the first job
        // must not run (the static destructors that follow it would run under the job).
        "logger-panics-at-exit" => {
            // SAFETY: `user_exit_handler` never unwinds (it ignores every write error).
            let rc = unsafe { atexit(user_exit_handler) };
            assert_eq!(rc, 0, "atexit refused the handler");
            let _keep = job(secs);
        }
        // The job itself calls exit.
        "job-calls-exit" => {
            if std::env::var("SCENARIO_GPU").as_deref() == Ok("1") {
                let res = raft::DeviceResources::new().expect("resources");
                let _job = res.spawn(|| std::process::exit(3)).expect("spawn");
            } else {
                let token = raft_exit::JobToken::register(raft_exit::Label { what: "job", id: 1, device: None }, wait);
                std::thread::spawn(move || {
                    raft_exit::mark_library_thread();
                    let _token = token;
                    std::process::exit(3);
                });
            }
            std::thread::sleep(Duration::from_secs(30));
        }
        // std::process::exit from a thread that is not main, while a job runs.
        "exit-from-thread" => {
            let _keep = job(secs);
            std::thread::spawn(|| std::process::exit(0)).join().ok();
            std::thread::sleep(Duration::from_secs(30));
        }
        // A release in flight on a library thread at exit, and no job.
        "release-in-flight" => {
            if std::env::var("SCENARIO_GPU").as_deref() == Ok("1") {
                // A job queues `secs` of work on the resources' stream and returns; once it has
                // ended, dropping the last handle queues the release, which waits for that
                // stream before destroying it: the release, not a job, holds the exit.
                let res = raft::DeviceResources::new().expect("resources");
                let stream = res.stream().expect("stream");
                let ms = (secs * 1000.0) as usize;
                res.spawn(move || {
                    // SAFETY: the stream is alive (this Arc, and the resources, hold it);
                    // `stream_work` makes no CUDA call and reads its argument as a number.
                    unsafe {
                        raft::cudarc::driver::result::stream::launch_host_function(
                            stream.cu_stream(),
                            stream_work,
                            ms as *mut std::ffi::c_void,
                        )
                    }
                })
                .expect("spawn")
                .join()
                .expect("job")
                .expect("cuLaunchHostFunc");
                // The job's token drops just after its result is seen.
                while raft::exit::jobs_in_flight() > 0 {
                    std::thread::sleep(Duration::from_millis(1));
                }
                drop(res);
            } else {
                let token = raft_exit::ReleaseToken::register(raft_exit::Label { what: "release", id: 1, device: None });
                std::thread::spawn(move || {
                    raft_exit::mark_library_thread();
                    std::thread::sleep(Duration::from_secs_f64(secs));
                    println!("RESULT release=finished");
                    drop(token);
                });
            }
            println!("RESULT jobs_at_exit={} releases_at_exit={}", raft::exit::jobs_in_flight(), raft::exit::releases_in_flight());
        }
        // Many resources alive at exit: the teardown releases them all.
        "many-resources" => {
            let n = env_f64("SCENARIO_COUNT", 200.0) as usize;
            let all: Vec<_> = (0..n).map(|_| raft::DeviceResources::new().expect("resources")).collect();
            for r in &all {
                let _ = r.spawn(|| ()).expect("spawn").join();
            }
            println!("RESULT alive={}", raft::stats().unreleased_resources);
            std::mem::forget(all); // still alive when main returns
        }
        // 2.2.3: the first resources on a device install the async pool.
        "mr-default" => {
            let before = mr(0);
            let _r = raft::DeviceResources::new().expect("resources");
            println!("RESULT before={before} after={} installed={}", mr(0), raft::installed_default(0));
        }
        // A user's resource installed beforehand is left alone.
        "mr-user-before" => {
            raft::set_memory_resource(0, raft::MemoryResourceKind::Managed).expect("set");
            let _r = raft::DeviceResources::new().expect("resources");
            println!("RESULT after={} installed={}", mr(0), raft::installed_default(0));
        }
        // A plain cuda_memory_resource installed beforehand equals the default and is replaced.
        "mr-cuda-before" => {
            raft::set_memory_resource(0, raft::MemoryResourceKind::Cuda).expect("set");
            let _r = raft::DeviceResources::new().expect("resources");
            println!("RESULT after={} installed={}", mr(0), raft::installed_default(0));
        }
        // A resource installed after the first resources is left alone by later ones.
        "mr-user-after" => {
            let _a = raft::DeviceResources::new().expect("resources");
            raft::set_memory_resource(0, raft::MemoryResourceKind::Managed).expect("set");
            let _b = raft::DeviceResources::new().expect("resources");
            println!("RESULT after={}", mr(0));
        }
        // Array drops: the pool frees inline, cudaFree goes to a release thread.
        "array-frees" => {
            let r = raft::DeviceResources::new().expect("resources");
            let pooled = raft::DeviceVec::<u8>::zeros(&r, 1 << 20).expect("array");
            let before = raft::stats().releases_done;
            drop(pooled);
            let inline = raft::stats().releases_done == before && raft::stats().releases_pending == 0;
            raft::set_memory_resource(0, raft::MemoryResourceKind::Cuda).expect("set");
            let blocking = raft::DeviceVec::<u8>::zeros(&r, 1 << 20).expect("array");
            drop(blocking);
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while raft::stats().releases_done == before && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            println!(
                "RESULT pool_inline={inline} cuda_on_release_thread={} live_arrays={}",
                raft::stats().releases_done > before,
                raft::stats().live_arrays
            );
        }
        // An array whose free blocks, dropped as main returns: the exit waits for its release.
        "array-drop-at-exit" => {
            let r = raft::DeviceResources::new().expect("resources");
            raft::set_memory_resource(0, raft::MemoryResourceKind::Cuda).expect("set");
            let arrays: Vec<_> = (0..64).map(|_| raft::DeviceVec::<f32>::zeros(&r, 1 << 20).expect("array")).collect();
            drop(arrays); // 64 releases queued as main returns
        }
        // Resources made and used, nothing in flight when main returns.
        "idle-resources" => {
            let r = raft::DeviceResources::new().expect("resources");
            r.spawn(|| ()).expect("spawn").join().expect("join");
        }
        // Several GPUs: a user's resource on the last device is left alone while device 0's
        // default is replaced.
        "mr-two-devices" => {
            let last = raft::device_count().expect("count") - 1;
            raft::set_memory_resource(last, raft::MemoryResourceKind::Managed).expect("set");
            let _all: Vec<_> = (0..=last).map(|d| raft::DeviceResources::on_device(d).expect("resources")).collect();
            println!("RESULT d0={} dlast={} last={last}", mr(0), mr(last));
        }
        // Several GPUs: a process that only ever uses the last device (as one rank per GPU
        // does), never device 0. Each step reports on its own, so a failure names its step.
        "last-device-only" => {
            let last = raft::device_count().expect("count") - 1;
            let res = raft::DeviceResources::on_device(last);
            report("resources", &res);
            let res = res.expect("resources");
            let zeros = raft::DeviceVec::<f32>::zeros(&res, 1 << 16);
            report("zeros", &zeros);
            if let Ok(z) = &zeros {
                println!("RESULT zeros_device={}", raft_tests::device_of(z));
            }
            let host: Vec<f32> = (0..(1 << 16)).map(|i| i as f32).collect();
            let copied = raft::DeviceVec::from_host(&res, &host);
            report("from_host", &copied);
            if let Ok(v) = &copied {
                let back = v.to_host();
                report("to_host", &back);
                println!("RESULT equal={}", back.map(|b| b == host).unwrap_or(false));
            }
            // Device 0's primary context: never made by a process that does not use device 0.
            let mut flags = 0u32;
            let mut active = -1i32;
            // SAFETY: reads the state of device 0's primary context into two valid locals.
            let rc = unsafe { cudarc::driver::sys::cuDevicePrimaryCtxGetState(0, &mut flags, &mut active) };
            println!("RESULT device0_active={active} device0_rc={rc:?}");
            println!("RESULT last={last}");
        }
        // The exit hook registered before RMM's per-device map exists (a thread counted by the
        // exit, made at the start of main), then resources, which make the map and install the
        // async pool: at exit, RMM's own hook and the map's destructor run before this library's
        // teardown, which must not read the destroyed map.
        // The pattern of the rmm tests' rare crash (run 33: a release thread faulted in
        // cuStreamSynchronize waiting for a dropped resources' stream while other release
        // threads destroyed memory resources): threads that each make resources and a CUDA
        // async pool, free an array of it on the stream, then drop the pool and the resources,
        // so that pool destructions and stream waits meet on the release threads.
        "pool-destroy-race" => {
            let threads = env_f64("SCENARIO_THREADS", 8.0) as usize;
            let rounds = env_f64("SCENARIO_ROUNDS", 200.0) as usize;
            std::thread::scope(|s| {
                for _ in 0..threads {
                    s.spawn(move || {
                        for _ in 0..rounds {
                            let res = raft::DeviceResources::new().expect("resources");
                            let mr = raft::MemoryResource::cuda_async_with(0, None, Some(32 << 20)).expect("pool");
                            let mut v = raft::DeviceVec::<u8>::new_in(&res, 1 << 20, &mr).expect("array");
                            v.fill_zero().expect("memset");
                            drop(v);
                            drop(mr);
                            drop(res);
                        }
                    });
                }
            });
            println!("RESULT rounds={}", threads * rounds);
        }
        // Eight threads, each on a stream of its own: each round an async pool whose last copy
        // is an array freed (stream-ordered) on a stream that then goes on working. The pool's
        // Rust handle is dropped first and its release waited for, so the array's copy is the
        // last. Prints how many pools were made, retired and reused once every release has run,
        // what trimming the retired pools then gave back and left, and the device memory taken
        // at the end against the start (device-wide: other processes' too).
        "pool-last-copy-in-array" => {
            let threads = env_f64("SCENARIO_THREADS", 8.0) as usize;
            let rounds = env_f64("SCENARIO_ROUNDS", 100.0) as usize;
            let settle = settle_releases;
            let first = raft::DeviceResources::new().expect("resources");
            let free = || first.context().mem_get_info().expect("cuMemGetInfo").0;
            let mut w = raft::DeviceVec::<u8>::new(&first, 1 << 20).expect("array");
            w.fill_zero().expect("memset");
            drop(w);
            first.sync().expect("sync");
            settle();
            let before = free();
            std::thread::scope(|s| {
                for _ in 0..threads {
                    s.spawn(move || {
                        let res = raft::DeviceResources::new().expect("resources");
                        for _ in 0..rounds {
                            let mr = raft::MemoryResource::cuda_async_with(0, None, Some(32 << 20)).expect("pool");
                            let mut v = raft::DeviceVec::<u8>::new_in(&res, 1 << 20, &mr).expect("array");
                            v.fill_zero().expect("memset");
                            drop(mr);
                            settle();
                            drop(v);
                            let mut w = raft::DeviceVec::<u8>::new(&res, 1 << 20).expect("array");
                            w.fill_zero().expect("memset");
                            drop(w);
                            res.sync().expect("sync");
                        }
                        res.release().expect("release");
                    });
                }
            });
            settle();
            // Every stream that freed into the pools has been waited for (each round syncs,
            // each thread's resources are released): the retired pools hold nothing after a trim.
            let trim = raft::memory::trim_retired_pools().expect("trim");
            let s = raft::stats();
            let taken = before.saturating_sub(free());
            println!(
                "RESULT rounds={} pools_made={} pools_retired={} pools_reused={} trimmed_mib={} still_held={} taken_mib={}",
                threads * rounds,
                s.async_pools_made,
                s.async_pools_retired,
                s.async_pools_reused,
                trim.released >> 20,
                trim.still_held,
                taken >> 20
            );
        }
        // A retired pool handed out again must behave as a new one with the settings asked for:
        // a pool made with a 64 MiB initial size and release threshold 0, used and dropped
        // (retired: threshold 0, trimmed), then one asked for with the same initial size and the
        // default threshold ("never"): it must be the retired pool (reused), primed again, and
        // keep its 64 MiB across a synchronisation.
        "pool-reuse-settings" => {
            const MIB: usize = 1 << 20;
            let res = raft::DeviceResources::new().expect("resources");
            let settle = settle_releases;
            let start = raft::stats();
            let a = raft::MemoryResource::cuda_async_with(0, Some(64 * MIB), Some(0)).expect("pool a");
            let mut v = raft::DeviceVec::<u8>::new_in(&res, MIB, &a).expect("array");
            v.fill_zero().expect("memset");
            drop(v);
            res.sync().expect("sync");
            drop(a);
            settle();
            let mid = raft::stats();
            let b = raft::MemoryResource::cuda_async_with(0, Some(64 * MIB), None).expect("pool b");
            res.sync().expect("sync");
            // A device-wide wait: any release a synchronisation triggers has happened.
            res.context().synchronize().expect("context sync");
            let end = raft::stats();
            let (reserved, used) = b.async_pool_bytes().expect("pool bytes").expect("an async pool");
            println!(
                "RESULT made={} retired={} reused={} reserved_mib={} used={}",
                end.async_pools_made - start.async_pools_made,
                mid.async_pools_retired - start.async_pools_retired,
                end.async_pools_reused - start.async_pools_reused,
                reserved / MIB,
                used
            );
            drop(b);
            res.release().expect("release");
        }
        // Async pools made and dropped while the resources whose streams freed into them live
        // on and keep working (each thread's resources last the whole run): what a user does
        // who tries pool settings in a loop.
        "pool-dies-beside-live-streams" => {
            let threads = env_f64("SCENARIO_THREADS", 8.0) as usize;
            let rounds = env_f64("SCENARIO_ROUNDS", 200.0) as usize;
            std::thread::scope(|s| {
                for _ in 0..threads {
                    s.spawn(move || {
                        let res = raft::DeviceResources::new().expect("resources");
                        let host: Vec<u8> = (0..16 << 20).map(|i| (i % 251) as u8).collect();
                        for _ in 0..rounds {
                            let mr = raft::MemoryResource::cuda_async_with(0, None, Some(32 << 20)).expect("pool");
                            let mut v = raft::DeviceVec::<u8>::new_in(&res, 1 << 20, &mr).expect("array");
                            v.fill_zero().expect("memset");
                            drop(v);
                            drop(mr);
                            let mut w = raft::DeviceVec::<u8>::new(&res, 1 << 20).expect("array");
                            w.fill_zero().expect("memset");
                            res.sync().expect("sync");
                            // Staged copies on this stream, which freed into the pool just
                            // dropped.
                            let staged = raft::Staging::default().from_host(&res, &host).expect("staged upload");
                            assert!(staged.to_host_staged().expect("staged download") == host, "staged round trip");
                        }
                        res.release().expect("release");
                    });
                }
            });
            println!("RESULT rounds={}", threads * rounds);
        }
        // A device's current resource replaced by a fresh async pool and back, 200 times, while
        // arrays made from it through the default path (no resource given) are dropped after
        // the pool's last Rust handle: the array's own copy then destroys the pool. Seven
        // threads keep allocating from whatever is current, syncing, on long-lived resources.
        //
        // For the diagnosis of its hang (GPU run 39): SCENARIO_WORKER_ROUNDS bounds the workers
        // (so a replacer that is only starved while they run still finishes, late), and
        // SCENARIO_WORKER_PAUSE_US pauses them between rounds; the replacer prints its slowest
        // round.
        "pool-dies-default-path" => {
            let rounds = env_f64("SCENARIO_ROUNDS", 200.0) as usize;
            let worker_rounds = env_f64("SCENARIO_WORKER_ROUNDS", f64::INFINITY);
            let pause = Duration::from_secs_f64(env_f64("SCENARIO_WORKER_PAUSE_US", 0.0) / 1e6);
            let stop = std::sync::atomic::AtomicBool::new(false);
            let stop = &stop;
            std::thread::scope(|s| {
                for _ in 0..7 {
                    s.spawn(move || {
                        let res = raft::DeviceResources::new().expect("resources");
                        let mut done = 0.0;
                        while !stop.load(std::sync::atomic::Ordering::Relaxed) && done < worker_rounds {
                            done += 1.0;
                            if !pause.is_zero() {
                                std::thread::sleep(pause);
                            }
                            let mut w = raft::DeviceVec::<u8>::new(&res, 1 << 20).expect("array");
                            w.fill_zero().expect("memset");
                            drop(w);
                            res.sync().expect("sync");
                        }
                        res.release().expect("release");
                    });
                }
                s.spawn(move || {
                    // The workers stop when this thread ends, also by a panic: a failure here is
                    // then a failure of the scenario, not a hang.
                    struct StopOnDrop<'a>(&'a std::sync::atomic::AtomicBool);
                    impl Drop for StopOnDrop<'_> {
                        fn drop(&mut self) {
                            self.0.store(true, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                    let _stop_workers = StopOnDrop(stop);
                    let res = raft::DeviceResources::new().expect("resources");
                    let mut slowest = Duration::ZERO;
                    for _ in 0..rounds {
                        let round = Instant::now();
                        let pool = raft::MemoryResource::cuda_async_with(0, None, Some(32 << 20)).expect("pool");
                        let previous = raft::memory::set_current(0, &pool).expect("set_current");
                        let mut v = raft::DeviceVec::<u8>::new(&res, 1 << 20).expect("array");
                        v.fill_zero().expect("memset");
                        raft::memory::set_current(0, &previous).expect("set_current back");
                        drop(pool);
                        drop(v);
                        let mut w = raft::DeviceVec::<u8>::new(&res, 1 << 20).expect("array");
                        w.fill_zero().expect("memset");
                        res.sync().expect("sync");
                        slowest = slowest.max(round.elapsed());
                    }
                    println!("RESULT slowest_round_ms={:.1}", slowest.as_secs_f64() * 1e3);
                    res.release().expect("release");
                });
            });
            println!("RESULT rounds={rounds}");
        }
        // Runs 37-38's pattern without this library, RMM or RAFT: the driver API alone, to tell
        // a driver hazard from ours. 8 threads × 200 rounds: a stream (a reused one when
        // SCENARIO_REUSE=1), a fresh async pool, 1 MiB from it on the stream, a memset, a
        // stream-ordered free; then the pool goes to a destroyer thread (which first waits for
        // the context when SCENARIO_DEVICE_SYNC=1) and the stream to a releaser thread (which
        // synchronises it, then destroys it or keeps it for reuse), as release threads do.
        "raw-pool-streams" => raw_pool_streams(),
        "hook-before-rmm-map" => {
            raft_exit::register_exit_hook();
            let res = raft::DeviceResources::new().expect("resources");
            let v = raft::DeviceVec::<f32>::zeros(&res, 1 << 10).expect("array");
            drop(v);
            println!("RESULT made=ok");
        }
        // A GPU job in flight on every device when main returns.
        "jobs-every-device" => {
            let until = std::time::Instant::now() + Duration::from_secs_f64(secs);
            let handles: Vec<_> = (0..raft::device_count().expect("count"))
                .map(|d| {
                    let r = raft::DeviceResources::on_device(d).expect("resources");
                    let rr = r.clone();
                    r.spawn(move || {
                        let mut v = raft::DeviceVec::<f32>::zeros(&rr, 1 << 20).expect("array");
                        while std::time::Instant::now() < until {
                            v.fill_zero().expect("memset");
                            rr.sync().expect("sync");
                        }
                        println!("RESULT job_on_{d}=finished");
                    })
                    .expect("spawn")
                })
                .collect();
            drop(handles);
        }
        // Nothing that makes a job or a release: no exit hook.
        "no-jobs" => {
            let _ = raft::device_count();
            println!("RESULT abi={} hook={}", raft::abi().raft, raft_exit::hook_registered());
        }
        // The exit wait as read on the main thread (RAFT_EXIT_WAIT at first use).
        "read-wait" => match raft::exit::current_exit_wait() {
            Ok(v) => println!("RESULT wait={v}"),
            Err(e) => println!("ERROR {}", raft::Error::from(e)),
        },
        // Issue 13, defect 7: device memory exhausted by cuBLAS handles, then recovered.
        "cublas-oom" => cublas_oom(),
        // Issue 13: a kernel fault on the resources' stream; main returns 7.
        "kernel-fault" => return kernel_fault(),
        // A bad RAFT_EXIT_WAIT makes `spawn` fail as `DeviceResources::spawn`.
        "spawn-bad-exit-wait" => spawn_bad_exit_wait(),
        other => {
            eprintln!("unknown scenario {other:?}");
            std::process::exit(2);
        }
    }
    println!("RESULT main_end_ms={}", now_ms());
    // The status main returns (`SCENARIO_STATUS`, else 0): the exit must end with it.
    ExitCode::from(std::env::var("SCENARIO_STATUS").ok().and_then(|v| v.parse::<u8>().ok()).unwrap_or(0))
}
