//! crates/raft-core/src/release/mod.rs: the device ledger (`Ledger::add` / `remove`: pending and
//! finished releases in one word, `counts`), `settle` (ledger, then `waiting` read, then notify
//! under `finished_lock`) and `Pool::drain` (the out-of-memory wait: what is pending and what had
//! finished read in one load, queued releases of the device run here, then wait until `pending`
//! finished, memory freed, nothing outside, or the deadline). Feature `mutant_two_reads` is the
//! code before the twentieth audit (the two read apart, from two counters): its
//! `drain_owed_one_release_while_another_is_queued` must fail.
//! Stubbed: the queue is empty in these scenarios (releases run on threads of their own, as
//! `on_own_thread`), so the `take_for` loop runs nothing; `Instant`/deadline: loom's
//! `wait_timeout` never times out, so a drain that would only end at its deadline (OOM_WAIT, 5 s)
//! shows as a loom deadlock; the caller is not a library thread (`outside` = `releases`).
//! SeqCst store-buffering pairs get a SeqCst fence (see crew.rs: loom treats SeqCst as AcqRel).
use loom::sync::atomic::{AtomicU64, AtomicUsize, Ordering, fence};
use loom::sync::{Condvar, Mutex};

#[inline]
fn sc() {
    fence(Ordering::SeqCst);
}

#[derive(Default)]
pub struct Ledger {
    pub on_workers: AtomicUsize,
    pub bytes: AtomicU64,
    /// The real code's `counts`: pending (low half) and finished (high half) in one word,
    /// changed by one RMW, read in one load.
    pub counts: AtomicU64,
    /// `mutant_two_reads`: the two counters of the code before the twentieth audit.
    pub releases: AtomicUsize,
    pub finished: AtomicU64,
}

impl Ledger {
    pub fn add(&self, bytes: u64) {
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.releases.fetch_add(1, Ordering::SeqCst);
        self.counts.fetch_add(1, Ordering::SeqCst);
    }
    pub fn remove(&self, bytes: u64) {
        self.bytes.fetch_sub(bytes, Ordering::Relaxed);
        self.finished.fetch_add(1, Ordering::SeqCst);
        self.counts.fetch_add((1 << 32) - 1, Ordering::SeqCst);
        self.releases.fetch_sub(1, Ordering::SeqCst);
    }

    /// The releases pending now.
    pub fn pending(&self) -> u64 {
        self.counts.load(Ordering::SeqCst) & 0xffff_ffff
    }
}

pub struct Pool {
    pub ledger: Ledger,
    pub finished_lock: Mutex<()>,
    pub finished: Condvar,
    pub waiting: AtomicUsize,
}

impl Pool {
    pub fn new() -> Pool {
        Pool { ledger: Ledger::default(), finished_lock: Mutex::new(()), finished: Condvar::new(), waiting: AtomicUsize::new(0) }
    }

    /// `on_own_thread`'s accounting before its thread starts.
    pub fn add_own_thread(&self, bytes: u64) {
        self.ledger.add(bytes);
        self.ledger.on_workers.fetch_add(1, Ordering::Relaxed);
    }

    /// `on_own_thread`'s `settle` closure after the release ran.
    pub fn finish_own_thread(&self, bytes: u64) {
        self.ledger.on_workers.fetch_sub(1, Ordering::Relaxed);
        self.settle(bytes);
    }

    pub fn settle(&self, bytes: u64) {
        self.ledger.remove(bytes);
        sc();
        if self.waiting.load(Ordering::SeqCst) > 0 {
            let _g = self.finished_lock.lock().unwrap();
            #[cfg(not(feature = "mutant_drain_no_notify"))]
            self.finished.notify_all();
        }
    }

    /// `Pool::drain` (caller not a library thread). Returns whether anything was pending.
    pub fn drain(&self) -> bool {
        self.drain_with(&|| ())
    }

    /// `drain` with a model-only hook right after `pending` is read (a test opens a gate there,
    /// so that what it queues counts as queued after the call).
    pub fn drain_with(&self, after_pending: &dyn Fn()) -> bool {
        let ledger = &self.ledger;
        #[cfg(feature = "mutant_two_reads")]
        let outside = |l: &Ledger| l.releases.load(Ordering::SeqCst);
        #[cfg(not(feature = "mutant_two_reads"))]
        let outside = |l: &Ledger| l.pending() as usize;
        #[cfg(feature = "mutant_two_reads")]
        let (pending, finished_before) = {
            let pending = outside(ledger);
            after_pending();
            if pending == 0 {
                return false;
            }
            (pending, ledger.finished.load(Ordering::SeqCst))
        };
        #[cfg(not(feature = "mutant_two_reads"))]
        let (pending, finished_before) = {
            let w = ledger.counts.load(Ordering::SeqCst);
            after_pending();
            if w & 0xffff_ffff == 0 {
                return false;
            }
            ((w & 0xffff_ffff) as usize, w >> 32)
        };
        let held_memory = ledger.bytes.load(Ordering::SeqCst) > 0;
        // for _ in 0..pending { take_for(device) }: the queue is empty here.
        self.waiting.fetch_add(1, Ordering::SeqCst);
        sc();
        let mut g = self.finished_lock.lock().unwrap();
        loop {
            let all_finished = current_finished(ledger).wrapping_sub(finished_before) >= pending as u64;
            let memory_freed = held_memory && ledger.bytes.load(Ordering::SeqCst) == 0;
            if all_finished || memory_freed || outside(ledger) == 0 {
                break;
            }
            g = self.finished.wait_timeout(g, std::time::Duration::from_millis(10)).unwrap().0;
        }
        drop(g);
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        true
    }
}

fn current_finished(l: &Ledger) -> u64 {
    #[cfg(not(feature = "mutant_two_reads"))]
    return l.counts.load(Ordering::SeqCst) >> 32;
    #[cfg(feature = "mutant_two_reads")]
    l.finished.load(Ordering::SeqCst)
}
