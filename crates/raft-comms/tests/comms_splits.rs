//! Splits that fail part-way, and an exit while a split waits for its peers (the fourteenth
//! audit): nothing NCCL made is left to nobody, and the exit does not wait out a split's
//! timeout. The one-GPU tests split cliques of one rank on device 0; the exit test needs two
//! GPUs. And (the fifteenth audit) a communicator alive at exit in a process that never queued a
//! collective is aborted by the exit's teardown, and a zero `sync_timeout` aborts nothing.
//! Skips without them (fails under `RAFT_REQUIRE_GPU=1`).
mod common;

use raft_comms::Communicator;
use raft_core::{DeviceResources, ErrorKind};
use std::sync::Mutex;
use std::time::Duration;

/// One test at a time: the leak test counts the process's threads.
static GPUS: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    GPUS.lock().unwrap_or_else(|e| e.into_inner())
}

/// A clique of one rank on device 0, on resources of its own.
fn one_rank() -> Communicator {
    let res = DeviceResources::on_device(0).unwrap();
    Communicator::clique_with_timeout(std::slice::from_ref(&res), Duration::from_secs(60)).unwrap().pop().unwrap()
}

/// The process's threads (NCCL gives each communicator proxy and service threads).
fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").map(|d| d.count()).unwrap_or(0)
}

/// Two splits of one communicator in one `split_all`: NCCL runs each split of a group on a
/// thread of its own, and both would exchange their colors over the parent's bootstrap
/// connections at once. Refused (`Logic`) before any split is issued; the communicator stays
/// usable and splits in two calls. (Before: accepted.)
#[test]
fn split_all_refuses_a_communicator_split_twice_in_one_call() {
    if !common::have(1, "split_all_refuses_a_communicator_split_twice_in_one_call") {
        return;
    }
    let _gpus = serial();
    let c = one_rank();
    let e = Communicator::split_all(&[(&c, Some(0), 0), (&c, Some(1), 0)]).expect_err("one parent split twice in one group");
    assert_eq!(e.kind(), ErrorKind::Logic, "{e}");
    assert!(e.message().contains("splits a communicator an earlier part splits too"), "{e}");
    assert!(c.ended().is_none(), "the refusal ended the communicator: {:?}", c.ended());
    let first = c.split(Some(0), 0).unwrap().expect("a child for color 0");
    let second = c.split(Some(1), 0).unwrap().expect("a child for color 1");
    assert_eq!((first.size(), second.size()), (1, 1));
    Communicator::release_all(vec![first, second, c]).unwrap();
}

/// A `split_all` with a part Rust refuses (a color past NCCL's int) beside a valid part of
/// another communicator: the valid part's split was issued in the group before the refusal,
/// NCCL made its child at the group's end, and the early return dropped the handle with the
/// child still in its slot: a communicator nobody could abort, with its threads and memory, for
/// the process's life. Now every part is checked before any split is issued. (Before: each
/// such call left NCCL's threads of one more communicator behind.)
#[test]
fn a_split_all_with_a_refused_part_leaves_no_communicator_behind() {
    if !common::have(1, "a_split_all_with_a_refused_part_leaves_no_communicator_behind") {
        return;
    }
    let _gpus = serial();
    let (a, b) = (one_rank(), one_rank());
    // A first successful split_all, released, so that the threads made once per process exist.
    let warm = Communicator::split_all(&[(&a, Some(0), 0), (&b, Some(0), 0)]).unwrap();
    Communicator::release_all(warm.into_iter().flatten().collect()).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let before = threads();
    const CALLS: usize = 8;
    for _ in 0..CALLS {
        let e = Communicator::split_all(&[(&a, Some(0), 0), (&b, Some(1 << 31), 0)]).expect_err("a color past NCCL's int");
        assert_eq!(e.kind(), ErrorKind::Logic, "{e}");
    }
    std::thread::sleep(Duration::from_millis(500));
    let after = threads();
    assert!(
        after < before + CALLS,
        "{CALLS} refused split_all calls left {} more threads ({before} before, {after} after): NCCL communicators left behind",
        after.saturating_sub(before)
    );
    assert!(a.ended().is_none() && b.ended().is_none(), "a refused split_all ended a parent");
    a.barrier().unwrap();
    Communicator::release_all(vec![a, b]).unwrap();
}

/// An exit while a split waits for a peer that never splits (two GPUs, rank 1 silent): the split
/// held the communicator's lock across its wait, and the exit's teardown, aborting every live
/// communicator, blocked on that lock until the split's timeout (60 s here). Now the teardown
/// aborts a communicator whose lock is held through the shim, which ends the wait: the process
/// exits in seconds. In a child process, bounded to 150 s.
#[test]
fn an_exit_while_a_split_waits_for_its_peers_does_not_wait_out_the_timeout() {
    const NAME: &str = "an_exit_while_a_split_waits_for_its_peers_does_not_wait_out_the_timeout";
    const CHILD: &str = "RAFT_COMMS_TEST_SPLIT_EXIT_CHILD";
    if std::env::var_os(CHILD).is_some() {
        let res: Vec<DeviceResources> = (0..2).map(|d| DeviceResources::on_device(d).unwrap()).collect();
        let mut comms = Communicator::clique_with_timeout(&res, Duration::from_secs(60)).unwrap();
        let rank0 = comms.remove(0);
        std::thread::spawn(move || {
            let _ = rank0.split(Some(0), 0); // rank 1 never splits
        });
        std::thread::sleep(Duration::from_millis(500));
        println!("child: main returns");
        std::mem::forget(comms); // rank 1 stays alive, silent
        return;
    }
    if !common::have(2, NAME) {
        return;
    }
    let _gpus = serial();
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", NAME, "--nocapture", "--test-threads=1"]).env(CHILD, "1");
    let run = common::run_bounded(cmd, Duration::from_secs(150));
    assert!(run.stdout.contains("child: main returns"), "{}", run.show());
    assert!(run.took < Duration::from_secs(30), "the exit took {:?} (the split's timeout is 60 s): {}", run.took, run.show());
}

/// The child's communicator, kept alive to the exit (as in a static of a program that hands it
/// to RAFT's C++ and never queues a collective from Rust).
static KEPT: std::sync::OnceLock<Communicator> = std::sync::OnceLock::new();

/// Registered before the communicator is made, so the C library runs it after the library's
/// exit hook (handlers run in reverse order): says whether the hook's teardown aborted it.
extern "C" fn after_the_exit_hook() {
    let ended = KEPT.get().map(|c| c.ended().is_some());
    eprintln!("child: kept communicator ended at exit: {ended:?}");
}

/// The fifteenth audit: the exit's teardown, which aborts every live communicator so that NCCL's
/// threads stop before the C++ static destructors tear CUDA down, runs from an exit hook that
/// only a job, a release or a collective registered. A process that made a communicator and
/// exited without queueing a collective from Rust left it running under those destructors.
/// Making a communicator registers the hook now. In a child process, bounded to 120 s.
/// (Before: the communicator was not ended at exit.)
#[test]
fn a_communicator_alive_at_exit_is_aborted_even_without_a_collective() {
    const NAME: &str = "a_communicator_alive_at_exit_is_aborted_even_without_a_collective";
    const CHILD: &str = "RAFT_COMMS_TEST_KEPT_AT_EXIT_CHILD";
    if std::env::var_os(CHILD).is_some() {
        // SAFETY: atexit stores a handler that takes nothing and never unwinds (it prints).
        assert_eq!(unsafe { libc::atexit(after_the_exit_hook) }, 0);
        assert!(KEPT.set(one_rank()).is_ok());
        println!("child: made the communicator, exiting");
        std::process::exit(0);
    }
    if !common::have(1, NAME) {
        return;
    }
    let _gpus = serial();
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", NAME, "--nocapture", "--test-threads=1"]).env(CHILD, "1");
    let run = common::run_bounded(cmd, Duration::from_secs(120));
    assert!(run.stdout.contains("child: made the communicator, exiting"), "{}", run.show());
    assert_eq!(run.status.and_then(|s| s.code()), Some(0), "{}", run.show());
    assert!(
        run.stderr.contains("child: kept communicator ended at exit: Some(true)"),
        "the exit's teardown did not abort a communicator alive at exit: {}",
        run.show()
    );
}

/// The fifteenth audit: `sync_timeout(Duration::ZERO)` with a collective still pending (held
/// behind a host function) ran out at once and aborted a healthy communicator, and with it its
/// clique, for good. A zero bound is refused (`Logic`), as `set_timeout` refuses one; the
/// communicator stays usable. (Before: `Timeout`, the communicator aborted.)
#[test]
fn a_zero_sync_timeout_is_refused_and_aborts_nothing() {
    use raft_comms::ReduceOp;
    if !common::have(1, "a_zero_sync_timeout_is_refused_and_aborts_nothing") {
        return;
    }
    let _gpus = serial();
    let c = one_rank();
    let res = c.resources().clone();
    let mut buf = raft_core::DeviceVec::from_host(&res, &[1.5f32; 8]).unwrap();
    let gate = common::Gate::close(&res.stream().unwrap(), Duration::from_secs(20));
    c.allreduce_in_place(&mut buf, ReduceOp::Sum).unwrap(); // pending behind the gate
    let zero = c.sync_timeout(Duration::ZERO);
    gate.open();
    let e = zero.expect_err("a zero bound was taken");
    assert_eq!((e.kind(), e.who()), (ErrorKind::Logic, "Communicator::sync_timeout"), "{e}");
    assert!(c.ended().is_none(), "a zero bound aborted the communicator: {:?}", c.ended());
    c.sync_timeout(Duration::from_secs(20)).unwrap();
    assert_eq!(buf.to_host().unwrap(), [1.5f32; 8], "one rank: a sum is the input");
    Communicator::release_all(vec![c]).unwrap();
}

/// The fifteenth audit's review: a zero bound for a communicator's making (`clique_with_timeout`,
/// `init`, `init_with_id`) made every later wait a deadline already past, where `set_timeout`,
/// `sync_timeout` and `RAFT_COMMS_TIMEOUT` refuse zero. Refused (`Logic`) before anything is
/// made; a non-zero bound then works. (Before: accepted.)
#[test]
fn a_zero_bound_for_a_new_communicator_is_refused() {
    if !common::have(1, "a_zero_bound_for_a_new_communicator_is_refused") {
        return;
    }
    let _gpus = serial();
    let res = DeviceResources::on_device(0).unwrap();
    let id = raft_comms::UniqueId::new().unwrap();
    let made = [
        ("Communicator::clique", Communicator::clique_with_timeout(std::slice::from_ref(&res), Duration::ZERO).map(drop)),
        ("Communicator::init", Communicator::init(&res, 0, 1, "127.0.0.1:0", Duration::ZERO).map(drop)),
        ("Communicator::init_with_id", Communicator::init_with_id(&res, &id, 0, 1, Duration::ZERO).map(drop)),
    ];
    for (who, got) in made {
        let e = got.expect_err(who);
        assert_eq!((e.kind(), e.who()), (ErrorKind::Logic, who), "{e}");
        assert!(e.message().contains("zero timeout"), "{e}");
    }
    let c = Communicator::init_with_id(&res, &id, 0, 1, Duration::from_secs(60)).unwrap();
    c.barrier().unwrap();
    Communicator::release_all(vec![c]).unwrap();
}
