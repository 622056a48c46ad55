//! Counts of what the library holds now, for soak tests and dashboards.
use crate::handles::HandleKind;
use crate::resources::live_registry;
use std::sync::atomic::Ordering;
use std::sync::Weak;

/// What the library holds now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stats {
    /// Resources objects not yet dropped (released or not).
    pub live_resources: usize,
    /// Of those, not yet released.
    pub unreleased_resources: usize,
    /// cuBLAS / cuSOLVER / cuSPARSE handles RAFT has made on unreleased resources.
    pub live_handles: usize,
    /// Device arrays alive.
    pub live_arrays: usize,
    /// Releases queued or running on the library release thread.
    pub releases_pending: usize,
    /// Jobs queued or running.
    pub jobs_in_flight: usize,
    /// Releases finished on library threads since the process started.
    pub releases_done: u64,
    /// How long the release thread has been on its current release (zero when idle).
    pub release_busy_for: std::time::Duration,
}

/// The counts now (takes the registry lock and asks RAFT about each handle: not for hot paths).
pub fn stats() -> Stats {
    let all: Vec<_> = live_registry().lock().unwrap_or_else(|e| e.into_inner()).values().filter_map(Weak::upgrade).collect();
    let mut s = Stats { live_resources: all.len(), ..Stats::default() };
    for inner in all {
        let r = crate::resources::DeviceResources::from_state(inner);
        if !r.is_released() {
            s.unreleased_resources += 1;
            s.live_handles += HandleKind::ALL.iter().filter(|k| r.has_handle(**k).unwrap_or(false)).count();
        }
    }
    s.live_arrays = crate::array::LIVE_ARRAYS.load(Ordering::Relaxed);
    s.releases_pending = raft_exit::releases_in_flight();
    s.jobs_in_flight = raft_exit::jobs_in_flight();
    s.releases_done = crate::release::releases_done();
    s.release_busy_for = crate::release::release_busy_for();
    s
}
