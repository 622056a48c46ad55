//! Counts of what the library holds now, for soak tests and dashboards.
use crate::handle_kind::HandleKind;
use crate::release::PendingReleases;
use crate::resources::live_registry;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Device arrays alive: counted where they are made and dropped (`array.rs`), summed here.
///
/// Counted per thread (issue 30): each thread adds to a count only it writes (a plain load and
/// store, no read-modify-write), so allocating threads share no cache line through it (one
/// process-wide atomic was two read-modify-writes per array, contended between threads). An
/// array made on one thread and dropped on another leaves +1 on the first and -1 on the second:
/// the sum is exact. A thread's count joins `RETIRED` when the thread ends.
pub(crate) mod live_arrays {
    use super::*;

    /// One thread's count: written by that thread only, read by [`total`]. A line of its own, so
    /// two threads' counts never share one.
    #[derive(Default)]
    #[repr(align(128))]
    struct Count(AtomicIsize);

    /// The counts of the running threads that made or dropped an array.
    fn counts() -> &'static Mutex<Vec<Arc<Count>>> {
        static COUNTS: Mutex<Vec<Arc<Count>>> = Mutex::new(Vec::new());
        &COUNTS
    }

    /// The counts of threads that ended, and changes made where a thread's count was gone (in
    /// its thread-local destructors).
    static RETIRED: AtomicIsize = AtomicIsize::new(0);

    /// This thread's count, registered at its first use; at the thread's end it moves into
    /// `RETIRED` under the registry's lock, so [`total`] never sees it twice or not at all.
    struct Mine(Arc<Count>);

    impl Mine {
        fn new() -> Mine {
            let count = Arc::new(Count::default());
            counts().lock().unwrap_or_else(|e| e.into_inner()).push(count.clone());
            Mine(count)
        }
    }

    impl Drop for Mine {
        fn drop(&mut self) {
            let mut all = counts().lock().unwrap_or_else(|e| e.into_inner());
            RETIRED.fetch_add(self.0 .0.load(Ordering::Relaxed), Ordering::Relaxed);
            all.retain(|c| !Arc::ptr_eq(c, &self.0));
        }
    }

    thread_local! {
        static MINE: Mine = Mine::new();
    }

    /// Adds `delta` (+1 made, -1 dropped) to the count.
    #[inline]
    pub(crate) fn add(delta: isize) {
        let counted = MINE.try_with(|m| {
            // Only this thread writes its count: a load and a store cannot lose an update.
            let c = &m.0 .0;
            c.store(c.load(Ordering::Relaxed) + delta, Ordering::Relaxed);
        });
        if counted.is_err() {
            // This thread's count is gone (its thread-local destructors are running).
            RETIRED.fetch_add(delta, Ordering::Relaxed);
        }
    }

    /// Arrays alive now. Exact when no array is being made or dropped meanwhile; otherwise the
    /// counts are read one after another and an array moving between threads in between may be
    /// missed or seen twice.
    pub(crate) fn total() -> usize {
        let all = counts().lock().unwrap_or_else(|e| e.into_inner());
        let sum = all.iter().map(|c| c.0.load(Ordering::Relaxed)).sum::<isize>() + RETIRED.load(Ordering::Relaxed);
        sum.max(0) as usize
    }
}

/// What the library holds now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stats {
    /// Resources objects not yet dropped (released or not).
    pub live_resources: usize,
    /// Of those, not yet released.
    pub unreleased_resources: usize,
    /// cuBLAS / cuSOLVER / cuSPARSE handles RAFT has made on unreleased resources.
    pub live_handles: usize,
    /// Device arrays alive (exact while no thread is making or dropping arrays; counted per
    /// thread, so a snapshot taken meanwhile may be off by the arrays in flight).
    pub live_arrays: usize,
    /// Releases queued or running on the library's threads (as the exit machinery counts them).
    pub releases_pending: usize,
    /// What pending releases hold, summed over the devices (see [`pending_releases`] for one
    /// device, and the limits below).
    pub pending: PendingReleases,
    /// The most releases that may be pending on one device before the next `new()` or handle
    /// creation there runs some of them itself (`RAFT_RELEASE_PENDING_MAX`, default 256).
    pub pending_releases_limit: usize,
    /// The most device memory pending releases may hold on one device before the same happens
    /// (`RAFT_RELEASE_PENDING_MIB`, default 2 GiB).
    pub pending_bytes_limit: u64,
    /// Jobs queued or running.
    pub jobs_in_flight: usize,
    /// Releases finished by the library since the process started.
    pub releases_done: u64,
    /// Of those, run by a thread that was making resources, a handle or an allocation on the
    /// same device (backpressure, or recovering from an out-of-memory error).
    pub releases_helped: u64,
    /// Release threads running now (`RAFT_RELEASE_THREADS` always, up to
    /// `RAFT_RELEASE_THREADS_MAX` while the queue is long).
    pub release_threads: usize,
    /// How long the longest-busy release thread has been on its current release (zero when
    /// all are idle).
    pub release_busy_for: Duration,
    /// Time releases spent running, summed over all of them: divided by `releases_done`, the
    /// mean release.
    pub release_time: Duration,
    /// Time queued releases waited for a thread before they ran, summed.
    pub release_wait: Duration,
    /// CUDA async pools this library created (with `cudaMemPoolCreate`) since the process
    /// started.
    pub async_pools_made: u64,
    /// CUDA async pools whose last copy (handle, array, adaptor, RMM map entry) has gone. Such a
    /// pool is never destroyed (the driver crashes or hangs when a pool is destroyed while a free
    /// into it is still queued on a stream that goes on working: GPU runs 42, 45, 46, 48): its
    /// memory goes back to the driver and the next async pool made on its device reuses it.
    pub async_pools_retired: u64,
    /// Retired async pools handed to a new async resource (made + reused = resources made).
    pub async_pools_reused: u64,
}

/// What the releases pending on `device` hold now: lock-free reads, cheap enough to sample
/// often.
pub fn pending_releases(device: usize) -> PendingReleases {
    crate::release::pending(device)
}

/// The counts now (takes the registry lock and asks RAFT about each handle: not for hot paths).
pub fn stats() -> Stats {
    let all = live_registry().lock().unwrap_or_else(|e| e.into_inner()).alive();
    let mut s = Stats { live_resources: all.len(), ..Stats::default() };
    for inner in all {
        let r = crate::resources::DeviceResources::from_state(inner);
        if !r.is_released() {
            s.unreleased_resources += 1;
            s.live_handles += HandleKind::ALL.iter().filter(|k| r.has_handle(**k).unwrap_or(false)).count();
        }
    }
    s.live_arrays = live_arrays::total();
    s.releases_pending = raft_exit::releases_in_flight();
    s.pending = crate::release::pending_total();
    let limits = crate::release::limits();
    (s.pending_releases_limit, s.pending_bytes_limit) = (limits.releases, limits.bytes);
    s.jobs_in_flight = raft_exit::jobs_in_flight();
    s.releases_done = crate::release::releases_done();
    s.releases_helped = crate::release::releases_helped();
    s.release_threads = crate::release::release_threads();
    s.release_busy_for = crate::release::release_busy_for();
    (s.release_time, s.release_wait) = crate::release::release_times();
    (s.async_pools_made, s.async_pools_retired, s.async_pools_reused) = crate::result::mr::async_pools();
    s
}

#[cfg(test)]
mod tests {
    use super::live_arrays;

    /// Counts made on one thread and dropped on others, and threads that end with a non-zero
    /// count, sum exactly (no array of the library is made on the CPU machine: only this test
    /// changes the count there; on a GPU machine other tests may, so the checks hold the
    /// process-wide count still while no other test in this binary allocates).
    #[test]
    fn the_live_count_sums_over_threads_that_made_dropped_and_ended() {
        let before = live_arrays::total() as isize;
        std::thread::scope(|s| {
            s.spawn(|| (0..1000).for_each(|_| live_arrays::add(1))).join().unwrap(); // ended with +1000
            s.spawn(|| (0..400).for_each(|_| live_arrays::add(-1))).join().unwrap();
            // ended with -400
        });
        assert_eq!(live_arrays::total() as isize - before, 600, "the ended threads' counts retired exactly");
        // A running thread's count is seen while it runs, and still after it ends.
        let (made, go) = (std::sync::Barrier::new(2), std::sync::Barrier::new(2));
        std::thread::scope(|s| {
            s.spawn(|| {
                (0..50).for_each(|_| live_arrays::add(1));
                made.wait();
                go.wait();
            });
            made.wait();
            assert_eq!(live_arrays::total() as isize - before, 650, "a running thread's count is summed");
            live_arrays::add(-650); // this thread drops what the others made
            go.wait();
        });
        assert_eq!(live_arrays::total() as isize, before);
    }
}
