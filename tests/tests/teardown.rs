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
/// it lets the stream go or is destroyed. Frees alternate between two resources; then GEMMs into
/// C on the first, C dropped, the first resources dropped (their release, on another thread,
/// drains the stream: the GEMMs still run meanwhile), a third resources frees into the pool (a
/// new stream), and the pool dropped. Its memory must not be handed out again before the GEMMs
/// end. A fence that recorded only at a stream's first free, forgot a stream when another came,
/// or let a stream go without a record would hand C's block back at once. (A stream whose
/// resources were released has drained: the fence can be its last holder only after its work.)
#[test]
fn a_pool_fed_by_alternating_streams_keeps_its_memory_until_a_released_streams_gemms_end() {
    require_gpu!();
    let _one = one_at_a_time();
    let upstream = memory::current(0).unwrap();
    let pool = upstream.pool(raft::PoolOptions::initial(N * N * 4)).unwrap();
    drop(upstream);
    let (a, b) = (DeviceResources::new().unwrap(), DeviceResources::new().unwrap());
    for i in 0..64 {
        let on = if i % 2 == 0 { &a } else { &b };
        drop(DeviceVec::<f32>::new_in(on, 1024, &pool).unwrap());
    }
    let (c, c_address) = queue_gemms(&a, &pool);
    // Waited for at the end, once `a` and its stream are gone (an event holds no stream).
    let done = a.stream().unwrap().record_event(None).unwrap();
    let started = Instant::now();
    drop(c); // freed on a's stream
    drop(DeviceVec::<f32>::new_in(&b, 1024, &pool).unwrap());
    drop(a); // released on its worker or a release thread, which drains the GEMMs meanwhile
    let third = DeviceResources::new().unwrap();
    drop(DeviceVec::<f32>::new_in(&third, 1024, &pool).unwrap()); // a new stream: the orphan goes
    drop(pool); // the last copy: destroyed once every recorded stream is done
    std::thread::sleep(Duration::from_millis(100));
    let pattern: Vec<f32> = (0..N * N).map(|i| -((i % 1000) as f32) - 1.0).collect();
    let mut d = DeviceVec::<f32>::new(&b, N * N).unwrap();
    d.copy_from_host(&pattern).unwrap();
    let d_address = address(&d);
    let waited = Instant::now();
    done.synchronize().unwrap();
    let gemms_left = waited.elapsed();
    assert!(
        gemms_left > Duration::from_millis(50),
        "the GEMMs ended {:?} after the drop, before the pattern was written: raise GEMMS",
        started.elapsed()
    );
    let bytes = (N * N * 4) as u64;
    let overlaps = d_address < c_address + bytes && c_address < d_address + bytes;
    assert!(!overlaps, "the pool's block ({c_address:#x}) was handed out again ({d_address:#x}) while GEMMs still wrote it");
    let back = d.to_host().unwrap();
    let wrong = back.iter().zip(&pattern).filter(|(x, y)| x != y).count();
    assert_eq!(wrong, 0, "{wrong} of {} elements were overwritten by the released stream's GEMMs", N * N);
}
