//! Arrays used on streams other than their own through cudarc's `DevicePtr` / `DevicePtrMut`
//! (`result/foreign.rs`): the array is freed only after every such use, whatever the other
//! stream's context object does meanwhile and whichever thread's per-thread stream it is.
//!
//! Each test queues a backlog on the other stream, so the use runs long after the host has moved
//! on, drops the array, takes the same block for a new array and zeroes it on the array's own
//! stream: a free that did not wait for the use lets the zeroing overtake it, and the use then
//! reads zeros. The tests run one at a time (`serial`): each relies on the pool giving the freed
//! block to the next array, which another test's allocations could take.
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtrMut, DeviceSlice, SyncOnDrop};
use raft::{DeviceResources, DeviceVec};
use raft_tests::patterns::pattern_f32;
use raft_tests::require_gpu;
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};

fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// 1 GiB of f32: a copy of it, behind a backlog of such copies, runs tens of milliseconds later.
const N: usize = 256 << 20;

/// Tens of milliseconds of copies between two of cudarc's own slices on `stream`.
fn backlog(stream: &Arc<CudaStream>) -> (CudaSlice<f32>, CudaSlice<f32>) {
    let mut x = stream.alloc_zeros::<f32>(N).unwrap();
    let mut y = stream.alloc_zeros::<f32>(N).unwrap();
    for _ in 0..16 {
        stream.memcpy_dtod(&x, &mut y).unwrap();
        stream.memcpy_dtod(&y, &mut x).unwrap();
    }
    (x, y)
}

/// Drops `v`, makes a new array of its size, checks it took the same block (else the test proves
/// nothing) and zeroes it on the resources' stream.
fn free_and_zero_the_block(res: &DeviceResources, v: DeviceVec<f32>) -> DeviceVec<f32> {
    // SAFETY: only the addresses are compared, never used.
    let freed_at = unsafe { v.as_raw() } as usize;
    drop(v);
    let mut fresh = DeviceVec::<f32>::new(res, N).unwrap();
    // SAFETY: as above.
    let reissued_at = unsafe { fresh.as_raw() } as usize;
    assert_eq!(reissued_at, freed_at, "the pool did not reissue the freed block: the test proves nothing");
    fresh.fill_zero().unwrap();
    fresh
}

/// A cudarc destination that runs `before` when asked for its pointer (the moment between the
/// source's guard being handed out and its record), then hands out its slice's.
struct Hooked<F: FnMut(&CudaStream)> {
    inner: CudaSlice<f32>,
    before: F,
}

impl<F: FnMut(&CudaStream)> DeviceSlice<f32> for Hooked<F> {
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn stream(&self) -> &Arc<CudaStream> {
        self.inner.stream()
    }
}

impl<F: FnMut(&CudaStream)> DevicePtrMut<f32> for Hooked<F> {
    fn device_ptr_mut<'a>(&'a mut self, stream: &'a CudaStream) -> (cudarc::driver::sys::CUdeviceptr, SyncOnDrop<'a>) {
        (self.before)(stream);
        self.inner.device_ptr_mut(stream)
    }
}

/// The ninth audit: cudarc records the guard's event only if the stream's `CudaContext` object
/// still has a stream of its own when the guard drops. Safe code can take that away during the
/// use (here the destination drops the object's last stream); the event was then never
/// recorded, the array's stream waited for nothing, and the array was freed under the copy.
#[test]
fn an_array_read_through_a_context_object_that_loses_its_last_stream_is_freed_after_the_read() {
    require_gpu!();
    let _one = serial();
    let res = DeviceResources::new().unwrap();
    let want = pattern_f32(N, 97);
    let v = DeviceVec::from_host(&res, &want).unwrap();
    // A context object of the user's own (the same primary context), with one stream of its own,
    // used through its legacy default stream.
    let user = CudaContext::new(res.device()).unwrap();
    let side = user.new_stream().unwrap();
    let s = user.default_stream();
    let (x, y) = backlog(&s);
    // Drops the user object's last stream: from then on cudarc's
    // `is_managing_stream_synchronization` is false for that object.
    let mut side = Some(side);
    let copied = {
        let mut dst = Hooked { inner: s.alloc_zeros::<f32>(N).unwrap(), before: |_: &CudaStream| drop(side.take()) };
        s.memcpy_dtod(&v, &mut dst).unwrap();
        dst.inner
    };
    assert!(side.is_none(), "the destination's pointer was not taken: the test proves nothing");
    let fresh = free_and_zero_the_block(&res, v);
    s.synchronize().unwrap();
    res.sync().unwrap();
    let got = s.clone_dtoh(&copied).unwrap();
    if let Some(i) = got.iter().zip(&want).position(|(g, w)| g != w) {
        panic!("element {i} of the copy is {} (want {}): the array was freed and zeroed under the copy", got[i], want[i]);
    }
    drop((fresh, x, y));
}

/// The ninth audit: the per-thread default stream has one handle on every thread, and the uses
/// were keyed by handle, one event per key: thread A's record replaced thread B's, and the
/// array's stream waited for A's use only. B's read, still queued behind a backlog, then read
/// the freed (and zeroed) block.
#[test]
fn an_array_read_on_two_threads_per_thread_streams_is_freed_after_both_reads() {
    require_gpu!();
    let _one = serial();
    let res = DeviceResources::new().unwrap();
    let ctx = res.context().clone();
    let want = pattern_f32(N, 101);
    let v = Arc::new(DeviceVec::from_host(&res, &want).unwrap());
    let (b_queued_tx, b_queued_rx) = mpsc::channel(); // B's read queued and its event recorded
    let (freed_tx, freed_rx) = mpsc::channel::<()>(); // the array freed and its block zeroed
    let b = {
        let (ctx, v) = (ctx.clone(), v.clone());
        std::thread::spawn(move || {
            let pb = ctx.per_thread_stream();
            let (x, y) = backlog(&pb);
            let mut out = pb.alloc_zeros::<f32>(N).unwrap();
            pb.memcpy_dtod(&*v, &mut out).unwrap();
            drop(v);
            b_queued_tx.send(()).unwrap();
            freed_rx.recv().unwrap();
            let got = pb.clone_dtoh(&out).unwrap(); // waits for this thread's stream
            drop((x, y, out));
            got
        })
    };
    let a = {
        let (ctx, v) = (ctx.clone(), v.clone());
        std::thread::spawn(move || {
            let pa = ctx.per_thread_stream();
            // Waits for B's whole read before its pointer: the source's guard is handed out
            // before, and recorded after, B's.
            let mut dst = Hooked { inner: pa.alloc_zeros::<f32>(N).unwrap(), before: move |_: &CudaStream| b_queued_rx.recv().unwrap() };
            // The source's guard first (an event handed out), then B's whole read, then the
            // copy here and this guard's record.
            pa.memcpy_dtod(&*v, &mut dst).unwrap();
            drop(v);
            pa.synchronize().unwrap();
        })
    };
    a.join().unwrap();
    // Both threads let their handle go once their read was queued.
    let mut v = v;
    let v = loop {
        match Arc::try_unwrap(v) {
            Ok(v) => break v,
            Err(again) => {
                v = again;
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
    };
    let fresh = free_and_zero_the_block(&res, v);
    freed_tx.send(()).unwrap();
    let got = b.join().unwrap();
    res.sync().unwrap();
    if let Some(i) = got.iter().zip(&want).position(|(g, w)| g != w) {
        panic!("element {i} of thread B's copy is {} (want {}): the array was freed and zeroed under that copy", got[i], want[i]);
    }
    drop(fresh);
}

/// The review of the ninth audit's fixes: cudarc's `CudaEvent::record` returns an error stored in
/// the event's context object instead of recording (and the guard's drop stores it back). The
/// event was made in the user's object, so an error stored there during the use skipped the
/// record, and the array was freed under the copy.
#[test]
fn an_array_read_through_a_context_object_holding_an_error_is_freed_after_the_read() {
    require_gpu!();
    let _one = serial();
    let res = DeviceResources::new().unwrap();
    let want = pattern_f32(N, 103);
    let v = DeviceVec::from_host(&res, &want).unwrap();
    let user = CudaContext::new(res.device()).unwrap();
    let s = user.new_stream().unwrap();
    let (x, y) = backlog(&s);
    // Stores an error in its stream's context object (`record_err` is public and safe).
    let invalid = cudarc::driver::DriverError(cudarc::driver::sys::CUresult::CUDA_ERROR_INVALID_VALUE);
    let mut dst = Hooked { inner: s.alloc_zeros::<f32>(N).unwrap(), before: |st: &CudaStream| st.context().record_err::<()>(Err(invalid)) };
    s.memcpy_dtod(&v, &mut dst).unwrap();
    let fresh = free_and_zero_the_block(&res, v);
    let _ = user.check_err(); // the error the destination stored, taken back
    s.synchronize().unwrap();
    res.sync().unwrap();
    let got = s.clone_dtoh(&dst.inner).unwrap();
    if let Some(i) = got.iter().zip(&want).position(|(g, w)| g != w) {
        panic!("element {i} of the copy is {} (want {}): the array was freed and zeroed under the copy", got[i], want[i]);
    }
    drop((fresh, x, y));
}

/// The second review of the ninth round: a guard is `Send`. Taken on one thread's per-thread
/// stream and dropped on another thread, it recorded the event that thread's per-thread uses
/// shared on the other thread's stream, replacing the record after the first thread's copy:
/// the array was freed under that copy.
///
/// Thread A stays alive, its per-thread stream busy, until the array was freed and its block
/// zeroed, then reads its copy back on its own stream (as the two-thread test above): no thread
/// ends with work queued on its per-thread stream, no cudarc slice moves to another thread's
/// per-thread stream, no device-wide wait. Every wait is bounded, so a hang fails and says where.
///
/// Its first form hung on the H200 (run 168, both libraries); this one passed 3 of 3 runs and
/// failed 3 of 3 on 88b986f, before the per-guard events (run 169).
#[test]
fn a_guard_dropped_on_another_thread_leaves_the_first_threads_use_ordered() {
    use cudarc::driver::DevicePtr;
    use std::time::Duration;
    const BOUND: Duration = Duration::from_secs(60);
    require_gpu!();
    let _one = serial();
    let res = DeviceResources::new().unwrap();
    let ctx = res.context().clone();
    let want = pattern_f32(N, 107);
    let v = Arc::new(DeviceVec::from_host(&res, &want).unwrap());
    let (queued_tx, queued_rx) = mpsc::channel::<()>(); // A's copy queued, the guard dropped on B
    let (freed_tx, freed_rx) = mpsc::channel::<()>(); // the array freed and its block zeroed
    let a = {
        let v = v.clone();
        std::thread::spawn(move || {
            let pts = ctx.per_thread_stream(); // A's per-thread stream where used here
            let (x, y) = backlog(&pts);
            let mut out = pts.alloc_zeros::<f32>(N).unwrap();
            std::thread::scope(|scope| {
                let (_ptr, guard) = v.device_ptr(&pts); // a guard held, not used
                pts.memcpy_dtod(&*v, &mut out).unwrap(); // its own guard records after the copy
                let on_b: &CudaStream = &pts; // the same handle: B's per-thread stream on B
                scope
                    .spawn(move || {
                        drop(guard); // recorded on B's per-thread stream
                        on_b.synchronize().unwrap(); // B leaves nothing queued behind
                    })
                    .join()
                    .unwrap();
            });
            drop(v);
            queued_tx.send(()).unwrap();
            freed_rx.recv_timeout(BOUND).expect("the array was not freed in time");
            let got = pts.clone_dtoh(&out).unwrap(); // waits for this thread's stream
            drop((x, y, out)); // freed on the stream they were made on
            pts.synchronize().unwrap();
            got
        })
    };
    if queued_rx.recv_timeout(BOUND).is_err() {
        // A ended without queuing (its panic is the failure) or is stuck.
        if a.is_finished() {
            a.join().unwrap();
        }
        panic!("thread A did not queue its copy within {BOUND:?}");
    }
    let v = Arc::try_unwrap(v).expect("thread A let its handle go before saying so");
    let fresh = free_and_zero_the_block(&res, v);
    freed_tx.send(()).unwrap();
    let got = a.join().unwrap();
    res.sync().unwrap();
    if let Some(i) = got.iter().zip(&want).position(|(g, w)| g != w) {
        panic!("element {i} of the first thread's copy is {} (want {}): the array was freed and zeroed under it", got[i], want[i]);
    }
    drop(fresh);
}

/// The tenth audit: a guard is handed out by reference, and a look into it (no field taken)
/// reaches the context objects of its event and its stream. With one object for every event of
/// the device, an error stored there through a guard of *another* array skipped this array's
/// record, and taking it back hid the skip: the array, only ever used through cudarc's safe
/// copy, was freed under that copy. Each entry's event now has an object of its own.
#[test]
fn an_error_stored_through_another_arrays_guard_skips_no_record_of_this_array() {
    use cudarc::driver::DevicePtr;
    require_gpu!();
    let _one = serial();
    let res = DeviceResources::new().unwrap();
    let want = pattern_f32(N, 109);
    let v = DeviceVec::from_host(&res, &want).unwrap();
    let other = DeviceVec::<f32>::zeros(&res, 1).unwrap();
    let user = CudaContext::new(res.device()).unwrap();
    let s = user.new_stream().unwrap();
    // A look into a guard of `other` on the same stream: nothing taken out, the guard drops.
    let (event_object, stream_object) = {
        let (_p, g) = other.device_ptr(&s);
        match &g {
            SyncOnDrop::Record(Some((ev, st))) => (ev.context().clone(), st.context().clone()),
            _ => panic!("a use on another stream gave no record guard"),
        }
    };
    let (x, y) = backlog(&s);
    let invalid = cudarc::driver::DriverError(cudarc::driver::sys::CUresult::CUDA_ERROR_INVALID_VALUE);
    let (eo, so) = (event_object.clone(), stream_object.clone());
    // Runs after v's guard is handed out, before its record.
    let mut dst = Hooked {
        inner: s.alloc_zeros::<f32>(N).unwrap(),
        before: move |_: &CudaStream| {
            eo.record_err::<()>(Err(invalid));
            so.record_err::<()>(Err(invalid));
        },
    };
    s.memcpy_dtod(&v, &mut dst).unwrap();
    // Taken back: a skipped record would go unseen.
    let _ = event_object.check_err();
    let _ = stream_object.check_err();
    let fresh = free_and_zero_the_block(&res, v);
    s.synchronize().unwrap();
    res.sync().unwrap();
    let got = s.clone_dtoh(&dst.inner).unwrap();
    if let Some(i) = got.iter().zip(&want).position(|(g, w)| g != w) {
        panic!("element {i} of the copy is {} (want {}): the array was freed and zeroed under the copy", got[i], want[i]);
    }
    drop((fresh, x, y, other));
}

/// The tenth audit: on the per-thread default stream every guard adds an entry, kept until an
/// exclusive use; a read-only loop grew the list without bound. Past 4096 entries the array is
/// left unordered (kept until the process ends rather than freed under a use), and says so
/// once, not at every later use of it. (Before: no bound, nothing said.)
#[test]
fn an_array_read_past_the_bound_on_per_thread_streams_is_kept_and_says_so_once() {
    use cudarc::driver::DevicePtr;
    use std::sync::atomic::{AtomicUsize, Ordering};
    static SAID: AtomicUsize = AtomicUsize::new(0);
    struct Count;
    impl log::Log for Count {
        fn enabled(&self, m: &log::Metadata) -> bool {
            m.target() == "raft"
        }
        fn log(&self, r: &log::Record) {
            if r.target() == "raft" && r.args().to_string().contains("could not be ordered") {
                SAID.fetch_add(1, Ordering::Relaxed);
            }
        }
        fn flush(&self) {}
    }
    require_gpu!();
    let _one = serial();
    log::set_boxed_logger(Box::new(Count)).expect("no other logger in this binary");
    log::set_max_level(log::LevelFilter::Warn);
    let res = DeviceResources::new().unwrap();
    let v = DeviceVec::from_host(&res, &[1.0f32; 16]).unwrap();
    let pts = res.context().per_thread_stream();
    for _ in 0..4097 {
        drop(v.device_ptr(&pts)); // a read on this thread's per-thread stream: one entry each
    }
    pts.synchronize().unwrap();
    let mut out = vec![0.0f32; 16];
    for _ in 0..10 {
        v.copy_to_host(&mut out).unwrap();
        assert_eq!(out, vec![1.0f32; 16]);
    }
    assert_eq!(SAID.load(Ordering::Relaxed), 1, "past the bound the array must be unordered, and say so exactly once");
    drop(v); // kept: no free under a use it cannot order
}

/// The review of the tenth audit's fixes: an entry's event object goes back to the pool only
/// when nothing else holds it. A look into a guard can keep a `Weak` of it (`Arc::downgrade`),
/// which the strong count alone missed: upgraded after the object was pooled, it held the event
/// object of the next entry made on the device, whichever array that is, and the skip of the
/// tenth audit worked across arrays again. (Before: the `Weak` upgraded.)
#[test]
fn an_event_object_a_guard_let_out_is_never_reused() {
    use cudarc::driver::DevicePtr;
    require_gpu!();
    let _one = serial();
    let res = DeviceResources::new().unwrap();
    let user = CudaContext::new(res.device()).unwrap();
    let s = user.new_stream().unwrap();
    let x = DeviceVec::<f32>::zeros(&res, 1).unwrap();
    let weak = {
        let (_p, g) = x.device_ptr(&s);
        match &g {
            SyncOnDrop::Record(Some((ev, _))) => Arc::downgrade(ev.context()),
            _ => panic!("a use on another stream gave no record guard"),
        }
    };
    drop(x); // its entry goes, and with it the event
    assert!(weak.upgrade().is_none(), "the event object a guard let out was pooled for reuse");
}

/// The eighteenth audit (helper 82): a thread whose current context is another library's context
/// of the same device (`cuCtxCreate`, PyCUDA's `autoinit`) got the shim's allocations, handles and
/// launches in that context: the shim's device scope saw "the same device" and switched nothing.
/// Memory of that context dies with it (the driver frees a destroyed context's memory), a device
/// use after free for arrays the library still holds. Now the primary context is bound around
/// the call and the thread's own context put back.
#[test]
fn memory_made_while_another_librarys_context_of_the_device_is_current_belongs_to_the_primary_context() {
    require_gpu!();
    let _one = serial();
    use cudarc::driver::sys;
    let res = DeviceResources::on_device(0).unwrap();
    let primary = res.stream().unwrap().context().cu_ctx() as usize;
    let mr = raft::MemoryResource::cuda(0).unwrap();
    std::thread::spawn(move || {
        let mut foreign: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: makes a new context of device 0 current on this thread; destroyed below, after
        // the library's calls, with no use of it left.
        unsafe { sys::cuCtxCreate_v4(&mut foreign, std::ptr::null_mut(), 0, 0) }.result().unwrap();
        assert_ne!(foreign as usize, primary);
        let v = DeviceVec::<f32>::new_in(&res, 1 << 20, &mr).unwrap();
        let mut current: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: writes the thread's current context into a local.
        unsafe { sys::cuCtxGetCurrent(&mut current) }.result().unwrap();
        assert_eq!(current as usize, foreign as usize, "the thread's own context was not put back");
        let owner = raft_tests::context_of_address(v.device_address());
        // SAFETY: the context made above, current on this thread, holds nothing the library uses
        // (checked: the array is the primary context's).
        unsafe { sys::cuCtxDestroy_v2(foreign) }.result().unwrap();
        assert_eq!(owner, primary, "an array of the library was made in another library's context (the foreign one: {})", foreign as usize);
        // Still usable after the foreign context is gone.
        let mut z = DeviceVec::<f32>::from_host(&res, &[1.0; 1024]).unwrap();
        z.fill_zero().unwrap();
        assert_eq!(z.to_host().unwrap(), vec![0.0; 1024]);
        drop(v);
    })
    .join()
    .unwrap();
}

/// The nineteenth audit (helper 86): the memory resources' constructors did not set up the
/// device's primary context, so a pool made first, with another library's context of the device
/// current, took its first block in that context (the shim binds the primary context only once
/// noted), and an array from the pool died with the foreign context. Now every constructor sets
/// the device up first. A fresh process: the pool must be the library's first step on device 0.
#[test]
fn a_pool_made_first_under_another_librarys_context_takes_its_memory_in_the_primary_context() {
    require_gpu!();
    let c = raft_tests::run_scenario!("pool-made-first-under-a-foreign-context", &[], std::time::Duration::from_secs(60));
    c.assert_code(0);
    assert_eq!(c.result("foreign_is_primary").as_deref(), Some("false"), "{c:?}");
    assert_eq!(c.result("owner").as_deref(), Some("primary"), "the pool's memory is another library's context's:\n{c:?}");
    assert_eq!(c.result("used_after_destroy").as_deref(), Some("true"), "{c:?}");
}
