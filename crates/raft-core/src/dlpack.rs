//! DLPack 1.x: device arrays handed to other libraries (PyTorch, CuPy, JAX, candle, …) and
//! theirs taken in, without a copy.
//!
//! **Export.** [`DeviceVec::into_dlpack`] / [`DeviceMatrix::into_dlpack`]
//! move the array into a [`DlpackExport`]; [`into_raw`](DlpackExport::into_raw) (versioned) or
//! [`into_raw_unversioned`](DlpackExport::into_raw_unversioned) hand it over as a managed tensor
//! whose deleter drops the array the way any array drops (stream-ordered free, or a release
//! thread; after the exit has decided, leaked to the OS), from any thread. The tensor's device
//! type is the memory's, as the driver describes it ([`DlpackExport::device`]): `kDLCUDA`,
//! or `kDLCUDAHost` / `kDLCUDAManaged` / `kDLCPU` for an array of a pinned-host, managed or
//! system-memory resource.
//! Before handing over,
//! order the consumer: [`order_before_stream`](DlpackExport::order_before_stream) (the consumer's
//! stream of `__dlpack__(stream=...)`: the consumer's stream waits for the array's work) or
//! [`synchronize`](DlpackExport::synchronize). Either way, and also with neither (`stream=-1`),
//! the deleter orders the array's free after the work queued so far on the legacy default
//! stream, which waits for every blocking stream of the context (PyTorch's default stream,
//! CuPy's streams): work a consumer queued on a non-blocking stream of its own is the
//! consumer's to finish before it lets the tensor go, as DLPack leaves it.
//!
//! **Import.** [`DlpackTensor::from_raw`] / [`from_raw_unversioned`](DlpackTensor::from_raw_unversioned)
//! take another library's managed tensor, check it (device type and id, dtype, shape, strides,
//! byte offset, alignment: a `Logic` error for anything that cannot be viewed, never a wrong
//! view), keep its producer alive and call its deleter exactly once when dropped, or at once when
//! refused. A read-only tensor gives no mutable access. The caller orders the producer's work
//! before its own use (the `__dlpack__(stream=...)` handshake with the consumer's stream, or a
//! synchronisation).
use crate::array::DeviceVec;
use crate::error::{Error, Result};
use crate::matrix::{DeviceMatrix, Layout};
use crate::result::dlpack::{self as dl, Checked, DLDataType, Exported, Foreign, Order};
use crate::result::gemm::GemmScalar;
use crate::result::DeviceScalar;
use std::marker::PhantomData;
use std::ptr::NonNull;

pub use crate::result::dlpack::{
    DLDataType as DlDataType, DLDevice, DLManagedTensor, DLManagedTensorVersioned, DLPackVersion, DLTensor, DLPACK_FLAG_BITMASK_IS_COPIED,
    DLPACK_FLAG_BITMASK_READ_ONLY, DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION, KDL_BFLOAT, KDL_CPU, KDL_CUDA, KDL_CUDA_HOST,
    KDL_CUDA_MANAGED, KDL_FLOAT, KDL_INT, KDL_UINT,
};

/// Element types with a DLPack dtype (one lane). Sealed: the dtype's width must be the type's.
pub trait DlpackElement: DeviceScalar + sealed::Sealed {
    /// The type's `DLDataType`.
    const DTYPE: DLDataType;
}

mod sealed {
    pub trait Sealed {}
}

macro_rules! elements {
    ($($t:ty => $code:expr),*) => {$(
        impl sealed::Sealed for $t {}
        impl DlpackElement for $t {
            const DTYPE: DLDataType = DLDataType { code: $code, bits: (std::mem::size_of::<$t>() * 8) as u8, lanes: 1 };
        }
    )*};
}
elements!(f32 => dl::KDL_FLOAT, f64 => dl::KDL_FLOAT, half::f16 => dl::KDL_FLOAT, half::bf16 => dl::KDL_BFLOAT,
    i8 => dl::KDL_INT, i16 => dl::KDL_INT, i32 => dl::KDL_INT, i64 => dl::KDL_INT,
    u8 => dl::KDL_UINT, u16 => dl::KDL_UINT, u32 => dl::KDL_UINT, u64 => dl::KDL_UINT);

fn extent(who: &'static str, n: usize) -> Result<i64> {
    i64::try_from(n).map_err(|_| Error::logic(who, format!("{n} does not fit DLPack's 64-bit shape")))
}

impl<T: DlpackElement> DeviceVec<T> {
    /// The array as a 1-D DLPack tensor of `len` elements, owning it.
    ///
    /// # Errors
    /// `Logic` on released resources; `Cuda` when the driver cannot describe the memory.
    pub fn into_dlpack(self) -> Result<DlpackExport> {
        const WHO: &str = "DeviceVec::into_dlpack";
        self.live(WHO)?;
        let shape = [extent(WHO, self.len())?, 0];
        self.export(WHO, 1, shape, None)
    }

    /// The array as a 2-D `rows × cols` DLPack tensor in `layout` (row-major: C order, null
    /// strides; column-major: strides `[1, rows]`), owning it: [`DeviceMatrix::into_dlpack`].
    fn into_dlpack_2d(self, rows: usize, cols: usize, layout: Layout) -> Result<DlpackExport> {
        const WHO: &str = "DeviceMatrix::into_dlpack";
        self.live(WHO)?;
        self.matrix(rows, cols, layout).map_err(|e| Error::logic(WHO, e.message().to_string()))?;
        let (r, c) = (extent(WHO, rows)?, extent(WHO, cols)?);
        let strides = match layout {
            Layout::RowMajor => None,
            Layout::ColMajor => Some([1, r]),
        };
        self.export(WHO, 2, [r, c], strides)
    }

    fn export(mut self, who: &'static str, ndim: i32, shape: [i64; 2], strides: Option<[i64; 2]>) -> Result<DlpackExport> {
        // Every use on other streams (reads included: the consumer may write) is ordered before
        // the array's stream first; the consumer is then ordered after that stream.
        let data = self.native_mut().address();
        let (stream, device) = (self.stream().clone(), self.resources().device());
        let inner = Exported::new(who, Box::new(self), stream, data, device, T::DTYPE, ndim, shape, strides)?;
        Ok(DlpackExport { inner: Some(inner), read_only: false })
    }
}

/// What an export owns, as the result layer sees it: kept after a failed order, only the
/// array's memory stays (its resources, stream and counts go as in any drop).
impl<T: DeviceScalar> dl::KeepMemory for DeviceVec<T> {
    fn keep_memory(self: Box<Self>) {
        (*self).leak_memory();
    }
}

impl<T: DlpackElement> DeviceMatrix<T> {
    /// The matrix as a 2-D DLPack tensor (row-major: C order, null strides; column-major:
    /// strides `[1, rows]`), owning its array.
    ///
    /// # Errors
    /// `Logic` on released resources; `Cuda` when the driver cannot describe the memory.
    pub fn into_dlpack(self) -> Result<DlpackExport> {
        let (rows, cols, layout) = (self.rows(), self.cols(), self.layout());
        self.into_vec().into_dlpack_2d(rows, cols, layout)
    }
}

/// A device array on its way to another library as a DLPack tensor (see the [module](self)).
/// Dropped without being handed over, it drops the array.
///
/// # Thread safety
/// `Send`; the raw tensor it becomes may be deleted from any thread.
pub struct DlpackExport {
    inner: Option<Exported>,
    read_only: bool,
}

static_assertions::assert_impl_all!(DlpackExport: Send);

impl DlpackExport {
    fn inner(&self) -> &Exported {
        self.inner.as_ref().expect("a DlpackExport holds its tensor until handed over")
    }

    /// The device address of the first element (the tensor's `data`; its `byte_offset` is 0).
    pub fn data_ptr(&self) -> u64 {
        self.inner().data()
    }

    /// DLPack's device of the memory, as the driver describes it (what `__dlpack_device__`
    /// answers): [`KDL_CUDA`] and the array's device for device memory, [`KDL_CUDA_MANAGED`]
    /// and the device for an array of a managed resource, [`KDL_CUDA_HOST`] and 0 for one of a
    /// pinned-host resource, [`KDL_CPU`] and 0 for memory the driver does not know (a
    /// system-memory resource). An empty array is [`KDL_CUDA`].
    pub fn device(&self) -> DLDevice {
        self.inner().device()
    }

    /// The tensor's shape.
    pub fn shape(&self) -> &[i64] {
        self.inner().shape()
    }

    /// The tensor's strides in elements; `None` for C order (DLPack's null strides).
    pub fn strides(&self) -> Option<&[i64]> {
        self.inner().strides()
    }

    /// Marks the tensor read-only (`DLPACK_FLAG_BITMASK_READ_ONLY`, versioned tensors only).
    pub fn read_only(mut self) -> Self {
        self.read_only = true;
        self
    }

    /// Waits until the array's work so far is done: the data is then ready for any stream (the
    /// `__dlpack__(stream=None)` case). The free, at the deleter, is ordered after the legacy
    /// default stream's work, where such a consumer works (see the [module](self)).
    ///
    /// # Errors
    /// `Logic` while the array's stream is being captured into a CUDA graph (the driver would
    /// refuse the wait and invalidate the capture); `Cuda` when the stream's work failed.
    pub fn synchronize(&self) -> Result<()> {
        self.inner().synchronize("DlpackExport::synchronize")
    }

    /// Orders the consumer's `stream` (a raw `CUstream`, as `__dlpack__(stream=...)` gives it;
    /// 1 and 2 name the legacy and per-thread default streams) after the array's work so far,
    /// on the device (no host wait). `stream` is used during this call only: the deleter never
    /// names it (DLPack has the consumer keep it alive for the handshake only; CuPy destroys its
    /// streams when collected). The free is then ordered, on the device, after the legacy
    /// default stream at the deleter, which waits for the work queued so far on every blocking
    /// stream of the context: the default streams (PyTorch's default stream) and streams made
    /// without `CU_STREAM_NON_BLOCKING` (CuPy's). A consumer working on a non-blocking stream
    /// of its own (a PyTorch side stream) finishes or orders that work before it lets the
    /// tensor go, as DLPack leaves it to the consumer. A consumer's stream being captured into a
    /// CUDA graph (PyTorch's `from_dlpack` inside `torch.cuda.graph`) while the array's own is
    /// not gets a host wait for the array's work instead: the driver refuses a captured wait for
    /// work outside the capture, and invalidates the capture.
    ///
    /// # Safety
    /// `stream` is 1, 2 or a live stream of the array's device, for the duration of the call.
    ///
    /// # Errors
    /// `Logic` for stream 0 (ambiguous for CUDA); `Cuda` when the driver refuses the event or
    /// the wait (the array's stream and the consumer's captured into two different graphs).
    pub unsafe fn order_before_stream(&mut self, stream: usize) -> Result<()> {
        const WHO: &str = "DlpackExport::order_before_stream";
        let inner = self.inner.as_mut().expect("a DlpackExport holds its tensor until handed over");
        // SAFETY: the caller's contract is the one `order_before` asks.
        unsafe { inner.order_before(WHO, stream) }
    }

    /// Hands the tensor over as a `DLManagedTensorVersioned` (DLPack 1.x): the receiver owns it
    /// and calls its deleter exactly once.
    pub fn into_raw(mut self) -> *mut DLManagedTensorVersioned {
        let e = self.inner.take().expect("a DlpackExport holds its tensor until handed over");
        e.into_raw(self.read_only).as_ptr()
    }

    /// Hands the tensor over as an unversioned `DLManagedTensor` (DLPack 0.x consumers; it has
    /// no read-only flag).
    pub fn into_raw_unversioned(mut self) -> *mut DLManagedTensor {
        let e = self.inner.take().expect("a DlpackExport holds its tensor until handed over");
        e.into_raw_unversioned().as_ptr()
    }
}

impl Drop for DlpackExport {
    fn drop(&mut self) {
        if let Some(e) = self.inner.take() {
            e.release();
        }
    }
}

impl std::fmt::Debug for DlpackExport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.inner {
            Some(e) => f.debug_struct("DlpackExport").field("shape", &e.shape()).field("strides", &e.strides()).finish(),
            None => f.write_str("DlpackExport(handed over)"),
        }
    }
}

/// Another library's DLPack tensor of `T`, viewed in place (see the [module](self)): owned
/// until dropped, when its producer's deleter runs, exactly once.
///
/// # Thread safety
/// `Send + Sync` (DLPack lets a consumer delete a tensor from any of its threads).
pub struct DlpackTensor<T: DlpackElement> {
    view: Checked,
    device: usize,
    /// Last field: the producer's memory outlives every use of the view above.
    _foreign: Foreign,
    _t: PhantomData<T>,
}

static_assertions::assert_impl_all!(DlpackTensor<f32>: Send, Sync);

impl<T: DlpackElement> DlpackTensor<T> {
    /// Takes a `DLManagedTensorVersioned` of device `device`: checked, and owned from here on,
    /// also when refused (its deleter then runs before this returns).
    ///
    /// # Safety
    /// `tensor` is null or a valid managed tensor whose ownership passes here (nobody else calls
    /// its deleter); its `data` is memory of the extent it describes, valid until the deleter
    /// runs; the producer's work on it is ordered before the caller's use (`__dlpack__(stream=)`
    /// given the stream the caller will use, or a synchronisation).
    ///
    /// # Errors
    /// `Logic` for a null pointer, another DLPack major version, a device that is not CUDA
    /// memory (`kDLCUDA`, `kDLCUDAManaged`) of `device`, another dtype than `T`'s, a negative or
    /// overflowing shape, strides that are not C or Fortran order, a null `data`, a
    /// `data + byte_offset` not aligned to `T`.
    pub unsafe fn from_raw(tensor: *mut DLManagedTensorVersioned, device: usize) -> Result<Self> {
        const WHO: &str = "DlpackTensor::from_raw";
        let p = NonNull::new(tensor).ok_or_else(|| Error::logic(WHO, "a null tensor"))?;
        // SAFETY: the caller's contract.
        Self::take(WHO, unsafe { Foreign::versioned(p) }, device)
    }

    /// Takes an unversioned `DLManagedTensor` (see [`from_raw`](Self::from_raw); never read-only:
    /// DLPack 0.x has no flags).
    ///
    /// # Safety
    /// As [`from_raw`](Self::from_raw).
    pub unsafe fn from_raw_unversioned(tensor: *mut DLManagedTensor, device: usize) -> Result<Self> {
        const WHO: &str = "DlpackTensor::from_raw_unversioned";
        let p = NonNull::new(tensor).ok_or_else(|| Error::logic(WHO, "a null tensor"))?;
        // SAFETY: the caller's contract.
        Self::take(WHO, unsafe { Foreign::unversioned(p) }, device)
    }

    fn take(who: &'static str, foreign: Foreign, device: usize) -> Result<Self> {
        // A refusal drops `foreign` here: the producer's deleter runs once, now.
        let view = dl::check(who, &foreign.describe(who)?, device, T::DTYPE, std::mem::size_of::<T>())?;
        Ok(DlpackTensor { view, device, _foreign: foreign, _t: PhantomData })
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.view.len
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.view.len == 0
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.view.shape
    }

    /// The device.
    pub fn device(&self) -> usize {
        self.device
    }

    /// Whether the producer marked it read-only.
    pub fn is_read_only(&self) -> bool {
        self.view.read_only
    }

    /// A 2-D tensor's `(rows, cols, layout)`; a 1-D one is a row. `None` above 2 dimensions.
    pub fn matrix_shape(&self) -> Option<(usize, usize, Layout)> {
        let layout = match self.view.order {
            Order::C => Layout::RowMajor,
            Order::F => Layout::ColMajor,
        };
        match self.view.shape[..] {
            [] => Some((1, 1, Layout::RowMajor)),
            [n] => Some((1, n, Layout::RowMajor)),
            [r, c] => Some((r, c, layout)),
            _ => None,
        }
    }

    /// The device address of the first element (`data + byte_offset`), for reads. Using it is
    /// the caller's `unsafe`, within [`len`](Self::len) elements, while the tensor lives.
    pub fn data_ptr(&self) -> u64 {
        self.view.data
    }

    /// The address for writes.
    ///
    /// # Errors
    /// `Logic` when the producer marked the tensor read-only.
    pub fn data_ptr_mut(&mut self) -> Result<u64> {
        if self.view.read_only {
            return Err(Error::logic("DlpackTensor::data_ptr_mut", "the producer marked the tensor read-only"));
        }
        Ok(self.view.data)
    }

    pub(crate) fn view(&self) -> &Checked {
        &self.view
    }
}

impl<T: DlpackElement> std::fmt::Debug for DlpackTensor<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DlpackTensor")
            .field("shape", &self.view.shape)
            .field("device", &self.device)
            .field("read_only", &self.view.read_only)
            .finish()
    }
}

/// `alpha · A · B` of two imported matrices (1-D tensors are rows) into a new row-major `m × n`
/// matrix on `resources`, through their cuBLAS handle. Returns once the product is done (the
/// imports may then be dropped: their producers' frees are not ordered on this stream).
///
/// # Errors
/// `Logic` when the shapes do not chain, a tensor has more than 2 dimensions or is on another
/// device than the resources, or when the driver does not know the first or last byte of a
/// tensor as device memory of that device (or managed memory); as [`gemm`](crate::gemm)
/// otherwise.
pub fn gemm_dlpack<T: GemmScalar + DlpackElement>(
    resources: &crate::DeviceResources,
    alpha: T,
    a: &DlpackTensor<T>,
    b: &DlpackTensor<T>,
) -> Result<DeviceMatrix<T>> {
    const WHO: &str = "gemm_dlpack";
    let dims = |t: &DlpackTensor<T>| {
        t.matrix_shape().ok_or_else(|| Error::logic(WHO, format!("a tensor of shape {:?} is not a matrix", t.shape())))
    };
    let ((m, k, la), (kb, n, lb)) = (dims(a)?, dims(b)?);
    if kb != k {
        return Err(Error::logic(WHO, format!("shapes do not chain: A {m}×{k}, B {kb}×{n}")));
    }
    for d in [a.device(), b.device()] {
        if d != resources.device() {
            return Err(Error::logic(WHO, format!("a tensor on device {d}, resources on device {}", resources.device())));
        }
    }
    let len = m.checked_mul(n).ok_or_else(|| Error::logic(WHO, format!("a {m}×{n} product overflows")))?;
    // What the producers say their memory is, asked of the driver before cuBLAS reads it.
    let ctx = resources.context().clone(); // not `stream()`: nothing leaves the library here
    for t in [a, b] {
        dl::check_memory(WHO, &ctx, t.view(), resources.device())?;
    }
    crate::gemm::cublas_handle_for_a_gemm(WHO, resources)?;
    let mut c = DeviceVec::<T>::alloc(WHO, resources, None, len)?;
    resources.with_native(WHO, |native| {
        // Row-major C is column-major Cᵀ = Bᵀ·Aᵀ; a row-major operand is, stored, its transpose.
        fn op(v: &Checked, rows: usize, cols: usize, l: Layout) -> crate::result::gemm::Foreign<'_> {
            let row = l == Layout::RowMajor;
            let (sr, sc) = if row { (cols, rows) } else { (rows, cols) };
            crate::result::gemm::Foreign { view: v, stored_rows: sr, stored_cols: sc, ld: sr.max(1), transposed: !row }
        }
        let (ob, oa) = (op(b.view(), k, n, lb), op(a.view(), m, k, la));
        let ran = crate::result::gemm::gemm_foreign(WHO, native, n, m, k, alpha, &ob, &oa, c.native_mut(), n.max(1));
        // The producers' memory may go once this returns (their deleters), also after a GEMM that
        // failed in cuBLAS, which may have launched part of its work: waited for either way, and
        // a wait that failed for another reason than a dead context stops the process
        // (`waited_for_borrow`). A refusal (`Logic`: checks, a capturing stream) queued nothing.
        if ran.as_ref().is_err_and(|e| e.kind() == crate::error::ErrorKind::Logic) {
            return ran;
        }
        let waited = crate::result::waited_for_borrow(WHO, crate::result::stream_sync(WHO, native.stream()));
        ran.and(waited)
    })?;
    DeviceMatrix::from_vec(c, m, n, Layout::RowMajor)
}
