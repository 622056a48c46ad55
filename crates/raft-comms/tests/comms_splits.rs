//! Splits that fail part-way, and an exit while a split waits for its peers (the fourteenth
//! audit): nothing NCCL made is left to nobody, and the exit does not wait out a split's
//! timeout. The one-GPU tests split cliques of one rank on device 0; the exit test needs two
//! GPUs. Skips without them (fails under `RAFT_REQUIRE_GPU=1`).
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
