//! Job round trips (`spawn` + `join` on the resources' worker) against the same waits written
//! without the library, and against waits that block at once.
use crate::measure::{measure, measure_turns, Stat};
use crate::table::Table;
use raft::DeviceResources;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};

/// As many spin-loop hints as `JobHandle::join` gives before parking (crates/raft-core/src/job.rs).
const JOIN_SPINS: usize = 2000;

/// A job's completion as `JobHandle` keeps it: an atomic flag the worker sets under a mutex,
/// and a condvar for a caller that stopped spinning.
struct Done {
    flag: AtomicBool,
    lock: Mutex<()>,
    cv: Condvar,
}

/// Job round trips without the library, waited for as `join` waits: a request over mpsc to a
/// thread waiting in `recv` (as the worker does), which sets the request's flag; the caller
/// spins `JOIN_SPINS` hints on the flag, then parks on the condvar. Measured in turns with
/// `ours` (the goal row's two sides see the same drifts of the machine): [ours, this].
fn spinning_round_trip_in_turns(warmup: usize, samples: usize, ours: &mut dyn FnMut()) -> [Stat; 2] {
    let (tx, rx) = mpsc::channel::<Arc<Done>>();
    let worker = std::thread::spawn(move || {
        while let Ok(done) = rx.recv() {
            black_box(1);
            let guard = done.lock.lock().unwrap();
            done.flag.store(true, Ordering::Release);
            drop(guard);
            done.cv.notify_all();
        }
    });
    let mut spinning = || {
        let done = Arc::new(Done { flag: AtomicBool::new(false), lock: Mutex::new(()), cv: Condvar::new() });
        tx.send(done.clone()).unwrap();
        for _ in 0..JOIN_SPINS {
            if done.flag.load(Ordering::Acquire) {
                return;
            }
            std::hint::spin_loop();
        }
        let mut guard = done.lock.lock().unwrap();
        while !done.flag.load(Ordering::Acquire) {
            guard = done.cv.wait(guard).unwrap();
        }
    };
    let stats = measure_turns(warmup, samples, [ours, &mut spinning]);
    drop(tx);
    worker.join().unwrap();
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
    let ours_job = format!("spawn + join: mpsc to the worker waiting in recv; join spins {JOIN_SPINS} hints on the job's flag, then parks");
    let spinning_label = format!(
        "spinning round trip: mpsc to a thread waiting in recv, which sets a flag; the caller spins {JOIN_SPINS} hints on it, then parks"
    );
    const BLOCKING: &str = "blocking round trip: mpsc to a thread waiting in recv and back; the caller blocks in recv";
    const SPAWN: &str = "std::thread::spawn + join";
    let [ours, spinning] = spinning_round_trip_in_turns(200, 5000, &mut || r.spawn(|| black_box(1)).unwrap().join().map(drop).unwrap());
    let parked = parked_round_trip(200, 5000);
    let spawn_join = measure(50, 1000, 1, || std::thread::spawn(|| black_box(1)).join().map(drop).unwrap());
    t.add(
        "job round trip (no-op job), same wait: spin, then park (in turns)",
        &ours_job,
        ours,
        vec![(&spinning_label, spinning)],
        &spinning_label,
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
}
