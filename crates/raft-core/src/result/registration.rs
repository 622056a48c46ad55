//! A caller's slice page-locked in place (`cuMemHostRegister`), for `RegisteredSlice`.
//!
//! The driver page-locks whole pages. Registering a slice as given would page-lock the bytes
//! before and after it on its first and last page: memory that safe code still reaches as plain
//! slices, which cudarc's safe copies take for pageable memory and do not wait for (a copy from
//! or into page-locked memory returns before it has run). So only the whole pages inside the
//! slice are registered; the ragged ends stay pageable and are copied as pageable memory
//! (`HostRef::locked` says which bytes are page-locked).
use super::copy::{HostMut, HostRef};
use super::{bind, ContextGuard, DeviceScalar};
use crate::error::{Error, Result};
use cudarc::driver::{sys as cusys, CudaContext};
use std::ffi::c_void;
use std::sync::Arc;

/// The host's page size (4 KiB where it cannot be asked).
fn page_size() -> usize {
    // SAFETY: sysconf reads a constant of the system.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(page).ok().filter(|p| p.is_power_of_two()).unwrap_or(4096)
}

/// The byte range, relative to `addr`, of the whole pages inside `addr..addr + bytes` (empty
/// when the range holds no whole page).
pub(crate) fn whole_pages(addr: usize, bytes: usize, page: usize) -> std::ops::Range<usize> {
    let start = addr.next_multiple_of(page) - addr;
    let end = (addr + bytes) / page * page;
    if end <= addr + start {
        return 0..0;
    }
    start..end - addr
}

/// A caller's slice whose whole pages are page-locked with `cuMemHostRegister` (portable: every
/// context sees them page-locked) for as long as this lives; the slice is reached only through
/// it meanwhile.
pub(crate) struct NativeRegistration<'a, T: DeviceScalar> {
    slice: &'a mut [T],
    /// The page-locked bytes of the slice, relative to its start (empty: none).
    locked: std::ops::Range<usize>,
    /// The context that registered the range; `None` once unregistered (or never registered).
    ctx: Option<Arc<CudaContext>>,
}

impl<'a, T: DeviceScalar> NativeRegistration<'a, T> {
    pub(crate) fn register(who: &'static str, ctx: &Arc<CudaContext>, slice: &'a mut [T]) -> Result<Self> {
        let locked = whole_pages(slice.as_ptr() as usize, std::mem::size_of_val(slice), page_size());
        if locked.is_empty() {
            return Ok(NativeRegistration { slice, locked, ctx: None });
        }
        if !raft_exit::native_release_allowed() {
            return Err(Error::logic(who, "the process is exiting: no slice is page-locked any more"));
        }
        let _keep = ContextGuard::save(who)?;
        bind(who, ctx)?;
        let start = (slice.as_mut_ptr() as *mut u8).wrapping_add(locked.start) as *mut c_void;
        // SAFETY: the range is whole pages inside the exclusively borrowed `slice` (`whole_pages`),
        // alive and unmoved for 'a; no byte outside the slice shares them. It is unregistered
        // before the borrow ends (`unregister`, Drop, or the process aborts), or, forgotten (the
        // `unsafe` `RegisteredSlice::new`), stays registered memory that the process owns.
        // Relaxed: the driver may refuse it while another thread captures a stream in global mode.
        let registered = super::relaxed(|| unsafe { cusys::cuMemHostRegister_v2(start, locked.len(), cusys::CU_MEMHOSTREGISTER_PORTABLE) });
        match registered.result() {
            Ok(()) => Ok(NativeRegistration { slice, locked, ctx: Some(ctx.clone()) }),
            Err(e) if e.0 == cusys::CUresult::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED => Err(Error::logic(
                who,
                "the slice is already page-locked (part of a PinnedVec, or registered elsewhere): CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
            )),
            Err(e) => Err(Error::driver(who, e)),
        }
    }

    pub(crate) fn as_slice(&self) -> &[T] {
        self.slice
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [T] {
        self.slice
    }

    pub(crate) fn host_ref(&self) -> HostRef<'_> {
        // SAFETY: the slice is borrowed for the `HostRef`'s life; `locked` is its registered part.
        unsafe { HostRef::new(self.slice.as_ptr() as usize, std::mem::size_of_val(self.slice), self.locked.clone()) }
    }

    pub(crate) fn host_mut(&mut self) -> HostMut<'_> {
        let bytes = std::mem::size_of_val(self.slice);
        // SAFETY: as for `host_ref`, borrowed exclusively.
        unsafe { HostMut::new(self.slice.as_mut_ptr() as usize, bytes, self.locked.clone()) }
    }

    /// Makes the slice pageable again (`cuMemHostUnregister`); once. Never returns with the
    /// slice still page-locked: when the driver refuses (other than at its own teardown, which
    /// unlocks everything), the process aborts, as the slice's borrow is about to end and safe
    /// code would reach page-locked memory as a plain slice. Also once the exit has decided,
    /// unlike the releases (the sixteenth audit: the slice came back page-locked to threads that
    /// still run under the exit's last handlers): these are driver calls only, never RAFT's or
    /// RMM's C++, and a driver already shut down answers `CUDA_ERROR_DEINITIALIZED`, having
    /// unlocked everything.
    pub(crate) fn unregister(&mut self, who: &'static str) {
        let Some(ctx) = self.ctx.take() else { return };
        let start = (self.slice.as_mut_ptr() as *mut u8).wrapping_add(self.locked.start) as *mut c_void;
        let done = ContextGuard::save(who).and_then(|_keep| {
            bind(who, &ctx)?;
            // SAFETY: unregisters the range `register` registered (same base address), exactly
            // once (`ctx` was taken above); no copy uses it any more (copies of it are waited for
            // inside the borrow that made this registration).
            // Relaxed: a refusal while another thread captures a stream in global mode would
            // stop the process below.
            super::relaxed(|| unsafe { cusys::cuMemHostUnregister(start) }).result().map_err(|e| Error::driver(who, e))
        });
        match done {
            Ok(()) => {}
            // The context is gone or can run nothing (no copy can read the pages any more), or
            // the driver no longer counts the range as registered: nothing is left page-locked
            // that a copy could use.
            Err(e) if super::context_is_dead(&e) || e.message().contains("CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED") => {}
            Err(e) => {
                raft_exit::abort_with(format_args!(
                    "{e}: a registered slice cannot be made pageable again; aborting rather than hand it back page-locked"
                ));
            }
        }
    }
}

impl<T: DeviceScalar> Drop for NativeRegistration<'_, T> {
    fn drop(&mut self) {
        self.unregister("RegisteredSlice::drop");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_whole_pages_inside_the_range_are_registered() {
        let page = 4096;
        assert_eq!(whole_pages(4096, 4096, page), 0..4096);
        assert_eq!(whole_pages(4096 + 16, 3 * 4096, page), 4080..4080 + 2 * 4096);
        assert_eq!(whole_pages(4096 + 16, 4096, page), 0..0, "no whole page inside");
        assert_eq!(whole_pages(4096 + 16, 2 * 4096 - 16, page), 4080..4080 + 4096);
        assert_eq!(whole_pages(100, 10, page), 0..0);
        assert_eq!(whole_pages(8192, 0, page), 0..0);
        for addr in [0usize, 8, 4000, 4096, 12_345] {
            for bytes in [0usize, 1, 4095, 4096, 8193, 40_000] {
                let r = whole_pages(addr, bytes, page);
                if !r.is_empty() {
                    assert!(
                        r.end <= bytes && (addr + r.start).is_multiple_of(page) && r.len().is_multiple_of(page),
                        "{addr} {bytes}: {r:?}"
                    );
                }
            }
        }
    }
}
