//! The library release threads and the ledger of what pending releases hold. Releases started by
//! `Drop` run here, so a dropping thread never blocks on the GPU; when the releases pending on a
//! device hold more than a bound, the next `new()` or handle creation on that device runs some
//! of them itself (backpressure), and an allocation that fails for lack of memory runs or waits
//! for its device's pending releases before it reports `OutOfMemory`. Each queued release is
//! registered with the exit machinery. Why helping rather than only more threads: see
//! docs/RELIABILITY.md, "Releases that keep up".
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Releases finished (on release threads, retiring workers and helping threads).
static DONE: AtomicU64 = AtomicU64::new(0);
/// Of those, run by a thread making resources or a handle (backpressure) or recovering from an
/// out-of-memory error.
static HELPED: AtomicU64 = AtomicU64::new(0);
/// Nanoseconds releases spent running, and waiting in the queue before that, summed.
static RUN_NS: AtomicU64 = AtomicU64::new(0);
static WAIT_NS: AtomicU64 = AtomicU64::new(0);
/// Most release threads there can be (`RAFT_RELEASE_THREADS_MAX` is capped at this).
const MAX_THREADS: usize = 64;
/// Per release thread: when its current release started (ns after `epoch()`, +1), 0 when idle.
/// One slot each, so a thread finishing its release never hides another's that hangs.
static BUSY_SINCE: [AtomicU64; MAX_THREADS] = [const { AtomicU64::new(0) }; MAX_THREADS];
/// Which slots of `BUSY_SINCE` a live thread owns (threads started on demand come and go).
static SLOT_TAKEN: [AtomicBool; MAX_THREADS] = [const { AtomicBool::new(false) }; MAX_THREADS];
/// Devices with a ledger of their own; releases of a device beyond are counted in the last one
/// (no process sees this many devices today; sharing a ledger only makes backpressure earlier).
const MAX_DEVICES: usize = 64;
/// How long an `OutOfMemory` waits for the releases of its device running elsewhere.
pub(crate) const OOM_WAIT: Duration = Duration::from_secs(5);
/// A thread started on demand ends after this long without a release to run.
const EXTRA_IDLE: Duration = Duration::from_millis(500);
/// Another thread is started when more than this many releases wait per running thread.
const GROW_AT: usize = 32;

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Releases finished so far by the library.
pub(crate) fn releases_done() -> u64 {
    DONE.load(Ordering::Relaxed)
}

/// Releases run by threads that were making resources, a handle or an allocation.
pub(crate) fn releases_helped() -> u64 {
    HELPED.load(Ordering::Relaxed)
}

/// Time releases spent running, and waiting for a thread before that, summed over all.
pub(crate) fn release_times() -> (Duration, Duration) {
    (Duration::from_nanos(RUN_NS.load(Ordering::Relaxed)), Duration::from_nanos(WAIT_NS.load(Ordering::Relaxed)))
}

/// The longest any release thread has been busy with its current release (zero when all are
/// idle): a release that hangs shows here.
pub(crate) fn release_busy_for() -> Duration {
    let now = epoch().elapsed();
    BUSY_SINCE
        .iter()
        .map(|b| match b.load(Ordering::Relaxed) {
            0 => Duration::ZERO,
            since => now.saturating_sub(Duration::from_nanos(since - 1)),
        })
        .max()
        .unwrap_or_default()
}

/// What a pending release will free, as counted for backpressure: the caller's estimate, made
/// when the release is queued.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Held {
    /// CUDA streams (one per resources object).
    pub(crate) streams: usize,
    /// cuBLAS / cuSOLVER / cuSPARSE handles.
    pub(crate) handles: usize,
    /// Device memory, estimated (a cuBLAS handle holds about 65 MiB).
    pub(crate) bytes: u64,
}

/// What the releases pending on one device hold: lock-free counters, read by backpressure on
/// every `new()` (two loads) and by `stats()`.
#[derive(Default)]
struct Ledger {
    /// The releases pending (queued, running, or waiting on a retiring worker) in the low 32
    /// bits, and those of this device finished ever (mod 2^32) in the high 32: one word, so an
    /// out-of-memory wait reads both at one instant. Read apart, a release that finished between
    /// the two reads was owed and never counted, and the wait ran to its deadline behind a later
    /// release (the twentieth audit, helper 96, with loom).
    counts: AtomicU64,
    /// Of those, in the queue, not yet started: what a helping thread can run.
    queued: AtomicUsize,
    /// Of those, queued on a worker behind its jobs: only that worker can run them.
    on_workers: AtomicUsize,
    streams: AtomicUsize,
    handles: AtomicUsize,
    bytes: AtomicU64,
}

/// [`Ledger::counts`]' pending releases.
const PENDING: u64 = u32::MAX as u64;
/// One finished release in [`Ledger::counts`] (its high half).
const FINISHED_ONE: u64 = 1 << 32;

/// The pending releases of a [`Ledger::counts`] word.
fn pending_of(counts: u64) -> usize {
    (counts & PENDING) as usize
}

/// The finished releases (mod 2^32) of a [`Ledger::counts`] word.
fn finished_of(counts: u64) -> u32 {
    (counts >> 32) as u32
}

impl Ledger {
    fn add(&self, h: Held) {
        self.streams.fetch_add(h.streams, Ordering::Relaxed);
        self.handles.fetch_add(h.handles, Ordering::Relaxed);
        self.bytes.fetch_add(h.bytes, Ordering::Relaxed);
        self.counts.fetch_add(1, Ordering::SeqCst);
    }

    fn remove(&self, h: Held) {
        self.streams.fetch_sub(h.streams, Ordering::Relaxed);
        self.handles.fetch_sub(h.handles, Ordering::Relaxed);
        self.bytes.fetch_sub(h.bytes, Ordering::Relaxed);
        // One more finished, one fewer pending, in one step (a pending count of at least one:
        // every `remove` follows its `add`, so the low half never borrows from the high).
        self.counts.fetch_add(FINISHED_ONE - 1, Ordering::SeqCst);
    }

    /// The releases pending now.
    fn pending(&self, order: Ordering) -> usize {
        pending_of(self.counts.load(order))
    }

    /// `counts` is read first, with `Acquire`: `add` and `remove` change it last (a release
    /// store), so a snapshot that sees a release gone also sees what it held gone (Miri's weak
    /// memory showed a snapshot with no release pending and its handle still counted).
    fn snapshot(&self) -> PendingReleases {
        PendingReleases {
            releases: self.pending(Ordering::Acquire),
            queued: self.queued.load(Ordering::Relaxed),
            on_workers: self.on_workers.load(Ordering::Relaxed),
            streams: self.streams.load(Ordering::Relaxed),
            handles: self.handles.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
        }
    }
}

/// How much the releases pending on one device may hold before the next `new()` or handle
/// creation there runs some of them itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    pub(crate) releases: usize,
    pub(crate) bytes: u64,
}

impl Limits {
    /// `RAFT_RELEASE_PENDING_MAX` releases (default 256) and `RAFT_RELEASE_PENDING_MIB` MiB
    /// (default 2048, about 31 cuBLAS handles) per device; warnings about bad values go to
    /// `warnings` (see [`knob`]).
    fn from_env(warnings: &mut Vec<String>) -> Limits {
        Limits {
            releases: knob("RAFT_RELEASE_PENDING_MAX", 256, 1..=usize::MAX, warnings),
            bytes: (knob("RAFT_RELEASE_PENDING_MIB", 2048, 1..=(u64::MAX >> 20) as usize, warnings) as u64) << 20,
        }
    }

    fn exceeded_by(&self, ledger: &Ledger) -> bool {
        ledger.pending(Ordering::Relaxed) > self.releases || ledger.bytes.load(Ordering::Relaxed) > self.bytes
    }
}

/// A numeric setting from the environment, or `default` when unset, not UTF-8 or out of `range`
/// (a warning pushed on `warnings`). Read inside the pool's `OnceLock`: the warnings are logged
/// by [`pool`] once it is set, never inside it, where a logger that asks the pool anything
/// (`raft::pending_releases`, `stats`, an array's drop) re-entered its initialisation, a
/// deadlock (the twenty-second audit).
fn knob(name: &str, default: usize, range: std::ops::RangeInclusive<usize>, warnings: &mut Vec<String>) -> usize {
    let text = match std::env::var(name) {
        Ok(text) => text,
        Err(std::env::VarError::NotPresent) => return default,
        Err(std::env::VarError::NotUnicode(raw)) => raw.to_string_lossy().into_owned(),
    };
    match text.trim().parse::<usize>() {
        Ok(n) if range.contains(&n) => n,
        _ => {
            warnings.push(format!("{name}={text:?} is not a number in {range:?}: using {default}"));
            default
        }
    }
}

/// What the releases pending on a device (or on all of them) hold, as counted when they were
/// queued: the stream of each released resources object, the library handles RAFT had made on
/// them, and the device memory those handles hold (estimated: about 65 MiB per cuBLAS handle).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PendingReleases {
    /// Releases queued, running, or waiting on a retiring worker behind its jobs.
    pub releases: usize,
    /// Of those, queued for a release thread and not yet started.
    pub queued: usize,
    /// Of those, waiting on a worker behind its jobs.
    pub on_workers: usize,
    /// CUDA streams they will destroy.
    pub streams: usize,
    /// cuBLAS, cuSOLVER and cuSPARSE handles they will destroy.
    pub handles: usize,
    /// Device memory they will free, estimated from the handles.
    pub bytes: u64,
}

impl std::ops::Add for PendingReleases {
    type Output = PendingReleases;

    fn add(self, o: PendingReleases) -> PendingReleases {
        PendingReleases {
            releases: self.releases + o.releases,
            queued: self.queued + o.queued,
            on_workers: self.on_workers + o.on_workers,
            streams: self.streams + o.streams,
            handles: self.handles + o.handles,
            bytes: self.bytes + o.bytes,
        }
    }
}

type Release = Box<dyn FnOnce() + Send + 'static>;

struct Queued {
    release: Release,
    /// The device whose ledger counts it (None: counted nowhere, e.g. a worker's fallback, which
    /// its own task accounts for).
    device: Option<usize>,
    held: Held,
    queued_at: Instant,
    /// None when the release carries its own token (a worker's release that fell back here).
    _token: Option<raft_exit::ReleaseToken>,
    /// Whether the release counts itself in `DONE` (a worker's release that fell back here).
    counts_itself: bool,
}

/// The queue, the release threads and the per-device ledgers.
struct Pool {
    queue: Mutex<VecDeque<Queued>>,
    /// Release threads wait here for work.
    work: Condvar,
    /// Out-of-memory waits sleep here until a release of theirs finishes.
    finished_lock: Mutex<()>,
    finished: Condvar,
    waiting: AtomicUsize,
    ledgers: [Ledger; MAX_DEVICES],
    /// Releases that name no device (counted in totals only).
    unplaced: Ledger,
    limits: Limits,
    /// Threads always running, the most there may be, and how many run now.
    base_threads: usize,
    max_threads: usize,
    threads: AtomicUsize,
    /// Whether threads may be started (false in unit tests of the accounting).
    spawns: bool,
}

impl Pool {
    fn new(limits: Limits, base_threads: usize, max_threads: usize, spawns: bool) -> Pool {
        Pool {
            queue: Mutex::new(VecDeque::new()),
            work: Condvar::new(),
            finished_lock: Mutex::new(()),
            finished: Condvar::new(),
            waiting: AtomicUsize::new(0),
            ledgers: std::array::from_fn(|_| Ledger::default()),
            unplaced: Ledger::default(),
            limits,
            base_threads,
            max_threads: max_threads.max(base_threads),
            threads: AtomicUsize::new(0),
            spawns,
        }
    }

    fn ledger(&self, device: Option<usize>) -> &Ledger {
        match device {
            Some(d) => &self.ledgers[d.min(MAX_DEVICES - 1)],
            None => &self.unplaced,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Queued>> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues a release, counted in its device's ledger; may start another thread when the
    /// queue outgrows the running ones. Never blocks on the GPU.
    fn push(&'static self, q: Queued) {
        let queued = self.push_local(q);
        self.maybe_grow(queued);
    }

    /// Queues without starting threads; returns how many releases are queued now.
    fn push_local(&self, q: Queued) -> usize {
        let ledger = self.ledger(q.device);
        ledger.add(q.held);
        ledger.queued.fetch_add(1, Ordering::Relaxed);
        let queued = {
            let mut queue = self.lock();
            queue.push_back(q);
            queue.len()
        };
        self.work.notify_one();
        queued
    }

    /// The oldest queued release of `device`, taken off the queue.
    fn take_for(&self, device: usize) -> Option<Queued> {
        let device = device.min(MAX_DEVICES - 1);
        let mut queue = self.lock();
        let at = queue.iter().position(|q| q.device.map(|d| d.min(MAX_DEVICES - 1)) == Some(device))?;
        let q = queue.remove(at)?;
        drop(queue);
        self.ledger(q.device).queued.fetch_sub(1, Ordering::Relaxed);
        Some(q)
    }

    /// Runs one release taken off the queue, on the calling thread, and settles its accounts.
    fn run(&self, q: Queued, busy: Option<&AtomicU64>, helping: bool) {
        let Queued { release, device, held, queued_at, _token, counts_itself } = q;
        let start = Instant::now();
        WAIT_NS.fetch_add(start.duration_since(queued_at).as_nanos() as u64, Ordering::Relaxed);
        if let Some(b) = busy {
            b.store(epoch().elapsed().as_nanos() as u64 + 1, Ordering::Relaxed);
        }
        // A failing release must not stop the ones behind it.
        crate::result::catch_forgetting(release);
        if let Some(b) = busy {
            b.store(0, Ordering::Relaxed);
        }
        if !counts_itself {
            RUN_NS.fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
            DONE.fetch_add(1, Ordering::Relaxed);
            if helping {
                HELPED.fetch_add(1, Ordering::Relaxed);
            }
        }
        // A release that counts itself settled its device's ledger already; this settles the
        // queue's own entry (counted nowhere but in the totals).
        self.settle(device, held);
        // `_token` drops here: the release has ended.
    }

    /// A release of `device` holding `held` has finished: its ledger forgets it, and whoever
    /// waits for the device's releases looks again.
    fn settle(&self, device: Option<usize>, held: Held) {
        self.ledger(device).remove(held);
        if self.waiting.load(Ordering::SeqCst) > 0 {
            let _g = self.finished_lock.lock().unwrap_or_else(|e| e.into_inner());
            self.finished.notify_all();
        }
    }

    /// Backpressure: while the releases pending on `device` hold more than the limits, runs
    /// the oldest queued ones here. Returns how many it ran.
    fn make_room(&self, device: usize) -> usize {
        let ledger = self.ledger(Some(device));
        let mut ran = 0;
        // Over the limits with nothing queued (all running, or on workers): nothing to help with.
        while self.limits.exceeded_by(ledger) && ledger.queued.load(Ordering::Relaxed) > 0 {
            let Some(q) = self.take_for(device) else { break };
            self.run(q, None, true);
            ran += 1;
        }
        ran
    }

    /// Runs the queued releases of `device` here (as many as were pending at the call: others
    /// may keep queueing), then waits, up to `wait`, until as many of its releases have
    /// finished as were pending at the call, or until none pending holds memory any more when
    /// some did. The wait covers releases running on release threads or other helping threads,
    /// and on workers unless the caller is a library thread (it may be the very worker such a
    /// release waits behind). Returns whether any was pending.
    fn drain(&self, device: usize, wait: Duration) -> bool {
        let ledger = self.ledger(Some(device));
        let outside = |counts: u64| {
            let on_workers = if raft_exit::on_library_thread() { ledger.on_workers.load(Ordering::SeqCst) } else { 0 };
            pending_of(counts).saturating_sub(on_workers)
        };
        // What is owed and what had finished, at one instant.
        let counts = ledger.counts.load(Ordering::SeqCst);
        let pending = outside(counts);
        if pending == 0 {
            return false;
        }
        let finished_before = finished_of(counts);
        #[cfg(test)]
        tests::AFTER_DRAIN_SNAPSHOT.with(|hook| hook.take().map(|f| f()));
        let held_memory = ledger.bytes.load(Ordering::SeqCst) > 0;
        for _ in 0..pending {
            let Some(q) = self.take_for(device) else { break };
            self.run(q, None, true);
        }
        let deadline = Instant::now() + wait;
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let mut g = self.finished_lock.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let counts = ledger.counts.load(Ordering::SeqCst);
            let all_finished = finished_of(counts).wrapping_sub(finished_before) as usize >= pending;
            let memory_freed = held_memory && ledger.bytes.load(Ordering::SeqCst) == 0;
            let now = Instant::now();
            if all_finished || memory_freed || outside(counts) == 0 || now >= deadline {
                break;
            }
            // Bounded naps as well as the notification: a worker's release settles without it.
            g = self.finished.wait_timeout(g, (deadline - now).min(Duration::from_millis(10))).unwrap_or_else(|e| e.into_inner()).0;
        }
        drop(g);
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        true
    }

    /// Starts one more release thread when `queued` releases are more than the running ones
    /// get through quickly: bursts of drops that no new() follows (a service shutting down a
    /// batch, threads ending) drain on more threads where the driver lets them run in parallel.
    fn maybe_grow(&'static self, queued: usize) {
        let running = self.threads.load(Ordering::Relaxed);
        if !self.spawns || running >= self.max_threads || running == 0 || queued <= GROW_AT * running {
            return;
        }
        if self.threads.compare_exchange(running, running + 1, Ordering::AcqRel, Ordering::Relaxed).is_ok() && !self.spawn(true) {
            self.threads.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Starts a release thread (counted in `threads` by the caller); one started on demand
    /// (`extra`) ends after `EXTRA_IDLE` without work. Returns whether it started.
    fn spawn(&'static self, extra: bool) -> bool {
        let Some(slot) = SLOT_TAKEN.iter().position(|s| s.compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed).is_ok())
        else {
            return false;
        };
        let body = move || {
            raft_exit::mark_library_thread();
            let busy = &BUSY_SINCE[slot];
            loop {
                let next = {
                    let mut queue = self.lock();
                    loop {
                        if let Some(q) = queue.pop_front() {
                            break Some(q);
                        }
                        if extra {
                            let (q, timeout) = self.work.wait_timeout(queue, EXTRA_IDLE).unwrap_or_else(|e| e.into_inner());
                            queue = q;
                            if timeout.timed_out() && queue.is_empty() {
                                break None;
                            }
                        } else {
                            queue = self.work.wait(queue).unwrap_or_else(|e| e.into_inner());
                        }
                    }
                };
                let Some(q) = next else { break };
                self.ledger(q.device).queued.fetch_sub(1, Ordering::Relaxed);
                self.run(q, Some(busy), false);
            }
            self.threads.fetch_sub(1, Ordering::AcqRel);
            SLOT_TAKEN[slot].store(false, Ordering::Release);
        };
        // The first release, or a long queue, may come from a thread-local destructor (a
        // thread's default resources dropped as it ends), where std's spawn can panic: then
        // no thread is started, and the caller carries on without it.
        let started = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            std::thread::Builder::new().name(format!("raft-release-{slot}")).spawn(body).is_ok()
        }))
        .unwrap_or(false);
        if !started {
            SLOT_TAKEN[slot].store(false, Ordering::Release);
        }
        started
    }

    fn totals(&self) -> PendingReleases {
        self.ledgers.iter().chain(std::iter::once(&self.unplaced)).map(Ledger::snapshot).fold(Default::default(), |a, b| a + b)
    }
}

/// The process's pool: its ledgers from the first use, its threads from the first release
/// queued for them (`start_threads`).
fn pool() -> &'static Pool {
    static POOL: OnceLock<&'static Pool> = OnceLock::new();
    if let Some(pool) = POOL.get() {
        return pool;
    }
    let mut warnings = Vec::new();
    let pool = POOL.get_or_init(|| {
        let base = knob("RAFT_RELEASE_THREADS", 4, 1..=MAX_THREADS, &mut warnings);
        let max = knob("RAFT_RELEASE_THREADS_MAX", 16.max(base), base..=MAX_THREADS, &mut warnings);
        // Leaked on purpose: the threads borrow it for the life of the process.
        Box::leak(Box::new(Pool::new(Limits::from_env(&mut warnings), base, max, true)))
    });
    // Logged once the pool is set (see `knob`), guarded: the first use may be a drop, which a
    // logger's panic must not make panic (the eighteenth audit).
    for warning in warnings {
        raft_exit::log_guarded(|| log::warn!(target: "raft", "{warning}"));
    }
    pool
}

/// Starts the pool's threads on first use; whether any runs. A start that failed (no thread
/// could be spawned, say from a thread-local destructor) is tried again by the next release.
fn start_threads(pool: &'static Pool) -> bool {
    static STARTED: AtomicBool = AtomicBool::new(false);
    static STARTING: Mutex<()> = Mutex::new(());
    if STARTED.load(Ordering::Acquire) {
        return true;
    }
    #[cfg(test)]
    if tests::REFUSE_THREADS.load(Ordering::SeqCst) {
        return false; // as if the OS refused every thread (a child process's test only)
    }
    let _one = STARTING.lock().unwrap_or_else(|e| e.into_inner());
    while pool.threads.load(Ordering::Acquire) < pool.base_threads {
        pool.threads.fetch_add(1, Ordering::AcqRel);
        if !pool.spawn(false) {
            pool.threads.fetch_sub(1, Ordering::AcqRel);
            break;
        }
    }
    let any = pool.threads.load(Ordering::Acquire) > 0;
    STARTED.store(any, Ordering::Release);
    any
}

/// Queues `release` on `worker` itself, behind the jobs already queued there; the worker ends
/// after it. A long job then delays only its own resources' release, never the others'. Falls
/// back to a release thread when the worker has stopped. `held` is counted in the device's
/// ledger until the release has run.
pub(crate) fn on_worker(worker: crate::job::Worker, label: raft_exit::Label, held: Held, release: Release) {
    let Ok(token) = raft_exit::ReleaseToken::try_register(label) else {
        // The exit has decided: no CUDA call may start now; the OS takes the native objects.
        std::mem::forget((worker, release));
        return;
    };
    let pool = pool();
    let device = label.device;
    let ledger = pool.ledger(device);
    ledger.add(held);
    ledger.on_workers.fetch_add(1, Ordering::Relaxed);
    let task: Release = Box::new(move || {
        let start = Instant::now();
        crate::result::catch_forgetting(release);
        RUN_NS.fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        DONE.fetch_add(1, Ordering::Relaxed);
        pool.ledger(device).on_workers.fetch_sub(1, Ordering::Relaxed);
        pool.settle(device, held);
        drop(token);
    });
    if let Err(task) = worker.retire(task) {
        // The worker has stopped: a release thread runs it, under the token and the accounts it
        // already holds.
        send(
            pool,
            Queued { release: task, device: None, held: Held::default(), queued_at: Instant::now(), _token: None, counts_itself: true },
        );
    }
}

/// Why [`on_own_thread`] did not start its release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NotStarted {
    /// The exit has decided: no release may start now.
    ExitDecided,
    /// No thread could be started.
    NoThread,
}

/// Runs `release` on a thread of its own, counted like a release on a worker: by the exit, and
/// in the device's ledger (`held`) until it has run, so that an out-of-memory retry waits for it.
/// For a release that waits for uses in flight (`resources.rs`, `finish_release_elsewhere`):
/// no thread that helps the queue may run it, as that thread may hold one of those uses.
/// Returns the new thread's id; when not started, `release` is dropped unrun.
pub(crate) fn on_own_thread(label: raft_exit::Label, held: Held, release: Release) -> Result<std::thread::ThreadId, NotStarted> {
    let Ok(token) = raft_exit::ReleaseToken::try_register(label) else {
        return Err(NotStarted::ExitDecided);
    };
    let pool = pool();
    let device = label.device;
    let ledger = pool.ledger(device);
    ledger.add(held);
    ledger.on_workers.fetch_add(1, Ordering::Relaxed);
    let settle = move || {
        pool.ledger(device).on_workers.fetch_sub(1, Ordering::Relaxed);
        pool.settle(device, held);
    };
    // As `Pool::spawn`: the caller may be a thread-local destructor (an out-of-memory retry in
    // one), where std's spawn can panic.
    let spawned = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        std::thread::Builder::new().name("raft-release-rest".into()).spawn(move || {
            raft_exit::mark_library_thread();
            let start = Instant::now();
            crate::result::catch_forgetting(release);
            RUN_NS.fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
            DONE.fetch_add(1, Ordering::Relaxed);
            settle();
            drop(token);
        })
    }));
    match spawned {
        Ok(Ok(thread)) => Ok(thread.thread().id()),
        Ok(Err(_)) | Err(_) => {
            // The closure (with the token and the release) was dropped unrun: undo the accounts.
            pool.ledger(device).on_workers.fetch_sub(1, Ordering::Relaxed);
            pool.settle(device, held);
            Err(NotStarted::NoThread)
        }
    }
}

/// Queues `release` on a release thread, counted in `label`'s device ledger as holding
/// nothing. Never blocks on the GPU, never panics; when no thread could be started, it waits
/// in the queue, counted, for the next thread, drain or backpressure to run it.
pub(crate) fn enqueue(label: raft_exit::Label, release: Release) {
    enqueue_holding(label, Held::default(), release)
}

/// [`enqueue`], counting `held` in the device's ledger until the release has run.
pub(crate) fn enqueue_holding(label: raft_exit::Label, held: Held, release: Release) {
    let Ok(token) = raft_exit::ReleaseToken::try_register(label) else {
        // The exit has decided: a release queued now could still be in a CUDA call when the
        // static destructors run; the OS takes the native objects instead.
        std::mem::forget(release);
        return;
    };
    let q = Queued { release, device: label.device, held, queued_at: Instant::now(), _token: Some(token), counts_itself: false };
    send(pool(), q);
}

fn send(pool: &'static Pool, mut q: Queued) {
    if !start_threads(pool) {
        // No thread could be started (the OS refused one: a pids limit): queued and counted all
        // the same, for the next release that starts a thread, an out-of-memory drain or the
        // backpressure to run on any thread. It was forgotten here, its memory lost for good and
        // uncounted, so no drain could even wait for it (the twenty-first audit, helper 104).
        // Its exit token goes: with no thread to run it, the exit must not wait for it (the OS
        // takes it then).
        q._token = None;
        pool.push_local(q);
        // Guarded: this runs inside drops (an array's, a memory resource's) and inside
        // `create_held` after its block was allocated (the map's old copy let go), where a
        // logger's panic left that block to nobody (helper 115).
        raft_exit::log_guarded(|| log::warn!(target: "raft", "no release thread could be started: the release waits in the queue for one"));
        return;
    }
    pool.push(q);
}

/// Backpressure, called before making what a release will later have to free (a stream, a
/// handle): while the releases pending on `device` hold more than the limits, runs the oldest
/// queued ones on the calling thread. Two atomic loads when under the limits.
/// Returns whether it ran any release on this thread.
pub(crate) fn make_room(device: usize) -> bool {
    pool().make_room(device) > 0
}

/// Whether the releases pending on `device` hold more than the limits (a handle lookup checks
/// this before asking whether its handle exists yet).
pub(crate) fn over_limits(device: usize) -> bool {
    let pool = pool();
    pool.limits.exceeded_by(pool.ledger(Some(device)))
}

/// Runs the queued releases of `device` on the calling thread and waits, up to [`OOM_WAIT`], for
/// those running elsewhere; with `kept_handles` (an `OutOfMemory` retry: the one place), then
/// destroys the handles kept for reuse, the drained ones' among them (it synchronises the device,
/// which breaks other threads' captures: memory wins), on a thread of its own
/// ([`trim_kept_handles_elsewhere`]). Whether anything was pending or destroyed.
pub(crate) fn drain_device(device: usize, kept_handles: bool) -> bool {
    pool().drain(device, OOM_WAIT) | (kept_handles && trim_kept_handles_elsewhere(device, OOM_WAIT))
}

/// Destroys the library handles kept for reuse on `device` (`raftrs_handles_trim`) on a thread
/// of its own, counted as a release pending on the device until it has run (another thread's
/// out-of-memory retry meanwhile waits for it rather than failing beside memory about to be
/// given back; the exit waits for it), and waits up to `wait` for it. Each destroy synchronises
/// the device: on the allocating thread it waited, without bound, for every other thread's work
/// (the seventeenth audit: another rank's collective waiting for this very thread was a
/// deadlock). Whether it destroyed any within the wait.
fn trim_kept_handles_elsewhere(device: usize, wait: Duration) -> bool {
    let done: std::sync::Arc<(Mutex<Option<usize>>, Condvar)> = Default::default();
    let report = done.clone();
    let trim: Release = Box::new(move || {
        let destroyed = crate::result::trim_kept_handles(device);
        let (lock, ready) = &*report;
        *lock.lock().unwrap_or_else(|e| e.into_inner()) = Some(destroyed);
        ready.notify_all();
    });
    let label = raft_exit::Label { what: "library handles kept for reuse", id: raft_exit::next_id(), device: Some(device) };
    if on_own_thread(label, Held::default(), trim).is_err() {
        return false;
    }
    let (lock, ready) = &*done;
    let got = lock.lock().unwrap_or_else(|e| e.into_inner());
    let (got, _) = ready.wait_timeout_while(got, wait, |d| d.is_none()).unwrap_or_else(|e| e.into_inner());
    got.is_some_and(|destroyed| destroyed > 0)
}

/// What the releases pending on `device` hold now.
pub(crate) fn pending(device: usize) -> PendingReleases {
    pool().ledger(Some(device)).snapshot()
}

/// What all pending releases hold now.
pub(crate) fn pending_total() -> PendingReleases {
    pool().totals()
}

/// The limits per device in force (read from the environment once).
pub(crate) fn limits() -> Limits {
    pool().limits
}

/// Release threads running now (the ones always there and those started on demand).
pub(crate) fn release_threads() -> usize {
    pool().threads.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests;
