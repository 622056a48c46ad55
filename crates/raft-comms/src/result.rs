//! The result layer: one checked function per shim entry point past loading, holding their FFI
//! `unsafe` and the status check (as raft-core's `result` module does for raft-sys's shim). The
//! crate's only other `unsafe` blocks load the shim and libnccl and read its last error
//! (`load.rs`, `sys.rs`), and handle `raft-run`'s signals.
//!
//! [`NativeComm`] owns one shim handle. Every function that hands device memory to NCCL takes
//! `DeviceVec`s, checks their counts ([`crate::counts`]) and that they are ordered on the stream
//! the call runs on, and only then makes the call: nothing above this module can hand NCCL a
//! pointer or a count.
use crate::counts;
use crate::dtype::{code_of, NcclType, ReduceOp};
use crate::load::{loaded, take_last_error};
use crate::sys::{self, raftcomms_comm, RaftcommsShim};
use cudarc::driver::{CudaStream, SyncOnDrop};
use raft_core::{DeviceVec, RaftResourcesPtr};
use raft_error::{Error, ErrorKind, Result};
use std::ffi::{c_void, CString};
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

// The shim's statuses are those `ErrorKind::from_shim_status` knows.
static_assertions::const_assert_eq!(sys::RAFTCOMMS_STATUS_OUT_OF_MEMORY, 1);
static_assertions::const_assert_eq!(sys::RAFTCOMMS_STATUS_CUDA, 2);
static_assertions::const_assert_eq!(sys::RAFTCOMMS_STATUS_LOGIC, 3);
static_assertions::const_assert_eq!(sys::RAFTCOMMS_STATUS_GENERIC, 4);

/// The loaded shim (with NCCL opened), or the error saying what is missing.
/// Refused once the library is closed (`raft_exit::closed`: after the exit's teardown, or in a
/// fork's child), as raft-core's shim gate is.
pub(crate) fn api(who: &'static str) -> Result<&'static RaftcommsShim> {
    if raft_exit::closed() {
        return Err(raft_exit::refusal(who));
    }
    loaded(who).map(|l| &l.api)
}

/// Turns a status into a result; the thread-local message is read and cleared at once.
fn check(who: &'static str, api: &RaftcommsShim, status: sys::raftcomms_status) -> Result<()> {
    if status == sys::RAFTCOMMS_STATUS_OK {
        return Ok(());
    }
    Err(Error::nccl(ErrorKind::from_shim_status(status), who, take_last_error(api)))
}

fn seconds(d: Duration) -> f64 {
    d.as_secs_f64()
}

fn stream_ptr(stream: &CudaStream) -> *mut c_void {
    stream.cu_stream() as *mut c_void
}

/// `ncclGetUniqueId`.
pub(crate) fn unique_id(who: &'static str) -> Result<[u8; sys::RAFTCOMMS_UNIQUE_ID_BYTES]> {
    let api = api(who)?;
    let mut id = [0u8; sys::RAFTCOMMS_UNIQUE_ID_BYTES];
    // SAFETY: the shim writes exactly RAFTCOMMS_UNIQUE_ID_BYTES bytes into the array.
    check(who, api, unsafe { (api.raftcomms_unique_id)(id.as_mut_ptr()) })?;
    Ok(id)
}

/// Whether the shim runs, for the calling thread, the destroys that may wait for the whole
/// device on threads of their own (see `raftcomms.h`): the watchdog's thread turns it on. Where
/// the shim cannot be loaded there is no communicator to destroy: nothing to do.
pub(crate) fn ends_elsewhere(on: bool) {
    if let Ok(api) = api("raft-comms") {
        // SAFETY: sets an atomic in the shim; takes no pointer.
        let _ = unsafe { (api.raftcomms_set_ends_elsewhere)(i32::from(on)) };
    }
}

/// The destroys begun on threads of their own that have not returned yet (0 without the shim).
pub(crate) fn ends_in_flight() -> i32 {
    // SAFETY: reads an atomic in the shim.
    api("raft-comms").map_or(0, |api| unsafe { (api.raftcomms_ends_in_flight)() })
}

/// `nccl.h`'s version code the shim was built with.
pub(crate) fn header_nccl_version(who: &'static str) -> Result<i32> {
    let api = api(who)?;
    // SAFETY: returns a constant.
    Ok(unsafe { (api.raftcomms_header_nccl_version)() })
}

/// One shim communicator handle. Dropping it makes no NCCL call (see `raftcomms_comm_free`):
/// ending the communicator is [`abort`](Self::abort) or [`finalize`](Self::finalize) then
/// [`destroy`](Self::destroy).
pub(crate) struct NativeComm {
    ptr: NonNull<raftcomms_comm>,
    api: &'static RaftcommsShim,
}

// SAFETY: the shim serialises every call on one communicator under its cell's lock (NCCL
// forbids concurrent calls on a communicator), and the handle itself is never changed after it
// was made; `raftcomms_comm_free` runs once, in Drop, when no other reference exists.
unsafe impl Send for NativeComm {}
// SAFETY: as above: shared use goes through the shim's lock.
unsafe impl Sync for NativeComm {}

impl Drop for NativeComm {
    fn drop(&mut self) {
        if !raft_exit::native_release_allowed() {
            return; // the exit has decided: no native call (leaked to the OS)
        }
        // SAFETY: the handle came from the shim and is freed exactly once; no NCCL call is made.
        unsafe { (self.api.raftcomms_comm_free)(self.ptr.as_ptr()) };
    }
}

fn handle_out(who: &'static str, api: &'static RaftcommsShim, raw: *mut raftcomms_comm) -> Result<NativeComm> {
    let ptr = NonNull::new(raw).ok_or_else(|| Error::new(ErrorKind::Generic, who, "the shim returned no communicator"))?;
    Ok(NativeComm { ptr, api })
}

/// A split's child from its `ncclCommSplit` until [`finish`](Self::finish) hands it over (ready,
/// to be made a `Communicator`, which aborts it on any later failure) or finds no color. NCCL
/// writes the child's communicator into the shim's slot when the parent's split completes: a
/// handle dropped before taking it from there left that communicator to nobody, with its memory
/// and proxy threads, for the process's life, unseen by the exit's teardown (the fourteenth
/// audit: `split_all` returned early on a refused part or a failed step). Dropped once the
/// parent's split completed ([`completed`](Self::completed)), the child is taken and aborted;
/// dropped before (the parent's wait or group failed and the parent was aborted: the slot may
/// never be written), the slot's 8 bytes are left to NCCL, as before.
pub(crate) struct IssuedSplit {
    child: Option<NativeComm>,
    completed: bool,
}

impl IssuedSplit {
    pub(crate) fn new(child: NativeComm) -> Self {
        IssuedSplit { child: Some(child), completed: false }
    }

    /// The parent's split has completed (its wait, or its group's end, succeeded).
    pub(crate) fn completed(&mut self) {
        self.completed = true;
    }

    /// After [`completed`](Self::completed): takes the child NCCL made and waits (at most
    /// `timeout`) until it is ready; `None` when this rank gave no color. A child that does not
    /// turn ready is aborted.
    pub(crate) fn finish(mut self, who: &'static str, timeout: Duration) -> Result<Option<NativeComm>> {
        debug_assert!(self.completed, "finished before the parent's split completed");
        let child = self.child.take().expect("finished once");
        // A failure here left nothing to abort: the shim aborted a child whose clique ended, or
        // left a slot NCCL never wrote in time.
        if !child.split_done(who)? {
            return Ok(None);
        }
        if let Err(e) = child.wait(who, timeout) {
            let _ = child.abort(who, e.message());
            return Err(e);
        }
        Ok(Some(child))
    }
}

impl Drop for IssuedSplit {
    fn drop(&mut self) {
        const WHO: &str = "Communicator::split";
        let Some(child) = self.child.take() else { return };
        if !self.completed || !raft_exit::native_release_allowed() {
            return;
        }
        // One look at the slot, no wait (the shim waits up to the child's timeout for a slot not
        // written yet: per child, on an error path): a slot still empty is left to NCCL.
        let _ = child.set_timeout(WHO, Duration::ZERO);
        if child.split_done(WHO).unwrap_or(false) {
            let _ = child.abort(WHO, "a later step of its split failed");
        }
    }
}

/// What `raftcomms_comm_info` says.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Info {
    pub(crate) rank: usize,
    pub(crate) size: usize,
    pub(crate) device: usize,
}

/// Checks that an array is ordered on the stream a call runs on, so that the call follows the
/// work that made its contents and precedes its free.
fn on_stream<T: NcclType>(who: &'static str, what: &str, v: &DeviceVec<T>, stream: &CudaStream) -> Result<()> {
    if v.stream().cu_stream() != stream.cu_stream() {
        return Err(Error::logic(
            who,
            format!(
                "the {what} array belongs to {} (device {}), not to the communicator's resources: collectives run on the \
                 communicator's stream, so allocate their arrays with those resources",
                v.resources(),
                v.resources().device()
            ),
        ));
    }
    if v.resources().is_released() {
        return Err(Error::released(who, v.resources().device()));
    }
    Ok(())
}

/// The device address of an array on its own stream (no synchronisation: checked by `on_stream`).
/// A capture begun on the stream since the collective's own question is refused (`Logic`, as
/// `who`'s), not a panic (the fifteenth audit: the infallible `DevicePtr` panicked there).
/// The ordering guard is dropped here, before NCCL queues: sound only because `on_stream`
/// refused an array of another stream (on its own stream the guard orders nothing, `Sync(None)`),
/// which debug builds check again (the sixteenth audit's hardening note).
fn addr<T: NcclType>(who: &'static str, v: &DeviceVec<T>, stream: &CudaStream) -> Result<*const c_void> {
    let (ptr, order) = v.try_device_ptr(stream).map_err(|e| e.with_who(who))?;
    debug_assert!(matches!(order, SyncOnDrop::Sync(None)), "{who}: an array of another stream reached addr");
    Ok(ptr as usize as *const c_void)
}

fn addr_mut<T: NcclType>(who: &'static str, v: &mut DeviceVec<T>, stream: &CudaStream) -> Result<*mut c_void> {
    let (ptr, order) = v.try_device_ptr_mut(stream).map_err(|e| e.with_who(who))?;
    debug_assert!(matches!(order, SyncOnDrop::Sync(None)), "{who}: an array of another stream reached addr_mut");
    Ok(ptr as usize as *mut c_void)
}

impl NativeComm {
    /// Starts a non-blocking `ncclCommInitRankConfig` (wait with [`wait`](Self::wait)).
    pub(crate) fn init(who: &'static str, id: &[u8; 128], world: usize, rank: usize, device: usize, timeout: Duration) -> Result<Self> {
        let api = api(who)?;
        let (world, rank, device) =
            (counts::as_int(who, "world size", world)?, counts::as_int(who, "rank", rank)?, counts::as_int(who, "device", device)?);
        let mut raw = std::ptr::null_mut();
        // SAFETY: `id` holds the 128 bytes the shim reads; `raw` receives a new handle or stays null.
        check(who, api, unsafe { (api.raftcomms_comm_init)(id.as_ptr(), world, rank, device, seconds(timeout), &mut raw) })?;
        handle_out(who, api, raw)
    }

    /// A clique over `devices` (rank i on devices[i]), initialised in one NCCL group on the
    /// calling thread (wait for each with [`wait`](Self::wait)).
    pub(crate) fn init_clique(who: &'static str, devices: &[usize], timeout: Duration) -> Result<Vec<Self>> {
        let api = api(who)?;
        let devs: Vec<i32> = devices.iter().map(|&d| counts::as_int(who, "device", d)).collect::<Result<_>>()?;
        let n = counts::as_int(who, "clique size", devs.len())?;
        let mut raw = vec![std::ptr::null_mut(); devs.len()];
        // SAFETY: `devs` and `raw` both hold `n` entries; the shim fills `raw` with new handles
        // only when it succeeds.
        check(who, api, unsafe { (api.raftcomms_comm_init_clique)(n, devs.as_ptr(), seconds(timeout), raw.as_mut_ptr()) })?;
        raw.into_iter().map(|r| handle_out(who, api, r)).collect()
    }

    /// Starts a non-blocking `ncclCommSplit` (`color` None: no color). The child has no
    /// communicator until the parent's [`wait`](Self::wait) (or the group's end) succeeded and
    /// [`split_done`](Self::split_done) took it.
    pub(crate) fn split(&self, who: &'static str, color: Option<u32>, key: i32) -> Result<NativeComm> {
        let color = match color {
            Some(c) => counts::as_int(who, "color", c as usize)?,
            None => -1,
        };
        let mut raw = std::ptr::null_mut();
        // SAFETY: the handle is alive for the borrow; `raw` receives a new handle or stays null.
        check(who, self.api, unsafe { (self.api.raftcomms_comm_split)(self.ptr.as_ptr(), color, key, &mut raw) })?;
        handle_out(who, self.api, raw)
    }

    /// After the parent's split completed: whether this rank's color made a communicator.
    fn split_done(&self, who: &'static str) -> Result<bool> {
        let mut present = 0;
        // SAFETY: the handle is alive; one int is written.
        check(who, self.api, unsafe { (self.api.raftcomms_comm_split_done)(self.ptr.as_ptr(), &mut present) })?;
        Ok(present != 0)
    }

    /// Waits (at most `timeout`) until the communicator is ready; aborts it otherwise.
    pub(crate) fn wait(&self, who: &'static str, timeout: Duration) -> Result<()> {
        // SAFETY: the handle is alive for the borrow.
        check(who, self.api, unsafe { (self.api.raftcomms_comm_wait)(self.ptr.as_ptr(), seconds(timeout)) })
    }

    pub(crate) fn info(&self, who: &'static str) -> Result<Info> {
        let (mut rank, mut size, mut device) = (0, 0, 0);
        // SAFETY: the handle is alive; three ints are written through valid pointers.
        check(who, self.api, unsafe { (self.api.raftcomms_comm_info)(self.ptr.as_ptr(), &mut rank, &mut size, &mut device) })?;
        if rank < 0 || size < 1 {
            return Err(Error::new(ErrorKind::Generic, who, "the communicator is not ready"));
        }
        Ok(Info { rank: rank as usize, size: size as usize, device: device.max(0) as usize })
    }

    pub(crate) fn set_timeout(&self, who: &'static str, timeout: Duration) -> Result<()> {
        // SAFETY: the handle is alive for the borrow.
        check(who, self.api, unsafe { (self.api.raftcomms_comm_set_timeout)(self.ptr.as_ptr(), seconds(timeout)) })
    }

    /// One look: NCCL's asynchronous error as an error, else whether `stream` (or, with `None`,
    /// the last marked call) has finished. A `stream` being captured is never queried (the
    /// shim answers from the last marked call then), and the look runs with the thread's
    /// capture mode relaxed: no capture fails it, and it invalidates none.
    pub(crate) fn query(&self, who: &'static str, stream: Option<&CudaStream>) -> Result<bool> {
        let mut state = sys::RAFTCOMMS_STATE_PENDING;
        let s = stream.map_or(std::ptr::null_mut(), stream_ptr);
        // SAFETY: the handle is alive; the stream (when given) is kept alive by the borrow.
        check(who, self.api, unsafe { (self.api.raftcomms_comm_query)(self.ptr.as_ptr(), s, &mut state) })?;
        Ok(state == sys::RAFTCOMMS_STATE_DONE)
    }

    /// `ncclCommAbort` (never waits for other ranks); `reason` is what later uses are told.
    pub(crate) fn abort(&self, who: &'static str, reason: &str) -> Result<()> {
        let reason = CString::new(reason.replace('\0', " ")).unwrap_or_default();
        // SAFETY: the handle is alive; the reason is NUL-terminated and copied by the shim.
        check(who, self.api, unsafe { (self.api.raftcomms_comm_abort)(self.ptr.as_ptr(), reason.as_ptr()) })
    }

    /// `ncclCommFinalize` (non-blocking: [`wait`](Self::wait), then [`destroy`](Self::destroy)).
    pub(crate) fn finalize(&self, who: &'static str) -> Result<()> {
        // SAFETY: the handle is alive for the borrow.
        check(who, self.api, unsafe { (self.api.raftcomms_comm_finalize)(self.ptr.as_ptr()) })
    }

    /// `ncclCommDestroy` after a completed finalize.
    pub(crate) fn destroy(&self, who: &'static str) -> Result<()> {
        // SAFETY: the handle is alive for the borrow; the shim ends the NCCL communicator once.
        check(who, self.api, unsafe { (self.api.raftcomms_comm_destroy)(self.ptr.as_ptr()) })
    }

    /// `raft::resource::set_comms` on the lent resources, with `stream` (theirs) for barriers.
    pub(crate) fn install(&self, who: &'static str, res: RaftResourcesPtr<'_>, stream: &CudaStream) -> Result<()> {
        // SAFETY: the raft::resources is lent for the call (alive, not released meanwhile); the
        // shim only adds a comms factory to it. The stream is the resources' own, alive.
        check(who, self.api, unsafe { (self.api.raftcomms_comm_install)(self.ptr.as_ptr(), res.as_ptr(), stream_ptr(stream)) })
    }

    /// Enqueues through `call`, with `mark` telling the shim to record the communicator's event.
    fn run(&self, who: &'static str, call: impl FnOnce(&RaftcommsShim, *mut raftcomms_comm) -> sys::raftcomms_status) -> Result<()> {
        check(who, self.api, call(self.api, self.ptr.as_ptr()))
    }

    pub(crate) fn allreduce<T: NcclType>(
        &self,
        who: &'static str,
        send: &DeviceVec<T>,
        recv: &mut DeviceVec<T>,
        op: ReduceOp,
        stream: &CudaStream,
        mark: bool,
    ) -> Result<()> {
        counts::allreduce(send.len(), recv.len()).map_err(|e| e.with_who(who))?;
        on_stream(who, "send", send, stream)?;
        on_stream(who, "receive", recv, stream)?;
        let (s, r, n) = (addr(who, send, stream)?, addr_mut(who, recv, stream)?, send.len());
        // SAFETY: both arrays hold `n` elements of T (checked above), live for the borrows, and
        // are ordered on `stream` (checked), so their frees follow the call.
        self.run(who, |api, c| unsafe { (api.raftcomms_allreduce)(c, s, r, n, code_of::<T>(), op.code(), stream_ptr(stream), mark as i32) })
    }

    pub(crate) fn allreduce_in_place<T: NcclType>(
        &self,
        who: &'static str,
        buf: &mut DeviceVec<T>,
        op: ReduceOp,
        stream: &CudaStream,
        mark: bool,
    ) -> Result<()> {
        on_stream(who, "", buf, stream)?;
        let (p, n) = (addr_mut(who, buf, stream)?, buf.len());
        // SAFETY: `n` elements in one live array ordered on `stream`; NCCL allows send == recv.
        self.run(who, |api, c| unsafe { (api.raftcomms_allreduce)(c, p, p, n, code_of::<T>(), op.code(), stream_ptr(stream), mark as i32) })
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn broadcast<T: NcclType>(
        &self,
        who: &'static str,
        world: usize,
        send: Option<&DeviceVec<T>>,
        recv: &mut DeviceVec<T>,
        root: usize,
        stream: &CudaStream,
        mark: bool,
    ) -> Result<()> {
        let send_len = send.map_or(recv.len(), |s| s.len());
        counts::broadcast(world, root, send_len, recv.len()).map_err(|e| e.with_who(who))?;
        if let Some(s) = send {
            on_stream(who, "send", s, stream)?;
        }
        on_stream(who, "receive", recv, stream)?;
        let r = addr_mut(who, recv, stream)?;
        let s = match send {
            Some(s) => addr(who, s, stream)?,
            None => r as *const c_void,
        };
        let (n, root) = (recv.len(), counts::as_int(who, "root", root)?);
        // SAFETY: the arrays (one, in place, or two) hold `n` elements (checked), are alive and
        // ordered on `stream`.
        self.run(who, |api, c| unsafe { (api.raftcomms_broadcast)(c, s, r, n, code_of::<T>(), root, stream_ptr(stream), mark as i32) })
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn reduce<T: NcclType>(
        &self,
        who: &'static str,
        (world, rank): (usize, usize),
        send: &DeviceVec<T>,
        recv: Option<&mut DeviceVec<T>>,
        op: ReduceOp,
        root: usize,
        stream: &CudaStream,
        mark: bool,
    ) -> Result<()> {
        counts::reduce(world, rank, root, send.len(), recv.as_ref().map(|r| r.len())).map_err(|e| e.with_who(who))?;
        on_stream(who, "send", send, stream)?;
        let r = match recv {
            Some(r) => {
                on_stream(who, "receive", r, stream)?;
                addr_mut(who, r, stream)?
            }
            None => std::ptr::null_mut(), // not the root: NCCL does not use it
        };
        let (s, n, root) = (addr(who, send, stream)?, send.len(), counts::as_int(who, "root", root)?);
        // SAFETY: `n` elements in the send array and (on the root, checked) in the receive array,
        // both alive and ordered on `stream`; elsewhere NCCL ignores the receive pointer.
        self.run(who, |api, c| unsafe {
            (api.raftcomms_reduce)(c, s, r, n, code_of::<T>(), op.code(), root, stream_ptr(stream), mark as i32)
        })
    }

    pub(crate) fn allgather<T: NcclType>(
        &self,
        who: &'static str,
        world: usize,
        send: &DeviceVec<T>,
        recv: &mut DeviceVec<T>,
        stream: &CudaStream,
        mark: bool,
    ) -> Result<()> {
        counts::allgather(world, send.len(), recv.len()).map_err(|e| e.with_who(who))?;
        on_stream(who, "send", send, stream)?;
        on_stream(who, "receive", recv, stream)?;
        let (s, r, n) = (addr(who, send, stream)?, addr_mut(who, recv, stream)?, send.len());
        // SAFETY: `n` elements sent, world × n received (checked), both alive on `stream`.
        self.run(who, |api, c| unsafe { (api.raftcomms_allgather)(c, s, r, n, code_of::<T>(), stream_ptr(stream), mark as i32) })
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn allgatherv<T: NcclType>(
        &self,
        who: &'static str,
        (world, rank): (usize, usize),
        send: &DeviceVec<T>,
        recv: &mut DeviceVec<T>,
        counts_per_rank: &[usize],
        stream: &CudaStream,
        mark: bool,
    ) -> Result<()> {
        let displs = counts::allgatherv(world, rank, counts_per_rank, send.len(), recv.len()).map_err(|e| e.with_who(who))?;
        on_stream(who, "send", send, stream)?;
        on_stream(who, "receive", recv, stream)?;
        let (s, r) = (addr(who, send, stream)?, addr_mut(who, recv, stream)?);
        // SAFETY: `counts_per_rank` and `displs` hold one entry per rank (the shim reads `world`
        // of each); every block lies inside the receive array (the counts add up to its length,
        // checked); this rank's block is its send array's length (checked).
        self.run(who, |api, c| unsafe {
            (api.raftcomms_allgatherv)(c, s, r, counts_per_rank.as_ptr(), displs.as_ptr(), code_of::<T>(), stream_ptr(stream), mark as i32)
        })
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn gather<T: NcclType>(
        &self,
        who: &'static str,
        (world, rank): (usize, usize),
        send: &DeviceVec<T>,
        recv: Option<&mut DeviceVec<T>>,
        root: usize,
        stream: &CudaStream,
        mark: bool,
    ) -> Result<()> {
        let recv = if rank == root { recv } else { None }; // only the root receives
        counts::gather(world, rank, root, send.len(), recv.as_ref().map(|r| r.len())).map_err(|e| e.with_who(who))?;
        on_stream(who, "send", send, stream)?;
        let r = match recv {
            Some(r) => {
                on_stream(who, "receive", r, stream)?;
                addr_mut(who, r, stream)?
            }
            None => std::ptr::null_mut(),
        };
        let (s, n, root) = (addr(who, send, stream)?, send.len(), counts::as_int(who, "root", root)?);
        // SAFETY: `n` elements sent; on the root, world × n received (checked); elsewhere the shim
        // posts no receive and does not touch the null pointer.
        self.run(who, |api, c| unsafe { (api.raftcomms_gather)(c, s, r, n, code_of::<T>(), root, stream_ptr(stream), mark as i32) })
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn reduce_scatter<T: NcclType>(
        &self,
        who: &'static str,
        world: usize,
        send: &DeviceVec<T>,
        recv: &mut DeviceVec<T>,
        op: ReduceOp,
        stream: &CudaStream,
        mark: bool,
    ) -> Result<()> {
        counts::reduce_scatter(world, send.len(), recv.len()).map_err(|e| e.with_who(who))?;
        on_stream(who, "send", send, stream)?;
        on_stream(who, "receive", recv, stream)?;
        let (s, r, n) = (addr(who, send, stream)?, addr_mut(who, recv, stream)?, recv.len());
        // SAFETY: world × n elements sent, n received (checked), both alive on `stream`.
        self.run(who, |api, c| unsafe {
            (api.raftcomms_reducescatter)(c, s, r, n, code_of::<T>(), op.code(), stream_ptr(stream), mark as i32)
        })
    }

    pub(crate) fn send<T: NcclType>(
        &self,
        who: &'static str,
        (world, rank): (usize, usize),
        buf: &DeviceVec<T>,
        peer: usize,
        stream: &CudaStream,
        mark: bool,
    ) -> Result<()> {
        counts::peer(world, rank, peer).map_err(|e| e.with_who(who))?;
        on_stream(who, "send", buf, stream)?;
        let (p, n, peer) = (addr(who, buf, stream)?, buf.len(), counts::as_int(who, "peer", peer)?);
        // SAFETY: the array's `n` elements, alive and ordered on `stream`.
        self.run(who, |api, c| unsafe { (api.raftcomms_send)(c, p, n, code_of::<T>(), peer, stream_ptr(stream), mark as i32) })
    }

    pub(crate) fn recv<T: NcclType>(
        &self,
        who: &'static str,
        (world, rank): (usize, usize),
        buf: &mut DeviceVec<T>,
        peer: usize,
        stream: &CudaStream,
        mark: bool,
    ) -> Result<()> {
        counts::peer(world, rank, peer).map_err(|e| e.with_who(who))?;
        on_stream(who, "receive", buf, stream)?;
        let (p, n, peer) = (addr_mut(who, buf, stream)?, buf.len(), counts::as_int(who, "peer", peer)?);
        // SAFETY: the array's `n` elements, alive and ordered on `stream`.
        self.run(who, |api, c| unsafe { (api.raftcomms_recv)(c, p, n, code_of::<T>(), peer, stream_ptr(stream), mark as i32) })
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn sendrecv<T: NcclType>(
        &self,
        who: &'static str,
        (world, rank): (usize, usize),
        send: &DeviceVec<T>,
        dest: usize,
        recv: &mut DeviceVec<T>,
        source: usize,
        stream: &CudaStream,
        mark: bool,
    ) -> Result<()> {
        counts::sendrecv(world, rank, dest, source, send.len(), recv.len()).map_err(|e| e.with_who(who))?;
        on_stream(who, "send", send, stream)?;
        on_stream(who, "receive", recv, stream)?;
        let (s, sn, r, rn) = (addr(who, send, stream)?, send.len(), addr_mut(who, recv, stream)?, recv.len());
        let (dest, source) = (counts::as_int(who, "peer", dest)?, counts::as_int(who, "peer", source)?);
        // SAFETY: each array's own length, alive and ordered on `stream`.
        self.run(who, |api, c| unsafe {
            (api.raftcomms_sendrecv)(c, s, sn, dest, r, rn, source, code_of::<T>(), stream_ptr(stream), mark as i32)
        })
    }

    /// The first half of a barrier: an allreduce of one int (stream-ordered memory of the shim's).
    pub(crate) fn barrier(&self, who: &'static str, stream: &CudaStream, mark: bool) -> Result<()> {
        // SAFETY: the handle is alive; the int is the shim's own, on the stream, which is alive.
        self.run(who, |api, c| unsafe { (api.raftcomms_barrier)(c, stream_ptr(stream), mark as i32) })
    }
}

/// `ncclGroupStart`.
pub(crate) fn group_start(who: &'static str) -> Result<()> {
    let api = api(who)?;
    // SAFETY: no argument; a thread-local NCCL state.
    check(who, api, unsafe { (api.raftcomms_group_start)() })
}

/// `ncclGroupEnd`, then for each communicator used in the group a wait and (with a stream) a mark.
pub(crate) fn group_end(who: &'static str, comms: &[(&NativeComm, Option<Arc<CudaStream>>)]) -> Result<()> {
    let api = api(who)?;
    let handles: Vec<*mut raftcomms_comm> = comms.iter().map(|(c, _)| c.ptr.as_ptr()).collect();
    let streams: Vec<*mut c_void> = comms.iter().map(|(_, s)| s.as_deref().map_or(std::ptr::null_mut(), stream_ptr)).collect();
    let n = counts::as_int(who, "communicators in a group", handles.len())?;
    // SAFETY: both arrays hold `n` entries; the handles and streams are kept alive by `comms`.
    check(who, api, unsafe { (api.raftcomms_group_end)(n, handles.as_ptr(), streams.as_ptr()) })
}

/// What `raft::resource::get_comms` reports on lent resources: (rank, size) when installed.
pub(crate) fn installed(who: &'static str, res: RaftResourcesPtr<'_>) -> Result<Option<(usize, usize)>> {
    let api = api(who)?;
    let (mut present, mut rank, mut size) = (0, 0, 0);
    // SAFETY: the raft::resources is lent for the call; three ints are written.
    check(who, api, unsafe { (api.raftcomms_installed)(res.as_ptr(), &mut present, &mut rank, &mut size) })?;
    Ok((present != 0).then(|| (rank.max(0) as usize, size.max(0) as usize)))
}

/// An allreduce through RAFT's `get_comms(res)` (then its `sync_stream`), as RAFT's C++ code
/// does it.
pub(crate) fn raft_allreduce<T: NcclType>(
    who: &'static str,
    res: RaftResourcesPtr<'_>,
    send: &DeviceVec<T>,
    recv: &mut DeviceVec<T>,
    op: ReduceOp,
    stream: &CudaStream,
) -> Result<()> {
    let api = api(who)?;
    counts::allreduce(send.len(), recv.len()).map_err(|e| e.with_who(who))?;
    on_stream(who, "send", send, stream)?;
    on_stream(who, "receive", recv, stream)?;
    let (s, r, n) = (addr(who, send, stream)?, addr_mut(who, recv, stream)?, send.len());
    // SAFETY: the resources are lent for the call; both arrays hold `n` elements (checked), are
    // alive and ordered on `stream`, the resources' own.
    check(who, api, unsafe { (api.raftcomms_raft_allreduce)(res.as_ptr(), s, r, n, code_of::<T>(), op.code(), stream_ptr(stream)) })
}
