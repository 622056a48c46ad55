//! NCCL groups (`ncclGroupStart` / `ncclGroupEnd`): several calls fused into one launch, and the
//! way one thread drives a whole clique (each GPU's call would otherwise wait for the others'
//! before the thread could make them).
use crate::communicator::Shared;
use crate::result;
use cudarc::driver::CudaStream;
use raft_error::{Error, Result};
use std::cell::RefCell;
use std::sync::Arc;

/// The calling thread's open group: its depth and the communicators used in it.
#[derive(Default)]
struct Frame {
    depth: usize,
    used: Vec<(Arc<Shared>, Arc<CudaStream>)>,
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
/// when the group ends. Every array passed to a collective inside `calls` must therefore stay
/// alive (not dropped, not moved into something that frees it) and must not be written by other
/// work until `group` has returned: an array freed inside the closure would be given back to its
/// pool before NCCL's kernel writes into it. (A scoped form whose closure can only borrow arrays
/// for the whole group, as `copy_scope` does for copies, would make this safe; it does not
/// exist yet.)
pub unsafe fn group<R>(calls: impl FnOnce() -> Result<R>) -> Result<R> {
    const WHO: &str = "raft_comms::group";
    let outermost = !active();
    if outermost {
        result::group_start(WHO)?;
    }
    let _ = FRAME.try_with(|f| f.borrow_mut().depth += 1);
    let mut open = Open { ended: false };
    let out = calls();
    let ended = open.end();
    match (out, ended) {
        (Err(e), _) => Err(e),
        (Ok(_), Err(e)) => Err(e),
        (Ok(r), Ok(())) => Ok(r),
    }
}

/// The open group, ended exactly once: by [`group`] or, when `calls` panics, by Drop.
struct Open {
    ended: bool,
}

impl Open {
    fn end(&mut self) -> Result<()> {
        const WHO: &str = "raft_comms::group";
        self.ended = true;
        let (depth, used) = FRAME
            .try_with(|f| {
                let mut f = f.borrow_mut();
                f.depth = f.depth.saturating_sub(1);
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
