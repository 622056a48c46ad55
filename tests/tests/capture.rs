//! Copies, allocations and CUDA graph capture (issue 33, items 5-8; the fifth audit): every copy
//! refused on a capturing stream, a copy scope that waits for its host copies whatever its body
//! captured, arrays used on other streams freed only after that use, registrations that
//! page-lock no neighbour, GEMMs refused, and arrays neither allocated nor freed into a capture.
//! What another thread's global capture makes the driver refuse: `global_capture.rs`.
use raft::{DeviceResources, DeviceVec, ErrorKind, PinnedVec, RegisteredSlice};
use raft_tests::global_capture::serial;
use raft_tests::patterns::{pattern_f32, pattern_u32, pattern_u8, same};
use raft_tests::require_gpu;
use raft_tests::OutputWithin;

#[test]
fn copies_with_host_memory_are_refused_while_the_stream_is_captured() {
    require_gpu!();
    let _one = serial();
    let res = DeviceResources::new().unwrap();
    let n = (1 << 20) + 3;
    let want = pattern_f32(n, 41);
    let mut dev = DeviceVec::from_host(&res, &want).unwrap();
    let stream = dev.stream().clone();
    let mut pinned = PinnedVec::<f32>::new(&res, n).unwrap();
    let mut pageable = vec![0f32; n];
    stream.begin_capture(cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED).unwrap();
    let refused = [
        ("scoped down", res.copy_scope(|s| s.to_host(&dev, &mut pinned))),
        ("blocking (staged) down", dev.copy_to_host(&mut pageable)),
        ("blocking pinned down", dev.copy_to_host(&mut pinned)),
        ("blocking (staged) up", dev.copy_from_host(&want)),
        ("blocking pinned up", dev.copy_from_host(&pinned)),
        // A memset only queues now (issue 34): captured, the graph would write the array at
        // each launch.
        ("fill_zero", dev.fill_zero()),
        ("zeros", DeviceVec::<f32>::zeros(&res, n).map(drop)),
    ];
    let graph = stream.end_capture(cudarc::driver::sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH);
    for (what, r) in refused {
        let e = r.expect_err(what);
        assert_eq!(e.kind(), ErrorKind::Logic, "{what}: {e}");
        assert!(e.to_string().contains("captured into a CUDA graph"), "{what}: {e}");
    }
    // Nothing was queued during the capture: an empty graph, or none.
    drop(graph.unwrap());
    // A capture begun inside a scope after its copy was queued, relaxed and thread-local: the
    // scope's end still waits for that copy (an event recorded before the capture, waited for
    // with the thread's capture mode relaxed; the stream itself cannot be synchronised while it
    // is captured, and in global or thread-local mode the driver refused the event wait too:
    // both made the scope fail and return with the copy in flight).
    // (Global mode also forbids the other threads' calls, here the other tests of this process,
    // and their refused calls invalidate the capture: it is left out. It differs from
    // thread-local mode only there; the relaxed wait serves both.)
    use cudarc::driver::sys::CUstreamCaptureMode as Mode;
    for mode in [Mode::CU_STREAM_CAPTURE_MODE_RELAXED, Mode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL] {
        let mut early = PinnedVec::<f32>::new(&res, n).unwrap();
        let scoped = res.copy_scope(|s| {
            s.to_host(&dev, &mut early)?;
            stream.begin_capture(mode).map_err(|e| raft::Error::new(ErrorKind::Cuda, "begin_capture", e.to_string()))
        });
        let graph = stream.end_capture(cudarc::driver::sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH);
        scoped.unwrap_or_else(|e| panic!("{mode:?}: {e}"));
        drop(graph.unwrap_or_else(|e| panic!("{mode:?}: the capture was invalidated: {e}")));
        same(&format!("a scope whose body began a capture ({mode:?})"), &early.to_vec(), &want);
    }
    // After the capture: every kind runs.
    res.copy_scope(|s| s.to_host(&dev, &mut pinned)).unwrap();
    same("scoped down after the capture", &pinned.to_vec(), &want);
    dev.copy_to_host(&mut pageable).unwrap();
    same("staged down after the capture", &pageable, &want);
    dev.copy_from_host(&pattern_f32(n, 43)).unwrap();
    same("blocking up after the capture", &dev.to_host().unwrap(), &pattern_f32(n, 43));
}

/// A scope whose body begins a capture on the scope's stream and then asks for a device copy:
/// the copy is refused (`Logic`), and the scope's end still waits for the host copy queued
/// before the capture (issue 33, item 5: the device copy was captured, its event became the
/// scope's last, waiting for it failed at once, and the scope returned `Err` with the 1 GiB
/// device-to-host copy still writing the borrowed `PinnedVec`).
#[test]
fn a_scope_waits_for_its_host_copies_when_its_body_begins_a_capture_and_copies_on() {
    require_gpu!();
    let _one = serial();
    use cudarc::driver::sys::{CUgraphInstantiate_flags as Flags, CUstreamCaptureMode as Mode};
    let res = DeviceResources::new().unwrap();
    let n = 256 << 20; // 1 GiB of f32: tens of milliseconds to the host
    let want = pattern_f32(n, 71);
    let dev = DeviceVec::from_host(&res, &want).unwrap();
    let src = DeviceVec::from_host(&res, &pattern_f32(1024, 72)).unwrap();
    let mut dst = DeviceVec::<f32>::zeros(&res, 1024).unwrap();
    let stream = dev.stream().clone();
    for mode in [Mode::CU_STREAM_CAPTURE_MODE_RELAXED, Mode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL] {
        let mut host = PinnedVec::<f32>::new(&res, n).unwrap();
        let scoped = res.copy_scope(|s| -> raft::Result<Option<raft::Error>> {
            s.to_host(&dev, &mut host)?;
            stream.begin_capture(mode).map_err(|e| raft::Error::new(ErrorKind::Cuda, "begin_capture", e.to_string()))?;
            Ok(s.device_to_device(&src, &mut dst).err())
        });
        // Read as the scope returns, before anything else waits: the last element is written last.
        let last_at_return = host.get(n - 1);
        let graph = stream.end_capture(Flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH);
        let refused = scoped.unwrap_or_else(|e| panic!("{mode:?}: the scope's end failed (its copy may still run): {e}"));
        let e = refused.unwrap_or_else(|| panic!("{mode:?}: a device copy on a capturing stream was accepted"));
        assert_eq!((e.kind(), e.who()), (ErrorKind::Logic, "CopyScope::device_to_device"), "{mode:?}: {e}");
        assert!(e.to_string().contains("captured into a CUDA graph"), "{e}");
        assert_eq!(last_at_return, Some(want[n - 1]), "{mode:?}: the scope returned before its copy had finished");
        drop(graph.unwrap_or_else(|e| panic!("{mode:?}: the capture was invalidated: {e}")));
        same(&format!("{mode:?}: the scope's host copy"), &host.to_vec(), &want);
    }
}

/// Device-only copies and cudarc pointers are refused while a stream they use is being captured
/// (issue 33, item 7): captured, the copy would run at each launch of the graph, after the arrays
/// may be freed. `transfer_device_to_device` and `copy_from_device` return `Logic` (capture on the
/// destination's stream, then on the source's), `DeviceVec::device_ptr` panics; nothing enters
/// the graph, and after the capture all of them run. (Before: each was accepted and captured.)
#[test]
fn device_copies_and_pointers_are_refused_while_a_stream_they_use_is_captured() {
    require_gpu!();
    let _one = serial();
    use cudarc::driver::sys::{CUgraphInstantiate_flags as Flags, CUstreamCaptureMode as Mode};
    use cudarc::driver::DevicePtr;
    let (a, b, c) = (DeviceResources::new().unwrap(), DeviceResources::new().unwrap(), DeviceResources::new().unwrap());
    let n = 4097;
    let want = pattern_u32(n, 75);
    let src = DeviceVec::from_host(&a, &want).unwrap();
    let mut dst = DeviceVec::<u32>::zeros(&b, n).unwrap();
    for res in [&b, &a] {
        let captured = res.stream().unwrap();
        // The owned copy's arrays live on `c`, whose stream is not captured (they are dropped
        // with the refusal).
        let (from, into) = (DeviceVec::from_host(&c, &want).unwrap(), DeviceVec::<u32>::zeros(&c, n).unwrap());
        captured.begin_capture(Mode::CU_STREAM_CAPTURE_MODE_RELAXED).unwrap();
        let ordered = dst.copy_from_device(&src);
        let owned = res.transfer_device_to_device(from, into).map(drop);
        let pointer = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let (ptr, _guard) = src.device_ptr(&captured);
            ptr
        }));
        let graph = captured.end_capture(Flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH);
        for (who, r) in [("DeviceVec::copy_from_device", ordered), ("DeviceResources::transfer_device_to_device", owned)] {
            let e = r.expect_err(who);
            assert_eq!((e.kind(), e.who()), (ErrorKind::Logic, who), "{e}");
            assert!(e.to_string().contains("captured into a CUDA graph"), "{e}");
        }
        assert!(pointer.is_err(), "device_ptr on a capturing stream handed out a pointer");
        drop(graph.unwrap());
    }
    dst.copy_from_device(&src).unwrap();
    same("copy_from_device after the captures", &dst.to_host().unwrap(), &want);
}

/// A `DeviceVec` written by cudarc's `memcpy_dtod` on another stream, while this thread
/// captures an unrelated stream in thread-local mode, is freed only after that copy (issue 33,
/// item 6: the pointer guard's wait was refused under the capture and swallowed by cudarc; the
/// array's memory, freed at once, was reissued to the next array, which the copy, still queued
/// behind a backlog, then overwrote).
#[test]
fn an_array_used_on_another_stream_under_a_capture_is_freed_after_that_use() {
    require_gpu!();
    let _one = serial();
    use cudarc::driver::sys::{CUgraphInstantiate_flags as Flags, CUstreamCaptureMode as Mode};
    let res = DeviceResources::new().unwrap();
    let ctx = res.stream().unwrap().context().clone();
    let (other, unrelated) = (ctx.new_stream().unwrap(), ctx.new_stream().unwrap());
    let n = 256 << 20; // 1 GiB of f32
    let src = DeviceVec::from_host(&res, &pattern_f32(n, 73)).unwrap();
    // A backlog on `other` (tens of milliseconds of copies between cudarc's own slices), so the
    // copy into the array runs long after the host has moved on.
    let mut x = other.alloc_zeros::<f32>(n).unwrap();
    let mut y = other.alloc_zeros::<f32>(n).unwrap();
    for _ in 0..16 {
        other.memcpy_dtod(&x, &mut y).unwrap();
        other.memcpy_dtod(&y, &mut x).unwrap();
    }
    let mut dst = DeviceVec::<f32>::zeros(&res, n).unwrap();
    // SAFETY: only the address is compared, never used.
    let freed_at = unsafe { dst.as_raw() } as usize;
    unrelated.begin_capture(Mode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
    other.memcpy_dtod(&src, &mut dst).unwrap();
    let graph = unrelated.end_capture(Flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH);
    drop(dst);
    let mut fresh = DeviceVec::<f32>::new(&res, n).unwrap();
    // SAFETY: as above.
    let reissued_at = unsafe { fresh.as_raw() } as usize;
    fresh.fill_zero().unwrap();
    let _ = other.synchronize();
    let _ = res.sync();
    let got = fresh.to_host().unwrap();
    assert_eq!(reissued_at, freed_at, "the pool did not reissue the freed block: the test proves nothing");
    if let Some(i) = got.iter().position(|v| *v != 0.0) {
        panic!("element {i} of an array zeroed after it was allocated holds {}: a copy into a freed array wrote it", got[i]);
    }
    drop(graph.unwrap_or_else(|e| panic!("the unrelated capture was invalidated: {e}")));
    drop((x, y));
}

/// Whether the driver takes `addr` for page-locked host memory.
fn page_locked(addr: usize) -> bool {
    use cudarc::driver::sys::{cuPointerGetAttributes, CUmemorytype, CUpointer_attribute, CUresult};
    let mut kind: u32 = 0;
    let mut attribute = CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE;
    let mut out = &mut kind as *mut u32 as *mut std::ffi::c_void;
    // SAFETY: writes one unsigned int for an address the driver only looks up.
    let rc = unsafe { cuPointerGetAttributes(1, &mut attribute, &mut out, addr as u64) };
    rc == CUresult::CUDA_SUCCESS && kind == CUmemorytype::CU_MEMORYTYPE_HOST as u32
}

/// Registering a slice that starts and ends inside pages page-locks only its whole pages: the
/// bytes before and after it on those pages stay pageable (issue 33, item 8: the driver locked
/// the whole first and last page, neighbours included, which safe code still reached as plain
/// slices). Copies of such a slice, its ragged ends pageable, are right both ways.
#[test]
fn registering_a_slice_page_locks_none_of_its_neighbours() {
    require_gpu!();
    let _one = serial();
    let res = DeviceResources::new().unwrap();
    // SAFETY: sysconf reads a constant.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    let mut backing = vec![0u8; 6 * page];
    let first = (backing.as_ptr() as usize).next_multiple_of(page) - backing.as_ptr() as usize;
    let (before, rest) = backing[first..].split_at_mut(100);
    let (slice, after) = rest.split_at_mut(3 * page);
    let inside = slice.as_ptr() as usize + page - 100; // a whole page of the slice
    let want = pattern_u8(slice.len(), 79);
    slice.copy_from_slice(&want);
    let (before_at, after_at) = (before.as_ptr() as usize + 99, after.as_ptr() as usize);
    let mut dev = DeviceVec::<u8>::zeros(&res, want.len()).unwrap();
    let other = pattern_u8(want.len(), 83);
    RegisteredSlice::scope(&res, slice, |r| {
        assert!(page_locked(inside), "the slice's whole pages are page-locked");
        assert!(!page_locked(before_at), "the byte before the slice, on its first page, was page-locked");
        assert!(!page_locked(after_at), "the byte after the slice, on its last page, was page-locked");
        res.copy_scope(|s| s.to_device(&*r, &mut dev)).unwrap();
        same("a slice with ragged ends, to the device", &dev.to_host().unwrap(), &want);
        dev.copy_from_host(&other).unwrap();
        res.copy_scope(|s| s.to_host(&dev, r)).unwrap();
        same("a slice with ragged ends, to the host", &r.to_vec(), &other);
        // The blocking copies take the registration as they take a slice (issue 34).
        dev.copy_from_host(&*r).unwrap();
        same("a slice with ragged ends, blocking to the device", &dev.to_host().unwrap(), &other);
        dev.copy_from_host(&want).unwrap();
        dev.copy_to_host(r).unwrap();
        same("a slice with ragged ends, blocking to the host", &r.to_vec(), &want);
    })
    .unwrap();
    assert!(!page_locked(inside), "unregistered");
    assert!(before.iter().chain(after.iter()).all(|&b| b == 0), "a byte outside the slice was written");
}

/// A GEMM is refused while the resources' stream is being captured into a CUDA graph (the fifth
/// audit, H1): captured, cuBLAS would write C at each launch of the graph, after the arrays (and,
/// after a release, the handle's workspace) may be gone. Nothing enters the graph; after the
/// capture the same GEMM runs. (Before: the GEMM was accepted and captured.)
#[test]
fn a_gemm_is_refused_while_the_stream_is_captured() {
    require_gpu!();
    let _one = serial();
    use cudarc::driver::sys::{CUgraphInstantiate_flags as Flags, CUstreamCaptureMode as Mode};
    let res = DeviceResources::new().unwrap();
    let n = 8;
    let (a, b, mut c) = gemm_operands(&res, n);
    let stream = res.stream().unwrap();
    stream.begin_capture(Mode::CU_STREAM_CAPTURE_MODE_RELAXED).unwrap();
    let refused = square_gemm(n, &a, &b, &mut c);
    let graph = stream.end_capture(Flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH);
    let e = refused.expect_err("a GEMM on a capturing stream was accepted (and captured)");
    assert_eq!((e.kind(), e.who()), (ErrorKind::Logic, "gemm"), "{e}");
    assert!(e.to_string().contains("captured into a CUDA graph"), "{e}");
    drop(graph.unwrap());
    square_gemm(n, &a, &b, &mut c).unwrap();
    assert!(c.to_host().unwrap().iter().all(|&x| x == 2.0 * n as f32));
}

/// `a` (ones), `b` (twos) and `c` (zeros), `n` × `n` each, on `res`: `a·b` is `2n` everywhere.
fn gemm_operands(res: &DeviceResources, n: usize) -> (DeviceVec<f32>, DeviceVec<f32>, DeviceVec<f32>) {
    let a = DeviceVec::from_host(res, &vec![1.0f32; n * n]).unwrap();
    let b = DeviceVec::from_host(res, &vec![2.0f32; n * n]).unwrap();
    (a, b, DeviceVec::<f32>::zeros(res, n * n).unwrap())
}

/// `c = a·b`, `n` × `n`, column-major.
fn square_gemm(n: usize, a: &DeviceVec<f32>, b: &DeviceVec<f32>, c: &mut DeviceVec<f32>) -> raft::Result<()> {
    use raft::Layout;
    raft::gemm(
        1.0,
        a.matrix(n, n, Layout::ColMajor).unwrap(),
        b.matrix(n, n, Layout::ColMajor).unwrap(),
        0.0,
        c.matrix_mut(n, n, Layout::ColMajor).unwrap(),
    )
}

/// Arrays are neither allocated nor freed into a CUDA graph captured on their stream (the fifth
/// audit's open item). Through the async pool, an allocation on a capturing stream became a node
/// of the graph (its address backed only while the graph runs) and a drop became a free node,
/// run at each launch; through a pool, an arena or a binning resource the allocation was served
/// and the free recorded the pool's stream event into the graph. Now each allocation is refused
/// (`Logic`), each array dropped during the capture is kept (not freed: its resource's
/// statistics still count it), the graph is empty, and after the capture both run again.
/// (Before: every allocation below was accepted, and the async pools' drops added free nodes.)
#[test]
fn arrays_are_neither_allocated_nor_freed_into_a_capture_of_their_stream() {
    require_gpu!();
    let _one = serial();
    use raft::MemoryResource;
    const MIB: usize = 1 << 20;
    let res = DeviceResources::new().unwrap();
    let stream = res.stream().unwrap();
    let cuda = MemoryResource::cuda(0).unwrap();
    // Each under a statistics adaptor, which counts what the library frees through it.
    let resources: Vec<(&str, Option<MemoryResource>)> = vec![
        ("the current resource (the async pool)", None),
        ("an async pool", Some(MemoryResource::cuda_async(0).unwrap().with_statistics().unwrap())),
        ("a pool", Some(cuda.pool(raft::PoolOptions::initial(32 * MIB)).unwrap().with_statistics().unwrap())),
        ("an arena", Some(cuda.arena(raft::ArenaOptions::size(64 * MIB)).unwrap().with_statistics().unwrap())),
        ("a binning resource", Some(cuda.binning(8, 20).unwrap().with_statistics().unwrap())),
    ];
    let n = 64 << 10; // 256 KiB of f32: freed inline by every resource above (no release thread)
    let make = |mr: &Option<MemoryResource>| match mr {
        Some(mr) => DeviceVec::<f32>::new_in(&res, n, mr),
        None => DeviceVec::<f32>::new(&res, n),
    };
    let kept: Vec<DeviceVec<f32>> = resources.iter().map(|(_, mr)| make(mr).unwrap()).collect();
    let live_before: Vec<Option<i64>> =
        resources.iter().map(|(_, mr)| mr.as_ref().map(|m| m.statistics().unwrap().current_count)).collect();
    let (refused, nodes) = captured(&stream, || {
        let refused: Vec<raft::Result<DeviceVec<f32>>> = resources.iter().map(|(_, mr)| make(mr)).collect();
        drop(kept);
        refused
    });
    for (((what, mr), r), before) in resources.iter().zip(refused).zip(&live_before) {
        let e = r.expect_err(&format!("{what}: an allocation on a capturing stream was accepted"));
        assert_eq!(e.kind(), ErrorKind::Logic, "{what}: {e}");
        assert!(e.to_string().contains("captured into a CUDA graph"), "{what}: {e}");
        if let (Some(mr), Some(before)) = (mr, before) {
            let now = mr.statistics().unwrap().current_count;
            assert_eq!(now, *before, "{what}: an array dropped during the capture was freed (or another allocated)");
        }
    }
    assert_eq!(nodes, 0, "the capture took {nodes} node(s): an allocation or a free entered the graph");
    // cudaMalloc itself cannot be captured, but relaxed it was served during the capture all the
    // same: refused too, whatever the resource.
    let (plain, _) = captured(&stream, || DeviceVec::<f32>::new_in(&res, n, &cuda));
    let e = plain.expect_err("a cudaMalloc allocation on a capturing stream was accepted");
    assert!(e.kind() == ErrorKind::Logic && e.to_string().contains("captured into a CUDA graph"), "{e}");
    // After the capture: allocations, copies and frees run again through each resource.
    for (i, (what, mr)) in resources.iter().enumerate() {
        let want = pattern_f32(n, 80 + i as u32);
        let mut v = make(mr).unwrap_or_else(|e| panic!("{what}: after the capture: {e}"));
        v.copy_from_host(&want).unwrap();
        same(&format!("{what} after the capture"), &v.to_host().unwrap(), &want);
        drop(v);
        if let (Some(mr), Some(before)) = (mr, live_before[i]) {
            assert_eq!(mr.statistics().unwrap().current_count, before, "{what}: an array made after the capture was not freed");
        }
    }
}

/// An array whose free goes to a release thread (cudaMalloc's may block), dropped while its
/// stream is being captured: the release thread waits for the capture to end, then frees it
/// (review of the capture commits: the free was refused at once and the block kept for the
/// process's life, though the capture lasted a tenth of a second).
#[test]
fn an_array_dropped_during_a_short_capture_is_freed_by_its_release_thread_after_it() {
    require_gpu!();
    let _one = serial();
    use raft::MemoryResource;
    let res = DeviceResources::new().unwrap();
    let stream = res.stream().unwrap();
    let mr = MemoryResource::cuda(0).unwrap().with_statistics().unwrap();
    let v = DeviceVec::<f32>::new_in(&res, 1 << 20, &mr).unwrap();
    let live = mr.statistics().unwrap().current_count;
    assert_eq!(live, 1);
    let (during, _) = captured(&stream, || {
        drop(v); // handed to a release thread, which finds the stream captured
        std::thread::sleep(std::time::Duration::from_millis(100));
        mr.statistics().unwrap().current_count
    });
    assert_eq!(during, 1, "the array was freed while its stream was being captured");
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while mr.statistics().unwrap().current_count != 0 && std::time::Instant::now() < give_up {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(mr.statistics().unwrap().current_count, 0, "the array was not freed after the capture ended (kept for good)");
}

/// Runs `body` while `stream` is being captured (relaxed, so the other tests' calls in this
/// process are not refused meanwhile), through the driver's own calls so the graph can be
/// inspected: returns `body`'s result and how many nodes the capture took.
fn captured<R>(stream: &cudarc::driver::CudaStream, body: impl FnOnce() -> R) -> (R, usize) {
    use cudarc::driver::sys;
    stream.context().bind_to_thread().unwrap();
    // SAFETY: the stream is alive for the borrow; its context is bound above.
    unsafe { sys::cuStreamBeginCapture_v2(stream.cu_stream(), sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED) }.result().unwrap();
    let out = body();
    stream.context().bind_to_thread().unwrap();
    let mut graph = std::ptr::null_mut();
    // SAFETY: ends the capture begun above on the same stream; the graph comes back owned.
    unsafe { sys::cuStreamEndCapture(stream.cu_stream(), &mut graph) }.result().unwrap();
    let mut nodes = 0usize;
    if !graph.is_null() {
        // SAFETY: `graph` is the captured graph, destroyed once after its nodes are counted.
        unsafe {
            sys::cuGraphGetNodes(graph, std::ptr::null_mut(), &mut nodes).result().unwrap();
            sys::cuGraphDestroy(graph).result().unwrap();
        }
    }
    (out, nodes)
}

/// Issue 30's private streams (`result/exposure.rs`): allocations on resources whose stream's
/// handle never left the library skip the capture question. Every way the handle leaves must
/// raise the flag first: after each, a capture begun on the stream through that handle makes
/// the next allocation a refusal (`Logic`), as before the flag existed. A way that forgot to
/// raise it lets the allocation into the graph instead (it returns `Ok`).
#[test]
fn every_way_the_stream_leaves_the_library_makes_allocations_ask_about_captures() {
    use cudarc::driver::sys::{CUgraphInstantiate_flags as Flags, CUstreamCaptureMode as Mode};
    use cudarc::driver::{CudaStream, DeviceSlice};
    use std::sync::Arc;
    require_gpu!();
    let _one = serial();
    type Out = fn(&DeviceResources, &DeviceVec<f32>) -> Arc<CudaStream>;
    let ways: [(&str, Out); 7] = [
        ("DeviceResources::stream", |r, _| r.stream().unwrap()),
        ("DeviceVec::stream", |_, v| v.stream().clone()),
        ("DeviceSlice::stream of a DeviceVec", |_, v| DeviceSlice::stream(v).clone()),
        ("DeviceView::stream", |_, v| v.view().stream().clone()),
        ("MatrixView::stream", |_, v| v.matrix(4, 4, raft::Layout::RowMajor).unwrap().stream().clone()),
        ("cublas_handle (cublasGetStream)", |r, _| {
            let handle = r.cublas_handle().unwrap();
            let mut raw: cudarc::cublas::sys::cudaStream_t = std::ptr::null_mut();
            // SAFETY: a live handle of the resources; writes one stream handle.
            let rc = unsafe { cudarc::cublas::sys::cublasGetStream_v2(handle, &mut raw) };
            assert_eq!(rc, cudarc::cublas::sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS);
            // SAFETY: the resources' stream, alive while they are (the test holds them).
            unsafe { r.context().wrap_borrowed_stream(raw as cudarc::driver::sys::CUstream) }
        }),
        ("with_raft_resources (raft::resource::get_cuda_stream)", |r, _| {
            // SAFETY: a plain C function of the baseline on the lent object, inside the lend.
            let raw = r.with_raft_resources(|p| unsafe { raft_tests::baseline::bl_lent_stream(p.as_ptr()) }).unwrap();
            // SAFETY: as above.
            unsafe { r.context().wrap_borrowed_stream(raw as cudarc::driver::sys::CUstream) }
        }),
    ];
    for (way, out) in ways {
        let res = DeviceResources::new().unwrap();
        let v = DeviceVec::<f32>::zeros(&res, 16).unwrap();
        let stream = out(&res, &v);
        stream.begin_capture(Mode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
        let made = DeviceVec::<f32>::new(&res, 1 << 16);
        let graph = stream.end_capture(Flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH);
        match made {
            Err(e) => assert_eq!(e.kind(), ErrorKind::Logic, "{way}: {e}"),
            Ok(_) => panic!("{way}: an allocation on the stream during a capture was not refused (the flag stayed down)"),
        }
        drop(graph);
        drop(DeviceVec::<f32>::new(&res, 1 << 16).unwrap()); // and allowed again after it
        drop(v);
        drop(stream);
        res.release().unwrap();
    }
}

/// The tenth audit and its review: RMM's pool takes a block freed on another stream after making
/// the allocating stream wait for that stream's last free. A free recorded into a capture (by
/// code outside these crates: here the shim called with a lowered flag, on the per-thread
/// default stream, where RMM records without the stream lookup that a capture refuses) takes a
/// private stream's later allocation into the capture, its flag down. The allocation must ask
/// after all and stop the process. The child prints `RESULT joined=yes` where it went on inside
/// the capture (before: the flag skipped the question).
#[test]
fn a_private_stream_taken_into_a_capture_by_a_pools_wait_stops_the_allocation() {
    use std::process::Command;
    if std::env::var_os("RAFT_CAPTURE_CHILD").is_some() {
        pool_join_child();
        return;
    }
    require_gpu!();
    let me = std::env::current_exe().unwrap();
    let out = Command::new(me)
        .args(["a_private_stream_taken_into_a_capture_by_a_pools_wait_stops_the_allocation", "--exact", "--nocapture", "--test-threads=1"])
        .env("RAFT_CAPTURE_CHILD", "pool-join")
        .output_within(std::time::Duration::from_secs(300));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("RESULT freed"), "the child did not reach the allocation:\n{stdout}\n{stderr}");
    assert!(!stdout.contains("RESULT joined=yes"), "the allocation went on inside the capture:\n{stdout}\n{stderr}");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(out.status.signal(), Some(libc::SIGABRT), "{:?}\n{stdout}\n{stderr}", out.status);
    assert!(stderr.contains("a CUDA graph capture began on a stream while an allocation was queued on it"), "{stderr}");
}

fn pool_join_child() {
    use cudarc::driver::sys::{self, CUstreamCaptureMode as Mode};
    let api = raft_sys::shim().expect("the shim loads");
    let ctx = cudarc::driver::CudaContext::new(0).unwrap();
    let a = ctx.new_stream().unwrap();
    let b = ctx.per_thread_stream();
    const BLOCK: usize = 8 << 20;
    let down = 0u8; // "no capture may begin on this stream": what a private stream's flag says
    let (mut cuda_mr, mut pool) = (std::ptr::null_mut(), std::ptr::null_mut());
    let (mut data, mut ordered, mut fresh) = (std::ptr::null_mut(), 0i32, std::ptr::null_mut());
    // SAFETY: the shim's documented calls on live streams of device 0 (b is this thread's
    // per-thread stream, used only on this thread); the out-pointers are locals; the block is
    // freed once, on the stream it was allocated on; `down` outlives the calls.
    unsafe {
        assert_eq!(api.raftrs_mr_new(0, raft_sys::RAFTRS_MR_CUDA, &mut cuda_mr), 0);
        assert_eq!(api.raftrs_mr_new_pool(cuda_mr, BLOCK as i64, -1, &mut pool), 0, "{}", raft_sys::take_last_error(api));
        let (a_h, b_h) = (a.cu_stream() as *mut std::ffi::c_void, b.cu_stream() as *mut std::ffi::c_void);
        // The pool's only block, on b, before any capture.
        assert_eq!(api.raftrs_mr_allocate_held(0, pool, 0, b_h, BLOCK, &mut data, &mut ordered, &mut fresh, &down), 0);
        b.synchronize().unwrap();
        b.begin_capture(Mode::CU_STREAM_CAPTURE_MODE_RELAXED).unwrap();
        // Freed into b's capture without asking: b's event recorded there.
        assert_eq!(api.raftrs_mr_deallocate_held(pool, b_h, std::ptr::null(), data, BLOCK, &down), 0);
        println!("RESULT freed");
        // a's list is empty: the pool takes b's block after a waits for b's event.
        let mut got = std::ptr::null_mut();
        let st = api.raftrs_mr_allocate_held(0, pool, 0, a_h, BLOCK, &mut got, &mut ordered, &mut fresh, &down);
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        sys::cuStreamIsCapturing(a.cu_stream(), &mut status).result().unwrap();
        let joined = status == sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE;
        println!("RESULT joined={} status={st}", if joined { "yes" } else { "no" });
    }
    std::process::exit(0); // b's capture is left open: the process ends here
}

/// A release while the resources' stream is being captured into a CUDA graph (the tenth audit's
/// open item): the drain before RAFT's handles are destroyed was refused by the driver, which
/// invalidated the capture, and the destruction went on while work queued before the capture (a
/// GEMM, here) could still use the cuBLAS handle's workspace. Now the release keeps the native
/// objects for the process's life and says so (`Logic`), the capture stays valid and empty, and
/// the work queued before it completes. (Before: the release returned the drain's `Cuda` error
/// after destroying, and the capture could not be ended.)
#[test]
fn a_release_while_the_stream_is_captured_keeps_the_native_objects_and_the_capture() {
    require_gpu!();
    let _one = serial();
    use cudarc::driver::sys::{CUgraphInstantiate_flags as Flags, CUstreamCaptureMode as Mode};
    let res = DeviceResources::new().unwrap();
    // Large enough to run for milliseconds after it is queued (about 1.1 TFLOP).
    let n = 8192;
    let (a, b, mut c) = gemm_operands(&res, n);
    let stream = res.stream().unwrap();
    stream.synchronize().unwrap();
    square_gemm(n, &a, &b, &mut c).unwrap();
    let queued_before = stream.record_event(None).unwrap();
    stream.begin_capture(Mode::CU_STREAM_CAPTURE_MODE_RELAXED).unwrap();
    let released = res.release();
    let gemm_done_at_release = queued_before.is_complete();
    let graph = stream.end_capture(Flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH);
    let e = released.expect_err(&format!(
        "the release of resources whose stream was being captured succeeded (the GEMM queued before had {}finished)",
        if gemm_done_at_release { "" } else { "not " }
    ));
    assert_eq!((e.kind(), e.who()), (ErrorKind::Logic, "DeviceResources::release"), "{e}");
    assert!(e.to_string().contains("captured into a CUDA graph"), "{e}");
    assert!(graph.is_ok(), "the release invalidated the capture: {:?}", graph.err());
    queued_before.synchronize().unwrap();
    stream.synchronize().unwrap();
    drop((a, b, c));
}

/// The resources dropped while their stream is being captured a short while: the release
/// thread waits for the capture to end before it drains the stream and destroys the native
/// objects, so the capture stays valid and takes nothing. (Before: the release thread's drain
/// invalidated the capture at once, and the destruction went on.)
#[test]
fn resources_dropped_during_a_short_capture_are_destroyed_after_it() {
    require_gpu!();
    let _one = serial();
    let res = DeviceResources::new().unwrap();
    let n = 64;
    let (a, b, mut c) = gemm_operands(&res, n); // the GEMM makes the cuBLAS handle
    square_gemm(n, &a, &b, &mut c).unwrap();
    assert!(c.to_host().unwrap().iter().all(|&x| x == 2.0 * n as f32));
    drop((a, b, c));
    let stream = res.stream().unwrap();
    raft_tests::settle_releases(std::time::Duration::from_secs(30));
    let done_before = raft::stats().releases_done;
    let ((), nodes) = captured(&stream, || {
        drop(res); // the last handle: a release thread destroys, and finds the stream captured
        std::thread::sleep(std::time::Duration::from_millis(100));
    });
    assert_eq!(nodes, 0, "the release put work into the graph");
    raft_tests::settle_releases(std::time::Duration::from_secs(30));
    assert!(raft::stats().releases_done > done_before, "the release did not run");
    // Destroyed, not kept: the release let its handle of the stream go (a kept one forgets it).
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while std::sync::Arc::strong_count(&stream) > 1 && std::time::Instant::now() < give_up {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(std::sync::Arc::strong_count(&stream), 1, "the resources' native objects were kept, not destroyed");
}

/// An array used on another stream (cudarc's `DevicePtrMut`) and dropped while its own stream is
/// being captured (the eleventh audit): the drop made the capturing stream wait for the use's
/// event, recorded outside the capture, which the driver refuses (invalidating the capture) or
/// would take into the graph only. Now the host waits for the use instead: the capture stays
/// valid and takes nothing, and the array is freed after it. (Before: the capture could not be
/// ended.)
#[test]
fn an_array_used_on_another_stream_and_dropped_during_a_capture_of_its_own_stream_leaves_the_capture_valid() {
    require_gpu!();
    let _one = serial();
    use raft::MemoryResource;
    let res = DeviceResources::new().unwrap();
    let stream = res.stream().unwrap();
    let other = stream.context().new_stream().unwrap();
    let mr = MemoryResource::cuda(0).unwrap().with_statistics().unwrap();
    let n = 1 << 20;
    let src = other.alloc_zeros::<f32>(n).unwrap();
    let mut v = DeviceVec::<f32>::new_in(&res, n, &mr).unwrap();
    other.memcpy_dtod(&src, &mut v).unwrap(); // a use of the array on `other`
    let ((), nodes) = captured(&stream, || drop(v));
    assert_eq!(nodes, 0, "the drop put work into the graph");
    other.synchronize().unwrap();
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while mr.statistics().unwrap().current_count != 0 && std::time::Instant::now() < give_up {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(mr.statistics().unwrap().current_count, 0, "the array was not freed after the capture ended");
}

/// `DeviceResources::sync` while the resources' stream is being captured (the eleventh audit): the
/// driver refuses a wait for a capturing stream and invalidates the capture. Now the wait is
/// refused first (`Logic`), and the capture stays valid. (Before: a `Cuda` error, and the capture
/// could not be ended.)
#[test]
fn a_sync_is_refused_while_the_stream_is_captured_and_the_capture_stays_valid() {
    require_gpu!();
    let _one = serial();
    let res = DeviceResources::new().unwrap();
    let stream = res.stream().unwrap();
    let (refused, nodes) = captured(&stream, || res.sync());
    let e = refused.expect_err("a sync of a capturing stream succeeded");
    assert_eq!((e.kind(), e.who()), (ErrorKind::Logic, "DeviceResources::sync"), "{e}");
    assert!(e.to_string().contains("captured into a CUDA graph"), "{e}");
    assert_eq!(nodes, 0);
    res.sync().unwrap();
}
