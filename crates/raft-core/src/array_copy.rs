//! `DeviceVec`'s copies to and from host memory (direct, page-locked, or staged through
//! [`Staging`]): above the array, the page-locked host arrays and the staged copy they use, so
//! that `array.rs` names none of them.
use crate::array::{DeviceVec, HostCopy};
use crate::copy::Staging;
use crate::error::{ErrorKind, Result};
use crate::host::PageLocked;
use crate::job::JobHandle;
use crate::resources::DeviceResources;
use crate::result::copy;
use crate::result::DeviceScalar;

impl<T: DeviceScalar> DeviceVec<T> {
    /// A copy of `host` in device memory.
    ///
    /// From pageable memory, copies of [`STAGED_FROM_BYTES`](Self::STAGED_FROM_BYTES) or more go
    /// through page-locked buffers by several threads ([`Staging::default`](crate::Staging)):
    /// several times faster than the driver's own pageable path. Page-locked memory given as a
    /// slice (the `unsafe` [`PinnedVec::as_slice`](crate::PinnedVec::as_slice)) is copied
    /// directly; a `PinnedVec` itself goes through [`copy_from_pinned`](Self::copy_from_pinned).
    pub fn from_host(resources: &DeviceResources, host: &[T]) -> Result<Self> {
        const WHO: &str = "DeviceVec::from_host";
        let mut v = Self::alloc(WHO, resources, None, host.len())?;
        v.live(WHO)?;
        v.upload(WHO, host)?;
        Ok(v)
    }

    /// The size from which copies between pageable host memory and an array are staged (see
    /// [`from_host`](Self::from_host)): below it the driver's direct path is as fast. GPU run 79,
    /// in turns with the native pinned copy (host to device / device to host): 256 KiB staged
    /// 0.48x / 0.49x, direct 0.46x / 0.36x; 512 KiB staged 0.52x / 0.52x, direct 0.37x / 0.28x;
    /// 4 MiB staged 0.67x / 0.72x, direct 0.27x / 0.22x. Those are copies in a row (the staging
    /// crew watching); a lone copy, the crew asleep, also pays its wake-up (GPU run 84, copies
    /// 5 ms apart: 512 KiB up staged 95 µs against the driver's 83 µs, down 77 against 116;
    /// 1 MiB 102 / 92 µs against 122 / 155). (4 MiB until run 79: before the staging crew, run
    /// 77's cached thread count and run 78's stores, staging lost below it.)
    pub const STAGED_FROM_BYTES: usize = 512 << 10;

    fn staged(host: &[T]) -> bool {
        std::mem::size_of_val(host) >= Self::STAGED_FROM_BYTES && !copy::is_page_locked(host)
    }

    fn upload(&mut self, who: &'static str, host: &[T]) -> Result<()> {
        if Self::staged(host) {
            match Staging::default().upload(who, self, host) {
                // No page-locked memory for the staging buffers (a memlock limit, say): the
                // driver's own path below still works.
                Err(e) if e.kind() == ErrorKind::OutOfMemory => {}
                other => return other,
            }
        }
        self.buf_mut().copy_from_host(who, host)
    }

    /// Copies `host` into the array (stream-ordered; returns once done).
    ///
    /// # Errors
    /// `Logic` when the lengths differ or the resources were released.
    pub fn copy_from_host(&mut self, host: &[T]) -> Result<()> {
        const WHO: &str = "DeviceVec::copy_from_host";
        self.live(WHO)?;
        self.same_len(WHO, host.len())?;
        self.upload(WHO, host)
    }

    /// Copies the array into `host` (stream-ordered; returns once done).
    ///
    /// # Errors
    /// `Logic` when the lengths differ or the resources were released.
    pub fn copy_to_host(&self, host: &mut [T]) -> Result<()> {
        self.copy_to_host_for("DeviceVec::copy_to_host", host)
    }

    /// Copies page-locked `src` (a [`PinnedVec`](crate::PinnedVec), a
    /// [`RegisteredSlice`](crate::RegisteredSlice)) into the array at the link's speed
    /// (stream-ordered; returns once done).
    ///
    /// # Errors
    /// `Logic` when the lengths differ, the resources were released, or the array's stream is
    /// being captured into a CUDA graph.
    pub fn copy_from_pinned<H: PageLocked<T>>(&mut self, src: &H) -> Result<()> {
        const WHO: &str = "DeviceVec::copy_from_pinned";
        self.live(WHO)?;
        self.same_len(WHO, src.elements())?;
        copy::copy_page_locked(WHO, copy::Ends::ToDevice(src.host_ref(), self.buf_mut()))
    }

    /// Copies the array into page-locked `dst` at the link's speed (stream-ordered; returns once
    /// done).
    ///
    /// # Errors
    /// As [`copy_from_pinned`](Self::copy_from_pinned).
    pub fn copy_to_pinned<H: PageLocked<T>>(&self, dst: &mut H) -> Result<()> {
        const WHO: &str = "DeviceVec::copy_to_pinned";
        self.live(WHO)?;
        self.same_len(WHO, dst.elements())?;
        copy::copy_page_locked(WHO, copy::Ends::ToHost(self.buf(), dst.host_mut()))
    }

    fn copy_to_host_for(&self, who: &'static str, host: &mut [T]) -> Result<()> {
        self.live(who)?;
        self.same_len(who, host.len())?;
        if Self::staged(host) {
            match Staging::default().download(who, self, host) {
                Err(e) if e.kind() == ErrorKind::OutOfMemory => {} // as in `upload`
                other => return other,
            }
        }
        self.buf().copy_to_host(who, host)
    }

    /// The array's contents on the host (staged from
    /// [`STAGED_FROM_BYTES`](Self::STAGED_FROM_BYTES) on, as [`from_host`](Self::from_host)).
    pub fn to_host(&self) -> Result<Vec<T>> {
        const WHO: &str = "DeviceVec::to_host";
        if self.len() * std::mem::size_of::<T>() >= Self::STAGED_FROM_BYTES {
            match Staging::default().new_vec_from(WHO, self) {
                Err(e) if e.kind() == ErrorKind::OutOfMemory => {} // as in `upload`
                other => return other,
            }
        }
        let mut host = vec![T::default(); self.len()];
        self.copy_to_host_for(WHO, &mut host)?;
        Ok(host)
    }

    /// Copies the array to the host on its resources' worker thread: the job owns the array and
    /// gives it back with the host copy.
    pub fn into_host_job(self) -> Result<JobHandle<HostCopy<T>>> {
        let resources = self.resources().clone();
        resources.spawn(move || self.to_host().map(|h| (h, self)))
    }
}
