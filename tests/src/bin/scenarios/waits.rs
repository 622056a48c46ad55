//! Audit finding 4b: jobs of two resources waiting for each other through releases and joins.
//! Each scenario prints `RESULT` lines; the parent kills it if it hangs (the deadlock of old).
use raft::{DeviceResources, JobHandle};
use std::sync::{mpsc, Arc, Barrier};
use std::time::{Duration, Instant};

fn two() -> (DeviceResources, DeviceResources) {
    (DeviceResources::new().expect("resources"), DeviceResources::new().expect("resources"))
}

/// A job of `a` releases `b` while a job of `b` releases `a`, both at once.
pub fn jobs_release_each_other() {
    let (a, b) = two();
    let start = Instant::now();
    let barrier = Arc::new(Barrier::new(2));
    let (ja, jb) = {
        let (bar, victim) = (barrier.clone(), b.clone());
        let ja = a.spawn(move || {
            bar.wait();
            victim.release()
        });
        let (bar, victim) = (barrier, a.clone());
        let jb = b.spawn(move || {
            bar.wait();
            victim.release()
        });
        (ja.expect("spawn on a"), jb.expect("spawn on b"))
    };
    let ra = ja.join().expect("job on a ran");
    let rb = jb.join().expect("job on b ran");
    println!("RESULT release_a={} release_b={}", ra.is_ok(), rb.is_ok());
    // A release handed to the worker is finished by it: a later release waits for that.
    a.release().expect("second release of a");
    b.release().expect("second release of b");
    println!("RESULT released_a={} released_b={} ms={}", a.is_released(), b.is_released(), start.elapsed().as_millis());
}

fn describe<T: std::fmt::Debug>(r: raft::Result<T>) -> String {
    match r {
        Ok(v) => format!("ok:{v:?}"),
        Err(e) => format!("{:?}:{e}", e.kind()),
    }
}

/// A job of `a` joins a job of `b` which joins that very job of `a`: whichever joins second is
/// refused (`Logic`), so its job ends and the first join returns.
pub fn jobs_join_each_other() {
    let (a, b) = two();
    let (out_tx, out_rx) = mpsc::channel::<String>();
    let (to_a, for_a) = mpsc::channel::<JobHandle<()>>();
    let (to_b, for_b) = mpsc::channel::<JobHandle<()>>();
    let out = out_tx.clone();
    let ja = a
        .spawn(move || {
            let other = for_a.recv().expect("b's job");
            out.send(format!("a={}", describe(other.join()))).expect("send");
        })
        .expect("spawn on a");
    let jb = b
        .spawn(move || {
            let other = for_b.recv().expect("a's job");
            out_tx.send(format!("b={}", describe(other.join()))).expect("send");
        })
        .expect("spawn on b");
    to_a.send(jb).expect("send");
    to_b.send(ja).expect("send");
    report_two(&out_rx);
}

/// A job of `a` releases `b` while a job of `b` joins a job of `a`.
pub fn release_and_join_cross() {
    let (a, b) = two();
    let (out_tx, out_rx) = mpsc::channel::<String>();
    let (to_b, for_b) = mpsc::channel::<JobHandle<()>>();
    let barrier = Arc::new(Barrier::new(2));
    let (bar, victim, out) = (barrier.clone(), b.clone(), out_tx.clone());
    let ja = a
        .spawn(move || {
            bar.wait();
            out.send(format!("a={}", describe(victim.release()))).expect("send");
        })
        .expect("spawn on a");
    let _jb = b
        .spawn(move || {
            let other = for_b.recv().expect("a's job");
            barrier.wait();
            out_tx.send(format!("b={}", describe(other.join()))).expect("send");
        })
        .expect("spawn on b");
    to_b.send(ja).expect("send");
    report_two(&out_rx);
    b.release().expect("b's release ends");
    println!("RESULT b_released={}", b.is_released());
}

fn report_two(out_rx: &mpsc::Receiver<String>) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let left = deadline.saturating_duration_since(Instant::now());
        match out_rx.recv_timeout(left) {
            Ok(s) => seen.push(s.replace(' ', "_")),
            Err(_) => {
                println!("RESULT outcome=timeout seen={}", seen.join(","));
                return;
            }
        }
    }
    seen.sort();
    println!("RESULT outcome=done");
    for s in seen {
        println!("RESULT {s}");
    }
}

/// The sixteenth session's audit, 1a: a job releasing its own resources while the thread that
/// spawned it holds a lend of them and joins it. The release waited for the lend's read lock,
/// the lend for the join, the join for the job: for ever. Now the release sees a thread waiting
/// for it and leaves its rest to a thread of its own, which finishes once the lend ends.
pub fn job_releases_while_a_lend_joins_it() {
    let r = DeviceResources::new().expect("resources");
    let start = Instant::now();
    let victim = r.clone();
    let joined = r.with_raft_resources(|_| r.spawn(move || victim.release()).expect("spawn").join());
    let joined = match joined {
        Ok(Ok(release)) => describe(release),
        Ok(Err(e)) => format!("join {:?}:{e}", e.kind()),
        Err(e) => format!("lend {:?}:{e}", e.kind()),
    };
    println!("RESULT joined={joined}");
    // The rest of the release runs on its own thread once the lend ended: a second release
    // returns once it has finished.
    let second = r.release();
    println!("RESULT second={} released={} ms={}", describe(second), r.is_released(), start.elapsed().as_millis());
    println!("RESULT sync={}", describe(r.sync()));
}

/// The audit's 1b: a release waiting for a lend on another thread held back, as std's `RwLock`
/// holds new readers behind a waiting writer, a use the lend itself waited for (a helper
/// thread's `sync`): for ever. Now the release polls (no waiting writer) and refuses new uses.
pub fn use_inside_a_lend_behind_a_release() {
    let r = DeviceResources::new().expect("resources");
    let start = Instant::now();
    let (used, release) = r
        .with_raft_resources(|_| {
            let releaser = r.clone();
            let release = std::thread::spawn(move || releaser.release());
            // The release is now waiting for this lend.
            std::thread::sleep(Duration::from_millis(300));
            let helper = r.clone();
            let used = std::thread::spawn(move || helper.sync()).join().expect("helper thread");
            (used, release)
        })
        .expect("lend");
    let release = release.join().expect("release thread");
    println!(
        "RESULT used={} release={} released={} ms={}",
        describe(used),
        describe(release),
        r.is_released(),
        start.elapsed().as_millis()
    );
}

/// The audit's 2 and 3: main returns while one thread holds a lend that does not end and
/// another waits in `release()` for it. The exit teardown waited for that release for ever;
/// now it waits a bounded time, and since something still runs inside the lend, the process
/// ends with its status without the C++ static destructors.
pub fn release_behind_a_lend_at_exit() {
    let r = DeviceResources::new().expect("resources");
    // A job registers the exit hook, as any program with jobs has it.
    r.spawn(|| ()).expect("spawn").join().expect("job");
    let lender = r.clone();
    let (lent_tx, lent_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = lender.with_raft_resources(|_| {
            lent_tx.send(()).expect("send");
            std::thread::sleep(Duration::from_secs(120));
        });
    });
    lent_rx.recv().expect("the lend began");
    let releaser = r.clone();
    std::thread::spawn(move || {
        let _ = releaser.release();
    });
    std::thread::sleep(Duration::from_millis(300));
}

/// The review of the seventh audit's fixes, 1: a release that left its rest to a thread of its
/// own must not leave a second release waiting for the thread that handed off, which may go on
/// to join what that second release runs on (the join was refused as a circle).
pub fn release_handed_off_then_join() {
    let (r, other) = two();
    let lender = r.clone();
    let (lent_tx, lent_rx) = mpsc::channel();
    let lend = std::thread::spawn(move || {
        lender.with_raft_resources(|_| {
            lent_tx.send(()).expect("send");
            std::thread::sleep(Duration::from_millis(300));
        })
    });
    lent_rx.recv().expect("the lend began");
    let victim = r.clone();
    let job = other
        .spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            victim.release()
        })
        .expect("spawn");
    let first = r.release();
    let joined = job.join();
    lend.join().expect("lend thread").expect("lend");
    let again = r.release();
    println!(
        "RESULT first={} joined={} again={} released={}",
        describe(first),
        match joined {
            Ok(second) => describe(second),
            Err(e) => format!("join {:?}:{e}", e.kind()),
        },
        describe(again),
        r.is_released()
    );
}

/// The review's 2: a lend of `r` joins a job that releases `r` a second time while a first
/// release (on the main thread) waits for that lend: the second release returns rather than
/// wait for the first, the join returns, the lend ends, and so does the first release.
pub fn second_release_inside_a_lend_join() {
    let (r, other) = two();
    let lender = r.clone();
    let (lent_tx, lent_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let job_on = other.clone();
    let lend = std::thread::spawn(move || {
        lender
            .with_raft_resources(|_| {
                lent_tx.send(()).expect("send");
                go_rx.recv().expect("the first release began");
                std::thread::sleep(Duration::from_millis(100));
                let victim = lender.clone();
                job_on.spawn(move || victim.release()).expect("spawn").join()
            })
            .expect("lend")
    });
    lent_rx.recv().expect("the lend began");
    let start = Instant::now();
    let first = std::thread::spawn({
        let r = r.clone();
        move || r.release()
    });
    std::thread::sleep(Duration::from_millis(50));
    go_tx.send(()).expect("send");
    let second = lend.join().expect("lend thread");
    let first = first.join().expect("first release thread");
    println!(
        "RESULT second={} first={} released={} ms={}",
        match second {
            Ok(r) => describe(r),
            Err(e) => format!("join {:?}:{e}", e.kind()),
        },
        describe(first),
        r.is_released(),
        start.elapsed().as_millis()
    );
}

/// The eighth round's cross: each of two threads, inside a lend of one resources object, waits
/// for the uses of the other, which the other thread holds. `mode` says what each waits with:
/// `release` (both release), `mut` (both take an exclusive lend), `mixed` (the first releases,
/// the second takes an exclusive lend). Both polled for ever before; now the one whose poll
/// closes the circle hands its release to a thread of its own (returns `Ok`) or has its
/// exclusive lend refused (`Logic`), and everything ends.
pub fn uses_cross_inside_lends(mode: &str) {
    let (r1, r2) = two();
    let start = Instant::now();
    let barrier = Arc::new(Barrier::new(2));
    let wait_with = |first: bool| match (mode, first) {
        ("release", _) | ("mixed", true) => "release",
        ("mut", _) | ("mixed", false) => "mut",
        (other, _) => panic!("unknown mode {other:?}"),
    };
    let thread = |held: DeviceResources, other: DeviceResources, how: &'static str, bar: Arc<Barrier>| {
        std::thread::spawn(move || {
            held.with_raft_resources(|_| {
                bar.wait();
                match how {
                    "release" => describe(other.release()),
                    _ => describe(other.with_raft_resources_mut(|_| ())),
                }
            })
            .expect("lend")
        })
    };
    let a = thread(r2.clone(), r1.clone(), wait_with(true), barrier.clone());
    let b = thread(r1.clone(), r2.clone(), wait_with(false), barrier);
    let (ra, rb) = (a.join().expect("thread a"), b.join().expect("thread b"));
    // A release handed to a thread of its own: a later release waits for it.
    let (again1, again2) = (describe(r1.release()), describe(r2.release()));
    println!(
        "RESULT a={ra} b={rb} again1={again1} again2={again2} released1={} released2={} ms={}",
        r1.is_released(),
        r2.is_released(),
        start.elapsed().as_millis()
    );
}

/// The eighth audit: RAFT's and cuVS's allocations hold a reference into RMM's map entry, which
/// replacing the current resource rewrites in place. Replacing it is refused while resources
/// lent to RAFT are alive on the device, and allowed again once they are released.
pub fn set_current_beside_a_lend() {
    let r = DeviceResources::new().expect("resources");
    let cuda = raft::MemoryResource::cuda(0).expect("cuda resource");
    let first = raft::memory::set_current(0, &cuda).expect("set_current before any lend");
    r.with_raft_resources(|_| ()).expect("lend");
    let refused = describe(raft::memory::set_current(0, &first));
    let reinit = describe(raft::memory::reinitialize(0, &raft::RmmOptions::default()));
    let unlent = DeviceResources::new().expect("resources");
    r.release().expect("release");
    let again = describe(raft::memory::set_current(0, &first).map(drop));
    drop(unlent);
    println!("RESULT refused={refused} reinit={reinit} again={again}");
}

/// The review of the eighth round, M1: inside a lend of `r`, a join of a job that takes an
/// exclusive lend of `r`. The exclusive lend polled for ever (it never asked whether anything
/// waited for its thread), and the join with it. Now it is refused once the join is seen.
pub fn exclusive_lend_in_a_job_joined_inside_a_lend() {
    let (r, other) = two();
    let start = Instant::now();
    let joined = r
        .with_raft_resources(|_| {
            let victim = r.clone();
            other.spawn(move || describe(victim.with_raft_resources_mut(|_| ()))).expect("spawn").join()
        })
        .expect("lend");
    let exclusive = match joined {
        Ok(s) => s,
        Err(e) => format!("join {:?}:{e}", e.kind()),
    };
    println!("RESULT exclusive={exclusive} ms={}", start.elapsed().as_millis());
}

/// The review's M2: thread A, inside an exclusive lend of `x`, releases `y`; thread B, inside a
/// lend of `y`, calls `x.sync()`, which waited in the read lock behind A's write lock, unseen:
/// A polled for B's lend for ever, and B waited for A. Now B's wait is recorded: whichever comes
/// second gives way (A's release is handed off, or B's call is refused), and both end.
pub fn exclusive_lend_releasing_beside_a_plain_use() {
    let (x, y) = two();
    let barrier = Arc::new(Barrier::new(2));
    let a = {
        let (x, y, bar) = (x.clone(), y.clone(), barrier.clone());
        std::thread::spawn(move || {
            x.with_raft_resources_mut(|_| {
                bar.wait();
                std::thread::sleep(Duration::from_millis(50));
                describe(y.release())
            })
            .expect("exclusive lend")
        })
    };
    let b = {
        let (x, y) = (x.clone(), y.clone());
        std::thread::spawn(move || {
            y.with_raft_resources(|_| {
                barrier.wait();
                describe(x.sync())
            })
            .expect("lend")
        })
    };
    let (release, sync) = (a.join().expect("thread a"), b.join().expect("thread b"));
    let again = describe(y.release());
    println!("RESULT release={release} sync={sync} again={again} released={}", y.is_released());
}

/// The fourteenth audit: inside an exclusive lend of `r`, a job of `r` that uses `r` (`sync`, or
/// `release` with `RELEASE=1`) is joined. The job's use waited in the read lock behind the
/// lend's write lock, a wait no record saw, while the lend waited for the job: both for ever
/// (a release blocked the same way sizing its ledger entry). Now the use polls and is refused
/// (`Logic`) once it sees the join; a release is handed on and ends after the lend.
pub fn a_use_in_a_job_joined_inside_an_exclusive_lend() {
    let r = DeviceResources::new().expect("resources");
    if std::env::var("ELSEWHERE").as_deref() == Ok("1") {
        return a_use_in_a_job_joined_beside_an_exclusive_lend(r);
    }
    let release = std::env::var("RELEASE").as_deref() == Ok("1");
    let start = Instant::now();
    let joined = r
        .with_raft_resources_mut(|_| {
            let victim = r.clone();
            let job = r.spawn(move || if release { describe(victim.release()) } else { describe(victim.sync()) }).expect("spawn");
            job.join()
        })
        .expect("the exclusive lend");
    let used = match joined {
        Ok(s) => s,
        Err(e) => format!("join {:?}:{e}", e.kind()),
    };
    println!("RESULT used={used} ms={}", start.elapsed().as_millis());
    println!("RESULT again={}", describe(r.release()));
    println!("RESULT released={}", r.is_released());
}

/// The review of the fix above: an exclusive lend on another thread that waits for nothing here
/// (it sleeps 300 ms), while this thread joins a job of the same resources that uses them. The
/// job's use must wait for the lend's end, not be refused: the refusal asked only whether *some*
/// thread awaited the job's, not the lend's.
fn a_use_in_a_job_joined_beside_an_exclusive_lend(r: DeviceResources) {
    let barrier = Arc::new(Barrier::new(2));
    let lend = {
        let (r, bar) = (r.clone(), barrier.clone());
        std::thread::spawn(move || {
            r.with_raft_resources_mut(|_| {
                bar.wait();
                std::thread::sleep(Duration::from_millis(300));
            })
        })
    };
    barrier.wait();
    std::thread::sleep(Duration::from_millis(20));
    let start = Instant::now();
    let victim = r.clone();
    let used = match r.spawn(move || describe(victim.sync())).expect("spawn").join() {
        Ok(s) => s,
        Err(e) => format!("join {:?}:{e}", e.kind()),
    };
    println!("RESULT used={used} ms={}", start.elapsed().as_millis());
    println!("RESULT lend={}", describe(lend.join().expect("the lend's thread")));
    println!("RESULT again={}", describe(r.release()));
}
