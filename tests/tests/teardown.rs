//! Pool-like resources let go while kernels still use their memory (issue 33, item 2): the
//! memory must go back upstream only once the work queued on it has ended, and the thread that
//! drops the last array of a pool must not wait for that work.
use cudarc::driver::DevicePtr;
use raft::{gemm, memory, DeviceResources, DeviceVec, Layout, MemoryResource, MemoryResourceKind};
use raft_tests::require_gpu;
use std::time::{Duration, Instant};

/// Square matrices of this side: C is 64 MiB of f32.
const N: usize = 4096;
/// GEMMs queued into C: about a second of an H200 (2·N³ flops each, fp32 without tensor cores).
const GEMMS: usize = 400;

/// One test at a time: each measures how long its own GEMMs run.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// The device address of an array (its guard waits for the array's stream: read it while idle).
fn address(v: &DeviceVec<f32>) -> u64 {
    let (ptr, _sync) = v.device_ptr(v.stream());
    ptr
}

/// Queues `GEMMS` products `C = A·B` (A and B all ones, so every element of C is `N`) into an
/// array of `pool`; returns C and its address (read before any work is queued on it).
fn queue_gemms(res: &DeviceResources, pool: &MemoryResource) -> (DeviceVec<f32>, u64) {
    let ones = vec![1f32; N * N];
    let a = DeviceVec::from_host(res, &ones).unwrap();
    let b = DeviceVec::from_host(res, &ones).unwrap();
    let mut c = DeviceVec::<f32>::new_in(res, N * N, pool).unwrap();
    let c_address = address(&c);
    for _ in 0..GEMMS {
        let (av, bv) = (a.matrix(N, N, Layout::RowMajor).unwrap(), b.matrix(N, N, Layout::RowMajor).unwrap());
        gemm(1.0, av, bv, 0.0, c.matrix_mut(N, N, Layout::RowMajor).unwrap()).unwrap();
    }
    (c, c_address) // A and B are freed stream-ordered after the GEMMs: they stay valid for them
}

/// Allocates C's size from the device's default resource on other resources while the GEMMs run,
/// writes a pattern, waits for the GEMMs, and checks the pattern and the address.
fn reuse_while_running(res: &DeviceResources, c_address: u64, started: Instant) {
    let other = DeviceResources::new().unwrap();
    let pattern: Vec<f32> = (0..N * N).map(|i| -((i % 1000) as f32) - 1.0).collect();
    let mut d = DeviceVec::<f32>::new(&other, N * N).unwrap();
    d.copy_from_host(&pattern).unwrap();
    let d_address = address(&d);
    let written = started.elapsed();
    let waited = Instant::now();
    res.sync().unwrap();
    let gemms_left = waited.elapsed();
    // The test only shows something if the GEMMs were still running when the pattern was written.
    assert!(
        gemms_left > Duration::from_millis(50),
        "the GEMMs ended {written:?} after the drop, before the pattern was written: raise GEMMS"
    );
    let bytes = (N * N * 4) as u64;
    let overlaps = d_address < c_address + bytes && c_address < d_address + bytes;
    assert!(
        !overlaps,
        "memory of a dropped pool was handed out again ({d_address:#x} inside {c_address:#x}+{bytes}) while GEMMs \
         still wrote it ({gemms_left:?} more)"
    );
    let back = d.to_host().unwrap();
    let wrong = back.iter().zip(&pattern).filter(|(x, y)| x != y).count();
    assert_eq!(wrong, 0, "{wrong} of {} elements were overwritten by the dropped pool's GEMMs", N * N);
}

#[test]
fn a_pool_dropped_under_running_gemms_keeps_its_memory_until_they_end() {
    require_gpu!();
    let _one = one_at_a_time();
    let res = DeviceResources::new().unwrap();
    let upstream = memory::current(0).unwrap();
    if upstream.kind() != MemoryResourceKind::CudaAsync {
        eprintln!("note: device 0's resource is {}, not the async pool: reuse may not show", upstream.kind());
    }
    // The pool's one upstream block is exactly C: given back early, it is the first block the
    // async pool can hand out for an allocation of C's size.
    let pool = upstream.pool(raft::PoolOptions::initial(N * N * 4)).unwrap();
    drop(upstream);
    let (c, c_address) = queue_gemms(&res, &pool);
    let started = Instant::now();
    drop(c); // stream-ordered: back to the pool's free list at once
    drop(pool); // the last copy: destroyed on a release thread
                // Before the fix the release thread handed the block back (on the legacy stream) in well
                // under this; the GEMMs run for about a second.
    std::thread::sleep(Duration::from_millis(100));
    reuse_while_running(&res, c_address, started);
}

#[test]
fn the_last_array_of_a_pool_drops_without_waiting_for_its_gemms() {
    require_gpu!();
    let _one = one_at_a_time();
    let res = DeviceResources::new().unwrap();
    let upstream = memory::current(0).unwrap();
    let pool = upstream.pool(raft::PoolOptions::initial(N * N * 4)).unwrap();
    drop(upstream);
    let (c, c_address) = queue_gemms(&res, &pool);
    drop(pool); // C now holds the last copy
    let started = Instant::now();
    drop(c); // the pool's destructor runs here: it must not wait for the GEMMs on this thread
    let dropping = started.elapsed();
    assert!(dropping < Duration::from_millis(50), "dropping the last array of a pool waited {dropping:?} for its GEMMs");
    std::thread::sleep(Duration::from_millis(100));
    reuse_while_running(&res, c_address, started);
    // The deferred pool is destroyed once the GEMMs have ended: nothing stays pending.
    let deadline = Instant::now() + Duration::from_secs(10);
    while raft::stats().releases_pending > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(raft::stats().releases_pending, 0, "the deferred pool was never destroyed");
}

/// Issue 30: the fence holds each stream that freed into the pool and records its event only when
/// it lets the stream go or is destroyed. Frees alternate among three resources; then `a`'s
/// stream is held shut from the host (a `Gate`) with GEMMs into C queued behind it, C is
/// dropped, `a` dropped (its release, on another thread, waits for the gate), the third frees
/// into the pool again, and the pool is dropped; then, gate still shut, an array of C's size is
/// made from the device's resource and a pattern written into it. Its memory must not be C's
/// block (the GEMMs, once the gate opens, would overwrite the pattern). A fence that recorded
/// only at a stream's first free, or forgot a stream when another came, would hand C's block
/// back at once. Each step is timed: none may wait for the shut stream. (Runs 109 to 111 relied
/// on GEMMs outlasting the steps, and saw them end first, 1.07 s after the drop.)
#[test]
fn a_pool_fed_by_alternating_streams_keeps_its_memory_until_a_released_streams_gemms_end() {
    require_gpu!();
    let _one = one_at_a_time();
    let upstream = memory::current(0).unwrap();
    let pool = upstream.pool(raft::PoolOptions::initial(N * N * 4)).unwrap();
    drop(upstream);
    let (a, b, third) = (DeviceResources::new().unwrap(), DeviceResources::new().unwrap(), DeviceResources::new().unwrap());
    for i in 0..96 {
        let on = [&a, &b, &third][i % 3];
        drop(DeviceVec::<f32>::new_in(on, 1024, &pool).unwrap());
    }
    let ones = vec![1f32; N * N];
    let (ma, mb) = (DeviceVec::from_host(&a, &ones).unwrap(), DeviceVec::from_host(&a, &ones).unwrap());
    let mut c = DeviceVec::<f32>::new_in(&a, N * N, &pool).unwrap();
    let c_address = address(&c);
    let stream_a = a.stream().unwrap();
    // What would wait for the whole device is done before the gate shuts (run 114: the first
    // GEMM, making the cuBLAS handle, waited 10 s for it): the handle, and the page-locked
    // buffers a staged copy of the pattern's size uses.
    a.cublas_handle().unwrap();
    let pattern: Vec<f32> = (0..N * N).map(|i| -((i % 1000) as f32) - 1.0).collect();
    DeviceVec::<f32>::new(&b, N * N).unwrap().copy_from_host(&pattern).unwrap();
    let shut = raft_tests::Gate::close(&stream_a);
    let safety = shut.open_after(Duration::from_secs(10)); // a step that waits still ends
    let queueing = Instant::now();
    for _ in 0..8 {
        let (av, bv) = (ma.matrix(N, N, Layout::RowMajor).unwrap(), mb.matrix(N, N, Layout::RowMajor).unwrap());
        gemm(1.0, av, bv, 0.0, c.matrix_mut(N, N, Layout::RowMajor).unwrap()).unwrap();
    }
    let queued_in = queueing.elapsed();
    let done = stream_a.record_event(None).unwrap(); // an event holds no stream
    let shut_at_first = done.try_is_complete();
    drop(stream_a);
    let mut steps: Vec<(&str, Duration)> = Vec::new();
    let mut step = |name: &'static str, f: &mut dyn FnMut()| {
        let t = Instant::now();
        f();
        steps.push((name, t.elapsed()));
    };
    let mut held = Some((c, ma, mb, a));
    // C and the inputs are freed on a's shut stream (stream-ordered), then a's last handle goes.
    step("drop C, the inputs and a (its release waits on another thread)", &mut || drop(held.take()));
    step("a free on the third stream", &mut || drop(DeviceVec::<f32>::new_in(&third, 1024, &pool).unwrap()));
    let mut pool = Some(pool);
    step("drop the pool (destroyed once a's stream is done)", &mut || drop(pool.take()));
    let mut d = None;
    step("an array of C's size from the device's resource, the pattern written", &mut || {
        let mut v = DeviceVec::<f32>::new(&b, N * N).unwrap();
        v.copy_from_host(&pattern).unwrap();
        d = Some(v);
    });
    let d = d.unwrap();
    let still_shut = !done.is_complete();
    shut.open();
    done.synchronize().unwrap();
    safety.join().unwrap();
    for (name, took) in &steps {
        assert!(*took < Duration::from_secs(2), "{name} waited for the shut stream ({took:?}); steps: {steps:?}");
    }
    assert!(
        still_shut,
        "set-up: the gate opened before the steps ended (GEMMs queued in {queued_in:?}, done at first: {shut_at_first:?}): {steps:?}"
    );
    let d_address = address(&d);
    let bytes = (N * N * 4) as u64;
    let overlaps = d_address < c_address + bytes && c_address < d_address + bytes;
    assert!(!overlaps, "the pool's block ({c_address:#x}) was handed out again ({d_address:#x}) while GEMMs were queued into it");
    let back = d.to_host().unwrap();
    let wrong = back.iter().zip(&pattern).filter(|(x, y)| x != y).count();
    assert_eq!(wrong, 0, "{wrong} of {} elements were overwritten by the released stream's GEMMs", N * N);
}
