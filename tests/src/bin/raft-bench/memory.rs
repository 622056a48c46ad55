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

/// Case 5: 1 MiB allocate + free, through the default resource, below RMM, and through pool and arena.
pub fn rows(t: &mut Table, r: &DeviceResources) {
    // 5. 1 MiB allocate + free.
    let mib = 1 << 20;
    // Ours and the C++ rows in turns (each sample runs each); cudaMalloc's row apart (slow).
    let [ours, cpp_async, cpp_lookup] = measure_turns(
        200,
        5000,
        [
            &mut || drop(DeviceVec::<u8>::new(r, mib).unwrap()),
            // SAFETY: plain C functions of the baseline.
            &mut || assert_eq!(unsafe { bl_alloc_free_async(mib) }, 0),
            // SAFETY: as above.
            &mut || assert_eq!(unsafe { bl_alloc_free_per_device(mib) }, 0),
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
    // Where the allocation's time goes: the shim's create + destroy called directly (its C++
    // side: device scope, RMM's map lock and resource copy, allocate, free) against the same
    // C++ lookup, and the context guard the result layer adds around each call.
    let stream = r.stream().unwrap();
    let api = raft_sys::shim().unwrap_or_else(|e| fail(&e.to_string()));
    let mut shim_direct = || {
        let (mut buf, mut data, mut ordered) = (std::ptr::null_mut(), std::ptr::null_mut(), 0);
        let s = stream.cu_stream() as *mut std::ffi::c_void;
        // SAFETY: the stream is alive (held above); out-pointers are locals; the buffer is freed
        // right after, on the same stream.
        unsafe {
            assert_eq!(api.raftrs_buffer_create(0, std::ptr::null(), s, mib, &mut buf, &mut data, &mut ordered), 0);
            assert_eq!(api.raftrs_buffer_destroy(buf, s), 0);
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
        "the shim's buffer create + destroy, called directly (in turns with the two C++ step rows)",
        shim_direct,
        vec![
            ("C++ through get_per_device_resource_ref", cpp_lookup),
            ("C++, the shim's steps but its device switches: copy + equality check under RMM's lock", cpp_copied),
            ("C++, the same with the copy in a heap object", cpp_copied_heap),
            ("DeviceVec::new + drop", ours),
            ("two cuCtxGetCurrent", guard_pair),
        ],
        "C++ through get_per_device_resource_ref",
        "reported",
    );

    // Issue 15: the same allocation through RMM's pool and arena, made from Rust, against C++
    // calling the same kind of resource (each over cudaMalloc, made once, warm).
    let pool = raft::MemoryResource::cuda(0).unwrap().pool(raft::PoolOptions::initial(256 << 20)).unwrap();
    let arena = raft::MemoryResource::cuda(0).unwrap().arena(raft::ArenaOptions::size(1 << 30)).unwrap();
    for (label, mr, cpp) in [
        ("1 MiB allocate + free, pool over cudaMalloc (in turns)", &pool, bl_alloc_free_pool as unsafe extern "C" fn(usize) -> i32),
        ("1 MiB allocate + free, arena over cudaMalloc (in turns)", &arena, bl_alloc_free_arena as unsafe extern "C" fn(usize) -> i32),
    ] {
        let [ours, base] = measure_turns(
            200,
            5000,
            [
                &mut || drop(DeviceVec::<u8>::new_in(r, mib, mr).unwrap()),
                // SAFETY: plain C functions of the baseline.
                &mut || assert_eq!(unsafe { cpp(mib) }, 0),
            ],
        );
        t.add(
            label,
            "DeviceVec::new_in + drop",
            ours,
            vec![("C++, the same resource kind", base)],
            "C++, the same resource kind",
            "<= 1.10x",
            |a, b| a <= 1.10 * b,
        );
    }
    drop((pool, arena));
    fragmentation(t);
}
