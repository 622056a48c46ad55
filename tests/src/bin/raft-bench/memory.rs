//! Allocation through RMM's resources against C++ calling the same ones, where an allocation's time
//! goes, and the fragmentation of the rapidsai/rmm#2039 pattern (issues 15 and 16).
use crate::fail;
use crate::measure::{measure, measure_turns};
use crate::table::Table;
use raft::{DeviceResources, DeviceVec};
use raft_tests::baseline::*;
use std::hint::black_box;

/// The multi-stream pattern of rapidsai/rmm#2039: allocations of mixed sizes made and freed on
/// several streams (one resources object each) through one resource. A statistics adaptor under
/// the resource counts what it takes from cudaMalloc (its footprint), one over it what is live;
/// the footprint's peak over the live peak is the fragmentation overhead. Same seeded sequence
/// for every resource and stream count.
fn fragmentation(t: &mut Table) {
    const ROUNDS: usize = 2000;
    let sizes = [64usize << 10, 1 << 20, 3 << 20, 16 << 20, 48 << 20];
    let mut seed: u64 = 0x2039;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let plan: Vec<(usize, usize, bool)> = (0..ROUNDS)
        .map(|_| {
            let n = next();
            (sizes[(n % sizes.len() as u64) as usize], (n >> 8) as usize, (n >> 16) % 3 != 0)
        })
        .collect();
    for streams in [1usize, 2, 4] {
        let all: Vec<DeviceResources> = (0..streams).map(|_| DeviceResources::on_device(0).unwrap()).collect();
        for (name, make) in [
            (
                "pool",
                (|up: &raft::MemoryResource| up.pool(raft::PoolOptions::initial(0)))
                    as fn(&raft::MemoryResource) -> raft::Result<raft::MemoryResource>,
            ),
            ("arena", |up: &raft::MemoryResource| up.arena(raft::ArenaOptions::size(8 << 30))),
            ("cuda_async", |_up: &raft::MemoryResource| raft::MemoryResource::cuda_async(0)),
        ] {
            let upstream = raft::MemoryResource::cuda(0).unwrap().with_statistics().unwrap();
            let mr = make(&upstream).unwrap();
            let top = mr.with_statistics().unwrap();
            let mut live: Vec<DeviceVec<u8>> = Vec::new();
            for &(bytes, pick, keep) in &plan {
                let res = &all[pick % streams];
                if keep || live.is_empty() {
                    live.push(DeviceVec::<u8>::new_in(res, bytes, &top).unwrap());
                }
                if live.len() > 64 || !keep {
                    let victim = pick % live.len();
                    drop(live.swap_remove(victim));
                }
            }
            drop(live);
            all.iter().for_each(|r| r.sync().unwrap());
            let live_peak = top.statistics().unwrap().peak_bytes as f64;
            // cuda_async takes from the driver's pool, not through `upstream`: its footprint is
            // not seen there, and the row says so.
            let footprint = upstream.statistics().unwrap().peak_bytes as f64;
            let note = if name == "arena" {
                format!(
                    "{name}, {streams} stream(s): live peak {:.0} MiB; the arena takes its whole 8 GiB from cudaMalloc at once ({:.0} MiB), so its overhead is that reservation, not fragmentation",
                    live_peak / (1u64 << 20) as f64,
                    footprint / (1u64 << 20) as f64
                )
            } else if name == "cuda_async" {
                format!(
                    "{name}, {streams} stream(s): live peak {:.0} MiB (footprint inside the driver's pool: not counted here)",
                    live_peak / (1u64 << 20) as f64
                )
            } else {
                format!(
                    "{name}, {streams} stream(s): live peak {:.0} MiB, taken from cudaMalloc at peak {:.0} MiB: {:.2}x",
                    live_peak / (1u64 << 20) as f64,
                    footprint / (1u64 << 20) as f64,
                    footprint / live_peak.max(1.0)
                )
            };
            eprintln!("  fragmentation (rmm#2039 pattern): {note}");
            t.notes.push(format!("fragmentation (rmm#2039 pattern, {ROUNDS} allocations of 64 KiB-48 MiB): {note}"));
        }
        all.iter().for_each(|r| r.release().unwrap());
    }
}

/// C++ doing the steps soundness requires of an allocation (`bl_alloc_free_held`).
const FLOOR: &str = "C++ doing the steps soundness requires: released check (shared lock), cuCtxGetCurrent (again at the free: its device), a record holding the resource and the stream (two shared_ptr copies; inline, as the array's), a per-thread live count, allocate + free through the type-erased resource (a pool-like one fenced as the shim fences it; an async pool's each with the capture mode relaxed)";
/// The same for the default path: the kept copy of the current resource compared with RMM's map
/// entry under RMM's lock first.
const FLOOR_DEFAULT: &str = "C++ doing the steps soundness requires: released check (shared lock), cuCtxGetCurrent (again at the free), the kept copy of the current resource compared with RMM's map entry under RMM's lock, a record holding it and the stream (two shared_ptr copies; inline), a per-thread live count, allocate + free through it (the async pool's each with the capture mode relaxed)";
/// The floor plus what this design adds (`bl_alloc_free_held_as_designed`).
const DESIGNED: &str = "the same C++ plus the two steps this design adds: a third counted handle (the array's resources object) and the thread's record of resources in use";

/// Case 5: 1 MiB allocate + free, through the default resource, below RMM, and through pool and arena.
pub fn rows(t: &mut Table, r: &DeviceResources) {
    // Like with like: the C++ allocation rows allocate and free on the stream ours use (run 132:
    // two idle streams differed by ~100 ns for the async pool at 256 B).
    let own = r.stream().unwrap();
    // SAFETY: the stream outlives the rows (held until the end of this function, where the
    // baseline is given its own back).
    unsafe { bl_use_stream(own.cu_stream() as *mut std::ffi::c_void) };
    // 5. 1 MiB allocate + free.
    let mib = 1 << 20;
    // Ours and the C++ rows in turns (each sample runs each); cudaMalloc's row apart (slow).
    let [ours, cpp_async, cpp_lookup, default_floor, default_designed] = measure_turns(
        200,
        5000,
        [
            &mut || drop(DeviceVec::<u8>::new(r, mib).unwrap()),
            // SAFETY: plain C functions of the baseline.
            &mut || assert_eq!(unsafe { bl_alloc_free_async(mib) }, 0),
            // SAFETY: as above.
            &mut || assert_eq!(unsafe { bl_alloc_free_per_device(mib) }, 0),
            // SAFETY: as above (kind 4: the current resource, revalidated under RMM's lock).
            &mut || assert_eq!(unsafe { bl_alloc_free_held(4, mib) }, 0),
            // SAFETY: as above.
            &mut || assert_eq!(unsafe { bl_alloc_free_held_as_designed(4, mib) }, 0),
        ],
    );
    // SAFETY: as above.
    let cpp_cuda = measure(50, 1000, 1, || assert_eq!(unsafe { bl_alloc_free_cuda(mib) }, 0));
    t.add(
        "1 MiB allocate + free (in turns)",
        "DeviceVec::new + drop (default resource)",
        ours,
        vec![
            ("C++ cuda_async_memory_resource", cpp_async),
            ("C++ through get_per_device_resource_ref", cpp_lookup),
            ("C++ cuda_memory_resource", cpp_cuda),
        ],
        "C++ cuda_async_memory_resource",
        "<= 1.10x pool, >= 2x faster than cudaMalloc",
        move |a, b| a <= 1.10 * b && 2.0 * a <= cpp_cuda.median_ns,
    );
    t.add(
        "1 MiB allocate + free, the default path, against its floor (in turns with the row above)",
        "DeviceVec::new + drop (default resource)",
        ours,
        vec![
            (FLOOR_DEFAULT, default_floor),
            (DESIGNED, default_designed),
            ("C++ through get_per_device_resource_ref (the goal's baseline)", cpp_lookup),
        ],
        FLOOR_DEFAULT,
        "<= 1.10x",
        |a, b| a <= 1.10 * b,
    );
    // Where the allocation's time goes: the shim's held allocate + free called directly (its C++
    // side: device scope, the kept copy compared under RMM's map lock, allocate, free) against
    // the same C++ lookup, and the context guard the result layer adds around each call.
    let stream = &own;
    let api = raft_sys::shim().unwrap_or_else(|e| fail(&e.to_string()));
    // The shim's default path as `DeviceVec::new` takes it: a handle to the current resource
    // (the crate's cache), revalidated under RMM's lock at each allocation.
    let mut current_mr = std::ptr::null_mut();
    // SAFETY: writes one handle, destroyed at the end of this function.
    assert_eq!(unsafe { api.raftrs_mr_current(0, &mut current_mr) }, 0);
    let current_mr = current_mr as *const raft_sys::raftrs_mr;
    let mut shim_direct = || {
        let (mut data, mut ordered) = (std::ptr::null_mut(), 0);
        let s = stream.cu_stream() as *mut std::ffi::c_void;
        // SAFETY: the stream is alive (held above); `current_mr` lives until the end of `rows`;
        // out-pointers are locals; the buffer is freed right after, on the same stream.
        unsafe {
            let mut fresh = std::ptr::null_mut();
            assert_eq!(api.raftrs_mr_allocate_held(0, current_mr, 1, s, mib, &mut data, &mut ordered, &mut fresh, std::ptr::null()), 0);
            let through = if fresh.is_null() { current_mr } else { fresh as *const raft_sys::raftrs_mr };
            assert_eq!(api.raftrs_mr_deallocate_held(through, s, std::ptr::null(), data, mib, std::ptr::null()), 0);
            if !fresh.is_null() {
                assert_eq!(api.raftrs_mr_destroy(fresh), 0); // the device's resource changed meanwhile
            }
        }
    };
    // The shim and the C++ steps in turns.
    let [shim_direct, cpp_copied, cpp_copied_heap] = measure_turns(
        200,
        5000,
        [
            &mut shim_direct,
            // SAFETY: plain C functions of the baseline.
            &mut || assert_eq!(unsafe { bl_alloc_free_copied(mib, 0) }, 0),
            // SAFETY: as above.
            &mut || assert_eq!(unsafe { bl_alloc_free_copied(mib, 1) }, 0),
        ],
    );
    // The C++ pool's own memory pool below RMM: the runtime's calls directly, the driver's.
    let [cpp_pool_again, cpp_runtime, cpp_driver] = measure_turns(
        200,
        5000,
        [
            // SAFETY: plain C functions of the baseline.
            &mut || assert_eq!(unsafe { bl_alloc_free_async(mib) }, 0),
            // SAFETY: as above.
            &mut || assert_eq!(unsafe { bl_alloc_free_async_runtime(mib) }, 0),
            // SAFETY: as above.
            &mut || assert_eq!(unsafe { bl_alloc_free_async_driver(mib) }, 0),
        ],
    );
    t.report(
        "1 MiB allocate + free, below RMM (in turns; every column C++)",
        "C++ cuda_async_memory_resource (as the goal row's baseline)",
        cpp_pool_again,
        vec![
            ("its pool through cudaMallocFromPoolAsync + cudaFreeAsync", cpp_runtime),
            ("its pool through cuMemAllocFromPoolAsync + cuMemFreeAsync", cpp_driver),
        ],
        "its pool through cuMemAllocFromPoolAsync + cuMemFreeAsync",
        "reported",
    );
    let guard_pair = measure(200, 5000, 1, || {
        // What ContextGuard::save + drop cost: two cuCtxGetCurrent, twice per allocation.
        let c = cudarc::driver::result::ctx::get_current().unwrap();
        black_box(cudarc::driver::result::ctx::get_current().unwrap() == c);
    });
    t.report(
        "1 MiB allocate + free, where the time goes",
        "the shim's default path (allocate_held with the kept current resource + deallocate_held), called directly (in turns with the two C++ step rows)",
        shim_direct,
        vec![
            ("C++ through get_per_device_resource_ref", cpp_lookup),
            ("C++, the steps before issue 30 without device switches: copy + equality check under RMM's lock", cpp_copied),
            ("C++, the same with the copy in a heap object", cpp_copied_heap),
            ("DeviceVec::new + drop", ours),
            ("two cuCtxGetCurrent", guard_pair),
        ],
        "C++ through get_per_device_resource_ref",
        "reported",
    );

    // SAFETY: the handle from raftrs_mr_current above, no longer used.
    assert_eq!(unsafe { api.raftrs_mr_destroy(current_mr as *mut raft_sys::raftrs_mr) }, 0);

    // Issue 30: every explicit resource at three sizes, against C++ calling the same kind of
    // resource (each over cudaMalloc, or the async pool, made once, warm), in turns.
    let cuda = raft::MemoryResource::cuda(0).unwrap();
    let pool = cuda.pool(raft::PoolOptions::initial(256 << 20)).unwrap();
    let arena = cuda.arena(raft::ArenaOptions::size(1 << 30)).unwrap();
    let binning = cuda.binning(8, 20).unwrap();
    let async_pool = raft::MemoryResource::cuda_async(0).unwrap();
    type Cpp = unsafe extern "C" fn(usize) -> i32;
    let kinds: [(&str, &raft::MemoryResource, Cpp); 4] = [
        ("pool over cudaMalloc", &pool, bl_alloc_free_pool),
        ("arena over cudaMalloc", &arena, bl_alloc_free_bench_arena),
        ("binning (2^8..2^20) over cudaMalloc", &binning, bl_alloc_free_binning),
        ("async pool", &async_pool, bl_alloc_free_async),
    ];
    for (index, (kind, mr, cpp)) in kinds.into_iter().enumerate() {
        for (size, bytes) in [("256 B", 256usize), ("64 KiB", 64 << 10), ("1 MiB", 1 << 20)] {
            let [ours, base, floor, designed] = measure_turns(
                200,
                5000,
                [
                    &mut || drop(DeviceVec::<u8>::new_in(r, bytes, mr).unwrap()),
                    // SAFETY: plain C functions of the baseline.
                    &mut || assert_eq!(unsafe { cpp(bytes) }, 0),
                    // SAFETY: as above; `index` is the kind's number in baseline.cpp's order.
                    &mut || assert_eq!(unsafe { bl_alloc_free_held(index as i32, bytes) }, 0),
                    // SAFETY: as above.
                    &mut || assert_eq!(unsafe { bl_alloc_free_held_as_designed(index as i32, bytes) }, 0),
                ],
            );
            t.add(
                &format!("{size} allocate + free, {kind} (in turns)"),
                "DeviceVec::new_in + drop",
                ours,
                vec![("C++, the same resource kind", base), (FLOOR, floor), (DESIGNED, designed)],
                "C++, the same resource kind",
                "<= 1.10x",
                |a, b| a <= 1.10 * b,
            );
            t.add(
                &format!("{size} allocate + free, {kind}, against its floor (the row above's turns)"),
                "DeviceVec::new_in + drop",
                ours,
                vec![(FLOOR, floor), (DESIGNED, designed), ("C++, the same resource kind", base)],
                FLOOR,
                "<= 1.10x",
                |a, b| a <= 1.10 * b,
            );
        }
    }
    private_streams(t, &kinds);
    // SAFETY: as at the top: the resources' own stream again for the rows below (run 167 left
    // them on the baseline's own).
    unsafe { bl_use_stream(own.cu_stream() as *mut std::ffi::c_void) };
    arena_steps(t, r, &arena);
    rust_steps(t);
    threads_on_one_arena(t, &arena);
    // Last of the explicit-resource rows: the rows above ran before it since run 129.
    one_async_pool(t, r, &async_pool);
    // SAFETY: a null pointer only makes the baseline forget its view of the pool dropped below.
    assert_eq!(unsafe { bl_async_share_pool_of(std::ptr::null()) }, 0);
    drop((pool, arena, binning, async_pool, cuda));
    fragmentation(t);
    // SAFETY: the baseline's own stream again (`own` is dropped after this).
    unsafe { bl_use_stream(std::ptr::null_mut()) };
    drop(own);
}

/// Issue 30's private streams (`result/exposure.rs`): resources whose stream's handle never left
/// the library, so their allocations and frees read a flag instead of asking the stream about a
/// capture. Ours on such resources, the C++ resource alone, and the floors taking the flag's
/// read in place of each query the shim skips, in turns (after an allocation through a pool or a
/// binning resource the shim asks the driver whatever the flag says, and so do the floors: the
/// tenth audit); C++ on a stream of its own (the bench cannot name the private stream without
/// raising its flag), an idle non-blocking stream like ours.
fn private_streams(t: &mut Table, kinds: &[(&str, &raft::MemoryResource, unsafe extern "C" fn(usize) -> i32); 4]) {
    let private = DeviceResources::new().unwrap();
    // SAFETY: null: the baseline's own stream for the rows below.
    unsafe { bl_use_stream(std::ptr::null_mut()) };
    // SAFETY: a switch of the baseline, read by its floors.
    unsafe { bl_floor_private(1) };
    for (index, (kind, mr, cpp)) in kinds.iter().enumerate() {
        for (size, bytes) in [("256 B", 256usize), ("64 KiB", 64 << 10), ("1 MiB", 1 << 20)] {
            let [ours, base, floor, designed] = measure_turns(
                200,
                5000,
                [
                    &mut || drop(DeviceVec::<u8>::new_in(&private, bytes, mr).unwrap()),
                    // SAFETY: plain C functions of the baseline.
                    &mut || assert_eq!(unsafe { cpp(bytes) }, 0),
                    // SAFETY: as above; `index` is the kind's number in baseline.cpp's order.
                    &mut || assert_eq!(unsafe { bl_alloc_free_held(index as i32, bytes) }, 0),
                    // SAFETY: as above.
                    &mut || assert_eq!(unsafe { bl_alloc_free_held_as_designed(index as i32, bytes) }, 0),
                ],
            );
            t.add(
                &format!("{size} allocate + free, {kind}, a private stream (in turns)"),
                "DeviceVec::new_in + drop, resources whose stream never left the library",
                ours,
                vec![
                    ("C++, the same resource kind", base),
                    ("the floor, the flag read for each query", floor),
                    ("the designed floor, the flag read for each query", designed),
                ],
                "C++, the same resource kind",
                "<= 1.10x",
                |a, b| a <= 1.10 * b,
            );
        }
    }
    // The default path on the private resources, against the C++ lookup.
    let mib = 1 << 20;
    let [ours, lookup, floor] = measure_turns(
        200,
        5000,
        [
            &mut || drop(DeviceVec::<u8>::new(&private, mib).unwrap()),
            // SAFETY: plain C functions of the baseline.
            &mut || assert_eq!(unsafe { bl_alloc_free_per_device(mib) }, 0),
            // SAFETY: as above (kind 4: the current resource, revalidated under RMM's lock).
            &mut || assert_eq!(unsafe { bl_alloc_free_held(4, mib) }, 0),
        ],
    );
    t.add(
        "1 MiB allocate + free, the default path, a private stream (in turns)",
        "DeviceVec::new + drop, resources whose stream never left the library",
        ours,
        vec![("C++ through get_per_device_resource_ref", lookup), ("the floor, the flag read for each query", floor)],
        "C++ through get_per_device_resource_ref",
        "<= 1.10x",
        |a, b| a <= 1.10 * b,
    );
    // SAFETY: as above.
    unsafe { bl_floor_private(0) };
    private.release().unwrap();
}

/// The async pool and the default path like with like (issue 30): the C++ rows above allocate
/// from a pool of their own, whose history (the 1 MiB rows before them, RMM's and the runtime's
/// and the driver's) is not ours; here C++ allocates from this library's very pool, through RMM's
/// `cuda_async_view_memory_resource` over its handle (bl_async_share_pool_of), on the same stream,
/// at the three sizes; and the default path (our installed async pool on both sides) at the same
/// three sizes against its floor.
fn one_async_pool(t: &mut Table, r: &DeviceResources, async_pool: &raft::MemoryResource) {
    let probe = DeviceVec::<u8>::new_in(r, 256, async_pool).unwrap();
    // SAFETY: the address of a live allocation of this library's async pool (only read by the
    // driver's pointer query).
    assert_eq!(unsafe { bl_async_share_pool_of(probe.device_address() as *const std::ffi::c_void) }, 0);
    drop(probe);
    const SAME: &str = "C++ RMM's view of the same pool (cuda_async_view_memory_resource), same stream";
    for (size, bytes) in [("256 B", 256usize), ("64 KiB", 64 << 10), ("1 MiB", 1 << 20)] {
        let [ours, same, floor, designed] = measure_turns(
            200,
            5000,
            [
                &mut || drop(DeviceVec::<u8>::new_in(r, bytes, async_pool).unwrap()),
                // SAFETY: plain C functions of the baseline (the view was made above).
                &mut || assert_eq!(unsafe { bl_alloc_free_async_shared(bytes) }, 0),
                // SAFETY: as above; kind 5 is the view of this library's pool.
                &mut || assert_eq!(unsafe { bl_alloc_free_held(5, bytes) }, 0),
                // SAFETY: as above.
                &mut || assert_eq!(unsafe { bl_alloc_free_held_as_designed(5, bytes) }, 0),
            ],
        );
        t.add(
            &format!("{size} allocate + free, async pool, C++ on the same pool (in turns)"),
            "DeviceVec::new_in + drop",
            ours,
            vec![(SAME, same), (FLOOR, floor), (DESIGNED, designed)],
            SAME,
            "<= 1.10x",
            |a, b| a <= 1.10 * b,
        );
        let [ours, floor, designed] = measure_turns(
            200,
            5000,
            [
                &mut || drop(DeviceVec::<u8>::new(r, bytes).unwrap()),
                // SAFETY: plain C functions of the baseline; kind 4 is the default path.
                &mut || assert_eq!(unsafe { bl_alloc_free_held(4, bytes) }, 0),
                // SAFETY: as above.
                &mut || assert_eq!(unsafe { bl_alloc_free_held_as_designed(4, bytes) }, 0),
            ],
        );
        t.report(
            &format!("{size} allocate + free, the default path against its floor, all sizes (in turns)"),
            "DeviceVec::new + drop (default resource)",
            ours,
            vec![(FLOOR_DEFAULT, floor), (DESIGNED, designed)],
            FLOOR_DEFAULT,
            "reported",
        );
    }
}

/// Where an allocation through an explicit arena goes (issue 30), in turns: ours, the shim's
/// held allocate + free called directly on an arena of its own (its C++ side: the device scope,
/// the fence's hint at the free), C++ RMM's arena alone, and C++ doing the
/// steps soundness requires (`bl_alloc_free_held`: the floor the goal is held to). At
/// 64 KiB, then at 0 bytes, where no side calls RMM (the shim skips it): what is left is each
/// layer's own cost.
fn arena_steps(t: &mut Table, r: &DeviceResources, arena: &raft::MemoryResource) {
    let stream = r.stream().unwrap();
    let api = raft_sys::shim().unwrap_or_else(|e| fail(&e.to_string()));
    let (mut cuda_mr, mut shim_arena) = (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: each writes one handle, destroyed at the end of this function.
    unsafe {
        assert_eq!(api.raftrs_mr_new(0, raft_sys::RAFTRS_MR_CUDA, &mut cuda_mr), 0);
        assert_eq!(api.raftrs_mr_new_arena(cuda_mr, 1 << 30, &mut shim_arena), 0);
    }
    let owner = std::sync::Arc::as_ptr(&stream) as *const std::ffi::c_void;
    const SHIM: &str = "the shim's allocate_held + deallocate_held on an arena of its own, called directly";
    for (size, bytes) in [("64 KiB", 64usize << 10), ("0 bytes (no RMM call on any side)", 0)] {
        let mut shim_direct = || {
            let (mut data, mut ordered, mut fresh) = (std::ptr::null_mut(), 0, std::ptr::null_mut());
            let s = stream.cu_stream() as *mut std::ffi::c_void;
            // SAFETY: the stream is alive (held above, and `owner` is its `Arc`, which a fence may
            // retain through the keeper the library registered); the arena lives until the end of
            // this function; out-pointers are locals; the buffer is freed right after, on its
            // stream.
            unsafe {
                assert_eq!(
                    api.raftrs_mr_allocate_held(0, shim_arena, 0, s, bytes, &mut data, &mut ordered, &mut fresh, std::ptr::null()),
                    0
                );
                assert_eq!(api.raftrs_mr_deallocate_held(shim_arena, s, owner, data, bytes, std::ptr::null()), 0);
            }
        };
        let [ours, shim, cpp_arena, cpp_floor, cpp_designed] = measure_turns(
            200,
            5000,
            [
                &mut || drop(DeviceVec::<u8>::new_in(r, bytes, arena).unwrap()),
                &mut shim_direct,
                // SAFETY: plain C functions of the baseline.
                &mut || assert_eq!(unsafe { bl_alloc_free_bench_arena(bytes) }, 0),
                // SAFETY: as above.
                &mut || assert_eq!(unsafe { bl_alloc_free_held(1, bytes) }, 0),
                // SAFETY: as above.
                &mut || assert_eq!(unsafe { bl_alloc_free_held_as_designed(1, bytes) }, 0),
            ],
        );
        let case = format!("{size} allocate + free, arena over cudaMalloc, against its floor (in turns)");
        let base = (if bytes == 0 { "C++ RMM's arena alone" } else { "C++ RMM's arena alone (the goal row's baseline)" }, cpp_arena);
        let designed = (DESIGNED, cpp_designed);
        if bytes == 0 {
            t.report(&case, "DeviceVec::new_in + drop", ours, vec![(FLOOR, cpp_floor), designed, (SHIM, shim), base], FLOOR, "reported");
        } else {
            t.add(
                &case,
                "DeviceVec::new_in + drop",
                ours,
                vec![(FLOOR, cpp_floor), designed, (SHIM, shim), base],
                FLOOR,
                "<= 1.10x",
                |a, b| a <= 1.10 * b,
            );
        }
    }
    // SAFETY: the handles made above, no longer used (the buffers were freed).
    unsafe {
        assert_eq!(api.raftrs_mr_destroy(shim_arena), 0);
        assert_eq!(api.raftrs_mr_destroy(cuda_mr), 0);
    }
}

/// What the Rust layer's own steps cost on this host's CPU (issue 30's accounting of the 0-byte
/// rows): each primitive an allocate + free of `DeviceVec` performs, timed in batches of 1000
/// (no per-call clock read), on objects only this thread touches.
fn rust_steps(t: &mut Table) {
    use std::cell::{Cell, RefCell};
    use std::sync::{Arc, Mutex, RwLock};
    let lock = RwLock::new(7u64);
    let arc = Arc::new(7u64);
    let weak = Arc::downgrade(&arc);
    let mutex = Mutex::new(Some(arc.clone()));
    let counter = std::sync::atomic::AtomicUsize::new(0);
    thread_local! {
        static STACK: RefCell<Vec<(u64, usize)>> = const { RefCell::new(Vec::new()) };
        static COUNT: Cell<isize> = const { Cell::new(0) };
    }
    let batch = |f: &mut dyn FnMut()| measure(1000, 2000, 1000, f);
    let rw = batch(&mut || drop(black_box(lock.read().unwrap())));
    let arc_pair = batch(&mut || drop(black_box(arc.clone())));
    let weak_up = batch(&mut || drop(black_box(weak.upgrade())));
    let mutex_clone = batch(&mut || drop(black_box(mutex.lock().unwrap().clone())));
    let global = batch(&mut || {
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        counter.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    });
    let local = batch(&mut || {
        COUNT.with(|c| c.set(black_box(c.get() + 1)));
        COUNT.with(|c| c.set(black_box(c.get() - 1)));
    });
    let stack = batch(&mut || {
        STACK.with(|s| black_box(s.borrow().iter().rev().any(|(id, _)| *id == 9)));
        STACK.with(|s| s.borrow_mut().push((1, 2)));
        STACK.with(|s| black_box(s.borrow_mut().pop()));
    });
    let boxed = batch(&mut || drop(black_box(Box::new([0u64; 8]))));
    t.report(
        "the Rust layer's steps alone, on this host's CPU (batches of 1000; no clock read per call)",
        "RwLock read + unlock (the resources' released check)",
        rw,
        vec![
            ("Arc clone + drop (one counted handle)", arc_pair),
            ("Weak upgrade + drop (the default path's kept copy, per thread)", weak_up),
            ("Mutex lock + Arc clone + unlock + drop (the default path's kept copy, process-wide)", mutex_clone),
            ("a process-wide atomic +1 and -1 (the live count before)", global),
            ("a thread-local count +1 and -1 (the live count now)", local),
            ("the thread's in-use record: search, push, pop", stack),
            ("a 64-byte Box made and dropped", boxed),
        ],
        "Arc clone + drop (one counted handle)",
        "reported",
    );
}

/// Issue 30: 8 and 16 threads (a resources object each, so a stream each) allocating and freeing
/// 64 KiB from one arena, against C++ threads doing the same on streams of their own from one
/// arena; in turns, fifteen rounds each (five read 0.5x to 1.2x from run to run). Each sample is
/// the wall time from the threads' common start to the last one's end, per allocation (its
/// inverse is the aggregate rate).
fn threads_on_one_arena(t: &mut Table, arena: &raft::MemoryResource) {
    const ITERS: usize = 2000;
    const BYTES: usize = 64 << 10;
    for threads in [8usize, 16] {
        let all: Vec<DeviceResources> = (0..threads).map(|_| DeviceResources::on_device(0).unwrap()).collect();
        let ours_once = || {
            let ready = std::sync::Barrier::new(threads + 1);
            let start = std::sync::OnceLock::new();
            std::thread::scope(|s| {
                for res in &all {
                    let ready = &ready;
                    s.spawn(move || {
                        ready.wait();
                        for _ in 0..ITERS {
                            drop(DeviceVec::<u8>::new_in(res, BYTES, arena).unwrap());
                        }
                    });
                }
                ready.wait();
                let _ = start.set(std::time::Instant::now());
            });
            start.get().unwrap().elapsed().as_nanos() as f64 / (threads * ITERS) as f64
        };
        let cpp_once = || {
            let mut ns = 0i64;
            // SAFETY: a plain C function of the baseline; writes one integer.
            assert_eq!(unsafe { bl_arena_threads(threads as i32, ITERS as i32, BYTES, &mut ns) }, 0);
            ns as f64 / (threads * ITERS) as f64
        };
        ours_once();
        cpp_once();
        let (mut ours, mut cpp) = (Vec::new(), Vec::new());
        for _ in 0..15 {
            ours.push(ours_once());
            cpp.push(cpp_once());
        }
        let (ours, cpp) = (crate::measure::stat_of(ours), crate::measure::stat_of(cpp));
        eprintln!("  {threads} threads x 64 KiB, one arena: {:.2} M/s ours, {:.2} M/s C++", 1e3 / ours.median_ns, 1e3 / cpp.median_ns);
        t.add(
            &format!("{threads} threads x 64 KiB allocate + free, one arena (in turns; ns per allocation of the aggregate)"),
            "DeviceVec::new_in + drop, a resources object per thread",
            ours,
            vec![("C++ threads, a stream each, one arena", cpp)],
            "C++ threads, a stream each, one arena",
            "<= 1.10x",
            |a, b| a <= 1.10 * b,
        );
        all.iter().for_each(|r| r.release().unwrap());
    }
}
