//! The exit hook: registered with `on_exit` (glibc; `atexit` elsewhere) when the first job,
//! release, communicator, queued copy or tracking memory resource is made (jobs and releases
//! through their tokens, the others through [`ensure_registered`]); at exit it waits for what is
//! in flight, then tears down or, when the wait runs out, leaks.
use crate::phase::{set_phase, Phase};
use crate::registry::{Outcome, REGISTRY};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, Once};
use std::time::{Duration, Instant};

/// How long releases may still run once no job runs.
pub(crate) const RELEASE_GRACE: Duration = Duration::from_secs(1);

static HOOK: Once = Once::new();
static TEARDOWNS: Mutex<Vec<fn()>> = Mutex::new(Vec::new());

thread_local! {
    /// Set on job workers and release threads (const, no destructor: readable during exit).
    static LIBRARY_THREAD: Cell<bool> = const { Cell::new(false) };
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

/// Set by a teardown step that left something running on another thread (a lend of resources
/// that did not end within its bound): the hook then ends the process with `_exit` after the
/// steps, as when a job outlives its bound, so that no static destructor runs under that thread.
static LEFT_RUNNING: AtomicBool = AtomicBool::new(false);

/// Tells the exit hook, from a teardown step, that something still runs on another thread and
/// may use what the C++ static destructors would destroy: the process ends after the teardown,
/// with its exit status, without running them (glibc, whose `on_exit` gives the hook the status;
/// elsewhere the exit goes on).
pub fn teardown_left_running() {
    LEFT_RUNNING.store(true, Ordering::SeqCst);
}

/// [`teardown_left_running`], then `why` logged through [`log_guarded`]: the record first, so a
/// user's logger that panics cannot drop it (the sixteenth audit).
pub fn left_running_saying(why: impl FnOnce()) {
    teardown_left_running();
    log_guarded(why);
}

/// One step of a teardown over many objects (one object's release or abort): a panic in it (a
/// user's logger, called on the way) neither stops the steps after it nor lets the exit go on
/// as if that object had ended: it counts as left running, its payload leaked.
pub fn teardown_step(step: impl FnOnce()) {
    if let Err(payload) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(step)) {
        std::mem::forget(payload);
        teardown_left_running();
    }
}

#[cfg(target_env = "gnu")]
extern "C" {
    /// glibc's `on_exit`: like `atexit`, but the handler receives the exit status.
    fn on_exit(function: extern "C" fn(libc::c_int, *mut libc::c_void), arg: *mut libc::c_void) -> libc::c_int;
}

/// Registers the hook with the C library's exit handlers, once (registering a job or release
/// does it too). For teardown steps that must run in a process that may never make
/// any of them, such as the tracking report of leaked allocations.
pub fn ensure_registered() {
    let mut refused = 0;
    HOOK.call_once(|| {
        #[cfg(target_env = "gnu")]
        // SAFETY: `exit_hook_with_status` never unwinds (it catches every panic) and uses no
        // argument; on_exit only stores the pointer.
        let rc = unsafe { on_exit(exit_hook_with_status, std::ptr::null_mut()) };
        #[cfg(not(target_env = "gnu"))]
        // SAFETY: `exit_hook` never unwinds (it catches every panic); atexit only stores it.
        let rc = unsafe { libc::atexit(exit_hook) };
        refused = rc;
    });
    watch_forks();
    // Logged outside the `Once`: a panicking logger would poison it, and every later job's
    // registration would panic (the fourteenth audit, low).
    if refused != 0 {
        log_guarded(|| log::warn!(target: "raft", "the C library refused the exit hook ({refused}): exits will not wait for GPU jobs"));
    }
}

/// Marks the child of any later `fork()` (see `forked_child`), once; the exit hook's registration
/// does it, and so does the library's first CUDA use.
pub fn watch_forks() {
    static WATCH: Once = Once::new();
    WATCH.call_once(|| {
        // SAFETY: `forked_child` touches two atomics only (async-signal-safe, as a fork's child
        // handler must be) and never unwinds; pthread_atfork only stores the pointer.
        let _ = unsafe { libc::pthread_atfork(None, None, Some(forked_child)) };
    });
}

/// Whether the hook was registered (the first job, release or communicator was made).
pub fn hook_registered() -> bool {
    HOOK.is_completed()
}

/// The exit hook (glibc, which passes the exit status): waits for what is in flight, then
/// either tears down and lets the exit go on, or skips the teardown and ends the process at
/// once with its own status (`_exit`).
///
/// # Handlers that do not run after a skipped teardown
/// The C library runs exit handlers in the reverse order of their registration, and `_exit`
/// ends the process without the rest. So after a skipped teardown:
/// - handlers registered *after* this hook (after the process's first job, release or
///   communicator) have already run: they are unaffected;
/// - handlers registered *before* it (before the first job, release or communicator; LLVM's
///   coverage writer and profilers usually register at start-up), the C++ static destructors
///   and the C++ streams' flush do not run. C stdio streams are flushed here, and Rust's
///   stdout was flushed before the exit began.
///
/// Workaround: register such a handler after the first job (then it runs before the hook), or
/// flush its data yourself before exiting (`__llvm_profile_write_file`, `__gcov_dump`, …).
#[cfg(target_env = "gnu")]
extern "C" fn exit_hook_with_status(status: libc::c_int, _arg: *mut libc::c_void) {
    if crate::phase::forked() || run_hook_guarded() {
        // Something still runs on the GPU (or the teardown did not run): the C++ static
        // destructors that would run next (libcudart's, RMM's per-device map) would tear CUDA
        // down under it and crash the process. End it here with its own status; the OS
        // reclaims what was leaked.
        // SAFETY: fflush(NULL) flushes every C stdio stream and takes no pointer of ours;
        // _exit ends the process at once, without returning into the C library's exit.
        unsafe {
            libc::fflush(std::ptr::null_mut());
            libc::_exit(status);
        }
    }
}

/// The exit hook without the exit status (no `on_exit`): the process cannot be ended here
/// with its own status, so after a skipped teardown the static destructors still run.
#[cfg(not(target_env = "gnu"))]
extern "C" fn exit_hook() {
    if !crate::phase::forked() {
        let _ = run_hook_guarded();
    }
}

/// The child of a `fork()` (Python's `os.fork`, a prefork server's workers) inherits the exit
/// hook, the registry's entries and every lock as it was, but none of the library's threads:
/// the jobs and releases it lists never end there, a lock another thread held at the fork is
/// never let go, and CUDA may not be used until an `exec` (the eighteenth audit: such a child's
/// `exit` waited out every job's bound, or for ever). Marked here, in the child, before anything
/// else runs: the exit decided as skipped (drops leak, no job or release is taken, no CUDA call
/// is made), and the hook ends the child at once, touching no lock.
extern "C" fn forked_child() {
    crate::phase::mark_forked();
}

/// Runs the hook; returns whether the process must end at once. A panic must not unwind into
/// the C library, nor let the exit go on as if the hook had decided to: after one, the phase
/// and the registry decide (see `Registry::settle_after_panic`).
fn run_hook_guarded() -> bool {
    match std::panic::catch_unwind(run_hook) {
        Ok(end_now) => end_now,
        Err(payload) => {
            // Dropping the payload could run a panicking destructor; at exit, leak it.
            std::mem::forget(payload);
            REGISTRY.settle_after_panic(usize::from(on_library_thread()))
        }
    }
}

/// Logs through the user's logger, which may panic: the hook's decision is already made by
/// then, and a panic in the logger must not change it (nor stop the teardown). For every log
/// line of a path that must finish whatever the logger does (the teardown's steps, a worker's
/// loop); the payload of a logger's panic is leaked, never dropped (its `Drop` may panic too).
pub fn log_guarded(log: impl FnOnce()) {
    if let Err(payload) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(log)) {
        std::mem::forget(payload);
    }
}

fn list<T: std::fmt::Display>(items: &[T]) -> String {
    if items.is_empty() {
        return "none".into();
    }
    items.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
}

/// Waits, then tears down or skips; returns whether the process must end at once (always on a
/// library thread; otherwise when something still runs after the wait or the teardown). The
/// decision itself is made in the registry, under its lock, so that no job is registered past
/// it.
fn run_hook() -> bool {
    let start = Instant::now();
    set_phase(Phase::Waiting);
    if on_library_thread() {
        let (jobs, releases) = REGISTRY.skip_now();
        log_guarded(|| {
            log::warn!(
                target: "raft",
                "exit called from a job or release thread: teardown skipped; jobs still running: {}; releases still running: {}",
                list(&jobs),
                releases
            )
        });
        // Ended at once, whatever else counts as in flight: the teardown is skipped, and a use
        // on a user's thread (a lend, a sync, an allocation: not counted here) may be inside
        // CUDA or RAFT, under which the static destructors registered before the hook would
        // pull the runtime away (the fourteenth audit: only jobs and releases beside the
        // exiting one ended it; otherwise the exit went on into those destructors).
        return true;
    }
    let in_flight = REGISTRY.jobs_now();
    match REGISTRY.wait_and_decide(start, RELEASE_GRACE) {
        Outcome::Drained { waited } => {
            log_guarded(|| {
                log::debug!(
                    target: "raft",
                    "exit: jobs in flight: {}; waited {:.3} s; tearing down",
                    list(&in_flight),
                    waited.as_secs_f64()
                )
            });
            let steps = TEARDOWNS.lock().unwrap_or_else(|e| e.into_inner()).clone();
            for step in steps {
                if let Err(payload) = std::panic::catch_unwind(step) {
                    std::mem::forget(payload);
                }
            }
            set_phase(Phase::TornDown);
            let left = LEFT_RUNNING.load(Ordering::SeqCst);
            if left {
                log_guarded(
                    || log::warn!(target: "raft", "exit: the teardown left resources in use on another thread: the process ends now, without the static destructors"),
                );
            }
            left
        }
        Outcome::TimedOut { waited, jobs, releases } => {
            log_guarded(|| {
                log::warn!(
                    target: "raft",
                    "exit: teardown skipped after waiting {:.3} s; jobs still running: {}; releases still running: {}",
                    waited.as_secs_f64(),
                    list(&jobs),
                    list(&releases)
                )
            });
            true
        }
    }
}
