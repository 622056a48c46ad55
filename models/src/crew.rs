//! crates/raft-core/src/result/crew.rs, whole: `run` (busy try_lock, grow, job written into the
//! cell, seats opened with a release store, `Close` guard, epoch bump, sleepers check and
//! notify), `grow` (threads spawned with the epoch before the post), `serve`, `wait_for_job`
//! (watch, then the sleepers/epoch handshake), `take_seat` (CAS on the packed seats word),
//! `Leave`, `Close` (close seats, spin until nobody is inside, clear the job).
//! Stubbed: the watch (`Instant`) is WATCH rounds of loads with a yield; `max_threads` is a
//! parameter; logging dropped; a `stop` flag (model only) lets crew threads end so loom can
//! finish: checked right after `wait_for_job`, set by `shutdown` before an epoch bump that uses the
//! same sleepers handshake. `job` is a loom `UnsafeCell`, so a read racing a write is reported.
use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering, fence};

/// loom treats SeqCst accesses as AcqRel (loom README, "Limitations"; tokio-rs/loom#180), so
/// the store-buffering handshake (`sleepers` vs `epoch`, both SeqCst in the real code, which
/// the C++/Rust model makes correct) would show false lost wake-ups. A SeqCst fence after each
/// side's first access gives loom that guarantee (it models SC fences exactly). Feature
/// `loom_sc_as_acqrel` leaves the fences out to show the false alarm.
#[inline]
fn sc() {
    #[cfg(not(feature = "loom_sc_as_acqrel"))]
    fence(Ordering::SeqCst);
}
use loom::sync::{Condvar, Mutex};

pub const WATCH: usize = 1;

type Job = &'static (dyn Fn() + Sync);

const SEAT: u64 = 1 << 32;
const INSIDE: u64 = SEAT - 1;

pub struct Crew {
    busy: Mutex<()>,
    started: Mutex<(usize, bool)>,
    epoch: AtomicU64,
    seats: AtomicU64,
    job: UnsafeCell<Option<Job>>,
    sleepers: AtomicUsize,
    sleep: Mutex<()>,
    wake: Condvar,
    pub max_threads: usize,
    stop: AtomicBool,
    pub handles: Mutex<Vec<loom::thread::JoinHandle<()>>>,
}

unsafe impl Sync for Crew {}

impl Crew {
    pub fn new(max_threads: usize) -> Crew {
        Crew {
            busy: Mutex::new(()),
            started: Mutex::new((0, false)),
            epoch: AtomicU64::new(0),
            seats: AtomicU64::new(0),
            job: UnsafeCell::new(None),
            sleepers: AtomicUsize::new(0),
            sleep: Mutex::new(()),
            wake: Condvar::new(),
            max_threads,
            stop: AtomicBool::new(false),
            handles: Mutex::new(Vec::new()),
        }
    }

    pub fn run<R>(&'static self, threads: usize, work: &(dyn Fn() + Sync), main: impl FnOnce() -> R) -> Option<R> {
        let _busy = match self.busy.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        let seats = self.grow(threads.clamp(1, self.max_threads));
        if seats == 0 {
            return None;
        }
        self.job.with_mut(|j| unsafe { *j = Some(std::mem::transmute::<&(dyn Fn() + Sync), Job>(work)) });
        self.seats.store(seats as u64 * SEAT, Ordering::Release);
        let _close = Close(self);
        self.epoch.fetch_add(1, Ordering::SeqCst);
        sc();
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = self.sleep.lock().unwrap();
            self.wake.notify_all();
        }
        Some(main())
    }

    fn grow(&'static self, want: usize) -> usize {
        let mut guard = self.started.lock().unwrap();
        let (started, refused) = &mut *guard;
        let seen = self.epoch.load(Ordering::Acquire);
        while *started < want && !*refused {
            let h = loom::thread::spawn(move || self.serve(seen));
            self.handles.lock().unwrap().push(h);
            *started += 1;
        }
        want.min(*started)
    }

    fn serve(&self, mut seen: u64) {
        loop {
            seen = self.wait_for_job(seen);
            if self.stop.load(Ordering::SeqCst) {
                return; // model only
            }
            self.take_seat();
        }
    }

    fn wait_for_job(&self, seen: u64) -> u64 {
        for _ in 0..WATCH {
            let now = self.epoch.load(Ordering::Acquire);
            if now != seen {
                return now;
            }
            loom::thread::yield_now();
        }
        let mut g = self.sleep.lock().unwrap();
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        sc();
        while self.epoch.load(Ordering::SeqCst) == seen {
            g = self.wake.wait(g).unwrap();
        }
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
        self.epoch.load(Ordering::Acquire)
    }

    fn take_seat(&self) {
        let mut s = self.seats.load(Ordering::Acquire);
        while s >= SEAT {
            match self.seats.compare_exchange_weak(s, s - SEAT + 1, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    let _leave = Leave(self);
                    let job = self.job.with(|j| unsafe { *j });
                    if let Some(job) = job {
                        job();
                    }
                    return;
                }
                Err(now) => s = now,
            }
        }
    }

    /// Model only: ends the crew threads (after the last `run`) and joins them.
    pub fn shutdown(&'static self) {
        self.stop.store(true, Ordering::SeqCst);
        self.epoch.fetch_add(1, Ordering::SeqCst);
        sc();
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = self.sleep.lock().unwrap();
            self.wake.notify_all();
        }
        let hs = std::mem::take(&mut *self.handles.lock().unwrap());
        for h in hs {
            h.join().unwrap();
        }
    }
}

struct Leave<'c>(&'c Crew);

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        self.0.seats.fetch_sub(1, Ordering::Release);
    }
}

struct Close(&'static Crew);

impl Drop for Close {
    fn drop(&mut self) {
        let crew = self.0;
        crew.seats.fetch_and(INSIDE, Ordering::AcqRel);
        #[cfg(not(feature = "mutant_crew_close_no_wait"))]
        while crew.seats.load(Ordering::Acquire) != 0 {
            loom::thread::yield_now();
        }
        crew.job.with_mut(|j| unsafe { *j = None });
    }
}
