//! `raft_py`: a Python extension over raft-rs's resources. Tensors come in and go out through
//! DLPack (`__dlpack__` / `__dlpack_device__`, so `torch.from_dlpack`, `cupy.from_dlpack`,
//! `jax.dlpack.from_dlpack` take what it returns), with no copy either way.
//!
//! - `gemm(a, b)`: `a @ b` of two CUDA matrices (f32, f64, f16, bf16; C or Fortran order) on the
//!   calling thread's default resources of their device, returned as a new row-major `Tensor`.
//! - `zeros(n, dtype)`, `address_of(t)`: an array made here, and where a tensor's data is as
//!   seen here (the no-copy checks of the tests).
//! - `rmm_map_address()`, `live_arrays()`: the process's RMM per-device map as the shim binds it,
//!   and the arrays alive (the one-RMM and leak checks).
//!
//! The stream handshake: importing, this extension passes its resources' stream to the
//! producer's `__dlpack__(stream=...)`, so the producer orders its work before it; exporting,
//! `Tensor.__dlpack__(stream=s)` makes the consumer's stream `s` wait for the array's work (`s`
//! is used during the call only), and the array's free, at the consumer's deleter, wait for the
//! work queued so far on every blocking stream (the legacy default stream's order: PyTorch's
//! default stream, CuPy's streams), whatever stream the consumer named (`None` and `-1`
//! included); work on a non-blocking stream of the consumer's own is the consumer's to finish
//! before it lets the tensor go. Waits on the host (a handshake beside a capture, making
//! resources, an allocation's out-of-memory retry) run without the GIL.
use pyo3::exceptions::{PyBufferError, PyMemoryError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use raft::dlpack::{DLManagedTensor, DLManagedTensorVersioned, DlDataType, KDL_CUDA, KDL_CUDA_MANAGED};
use raft::half::{bf16, f16};
use raft::{DeviceResources, DeviceVec, DlpackElement, DlpackExport, DlpackTensor, ErrorKind};
use std::ffi::{c_void, CStr};
use std::sync::Mutex;

fn py_err(e: raft::Error) -> PyErr {
    match e.kind() {
        ErrorKind::Logic => PyValueError::new_err(e.to_string()),
        ErrorKind::OutOfMemory => PyMemoryError::new_err(e.to_string()),
        _ => PyRuntimeError::new_err(e.to_string()),
    }
}

const VERSIONED: &CStr = c"dltensor_versioned";
const UNVERSIONED: &CStr = c"dltensor";
const USED_VERSIONED: &CStr = c"used_dltensor_versioned";
const USED_UNVERSIONED: &CStr = c"used_dltensor";

/// A capsule owning the raw tensor `raw` under `name`; its destructor deletes the tensor unless a
/// consumer renamed it (took it). Where no capsule could be made (null, a Python error set), it
/// took nothing: the tensor is deleted here, once.
///
/// # Safety
/// `raw` is a fresh tensor owned by the caller, whose ownership passes here; `delete` is its
/// deleter; `destructor` deletes a tensor of `raw`'s kind under `name`.
unsafe fn capsule_of<M>(
    raw: *mut M,
    name: &'static CStr,
    destructor: unsafe extern "C" fn(*mut ffi::PyObject),
    delete: Option<unsafe extern "C" fn(*mut M)>,
) -> *mut ffi::PyObject {
    // SAFETY: the caller's contract; the name is 'static.
    unsafe {
        let capsule = ffi::PyCapsule_New(raw as *mut c_void, name.as_ptr(), Some(destructor));
        if capsule.is_null() {
            if let Some(delete) = delete {
                delete(raw);
            }
        }
        capsule
    }
}

/// A capsule nobody consumed still owns its tensor (DLPack's Python rule: a consumer renames it
/// `used_…`): its destructor deletes it.
unsafe extern "C" fn drop_versioned_capsule(capsule: *mut ffi::PyObject) {
    // SAFETY: called by Python with the capsule being destroyed; the name check tells whether
    // the tensor is still ours (a consumer renames the capsule when it takes the tensor).
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, VERSIONED.as_ptr()) == 1 {
            let p = ffi::PyCapsule_GetPointer(capsule, VERSIONED.as_ptr()) as *mut DLManagedTensorVersioned;
            if let Some(d) = p.as_ref().and_then(|t| t.deleter) {
                d(p);
            }
        }
    }
}

unsafe extern "C" fn drop_unversioned_capsule(capsule: *mut ffi::PyObject) {
    // SAFETY: as in `drop_versioned_capsule`.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, UNVERSIONED.as_ptr()) == 1 {
            let p = ffi::PyCapsule_GetPointer(capsule, UNVERSIONED.as_ptr()) as *mut DLManagedTensor;
            if let Some(d) = p.as_ref().and_then(|t| t.deleter) {
                d(p);
            }
        }
    }
}

/// A device array made here, until a consumer takes it through `__dlpack__` (once).
#[pyclass(module = "raft_py")]
struct Tensor {
    export: Mutex<Option<DlpackExport>>,
    /// DLPack's device of the memory (`DlpackExport::device`): `(kDLCUDA, device)` unless the
    /// array came from a pinned-host, managed or system-memory resource.
    dl_device: (i32, i32),
    data_ptr: u64,
    shape: Vec<i64>,
}

impl Tensor {
    fn new(export: DlpackExport) -> Self {
        let (data_ptr, shape, d) = (export.data_ptr(), export.shape().to_vec(), export.device());
        Tensor { export: Mutex::new(Some(export)), dl_device: (d.device_type, d.device_id), data_ptr, shape }
    }
}

#[pymethods]
impl Tensor {
    /// DLPack's producer side (array API standard, DLPack 1.x).
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__(
        &self,
        py: Python<'_>,
        stream: Option<isize>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Py<PyAny>> {
        if copy == Some(true) {
            return Err(PyBufferError::new_err(
                "raft_py.Tensor.__dlpack__: copy=True is not supported (the tensor is handed over in place)",
            ));
        }
        if let Some(d) = dl_device {
            if d != self.__dlpack_device__() {
                return Err(PyBufferError::new_err(format!(
                    "raft_py.Tensor.__dlpack__: the tensor is on {:?}, asked for {d:?}",
                    self.__dlpack_device__()
                )));
            }
        }
        // The stream, checked before the tensor is taken (a refusal leaves it for the next call).
        // A handle is a pointer into the driver's memory: 0 is ambiguous, other negatives and
        // small or unaligned values are never one. Beyond that, no driver call can tell a live
        // handle from a stale one: the value is trusted for the handshake only, as the DLPack
        // protocol trusts it (PyTorch and CuPy as producers do too), and never kept: the free is
        // ordered after the legacy default stream instead, for every tensor handed over.
        match stream {
            None | Some(-1 | 1 | 2) => {}
            Some(0) => return Err(PyValueError::new_err("raft_py.Tensor.__dlpack__: stream 0 is ambiguous for CUDA (use 1 or 2)")),
            Some(s) if s < 4096 || s % 8 != 0 => {
                return Err(PyValueError::new_err(format!(
                    "raft_py.Tensor.__dlpack__: stream {s} is not a CUDA stream (None, -1, 1, 2 or a cudaStream_t)"
                )))
            }
            Some(_) => {}
        }
        // Taken out, and the lock let go at once: the wait below runs without the GIL, and a
        // thread holding the GIL must never wait for this lock meanwhile.
        let taken = self.export.lock().unwrap_or_else(|e| e.into_inner()).take();
        let mut export = taken.ok_or_else(|| PyBufferError::new_err("raft_py.Tensor.__dlpack__: the tensor was already handed over"))?;
        let ordered = match stream {
            // The consumer will synchronise itself (or uses the data on the host side of a wait).
            Some(-1) => Ok(()),
            // Without the GIL: beside a capture of the consumer's stream the order is a host
            // wait for the array's work, which may wait for a stream whose host function needs
            // the GIL (the seventeenth audit).
            Some(s) => {
                let (back, ordered) = py.detach(move || {
                    // SAFETY: 1, 2, or (checked above to look like one) the consumer's live
                    // stream of the tensor's device, which the protocol has the consumer name
                    // for this call (the consumer is inside it while this runs); it is used
                    // during the call only.
                    let ordered = unsafe { export.order_before_stream(s as usize) };
                    (export, ordered)
                });
                export = back;
                ordered
            }
            // A host wait: without the GIL, so other Python threads run meanwhile.
            None => {
                let (back, waited) = py.detach(move || {
                    let waited = export.synchronize();
                    (export, waited)
                });
                export = back;
                waited
            }
        };
        if let Err(e) = ordered {
            // Not handed over: the tensor stays with this object for the next call.
            *self.export.lock().unwrap_or_else(|e| e.into_inner()) = Some(export);
            return Err(py_err(e));
        }
        let versioned = max_version.is_some_and(|(major, _)| major >= 1);
        // SAFETY: each raw tensor is fresh, owned, and handed to `capsule_of` once with its own
        // name, destructor and deleter.
        let capsule = unsafe {
            if versioned {
                let raw = export.into_raw();
                capsule_of(raw, VERSIONED, drop_versioned_capsule, (*raw).deleter)
            } else {
                let raw = export.into_raw_unversioned();
                capsule_of(raw, UNVERSIONED, drop_unversioned_capsule, (*raw).deleter)
            }
        };
        // SAFETY: a new reference, or null with the Python error set.
        unsafe { Bound::from_owned_ptr_or_err(py, capsule) }.map(Bound::unbind)
    }

    fn __dlpack_device__(&self) -> (i32, i32) {
        self.dl_device
    }

    /// The device address of the data (compare with `torch_tensor.data_ptr()`).
    #[getter]
    fn data_ptr(&self) -> u64 {
        self.data_ptr
    }

    #[getter]
    fn shape(&self) -> Vec<i64> {
        self.shape.clone()
    }
}

/// An imported tensor of one of the GEMM element types.
enum Imported {
    F32(DlpackTensor<f32>),
    F64(DlpackTensor<f64>),
    F16(DlpackTensor<f16>),
    Bf16(DlpackTensor<bf16>),
    Other(DlpackTensor<u8>, DlDataType),
}

/// The dtype a raw tensor declares, read before taking it as a typed view.
///
/// # Safety
/// `p` is a valid versioned (`versioned`) or unversioned managed tensor.
unsafe fn raw_dtype(p: *mut c_void, versioned: bool) -> Option<DlDataType> {
    // SAFETY: the caller's contract; the version (the leading field every major version keeps)
    // is read through a raw place, and the rest of the struct only under the major version this
    // library reads (no reference to the whole struct is made before).
    unsafe {
        if versioned {
            let t = p as *const DLManagedTensorVersioned;
            let major = std::ptr::addr_of!((*t).version.major).read();
            (major == 1).then(|| std::ptr::addr_of!((*t).dl_tensor.dtype).read())
        } else {
            Some((*(p as *const DLManagedTensor)).dl_tensor.dtype)
        }
    }
}

/// Takes the raw tensor `p` as a typed view (checked; its deleter runs once either way).
///
/// # Safety
/// `p` is a valid versioned (`versioned`) or unversioned managed tensor whose ownership passes
/// here: it came out of a capsule the caller took (renamed), and nobody else calls its deleter.
unsafe fn typed<T: DlpackElement>(p: *mut c_void, versioned: bool, device: usize) -> raft::Result<DlpackTensor<T>> {
    // SAFETY: the caller's contract is the one `from_raw` / `from_raw_unversioned` ask.
    unsafe {
        if versioned {
            DlpackTensor::from_raw(p as *mut DLManagedTensorVersioned, device)
        } else {
            DlpackTensor::from_raw_unversioned(p as *mut DLManagedTensor, device)
        }
    }
}

/// `obj`'s `__dlpack_device__()`, refused unless CUDA device memory (or managed memory) of a
/// device number that can be one: checked before any resources are made for it.
fn cuda_device_of(obj: &Bound<'_, PyAny>) -> PyResult<usize> {
    let (kind, id): (i32, i32) = obj.call_method0("__dlpack_device__")?.extract()?;
    if kind != KDL_CUDA && kind != KDL_CUDA_MANAGED {
        return Err(PyTypeError::new_err(format!("raft_py: a tensor on device type {kind}, not CUDA memory")));
    }
    usize::try_from(id).map_err(|_| PyValueError::new_err(format!("raft_py: a CUDA tensor on device {id}, which no device is")))
}

/// Takes `obj`'s tensor through `__dlpack__`, ordered before `res`'s stream.
fn import(obj: &Bound<'_, PyAny>, res: &DeviceResources) -> PyResult<Imported> {
    let id = cuda_device_of(obj)?;
    if id != res.device() {
        return Err(PyValueError::new_err(format!("raft_py: a tensor on device {id}, resources on device {}", res.device())));
    }
    let stream = res.stream().map_err(py_err)?.cu_stream() as usize as isize;
    let py = obj.py();
    let kwargs = pyo3::types::PyDict::new(py);
    kwargs.set_item("stream", stream)?;
    kwargs.set_item("max_version", (1u32, 1u32))?;
    let capsule = match obj.call_method("__dlpack__", (), Some(&kwargs)) {
        Ok(c) => c,
        // A producer older than DLPack 1.0 knows no max_version.
        Err(e) if e.is_instance_of::<PyTypeError>(py) => {
            kwargs.del_item("max_version")?;
            obj.call_method("__dlpack__", (), Some(&kwargs))?
        }
        Err(e) => return Err(e),
    };
    let cap = capsule.as_ptr();
    // SAFETY: `cap` is alive (held by `capsule`); the name checks tell which tensor it holds; the
    // rename makes its destructor leave the tensor to us (DLPack's Python protocol).
    let (p, versioned) = unsafe {
        let versioned = ffi::PyCapsule_IsValid(cap, VERSIONED.as_ptr()) == 1;
        if !versioned && ffi::PyCapsule_IsValid(cap, UNVERSIONED.as_ptr()) != 1 {
            return Err(PyTypeError::new_err("raft_py: __dlpack__ returned no unused DLPack capsule"));
        }
        let name = if versioned { VERSIONED } else { UNVERSIONED };
        let p = ffi::PyCapsule_GetPointer(cap, name.as_ptr());
        if p.is_null() {
            return Err(PyErr::fetch(py));
        }
        if ffi::PyCapsule_SetName(cap, if versioned { USED_VERSIONED } else { USED_UNVERSIONED }.as_ptr()) != 0 {
            return Err(PyErr::fetch(py));
        }
        (p, versioned)
    };
    let device = res.device();
    // SAFETY: `p` is a valid tensor of the kind the capsule's name says.
    let dtype = unsafe { raw_dtype(p, versioned) };
    // SAFETY (each `typed`): `p` came out of the capsule taken (renamed) above, of the kind its
    // name says; exactly one `typed` call takes it.
    let t = match dtype {
        Some(d) if d == f32::DTYPE => Imported::F32(unsafe { typed(p, versioned, device) }.map_err(py_err)?),
        Some(d) if d == f64::DTYPE => Imported::F64(unsafe { typed(p, versioned, device) }.map_err(py_err)?),
        Some(d) if d == f16::DTYPE => Imported::F16(unsafe { typed(p, versioned, device) }.map_err(py_err)?),
        Some(d) if d == bf16::DTYPE => Imported::Bf16(unsafe { typed(p, versioned, device) }.map_err(py_err)?),
        // Taken (and its deleter run) by a view that refuses it with the reason.
        _ => {
            let d = dtype.unwrap_or(u8::DTYPE);
            Imported::Other(unsafe { typed(p, versioned, device) }.map_err(py_err)?, d)
        }
    };
    Ok(t)
}

/// The calling thread's default resources of `obj`'s device, once `obj` is known to be CUDA
/// memory: a host tensor, or a device number below 0, is refused before anything is made (the
/// nineteenth audit: a CPU tensor made device 0's context and resources first, and its refusal
/// on a machine without a driver said "no CUDA driver" instead of "not CUDA memory").
fn resources_for(obj: &Bound<'_, PyAny>) -> PyResult<DeviceResources> {
    let id = cuda_device_of(obj)?;
    // Without the GIL: making resources may wait for pending releases.
    obj.py().detach(|| raft::current_device_resources(id)).map_err(py_err)
}

/// `a @ b` (2-D, or 1-D as a row) on the calling thread's default resources of their device.
#[pyfunction]
fn gemm(py: Python<'_>, a: &Bound<'_, PyAny>, b: &Bound<'_, PyAny>) -> PyResult<Tensor> {
    let res = resources_for(a)?;
    let (ia, ib) = (import(a, &res)?, import(b, &res)?);
    let out = py.detach(move || {
        fn run<T: raft::GemmScalar + DlpackElement>(
            res: &DeviceResources,
            one: T,
            a: &DlpackTensor<T>,
            b: &DlpackTensor<T>,
        ) -> raft::Result<DlpackExport> {
            raft::gemm_dlpack(res, one, a, b)?.into_dlpack()
        }
        match (&ia, &ib) {
            (Imported::F32(a), Imported::F32(b)) => Ok(run(&res, 1.0f32, a, b)),
            (Imported::F64(a), Imported::F64(b)) => Ok(run(&res, 1.0f64, a, b)),
            (Imported::F16(a), Imported::F16(b)) => Ok(run(&res, f16::ONE, a, b)),
            (Imported::Bf16(a), Imported::Bf16(b)) => Ok(run(&res, bf16::ONE, a, b)),
            (Imported::Other(_, d), _) | (_, Imported::Other(_, d)) => Err(format!("raft_py.gemm: dtype {d:?} has no GEMM here")),
            _ => Err("raft_py.gemm: a and b have different dtypes".to_string()),
        }
    });
    let export = out.map_err(PyTypeError::new_err)?.map_err(py_err)?;
    Ok(Tensor::new(export))
}

/// `n` zeros of `dtype` ("float32", "float16", "bfloat16", "int8", "uint8", "int32", "int64")
/// made here, as a 1-D tensor.
#[pyfunction]
#[pyo3(signature = (n, dtype="float32", device=0))]
fn zeros(py: Python<'_>, n: usize, dtype: &str, device: usize) -> PyResult<Tensor> {
    fn z<T: DlpackElement>(device: usize, n: usize) -> raft::Result<DlpackExport> {
        let res = raft::current_device_resources(device)?;
        DeviceVec::<T>::zeros(&res, n)?.into_dlpack()
    }
    let make: fn(usize, usize) -> raft::Result<DlpackExport> = match dtype {
        "float32" => z::<f32>,
        "float64" => z::<f64>,
        "float16" => z::<f16>,
        "bfloat16" => z::<bf16>,
        "int8" => z::<i8>,
        "uint8" => z::<u8>,
        "int32" => z::<i32>,
        "int64" => z::<i64>,
        other => return Err(PyValueError::new_err(format!("raft_py.zeros: unknown dtype {other:?}"))),
    };
    // Without the GIL: making resources may wait for pending releases, and an allocation's
    // out-of-memory retry for the releases of its device (seconds).
    let e = py.detach(|| make(device, n));
    Ok(Tensor::new(e.map_err(py_err)?))
}

/// Where `obj`'s data is as this extension imports it (taken through `__dlpack__`, viewed in
/// place, let go): equal to the producer's own pointer when nothing was copied.
#[pyfunction]
fn address_of(obj: &Bound<'_, PyAny>) -> PyResult<u64> {
    let res = resources_for(obj)?;
    Ok(match import(obj, &res)? {
        Imported::F32(t) => t.data_ptr(),
        Imported::F64(t) => t.data_ptr(),
        Imported::F16(t) => t.data_ptr(),
        Imported::Bf16(t) => t.data_ptr(),
        Imported::Other(t, _) => t.data_ptr(),
    })
}

/// The address of RMM's per-device resource map as the shim this extension loaded binds it.
#[pyfunction]
fn rmm_map_address() -> PyResult<usize> {
    raft::memory::rmm_map_address().map_err(py_err)
}

/// Device arrays alive in this process's raft-rs (the leak check).
#[pyfunction]
fn live_arrays() -> usize {
    raft::stats().live_arrays
}

#[pymodule]
fn raft_py(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Tensor>()?;
    m.add_function(wrap_pyfunction!(gemm, m)?)?;
    m.add_function(wrap_pyfunction!(zeros, m)?)?;
    m.add_function(wrap_pyfunction!(address_of, m)?)?;
    m.add_function(wrap_pyfunction!(rmm_map_address, m)?)?;
    m.add_function(wrap_pyfunction!(live_arrays, m)?)?;
    Ok(())
}
