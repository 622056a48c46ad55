//! The exit hook: registered with `atexit` when the first job or release is made; at exit it
//! waits for what is in flight, then tears down or, when the wait runs out, leaks.
use crate::registry::{Outcome, Registry};
use std::cell::Cell;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Mutex, Once};
use std::time::{Duration, Instant};

pub(crate) static REGISTRY: Registry = Registry::new();

/// How long releases may still run once no job runs.
pub(crate) const RELEASE_GRACE: Duration = Duration::from_secs(1);

/// Where the process is in its exit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    /// No exit has begun.
    Running = 0,
    /// The exit hook is waiting for jobs and releases.
    Waiting = 1,
    /// Everything drained; the teardown runs.
    TearingDown = 2,
    /// The teardown ran.
    TornDown = 3,
    /// The teardown was skipped: native objects are leaked to the OS.
    Skipped = 4,
}

static PHASE: AtomicU8 = AtomicU8::new(Phase::Running as u8);
static HOOK: Once = Once::new();
static TEARDOWNS: Mutex<Vec<fn()>> = Mutex::new(Vec::new());

thread_local! {
    /// Set on job workers and release threads (const, no destructor: readable during exit).
    static LIBRARY_THREAD: Cell<bool> = const { Cell::new(false) };
}

/// Where the process is in its exit.
pub fn phase() -> Phase {
    match PHASE.load(Ordering::Acquire) {
        0 => Phase::Running,
        1 => Phase::Waiting,
        2 => Phase::TearingDown,
        3 => Phase::TornDown,
        _ => Phase::Skipped,
    }
}

fn set_phase(p: Phase) {
    PHASE.store(p as u8, Ordering::Release);
}

/// Whether a release may still call into CUDA: not once the exit has decided (a release made
/// after that would run under the C++ static destructors), except the teardown's own.
pub fn native_release_allowed() -> bool {
    matches!(phase(), Phase::Running | Phase::Waiting | Phase::TearingDown)
}

/// Whether the exit has begun (the hook is running or has run).
pub fn exiting() -> bool {
    phase() != Phase::Running
}

/// Marks the calling thread as a library thread (a job worker or a release thread): an exit
/// called from it skips the teardown at once instead of waiting for itself.
pub fn mark_library_thread() {
    let _ = LIBRARY_THREAD.try_with(|f| f.set(true));
}

/// Whether the calling thread is a library thread.
pub fn on_library_thread() -> bool {
    LIBRARY_THREAD.try_with(Cell::get).unwrap_or(false)
}

/// Adds a teardown step, run once by the exit hook when everything drained in time (in the
/// order added). Used by `raft-core` to release live resources and its memory resources.
pub fn on_teardown(step: fn()) {
    TEARDOWNS.lock().unwrap_or_else(|e| e.into_inner()).push(step);
}

#[cfg(target_env = "gnu")]
extern "C" {
    /// glibc's `on_exit`: like `atexit`, but the handler receives the exit status.
    fn on_exit(function: extern "C" fn(libc::c_int, *mut libc::c_void), arg: *mut libc::c_void) -> libc::c_int;
}

/// Registers the hook with the C library's exit handlers, once.
pub(crate) fn ensure_registered() {
    HOOK.call_once(|| {
        #[cfg(target_env = "gnu")]
        // SAFETY: `exit_hook_with_status` never unwinds (it catches every panic) and uses no
        // argument; on_exit only stores the pointer.
        let rc = unsafe { on_exit(exit_hook_with_status, std::ptr::null_mut()) };
        #[cfg(not(target_env = "gnu"))]
        // SAFETY: `exit_hook` never unwinds (it catches every panic); atexit only stores it.
        let rc = unsafe { libc::atexit(exit_hook) };
        if rc != 0 {
            log::warn!(target: "raft", "the C library refused the exit hook ({rc}): exits will not wait for GPU jobs");
        }
    });
}

/// Whether the hook was registered (the first job or release was made).
pub fn hook_registered() -> bool {
    HOOK.is_completed()
}

#[cfg(target_env = "gnu")]
extern "C" fn exit_hook_with_status(status: libc::c_int, _arg: *mut libc::c_void) {
    // A panic must not unwind into libc; there is nothing to do with one at exit.
    let end_now = std::panic::catch_unwind(run_hook).unwrap_or(false);
    if end_now {
        // Something still runs on the GPU: the C++ static destructors that would run next
        // (libcudart's, RMM's per-device map) would tear CUDA down under it and crash the
        // process. End it here with its own status; the OS reclaims what was leaked.
        // SAFETY: fflush(NULL) flushes every C stdio stream; _exit ends the process at once.
        unsafe {
            libc::fflush(std::ptr::null_mut());
            libc::_exit(status);
        }
    }
}

#[cfg(not(target_env = "gnu"))]
extern "C" fn exit_hook() {
    // Without on_exit the status is unknown, so the process cannot be ended here: the
    // teardown is still skipped, but the static destructors run.
    let _ = std::panic::catch_unwind(run_hook);
}

fn list<T: std::fmt::Display>(items: &[T]) -> String {
    if items.is_empty() {
        return "none".into();
    }
    items.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
}

/// Waits, then tears down or skips; returns whether the process must end at once (something
/// other than the exiting thread still runs).
fn run_hook() -> bool {
    let start = Instant::now();
    set_phase(Phase::Waiting);
    if on_library_thread() {
        set_phase(Phase::Skipped);
        let jobs = REGISTRY.jobs_now();
        let releases = REGISTRY.releases_in_flight();
        log::warn!(
            target: "raft",
            "exit called from a job or release thread: teardown skipped; jobs still running: {}; releases still running: {}",
            list(&jobs),
            releases
        );
        // The exiting thread holds one of them itself.
        return jobs.len() + releases > 1;
    }
    let in_flight = REGISTRY.jobs_now();
    match REGISTRY.wait_for_drain(start, RELEASE_GRACE) {
        Outcome::Drained { waited } => {
            set_phase(Phase::TearingDown);
            log::debug!(
                target: "raft",
                "exit: jobs in flight: {}; waited {:.3} s; tearing down",
                list(&in_flight),
                waited.as_secs_f64()
            );
            let steps = TEARDOWNS.lock().unwrap_or_else(|e| e.into_inner()).clone();
            for step in steps {
                let _ = std::panic::catch_unwind(step);
            }
            set_phase(Phase::TornDown);
            false
        }
        Outcome::TimedOut { waited, jobs, releases } => {
            set_phase(Phase::Skipped);
            log::warn!(
                target: "raft",
                "exit: teardown skipped after waiting {:.3} s; jobs still running: {}; releases still running: {}",
                waited.as_secs_f64(),
                list(&jobs),
                list(&releases)
            );
            true
        }
    }
}
