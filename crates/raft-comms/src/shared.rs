//! A communicator's shared state (`Shared`): what its handle, the watchdog and an open NCCL group
//! all hold. It sits below `communicator.rs` (the public handle) and above `group.rs` and
//! `watchdog.rs`, which see it only through their traits ([`Member`], [`Watched`]): the watchdog
//! step and the group hooks are here, with the state they change.
use crate::group::{self, Member};
use crate::result::{self, NativeComm};
use crate::watchdog::{self, Watched};
use cudarc::driver::CudaStream;
use raft_core::DeviceResources;
use raft_error::{Error, ErrorKind, Reason, Result};
use raft_exit::{JobToken, Label, ReleaseToken};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Once, Weak};
use std::time::{Duration, Instant};

/// Where a dropped communicator's teardown is (done by the watchdog).
pub(crate) enum Closing {
    No,
    /// Dropped: finalize once the work in flight has finished.
    Requested(ReleaseToken),
    /// `ncclCommFinalize` issued at `since`: destroy once it completes, abort past the timeout.
    Finalizing {
        since: Instant,
        _release: ReleaseToken,
    },
}

/// What changes over a communicator's life, under one lock (taken before the shim's own).
pub(crate) struct State {
    /// The exit rule: a job registered with raft-exit from the first collective enqueued until
    /// its work is seen finished (by `sync` or the watchdog), so that an exit waits for it (up to
    /// the exit wait read when it was enqueued) instead of tearing CUDA down under it.
    pub(crate) token: Option<JobToken>,
    /// When the last collective was enqueued: the timeout runs from there.
    pub(crate) last_enqueue: Instant,
    /// Set once the communicator was aborted or released: every later call returns it.
    pub(crate) ended: Option<Error>,
    /// The thread whose open NCCL group holds calls on this communicator, until that group
    /// ends. NCCL keeps a group per thread: a call from another thread meanwhile would join
    /// that group's pending work on the communicator and be launched only when it ends, after
    /// the caller's arrays may be gone; such calls are refused.
    pub(crate) group_thread: Option<std::thread::ThreadId>,
    /// Whether the watchdog holds it.
    pub(crate) watched: bool,
    pub(crate) closing: Closing,
}

/// Everything one communicator owns, shared by its handle, the watchdog and an open group.
pub(crate) struct Shared {
    pub(crate) native: NativeComm,
    pub(crate) resources: DeviceResources,
    pub(crate) rank: usize,
    pub(crate) size: usize,
    pub(crate) id: u64,
    pub(crate) timeout_ns: AtomicU64,
    /// Open groups (on any thread) that queued calls on it and have not ended: the watchdog
    /// leaves it alone meanwhile (its calls are not launched yet).
    pub(crate) groups: AtomicUsize,
    pub(crate) state: Mutex<State>,
}

/// Every communicator made, for the exit teardown: one still alive then (leaked, or kept in a
/// static) is aborted, so that NCCL's threads stop before the CUDA runtime is torn down.
static LIVE: Mutex<Vec<Weak<Shared>>> = Mutex::new(Vec::new());

pub(crate) fn register_live(shared: &Arc<Shared>) {
    static TEARDOWN: Once = Once::new();
    TEARDOWN.call_once(|| {
        raft_exit::on_teardown(abort_all_live);
        // RMM's per-device map made before the exit hook below (as `with_tracking` does), so
        // that the C library destroys it after the hook has run; where it could not be, the
        // teardown never reads the map once it is gone (the shim's flag).
        let _ = raft_core::memory::rmm_map_address();
    });
    // The exit hook runs the teardown: registered here too, not only by the first job or
    // release, so that a process whose communicators never queue a collective from Rust (kept
    // in a static, used only by RAFT's C++ through `install`) still aborts them before the C++
    // static destructors tear CUDA down under NCCL's threads (the fifteenth audit). Its own
    // `Once` makes later calls one load; it logs outside any `Once` of ours.
    raft_exit::register_exit_hook();
    let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
    live.retain(|w| w.strong_count() > 0);
    live.push(Arc::downgrade(shared));
}

/// The exit teardown's step (everything drained by then): aborts what is still alive, here, and
/// waits (up to [`ENDS_AT_EXIT`]) for the destroys the watchdog began on threads of their own;
/// one still inside NCCL then keeps the static destructors from running under it.
fn abort_all_live() {
    let live: Vec<Arc<Shared>> = LIVE.lock().unwrap_or_else(|e| e.into_inner()).iter().filter_map(Weak::upgrade).collect();
    for sh in live {
        raft_exit::teardown_step(|| abort_one(&sh));
    }
    let start = std::time::Instant::now();
    while result::ends_in_flight() > 0 {
        if start.elapsed() > ENDS_AT_EXIT {
            raft_exit::left_running_saying(|| {
                log::warn!(
                    target: "raft",
                    "exit teardown: {} communicator destroy(s) still inside NCCL after {:.1} s",
                    result::ends_in_flight(),
                    ENDS_AT_EXIT.as_secs_f64()
                )
            });
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// How long the exit's teardown waits for destroys running on threads of their own.
const ENDS_AT_EXIT: Duration = Duration::from_secs(5);

/// Aborts one live communicator for the exit's teardown (see [`abort_all_live`]).
fn abort_one(sh: &Shared) {
    const WHO: &str = "exit teardown";
    let why = "the process exited with the communicator alive";
    // A call holds the lock a moment (an enqueue, the watchdog's look): waited for up to
    // 100 ms; a split waiting for its peers holds it up to its timeout.
    let start = std::time::Instant::now();
    let mut locked = sh.state.try_lock();
    while matches!(locked, Err(std::sync::TryLockError::WouldBlock)) && start.elapsed() < Duration::from_millis(100) {
        std::thread::sleep(Duration::from_millis(1));
        locked = sh.state.try_lock();
    }
    let locked = match locked {
        Ok(st) => Some(st),
        Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    };
    match locked {
        Some(mut st) => {
            if st.ended.is_none() {
                let ended = sh.end_with(&mut st, WHO, Error::logic(WHO, why));
                drop(st);
                // Its abort's failure, if any, is in the error (`end_with`): said, unlocked.
                if ended.message() != why {
                    raft_exit::log_guarded(|| log::debug!(target: "raft", "{ended}"));
                }
            }
        }
        // Held across a wait (a split waits for its peers under it, up to the timeout):
        // aborted through the shim, which serialises it with that wait's looks and ends the
        // wait; the holder then records the end (the fourteenth audit: the teardown waited
        // out the split's timeout on the lock).
        None => {
            // The holder is still inside NCCL's code (on its way out of the wait): the
            // static destructors after the teardown must not run under it (helper 65).
            let aborted = sh.native.abort(WHO, why);
            raft_exit::left_running_saying(|| {
                if let Err(e) = aborted {
                    log::debug!(target: "raft", "{e}");
                }
            });
        }
    }
}

pub(crate) static NEXT_ID: AtomicU64 = AtomicU64::new(1);

pub(crate) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn timeout(&self) -> Duration {
        Duration::from_nanos(self.timeout_ns.load(Ordering::Relaxed))
    }

    pub(crate) fn label(&self, what: &'static str) -> Label {
        Label { what, id: self.id, device: Some(self.resources.device()) }
    }

    /// Ends the communicator with `error`: aborts it (a no-op when the shim already did; the
    /// shim aborts its clique with it, see `clique` in the shim's common.hpp), keeps the error
    /// for every later call, and ends the exit-wait job. Returns the error (with the abort's
    /// own failure, if any, added to its message).
    pub(crate) fn end_with(&self, st: &mut State, who: &'static str, error: Error) -> Error {
        let error = if st.ended.is_none() {
            // A failed abort is said in the error, not logged: every caller holds the
            // communicator's lock, which a user's logger that syncs this communicator would take
            // again on this thread (the twenty-second audit: a deadlock).
            let error = match self.native.abort(who, error.message()) {
                Ok(()) => error,
                Err(e) => {
                    let message = format!("{}; aborting the communicator failed too: {}", error.message(), e.message());
                    error.with_message(message)
                }
            };
            st.ended = Some(error.clone());
            error
        } else {
            error
        };
        st.token = None;
        error
    }

    /// A failure of a call on the communicator: refused arguments (`Logic`) leave it as it was;
    /// anything else ends it. Returns the error.
    pub(crate) fn fail_unless_refused(&self, st: &mut State, who: &'static str, error: Error) -> Error {
        if error.kind() == ErrorKind::Logic {
            error
        } else {
            self.end_with(st, who, error)
        }
    }

    /// The error of a call on an ended communicator, seen from `who`.
    pub(crate) fn ended_error(st: &State, who: &'static str) -> Option<Error> {
        st.ended.as_ref().map(|e| e.clone().with_who(who))
    }

    /// The error of a call on an ended communicator, or of one made while another thread's open
    /// group holds calls on it (see [`State::group_thread`]).
    pub(crate) fn unusable(st: &State, who: &'static str) -> Option<Error> {
        if let Some(e) = Self::ended_error(st, who) {
            return Some(e);
        }
        match st.group_thread {
            Some(owner) if owner != std::thread::current().id() => Some(Error::logic(
                who,
                "the communicator has calls in an open NCCL group on another thread (NCCL keeps a group per thread and \
                 launches its calls when it ends): call it from that thread, or after that group has ended",
            )),
            _ => None,
        }
    }

    /// Enqueues one call on the resources' stream (see `collectives.rs`): refuses on an ended
    /// communicator or once the exit has decided, keeps the exit-wait job and the watchdog up to
    /// date, and ends the communicator when the failure leaves it unusable.
    pub(crate) fn enqueue(
        self: &Arc<Self>,
        who: &'static str,
        call: impl FnOnce(&NativeComm, &CudaStream, bool) -> Result<()>,
    ) -> Result<()> {
        group::check_call(who)?;
        let stream = self.resources.stream().map_err(|e| e.with_who(who))?;
        let in_group = group::active();
        let mut st = self.lock();
        if let Some(e) = Self::unusable(&st, who) {
            return Err(e);
        }
        let fresh = if st.token.is_none() {
            let bound = raft_exit::current_exit_wait().map_err(|e| Error::logic(who, e.to_string()))?;
            Some(JobToken::try_register(self.label("collective"), bound).map_err(|e| Error::logic(who, e.to_string()))?)
        } else {
            None
        };
        refuse_capture(who, &stream)?;
        if let Err(e) = call(&self.native, &stream, !in_group) {
            return Err(self.fail_unless_refused(&mut st, who, e));
        }
        // Inside a group nothing is launched until the group's end, which asks the group's
        // streams before and after the launch (`group.rs`, `Open::end`).
        if !in_group && raft_core::stream_is_capturing(&stream).unwrap_or(false) {
            // A capture begun meanwhile on another thread may have taken the collective into its
            // graph, which would then read and write the arrays at each launch: as for a copy
            // in raft-core, the process stops.
            raft_exit::abort_with(format_args!(
                "{who}: a CUDA graph capture began on the stream while a collective was queued on it; aborting"
            ));
        }
        if let Some(t) = fresh {
            st.token = Some(t);
        }
        st.last_enqueue = Instant::now();
        if in_group {
            // Under the same lock as the check above: no other thread's call slips in between.
            st.group_thread = Some(std::thread::current().id());
            if group::used(self, stream) {
                self.groups.fetch_add(1, Ordering::AcqRel);
            }
        }
        let start_watching = !st.watched;
        st.watched = true;
        drop(st);
        if start_watching {
            watchdog::watch(self.clone());
        }
        Ok(())
    }

    /// After the group that used this communicator ended: the group's calls now run (their
    /// exit-wait job and the watchdog follow them), or the group failed (the shim aborted it).
    pub(crate) fn after_group(self: &Arc<Self>, failed: Option<&Error>) {
        self.groups.fetch_sub(1, Ordering::AcqRel);
        let mut st = self.lock();
        st.group_thread = None;
        if let Some(e) = failed {
            // The shim aborted the group's communicators, and with them their cliques.
            st.ended.get_or_insert_with(|| e.clone());
            st.token = None;
            return;
        }
        if st.ended.is_some() {
            return;
        }
        if st.token.is_none() {
            // The watchdog may have seen the event of the calls before the group and ended the
            // job meanwhile: the group's calls need one again. (Once the exit has decided there
            // is none to be had; the calls are launched all the same.)
            if let Ok(bound) = raft_exit::current_exit_wait() {
                st.token = JobToken::try_register(self.label("collective"), bound).ok();
            }
        }
        st.last_enqueue = Instant::now();
        let start_watching = !st.watched;
        st.watched = true;
        drop(st);
        if start_watching {
            watchdog::watch(self.clone());
        }
    }
}

/// A collective queued on a stream being captured into a CUDA graph would run at each launch of
/// the graph, after its arrays may be gone (NCCL's calls can be captured): refused (`Logic`), as
/// raft-core refuses copies, zeroing and GEMMs. A failed query is the driver's error.
pub(crate) fn refuse_capture(who: &'static str, stream: &CudaStream) -> Result<()> {
    match raft_core::stream_is_capturing(stream) {
        Ok(false) => Ok(()),
        Ok(true) => Err(Error::logic(
            who,
            "the resources' stream is being captured into a CUDA graph: the graph would run the collective at each launch, \
             after its arrays may be gone; call it before the capture begins or after it ends",
        )),
        Err(e) => Err(e.with_who(who)),
    }
}

impl Member for Shared {
    fn native(&self) -> &NativeComm {
        &self.native
    }

    fn group_ended(self: Arc<Self>, failed: Option<&Error>) {
        self.after_group(failed);
    }
}

impl Watched for Shared {
    /// One look by the watchdog; returns whether to keep watching.
    fn watch_step(&self) -> bool {
        const WHO: &str = "raft-comms watchdog";
        if !raft_exit::native_release_allowed() {
            return false; // the exit has decided: no native call any more
        }
        if raft_exit::exiting() {
            // From the exit's first step on, destroys run here again, counted by their
            // release, so none is left on a thread of its own under the teardown.
            result::ends_elsewhere(false);
        }
        // An open group has queued calls on it, not launched yet: look after the group.
        if self.groups.load(Ordering::Acquire) > 0 {
            return true;
        }
        // A caller in `sync` or `release` holds the lock: look next time. A lock poisoned by a
        // panic under it is taken as it is (looked at "next time" for ever, the communicator's
        // dropped teardown never finished: the fourteenth audit, low).
        let mut st = match self.state.try_lock() {
            Ok(st) => st,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return true,
        };
        let mut unsaid = None;
        if st.token.is_some() && st.ended.is_none() {
            match self.native.query(WHO, None) {
                Ok(true) => st.token = None,
                Ok(false) => {
                    let timeout = self.timeout();
                    if st.last_enqueue.elapsed() > timeout {
                        let e = Error::timeout(
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
                    let message = format!("NCCL reported an error, and the communicator was aborted: {}", e.message());
                    let e = e.with_who(WHO).with_message(message);
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
                            unsaid = self.native.destroy(WHO).err();
                            st.ended = Some(Error::logic(WHO, "the communicator was released").with_reason(Reason::Released));
                            false
                        }
                        Ok(false) if since.elapsed() <= self.timeout() => {
                            st.closing = Closing::Finalizing { since, _release };
                            true
                        }
                        Ok(false) => {
                            let e = Error::timeout(WHO, "finalizing a dropped communicator timed out (other ranks gone?)");
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
        // Said once the lock is let go (the twenty-second audit: nothing logs under it).
        drop(st);
        if let Some(e) = unsaid {
            raft_exit::log_guarded(|| log::warn!(target: "raft", "{e}"));
        }
        keep
    }
}
