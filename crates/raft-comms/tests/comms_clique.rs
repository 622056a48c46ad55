//! One process, two GPUs: a clique driven from one thread (inside `raft_comms::group`) and from
//! one thread per GPU; every collective for every element type against an answer computed on the
//! CPU; sub-communicators; the communicator installed into RAFT's resources and used through
//! `get_comms`; counts refused with no NCCL call made; a rank that never makes the matching call
//! turned into an error within the bound. Skips without two GPUs (fails under
//! `RAFT_REQUIRE_GPU=1`).
// Rank r indexes the resources, the communicators and the arrays alike.
#![allow(clippy::needless_range_loop)]

mod common;

use common::{data, reduce_cpu, typed, Val};

use cudarc::driver::sys::{CUgraphInstantiate_flags as Flags, CUstreamCaptureMode as Mode};
use raft_comms::{group, group_scope, Communicator, ReduceOp};
use raft_core::{DeviceResources, DeviceVec, ErrorKind};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// NCCL kernels of two cliques on the same GPUs at once can wait for each other: one test at a
/// time.
static GPUS: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    GPUS.lock().unwrap_or_else(|e| e.into_inner())
}

fn setup() -> (Vec<DeviceResources>, Vec<Communicator>) {
    let resources: Vec<DeviceResources> = (0..2).map(|d| DeviceResources::on_device(d).unwrap()).collect();
    let comms = Communicator::clique_with_timeout(&resources, Duration::from_secs(60)).unwrap();
    for (i, c) in comms.iter().enumerate() {
        assert_eq!((c.rank(), c.size(), c.device()), (i, 2, i));
    }
    (resources, comms)
}

/// A clique of one rank on device 0.
fn one_rank() -> (DeviceResources, Vec<Communicator>) {
    let res = DeviceResources::on_device(0).unwrap();
    (res.clone(), Communicator::clique_with_timeout(std::slice::from_ref(&res), Duration::from_secs(60)).unwrap())
}

fn sync_all(comms: &[Communicator]) {
    for c in comms {
        c.sync().unwrap();
    }
}

fn up<T: Val>(res: &DeviceResources, v: &[i64]) -> DeviceVec<T> {
    DeviceVec::from_host(res, &typed::<T>(v)).unwrap()
}

fn zeros<T: Val>(res: &DeviceResources, n: usize) -> DeviceVec<T> {
    DeviceVec::zeros(res, n).unwrap()
}

/// Every collective of one element type on a clique driven from this thread.
fn every_collective<T: Val>(res: &[DeviceResources], comms: &[Communicator]) {
    let (world, n) = (comms.len(), 8);
    let name = std::any::type_name::<T>();

    for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max] {
        let send: Vec<DeviceVec<T>> = (0..world).map(|r| up(&res[r], &data(r, n))).collect();
        let mut recv: Vec<DeviceVec<T>> = (0..world).map(|r| zeros(&res[r], n)).collect();
        // SAFETY: the arrays used inside live past the group and nothing else touches them meanwhile.
        unsafe { group(|| (0..world).try_for_each(|r| comms[r].allreduce(&send[r], &mut recv[r], op))) }.unwrap();
        sync_all(comms);
        for r in 0..world {
            assert_eq!(recv[r].to_host().unwrap(), typed::<T>(&reduce_cpu(op, n, world)), "{name} allreduce {op:?} rank {r}");
        }
    }

    let mut buf: Vec<DeviceVec<T>> = (0..world).map(|r| up(&res[r], &data(r, n))).collect();
    // SAFETY: the arrays used inside live past the group and nothing else touches them meanwhile.
    unsafe { group(|| buf.iter_mut().enumerate().try_for_each(|(r, b)| comms[r].allreduce_in_place(b, ReduceOp::Sum))) }.unwrap();
    sync_all(comms);
    for (r, b) in buf.iter().enumerate() {
        assert_eq!(b.to_host().unwrap(), typed::<T>(&reduce_cpu(ReduceOp::Sum, n, world)), "{name} allreduce in place rank {r}");
    }

    // Broadcast from rank 1, then in place from rank 0.
    let send: Vec<DeviceVec<T>> = (0..world).map(|r| up(&res[r], &data(r, n))).collect();
    let mut recv: Vec<DeviceVec<T>> = (0..world).map(|r| zeros(&res[r], n)).collect();
    // SAFETY: the arrays used inside live past the group and nothing else touches them meanwhile.
    unsafe { group(|| (0..world).try_for_each(|r| comms[r].broadcast(&send[r], &mut recv[r], 1))) }.unwrap();
    sync_all(comms);
    for r in 0..world {
        assert_eq!(recv[r].to_host().unwrap(), typed::<T>(&data(1, n)), "{name} broadcast rank {r}");
    }
    let mut buf: Vec<DeviceVec<T>> = (0..world).map(|r| up(&res[r], &data(r, n))).collect();
    // SAFETY: the arrays used inside live past the group and nothing else touches them meanwhile.
    unsafe { group(|| buf.iter_mut().enumerate().try_for_each(|(r, b)| comms[r].broadcast_in_place(b, 0))) }.unwrap();
    sync_all(comms);
    for (r, b) in buf.iter().enumerate() {
        assert_eq!(b.to_host().unwrap(), typed::<T>(&data(0, n)), "{name} broadcast in place rank {r}");
    }

    // Reduce to rank 1; rank 0 gives no receive array.
    let send: Vec<DeviceVec<T>> = (0..world).map(|r| up(&res[r], &data(r, n))).collect();
    let mut at_root: DeviceVec<T> = zeros(&res[1], n);
    // SAFETY: the arrays used inside live past the group and nothing else touches them meanwhile.
    unsafe {
        group(|| {
            comms[0].reduce(&send[0], None, ReduceOp::Max, 1)?;
            comms[1].reduce(&send[1], Some(&mut at_root), ReduceOp::Max, 1)
        })
    }
    .unwrap();
    sync_all(comms);
    assert_eq!(at_root.to_host().unwrap(), typed::<T>(&reduce_cpu(ReduceOp::Max, n, world)), "{name} reduce");

    // Allgather.
    let send: Vec<DeviceVec<T>> = (0..world).map(|r| up(&res[r], &data(r, n))).collect();
    let mut recv: Vec<DeviceVec<T>> = (0..world).map(|r| zeros(&res[r], world * n)).collect();
    // SAFETY: the arrays used inside live past the group and nothing else touches them meanwhile.
    unsafe { group(|| (0..world).try_for_each(|r| comms[r].allgather(&send[r], &mut recv[r]))) }.unwrap();
    sync_all(comms);
    let all: Vec<i64> = (0..world).flat_map(|r| data(r, n)).collect();
    for r in 0..world {
        assert_eq!(recv[r].to_host().unwrap(), typed::<T>(&all), "{name} allgather rank {r}");
    }

    // Allgatherv: rank 0 sends 3, rank 1 sends 5.
    let counts = [3usize, 5];
    let send: Vec<DeviceVec<T>> = (0..world).map(|r| up(&res[r], &data(r, counts[r]))).collect();
    let mut recv: Vec<DeviceVec<T>> = (0..world).map(|r| zeros(&res[r], 8)).collect();
    // SAFETY: the arrays used inside live past the group and nothing else touches them meanwhile.
    unsafe { group(|| (0..world).try_for_each(|r| comms[r].allgatherv(&send[r], &mut recv[r], &counts))) }.unwrap();
    sync_all(comms);
    let all: Vec<i64> = (0..world).flat_map(|r| data(r, counts[r])).collect();
    for r in 0..world {
        assert_eq!(recv[r].to_host().unwrap(), typed::<T>(&all), "{name} allgatherv rank {r}");
    }

    // Gather to rank 0.
    let send: Vec<DeviceVec<T>> = (0..world).map(|r| up(&res[r], &data(r, n))).collect();
    let mut at_root: DeviceVec<T> = zeros(&res[0], world * n);
    // SAFETY: the arrays used inside live past the group and nothing else touches them meanwhile.
    unsafe {
        group(|| {
            comms[0].gather(&send[0], Some(&mut at_root), 0)?;
            comms[1].gather(&send[1], None, 0)
        })
    }
    .unwrap();
    sync_all(comms);
    let all: Vec<i64> = (0..world).flat_map(|r| data(r, n)).collect();
    assert_eq!(at_root.to_host().unwrap(), typed::<T>(&all), "{name} gather");

    // Reduce-scatter: rank r gets block r of the sum.
    let send: Vec<DeviceVec<T>> = (0..world).map(|r| up(&res[r], &data(r, world * n))).collect();
    let mut recv: Vec<DeviceVec<T>> = (0..world).map(|r| zeros(&res[r], n)).collect();
    // SAFETY: the arrays used inside live past the group and nothing else touches them meanwhile.
    unsafe { group(|| (0..world).try_for_each(|r| comms[r].reduce_scatter(&send[r], &mut recv[r], ReduceOp::Sum))) }.unwrap();
    sync_all(comms);
    let sum = reduce_cpu(ReduceOp::Sum, world * n, world);
    for r in 0..world {
        assert_eq!(recv[r].to_host().unwrap(), typed::<T>(&sum[r * n..(r + 1) * n]), "{name} reduce_scatter rank {r}");
    }

    // Send / recv: rank 0 to rank 1.
    let sent: DeviceVec<T> = up(&res[0], &data(0, n));
    let mut got: DeviceVec<T> = zeros(&res[1], n);
    // SAFETY: the arrays used inside live past the group and nothing else touches them meanwhile.
    unsafe {
        group(|| {
            comms[0].send(&sent, 1)?;
            comms[1].recv(&mut got, 0)
        })
    }
    .unwrap();
    sync_all(comms);
    assert_eq!(got.to_host().unwrap(), typed::<T>(&data(0, n)), "{name} send/recv");

    // Sendrecv around the ring.
    let send: Vec<DeviceVec<T>> = (0..world).map(|r| up(&res[r], &data(r, n))).collect();
    let mut recv: Vec<DeviceVec<T>> = (0..world).map(|r| zeros(&res[r], n)).collect();
    // SAFETY: the arrays used inside live past the group and nothing else touches them meanwhile.
    unsafe { group(|| (0..world).try_for_each(|r| comms[r].sendrecv(&send[r], (r + 1) % world, &mut recv[r], (r + world - 1) % world))) }
        .unwrap();
    sync_all(comms);
    for r in 0..world {
        assert_eq!(recv[r].to_host().unwrap(), typed::<T>(&data((r + world - 1) % world, n)), "{name} sendrecv rank {r}");
    }
}

#[test]
fn every_collective_for_every_type_matches_the_cpu() {
    if !common::have(2, "every_collective_for_every_type_matches_the_cpu") {
        return;
    }
    let _gpus = serial();
    let (res, comms) = setup();
    every_collective::<f32>(&res, &comms);
    every_collective::<f64>(&res, &comms);
    every_collective::<i32>(&res, &comms);
    every_collective::<i64>(&res, &comms);
    every_collective::<u8>(&res, &comms);
    Communicator::release_all(comms).unwrap();
}

/// The safe form of a group: collectives through the scope's methods (which borrow the arrays
/// past the group's end) match the CPU; a collective called directly inside the scope is refused
/// before NCCL (`Logic`), as is a scoped group inside another group; the clique still agrees.
#[test]
fn a_scoped_group_runs_its_collectives_and_refuses_direct_calls() {
    if !common::have(2, "a_scoped_group_runs_its_collectives_and_refuses_direct_calls") {
        return;
    }
    let _gpus = serial();
    let (res, comms) = setup();
    let (world, n) = (comms.len(), 8);
    let mut buf: Vec<DeviceVec<f32>> = (0..world).map(|r| up(&res[r], &data(r, n))).collect();
    let send: Vec<DeviceVec<f32>> = (0..world).map(|r| up(&res[r], &data(r, n))).collect();
    let mut recv: Vec<DeviceVec<f32>> = (0..world).map(|r| zeros(&res[r], world * n)).collect();
    group_scope(|g| {
        for (r, b) in buf.iter_mut().enumerate() {
            g.on(&comms[r]).allreduce_in_place(b, ReduceOp::Sum)?;
        }
        for (r, out) in recv.iter_mut().enumerate() {
            g.on(&comms[r]).allgather(&send[r], out)?;
        }
        Ok(())
    })
    .unwrap();
    sync_all(&comms);
    let all: Vec<i64> = (0..world).flat_map(|r| data(r, n)).collect();
    for r in 0..world {
        assert_eq!(buf[r].to_host().unwrap(), typed::<f32>(&reduce_cpu(ReduceOp::Sum, n, world)), "allreduce in place rank {r}");
        assert_eq!(recv[r].to_host().unwrap(), typed::<f32>(&all), "allgather rank {r}");
    }

    let e = group_scope(|_g| comms[0].allreduce_in_place(&mut buf[0], ReduceOp::Sum)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Logic, "{e}");
    assert!(e.to_string().contains("GroupScope"), "{e}");
    // SAFETY: no collective is made inside this group.
    let e = unsafe { group(|| group_scope(|_g| Ok(()))) }.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Logic, "{e}");

    // Nothing reached NCCL: the ranks still agree.
    let mut again: Vec<DeviceVec<f32>> = (0..world).map(|r| up(&res[r], &data(r, n))).collect();
    group_scope(|g| again.iter_mut().enumerate().try_for_each(|(r, b)| g.on(&comms[r]).allreduce_in_place(b, ReduceOp::Sum))).unwrap();
    sync_all(&comms);
    for r in 0..world {
        assert_eq!(again[r].to_host().unwrap(), typed::<f32>(&reduce_cpu(ReduceOp::Sum, n, world)), "after the refusals, rank {r}");
    }
    Communicator::release_all(comms).unwrap();
}

#[test]
fn one_thread_per_gpu_needs_no_group_and_barriers_meet() {
    if !common::have(2, "one_thread_per_gpu_needs_no_group_and_barriers_meet") {
        return;
    }
    let _gpus = serial();
    let (res, comms) = setup();
    let n = 1 << 20;
    std::thread::scope(|s| {
        for (r, c) in comms.iter().enumerate() {
            let res = &res[r];
            s.spawn(move || {
                let mut v: DeviceVec<f32> = up(res, &data(r, n));
                c.allreduce_in_place(&mut v, ReduceOp::Sum).unwrap();
                c.barrier().unwrap();
                assert_eq!(v.to_host().unwrap(), typed::<f32>(&reduce_cpu(ReduceOp::Sum, n, 2)));
                c.barrier().unwrap();
            });
        }
    });
    Communicator::release_all(comms).unwrap();
}

#[test]
fn sub_communicators_from_split() {
    if !common::have(2, "sub_communicators_from_split") {
        return;
    }
    let _gpus = serial();
    let (res, comms) = setup();
    // One color, keys reversed: the ranks swap.
    let subs = Communicator::split_all(&[(&comms[0], Some(5), 1), (&comms[1], Some(5), 0)]).unwrap();
    let subs: Vec<Communicator> = subs.into_iter().map(Option::unwrap).collect();
    assert_eq!((subs[0].rank(), subs[0].size(), subs[1].rank(), subs[1].size()), (1, 2, 0, 2));
    // Gather onto the sub-communicator's rank 0 (the parent's rank 1): the parent's rank 1 data first.
    let send: Vec<DeviceVec<i32>> = (0..2).map(|r| up(&res[r], &data(r, 4))).collect();
    let mut at_root: DeviceVec<i32> = zeros(&res[1], 8);
    // SAFETY: the arrays used inside live past the group and nothing else touches them meanwhile.
    unsafe {
        group(|| {
            subs[0].gather(&send[0], None, 0)?;
            subs[1].gather(&send[1], Some(&mut at_root), 0)
        })
    }
    .unwrap();
    sync_all(&subs);
    let want: Vec<i64> = data(1, 4).into_iter().chain(data(0, 4)).collect();
    assert_eq!(at_root.to_host().unwrap(), typed::<i32>(&want));

    // Rank 1 takes no part: rank 0 alone in a communicator of one, rank 1 gets none.
    let alone = Communicator::split_all(&[(&comms[0], Some(0), 0), (&comms[1], None, 0)]).unwrap();
    assert!(alone[1].is_none());
    let solo = alone.into_iter().next().unwrap().unwrap();
    assert_eq!((solo.rank(), solo.size()), (0, 1));
    let mut v: DeviceVec<f64> = up(&res[0], &data(0, 4));
    solo.allreduce_in_place(&mut v, ReduceOp::Sum).unwrap();
    solo.sync().unwrap();
    assert_eq!(v.to_host().unwrap(), typed::<f64>(&data(0, 4)));

    // The parents still work after their children are gone.
    Communicator::release_all(subs).unwrap();
    solo.release().unwrap();
    let mut buf: Vec<DeviceVec<i64>> = (0..2).map(|r| up(&res[r], &data(r, 4))).collect();
    // SAFETY: the arrays used inside live past the group and nothing else touches them meanwhile.
    unsafe { group(|| buf.iter_mut().enumerate().try_for_each(|(r, b)| comms[r].allreduce_in_place(b, ReduceOp::Sum))) }.unwrap();
    sync_all(&comms);
    assert_eq!(buf[0].to_host().unwrap(), typed::<i64>(&reduce_cpu(ReduceOp::Sum, 4, 2)));
    Communicator::release_all(comms).unwrap();
}

#[test]
fn raft_sees_the_installed_communicator_through_get_comms() {
    if !common::have(2, "raft_sees_the_installed_communicator_through_get_comms") {
        return;
    }
    let _gpus = serial();
    let (res, comms) = setup();
    assert_eq!(raft_comms::installed(&res[0]).unwrap(), None);
    for (r, c) in comms.iter().enumerate() {
        c.install(&res[r]).unwrap();
        assert_eq!(raft_comms::installed(&res[r]).unwrap(), Some((r, 2)));
    }
    let e = comms[0].install(&res[1]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Logic, "{e}");
    // RAFT's comms_t::allreduce then sync_stream block per rank: one thread each.
    let n = 1000;
    std::thread::scope(|s| {
        for r in 0..2 {
            let res = &res[r];
            s.spawn(move || {
                let send: DeviceVec<f32> = up(res, &data(r, n));
                let mut recv: DeviceVec<f32> = zeros(res, n);
                raft_comms::through_raft::allreduce(res, &send, &mut recv, ReduceOp::Sum).unwrap();
                assert_eq!(recv.to_host().unwrap(), typed::<f32>(&reduce_cpu(ReduceOp::Sum, n, 2)));
            });
        }
    });
    // After the communicator ends, RAFT's handle says so instead of using a dead communicator.
    Communicator::release_all(comms).unwrap();
    assert_eq!(raft_comms::installed(&res[0]).unwrap(), Some((0, 2)), "the installed handle stays, ended");
    let send: DeviceVec<f32> = up(&res[0], &data(0, 4));
    let mut recv: DeviceVec<f32> = zeros(&res[0], 4);
    let e = raft_comms::through_raft::allreduce(&res[0], &send, &mut recv, ReduceOp::Sum).unwrap_err();
    assert!(e.message().contains("was released"), "{e}");
}

#[test]
fn wrong_counts_are_refused_before_nccl_and_the_clique_still_agrees() {
    if !common::have(2, "wrong_counts_are_refused_before_nccl_and_the_clique_still_agrees") {
        return;
    }
    let _gpus = serial();
    let (res, comms) = setup();
    let send: DeviceVec<f32> = up(&res[0], &data(0, 4));
    let mut short: DeviceVec<f32> = zeros(&res[0], 7);
    let e = comms[0].allgather(&send, &mut short).unwrap_err();
    assert_eq!((e.kind(), e.who()), (ErrorKind::Logic, "Communicator::allgather"), "{e}");
    let mut wrong: DeviceVec<f32> = zeros(&res[0], 3);
    assert_eq!(comms[0].reduce_scatter(&send, &mut wrong, ReduceOp::Sum).unwrap_err().kind(), ErrorKind::Logic);
    assert_eq!(comms[0].allreduce(&send, &mut wrong, ReduceOp::Sum).unwrap_err().kind(), ErrorKind::Logic);
    assert_eq!(comms[0].broadcast_in_place(&mut wrong, 2).unwrap_err().kind(), ErrorKind::Logic);
    assert_eq!(comms[0].send(&send, 2).unwrap_err().kind(), ErrorKind::Logic);
    assert_eq!(comms[0].gather(&send, None, 0).unwrap_err().kind(), ErrorKind::Logic, "the root needs a receive array");
    // An array of other resources (another stream) is refused too.
    let other = DeviceResources::on_device(0).unwrap();
    let foreign: DeviceVec<f32> = up(&other, &data(0, 4));
    let mut recv: DeviceVec<f32> = zeros(&res[0], 4);
    let e = comms[0].allreduce(&foreign, &mut recv, ReduceOp::Sum).unwrap_err();
    assert!(e.message().contains("not to the communicator's resources"), "{e}");
    // Waiting inside a group is refused: it would wait for work the group has not launched.
    // SAFETY: the arrays used inside live past the group and nothing else touches them meanwhile.
    let e = unsafe { group(|| comms[0].sync()) }.unwrap_err();
    assert!(e.message().contains("inside raft_comms::group"), "{e}");
    // Nothing reached NCCL: the next collective still pairs up.
    let mut buf: Vec<DeviceVec<f32>> = (0..2).map(|r| up(&res[r], &data(r, 4))).collect();
    // SAFETY: the arrays used inside live past the group and nothing else touches them meanwhile.
    unsafe { group(|| buf.iter_mut().enumerate().try_for_each(|(r, b)| comms[r].allreduce_in_place(b, ReduceOp::Sum))) }.unwrap();
    sync_all(&comms);
    assert_eq!(buf[1].to_host().unwrap(), typed::<f32>(&reduce_cpu(ReduceOp::Sum, 4, 2)));
    Communicator::release_all(comms).unwrap();
}

#[test]
fn a_rank_that_never_joins_a_collective_is_an_error_within_the_bound() {
    if !common::have(2, "a_rank_that_never_joins_a_collective_is_an_error_within_the_bound") {
        return;
    }
    let _gpus = serial();
    let (res, comms) = setup();
    // Connections first (a first collective sets them up), so the lone call below is enqueued.
    let mut warm: Vec<DeviceVec<f32>> = (0..2).map(|r| up(&res[r], &data(r, 4))).collect();
    // SAFETY: the arrays used inside live past the group and nothing else touches them meanwhile.
    unsafe { group(|| warm.iter_mut().enumerate().try_for_each(|(r, b)| comms[r].allreduce_in_place(b, ReduceOp::Sum))) }.unwrap();
    sync_all(&comms);
    let bound = Duration::from_secs(3);
    comms[0].set_timeout(bound).unwrap();
    let mut lone: DeviceVec<f32> = up(&res[0], &data(0, 1 << 16));
    let start = Instant::now();
    let outcome = comms[0].allreduce_in_place(&mut lone, ReduceOp::Sum).and_then(|()| comms[0].sync());
    let took = start.elapsed();
    let e = outcome.unwrap_err();
    assert!(took >= bound - Duration::from_millis(100) && took < bound + Duration::from_secs(10), "took {took:?}");
    assert!(e.message().contains("did not finish within") || e.message().contains("did not complete within"), "{e}");
    assert!(comms[0].ended().is_some());
    // Every later call says the same; the stuck kernel was aborted, so the stream drains.
    let again = comms[0].allreduce_in_place(&mut lone, ReduceOp::Sum).unwrap_err();
    assert_eq!(again.who(), "Communicator::allreduce_in_place");
    assert!(common::drains_within(&res[0], Duration::from_secs(20)), "the stream did not drain after the abort");
    let mut it = comms.into_iter();
    it.next().unwrap().abort().unwrap();
    it.next().unwrap().abort().unwrap();
}

#[test]
fn dropped_communicators_are_torn_down_in_the_background() {
    if !common::have(2, "dropped_communicators_are_torn_down_in_the_background") {
        return;
    }
    let _gpus = serial();
    let (res, comms) = setup();
    let mut buf: Vec<DeviceVec<f32>> = (0..2).map(|r| up(&res[r], &data(r, 1 << 20))).collect();
    // SAFETY: the arrays used inside live past the group and nothing else touches them meanwhile.
    unsafe { group(|| buf.iter_mut().enumerate().try_for_each(|(r, b)| comms[r].allreduce_in_place(b, ReduceOp::Sum))) }.unwrap();
    let start = Instant::now();
    drop(comms); // with the allreduce maybe still running: Drop returns at once
    assert!(start.elapsed() < Duration::from_secs(1), "drop blocked for {:?}", start.elapsed());
    let deadline = Instant::now() + Duration::from_secs(30);
    while raft_exit::releases_in_flight() > 0 {
        assert!(Instant::now() < deadline, "the teardown did not finish");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(buf[0].to_host().unwrap(), typed::<f32>(&reduce_cpu(ReduceOp::Sum, 1 << 20, 2)));
}

#[test]
fn a_clique_refuses_two_ranks_on_one_gpu() {
    if !common::have(1, "a_clique_refuses_two_ranks_on_one_gpu") {
        return;
    }
    let res = DeviceResources::on_device(0).unwrap();
    let e = Communicator::clique(&[res.clone(), res]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Logic);
    assert!(e.message().contains("two resources on device 0"), "{e}");
    assert_eq!(Communicator::clique(&[]).unwrap_err().kind(), ErrorKind::Logic);
}

/// While one thread's open group holds calls on a communicator, a call from another thread is
/// refused (`Logic`) before NCCL: NCCL keeps a group per thread and would fold the call into
/// that group, launched only when it ends, after the caller's array is gone. Once the group has
/// ended, the other thread's calls run. One GPU: a clique of one. (Before the fix the other
/// thread's call returned `Ok` and its array was freed under the pending collective.)
#[test]
fn a_group_on_one_thread_refuses_calls_from_another_until_it_ends() {
    if !common::have(1, "a_group_on_one_thread_refuses_calls_from_another_until_it_ends") {
        return;
    }
    let _gpus = serial();
    let (res, comms) = one_rank();
    let c = &comms[0];
    // Installed into other resources of the device too: RAFT's C++ path (get_comms) is checked
    // on the C++ side, past the Rust side's own check.
    let other_res = DeviceResources::on_device(0).unwrap();
    c.install(&other_res).unwrap();
    let n = 8;
    // Out of place into zeros: with one rank an in-place allreduce leaves its input as it was
    // whether or not it ran; the zeros change only if it ran.
    let input = up::<f32>(&res, &data(0, n));
    let mut mine = zeros::<f32>(&res, n);
    let (inside, done) = (std::sync::Barrier::new(2), std::sync::Barrier::new(2));
    std::thread::scope(|s| {
        let other = s.spawn(|| {
            inside.wait();
            let mut theirs = up::<f32>(&res, &data(0, n));
            let direct = c.allreduce_in_place(&mut theirs, ReduceOp::Sum);
            let send = up::<f32>(&other_res, &data(0, n));
            let mut recv = zeros::<f32>(&other_res, n);
            let through_raft = raft_comms::through_raft::allreduce(&other_res, &send, &mut recv, ReduceOp::Sum);
            // A wait whose timeout would abort the communicator NCCL holds in the group.
            let sync = c.sync();
            done.wait();
            (direct, through_raft, sync)
        });
        // The barriers are reached whatever the group's call returns (a failure would otherwise
        // leave the other thread waiting).
        let grouped = group_scope(|g| {
            let r = g.on(c).allreduce(&input, &mut mine, ReduceOp::Sum);
            inside.wait();
            done.wait();
            r
        });
        let (direct, through_raft, sync) = other.join().unwrap();
        grouped.unwrap();
        for (what, r) in [("direct", direct), ("through RAFT's get_comms", through_raft), ("sync", sync)] {
            let e = r.expect_err(&format!("{what}: a call from another thread joined this thread's open group"));
            assert_eq!(e.kind(), ErrorKind::Logic, "{what}: {e}");
            assert!(e.to_string().contains("another thread"), "{what}: {e}");
        }
    });
    c.sync().unwrap();
    assert_eq!(mine.to_host().unwrap(), typed::<f32>(&reduce_cpu(ReduceOp::Sum, n, 1)));
    // The group has ended: another thread's call runs.
    std::thread::scope(|s| {
        s.spawn(|| {
            let send = up::<f32>(&res, &data(0, n));
            let mut theirs = zeros::<f32>(&res, n);
            c.allreduce(&send, &mut theirs, ReduceOp::Sum).unwrap();
            c.sync().unwrap();
            assert_eq!(theirs.to_host().unwrap(), typed::<f32>(&reduce_cpu(ReduceOp::Sum, n, 1)));
        });
    });
    Communicator::release_all(comms).unwrap();
}

/// Installing a communicator has the resources to itself: it waits for a lend of them on
/// another thread to end, since RAFT's `set_comms` replaces the comms cell, which a reader there
/// (`installed`, `through_raft`, cuVS) could be left holding a reference into once it is freed.
/// Inside a lend on the installing thread it would wait for itself: refused. One GPU: a clique
/// of one. (Before the fix the installation ran beside the other thread's lend, under the same
/// shared lock, and returned while that lend was still running.)
#[test]
fn installing_waits_for_a_lend_of_the_resources_on_another_thread() {
    if !common::have(1, "installing_waits_for_a_lend_of_the_resources_on_another_thread") {
        return;
    }
    let _gpus = serial();
    let (res, comms) = one_rank();
    let c = &comms[0];
    let entered = std::sync::Barrier::new(2);
    let lend_ended: Mutex<Option<Instant>> = Mutex::new(None);
    std::thread::scope(|s| {
        s.spawn(|| {
            res.with_raft_resources(|_| {
                entered.wait();
                std::thread::sleep(Duration::from_millis(300));
                *lend_ended.lock().unwrap() = Some(Instant::now());
            })
            .unwrap();
        });
        entered.wait();
        c.install(&res).unwrap();
        let installed = Instant::now();
        let ended = lend_ended.lock().unwrap().expect("the installation returned while another thread's lend was still running");
        assert!(ended <= installed);
    });
    assert_eq!(raft_comms::installed(&res).unwrap(), Some((0, 1)));
    let e = res.with_raft_resources(|_| c.install(&res)).unwrap().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Logic);
    assert!(e.message().contains("would wait for itself"), "{e}");
    Communicator::release_all(comms).unwrap();
}

/// A rank of a clique aborted while another thread's open group holds calls on its peer: the
/// peer's `ncclCommAbort` waits for that group's end. NCCL lists the peer in the owning thread's
/// group, and an abort from another thread (here the clique's rule, "abort one, abort all")
/// freed it under the `ncclGroupEnd` that walks that list: a use after free. The group's end
/// now fails, saying the clique was aborted, and rank 0's stream drains. Two GPUs.
#[test]
fn aborting_a_rank_while_its_peer_is_in_another_threads_group_waits_for_that_group() {
    if !common::have(2, "aborting_a_rank_while_its_peer_is_in_another_threads_group_waits_for_that_group") {
        return;
    }
    let _gpus = serial();
    let (res, comms) = setup();
    warm_up(&res, &comms);
    let mut it = comms.into_iter();
    let (c0, c1) = (it.next().unwrap(), it.next().unwrap());
    let mut a: DeviceVec<f32> = up(&res[0], &data(0, 1 << 16));
    let grouped = group_scope(|g| {
        g.on(&c0).allreduce_in_place(&mut a, ReduceOp::Sum)?;
        std::thread::spawn(move || c1.abort()).join().unwrap()
    });
    let e = grouped.expect_err("the group ended well on a communicator whose clique was aborted");
    assert!(e.message().contains("aborted"), "{e}");
    assert!(c0.ended().is_some(), "rank 0 was left running after its clique's abort");
    assert!(common::drains_within(&res[0], Duration::from_secs(10)), "rank 0's stream still runs after the clique's abort");
    drop(a);
    c0.abort().unwrap();
}

/// The ranks split from a clique one thread per rank (`split`, not `split_all`) are a clique of
/// their own, as are ranks initialised in one process with one unique id: an abort of one ends
/// the other. (Before: only `clique` and `split_all` linked their ranks, and the other rank was
/// left running, its kernels still reaching the aborted rank's arrays.) Two GPUs.
#[test]
fn ranks_split_per_thread_or_made_from_one_id_in_a_process_abort_together() {
    if !common::have(2, "ranks_split_per_thread_or_made_from_one_id_in_a_process_abort_together") {
        return;
    }
    let _gpus = serial();
    let (res, comms) = setup();
    let children: Vec<Communicator> = std::thread::scope(|s| {
        let made: Vec<_> = comms.iter().map(|c| s.spawn(move || c.split(Some(0), 0))).collect();
        made.into_iter().map(|t| t.join().unwrap().unwrap().expect("a color gives a communicator")).collect()
    });
    let mut it = children.into_iter();
    let (k0, k1) = (it.next().unwrap(), it.next().unwrap());
    k0.abort().unwrap();
    let e = k1.ended().expect("the other child of the split was left running after rank 0's abort");
    assert!(e.message().contains("of its clique was aborted"), "{e}");
    assert!(comms[0].ended().is_none() && comms[1].ended().is_none(), "the split's abort reached its parents");
    k1.abort().unwrap();
    Communicator::release_all(comms).unwrap();

    let id = raft_comms::UniqueId::new().unwrap();
    let made: Vec<Communicator> = std::thread::scope(|s| {
        let ranks: Vec<_> = (0..2)
            .map(|r| {
                let (res, id) = (&res[r], &id);
                s.spawn(move || Communicator::init_with_id(res, id, r, 2, Duration::from_secs(60)))
            })
            .collect();
        ranks.into_iter().map(|t| t.join().unwrap().unwrap()).collect()
    });
    let mut it = made.into_iter();
    let (r0, r1) = (it.next().unwrap(), it.next().unwrap());
    r1.abort().unwrap();
    let e = r0.ended().expect("rank 0 of one id was left running after rank 1's abort");
    assert!(e.message().contains("rank 1 of its clique was aborted"), "{e}");
    r0.abort().unwrap();
}

/// A collective is refused while the resources' stream is being captured into a CUDA graph
/// (NCCL's calls can be captured: the graph would run the collective at each launch, after its
/// arrays may be gone). Nothing enters the graph; after the capture the collective runs. One GPU:
/// a clique of one. (Before: the allreduce was accepted and captured.)
#[test]
fn a_collective_is_refused_while_the_stream_is_captured() {
    if !common::have(1, "a_collective_is_refused_while_the_stream_is_captured") {
        return;
    }
    let _gpus = serial();
    let (res, comms) = one_rank();
    let c = &comms[0];
    let n = 8;
    let input = up::<f32>(&res, &data(0, n));
    let mut out = zeros::<f32>(&res, n);
    let stream = res.stream().unwrap();
    stream.begin_capture(Mode::CU_STREAM_CAPTURE_MODE_RELAXED).unwrap();
    let refused = c.allreduce(&input, &mut out, ReduceOp::Sum);
    let graph = stream.end_capture(Flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH);
    let e = refused.expect_err("an allreduce on a capturing stream was accepted (and captured)");
    assert_eq!(e.kind(), ErrorKind::Logic, "{e}");
    assert!(e.message().contains("captured into a CUDA graph"), "{e}");
    drop(graph.unwrap());
    assert!(c.ended().is_none(), "a refused call ended the communicator");
    c.allreduce(&input, &mut out, ReduceOp::Sum).unwrap();
    c.sync().unwrap();
    assert_eq!(out.to_host().unwrap(), typed::<f32>(&reduce_cpu(ReduceOp::Sum, n, 1)));
    // RAFT's own path too (the eighth audit: it alone asked nothing before the call).
    let other = DeviceResources::on_device(0).unwrap();
    c.install(&other).unwrap();
    let (input, mut out) = (up::<f32>(&other, &data(0, n)), zeros::<f32>(&other, n));
    let stream = other.stream().unwrap();
    stream.begin_capture(Mode::CU_STREAM_CAPTURE_MODE_RELAXED).unwrap();
    let refused = raft_comms::through_raft::allreduce(&other, &input, &mut out, ReduceOp::Sum);
    let graph = stream.end_capture(Flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH);
    let e = refused.expect_err("RAFT's allreduce on a capturing stream was accepted");
    assert!(e.message().contains("captured into a CUDA graph"), "through RAFT: {e}");
    drop(graph.unwrap());
    raft_comms::through_raft::allreduce(&other, &input, &mut out, ReduceOp::Sum).unwrap();
    assert_eq!(out.to_host().unwrap(), typed::<f32>(&reduce_cpu(ReduceOp::Sum, n, 1)));
    Communicator::release_all(comms).unwrap();
}

/// A capture begun on the stream after a group's collective was queued, before the group's end:
/// the process stops before NCCL launches the collective (the fifth audit's open item). NCCL
/// launches a group's calls only at `ncclGroupEnd`, so the launch went into the capture (with
/// several ranks, a graph running the collective at each launch after the group's arrays were
/// gone). In a child process, as the stop ends it, bounded to three minutes. (Before: the
/// child's group ended, the capture gave its graph back, and the child exited 0.)
#[test]
fn a_capture_begun_before_a_groups_end_stops_the_process_before_the_launch() {
    const NAME: &str = "a_capture_begun_before_a_groups_end_stops_the_process_before_the_launch";
    const CHILD: &str = "RAFT_COMMS_TEST_GROUP_CAPTURE_CHILD";
    if std::env::var_os(CHILD).is_some() {
        let (res, comms) = one_rank();
        let mut buf = up::<f32>(&res, &data(0, 8));
        let stream = res.stream().unwrap();
        let ended = group_scope(|g| {
            g.on(&comms[0]).allreduce_in_place(&mut buf, ReduceOp::Sum)?;
            stream.begin_capture(Mode::CU_STREAM_CAPTURE_MODE_RELAXED).unwrap();
            Ok(())
        });
        // Reached only when the group's end launched the collective into the capture.
        let graph = stream.end_capture(Flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH);
        println!("child: the group ended ({ended:?}); the capture gave a graph: {:?}", graph.map(|g| g.is_some()));
        return;
    }
    if !common::have(1, NAME) {
        return;
    }
    let _gpus = serial();
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", NAME, "--nocapture", "--test-threads=1"]).env(CHILD, "1");
    let run = common::run_bounded(cmd, Duration::from_secs(180));
    let (stdout, stderr) = (&run.stdout, &run.stderr);
    use std::os::unix::process::ExitStatusExt;
    let signal = run.status.and_then(|s| s.signal());
    assert_eq!(signal, Some(libc::SIGABRT), "the child was not stopped (SIGABRT) at the group's end: {}", run.show());
    assert!(
        stderr.contains("a CUDA graph capture began on a stream") && stderr.contains("before the group's end launched them"),
        "{stderr}"
    );
    assert!(!stdout.contains("child: the group ended"), "{stdout}");
}

/// Sets the clique's connections up (a first collective does), so that a lone call later is
/// enqueued and waits on the GPU for its peer.
fn warm_up(res: &[DeviceResources], comms: &[Communicator]) {
    let mut warm: Vec<DeviceVec<f32>> = (0..2).map(|r| up(&res[r], &data(r, 4))).collect();
    // SAFETY: the arrays used inside live past the group and nothing else touches them meanwhile.
    unsafe { group(|| warm.iter_mut().enumerate().try_for_each(|(r, b)| comms[r].allreduce_in_place(b, ReduceOp::Sum))) }.unwrap();
    sync_all(comms);
}

/// Aborting one rank of a clique aborts the others: within a process NCCL's kernels reach the
/// peers' arrays directly, and rank 1's kernel, left waiting for rank 0, would still touch rank
/// 0's arrays after they are freed and reused. (Before: rank 1 stayed alive, its kernel stuck
/// until its own 60 s timeout; `ended()` was `None` and its stream did not drain.)
#[test]
fn aborting_one_rank_of_a_clique_aborts_the_others() {
    if !common::have(2, "aborting_one_rank_of_a_clique_aborts_the_others") {
        return;
    }
    let _gpus = serial();
    let (res, comms) = setup();
    warm_up(&res, &comms);
    let mut lone: DeviceVec<f32> = up(&res[1], &data(1, 1 << 16));
    comms[1].allreduce_in_place(&mut lone, ReduceOp::Sum).unwrap(); // waits for rank 0 on the GPU
    let mut it = comms.into_iter();
    let (c0, c1) = (it.next().unwrap(), it.next().unwrap());
    c0.abort().unwrap();
    let e = c1.ended().expect("rank 1 was left running after rank 0's abort");
    assert!(e.message().contains("rank 0 of its clique was aborted"), "{e}");
    assert!(common::drains_within(&res[1], Duration::from_secs(5)), "rank 1's kernel still runs after the clique's abort");
    let again = c1.allreduce_in_place(&mut lone, ReduceOp::Sum).unwrap_err();
    assert!(again.message().contains("aborted"), "{again}");
    c1.abort().unwrap();
}

/// An abort made by RAFT's `sync_stream` (through `get_comms`, in the shim) is what `ended()`
/// says. (Before: `ended()` read only the Rust side's record, and said `None`.)
#[test]
fn an_abort_by_rafts_sync_stream_is_seen_by_ended() {
    if !common::have(2, "an_abort_by_rafts_sync_stream_is_seen_by_ended") {
        return;
    }
    let _gpus = serial();
    let (res, comms) = setup();
    warm_up(&res, &comms);
    comms[0].install(&res[0]).unwrap();
    comms[0].set_timeout(Duration::from_secs(1)).unwrap();
    let send: DeviceVec<f32> = up(&res[0], &data(0, 1 << 16));
    let mut recv: DeviceVec<f32> = zeros(&res[0], 1 << 16);
    // Rank 1 never makes the matching call: sync_stream times out and aborts.
    let e = raft_comms::through_raft::allreduce(&res[0], &send, &mut recv, ReduceOp::Sum).unwrap_err();
    assert!(comms[0].ended().is_some(), "ended() missed the abort: {e}");
    assert!(comms[0].ended().unwrap().message().contains("sync_stream"), "{:?}", comms[0].ended());
    // An abort made in C++ alone ends the clique too. (Before: only the Rust side aborted the
    // peers, and rank 1 was left running.)
    let peer = comms[1].ended().expect("rank 1 was left running after RAFT's sync_stream aborted rank 0");
    assert!(peer.message().contains("rank 0 of its clique was aborted"), "{peer}");
    let mut it = comms.into_iter();
    it.next().unwrap().abort().unwrap();
    it.next().unwrap().abort().unwrap();
}

/// The eighth audit: NCCL pairs a send to self with a receive from self and copies the send's
/// byte count into the receive's array, unchecked. Before: `sendrecv(&big, me, &mut small, me)`
/// passed every check and NCCL wrote all of `big` into `small`'s 16 elements; a lone send or
/// receive to self failed only at NCCL's group end, ending the communicator. Now each is refused
/// (`Logic`) before NCCL, and a sendrecv to itself with one length copies as it should.
#[test]
fn a_rank_sends_to_itself_only_both_ways_with_one_length() {
    if !common::have(1, "a_rank_sends_to_itself_only_both_ways_with_one_length") {
        return;
    }
    let _gpus = serial();
    let (res, comms) = one_rank();
    let c = &comms[0];
    let big = up::<f32>(&res, &data(0, 1 << 20));
    let mut small = zeros::<f32>(&res, 16);
    for (what, r) in [
        ("sendrecv of two lengths", c.sendrecv(&big, 0, &mut small, 0)),
        ("send to itself", c.send(&big, 0)),
        ("recv from itself", c.recv(&mut small, 0)),
    ] {
        let e = r.expect_err(what);
        assert_eq!(e.kind(), ErrorKind::Logic, "{what}: {e}");
    }
    let src = up::<f32>(&res, &data(0, 16));
    c.sendrecv(&src, 0, &mut small, 0).unwrap();
    c.sync().unwrap();
    assert_eq!(small.to_host().unwrap(), src.to_host().unwrap(), "the copy to itself");
    assert!(c.ended().is_none(), "the refusals left the communicator working");
}

/// `sync` on a communicator whose resources' stream the user captures (relaxed mode), after a
/// collective completed: refused (`Logic`), the communicator not ended, the user's capture still
/// valid, and a collective after the capture gives the right result. (Before, expected, to be
/// confirmed on GPU: `sync` queried the capturing stream, the driver refused (a `Cuda` error)
/// and invalidated the capture, and `sync` aborted the healthy communicator.)
#[test]
fn sync_refuses_a_captured_stream_and_leaves_the_communicator_and_the_capture_alone() {
    if !common::have(1, "sync_refuses_a_captured_stream_and_leaves_the_communicator_and_the_capture_alone") {
        return;
    }
    let _gpus = serial();
    let (res, comms) = one_rank();
    let (c, n, sum) = (&comms[0], 8, typed::<f32>(&reduce_cpu(ReduceOp::Sum, 8, 1)));
    let (input, mut out) = (up::<f32>(&res, &data(0, n)), zeros::<f32>(&res, n));
    c.allreduce(&input, &mut out, ReduceOp::Sum).unwrap();
    c.sync().unwrap();
    let stream = res.stream().unwrap();
    stream.begin_capture(Mode::CU_STREAM_CAPTURE_MODE_RELAXED).unwrap();
    let (refused, ended) = (c.sync(), c.ended());
    let graph = stream.end_capture(Flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH);
    let e = refused.expect_err("sync on a capturing stream answered Ok");
    assert_eq!(e.kind(), ErrorKind::Logic, "{e}");
    assert!(e.message().contains("being captured"), "{e}");
    assert!(ended.is_none() && c.ended().is_none(), "the capture ended the communicator: {:?}", c.ended());
    drop(graph.expect("sync invalidated the user's capture"));
    let mut again = zeros::<f32>(&res, n);
    c.allreduce(&input, &mut again, ReduceOp::Sum).unwrap();
    c.sync().unwrap();
    assert_eq!((out.to_host().unwrap(), again.to_host().unwrap()), (sum.clone(), sum));
    Communicator::release_all(comms).unwrap();
}

/// `release` while the user captures the resources' stream (relaxed mode), with a collective
/// queued before the capture still pending (held behind a host function for 300 ms): it waits
/// for that collective (the communicator's event), then finalizes, and returns `Ok`. Whether
/// the user's capture survives NCCL's own teardown is printed, not asserted. (Before, expected,
/// to be confirmed on GPU: the wait queried the capturing stream, failed, and `release` aborted
/// the communicator and returned that error.)
#[test]
fn release_on_a_captured_stream_waits_for_the_collectives_from_the_event() {
    if !common::have(1, "release_on_a_captured_stream_waits_for_the_collectives_from_the_event") {
        return;
    }
    let _gpus = serial();
    let (res, comms) = one_rank();
    let (mut buf, stream) = (up::<f32>(&res, &data(0, 8)), res.stream().unwrap());
    let gate = common::Gate::close(&stream, Duration::from_secs(20));
    comms[0].allreduce_in_place(&mut buf, ReduceOp::Sum).unwrap(); // pending behind the gate
    stream.begin_capture(Mode::CU_STREAM_CAPTURE_MODE_RELAXED).unwrap();
    gate.open_after(Duration::from_millis(300));
    let start = Instant::now();
    let released = Communicator::release_all(comms);
    let took = start.elapsed();
    let graph = stream.end_capture(Flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH);
    released.expect("release on a capturing stream failed");
    assert!(took >= Duration::from_millis(250), "release returned before the pending collective ran ({took:?})");
    eprintln!("the user's capture after release: {:?}", graph.map(|g| g.is_some()));
    assert_eq!(buf.to_host().unwrap(), typed::<f32>(&data(0, 8)), "one rank: a sum is the input");
}

/// An unrelated stream captured in global mode on another thread while the communicator has a
/// collective pending (held behind a host function) and the watchdog watches it, while this
/// thread asks `ended()` and waits in `sync`: the communicator is not aborted, `sync` returns
/// `Ok`, a barrier meets, the other thread's capture ends `Ok`, and a later collective works.
/// (Before, expected, to be confirmed on GPU: in global mode the driver refused the watchdog's
/// event query and `sync`'s stream query, invalidating the capture, and the watchdog aborted the
/// communicator. The barrier since the thirteenth audit: its int's stream-ordered allocation and
/// free were refused in global mode, a `Cuda` error and the capture invalidated.)
#[test]
fn another_threads_global_capture_neither_aborts_a_watched_communicator_nor_is_invalidated() {
    if !common::have(1, "another_threads_global_capture_neither_aborts_a_watched_communicator_nor_is_invalidated") {
        return;
    }
    let _gpus = serial();
    let (res, comms) = one_rank();
    let (c, mut buf) = (&comms[0], up::<f32>(&res, &data(0, 8)));
    let gate = common::Gate::close(&res.stream().unwrap(), Duration::from_secs(20));
    c.allreduce_in_place(&mut buf, ReduceOp::Sum).unwrap(); // pending behind the gate, watched
    let other = common::OtherCapture::begin(res.context(), Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(200)); // the watchdog looks every millisecond
    let ended = c.ended();
    gate.open();
    let synced = c.sync_timeout(Duration::from_secs(20));
    let met = c.barrier();
    let captured = other.end();
    assert!(ended.is_none(), "the communicator was aborted during another thread's capture: {ended:?}");
    synced.expect("sync during another thread's capture");
    met.expect("a barrier during another thread's capture");
    captured.expect("the other thread's capture was invalidated");
    c.allreduce_in_place(&mut buf, ReduceOp::Sum).unwrap();
    c.sync().unwrap();
    assert_eq!(buf.to_host().unwrap(), typed::<f32>(&data(0, 8)), "one rank: a sum is the input");
    Communicator::release_all(comms).unwrap();
}
