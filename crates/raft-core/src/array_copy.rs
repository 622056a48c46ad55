//! `DeviceVec`'s blocking copies to and from host memory: one verb per direction whatever the
//! host memory is (pageable, staged through [`Staging`] by itself past a size; page-locked,
//! copied directly). Above the array, the page-locked host arrays and the staged copy they use,
//! so that `array.rs` names none of them.
use crate::array::{DeviceVec, HostCopy};
use crate::copy::Staging;
use crate::error::{ErrorKind, Result};
use crate::host::sealed::{Read, Write};
use crate::host::{HostSource, HostTarget, PageLocked};
use crate::job::JobHandle;
use crate::resources::DeviceResources;
use crate::result::copy;
use crate::result::DeviceScalar;

/// The blocking copies: each touches host memory the caller lends for the call, so each returns
/// once the copy is done (the blocking rule of `docs/API.md`).
impl<T: DeviceScalar> DeviceVec<T> {
    /// A copy of `src` in device memory: a slice, `Vec` or array, a
    /// [`PinnedVec`](crate::PinnedVec) or a [`RegisteredSlice`](crate::RegisteredSlice) (see
    /// [`HostSource`]). Returns once done.
    ///
    /// From pageable memory, copies of [`STAGED_FROM_BYTES`](Self::STAGED_FROM_BYTES) or more (as
    /// [`Staging::current`] says) go through page-locked buffers by several threads: several
    /// times faster than the driver's own pageable path. Page-locked memory is copied directly,
    /// at the link's speed (also a slice of it, from the `unsafe`
    /// [`PinnedVec::as_slice`](crate::PinnedVec::as_slice)).
    ///
    /// # Errors
    /// As [`new`](Self::new); `Logic` while the resources' stream is being captured into a CUDA
    /// graph; `Cuda` when the copy fails.
    pub fn from_host<H: HostSource<T> + ?Sized>(resources: &DeviceResources, src: &H) -> Result<Self> {
        const WHO: &str = "DeviceVec::from_host";
        let src = src.read();
        let mut v = Self::alloc(WHO, resources, None, src.len())?;
        v.live(WHO)?;
        v.upload(WHO, src)?;
        Ok(v)
    }

    /// The size from which copies between pageable host memory and an array are staged by
    /// default (see [`from_host`](Self::from_host); [`Staging::with_staged_from`] changes it):
    /// below it the driver's direct path is as fast. GPU run 79,
    /// in turns with the native pinned copy (host to device / device to host): 256 KiB staged
    /// 0.48x / 0.49x, direct 0.46x / 0.36x; 512 KiB staged 0.52x / 0.52x, direct 0.37x / 0.28x;
    /// 4 MiB staged 0.67x / 0.72x, direct 0.27x / 0.22x. Those are copies in a row (the staging
    /// crew watching); a lone copy, the crew asleep, also pays its wake-up (GPU run 84, copies
    /// 5 ms apart: 512 KiB up staged 95 µs against the driver's 83 µs, down 77 against 116;
    /// 1 MiB 102 / 92 µs against 122 / 155). (4 MiB until run 79: before the staging crew, run
    /// 77's cached thread count and run 78's stores, staging lost below it.)
    pub const STAGED_FROM_BYTES: usize = 512 << 10;

    /// The process's staging, where a copy of pageable `host` is to be staged.
    fn staging_for(host: &[T]) -> Option<Staging> {
        let staging = Staging::current();
        (std::mem::size_of_val(host) >= staging.staged_from() && !copy::is_page_locked(host)).then_some(staging)
    }

    fn upload(&mut self, who: &'static str, src: Read<'_, T>) -> Result<()> {
        let host = match src {
            Read::Locked(host, _) => return copy::copy_page_locked(who, copy::Ends::ToDevice(host, self.buf_mut())),
            Read::Pageable(host) => host,
        };
        if let Some(staging) = Self::staging_for(host) {
            match staging.upload(who, self, host) {
                // No page-locked memory for the staging buffers (a memlock limit, say): the
                // driver's own path below still works.
                Err(e) if e.kind() == ErrorKind::OutOfMemory => {}
                other => return other,
            }
        }
        self.buf_mut().copy_from_host(who, host)
    }

    /// Copies `src` (any [`HostSource`], as [`from_host`](Self::from_host)) into the array;
    /// returns once done.
    ///
    /// # Errors
    /// `Logic` when the lengths differ, the resources were released, or the array's stream is
    /// being captured into a CUDA graph; `Cuda` when the copy fails.
    pub fn copy_from_host<H: HostSource<T> + ?Sized>(&mut self, src: &H) -> Result<()> {
        const WHO: &str = "DeviceVec::copy_from_host";
        let src = src.read();
        self.live(WHO)?;
        self.same_len(WHO, src.len())?;
        self.upload(WHO, src)
    }

    /// Copies the array into `dst` (a slice, `Vec` or array, a [`PinnedVec`](crate::PinnedVec)
    /// or a [`RegisteredSlice`](crate::RegisteredSlice): see [`HostTarget`]); returns once done.
    /// Staged as [`from_host`](Self::from_host) is.
    ///
    /// # Errors
    /// As [`copy_from_host`](Self::copy_from_host).
    pub fn copy_to_host<H: HostTarget<T> + ?Sized>(&self, dst: &mut H) -> Result<()> {
        self.copy_to_host_for("DeviceVec::copy_to_host", dst.write())
    }

    /// Copies page-locked `src` into the array; returns once done.
    ///
    /// # Errors
    /// As [`copy_from_host`](Self::copy_from_host), which it is.
    #[deprecated(note = "use `copy_from_host`: it takes page-locked memory too, and copies it directly")]
    pub fn copy_from_pinned<H: PageLocked<T>>(&mut self, src: &H) -> Result<()> {
        self.copy_from_host(src)
    }

    /// Copies the array into page-locked `dst`; returns once done.
    ///
    /// # Errors
    /// As [`copy_to_host`](Self::copy_to_host), which it is.
    #[deprecated(note = "use `copy_to_host`: it takes page-locked memory too, and copies into it directly")]
    pub fn copy_to_pinned<H: PageLocked<T>>(&self, dst: &mut H) -> Result<()> {
        self.copy_to_host(dst)
    }

    fn copy_to_host_for(&self, who: &'static str, dst: Write<'_, T>) -> Result<()> {
        self.live(who)?;
        self.same_len(who, dst.len())?;
        let host = match dst {
            Write::Locked(host, _) => return copy::copy_page_locked(who, copy::Ends::ToHost(self.buf(), host)),
            Write::Pageable(host) => host,
        };
        if let Some(staging) = Self::staging_for(host) {
            match staging.download(who, self, host) {
                Err(e) if e.kind() == ErrorKind::OutOfMemory => {} // as in `upload`
                other => return other,
            }
        }
        self.buf().copy_to_host(who, host)
    }

    /// The array's contents in a new `Vec` (staged from
    /// [`STAGED_FROM_BYTES`](Self::STAGED_FROM_BYTES) on, as [`from_host`](Self::from_host));
    /// returns once done.
    pub fn to_host(&self) -> Result<Vec<T>> {
        const WHO: &str = "DeviceVec::to_host";
        let staging = Staging::current();
        if self.len() * std::mem::size_of::<T>() >= staging.staged_from() {
            match staging.new_vec_from(WHO, self) {
                Err(e) if e.kind() == ErrorKind::OutOfMemory => {} // as in `upload`
                other => return other,
            }
        }
        let mut host = vec![T::default(); self.len()];
        self.copy_to_host_for(WHO, Write::Pageable(&mut host))?;
        Ok(host)
    }

    /// Copies the array to the host on its resources' worker thread: the job owns the array and
    /// gives it back with the host copy.
    pub fn into_host_job(self) -> Result<JobHandle<HostCopy<T>>> {
        let resources = self.resources().clone();
        resources.spawn(move || self.to_host().map(|h| (h, self)))
    }
}
