//! The watchdog: one library thread per process that follows every communicator with work in
//! flight or a teardown to finish. It
//! - ends a collective's exit-wait job as soon as its work is seen finished (so an exit waits
//!   only as long as the collectives really run);
//! - aborts a communicator whose NCCL reports an asynchronous error, or whose last collective has
//!   not finished within its timeout (a rank that died or never called it): the stuck kernels
//!   end, a thread blocked on the stream returns, and the next call says what happened;
//! - finishes the teardown of dropped communicators (finalize, wait, destroy; abort on timeout),
//!   so that `Drop` never blocks.
//!
//! Once the process's exit has decided, it makes no further native call.
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

/// How often the watched communicators are looked at.
const PERIOD: Duration = Duration::from_millis(1);

/// What the watchdog follows (a communicator's shared state): it names nothing above it.
pub(crate) trait Watched: Send + Sync {
    /// One look: follow the work in flight or the teardown a step; returns whether to keep
    /// watching.
    fn watch_step(&self) -> bool;
}

struct Watchdog {
    /// The watched communicators, each entry with a ticket of its own: a communicator whose last
    /// step ended the watch may be added again (by a collective, a group's end or its `Drop` on
    /// another thread) before that step's entry is removed, and only the stepped entry goes.
    watched: Mutex<Vec<(u64, Arc<dyn Watched>)>>,
    next_ticket: std::sync::atomic::AtomicU64,
    wake: Condvar,
    /// Whether the thread runs: a spawn that failed (no thread to be had) is tried again at the
    /// next `watch` and every `sync` (`retry_start`), so a dropped communicator's teardown is not
    /// left to a thread that never came.
    running: Mutex<bool>,
}

static WATCHDOG: OnceLock<Watchdog> = OnceLock::new();

/// Whether a start failed and nothing started it since: `retry_start` (every `sync`) asks this
/// first, one load.
static START_FAILED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Adds a communicator to the watched ones (the caller marked it as watched, so once while it is
/// watched).
pub(crate) fn watch(shared: Arc<dyn Watched>) {
    let dog = WATCHDOG.get_or_init(|| Watchdog {
        watched: Mutex::new(Vec::new()),
        next_ticket: std::sync::atomic::AtomicU64::new(0),
        wake: Condvar::new(),
        running: Mutex::new(false),
    });
    start(dog);
    let ticket = dog.next_ticket.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    dog.watched.lock().unwrap_or_else(|e| e.into_inner()).push((ticket, shared));
    dog.wake.notify_one();
}

/// Starts the watchdog's thread unless it runs. A start the OS refused (a pids limit) is tried
/// again at the next `watch` and at every `sync` ([`retry_start`]): a dropped communicator's
/// teardown waited for a thread that only another communicator's first collective would start
/// (the twenty-first audit, helper 104).
fn start(dog: &'static Watchdog) {
    let mut running = dog.running.lock().unwrap_or_else(|e| e.into_inner());
    if *running {
        return;
    }
    #[cfg(test)]
    let refused = tests::REFUSE_SPAWN.load(std::sync::atomic::Ordering::SeqCst);
    #[cfg(not(test))]
    let refused = false;
    let spawned = if refused {
        Err(std::io::Error::from(std::io::ErrorKind::WouldBlock))
    } else {
        std::thread::Builder::new().name("raft-comms-watchdog".into()).spawn(move || run(dog))
    };
    match spawned {
        Ok(_) => {
            *running = true;
            START_FAILED.store(false, std::sync::atomic::Ordering::Relaxed);
        }
        Err(e) => {
            START_FAILED.store(true, std::sync::atomic::Ordering::Relaxed);
            // Logged after the lock: a logger that syncs a communicator retries this start,
            // which locked it again on this thread (the twenty-second audit: a deadlock).
            drop(running);
            // Guarded: this runs inside a group's end for each member, whose later members a
            // logger's panic would leave half-ended (the sixteenth audit).
            raft_exit::log_guarded(|| {
                log::warn!(
                    target: "raft",
                    "raft-comms: the watchdog thread could not start ({e}): collectives are watched only by sync() \
                     until a later collective or sync starts it"
                )
            })
        }
    }
}

/// Starts the watchdog again where its start failed (one load otherwise): called by every
/// `sync`, so the watched communicators (a dropped one's teardown included) get their thread at
/// the next call that can make one.
pub(crate) fn retry_start() {
    if START_FAILED.load(std::sync::atomic::Ordering::Relaxed) {
        if let Some(dog) = WATCHDOG.get() {
            start(dog);
        }
    }
}

fn run(dog: &'static Watchdog) {
    /// A watchdog that ends by a panic (a step's logger, say) is started again by the next
    /// `watch`, not left marked running.
    struct Ended(&'static Watchdog);
    impl Drop for Ended {
        fn drop(&mut self) {
            *self.0.running.lock().unwrap_or_else(|e| e.into_inner()) = false;
        }
    }
    let _ended = Ended(dog);
    // The destroys of dropped communicators (after their finalize completed) and their events'
    // destroys wait for the whole device: on threads of their own, so that one communicator's
    // teardown holds up no other's look (run 217).
    crate::result::ends_elsewhere(true);
    loop {
        let now: Vec<(u64, Arc<dyn Watched>)> = {
            let mut list = dog.watched.lock().unwrap_or_else(|e| e.into_inner());
            while list.is_empty() {
                list = dog.wake.wait(list).unwrap_or_else(|e| e.into_inner());
            }
            list.clone()
        };
        let done: Vec<(u64, Arc<dyn Watched>)> = now.into_iter().filter(|(_, s)| !s.watch_step()).collect();
        if !done.is_empty() {
            // By ticket: an entry added again while its step ended stays.
            dog.watched.lock().unwrap_or_else(|e| e.into_inner()).retain(|(t, _)| !done.iter().any(|(d, _)| d == t));
        }
        // Dropped here, outside the list's lock: the last reference of a torn-down communicator
        // goes (its handle, its resources' clone).
        drop(done);
        std::thread::sleep(PERIOD);
    }
}

#[cfg(test)]
mod tests {
    use super::{retry_start, watch, Watched};
    use std::sync::atomic::AtomicBool;

    /// `start` answers as if the OS refused the thread (set only in the child below).
    pub(super) static REFUSE_SPAWN: AtomicBool = AtomicBool::new(false);

    struct Counted(AtomicUsize);

    impl Watched for Counted {
        fn watch_step(&self) -> bool {
            self.0.fetch_add(1, Ordering::SeqCst);
            false
        }
    }

    /// A watchdog whose start the OS refused is started by the next `sync` (`retry_start`),
    /// and looks at what was watched meanwhile (a dropped communicator's teardown). Before, only
    /// a later `watch` (another communicator's first collective) retried it. In a child process:
    /// the watchdog is process-wide.
    #[test]
    fn a_watchdog_whose_start_was_refused_is_started_by_the_next_sync() {
        const ROLE: &str = "RAFT_COMMS_TEST_WATCHDOG_REFUSED";
        const NAME: &str = "watchdog::tests::a_watchdog_whose_start_was_refused_is_started_by_the_next_sync";
        if std::env::var_os(ROLE).is_some() {
            REFUSE_SPAWN.store(true, Ordering::SeqCst);
            let item = Arc::new(Counted(AtomicUsize::new(0)));
            watch(item.clone());
            std::thread::sleep(Duration::from_millis(300));
            let before = item.0.load(Ordering::SeqCst);
            REFUSE_SPAWN.store(false, Ordering::SeqCst);
            retry_start();
            let give_up = Instant::now() + Duration::from_secs(5);
            while item.0.load(Ordering::SeqCst) == 0 && Instant::now() < give_up {
                std::thread::sleep(Duration::from_millis(5));
            }
            println!("STEPS {before} {}", item.0.load(Ordering::SeqCst));
            return;
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", NAME, "--nocapture", "--test-threads=1"])
            .env(ROLE, "1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
        assert!(text.contains("STEPS 0 1"), "refused, then retried by a sync: {text}");
    }
    /// A logger that makes what every `Communicator::sync` does first (`retry_start`), once: a
    /// logger that syncs a communicator, or reports on one, from its `log`.
    struct Syncs;

    static SYNCED: AtomicUsize = AtomicUsize::new(0);

    impl log::Log for Syncs {
        fn enabled(&self, _: &log::Metadata<'_>) -> bool {
            true
        }

        fn log(&self, _: &log::Record<'_>) {
            if SYNCED.fetch_add(1, Ordering::SeqCst) == 0 {
                retry_start();
            }
        }

        fn flush(&self) {}
    }

    /// The warning that the watchdog's thread could not start was logged under the lock of the
    /// watchdog's start (`running`): a logger that syncs a communicator (whose first step retries
    /// that start) locked it again on the same thread, a deadlock inside the collective, group
    /// end or `sync` that logged (the twenty-second audit). In a child process, bounded: the
    /// watchdog and the logger are process-wide, and the deadlock must fail the test, not hang it.
    #[test]
    fn a_logger_that_syncs_while_the_watchdog_s_refused_start_is_warned_about_does_not_deadlock() {
        const ROLE: &str = "RAFT_COMMS_TEST_WATCHDOG_LOGGER_SYNCS";
        const NAME: &str = "watchdog::tests::a_logger_that_syncs_while_the_watchdog_s_refused_start_is_warned_about_does_not_deadlock";
        if std::env::var_os(ROLE).is_some() {
            log::set_logger(&Syncs).expect("the first logger");
            log::set_max_level(log::LevelFilter::Trace);
            REFUSE_SPAWN.store(true, Ordering::SeqCst);
            watch(Arc::new(Counted(AtomicUsize::new(0))));
            println!("WATCHED LOGGED {}", SYNCED.load(Ordering::SeqCst));
            return;
        }
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", NAME, "--nocapture", "--test-threads=1"])
            .env(ROLE, "1")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let give_up = Instant::now() + Duration::from_secs(20);
        while child.try_wait().unwrap().is_none() {
            if Instant::now() >= give_up {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the child was still running after 20 s: deadlocked");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let out = child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{text}");
        assert!(text.contains("WATCHED LOGGED 2"), "the refusal logged, and the logger's retry refused and logged again: {text}");
    }
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex, Weak};
    use std::time::{Duration, Instant};

    /// Stands for a communicator's shared state: its first step finds nothing in flight and ends
    /// the watch (`watched = false`, as `Shared::watch_step` does), and at that moment another
    /// thread's collective, group end or `Drop` sees the flag down and adds it again (done here
    /// from inside the step, after the flag went down: the same interleaving, made certain).
    struct ReAdded {
        steps: AtomicUsize,
        me: Mutex<Weak<ReAdded>>,
    }

    impl Watched for ReAdded {
        fn watch_step(&self) -> bool {
            if self.steps.fetch_add(1, Ordering::SeqCst) == 0 {
                let me = self.me.lock().unwrap().upgrade().expect("alive while watched");
                watch(me);
                return false;
            }
            true // work in flight again: keep watching
        }
    }

    /// The ninth audit: the watchdog removed every entry of a communicator whose step said
    /// "done", by address, including one added again meanwhile; that communicator's flag stayed
    /// up, so nothing added it back, and its timeout abort (or its dropped teardown) never came.
    #[test]
    fn a_communicator_added_again_while_its_last_step_ends_is_still_watched() {
        let item = Arc::new(ReAdded { steps: AtomicUsize::new(0), me: Mutex::new(Weak::new()) });
        *item.me.lock().unwrap() = Arc::downgrade(&item);
        watch(item.clone());
        let give_up = Instant::now() + Duration::from_secs(5);
        while item.steps.load(Ordering::SeqCst) < 3 && Instant::now() < give_up {
            std::thread::sleep(Duration::from_millis(5));
        }
        let steps = item.steps.load(Ordering::SeqCst);
        assert!(steps >= 3, "added again during its last step, then looked at only {steps} time(s) in 5 s");
    }
}
