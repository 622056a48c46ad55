//! The staging crew: the host threads of staged copies, which after a copy keep watching for
//! the next one a short while (spinning, then yielding) before they sleep.
//!
//! Why not a plain pool: a pool's sleeping threads wake one by one, 23–70 µs after a copy
//! begins (GPU run 61), while the link sits idle. Copies come in runs (a pipeline's batches,
//! a loop over arrays): a crew still watching starts on the next copy within a microsecond.
//! OpenMP runtimes do the same (`OMP_WAIT_POLICY`, `KMP_BLOCKTIME`, 200 ms by default);
//! here the watch is [`watch_time`], 1 ms unless `RAFT_STAGING_SPIN_US` says otherwise.
//!
//! One copy uses the crew at a time; a copy that finds it busy runs on other threads (see
//! `copy.rs`). The copy's caller never waits for a crew thread to *start*: the work a crew
//! thread joins is shared by whoever takes it, so a thread that joins late (or never) only
//! slows the copy; the caller waits only for threads that did join, to leave.
use crate::error::{Error, Result};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, OnceLock, TryLockError};
use std::time::{Duration, Instant};

/// The most crew threads: as many as the machine runs at once, at most this.
const MAX_THREADS: usize = 16;

fn max_threads() -> usize {
    parallelism().clamp(1, MAX_THREADS)
}

/// How many threads the machine runs at once (`std::thread::available_parallelism`, 1 when
/// unknown), asked once per process: on Linux every call reads the cgroup's CPU quota from the
/// filesystem (15.8 µs on the H200 host, GPU run 77; 25 µs on the build machine), which every
/// staged copy paid until then. A CPU affinity or quota changed after the first staged copy
/// does not change the crew's size or the default thread count.
pub(crate) fn parallelism() -> usize {
    static N: OnceLock<usize> = OnceLock::new();
    *N.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// How long a crew thread keeps watching after its last copy: `RAFT_STAGING_SPIN_US`
/// (microseconds, 0 to 1 000 000; 0 sleeps at once), 1 ms by default. Read once.
///
/// # Errors
/// `Logic`, naming the variable, for a value that does not parse or is out of range.
pub(crate) fn watch_time(who: &'static str) -> Result<Duration> {
    static WATCH: OnceLock<std::result::Result<Duration, String>> = OnceLock::new();
    // Lossily: a value that is not UTF-8 is refused, never taken for unset.
    let read = || std::env::var_os("RAFT_STAGING_SPIN_US").map(|v| v.to_string_lossy().into_owned());
    WATCH.get_or_init(|| parse_watch(read().as_deref())).clone().map_err(|m| Error::logic(who, m))
}

fn parse_watch(v: Option<&str>) -> std::result::Result<Duration, String> {
    parse_micros("RAFT_STAGING_SPIN_US", v, Duration::from_millis(1))
}

/// A watch in microseconds from the environment variable `name` (its value `v`): 0 to
/// 1 000 000, `default` when unset or blank; the error names the variable. The staging crew's
/// and the job workers' watches (`job.rs`) read theirs with it.
pub(crate) fn parse_micros(name: &str, v: Option<&str>, default: Duration) -> std::result::Result<Duration, String> {
    match v.map(str::trim).filter(|t| !t.is_empty()) {
        None => Ok(default),
        Some(t) => match t.parse::<u64>() {
            Ok(us) if us <= 1_000_000 => Ok(Duration::from_micros(us)),
            _ => Err(format!("{name}: expected microseconds from 0 to 1000000, given {t:?}")),
        },
    }
}

/// A job posted to the crew, its lifetime erased (see [`Crew::run`]).
type Job = &'static (dyn Fn() + Sync);

/// Open seats live in the high half of [`Crew::seats`], threads inside the job in the low.
const SEAT: u64 = 1 << 32;
const INSIDE: u64 = SEAT - 1;

pub(crate) struct Crew {
    /// One copy at a time posts to the crew.
    busy: Mutex<()>,
    /// Threads started so far (grown to what copies ask for, at most [`max_threads`]), and
    /// whether the OS refused one (then the crew stays as it is: no retry, one warning).
    started: Mutex<(usize, bool)>,
    /// Bumped when a job is posted: what watching threads look for.
    epoch: AtomicU64,
    /// (seats still open) × `SEAT` + (threads inside the job).
    seats: AtomicU64,
    /// The posted job. Written only by the poster, holding `busy`, while `seats` is 0 (no seat
    /// open, nobody inside); read only by a thread that holds a seat.
    job: UnsafeCell<Option<Job>>,
    /// Threads asleep (or about to be) on `wake`.
    sleepers: AtomicUsize,
    sleep: Mutex<()>,
    wake: Condvar,
    watch: Duration,
}

// SAFETY: `job` is the only field without its own synchronisation. It is written only by the
// thread holding `busy` while `seats` is 0, and read only by a thread that claimed a seat: the
// claim's acquiring compare-exchange sees the poster's release store that opened the seats
// (made after the write), and the poster writes again only after every holder has left (its
// release decrement, acquired by the poster's wait). So no read races a write. The job itself
// is `Sync`, so calling it from several threads at once is allowed.
unsafe impl Sync for Crew {}

/// The crew, made at the first staged copy; `None` when `RAFT_STAGING_SPIN_US` is bad (that
/// error comes from [`watch_time`]). Its threads start as copies ask for them.
pub(crate) fn crew() -> Option<&'static Crew> {
    static CREW: OnceLock<Option<Crew>> = OnceLock::new();
    CREW.get_or_init(|| Some(Crew::new(watch_time("staging").ok()?))).as_ref()
}

impl Crew {
    /// A crew with no thread yet (they start as jobs ask for them).
    fn new(watch: Duration) -> Crew {
        Crew {
            busy: Mutex::new(()),
            started: Mutex::new((0, false)),
            epoch: AtomicU64::new(0),
            seats: AtomicU64::new(0),
            job: UnsafeCell::new(None),
            sleepers: AtomicUsize::new(0),
            sleep: Mutex::new(()),
            wake: Condvar::new(),
            watch,
        }
    }

    /// Runs `work` on crew threads, at most `threads` calls in all (one per seat; a thread may
    /// take two seats of one job), and `main` on the calling thread; returns `main`'s outcome
    /// once every thread that joined has left `work`. `None`, without running anything, while
    /// another copy holds the crew or when no crew thread could be started. `work` must not
    /// panic (the caller catches).
    pub(crate) fn run<R>(&'static self, threads: usize, work: &(dyn Fn() + Sync), main: impl FnOnce() -> R) -> Option<R> {
        let _busy = match self.busy.try_lock() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return None,
        };
        let seats = self.grow(threads.clamp(1, max_threads()));
        if seats == 0 {
            return None;
        }
        // SAFETY: the lifetime is erased only for the crew's reads, which all happen before this
        // call returns: a thread reads `job` only while holding a seat, and `Close` (dropped
        // when this call returns or unwinds) closes the seats and waits until every holder has
        // left before clearing `job`. Writing the cell: we hold `busy`, and `seats` is 0 (the
        // last `Close` left it so), so no thread reads it now (see `unsafe impl Sync`).
        unsafe { *self.job.get() = Some(std::mem::transmute::<&(dyn Fn() + Sync), Job>(work)) };
        self.seats.store(seats as u64 * SEAT, Ordering::Release);
        let _close = Close(self);
        self.epoch.fetch_add(1, Ordering::SeqCst);
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = self.sleep.lock().unwrap_or_else(|e| e.into_inner());
            self.wake.notify_all();
        }
        Some(main())
    }

    /// Starts threads until `want` run (or the OS refuses one: then never again); how many run.
    fn grow(&'static self, want: usize) -> usize {
        let mut guard = self.started.lock().unwrap_or_else(|e| e.into_inner());
        let (started, refused) = &mut *guard;
        // The epoch before the job being posted: a new thread that starts only after the post
        // still joins it.
        let seen = self.epoch.load(Ordering::Acquire);
        while *started < want && !*refused {
            let spawned = std::thread::Builder::new().name(format!("raft-staging-{}", *started)).spawn(move || self.serve(seen));
            match spawned {
                Ok(_) => *started += 1,
                Err(e) => {
                    log::warn!(target: "raft", "a staging thread could not be started, staged copies keep the {started} running: {e}");
                    *refused = true;
                }
            }
        }
        want.min(*started)
    }

    /// A crew thread (`seen`: the epoch before the job it was started for): watch for a job,
    /// take a seat if one is open, work, again.
    fn serve(&self, mut seen: u64) {
        raft_exit::mark_library_thread();
        loop {
            seen = self.wait_for_job(seen);
            self.take_seat();
        }
    }

    /// Returns the epoch once it differs from `seen`: spinning first, then yielding until the
    /// watch time has passed since the call, then asleep.
    fn wait_for_job(&self, seen: u64) -> u64 {
        let since = Instant::now();
        let mut spins = 0u32;
        loop {
            let now = self.epoch.load(Ordering::Acquire);
            if now != seen {
                return now;
            }
            if spins < 256 {
                std::hint::spin_loop();
                spins += 1;
            } else if since.elapsed() < self.watch {
                std::thread::yield_now();
            } else {
                break;
            }
        }
        let mut g = self.sleep.lock().unwrap_or_else(|e| e.into_inner());
        // With the poster's bump-then-read (both SeqCst), either the poster sees this sleeper
        // and notifies (after taking `sleep`, which this thread holds until it waits), or this
        // thread sees the new epoch and does not wait.
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        while self.epoch.load(Ordering::SeqCst) == seen {
            g = self.wake.wait(g).unwrap_or_else(|e| e.into_inner());
        }
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
        self.epoch.load(Ordering::Acquire)
    }

    /// Takes an open seat, if any, and runs the job in it.
    fn take_seat(&self) {
        let mut s = self.seats.load(Ordering::Acquire);
        while s >= SEAT {
            match self.seats.compare_exchange_weak(s, s - SEAT + 1, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    let _leave = Leave(self);
                    // SAFETY: this thread holds a seat: the job was written before the seats
                    // opened (the claim above acquired that store) and stays until every holder
                    // has left (see `unsafe impl Sync`).
                    let job = unsafe { *self.job.get() };
                    if let Some(job) = job {
                        // `work` does not panic (the poster wraps it); were it to, the thread
                        // would still leave its seat (`Leave`) and serve on.
                        super::catch_forgetting(job);
                    }
                    return;
                }
                Err(now) => s = now,
            }
        }
    }
}

/// Leaves a seat (the thread is no longer inside the job).
struct Leave<'c>(&'c Crew);

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        self.0.seats.fetch_sub(1, Ordering::Release);
    }
}

/// Closes a job's seats and waits until every thread inside has left, then clears the job.
struct Close(&'static Crew);

impl Drop for Close {
    fn drop(&mut self) {
        let crew = self.0;
        crew.seats.fetch_and(INSIDE, Ordering::AcqRel);
        let mut spins = 0u32;
        while crew.seats.load(Ordering::Acquire) != 0 {
            if spins < 256 {
                std::hint::spin_loop();
                spins += 1;
            } else {
                std::thread::yield_now();
            }
        }
        // SAFETY: the seats are closed and nobody is inside (the loop above acquired every
        // holder's leave), so no thread reads `job`; we still hold `busy`.
        unsafe { *crew.job.get() = None };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_watch_time_reads_microseconds_and_names_the_variable() {
        assert_eq!(parse_watch(None), Ok(Duration::from_millis(1)));
        assert_eq!(parse_watch(Some(" ")), Ok(Duration::from_millis(1)));
        assert_eq!(parse_watch(Some("0")), Ok(Duration::ZERO));
        assert_eq!(parse_watch(Some("250")), Ok(Duration::from_micros(250)));
        let bad = parse_watch(Some("2ms")).unwrap_err();
        assert!(bad.contains("RAFT_STAGING_SPIN_US") && bad.contains("2ms"), "{bad}");
        assert!(parse_watch(Some("1000001")).is_err());
    }

    #[test]
    fn every_joined_thread_has_left_when_run_returns_and_a_busy_crew_says_so() {
        let crew = crew().expect("threads start on this machine");
        for round in 0..200 {
            let inside = AtomicUsize::new(0);
            let calls = AtomicUsize::new(0);
            let work = || {
                inside.fetch_add(1, Ordering::SeqCst);
                calls.fetch_add(1, Ordering::SeqCst);
                std::thread::yield_now();
                inside.fetch_sub(1, Ordering::SeqCst);
            };
            let main = || {
                // A second copy finds the crew busy.
                assert!(crew.run(2, &|| (), || ()).is_none());
                round
            };
            // Another test's copy may hold the crew a moment: try again until this one runs.
            let ran = loop {
                match crew.run(4, &work, main) {
                    Some(r) => break r,
                    None => std::thread::yield_now(),
                }
            };
            assert_eq!(ran, round);
            // Every thread that joined has left, before run returned.
            assert_eq!(inside.load(Ordering::SeqCst), 0, "a crew thread was still inside the job after run returned");
            assert!(calls.load(Ordering::SeqCst) <= 4, "more threads joined than seats");
        }
    }

    /// Waits until `joined` is non-zero or 5 s have passed.
    fn until_joined(joined: &AtomicUsize) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while joined.load(Ordering::SeqCst) == 0 && Instant::now() < deadline {
            std::thread::yield_now();
        }
    }

    #[test]
    fn threads_started_for_a_job_join_it() {
        // A crew of its own: its threads start for this very job, after it was posted.
        let crew: &'static Crew = Box::leak(Box::new(Crew::new(Duration::from_millis(1))));
        let joined = AtomicUsize::new(0);
        let work = || {
            joined.fetch_add(1, Ordering::SeqCst);
        };
        crew.run(3, &work, || until_joined(&joined)).expect("a new crew is free and its threads start");
        assert!(joined.load(Ordering::SeqCst) >= 1, "no thread started for the job joined it");
    }

    #[test]
    fn a_sleeping_crew_wakes_for_the_next_job() {
        let crew = crew().expect("threads start on this machine");
        // Longer than the watch: the threads have gone to sleep.
        std::thread::sleep(crew.watch + Duration::from_millis(20));
        let joined = AtomicUsize::new(0);
        let work = || {
            joined.fetch_add(1, Ordering::SeqCst);
        };
        // The caller waits until some thread joined (or gives up after 5 s: then the test fails).
        let main = || until_joined(&joined);
        while crew.run(2, &work, main).is_none() {
            std::thread::yield_now(); // another test's copy holds the crew a moment
        }
        assert!(joined.load(Ordering::SeqCst) >= 1, "no sleeping crew thread woke for the job");
    }
}
