//! What the driver refuses in a thread's own global capture mode while another thread captures
//! an unrelated stream in global mode (the mode PyTorch's captures default to; the eleventh,
//! twelfth and thirteenth audits): every wait, query, allocation, free and construction the
//! library makes for the user runs relaxed where the driver would refuse it, so it succeeds and
//! leaves that other capture valid. Captures of the resources' own stream: `capture.rs`.
use raft::{DeviceResources, DeviceVec, PinnedVec, RegisteredSlice};
use raft_tests::global_capture::{capture_mode_now, serial, while_another_thread_captures_globally};
use raft_tests::patterns::{pattern_f32, pattern_u8, same};
use raft_tests::require_gpu;
use raft_tests::OutputWithin;

/// Resources released while another thread captures an unrelated stream in global mode (the
/// eleventh audit): the release's first look at its stream (`cuStreamQuery`, before its wait) ran
/// in the thread's own global mode, which the driver refuses during such a capture, invalidating
/// it; the release then failed. Now the look is relaxed, as the wait after it is: the release
/// drains and destroys, and the other capture stays valid. (Before: a `Cuda` error, and the other
/// thread's capture invalidated.)
#[test]
fn a_release_while_another_thread_captures_in_global_mode_drains_and_leaves_that_capture_valid() {
    require_gpu!();
    let _one = serial();
    let res = DeviceResources::new().unwrap();
    let ctx = res.stream().unwrap().context().clone(); // the stream handed out: the release drains it
    let v = DeviceVec::<f32>::zeros(&res, 1 << 20).unwrap();
    res.sync().unwrap();
    let (released, other) = while_another_thread_captures_globally(&ctx, || res.release());
    released.unwrap();
    other.unwrap_or_else(|e| panic!("the release invalidated another thread's capture: {e}"));
    drop(v);
}

/// Memory of `cudaMalloc` freed (on a release thread) while another thread captures an unrelated
/// stream in global mode (the eleventh audit): in the release thread's own global mode the driver
/// may refuse the `cudaFree`, which RMM swallows, leaking the block. Now the free runs relaxed:
/// the memory goes back to the device. The other capture's fate is printed, not asserted: a
/// `cudaFree` synchronises the device, which the driver may count against a capture.
#[test]
fn memory_freed_while_another_thread_captures_in_global_mode_goes_back_to_the_device() {
    require_gpu!();
    let _one = serial();
    use raft::MemoryResource;
    let res = DeviceResources::new().unwrap();
    let ctx = res.context().clone();
    let mr = MemoryResource::cuda(0).unwrap();
    const BYTES: usize = 4 << 30;
    let v = DeviceVec::<u8>::new_in(&res, BYTES, &mr).unwrap();
    res.sync().unwrap();
    let (free_before, _) = ctx.mem_get_info().unwrap();
    let ((), other) = while_another_thread_captures_globally(&ctx, || {
        drop(v); // a release thread frees it
        raft_tests::settle_releases(std::time::Duration::from_secs(30));
    });
    println!("the other thread's capture: {other:?}");
    let (free_after, _) = ctx.mem_get_info().unwrap();
    assert!(
        free_after >= free_before + BYTES / 2,
        "the block freed during another thread's global capture did not go back: {free_before} bytes free before the free, {free_after} after"
    );
}

/// An array of a binning resource installed by another library, whose one bin is plain
/// `cudaMalloc`/`cudaFree`, dropped while another thread captures an unrelated stream in global
/// mode (the fifteenth audit): the binning resource's async upstream made every one of its frees
/// look stream-ordered, so the array was freed inline, in the thread's own global mode, where the
/// driver refuses the bin's `cudaFree` and RMM swallows the refusal: the block never went back.
/// Now a binning resource this library did not make frees as "may block" (a release thread,
/// relaxed, after a stream wait). In a child process: the other library's resource stays
/// installed to its exit.
#[test]
fn an_array_of_another_library_s_binning_resource_dropped_while_another_thread_captures_goes_back_to_the_device() {
    const BYTES: usize = 1 << 30;
    if std::env::var_os("RAFT_CAPTURE_CHILD").is_some_and(|v| v == "foreign-binning") {
        let res = DeviceResources::new().unwrap();
        let ctx = res.context().clone();
        raft_tests::foreign::install_binning_with_a_cuda_malloc_bin(0, BYTES);
        let v = DeviceVec::<u8>::new(&res, BYTES).unwrap();
        res.sync().unwrap();
        let (free_before, _) = ctx.mem_get_info().unwrap();
        let ((), other) = while_another_thread_captures_globally(&ctx, || {
            drop(v);
            raft_tests::settle_releases(std::time::Duration::from_secs(30));
        });
        let (free_after, _) = ctx.mem_get_info().unwrap();
        println!("free before the drop {free_before}, after {free_after}; the other thread's capture: {other:?}");
        println!("RESULT freed={}", free_after >= free_before + BYTES / 2);
        return;
    }
    require_gpu!();
    let _one = serial();
    let (stdout, stderr) = child(
        "an_array_of_another_library_s_binning_resource_dropped_while_another_thread_captures_goes_back_to_the_device",
        "foreign-binning",
    );
    assert!(
        stdout.contains("RESULT freed=true"),
        "the block of another library's binning resource, freed during another thread's global capture, did not go back:\n{stdout}\n{stderr}"
    );
}

/// Runs this binary's test `name` alone in a child process with `RAFT_CAPTURE_CHILD=role` (a test
/// whose failure would stop the process, or that needs a process of its own): the child's
/// standard output and error, once it ended normally.
fn child(name: &str, role: &str) -> (String, String) {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env("RAFT_CAPTURE_CHILD", role)
        .output_within(std::time::Duration::from_secs(300));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned());
    assert!(out.status.success(), "the child stopped: {:?}\n{stdout}\n{stderr}", out.status);
    (stdout, stderr)
}

/// A slice registered and unregistered while another thread captures an unrelated stream in
/// global mode (the eleventh audit): `cuMemHostRegister` / `cuMemHostUnregister` ran in the
/// thread's own global mode, which the driver may refuse during such a capture; a refused
/// unregistration stops the process (a slice is never handed back page-locked). Now both run
/// relaxed: the scope ends normally. In a child process, which a stop would end.
#[test]
fn a_slice_registered_while_another_thread_captures_in_global_mode_is_unregistered() {
    if std::env::var_os("RAFT_CAPTURE_CHILD").is_some_and(|v| v == "register") {
        let res = DeviceResources::new().unwrap();
        let ctx = res.context().clone();
        let mut host = pattern_u8(1 << 20, 89);
        let (scoped, other) = while_another_thread_captures_globally(&ctx, || RegisteredSlice::scope(&res, &mut host, |r| r.len()));
        println!("RESULT scope={scoped:?} other={other:?}");
        return;
    }
    require_gpu!();
    let _one = serial();
    let (stdout, stderr) = child("a_slice_registered_while_another_thread_captures_in_global_mode_is_unregistered", "register");
    assert!(stdout.contains(&format!("RESULT scope=Ok({})", 1 << 20)), "the registration failed:\n{stdout}\n{stderr}");
}

/// Staged copies (page-locked slots reused once their events say so) while another thread
/// captures an unrelated stream in global mode (the twelfth audit): the slots' `cuEventQuery`
/// ran in the thread's own global mode, which the driver refuses during such a capture,
/// invalidating it; the copy failed. Now the query is relaxed, as the waits are. (Before: a
/// `Cuda` error, and the other thread's capture invalidated.)
#[test]
fn staged_copies_while_another_thread_captures_in_global_mode_succeed_and_leave_that_capture_valid() {
    require_gpu!();
    let _one = serial();
    let res = DeviceResources::new().unwrap();
    let ctx = res.context().clone();
    // 4 MiB, staged both ways; the staging's slots are made before the capture begins (only
    // their reuse is asked about).
    let host = pattern_f32(1 << 20, 97);
    let mut v = DeviceVec::from_host(&res, &host).unwrap();
    same("the warm-up copy", &v.to_host().unwrap(), &host);
    let back = pattern_f32(1 << 20, 98);
    let (copied, other) = while_another_thread_captures_globally(&ctx, || v.copy_from_host(&back[..]).and_then(|()| v.to_host()));
    let copied = copied.unwrap_or_else(|e| panic!("a staged copy failed during another thread's global capture: {e}"));
    other.unwrap_or_else(|e| panic!("the staged copies invalidated another thread's capture: {e}"));
    same("the staged copies", &copied, &back);
}

/// Copies too small to stage (a pageable `cudaMemcpyAsync`, then a relaxed wait) while another
/// thread captures an unrelated stream in global mode: both go ahead and the capture stays valid.
#[test]
fn small_copies_while_another_thread_captures_in_global_mode_succeed_and_leave_that_capture_valid() {
    require_gpu!();
    let _one = serial();
    let res = DeviceResources::new().unwrap();
    let ctx = res.context().clone();
    let host = pattern_f32(4096, 99);
    let mut v = DeviceVec::<f32>::zeros(&res, 4096).unwrap();
    res.sync().unwrap();
    let (copied, other) = while_another_thread_captures_globally(&ctx, || v.copy_from_host(&host[..]).and_then(|()| v.to_host()));
    let copied = copied.unwrap_or_else(|e| panic!("a small copy failed during another thread's global capture: {e}"));
    other.unwrap_or_else(|e| panic!("the small copies invalidated another thread's capture: {e}"));
    same("the small copies", &copied, &host);
}

/// `Transfer::is_finished` while another thread captures an unrelated stream in global mode (the
/// twelfth audit): its event query was refused in the thread's own global mode, so it answered
/// "finished" with the copy running, and the other thread's capture was invalidated. Now the
/// query is relaxed. (Before: the capture invalidated.)
#[test]
fn a_transfer_asked_while_another_thread_captures_in_global_mode_leaves_that_capture_valid() {
    require_gpu!();
    let _one = serial();
    let res = DeviceResources::new().unwrap();
    let ctx = res.context().clone();
    const N: usize = 64 << 20; // 256 MiB
    let src = DeviceVec::<f32>::zeros(&res, N).unwrap();
    let dst = PinnedVec::<f32>::new(&res, N).unwrap();
    res.sync().unwrap();
    let transfer = res.transfer_to_host(src, dst).unwrap();
    let (asked, other) = while_another_thread_captures_globally(&ctx, || transfer.is_finished());
    let (_src, dst) = transfer.wait().unwrap();
    println!("is_finished during the other thread's capture: {asked}");
    other.unwrap_or_else(|e| panic!("asking whether a transfer finished invalidated another thread's capture: {e}"));
    assert_eq!(dst.len(), N);
}

/// `DeviceResources::sync_raft` while another thread captures an unrelated stream in global mode
/// (the twelfth audit): RAFT's `sync_stream` polled the stream in the thread's own global mode,
/// which the driver refuses during such a capture, invalidating it. Now the shim relaxes the mode
/// around it. (Before: a `Cuda` error, and the other thread's capture invalidated.)
#[test]
fn sync_raft_while_another_thread_captures_in_global_mode_waits_and_leaves_that_capture_valid() {
    require_gpu!();
    let _one = serial();
    let res = DeviceResources::new().unwrap();
    let ctx = res.context().clone();
    let _v = DeviceVec::<f32>::zeros(&res, 1 << 20).unwrap();
    let (synced, other) = while_another_thread_captures_globally(&ctx, || res.sync_raft());
    synced.unwrap_or_else(|e| panic!("sync_raft failed during another thread's global capture: {e}"));
    other.unwrap_or_else(|e| panic!("sync_raft invalidated another thread's capture: {e}"));
}

/// Memory from `cudaMalloc` and `cudaHostAlloc` allocated while another thread captures an
/// unrelated stream in global mode (the twelfth audit): the allocations ran in the thread's own
/// global mode, which the driver refuses during such a capture for calls it deems unsafe, as it
/// refused their frees before the eleventh audit. Now both run relaxed, as their frees do (the
/// stream-ordered pools' allocations are not touched).
#[test]
fn memory_allocated_while_another_thread_captures_in_global_mode_is_allocated_and_leaves_that_capture_valid() {
    require_gpu!();
    let _one = serial();
    use raft::MemoryResource;
    let res = DeviceResources::new().unwrap();
    let ctx = res.context().clone();
    let mr = MemoryResource::cuda(0).unwrap();
    drop(PinnedVec::<u8>::new(&res, 1).unwrap()); // the default pinned resource made before
    let ((device, host), other) = while_another_thread_captures_globally(&ctx, || {
        (DeviceVec::<u8>::new_in(&res, 64 << 20, &mr), PinnedVec::<u8>::new(&res, 64 << 20))
    });
    let device = device.unwrap_or_else(|e| panic!("cudaMalloc during another thread's global capture: {e}"));
    let host = host.unwrap_or_else(|e| panic!("cudaHostAlloc during another thread's global capture: {e}"));
    other.unwrap_or_else(|e| panic!("the allocations invalidated another thread's capture: {e}"));
    assert_eq!((device.len(), host.len()), (64 << 20, 64 << 20));
}

/// `with_relaxed_capture` puts the thread's own capture mode back, also when its closure panics
/// (the review of the twelfth audit: a panic caught further up, as `catch_unwind` or a job's
/// join does, left the thread relaxed for good, so its unsafe calls no longer showed up against
/// other threads' global captures).
#[test]
fn with_relaxed_capture_puts_the_mode_back_also_after_a_panic() {
    require_gpu!();
    use cudarc::driver::sys::CUstreamCaptureMode as Mode;
    let _res = DeviceResources::new().unwrap(); // the driver loaded
    assert_eq!(capture_mode_now(), Mode::CU_STREAM_CAPTURE_MODE_GLOBAL);
    assert_eq!(raft::with_relaxed_capture(capture_mode_now), Mode::CU_STREAM_CAPTURE_MODE_RELAXED);
    assert_eq!(capture_mode_now(), Mode::CU_STREAM_CAPTURE_MODE_GLOBAL);
    let caught = std::panic::catch_unwind(|| raft::with_relaxed_capture(|| panic!("a panic inside")));
    assert!(caught.is_err());
    assert_eq!(capture_mode_now(), Mode::CU_STREAM_CAPTURE_MODE_GLOBAL, "a panic left the thread relaxed");
}

/// A cuBLAS handle's creation and a pool's first block (`cudaMalloc` from its upstream) while
/// another thread captures an unrelated stream in global mode (the twelfth audit's review): both
/// ran in the thread's own global mode. Now the shim relaxes it around a handle's creation and
/// a memory resource's construction.
#[test]
fn a_handle_and_a_pool_made_while_another_thread_captures_in_global_mode_leave_that_capture_valid() {
    require_gpu!();
    let _one = serial();
    use raft::{MemoryResource, PoolOptions};
    let res = DeviceResources::new().unwrap();
    let ctx = res.context().clone();
    let cuda = MemoryResource::cuda(0).unwrap();
    let ((handle, pool), other) =
        while_another_thread_captures_globally(&ctx, || (res.cublas_handle().map(|_| ()), cuda.pool(PoolOptions::initial(64 << 20))));
    handle.unwrap_or_else(|e| panic!("a cuBLAS handle during another thread's global capture: {e}"));
    let pool = pool.unwrap_or_else(|e| panic!("a pool during another thread's global capture: {e}"));
    other.unwrap_or_else(|e| panic!("making a handle and a pool invalidated another thread's capture: {e}"));
    drop(pool);
}

/// A pool and a binning resource growing from `cudaMalloc` while another thread captures an
/// unrelated stream in global mode (the thirteenth audit; the twelfth left it open): the growth's
/// `cudaMalloc` ran in the thread's own global mode, which the driver refuses during such a
/// capture, invalidating it, and the allocation failed. Now the shim calls a pool's or a binning
/// resource's upstream relaxed (only the upstream's calls: an allocation the pool serves itself
/// pays nothing). (Before: `OutOfMemory` from RMM's `bad_alloc`, and the other capture
/// invalidated.)
#[test]
fn pools_grown_while_another_thread_captures_in_global_mode_grow_and_leave_that_capture_valid() {
    require_gpu!();
    let _one = serial();
    use raft::{MemoryResource, PoolOptions};
    let res = DeviceResources::new().unwrap();
    let ctx = res.context().clone();
    let cuda = MemoryResource::cuda(0).unwrap();
    let pool = cuda.pool(PoolOptions::initial(1 << 20)).unwrap();
    // Bins of 256 B to 64 KiB, each taking its blocks from the upstream 128 at a time (RMM's
    // fixed_size_memory_resource: 32 KiB for the smallest): 10 000 blocks of 256 B grow the
    // smallest bin 78 times.
    let binning = cuda.binning(8, 16).unwrap();
    let ((grown, binned), other) = while_another_thread_captures_globally(&ctx, || {
        let grown = DeviceVec::<u8>::new_in(&res, 64 << 20, &pool);
        let binned: raft::Result<Vec<DeviceVec<u8>>> = (0..10_000).map(|_| DeviceVec::<u8>::new_in(&res, 256, &binning)).collect();
        (grown, binned)
    });
    let grown = grown.unwrap_or_else(|e| panic!("a pool's growth during another thread's global capture: {e}"));
    let binned = binned.unwrap_or_else(|e| panic!("a bin's growth during another thread's global capture: {e}"));
    other.unwrap_or_else(|e| panic!("the growths invalidated another thread's capture: {e}"));
    assert_eq!((grown.len(), binned.len()), (64 << 20, 10_000));
}

/// The first GEMM of a resources object while another thread captures an unrelated stream in
/// global mode (the thirteenth audit): the GEMM made the cuBLAS handle in the thread's own
/// global mode (the twelfth audit's review relaxed only `cublas_handle()`), which the driver
/// refuses during such a capture, invalidating it. Now the shim runs every GEMM relaxed (see
/// the next test). (Before: a `Cuda` error from the handle's creation, and the other capture
/// invalidated.)
#[test]
fn a_first_gemm_while_another_thread_captures_in_global_mode_runs_and_leaves_that_capture_valid() {
    require_gpu!();
    let _one = serial();
    use raft::{HandleKind, Layout};
    let res = DeviceResources::new().unwrap();
    let ctx = res.context().clone();
    let n = 64;
    let a = DeviceVec::from_host(&res, &vec![1.0f32; n * n]).unwrap();
    let b = DeviceVec::from_host(&res, &vec![2.0f32; n * n]).unwrap();
    let mut c = DeviceVec::<f32>::zeros(&res, n * n).unwrap();
    res.sync().unwrap();
    assert!(!res.has_handle(HandleKind::Cublas).unwrap(), "the GEMM below must make the handle");
    let (ran, other) = while_another_thread_captures_globally(&ctx, || {
        let (a, b) = (a.matrix(n, n, Layout::ColMajor)?, b.matrix(n, n, Layout::ColMajor)?);
        raft::gemm(1.0, a, b, 0.0, c.matrix_mut(n, n, Layout::ColMajor)?)
    });
    ran.unwrap_or_else(|e| panic!("a first GEMM during another thread's global capture: {e}"));
    other.unwrap_or_else(|e| panic!("the first GEMM invalidated another thread's capture: {e}"));
    assert!(c.to_host().unwrap().iter().all(|&x| x == 2.0 * n as f32), "the product is wrong");
}

/// Arrays of the default async pool allocated and freed while another thread captures an
/// unrelated stream in global mode (the thirteenth audit): `cuMemAllocFromPoolAsync` and
/// `cuMemFreeAsync` ran in the thread's own global mode, which the driver refuses during such a
/// capture, invalidating it; RMM swallows a refused free, so the block never went back to the
/// pool. Now every call into this library's async pools runs relaxed. (Before: a `Cuda` error,
/// the other capture invalidated, the freed array's 4 MiB still in use.)
#[test]
fn async_pool_arrays_made_and_dropped_while_another_thread_captures_in_global_mode_leave_that_capture_valid() {
    require_gpu!();
    let _one = serial();
    use raft::MemoryResource;
    let res = DeviceResources::new().unwrap();
    let ctx = res.context().clone();
    let pool = MemoryResource::current(0).unwrap();
    let old = DeviceVec::<f32>::zeros(&res, 1 << 20).unwrap();
    res.sync().unwrap();
    let in_use_before = pool.async_pool_bytes().unwrap().expect("the default resource is an async pool").in_use;
    let (made, other) = while_another_thread_captures_globally(&ctx, || {
        let made = DeviceVec::<f32>::new(&res, 1 << 20);
        drop(old); // freed inline, in stream order
        made
    });
    let made = made.unwrap_or_else(|e| panic!("an async pool's allocation during another thread's global capture: {e}"));
    other.unwrap_or_else(|e| panic!("the allocation and the free invalidated another thread's capture: {e}"));
    drop(made);
    res.sync().unwrap();
    let in_use_after = pool.async_pool_bytes().unwrap().unwrap().in_use;
    assert!(
        in_use_after + (4 << 20) <= in_use_before,
        "the array freed during the capture did not go back to the pool: {in_use_before} bytes in use before, {in_use_after} after"
    );
}

/// An async pool made, asked about and trimmed while another thread captures an unrelated stream
/// in global mode (the thirteenth audit): `cudaMemPoolCreate`, the pool's attributes and its
/// trims ran in the thread's own global mode, refused during such a capture, which the refusal
/// invalidated. Now relaxed. (Before: a `Cuda` error, the other capture invalidated.)
#[test]
fn async_pools_made_and_trimmed_while_another_thread_captures_in_global_mode_leave_that_capture_valid() {
    require_gpu!();
    let _one = serial();
    use raft::MemoryResource;
    let res = DeviceResources::new().unwrap();
    let ctx = res.context().clone();
    let (done, other) = while_another_thread_captures_globally(&ctx, || -> raft::Result<()> {
        let first = MemoryResource::cuda_async(0)?;
        first.async_pool_bytes()?;
        drop(first);
        MemoryResource::cuda_async(0)?.async_pool_bytes()?; // a fresh pool or the retired one
        raft::memory::trim_retired_pools()?;
        Ok(())
    });
    done.unwrap_or_else(|e| panic!("an async pool made, asked about or trimmed during another thread's global capture: {e}"));
    other.unwrap_or_else(|e| panic!("making, asking about or trimming an async pool invalidated another thread's capture: {e}"));
}

/// The first GEMM on a handle made through `cublas_handle()` while another thread captures an
/// unrelated stream in global mode (the thirteenth audit's review asked): the GEMM relaxed the
/// mode only while the handle was not made yet, so what cuBLAS does at a handle's first GEMM ran
/// in the thread's own global mode, which the driver refuses during such a capture. Now every
/// GEMM runs relaxed. The handle is made and the GEMM run inside the same capture window.
/// (Before, run 189: the product right, the other capture invalidated.)
#[test]
fn a_first_gemm_on_a_handle_made_while_another_thread_captures_in_global_mode_runs_and_leaves_that_capture_valid() {
    require_gpu!();
    let _one = serial();
    use raft::{HandleKind, Layout};
    let res = DeviceResources::new().unwrap();
    let ctx = res.context().clone();
    let n = 96;
    let a = DeviceVec::from_host(&res, &vec![1.0f32; n * n]).unwrap();
    let b = DeviceVec::from_host(&res, &vec![3.0f32; n * n]).unwrap();
    let mut c = DeviceVec::<f32>::zeros(&res, n * n).unwrap();
    res.sync().unwrap();
    assert!(!res.has_handle(HandleKind::Cublas).unwrap(), "the handle must be made inside the window");
    let (ran, other) = while_another_thread_captures_globally(&ctx, || {
        res.cublas_handle()?;
        let (a, b) = (a.matrix(n, n, Layout::ColMajor)?, b.matrix(n, n, Layout::ColMajor)?);
        raft::gemm(1.0, a, b, 0.0, c.matrix_mut(n, n, Layout::ColMajor)?)
    });
    ran.unwrap_or_else(|e| panic!("a first GEMM on a handle made during another thread's global capture: {e}"));
    other.unwrap_or_else(|e| panic!("the handle and its first GEMM invalidated another thread's capture: {e}"));
    assert!(c.to_host().unwrap().iter().all(|&x| x == 3.0 * n as f32), "the product is wrong");
}

/// The process's first resources on a device made while another thread captures a stream of the
/// same context in global mode (the thirteenth audit left it open): the first resources set up
/// the device's context object, whose first stream cudarc made with a `cuCtxSynchronize`, a
/// device-wide wait the driver refuses in every capture mode while a stream of the context is
/// captured; the creation failed and the capture was invalidated. Now the library makes a fresh
/// object's first stream without that wait (the object is its own: no work of it can precede
/// the stream). In a child process: the device's context object is made once per process.
/// (Before, runs 186–188: `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`, the capture invalidated.)
#[test]
fn the_first_resources_made_while_another_thread_captures_in_global_mode_are_made_and_leave_that_capture_valid() {
    if std::env::var_os("RAFT_CAPTURE_CHILD").is_some_and(|v| v == "first-resources") {
        // The capture's own context object, made with cudarc alone: nothing of this library yet.
        let ctx = cudarc::driver::CudaContext::new(0).unwrap();
        let (made, other) = while_another_thread_captures_globally(&ctx, || -> raft::Result<(raft::MemoryResourceKind, Vec<f32>)> {
            let res = DeviceResources::new()?;
            let kind = raft::MemoryResource::current(0)?.kind();
            let v = DeviceVec::<f32>::zeros(&res, 1 << 16)?;
            let back = v.to_host()?;
            drop(v);
            res.release()?;
            Ok((kind, back))
        });
        match made {
            Ok((kind, back)) => println!("RESULT kind={kind:?} zeros={} other={other:?}", back.iter().all(|&x| x == 0.0)),
            Err(e) => println!("RESULT error={e} other={other:?}"),
        }
        return;
    }
    require_gpu!();
    let _one = serial();
    let (stdout, stderr) = child(
        "the_first_resources_made_while_another_thread_captures_in_global_mode_are_made_and_leave_that_capture_valid",
        "first-resources",
    );
    assert!(
        stdout.contains("RESULT kind=CudaAsync zeros=true other=Ok(())"),
        "the first resources failed, or the capture was lost:\n{stdout}\n{stderr}"
    );
}

/// The review of the fourteenth audit: the half-precision GEMMs (`cublasGemmEx`, called from
/// Rust, not through the shim) were not relaxed with the shim's: a handle's first `f16` GEMM
/// during another thread's global capture invalidated it, as the `f32` one did (run 189).
#[test]
fn a_first_half_precision_gemm_while_another_thread_captures_in_global_mode_leaves_that_capture_valid() {
    require_gpu!();
    let _one = serial();
    use raft::half::f16;
    use raft::{HandleKind, Layout};
    let res = DeviceResources::new().unwrap();
    let ctx = res.context().clone();
    let n = 64;
    let a = DeviceVec::from_host(&res, &vec![f16::from_f32(1.0); n * n]).unwrap();
    let b = DeviceVec::from_host(&res, &vec![f16::from_f32(2.0); n * n]).unwrap();
    let mut c = DeviceVec::<f16>::zeros(&res, n * n).unwrap();
    res.sync().unwrap();
    assert!(!res.has_handle(HandleKind::Cublas).unwrap(), "the handle must be made inside the window");
    let (ran, other) = while_another_thread_captures_globally(&ctx, || {
        res.cublas_handle()?;
        let (a, b) = (a.matrix(n, n, Layout::ColMajor)?, b.matrix(n, n, Layout::ColMajor)?);
        raft::gemm(f16::from_f32(1.0), a, b, f16::from_f32(0.0), c.matrix_mut(n, n, Layout::ColMajor)?)
    });
    ran.unwrap_or_else(|e| panic!("a first f16 GEMM during another thread's global capture: {e}"));
    other.unwrap_or_else(|e| panic!("the handle and its first f16 GEMM invalidated another thread's capture: {e}"));
    assert!(c.to_host().unwrap().iter().all(|&x| x.to_f32() == 2.0 * n as f32), "the product is wrong");
}

/// Releases `res` (or drops it and waits for its release thread, `dropped`) while another thread
/// captures an unrelated stream in global mode; prints what happened under `label`. The other
/// capture's failure, named, if it was invalidated. The release itself must succeed.
fn let_go_while_another_thread_captures(res: DeviceResources, dropped: bool, label: &str) -> Option<String> {
    res.sync().unwrap();
    let ctx = res.context().clone();
    let (released, other) = while_another_thread_captures_globally(&ctx, || {
        if dropped {
            drop(res);
            raft_tests::settle_releases(std::time::Duration::from_secs(30));
            Ok(())
        } else {
            res.release()
        }
    });
    let how = if dropped { "dropped" } else { "released" };
    println!("{label} {how}: release {released:?}, the other capture {other:?}");
    released.unwrap();
    other.err().map(|e| format!("{label} {how}: {e}"))
}

/// The sixteenth audit (helper 75): resources whose library handles were made, released while
/// another thread captures an unrelated stream in global mode. `cublasDestroy` (and the other
/// libraries' destroys) synchronise the device, which a capture in progress on it does not
/// allow in any mode. Each kind alone, then all four; released, and dropped (a release thread
/// destroys them later).
#[test]
fn resources_with_library_handles_released_while_another_thread_captures_leave_that_capture_valid() {
    require_gpu!();
    let _one = serial();
    use raft::HandleKind;
    let kinds = [HandleKind::Cublas, HandleKind::CusolverDn, HandleKind::CusolverSp, HandleKind::Cusparse];
    let mut broken = Vec::new();
    for (name, which) in [
        ("cuBLAS", &kinds[..1]),
        ("cuSOLVER dense", &kinds[1..2]),
        ("cuSOLVER sparse", &kinds[2..3]),
        ("cuSPARSE", &kinds[3..]),
        ("all four", &kinds[..]),
    ] {
        for dropped in [false, true] {
            let res = DeviceResources::new().unwrap();
            for &k in which {
                res.handle(k).unwrap();
            }
            if let Some(e) = let_go_while_another_thread_captures(res, dropped, &format!("HANDLES {name}")) {
                broken.push(e);
            }
        }
    }
    assert!(broken.is_empty(), "releasing library handles invalidated another thread's capture: {broken:?}");
}

/// The sixteenth audit's review: RAFT's cuBLASLt handle (its `linalg::gemm`, and cuVS through
/// it), made through a lend, let go with the resources while another thread captures an
/// unrelated stream in global mode: `cublasLtDestroy` synchronises the device as `cublasDestroy`
/// does. Now kept as the other handles are. Released, and dropped.
#[test]
fn resources_whose_lend_made_a_cublaslt_handle_released_while_another_thread_captures_leave_that_capture_valid() {
    require_gpu!();
    let _one = serial();
    let mut broken = Vec::new();
    for dropped in [false, true] {
        let res = DeviceResources::new().unwrap();
        let made = res.with_raft_resources(|lent| raft_tests::foreign::cublaslt_handle(&lent)).unwrap();
        assert!(!made.is_null(), "RAFT made no cuBLASLt handle");
        if let Some(e) = let_go_while_another_thread_captures(res, dropped, "CUBLASLT") {
            broken.push(e);
        }
    }
    assert!(broken.is_empty(), "letting RAFT's cuBLASLt handle go invalidated another thread's capture: {broken:?}");
}
