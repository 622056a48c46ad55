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
    /// next `watch`, so a dropped communicator's teardown is not left to a thread that never came.
    running: Mutex<bool>,
}

static WATCHDOG: OnceLock<Watchdog> = OnceLock::new();

/// Adds a communicator to the watched ones (the caller marked it as watched, so once while it is
/// watched).
pub(crate) fn watch(shared: Arc<dyn Watched>) {
    let dog = WATCHDOG.get_or_init(|| Watchdog {
        watched: Mutex::new(Vec::new()),
        next_ticket: std::sync::atomic::AtomicU64::new(0),
        wake: Condvar::new(),
        running: Mutex::new(false),
    });
    {
        let mut running = dog.running.lock().unwrap_or_else(|e| e.into_inner());
        if !*running {
            match std::thread::Builder::new().name("raft-comms-watchdog".into()).spawn(move || run(dog)) {
                Ok(_) => *running = true,
                // Guarded: this runs inside a group's end for each member, whose later members a
                // logger's panic would leave half-ended (the sixteenth audit).
                Err(e) => raft_exit::log_guarded(|| {
                    log::warn!(
                        target: "raft",
                        "raft-comms: the watchdog thread could not start ({e}): collectives are watched only by sync() \
                         until a later collective starts it"
                    )
                }),
            }
        }
    }
    let ticket = dog.next_ticket.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    dog.watched.lock().unwrap_or_else(|e| e.into_inner()).push((ticket, shared));
    dog.wake.notify_one();
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
    use super::{watch, Watched};
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
