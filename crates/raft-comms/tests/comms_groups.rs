//! How groups nest, checked before any collective (NCCL loaded, no GPU needed): a scoped group
//! refuses an unsafe `group` inside it (whose calls would be launched only at the scope's end,
//! after the inner closure's arrays may be gone), refuses to open inside another group, and the
//! thread is left with no group open afterwards. Skips where NCCL cannot be loaded. And, on one
//! GPU, a collective made by user code running inside a scoped call (a logger) is refused, and
//! the watchdog's abort behind a shut stream holds up no use of the communicator. A group of more
//! NCCL calls than NCCL's old limit of 2048 completes (one GPU: point-to-point; two: collectives).
mod common;

use raft_comms::{group, group_scope, Communicator, ReduceOp};
use raft_core::{DeviceResources, DeviceVec, ErrorKind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

#[test]
fn groups_nest_only_where_every_array_outlives_the_launch() {
    if !common::have_nccl("groups_nest_only_where_every_array_outlives_the_launch") {
        return;
    }
    // An unsafe group inside a scoped one.
    // SAFETY: no collective is made inside.
    let e = group_scope(|_g| unsafe { group(|| Ok(())) }).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Logic, "{e}");
    assert!(e.to_string().contains("group_scope"), "{e}");
    // A scoped group inside an unsafe one, and inside another scoped one.
    // SAFETY: as above.
    let e = unsafe { group(|| group_scope(|_g| Ok(()))) }.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Logic, "{e}");
    let e = group_scope(|_g| group_scope(|_h| Ok(()))).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Logic, "{e}");
    // Nothing is left open: both forms work again, and nest the way they may.
    assert_eq!(group_scope(|_g| Ok(5)).unwrap(), 5);
    // SAFETY: as above.
    assert_eq!(unsafe { group(|| group(|| Ok(6))) }.unwrap(), 6);
}

/// A clique of one rank on device 0, on resources of its own.
fn one_rank(res: &DeviceResources) -> Communicator {
    Communicator::clique_with_timeout(std::slice::from_ref(res), Duration::from_secs(60)).unwrap().pop().unwrap()
}

static OTHER: OnceLock<Communicator> = OnceLock::new();
/// The logger's array: kept alive past the group's end, so that the run before the fix (when
/// the logger's collective entered the group) wrote into live memory, not a freed block.
static SPARE: Mutex<Option<DeviceVec<f32>>> = Mutex::new(None);
static ARMED: AtomicBool = AtomicBool::new(false);
/// The test's thread: a line logged by another test's thread meanwhile is not the case.
static TEST_THREAD: OnceLock<std::thread::ThreadId> = OnceLock::new();
static SEEN: Mutex<Vec<Result<(), ErrorKind>>> = Mutex::new(Vec::new());

/// A logger that, once armed, makes a collective on another communicator and notes its result.
struct Reenter;

impl log::Log for Reenter {
    fn enabled(&self, _: &log::Metadata) -> bool {
        true
    }
    fn log(&self, _: &log::Record) {
        if TEST_THREAD.get() != Some(&std::thread::current().id()) || !ARMED.swap(false, Ordering::SeqCst) {
            return;
        }
        let mut spare = SPARE.lock().unwrap_or_else(|e| e.into_inner());
        if let (Some(other), Some(buf)) = (OTHER.get(), spare.as_mut()) {
            let got = other.allreduce_in_place(buf, ReduceOp::Sum).map_err(|e| e.kind());
            SEEN.lock().unwrap_or_else(|e| e.into_inner()).push(got);
        }
    }
    fn flush(&self) {}
}

/// The fifteenth audit: a `GroupScope` method marked the thread for its whole call, and every
/// collective made meanwhile passed as the scope's own. The library logs inside such a call (an
/// array whose uses on other streams can no longer be ordered says so when read), so a logger
/// could make a collective on another communicator that entered the open group with an array
/// the logger then freed, before the group's end launched NCCL's writes into it. The mark is
/// taken by the scope's own collective: the logger's is refused (`Logic`) as any direct call
/// inside a scoped group. (Before: it was accepted into the group.)
#[test]
fn a_collective_made_by_a_logger_inside_a_scoped_call_is_refused() {
    use cudarc::driver::DevicePtr;
    if !common::have(1, "a_collective_made_by_a_logger_inside_a_scoped_call_is_refused") {
        return;
    }
    static LOGGER: Reenter = Reenter;
    log::set_logger(&LOGGER).expect("no other logger in this binary");
    log::set_max_level(log::LevelFilter::Warn);
    let (res, other_res) = (DeviceResources::on_device(0).unwrap(), DeviceResources::on_device(0).unwrap());
    let comm = one_rank(&res);
    assert!(OTHER.set(one_rank(&other_res)).is_ok());
    *SPARE.lock().unwrap() = Some(DeviceVec::from_host(&other_res, &[1.0f32; 16]).unwrap());
    // Read past the bound on per-thread streams: the array's next read logs once
    // (`foreign::an_array_read_past_the_bound_on_per_thread_streams_is_kept_and_says_so_once`).
    let v = DeviceVec::from_host(&res, &[1.0f32; 16]).unwrap();
    let pts = res.context().per_thread_stream();
    for _ in 0..4097 {
        drop(v.device_ptr(&pts));
    }
    pts.synchronize().unwrap();
    let mut out = DeviceVec::<f32>::zeros(&res, 16).unwrap();
    assert!(TEST_THREAD.set(std::thread::current().id()).is_ok());
    ARMED.store(true, Ordering::SeqCst);
    group_scope(|g| g.on(&comm).allreduce(&v, &mut out, ReduceOp::Sum)).unwrap();
    comm.sync().unwrap();
    OTHER.get().unwrap().sync().unwrap();
    assert!(!ARMED.load(Ordering::SeqCst), "nothing was logged inside the scoped call: the test did not reach its case");
    assert_eq!(
        *SEEN.lock().unwrap(),
        [Err(ErrorKind::Logic)],
        "a collective made by a logger inside a scoped call was not refused (it entered the open group)"
    );
    assert_eq!(out.to_host().unwrap(), [1.0f32; 16]);
}

/// The eighteenth audit (helper 83; run 216 reproduced it): the watchdog's abort of a
/// communicator runs under the communicator's locks, and `ncclCommAbort` waits for NCCL's
/// internal stream, which follows the user's stream. A collective queued behind other work that
/// outlived the timeout holds `ended()` (and `sync`, `Drop`, every other communicator's watchdog
/// step) until that work ends: 17 s here. One rank, its stream shut by a gate for 20 s, a
/// timeout of 1 s: `ended()` should answer at once, not when the gate opens. Run 217 passed it
/// with the abort on a thread of its own; the review (helper 85) found that unsound for a
/// clique (a peer's kernel could reach arrays freed once `abort` returned), so the abort runs in
/// the call again and this test is ignored until the frees are ordered after the whole clique's
/// end on the device (docs/RELIABILITY.md, left open). Run it with `--ignored`.
#[test]
#[ignore = "the watchdog's abort still waits for the device under the communicator's locks (left open)"]
fn a_watchdog_abort_behind_a_shut_stream_does_not_hold_up_ended() {
    if !common::have(1, "a_watchdog_abort_behind_a_shut_stream_does_not_hold_up_ended") {
        return;
    }
    let res = DeviceResources::on_device(0).unwrap();
    let comm = one_rank(&res);
    let mut v: DeviceVec<f32> = DeviceVec::from_host(&res, &vec![1.0f32; 1 << 16]).unwrap();
    comm.allreduce_in_place(&mut v, ReduceOp::Sum).unwrap();
    comm.sync().unwrap();
    comm.set_timeout(Duration::from_secs(1)).unwrap();
    let gate = common::Gate::close(&res.stream().unwrap(), Duration::from_secs(20));
    comm.allreduce_in_place(&mut v, ReduceOp::Sum).unwrap();
    std::thread::sleep(Duration::from_secs(3)); // past the timeout: the watchdog has aborted
    let start = Instant::now();
    let ended = comm.ended();
    let took = start.elapsed();
    gate.open();
    eprintln!("ended() after {took:?}: {ended:?}");
    assert!(took < Duration::from_secs(1), "ended() waited {took:?} for the abort behind the shut stream");
    assert!(ended.is_some_and(|e| e.message().contains("did not finish within")), "the timeout did not end the communicator");
}

/// The review of the eighteenth audit (helper 85): raft-comms' own device scope kept another
/// library's context of the same device current (PyCUDA's `autoinit`, `cuCtxCreate`), so the
/// communicator's event and NCCL's calls were made in it, and died with it. A communicator made
/// while such a context is current must work after that context is destroyed.
#[test]
fn a_communicator_made_under_another_librarys_context_outlives_that_context() {
    if !common::have(1, "a_communicator_made_under_another_librarys_context_outlives_that_context") {
        return;
    }
    use cudarc::driver::sys;
    let res = DeviceResources::on_device(0).unwrap();
    std::thread::spawn(move || {
        let mut foreign: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: makes a new context of device 0 current on this thread; destroyed below, with
        // nothing of the library's in it (what the test checks).
        unsafe { sys::cuCtxCreate_v4(&mut foreign, std::ptr::null_mut(), 0, 0) }.result().unwrap();
        let comm = one_rank(&res);
        let mut v: DeviceVec<f32> = DeviceVec::from_host(&res, &[2.0f32; 1024]).unwrap();
        comm.allreduce_in_place(&mut v, ReduceOp::Sum).unwrap();
        comm.sync().unwrap();
        // SAFETY: the context made above, current on this thread.
        unsafe { sys::cuCtxDestroy_v2(foreign) }.result().unwrap();
        comm.allreduce_in_place(&mut v, ReduceOp::Sum).unwrap();
        comm.sync().unwrap();
        assert_eq!(v.to_host().unwrap(), vec![2.0f32; 1024], "one rank: a sum is the input");
        assert!(comm.ended().is_none(), "{:?}", comm.ended());
        comm.release().unwrap();
    })
    .join()
    .unwrap();
}

/// Bytes malloc has handed out and not taken back, all arenas (glibc's `mallinfo2`).
fn heap_in_use() -> usize {
    // SAFETY: mallinfo2 takes nothing and returns a struct by value.
    unsafe { libc::mallinfo2() }.uordblks
}

/// Runs `test` alone in a child process of this binary with `role` set, and returns the numbers
/// of the `GROWTH …` line it prints (after the harness's "test … ... " on the same line).
fn growth_in_a_child(test: &str, role: &str) -> Vec<i64> {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(role, "1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_once("GROWTH ")
        .and_then(|(_, rest)| rest.lines().next())
        .unwrap_or_else(|| panic!("{test}: the child said nothing: {out:?}"))
        .split(' ')
        .map(|n| n.parse().unwrap())
        .collect()
}

/// The twentieth audit (helper 98): NCCL 2.28's ncclGroupEnd allocates a job it frees only for a
/// group that held work, and the shim opened NCCL's group at every group's start: each group
/// whose body reached no NCCL call leaked 160 bytes (176 with malloc's header), and each thread
/// that ever ended a group kept a vector of the shim's. Measured in a child process of its own
/// (nothing else allocating meanwhile): before, +17.6 MB for the 100 000 empty groups and
/// +4.2 MB for the 20 000 threads (3.5 MB of it NCCL's leak, 0.64 MB the shim's vectors: the
/// bound is 8 bytes a thread, below the 32 of one vector). Only empty groups run here: a group
/// that held a communicator (its held list) needs a GPU.
#[test]
fn empty_groups_and_threads_that_ended_groups_leave_no_memory_behind() {
    const ROLE: &str = "RAFT_COMMS_TEST_GROUP_MEMORY";
    if std::env::var_os(ROLE).is_some() {
        let warm = || {
            for _ in 0..1000 {
                group_scope(|_| Ok(())).unwrap();
            }
        };
        warm();
        let before = heap_in_use();
        for _ in 0..50_000 {
            group_scope(|_| Ok(())).unwrap();
            // SAFETY: no collective is made inside.
            unsafe { group(|| Ok(())) }.unwrap();
        }
        let groups = heap_in_use() as i64 - before as i64;
        std::thread::spawn(|| group_scope(|_| Ok(())).unwrap()).join().unwrap(); // the thread machinery warm
        let before = heap_in_use();
        for _ in 0..20_000 {
            std::thread::spawn(|| group_scope(|_| Ok(())).unwrap()).join().unwrap();
        }
        let threads = heap_in_use() as i64 - before as i64;
        println!("GROWTH {groups} {threads}");
        std::process::exit(0);
    }
    if !common::have_nccl("empty_groups_and_threads_that_ended_groups_leave_no_memory_behind") {
        return;
    }
    let growth = growth_in_a_child("empty_groups_and_threads_that_ended_groups_leave_no_memory_behind", ROLE);
    assert!(
        growth[0] < 1 << 20 && growth[1] < 20_000 * 8,
        "100 000 empty groups kept {} bytes, 20 000 threads that each ended a group {} bytes",
        growth[0],
        growth[1]
    );
}

/// Helper 98 (the twentieth audit; read in NCCL 2.28's source, not yet run): NCCL runs a plain
/// collective as a group of its own, and one whose task never joins that group (no elements; a
/// communicator of one rank, which NCCL copies itself) would leave the group's job allocated:
/// 160 bytes per call, as the empty groups above did. Measured in a child process of its own.
/// Run 219: 3528992 and 3520000 bytes (176 per call) before the shim answered such calls itself
/// (`answer_locally`), passed after.
#[test]
fn collectives_of_one_rank_and_of_no_elements_leave_no_memory_behind() {
    const ROLE: &str = "RAFT_COMMS_TEST_COLLECTIVE_MEMORY";
    let test = "collectives_of_one_rank_and_of_no_elements_leave_no_memory_behind";
    if std::env::var_os(ROLE).is_some() {
        let res = DeviceResources::on_device(0).unwrap();
        let comm = one_rank(&res);
        let mut data = DeviceVec::from_host(&res, &[1.0f32; 16]).unwrap();
        let mut none = DeviceVec::<f32>::zeros(&res, 0).unwrap();
        let mut grows = Vec::new();
        for buf in [&mut data, &mut none] {
            for _ in 0..100 {
                comm.allreduce_in_place(buf, ReduceOp::Sum).unwrap();
            }
            comm.sync().unwrap();
            let before = heap_in_use();
            for _ in 0..20_000 {
                comm.allreduce_in_place(buf, ReduceOp::Sum).unwrap();
            }
            comm.sync().unwrap();
            grows.push(heap_in_use() as i64 - before as i64);
        }
        println!("GROWTH {} {}", grows[0], grows[1]);
        std::process::exit(0);
    }
    if !common::have(1, test) {
        return;
    }
    let growth = growth_in_a_child(test, ROLE);
    eprintln!("GROWTH over 20 000 allreduces of one rank: {} bytes; of no elements: {} bytes", growth[0], growth[1]);
    assert!(
        growth[0] < 1 << 20 && growth[1] < 1 << 20,
        "20 000 allreduces on a communicator of one rank kept {} bytes, 20 000 of no elements {} bytes",
        growth[0],
        growth[1]
    );
}

/// What the shim answers itself since run 219 (collectives of a communicator of one rank, and
/// of no elements), checked for results: every collective, in place and out of place, equals
/// its input on one rank, as NCCL's would; a root that is not a rank is refused; collectives of
/// no elements and the one-rank barrier end; RAFT's `comms_iface` path (an installed
/// communicator's allreduce) too. The review of the local answers (helper 102) found only
/// allreduce checked on one rank. One GPU; passed in runs 220, 222 and 223 (H100).
#[test]
fn every_collective_of_one_rank_and_of_no_elements_gives_what_nccl_would() {
    let test = "every_collective_of_one_rank_and_of_no_elements_gives_what_nccl_would";
    if !common::have(1, test) {
        return;
    }
    let res = DeviceResources::on_device(0).unwrap();
    let comm = one_rank(&res);
    let host: Vec<f32> = (0..64).map(|i| i as f32 * 0.5 - 3.0).collect();
    let send = DeviceVec::from_host(&res, &host).unwrap();
    let fresh = || DeviceVec::from_host(&res, &[f32::NAN; 64]).unwrap();
    let same = |what: &str, v: &DeviceVec<f32>| {
        comm.sync().unwrap();
        assert_eq!(v.to_host().unwrap(), host, "{what} on one rank");
    };
    for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max] {
        let mut r = fresh();
        comm.allreduce(&send, &mut r, op).unwrap();
        same(&format!("allreduce {op:?}"), &r);
        let mut b = DeviceVec::from_host(&res, &host).unwrap();
        comm.allreduce_in_place(&mut b, op).unwrap();
        same(&format!("allreduce_in_place {op:?}"), &b);
        let mut r = fresh();
        comm.reduce(&send, Some(&mut r), op, 0).unwrap();
        same(&format!("reduce {op:?}"), &r);
        let mut r = fresh();
        comm.reduce_scatter(&send, &mut r, op).unwrap();
        same(&format!("reduce_scatter {op:?}"), &r);
    }
    let mut r = fresh();
    comm.broadcast(&send, &mut r, 0).unwrap();
    same("broadcast", &r);
    let mut b = DeviceVec::from_host(&res, &host).unwrap();
    comm.broadcast_in_place(&mut b, 0).unwrap();
    same("broadcast_in_place", &b);
    let mut r = fresh();
    comm.allgather(&send, &mut r).unwrap();
    same("allgather", &r);
    let mut r = fresh();
    comm.allgatherv(&send, &mut r, &[64]).unwrap();
    same("allgatherv", &r);
    let mut r = fresh();
    comm.gather(&send, Some(&mut r), 0).unwrap();
    same("gather", &r);
    let mut r = fresh();
    assert_eq!(comm.broadcast(&send, &mut r, 1).unwrap_err().kind(), ErrorKind::Logic, "root 1 of one rank");
    comm.barrier().unwrap();
    // No elements: nothing to move, each call ends.
    let mut none = DeviceVec::<f32>::zeros(&res, 0).unwrap();
    let empty = DeviceVec::<f32>::zeros(&res, 0).unwrap();
    comm.allreduce_in_place(&mut none, ReduceOp::Sum).unwrap();
    comm.broadcast_in_place(&mut none, 0).unwrap();
    comm.allgather(&empty, &mut none).unwrap();
    comm.reduce_scatter(&empty, &mut none, ReduceOp::Max).unwrap();
    comm.sync().unwrap();
    // RAFT's path: an installed communicator's allreduce through `comms_iface`.
    comm.install(&res).unwrap();
    let mut r = fresh();
    raft_comms::through_raft::allreduce(&res, &send, &mut r, ReduceOp::Sum).unwrap();
    same("RAFT's comms_iface allreduce", &r);
}

/// More operations in one NCCL group than NCCL's old limit of 2048 (`NCCL_MAX_OPS`, enforced
/// per communicator up to 2.12: "Too many async operations in progress"). NCCL 2.13 queues a
/// group's tasks in growing pools and cuts them into as many kernels as its work budget needs,
/// so the NCCL this crate loads (2.18 or newer) takes any number (helper 117, read in NCCL's
/// source at v2.18.1-1 and v2.28.9-1). Here, on one rank, 3000 sendrecv to itself in one scope:
/// 6000 NCCL calls in the one group. One GPU; passed in runs 222 and 223 (H100).
const PAST_THE_OLD_LIMIT: usize = 3000;

#[test]
fn a_group_of_more_than_2048_point_to_point_calls_completes() {
    let test = "a_group_of_more_than_2048_point_to_point_calls_completes";
    if !common::have(1, test) {
        return;
    }
    let res = DeviceResources::on_device(0).unwrap();
    let comm = one_rank(&res);
    let value = |i: usize, j: usize| (i * 4 + j) as f32;
    let send: Vec<DeviceVec<f32>> = (0..PAST_THE_OLD_LIMIT)
        .map(|i| DeviceVec::from_host(&res, &[value(i, 0), value(i, 1), value(i, 2), value(i, 3)]).unwrap())
        .collect();
    let mut recv: Vec<DeviceVec<f32>> = (0..PAST_THE_OLD_LIMIT).map(|_| DeviceVec::from_host(&res, &[f32::NAN; 4]).unwrap()).collect();
    group_scope(|g| send.iter().zip(recv.iter_mut()).try_for_each(|(s, r)| g.on(&comm).sendrecv(s, 0, r, 0))).unwrap();
    comm.sync().unwrap();
    for (i, r) in recv.iter().enumerate() {
        assert_eq!(r.to_host().unwrap(), [value(i, 0), value(i, 1), value(i, 2), value(i, 3)], "sendrecv {i} of the group");
    }
}

/// The same across two ranks with collectives, the pattern of `allgatherv` (a broadcast per
/// rank in one group): 3000 broadcasts a communicator in one scope, the root alternating.
/// Two GPUs; GPU run owed.
#[test]
fn a_group_of_more_than_2048_collectives_completes_on_two_ranks() {
    let test = "a_group_of_more_than_2048_collectives_completes_on_two_ranks";
    if !common::have(2, test) {
        return;
    }
    let res: Vec<DeviceResources> = (0..2).map(|d| DeviceResources::on_device(d).unwrap()).collect();
    let comms = Communicator::clique_with_timeout(&res, Duration::from_secs(120)).unwrap();
    let value = |r: usize, i: usize| (r * 100_000 + i) as f32;
    let mut bufs: Vec<Vec<DeviceVec<f32>>> =
        (0..2).map(|r| (0..PAST_THE_OLD_LIMIT).map(|i| DeviceVec::from_host(&res[r], &[value(r, i); 4]).unwrap()).collect()).collect();
    group_scope(|g| {
        for (r, mine) in bufs.iter_mut().enumerate() {
            for (i, b) in mine.iter_mut().enumerate() {
                g.on(&comms[r]).broadcast_in_place(b, i % 2)?;
            }
        }
        Ok(())
    })
    .unwrap();
    for c in &comms {
        c.sync().unwrap();
    }
    for (r, mine) in bufs.iter().enumerate() {
        for (i, b) in mine.iter().enumerate() {
            assert_eq!(b.to_host().unwrap(), [value(i % 2, i); 4], "broadcast {i} of the group on rank {r}");
        }
    }
    drop(bufs);
    Communicator::release_all(comms).unwrap();
}
