//! The rendezvous's one clock: a deadline from a timeout, and what is left of it.
use std::time::{Duration, Instant};

/// `Instant + Duration` that saturates instead of panicking (`Duration::MAX` timeouts).
pub(crate) fn deadline_after(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout).unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 24 * 3600))
}

/// What is left before `deadline`; `None` once it has passed.
pub(super) fn remaining(deadline: Instant) -> Option<Duration> {
    deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero())
}
