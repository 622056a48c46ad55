//! A user's exit handler that calls the library after the library's exit teardown has run (the
//! twenty-third audit's open item): C libraries run exit handlers in the reverse order of their
//! registration, so a handler registered before the library's exit hook runs after it.
use std::io::Write;
use std::sync::Mutex;

/// What main made before the exit, for the handler to use and drop after the teardown (GPU).
struct Kept {
    res: raft::DeviceResources,
    /// From the device's default resource (the async pool: its drop would free inline).
    pooled: raft::DeviceVec<f32>,
    /// From `cudaMalloc` (its drop would queue the free on a release thread).
    plain: raft::DeviceVec<f32>,
    cuda: raft::MemoryResource,
    pinned: raft::PinnedVec<f32>,
}

static KEPT: Mutex<Option<Kept>> = Mutex::new(None);

/// `library-after-teardown`: registers [`after_teardown`] with `atexit` where
/// `SCENARIO_HANDLER` says, which decides what is already torn down when it runs (exit handlers
/// run in the reverse order of their registration; all three run after the library's hook):
/// - `first` (the default): first thing in main; it runs after RMM's per-device map and the CUDA
///   runtime's static state are destroyed;
/// - `after-shim` (GPU): after the shim and the CUDA runtime are loaded (`device_count`), before
///   the first resources make RMM's map: it runs after the map's destruction, the runtime alive;
/// - `after-first-use` (GPU): after the first resources, before the exit hook: it runs before
///   RMM's map and the runtime are torn down.
///
/// With `SCENARIO_GPU=1` main makes resources, arrays, a memory resource and pinned memory and
/// leaves them to the handler; a job registers the exit hook. Without a GPU the hook is
/// registered directly. Main returns `SCENARIO_STATUS`.
pub(crate) fn library_after_teardown() {
    let gpu = std::env::var("SCENARIO_GPU").as_deref() == Ok("1");
    let at = std::env::var("SCENARIO_HANDLER").unwrap_or_else(|_| "first".into());
    if at == "first" {
        register();
    }
    if gpu {
        raft::device_count().expect("a device count");
        if at == "after-shim" {
            register();
        }
        let res = raft::DeviceResources::new().expect("resources");
        if at == "after-first-use" {
            register();
        }
        let pooled = raft::DeviceVec::<f32>::zeros(&res, 1 << 20).expect("an array of the default resource");
        let cuda = raft::MemoryResource::cuda(0).expect("a cuda resource");
        let plain = raft::DeviceVec::<f32>::new_in(&res, 1 << 20, &cuda).expect("an array of cudaMalloc");
        let pinned = raft::PinnedVec::<f32>::new(&res, 1 << 10).expect("pinned memory");
        res.spawn(|| ()).expect("a job").join().expect("the job"); // registers the exit hook
        *KEPT.lock().unwrap_or_else(|e| e.into_inner()) = Some(Kept { res, pooled, plain, cuda, pinned });
    } else {
        raft_exit::register_exit_hook();
    }
    println!("RESULT hook_registered={} main_returns=1", raft_exit::hook_registered());
}

fn register() {
    // The handler runs after the hook only when registered before it.
    println!("RESULT hook_before_handler={}", raft_exit::hook_registered());
    // SAFETY: `after_teardown` never unwinds (it catches every panic and ignores write errors).
    assert_eq!(unsafe { super::common::atexit(after_teardown) }, 0, "atexit refused the handler");
}

/// One line to stdout, flushed (Rust's stdout is already cleaned up at this point of the exit;
/// a failed write is ignored: this runs inside the C library's exit).
fn say(line: String) {
    let mut out = std::io::stdout();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// `RESULT key=<kind> key_reason=<reason>` and `MESSAGE key=<who: message>`, or `RESULT key=ok`.
fn outcome<T>(key: &str, made: raft::Result<T>) {
    match made {
        // Whatever was made is leaked: its drop is the point of another step.
        Ok(made) => {
            std::mem::forget(made);
            say(format!("RESULT {key}=ok"));
        }
        Err(e) => {
            say(format!("RESULT {key}={} {key}_reason={}", e.kind(), e.reason()));
            say(format!("MESSAGE {key}={e}"));
        }
    }
}

extern "C" fn after_teardown() {
    let ran = std::panic::catch_unwind(|| {
        say(format!("RESULT phase={:?}", raft::exit::phase()));
        outcome("new", raft::DeviceResources::new());
        outcome("on_device", raft::DeviceResources::on_device(0));
        outcome("current", raft::current_device_resources(0));
        outcome("mr_cuda", raft::MemoryResource::cuda(0));
        outcome("mr_current", raft::memory::current(0));
        let kept = KEPT.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(kept) = kept {
            outcome("alloc", raft::DeviceVec::<f32>::new(&kept.res, 16));
            outcome("alloc_in", raft::DeviceVec::<f32>::new_in(&kept.res, 16, &kept.cuda));
            outcome("pinned_new", raft::PinnedVec::<f32>::new(0usize, 16));
            outcome("set_current", raft::memory::set_current(0, &kept.cuda));
            outcome("spawn", kept.res.spawn(|| ()));
            outcome("sync", kept.res.sync());
            // Made before the exit, dropped after the teardown: each drop must leave its native
            // object to the OS (no CUDA, RAFT or RMM call), never crash or wait.
            let Kept { res, pooled, plain, cuda, pinned } = kept;
            drop((pooled, plain, pinned));
            drop((cuda, res));
            say("RESULT dropped=ok".into());
        }
    });
    say(format!("RESULT handler={}", if ran.is_ok() { "ran" } else { "panicked" }));
}
