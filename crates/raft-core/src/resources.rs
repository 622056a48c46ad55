//! `DeviceResources`: a RAFT `raft::device_resources` on a stream of its own, owned from Rust:
//! making, syncing, releasing, jobs. Handles are in `handles.rs`, scoped release in `scoped.rs`,
//! per-thread defaults in `current.rs`.
use crate::device::{context, current_device_bound};
use crate::error::{Error, ErrorKind, Result};
use crate::holding::{self, held_native, holding, Holding};
use crate::job::{job_task, JobHandle, Shared, Worker};
use crate::result::{self, ContextGuard, NativeResources};
use crate::{memory, release, waits};
use cudarc::driver::{CudaContext, CudaStream};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock, Weak};
use std::thread::ThreadId;

/// Where a release is: none yet, one running (on which thread), or done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Releasing {
    No,
    By(ThreadId),
    Done,
}

/// Everything one resources object owns, shared by its handles.
pub(crate) struct ResourcesState {
    id: u64,
    /// Whether a capture may begin on the stream (`result/exposure.rs`): raised before its handle
    /// leaves the library; read by allocations and frees, also after release (then raised).
    capture: Arc<result::exposure::CaptureFlag>,
    /// Its slot in the live registry.
    slot: usize,
    device: usize,
    ctx: Arc<CudaContext>,
    released: AtomicBool,
    /// The release is taking the native objects (after the jobs queued before it): no new use
    /// begins from here on, so the release waits only for the uses in flight.
    closing: AtomicBool,
    /// The native resources and their stream, until release. Calls hold the read lock for
    /// their duration; a release takes the object out under the write lock.
    native: RwLock<Option<NativeResources>>,
    /// Whether the native resources were ever handed to a use (their stream, a handle, an
    /// allocation, a copy, a lend: every use goes through `with_native`). Until then nothing
    /// can have been queued on the stream, and a release has nothing to drain.
    used: AtomicBool,
    /// The worker, started on the first job. Its lock also orders `spawn` against `release`.
    worker: Mutex<Option<Worker>>,
    /// The release's progress: a second `release()` waits for the first to finish, without any
    /// lock held across the first one's wait for the jobs (see `release`).
    releasing: Mutex<Releasing>,
    released_cv: Condvar,
    /// Threads waiting on `released_cv` (changed under `releasing`): a release with none
    /// notifies nobody (a notify is a system call even with no waiter), and one that hands its
    /// rest to another thread moves their recorded waits to it at once (`waits::retarget`).
    release_waiters: waits::Waiters,
    /// The worker thread's id, once started: a job on it never waits for a release of its own
    /// resources (that release is waiting for the job).
    worker_thread: Mutex<Option<ThreadId>>,
    /// The thread holding the write lock for an exclusive lend (`with_native_exclusive`), while
    /// it does: a use polling behind it is refused only when that thread waits for the use's.
    exclusive_by: Mutex<Option<ThreadId>>,
}

impl ResourcesState {
    /// Releases now, on the calling thread: queued jobs finish, then the handles, RAFT's object
    /// and the stream are destroyed. A second call waits until the first has finished, except
    /// where that wait would never end (`waits`): on these resources' own worker thread (a job
    /// releasing its own resources while another thread releases them), on a thread the release
    /// in progress is itself waiting for, or on one something waits for (it may hold a use the
    /// first release waits for); then it returns at once. The first, once it has taken over
    /// (`finish_release`), polls for the uses in flight, and leaves that wait to a thread of its
    /// own when something waits for it (`finish_release_elsewhere`). Likewise, when the
    /// worker's jobs are waiting (through any chain of releases and joins) for the calling
    /// thread, the rest of the release is queued on that worker behind its jobs instead of
    /// waited for: two jobs releasing each other's resources both return.
    fn release(self: &Arc<Self>, who: &'static str) -> Result<()> {
        if holding(self.id) {
            // This thread is inside a use of these resources (a lend, an allocation whose
            // failure callback released them): the release would wait for this very thread.
            return Err(Error::logic(
                who,
                format!(
                    "the device resources on device {} are in use on this thread (inside with_raft_resources or an allocation): release them after that use",
                    self.device
                ),
            ));
        }
        {
            let mut state = self.releasing.lock().unwrap_or_else(|e| e.into_inner());
            match *state {
                Releasing::Done => return Ok(()),
                Releasing::By(by) => {
                    let on_worker = *self.worker_thread.lock().unwrap_or_else(|e| e.into_inner()) == Some(std::thread::current().id());
                    // The thread doing the release may be waiting for this one.
                    let Some(mut waiting) = (!on_worker).then(|| waits::wait_for(by)).flatten().map(|w| (by, w)) else {
                        return Ok(());
                    };
                    let _counted = self.release_waiters.enter();
                    // The exit teardown waits a bounded time, as for a lend (a release on a user
                    // thread may itself be waiting for a lend that never ends).
                    let deadline = (who == TEARDOWN).then(|| std::time::Instant::now() + TEARDOWN_LEND_WAIT);
                    loop {
                        match *state {
                            Releasing::Done => break,
                            // The release moved to its worker (see below): the wait is now for
                            // that thread, checked again for a circle.
                            Releasing::By(now) if now != waiting.0 => {
                                drop(waiting);
                                match waits::wait_for(now) {
                                    Some(w) => waiting = (now, w),
                                    None => return Ok(()),
                                }
                            }
                            _ => {}
                        }
                        match deadline {
                            None => {
                                state = self
                                    .released_cv
                                    .wait_timeout(state, std::time::Duration::from_millis(10))
                                    .unwrap_or_else(|e| e.into_inner())
                                    .0;
                                // While the first release waits for the uses in flight, a thread waiting for this
                                // one may hold such a use (a lend joining the job making this call): a second
                                // release has nothing of its own to finish, so it returns rather than close that circle.
                                if !matches!(*state, Releasing::Done)
                                    && self.closing.load(Ordering::Acquire)
                                    && waits::awaited(std::thread::current().id())
                                {
                                    break;
                                }
                            }
                            Some(deadline) => {
                                let now = std::time::Instant::now();
                                if now >= deadline {
                                    drop((state, waiting, _counted)); // said unlocked: a logger may use these resources (audit 22)
                                    raft_exit::left_running_saying(
                                        || log::warn!(target: "raft", "exit teardown: resources {} on device {} are still being released on another thread: left to the OS", self.id, self.device),
                                    );
                                    return Ok(());
                                }
                                state = self.released_cv.wait_timeout(state, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
                            }
                        }
                    }
                    return Ok(());
                }
                Releasing::No => *state = Releasing::By(std::thread::current().id()),
            }
        }
        let worker = {
            let mut w = self.worker.lock().unwrap_or_else(|e| e.into_inner());
            self.released.store(true, Ordering::Release);
            w.take()
        };
        if let Some(w) = worker {
            if w.thread_id() == std::thread::current().id() {
                w.finish(); // a job releasing its own resources: the worker ends after it
            } else if let Some(waiting) = waits::wait_for(w.thread_id()) {
                w.finish();
                drop(waiting);
            } else {
                // The worker's jobs wait for this thread: waiting for them would never end. The
                // worker finishes the release itself, after its queued jobs; a second release
                // waits for that worker (its `By`), and every use is already refused.
                {
                    let mut state = self.releasing.lock().unwrap_or_else(|e| e.into_inner());
                    *state = Releasing::By(w.thread_id());
                    // Waiters wait for the worker now: their recorded waits move with the state
                    // (where that closes no circle), and they check that wait again.
                    let ids = self.release_waiters.ids();
                    waits::retarget(&ids, std::thread::current().id(), w.thread_id());
                    drop(ids);
                    if self.release_waiters.count() > 0 {
                        self.released_cv.notify_all();
                    }
                }
                let held = self.held_estimate();
                let label = raft_exit::Label { what: "release of resources", id: self.id, device: Some(self.device) };
                let state = Arc::clone(self);
                let rest = move || {
                    if let Err(e) = state.finish_release(who) {
                        log::warn!(target: "raft", "{e}");
                    }
                };
                release::on_worker(w, label, held, Box::new(rest));
                return Ok(());
            }
        }
        self.finish_release(who)
    }

    /// The release's end, once no job of these resources can run any more: the native objects
    /// are taken under the write lock (after every use), destroyed, and waiters told.
    fn finish_release(self: &Arc<Self>, who: &'static str) -> Result<()> {
        // The jobs queued before the release have run (or a job runs this): from here on no new
        // use begins (`with_native`), so the wait below is for the uses in flight only.
        self.closing.store(true, Ordering::Release);
        let native = if who == TEARDOWN {
            // At exit, a thread still inside a lend would hold the exit forever: wait a bounded
            // time, then leave the native object to the OS.
            let deadline = std::time::Instant::now() + TEARDOWN_LEND_WAIT;
            loop {
                match self.native.try_write() {
                    Ok(mut g) => break g.take(),
                    Err(std::sync::TryLockError::Poisoned(p)) => break p.into_inner().take(),
                    Err(std::sync::TryLockError::WouldBlock) if std::time::Instant::now() < deadline => {
                        std::thread::sleep(std::time::Duration::from_millis(1))
                    }
                    Err(std::sync::TryLockError::WouldBlock) => {
                        // That thread may still be in RAFT's or cuVS's code, which the static
                        // destructors after the teardown would pull the ground from under.
                        raft_exit::left_running_saying(
                            || log::warn!(target: "raft", "exit teardown: resources {} on device {} are still lent on another thread: left to the OS", self.id, self.device),
                        );
                        break None;
                    }
                }
            }
        } else {
            match self.take_native_when_unused(true) {
                Some(native) => native,
                None => {
                    // A thread waiting for this one may hold a use: finished elsewhere.
                    self.finish_release_elsewhere(who);
                    return Ok(());
                }
            }
        };
        self.destroy_taken(who, native)
    }

    /// Takes the native objects once no use of them is in flight on another thread. Polled,
    /// never queued as a waiting writer: std's `RwLock` holds new readers back behind a waiting
    /// writer, so a use in flight that waited (outside the lock) for another use of these
    /// resources would wait for ever (the sixteenth session's audit; `with_native_exclusive`
    /// polls for the same reason). New uses are refused once the release takes over (`closing`,
    /// checked by `with_native`), so the wait is for the uses already in flight. `None` when a thread waits
    /// for this one (a join of the job running this release, say, inside a lend of these
    /// resources): that thread may hold a use, and this wait would never end.
    /// `give_up_if_awaited`: false on the thread that finishes a handed-off release (only
    /// second releases wait for it, and they return rather than wait when something waits for
    /// them). A use in flight is given 2 ms before the question is asked, so that a short use
    /// beside a waiting join does not send the release elsewhere.
    fn take_native_when_unused(&self, give_up_if_awaited: bool) -> Option<Option<NativeResources>> {
        let start = std::time::Instant::now();
        let me = std::thread::current().id();
        let mut nap = std::time::Duration::from_micros(50);
        let mut polling = None;
        loop {
            match self.native.try_write() {
                Ok(mut g) => return Some(g.take()),
                Err(std::sync::TryLockError::Poisoned(p)) => return Some(p.into_inner().take()),
                Err(std::sync::TryLockError::WouldBlock) => {
                    if polling.is_none() {
                        // A use in flight may belong to a thread polling for one this thread
                        // holds (it releases, inside a lend, what this thread lends): never ends.
                        polling = waits::poll_for(self.id, &holding::held_ids());
                        if polling.is_none() && give_up_if_awaited {
                            return None;
                        }
                    }
                    let waited = start.elapsed();
                    if give_up_if_awaited && waited >= std::time::Duration::from_millis(2) && waits::awaited(me) {
                        return None;
                    }
                    if waited < std::time::Duration::from_millis(1) {
                        std::thread::yield_now()
                    } else {
                        // Backing off to 1 ms: a lend may last as long as a cuVS build.
                        std::thread::sleep(nap);
                        nap = (nap * 2).min(std::time::Duration::from_millis(1));
                    }
                }
            }
        }
    }

    /// Whether the thread holding an exclusive lend of these resources waits, directly or through
    /// others, for thread `me` (a use polling behind that lend would then wait for ever).
    fn lender_waits_for(&self, me: ThreadId) -> bool {
        let lender = *self.exclusive_by.lock().unwrap_or_else(|e| e.into_inner());
        lender.is_some_and(|lender| waits::waits_for(lender, me))
    }

    /// What the native objects hold (the device ledger's estimate for a release handed on), read
    /// only when the lock is free: a writer holding it (an exclusive lend) may be waiting for
    /// this very thread (its join of the job releasing), and a blocking read would wait for it
    /// in turn, for ever (the fourteenth audit). The estimate is then nothing.
    fn held_estimate(&self) -> crate::release::Held {
        let native = match self.native.try_read() {
            Ok(native) => native,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return Default::default(),
        };
        native.as_ref().map(crate::handle_kind::held_by).unwrap_or_default()
    }

    /// The rest of a release whose thread cannot wait for the uses in flight (see
    /// [`take_native_when_unused`](Self::take_native_when_unused)): a thread of its own waits for
    /// them, destroys the native objects and tells the waiters, counted as a release in flight by
    /// the exit and in the device's ledger (`release::on_own_thread`). Without a thread, the native objects stay until the last handle is dropped (which
    /// releases them on a release thread) and the release counts as done.
    fn finish_release_elsewhere(self: &Arc<Self>, who: &'static str) {
        let label = raft_exit::Label { what: "release of resources", id: self.id, device: Some(self.device) };
        // What the rest will free, counted in the device's ledger until it has run (an
        // out-of-memory retry waits for it).
        let held = self.held_estimate();
        let state = Arc::clone(self);
        let rest = Box::new(move || {
            // Only second releases wait for this thread, and they never hold a use of these
            // resources: it waits for the uses in flight, which new uses (refused) cannot prolong.
            let native = state.take_native_when_unused(false).flatten();
            if let Err(e) = state.destroy_taken(who, native) {
                log::warn!(target: "raft", "{e}");
            }
        });
        match release::on_own_thread(label, held, rest) {
            Ok(rest_thread) => {
                // A second release now waits for that thread, not for this one (which returns,
                // and may go on to join what the second release runs on): the state and the
                // waiters' recorded waits move together, under the lock the waiters hold.
                let me = std::thread::current().id();
                let mut state = self.releasing.lock().unwrap_or_else(|e| e.into_inner());
                if matches!(*state, Releasing::By(by) if by == me) {
                    *state = Releasing::By(rest_thread);
                    let ids = self.release_waiters.ids();
                    // The new thread waits for nothing: every wait moves.
                    waits::retarget(&ids, me, rest_thread);
                    drop(ids);
                    if self.release_waiters.count() > 0 {
                        self.released_cv.notify_all();
                    }
                }
            }
            Err(release::NotStarted::ExitDecided) => {
                // The exit has decided (its teardown, or a thread after it, waits for this one):
                // the use in flight may be in RAFT's or cuVS's code, which the static destructors
                // after the teardown would pull the ground from under.
                raft_exit::teardown_left_running();
                // Done first: a panicking logger must not leave the release unfinished for
                // ever (a second release would wait for it).
                self.mark_released_done();
                log::warn!(target: "raft", "exit teardown: resources {} on device {} are in use on another thread: left to the OS", self.id, self.device);
            }
            Err(release::NotStarted::NoThread) => {
                self.mark_released_done();
                log::warn!(target: "raft", "resources {} on device {}: released while in use, and no thread could finish the release: the native objects are destroyed with the last handle", self.id, self.device);
            }
        }
    }

    /// Destroys the native objects taken out of the lock (unless the exit has decided), then
    /// tells the waiters the release is done.
    fn destroy_taken(&self, who: &'static str, native: Option<NativeResources>) -> Result<()> {
        /// Marks the release done when dropped: also when the destruction panics, or a second
        /// release would wait for it for ever.
        struct Done<'a>(&'a ResourcesState);
        impl Drop for Done<'_> {
            fn drop(&mut self) {
                self.0.mark_released_done();
            }
        }
        let _done = Done(self);
        match native {
            // The write lock above ordered every use (under the read lock) before this load.
            Some(n) if raft_exit::native_release_allowed() => n.destroy(who, self.used.load(Ordering::Relaxed)),
            Some(n) => {
                n.leak(); // the exit has decided: no CUDA call under the static destructors
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// The release has finished: a second release waiting for it returns.
    fn mark_released_done(&self) {
        let mut state = self.releasing.lock().unwrap_or_else(|e| e.into_inner());
        *state = Releasing::Done;
        // Read under the lock that every waiter holds while it counts itself in.
        if self.release_waiters.count() > 0 {
            self.released_cv.notify_all();
        }
    }
}

impl Drop for ResourcesState {
    fn drop(&mut self) {
        live_registry().lock().unwrap_or_else(|e| e.into_inner()).remove(self.slot);
        let native = self.native.get_mut().unwrap_or_else(|e| e.into_inner()).take();
        let worker = self.worker.get_mut().unwrap_or_else(|e| e.into_inner()).take();
        if native.is_none() && worker.is_none() {
            return;
        }
        if !raft_exit::native_release_allowed() {
            // The exit has decided: leak to the OS rather than call CUDA under the destructors.
            if let Some(n) = native {
                n.leak();
            }
            std::mem::forget(worker);
            return;
        }
        // The last handle is gone: release on a library thread, never blocking this one. With a
        // worker, the worker itself releases after the jobs queued on it; without, a release
        // thread does (it never waits for a job).
        let label = raft_exit::Label { what: "release of resources", id: self.id, device: Some(self.device) };
        // What the release will free, counted against the device until it has run.
        let held = native.as_ref().map(crate::handle_kind::held_by).unwrap_or_default();
        let used = *self.used.get_mut();
        let destroy = move || {
            if let Some(n) = native {
                if !raft_exit::native_release_allowed() {
                    n.leak();
                } else if let Err(e) = n.destroy("DeviceResources::drop", used) {
                    log::warn!(target: "raft", "{e}");
                }
            }
        };
        match worker {
            Some(w) => release::on_worker(w, label, held, Box::new(destroy)),
            None => release::enqueue_holding(label, held, Box::new(destroy)),
        }
    }
}

/// Why a wait for a use of resources is refused where it would close a circle.
const WAITS_FOR_THIS_ONE: &str =
    "a use of these resources is held by a thread that waits for this one (a join, or a wait for resources this thread holds): this wait would never end";

/// The `who` of the exit teardown's releases.
const TEARDOWN: &str = "exit teardown";
/// How long the exit teardown waits for another thread's lend of resources to end.
const TEARDOWN_LEND_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Every resources object alive, for the exit teardown and for [`crate::stats`] (`live.rs`).
pub(crate) type LiveRegistry = crate::live::LiveRegistry<ResourcesState>;

pub(crate) fn live_registry() -> &'static Mutex<LiveRegistry> {
    static LIVE: Mutex<LiveRegistry> = Mutex::new(LiveRegistry::new());
    &LIVE
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// RAFT's device resources (`raft::device_resources`) for one device, on a CUDA stream of
/// their own.
///
/// Each object owns a non-blocking CUDA stream (made through cudarc on the device's primary
/// context, never the legacy or per-thread default stream), a worker thread for jobs (started
/// on the first [`spawn`](Self::spawn)), and the cuBLAS, cuSOLVER (dense and sparse) and
/// cuSPARSE handles RAFT creates on first use, bound to that stream. Making one costs a stream
/// and a small C++ object; a first cuBLAS handle costs tens of milliseconds and about 65 MiB of
/// device memory, paid only by the resources that use one. Released resources' handles are kept
/// for the next resources of the device (destroying one would synchronise the device, breaking
/// other threads' stream captures), and destroyed only when an allocation runs out of memory.
///
/// `Clone` gives the *same* resources (a cheap handle); `==` is identity. Resources are
/// released by [`release`](Self::release), at the end of [`with_device_resources`], or when
/// the last handle is dropped (then on a library release thread: `Drop` never blocks). What
/// such pending releases hold is bounded per device (`RAFT_RELEASE_PENDING_MAX` releases,
/// `RAFT_RELEASE_PENDING_MIB` of handle memory; see [`crate::Stats::pending`]): beyond it, the
/// next `new()` or first handle on that device runs some of them on its own thread first. An
/// `OutOfMemory` is only reported once the releases pending on the device have run.
/// Released resources stay a `DeviceResources` value: [`device`](Self::device) still answers,
/// and the rest give a `Logic` error.
///
/// # Thread safety
/// `Send + Sync`: any thread may sync, spawn, take handles or release. A release lets the jobs
/// already queued run, then refuses new calls (`Logic`) and waits for those in progress on other
/// threads (see [`release`](Self::release)).
///
/// [`with_device_resources`]: crate::with_device_resources
#[derive(Clone)]
pub struct DeviceResources {
    state: Arc<ResourcesState>,
}

static_assertions::assert_impl_all!(DeviceResources: Send, Sync, Clone, Eq, std::hash::Hash);

impl DeviceResources {
    /// New, independent resources on the calling thread's current CUDA device. When the
    /// releases pending on the device hold more than their bound, runs some of them first.
    ///
    /// # Errors
    /// `Cuda` when there is no driver or CUDA fails; `OutOfMemory` when the device has no room
    /// for a stream even after its pending releases ran.
    pub fn new() -> Result<Self> {
        const WHO: &str = "DeviceResources::new";
        let (device, bound) = current_device_bound(WHO)?;
        Self::create_bound(WHO, device, bound)
    }

    /// New, independent resources on `device` (with the same backpressure as [`new`](Self::new)).
    ///
    /// # Errors
    /// `Logic` for a device that does not exist (`DeviceResources::on_device: no device 1
    /// among 1`); `Cuda` when there is no driver or CUDA fails; `OutOfMemory` as for `new`.
    pub fn on_device(device: usize) -> Result<Self> {
        Self::create("DeviceResources::on_device", device)
    }

    pub(crate) fn create(who: &'static str, device: usize) -> Result<Self> {
        Self::create_bound(who, device, None)
    }

    /// `bound`: the context the caller has just read as the thread's current one, if any.
    fn create_bound(who: &'static str, device: usize, bound: Option<usize>) -> Result<Self> {
        // context() checks that the device exists.
        let ctx = context(who, device)?;
        // Backpressure: new resources are a stream a release will have to destroy; while the
        // releases pending on this device hold too much, this thread runs some of them first.
        let ran = release::make_room(device);
        // One read of the thread's context for the whole creation (none when the caller's read
        // found the device's context and no release ran here since: between that read and this
        // point only `context()`'s fast path and `make_room` run, and nothing may be added here
        // that binds another context): every step below leaves the device's context current
        // (see `ContextGuard::bind`).
        let guard = match bound {
            Some(current) if !ran && current == ctx.cu_ctx() as usize => ContextGuard::bound_already(&ctx),
            _ => ContextGuard::bind(who, &ctx)?,
        };
        memory::ensure_default(who, device)?;
        let make = || NativeResources::create(who, device, result::new_stream(who, &ctx)?, &guard);
        // Memory only waiting for a pending release is not missing: run or wait for them, then
        // try once more.
        let native = match make() {
            Err(e) if e.kind() == ErrorKind::OutOfMemory && release::drain_device(device, true) => make(),
            made => made,
        }?;
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let capture = native.capture_flag().clone();
        // Registered as it is made (its `Weak` upgrades only once the object exists: no reader
        // of the registry sees it half made).
        let state = Arc::new_cyclic(|me| {
            // The registry's lock is let go before the state is built.
            let slot = live_registry().lock().unwrap_or_else(|e| e.into_inner()).insert(me.clone());
            ResourcesState {
                id,
                capture,
                slot,
                device,
                ctx,
                released: AtomicBool::new(false),
                native: RwLock::new(Some(native)),
                used: AtomicBool::new(false),
                worker: Mutex::new(None),
                releasing: Mutex::new(Releasing::No),
                released_cv: Condvar::new(),
                release_waiters: waits::Waiters::default(),
                worker_thread: Mutex::new(None),
                exclusive_by: Mutex::new(None),
                closing: AtomicBool::new(false),
            }
        });
        memory::register_teardown_releasing(release_all_live);
        Ok(DeviceResources { state })
    }

    /// The device number; still answers after release.
    pub fn device(&self) -> usize {
        self.state.device
    }

    /// Whether these resources were released.
    pub fn is_released(&self) -> bool {
        self.state.released.load(Ordering::Acquire)
    }

    /// Runs `f` on the live native resources, or gives the `Logic` error of released resources.
    pub(crate) fn with_native<R>(&self, who: &'static str, f: impl FnOnce(&NativeResources) -> Result<R>) -> Result<R> {
        let id = self.state.id;
        if let Some(native) = held_native(id) {
            // A use inside a use on the same thread (a memory failure callback calling `sync`, a
            // call inside a lend): taking the read lock again would wait behind a release
            // waiting for the write lock (std's RwLock queues new readers behind a waiting
            // writer), which waits for the outer use: a deadlock. The outer read lock is held.
            let _held = Holding::enter(who, id, native)?;
            // SAFETY: `native` points into `self.state.native`, locked by the outer use further
            // up this thread's stack (read-locked by `with_native`, or write-locked by
            // `with_native_exclusive`); that guard outlives this call (its
            // `Holding` entry is removed before it is dropped), so no release can take it out.
            return f(unsafe { &*native });
        }
        // Once the release takes the native objects, no new use begins: it waits only for the
        // uses already in flight, which no stream of new ones can prolong.
        if self.state.closing.load(Ordering::Acquire) {
            return Err(raft_exit::closed_or(Error::released(who, self.state.device)));
        }
        let native = match self.state.native.try_read() {
            Ok(guard) => guard,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => {
                // A writer holds the lock (no writer ever waits for it): an exclusive lend, or a
                // release taking the objects out. Recorded as a poll while this thread waits, so
                // that a writer polling for a use this thread holds sees the circle, and refused
                // where this wait closes one (the writer polls for what this thread holds).
                let _polling = waits::poll_for(id, &holding::held_ids()).ok_or_else(|| Error::logic(who, WAITS_FOR_THIS_ONE))?;
                // Polled, not a blocking read (`waits::read_behind_writer`): refused once the
                // lend's thread waits for this one (the fourteenth audit: it waited for ever).
                let me = std::thread::current().id();
                match waits::read_behind_writer(&self.state.native, &self.state.closing, || self.state.lender_waits_for(me)) {
                    Ok(guard) => guard,
                    Err(waits::Behind::Closing) => return Err(raft_exit::closed_or(Error::released(who, self.state.device))),
                    Err(waits::Behind::Refused) => return Err(Error::logic(who, WAITS_FOR_THIS_ONE)),
                }
            }
        };
        match native.as_ref() {
            Some(n) => {
                // Declared after the guard: dropped before it, so the entry never outlives it.
                let _held = Holding::enter(who, id, n as *const NativeResources)?;
                if !self.state.used.load(Ordering::Relaxed) {
                    self.state.used.store(true, Ordering::Relaxed);
                }
                f(n)
            }
            None => Err(raft_exit::closed_or(Error::released(who, self.state.device))),
        }
    }

    /// Runs `f` on the live native resources with no other use of them running, on any thread:
    /// for changes to RAFT's object (`raft::resource::set_comms` replaces a resource cell, which
    /// RAFT documents as unsafe beside any concurrent use of the object). Takes the write lock a
    /// release takes, at the first moment no use is in progress (polled); refused inside a use of
    /// the same resources on this thread, which it would wait for.
    pub(crate) fn with_native_exclusive<R>(&self, who: &'static str, f: impl FnOnce(&NativeResources) -> Result<R>) -> Result<R> {
        let id = self.state.id;
        if held_native(id).is_some() {
            return Err(Error::logic(
                who,
                "called inside a use of the same resources on this thread (a lend, a job's or a callback's use): it would wait for itself",
            ));
        }
        // Polled, never queued as a waiting writer: std's RwLock holds new readers back behind
        // a waiting writer, so a use on another thread that waits (outside the lock) for a third
        // use of these resources would deadlock with this call while it waited. Polling, the
        // other uses go on, and this call takes the first moment with none in progress.
        let start = std::time::Instant::now();
        let mut polling = None;
        let native = loop {
            // As `with_native`: no new use once the release takes the native objects (checked
            // at every poll, so a release begun meanwhile is not held up).
            if self.state.closing.load(Ordering::Acquire) {
                return Err(raft_exit::closed_or(Error::released(who, self.state.device)));
            }
            match self.state.native.try_write() {
                Ok(guard) => break guard,
                Err(std::sync::TryLockError::Poisoned(p)) => break p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) if polling.is_none() => {
                    // As a release's poll (`take_native_when_unused`): refused where it would
                    // never end.
                    polling = Some(waits::poll_for(id, &holding::held_ids()).ok_or_else(|| Error::logic(who, WAITS_FOR_THIS_ONE))?);
                }
                // As a release (`take_native_when_unused`): a thread waiting for this one (a
                // join of the job making this call, inside a lend of these resources) may hold
                // the use this call waits for.
                Err(std::sync::TryLockError::WouldBlock)
                    if start.elapsed() >= std::time::Duration::from_millis(2) && waits::awaited(std::thread::current().id()) =>
                {
                    return Err(Error::logic(who, WAITS_FOR_THIS_ONE));
                }
                Err(std::sync::TryLockError::WouldBlock) if start.elapsed() < std::time::Duration::from_millis(1) => {
                    std::thread::yield_now()
                }
                Err(std::sync::TryLockError::WouldBlock) => std::thread::sleep(std::time::Duration::from_micros(50)),
            }
        };
        drop(polling);
        /// Names this thread as the lend's while it holds the write lock (cleared first when
        /// dropped: declared after the guard).
        struct Lending<'a>(&'a Mutex<Option<ThreadId>>);
        impl Drop for Lending<'_> {
            fn drop(&mut self) {
                *self.0.lock().unwrap_or_else(|e| e.into_inner()) = None;
            }
        }
        *self.state.exclusive_by.lock().unwrap_or_else(|e| e.into_inner()) = Some(std::thread::current().id());
        let _lending = Lending(&self.state.exclusive_by);
        match native.as_ref() {
            Some(n) => {
                // A use of the same resources from inside `f` on this thread (the read lock would
                // wait for this write lock) takes the held pointer instead, as a nested use does.
                let _held = Holding::enter(who, id, n as *const NativeResources)?;
                self.state.used.store(true, Ordering::Relaxed);
                f(n)
            }
            None => Err(raft_exit::closed_or(Error::released(who, self.state.device))),
        }
    }

    /// Blocks until the stream has drained (`cuStreamSynchronize`). Callable from any thread.
    ///
    /// # Errors
    /// `Logic` on released resources (`DeviceResources::sync: the device resources on device 0
    /// were released`) and while the stream is being captured into a CUDA graph (the driver
    /// would refuse the wait and invalidate the capture); `Cuda` when the stream's work failed.
    pub fn sync(&self) -> Result<()> {
        const WHO: &str = "DeviceResources::sync";
        self.with_native(WHO, |n| result::requested_sync(WHO, n.stream()))
    }

    /// Releases now: the queued jobs finish, then the stream is drained and the handles, RAFT's
    /// object and the stream are destroyed. (Resources never used, whose stream nobody was
    /// handed, have nothing queued: their stream is not asked.) Idempotent: a second call
    /// returns `Ok` once the first release has finished (at once when made by a job on these
    /// resources' own worker, which the first release is waiting for).
    ///
    /// Once the jobs queued before it have run, every new use of these resources is refused
    /// (`Logic`, released) and the uses already in flight on other threads (a lend, a call) are
    /// waited for; a use they hand to yet another thread meanwhile is refused rather than left
    /// waiting behind the release. Nested uses on a thread already inside one go ahead.
    ///
    /// Exceptions, so that nothing waits in a circle, where this call returns `Ok` before the
    /// native objects are destroyed and an error of the later destruction is logged (`warn`,
    /// target `raft`) rather than returned:
    /// - when these resources' jobs are themselves waiting (through other jobs' releases or
    ///   joins) for the calling thread, their worker finishes the release after its queued jobs;
    /// - when, a use being in flight, a thread waits for the calling thread through this library
    ///   (a [`JobHandle::join`] of the job making this call, say, inside a lend of these
    ///   resources), a thread of its own finishes the release once the uses in flight have ended;
    ///   likewise when a use in flight is held by a thread that itself waits for a use this
    ///   thread holds (two threads, each inside a lend of one object, releasing the other's);
    ///   and a second release that something waits for returns without waiting for the first.
    ///   A wait this library does not see (a channel, a thread's join, an `await` of the job)
    ///   cannot be told apart: releasing from a thread that such a lend waits for never ends.
    ///
    /// # Errors
    /// `Logic` while the stream is being captured into a CUDA graph: work queued before the
    /// capture may still use RAFT's handles, so the native objects (handles, workspaces, the
    /// stream) are kept until the process ends rather than destroyed; the resources count as
    /// released all the same, and a second call returns `Ok`. The same, with the wait's own
    /// error, when draining the stream fails for any reason but a dead context. `Cuda` when
    /// destroying a handle failed (everything is released all the same), including a failure
    /// cudarc recorded while destroying the stream.
    pub fn release(&self) -> Result<()> {
        self.state.release("DeviceResources::release")
    }

    /// The resources' stream as a cudarc stream: copies, kernels and cudarc's cuBLAS on it are
    /// ordered with RAFT's work, and [`sync`](Self::sync) waits for them. The stream stays valid
    /// while the returned `Arc` lives, also after release.
    ///
    /// # Errors
    /// `Logic` on released resources.
    pub fn stream(&self) -> Result<Arc<CudaStream>> {
        self.with_native("DeviceResources::stream", |n| {
            n.capture_flag().raise(); // the handle leaves the library (`result/exposure.rs`)
            Ok(n.stream().clone())
        })
    }

    /// Whether a capture may begin on the stream (`result/exposure.rs`); raise it before the
    /// stream's handle leaves the library.
    pub(crate) fn capture_flag(&self) -> &result::exposure::CaptureFlag {
        &self.state.capture
    }

    /// The device's primary context, as cudarc knows it.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.state.ctx
    }

    /// RAFT's `raft::resource::sync_stream` (polls the stream), beside [`sync`](Self::sync);
    /// refused as `sync` is while the stream is being captured into a CUDA graph.
    pub fn sync_raft(&self) -> Result<()> {
        const WHO: &str = "DeviceResources::sync_raft";
        self.with_native(WHO, |n| result::refuse_captured_wait(WHO, n.stream()).and_then(|()| n.sync_raft(WHO)))
    }

    /// Runs `job` on these resources' worker thread (started on the first job), after the jobs
    /// queued before it. The exit wait in force on the calling thread is read now and bounds
    /// how long an exit waits for this job.
    ///
    /// A job may call `std::process::exit` (see `raft::exit`), but not while the process is
    /// already exiting (main returned, or another thread called exit): Rust lets one thread exit,
    /// so the job's call then blocks for good, the exit waits out this job's exit wait and ends
    /// with the first status, and under `ExitWait::FOREVER` never ends. Return an error from the
    /// job instead.
    ///
    /// # Errors
    /// `Logic` on released resources, a bad `RAFT_EXIT_WAIT` or `RAFT_WORKER_SPIN_US` (the
    /// worker's watch for its next job, microseconds, 50 by default), or once the process's exit has
    /// decided; `Cuda` when the worker thread cannot bind the device's context; `Generic` when
    /// no worker thread could be started.
    pub fn spawn<F, T>(&self, job: F) -> Result<JobHandle<T>>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        const WHO: &str = "DeviceResources::spawn";
        let bound = raft_exit::current_exit_wait().map_err(|e| Error::logic(WHO, e.to_string()))?;
        let device = self.state.device;
        let mut worker = self.state.worker.lock().unwrap_or_else(|e| e.into_inner());
        if self.is_released() {
            return Err(raft_exit::closed_or(Error::released(WHO, device)));
        }
        if worker.is_none() {
            let w = Worker::start(WHO, device, self.state.ctx.clone())?;
            *self.state.worker_thread.lock().unwrap_or_else(|e| e.into_inner()) = Some(w.thread_id());
            *worker = Some(w);
        }
        let label = raft_exit::Label { what: "job", id: raft_exit::next_id(), device: Some(device) };
        let token = raft_exit::JobToken::try_register(label, bound).map_err(|e| Error::logic(WHO, e.to_string()))?;
        let shared = Shared::new();
        let task = job_task(job, shared.clone(), token);
        let Some(w) = worker.as_ref() else { return Err(Error::new(ErrorKind::Generic, WHO, "the worker thread has stopped")) };
        let on = w.thread_id();
        if w.send(task).is_err() {
            return Err(Error::new(ErrorKind::Generic, WHO, "the worker thread has stopped"));
        }
        Ok(JobHandle { shared, device, worker: on })
    }

    /// A weak handle: it does not keep the resources from being dropped (and so released).
    pub fn downgrade(&self) -> WeakResources {
        WeakResources { state: Arc::downgrade(&self.state), device: self.state.device }
    }

    pub(crate) fn from_state(state: Arc<ResourcesState>) -> Self {
        DeviceResources { state }
    }

    pub(crate) fn release_logged(&self, who: &'static str) {
        if let Err(e) = self.state.release(who) {
            log::warn!(target: "raft", "{e}");
        }
    }

    /// The id of these resources (unique in the process; shown by `Debug`).
    pub fn id(&self) -> u64 {
        self.state.id
    }
}

/// A [`DeviceResources`] handle that does not keep them alive (see [`DeviceResources::downgrade`]).
#[derive(Clone)]
pub struct WeakResources {
    state: Weak<ResourcesState>,
    device: usize,
}

impl WeakResources {
    /// The resources, while some strong handle still holds them.
    pub fn upgrade(&self) -> Option<DeviceResources> {
        self.state.upgrade().map(|state| DeviceResources { state })
    }
}

impl fmt::Debug for WeakResources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WeakResources").field("device", &self.device).field("alive", &(self.state.strong_count() > 0)).finish()
    }
}

impl PartialEq for DeviceResources {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.state, &other.state)
    }
}

impl Eq for DeviceResources {}

impl std::hash::Hash for DeviceResources {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        Arc::as_ptr(&self.state).hash(state)
    }
}

impl fmt::Display for DeviceResources {
    /// `device-resources on cuda:0`, or `device-resources on cuda:0 (released)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "device-resources on cuda:{}", self.device())?;
        if self.is_released() {
            f.write_str(" (released)")?;
        }
        Ok(())
    }
}

impl fmt::Debug for DeviceResources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceResources")
            .field("id", &self.id())
            .field("device", &self.device())
            .field("released", &self.is_released())
            .finish()
    }
}

/// Releases every live resources object: the exit teardown, once everything drained; each in
/// its own step (`raft_exit::teardown_step`).
pub(crate) fn release_all_live() {
    let all = live_registry().lock().unwrap_or_else(|e| e.into_inner()).alive();
    for state in all {
        raft_exit::teardown_step(|| {
            if let Err(e) = state.release(TEARDOWN) {
                raft_exit::log_guarded(|| log::debug!(target: "raft", "{e}"));
            }
        });
    }
}
