//! GEMM through the resources' cuBLAS handle (`gemm`, `GemmScalar`): the shim call and the
//! operands it checks, above the buffers it reads and writes.
use super::buffer::NativeBuffer;
use super::{api, check, ContextGuard, DeviceScalar, NativeResources};
use crate::error::{Error, Result};
use raft_sys as sys;
use std::ffi::{c_int, c_void};

/// One GEMM operand as cuBLAS (column-major) reads it: `rows × cols` (after `op`), stored
/// column-major from element `offset` of its buffer with leading dimension `ld`, `transposed`
/// meaning cuBLAS applies `op = T`.
pub(crate) struct Operand<'a> {
    pub(crate) buffer: &'a NativeBuffer,
    /// Where the matrix starts in the buffer, in elements (a sub-matrix's first element).
    pub(crate) offset: usize,
    /// Rows and columns of the matrix as stored (before cuBLAS's `op`).
    pub(crate) stored_rows: usize,
    pub(crate) stored_cols: usize,
    pub(crate) ld: usize,
    pub(crate) transposed: bool,
}

impl Operand<'_> {
    fn check<T>(&self, who: &'static str, name: &str) -> Result<()> {
        extent_check::<T>(who, name, self.buffer.bytes, self.offset, self.stored_rows, self.stored_cols, self.ld)
    }

    /// The first element's address (inside the buffer once [`check`](Self::check)ed).
    fn raw<T>(&self) -> Raw {
        Raw { data: (self.buffer.data as *const T).wrapping_add(self.offset).cast(), ld: self.ld, transposed: self.transposed }
    }
}

/// An operand in another library's memory (an imported DLPack tensor, checked when imported),
/// described as [`Operand`] describes an array's.
pub(crate) struct Foreign<'a> {
    pub(crate) view: &'a super::dlpack::Checked,
    pub(crate) stored_rows: usize,
    pub(crate) stored_cols: usize,
    pub(crate) ld: usize,
    pub(crate) transposed: bool,
}

/// Refuses an operand whose elements, as cuBLAS will address them, leave its memory of `bytes`:
/// element (r, c) lies at `offset + c * ld + r`, so the last is
/// `offset + (cols - 1) * ld + rows - 1`.
fn extent_check<T>(who: &'static str, name: &str, bytes: usize, offset: usize, rows: usize, cols: usize, ld: usize) -> Result<()> {
    if ld < rows.max(1) {
        return Err(Error::logic(who, format!("{name}: leading dimension {ld} is below its {rows} rows")));
    }
    let elements = bytes / std::mem::size_of::<T>();
    let needed = if rows == 0 || cols == 0 { Some(0) } else { (cols - 1).checked_mul(ld).and_then(|n| n.checked_add(rows)) };
    match needed.and_then(|n| n.checked_add(offset)) {
        Some(n) if n <= elements => Ok(()),
        _ => Err(Error::logic(
            who,
            format!(
                "{name}: a {rows}×{cols} matrix with leading dimension {ld} from element {offset} needs more than the {elements} elements of its array"
            ),
        )),
    }
}

/// Element types cuBLAS multiplies here: `f32` (cublasSgemm), `f64` (cublasDgemm), and
/// `half::f16` / `half::bf16` (cublasGemmEx with `CUBLAS_COMPUTE_32F`: products accumulated in
/// `f32`, tensor cores allowed, the result rounded once to the element type).
///
/// For the half types `alpha` and `beta` are given in the element type, as for the others (one
/// signature for every `T`), and widened to `f32` for cuBLAS, which takes `f32` scalars with a
/// 32-bit compute type; the widening is exact, so `alpha = 1, beta = 0` means exactly that.
///
/// Integer arrays have no GEMM here (cuBLAS's integer GEMM is `i8` in, `i32` out, another
/// signature):
///
/// ```compile_fail
/// fn takes<T: raft_core::GemmScalar>() {}
/// takes::<i32>();
/// ```
pub trait GemmScalar: DeviceScalar + sealed::Sealed {}
impl GemmScalar for f32 {}
impl GemmScalar for f64 {}
impl GemmScalar for half::f16 {}
impl GemmScalar for half::bf16 {}

mod sealed {
    pub trait Sealed {
        fn run(
            who: &'static str,
            api: &raft_sys::RaftrsShim,
            args: &super::GemmArgs<'_>,
            alpha: Self,
            beta: Self,
        ) -> crate::error::Result<()>
        where
            Self: Sized;
    }
}

/// One checked operand as the calls take it.
struct Raw {
    data: *const c_void,
    ld: usize,
    transposed: bool,
}

#[doc(hidden)]
pub struct GemmArgs<'a> {
    res: &'a NativeResources,
    m: usize,
    n: usize,
    k: usize,
    a: Raw,
    b: Raw,
    c: *mut c_void,
    ldc: usize,
}

macro_rules! gemm_scalar {
    ($t:ty, $call:ident) => {
        impl sealed::Sealed for $t {
            fn run(who: &'static str, api: &sys::RaftrsShim, g: &GemmArgs<'_>, alpha: $t, beta: $t) -> Result<()> {
                // SAFETY: every operand's extent (from its offset, with its leading dimension) was checked against its buffer by `gemm`, which
                // holds the borrows (C exclusively) for the call; the resources are alive for the
                // borrow.
                let status = unsafe {
                    api.$call(
                        g.res.ptr.as_ptr(),
                        g.a.transposed as i32,
                        g.b.transposed as i32,
                        g.m as i64,
                        g.n as i64,
                        g.k as i64,
                        alpha,
                        g.a.data as *const $t,
                        g.a.ld as i64,
                        g.b.data as *const $t,
                        g.b.ld as i64,
                        beta,
                        g.c as *mut $t,
                        g.ldc as i64,
                    )
                };
                check(who, api, status)
            }
        }
    };
}
gemm_scalar!(f32, raftrs_gemm_f32);
gemm_scalar!(f64, raftrs_gemm_f64);

macro_rules! gemm_half {
    ($t:ty, $dtype:expr) => {
        impl sealed::Sealed for $t {
            fn run(who: &'static str, _api: &sys::RaftrsShim, g: &GemmArgs<'_>, alpha: $t, beta: $t) -> Result<()> {
                gemm_ex(who, g, $dtype, alpha.to_f32(), beta.to_f32())
            }
        }
    };
}
gemm_half!(half::f16, cublas_ex::CUDA_R_16F);
gemm_half!(half::bf16, cublas_ex::CUDA_R_16BF);

/// `cublasGemmEx` on the resources' handle, with `f32` accumulation.
///
/// The shim has entry points for `S`/`D` only; rather than grow its ABI for two more, the half
/// types call cuBLAS directly, in the very `libcublas.so.13` the shim linked (looked up with
/// `RTLD_NOLOAD`, never loaded by another name: RAFT's handle is only valid in the library that
/// made it). The same steps as the shim's GEMM: the device's context current, the handle bound
/// to the resources' stream and in host pointer mode, every dimension in cuBLAS's `int` range.
fn gemm_ex(who: &'static str, g: &GemmArgs<'_>, dtype: i32, alpha: f32, beta: f32) -> Result<()> {
    int_range(who, [g.m, g.n, g.k, g.a.ld, g.b.ld, g.ldc])?;
    // Made (or found) first: the handle's creation is what guarantees cuBLAS is loaded.
    let handle = g.res.handle(who, super::HandleCode(sys::RAFTRS_HANDLE_CUBLAS))?;
    let lib = cublas_ex::table(who)?;
    let _ctx = ContextGuard::bind(who, g.res.stream.context())?;
    let op = |t: bool| if t { cublas_ex::CUBLAS_OP_T } else { cublas_ex::CUBLAS_OP_N };
    // SAFETY: `handle` is the resources' live cuBLAS handle (they are borrowed for the call) and
    // the functions come from the library that made it; the stream is the resources' own (alive:
    // held by them); every operand's extent was checked against its buffer by `gemm`, which holds
    // the borrows (C exclusively) for the call; alpha and beta are locals read during the call
    // (host pointer mode is set first); the dimensions fit `int` (checked above).
    // Relaxed, as the shim's GEMMs: cuBLAS's work at a handle's first GEMM (or a kernel's first
    // load) is refused beside another thread's global capture, which the refusal invalidates
    // (run 189); the resources' stream is not being captured here (refused by `gemm`).
    super::relaxed(|| unsafe {
        cublas_ex::status(
            who,
            "binding the cuBLAS handle to the resources' stream",
            (lib.set_stream)(handle, g.res.stream.cu_stream() as *mut c_void),
        )?;
        cublas_ex::status(who, "setting cuBLAS's host pointer mode", (lib.set_pointer_mode)(handle, cublas_ex::CUBLAS_POINTER_MODE_HOST))?;
        cublas_ex::status(
            who,
            "the half-precision matrix product (cublasGemmEx, f32 accumulation)",
            (lib.gemm_ex)(
                handle,
                op(g.a.transposed),
                op(g.b.transposed),
                g.m as c_int,
                g.n as c_int,
                g.k as c_int,
                (&alpha as *const f32).cast(),
                g.a.data,
                dtype,
                g.a.ld as c_int,
                g.b.data,
                dtype,
                g.b.ld as c_int,
                (&beta as *const f32).cast(),
                g.c,
                dtype,
                g.ldc as c_int,
                cublas_ex::CUBLAS_COMPUTE_32F,
                cublas_ex::CUBLAS_GEMM_DEFAULT,
            ),
        )
    })
}

/// Refuses a dimension cuBLAS's 32-bit `int` arguments cannot carry (it would wrap to a smaller
/// or negative extent than the one checked against the buffers).
fn int_range(who: &'static str, dims: [usize; 6]) -> Result<()> {
    match dims.iter().find(|&&d| d > i32::MAX as usize) {
        Some(d) => Err(Error::logic(who, format!("a dimension of {d} is out of cuBLAS's int range"))),
        None => Ok(()),
    }
}

/// The few cuBLAS entry points `gemm_ex` calls, typed with plain `int`s for cuBLAS's enums (a
/// status value Rust does not know stays a number, never an invalid enum).
mod cublas_ex {
    use crate::error::{Error, ErrorKind, Result};
    use std::ffi::{c_int, c_void, CStr};
    use std::sync::OnceLock;

    pub(super) const CUDA_R_16F: c_int = 2;
    pub(super) const CUDA_R_16BF: c_int = 14;
    pub(super) const CUBLAS_COMPUTE_32F: c_int = 68;
    pub(super) const CUBLAS_GEMM_DEFAULT: c_int = -1;
    pub(super) const CUBLAS_OP_N: c_int = 0;
    pub(super) const CUBLAS_OP_T: c_int = 1;
    pub(super) const CUBLAS_POINTER_MODE_HOST: c_int = 0;
    const CUBLAS_STATUS_SUCCESS: c_int = 0;
    const CUBLAS_STATUS_ALLOC_FAILED: c_int = 3;

    // The values are cuBLAS's (cudarc's generated bindings of the same headers say so).
    use cudarc::cublas::sys as cb;
    static_assertions::const_assert_eq!(CUDA_R_16F, cb::cudaDataType::CUDA_R_16F as c_int);
    static_assertions::const_assert_eq!(CUDA_R_16BF, cb::cudaDataType::CUDA_R_16BF as c_int);
    static_assertions::const_assert_eq!(CUBLAS_COMPUTE_32F, cb::cublasComputeType_t::CUBLAS_COMPUTE_32F as c_int);
    static_assertions::const_assert_eq!(CUBLAS_GEMM_DEFAULT, cb::cublasGemmAlgo_t::CUBLAS_GEMM_DFALT as c_int);
    static_assertions::const_assert_eq!(CUBLAS_OP_T, cb::cublasOperation_t::CUBLAS_OP_T as c_int);
    static_assertions::const_assert_eq!(CUBLAS_POINTER_MODE_HOST, cb::cublasPointerMode_t::CUBLAS_POINTER_MODE_HOST as c_int);
    static_assertions::const_assert_eq!(CUBLAS_STATUS_ALLOC_FAILED, cb::cublasStatus_t::CUBLAS_STATUS_ALLOC_FAILED as c_int);

    type Handle = *mut c_void;
    type GemmEx = unsafe extern "C" fn(
        Handle,
        c_int,
        c_int,
        c_int,
        c_int,
        c_int,
        *const c_void,
        *const c_void,
        c_int,
        c_int,
        *const c_void,
        c_int,
        c_int,
        *const c_void,
        *mut c_void,
        c_int,
        c_int,
        c_int,
        c_int,
    ) -> c_int;

    pub(super) struct Table {
        pub(super) set_stream: unsafe extern "C" fn(Handle, *mut c_void) -> c_int,
        pub(super) set_pointer_mode: unsafe extern "C" fn(Handle, c_int) -> c_int,
        pub(super) gemm_ex: GemmEx,
    }

    /// The shim's cuBLAS (the soname it is linked against), resolved once.
    pub(super) fn table(who: &'static str) -> Result<&'static Table> {
        static TABLE: OnceLock<std::result::Result<Table, String>> = OnceLock::new();
        TABLE.get_or_init(resolve).as_ref().map_err(|m| Error::new(ErrorKind::Cuda, who, m.clone()))
    }

    fn resolve() -> std::result::Result<Table, String> {
        const LIB: &CStr = c"libcublas.so.13";
        // SAFETY: RTLD_NOLOAD only finds a library already in the process (the shim's NEEDED
        // cuBLAS), running no initialiser; the handle is never closed, so the symbols stay valid.
        let lib = unsafe { libc::dlopen(LIB.as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_NOW) };
        if lib.is_null() {
            return Err("libcublas.so.13 is not loaded in this process (the shim links it): cannot call cublasGemmEx".into());
        }
        let sym = |name: &CStr| {
            // SAFETY: `lib` is a live handle; dlsym only reads the library's symbol table.
            let p = unsafe { libc::dlsym(lib, name.as_ptr()) };
            if p.is_null() {
                Err(format!("libcublas.so.13 has no {}", name.to_string_lossy()))
            } else {
                Ok(p)
            }
        };
        let (set_stream, set_pointer_mode, gemm_ex) =
            (sym(c"cublasSetStream_v2")?, sym(c"cublasSetPointerMode_v2")?, sym(c"cublasGemmEx")?);
        // SAFETY: each symbol is the cuBLAS function of that name, whose C signature (cublas_api.h,
        // CUDA 13) the types above spell with `int` for its enums (all `int`-sized C enums).
        unsafe {
            Ok(Table {
                set_stream: std::mem::transmute::<*mut c_void, unsafe extern "C" fn(Handle, *mut c_void) -> c_int>(set_stream),
                set_pointer_mode: std::mem::transmute::<*mut c_void, unsafe extern "C" fn(Handle, c_int) -> c_int>(set_pointer_mode),
                gemm_ex: std::mem::transmute::<*mut c_void, GemmEx>(gemm_ex),
            })
        }
    }

    /// A cuBLAS status as this crate's error: `OutOfMemory` for its allocation failure.
    pub(super) fn status(who: &'static str, what: &str, status: c_int) -> Result<()> {
        match status {
            CUBLAS_STATUS_SUCCESS => Ok(()),
            CUBLAS_STATUS_ALLOC_FAILED => Err(Error::new(ErrorKind::OutOfMemory, who, format!("{what}: CUBLAS_STATUS_ALLOC_FAILED"))),
            s => Err(Error::new(ErrorKind::Cuda, who, format!("{what}: cuBLAS status {s}"))),
        }
    }
}

/// Refuses operands whose shapes after cuBLAS's `op` (each given as stored rows, stored columns
/// and whether it is transposed) are not `op(A)` m×k and `op(B)` k×n: the one check of both
/// entry points, an array's and another library's memory.
fn chain(who: &'static str, a: (usize, usize, bool), b: (usize, usize, bool), m: usize, n: usize, k: usize) -> Result<()> {
    let after_op = |(rows, cols, transposed): (usize, usize, bool)| if transposed { (cols, rows) } else { (rows, cols) };
    let ((ar, ac), (br, bc)) = (after_op(a), after_op(b));
    if (ar, ac, br, bc) != (m, k, k, n) {
        return Err(Error::logic(who, format!("shapes do not chain: op(A) {ar}×{ac}, op(B) {br}×{bc}, C {m}×{n}")));
    }
    Ok(())
}

/// Column-major `C = alpha · op(A) · op(B) + beta · C` (C is m×n, not transposed) through the
/// resources' cuBLAS handle, on their stream. Every extent is checked against its buffer first:
/// a shape cuBLAS would read or write past an array is a `Logic` error, never a call. The
/// caller holds C's elements exclusively.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm<T: GemmScalar>(
    who: &'static str,
    res: &NativeResources,
    m: usize,
    n: usize,
    k: usize,
    alpha: T,
    a: &Operand<'_>,
    b: &Operand<'_>,
    beta: T,
    c: &Operand<'_>,
) -> Result<()> {
    chain(who, (a.stored_rows, a.stored_cols, a.transposed), (b.stored_rows, b.stored_cols, b.transposed), m, n, k)?;
    if (c.stored_rows, c.stored_cols, c.transposed) != (m, n, false) {
        return Err(Error::logic(who, format!("C is {}×{}, the product {m}×{n}", c.stored_rows, c.stored_cols)));
    }
    a.check::<T>(who, "A")?;
    b.check::<T>(who, "B")?;
    c.check::<T>(who, "C")?;
    for s in [&a.buffer.stream, &b.buffer.stream, &c.buffer.stream] {
        if s.cu_stream() != res.stream.cu_stream() {
            return Err(Error::logic(who, "A, B and C must be ordered on the resources' stream"));
        }
    }
    let api = api(who)?;
    refuse_capture_of_gemm(who, &res.stream)?;
    let _keep = ContextGuard::save(who)?;
    let args = GemmArgs { res, m, n, k, a: a.raw::<T>(), b: b.raw::<T>(), c: c.raw::<T>().data as *mut c_void, ldc: c.ld };
    let ran = T::run(who, api, &args, alpha, beta);
    stop_if_captured_meanwhile(who, &res.stream);
    ran
}

/// A GEMM queued on a stream being captured into a CUDA graph would run at each launch of the
/// graph, reading and writing the arrays after they may be gone (and through a cuBLAS handle, and
/// its workspace, a release destroys): refused, as copies and zeroing are.
pub(crate) fn refuse_capture_of_gemm(who: &'static str, stream: &cudarc::driver::CudaStream) -> Result<()> {
    super::refuse_capture(who, [stream]).map_err(|e| match e.kind() {
        crate::error::ErrorKind::Logic => Error::logic(
            who,
            "the stream is being captured into a CUDA graph: the graph would run the GEMM at each launch, after its \
             arrays may be gone; run it before the capture begins or after it ends",
        ),
        _ => e,
    })
}

/// A capture begun meanwhile on another thread may have taken the GEMM into its graph, which
/// would then write the array at each launch: as for a copy or a memset, the process stops.
fn stop_if_captured_meanwhile(who: &'static str, stream: &cudarc::driver::CudaStream) {
    if super::captured_meanwhile(stream) {
        raft_exit::abort_with(format_args!("{who}: a CUDA graph capture began on a stream while a GEMM was queued on it; aborting"));
    }
}

/// `C = alpha · op(A) · op(B)` (C overwritten) with A and B in another library's memory (see
/// [`gemm`]: the same checks against each operand's extent). The caller ordered the producer's
/// work before the resources' stream (the import's contract).
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_foreign<T: GemmScalar>(
    who: &'static str,
    res: &NativeResources,
    m: usize,
    n: usize,
    k: usize,
    alpha: T,
    a: &Foreign<'_>,
    b: &Foreign<'_>,
    c: &mut NativeBuffer,
    ldc: usize,
) -> Result<()> {
    chain(who, (a.stored_rows, a.stored_cols, a.transposed), (b.stored_rows, b.stored_cols, b.transposed), m, n, k)?;
    extent_check::<T>(who, "A", a.view.bytes, 0, a.stored_rows, a.stored_cols, a.ld)?;
    extent_check::<T>(who, "B", b.view.bytes, 0, b.stored_rows, b.stored_cols, b.ld)?;
    extent_check::<T>(who, "C", c.bytes, 0, m, n, ldc)?;
    if c.stream.cu_stream() != res.stream.cu_stream() {
        return Err(Error::logic(who, "C must be ordered on the resources' stream"));
    }
    let api = api(who)?;
    refuse_capture_of_gemm(who, &res.stream)?;
    let _keep = ContextGuard::save(who)?;
    let raw = |f: &Foreign<'_>| Raw { data: f.view.data as *const c_void, ld: f.ld, transposed: f.transposed };
    let args = GemmArgs { res, m, n, k, a: raw(a), b: raw(b), c: c.data, ldc };
    let ran = T::run(who, api, &args, alpha, T::default());
    stop_if_captured_meanwhile(who, &res.stream);
    ran
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn operands_chain_after_their_op_or_are_refused() {
        // A stored 3×2 and transposed is op(A) 2×3; B stored 3×4 is op(B) 3×4: C is 2×4.
        assert!(chain("gemm", (3, 2, true), (3, 4, false), 2, 4, 3).is_ok());
        let e = chain("gemm", (3, 2, false), (3, 4, false), 3, 4, 2).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Logic);
        assert_eq!(e.to_string(), "gemm: shapes do not chain: op(A) 3×2, op(B) 3×4, C 3×4");
        assert!(chain("gemm", (2, 3, false), (4, 3, true), 2, 4, 3).is_ok());
        assert!(chain("gemm", (2, 3, false), (4, 3, true), 2, 5, 3).is_err(), "C's columns");
    }

    #[test]
    fn dimensions_past_cublas_int_are_refused_not_wrapped() {
        assert!(int_range("gemm", [1, 2, 3, i32::MAX as usize, 5, 6]).is_ok());
        let e = int_range("gemm", [1, 2, 3, 4, 1 << 31, 6]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Logic);
        assert_eq!(e.to_string(), "gemm: a dimension of 2147483648 is out of cuBLAS's int range");
    }

    #[test]
    fn cublas_statuses_become_this_crate_s_errors() {
        assert!(cublas_ex::status("gemm", "x", 0).is_ok());
        assert_eq!(cublas_ex::status("gemm", "x", 3).unwrap_err().kind(), ErrorKind::OutOfMemory);
        let e = cublas_ex::status("gemm", "the product", 13).unwrap_err();
        assert_eq!((e.kind(), e.to_string()), (ErrorKind::Cuda, "gemm: the product: cuBLAS status 13".to_string()));
    }

    #[test]
    #[cfg_attr(miri, ignore = "loads the shim (dlopen)")]
    fn without_the_shim_s_cublas_in_the_process_gemm_ex_is_an_error_not_a_panic() {
        // cudarc's own loader would panic, or load another cuBLAS than the one that made RAFT's
        // handle. The shim (which loads cuBLAS) is found in this process too, so the check runs
        // in a child of this test binary whose `RAFT_RS_SHIM` names no file: nothing loads
        // cuBLAS there. (It returned early when the shim loaded, which it does here: the test
        // could not fail.)
        const CHILD: &str = "RAFT_CORE_TEST_NO_SHIM_CHILD";
        if std::env::var_os(CHILD).is_some() {
            assert!(crate::result::api("t").is_err(), "the shim loaded from a path that does not exist");
            let e = cublas_ex::table("gemm").err().expect("no cuBLAS is loaded without the shim");
            assert_eq!(e.kind(), ErrorKind::Cuda);
            assert!(e.message().contains("libcublas.so.13 is not loaded"), "{e}");
            return;
        }
        let name = "result::gemm::tests::without_the_shim_s_cublas_in_the_process_gemm_ex_is_an_error_not_a_panic";
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", name, "--nocapture", "--test-threads=1"])
            .env(CHILD, "1")
            .env("RAFT_RS_SHIM", "/nonexistent/raft/libraftrs_shim.so")
            .output()
            .unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success() && text.contains("1 passed"), "{text}");
    }
}
