//! Loom models of raft-core's hand-written synchronisation (helper 96, the twentieth audit).
//! Each module copies one protocol of `crates/raft-core` with its real orderings and structure;
//! CUDA, logging, the waits registry and timing are stubbed as noted in each module. A change to
//! one of those protocols changes its model too. Run: `scripts/models.sh` (every model, and every
//! mutant feature, which must make its model fail).
pub mod crew;
pub mod job;
pub mod release;

/// `loom::model` with the preemption bound from `LOOM_MAX_PREEMPTIONS` (unbounded when unset),
/// printing how many interleavings ran.
pub fn check<F: Fn() + Sync + Send + 'static>(name: &str, f: F) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let n = std::sync::Arc::new(AtomicUsize::new(0));
    let n2 = n.clone();
    let b = loom::model::Builder::new();
    let bound = b.preemption_bound;
    b.check(move || {
        n2.fetch_add(1, Ordering::Relaxed);
        f()
    });
    eprintln!("MODEL {name}: {} interleavings explored (preemption bound {:?}), all passed", n.load(Ordering::Relaxed), bound);
}
