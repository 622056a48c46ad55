//! The registry of what is in flight: jobs (each with the exit wait read when it was made) and
//! releases running on the library threads. Registering is a short uncontended lock around a
//! slab insert, never a lock held across the job.
//!
//! The exit hook's decision (tear down or skip) is made here, under the same lock as every
//! registration, so that a job is either registered before the decision (and waited for) or
//! refused after it ([`Registry::try_add_job`]); never registered and then ignored.
use crate::phase::{ExitDecided, Phase, PhaseCell, PHASE};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// What a job or release is, for the exit log: `job 12 on device 0`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Label {
    /// `"job"`, `"release"`, …
    pub what: &'static str,
    /// A number unique among its kind.
    pub id: u64,
    /// The GPU it works on, when it has one.
    pub device: Option<usize>,
}

impl std::fmt::Display for Label {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.what, self.id)?;
        if let Some(d) = self.device {
            write!(f, " on device {d}")?;
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    label: Label,
    /// The exit wait in seconds (`+inf` allowed); 0 for releases, whose bound is the fixed grace.
    bound: f64,
}

/// A slab of entries: O(1) insert and remove, stable slots.
#[derive(Default)]
struct Slab {
    slots: Vec<Option<Entry>>,
    free: Vec<usize>,
    len: usize,
}

impl Slab {
    fn insert(&mut self, e: Entry) -> usize {
        self.len += 1;
        match self.free.pop() {
            Some(i) => {
                self.slots[i] = Some(e);
                i
            }
            None => {
                self.slots.push(Some(e));
                self.slots.len() - 1
            }
        }
    }
    fn remove(&mut self, i: usize) {
        if self.slots.get_mut(i).and_then(Option::take).is_some() {
            self.len -= 1;
            self.free.push(i);
        }
    }
    fn iter(&self) -> impl Iterator<Item = &Entry> {
        self.slots.iter().flatten()
    }
}

#[derive(Default)]
struct State {
    jobs: Slab,
    releases: Slab,
    last_job_end: Option<Instant>,
}

/// The longest the exit wait sleeps between two looks at the registry.
const POLL: Duration = Duration::from_millis(100);

/// The process's registry, read by the exit hook.
pub(crate) static REGISTRY: Registry = Registry::new(&PHASE);

pub(crate) struct Registry {
    /// The exit phase this registry decides and reads: the process's own, except in tests.
    phase: &'static PhaseCell,
    state: Mutex<State>,
    changed: Condvar,
    jobs: AtomicUsize,
    releases: AtomicUsize,
}

/// How the exit wait ended.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// Nothing runs any more.
    Drained { waited: Duration },
    /// Something still runs past its bound: the labels of what still runs.
    TimedOut { waited: Duration, jobs: Vec<Label>, releases: Vec<Label> },
}

impl Registry {
    pub(crate) const fn new(phase: &'static PhaseCell) -> Self {
        Registry {
            phase,
            state: Mutex::new(State {
                jobs: Slab { slots: Vec::new(), free: Vec::new(), len: 0 },
                releases: Slab { slots: Vec::new(), free: Vec::new(), len: 0 },
                last_job_end: None,
            }),
            changed: Condvar::new(),
            jobs: AtomicUsize::new(0),
            releases: AtomicUsize::new(0),
        }
    }

    /// Never poisoned for our purposes: no code panics while holding the lock, and the exit
    /// hook must read it whatever happened.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds a job whatever the phase: once the exit has decided it is not waited for.
    pub(crate) fn add_job(&self, label: Label, bound: f64) -> usize {
        let slot = self.lock().jobs.insert(Entry { label, bound });
        self.jobs.fetch_add(1, Ordering::Relaxed);
        slot
    }

    /// Adds a job unless the exit has decided. The phase is read under the lock the exit hook
    /// decides under: a job accepted here is seen by the hook's wait.
    pub(crate) fn try_add_job(&self, label: Label, bound: f64) -> Result<usize, ExitDecided> {
        let slot = {
            let mut st = self.lock();
            let phase = self.phase.get();
            if phase.decided() {
                return Err(ExitDecided::new(phase));
            }
            st.jobs.insert(Entry { label, bound })
        };
        self.jobs.fetch_add(1, Ordering::Relaxed);
        Ok(slot)
    }

    /// Ends a job. Whether to wake the exit hook is decided under the lock: the hook sets its
    /// phase before it takes the lock, so an end that races with the exit is never missed.
    pub(crate) fn end_job(&self, slot: usize) {
        let notify = {
            let mut st = self.lock();
            st.jobs.remove(slot);
            let notify = self.phase.get() != Phase::Running;
            if notify {
                st.last_job_end = Some(Instant::now());
            }
            notify
        };
        self.jobs.fetch_sub(1, Ordering::Relaxed);
        if notify {
            self.changed.notify_all();
        }
    }

    /// Registers a release unless the exit has decided (under the lock, as jobs): one queued
    /// after that could still be in a CUDA call when the static destructors run.
    pub(crate) fn try_add_release(&self, label: Label) -> Result<usize, ExitDecided> {
        let slot = {
            let mut st = self.lock();
            let phase = self.phase.get();
            if phase.decided() {
                return Err(ExitDecided::new(phase));
            }
            st.releases.insert(Entry { label, bound: 0.0 })
        };
        self.releases.fetch_add(1, Ordering::Relaxed);
        Ok(slot)
    }

    pub(crate) fn add_release(&self, label: Label) -> usize {
        let slot = self.lock().releases.insert(Entry { label, bound: 0.0 });
        self.releases.fetch_add(1, Ordering::Relaxed);
        slot
    }

    pub(crate) fn end_release(&self, slot: usize) {
        let notify = {
            let mut st = self.lock();
            st.releases.remove(slot);
            self.phase.get() != Phase::Running
        };
        self.releases.fetch_sub(1, Ordering::Relaxed);
        if notify {
            self.changed.notify_all();
        }
    }

    pub(crate) fn jobs_in_flight(&self) -> usize {
        self.jobs.load(Ordering::Relaxed)
    }

    pub(crate) fn releases_in_flight(&self) -> usize {
        self.releases.load(Ordering::Relaxed)
    }

    /// The labels of the jobs in flight now.
    pub(crate) fn jobs_now(&self) -> Vec<Label> {
        self.lock().jobs.iter().map(|e| e.label).collect()
    }

    /// The exit called from a job or release thread: decides at once (teardown skipped),
    /// returning what runs now, the exiting thread's own job or release among them.
    pub(crate) fn skip_now(&self) -> (Vec<Label>, usize) {
        let st = self.lock();
        self.phase.set(Phase::Skipped);
        (st.jobs.iter().map(|e| e.label).collect(), st.releases.len)
    }

    /// Waits, from `start`, until nothing runs, or until the jobs in flight are past the
    /// largest of their bounds, or (once no job runs) the releases are past one second after
    /// `start` or the last job's end, whichever is later; then decides, under the lock:
    /// `TearingDown` when drained, else `Skipped`.
    pub(crate) fn wait_and_decide(&self, start: Instant, release_grace: Duration) -> Outcome {
        let mut st = self.lock();
        loop {
            let now = Instant::now();
            if st.jobs.len == 0 && st.releases.len == 0 {
                self.phase.set(Phase::TearingDown);
                return Outcome::Drained { waited: now - start };
            }
            let deadline = if st.jobs.len > 0 {
                let bound = st.jobs.iter().map(|e| e.bound).fold(0.0_f64, f64::max);
                // `+inf`, or too large for an Instant: no deadline.
                Duration::try_from_secs_f64(bound).ok().and_then(|d| start.checked_add(d))
            } else {
                let base = st.last_job_end.map_or(start, |end| end.max(start));
                Some(base + release_grace)
            };
            match deadline {
                Some(deadline) if now >= deadline => {
                    self.phase.set(Phase::Skipped);
                    return Outcome::TimedOut {
                        waited: now - start,
                        jobs: st.jobs.iter().map(|e| e.label).collect(),
                        releases: st.releases.iter().map(|e| e.label).collect(),
                    };
                }
                // Ends wake the wait at once; the slice only bounds the cost of a wake-up that
                // could not be sent (an end on a thread whose phase read was stale).
                Some(deadline) => st = self.changed.wait_timeout(st, (deadline - now).min(POLL)).unwrap_or_else(|e| e.into_inner()).0,
                None => st = self.changed.wait_timeout(st, POLL).unwrap_or_else(|e| e.into_inner()).0,
            }
        }
    }

    /// After a panic inside the exit hook, settles the exit under the lock (so no job slips
    /// in): whether the process must end at once. Only when the teardown ran and nothing runs
    /// but the exiting thread's own job or release (`own`: 1 on a library thread, else 0) may
    /// the exit go on to the C library's handlers and the static destructors. Otherwise the
    /// teardown did not run (or not to its end): it counts as skipped, and the process ends.
    pub(crate) fn settle_after_panic(&self, own: usize) -> bool {
        let st = self.lock();
        let others_run = st.jobs.len + st.releases.len > own;
        let phase = self.phase.get();
        if phase != Phase::TornDown {
            self.phase.set(Phase::Skipped);
            return true;
        }
        others_run
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A registry with a phase of its own: the tests never move the process's exit. The cells
    /// are statics (not leaked boxes), so valgrind's leak check stays meaningful here.
    fn registry() -> Registry {
        static CELLS: [PhaseCell; 32] = [const { PhaseCell::new() }; 32];
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let i = NEXT.fetch_add(1, Ordering::Relaxed);
        Registry::new(CELLS.get(i).expect("more registries than test cells: raise the count"))
    }

    fn label(id: u64) -> Label {
        Label { what: "job", id, device: Some(0) }
    }

    #[test]
    fn slab_reuses_slots_and_counts() {
        let r = registry();
        let a = r.add_job(label(1), 1.0);
        let b = r.add_job(label(2), 1.0);
        assert_eq!(r.jobs_in_flight(), 2);
        r.end_job(a);
        let c = r.add_job(label(3), 1.0);
        assert_eq!(c, a);
        r.end_job(b);
        r.end_job(c);
        assert_eq!(r.jobs_in_flight(), 0);
        assert!(r.jobs_now().is_empty());
    }

    #[test]
    fn drains_at_once_when_nothing_runs() {
        let r = registry();
        assert!(matches!(r.wait_and_decide(Instant::now(), Duration::from_secs(1)), Outcome::Drained { .. }));
    }

    #[test]
    fn times_out_at_the_largest_bound_and_names_the_job() {
        let r = registry();
        r.add_job(label(7), 0.05);
        r.add_job(label(8), 0.15);
        let start = Instant::now();
        match r.wait_and_decide(start, Duration::from_secs(1)) {
            Outcome::TimedOut { waited, jobs, .. } => {
                assert!(waited >= Duration::from_millis(150), "{waited:?}");
                assert!(waited < Duration::from_millis(1000), "{waited:?}");
                assert_eq!(jobs.len(), 2);
                assert_eq!(jobs[1].to_string(), "job 8 on device 0");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_job_ending_in_time_drains_the_wait() {
        let r = std::sync::Arc::new(registry());
        let slot = r.add_job(label(1), 5.0);
        let r2 = r.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            r2.end_job(slot);
        });
        match r.wait_and_decide(Instant::now(), Duration::from_secs(1)) {
            Outcome::Drained { waited } => assert!(waited >= Duration::from_millis(90) && waited < Duration::from_secs(2)),
            other => panic!("{other:?}"),
        }
        t.join().unwrap();
    }

    #[test]
    fn releases_get_one_second_after_the_last_job() {
        let r = registry();
        r.add_release(Label { what: "release", id: 1, device: None });
        let start = Instant::now();
        match r.wait_and_decide(start, Duration::from_millis(200)) {
            Outcome::TimedOut { waited, jobs, releases } => {
                assert!(waited >= Duration::from_millis(200));
                assert!(jobs.is_empty());
                assert_eq!(releases.len(), 1);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_release_is_refused_once_the_exit_has_decided_and_accepted_before() {
        let r = registry();
        let release = Label { what: "release", id: 1, device: Some(0) };
        for phase in [Phase::Running, Phase::Waiting] {
            r.phase.set(phase);
            let slot = r.try_add_release(release).expect("accepted before the decision");
            r.end_release(slot);
        }
        for phase in [Phase::TearingDown, Phase::TornDown, Phase::Skipped] {
            r.phase.set(phase);
            assert_eq!(r.try_add_release(release).unwrap_err().phase(), phase);
        }
        assert_eq!(r.releases_in_flight(), 0);
    }

    #[test]
    fn a_job_is_refused_once_the_exit_has_decided_and_accepted_before() {
        let r = registry();
        r.phase.set(Phase::Waiting);
        let waited_for = r.try_add_job(label(1), 0.1).expect("accepted while the exit waits");
        r.end_job(waited_for);
        assert!(matches!(r.wait_and_decide(Instant::now(), Duration::from_secs(1)), Outcome::Drained { .. }));
        assert_eq!(r.phase.get(), Phase::TearingDown, "decided under the lock");
        for phase in [Phase::TearingDown, Phase::TornDown, Phase::Skipped] {
            r.phase.set(phase);
            let e = r.try_add_job(label(2), 10.0).unwrap_err();
            assert_eq!(e.phase(), phase);
            assert_eq!(e.to_string(), "the process is exiting");
        }
        assert_eq!(r.jobs_in_flight(), 0);
        assert!(r.jobs_now().is_empty());
    }

    #[test]
    fn no_job_slips_in_between_the_drain_and_the_decision() {
        // A thread keeps registering short jobs while the exit waits: every job it got was
        // registered before the decision (so the wait saw it end), and once refused it is
        // refused for good; nothing is left in the registry when the teardown would start.
        let r = std::sync::Arc::new(registry());
        r.phase.set(Phase::Waiting);
        let r2 = r.clone();
        let maker = std::thread::spawn(move || {
            let r = r2;
            let mut made = 0;
            loop {
                match r.try_add_job(label(made), 5.0) {
                    Ok(slot) => {
                        made += 1;
                        std::thread::sleep(Duration::from_micros(200));
                        r.end_job(slot);
                        std::thread::yield_now();
                    }
                    Err(e) => return (made, e),
                }
            }
        });
        std::thread::sleep(Duration::from_millis(20));
        match r.wait_and_decide(Instant::now(), Duration::from_secs(1)) {
            Outcome::Drained { .. } => assert!(r.jobs_now().is_empty()),
            other => panic!("{other:?}"),
        }
        let (made, refused) = maker.join().unwrap();
        assert!(made > 0);
        assert_eq!(refused.phase(), Phase::TearingDown);
        assert!(r.jobs_now().is_empty());
    }

    #[test]
    fn after_a_panic_only_a_finished_teardown_with_nothing_running_lets_the_exit_go_on() {
        let release = Label { what: "release", id: 9, device: None };
        // The teardown ran and nothing runs: the exit goes on.
        let r = registry();
        r.phase.set(Phase::TornDown);
        assert!(!r.settle_after_panic(0));
        assert_eq!(r.phase.get(), Phase::TornDown);
        // ... but not with a release still running (it holds the exit back no longer).
        let slot = r.add_release(release);
        assert!(r.settle_after_panic(0));
        // The exiting library thread's own release does not count.
        assert!(!r.settle_after_panic(1));
        r.end_release(slot);
        // Before the decision, during the teardown or after a skip: skipped, end now.
        for phase in [Phase::Waiting, Phase::TearingDown, Phase::Skipped] {
            let r = registry();
            r.phase.set(phase);
            r.add_job(label(1), 10.0);
            assert!(r.settle_after_panic(0), "{phase:?}");
            assert_eq!(r.phase.get(), Phase::Skipped, "{phase:?}");
            let r = registry();
            r.phase.set(phase);
            assert!(r.settle_after_panic(0), "{phase:?} with nothing running: the teardown did not run");
            assert_eq!(r.phase.get(), Phase::Skipped);
        }
    }

    #[test]
    fn an_exit_from_a_library_thread_decides_at_once() {
        let r = registry();
        r.phase.set(Phase::Waiting);
        let own = r.add_job(label(1), 10.0);
        let (jobs, releases) = r.skip_now();
        assert_eq!((jobs.len(), releases), (1, 0));
        assert_eq!(r.phase.get(), Phase::Skipped);
        assert!(r.try_add_job(label(2), 10.0).is_err());
        r.end_job(own);
    }
}
