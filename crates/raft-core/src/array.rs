//! `DeviceVec<T>`: typed device memory from the device's current RMM resource, allocated and
//! freed in order on a resources object's stream (an `rmm::device_buffer`).
use crate::device::ContextGuard;
use crate::error::{Error, ErrorKind, Result};
use crate::ffi::check;
use crate::resources::DeviceResources;
use cudarc::driver::CudaStream;
use raft_sys as sys;
use std::ffi::c_void;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Plain numeric types that may live in device memory: `Copy`, no drop, every bit pattern valid.
///
/// # Safety
/// Implement only for types where any bit pattern is a valid value and which own no resources.
pub unsafe trait DeviceScalar: Copy + Default + Send + Sync + 'static {}

macro_rules! scalars {
    ($($t:ty),*) => {$(
        // SAFETY: a primitive number: any bit pattern is a value, nothing to drop.
        unsafe impl DeviceScalar for $t {}
    )*};
}
scalars!(f32, f64, i8, i16, i32, i64, u8, u16, u32, u64);

pub(crate) static LIVE_ARRAYS: AtomicUsize = AtomicUsize::new(0);

struct Buffer(NonNull<sys::raftrs_buffer>);
// SAFETY: an rmm::device_buffer is a pointer, a size, a stream and a resource reference: it
// may move between threads; all use goes through &self (reads) or Drop (exclusive).
unsafe impl Send for Buffer {}
// SAFETY: as above; shared use only reads its fields.
unsafe impl Sync for Buffer {}

/// `len` elements of `T` in device memory, on a resources object's stream.
///
/// Allocated through the device's current RMM resource (the async pool by default) and freed,
/// stream-ordered, when dropped. The array keeps its resources' stream alive; once the resources
/// are released, its operations give the `Logic` error of released resources.
///
/// # Thread safety
/// `Send + Sync`; writes need `&mut self`.
pub struct DeviceVec<T: DeviceScalar> {
    buffer: Buffer,
    /// Freeing never blocks (the async pool): done inline by `Drop`; otherwise on a release thread.
    stream_ordered: bool,
    ptr: *mut T,
    len: usize,
    stream: Arc<CudaStream>,
    resources: DeviceResources,
    _t: PhantomData<T>,
}

// SAFETY: the device pointer is only dereferenced by the GPU, in stream order; the struct owns
// its buffer (see `Buffer`).
unsafe impl<T: DeviceScalar> Send for DeviceVec<T> {}
// SAFETY: shared access only reads device memory (copies to the host) in stream order.
unsafe impl<T: DeviceScalar> Sync for DeviceVec<T> {}
static_assertions::assert_impl_all!(DeviceVec<f32>: Send, Sync);

fn bytes_of<T>(who: &'static str, len: usize) -> Result<usize> {
    len.checked_mul(std::mem::size_of::<T>()).ok_or_else(|| {
        Error::new(ErrorKind::OutOfMemory, who, format!("{len} elements of {} bytes do not fit in memory", std::mem::size_of::<T>()))
    })
}

impl<T: DeviceScalar> DeviceVec<T> {
    /// `len` elements with unspecified contents.
    ///
    /// # Errors
    /// `OutOfMemory` when the allocation fails; `Logic` on released resources.
    pub fn new(resources: &DeviceResources, len: usize) -> Result<Self> {
        Self::alloc("DeviceVec::new", resources, len)
    }

    fn alloc(who: &'static str, resources: &DeviceResources, len: usize) -> Result<Self> {
        let bytes = bytes_of::<T>(who, len)?;
        let _keep = ContextGuard::save(who)?;
        resources.with_live(who, |live| {
            let mut raw = std::ptr::null_mut();
            // SAFETY: the stream is alive under the read lock; `raw` receives a new buffer.
            check(who, unsafe {
                sys::raftrs_buffer_create(resources.device() as i32, live.stream().cu_stream() as *mut c_void, bytes, &mut raw)
            })?;
            let buffer = Buffer(NonNull::new(raw).ok_or_else(|| Error::new(ErrorKind::Generic, who, "the shim returned no buffer"))?);
            // SAFETY: the buffer was just made and is alive.
            let ptr = unsafe { sys::raftrs_buffer_data(buffer.0.as_ptr()) } as *mut T;
            // SAFETY: as above.
            let stream_ordered = unsafe { sys::raftrs_buffer_stream_ordered(buffer.0.as_ptr()) } != 0;
            LIVE_ARRAYS.fetch_add(1, Ordering::Relaxed);
            Ok(DeviceVec { buffer, stream_ordered, ptr, len, stream: live.stream().clone(), resources: resources.clone(), _t: PhantomData })
        })
    }

    /// `len` zeros.
    pub fn zeros(resources: &DeviceResources, len: usize) -> Result<Self> {
        let mut v = Self::alloc("DeviceVec::zeros", resources, len)?;
        v.fill_zero()?;
        Ok(v)
    }

    /// A copy of `host` in device memory.
    pub fn from_host(resources: &DeviceResources, host: &[T]) -> Result<Self> {
        let mut v = Self::alloc("DeviceVec::from_host", resources, host.len())?;
        v.copy_from_host(host)?;
        Ok(v)
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

    /// The stream the array is ordered on (its resources' stream), for cudarc kernels.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The device address, for kernels and FFI (valid while the array lives).
    pub fn device_ptr(&self) -> u64 {
        self.ptr as u64
    }

    /// The device address as a typed pointer.
    pub fn as_ptr(&self) -> *const T {
        self.ptr
    }

    /// The device address as a typed mutable pointer.
    pub fn as_mut_ptr(&mut self) -> *mut T {
        self.ptr
    }

    fn live(&self, who: &'static str) -> Result<()> {
        if self.resources.is_released() {
            Err(Error::released(who, self.resources.device()))
        } else {
            Ok(())
        }
    }

    fn same_len(&self, who: &'static str, other: usize) -> Result<()> {
        if other != self.len {
            return Err(Error::logic(who, format!("expected {} elements, given {other}", self.len)));
        }
        Ok(())
    }

    fn wait(&self, who: &'static str) -> Result<()> {
        // SAFETY: the stream is alive (we hold an Arc); no current context is needed.
        unsafe { cudarc::driver::result::stream::synchronize(self.stream.cu_stream()) }.map_err(|e| Error::driver(who, e))
    }

    /// Sets every byte to zero (stream-ordered; returns once done).
    pub fn fill_zero(&mut self) -> Result<()> {
        const WHO: &str = "DeviceVec::fill_zero";
        self.live(WHO)?;
        let _keep = ContextGuard::save(WHO)?;
        let bytes = self.len * std::mem::size_of::<T>();
        // SAFETY: `ptr` holds `bytes` bytes of device memory owned by this array.
        check(WHO, unsafe {
            sys::raftrs_memset_async(
                self.resources.device() as i32,
                self.ptr as *mut c_void,
                0,
                bytes,
                self.stream.cu_stream() as *mut c_void,
            )
        })?;
        self.wait(WHO)
    }

    /// Copies `host` into the array (stream-ordered; returns once done).
    ///
    /// # Errors
    /// `Logic` when the lengths differ or the resources were released.
    pub fn copy_from_host(&mut self, host: &[T]) -> Result<()> {
        const WHO: &str = "DeviceVec::copy_from_host";
        self.live(WHO)?;
        let _keep = ContextGuard::save(WHO)?;
        self.same_len(WHO, host.len())?;
        let bytes = std::mem::size_of_val(host);
        // SAFETY: both ranges hold `bytes` bytes; the host slice outlives the copy, which is
        // waited for before returning.
        check(WHO, unsafe {
            sys::raftrs_memcpy_async(
                self.resources.device() as i32,
                self.ptr as *mut c_void,
                host.as_ptr() as *const c_void,
                bytes,
                self.stream.cu_stream() as *mut c_void,
            )
        })?;
        self.wait(WHO)
    }

    /// Copies the array into `host` (stream-ordered; returns once done).
    ///
    /// # Errors
    /// `Logic` when the lengths differ or the resources were released.
    pub fn copy_to_host(&self, host: &mut [T]) -> Result<()> {
        const WHO: &str = "DeviceVec::copy_to_host";
        self.live(WHO)?;
        let _keep = ContextGuard::save(WHO)?;
        self.same_len(WHO, host.len())?;
        let bytes = std::mem::size_of_val(host);
        // SAFETY: both ranges hold `bytes` bytes; the host slice outlives the copy, which is
        // waited for before returning.
        check(WHO, unsafe {
            sys::raftrs_memcpy_async(
                self.resources.device() as i32,
                host.as_mut_ptr() as *mut c_void,
                self.ptr as *const c_void,
                bytes,
                self.stream.cu_stream() as *mut c_void,
            )
        })?;
        self.wait(WHO)
    }

    /// The array's contents on the host.
    pub fn to_host(&self) -> Result<Vec<T>> {
        let mut host = vec![T::default(); self.len];
        self.copy_to_host(&mut host).map_err(|e| e.with_who("DeviceVec::to_host"))?;
        Ok(host)
    }

    /// Copies the array to the host on its resources' worker thread: the job owns the array and
    /// gives it back with the host copy.
    pub fn into_host_job(self) -> Result<crate::JobHandle<HostCopy<T>>> {
        let resources = self.resources.clone();
        resources.spawn(move || self.to_host().map(|h| (h, self)))
    }

    /// A 2-D view of `rows × cols` elements in `layout`, for matrix routines.
    ///
    /// # Errors
    /// `Logic` when `rows × cols` is not the array's length.
    pub fn matrix(&self, rows: usize, cols: usize, layout: Layout) -> Result<MatrixView<'_, T>> {
        if rows.checked_mul(cols) != Some(self.len) {
            return Err(Error::logic(
                "DeviceVec::matrix",
                format!("a {rows}×{cols} matrix needs {} elements, the array has {}", rows.saturating_mul(cols), self.len),
            ));
        }
        Ok(MatrixView { data: self, rows, cols, layout })
    }

    /// A mutable 2-D view (see [`matrix`](Self::matrix)).
    pub fn matrix_mut(&mut self, rows: usize, cols: usize, layout: Layout) -> Result<MatrixViewMut<'_, T>> {
        if rows.checked_mul(cols) != Some(self.len) {
            return Err(Error::logic(
                "DeviceVec::matrix_mut",
                format!("a {rows}×{cols} matrix needs {} elements, the array has {}", rows.saturating_mul(cols), self.len),
            ));
        }
        Ok(MatrixViewMut { data: self, rows, cols, layout })
    }
}

/// Frees a buffer stream-ordered on `stream`, keeping the caller's CUDA context.
fn free(buffer: &Buffer, stream: &CudaStream) {
    let _keep = ContextGuard::save("DeviceVec::drop");
    // SAFETY: the buffer is freed exactly once (its owner is being dropped), stream-ordered on a
    // stream kept alive by the caller's Arc; the shim catches every exception.
    let status = unsafe { sys::raftrs_buffer_destroy(buffer.0.as_ptr(), stream.cu_stream() as *mut c_void) };
    if let Err(e) = check("DeviceVec::drop", status) {
        log::warn!(target: "raft", "{e}");
    }
}

impl<T: DeviceScalar> Drop for DeviceVec<T> {
    fn drop(&mut self) {
        LIVE_ARRAYS.fetch_sub(1, Ordering::Relaxed);
        if !raft_exit::native_release_allowed() {
            return; // leaked to the OS: no CUDA call once the exit has decided
        }
        if self.stream_ordered {
            // The async pool frees in stream order without blocking: do it here.
            free(&self.buffer, &self.stream);
            return;
        }
        // Another resource may block in its free (cudaFree synchronises the device): hand it to a
        // release thread, counted by the exit machinery like any release.
        let (buffer, stream) = (Buffer(self.buffer.0), self.stream.clone());
        let label = raft_exit::Label { what: "release of array", id: raft_exit::next_id(), device: Some(self.resources.device()) };
        crate::release::enqueue(label, Box::new(move || free(&buffer, &stream)));
    }
}

impl<T: DeviceScalar> std::fmt::Debug for DeviceVec<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceVec").field("len", &self.len).field("device", &self.resources.device()).finish()
    }
}

/// What [`DeviceVec::into_host_job`] gives back: the host copy and the array itself.
pub type HostCopy<T> = Result<(Vec<T>, DeviceVec<T>)>;

/// How a matrix's elements follow each other in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Rows one after another (C order).
    RowMajor,
    /// Columns one after another (Fortran order, cuBLAS's own).
    ColMajor,
}

/// A read-only `rows × cols` view of a [`DeviceVec`].
#[derive(Debug, Clone, Copy)]
pub struct MatrixView<'a, T: DeviceScalar> {
    /// The elements.
    pub data: &'a DeviceVec<T>,
    /// Rows.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
    /// Order in memory.
    pub layout: Layout,
}

/// A mutable `rows × cols` view of a [`DeviceVec`].
#[derive(Debug)]
pub struct MatrixViewMut<'a, T: DeviceScalar> {
    /// The elements.
    pub data: &'a mut DeviceVec<T>,
    /// Rows.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
    /// Order in memory.
    pub layout: Layout,
}
