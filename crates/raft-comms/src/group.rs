//! NCCL groups (`ncclGroupStart` / `ncclGroupEnd`): several calls fused into one launch, and the
//! way one thread drives a whole clique (each GPU's call would otherwise wait for the others'
//! before the thread could make them).
use crate::communicator::Shared;
use crate::result;
use cudarc::driver::CudaStream;
use raft_error::{Error, Result};
use std::cell::RefCell;
use std::sync::Arc;

/// The calling thread's open group: its depth, the communicators used in it, and how calls
/// inside it are vouched for.
#[derive(Default)]
struct Frame {
    depth: usize,
    used: Vec<(Arc<Shared>, Arc<CudaStream>)>,
    /// Open `group`s (unsafe: their caller promised the arrays outlive the group).
    unchecked: usize,
    /// A `GroupScope` method is making the call (its arrays are borrowed past the group's end).
    via_scope: bool,
    /// A [`group_scope`] is open: an unsafe `group` inside it is refused (its calls would be
    /// launched only when the scope ends, after the inner closure's arrays may be gone).
    scoped: bool,
}

thread_local! {
    static FRAME: RefCell<Frame> = RefCell::new(Frame::default());
}

/// Whether the calling thread is inside [`group`].
pub(crate) fn active() -> bool {
    FRAME.try_with(|f| f.borrow().depth > 0).unwrap_or(false)
}

/// The `Logic` error of a call that waits, made inside a group (it would wait for work the group
/// has not launched yet).
pub(crate) fn refuse_inside(who: &'static str) -> Result<()> {
    if active() {
        return Err(Error::logic(
            who,
            "called inside raft_comms::group: the group's calls are launched only when the group ends, so a wait \
             inside it would never end; call it after the group",
        ));
    }
    Ok(())
}

/// Refuses a collective made inside a [`group_scope`] other than through its [`GroupScope`]: only
/// those borrow their arrays until the group has ended.
pub(crate) fn check_call(who: &'static str) -> Result<()> {
    let allowed = FRAME.try_with(|f| {
        let f = f.borrow();
        f.depth == 0 || f.unchecked > 0 || f.via_scope
    });
    if allowed.unwrap_or(true) {
        return Ok(());
    }
    Err(Error::logic(
        who,
        "called directly inside raft_comms::group_scope: collectives in a scoped group go through the scope's \
         methods (GroupScope::allreduce_in_place, …), which borrow the arrays until the group has launched them",
    ))
}

/// Notes that a communicator was used in the open group (the group's end waits for it and
/// records its event on `stream`).
pub(crate) fn used(shared: &Arc<Shared>, stream: Arc<CudaStream>) {
    let _ = FRAME.try_with(|f| {
        let mut f = f.borrow_mut();
        if !f.used.iter().any(|(s, _)| Arc::ptr_eq(s, shared)) {
            shared.groups.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
            f.used.push((shared.clone(), stream));
        }
    });
}

/// Runs `calls` as one NCCL group (`ncclGroupStart` … `ncclGroupEnd`) on the calling thread:
/// the collectives made inside on any communicators are launched together when it ends.
///
/// This is how one thread drives a clique ([`Communicator::clique`](crate::Communicator::clique)):
/// make the call of every GPU inside one group. Groups nest (only the outermost launches). The
/// group ends also when `calls` fails or panics; a failed group end aborts the communicators
/// used in it, since their ranks may no longer agree on what ran.
///
/// Inside the group, calls that wait (`sync`, `barrier`, `split`, `release`) are refused: what
/// they would wait for is launched only at the group's end.
///
/// ```no_run
/// # use raft_comms::{Communicator, ReduceOp};
/// # use raft_core::{DeviceResources, DeviceVec};
/// # fn main() -> raft_core::Result<()> {
/// let resources = [DeviceResources::on_device(0)?, DeviceResources::on_device(1)?];
/// let comms = Communicator::clique(&resources)?;
/// let mut data: Vec<DeviceVec<f32>> =
///     resources.iter().map(|r| DeviceVec::from_host(r, &[1.0; 4])).collect::<raft_core::Result<_>>()?;
/// // SAFETY: the arrays of `data` live past the group and nothing else touches them meanwhile.
/// unsafe {
///     raft_comms::group(|| {
///         for (c, d) in comms.iter().zip(data.iter_mut()) {
///             c.allreduce_in_place(d, ReduceOp::Sum)?;
///         }
///         Ok(())
///     })?;
/// }
/// for c in &comms {
///     c.sync()?;
/// }
/// assert_eq!(data[1].to_host()?, [2.0; 4]);
/// # Ok(()) }
/// ```
///
/// # Errors
/// The first error of `calls`, else that of `ncclGroupEnd` (or of waiting for a communicator to
/// take the group's calls, bounded by its timeout).
///
/// # Safety
/// Inside a group NCCL only records the arrays' addresses; it queues the work on their streams
/// when the outermost group ends. Every array passed to a collective inside `calls` must
/// therefore stay alive (not dropped, not moved into something that frees it) and must not be
/// written by other work until the outermost group has ended (`group` returned, when it is not
/// nested in another): an array freed inside the closure would be given back to its
/// pool before NCCL's kernel writes into it. Likewise every communicator used inside must not be
/// aborted or released (from any thread) before then. [`group_scope`] is the safe form.
pub unsafe fn group<R>(calls: impl FnOnce() -> Result<R>) -> Result<R> {
    const WHO: &str = "raft_comms::group";
    if FRAME.try_with(|f| f.borrow().scoped).unwrap_or(false) {
        return Err(Error::logic(WHO, "inside raft_comms::group_scope: make the calls through the scope's GroupScope"));
    }
    let outermost = !active();
    if outermost {
        result::group_start(WHO)?;
    }
    let _ = FRAME.try_with(|f| {
        let mut f = f.borrow_mut();
        f.depth += 1;
        f.unchecked += 1;
    });
    let mut open = Open { ended: false, unchecked: true };
    let out = calls();
    let ended = open.end();
    match (out, ended) {
        (Err(e), _) => Err(e),
        (Ok(_), Err(e)) => Err(e),
        (Ok(r), Ok(())) => Ok(r),
    }
}

/// The open group, ended exactly once: by [`group`] / [`group_scope`] or, when the closure
/// panics, by Drop.
struct Open {
    ended: bool,
    /// Opened by the unsafe [`group`].
    unchecked: bool,
}

impl Open {
    fn end(&mut self) -> Result<()> {
        const WHO: &str = "raft_comms::group";
        self.ended = true;
        let unchecked = self.unchecked;
        let (depth, used) = FRAME
            .try_with(|f| {
                let mut f = f.borrow_mut();
                f.depth = f.depth.saturating_sub(1);
                if unchecked {
                    f.unchecked = f.unchecked.saturating_sub(1);
                } else {
                    f.scoped = false;
                }
                (f.depth, if f.depth == 0 { std::mem::take(&mut f.used) } else { Vec::new() })
            })
            .unwrap_or((0, Vec::new()));
        if depth > 0 {
            return Ok(());
        }
        let list: Vec<(&crate::result::NativeComm, Option<Arc<CudaStream>>)> =
            used.iter().map(|(s, stream)| (&s.native, Some(stream.clone()))).collect();
        let ended = result::group_end(WHO, &list);
        for (shared, _) in &used {
            shared.after_group(ended.as_ref().err());
        }
        ended
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        if !self.ended {
            if let Err(e) = self.end() {
                log::warn!(target: "raft", "{e}");
            }
        }
    }
}

/// [`group`] without `unsafe`: one NCCL group whose collectives go through the [`GroupScope`]
/// the closure receives, whose methods borrow every array for `'env`, past the group's end (when
/// NCCL queues the work). An array made and dropped inside the closure cannot be handed to them,
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
///         g.allreduce_in_place(c, d, ReduceOp::Sum)?;
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
///     g.allreduce_in_place(c, &mut tmp, ReduceOp::Sum) // error: `tmp` dies before the group ends
/// })?;
/// # Ok(()) }
/// ```
///
/// # Errors
/// `Logic` inside another group (a scoped group launches at its own end, which a group around it
/// would postpone past the borrows); otherwise as [`group`].
pub fn group_scope<'env, F, R>(calls: F) -> Result<R>
where
    F: for<'scope> FnOnce(&'scope GroupScope<'scope, 'env>) -> Result<R>,
{
    const WHO: &str = "raft_comms::group_scope";
    match FRAME.try_with(|f| f.borrow().depth) {
        Ok(0) => {}
        Ok(_) => {
            return Err(Error::logic(
                WHO,
                "inside another group: a scoped group must be the outermost (its arrays are borrowed only until it ends)",
            ))
        }
        Err(_) => return Err(Error::logic(WHO, "called while the thread's locals are being destroyed: no group can be kept track of")),
    }
    result::group_start(WHO)?;
    let _ = FRAME.try_with(|f| {
        let mut f = f.borrow_mut();
        f.depth += 1;
        f.scoped = true;
    });
    let mut open = Open { ended: false, unchecked: false };
    let scope = GroupScope { _scope: std::marker::PhantomData, _env: std::marker::PhantomData };
    let out = calls(&scope);
    let ended = open.end();
    match (out, ended) {
        (Err(e), _) => Err(e),
        (Ok(_), Err(e)) => Err(e),
        (Ok(r), Ok(())) => Ok(r),
    }
}

/// The collectives of a [`group_scope`]: each borrows its arrays and its communicator for
/// `'env`, which outlives the group, and is queued when the group ends. A communicator used in
/// the group can therefore not be moved away (to another thread that aborts or releases it,
/// say) before the group has ended:
///
/// ```compile_fail,E0597
/// # use raft_comms::{Communicator, ReduceOp};
/// # use raft_core::DeviceVec;
/// # fn f(c: Communicator, buf: &mut DeviceVec<f32>) -> raft_core::Result<()> {
/// raft_comms::group_scope(|g| {
///     g.allreduce_in_place(&c, buf, ReduceOp::Sum)?;
///     std::thread::spawn(move || c.abort()).join().unwrap() // error: `c` is borrowed until the group ends
/// })?;
/// # Ok(()) }
/// ```
pub struct GroupScope<'scope, 'env: 'scope> {
    _scope: std::marker::PhantomData<&'scope mut &'scope ()>,
    _env: std::marker::PhantomData<&'env mut &'env ()>,
}

/// Runs `call` as a scoped call (allowed by [`check_call`]).
fn via_scope<R>(call: impl FnOnce() -> Result<R>) -> Result<R> {
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            let _ = FRAME.try_with(|f| f.borrow_mut().via_scope = false);
        }
    }
    let _ = FRAME.try_with(|f| f.borrow_mut().via_scope = true);
    let _reset = Reset;
    call()
}

use crate::communicator::Communicator;
use crate::dtype::{NcclType, ReduceOp};
use raft_core::DeviceVec;

impl<'scope, 'env> GroupScope<'scope, 'env> {
    /// [`Communicator::allreduce`] in the group.
    pub fn allreduce<T: NcclType>(
        &self,
        c: &'env Communicator,
        send: &'env DeviceVec<T>,
        recv: &'env mut DeviceVec<T>,
        op: ReduceOp,
    ) -> Result<()> {
        via_scope(|| c.allreduce(send, recv, op))
    }
    /// [`Communicator::allreduce_in_place`] in the group.
    pub fn allreduce_in_place<T: NcclType>(&self, c: &'env Communicator, buf: &'env mut DeviceVec<T>, op: ReduceOp) -> Result<()> {
        via_scope(|| c.allreduce_in_place(buf, op))
    }
    /// [`Communicator::broadcast`] in the group.
    pub fn broadcast<T: NcclType>(
        &self,
        c: &'env Communicator,
        send: &'env DeviceVec<T>,
        recv: &'env mut DeviceVec<T>,
        root: usize,
    ) -> Result<()> {
        via_scope(|| c.broadcast(send, recv, root))
    }
    /// [`Communicator::broadcast_in_place`] in the group.
    pub fn broadcast_in_place<T: NcclType>(&self, c: &'env Communicator, buf: &'env mut DeviceVec<T>, root: usize) -> Result<()> {
        via_scope(|| c.broadcast_in_place(buf, root))
    }
    /// [`Communicator::reduce`] in the group.
    pub fn reduce<T: NcclType>(
        &self,
        c: &'env Communicator,
        send: &'env DeviceVec<T>,
        recv: Option<&'env mut DeviceVec<T>>,
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        via_scope(|| c.reduce(send, recv, op, root))
    }
    /// [`Communicator::allgather`] in the group.
    pub fn allgather<T: NcclType>(&self, c: &'env Communicator, send: &'env DeviceVec<T>, recv: &'env mut DeviceVec<T>) -> Result<()> {
        via_scope(|| c.allgather(send, recv))
    }
    /// [`Communicator::allgatherv`] in the group.
    pub fn allgatherv<T: NcclType>(
        &self,
        c: &'env Communicator,
        send: &'env DeviceVec<T>,
        recv: &'env mut DeviceVec<T>,
        counts: &[usize],
    ) -> Result<()> {
        via_scope(|| c.allgatherv(send, recv, counts))
    }
    /// [`Communicator::gather`] in the group.
    pub fn gather<T: NcclType>(
        &self,
        c: &'env Communicator,
        send: &'env DeviceVec<T>,
        recv: Option<&'env mut DeviceVec<T>>,
        root: usize,
    ) -> Result<()> {
        via_scope(|| c.gather(send, recv, root))
    }
    /// [`Communicator::reduce_scatter`] in the group.
    pub fn reduce_scatter<T: NcclType>(
        &self,
        c: &'env Communicator,
        send: &'env DeviceVec<T>,
        recv: &'env mut DeviceVec<T>,
        op: ReduceOp,
    ) -> Result<()> {
        via_scope(|| c.reduce_scatter(send, recv, op))
    }
    /// [`Communicator::send`] in the group.
    pub fn send<T: NcclType>(&self, c: &'env Communicator, buf: &'env DeviceVec<T>, peer: usize) -> Result<()> {
        via_scope(|| c.send(buf, peer))
    }
    /// [`Communicator::recv`] in the group.
    pub fn recv<T: NcclType>(&self, c: &'env Communicator, buf: &'env mut DeviceVec<T>, peer: usize) -> Result<()> {
        via_scope(|| c.recv(buf, peer))
    }
    /// [`Communicator::sendrecv`] in the group.
    pub fn sendrecv<T: NcclType>(
        &self,
        c: &'env Communicator,
        send: &'env DeviceVec<T>,
        dest: usize,
        recv: &'env mut DeviceVec<T>,
        source: usize,
    ) -> Result<()> {
        via_scope(|| c.sendrecv(send, dest, recv, source))
    }
}
