//! DLPack's C types (dlpack.h 1.x, versioned and unversioned managed tensors) and the FFI of
//! handing tensors over: the deleters this library gives out, the reading of another library's
//! tensor, the one call of its deleter, and the stream orders of both directions.
//!
//! The header's types are written out here rather than taken from a crate: `dlpark` (0.10)
//! needs Rust 1.88 (the workspace's floor is 1.80) and its own cudarc and pyo3 versions, and
//! the header is a few stable `repr(C)` structs (the ABI DLPack promises to keep within a major
//! version).
use super::{bind, ContextGuard};
use crate::error::{Error, Result};
use cudarc::driver::{result as cu, sys as cusys, CudaContext, CudaStream};
use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::Arc;

/// `DLPACK_MAJOR_VERSION` / `DLPACK_MINOR_VERSION` this library speaks.
pub const DLPACK_MAJOR_VERSION: u32 = 1;
pub const DLPACK_MINOR_VERSION: u32 = 1;
/// `DLPACK_FLAG_BITMASK_READ_ONLY`: the consumer must not write.
pub const DLPACK_FLAG_BITMASK_READ_ONLY: u64 = 1 << 0;
/// `DLPACK_FLAG_BITMASK_IS_COPIED`: the producer copied the data for this tensor.
pub const DLPACK_FLAG_BITMASK_IS_COPIED: u64 = 1 << 1;

/// `DLDeviceType` values this library names (a C enum: kept as its `int`, never a Rust enum,
/// so an unknown value from another library is a number, not undefined behaviour).
pub const KDL_CPU: i32 = 1;
pub const KDL_CUDA: i32 = 2;
pub const KDL_CUDA_HOST: i32 = 3;
pub const KDL_CUDA_MANAGED: i32 = 13;

/// `DLDataTypeCode` values.
pub const KDL_INT: u8 = 0;
pub const KDL_UINT: u8 = 1;
pub const KDL_FLOAT: u8 = 2;
pub const KDL_BFLOAT: u8 = 4;

/// `DLPackVersion`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DLPackVersion {
    pub major: u32,
    pub minor: u32,
}

/// `DLDevice`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DLDevice {
    pub device_type: i32,
    pub device_id: i32,
}

/// `DLDataType`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DLDataType {
    pub code: u8,
    pub bits: u8,
    pub lanes: u16,
}

/// `DLTensor`.
#[repr(C)]
#[derive(Debug)]
pub struct DLTensor {
    pub data: *mut c_void,
    pub device: DLDevice,
    pub ndim: i32,
    pub dtype: DLDataType,
    pub shape: *mut i64,
    pub strides: *mut i64,
    pub byte_offset: u64,
}

/// `DLManagedTensor` (DLPack before 1.0, still what many consumers take).
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensor {
    pub dl_tensor: DLTensor,
    pub manager_ctx: *mut c_void,
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// `DLManagedTensorVersioned` (DLPack 1.x).
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensorVersioned {
    pub version: DLPackVersion,
    pub manager_ctx: *mut c_void,
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    pub flags: u64,
    pub dl_tensor: DLTensor,
}

// The layouts of dlpack.h on a 64-bit target.
static_assertions::const_assert_eq!(std::mem::size_of::<DLTensor>(), 48);
static_assertions::const_assert_eq!(std::mem::size_of::<DLManagedTensor>(), 64);
static_assertions::const_assert_eq!(std::mem::size_of::<DLManagedTensorVersioned>(), 80);

// ---- export ----------------------------------------------------------------------------------

/// What an exported tensor keeps alive: the array (type-erased: this layer cannot name it; its
/// `Drop` routes the free) and the arrays the tensor's `shape` / `strides` point into.
struct Owned {
    /// The array's stream (its free is ordered there) and its context. Declared first: dropped
    /// before the array, so the array's own drop holds the stream's last handle, and binds and
    /// restores contexts as it does for any array.
    stream: Arc<CudaStream>,
    owner: Option<Box<dyn KeepMemory>>,
    shape: [i64; 2],
    strides: [i64; 2],
    /// The tensor was handed over (`into_raw*`), or a consumer named a stream other than the
    /// array's own: the free is ordered after the legacy default stream at the deleter (see
    /// [`Owned::release`]). A consumer that named no stream (`__dlpack__(stream=None)`, whose
    /// work then goes to the legacy default stream, or `-1`) is ordered so too: the seventeenth
    /// audit found its work racing the array's next owner.
    consumed: bool,
}

/// The array an export owns, as this layer sees it: dropped, it frees its memory (its own
/// `Drop`); kept, it keeps only its memory, for the process's life, and lets everything else go.
pub(crate) trait KeepMemory: Send {
    fn keep_memory(self: Box<Self>);
}

impl Owned {
    /// Lets the array go after its consumers' work so far. The deleter never names a stream a
    /// consumer gave at the handshake: DLPack has the consumer keep that stream alive for the
    /// `__dlpack__` call only (CuPy destroys its streams when collected; a
    /// `torch.cuda.ExternalStream` is anyone's), and a destroyed handle cannot be told from a
    /// live one. The free is ordered, on the device, after an event recorded on the legacy
    /// default stream (1), which waits for the work queued so far on every blocking stream of
    /// the context: the legacy and per-thread default streams (PyTorch's default stream) and
    /// streams made without `CU_STREAM_NON_BLOCKING` (CuPy's). Work a consumer queued on a
    /// non-blocking stream of its own (a PyTorch side stream) is the consumer's to finish or
    /// order before it lets the tensor go, as DLPack leaves it. A failed order, or one a capture
    /// in progress on the context stands in the way of, keeps the array's memory (not the rest)
    /// for the process's life, unless the context is dead.
    /// Never panics (it runs inside an `extern "C"` deleter, on any thread).
    fn release(self) {
        let Owned { stream, owner, consumed, .. } = self;
        if consumed && raft_exit::native_release_allowed() {
            let ordered = match capture_in_the_way(DELETER, &stream) {
                Ok(false) => order(DELETER, stream.context(), 1, stream.cu_stream() as usize),
                Ok(true) => Err(Error::logic(
                    DELETER,
                    "a stream of the array's context is being captured into a CUDA graph: the free cannot be ordered after \
                     the consumer's work without joining or breaking that capture",
                )),
                Err(e) => Err(e),
            };
            if let Err(e) = ordered {
                if !super::context_is_dead(&e) && !super::already_gone(&e) {
                    // Kept first: a logger that panics must not free the array under the
                    // consumer's work (the deleter's `catch_unwind` would drop the owner).
                    drop(stream);
                    if let Some(owner) = owner {
                        owner.keep_memory();
                    }
                    log::warn!(target: "raft", "{e} (the array's memory is kept: the consumer's work may still use it)");
                    return;
                }
            }
        }
        drop(stream);
        drop(owner);
    }
}

const DELETER: &str = "DLPack deleter";

/// A versioned managed tensor and what it keeps alive, in one allocation (`manager_ctx` is
/// the allocation itself).
#[repr(C)]
struct VersionedBox {
    managed: DLManagedTensorVersioned,
    owned: Owned,
}

/// The same for an unversioned tensor.
#[repr(C)]
struct UnversionedBox {
    managed: DLManagedTensor,
    owned: Owned,
}

unsafe extern "C" fn delete_versioned(p: *mut DLManagedTensorVersioned) {
    if p.is_null() {
        return;
    }
    // SAFETY: `p` is the `managed` field at offset 0 of a `VersionedBox` leaked by
    // `Exported::into_raw` (the only way this deleter is handed out), and DLPack's contract is
    // that the deleter runs once: the box is reclaimed exactly once.
    let b = unsafe { Box::from_raw(p as *mut VersionedBox) };
    // A panic must not unwind into C (it would abort): logged and swallowed.
    if super::catch_forgetting(move || b.owned.release()).is_none() {
        super::catch_forgetting(|| log::warn!(target: "raft", "{}: releasing the array panicked", DELETER));
    }
}

unsafe extern "C" fn delete_unversioned(p: *mut DLManagedTensor) {
    if p.is_null() {
        return;
    }
    // SAFETY: as in `delete_versioned`, for an `UnversionedBox` from `into_raw_unversioned`.
    let b = unsafe { Box::from_raw(p as *mut UnversionedBox) };
    if super::catch_forgetting(move || b.owned.release()).is_none() {
        super::catch_forgetting(|| log::warn!(target: "raft", "{}: releasing the array panicked", DELETER));
    }
}

/// An array on its way out as a DLPack tensor: owns the array until handed over as a raw
/// managed tensor (whose deleter then owns it), or drops it.
pub(crate) struct Exported {
    owned: Owned,
    data: u64,
    /// DLPack's device of the memory, as the driver describes it (`memory_label`).
    device: DLDevice,
    dtype: DLDataType,
    ndim: i32,
    /// Null strides (C-contiguous) unless set.
    explicit_strides: bool,
}

impl Exported {
    /// `owner` holds `data` (memory of a resource of `device`, ordered on `stream`) for as long
    /// as it lives; `shape` / `strides` (the first `ndim` used) describe no more than it holds
    /// (the caller checked). The memory is labelled as the driver describes it: an array from a
    /// pinned-host or managed memory resource is not labelled device memory (the fifteenth
    /// audit: a consumer copying "device" memory to the host would name the wrong direction).
    ///
    /// # Errors
    /// The driver's, when it cannot describe the memory (the owner is dropped then).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        who: &'static str,
        owner: Box<dyn KeepMemory>,
        stream: Arc<CudaStream>,
        data: u64,
        device: usize,
        dtype: DLDataType,
        ndim: i32,
        shape: [i64; 2],
        strides: Option<[i64; 2]>,
    ) -> Result<Self> {
        let device_type = memory_label(who, stream.context(), data)?;
        // DLPack's rule: host memory (plain or page-locked) is device 0; device and managed
        // memory name their device.
        let device_id = if device_type == KDL_CPU || device_type == KDL_CUDA_HOST { 0 } else { device as i32 };
        let owned = Owned { stream, owner: Some(owner), shape, strides: strides.unwrap_or([0; 2]), consumed: false };
        let device = DLDevice { device_type, device_id };
        Ok(Exported { owned, data, device, dtype, ndim, explicit_strides: strides.is_some() })
    }

    /// DLPack's device of the memory: `KDL_CUDA` or `KDL_CUDA_MANAGED` and the array's device,
    /// or `KDL_CUDA_HOST` or `KDL_CPU` and 0 (`memory_label`).
    pub(crate) fn device(&self) -> DLDevice {
        self.device
    }

    pub(crate) fn data(&self) -> u64 {
        self.data
    }

    pub(crate) fn shape(&self) -> &[i64] {
        &self.owned.shape[..self.ndim as usize]
    }

    pub(crate) fn strides(&self) -> Option<&[i64]> {
        self.explicit_strides.then(|| &self.owned.strides[..self.ndim as usize])
    }

    /// Orders the consumer's `stream` after the array's work so far (on the device), and marks
    /// the array's eventual free to be ordered after its consumers (see [`Owned::release`]).
    /// The array's own stream needs neither.
    ///
    /// # Safety
    /// `stream` is 1, 2 or a live `CUstream` of the array's device, for the duration of the call
    /// (it is not used after it).
    pub(crate) unsafe fn order_before(&mut self, who: &'static str, stream: usize) -> Result<()> {
        if stream == 0 {
            return Err(Error::logic(who, "stream 0 is ambiguous for CUDA (1 names the legacy default stream, 2 the per-thread one)"));
        }
        if stream == self.owned.stream.cu_stream() as usize {
            return Ok(()); // the array's own order suffices, both ways
        }
        // A consumer's stream being captured (PyTorch's `from_dlpack` inside `torch.cuda.graph`)
        // while the array's own is not: a wait for an event recorded outside the capture is
        // refused by the driver, which invalidates the capture (the thirteenth audit). The host
        // waits for the array's work instead (relaxed): the data is then ready for every launch
        // of the graph, and nothing joins the capture. Both streams captured (the array's joined
        // the consumer's capture): the event's record and wait are the graph's own dependency,
        // as before. A failed question (the legacy stream beside another stream's global
        // capture) takes the wait's path, which reports the driver's answer. Asked in the
        // array's context: the default streams (1, 2) are the current context's.
        let consumer_captured = {
            let _keep = ContextGuard::save(who)?;
            bind(who, self.owned.stream.context())?;
            // SAFETY: `stream` is live for the call (the caller's contract).
            unsafe { super::capturing_handle(who, stream as cusys::CUstream) }.unwrap_or(false)
        };
        if consumer_captured && !super::capturing(who, &self.owned.stream).unwrap_or(true) {
            super::stream_sync(who, &self.owned.stream)?;
            self.owned.consumed = true;
            return Ok(());
        }
        order(who, self.owned.stream.context(), self.owned.stream.cu_stream() as usize, stream)?;
        self.owned.consumed = true;
        Ok(())
    }

    /// Waits for the array's stream: the data is then ready for any stream.
    pub(crate) fn synchronize(&self, who: &'static str) -> Result<()> {
        super::requested_sync(who, &self.owned.stream)
    }

    fn tensor(&mut self) -> DLTensor {
        DLTensor {
            data: self.data as *mut c_void,
            device: self.device,
            ndim: self.ndim,
            dtype: self.dtype,
            shape: std::ptr::null_mut(),
            strides: std::ptr::null_mut(),
            byte_offset: 0,
        }
    }

    /// Hands the tensor over as `DLManagedTensorVersioned`: whoever holds the pointer calls its
    /// deleter once, from any thread, which lets the array go through its own `Drop`.
    pub(crate) fn into_raw(mut self, read_only: bool) -> NonNull<DLManagedTensorVersioned> {
        let dl_tensor = self.tensor();
        let flags = if read_only { DLPACK_FLAG_BITMASK_READ_ONLY } else { 0 };
        let version = DLPackVersion { major: DLPACK_MAJOR_VERSION, minor: DLPACK_MINOR_VERSION };
        let managed =
            DLManagedTensorVersioned { version, manager_ctx: std::ptr::null_mut(), deleter: Some(delete_versioned), flags, dl_tensor };
        let strided = self.explicit_strides;
        // Whatever the handshake said, the receiver may use the memory until its deleter.
        self.owned.consumed = true;
        let b = Box::into_raw(Box::new(VersionedBox { managed, owned: self.owned }));
        // SAFETY: `b` is a fresh, unique allocation; the pointers set here point into it (heap,
        // never moved) and live until its deleter reclaims it.
        unsafe {
            (*b).managed.manager_ctx = b as *mut c_void;
            (*b).managed.dl_tensor.shape = (*b).owned.shape.as_mut_ptr();
            if strided {
                (*b).managed.dl_tensor.strides = (*b).owned.strides.as_mut_ptr();
            }
            NonNull::new_unchecked(b as *mut DLManagedTensorVersioned)
        }
    }

    /// The same as an unversioned `DLManagedTensor` (no flags: DLPack 0.x has none).
    pub(crate) fn into_raw_unversioned(mut self) -> NonNull<DLManagedTensor> {
        let dl_tensor = self.tensor();
        let managed = DLManagedTensor { dl_tensor, manager_ctx: std::ptr::null_mut(), deleter: Some(delete_unversioned) };
        let strided = self.explicit_strides;
        // As in `into_raw`.
        self.owned.consumed = true;
        let b = Box::into_raw(Box::new(UnversionedBox { managed, owned: self.owned }));
        // SAFETY: as in `into_raw`.
        unsafe {
            (*b).managed.manager_ctx = b as *mut c_void;
            (*b).managed.dl_tensor.shape = (*b).owned.shape.as_mut_ptr();
            if strided {
                (*b).managed.dl_tensor.strides = (*b).owned.strides.as_mut_ptr();
            }
            NonNull::new_unchecked(b as *mut DLManagedTensor)
        }
    }

    /// Lets the array go without handing it over (its own `Drop`, ordered after a consumer
    /// stream if one was given).
    pub(crate) fn release(self) {
        self.owned.release();
    }
}

/// Whether ordering the free after the legacy default stream now would meet a capture: a
/// blocking stream of the context being captured makes the legacy stream unusable (a record on
/// it fails and invalidates that capture; `cuStreamIsCapturing` of the legacy stream says
/// `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT` without touching it), and the array's own stream being
/// captured would take the wait into its graph.
fn capture_in_the_way(who: &'static str, own: &CudaStream) -> Result<bool> {
    if super::capturing(who, own)? {
        return Ok(true);
    }
    let _keep = ContextGuard::save(who)?;
    bind(who, own.context())?;
    let mut status = cusys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: the legacy default stream of the bound context (handle 1) always exists; the call
    // writes one status into a local.
    match unsafe { cusys::cuStreamIsCapturing(1 as cusys::CUstream, &mut status) } {
        cusys::CUresult::CUDA_SUCCESS => Ok(status != cusys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE),
        cusys::CUresult::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT => Ok(true),
        rc => Err(Error::driver(who, cudarc::driver::DriverError(rc))),
    }
}

/// Makes `waiter` wait (on the device) for the work queued so far on `first`: an event recorded
/// on `first`, waited for by `waiter`, destroyed at once (CUDA keeps it until the wait is done).
/// Both are raw `CUstream`s of `ctx`'s device (1 and 2 name the default streams).
fn order(who: &'static str, ctx: &Arc<CudaContext>, first: usize, waiter: usize) -> Result<()> {
    if first == waiter {
        return Ok(());
    }
    let _keep = ContextGuard::save(who)?;
    bind(who, ctx)?;
    let event = cu::event::create(cusys::CUevent_flags::CU_EVENT_DISABLE_TIMING).map_err(|e| Error::driver(who, e))?;
    // SAFETY: `event` was just made in the bound context; both streams are live streams of that
    // device (the callers' contracts); the event is destroyed once, after the wait is queued.
    unsafe {
        let recorded = cu::event::record(event, first as cusys::CUstream);
        // After the record: a capture that took it began after `first`'s flag was raised.
        super::exposure::before_join_handles(waiter, first);
        let waited = recorded
            .and_then(|()| cu::stream::wait_event(waiter as cusys::CUstream, event, cusys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT));
        let _ = cu::event::destroy(event);
        waited.map_err(|e| Error::driver(who, e))
    }
}

// ---- import ----------------------------------------------------------------------------------

/// What a foreign managed tensor says about itself, copied out of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Described {
    pub(crate) version: Option<DLPackVersion>,
    pub(crate) flags: u64,
    pub(crate) data: u64,
    pub(crate) device: DLDevice,
    pub(crate) dtype: DLDataType,
    pub(crate) shape: Vec<i64>,
    pub(crate) strides: Option<Vec<i64>>,
    pub(crate) byte_offset: u64,
}

/// The most dimensions read from a foreign tensor (a larger `ndim` is refused before its shape
/// is read: it would be a corrupt header, not a tensor).
pub(crate) const MAX_NDIM: i32 = 64;

enum Raw {
    Versioned(NonNull<DLManagedTensorVersioned>),
    Unversioned(NonNull<DLManagedTensor>),
}

/// Another library's managed tensor, owned: its deleter runs exactly once, when this drops.
pub(crate) struct Foreign {
    raw: Raw,
}

// SAFETY: DLPack lets a consumer hold a managed tensor on any thread and call its deleter from
// there (the producer's deleter must be callable from the consumer's threads: torch's and
// CuPy's are). The tensor's fields are only read through `&self`.
unsafe impl Send for Foreign {}
// SAFETY: shared use reads plain fields only.
unsafe impl Sync for Foreign {}

impl Foreign {
    /// Takes ownership of a versioned tensor.
    ///
    /// # Safety
    /// `p` is a valid `DLManagedTensorVersioned` whose ownership passes to the result (its
    /// deleter is called once, by it, and by nobody else).
    pub(crate) unsafe fn versioned(p: NonNull<DLManagedTensorVersioned>) -> Self {
        Foreign { raw: Raw::Versioned(p) }
    }

    /// Takes ownership of an unversioned tensor.
    ///
    /// # Safety
    /// As [`versioned`](Self::versioned), for a `DLManagedTensor`.
    pub(crate) unsafe fn unversioned(p: NonNull<DLManagedTensor>) -> Self {
        Foreign { raw: Raw::Unversioned(p) }
    }

    /// The tensor's description, or a `Logic` error for a header it cannot read (a major
    /// version it does not know: then no field past the version and deleter is read, as the
    /// standard says; an `ndim` out of range, a null shape).
    pub(crate) fn describe(&self, who: &'static str) -> Result<Described> {
        // SAFETY: the tensor is valid until its deleter runs (the constructors' contract), which
        // only `Drop` calls; `ndim` is checked before `shape` / `strides` are read as arrays of
        // that length.
        unsafe {
            let (version, flags, t) = match self.raw {
                Raw::Versioned(p) => {
                    let m = p.as_ptr();
                    let version = (*m).version;
                    if version.major != DLPACK_MAJOR_VERSION {
                        return Err(Error::logic(
                            who,
                            format!("DLPack {}.{}: this library reads major version {DLPACK_MAJOR_VERSION}", version.major, version.minor),
                        ));
                    }
                    (Some(version), (*m).flags, &(*m).dl_tensor)
                }
                Raw::Unversioned(p) => (None, 0, &(*p.as_ptr()).dl_tensor),
            };
            if !(0..=MAX_NDIM).contains(&t.ndim) {
                return Err(Error::logic(who, format!("ndim {} is out of range", t.ndim)));
            }
            let n = t.ndim as usize;
            if n > 0 && t.shape.is_null() {
                return Err(Error::logic(who, "a tensor of rank above 0 with no shape"));
            }
            let read = |p: *const i64| if n == 0 { Vec::new() } else { std::slice::from_raw_parts(p, n).to_vec() };
            Ok(Described {
                version,
                flags,
                data: t.data as u64,
                device: t.device,
                dtype: t.dtype,
                shape: read(t.shape),
                strides: (!t.strides.is_null()).then(|| read(t.strides)),
                byte_offset: t.byte_offset,
            })
        }
    }
}

impl Drop for Foreign {
    fn drop(&mut self) {
        // SAFETY: the tensor is owned (constructors' contract) and this is the one call of its
        // deleter; DLPack allows a null deleter (nothing to free).
        unsafe {
            match self.raw {
                Raw::Versioned(p) => {
                    if let Some(d) = (*p.as_ptr()).deleter {
                        d(p.as_ptr())
                    }
                }
                Raw::Unversioned(p) => {
                    if let Some(d) = (*p.as_ptr()).deleter {
                        d(p.as_ptr())
                    }
                }
            }
        }
    }
}

/// The order of a contiguous tensor's elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Order {
    /// C order (DLPack's null strides): the last index varies fastest.
    C,
    /// Fortran order: the first index varies fastest.
    F,
}

/// A foreign tensor this library can view: all of it is device memory of one device, of the
/// element type asked for, contiguous, aligned, and its extent does not wrap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Checked {
    /// The first element (`data + byte_offset`).
    pub(crate) data: u64,
    pub(crate) len: usize,
    pub(crate) bytes: usize,
    pub(crate) shape: Vec<usize>,
    pub(crate) order: Order,
    pub(crate) read_only: bool,
}

/// Asks the driver what the first and the last byte of `view` are (`cuPointerGetAttributes`,
/// which answers "unknown" rather than fail for memory CUDA does not know): each must be device
/// memory of `device`, or managed memory, else `Logic`. The rest of the producer's description
/// is trusted (an import is an `unsafe fn`); this catches, before cuBLAS reads it, host memory
/// labelled CUDA, memory of another device, and a range that runs past the producer's mapping.
pub(crate) fn check_memory(who: &'static str, ctx: &Arc<CudaContext>, view: &Checked, device: usize) -> Result<()> {
    if view.bytes == 0 {
        return Ok(());
    }
    let last = view
        .data
        .checked_add(view.bytes as u64 - 1)
        .ok_or_else(|| Error::logic(who, format!("a tensor of {} bytes at {:#x} wraps the address space", view.bytes, view.data)))?;
    let _keep = ContextGuard::save(who)?;
    bind(who, ctx)?;
    for (which, at) in [("first", view.data), ("last", last)] {
        let (mut kind, mut ordinal, mut managed) = (0u32, -1i32, 0u32);
        let mut attributes = [
            cusys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            cusys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            cusys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_MANAGED,
        ];
        let mut out =
            [&mut kind as *mut u32 as *mut c_void, &mut ordinal as *mut i32 as *mut c_void, &mut managed as *mut u32 as *mut c_void];
        // SAFETY: three attributes, each written into a local of its documented size (an
        // unsigned int, an int, a boolean into a zeroed unsigned int); `at` is only looked up,
        // never dereferenced; the context is bound above.
        unsafe { cusys::cuPointerGetAttributes(3, attributes.as_mut_ptr(), out.as_mut_ptr(), at) }
            .result()
            .map_err(|e| Error::driver(who, e))?;
        if managed != 0 {
            continue;
        }
        if kind != cusys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32 {
            return Err(Error::logic(
                who,
                format!(
                    "the tensor's {which} byte ({at:#x}) is not device memory (the driver says memory type {kind}), though labelled CUDA"
                ),
            ));
        }
        if ordinal != device as i32 {
            return Err(Error::logic(
                who,
                format!("the tensor's {which} byte ({at:#x}) is memory of device {ordinal}, not of device {device}"),
            ));
        }
    }
    Ok(())
}

/// DLPack's device type for the memory at `data` (an allocation of a memory resource of `ctx`'s
/// device), asked of the driver: `KDL_CUDA` for device memory, `KDL_CUDA_MANAGED` for managed
/// memory, `KDL_CUDA_HOST` for page-locked host memory (a pinned-host resource), and `KDL_CPU`
/// for memory the driver does not know (a system-memory resource, as on HMM or ATS machines:
/// plain host memory). An empty array's null address is `KDL_CUDA` whatever its resource
/// (there is nothing to read).
fn memory_label(who: &'static str, ctx: &Arc<CudaContext>, data: u64) -> Result<i32> {
    if data == 0 {
        return Ok(KDL_CUDA);
    }
    let _keep = ContextGuard::save(who)?;
    bind(who, ctx)?;
    let (mut kind, mut managed) = (0u32, 0u32);
    let mut attributes =
        [cusys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE, cusys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_MANAGED];
    let mut out = [&mut kind as *mut u32 as *mut c_void, &mut managed as *mut u32 as *mut c_void];
    // SAFETY: two attributes, each written into a local of its documented size (an unsigned int,
    // a boolean into a zeroed unsigned int); `data` is only looked up, never dereferenced; the
    // context is bound above.
    unsafe { cusys::cuPointerGetAttributes(2, attributes.as_mut_ptr(), out.as_mut_ptr(), data) }
        .result()
        .map_err(|e| Error::driver(who, e))?;
    Ok(if managed != 0 {
        KDL_CUDA_MANAGED
    } else if kind == cusys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32 {
        KDL_CUDA
    } else if kind == cusys::CUmemorytype::CU_MEMORYTYPE_HOST as u32 {
        KDL_CUDA_HOST
    } else {
        KDL_CPU
    })
}

fn device_name(t: i32) -> String {
    match t {
        KDL_CPU => "kDLCPU (host memory)".into(),
        KDL_CUDA_HOST => "kDLCUDAHost (page-locked host memory)".into(),
        t => format!("device type {t}"),
    }
}

/// Checks `d` against what a view needs: a `Logic` error naming the first field it cannot view
/// (never a view of other memory than the tensor's).
pub(crate) fn check(who: &'static str, d: &Described, device: usize, dtype: DLDataType, size: usize) -> Result<Checked> {
    if d.device.device_type != KDL_CUDA && d.device.device_type != KDL_CUDA_MANAGED {
        return Err(Error::logic(
            who,
            format!("{} is not CUDA device memory (kDLCUDA or kDLCUDAManaged)", device_name(d.device.device_type)),
        ));
    }
    if d.device.device_id < 0 || d.device.device_id as usize != device {
        return Err(Error::logic(who, format!("the tensor is on device {}, expected device {device}", d.device.device_id)));
    }
    if d.dtype != dtype {
        let DLDataType { code, bits, lanes } = d.dtype;
        return Err(Error::logic(
            who,
            format!(
                "dtype (code {code}, {bits} bits, {lanes} lanes) is not the element type asked for (code {}, {} bits, 1 lane)",
                dtype.code, dtype.bits
            ),
        ));
    }
    let mut shape = Vec::with_capacity(d.shape.len());
    let mut len = 1usize;
    for &e in &d.shape {
        let e = usize::try_from(e).map_err(|_| Error::logic(who, format!("shape {:?} has a negative extent", d.shape)))?;
        len = len.checked_mul(e).ok_or_else(|| Error::logic(who, format!("shape {:?}: the element count overflows", d.shape)))?;
        shape.push(e);
    }
    let bytes = len
        .checked_mul(size)
        .filter(|&b| b <= isize::MAX as usize)
        .ok_or_else(|| Error::logic(who, format!("shape {:?}: the byte count overflows", d.shape)))?;
    let order = match &d.strides {
        None => Order::C,
        Some(_) if len == 0 => Order::C,
        Some(strides) => {
            if contiguous(&shape, strides, shape.len(), |i| i.checked_sub(1)) {
                Order::C
            } else if contiguous(&shape, strides, 0, |i| if i + 1 < shape.len() { Some(i + 1) } else { None }) {
                Order::F
            } else {
                return Err(Error::logic(
                    who,
                    format!("strides {strides:?} of shape {:?} are not contiguous (C or Fortran order): copy the tensor first", d.shape),
                ));
            }
        }
    };
    if len > 0 && d.data == 0 {
        return Err(Error::logic(who, "a tensor of elements with a null data pointer"));
    }
    let data = d.data.checked_add(d.byte_offset).filter(|a| a.checked_add(bytes as u64).is_some());
    let data = data.ok_or_else(|| Error::logic(who, format!("data {:#x} + byte offset {} wraps around", d.data, d.byte_offset)))?;
    if len > 0 && data % size as u64 != 0 {
        return Err(Error::logic(
            who,
            format!("data {:#x} + byte offset {} is not aligned to the element's {size} bytes", d.data, d.byte_offset),
        ));
    }
    Ok(Checked { data, len, bytes, shape, order, read_only: d.flags & DLPACK_FLAG_BITMASK_READ_ONLY != 0 })
}

/// Whether `strides` lay `shape` out densely, walking the dimensions from the fastest (`start`
/// then `next`, from `shape.len()` meaning "before the last"): each stride is the product of
/// the faster extents; a dimension of extent 1 may have any stride (it is never stepped).
fn contiguous(shape: &[usize], strides: &[i64], start: usize, next: impl Fn(usize) -> Option<usize>) -> bool {
    if strides.len() != shape.len() {
        return false;
    }
    if shape.is_empty() {
        return true;
    }
    let mut want: u64 = 1;
    let mut i = if start == shape.len() { shape.len().checked_sub(1) } else { Some(start) };
    while let Some(d) = i {
        if shape[d] != 1 && strides[d] != want as i64 {
            return false;
        }
        want = want.saturating_mul(shape[d] as u64);
        i = next(d);
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every small tensor description, exhaustively: `check` accepts one exactly when its
    /// elements, as its own shape, strides and offset place them (computed here in i128 from
    /// DLPack's definition), are the `len` elements from `data` in the order it reports, C or
    /// Fortran, element for element; everything else is refused. A checker that let one
    /// element out, or took a transposed tensor for the other order, would hand cuBLAS other
    /// memory than the tensor's.
    #[test]
    #[cfg_attr(miri, ignore = "pure arithmetic over tens of thousands of cases: Miri adds nothing and takes minutes")]
    fn every_small_tensor_is_viewed_exactly_as_its_strides_place_it_or_refused() {
        let f32 = DLDataType { code: KDL_FLOAT, bits: 32, lanes: 1 };
        let values: [i64; 6] = [-1, 0, 1, 2, 3, 6];
        let mut accepted = [0usize; 2];
        for ndim in 0..=3usize {
            for shape_code in 0..4usize.pow(ndim as u32) {
                let shape: Vec<i64> = (0..ndim).map(|d| (shape_code / 4usize.pow(d as u32) % 4) as i64).collect();
                let mut strides_all: Vec<Option<Vec<i64>>> = vec![None];
                for code in 0..values.len().pow(ndim as u32) {
                    strides_all.push(Some((0..ndim).map(|d| values[code / values.len().pow(d as u32) % values.len()]).collect()));
                }
                for strides in strides_all {
                    for (data, byte_offset) in [(4096u64, 0u64), (4096, 8), (4096, 2), (0, 0)] {
                        let d = Described {
                            version: None,
                            flags: 0,
                            data,
                            device: DLDevice { device_type: KDL_CUDA, device_id: 0 },
                            dtype: f32,
                            shape: shape.clone(),
                            strides: strides.clone(),
                            byte_offset,
                        };
                        let len: i128 = shape.iter().map(|&e| e as i128).product();
                        // The tensor's own element addresses, by multi-index (row-major walk).
                        let eff: Vec<i64> = strides.clone().unwrap_or_else(|| {
                            let mut s = vec![1i64; ndim];
                            for k in (0..ndim.saturating_sub(1)).rev() {
                                s[k] = s[k + 1] * shape[k + 1];
                            }
                            s
                        });
                        let mut addresses = Vec::new();
                        let mut index = vec![0i64; ndim];
                        for _ in 0..len {
                            let at: i128 = (0..ndim).map(|k| index[k] as i128 * eff[k] as i128).sum();
                            addresses.push((index.clone(), data as i128 + byte_offset as i128 + 4 * at));
                            for k in (0..ndim).rev() {
                                index[k] += 1;
                                if index[k] < shape[k] {
                                    break;
                                }
                                index[k] = 0;
                            }
                        }
                        // Where a dense view from the first element puts each index, C and F.
                        let dense = |order: Order, index: &[i64]| -> i128 {
                            let (mut at, mut step) = (0i128, 1i128);
                            let dims: Vec<usize> = match order {
                                Order::C => (0..ndim).rev().collect(),
                                Order::F => (0..ndim).collect(),
                            };
                            for k in dims {
                                at += index[k] as i128 * step;
                                step *= shape[k] as i128;
                            }
                            data as i128 + byte_offset as i128 + 4 * at
                        };
                        let fits = |order: Order| addresses.iter().all(|(i, a)| dense(order, i) == *a);
                        let aligned = len == 0 || (data + byte_offset) % 4 == 0;
                        let null = len > 0 && data == 0;
                        let viewable = (fits(Order::C) || fits(Order::F)) && aligned && !null;
                        let what = format!("shape {shape:?} strides {strides:?} data {data:#x}+{byte_offset}");
                        match check("t", &d, 0, f32, 4) {
                            Ok(c) => {
                                assert!(viewable, "{what} accepted as {c:?}");
                                assert!(fits(c.order), "{what} accepted in {:?} order, which places it elsewhere", c.order);
                                assert_eq!((c.len as i128, c.bytes as i128, c.data), (len, 4 * len, data + byte_offset), "{what}");
                                accepted[c.order as usize] += 1;
                            }
                            Err(e) => {
                                assert_eq!(e.kind(), crate::ErrorKind::Logic, "{what}");
                                assert!(!viewable, "{what} refused: {e}");
                            }
                        }
                    }
                }
            }
        }
        assert!(accepted[0] > 100 && accepted[1] > 100, "the domain accepted too few: {accepted:?}");
    }
}
