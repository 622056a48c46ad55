//! `DeviceVec<T>`: typed device memory from an RMM resource, allocated and freed in order on a
//! resources object's stream: a held allocation (`NativeBuffer::create_held`), whose buffer holds
//! the resource that frees it. Its views are `views.rs` (ranges) and `matrix.rs` (matrices).
use crate::current::AsResources;
use crate::error::{Error, ErrorKind, Result};
use crate::memory::MemoryResource;
use crate::resources::DeviceResources;
use crate::result::buffer::NativeBuffer;
use crate::result::foreign::ForeignUses;
use crate::result::DeviceScalar;
use cudarc::driver::{sys::CUdeviceptr, CudaStream, DevicePtr, DevicePtrMut, DeviceSlice, SyncOnDrop};
use std::marker::PhantomData;
use std::sync::Arc;

/// `len` elements of `T` in device memory, on a resources object's stream.
///
/// Allocated through the device's current RMM resource (the async pool by default), or a given
/// [`MemoryResource`] ([`new_in`](Self::new_in)), and freed, stream-ordered, when dropped. The
/// array holds the resource that made it and its resources' stream: replacing the device's
/// resource or releasing the resources never leaves it dangling (a resource another library
/// installed by reference excepted: see [`memory`](crate::memory)). Once the resources are
/// released, its operations give the `Logic` error of released resources.
///
/// For cudarc: `DeviceVec` implements [`DevicePtr`] and [`DevicePtrMut`], so cudarc's kernels
/// launches and cuBLAS wrappers take it directly. Used on another stream than its own, that
/// stream first waits for the array's stream, and the pointer's guard records an event there
/// once the use is queued: the array's own stream waits for it (on the device, never refused
/// by a graph capture) before its next use of the array and before the array is freed, so the
/// array is never freed under work queued elsewhere. (Each other stream keeps an entry until the
/// array's next exclusive use, and on a per-thread default stream each pointer does: past 4096
/// entries a further use waits on the host and the array is kept until the process ends.) A
/// pointer asked for on a stream being captured into a CUDA graph (or while the array's own
/// stream is) panics: the graph would use the memory at each launch, after the array may be
/// gone. One exception, in cudarc:
/// its `memcpy_dtod` between two devices queues the copy on the destination's stream but asks
/// the source for its pointer on the source's own stream (cudarc 0.19), so the source's drop is
/// not ordered after the copy (cudarc's own slices have the same gap). Between devices, copy
/// with [`copy_from_device`](Self::copy_from_device) or the resources' copies instead. Another,
/// in cudarc 0.19.10: `CudaStream::memcpy_dtoh(&src, &mut dst)` checks only that `dst` is at
/// least as long as `src`, then copies `dst.len()` elements, reading past the end of the array
/// (or of a view, into memory it does not own) when `dst` is longer: give it a destination of
/// exactly the array's length, or use [`copy_to_host`](Self::copy_to_host), which checks. A
/// third, in cudarc 0.19: `SyncOnDrop`'s variants have public fields, so code holding a guard
/// can take the event out of it and record it elsewhere (or reach the context it was made in)
/// after the guard is gone; the array's stream then waits for that record instead of the use.
/// cudarc's own slices order their frees through the same events and share the gap. Never
/// take a guard apart, nor forget one: `DevicePtr` and `DevicePtrMut` are safe traits in
/// cudarc 0.19, so a type of yours implementing them (asking an array for its pointer and
/// forgetting the guard, or answering any address at all) is taken by cudarc's safe calls on
/// its word. A fourth, in cudarc 0.19's `nccl` feature (which this library does not
/// turn on; a crate of yours that does turns it on for every user of cudarc in the build): its
/// safe collectives take the send buffer's length as the count and never compare it with the
/// receive buffer's (`all_reduce`, `reduce`; `all_gather` and `reduce_scatter` scale one by the
/// world size unchecked), so a shorter receive array or view is written past its end; and its
/// safe `group_start` lets a `send` record its guard's event before `ncclGroupEnd` queues the
/// work, so the array's free is not ordered after it. Hand arrays to NCCL through raft-comms,
/// which checks the counts, never through cudarc's `nccl` wrappers.
///
/// CUDA graphs: an array is neither allocated nor freed on a stream being captured into a graph
/// (through the async pool either would become a node of the graph, run at each launch rather
/// than now). Allocating is refused (`Logic`); an array dropped while its stream is captured is
/// not freed: it stays allocated, with its resource, until the process ends (a warning is
/// logged). A free that runs on a release thread (a resource whose free may block) waits up to
/// a second for a capture of its stream to end first. Make and drop arrays before the capture
/// begins or after it ends.
///
/// # Thread safety
/// `Send + Sync`; writes need `&mut self`.
pub struct DeviceVec<T: DeviceScalar> {
    buffer: Option<NativeBuffer>,
    len: usize,
    resources: DeviceResources,
    /// Uses on other streams (cudarc's `DevicePtr`), which the array's own stream waits for.
    foreign: ForeignUses,
    _t: PhantomData<T>,
}

static_assertions::assert_impl_all!(DeviceVec<f32>: Send, Sync);

impl<T: DeviceScalar> DeviceVec<T> {
    /// `len` elements with unspecified contents, from the device's current RMM resource.
    ///
    /// # Errors
    /// `OutOfMemory` when the allocation fails, and for more than 2^48 bytes (256 TiB, more than
    /// any device holds), refused before RMM sees them; `Logic` on released resources, while the
    /// resources' stream is being captured into a CUDA graph, and for a length whose byte count
    /// overflows or comes within 4096 bytes of `usize::MAX` (RMM's rounding to its alignment
    /// would wrap).
    pub fn new(resources: &DeviceResources, len: usize) -> Result<Self> {
        Self::alloc("DeviceVec::new", resources, None, len)
    }

    /// `len` elements with unspecified contents, from `mr` (made for the resources' device).
    ///
    /// # Errors
    /// `Logic` when `mr` belongs to another device, the resources were released or their stream
    /// is being captured into a CUDA graph; `OutOfMemory` when the allocation fails; sizes as
    /// [`new`](Self::new).
    pub fn new_in(resources: &DeviceResources, len: usize, mr: &MemoryResource) -> Result<Self> {
        Self::alloc("DeviceVec::new_in", resources, Some(mr), len)
    }

    pub(crate) fn alloc(who: &'static str, resources: &DeviceResources, mr: Option<&MemoryResource>, len: usize) -> Result<Self> {
        // Refused before the retry below: no release can make room for it.
        let bytes = crate::result::buffer::allocation_bytes::<T>(who, len)?;
        if let Some(mr) = mr {
            if mr.device() != resources.device() {
                return Err(Error::logic(
                    who,
                    format!("a memory resource of device {} cannot allocate for resources on device {}", mr.device(), resources.device()),
                ));
            }
        }
        let make = || {
            resources.with_native(who, |n| {
                NativeBuffer::create_held(who, resources.device(), mr.map(|m| m.native_arc()), n.stream(), n.capture_flag(), bytes)
            })
        };
        // The retry out of line (issue 30: inline, its match moved the buffer through memory
        // twice more on every allocation).
        let buffer = match make() {
            Ok(buffer) => buffer,
            Err(e) => Self::after_failure(who, resources, mr, e, make)?,
        };
        crate::stats::live_arrays::add(1);
        Ok(DeviceVec { buffer: Some(buffer), len, resources: resources.clone(), foreign: ForeignUses::default(), _t: PhantomData })
    }

    /// An allocation failed with `e`: out of memory only after the releases pending on this
    /// device had their chance to give memory back (run or waited for, then `make` tried once
    /// more). A final failure gives what the async pool holds unused back to the driver, for
    /// other processes (RMM keeps it otherwise: runs 22, 24 and 28 saw the next process fail to
    /// make a context).
    #[cold]
    #[inline(never)]
    fn after_failure(
        who: &'static str,
        resources: &DeviceResources,
        mr: Option<&MemoryResource>,
        e: Error,
        make: impl Fn() -> Result<NativeBuffer>,
    ) -> Result<NativeBuffer> {
        let out_of_memory = |e: &Error| e.kind() == ErrorKind::OutOfMemory;
        // Both run (`|`, not `||`): pending releases, and retired async pools that still hold
        // memory.
        let retried =
            if out_of_memory(&e) && (crate::release::drain_device(resources.device(), true) | crate::result::mr::reclaim_retired_pools()) {
                make()
            } else {
                Err(e)
            };
        retried.inspect_err(|e| {
            if out_of_memory(e) {
                if let Err(trim) = crate::result::mr::trim_async_pool(who, resources.device(), mr.map(|m| m.native())) {
                    log::warn!(target: "raft", "{trim}");
                }
            }
        })
    }

    /// `len` zeros; returns once the zeroing is queued on the array's stream (an operation on
    /// device memory only queues: see the blocking rule in `docs/API.md`).
    ///
    /// # Errors
    /// As [`new`](Self::new); `Logic` while the resources' stream is being captured into a CUDA
    /// graph.
    pub fn zeros(resources: &DeviceResources, len: usize) -> Result<Self> {
        const WHO: &str = "DeviceVec::zeros";
        let mut v = Self::alloc(WHO, resources, None, len)?;
        v.live(WHO)?;
        crate::result::copy::zero_ordered(WHO, v.buf_mut())?;
        Ok(v)
    }

    /// The buffer, for a shared use on its own stream: ordered after the writes of other
    /// streams (`DevicePtrMut`).
    pub(crate) fn buf(&self) -> &NativeBuffer {
        let buffer = self.buffer.as_ref().expect("a DeviceVec holds its buffer until dropped");
        self.foreign.before_read(buffer.stream());
        buffer
    }

    /// The buffer, for an exclusive use on its own stream: ordered after every use of other
    /// streams (a failure only lets the use race them: values, never memory).
    pub(crate) fn buf_mut(&mut self) -> &mut NativeBuffer {
        let buffer = self.buffer.as_mut().expect("a DeviceVec holds its buffer until dropped");
        if let Err(e) = self.foreign.settle_all("DeviceVec", buffer.stream()) {
            self.foreign.report(&e);
        }
        buffer
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The resources the array belongs to.
    pub fn resources(&self) -> &DeviceResources {
        &self.resources
    }

    /// The stream the array is ordered on (its resources' stream), for cudarc kernels. Every
    /// stream of the library is cudarc's `Arc<CudaStream>`: an array (or view, or matrix) holds
    /// its own and lends it (`&Arc<CudaStream>`, as cudarc's `DeviceSlice::stream`); resources,
    /// which may be released, give a clone (`DeviceResources::stream() -> Result<Arc<..>>`).
    pub fn stream(&self) -> &Arc<CudaStream> {
        self.resources.capture_flag().raise(); // the handle leaves the library (`result/exposure.rs`)
        self.buf().stream()
    }

    /// The device address of the first element, for FFI and cudarc: a number, so safe to have;
    /// using it is the caller's `unsafe`, within [`len`](Self::len) elements, ordered on
    /// [`stream`](Self::stream), while the array lives.
    pub fn device_address(&self) -> u64 {
        self.parts().0.address()
    }

    /// The device address, for FFI. The address is valid while the array lives; reading or
    /// writing through it is the caller's `unsafe`, ordered on [`stream`](Self::stream).
    ///
    /// # Safety
    /// The caller must not use the pointer past the array's life, outside its `len` elements,
    /// or (for writes) while any shared borrow of the array is used.
    pub unsafe fn as_raw(&self) -> *const T {
        self.buf().address() as *const T
    }

    pub(crate) fn live(&self, who: &'static str) -> Result<()> {
        if self.resources.is_released() {
            Err(raft_exit::closed_or(Error::released(who, self.resources.device())))
        } else {
            Ok(())
        }
    }

    /// Sets every byte to zero on the array's stream; returns once queued (see
    /// [`zeros`](Self::zeros)).
    ///
    /// # Errors
    /// `Logic` on released resources or while the stream is being captured into a CUDA graph.
    pub fn fill_zero(&mut self) -> Result<()> {
        const WHO: &str = "DeviceVec::fill_zero";
        self.live(WHO)?;
        crate::result::copy::zero_ordered(WHO, self.buf_mut())
    }

    pub(crate) fn same_len(&self, who: &'static str, other: usize) -> Result<()> {
        if other != self.len {
            return Err(Error::logic(who, format!("expected {} elements, given {other}", self.len)));
        }
        Ok(())
    }

    /// The buffer and the record of its uses on other streams, for views, which order their
    /// uses themselves (`views.rs`).
    pub(crate) fn parts(&self) -> (&NativeBuffer, &ForeignUses) {
        (self.buffer.as_ref().expect("a DeviceVec holds its buffer until dropped"), &self.foreign)
    }

    /// Keeps the array's memory (with the resource and stream handles its buffer holds) for the
    /// process's life and lets the rest go as a drop does (its resources, its counts): for a
    /// free that could not be ordered after work that may still use the memory.
    pub(crate) fn leak_memory(mut self) {
        if let Some(buffer) = self.buffer.take() {
            buffer.leak();
        }
    }

    pub(crate) fn native(&self) -> &NativeBuffer {
        self.buf()
    }

    pub(crate) fn native_mut(&mut self) -> &mut NativeBuffer {
        self.buf_mut()
    }
}

impl<T: DeviceScalar> Drop for DeviceVec<T> {
    fn drop(&mut self) {
        crate::stats::live_arrays::add(-1);
        let Some(buffer) = self.buffer.take() else { return };
        if !raft_exit::native_release_allowed() {
            buffer.leak(); // no CUDA call once the exit has decided: leaked to the OS
            return;
        }
        // Freed in the order of its own stream, after what other streams queued on it.
        if let Err(e) = self.foreign.settle_all("DeviceVec::drop", buffer.stream()) {
            // Leaked first: a logger that panics must not drop the buffer (and with it, maybe, the
            // last handle of its resource) under that use.
            buffer.leak();
            log::warn!(target: "raft", "{e} (the array is leaked: a use on another stream may still run)");
            return;
        }
        if buffer.frees_stream_ordered() {
            // The async pool frees in stream order without blocking: do it here.
            if let Err(e) = buffer.free("DeviceVec::drop", Some(self.resources.capture_flag())) {
                log::warn!(target: "raft", "{e}");
            }
            return;
        }
        // Another resource may block in its free (cudaFree synchronises the device): hand it to a
        // release thread, counted by the exit machinery like any release.
        let label = raft_exit::Label { what: "release of array", id: raft_exit::next_id(), device: Some(self.resources.device()) };
        // Counted as memory pending release on its device: backpressure and the out-of-memory
        // retry see it.
        let held = crate::release::Held { streams: 0, handles: 0, bytes: (self.len * std::mem::size_of::<T>()) as u64 };
        crate::release::enqueue_holding(
            label,
            held,
            Box::new(move || {
                if !raft_exit::native_release_allowed() {
                    buffer.leak();
                } else if let Err(e) = buffer.free("DeviceVec::drop", None) {
                    log::warn!(target: "raft", "{e}");
                }
            }),
        );
    }
}

impl<T: DeviceScalar> std::fmt::Debug for DeviceVec<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceVec").field("len", &self.len).field("device", &self.resources.device()).finish()
    }
}

/// An array means its resources.
impl<T: DeviceScalar> AsResources for DeviceVec<T> {
    fn as_resources(&self) -> Result<DeviceResources> {
        Ok(self.resources().clone())
    }

    fn as_device(&self) -> Result<usize> {
        Ok(self.resources().device())
    }
}

impl<T: DeviceScalar> DeviceSlice<T> for DeviceVec<T> {
    fn len(&self) -> usize {
        self.len
    }

    fn stream(&self) -> &Arc<CudaStream> {
        DeviceVec::stream(self)
    }
}

/// On another stream than the array's own, `stream` first waits for the array's stream, and the
/// guard records an event on `stream` once the use is queued, which the array's own stream waits
/// for (on the device) before its next use of the array and before the array is freed (see
/// `result/foreign.rs`). Panics when either stream is being captured into a CUDA graph.
impl<T: DeviceScalar> DevicePtr<T> for DeviceVec<T> {
    fn device_ptr<'a>(&'a self, stream: &'a CudaStream) -> (CUdeviceptr, SyncOnDrop<'a>) {
        self.try_device_ptr(stream).unwrap_or_else(|e| panic!("{e}"))
    }
}

impl<T: DeviceScalar> DevicePtrMut<T> for DeviceVec<T> {
    fn device_ptr_mut<'a>(&'a mut self, stream: &'a CudaStream) -> (CUdeviceptr, SyncOnDrop<'a>) {
        self.try_device_ptr_mut(stream).unwrap_or_else(|e| panic!("{e}"))
    }
}

impl<T: DeviceScalar> DeviceVec<T> {
    /// [`DevicePtr::device_ptr`] with its refusal as an error: the array's address for a read
    /// on `stream`, ordered as the trait's (`stream` waits for the array's stream; the guard
    /// records an event the array's stream waits for before its next write and its free).
    ///
    /// # Errors
    /// `Logic` when `stream` or the array's stream is being captured into a CUDA graph (where
    /// the trait panics): the graph would use the memory at each launch, after the array may be
    /// gone; the driver's error when that question fails.
    pub fn try_device_ptr<'a>(&'a self, stream: &'a CudaStream) -> Result<(CUdeviceptr, SyncOnDrop<'a>)> {
        let buffer = self.buf();
        let guard = self.foreign.guard("DeviceVec::device_ptr", buffer.stream(), self.resources.capture_flag(), stream, false)?;
        Ok((buffer.address(), guard))
    }

    /// [`DevicePtrMut::device_ptr_mut`] with its refusal as an error (see
    /// [`try_device_ptr`](Self::try_device_ptr)): the address for a write on `stream`.
    ///
    /// # Errors
    /// As [`try_device_ptr`](Self::try_device_ptr).
    pub fn try_device_ptr_mut<'a>(&'a mut self, stream: &'a CudaStream) -> Result<(CUdeviceptr, SyncOnDrop<'a>)> {
        // Ordered after every earlier use elsewhere (a write must not overtake their reads).
        self.buf_mut();
        let this: &'a Self = self;
        let buffer = this.buffer.as_ref().expect("a DeviceVec holds its buffer until dropped");
        let guard = this.foreign.guard("DeviceVec::device_ptr_mut", buffer.stream(), this.resources.capture_flag(), stream, true)?;
        Ok((buffer.address(), guard))
    }
}

/// What [`DeviceVec::into_host_job`] gives back: the host copy and the array itself.
pub type HostCopy<T> = Result<(Vec<T>, DeviceVec<T>)>;
