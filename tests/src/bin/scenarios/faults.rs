//! Fault-injection scenarios (issue 13): cuBLAS handles exhausting device memory, a kernel
//! fault on the resources' stream, and a bad `RAFT_EXIT_WAIT`; each reports every call's outcome.
use std::process::ExitCode;
use std::time::{Duration, Instant};

use crate::common::{now_ms, report};

/// Fault injection, defect 7: resources take cuBLAS handles until device memory runs out (all but
/// 2 GiB of it is taken first by arrays, so that it takes a few dozen handles, not two thousand).
/// The failure must be `OutOfMemory`; once everything is released, new resources take a handle
/// and multiply matrices again.
pub(crate) fn cublas_oom() {
    const HEADROOM: usize = 2 << 30;
    const CHUNK: usize = 16 << 30;
    const MOST_RESOURCES: usize = 4096;
    let first = raft::DeviceResources::new().expect("resources");
    let free = || first.context().mem_get_info().expect("cuMemGetInfo").0;
    println!("RESULT free_mib={}", free() >> 20);
    // cudaMalloc'd, not from the pool (the pool keeps what it frees; cudaFree gives it back), in
    // chunks: one allocation of nearly all the memory may not find a range that large.
    let cuda = raft::MemoryResource::cuda(first.device()).expect("a cuda_memory_resource");
    let mut filler = Vec::new();
    while free() > HEADROOM + (256 << 20) {
        match raft::DeviceVec::<u8>::new_in(&first, (free() - HEADROOM).min(CHUNK), &cuda) {
            Ok(v) => filler.push(v),
            Err(e) => {
                println!("MESSAGE filler={e}");
                break;
            }
        }
    }
    println!("RESULT filled_free_mib={}", free() >> 20);
    let mut all = vec![first];
    let mut failure = None;
    for _ in 0..MOST_RESOURCES {
        let r = match raft::DeviceResources::new() {
            Ok(r) => r,
            Err(e) => {
                failure = Some(("new", e));
                break;
            }
        };
        let handle = r.cublas_handle();
        all.push(r);
        if let Err(e) = handle {
            failure = Some(("cublas", e));
            break;
        }
    }
    let handles = all.iter().filter(|r| r.has_handle(raft::HandleKind::Cublas).unwrap_or(false)).count();
    match &failure {
        Some((step, e)) => {
            println!("RESULT kind={} step={step} handles={handles}", e.kind());
            println!("MESSAGE oom={e}");
        }
        None => println!("RESULT kind=none handles={handles}"),
    }
    let release_errors = all.iter().map(raft::DeviceResources::release).filter(|r| r.is_err()).count();
    println!("RESULT release_errors={release_errors}");
    drop(all);
    drop(filler);
    // The filler's cudaFree runs on a library release thread: wait for it.
    let deadline = Instant::now() + Duration::from_secs(60);
    while (raft::exit::releases_in_flight() > 0 || raft::stats().live_arrays > 0) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let recovered = (|| -> raft::Result<bool> {
        let r = raft::DeviceResources::new()?;
        r.cublas_handle()?;
        let a = raft::DeviceVec::from_host(&r, &[1.0f32, 2.0, 3.0, 4.0])?;
        let b = raft::DeviceVec::from_host(&r, &[0.0f32, 1.0, 1.0, 0.0])?;
        let mut c = raft::DeviceVec::<f32>::zeros(&r, 4)?;
        let layout = raft::Layout::RowMajor;
        raft::gemm(1.0, a.matrix(2, 2, layout)?, b.matrix(2, 2, layout)?, 0.0, c.matrix_mut(2, 2, layout)?)?;
        r.sync()?;
        let product = c.to_host()?;
        r.release()?;
        Ok(product == [2.0, 1.0, 4.0, 3.0])
    })();
    report("recovery", &recovered);
    println!("RESULT recovered={}", if recovered == Ok(true) { "yes" } else { "no" });
}

/// A kernel that stores through a null pointer: an illegal-address fault. PTX, loaded by the
/// driver (the workspace's cudarc has no NVRTC). Volatile, so no compiler drops the store.
const FAULT_PTX: &std::ffi::CStr = c".version 7.0
.target sm_75
.address_size 64

.visible .entry fault()
{
    .reg .b32 %r<2>;
    .reg .b64 %rd<2>;

    mov.u64 %rd1, 0;
    mov.u32 %r1, 1;
    st.volatile.global.u32 [%rd1], %r1;
    ret;
}
";

/// Queues the faulting kernel on `stream` (the module is never unloaded: the context it lives in
/// is lost with the fault anyway).
fn launch_fault(stream: &raft::cudarc::driver::CudaStream) -> raft::Result<()> {
    use raft::cudarc::driver::result as cu;
    const WHO: &str = "launch_fault";
    let driver = |e| raft::Error::driver(WHO, e);
    stream.context().bind_to_thread().map_err(driver)?;
    // SAFETY: the image is a NUL-terminated PTX text, read by the driver up to its NUL.
    let module = unsafe { cu::module::load_data(FAULT_PTX.as_ptr().cast()) }.map_err(driver)?;
    let name = std::ffi::CString::new("fault").expect("no NUL in the name");
    // SAFETY: `module` was just loaded and is never unloaded.
    let function = unsafe { cu::module::get_function(module, name) }.map_err(driver)?;
    // SAFETY: `fault` takes no parameters and the stream is alive (borrowed). Its store faults
    // in the GPU's memory management unit (nothing is mapped at address 0): no memory is
    // written, the device's context is lost, which is what this scenario is about.
    unsafe { cu::launch_kernel(function, (1, 1, 1), (1, 1, 1), 0, stream.cu_stream(), &mut []) }.map_err(driver)
}

/// Fault injection "kernel fault": after an illegal-address kernel on the resources' stream,
/// every call reports the fault as a `Cuda` error; `main` then returns 7 (see soundness.rs).
pub(crate) fn kernel_fault() -> ExitCode {
    let res = raft::DeviceResources::new().expect("resources");
    let stream = res.stream().expect("stream");
    report("launch", &launch_fault(&stream));
    drop(stream);
    report("sync", &res.sync());
    report("zeros", &raft::DeviceVec::<f32>::zeros(&res, 4));
    report("from_host", &raft::DeviceVec::from_host(&res, &[1.0f32, 2.0, 3.0, 4.0]));
    report("release", &res.release());
    println!("RESULT released={}", res.is_released());
    report("new", &raft::DeviceResources::new());
    println!("RESULT main_end_ms={}", now_ms());
    ExitCode::from(7)
}

/// A bad `RAFT_EXIT_WAIT` (set by the parent) refuses a job, under the API the user called; a
/// scoped wait, or a default set in code, still lets jobs be made.
pub(crate) fn spawn_bad_exit_wait() {
    let res = raft::DeviceResources::new().expect("resources");
    report("spawn", &res.spawn(|| ()));
    let scoped = raft::exit::with_exit_wait(1.0, || res.spawn(|| 6 * 7).and_then(raft::JobHandle::join)).expect("a valid wait");
    report("scoped", &scoped);
    raft::exit::set_default_exit_wait(1.0).expect("a valid wait");
    report("after_default", &res.spawn(|| ()).and_then(raft::JobHandle::join));
    res.release().expect("release");
}

/// The fourteenth audit: an error code stored in the library's context object (cudarc's safe
/// `record_err`; cudarc's own drops store theirs there too) was read as the failure of the
/// library's next bind of that object. `STORED_ERROR` picks the code: `illegal-address` ("the
/// context is dead") made a registered slice's unregistration skip the driver, handing the
/// slice back page-locked (registering it again then failed as "already page-locked");
/// `invalid-value` made it stop the process. Reports both registrations' outcomes.
pub(crate) fn stored_error_unregister() {
    use cudarc::driver::sys::CUresult;
    let code = match std::env::var("STORED_ERROR").as_deref() {
        Ok("illegal-address") => CUresult::CUDA_ERROR_ILLEGAL_ADDRESS,
        Ok("invalid-value") => CUresult::CUDA_ERROR_INVALID_VALUE,
        other => panic!("STORED_ERROR={other:?}"),
    };
    let res = raft::DeviceResources::new().expect("resources");
    let mut data = vec![1.0f32; 1 << 20];
    let first = raft::RegisteredSlice::scope(&res, &mut data, |_| {
        res.context().record_err::<()>(Err(cudarc::driver::DriverError(code)));
    });
    report("first", &first);
    let again = raft::RegisteredSlice::scope(&res, &mut data, |_| ());
    report("again", &again);
    // Whatever the library left stored, so that nothing later reads it.
    println!("RESULT stored_left={}", res.context().check_err().is_err());
}

/// The fourteenth audit: a memory failure callback that panics with a payload whose own `Drop`
/// panics. The payload was dropped inside the shim's `extern "C"` callback, where the second
/// panic cannot unwind: the process aborted. Now the allocation fails as out of memory.
pub(crate) fn failure_callback_payload_panics() {
    struct Bomb;
    impl Drop for Bomb {
        fn drop(&mut self) {
            panic!("the payload's drop panics");
        }
    }
    let res = raft::DeviceResources::new().expect("resources");
    let mr = raft::MemoryResource::cuda(0)
        .and_then(|m| m.with_limit(1 << 20))
        .and_then(|m| m.with_failure_callback(|_| std::panic::panic_any(Bomb)))
        .expect("a limited resource with a failure callback");
    let v = raft::DeviceVec::<u8>::new_in(&res, 2 << 20, &mr);
    report("alloc", &v.map(|v| v.len()));
    drop(mr);
    res.release().expect("release");
}
