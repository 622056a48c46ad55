//! NCCL groups (`ncclGroupStart` / `ncclGroupEnd`): several calls fused into one launch, and the
//! way one thread drives a whole clique (each GPU's call would otherwise wait for the others'
//! before the thread could make them).
use crate::result::{self, NativeComm};
use cudarc::driver::CudaStream;
use raft_error::{Error, Result};
use std::cell::RefCell;
use std::sync::Arc;

/// The calling thread's open group: its depth, the communicators used in it, and how calls
/// inside it are vouched for.
#[derive(Default)]
struct Frame {
    depth: usize,
    used: Vec<(Arc<dyn Member>, Arc<CudaStream>)>,
    /// Open `group`s (unsafe: their caller promised the arrays outlive the group).
    unchecked: usize,
    /// A `GroupScope` method is making the call (its arrays are borrowed past the group's end).
    via_scope: bool,
    /// A [`group_scope`](crate::group_scope) is open: an unsafe `group` inside it is refused (its calls would be
    /// launched only when the scope ends, after the inner closure's arrays may be gone).
    scoped: bool,
}

/// A communicator as an open group sees it (its shared state): it names nothing above it.
pub(crate) trait Member: Send + Sync {
    /// The native communicator the group's end waits for.
    fn native(&self) -> &NativeComm;
    /// After the group that used it ended, `failed` when the group's end failed.
    fn group_ended(self: Arc<Self>, failed: Option<&Error>);
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

/// Refuses a collective made inside a [`group_scope`](crate::group_scope) other than through its [`GroupScope`](crate::GroupScope): only
/// those borrow their arrays until the group has ended.
///
/// A scoped call's mark is taken here, by the one collective it vouches for (each
/// `GroupScope` method makes exactly one, and asks this first): user code that runs further
/// inside that call (a logger the library logs to while it takes the arrays' addresses, a panic
/// hook) makes its own collectives unmarked, refused like any other direct call, instead of
/// slipping into the group with arrays it may free before the group's end (the fifteenth audit).
pub(crate) fn check_call(who: &'static str) -> Result<()> {
    let allowed = FRAME.try_with(|f| {
        let mut f = f.borrow_mut();
        let via_scope = std::mem::take(&mut f.via_scope);
        f.depth == 0 || f.unchecked > 0 || via_scope
    });
    if allowed.unwrap_or(true) {
        return Ok(());
    }
    Err(Error::logic(
        who,
        "called directly inside raft_comms::group_scope: collectives in a scoped group go through the scope's GroupScope \
         methods (g.on(&comm).allreduce_in_place, …), which borrow the arrays until the group has launched them",
    ))
}

/// Notes that a communicator was used in the open group (the group's end waits for it and
/// records its event on `stream`); returns whether it is new to the group.
pub(crate) fn used<M: Member + 'static>(member: &Arc<M>, stream: Arc<CudaStream>) -> bool {
    FRAME
        .try_with(|f| {
            let mut f = f.borrow_mut();
            let new = !f.used.iter().any(|(s, _)| std::ptr::addr_eq(Arc::as_ptr(s), Arc::as_ptr(member)));
            if new {
                f.used.push((member.clone(), stream));
            }
            new
        })
        .unwrap_or(false)
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
/// aborted or released (from any thread) before then. [`group_scope`](crate::group_scope) is the safe form.
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

/// The open group, ended exactly once: by [`group`] / [`scoped`] or, when the closure
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
            used.iter().map(|(s, stream)| (s.native(), Some(stream.clone()))).collect();
        // The group's calls were checked against a capture when they were made, but NCCL
        // launches them only here: a capture begun on one of their streams since (by the group's
        // body, or by another thread) would take them into its graph, which would then read and
        // write the arrays at each launch, after the group's borrows end. They cannot be
        // withdrawn from NCCL's group (ending the group launches them; leaving it open leaves
        // NCCL's thread state open), so, as for a capture begun during a copy, the process stops
        // before they are launched; and after, for a capture begun meanwhile on another thread.
        let stop_if_captured = |when: &str| {
            let captured = |s: &Option<Arc<CudaStream>>| s.as_ref().is_some_and(|s| raft_core::stream_is_capturing(s).unwrap_or(false));
            if let Some((_, Some(stream))) = list.iter().find(|(_, s)| captured(s)) {
                raft_exit::abort_with(format_args!(
                    "{WHO}: a CUDA graph capture began on a stream ({:p}) {when}; aborting",
                    stream.cu_stream()
                ));
            }
        };
        stop_if_captured("after the group's collectives were queued on it, before the group's end launched them");
        let ended = result::group_end(WHO, &list);
        stop_if_captured("while the group's end launched its collectives");
        for (member, _) in &used {
            member.clone().group_ended(ended.as_ref().err());
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

/// Runs `call` as a scoped call: the first [`check_call`] inside it, the call's own, is allowed.
pub(crate) fn via_scope<R>(call: impl FnOnce() -> Result<R>) -> Result<R> {
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

/// Runs `calls` as the outermost, scoped group of [`group_scope`](crate::group_scope) (which
/// hands its closure the `GroupScope`).
pub(crate) fn scoped<R>(who: &'static str, calls: impl FnOnce() -> Result<R>) -> Result<R> {
    match FRAME.try_with(|f| f.borrow().depth) {
        Ok(0) => {}
        Ok(_) => {
            return Err(Error::logic(
                who,
                "inside another group: a scoped group must be the outermost (its arrays are borrowed only until it ends)",
            ))
        }
        Err(_) => return Err(Error::logic(who, "called while the thread's locals are being destroyed: no group can be kept track of")),
    }
    result::group_start(who)?;
    let _ = FRAME.try_with(|f| {
        let mut f = f.borrow_mut();
        f.depth += 1;
        f.scoped = true;
    });
    let mut open = Open { ended: false, unchecked: false };
    let out = calls();
    let ended = open.end();
    match (out, ended) {
        (Err(e), _) => Err(e),
        (Ok(_), Err(e)) => Err(e),
        (Ok(r), Ok(())) => Ok(r),
    }
}
