//! The safe NCCL group: [`group_scope`] and its [`GroupScope`], whose collectives borrow their
//! arrays and communicators past the group's end. Above `communicator.rs` (its methods are the
//! communicator's collectives); the group bookkeeping itself is `group.rs`.
use crate::communicator::Communicator;
use crate::dtype::{NcclType, ReduceOp};
use crate::group;
use raft_core::DeviceVec;
use raft_error::Result;

/// [`group`](crate::group) without `unsafe`: one NCCL group whose collectives go through the
/// [`GroupScope`] the closure receives, whose methods borrow every array for `'env`, past the
/// group's end (when NCCL queues the work). An array made and dropped inside the closure cannot be handed to them,
/// and a collective called directly on a communicator inside is refused (`Logic`), so nothing
/// NCCL will read or write can be freed before it has been queued on its stream. Once queued,
/// the arrays' own frees are ordered after it on that stream.
///
/// ```no_run
/// # use raft_comms::{Communicator, ReduceOp};
/// # use raft_core::{DeviceResources, DeviceVec};
/// # fn main() -> raft_core::Result<()> {
/// let resources = [DeviceResources::on_device(0)?, DeviceResources::on_device(1)?];
/// let comms = Communicator::clique(&resources)?;
/// let mut data: Vec<DeviceVec<f32>> =
///     resources.iter().map(|r| DeviceVec::from_host(r, &[1.0; 4])).collect::<raft_core::Result<_>>()?;
/// raft_comms::group_scope(|g| {
///     for (c, d) in comms.iter().zip(data.iter_mut()) {
///         g.on(c).allreduce_in_place(d, ReduceOp::Sum)?;
///     }
///     Ok(())
/// })?;
/// for c in &comms {
///     c.sync()?;
/// }
/// assert_eq!(data[1].to_host()?, [2.0; 4]);
/// # Ok(()) }
/// ```
///
/// An array that does not outlive the group is refused by the compiler:
///
/// ```compile_fail,E0597
/// # use raft_comms::{Communicator, ReduceOp};
/// # use raft_core::{DeviceResources, DeviceVec};
/// # fn f(res: &DeviceResources, c: &Communicator) -> raft_core::Result<()> {
/// raft_comms::group_scope(|g| {
///     let mut tmp = DeviceVec::<f32>::zeros(res, 4)?;
///     g.on(c).allreduce_in_place(&mut tmp, ReduceOp::Sum) // error: `tmp` dies before the group ends
/// })?;
/// # Ok(()) }
/// ```
///
/// # Errors
/// `Logic` inside another group (a scoped group launches at its own end, which a group around it
/// would postpone past the borrows); otherwise as [`group`](crate::group).
pub fn group_scope<'env, F, R>(calls: F) -> Result<R>
where
    F: for<'scope> FnOnce(&'scope GroupScope<'scope, 'env>) -> Result<R>,
{
    const WHO: &str = "raft_comms::group_scope";
    let scope = GroupScope { _scope: std::marker::PhantomData, _env: std::marker::PhantomData, _thread: std::marker::PhantomData };
    group::scoped(WHO, || calls(&scope))
}

/// The handle of a [`group_scope`]: [`on`](Self::on) gives a communicator's collectives, each
/// borrowing its arrays and the communicator for `'env`, which outlives the group, and queued
/// when the group ends. A communicator used in
/// the group can therefore not be moved away (to another thread that aborts or releases it,
/// say) before the group has ended:
///
/// ```compile_fail,E0597
/// # use raft_comms::{Communicator, ReduceOp};
/// # use raft_core::DeviceVec;
/// # fn f(c: Communicator, buf: &mut DeviceVec<f32>) -> raft_core::Result<()> {
/// raft_comms::group_scope(|g| {
///     g.on(&c).allreduce_in_place(buf, ReduceOp::Sum)?;
///     std::thread::spawn(move || c.abort()).join().unwrap() // error: `c` is borrowed until the group ends
/// })?;
/// # Ok(()) }
/// ```
///
/// The group is the calling thread's (NCCL's `ncclGroupStart` is per thread), so the scope
/// stays on it: a collective made through it on another thread would run at once, outside the
/// group (the sixteenth audit).
///
/// ```compile_fail,E0277
/// # use raft_comms::{Communicator, ReduceOp};
/// # use raft_core::DeviceVec;
/// # fn f(c: Communicator, buf: &mut DeviceVec<f32>) -> raft_core::Result<()> {
/// raft_comms::group_scope(|g| {
///     std::thread::scope(|s| {
///         s.spawn(|| g.on(&c).allreduce_in_place(buf, ReduceOp::Sum)); // error: `GroupScope` is not `Sync`
///     });
///     Ok(())
/// })?;
/// # Ok(()) }
/// ```
pub struct GroupScope<'scope, 'env: 'scope> {
    _scope: std::marker::PhantomData<&'scope mut &'scope ()>,
    _env: std::marker::PhantomData<&'env mut &'env ()>,
    /// Neither `Send` nor `Sync`: the group is this thread's.
    _thread: std::marker::PhantomData<*const ()>,
}

impl<'scope, 'env> GroupScope<'scope, 'env> {
    /// The collectives of `comm` in this group: `g.on(&comm).allreduce_in_place(&mut buf, op)`.
    /// The communicator is borrowed for `'env`, past the group's end, as are the arrays.
    pub fn on(&'scope self, comm: &'env Communicator) -> ScopedComm<'scope, 'env> {
        ScopedComm { _scope: self, comm }
    }
}

/// One communicator's collectives in a [`group_scope`] ([`GroupScope::on`]): each borrows its
/// arrays for `'env`, which outlives the group, and is queued when the group ends. It cannot
/// leave the closure (it borrows the scope).
pub struct ScopedComm<'scope, 'env: 'scope> {
    _scope: &'scope GroupScope<'scope, 'env>,
    comm: &'env Communicator,
}

impl<'scope, 'env> ScopedComm<'scope, 'env> {
    /// [`Communicator::allreduce`] in the group.
    pub fn allreduce<T: NcclType>(&self, send: &'env DeviceVec<T>, recv: &'env mut DeviceVec<T>, op: ReduceOp) -> Result<()> {
        group::via_scope(|| self.comm.allreduce(send, recv, op))
    }
    /// [`Communicator::allreduce_in_place`] in the group.
    pub fn allreduce_in_place<T: NcclType>(&self, buf: &'env mut DeviceVec<T>, op: ReduceOp) -> Result<()> {
        group::via_scope(|| self.comm.allreduce_in_place(buf, op))
    }
    /// [`Communicator::broadcast`] in the group.
    pub fn broadcast<T: NcclType>(&self, send: &'env DeviceVec<T>, recv: &'env mut DeviceVec<T>, root: usize) -> Result<()> {
        group::via_scope(|| self.comm.broadcast(send, recv, root))
    }
    /// [`Communicator::broadcast_in_place`] in the group.
    pub fn broadcast_in_place<T: NcclType>(&self, buf: &'env mut DeviceVec<T>, root: usize) -> Result<()> {
        group::via_scope(|| self.comm.broadcast_in_place(buf, root))
    }
    /// [`Communicator::reduce`] in the group.
    pub fn reduce<T: NcclType>(
        &self,
        send: &'env DeviceVec<T>,
        recv: Option<&'env mut DeviceVec<T>>,
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        group::via_scope(|| self.comm.reduce(send, recv, op, root))
    }
    /// [`Communicator::allgather`] in the group.
    pub fn allgather<T: NcclType>(&self, send: &'env DeviceVec<T>, recv: &'env mut DeviceVec<T>) -> Result<()> {
        group::via_scope(|| self.comm.allgather(send, recv))
    }
    /// [`Communicator::allgatherv`] in the group.
    pub fn allgatherv<T: NcclType>(&self, send: &'env DeviceVec<T>, recv: &'env mut DeviceVec<T>, counts: &[usize]) -> Result<()> {
        group::via_scope(|| self.comm.allgatherv(send, recv, counts))
    }
    /// [`Communicator::gather`] in the group.
    pub fn gather<T: NcclType>(&self, send: &'env DeviceVec<T>, recv: Option<&'env mut DeviceVec<T>>, root: usize) -> Result<()> {
        group::via_scope(|| self.comm.gather(send, recv, root))
    }
    /// [`Communicator::reduce_scatter`] in the group.
    pub fn reduce_scatter<T: NcclType>(&self, send: &'env DeviceVec<T>, recv: &'env mut DeviceVec<T>, op: ReduceOp) -> Result<()> {
        group::via_scope(|| self.comm.reduce_scatter(send, recv, op))
    }
    /// [`Communicator::send`] in the group.
    pub fn send<T: NcclType>(&self, buf: &'env DeviceVec<T>, peer: usize) -> Result<()> {
        group::via_scope(|| self.comm.send(buf, peer))
    }
    /// [`Communicator::recv`] in the group.
    pub fn recv<T: NcclType>(&self, buf: &'env mut DeviceVec<T>, peer: usize) -> Result<()> {
        group::via_scope(|| self.comm.recv(buf, peer))
    }
    /// [`Communicator::sendrecv`] in the group.
    pub fn sendrecv<T: NcclType>(&self, send: &'env DeviceVec<T>, dest: usize, recv: &'env mut DeviceVec<T>, source: usize) -> Result<()> {
        group::via_scope(|| self.comm.sendrecv(send, dest, recv, source))
    }
}
