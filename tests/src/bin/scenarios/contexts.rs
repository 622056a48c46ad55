//! Scenarios about which CUDA context the library's memory lands in, each in a fresh process so
//! that the device has not been set up by the library before the step under test.
use cudarc::driver::sys;

/// The nineteenth audit (helper 86): with another library's context of device 0 current on the
/// thread and the library not yet set up on device 0, a memory resource made first (a pool,
/// whose first block it allocates at once) took that block in the foreign context: the shim's
/// device scope binds the primary context only once the library has noted it. The foreign
/// context's destruction then frees the pool's memory under the arrays made from it.
/// Reports the owner of an array made from that pool (`primary` or `foreign`), and whether the
/// array is still usable once the foreign context is destroyed.
pub(crate) fn pool_made_first_under_a_foreign_context() {
    // SAFETY: initialises the driver; no pointer.
    unsafe { sys::cuInit(0) }.result().expect("cuInit");
    let mut foreign: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: makes a new context of device 0 current on this thread; destroyed below, after the
    // library's calls, with no use of it left (checked: nothing of the library's is in it).
    unsafe { sys::cuCtxCreate_v4(&mut foreign, std::ptr::null_mut(), 0, 0) }.result().expect("cuCtxCreate");
    let pool = raft::MemoryResource::cuda(0)
        .and_then(|cuda| cuda.pool(raft::PoolOptions::initial(64 << 20).maximum(64 << 20)))
        .expect("a pool of device 0");
    let res = raft::DeviceResources::on_device(0).expect("resources");
    let primary = res.stream().expect("stream").context().cu_ctx() as usize;
    let mut v = raft::DeviceVec::<f32>::new_in(&res, 1 << 20, &pool).expect("an array from the pool");
    let owner = raft_tests::context_of_address(v.device_address());
    println!(
        "RESULT owner={} foreign_is_primary={}",
        if owner == primary {
            "primary"
        } else if owner == foreign as usize {
            "foreign"
        } else {
            "other"
        },
        foreign as usize == primary
    );
    if owner != primary {
        // The array's memory dies with the foreign context: stop here (using it would fault).
        return;
    }
    // SAFETY: the context made above, current on this thread; nothing of the library's is in it.
    unsafe { sys::cuCtxDestroy_v2(foreign) }.result().expect("cuCtxDestroy");
    let used = v.fill_zero().and_then(|_| v.to_host()).map(|h| h.iter().all(|x| *x == 0.0));
    println!("RESULT used_after_destroy={}", matches!(used, Ok(true)));
}

/// The nineteenth audit (helper 86), two GPUs: an array of device 0 used on a stream of device 1
/// (cudarc's, of device 1's primary context), where the library has made nothing on device 1.
/// With no records context for device 1 the use was taken for one in another library's context:
/// the array was leaked for the life of the process. Reports the tracking resource's live
/// allocations once the array is dropped and its stream synchronised (`live=0` when freed).
pub(crate) fn array_used_on_a_stream_of_a_device_without_resources() {
    let res = raft::DeviceResources::on_device(0).expect("resources on device 0");
    let mr = raft::MemoryResource::cuda_async(0).and_then(|m| m.with_tracking()).expect("a tracking resource");
    let other = cudarc::driver::CudaContext::new(1).expect("device 1's primary context");
    let s1 = other.new_stream().expect("a stream of device 1");
    let v = raft::DeviceVec::<f32>::new_in(&res, 1 << 16, &mr).expect("an array");
    {
        let (_ptr, _guard) = v.try_device_ptr(&s1).expect("a use on device 1's stream");
    }
    drop(v);
    res.sync().expect("sync");
    s1.synchronize().expect("sync device 1's stream");
    // The free is stream-ordered and may go through the release queue: give it a moment.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let mut live = mr.tracked().expect("tracked").count;
    while live > 0 && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(20));
        live = mr.tracked().expect("tracked").count;
    }
    println!("RESULT live={live}");
}
