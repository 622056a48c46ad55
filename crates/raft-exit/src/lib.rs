//! Exiting while GPU jobs run, made safe and predictable.
//!
//! A CUDA program whose worker threads still run when the process exits tends to crash in the
//! static destructors (`cudaErrorCudartUnloading`, "driver shutting down", a segfault in
//! libcuda) or to hang. This crate knows jobs, releases and the exit, not RAFT:
//!
//! - the **exit wait** ([`current_exit_wait`], [`with_exit_wait`], `RAFT_EXIT_WAIT`): how long
//!   the exit may wait for a job, read when the job is made, on the calling thread; given in
//!   seconds or as a `Duration` ([`ExitWait`]);
//! - the **registry** ([`JobToken`], [`ReleaseToken`]): what is in flight;
//! - the **exit hook**, registered with `on_exit` (glibc; `atexit` elsewhere) by the first job,
//!   release, communicator, queued copy (raft-core's `Transfer`, `copy_from_device`) or tracking
//!   memory resource: it waits for the jobs in flight up to the largest of their bounds, and for
//!   releases up to one second after the exit began or the last job ended, whichever is later;
//!   then runs the teardown steps ([`on_teardown`]) if everything drained, or skips them
//!   (leaking native objects to the OS, never destroying them under a running job), logs a
//!   warning on target `raft`, and ends the process at once with its exit status (`_exit`): the
//!   C++ static destructors that would follow (the CUDA runtime's, RMM's) would otherwise tear
//!   CUDA down under the running job.
//!   A panic inside the hook (a user's `log` logger, say) changes none of this;
//! - the **phase** of the exit ([`phase`], [`Phase`]): a job made once the exit has decided can
//!   be refused ([`JobToken::try_register`], [`ExitDecided`]); once the teardown has run or was
//!   skipped the library is [`closed`]: code that still runs (a user's exit handler registered
//!   before the hook, which runs after it) is refused everything new ([`refusal`]: `Logic`,
//!   reason `Exiting`), and what it drops is left to the OS.
//!
//! # Your own exit handlers after a skipped teardown
//! `_exit` ends the process without running the exit handlers that come after the hook. The C
//! library runs them in the reverse order of their registration, so:
//!
//! | registered with `atexit` (or `on_exit`) | after a skipped teardown |
//! | --- | --- |
//! | after the process's first job, release, communicator, queued copy or tracking resource (after the hook) | already ran: unaffected |
//! | before the first of those (coverage writers, profilers, most start-up code) | do **not** run |
//! | C++ static destructors, C++ streams' flush | do **not** run (that is the point) |
//!
//! C stdio streams are flushed before `_exit`, and Rust's stdout is flushed before the exit
//! begins (when `main` returns and in `std::process::exit`). A teardown that ran (everything
//! drained in time) lets the exit go on: then every handler runs. Workaround for a handler
//! that must run: register it after the first job (it then runs before the hook), or flush its
//! data yourself before exiting (`__llvm_profile_write_file`, `__gcov_dump`, a profiler's own
//! flush call).
//!
//! # Thread safety
//! Everything here may be called from any thread, also during the exit.
mod hook;
mod phase;
mod registry;
mod wait;

pub use hook::{
    ensure_registered as register_exit_hook, hook_registered, left_running_saying, log_guarded, mark_library_thread, on_library_thread,
    on_teardown, teardown_left_running, teardown_step, watch_forks,
};
pub use phase::{closed, closed_or, exiting, forked, native_release_allowed, phase, refusal, ExitDecided, Phase};
pub use registry::Label;
pub use wait::{
    current_exit_wait, default_exit_wait, set_default_exit_wait, spawn_thread, validate, with_exit_wait, ExitWait, InvalidExitWait,
    DEFAULT_EXIT_WAIT,
};

/// Writes `message` (and a newline) to stderr and aborts the process: for a state no code may
/// go on from (a copy that may still run under a borrow about to end, work a CUDA graph capture
/// may have taken). Unlike `eprintln!` followed by `abort`, it aborts even when stderr is a
/// closed pipe (`eprintln!` panics then, and the unwinding would run the very code the abort
/// was to prevent) or when formatting the message panics.
#[cold]
pub fn abort_with(message: std::fmt::Arguments<'_>) -> ! {
    struct AbortOnDrop;
    impl Drop for AbortOnDrop {
        fn drop(&mut self) {
            std::process::abort();
        }
    }
    let _abort = AbortOnDrop; // a panic while writing still aborts, in the unwinding
                              // Formatted first, then written straight to fd 2, not through Rust's stderr lock: another
                              // thread may hold that lock for ever (blocked writing to a full pipe), and the abort must
                              // not wait for it (the eighteenth audit). A stderr that takes nothing within a moment gets
                              // nothing.
    let text = format!("{message}\n");
    write_to_stderr_unless_stuck(text.as_bytes());
    std::process::abort()
}

/// Writes `bytes` to fd 2, giving up on an error or when fd 2 accepts nothing for 100 ms.
fn write_to_stderr_unless_stuck(mut bytes: &[u8]) {
    while !bytes.is_empty() {
        let mut ready = libc::pollfd { fd: 2, events: libc::POLLOUT, revents: 0 };
        // SAFETY: one pollfd, a local, for the call.
        if unsafe { libc::poll(&mut ready, 1, 100) } != 1 || ready.revents & libc::POLLOUT == 0 {
            return;
        }
        // SAFETY: writes from a live slice of `bytes.len()` bytes.
        let n = unsafe { libc::write(2, bytes.as_ptr().cast(), bytes.len()) };
        if n <= 0 {
            return;
        }
        bytes = &bytes[n as usize..];
    }
}

use registry::REGISTRY;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A fresh id for a label.
pub fn next_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

/// A job in flight, from its creation to its end; dropping the token ends it.
#[derive(Debug)]
#[must_use = "the job counts as in flight until the token is dropped"]
pub struct JobToken {
    slot: usize,
}
static_assertions::assert_impl_all!(JobToken: Send, Sync);

impl JobToken {
    /// Registers a job whose exit wait is `bound` seconds (read by the caller, when the job was
    /// made, from [`current_exit_wait`]). Registers the exit hook on first use.
    ///
    /// It registers whatever the exit's [`phase`]: a job registered once the exit has decided
    /// is not waited for, and may run under the teardown or be cut short by `_exit`. Use
    /// [`try_register`](Self::try_register) to have it refused instead.
    pub fn register(label: Label, bound: f64) -> JobToken {
        hook::ensure_registered();
        JobToken { slot: REGISTRY.add_job(label, bound) }
    }

    /// Registers a job as [`register`](Self::register) does, unless the exit has decided
    /// (phase `TearingDown`, `TornDown` or `Skipped`). The check and the registration are one
    /// step under the lock the exit hook decides under: a job registered here is waited for
    /// (up to its bound), and one refused is one the exit would not have waited for.
    ///
    /// # Errors
    /// [`ExitDecided`] (`the process is exiting`) once the exit has decided; don't start the
    /// job then.
    pub fn try_register(label: Label, bound: f64) -> Result<JobToken, ExitDecided> {
        hook::ensure_registered();
        REGISTRY.try_add_job(label, bound).map(|slot| JobToken { slot })
    }
}

impl Drop for JobToken {
    fn drop(&mut self) {
        // In a fork's child the registry's lock may have been copied held: its counts are left
        // as they are (the child's exit waits for nothing).
        if !forked() {
            REGISTRY.end_job(self.slot);
        }
    }
}

/// A release in flight on a library thread; dropping the token ends it.
#[derive(Debug)]
#[must_use = "the release counts as in flight until the token is dropped"]
pub struct ReleaseToken {
    slot: usize,
}
static_assertions::assert_impl_all!(ReleaseToken: Send, Sync);

impl ReleaseToken {
    /// Registers a release (queued or running on a library thread). Registers the exit hook on
    /// first use.
    pub fn register(label: Label) -> ReleaseToken {
        hook::ensure_registered();
        ReleaseToken { slot: REGISTRY.add_release(label) }
    }

    /// Registers a release unless the exit has decided ([`ExitDecided`]): then the caller leaves
    /// the native objects to the OS instead of queueing a release that could still be inside a
    /// CUDA call when the static destructors run.
    pub fn try_register(label: Label) -> Result<ReleaseToken, ExitDecided> {
        hook::ensure_registered();
        REGISTRY.try_add_release(label).map(|slot| ReleaseToken { slot })
    }
}

impl Drop for ReleaseToken {
    fn drop(&mut self) {
        if !forked() {
            REGISTRY.end_release(self.slot); // as `JobToken`'s drop
        }
    }
}

/// Jobs in flight now.
pub fn jobs_in_flight() -> usize {
    REGISTRY.jobs_in_flight()
}

/// Releases in flight now.
pub fn releases_in_flight() -> usize {
    REGISTRY.releases_in_flight()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg_attr(miri, ignore = "registers the exit hook with glibc's on_exit")]
    fn try_register_accepts_a_job_while_the_process_runs() {
        // The process's own phase: Running in this test binary (its exit never began).
        assert_eq!(phase(), Phase::Running);
        let token = JobToken::try_register(Label { what: "job", id: next_id(), device: None }, 1.0).expect("accepted while running");
        assert!(jobs_in_flight() >= 1);
        assert!(hook_registered());
        drop(token);
    }

    /// The ninth audit: `eprintln!` then `abort()` panicked instead of aborting when stderr was
    /// a closed pipe (`prog 2>&1 | head -1`), and the unwinding ran the code the abort was to
    /// prevent (a borrow ended under a running copy). A child process with such a stderr must
    /// end by SIGABRT, never by a panic's exit status.
    #[test]
    #[cfg_attr(miri, ignore = "spawns a process")]
    fn abort_with_aborts_even_when_stderr_is_a_closed_pipe() {
        use std::os::unix::process::ExitStatusExt;
        const CHILD: &str = "RAFT_EXIT_TEST_ABORT_CHILD";
        if std::env::var_os(CHILD).is_some() {
            abort_with(format_args!("the child stops here ({})", "a message long enough to be written"));
        }
        // A pipe whose reading end is closed before the child starts: its writes fail (EPIPE).
        let mut ends = [0i32; 2];
        // SAFETY: writes two descriptors into the array.
        assert_eq!(unsafe { libc::pipe(ends.as_mut_ptr()) }, 0);
        // SAFETY: both descriptors were just made and are owned here, each closed once.
        let (read_end, write_end) = unsafe {
            use std::os::fd::FromRawFd;
            (std::os::fd::OwnedFd::from_raw_fd(ends[0]), std::os::fd::OwnedFd::from_raw_fd(ends[1]))
        };
        drop(read_end);
        let exe = std::env::current_exe().unwrap();
        let mut child = std::process::Command::new(exe)
            .args(["--exact", "tests::abort_with_aborts_even_when_stderr_is_a_closed_pipe", "--nocapture", "--test-threads=1"])
            .env(CHILD, "1")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::from(write_end))
            .spawn()
            .unwrap();
        let status = child.wait().unwrap();
        assert_eq!(status.signal(), Some(libc::SIGABRT), "the child did not abort: {status:?}");
    }

    /// The eighteenth audit (helper 82): `abort_with` wrote through Rust's stderr lock, so a
    /// thread holding that lock for ever (blocked writing to a full pipe, say) kept the process
    /// from aborting. A child whose other thread holds the lock must still end by SIGABRT.
    #[test]
    #[cfg_attr(miri, ignore = "spawns a process")]
    fn abort_with_aborts_while_another_thread_holds_stderr() {
        use std::os::unix::process::ExitStatusExt;
        const CHILD: &str = "RAFT_EXIT_TEST_ABORT_LOCKED_CHILD";
        if std::env::var_os(CHILD).is_some() {
            let (held, holding) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let _lock = std::io::stderr().lock();
                held.send(()).unwrap();
                loop {
                    std::thread::sleep(std::time::Duration::from_secs(1));
                }
            });
            holding.recv().unwrap();
            abort_with(format_args!("the child stops here"));
        }
        let exe = std::env::current_exe().unwrap();
        let mut child = std::process::Command::new(exe)
            .args(["--exact", "tests::abort_with_aborts_while_another_thread_holds_stderr", "--nocapture", "--test-threads=1"])
            .env(CHILD, "1")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let start = std::time::Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break Some(status);
            }
            if start.elapsed() > std::time::Duration::from_secs(10) {
                child.kill().unwrap();
                child.wait().unwrap();
                break None;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        assert_eq!(status.and_then(|s| s.signal()), Some(libc::SIGABRT), "the child did not abort within 10 s: {status:?}");
    }

    /// The crate's files, for the layout checks below.
    const FILES: [(&str, &str); 5] = [
        ("lib.rs", include_str!("lib.rs")),
        ("hook.rs", include_str!("hook.rs")),
        ("phase.rs", include_str!("phase.rs")),
        ("registry.rs", include_str!("registry.rs")),
        ("wait.rs", include_str!("wait.rs")),
    ];

    #[test]
    fn the_registry_and_the_phase_do_not_reach_into_the_hook() {
        // registry -> phase and hook -> {registry, phase}: no module circle.
        for (name, text) in FILES.iter().filter(|(n, _)| *n == "registry.rs" || *n == "phase.rs") {
            for other in ["crate::hook", "hook::", "crate::registry"] {
                if *name == "registry.rs" && other == "crate::registry" {
                    continue;
                }
                assert!(!text.contains(other), "{name} names {other}");
            }
        }
    }

    #[test]
    fn every_file_says_why_it_exists_and_every_unsafe_block_why_it_is_sound() {
        for (name, text) in FILES {
            assert!(text.starts_with("//!"), "{name} does not start with a `//!` line");
            // Spelled in pieces so that this test's own text does not match.
            let (block, imp) = (["unsafe", " {"].concat(), ["unsafe", " impl"].concat());
            let lines: Vec<&str> = text.lines().collect();
            for (i, line) in lines.iter().enumerate() {
                let code = line.split("//").next().unwrap_or("");
                if !code.contains(&block) && !code.contains(&imp) {
                    continue;
                }
                // The SAFETY comment sits just above (attributes and the rest of the comment
                // may come between) or on the line itself.
                let above = lines[..i].iter().rev().take_while(|l| {
                    let t = l.trim_start();
                    t.starts_with("//") || t.starts_with("#[")
                });
                let ok = line.contains("SAFETY:") || above.into_iter().any(|l| l.contains("// SAFETY:"));
                assert!(ok, "{name}:{}: `unsafe` without a `// SAFETY:` line: {line}", i + 1);
            }
        }
    }
}
