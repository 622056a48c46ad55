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
use crate::communicator::{Closing, Shared};
use raft_error::{Error, ErrorKind};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How often the watched communicators are looked at.
const PERIOD: Duration = Duration::from_millis(1);

struct Watchdog {
    watched: Mutex<Vec<Arc<Shared>>>,
    wake: Condvar,
}

static WATCHDOG: OnceLock<Watchdog> = OnceLock::new();

/// Adds a communicator to the watched ones (the caller marked it as watched, so once).
pub(crate) fn watch(shared: Arc<Shared>) {
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
        let now: Vec<Arc<Shared>> = {
            let mut list = dog.watched.lock().unwrap_or_else(|e| e.into_inner());
            while list.is_empty() {
                list = dog.wake.wait(list).unwrap_or_else(|e| e.into_inner());
            }
            list.clone()
        };
        let done: Vec<Arc<Shared>> = now.into_iter().filter(|s| !s.watch_step()).collect();
        if !done.is_empty() {
            dog.watched.lock().unwrap_or_else(|e| e.into_inner()).retain(|s| !done.iter().any(|d| Arc::ptr_eq(s, d)));
        }
        // Dropped here, outside the list's lock: the last reference of a torn-down communicator
        // goes (its handle, its resources' clone).
        drop(done);
        std::thread::sleep(PERIOD);
    }
}

impl Shared {
    /// One look by the watchdog; returns whether to keep watching.
    pub(crate) fn watch_step(&self) -> bool {
        const WHO: &str = "raft-comms watchdog";
        if !raft_exit::native_release_allowed() {
            return false; // the exit has decided: no native call any more
        }
        // An open group has queued calls on it, not launched yet: look after the group.
        if self.groups.load(Ordering::Acquire) > 0 {
            return true;
        }
        // A caller in `sync` or `release` holds the lock: look next time.
        let Ok(mut st) = self.state.try_lock() else { return true };
        if st.token.is_some() && st.ended.is_none() {
            match self.native.query(WHO, None) {
                Ok(true) => st.token = None,
                Ok(false) => {
                    let timeout = self.timeout();
                    if st.last_enqueue.elapsed() > timeout {
                        let e = Error::new(
                            ErrorKind::Generic,
                            WHO,
                            format!(
                                "a collective did not finish within {:.1} s of being enqueued (a rank died, or never made the \
                                 matching call); the communicator was aborted",
                                timeout.as_secs_f64()
                            ),
                        );
                        self.end_with(&mut st, WHO, e);
                    }
                }
                Err(e) => {
                    let e = Error::new(e.kind(), WHO, format!("NCCL reported an error, and the communicator was aborted: {}", e.message()));
                    self.end_with(&mut st, WHO, e);
                }
            }
        }
        if st.token.is_some() && st.ended.is_none() {
            return true;
        }
        st.token = None;
        let keep = match std::mem::replace(&mut st.closing, Closing::No) {
            Closing::No => false,
            Closing::Requested(release) => {
                if st.ended.is_some() {
                    false
                } else {
                    match self.native.finalize(WHO) {
                        Ok(()) => {
                            st.closing = Closing::Finalizing { since: Instant::now(), _release: release };
                            true
                        }
                        Err(e) => {
                            self.end_with(&mut st, WHO, e);
                            false
                        }
                    }
                }
            }
            Closing::Finalizing { since, _release } => {
                if st.ended.is_some() {
                    false
                } else {
                    match self.native.query(WHO, None) {
                        Ok(true) => {
                            if let Err(e) = self.native.destroy(WHO) {
                                log::warn!(target: "raft", "{e}");
                            }
                            st.ended = Some(Error::logic(WHO, "the communicator was released"));
                            false
                        }
                        Ok(false) if since.elapsed() <= self.timeout() => {
                            st.closing = Closing::Finalizing { since, _release };
                            true
                        }
                        Ok(false) => {
                            let e = Error::new(ErrorKind::Generic, WHO, "finalizing a dropped communicator timed out (other ranks gone?)");
                            self.end_with(&mut st, WHO, e);
                            false
                        }
                        Err(e) => {
                            self.end_with(&mut st, WHO, e);
                            false
                        }
                    }
                }
            }
        };
        if !keep {
            st.watched = false;
        }
        keep
    }
}
