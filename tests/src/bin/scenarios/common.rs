//! What several scenarios share: the jobs and works that hold an exit, the clocks and outcome
//! lines the parent reads, and the user-side hooks (logger, `atexit`) the exit must survive.
use std::time::{Duration, Instant};

/// A job that runs `secs`: on real resources (GPU work, syncing its stream) when
/// `SCENARIO_GPU=1`, else a CPU job registered with raft-exit like the library's own.
pub(crate) fn job(secs: f64) -> Box<dyn FnOnce() + Send> {
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
pub(crate) unsafe extern "C" fn stream_work(arg: *mut std::ffi::c_void) {
    use std::io::Write;
    std::thread::sleep(Duration::from_millis(arg as u64));
    let _ = writeln!(std::io::stdout(), "RESULT stream_work=finished");
}

/// Waits until no release is pending (30 s at most, then panics): a dropped memory resource's
/// handle is destroyed on a release thread, so its pool's last copy may go a moment later.
pub(crate) fn settle_releases() {
    raft_tests::settle_releases(Duration::from_secs(30));
}

/// Wall-clock milliseconds since the epoch, for exit latencies measured by the parent.
pub(crate) fn now_ms() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis()
}

pub(crate) fn mr(device: usize) -> String {
    format!("{:?}", raft::memory::current(device).expect("memory resource").kind())
}

/// A user's logger that panics on warnings (and writes the rest to stderr): the exit hook logs
/// its skipped teardown at `warn`, so the panic happens inside the hook.
pub(crate) struct PanickingLogger;

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

pub(crate) static PANICKING_LOGGER: PanickingLogger = PanickingLogger;

extern "C" {
    /// The C library's `atexit`, as a user (a coverage tool, a profiler) would call it.
    pub(crate) fn atexit(handler: extern "C" fn()) -> std::ffi::c_int;
}

/// An exit handler of the user's, registered before the first job: it runs only when the exit
/// goes on to the C library's handlers and the static destructors.
pub(crate) extern "C" fn user_exit_handler() {
    use std::io::Write;
    let mut out = std::io::stdout();
    let _ = out.write_all(b"RESULT user_atexit=ran\n");
    let _ = out.flush();
}

/// Prints one call's outcome for the parent: `RESULT key=<kind> key_who=<who>` and the error's
/// full text as `MESSAGE key=<who: message>` (or `RESULT key=ok`).
pub(crate) fn report<T>(key: &str, outcome: &raft::Result<T>) {
    match outcome {
        Ok(_) => println!("RESULT {key}=ok"),
        Err(e) => {
            println!("RESULT {key}={} {key}_who={}", e.kind(), e.who());
            println!("MESSAGE {key}={e}");
        }
    }
}
