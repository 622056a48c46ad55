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
    watched: Mutex<Vec<Arc<dyn Watched>>>,
    wake: Condvar,
}

static WATCHDOG: OnceLock<Watchdog> = OnceLock::new();

/// Adds a communicator to the watched ones (the caller marked it as watched, so once).
pub(crate) fn watch(shared: Arc<dyn Watched>) {
    let dog = WATCHDOG.get_or_init(|| {
        let spawned = std::thread::Builder::new().name("raft-comms-watchdog".into()).spawn(run);
        if let Err(e) = spawned {
            log::warn!(target: "raft", "raft-comms: the watchdog thread could not start ({e}): collectives are watched only by sync()");
        }
        Watchdog { watched: Mutex::new(Vec::new()), wake: Condvar::new() }
    });
    dog.watched.lock().unwrap_or_else(|e| e.into_inner()).push(shared);
    dog.wake.notify_one();
}

fn run() {
    let dog = loop {
        // The spawning call is still inside get_or_init: wait for it to finish.
        if let Some(d) = WATCHDOG.get() {
            break d;
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    loop {
        let now: Vec<Arc<dyn Watched>> = {
            let mut list = dog.watched.lock().unwrap_or_else(|e| e.into_inner());
            while list.is_empty() {
                list = dog.wake.wait(list).unwrap_or_else(|e| e.into_inner());
            }
            list.clone()
        };
        let done: Vec<Arc<dyn Watched>> = now.into_iter().filter(|s| !s.watch_step()).collect();
        if !done.is_empty() {
            dog.watched
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .retain(|s| !done.iter().any(|d| std::ptr::addr_eq(Arc::as_ptr(s), Arc::as_ptr(d))));
        }
        // Dropped here, outside the list's lock: the last reference of a torn-down communicator
        // goes (its handle, its resources' clone).
        drop(done);
        std::thread::sleep(PERIOD);
    }
}
