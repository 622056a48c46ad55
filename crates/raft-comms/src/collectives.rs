//! The collectives and point-to-point calls of a [`Communicator`], on `DeviceVec`s of its
//! resources, enqueued on their stream. Each checks its counts ([`crate::counts`]) and that the
//! arrays belong to the communicator's resources before NCCL is called; none waits (see
//! [`Communicator::sync`]).
use crate::communicator::Communicator;
use crate::dtype::{NcclType, ReduceOp};
use raft_core::DeviceVec;
use raft_error::Result;

impl Communicator {
    /// `recv = op` over every rank's `send` (`ncclAllReduce`); `send` and `recv` have the same
    /// length here and on every rank.
    ///
    /// # Errors
    /// `Logic` before NCCL is called: lengths differ, an array of other resources, an ended
    /// communicator; `Generic` / `Cuda` when NCCL fails (the communicator is then aborted).
    pub fn allreduce<T: NcclType>(&self, send: &DeviceVec<T>, recv: &mut DeviceVec<T>, op: ReduceOp) -> Result<()> {
        const WHO: &str = "Communicator::allreduce";
        self.shared().enqueue(WHO, |n, s, mark| n.allreduce(WHO, send, recv, op, s, mark))
    }

    /// [`allreduce`](Self::allreduce) in place: `buf = op` over every rank's `buf`.
    ///
    /// # Errors
    /// As [`allreduce`](Self::allreduce).
    pub fn allreduce_in_place<T: NcclType>(&self, buf: &mut DeviceVec<T>, op: ReduceOp) -> Result<()> {
        const WHO: &str = "Communicator::allreduce_in_place";
        self.shared().enqueue(WHO, |n, s, mark| n.allreduce_in_place(WHO, buf, op, s, mark))
    }

    /// Every rank's `recv` = the root's `send` (`ncclBroadcast`; `send` is read on the root
    /// only, but must have `recv`'s length everywhere).
    ///
    /// # Errors
    /// `Logic` for a root that is not a rank, lengths that differ, an array of other resources;
    /// else as [`allreduce`](Self::allreduce).
    pub fn broadcast<T: NcclType>(&self, send: &DeviceVec<T>, recv: &mut DeviceVec<T>, root: usize) -> Result<()> {
        const WHO: &str = "Communicator::broadcast";
        let world = self.size();
        self.shared().enqueue(WHO, |n, s, mark| n.broadcast(WHO, world, Some(send), recv, root, s, mark))
    }

    /// [`broadcast`](Self::broadcast) in place: every rank's `buf` = the root's.
    ///
    /// # Errors
    /// As [`broadcast`](Self::broadcast).
    pub fn broadcast_in_place<T: NcclType>(&self, buf: &mut DeviceVec<T>, root: usize) -> Result<()> {
        const WHO: &str = "Communicator::broadcast_in_place";
        let world = self.size();
        self.shared().enqueue(WHO, |n, s, mark| n.broadcast(WHO, world, None, buf, root, s, mark))
    }

    /// The root's `recv` = `op` over every rank's `send` (`ncclReduce`). The root passes a
    /// receive array of `send`'s length; the others may pass `None` (theirs is not touched).
    ///
    /// # Errors
    /// `Logic` for a root that is not a rank, a root without a receive array, lengths that
    /// differ; else as [`allreduce`](Self::allreduce).
    pub fn reduce<T: NcclType>(&self, send: &DeviceVec<T>, recv: Option<&mut DeviceVec<T>>, op: ReduceOp, root: usize) -> Result<()> {
        const WHO: &str = "Communicator::reduce";
        let at = (self.size(), self.rank());
        self.shared().enqueue(WHO, |n, s, mark| n.reduce(WHO, at, send, recv, op, root, s, mark))
    }

    /// `recv` = every rank's `send`, one after another in rank order (`ncclAllGather`): `recv`
    /// holds `size() × send.len()` elements.
    ///
    /// # Errors
    /// `Logic` when `recv` has another length; else as [`allreduce`](Self::allreduce).
    pub fn allgather<T: NcclType>(&self, send: &DeviceVec<T>, recv: &mut DeviceVec<T>) -> Result<()> {
        const WHO: &str = "Communicator::allgather";
        let world = self.size();
        self.shared().enqueue(WHO, |n, s, mark| n.allgather(WHO, world, send, recv, s, mark))
    }

    /// [`allgather`](Self::allgather) with a count per rank: rank r sends `counts[r]` elements,
    /// and `recv` holds them all in rank order (`counts.iter().sum()` elements). Made of one
    /// `ncclBroadcast` per rank in one group, as RAFT's own does.
    ///
    /// # Errors
    /// `Logic` when `counts` does not have one entry per rank, this rank's entry is not
    /// `send.len()`, `recv` does not hold their sum, or the communicator has more than 2048
    /// ranks (the shim issues one broadcast per rank in one NCCL group, and refuses more);
    /// else as [`allreduce`](Self::allreduce).
    pub fn allgatherv<T: NcclType>(&self, send: &DeviceVec<T>, recv: &mut DeviceVec<T>, counts: &[usize]) -> Result<()> {
        const WHO: &str = "Communicator::allgatherv";
        let at = (self.size(), self.rank());
        self.shared().enqueue(WHO, |n, s, mark| n.allgatherv(WHO, at, send, recv, counts, s, mark))
    }

    /// The root's `recv` = every rank's `send` in rank order (`ncclSend` / `ncclRecv` in a group):
    /// the root passes a receive array of `size() × send.len()` elements; the others' is ignored.
    ///
    /// # Errors
    /// `Logic` for a root that is not a rank, a root without a receive array of that length;
    /// else as [`allreduce`](Self::allreduce).
    pub fn gather<T: NcclType>(&self, send: &DeviceVec<T>, recv: Option<&mut DeviceVec<T>>, root: usize) -> Result<()> {
        const WHO: &str = "Communicator::gather";
        let at = (self.size(), self.rank());
        self.shared().enqueue(WHO, |n, s, mark| n.gather(WHO, at, send, recv, root, s, mark))
    }

    /// `recv` = this rank's block of `op` over every rank's `send` (`ncclReduceScatter`):
    /// `send` holds `size() × recv.len()` elements; rank r gets block r.
    ///
    /// # Errors
    /// `Logic` when `send` has another length; else as [`allreduce`](Self::allreduce).
    pub fn reduce_scatter<T: NcclType>(&self, send: &DeviceVec<T>, recv: &mut DeviceVec<T>, op: ReduceOp) -> Result<()> {
        const WHO: &str = "Communicator::reduce_scatter";
        let world = self.size();
        self.shared().enqueue(WHO, |n, s, mark| n.reduce_scatter(WHO, world, send, recv, op, s, mark))
    }

    /// Sends `buf` to `peer` (`ncclSend`), which must [`recv`](Self::recv) as many elements.
    /// When this rank also receives, use [`sendrecv`](Self::sendrecv) (or a
    /// [`group`](crate::group)): a lone send and receive in opposite directions deadlock.
    ///
    /// # Errors
    /// `Logic` for a peer that is not a rank, or is this rank (to itself, use
    /// [`sendrecv`](Self::sendrecv) both ways); else as [`allreduce`](Self::allreduce).
    pub fn send<T: NcclType>(&self, buf: &DeviceVec<T>, peer: usize) -> Result<()> {
        const WHO: &str = "Communicator::send";
        let at = (self.size(), self.rank());
        self.shared().enqueue(WHO, |n, s, mark| n.send(WHO, at, buf, peer, s, mark))
    }

    /// Receives `buf.len()` elements from `peer` (`ncclRecv`).
    ///
    /// # Errors
    /// As [`send`](Self::send).
    pub fn recv<T: NcclType>(&self, buf: &mut DeviceVec<T>, peer: usize) -> Result<()> {
        const WHO: &str = "Communicator::recv";
        let at = (self.size(), self.rank());
        self.shared().enqueue(WHO, |n, s, mark| n.recv(WHO, at, buf, peer, s, mark))
    }

    /// Sends `send` to `dest` and receives `recv` from `source` in one group (no deadlock). To
    /// this rank itself only both ways at once, with arrays of one length (NCCL copies the send
    /// into the receive array with the send's count).
    ///
    /// # Errors
    /// `Logic` for a peer that is not a rank, for this rank as one peer but not the other, and
    /// for arrays of two lengths to this rank itself; else as [`allreduce`](Self::allreduce).
    pub fn sendrecv<T: NcclType>(&self, send: &DeviceVec<T>, dest: usize, recv: &mut DeviceVec<T>, source: usize) -> Result<()> {
        const WHO: &str = "Communicator::sendrecv";
        let at = (self.size(), self.rank());
        self.shared().enqueue(WHO, |n, s, mark| n.sendrecv(WHO, at, send, dest, recv, source, s, mark))
    }
}
