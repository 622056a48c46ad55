//! The library release threads: releases started by `Drop` run here, so a dropping thread never
//! blocks on the GPU. Each queued release is registered with the exit machinery.
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

/// Releases finished on the library threads (release threads and retiring workers).
static DONE: AtomicU64 = AtomicU64::new(0);
/// Most release threads there can be (`RAFT_RELEASE_THREADS` is capped at this).
const MAX_THREADS: usize = 64;
/// Per release thread: when its current release started (ns after `epoch()`, +1), 0 when idle.
/// One slot each, so a thread finishing its release never hides another's that hangs.
static BUSY_SINCE: [AtomicU64; MAX_THREADS] = [const { AtomicU64::new(0) }; MAX_THREADS];

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Releases finished so far on library threads.
pub(crate) fn releases_done() -> u64 {
    DONE.load(Ordering::Relaxed)
}

/// The longest any release thread has been busy with its current release (zero when all are
/// idle): a release that hangs shows here.
pub(crate) fn release_busy_for() -> std::time::Duration {
    let now = epoch().elapsed();
    BUSY_SINCE
        .iter()
        .map(|b| match b.load(Ordering::Relaxed) {
            0 => std::time::Duration::ZERO,
            since => now.saturating_sub(std::time::Duration::from_nanos(since - 1)),
        })
        .max()
        .unwrap_or_default()
}

type Release = Box<dyn FnOnce() + Send + 'static>;

struct Queued {
    release: Release,
    /// None when the release carries its own token (a worker's release that fell back here).
    _token: Option<raft_exit::ReleaseToken>,
    /// Whether the release counts itself in `DONE` (a worker's release that fell back here).
    counts_itself: bool,
}

/// How many release threads: `RAFT_RELEASE_THREADS` (1 to 64), else 4. Releasing many streams
/// at once is slow in the driver when thousands are alive (see docs/RELIABILITY.md), so several
/// threads keep the queue short.
fn release_threads() -> usize {
    std::env::var("RAFT_RELEASE_THREADS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|n| (1..=MAX_THREADS).contains(n))
        .unwrap_or(4)
}

fn queue() -> Option<&'static Mutex<mpsc::Sender<Queued>>> {
    static QUEUE: OnceLock<Option<Mutex<mpsc::Sender<Queued>>>> = OnceLock::new();
    QUEUE
        .get_or_init(|| {
            let (tx, rx) = mpsc::channel::<Queued>();
            let rx = std::sync::Arc::new(Mutex::new(rx));
            let mut started = 0;
            for (i, busy) in BUSY_SINCE.iter().enumerate().take(release_threads()) {
                let rx = rx.clone();
                let spawned = std::thread::Builder::new().name(format!("raft-release-{i}")).spawn(move || {
                    raft_exit::mark_library_thread();
                    loop {
                        // Take one release; the lock is not held while it runs.
                        let next = rx.lock().unwrap_or_else(|e| e.into_inner()).recv();
                        let Ok(q) = next else { break };
                        busy.store(epoch().elapsed().as_nanos() as u64 + 1, Ordering::Relaxed);
                        // A failing release must not stop the ones behind it.
                        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(q.release));
                        busy.store(0, Ordering::Relaxed);
                        if !q.counts_itself {
                            DONE.fetch_add(1, Ordering::Relaxed);
                        }
                        // `_token` drops here: the release has ended.
                    }
                });
                started += spawned.is_ok() as usize;
            }
            (started > 0).then(|| Mutex::new(tx))
        })
        .as_ref()
}

/// Queues `release` on `worker` itself, behind the jobs already queued there; the worker ends
/// after it. A long job then delays only its own resources' release, never the others'. Falls
/// back to the release thread when the worker has stopped.
pub(crate) fn on_worker(worker: crate::job::Worker, label: raft_exit::Label, release: Release) {
    let token = raft_exit::ReleaseToken::register(label);
    let task: Release = Box::new(move || {
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(release));
        DONE.fetch_add(1, Ordering::Relaxed);
        drop(token);
    });
    if let Err(task) = worker.retire(task) {
        // The worker has stopped: the release thread runs it, under the token it already holds.
        send(Queued { release: task, _token: None, counts_itself: true });
    }
}

/// Queues `release` on the release thread. Never blocks on the GPU, never panics; when no
/// thread can run it (none could be started), the native objects are leaked instead.
pub(crate) fn enqueue(label: raft_exit::Label, release: Release) {
    send(Queued { release, _token: Some(raft_exit::ReleaseToken::register(label)), counts_itself: false });
}

fn send(queued: Queued) {
    let Some(q) = queue() else {
        log::warn!(target: "raft", "no release thread could be started: native objects leaked");
        std::mem::forget(queued.release);
        return;
    };
    let sent = q.lock().unwrap_or_else(|e| e.into_inner()).send(queued);
    if let Err(mpsc::SendError(q)) = sent {
        std::mem::forget(q.release);
    }
}
