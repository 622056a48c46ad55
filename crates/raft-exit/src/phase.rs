//! Where the process is in its exit: one atomic, read by the registry (to wake the exit wait and
//! to refuse jobs once the exit has decided) and by the library (whether a release may still
//! call into CUDA), written by the exit hook. It lives apart from both so that neither the
//! registry nor the hook has to reach into the other.
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

/// Where the process is in its exit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    /// No exit has begun.
    Running = 0,
    /// The exit hook is waiting for jobs and releases.
    Waiting = 1,
    /// Everything drained; the teardown runs.
    TearingDown = 2,
    /// The teardown ran.
    TornDown = 3,
    /// The teardown was skipped: native objects are leaked to the OS.
    Skipped = 4,
}

impl Phase {
    /// Whether the exit hook has decided (tear down or skip): from then on nothing new is
    /// waited for.
    pub(crate) fn decided(self) -> bool {
        matches!(self, Phase::TearingDown | Phase::TornDown | Phase::Skipped)
    }
}

/// A phase that may change under readers: the process's own is [`PHASE`]; tests of the
/// registry make their own, so they never move the process's exit.
pub(crate) struct PhaseCell(AtomicU8);

impl PhaseCell {
    pub(crate) const fn new() -> Self {
        PhaseCell(AtomicU8::new(Phase::Running as u8))
    }

    #[inline]
    pub(crate) fn get(&self) -> Phase {
        match self.0.load(Ordering::Acquire) {
            0 => Phase::Running,
            1 => Phase::Waiting,
            2 => Phase::TearingDown,
            3 => Phase::TornDown,
            _ => Phase::Skipped,
        }
    }

    pub(crate) fn set(&self, p: Phase) {
        self.0.store(p as u8, Ordering::Release);
    }
}

/// The process's exit phase.
pub(crate) static PHASE: PhaseCell = PhaseCell::new();

/// Where the process is in its exit.
#[inline]
pub fn phase() -> Phase {
    PHASE.get()
}

/// Moves the process's exit phase (the exit hook's decisions are made under the registry's lock,
/// through the registry).
pub(crate) fn set_phase(p: Phase) {
    PHASE.set(p);
}

/// Whether a release may still call into CUDA: not once the exit has decided (a release made
/// after that would run under the C++ static destructors), except the teardown's own.
#[inline]
pub fn native_release_allowed() -> bool {
    matches!(phase(), Phase::Running | Phase::Waiting | Phase::TearingDown)
}

/// Whether the exit has begun (the hook is running or has run).
pub fn exiting() -> bool {
    phase() != Phase::Running
}

/// Whether the library is closed to new work for good: the exit's teardown has run or was
/// skipped (`TornDown`, `Skipped`; a fork's child is `Skipped` too). Code that still runs then (a
/// user's exit handler registered before the library's hook runs after it, a thread still
/// running under the exit) must make nothing native: it would meet the C++ static destructors
/// that follow (RMM's per-device map, the CUDA runtime's), or outlive a skipped teardown.
///
/// One relaxed load, read by the gate every shim call passes (raft-core's, raft-comms's and
/// raft-cuvs's `api`, in place of the fork flag they read before: the same cost). Relaxed is
/// enough: the exit's own handlers run on the thread that set the phase, and another thread's
/// call racing the decision is no more refused by an ordered load.
#[inline]
pub fn closed() -> bool {
    PHASE.0.load(Ordering::Relaxed) >= Phase::TornDown as u8
}

/// The error of a call refused because the library is [`closed`]: `Error::forked` (`Cuda`) in a
/// fork's child, else `Error::exiting` (`Logic`, reason `Exiting`).
#[cold]
#[inline(never)]
pub fn refusal(who: impl Into<std::borrow::Cow<'static, str>>) -> raft_error::Error {
    if forked() {
        raft_error::Error::forked(who)
    } else {
        raft_error::Error::exiting(who)
    }
}

/// `e`, or once the library is [`closed`], the exit's [`refusal`] for the same caller: for the
/// refusal of an object the exit's teardown released, which then says why. Only on error paths.
#[cold]
pub fn closed_or(e: raft_error::Error) -> raft_error::Error {
    if closed() {
        refusal(e.who().to_owned())
    } else {
        e
    }
}

/// A job refused because the exit has already decided: it would be neither waited for nor safe
/// from the teardown (see [`JobToken::try_register`](crate::JobToken::try_register)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the process is exiting")]
pub struct ExitDecided {
    phase: Phase,
}

impl ExitDecided {
    pub(crate) fn new(phase: Phase) -> Self {
        ExitDecided { phase }
    }

    /// The phase the exit was in when the job was refused (`TearingDown`, `TornDown` or
    /// `Skipped`).
    pub fn phase(&self) -> Phase {
        self.phase
    }
}

/// Set in the child of a `fork()` made after the library's first CUDA use or the exit
/// hook's registration (the fork's child handler sets it).
static FORKED: AtomicBool = AtomicBool::new(false);

/// Whether this process is the child of a `fork()` of a process that used the library: CUDA,
/// RAFT and the library's threads are not usable here (CUDA allows no use after a fork until an
/// `exec`).
#[inline]
pub fn forked() -> bool {
    FORKED.load(Ordering::Relaxed)
}

/// In a fork's child (async-signal-safe: two atomic stores).
pub(crate) fn mark_forked() {
    FORKED.store(true, Ordering::Relaxed);
    PHASE.set(Phase::Skipped);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cell_reads_back_every_phase_and_knows_which_have_decided() {
        let cell = PhaseCell::new();
        assert_eq!(cell.get(), Phase::Running);
        for p in [Phase::Running, Phase::Waiting, Phase::TearingDown, Phase::TornDown, Phase::Skipped] {
            cell.set(p);
            assert_eq!(cell.get(), p);
            assert_eq!(p.decided(), !matches!(p, Phase::Running | Phase::Waiting), "{p:?}");
        }
    }

    #[test]
    fn only_a_teardown_that_ran_or_was_skipped_closes_the_library() {
        // The ordering `closed` relies on: the phases after the teardown come last.
        for p in [Phase::Running, Phase::Waiting, Phase::TearingDown, Phase::TornDown, Phase::Skipped] {
            let closes = p as u8 >= Phase::TornDown as u8;
            assert_eq!(closes, matches!(p, Phase::TornDown | Phase::Skipped), "{p:?}");
            // The teardown's own releases still reach CUDA; nothing after it does.
            assert_eq!(closes, p.decided() && p != Phase::TearingDown, "{p:?}");
        }
        // This test binary's exit never began.
        assert!(!closed());
        let e = closed_or(raft_error::Error::released("DeviceVec::new", 0));
        assert_eq!(e.reason(), raft_error::Reason::Released, "a process that runs keeps the object's own error");
        let e = refusal("DeviceResources::new");
        assert_eq!((e.kind(), e.reason()), (raft_error::ErrorKind::Logic, raft_error::Reason::Exiting));
        assert_eq!(e.who(), "DeviceResources::new");
    }

    #[test]
    fn exit_decided_says_the_process_is_exiting() {
        let e = ExitDecided::new(Phase::Skipped);
        assert_eq!(e.to_string(), "the process is exiting");
        assert_eq!(e.phase(), Phase::Skipped);
    }
}
