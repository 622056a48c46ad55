//! Job round trips (`spawn` + `join` on the resources' worker) against the same waits written
//! without the library, and against waits that block at once.
use crate::measure::{measure, measure_turns, stat_of, Stat};
use crate::table::Table;
use raft::DeviceResources;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// As many spin-loop hints as `JobHandle::join` gives before parking (crates/raft-core/src/job.rs).
const JOIN_SPINS: usize = 2000;

/// A job's completion as `JobHandle` keeps it: an atomic flag the worker sets under a mutex,
/// and a condvar for a caller that stopped spinning.
struct Done {
    flag: AtomicBool,
    /// Callers parked on `cv` (counted under the lock, as `JobHandle::join` counts itself).
    lock: Mutex<usize>,
    cv: Condvar,
}

/// How long the resources' worker watches for the next job before it sleeps (the default of
/// `RAFT_WORKER_SPIN_US`, crates/raft-core/src/job.rs).
const WORKER_WATCH: Duration = Duration::from_micros(50);

/// The bare thread's wait for the next request: at once in `recv` (std's short spin, then
/// parked), or watching with `try_recv` for `watch` first, as the resources' worker does.
fn next<T>(rx: &mpsc::Receiver<T>, watch: Duration) -> Option<T> {
    if !watch.is_zero() {
        let start = Instant::now();
        loop {
            for _ in 0..64 {
                match rx.try_recv() {
                    Ok(v) => return Some(v),
                    Err(mpsc::TryRecvError::Disconnected) => return None,
                    Err(mpsc::TryRecvError::Empty) => std::hint::spin_loop(),
                }
            }
            if start.elapsed() >= watch {
                break;
            }
        }
    }
    rx.recv().ok()
}

/// A thread that completes `Done`s, waiting for each as `next`. `wake_always`: the wake (a
/// system call) at every completion, as the spin round trip was written (run 123 found
/// that this call is what keeps that thread awake for the next request: without it, it parks
/// between requests and its round trip reads ~7 µs); otherwise only for a caller that parked, as
/// `Shared::complete` does (the like-with-like row).
fn done_thread(watch: Duration, wake_always: bool) -> (mpsc::Sender<Arc<Done>>, std::thread::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel::<Arc<Done>>();
    let worker = std::thread::spawn(move || {
        while let Some(done) = next(&rx, watch) {
            black_box(1);
            let parked = {
                let guard = done.lock.lock().unwrap();
                done.flag.store(true, Ordering::Release);
                *guard
            };
            if wake_always || parked > 0 {
                done.cv.notify_all();
            }
        }
    });
    (tx, worker)
}

/// One round trip to such a thread, waited for as `join` waits: spin `JOIN_SPINS` hints on the
/// flag, then park on the condvar.
fn round_trip(tx: &mpsc::Sender<Arc<Done>>) {
    let done = Arc::new(Done { flag: AtomicBool::new(false), lock: Mutex::new(0), cv: Condvar::new() });
    tx.send(done.clone()).unwrap();
    for _ in 0..JOIN_SPINS {
        if done.flag.load(Ordering::Acquire) {
            return;
        }
        std::hint::spin_loop();
    }
    let mut guard = done.lock.lock().unwrap();
    *guard += 1; // counted as parked under the lock, as `JobHandle::join`
    while !done.flag.load(Ordering::Acquire) {
        guard = done.cv.wait(guard).unwrap();
    }
}

/// Job round trips without the library, in turns with `ours`: [ours, to a thread waiting in
/// `recv` at once (the baseline), to a thread that watches as the worker does].
fn round_trips_in_turns(warmup: usize, samples: usize, ours: &mut dyn FnMut()) -> [Stat; 3] {
    let (sleeping_tx, sleeping) = done_thread(Duration::ZERO, true);
    let (watching_tx, watching) = done_thread(WORKER_WATCH, false);
    let stats = measure_turns(warmup, samples, [ours, &mut || round_trip(&sleeping_tx), &mut || round_trip(&watching_tx)]);
    drop((sleeping_tx, watching_tx));
    sleeping.join().unwrap();
    watching.join().unwrap();
    stats
}

/// Round trips over two mpsc channels to a thread waiting in `recv`; the caller blocks in
/// `recv` too (std's short backoff, then parked: no spin of its own).
fn parked_round_trip(warmup: usize, samples: usize) -> Stat {
    let (req_tx, req_rx) = mpsc::channel::<u32>();
    let (rep_tx, rep_rx) = mpsc::channel::<u32>();
    let parked = std::thread::spawn(move || {
        while let Ok(v) = req_rx.recv() {
            rep_tx.send(v).unwrap();
        }
    });
    let s = measure(warmup, samples, 1, || {
        req_tx.send(1).unwrap();
        rep_rx.recv().unwrap();
    });
    drop(req_tx);
    parked.join().unwrap();
    s
}

/// Case 4: job round trip (no-op job).
pub fn rows(t: &mut Table, r: &DeviceResources) {
    // 4. job round trip (no-op job). Ours sends the job over mpsc to the resources' worker,
    // waiting in `recv`, and `join` spins before it parks: compared like with like (the same
    // waits, without the library), then, reported only, against waits that block at once.
    let ours_job = format!(
        "spawn + join: mpsc to the worker (which watches {} µs for the next job, then sleeps in recv); join spins {JOIN_SPINS} hints on the job's flag, then parks",
        WORKER_WATCH.as_micros()
    );
    let spinning_label = format!(
        "spinning round trip: mpsc to a thread waiting in recv, which sets a flag and wakes the condvar; the caller spins {JOIN_SPINS} hints on it, then parks"
    );
    let watching_label = format!(
        "the same round trip, the thread watching {} µs with try_recv before recv and waking only a parked caller, as the worker",
        WORKER_WATCH.as_micros()
    );
    const BLOCKING: &str = "blocking round trip: mpsc to a thread waiting in recv and back; the caller blocks in recv";
    const SPAWN: &str = "std::thread::spawn + join";
    let [ours, spinning, watching] = round_trips_in_turns(200, 5000, &mut || r.spawn(|| black_box(1)).unwrap().join().map(drop).unwrap());
    let parked = parked_round_trip(200, 5000);
    let spawn_join = measure(50, 1000, 1, || std::thread::spawn(|| black_box(1)).join().map(drop).unwrap());
    t.add(
        "job round trip (no-op job) against the spin round trip (issue 30's goal, in turns)",
        &ours_job,
        ours,
        vec![(&spinning_label, spinning), (&watching_label, watching)],
        &spinning_label,
        "<= 1.50x",
        |a, b| a <= 1.50 * b,
    );
    t.add(
        "job round trip (no-op job), like with like: the bare thread waits as the worker does (same turns)",
        &ours_job,
        ours,
        vec![(&watching_label, watching)],
        &watching_label,
        "<= 1.10x",
        |a, b| a <= 1.10 * b,
    );
    t.report(
        "job round trip (no-op job), against waits that block at once (unlike: ours spins first)",
        &ours_job,
        ours,
        vec![(BLOCKING, parked), (SPAWN, spawn_join)],
        BLOCKING,
        "reported",
    );
    steps(t, r);
}

/// Where a job round trip's time goes: `spawn` alone (the join outside the timed region), and
/// `join` alone of a job already finished (the wait outside it).
fn steps(t: &mut Table, r: &DeviceResources) {
    let mut spawn_only = Vec::with_capacity(5000);
    let mut join_only = Vec::with_capacity(5000);
    for i in 0..5200 {
        let t0 = Instant::now();
        let h = r.spawn(|| black_box(1)).unwrap();
        let spawned = t0.elapsed().as_nanos() as f64;
        while !h.is_finished() {
            std::hint::spin_loop();
        }
        let t1 = Instant::now();
        h.join().unwrap();
        let joined = t1.elapsed().as_nanos() as f64;
        if i >= 200 {
            spawn_only.push(spawned);
            join_only.push(joined);
        }
    }
    t.report(
        "where a job round trip goes: spawn alone (queued; the join untimed)",
        "DeviceResources::spawn of a no-op job: exit wait read, worker lock, registry token, completion state, boxed task, channel send",
        stat_of(spawn_only),
        vec![],
        "—",
        "reported",
    );
    t.report(
        "where a job round trip goes: join of a job already finished",
        "JobHandle::join once is_finished() is true: the flag, the result taken under the lock",
        stat_of(join_only),
        vec![],
        "—",
        "reported",
    );
}
