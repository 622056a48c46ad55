//! DLPack export and import (issue 31). The import checks run on the CPU against host-side fake
//! tensors (their data is never touched: a fake address); export and round trips need a GPU.
use raft::dlpack::{
    DLDevice, DLManagedTensor, DLManagedTensorVersioned, DLPackVersion, DLTensor, DlDataType, DLPACK_FLAG_BITMASK_READ_ONLY, KDL_CPU,
    KDL_CUDA, KDL_CUDA_HOST, KDL_CUDA_MANAGED, KDL_FLOAT,
};
use raft::half::f16;
use raft::{DeviceMatrix, DeviceResources, DeviceVec, DlpackElement, DlpackTensor, ErrorKind, Layout};
use raft_tests::require_gpu;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// A host-side fake producer: the managed tensor, its shape and strides, and a count of its
/// deleter's calls.
#[repr(C)]
struct Fake<M> {
    managed: M,
    shape: Vec<i64>,
    strides: Option<Vec<i64>>,
    deleted: Arc<AtomicUsize>,
}

#[derive(Clone)]
struct Spec {
    device_type: i32,
    device_id: i32,
    dtype: DlDataType,
    shape: Vec<i64>,
    strides: Option<Vec<i64>>,
    data: u64,
    byte_offset: u64,
    flags: u64,
    major: u32,
    ndim: Option<i32>,
}

fn spec(shape: &[i64]) -> Spec {
    Spec {
        device_type: KDL_CUDA,
        device_id: 0,
        dtype: f32::DTYPE,
        shape: shape.to_vec(),
        strides: None,
        data: 0x7f00_0000_1000,
        byte_offset: 0,
        flags: 0,
        major: 1,
        ndim: None,
    }
}

fn tensor(s: &Spec, fake_shape: &mut [i64], fake_strides: &mut Option<Vec<i64>>) -> DLTensor {
    DLTensor {
        data: s.data as *mut _,
        device: DLDevice { device_type: s.device_type, device_id: s.device_id },
        ndim: s.ndim.unwrap_or(s.shape.len() as i32),
        dtype: s.dtype,
        shape: fake_shape.as_mut_ptr(),
        strides: fake_strides.as_mut().map_or(std::ptr::null_mut(), |v| v.as_mut_ptr()),
        byte_offset: s.byte_offset,
    }
}

unsafe extern "C" fn delete_versioned(p: *mut DLManagedTensorVersioned) {
    let fake = unsafe { Box::from_raw(p as *mut Fake<DLManagedTensorVersioned>) };
    fake.deleted.fetch_add(1, Ordering::SeqCst);
}

unsafe extern "C" fn delete_unversioned(p: *mut DLManagedTensor) {
    let fake = unsafe { Box::from_raw(p as *mut Fake<DLManagedTensor>) };
    fake.deleted.fetch_add(1, Ordering::SeqCst);
}

fn versioned(s: &Spec) -> (*mut DLManagedTensorVersioned, Arc<AtomicUsize>) {
    let deleted = Arc::new(AtomicUsize::new(0));
    let mut shape = s.shape.clone();
    let mut strides = s.strides.clone();
    let t = tensor(s, &mut shape, &mut strides);
    let managed = DLManagedTensorVersioned {
        version: DLPackVersion { major: s.major, minor: 0 },
        manager_ctx: std::ptr::null_mut(),
        deleter: Some(delete_versioned),
        flags: s.flags,
        dl_tensor: t,
    };
    // The Vec's heap buffers do not move with the box: the pointers above stay valid.
    let fake = Box::new(Fake { managed, shape, strides, deleted: deleted.clone() });
    (Box::into_raw(fake) as *mut DLManagedTensorVersioned, deleted)
}

fn unversioned(s: &Spec) -> (*mut DLManagedTensor, Arc<AtomicUsize>) {
    let deleted = Arc::new(AtomicUsize::new(0));
    let mut shape = s.shape.clone();
    let mut strides = s.strides.clone();
    let t = tensor(s, &mut shape, &mut strides);
    let managed = DLManagedTensor { dl_tensor: t, manager_ctx: std::ptr::null_mut(), deleter: Some(delete_unversioned) };
    let fake = Box::new(Fake { managed, shape, strides, deleted: deleted.clone() });
    (Box::into_raw(fake) as *mut DLManagedTensor, deleted)
}

/// Imports `s` as `T` on device 0; returns the refusal's message (or "ok") and checks that the
/// producer's deleter ran exactly once by the end (at once for a refusal).
fn import<T: DlpackElement>(s: &Spec) -> String {
    let (p, deleted) = versioned(s);
    // SAFETY: a fresh fake whose ownership passes; its data is never read.
    let r = unsafe { DlpackTensor::<T>::from_raw(p, 0) };
    let out = match &r {
        Ok(_) => "ok".to_string(),
        Err(e) => {
            assert_eq!(e.kind(), ErrorKind::Logic, "{e}");
            assert_eq!(deleted.load(Ordering::SeqCst), 1, "a refused tensor is deleted at once, once");
            e.to_string()
        }
    };
    drop(r);
    assert_eq!(deleted.load(Ordering::SeqCst), 1, "the deleter runs exactly once");
    out
}

#[test]
fn a_cuda_tensor_is_viewed_in_place_and_deleted_once_on_drop() {
    let mut s = spec(&[3, 4]);
    s.byte_offset = 64;
    let (p, deleted) = versioned(&s);
    // SAFETY: a fresh fake whose ownership passes; its data is never read.
    let t = unsafe { DlpackTensor::<f32>::from_raw(p, 0) }.unwrap();
    assert_eq!((t.len(), t.shape(), t.matrix_shape()), (12, &[3usize, 4][..], Some((3, 4, Layout::RowMajor))));
    assert_eq!(t.data_ptr(), s.data + 64, "the view starts at data + byte_offset: no copy");
    assert!(!t.is_read_only());
    assert_eq!(deleted.load(Ordering::SeqCst), 0, "the producer stays alive while viewed");
    let t = std::thread::spawn(move || t).join().unwrap(); // Send
    drop(t);
    assert_eq!(deleted.load(Ordering::SeqCst), 1);
}

#[test]
fn an_unversioned_tensor_is_taken_too() {
    let mut s = spec(&[5]);
    s.dtype = f16::DTYPE;
    let (p, deleted) = unversioned(&s);
    // SAFETY: as above.
    let t = unsafe { DlpackTensor::<f16>::from_raw_unversioned(p, 0) }.unwrap();
    assert_eq!(t.matrix_shape(), Some((1, 5, Layout::RowMajor)));
    drop(t);
    assert_eq!(deleted.load(Ordering::SeqCst), 1);
    // A refusal deletes it too.
    let (p, deleted) = unversioned(&s);
    // SAFETY: as above.
    let e = unsafe { DlpackTensor::<f32>::from_raw_unversioned(p, 0) }.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Logic);
    assert_eq!(deleted.load(Ordering::SeqCst), 1);
}

#[test]
fn memory_that_is_not_cuda_device_memory_of_the_device_is_refused() {
    let mut s = spec(&[2, 2]);
    s.device_type = KDL_CPU;
    assert_eq!(import::<f32>(&s), "DlpackTensor::from_raw: kDLCPU (host memory) is not CUDA device memory (kDLCUDA or kDLCUDAManaged)");
    s.device_type = KDL_CUDA_HOST;
    assert!(import::<f32>(&s).contains("kDLCUDAHost"));
    s.device_type = KDL_CUDA_MANAGED;
    assert_eq!(import::<f32>(&s), "ok", "managed memory is device-accessible");
    s.device_type = KDL_CUDA;
    s.device_id = 1;
    assert_eq!(import::<f32>(&s), "DlpackTensor::from_raw: the tensor is on device 1, expected device 0");
}

#[test]
fn another_dtype_is_refused() {
    let mut s = spec(&[4]);
    s.dtype = f16::DTYPE;
    assert!(import::<f32>(&s).contains("is not the element type asked for"));
    s.dtype = DlDataType { code: KDL_FLOAT, bits: 32, lanes: 2 };
    assert!(import::<f32>(&s).contains("2 lanes"));
    s.dtype = i32::DTYPE;
    assert!(import::<f32>(&s).contains("code 0, 32 bits"), "same width, another code");
    assert_eq!(import::<i32>(&s), "ok");
}

#[test]
fn strides_must_be_c_or_fortran_order() {
    let mut s = spec(&[3, 4]);
    s.strides = Some(vec![4, 1]);
    assert_eq!(import::<f32>(&s), "ok", "explicit C strides");
    s.strides = Some(vec![1, 3]);
    let (p, _) = versioned(&s);
    // SAFETY: as above.
    let t = unsafe { DlpackTensor::<f32>::from_raw(p, 0) }.unwrap();
    assert_eq!(t.matrix_shape(), Some((3, 4, Layout::ColMajor)), "Fortran strides are a column-major matrix");
    drop(t);
    s.strides = Some(vec![8, 1]); // padded rows: a view of every other row's memory
    assert_eq!(
        import::<f32>(&s),
        "DlpackTensor::from_raw: strides [8, 1] of shape [3, 4] are not contiguous (C or Fortran order): copy the tensor first"
    );
    s.strides = Some(vec![-4, 1]);
    assert!(import::<f32>(&s).contains("not contiguous"), "negative strides");
    s.strides = Some(vec![4, 2]);
    assert!(import::<f32>(&s).contains("not contiguous"), "a step over elements");
    s.shape = vec![1, 4];
    s.strides = Some(vec![99, 1]);
    assert_eq!(import::<f32>(&s), "ok", "the stride of an extent of 1 is never used");
}

#[test]
fn offsets_must_keep_the_element_alignment() {
    let mut s = spec(&[2]);
    s.byte_offset = 2;
    assert_eq!(
        import::<f32>(&s),
        format!("DlpackTensor::from_raw: data {:#x} + byte offset 2 is not aligned to the element's 4 bytes", s.data)
    );
    s.dtype = f16::DTYPE;
    assert_eq!(import::<f16>(&s), "ok", "2 bytes is f16's alignment");
    s.byte_offset = u64::MAX - 8;
    assert!(import::<f16>(&s).contains("wraps around"));
}

#[test]
fn broken_headers_are_refused_before_their_shapes_are_read() {
    let mut s = spec(&[2, 2]);
    s.major = 2;
    assert_eq!(import::<f32>(&s), "DlpackTensor::from_raw: DLPack 2.0: this library reads major version 1");
    let mut s = spec(&[2, 2]);
    s.ndim = Some(-1);
    assert!(import::<f32>(&s).contains("ndim -1 is out of range"));
    s.ndim = Some(1000);
    assert!(import::<f32>(&s).contains("ndim 1000 is out of range"));
    let s = spec(&[2, -3]);
    assert!(import::<f32>(&s).contains("negative extent"));
    let s = spec(&[i64::MAX, 4]);
    assert!(import::<f32>(&s).contains("overflows"));
    let mut s = spec(&[2]);
    s.data = 0;
    assert_eq!(import::<f32>(&s), "DlpackTensor::from_raw: a tensor of elements with a null data pointer");
    let mut s = spec(&[0, 3]);
    s.data = 0;
    assert_eq!(import::<f32>(&s), "ok", "an empty tensor may have no data");
    // SAFETY: null is refused before anything is read.
    let e = unsafe { DlpackTensor::<f32>::from_raw(std::ptr::null_mut(), 0) }.unwrap_err();
    assert_eq!(e.to_string(), "DlpackTensor::from_raw: a null tensor");
}

#[test]
fn a_read_only_tensor_gives_no_mutable_access() {
    let mut s = spec(&[4]);
    s.flags = DLPACK_FLAG_BITMASK_READ_ONLY;
    let (p, _) = versioned(&s);
    // SAFETY: as above.
    let mut t = unsafe { DlpackTensor::<f32>::from_raw(p, 0) }.unwrap();
    assert!(t.is_read_only());
    let e = t.data_ptr_mut().unwrap_err();
    assert_eq!(e.to_string(), "DlpackTensor::data_ptr_mut: the producer marked the tensor read-only");
    s.flags = 0;
    let (p, _) = versioned(&s);
    // SAFETY: as above.
    let mut t = unsafe { DlpackTensor::<f32>::from_raw(p, 0) }.unwrap();
    assert_eq!(t.data_ptr_mut().unwrap(), s.data);
}

// ---- on the GPU ------------------------------------------------------------------------------

fn live_arrays() -> usize {
    raft::stats().live_arrays
}

/// The GPU tests count the process's live arrays: one at a time, so another test's arrays are
/// not counted as theirs.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn an_export_round_trips_without_a_copy_and_its_deleter_frees_from_another_thread() {
    require_gpu!();
    let _one = one_at_a_time();
    let r = DeviceResources::new().unwrap();
    let before = live_arrays();
    let v = DeviceVec::from_host(&r, &(0..12).map(|i| i as f32).collect::<Vec<_>>()).unwrap();
    // SAFETY: a live array, borrowed for the read of its address only.
    let addr = unsafe { v.as_raw() } as u64;
    let mut e = DeviceMatrix::from_vec(v, 3, 4, Layout::ColMajor).unwrap().into_dlpack().unwrap();
    assert_eq!((e.data_ptr(), e.shape(), e.strides()), (addr, &[3i64, 4][..], Some(&[1i64, 3][..])));
    // SAFETY: the legacy default stream always exists.
    unsafe { e.order_before_stream(1) }.unwrap();
    let raw = e.into_raw();
    assert_eq!(live_arrays(), before + 1, "the tensor owns the array");
    // SAFETY: a tensor this library made; ownership passes to the import.
    let t = unsafe { DlpackTensor::<f32>::from_raw(raw, r.device()) }.unwrap();
    assert_eq!((t.data_ptr(), t.matrix_shape()), (addr, Some((3, 4, Layout::ColMajor))), "no copy");
    std::thread::spawn(move || drop(t)).join().unwrap();
    assert_eq!(live_arrays(), before, "the deleter, on another thread, dropped the array");
    // Unversioned, and dropped without being handed over.
    let v = DeviceVec::<f16>::zeros(&r, 8).unwrap();
    let raw = v.into_dlpack().unwrap().into_raw_unversioned();
    // SAFETY: as above.
    let t = unsafe { DlpackTensor::<f16>::from_raw_unversioned(raw, r.device()) }.unwrap();
    assert_eq!(t.shape(), &[8]);
    drop(t);
    drop(DeviceVec::<i8>::zeros(&r, 8).unwrap().into_dlpack().unwrap());
    assert_eq!(live_arrays(), before);
    // A read-only export is imported read-only.
    let raw = DeviceVec::<u8>::zeros(&r, 4).unwrap().into_dlpack().unwrap().read_only().into_raw();
    // SAFETY: as above.
    let mut t = unsafe { DlpackTensor::<u8>::from_raw(raw, r.device()) }.unwrap();
    assert!(t.data_ptr_mut().is_err());
}

/// An export ordered before a stream of the consumer's own, which the consumer destroys before
/// its deleter runs (CuPy destroys its streams when collected; CuPy's streams are blocking
/// ones): the deleter never names that stream (helper-35's first finding: it recorded an event
/// on the handle, whatever had become of it), yet the free still waits for the work the
/// consumer queued there, through the legacy default stream, which waits for every blocking
/// stream. A copy into the export, queued behind a backlog on that stream, must not reach the
/// next array given the same block. (On the code before, this passed too while the destroyed
/// stream still had work, the driver keeping it until then: it shows that the new ordering
/// holds, not the old fault.)
#[test]
fn an_export_whose_consumer_stream_is_destroyed_before_the_deleter_is_freed_after_its_work() {
    require_gpu!();
    use cudarc::driver::result as cu;
    let _one = one_at_a_time();
    let r = DeviceResources::new().unwrap();
    let before = live_arrays();
    let ctx = r.stream().unwrap().context().clone();
    let n = 256 << 20; // 1 GiB of f32
    let src = DeviceVec::from_host(&r, &raft_tests::patterns::pattern_f32(n, 91)).unwrap();
    let (x, y) = (DeviceVec::<f32>::zeros(&r, n).unwrap(), DeviceVec::<f32>::zeros(&r, n).unwrap());
    r.sync().unwrap(); // `src`, `x` and `y` are ready for any stream
    ctx.bind_to_thread().unwrap();
    // A blocking stream of the consumer's own, as CuPy makes them.
    let consumer = cu::stream::create(cu::stream::StreamKind::Default).unwrap();
    // A backlog there (tens of milliseconds of copies), so its copy into the export runs long
    // after the deleter.
    for _ in 0..16 {
        // SAFETY: 1 GiB each, live device memory (the arrays outlive the work: the final read
        // below waits for it); queued on the consumer's live stream, in the bound context.
        unsafe {
            cu::memcpy_dtod_async(y.device_address(), x.device_address(), n * 4, consumer).unwrap();
            cu::memcpy_dtod_async(x.device_address(), y.device_address(), n * 4, consumer).unwrap();
        }
    }
    let mut e = DeviceVec::<f32>::zeros(&r, n).unwrap().into_dlpack().unwrap();
    let freed_at = e.data_ptr();
    // SAFETY: a live stream of the array's device, for the call.
    unsafe { e.order_before_stream(consumer as usize) }.unwrap();
    let raw = e.into_raw();
    ctx.bind_to_thread().unwrap();
    // SAFETY: the tensor is owned until its deleter and `src` lives to the end; queued on the
    // consumer's live stream, in the bound context; then the stream is destroyed (its queued
    // work still runs) and never named again.
    unsafe {
        cu::memcpy_dtod_async(freed_at, src.device_address(), n * 4, consumer).unwrap();
        cu::stream::destroy(consumer).unwrap();
    }
    // SAFETY: a tensor this library made, deleted once.
    unsafe { ((*raw).deleter.unwrap())(raw) };
    assert_eq!(live_arrays(), before + 3, "the exported array was not let go by its deleter");
    let mut fresh = DeviceVec::<f32>::new(&r, n).unwrap();
    fresh.fill_zero().unwrap();
    let got = fresh.to_host().unwrap();
    assert_eq!(fresh.device_address(), freed_at, "the pool did not reissue the freed block: the test proves nothing");
    if let Some(i) = got.iter().position(|v| *v != 0.0) {
        panic!("element {i} of an array zeroed after it was allocated holds {}: the consumer's copy wrote it after the free", got[i]);
    }
    drop((src, x, y));
}

/// A tensor handed over after `synchronize` (Python's `__dlpack__(stream=None)`, whose consumer
/// then works on the legacy default stream) or with no order at all (`stream=-1`): the
/// consumer's copy into it, queued on the legacy default stream behind a backlog, must not reach
/// the next array given the same block. Before the seventeenth audit's fix only a consumer that
/// named a stream got the free ordered after the legacy default stream: the copy landed in the
/// next owner's zeroed array.
#[test]
fn an_export_handed_over_without_a_consumer_stream_is_freed_after_the_legacy_default_stream_s_work() {
    require_gpu!();
    use cudarc::driver::{result as cu, sys};
    let _one = one_at_a_time();
    let r = DeviceResources::new().unwrap();
    let ctx = r.stream().unwrap().context().clone();
    let n = 256 << 20; // 1 GiB of f32
    let src = DeviceVec::from_host(&r, &raft_tests::patterns::pattern_f32(n, 93)).unwrap();
    let (x, y) = (DeviceVec::<f32>::zeros(&r, n).unwrap(), DeviceVec::<f32>::zeros(&r, n).unwrap());
    r.sync().unwrap(); // `src`, `x` and `y` are ready for any stream
                       // CUDA's `CU_STREAM_LEGACY` (`cuda.h` defines it as `((CUstream)0x1)`; cudarc has no constant).
    let legacy = 1usize as sys::CUstream;
    for synchronized in [true, false] {
        let before = live_arrays();
        ctx.bind_to_thread().unwrap();
        // A backlog on the legacy default stream (tens of milliseconds of copies), so the
        // consumer's copy into the export runs long after the deleter.
        for _ in 0..16 {
            // SAFETY: 1 GiB each, live device memory (the arrays outlive the work: the final
            // read below waits for it); queued on the legacy default stream of the bound context.
            unsafe {
                cu::memcpy_dtod_async(y.device_address(), x.device_address(), n * 4, legacy).unwrap();
                cu::memcpy_dtod_async(x.device_address(), y.device_address(), n * 4, legacy).unwrap();
            }
        }
        let e = DeviceVec::<f32>::zeros(&r, n).unwrap().into_dlpack().unwrap();
        if synchronized {
            e.synchronize().unwrap();
        }
        let freed_at = e.data_ptr();
        let raw = e.into_raw();
        ctx.bind_to_thread().unwrap();
        // SAFETY: the tensor is owned until its deleter and `src` lives to the end; queued on
        // the legacy default stream of the bound context.
        unsafe { cu::memcpy_dtod_async(freed_at, src.device_address(), n * 4, legacy).unwrap() };
        // SAFETY: a tensor this library made, deleted once.
        unsafe { ((*raw).deleter.unwrap())(raw) };
        assert_eq!(live_arrays(), before, "the exported array was not let go by its deleter");
        let mut fresh = DeviceVec::<f32>::new(&r, n).unwrap();
        fresh.fill_zero().unwrap();
        r.sync().unwrap();
        // The consumer's copy has landed, before or after the zeroing (the reviewer: read while
        // it lands, the test failed only where it had reached).
        ctx.bind_to_thread().unwrap();
        // SAFETY: waits for the legacy default stream of the bound context (the backlog).
        unsafe { cu::stream::synchronize(legacy) }.unwrap();
        let got = fresh.to_host().unwrap();
        assert_eq!(fresh.device_address(), freed_at, "the pool did not reissue the freed block: the test proves nothing");
        if let Some(i) = got.iter().position(|v| *v != 0.0) {
            panic!(
                "element {i} of an array zeroed after it was allocated holds {} (synchronized: {synchronized}): the consumer's \
                 copy on the legacy default stream wrote it after the free",
                got[i]
            );
        }
    }
    drop((src, x, y));
}

/// A consumer's stream being captured when the export is ordered before it (PyTorch's
/// `torch.from_dlpack` inside `torch.cuda.graph`, which captures in global mode): the order
/// queued a wait for an event recorded outside the capture, which the driver refuses,
/// invalidating the capture (the thirteenth audit). Now the host waits for the array's work
/// instead: the call succeeds, the capture stays valid and takes no node, and the data is the
/// array's.
#[test]
fn an_export_ordered_before_a_capturing_stream_waits_on_the_host_and_leaves_the_capture_valid() {
    require_gpu!();
    let _one = one_at_a_time();
    use cudarc::driver::{result as cu, sys};
    let r = DeviceResources::new().unwrap();
    let want = raft_tests::patterns::pattern_f32(1 << 20, 17);
    let mut e = DeviceVec::from_host(&r, &want).unwrap().into_dlpack().unwrap();
    let consumer = r.context().new_stream().unwrap();
    r.context().bind_to_thread().unwrap();
    // SAFETY: the consumer's stream is alive for the borrow; its context is bound above.
    unsafe { sys::cuStreamBeginCapture_v2(consumer.cu_stream(), sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL) }
        .result()
        .unwrap();
    // SAFETY: a live stream of the array's device, for the call.
    let ordered = unsafe { e.order_before_stream(consumer.cu_stream() as usize) };
    r.context().bind_to_thread().unwrap();
    let mut graph = std::ptr::null_mut();
    // SAFETY: ends the capture begun above on the same stream; the graph comes back owned.
    let ended = unsafe { sys::cuStreamEndCapture(consumer.cu_stream(), &mut graph) }.result();
    let mut nodes = 0usize;
    if !graph.is_null() {
        // SAFETY: `graph` is the captured graph, destroyed once after its nodes are counted.
        unsafe {
            sys::cuGraphGetNodes(graph, std::ptr::null_mut(), &mut nodes).result().unwrap();
            sys::cuGraphDestroy(graph).result().unwrap();
        }
    }
    ordered.unwrap_or_else(|err| panic!("ordering an export before a capturing stream: {err}"));
    ended.unwrap_or_else(|err| panic!("the order invalidated the consumer's capture: {err:?}"));
    assert_eq!(nodes, 0, "the order joined the consumer's capture");
    let mut got = vec![0f32; want.len()];
    // SAFETY: the export owns the array (alive until `e` drops below); the host wait above
    // ordered its copy in before this read.
    unsafe { cu::memcpy_dtoh_sync(&mut got, e.data_ptr()) }.unwrap();
    assert!(got == want, "the exported data is not the array's");
    drop(e);
}

/// `gemm_dlpack` asks the driver what an imported tensor's memory is before cuBLAS reads it
/// (helper-35's third finding): host memory labelled CUDA is refused (`Logic`), where before
/// cuBLAS read it as device memory (a fault that ends the context, or host bytes read through
/// the address space). A real array's tensor passes the same check.
#[test]
fn gemm_dlpack_refuses_memory_the_driver_does_not_know_as_the_devices() {
    require_gpu!();
    let _one = one_at_a_time();
    let r = DeviceResources::new().unwrap();
    let host = vec![1.0f32; 16];
    let mut s = spec(&[4, 4]);
    s.data = host.as_ptr() as u64;
    let (p, deleted) = versioned(&s);
    // SAFETY: a fresh fake whose ownership passes; it claims host memory is the device's (the
    // lie under test: `gemm_dlpack` must find it out before anything reads the memory).
    let fake = unsafe { DlpackTensor::<f32>::from_raw(p, r.device()) }.unwrap();
    let real = DeviceMatrix::from_host(&r, &[2.0f32; 16], 4, 4, Layout::RowMajor).unwrap().into_dlpack().unwrap();
    // SAFETY: a tensor this library made; ownership passes to the import.
    let real = unsafe { DlpackTensor::<f32>::from_raw(real.into_raw(), r.device()) }.unwrap();
    for (what, e) in [("host as A", raft::gemm_dlpack(&r, 1.0, &fake, &real)), ("host as B", raft::gemm_dlpack(&r, 1.0, &real, &fake))]
        .map(|(w, g)| (w, g.map(drop).expect_err(w)))
    {
        assert_eq!((e.kind(), e.who()), (ErrorKind::Logic, "gemm_dlpack"), "{what}: {e}");
        assert!(e.to_string().contains("is not device memory"), "{what}: {e}");
    }
    // Both operands real: the check passes and the product is right (4 × 2·2 = 16).
    let c = raft::gemm_dlpack(&r, 1.0, &real, &real).unwrap();
    assert!(c.to_host().unwrap().iter().all(|&x| x == 16.0), "{:?}", c.to_host().unwrap());
    drop(fake);
    assert_eq!(deleted.load(Ordering::SeqCst), 1);
    drop(host);
}

#[test]
fn a_tensor_outliving_its_released_resources_still_frees() {
    require_gpu!();
    let _one = one_at_a_time();
    let before = live_arrays();
    let r = DeviceResources::new().unwrap();
    let e = DeviceVec::<f32>::zeros(&r, 1 << 20).unwrap().into_dlpack().unwrap();
    e.synchronize().unwrap();
    let raw = e.into_raw();
    // The consumer still holds the tensor when the resources go: its array keeps its stream and
    // memory resource, as any array does.
    r.release().unwrap();
    assert!(r.is_released());
    // SAFETY: a tensor this library made, deleted once.
    unsafe { ((*raw).deleter.unwrap())(raw) };
    assert_eq!(live_arrays(), before);
}

#[test]
fn gemm_on_imported_tensors_matches_gemm_on_arrays() {
    require_gpu!();
    let _one = one_at_a_time();
    let r = DeviceResources::new().unwrap();
    let (m, k, n) = (37, 65, 29);
    let a: Vec<f32> = (0..m * k).map(|i| ((i * 7 % 13) as f32 - 6.0) / 8.0).collect();
    let b: Vec<f32> = (0..k * n).map(|i| ((i * 5 % 11) as f32 - 5.0) / 4.0).collect();
    for lb in [Layout::RowMajor, Layout::ColMajor] {
        let ta = DeviceMatrix::from_host(&r, &a, m, k, Layout::RowMajor).unwrap().into_dlpack().unwrap();
        let tb = DeviceMatrix::from_host(&r, &b, k, n, lb).unwrap().into_dlpack().unwrap();
        ta.synchronize().unwrap();
        tb.synchronize().unwrap();
        // SAFETY: tensors this library made, synchronised.
        let (ia, ib) =
            unsafe { (DlpackTensor::<f32>::from_raw(ta.into_raw(), 0).unwrap(), DlpackTensor::<f32>::from_raw(tb.into_raw(), 0).unwrap()) };
        let c = raft::gemm_dlpack(&r, 1.0, &ia, &ib).unwrap().to_host().unwrap();
        let (da, db) = (DeviceVec::from_host(&r, &a).unwrap(), DeviceVec::from_host(&r, &b).unwrap());
        let mut want = DeviceVec::<f32>::zeros(&r, m * n).unwrap();
        raft::gemm(
            1.0,
            da.matrix(m, k, Layout::RowMajor).unwrap(),
            db.matrix(k, n, lb).unwrap(),
            0.0,
            want.matrix_mut(m, n, Layout::RowMajor).unwrap(),
        )
        .unwrap();
        assert_eq!(c, want.to_host().unwrap(), "{lb:?}: the same cuBLAS call on the same values");
    }
}

/// The fifteenth audit: an array of a pinned-host or managed memory resource (accepted by
/// `new_in`) was exported labelled `kDLCUDA` device memory, which this library's own import
/// refuses ("not device memory, though labelled CUDA") and a consumer copying it to the host as
/// device memory would name the wrong direction. The export labels the memory as the driver
/// describes it: `kDLCUDAHost` (device id 0, DLPack's rule for host memory) and
/// `kDLCUDAManaged`; device memory stays `kDLCUDA`; the deleter frees each. (Before: `kDLCUDA`
/// for all three.)
#[test]
fn an_export_labels_pinned_host_and_managed_memory_as_what_they_are() {
    use raft::MemoryResource;
    require_gpu!();
    let _one = one_at_a_time();
    let r = DeviceResources::new().unwrap();
    let before = live_arrays();
    let d = r.device() as i32;
    let kinds = [
        ("pinned host", MemoryResource::pinned_host(r.device()).unwrap(), (KDL_CUDA_HOST, 0)),
        ("managed", MemoryResource::managed(r.device()).unwrap(), (KDL_CUDA_MANAGED, d)),
        ("device", MemoryResource::cuda(r.device()).unwrap(), (KDL_CUDA, d)),
    ];
    for (what, mr, (want, id)) in kinds {
        let mut v = DeviceVec::<f32>::new_in(&r, 64, &mr).unwrap();
        v.copy_from_host(&[2.5f32; 64]).unwrap();
        let e = v.into_dlpack().unwrap();
        assert_eq!(e.device(), DLDevice { device_type: want, device_id: id }, "{what} memory");
        e.synchronize().unwrap();
        let raw = e.into_raw();
        // SAFETY: `raw` is the tensor just handed over, read and then deleted once here.
        let device = unsafe { (*raw).dl_tensor.device };
        assert_eq!((device.device_type, device.device_id), (want, id), "{what}");
        if want == KDL_CUDA_MANAGED || want == KDL_CUDA {
            // SAFETY: a tensor this library made; ownership passes to the import.
            let t = unsafe { DlpackTensor::<f32>::from_raw(raw, r.device()) }.unwrap();
            drop(t);
        } else {
            // SAFETY: as above; the import refuses host memory and calls the deleter itself.
            let refused = unsafe { DlpackTensor::<f32>::from_raw(raw, r.device()) };
            assert_eq!(refused.map(drop).unwrap_err().kind(), ErrorKind::Logic, "{what}");
        }
    }
    assert_eq!(live_arrays(), before, "each deleter dropped its array");
}
