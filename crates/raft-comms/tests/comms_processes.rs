//! Several processes, one GPU each, started by `raft-run` (this test binary re-runs itself as
//! the ranks): every collective for every element type against the CPU's answer, a
//! sub-communicator and RAFT's `get_comms`; a rank killed mid-run gives the other an error within
//! the bound; a rank that never arrives gives one at initialisation; an exit with collectives in
//! flight ends promptly. Skips without two GPUs (fails under `RAFT_REQUIRE_GPU=1`; the rank that
//! never arrives needs one).
mod common;

use common::Run;
use common::{data, reduce_cpu, typed, Val};
use raft_comms::{Communicator, Launch, ReduceOp};
use raft_core::{DeviceResources, DeviceVec};
use std::process::Command;
use std::time::{Duration, Instant};

const CHILD: &str = "RAFT_COMMS_CHILD";

/// One job on the GPUs at a time: the timing bounds below assume the GPUs are not shared.
static GPUS: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    GPUS.lock().unwrap_or_else(|e| e.into_inner())
}

/// `raft-run -n 2 [options] <this binary> <test> --exact` with the ranks' role, for at most
/// three minutes (a hang fails the test).
fn ranks(options: &[&str], test: &str, role: &str, env: &[(&str, &str)]) -> Run {
    let mut cmd = Command::new(common::raft_run());
    cmd.args(["-n", "2"]).args(options).arg(std::env::current_exe().unwrap());
    cmd.args([test, "--exact", "--nocapture", "--test-threads=1"]).env(CHILD, role);
    for (k, v) in env {
        cmd.env(k, v);
    }
    common::run_bounded(cmd, Duration::from_secs(180))
}

/// A rank's resources (its GPU from LOCAL_RANK) and communicator.
fn join() -> (Launch, DeviceResources, Communicator) {
    let launch = Launch::from_env().unwrap();
    let res = DeviceResources::on_device(launch.local_rank.unwrap()).unwrap();
    let comm = Communicator::from_env(&res).unwrap();
    assert_eq!((comm.rank(), comm.size()), (launch.rank, launch.size));
    (launch, res, comm)
}

fn up<T: Val>(res: &DeviceResources, v: &[i64]) -> DeviceVec<T> {
    DeviceVec::from_host(res, &typed::<T>(v)).unwrap()
}

fn zeros<T: Val>(res: &DeviceResources, n: usize) -> DeviceVec<T> {
    DeviceVec::zeros(res, n).unwrap()
}

/// One rank's side of every collective of one element type.
fn every_collective<T: Val>(res: &DeviceResources, c: &Communicator) {
    let (r, world, n) = (c.rank(), c.size(), 1000);
    let name = std::any::type_name::<T>();
    for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max] {
        let send: DeviceVec<T> = up(res, &data(r, n));
        let mut recv: DeviceVec<T> = zeros(res, n);
        c.allreduce(&send, &mut recv, op).unwrap();
        c.sync().unwrap();
        assert_eq!(recv.to_host().unwrap(), typed::<T>(&reduce_cpu(op, n, world)), "{name} allreduce {op:?}");
    }
    let mut buf: DeviceVec<T> = up(res, &data(r, n));
    c.broadcast_in_place(&mut buf, 1).unwrap();
    let send: DeviceVec<T> = up(res, &data(r, n));
    let mut recv: DeviceVec<T> = zeros(res, n);
    c.broadcast(&send, &mut recv, 0).unwrap();
    c.sync().unwrap();
    assert_eq!(buf.to_host().unwrap(), typed::<T>(&data(1, n)), "{name} broadcast in place");
    assert_eq!(recv.to_host().unwrap(), typed::<T>(&data(0, n)), "{name} broadcast");

    let mut root: DeviceVec<T> = zeros(res, n);
    c.reduce(&send, if r == 0 { Some(&mut root) } else { None }, ReduceOp::Sum, 0).unwrap();
    let mut all: DeviceVec<T> = zeros(res, world * n);
    c.allgather(&send, &mut all).unwrap();
    let counts: Vec<usize> = (0..world).map(|q| 10 + q).collect();
    let mine: DeviceVec<T> = up(res, &data(r, counts[r]));
    let mut allv: DeviceVec<T> = zeros(res, counts.iter().sum());
    c.allgatherv(&mine, &mut allv, &counts).unwrap();
    let mut gathered: DeviceVec<T> = zeros(res, world * n);
    c.gather(&send, if r == 1 { Some(&mut gathered) } else { None }, 1).unwrap();
    let big: DeviceVec<T> = up(res, &data(r, world * n));
    let mut block: DeviceVec<T> = zeros(res, n);
    c.reduce_scatter(&big, &mut block, ReduceOp::Sum).unwrap();
    let mut from_left: DeviceVec<T> = zeros(res, n);
    c.sendrecv(&send, (r + 1) % world, &mut from_left, (r + world - 1) % world).unwrap();
    c.sync().unwrap();
    if r == 0 {
        assert_eq!(root.to_host().unwrap(), typed::<T>(&reduce_cpu(ReduceOp::Sum, n, world)), "{name} reduce");
    }
    let everyone: Vec<i64> = (0..world).flat_map(|q| data(q, n)).collect();
    assert_eq!(all.to_host().unwrap(), typed::<T>(&everyone), "{name} allgather");
    let everyone_v: Vec<i64> = (0..world).flat_map(|q| data(q, counts[q])).collect();
    assert_eq!(allv.to_host().unwrap(), typed::<T>(&everyone_v), "{name} allgatherv");
    if r == 1 {
        assert_eq!(gathered.to_host().unwrap(), typed::<T>(&everyone), "{name} gather");
    }
    let sum = reduce_cpu(ReduceOp::Sum, world * n, world);
    assert_eq!(block.to_host().unwrap(), typed::<T>(&sum[r * n..(r + 1) * n]), "{name} reduce_scatter");
    assert_eq!(from_left.to_host().unwrap(), typed::<T>(&data((r + world - 1) % world, n)), "{name} sendrecv");

    // Point to point, one way.
    if r == 0 {
        c.send(&send, 1).unwrap();
    } else if r == 1 {
        let mut got: DeviceVec<T> = zeros(res, n);
        c.recv(&mut got, 0).unwrap();
        c.sync().unwrap();
        assert_eq!(got.to_host().unwrap(), typed::<T>(&data(0, n)), "{name} send/recv");
    }
    c.barrier().unwrap();
}

fn child_collectives() {
    let (_, res, comm) = join();
    every_collective::<f32>(&res, &comm);
    every_collective::<f64>(&res, &comm);
    every_collective::<i32>(&res, &comm);
    every_collective::<i64>(&res, &comm);
    every_collective::<u8>(&res, &comm);
    // A sub-communicator with the ranks swapped.
    let sub = comm.split(Some(1), -(comm.rank() as i32)).unwrap().unwrap();
    assert_eq!((sub.rank(), sub.size()), (comm.size() - 1 - comm.rank(), comm.size()));
    let mut v: DeviceVec<i64> = up(&res, &[sub.rank() as i64 + 1; 3]);
    sub.allreduce_in_place(&mut v, ReduceOp::Sum).unwrap();
    sub.sync().unwrap();
    assert_eq!(v.to_host().unwrap(), [3, 3, 3]);
    sub.release().unwrap();
    // RAFT's view: get_comms on the resources.
    comm.install(&res).unwrap();
    assert_eq!(raft_comms::installed(&res).unwrap(), Some((comm.rank(), comm.size())));
    let send: DeviceVec<f64> = up(&res, &data(comm.rank(), 100));
    let mut recv: DeviceVec<f64> = zeros(&res, 100);
    raft_comms::through_raft::allreduce(&res, &send, &mut recv, ReduceOp::Min).unwrap();
    assert_eq!(recv.to_host().unwrap(), typed::<f64>(&reduce_cpu(ReduceOp::Min, 100, comm.size())));
    comm.release().unwrap();
    println!("RANK_OK {}", Launch::from_env().unwrap().rank);
}

#[test]
fn two_processes_every_collective_for_every_type() {
    if let Ok(role) = std::env::var(CHILD) {
        assert_eq!(role, "collectives");
        return child_collectives();
    }
    if !common::have(2, "two_processes_every_collective_for_every_type") {
        return;
    }
    let _gpus = serial();
    let run = ranks(&[], "two_processes_every_collective_for_every_type", "collectives", &[("RAFT_COMMS_TIMEOUT", "60")]);
    assert!(run.status.is_some_and(|s| s.success()), "{}", run.show());
    assert!(run.stdout.contains("RANK_OK 0") && run.stdout.contains("RANK_OK 1"), "{}", run.show());
    eprintln!("two processes, every collective: {:?}", run.took);
}

fn child_killed() {
    let (launch, res, comm) = join();
    let mut v: DeviceVec<f32> = up(&res, &data(launch.rank, 1 << 20));
    comm.allreduce_in_place(&mut v, ReduceOp::Sum).unwrap();
    comm.barrier().unwrap();
    if launch.rank == 1 {
        // Gone without a word, mid-run, as a crash would.
        // SAFETY: raise takes a signal number; SIGKILL ends this process at once.
        unsafe { libc::raise(libc::SIGKILL) };
    }
    let bound = Duration::from_secs(10);
    comm.set_timeout(bound).unwrap();
    std::thread::sleep(Duration::from_millis(300)); // rank 1 is surely gone
    let start = Instant::now();
    let outcome = (0..100).try_for_each(|_| {
        comm.allreduce_in_place(&mut v, ReduceOp::Sum)?;
        comm.sync()
    });
    let took = start.elapsed();
    let e = outcome.expect_err("collectives with a dead rank cannot succeed");
    println!("SURVIVOR_ERROR after {:.3} s: {e}", took.as_secs_f64());
    assert!(took <= bound + Duration::from_secs(5), "the error took {took:?}, beyond the {bound:?} bound");
    // The stream drains: the stuck kernels were aborted.
    assert!(common::drains_within(&res, Duration::from_secs(20)), "the stream did not drain after the abort");
    assert!(comm.ended().is_some());
}

#[test]
fn a_rank_killed_mid_run_gives_the_other_an_error_within_the_bound() {
    if let Ok(role) = std::env::var(CHILD) {
        assert_eq!(role, "killed");
        return child_killed();
    }
    if !common::have(2, "a_rank_killed_mid_run_gives_the_other_an_error_within_the_bound") {
        return;
    }
    let _gpus = serial();
    let run = ranks(&["--keep-going"], "a_rank_killed_mid_run_gives_the_other_an_error_within_the_bound", "killed", &[]);
    assert_eq!(run.status.and_then(|s| s.code()), Some(128 + libc::SIGKILL), "rank 1's SIGKILL is raft-run's status: {}", run.show());
    assert!(run.stdout.contains("SURVIVOR_ERROR"), "{}", run.show());
    assert!(!run.stderr.contains("rank 0 ("), "rank 0 failed: {}", run.show());
    assert!(run.took < Duration::from_secs(90), "{}", run.show());
    eprintln!("{}", run.stdout.lines().find(|l| l.contains("SURVIVOR_ERROR")).unwrap_or(""));
}

fn child_killed_in_1gib() {
    let (launch, res, comm) = join();
    println!("PID {} {}", launch.rank, std::process::id());
    let n = 256 << 20; // 1 GiB of f32
    let mut big: DeviceVec<f32> = zeros(&res, n);
    // Connections up first (a first collective makes them), so the kill lands in a transfer.
    let mut warm: DeviceVec<f32> = up(&res, &data(launch.rank, 1024));
    comm.allreduce_in_place(&mut warm, ReduceOp::Sum).unwrap();
    comm.barrier().unwrap();
    let bound = Duration::from_secs(10);
    comm.set_timeout(bound).unwrap();
    // Ten 1 GiB allreduces back to back: tens of milliseconds each over NVLink, far more over
    // sockets; rank 1 dies 30 ms into them, in the middle of one.
    for _ in 0..10 {
        comm.allreduce_in_place(&mut big, ReduceOp::Sum).unwrap();
    }
    let start = Instant::now();
    if launch.rank == 1 {
        std::thread::sleep(Duration::from_millis(30));
        // SAFETY: raise takes a signal number; SIGKILL ends this process at once.
        unsafe { libc::raise(libc::SIGKILL) };
    }
    let outcome = comm.sync();
    let took = start.elapsed();
    let e = outcome.expect_err("allreduces with a rank killed in the middle cannot all succeed");
    println!("SURVIVOR_ERROR after {:.3} s: {e}", took.as_secs_f64());
    assert!(took <= bound + Duration::from_secs(5), "the error took {took:?}, beyond the {bound:?} timeout");
    assert!(comm.ended().is_some(), "the communicator did not end with the error");
    // Released (communicator, array, resources), then a non-zero exit, as a job would.
    let released = comm.release();
    drop((big, warm));
    let res_released = res.release();
    println!("SURVIVOR_RELEASED communicator {released:?} resources {res_released:?}");
    std::process::exit(3);
}

/// Issue 32's failure case: a rank killed (SIGKILL) in the middle of a 1 GiB allreduce. The
/// survivor gets an error within its configured timeout (10 s), releases its communicator and
/// resources and exits with a non-zero status (3, its choice); afterwards no rank process is left
/// and each GPU's free memory is back to what it was before the job (within 256 MiB).
#[test]
fn a_rank_killed_in_a_1_gib_allreduce_leaves_an_erring_survivor_and_free_gpus() {
    const NAME: &str = "a_rank_killed_in_a_1_gib_allreduce_leaves_an_erring_survivor_and_free_gpus";
    if let Ok(role) = std::env::var(CHILD) {
        assert_eq!(role, "killed-1gib");
        return child_killed_in_1gib();
    }
    if !common::have(2, NAME) {
        return;
    }
    let _gpus = serial();
    let contexts: Vec<_> = (0..2).map(|d| cudarc::driver::CudaContext::new(d).unwrap()).collect();
    let free = |d: usize| contexts[d].mem_get_info().unwrap().0;
    let before: Vec<usize> = (0..2).map(free).collect();
    let run = ranks(&["--keep-going"], NAME, "killed-1gib", &[]);
    assert_eq!(run.status.and_then(|s| s.code()), Some(128 + libc::SIGKILL), "rank 1's SIGKILL is raft-run's status: {}", run.show());
    assert!(run.stdout.contains("SURVIVOR_ERROR") && run.stdout.contains("SURVIVOR_RELEASED"), "{}", run.show());
    assert!(run.stderr.contains("rank 0 (pid") && run.stderr.contains("exited with status 3"), "rank 0's own status: {}", run.show());
    for line in run.stdout.lines().filter(|l| l.starts_with("PID ")) {
        let pid = line.rsplit(' ').next().unwrap();
        let gone = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map_or(true, |stat| stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('Z')));
        assert!(gone, "rank process {pid} is still there after the job: {}", run.show());
    }
    // The driver gives a dead process's memory back shortly after it is reaped.
    let deadline = Instant::now() + Duration::from_secs(10);
    for (d, &was) in before.iter().enumerate() {
        let slack = 256 << 20;
        while free(d) + slack < was && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        let after = free(d);
        assert!(after + slack >= was, "GPU {d}: {} MiB free after the job, {} MiB before", after >> 20, was >> 20);
    }
    eprintln!("{} ({:?} for the job)", run.stdout.lines().find(|l| l.contains("SURVIVOR_ERROR")).unwrap_or(""), run.took);
}

fn child_exit_in_flight() {
    let (launch, res, comm) = join();
    let mut v: DeviceVec<f32> = up(&res, &data(launch.rank, 64 << 20));
    for _ in 0..20 {
        comm.allreduce_in_place(&mut v, ReduceOp::Sum).unwrap();
    }
    // Returns with the allreduces in flight: the communicator's drop hands its teardown to the
    // watchdog, and the exit waits for the collectives and the teardown, then tears down.
    println!("RETURNING {}", launch.rank);
    drop((v, comm));
}

#[test]
fn an_exit_with_collectives_in_flight_ends_promptly_and_cleanly() {
    if let Ok(role) = std::env::var(CHILD) {
        assert_eq!(role, "exit-in-flight");
        return child_exit_in_flight();
    }
    if !common::have(2, "an_exit_with_collectives_in_flight_ends_promptly_and_cleanly") {
        return;
    }
    let _gpus = serial();
    // An exit wait far longer than the bound: an exit that waited it out (collectives not seen
    // finished) fails the bound instead of passing as "slow".
    let run = ranks(&[], "an_exit_with_collectives_in_flight_ends_promptly_and_cleanly", "exit-in-flight", &[("RAFT_EXIT_WAIT", "60")]);
    assert!(run.status.is_some_and(|s| s.success()), "{}", run.show());
    assert!(run.stdout.contains("RETURNING 0") && run.stdout.contains("RETURNING 1"), "{}", run.show());
    assert!(run.took < Duration::from_secs(20), "{}", run.show());
}

fn child_peer_dead_at_exit() {
    let (launch, res, comm) = join();
    let mut v: DeviceVec<f32> = up(&res, &data(launch.rank, 1 << 20));
    comm.allreduce_in_place(&mut v, ReduceOp::Sum).unwrap();
    comm.barrier().unwrap();
    if launch.rank == 1 {
        // SAFETY: raise takes a signal number; SIGKILL ends this process at once.
        unsafe { libc::raise(libc::SIGKILL) };
    }
    std::thread::sleep(Duration::from_millis(300));
    comm.allreduce_in_place(&mut v, ReduceOp::Sum).unwrap(); // never finishes: the peer is gone
                                                             // The exit waits RAFT_EXIT_WAIT for it, then skips the teardown rather than destroy CUDA
                                                             // state under the stuck collective, and ends with the process's own status.
    println!("RETURNING {}", launch.rank);
    drop((v, comm));
}

#[test]
fn an_exit_with_a_collective_stuck_on_a_dead_rank_is_bounded() {
    if let Ok(role) = std::env::var(CHILD) {
        assert_eq!(role, "peer-dead-at-exit");
        return child_peer_dead_at_exit();
    }
    if !common::have(2, "an_exit_with_a_collective_stuck_on_a_dead_rank_is_bounded") {
        return;
    }
    let _gpus = serial();
    let run = ranks(
        &["--keep-going"],
        "an_exit_with_a_collective_stuck_on_a_dead_rank_is_bounded",
        "peer-dead-at-exit",
        &[("RAFT_EXIT_WAIT", "2"), ("RAFT_COMMS_TIMEOUT", "30")],
    );
    assert_eq!(run.status.and_then(|s| s.code()), Some(128 + libc::SIGKILL), "{}", run.show());
    assert!(run.stdout.contains("RETURNING 0"), "{}", run.show());
    assert!(!run.stderr.contains("rank 0 ("), "rank 0 failed: {}", run.show());
    assert!(run.took < Duration::from_secs(25), "the exit waited beyond the 2 s exit wait: {}", run.show());
}

#[test]
fn a_rank_that_never_arrives_fails_initialisation_within_the_bound() {
    if !common::have(1, "a_rank_that_never_arrives_fails_initialisation_within_the_bound") {
        return;
    }
    let _gpus = serial();
    let res = DeviceResources::on_device(0).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let start = Instant::now();
    let e = Communicator::init(&res, 0, 2, &addr, Duration::from_secs(3)).unwrap_err();
    let took = start.elapsed();
    assert!(e.message().contains("missing: 1"), "{e}");
    assert!(took >= Duration::from_millis(2900) && took < Duration::from_secs(10), "took {took:?}");
    let e = Communicator::init(&res, 1, 2, &addr, Duration::from_secs(2)).unwrap_err();
    assert!(e.message().contains("could not get the id from rank 0"), "{e}");
}
