//! tls-exit: exit-time behaviour that needs a process of its own, run by tests/tests/memory.rs.
//! It prints `RESULT key=value` lines for the parent to check.
//!
//! `tls-exit last-error` (issue 13, defect 5): a failing shim call from an `atexit` handler.
//! glibc runs the thread-local destructors of the exiting thread *before* the exit handlers, so
//! the shim's last-error message, written by every failing call, must not be a C++ object with
//! a destructor (d3ada27 had `thread_local std::string last_error`: the handler's failure
//! assigned to a destroyed string, writing into freed memory). Run it under valgrind. It needs a
//! machine where the CUDA runtime fails (no driver): with a GPU every shim call that can fail
//! is checked in Rust first or fails as a CUDA API error that compute-sanitizer reports, so
//! there it prints `SKIP` and exits 0.
//!
//! `tls-exit user-async-before | user-async-after | library-pool` (issue 13, "Departures"):
//! which resource is device 0's current once the exit teardown has run, read by a teardown
//! step added after raft-core's. The teardown puts RMM's initial resource back only where the
//! pool this library installed is still current; d3ada27 reset any `CudaAsync` resource, also
//! one the user installed after the first resources.
use raft::MemoryResource;
use std::io::Write;
use std::process::ExitCode;
use std::sync::OnceLock;

extern "C" {
    /// The C library's `atexit`, as a user would call it.
    fn atexit(handler: extern "C" fn()) -> std::ffi::c_int;
}

fn main() -> ExitCode {
    let mode = std::env::args().nth(1).unwrap_or_else(|| "last-error".into());
    match mode.as_str() {
        "last-error" => last_error(),
        "user-async-before" | "user-async-after" | "library-pool" => {
            env_logger::Builder::new().parse_filters(&std::env::var("RUST_LOG").unwrap_or_else(|_| "raft=debug".into())).init();
            teardown(&mode)
        }
        other => {
            eprintln!("unknown mode {other:?}: last-error | user-async-before | user-async-after | library-pool");
            ExitCode::from(2)
        }
    }
}

/// Writes straight to stdout and flushes: also usable from exit handlers.
fn say(text: &str) {
    let mut out = std::io::stdout();
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
}

fn last_error() -> ExitCode {
    // The first failing call: the shim's message now lives in this (the main) thread's
    // thread-local, as it would in any program that handled an error before exiting.
    match raft::device_count() {
        Ok(n) => {
            say(&format!(
                "SKIP a CUDA driver answers here ({n} device(s)): no shim call fails on the main thread without a CUDA API error\n"
            ));
            return ExitCode::SUCCESS;
        }
        Err(e) => say(&format!("MAIN {e}\n")),
    }
    // SAFETY: `after_thread_locals` never unwinds (it catches every panic); atexit only stores
    // the pointer.
    let rc = unsafe { atexit(after_thread_locals) };
    say(&format!("RESULT registered={}\n", rc == 0));
    if rc == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(3)
    }
}

/// Runs after main returned, once glibc has run the main thread's thread-local destructors:
/// the same failing shim call again.
extern "C" fn after_thread_locals() {
    let line = std::panic::catch_unwind(|| match raft::device_count() {
        Ok(n) => format!("RESULT at_exit=ok devices={n}\n"),
        Err(e) => format!("RESULT at_exit=failed\nAT_EXIT {e}\n"),
    })
    .unwrap_or_else(|_| "RESULT at_exit=panicked\n".into());
    say(&line);
}

/// The user's resource, kept for the teardown step to compare with.
static USER: OnceLock<MemoryResource> = OnceLock::new();

fn install_user_pool() {
    let pool = MemoryResource::cuda_async(0).expect("a cudaMallocAsync pool of the user's");
    let _previous = raft::memory::set_current(0, &pool).expect("set_current");
    USER.set(pool).expect("one user pool");
}

fn teardown(mode: &str) -> ExitCode {
    if mode == "user-async-before" {
        install_user_pool();
    }
    let res = raft::DeviceResources::on_device(0).expect("the first resources");
    if mode == "user-async-after" {
        install_user_pool();
    }
    // The first job registers the exit hook, whose teardown is under test.
    res.spawn(|| ()).expect("spawn").join().expect("join");
    // Added after the first resources added raft-core's steps: runs after them, inside the
    // hook, while CUDA and RMM are still up.
    raft_exit::on_teardown(report_after_teardown);
    let now = raft::memory::current(0).map(|m| format!("{:?}", m.kind())).unwrap_or_else(|_| "error".into());
    say(&format!("RESULT installed={} before_exit={now}\n", raft::installed_default(0)));
    ExitCode::SUCCESS
}

fn report_after_teardown() {
    let current = MemoryResource::current(0);
    let kind = match &current {
        Ok(c) => format!("{:?}", c.kind()),
        Err(_) => "error".into(),
    };
    let user_kept = match (USER.get(), &current) {
        (Some(user), Ok(c)) => c.same_as(user).map(|b| b.to_string()).unwrap_or_else(|_| "error".into()),
        (None, _) => "none".into(),
        (Some(_), Err(_)) => "error".into(),
    };
    say(&format!("RESULT teardown_current={kind} user_kept={user_kept}\n"));
}
