//! The registry of what is in flight: jobs (each with the exit wait read when it was made) and
//! releases running on the library threads. Registering is a short uncontended lock around a
//! slab insert, never a lock held across the job.
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

pub(crate) struct Registry {
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
    pub(crate) const fn new() -> Self {
        Registry {
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

    pub(crate) fn add_job(&self, label: Label, bound: f64) -> usize {
        let slot = self.lock().jobs.insert(Entry { label, bound });
        self.jobs.fetch_add(1, Ordering::Relaxed);
        slot
    }

    /// Ends a job. Whether to wake the exit hook is decided under the lock: the hook sets its
    /// phase before it takes the lock, so an end that races with the exit is never missed.
    pub(crate) fn end_job(&self, slot: usize) {
        let notify = {
            let mut st = self.lock();
            st.jobs.remove(slot);
            let notify = crate::hook::exiting();
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

    pub(crate) fn add_release(&self, label: Label) -> usize {
        let slot = self.lock().releases.insert(Entry { label, bound: 0.0 });
        self.releases.fetch_add(1, Ordering::Relaxed);
        slot
    }

    pub(crate) fn end_release(&self, slot: usize) {
        let notify = {
            let mut st = self.lock();
            st.releases.remove(slot);
            crate::hook::exiting()
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

    /// Waits, from `start`, until nothing runs, or until the jobs in flight are past the
    /// largest of their bounds, or (once no job runs) the releases are past one second after
    /// `start` or the last job's end, whichever is later.
    pub(crate) fn wait_for_drain(&self, start: Instant, release_grace: Duration) -> Outcome {
        let mut st = self.lock();
        loop {
            let now = Instant::now();
            if st.jobs.len == 0 && st.releases.len == 0 {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn label(id: u64) -> Label {
        Label { what: "job", id, device: Some(0) }
    }

    #[test]
    fn slab_reuses_slots_and_counts() {
        let r = Registry::new();
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
        let r = Registry::new();
        assert!(matches!(r.wait_for_drain(Instant::now(), Duration::from_secs(1)), Outcome::Drained { .. }));
    }

    #[test]
    fn times_out_at_the_largest_bound_and_names_the_job() {
        let r = Registry::new();
        r.add_job(label(7), 0.05);
        r.add_job(label(8), 0.15);
        let start = Instant::now();
        match r.wait_for_drain(start, Duration::from_secs(1)) {
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
        let r = std::sync::Arc::new(Registry::new());
        let slot = r.add_job(label(1), 5.0);
        let r2 = r.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            r2.end_job(slot);
        });
        match r.wait_for_drain(Instant::now(), Duration::from_secs(1)) {
            Outcome::Drained { waited } => assert!(waited >= Duration::from_millis(90) && waited < Duration::from_secs(2)),
            other => panic!("{other:?}"),
        }
        t.join().unwrap();
    }

    #[test]
    fn releases_get_one_second_after_the_last_job() {
        let r = Registry::new();
        r.add_release(Label { what: "release", id: 1, device: None });
        let start = Instant::now();
        match r.wait_for_drain(start, Duration::from_millis(200)) {
            Outcome::TimedOut { waited, jobs, releases } => {
                assert!(waited >= Duration::from_millis(200));
                assert!(jobs.is_empty());
                assert_eq!(releases.len(), 1);
            }
            other => panic!("{other:?}"),
        }
    }
}
