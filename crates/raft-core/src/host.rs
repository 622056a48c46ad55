//! Page-locked host memory, the host end of copies at the speed of the link: [`PinnedVec`] from
//! RMM's pinned host resource, and [`RegisteredSlice`], a caller's own slice page-locked in
//! place (`cuMemHostRegister`).
use crate::current::AsResources;
use crate::error::{Error, Result};
use crate::memory::{MemoryResource, MemoryResourceKind};
use crate::result::copy::{HostMut, HostRef, NativeHostBuffer};
use crate::result::registration::NativeRegistration;
use crate::result::DeviceScalar;
use std::marker::PhantomData;
use std::sync::Mutex;

/// The `Logic` error of two lengths that differ.
fn same_len(who: &'static str, from: usize, into: usize) -> Result<()> {
    if from != into {
        return Err(Error::logic(who, format!("a copy of {from} elements into {into} elements")));
    }
    Ok(())
}

/// `len` elements of `T` in bytes, or the error of a size no memory holds (as `DeviceVec`
/// reports it): refused before any CUDA call, also before the resource is made or found.
pub(crate) fn bytes_for<T>(who: &'static str, len: usize) -> Result<usize> {
    crate::result::buffer::allocation_bytes::<T>(who, len)
}

/// The pinned host resource this library allocates from on `device` (one per device, made on
/// first use and kept for the process).
pub(crate) fn default_pinned(who: &'static str, device: usize) -> Result<MemoryResource> {
    static MADE: Mutex<Vec<(usize, MemoryResource)>> = Mutex::new(Vec::new());
    let mut made = MADE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, mr)) = made.iter().find(|(d, _)| *d == device) {
        return Ok(mr.clone());
    }
    let mr = MemoryResource::pinned_host(device).map_err(|e| e.with_who(who))?;
    made.push((device, mr.clone()));
    Ok(mr)
}

/// `len` elements of `T` in page-locked host memory (RMM's `pinned_host_memory_resource`,
/// `cudaHostAlloc`): the host end of copies that run at the speed of the link, asynchronously.
///
/// It holds the memory resource that made it, so what frees the memory lives as long as the
/// memory. Dropping it frees the memory on a library release thread (`cudaFreeHost` may wait for
/// the device): `Drop` never blocks.
///
/// Copies (see `docs/API.md`): the blocking [`DeviceVec::copy_from_host`](crate::DeviceVec::copy_from_host)
/// / [`copy_to_host`](crate::DeviceVec::copy_to_host) take it as they take a slice, and run at
/// the pinned speed; [`DeviceResources::copy_scope`](crate::DeviceResources::copy_scope) borrows
/// it for a scope that waits; [`DeviceResources::transfer_to_device`](crate::DeviceResources::transfer_to_device)
/// and [`transfer_to_host`](crate::DeviceResources::transfer_to_host) take it by value and give it
/// back when the copy has finished.
///
/// The host reads and writes it by value ([`get`](Self::get), [`iter`](Self::iter),
/// [`to_vec`](Self::to_vec), [`copy_from_slice`](Self::copy_from_slice), …), not as a `&[T]`:
/// a copy from or into a plain slice of page-locked memory runs asynchronously, and cudarc's
/// safe copies (`memcpy_htod`, `memcpy_dtoh`) take any `&[T]` as pageable memory, whose copies
/// they take to be synchronous, and do not wait for them. Such a slice in safe code could be read while
/// the device writes it, or freed under the copy. [`as_slice`](Self::as_slice) gives it, with
/// that contract, as `unsafe`:
///
/// ```compile_fail,E0308
/// # use raft_core::PinnedVec;
/// # fn f() -> raft_core::Result<()> {
/// let pinned = PinnedVec::<f32>::new(0, 4)?;
/// let slice: &[f32] = &pinned; // error: no safe `&[T]` of page-locked memory
/// # Ok(()) }
/// ```
///
/// # Thread safety
/// `Send + Sync`; writes need `&mut self`.
pub struct PinnedVec<T: DeviceScalar> {
    host: Option<NativeHostBuffer>,
    len: usize,
    /// The resource that made the memory (the buffer holds its own C++ copy; this keeps the Rust
    /// side's view of it, e.g. a tracking report, as long).
    mr: MemoryResource,
    _t: PhantomData<T>,
}

static_assertions::assert_impl_all!(PinnedVec<f32>: Send, Sync);

impl<T: DeviceScalar> PinnedVec<T> {
    /// `len` zeros in page-locked memory for `device` (a number, or resources on it).
    ///
    /// # Errors
    /// `OutOfMemory` when the memory cannot be page-locked, and for more than 2^48 bytes;
    /// `Logic` for a device that does not exist, and for a length whose byte count overflows or
    /// comes within 4096 bytes of `usize::MAX` (as [`DeviceVec::new`](crate::DeviceVec::new)); `Cuda` without a driver.
    pub fn new(device: impl AsResources, len: usize) -> Result<Self> {
        const WHO: &str = "PinnedVec::new";
        let bytes = bytes_for::<T>(WHO, len)?;
        let mr = default_pinned(WHO, device.as_device().map_err(|e| e.with_who(WHO))?)?;
        Self::made(WHO, mr, len, |ctx, mr| NativeHostBuffer::zeroed(WHO, ctx, mr, bytes))
    }

    /// A page-locked copy of `data` for `device`.
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn from_slice(device: impl AsResources, data: &[T]) -> Result<Self> {
        const WHO: &str = "PinnedVec::from_slice";
        bytes_for::<T>(WHO, data.len())?;
        let mr = default_pinned(WHO, device.as_device().map_err(|e| e.with_who(WHO))?)?;
        Self::made(WHO, mr, data.len(), |ctx, mr| NativeHostBuffer::copied(WHO, ctx, mr, data))
    }

    /// `len` zeros from `mr`, which must be a pinned host resource
    /// ([`MemoryResource::pinned_host`]). The resource comes last, as in
    /// [`DeviceVec::new_in`](crate::DeviceVec::new_in) and std's `Vec::with_capacity_in`.
    ///
    /// # Errors
    /// `Logic` for a resource of another kind; otherwise as [`new`](Self::new).
    pub fn new_in(len: usize, mr: &MemoryResource) -> Result<Self> {
        const WHO: &str = "PinnedVec::new_in";
        let bytes = bytes_for::<T>(WHO, len)?;
        if mr.kind() != MemoryResourceKind::PinnedHost {
            return Err(Error::logic(WHO, format!("{} does not allocate page-locked host memory", mr.kind())));
        }
        Self::made(WHO, mr.clone(), len, |ctx, mr| NativeHostBuffer::zeroed(WHO, ctx, mr, bytes))
    }

    fn made(
        who: &'static str,
        mr: MemoryResource,
        len: usize,
        make: impl FnOnce(&std::sync::Arc<cudarc::driver::CudaContext>, &crate::result::mr::NativeMr) -> Result<NativeHostBuffer>,
    ) -> Result<Self> {
        let ctx = crate::device::context(who, mr.device())?;
        let host = make(&ctx, mr.native())?;
        Ok(PinnedVec { host: Some(host), len, mr, _t: PhantomData })
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device whose pinned resource made the memory (every device reaches it: the memory
    /// is portable under unified addressing).
    pub fn device(&self) -> usize {
        self.mr.device()
    }

    /// The resource that made the memory.
    pub fn memory_resource(&self) -> &MemoryResource {
        &self.mr
    }

    /// Element `i`, or `None` past the end.
    pub fn get(&self, i: usize) -> Option<T> {
        self.native().as_slice(self.len).get(i).copied()
    }

    /// Writes element `i`.
    ///
    /// # Errors
    /// `Logic` past the end.
    pub fn set(&mut self, i: usize, value: T) -> Result<()> {
        let len = self.len;
        match self.native_mut().as_mut_slice(len).get_mut(i) {
            Some(at) => {
                *at = value;
                Ok(())
            }
            None => Err(Error::logic("PinnedVec::set", format!("element {i} of {len}"))),
        }
    }

    /// The elements, by value.
    pub fn iter(&self) -> impl Iterator<Item = T> + '_ {
        self.native().as_slice(self.len).iter().copied()
    }

    /// The elements in a new `Vec`.
    pub fn to_vec(&self) -> Vec<T> {
        self.native().as_slice(self.len).to_vec()
    }

    /// Overwrites every element with `src`'s.
    ///
    /// # Errors
    /// `Logic` when the lengths differ.
    pub fn copy_from_slice(&mut self, src: &[T]) -> Result<()> {
        let len = self.len;
        same_len("PinnedVec::copy_from_slice", src.len(), len)?;
        self.native_mut().as_mut_slice(len).copy_from_slice(src);
        Ok(())
    }

    /// Copies every element into `dst`.
    ///
    /// # Errors
    /// `Logic` when the lengths differ.
    pub fn copy_to_slice(&self, dst: &mut [T]) -> Result<()> {
        same_len("PinnedVec::copy_to_slice", self.len, dst.len())?;
        dst.copy_from_slice(self.native().as_slice(self.len));
        Ok(())
    }

    /// Sets every element to `value`.
    pub fn fill(&mut self, value: T) {
        let len = self.len;
        self.native_mut().as_mut_slice(len).fill(value);
    }

    /// The elements as a slice.
    ///
    /// # Safety
    /// No copy or kernel that this library did not queue may read or write the memory while the
    /// slice is used, or still run once the `PinnedVec` is dropped: in particular not cudarc's
    /// `memcpy_htod` / `memcpy_dtoh` given this slice, which return before their copy from
    /// page-locked memory has run and never wait for it (they take every `&[T]` for pageable
    /// memory). Copies through this library's APIs always wait, or hold the `PinnedVec`.
    pub unsafe fn as_slice(&self) -> &[T] {
        self.native().as_slice(self.len)
    }

    /// The elements as a slice, to write.
    ///
    /// # Safety
    /// As [`as_slice`](Self::as_slice).
    pub unsafe fn as_mut_slice(&mut self) -> &mut [T] {
        let len = self.len;
        self.native_mut().as_mut_slice(len)
    }

    pub(crate) fn native(&self) -> &NativeHostBuffer {
        self.host.as_ref().expect("a PinnedVec holds its memory until dropped")
    }

    pub(crate) fn native_mut(&mut self) -> &mut NativeHostBuffer {
        self.host.as_mut().expect("a PinnedVec holds its memory until dropped")
    }
}

impl<T: DeviceScalar> std::fmt::Debug for PinnedVec<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedVec").field("len", &self.len).field("device", &self.device()).finish()
    }
}

impl<T: DeviceScalar> Drop for PinnedVec<T> {
    fn drop(&mut self) {
        let Some(host) = self.host.take() else { return };
        if !raft_exit::native_release_allowed() {
            host.leak(); // no CUDA call once the exit has decided: leaked to the OS
            return;
        }
        if host.bytes() == 0 {
            // Nothing was allocated: only the shim's handle goes.
            if let Err(e) = host.free("PinnedVec::drop") {
                log::warn!(target: "raft", "{e}");
            }
            return;
        }
        // cudaFreeHost may wait for the device: free on a release thread, counted by the exit
        // machinery like any release.
        let label = raft_exit::Label { what: "release of pinned memory", id: raft_exit::next_id(), device: Some(host.device()) };
        crate::release::enqueue(
            label,
            Box::new(move || {
                if !raft_exit::native_release_allowed() {
                    host.leak();
                } else if let Err(e) = host.free("PinnedVec::drop") {
                    log::warn!(target: "raft", "{e}");
                }
            }),
        );
    }
}

/// A caller's own slice, page-locked in place (`cuMemHostRegister`, portable) for as long as this
/// lives: copies from and to it run at the pinned speed without a copy into a [`PinnedVec`].
///
/// It holds the slice's exclusive borrow, so while it lives the slice is reached only through
/// it (by value, as a [`PinnedVec`] is, and for the same reason); dropping it makes the memory
/// pageable again
/// (`cuMemHostUnregister`), inline: unlike other drops here it may wait briefly in the driver,
/// and [`unregister`](Self::unregister) gives its error. Page-locking costs about as much as
/// copying the memory once: register data that is copied several times.
///
/// Asynchronous copies borrow it only inside [`DeviceResources::copy_scope`](crate::DeviceResources::copy_scope), which waits: a
/// registration cannot be released while a copy may use it.
///
/// Made by [`scope`](Self::scope), which ends the registration before the slice's borrow
/// ends, however the body leaves. (A registration that outlived the borrow, forgotten with
/// `mem::forget`, would leave page-locked memory that safe code reaches as a plain slice, which
/// cudarc's copies would take for pageable memory and not wait for: [`new`](Self::new), which
/// makes one that can be forgotten, is `unsafe`.)
///
/// ```compile_fail,E0133
/// # use raft_core::RegisteredSlice;
/// # fn f() -> raft_core::Result<()> {
/// let mut data = vec![0f32; 1024];
/// std::mem::forget(RegisteredSlice::new(0, &mut data)?); // error: `new` is unsafe
/// data[0] = 1.0; // (page-locked memory, reached as a plain slice)
/// # Ok(()) }
/// ```
///
/// ```compile_fail,E0499
/// # use raft_core::RegisteredSlice;
/// # fn f() -> raft_core::Result<()> {
/// let mut data = vec![0f32; 1024];
/// RegisteredSlice::scope(0, &mut data, |registered| {
///     data[0] = 1.0; // error: `data` is reached only through `registered` meanwhile
///     registered.len()
/// })?;
/// # Ok(()) }
/// ```
///
/// # Thread safety
/// `Send + Sync` like `&mut [T]`.
pub struct RegisteredSlice<'a, T: DeviceScalar> {
    native: NativeRegistration<'a, T>,
    device: usize,
}

static_assertions::assert_impl_all!(RegisteredSlice<'static, f32>: Send, Sync);

impl<'a, T: DeviceScalar> RegisteredSlice<'a, T> {
    /// Page-locks `slice` for `device` (every device reaches it: the registration is portable)
    /// while `body` runs with the registration, then makes it pageable again, also when `body`
    /// panics.
    ///
    /// The driver page-locks whole pages, so only the whole pages inside the slice are
    /// registered: the bytes that share its first and last page with other memory stay
    /// pageable (other memory on those pages is never page-locked behind its owner's back) and
    /// are copied as pageable memory. A slice holding no whole page registers nothing; its
    /// copies run as a plain slice's would. Page-aligned slices are copied wholly at the pinned
    /// speed.
    ///
    /// Should the driver refuse to make the memory pageable again (anything but its own
    /// teardown), the process aborts: handing the slice back page-locked would let safe code
    /// give page-locked memory to copies that take it for pageable and do not wait for it.
    ///
    /// # Errors
    /// `Logic` for a device that does not exist, memory the driver reports as already
    /// page-locked (part of a [`PinnedVec`], or registered elsewhere), or once the process's exit
    /// has decided; `Cuda` when the driver refuses otherwise.
    pub fn scope<R>(device: impl AsResources, slice: &'a mut [T], body: impl FnOnce(&mut RegisteredSlice<'a, T>) -> R) -> Result<R> {
        const WHO: &str = "RegisteredSlice::scope";
        let device = device.as_device().map_err(|e| e.with_who(WHO))?;
        let mut registered = Self::register(WHO, device, slice)?;
        let out = body(&mut registered);
        registered.native.unregister(WHO);
        Ok(out)
    }

    /// Page-locks `slice` for `device` until the registration is dropped or
    /// [`unregister`](Self::unregister)ed.
    ///
    /// # Errors
    /// As [`scope`](Self::scope).
    ///
    /// # Safety
    /// The registration must end before `slice` is used again: it must not be forgotten
    /// (`mem::forget`, a reference cycle), or the memory stays page-locked under a slice that
    /// safe code may hand to copies that do not wait for page-locked memory (cudarc's
    /// `memcpy_htod` / `memcpy_dtoh` take every `&[T]` for pageable memory).
    pub unsafe fn new(device: impl AsResources, slice: &'a mut [T]) -> Result<Self> {
        const WHO: &str = "RegisteredSlice::new";
        Self::register(WHO, device.as_device().map_err(|e| e.with_who(WHO))?, slice)
    }

    fn register(who: &'static str, device: usize, slice: &'a mut [T]) -> Result<Self> {
        let ctx = crate::device::context(who, device)?;
        Ok(RegisteredSlice { native: NativeRegistration::register(who, &ctx, slice)?, device })
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.native.as_slice().len()
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The device given to [`new`](Self::new).
    pub fn device(&self) -> usize {
        self.device
    }

    /// Makes the memory pageable again now (as dropping it does: the process aborts where the
    /// driver refuses, see [`scope`](Self::scope)).
    ///
    /// # Errors
    /// None today: kept for callers that check.
    pub fn unregister(mut self) -> Result<()> {
        self.native.unregister("RegisteredSlice::unregister");
        Ok(())
    }

    /// Element `i`, or `None` past the end.
    pub fn get(&self, i: usize) -> Option<T> {
        self.native.as_slice().get(i).copied()
    }

    /// The elements in a new `Vec`.
    pub fn to_vec(&self) -> Vec<T> {
        self.native.as_slice().to_vec()
    }

    /// Overwrites every element with `src`'s.
    ///
    /// # Errors
    /// `Logic` when the lengths differ.
    pub fn copy_from_slice(&mut self, src: &[T]) -> Result<()> {
        same_len("RegisteredSlice::copy_from_slice", src.len(), self.len())?;
        self.native.as_mut_slice().copy_from_slice(src);
        Ok(())
    }

    /// The elements as a slice.
    ///
    /// # Safety
    /// As [`PinnedVec::as_slice`]: no copy this library did not queue (cudarc's `memcpy_htod` /
    /// `memcpy_dtoh` given this slice) may use the memory while the slice is used or after the
    /// registration ends.
    pub unsafe fn as_slice(&self) -> &[T] {
        self.native.as_slice()
    }

    /// The elements as a slice, to write.
    ///
    /// # Safety
    /// As [`as_slice`](Self::as_slice).
    pub unsafe fn as_mut_slice(&mut self) -> &mut [T] {
        self.native.as_mut_slice()
    }
}

impl<T: DeviceScalar> std::fmt::Debug for RegisteredSlice<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegisteredSlice").field("len", &self.len()).field("device", &self.device).finish()
    }
}

/// Page-locked host memory a copy reaches directly (DMA): [`PinnedVec`] and
/// [`RegisteredSlice`]. Sealed: only memory this library page-locked qualifies.
pub trait PageLocked<T: DeviceScalar>: sealed::Sealed + HostSource<T> + HostTarget<T> {
    /// The number of elements.
    fn elements(&self) -> usize;
}

impl<T: DeviceScalar> PageLocked<T> for PinnedVec<T> {
    fn elements(&self) -> usize {
        self.len
    }
}
impl<T: DeviceScalar> PageLocked<T> for RegisteredSlice<'_, T> {
    fn elements(&self) -> usize {
        self.len()
    }
}

/// Host memory a blocking copy reads: a slice, `Vec` or array (pageable: staged through
/// page-locked buffers from [`DeviceVec::STAGED_FROM_BYTES`](crate::DeviceVec::STAGED_FROM_BYTES)
/// on), a [`PinnedVec`] or a [`RegisteredSlice`] (page-locked: copied directly, at the link's
/// speed), or a reference to one. What `DeviceVec::from_host` and `copy_from_host` take, so
/// that one verb copies from every kind of host memory. Sealed.
pub trait HostSource<T: DeviceScalar>: sealed::Source<T> {}

/// Host memory a blocking copy writes (see [`HostSource`]): what `DeviceVec::copy_to_host`
/// takes. Sealed.
pub trait HostTarget<T: DeviceScalar>: sealed::Target<T> {}

impl<T: DeviceScalar, S: sealed::Source<T> + ?Sized> HostSource<T> for S {}
impl<T: DeviceScalar, S: sealed::Target<T> + ?Sized> HostTarget<T> for S {}

pub(crate) mod sealed {
    use crate::result::copy::{HostMut, HostRef};
    use crate::result::DeviceScalar;

    /// The page-locked bytes, for the copy layer.
    pub trait Sealed {
        fn host_ref(&self) -> HostRef<'_>;
        fn host_mut(&mut self) -> HostMut<'_>;
    }

    /// Host memory to read: pageable elements, or page-locked bytes (and their element count).
    pub enum Read<'a, T> {
        Pageable(&'a [T]),
        Locked(HostRef<'a>, usize),
    }

    /// Host memory to write (see [`Read`]).
    pub enum Write<'a, T> {
        Pageable(&'a mut [T]),
        Locked(HostMut<'a>, usize),
    }

    pub trait Source<T: DeviceScalar> {
        fn read(&self) -> Read<'_, T>;
    }

    pub trait Target<T: DeviceScalar> {
        fn write(&mut self) -> Write<'_, T>;
    }

    impl<T: DeviceScalar> Read<'_, T> {
        pub fn len(&self) -> usize {
            match self {
                Read::Pageable(s) => s.len(),
                Read::Locked(_, n) => *n,
            }
        }
    }

    impl<T: DeviceScalar> Write<'_, T> {
        pub fn len(&self) -> usize {
            match self {
                Write::Pageable(s) => s.len(),
                Write::Locked(_, n) => *n,
            }
        }
    }

    impl<T: DeviceScalar> Source<T> for [T] {
        fn read(&self) -> Read<'_, T> {
            Read::Pageable(self)
        }
    }
    impl<T: DeviceScalar> Target<T> for [T] {
        fn write(&mut self) -> Write<'_, T> {
            Write::Pageable(self)
        }
    }
    impl<T: DeviceScalar, const N: usize> Source<T> for [T; N] {
        fn read(&self) -> Read<'_, T> {
            Read::Pageable(self)
        }
    }
    impl<T: DeviceScalar, const N: usize> Target<T> for [T; N] {
        fn write(&mut self) -> Write<'_, T> {
            Write::Pageable(self)
        }
    }
    impl<T: DeviceScalar> Source<T> for Vec<T> {
        fn read(&self) -> Read<'_, T> {
            Read::Pageable(self)
        }
    }
    impl<T: DeviceScalar> Target<T> for Vec<T> {
        fn write(&mut self) -> Write<'_, T> {
            Write::Pageable(self)
        }
    }
    impl<T: DeviceScalar, S: Source<T> + ?Sized> Source<T> for &S {
        fn read(&self) -> Read<'_, T> {
            (**self).read()
        }
    }
    impl<T: DeviceScalar, S: Source<T> + ?Sized> Source<T> for &mut S {
        fn read(&self) -> Read<'_, T> {
            (**self).read()
        }
    }
    impl<T: DeviceScalar, S: Target<T> + ?Sized> Target<T> for &mut S {
        fn write(&mut self) -> Write<'_, T> {
            (**self).write()
        }
    }
}

impl<T: DeviceScalar> sealed::Source<T> for PinnedVec<T> {
    fn read(&self) -> sealed::Read<'_, T> {
        sealed::Read::Locked(self.native().host_ref(), self.len)
    }
}
impl<T: DeviceScalar> sealed::Target<T> for PinnedVec<T> {
    fn write(&mut self) -> sealed::Write<'_, T> {
        let len = self.len;
        sealed::Write::Locked(self.native_mut().host_mut(), len)
    }
}
impl<T: DeviceScalar> sealed::Source<T> for RegisteredSlice<'_, T> {
    fn read(&self) -> sealed::Read<'_, T> {
        sealed::Read::Locked(self.native.host_ref(), self.len())
    }
}
impl<T: DeviceScalar> sealed::Target<T> for RegisteredSlice<'_, T> {
    fn write(&mut self) -> sealed::Write<'_, T> {
        let len = self.len();
        sealed::Write::Locked(self.native.host_mut(), len)
    }
}

impl<T: DeviceScalar> sealed::Sealed for PinnedVec<T> {
    fn host_ref(&self) -> HostRef<'_> {
        self.native().host_ref()
    }
    fn host_mut(&mut self) -> HostMut<'_> {
        self.native_mut().host_mut()
    }
}

impl<T: DeviceScalar> sealed::Sealed for RegisteredSlice<'_, T> {
    fn host_ref(&self) -> HostRef<'_> {
        self.native.host_ref()
    }
    fn host_mut(&mut self) -> HostMut<'_> {
        self.native.host_mut()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn sizes_no_memory_holds_are_refused_before_any_cuda_call() {
        // An overflowing byte count is a wrong length; a size past 2^48 bytes is memory no one has.
        let e = bytes_for::<f64>("PinnedVec::new", usize::MAX / 4).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Logic);
        assert!(e.to_string().starts_with("PinnedVec::new: "), "{e}");
        assert_eq!(bytes_for::<u8>("x", usize::MAX - 7).unwrap_err().kind(), ErrorKind::Logic);
        assert_eq!(bytes_for::<u8>("x", usize::MAX - 4096).unwrap_err().kind(), ErrorKind::OutOfMemory);
        assert_eq!(bytes_for::<u32>("x", (1 << 46) + 1).unwrap_err().kind(), ErrorKind::OutOfMemory);
        assert_eq!(bytes_for::<u32>("x", 1 << 46).unwrap(), 1 << 48);
        assert_eq!(bytes_for::<u16>("x", 3).unwrap(), 6);
    }
}
