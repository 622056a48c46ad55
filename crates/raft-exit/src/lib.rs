//! Exiting while GPU jobs run, made safe and predictable.
//!
//! A CUDA program whose worker threads still run when the process exits tends to crash in the
//! static destructors (`cudaErrorCudartUnloading`, "driver shutting down", a segfault in
//! libcuda) or to hang. This crate knows jobs, releases and the exit, not RAFT:
//!
//! - the **exit wait** ([`current_exit_wait`], [`with_exit_wait`], `RAFT_EXIT_WAIT`): how long
//!   the exit may wait for a job, read when the job is made, on the calling thread;
//! - the **registry** ([`JobToken`], [`ReleaseToken`]): what is in flight;
//! - the **exit hook**, registered with `atexit` by the first job or release: it waits for the
//!   jobs in flight up to the largest of their bounds, and for releases up to one second after
//!   the exit began or the last job ended, whichever is later; then runs the teardown steps
//!   ([`on_teardown`]) if everything drained, or skips them (leaking native objects to the OS,
//!   never destroying them under a running job), logs a warning on target `raft`, and ends
//!   the process at once with its exit status (`_exit`): the C++ static destructors that would
//!   follow (the CUDA runtime's, RMM's) would otherwise tear CUDA down under the running job.
//!
//! # Thread safety
//! Everything here may be called from any thread, also during the exit.
mod hook;
mod registry;
mod wait;

pub use hook::{exiting, hook_registered, mark_library_thread, native_release_allowed, on_library_thread, on_teardown, phase, Phase};
pub use registry::Label;
pub use wait::{
    current_exit_wait, default_exit_wait, set_default_exit_wait, spawn_thread, validate, with_exit_wait, InvalidExitWait, DEFAULT_EXIT_WAIT,
};

use hook::REGISTRY;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A fresh id for a label.
pub fn next_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

/// A job in flight, from its creation to its end; dropping the token ends it.
#[derive(Debug)]
#[must_use = "the job counts as in flight until the token is dropped"]
pub struct JobToken {
    slot: usize,
}
static_assertions::assert_impl_all!(JobToken: Send, Sync);

impl JobToken {
    /// Registers a job whose exit wait is `bound` seconds (read by the caller, when the job was
    /// made, from [`current_exit_wait`]). Registers the exit hook on first use.
    pub fn register(label: Label, bound: f64) -> JobToken {
        hook::ensure_registered();
        JobToken { slot: REGISTRY.add_job(label, bound) }
    }
}

impl Drop for JobToken {
    fn drop(&mut self) {
        REGISTRY.end_job(self.slot);
    }
}

/// A release in flight on a library thread; dropping the token ends it.
#[derive(Debug)]
#[must_use = "the release counts as in flight until the token is dropped"]
pub struct ReleaseToken {
    slot: usize,
}
static_assertions::assert_impl_all!(ReleaseToken: Send, Sync);

impl ReleaseToken {
    /// Registers a release (queued or running on a library thread). Registers the exit hook on
    /// first use.
    pub fn register(label: Label) -> ReleaseToken {
        hook::ensure_registered();
        ReleaseToken { slot: REGISTRY.add_release(label) }
    }
}

impl Drop for ReleaseToken {
    fn drop(&mut self) {
        REGISTRY.end_release(self.slot);
    }
}

/// Jobs in flight now.
pub fn jobs_in_flight() -> usize {
    REGISTRY.jobs_in_flight()
}

/// Releases in flight now.
pub fn releases_in_flight() -> usize {
    REGISTRY.releases_in_flight()
}
