//! The checks every collective makes on its counts before NCCL is called: NCCL trusts the counts
//! it is given and reads or writes that many elements, so a count that does not match the arrays
//! would let it run past an allocation. Each [`Communicator`](crate::Communicator) method calls
//! the check of its collective first; they are public so that a program can check its own sizes
//! up front (and so that they can be tested without a GPU).
//!
//! What no local check can see: that the *other* ranks pass matching counts (NCCL requires the
//! same count on every rank of a collective, and matching counts between a send and its
//! receive). That agreement is the program's, as in MPI; see `docs/COMMS.md`.
use raft_error::{Error, Result};

fn logic(who: &'static str, message: String) -> Error {
    Error::logic(who, message)
}

/// `world × per_rank`, or the error of a product that does not fit in memory.
fn times(who: &'static str, world: usize, per_rank: usize) -> Result<usize> {
    world.checked_mul(per_rank).ok_or_else(|| logic(who, format!("{world} ranks × {per_rank} elements does not fit in memory")))
}

/// A rank number below the world size.
pub fn rank_in(who: &'static str, what: &str, world: usize, rank: usize) -> Result<()> {
    if rank >= world {
        return Err(logic(who, format!("{what} {rank} is not a rank of a communicator of {world}")));
    }
    Ok(())
}

/// Allreduce: the receive array holds as many elements as the send array.
pub fn allreduce(send: usize, recv: usize) -> Result<()> {
    const WHO: &str = "counts::allreduce";
    if send != recv {
        return Err(logic(WHO, format!("the send array has {send} elements, the receive array {recv}: they must be equal")));
    }
    Ok(())
}

/// Broadcast: a root among the ranks, arrays of equal length.
pub fn broadcast(world: usize, root: usize, send: usize, recv: usize) -> Result<()> {
    const WHO: &str = "counts::broadcast";
    rank_in(WHO, "root", world, root)?;
    if send != recv {
        return Err(logic(WHO, format!("the send array has {send} elements, the receive array {recv}: they must be equal")));
    }
    Ok(())
}

/// Reduce: a root among the ranks; on the root (`recv` given) the receive array holds as many
/// elements as the send array; the root must give one.
pub fn reduce(world: usize, rank: usize, root: usize, send: usize, recv: Option<usize>) -> Result<()> {
    const WHO: &str = "counts::reduce";
    rank_in(WHO, "root", world, root)?;
    match recv {
        Some(recv) if recv != send => {
            Err(logic(WHO, format!("the send array has {send} elements, the receive array {recv}: they must be equal")))
        }
        None if rank == root => Err(logic(WHO, format!("rank {rank} is the root: it needs a receive array of {send} elements"))),
        _ => Ok(()),
    }
}

/// Allgather: the receive array holds `world × send` elements.
pub fn allgather(world: usize, send: usize, recv: usize) -> Result<()> {
    const WHO: &str = "counts::allgather";
    let want = times(WHO, world, send)?;
    if recv != want {
        return Err(logic(WHO, format!("the receive array has {recv} elements; {world} ranks × {send} sent elements need exactly {want}")));
    }
    Ok(())
}

/// Allgatherv: one count per rank, this rank's count is its send array's length, and the receive
/// array holds their sum. Returns where each rank's block starts in the receive array.
pub fn allgatherv(world: usize, rank: usize, counts: &[usize], send: usize, recv: usize) -> Result<Vec<usize>> {
    const WHO: &str = "counts::allgatherv";
    rank_in(WHO, "rank", world, rank)?;
    if counts.len() != world {
        return Err(logic(WHO, format!("{} counts given for a communicator of {world}: one per rank is needed", counts.len())));
    }
    if counts[rank] != send {
        return Err(logic(WHO, format!("this rank ({rank}) sends {send} elements but its count says {}", counts[rank])));
    }
    let mut displs = Vec::with_capacity(world);
    let mut total = 0usize;
    for &c in counts {
        displs.push(total);
        total = total.checked_add(c).ok_or_else(|| logic(WHO, "the counts add up to more than fits in memory".to_string()))?;
    }
    if recv != total {
        return Err(logic(WHO, format!("the receive array has {recv} elements; the counts add up to {total}")));
    }
    Ok(displs)
}

/// Gather: a root among the ranks; the root gives a receive array of `world × send` elements.
pub fn gather(world: usize, rank: usize, root: usize, send: usize, recv: Option<usize>) -> Result<()> {
    const WHO: &str = "counts::gather";
    rank_in(WHO, "root", world, root)?;
    if rank != root {
        return Ok(());
    }
    let want = times(WHO, world, send)?;
    match recv {
        Some(recv) if recv == want => Ok(()),
        Some(recv) => Err(logic(
            WHO,
            format!("the root's receive array has {recv} elements; {world} ranks × {send} sent elements need exactly {want}"),
        )),
        None => Err(logic(WHO, format!("rank {rank} is the root: it needs a receive array of {want} elements"))),
    }
}

/// Reduce-scatter: the send array holds `world × recv` elements.
pub fn reduce_scatter(world: usize, send: usize, recv: usize) -> Result<()> {
    const WHO: &str = "counts::reduce_scatter";
    let want = times(WHO, world, recv)?;
    if send != want {
        return Err(logic(
            WHO,
            format!("the send array has {send} elements; {world} ranks × {recv} received elements need exactly {want}"),
        ));
    }
    Ok(())
}

/// Send or receive on rank `rank`: a peer among the ranks, and not `rank` itself. NCCL pairs a
/// send to self with a receive from self in its group and copies the **send's** byte count into
/// the receive's array, unchecked: a lone send or receive to self would pair with another
/// call's in the same group (or fail at the group's end, ending the communicator).
pub fn peer(world: usize, rank: usize, peer: usize) -> Result<()> {
    const WHO: &str = "counts::peer";
    rank_in(WHO, "peer", world, peer)?;
    if peer == rank {
        return Err(logic(
            WHO,
            format!("peer {peer} is this rank: a send or receive to itself goes through sendrecv, with this rank as both peers and arrays of one length"),
        ));
    }
    Ok(())
}

/// Sendrecv on rank `rank`: both peers ranks; to itself only both ways at once, with the send
/// and receive arrays of one length (NCCL copies the send's count into the receive's array,
/// see [`peer`]; each such call then pairs its own two, in NCCL's order, within any group).
pub fn sendrecv(world: usize, rank: usize, dest: usize, source: usize, send: usize, recv: usize) -> Result<()> {
    const WHO: &str = "counts::sendrecv";
    rank_in(WHO, "peer", world, dest)?;
    rank_in(WHO, "peer", world, source)?;
    match (dest == rank, source == rank) {
        (false, false) => Ok(()),
        (true, true) if send == recv => Ok(()),
        (true, true) => Err(logic(
            WHO,
            format!("a sendrecv to this rank itself copies the send array's {send} elements into the receive array of {recv}: they must be equal"),
        )),
        _ => Err(logic(
            WHO,
            format!("rank {rank} sends to {dest} and receives from {source}: to itself only both ways at once (NCCL pairs a send to self with whichever receive from self is queued)"),
        )),
    }
}

/// Communicator ranks and sizes are `int` in NCCL.
pub(crate) fn as_int(who: &'static str, what: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| logic(who, format!("{what} {v} is more than NCCL's int holds")))
}
