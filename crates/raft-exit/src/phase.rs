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
    fn exit_decided_says_the_process_is_exiting() {
        let e = ExitDecided::new(Phase::Skipped);
        assert_eq!(e.to_string(), "the process is exiting");
        assert_eq!(e.phase(), Phase::Skipped);
    }
}
