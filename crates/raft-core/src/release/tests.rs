//! The release machinery's unit tests (the ledger, releases on threads of their own, the queue).
use super::*;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::Arc;

const MIB: u64 = 1 << 20;

/// A release on a thread of its own is counted by its device's ledger (as waiting on a
/// worker, which a library thread's out-of-memory retry does not wait for) from the call
/// until it has run, and runs on another thread. Device 41: no other test counts there.
#[test]
#[cfg_attr(miri, ignore = "registers the exit hook with glibc's on_exit, a foreign function Miri cannot run")]
fn a_release_on_its_own_thread_is_counted_until_it_has_run() {
    let device = 41;
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let (ran_tx, ran_rx) = std::sync::mpsc::channel();
    let label = raft_exit::Label { what: "test release", id: raft_exit::next_id(), device: Some(device) };
    let held = Held { streams: 1, handles: 2, bytes: 3 * MIB };
    let started = on_own_thread(
        label,
        held,
        Box::new(move || {
            go_rx.recv().unwrap();
            ran_tx.send(std::thread::current().id()).unwrap();
        }),
    )
    .unwrap();
    let during = pending(device);
    assert_eq!((during.releases, during.on_workers, during.streams, during.handles, during.bytes), (1, 1, 1, 2, 3 * MIB));
    go_tx.send(()).unwrap();
    let ran_on = ran_rx.recv().unwrap();
    assert_eq!(ran_on, started);
    assert_ne!(ran_on, std::thread::current().id());
    let give_up = Instant::now() + Duration::from_secs(5);
    while pending(device).releases != 0 && Instant::now() < give_up {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(pending(device), PendingReleases::default(), "settled once it ran");
}

/// The out-of-memory retry's trim of the kept handles (`trim_kept_handles_elsewhere`) runs as a
/// release of its own (counted as one run), answers as soon as it has run rather than at the
/// end of its wait, and leaves its device's ledger as it was. The shim refuses device 43 (no
/// driver here, no such device on a GPU machine), so nothing is destroyed and the answer is
/// `false`. Device 43: no other test counts there.
#[test]
#[cfg_attr(miri, ignore = "registers the exit hook with glibc's on_exit, a foreign function Miri cannot run")]
fn the_kept_handles_trim_runs_as_a_release_and_answers_before_its_wait_ends() {
    let device = 43;
    let done_before = releases_done();
    let start = Instant::now();
    assert!(!trim_kept_handles_elsewhere(device, Duration::from_secs(5)), "no handle of device 43 could be destroyed");
    assert!(start.elapsed() < Duration::from_secs(5), "the trim's answer came only with the wait's end");
    let give_up = Instant::now() + Duration::from_secs(5);
    while pending(device).releases != 0 && Instant::now() < give_up {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(pending(device), PendingReleases::default(), "settled once it ran");
    assert!(releases_done() > done_before, "counted as a release run");
}

fn handle() -> Held {
    Held { streams: 1, handles: 1, bytes: 65 * MIB }
}

/// A pool with no threads: only helping threads run its releases.
fn pool(releases: usize, bytes: u64) -> Pool {
    Pool::new(Limits { releases, bytes }, 1, 1, false)
}

fn queued(device: usize, held: Held, ran: &Arc<AtomicUsize>) -> Queued {
    let ran = ran.clone();
    Queued {
        release: Box::new(move || {
            ran.fetch_add(1, Ordering::SeqCst);
        }),
        device: Some(device),
        held,
        queued_at: Instant::now(),
        _token: None,
        counts_itself: false,
    }
}

#[test]
fn the_ledger_counts_what_is_queued_and_forgets_what_ran() {
    let p = pool(1000, 10_000 * MIB);
    let ran = Arc::new(AtomicUsize::new(0));
    for _ in 0..3 {
        p.push_local(queued(0, handle(), &ran));
    }
    p.push_local(queued(1, Held { streams: 1, handles: 0, bytes: 0 }, &ran));
    let d0 = p.ledger(Some(0)).snapshot();
    assert_eq!((d0.releases, d0.queued, d0.streams, d0.handles, d0.bytes), (3, 3, 3, 3, 195 * MIB));
    assert_eq!(p.totals().releases, 4);
    assert_eq!(p.totals().bytes, 195 * MIB);
    // Nothing over the limits: helping runs nothing.
    assert_eq!(p.make_room(0), 0);
    assert_eq!(ran.load(Ordering::SeqCst), 0);
    // Draining device 1 runs its release only.
    assert!(p.drain(1, Duration::from_secs(1)));
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    assert_eq!(p.ledger(Some(1)).snapshot(), Default::default());
    assert_eq!(p.ledger(Some(0)).snapshot().releases, 3);
    // Nothing pending on device 1 any more: no retry is worth it.
    assert!(!p.drain(1, Duration::from_secs(1)));
    assert!(p.drain(0, Duration::from_secs(1)));
    assert_eq!(ran.load(Ordering::SeqCst), 4);
    assert_eq!(p.totals(), Default::default());
}

#[test]
fn helping_runs_the_oldest_of_its_device_until_under_the_limits() {
    // 4 handles' worth of bytes allowed: 10 queued handles leave 4 after helping.
    let p = pool(1000, 4 * 65 * MIB);
    let order = Arc::new(Mutex::new(Vec::new()));
    for i in 0..10 {
        let order = order.clone();
        p.push_local(Queued {
            release: Box::new(move || order.lock().unwrap().push(i)),
            device: Some(0),
            held: handle(),
            queued_at: Instant::now(),
            _token: None,
            counts_itself: false,
        });
    }
    assert_eq!(p.make_room(0), 6);
    assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3, 4, 5]);
    let left = p.ledger(Some(0)).snapshot();
    assert_eq!((left.releases, left.bytes), (4, 4 * 65 * MIB));
    assert!(!p.limits.exceeded_by(p.ledger(Some(0))));
    // Another device's backlog is not this device's business.
    let ran = Arc::new(AtomicUsize::new(0));
    for _ in 0..10 {
        p.push_local(queued(1, handle(), &ran));
    }
    assert_eq!(p.make_room(0), 0);
    assert_eq!(p.make_room(1), 6);
}

#[test]
fn the_count_limit_holds_for_releases_holding_no_memory() {
    let p = pool(8, u64::MAX);
    let ran = Arc::new(AtomicUsize::new(0));
    for _ in 0..20 {
        p.push_local(queued(2, Held { streams: 1, handles: 0, bytes: 0 }, &ran));
    }
    assert_eq!(p.make_room(2), 12);
    assert_eq!(p.ledger(Some(2)).snapshot().releases, 8);
}

#[test]
fn a_panicking_release_is_settled_like_any_other() {
    let p = pool(0, 0);
    p.push_local(Queued {
        release: Box::new(|| panic!("a release failing")),
        device: Some(0),
        held: handle(),
        queued_at: Instant::now(),
        _token: None,
        counts_itself: false,
    });
    assert_eq!(p.make_room(0), 1);
    assert_eq!(p.ledger(Some(0)).snapshot(), Default::default());
}

/// A pool for the process's life (its threads hold `&'static` to it), kept reachable from a
/// static so that valgrind's leak check over the test binary stays meaningful.
fn kept(p: Pool) -> &'static Pool {
    static KEPT: std::sync::Mutex<Vec<&'static Pool>> = std::sync::Mutex::new(Vec::new());
    let p: &'static Pool = Box::leak(Box::new(p));
    KEPT.lock().unwrap_or_else(|e| e.into_inner()).push(p);
    p
}

thread_local! {
    /// Run once by `Pool::drain` on this thread right after it read what it waits for (the
    /// point between the two reads it made before the twentieth audit).
    pub(super) static AFTER_DRAIN_SNAPSHOT: std::cell::Cell<Option<Box<dyn FnOnce()>>> = const { std::cell::Cell::new(None) };
}

/// The twentieth audit (helper 96, found with loom): the wait read the pending releases and the
/// finished count apart; a release that finished between the reads was owed and never counted,
/// so with another release queued meanwhile (a long one, holding no memory) the wait ran to its
/// deadline. Read as one word, the wait ends when the release it saw ends. Before: 500 ms.
#[test]
fn an_out_of_memory_wait_counts_a_release_that_ends_as_it_looks() {
    let p = kept(pool(1000, u64::MAX));
    let device = 5;
    let ledger = p.ledger(Some(device));
    ledger.add(Held::default()); // R1: running elsewhere, holding no memory
    AFTER_DRAIN_SNAPSHOT.with(|hook| {
        hook.set(Some(Box::new(move || {
            p.settle(Some(device), Held::default()); // R1 ends
            p.ledger(Some(device)).add(Held::default()); // R2 starts, and runs long
        })))
    });
    let t = Instant::now();
    assert!(p.drain(device, Duration::from_millis(500)));
    let waited = t.elapsed();
    assert!(waited < Duration::from_millis(400), "the wait for R1 ran to its deadline ({waited:?}) behind R2");
    p.ledger(Some(device)).remove(Held::default()); // R2 ends
    assert_eq!(p.ledger(Some(device)).snapshot(), PendingReleases::default());
}

#[test]
fn an_out_of_memory_wait_ends_when_the_release_running_elsewhere_ends() {
    let p = kept(pool(1000, u64::MAX));
    let ran = Arc::new(AtomicUsize::new(0));
    p.push_local(queued(0, handle(), &ran));
    // Another thread takes it off the queue and is slow to run it: a drain finds nothing
    // queued and waits for it.
    let q = p.take_for(0).unwrap();
    let other = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        p.run(q, None, false);
    });
    let t = Instant::now();
    assert!(p.drain(0, Duration::from_secs(5)));
    let waited = t.elapsed();
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    assert!(waited >= Duration::from_millis(90), "waited {waited:?} for the release running elsewhere");
    assert!(waited < Duration::from_secs(4), "woken when it ended, not at the deadline: {waited:?}");
    other.join().unwrap();
    // And a release that never ends only holds the wait up to its bound.
    p.ledger(Some(0)).add(handle());
    let t = Instant::now();
    assert!(p.drain(0, Duration::from_millis(50)));
    assert!(t.elapsed() < Duration::from_secs(2));
}

#[test]
fn a_long_queue_starts_more_threads_which_end_when_idle() {
    let p = kept(Pool::new(Limits { releases: usize::MAX, bytes: u64::MAX }, 1, 4, true));
    p.threads.fetch_add(1, Ordering::AcqRel);
    assert!(p.spawn(false));
    let ran = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    for _ in 0..400 {
        let (ran, most) = (ran.clone(), most.clone());
        p.push(Queued {
            release: Box::new(move || {
                most.fetch_max(p.threads.load(Ordering::Relaxed), Ordering::SeqCst);
                std::thread::sleep(Duration::from_micros(500));
                ran.fetch_add(1, Ordering::SeqCst);
            }),
            device: Some(0),
            held: handle(),
            queued_at: Instant::now(),
            _token: None,
            counts_itself: false,
        });
    }
    let t = Instant::now();
    while p.ledger(Some(0)).snapshot().releases > 0 && t.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(ran.load(Ordering::SeqCst), 400);
    assert_eq!(p.ledger(Some(0)).snapshot(), Default::default());
    assert!(most.load(Ordering::SeqCst) > 1, "the backlog started more threads");
    assert!(p.threads.load(Ordering::SeqCst) <= 4);
    let t = Instant::now();
    while p.threads.load(Ordering::SeqCst) > 1 && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(p.threads.load(Ordering::SeqCst), 1, "the threads started on demand ended once idle");
}

#[test]
fn an_out_of_memory_wait_ends_once_no_pending_release_holds_memory() {
    let p = pool(1000, u64::MAX);
    let ran = Arc::new(AtomicUsize::new(0));
    // A release that holds no memory runs elsewhere and never ends; the handle queued
    // behind it is run by the drain itself, which then stops waiting.
    p.ledger(Some(0)).add(Held { streams: 1, handles: 0, bytes: 0 });
    p.push_local(queued(0, handle(), &ran));
    let t = Instant::now();
    assert!(p.drain(0, Duration::from_secs(5)));
    assert!(t.elapsed() < Duration::from_secs(2), "waited {:?} for a release holding no memory", t.elapsed());
    assert_eq!(ran.load(Ordering::SeqCst), 1);
}

#[test]
fn a_worker_s_release_falling_back_to_the_queue_is_counted_once_it_ran() {
    let p = pool(1000, u64::MAX);
    let ran = Arc::new(AtomicUsize::new(0));
    let q = Queued { device: None, held: Held::default(), counts_itself: true, ..queued(0, Held::default(), &ran) };
    p.push_local(q);
    assert_eq!(p.totals().releases, 1);
    let q = {
        let mut queue = p.lock();
        queue.pop_front().unwrap()
    };
    p.ledger(None).queued.fetch_sub(1, Ordering::Relaxed);
    p.run(q, None, false);
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    assert_eq!(p.totals(), Default::default());
}

#[test]
fn devices_beyond_the_last_ledger_share_it() {
    let p = pool(1000, u64::MAX);
    let ran = Arc::new(AtomicUsize::new(0));
    p.push_local(queued(MAX_DEVICES + 5, handle(), &ran));
    assert_eq!(p.ledger(Some(MAX_DEVICES - 1)).snapshot().releases, 1);
    assert!(p.drain(MAX_DEVICES + 5, Duration::from_secs(1)));
    assert_eq!(ran.load(Ordering::SeqCst), 1);
}

/// `start_threads` answers as if the OS refused every thread (set only in the child below).
pub(super) static REFUSE_THREADS: AtomicBool = AtomicBool::new(false);

/// A release queued while no release thread could be started (the OS refused one: a pids limit)
/// runs once one can, and is counted meanwhile, so an out-of-memory drain sees it. It was
/// forgotten: its memory lost for good and uncounted (the twenty-first audit, helper 104). In a
/// child process: the refusal is process-wide, and this process's threads may have started.
#[test]
#[cfg_attr(miri, ignore)] // a child process
fn a_release_queued_while_no_thread_can_start_runs_once_one_can() {
    const ROLE: &str = "RAFT_CORE_TEST_NO_RELEASE_THREAD";
    const NAME: &str = "release::tests::a_release_queued_while_no_thread_can_start_runs_once_one_can";
    if std::env::var_os(ROLE).is_some() {
        let device = 47;
        REFUSE_THREADS.store(true, Ordering::SeqCst);
        let first = Arc::new(AtomicUsize::new(0));
        let f = first.clone();
        let label = raft_exit::Label { what: "queued without a thread", id: raft_exit::next_id(), device: Some(device) };
        enqueue_holding(
            label,
            Held { streams: 0, handles: 0, bytes: MIB },
            Box::new(move || {
                f.fetch_add(1, Ordering::SeqCst);
            }),
        );
        let counted = pending(device);
        REFUSE_THREADS.store(false, Ordering::SeqCst);
        let second = Arc::new(AtomicUsize::new(0));
        let s = second.clone();
        let label = raft_exit::Label { what: "the next release", id: raft_exit::next_id(), device: Some(device) };
        enqueue(
            label,
            Box::new(move || {
                s.fetch_add(1, Ordering::SeqCst);
            }),
        );
        let give_up = Instant::now() + Duration::from_secs(5);
        while (first.load(Ordering::SeqCst) == 0 || second.load(Ordering::SeqCst) == 0) && Instant::now() < give_up {
            std::thread::sleep(Duration::from_millis(1));
        }
        println!("COUNTED {} {} RAN {} {}", counted.releases, counted.bytes, first.load(Ordering::SeqCst), second.load(Ordering::SeqCst));
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", NAME, "--nocapture", "--test-threads=1"])
        .env(ROLE, "1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains(&format!("COUNTED 1 {MIB} RAN 1 1")), "the release queued while no thread could start: {text}");
}

/// Runs this test binary's test `name` in a child process with `role` set, and gives its
/// stdout and whether it succeeded; `None` when it ran past `limit` (it was killed: a deadlock).
fn child_within(name: &str, role: &str, envs: &[(&str, &str)], limit: Duration) -> Option<(bool, String)> {
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(role, "1")
        // Only the settings the test gives: a bad one from the caller's environment would add
        // its own warning (the review, helper 107).
        .env_remove("RAFT_RELEASE_THREADS")
        .env_remove("RAFT_RELEASE_THREADS_MAX")
        .env_remove("RAFT_RELEASE_PENDING_MAX")
        .env_remove("RAFT_RELEASE_PENDING_MIB")
        .envs(envs.iter().copied())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let give_up = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() >= give_up {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output().unwrap();
    Some((out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)))
}

/// A logger that asks the release pool what is pending (`raft::pending_releases`, as a logger
/// adding the library's figures to each line might), once: it must not re-enter anything the
/// line was logged under.
struct AsksPending;

static ASKED: AtomicUsize = AtomicUsize::new(0);

impl log::Log for AsksPending {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, _: &log::Record<'_>) {
        if ASKED.fetch_add(1, Ordering::SeqCst) == 0 {
            let _ = pending(0); // what `raft::pending_releases` reads
        }
    }

    fn flush(&self) {}
}

/// A bad `RAFT_RELEASE_*` value is warned about: the warning was logged inside the pool's
/// `OnceLock`, so a logger that asks for the pending releases (or `stats()`) re-entered its
/// initialisation on the same thread, which deadlocks (the twenty-second audit). In a child
/// process: the pool and the logger are process-wide; bounded, so the deadlock fails the test.
#[test]
#[cfg_attr(miri, ignore)] // a child process
fn a_logger_asking_for_pending_releases_while_a_bad_setting_is_warned_about_does_not_deadlock() {
    const ROLE: &str = "RAFT_CORE_TEST_LOGGER_ASKS_PENDING";
    const NAME: &str = "release::tests::a_logger_asking_for_pending_releases_while_a_bad_setting_is_warned_about_does_not_deadlock";
    if std::env::var_os(ROLE).is_some() {
        log::set_logger(&AsksPending).expect("the first logger");
        log::set_max_level(log::LevelFilter::Trace);
        let pending = pending(0);
        println!("PENDING {} ASKED {}", pending.releases, ASKED.load(Ordering::SeqCst));
        return;
    }
    let got = child_within(NAME, ROLE, &[("RAFT_RELEASE_THREADS", "many")], Duration::from_secs(20));
    let Some((ok, text)) = got else { panic!("the child was still running after 20 s: deadlocked") };
    assert!(ok, "{text}");
    assert!(text.contains("PENDING 0 ASKED 1"), "the warning reached the logger once, which asked once: {text}");
}

/// A logger whose every line panics.
struct Panics;

impl log::Log for Panics {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, _: &log::Record<'_>) {
        panic!("the user's logger panicked");
    }

    fn flush(&self) {}
}

/// A release queued while no release thread can start logs a warning: that line ran unguarded,
/// so a user's logger that panics unwound out of `enqueue`, that is out of the drop that queued
/// it (an array's, a memory resource's), and out of `create_held` after its block was allocated,
/// leaving the block to nobody (helper 115). The release is queued and counted either way. In a
/// child process: the refusal and the logger are process-wide.
#[test]
#[cfg_attr(miri, ignore)] // a child process
fn a_panicking_logger_does_not_unwind_out_of_a_release_queued_without_a_thread() {
    const ROLE: &str = "RAFT_CORE_TEST_NO_THREAD_PANICKING_LOGGER";
    const NAME: &str = "release::tests::a_panicking_logger_does_not_unwind_out_of_a_release_queued_without_a_thread";
    if std::env::var_os(ROLE).is_some() {
        log::set_logger(&Panics).expect("the first logger");
        log::set_max_level(log::LevelFilter::Warn);
        let device = 46;
        REFUSE_THREADS.store(true, Ordering::SeqCst);
        let label = raft_exit::Label { what: "queued without a thread", id: raft_exit::next_id(), device: Some(device) };
        let unwound = std::panic::catch_unwind(|| {
            enqueue_holding(label, Held { streams: 0, handles: 0, bytes: MIB }, Box::new(|| {}));
        })
        .is_err();
        println!("UNWOUND {unwound} COUNTED {}", pending(device).releases);
        return;
    }
    let Some((ok, text)) = child_within(NAME, ROLE, &[], Duration::from_secs(20)) else { panic!("the child was still running after 20 s") };
    assert!(ok, "{text}");
    assert!(text.contains("UNWOUND false COUNTED 1"), "a panicking logger while no release thread can start: {text}");
}
