//! The thread's record of the resources it is using now (`with_native` in `resources.rs`): a
//! use nested inside another on the same thread takes the outer use's native object instead of
//! the lock again, and a release from inside a use is refused (it would wait for its own thread).
use crate::error::{Error, Result};
use crate::result::NativeResources;
use std::cell::Cell;

thread_local! {
    /// The resources this thread is using now (inside `with_native`: a call, a lend, an
    /// allocation), innermost last, with the native object the outer use holds the read lock
    /// of; the first `HOLDING_DEPTH` entries are live. A release of one of them from this thread
    /// would wait for itself. Plain cells, const-initialised, so no destructor: the record stays
    /// readable while the thread's other thread-locals are destroyed (a use or a release from a
    /// thread-local's `Drop` is still seen; a `Vec` here was gone by then, and such a release
    /// waited for its own thread: the sixteenth session's audit).
    static HOLDING: [Cell<(u64, *const NativeResources)>; HOLDING_MAX] =
        const { [const { Cell::new((0, std::ptr::null())) }; HOLDING_MAX] };
    static HOLDING_DEPTH: Cell<usize> = const { Cell::new(0) };
}

/// How deeply uses of resources may nest on one thread (a use inside a lend inside a job …).
const HOLDING_MAX: usize = 16;

pub(crate) fn holding(id: u64) -> bool {
    held_native(id).is_some()
}

/// The native object of resources this thread is already inside a use of (read-locked further
/// up this thread's stack).
#[inline]
pub(crate) fn held_native(id: u64) -> Option<*const NativeResources> {
    let depth = HOLDING_DEPTH.with(Cell::get);
    HOLDING.with(|h| h[..depth].iter().rev().map(Cell::get).find(|(held, _)| *held == id).map(|(_, n)| n))
}

/// The ids of the resources this thread is inside a use of now (for a poll's record in
/// `waits.rs`; off the fast path: it allocates).
pub(crate) fn held_ids() -> Vec<u64> {
    let depth = HOLDING_DEPTH.with(Cell::get);
    HOLDING.with(|h| h[..depth].iter().map(|c| c.get().0).collect())
}

/// Marks resources in use on this thread for the guard's life.
pub(crate) struct Holding;

impl Holding {
    /// Records the use; refused (`Logic`) past `HOLDING_MAX` nested uses, which could no longer
    /// be told apart from a first use (a release inside them would wait for its own thread).
    #[inline]
    pub(crate) fn enter(who: &'static str, id: u64, native: *const NativeResources) -> Result<Holding> {
        let depth = HOLDING_DEPTH.with(Cell::get);
        if depth == HOLDING_MAX {
            return Err(Error::logic(who, format!("more than {HOLDING_MAX} uses of device resources nested on one thread")));
        }
        HOLDING.with(|h| h[depth].set((id, native)));
        HOLDING_DEPTH.with(|d| d.set(depth + 1));
        Ok(Holding)
    }
}

impl Drop for Holding {
    #[inline]
    fn drop(&mut self) {
        // Guards are dropped in the reverse order of their making (each lives in one frame).
        HOLDING_DEPTH.with(|d| d.set(d.get() - 1));
    }
}
