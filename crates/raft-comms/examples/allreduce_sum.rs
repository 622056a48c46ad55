//! Sums a distributed vector across ranks: each rank owns a shard of a dataset, makes its part of
//! a vector from it (here a histogram of its values, 16 buckets), and one allreduce gives every
//! rank the sum of all the parts, the histogram of the whole dataset.
//!
//! ```text
//! raft-run -n 2 cargo run --example allreduce_sum     # one process per GPU
//! MASTER_ADDR=host0 MASTER_PORT=29500 mpirun -np 2 -x MASTER_ADDR -x MASTER_PORT target/debug/examples/allreduce_sum
//! cargo run --example allreduce_sum                   # one process, every visible GPU
//! ```
use raft_comms::{group_scope, Communicator, Launch, ReduceOp};
use raft_core::{DeviceResources, DeviceVec};

/// The dataset: the numbers 0..N; rank r of w owns those equal to r modulo w.
const N: u64 = 1 << 24;
const BUCKETS: usize = 16;

/// Rank `rank` of `world`'s part: the histogram of its shard, by value modulo 16.
fn part(rank: usize, world: usize) -> Vec<i64> {
    let mut h = vec![0i64; BUCKETS];
    for x in (rank as u64..N).step_by(world) {
        h[(x % BUCKETS as u64) as usize] += 1;
    }
    h
}

fn check(total: &[i64]) {
    assert!(total.iter().all(|&c| c == (N / BUCKETS as u64) as i64), "wrong histogram: {total:?}");
}

fn main() -> raft_core::Result<()> {
    if let Ok(launch) = Launch::from_env() {
        // One process per GPU, started by a launcher (raft-run, torchrun, mpirun, srun).
        let res = DeviceResources::on_device(launch.device()?)?;
        let comm = Communicator::from_env(&res)?;
        let mut v = DeviceVec::from_host(&res, &part(comm.rank(), comm.size()))?;
        comm.allreduce_in_place(&mut v, ReduceOp::Sum)?;
        comm.sync()?;
        let total = v.to_host()?;
        check(&total);
        println!("rank {} of {}: the {N} values in {BUCKETS} buckets: {:?}", comm.rank(), comm.size(), &total[..4]);
        return comm.release();
    }
    // One process driving every visible GPU: a clique, its calls in one group.
    let devices = raft_core::device_count()?;
    if devices == 0 {
        eprintln!("no GPU: run it on a machine with one, or under raft-run");
        return Ok(());
    }
    let resources: Vec<DeviceResources> = (0..devices).map(DeviceResources::on_device).collect::<raft_core::Result<_>>()?;
    let comms = Communicator::clique(&resources)?;
    let world = comms.len();
    let mut parts: Vec<DeviceVec<i64>> =
        resources.iter().enumerate().map(|(r, res)| DeviceVec::from_host(res, &part(r, world))).collect::<raft_core::Result<_>>()?;
    group_scope(|g| comms.iter().zip(parts.iter_mut()).try_for_each(|(c, p)| g.on(c).allreduce_in_place(p, ReduceOp::Sum)))?;
    for (c, p) in comms.iter().zip(&parts) {
        c.sync()?;
        let total = p.to_host()?;
        check(&total);
        println!("{c}: the {N} values in {BUCKETS} buckets: {:?}", &total[..4]);
    }
    Communicator::release_all(comms)
}
