//! `Communicator`: one NCCL communicator (`ncclComm_t`) of one rank, bound to a
//! `DeviceResources` whose stream its collectives run on; how it is made (a clique of this
//! process's GPUs, or one rank of several processes), split, installed into RAFT's resources,
//! waited for, and ended. The collectives themselves are in `collectives.rs`.
use crate::counts;
use crate::group;
use crate::launch::{timeout_from_env, Launch};
use crate::rendezvous;
use crate::result::{self, IssuedSplit, NativeComm};
use crate::secret::Secret;
use crate::shared::{nanos, register_live, Closing, Shared, State, NEXT_ID};
use crate::unique_id::UniqueId;
use crate::watchdog;
use cudarc::driver::CudaStream;
use raft_core::DeviceResources;
use raft_error::{Error, ErrorKind, Reason, Result};
use raft_exit::ReleaseToken;
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One rank's NCCL communicator (`ncclComm_t`), bound to a [`DeviceResources`]: its collectives
/// (see [`allreduce`](Self::allreduce) and the others) run on the resources' stream, on
/// [`DeviceVec`](raft_core::DeviceVec)s of those resources, with their counts checked before NCCL is
/// called. [`install`](Self::install) puts it into RAFT's resources
/// (`raft::resource::set_comms`), where RAFT's and cuVS's multi-GPU C++ code finds it through
/// `raft::resource::get_comms`.
///
/// Made by [`clique`](Self::clique) (one process, several GPUs), [`from_env`](Self::from_env) /
/// [`init`](Self::init) (one rank of several processes), or [`split`](Self::split).
///
/// # Waiting, failures and timeouts
/// Collectives are stream-ordered and return once enqueued. [`sync`](Self::sync) waits for the
/// stream, and so does anything else that waits for it (`to_host`, `DeviceResources::sync`).
/// Every communicator has a timeout ([`set_timeout`](Self::set_timeout); `RAFT_COMMS_TIMEOUT`,
/// default 300 s): a collective that has not finished that long after it was enqueued (a rank
/// died, or never made the matching call), or an error NCCL reports, aborts the communicator
/// (`ncclCommAbort`) — from `sync`, or from the library's watchdog thread when nobody is in
/// `sync` — so that the stuck kernels end and every waiter returns; every later call then
/// returns that error. Initialisation is bounded the same way.
///
/// # Ending
/// [`release`](Self::release) (or [`release_all`](Self::release_all) for a clique) waits for the
/// work, finalizes and destroys the communicator and returns any error; [`abort`](Self::abort)
/// ends it at once. Dropping it hands the same teardown to the watchdog: `Drop` never blocks. A
/// communicator holds its resources, so it is always destroyed before them. RAFT's resources it
/// was installed into keep a handle that fails, saying why, once it has ended.
///
/// # Exit
/// From its first collective until its work is seen finished, a communicator counts as a job of
/// `raft-exit` (with the exit wait read when the collective was enqueued): an exit waits for it,
/// then tears down, or skips the teardown when it does not finish in time — never destroying
/// CUDA state under a running collective. One still alive at the teardown (kept in a static,
/// leaked, or never given a collective from Rust) is aborted then, so that NCCL's threads stop
/// before the C++ static destructors tear CUDA down: making a communicator registers the exit
/// hook.
///
/// # Thread safety
/// `Send + Sync`: calls from several threads are serialised on the communicator (NCCL forbids
/// concurrent calls on one). While a thread's open group holds calls on it, calls from other
/// threads are refused (`Logic`) until that group ends: NCCL would otherwise fold them into that
/// thread's group. For a clique driven from one thread, put the calls of all its GPUs inside one
/// [`group`](crate::group); from one thread per GPU, no group is needed.
///
/// The order in which collectives are issued is the program's, as with NCCL itself: NCCL
/// matches the n-th call of every rank, so two threads issuing collectives on one communicator
/// must make the same order on every rank (one issuing thread per communicator, or a lock of the
/// program's around each issue). Calls issued in different orders on different ranks are a
/// mismatch like any other (see the crate docs): the ranks wait until the timeout aborts the
/// communicator. Aborting one rank of this process's ranks of a communicator (a
/// [`clique`](Self::clique), the children of one split of those ranks, ranks initialised here
/// with one [`UniqueId`](crate::UniqueId)) aborts the others too, whoever aborts it: this API,
/// the watchdog, a failed group, or RAFT's `sync_stream` in C++.
pub struct Communicator {
    shared: Arc<Shared>,
}

static_assertions::assert_impl_all!(Communicator: Send, Sync);

impl Communicator {
    fn new(native: NativeComm, resources: DeviceResources, timeout: Duration) -> Result<Communicator> {
        // NCCL made the communicator: a failure from here on aborts it (its proxy threads would
        // otherwise live on, and the exit's teardown never sees it; in a clique the shim's rule
        // aborts the other ranks too). Dropping the handle alone only frees the shim's cell.
        let refuse = |native: &NativeComm, e: Error| {
            let _ = native.abort("Communicator", e.message());
            e
        };
        let info = match native.info("Communicator") {
            Ok(info) => info,
            Err(e) => return Err(refuse(&native, e)),
        };
        if info.device != resources.device() {
            let e = Error::new(
                ErrorKind::Generic,
                "Communicator",
                format!("NCCL put the communicator on device {}, its resources are on device {}", info.device, resources.device()),
            );
            return Err(refuse(&native, e));
        }
        let shared = Arc::new(Shared {
            native,
            resources,
            rank: info.rank,
            size: info.size,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            timeout_ns: AtomicU64::new(nanos(timeout)),
            groups: AtomicUsize::new(0),
            state: Mutex::new(State {
                token: None,
                last_enqueue: Instant::now(),
                ended: None,
                group_thread: None,
                watched: false,
                closing: Closing::No,
            }),
        });
        register_live(&shared);
        Ok(Communicator { shared })
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// One communicator per resources object, rank `i` on `resources[i]`'s device, all in this
    /// process: a new unique id, then `ncclCommInitRankConfig` for every device inside one NCCL
    /// group, eagerly, on the calling thread (a lazy initialisation inside worker threads breaks
    /// the group: NVIDIA/cuvs#968). Bounded by `RAFT_COMMS_TIMEOUT` (default 300 s).
    ///
    /// # Errors
    /// `Logic` for no resources, two on one device, released resources, a zero bound, or a call
    /// inside a group; `Generic` / `Cuda` when NCCL fails or does not finish in time (every
    /// communicator made so far is aborted).
    pub fn clique(resources: &[DeviceResources]) -> Result<Vec<Communicator>> {
        Self::clique_with_timeout(resources, timeout_from_env()?)
    }

    /// [`clique`](Self::clique) with an explicit bound.
    pub fn clique_with_timeout(resources: &[DeviceResources], timeout: Duration) -> Result<Vec<Communicator>> {
        const WHO: &str = "Communicator::clique";
        group::refuse_inside(WHO)?;
        refuse_zero_timeout(WHO, timeout)?;
        if resources.is_empty() {
            return Err(Error::logic(WHO, "no resources: a clique needs one per device"));
        }
        let devices: Vec<usize> = resources.iter().map(|r| r.device()).collect();
        for (i, d) in devices.iter().enumerate() {
            if devices[..i].contains(d) {
                return Err(Error::logic(WHO, format!("two resources on device {d}: NCCL needs one rank per GPU")));
            }
        }
        if let Some(r) = resources.iter().find(|r| r.is_released()) {
            return Err(Error::released(WHO, r.device()));
        }
        let natives = NativeComm::init_clique(WHO, &devices, timeout)?;
        let mut failed = None;
        for n in &natives {
            if let Err(e) = n.wait(WHO, timeout) {
                failed.get_or_insert(e);
            }
        }
        if let Some(e) = failed {
            for n in &natives {
                let _ = n.abort(WHO, e.message());
            }
            return Err(e);
        }
        // One clique in the shim already (an abort of one aborts the others).
        natives.into_iter().zip(resources).map(|(n, r)| Self::new(n, r.clone(), timeout)).collect()
    }

    /// This process's rank among several, from the launcher's environment (`RANK`,
    /// `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`; see [`Launch`]), bounded by
    /// `RAFT_COMMS_TIMEOUT` (default 300 s). Pick the device from `LOCAL_RANK` first:
    ///
    /// ```no_run
    /// # fn main() -> raft_core::Result<()> {
    /// let launch = raft_comms::Launch::from_env()?;
    /// let res = raft_core::DeviceResources::on_device(launch.device()?)?;
    /// let comm = raft_comms::Communicator::from_env(&res)?;
    /// # Ok(()) }
    /// ```
    ///
    /// Ranks that `srun` numbered (see [`Launch`]) bind their Slurm step into the rendezvous
    /// secret's job when `RAFT_COMMS_JOB` is unset: two steps of one batch script, sharing its
    /// secret, refuse each other's ranks.
    ///
    /// # Errors
    /// As [`init`](Self::init); `Logic` naming a missing or malformed variable.
    pub fn from_env(resources: &DeviceResources) -> Result<Communicator> {
        const WHO: &str = "Communicator::from_env";
        let launch = Launch::from_env()?;
        let mut secret = Secret::from_env().map_err(|e| e.with_who(WHO))?;
        if std::env::var_os(crate::secret::JOB_VAR).is_none() {
            // Read lossily, as `Launch::from_env` reads the same variables: a value that is not
            // UTF-8 binds the step too, where `std::env::var` dropped it.
            if let Some(step) =
                crate::launch::srun_step_job(launch.launcher, |name| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned()))
            {
                secret = secret.map(|s| s.with_job(step));
            }
        }
        Self::init_with_secret(resources, launch.rank, launch.size, &launch.rendezvous_addr(), timeout_from_env()?, secret)
    }

    /// Rank `rank` of `size` ranks on `resources`' device: rank 0 makes the unique id and serves it at
    /// `addr` (`host:port`) over TCP; the others fetch it from there, each side proving to the
    /// other that it holds the job's secret (`RAFT_COMMS_SECRET`, see [`Secret`]; without one,
    /// `addr` must be a loopback address); then a non-blocking
    /// `ncclCommInitRankConfig`, polled. The whole is bounded by `timeout`: a rank that never
    /// arrives gives the others an error naming it, and an initialisation that does not complete
    /// is aborted (`ncclCommAbort`).
    ///
    /// # Errors
    /// `Logic` for a rank not below `size`, a zero bound, released resources, another rank's
    /// mismatching world size, a call inside a group, a peer without the job's secret, and, for
    /// a size above 1 (a communicator of one rank has no rendezvous, and its address is not
    /// read), an address that is not `host:port` or names port 0, or no secret for an address
    /// that is not loopback; `Generic` when the rendezvous or NCCL fails or runs out of time (an
    /// address whose name does not resolve is retried until then).
    pub fn init(resources: &DeviceResources, rank: usize, size: usize, addr: &str, timeout: Duration) -> Result<Communicator> {
        let secret = Secret::from_env().map_err(|e| e.with_who("Communicator::init"))?;
        Self::init_with_secret(resources, rank, size, addr, timeout, secret)
    }

    /// [`init`](Self::init) with the rendezvous secret given.
    fn init_with_secret(
        resources: &DeviceResources,
        rank: usize,
        size: usize,
        addr: &str,
        timeout: Duration,
        secret: Option<Secret>,
    ) -> Result<Communicator> {
        const WHO: &str = "Communicator::init";
        group::refuse_inside(WHO)?;
        refuse_zero_timeout(WHO, timeout)?;
        if size == 0 || rank >= size {
            return Err(Error::logic(WHO, format!("rank {rank} is not a rank of a size of {size}")));
        }
        let deadline = rendezvous::deadline_after(timeout);
        let id = if rank == 0 {
            // Bound before the id is made: an address of another host, or one without a secret
            // that is not loopback, fails before NCCL starts its bootstrap root.
            let listener = if size > 1 { Some(rendezvous::bind(WHO, addr, secret.as_ref(), deadline, timeout)?) } else { None };
            let id = UniqueId::new().map_err(|e| e.with_who(WHO))?;
            if let Some(listener) = listener {
                rendezvous::serve_on(WHO, &listener, id.as_bytes(), size, secret.as_ref(), deadline, timeout)?;
            }
            id
        } else {
            UniqueId::from_bytes(rendezvous::fetch_until(WHO, addr, rank, size, secret.as_ref(), deadline, timeout)?)
        };
        let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
        Self::init_until(WHO, resources, &id, rank, size, left, timeout)
    }

    /// Rank `rank` of `size` ranks with an id shared by the program's own means (rank 0's
    /// [`UniqueId::new`]), bounded by `timeout`.
    ///
    /// # Errors
    /// As [`init`](Self::init), without the rendezvous.
    pub fn init_with_id(resources: &DeviceResources, id: &UniqueId, rank: usize, size: usize, timeout: Duration) -> Result<Communicator> {
        const WHO: &str = "Communicator::init_with_id";
        group::refuse_inside(WHO)?;
        refuse_zero_timeout(WHO, timeout)?;
        if size == 0 || rank >= size {
            return Err(Error::logic(WHO, format!("rank {rank} is not a rank of a size of {size}")));
        }
        Self::init_until(WHO, resources, id, rank, size, timeout, timeout)
    }

    fn init_until(
        who: &'static str,
        resources: &DeviceResources,
        id: &UniqueId,
        rank: usize,
        world: usize,
        left: Duration,
        timeout: Duration,
    ) -> Result<Communicator> {
        if resources.is_released() {
            return Err(Error::released(who, resources.device()));
        }
        let native = NativeComm::init(who, id.as_bytes(), world, rank, resources.device(), timeout)?;
        native.wait(who, left).map_err(|e| {
            let message = format!("rank {rank} of {world}: NCCL's initialisation failed: {}", e.message());
            e.with_who(who).with_message(message)
        })?;
        Self::new(native, resources.clone(), timeout)
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.shared.rank
    }

    /// The number of ranks (the world size: `WORLD_SIZE`, [`Launch::size`](crate::Launch::size),
    /// the `size` of [`init`](Self::init); one name for it across the crate).
    pub fn size(&self) -> usize {
        self.shared.size
    }

    /// The device (the resources').
    pub fn device(&self) -> usize {
        self.shared.resources.device()
    }

    /// The resources whose stream the collectives run on.
    pub fn resources(&self) -> &DeviceResources {
        &self.shared.resources
    }

    /// The bound of this communicator's waits.
    pub fn timeout(&self) -> Duration {
        self.shared.timeout()
    }

    /// Sets the bound of this communicator's waits (and of the RAFT-side handle's).
    ///
    /// # Errors
    /// `Logic` for a zero bound or an ended communicator.
    pub fn set_timeout(&self, timeout: Duration) -> Result<()> {
        const WHO: &str = "Communicator::set_timeout";
        refuse_zero_timeout(WHO, timeout)?;
        let st = self.shared.lock();
        if let Some(e) = Shared::ended_error(&st, WHO) {
            return Err(e);
        }
        self.shared.native.set_timeout(WHO, timeout)?;
        self.shared.timeout_ns.store(nanos(timeout), Ordering::Relaxed);
        Ok(())
    }

    /// The error that ended this communicator (aborted, released), if it has ended: also an
    /// abort made where the Rust side does not see it (RAFT's `sync_stream` through
    /// [`install`](Self::install), or an abort of another rank of its clique).
    pub fn ended(&self) -> Option<Error> {
        let sh = &self.shared;
        let mut st = sh.lock();
        // Not while an open group holds calls on it (NCCL owns it until the group ends), nor
        // once the exit has decided (no native call any more).
        if st.ended.is_none() && sh.groups.load(Ordering::Acquire) == 0 && raft_exit::native_release_allowed() {
            // The shim refuses (`Logic`) a communicator it ended; other errors are the
            // watchdog's and `sync`'s to act on.
            if let Err(e) = sh.native.query("Communicator::ended", None) {
                if e.kind() == ErrorKind::Logic {
                    st.ended = Some(e);
                    st.token = None;
                }
            }
        }
        st.ended.clone()
    }

    /// Waits for the work on the resources' stream (the collectives enqueued so far), at most
    /// the communicator's timeout.
    ///
    /// While the stream is being captured into a CUDA graph its work cannot be waited for (CUDA
    /// refuses, and the refusal would invalidate the capture): the call is refused, and the
    /// communicator and the capture are left as they are.
    ///
    /// # Errors
    /// `Generic` when NCCL reported an error or the work did not finish in time: the
    /// communicator is then aborted, and every later call returns the same error; `Cuda` when
    /// the stream failed; `Logic` inside a group, on an ended communicator, or while the
    /// resources' stream is being captured (nothing is ended then).
    pub fn sync(&self) -> Result<()> {
        self.sync_within("Communicator::sync", self.timeout(), OnCapture::Refuse)
    }

    /// [`sync`](Self::sync) with another bound for this wait. Like the communicator's own
    /// bound, it is a deadline for the collectives, not a poll: when it runs out the
    /// communicator is aborted (as [`sync`](Self::sync) says).
    ///
    /// # Errors
    /// As [`sync`](Self::sync); `Logic` for a zero bound (as [`set_timeout`](Self::set_timeout)),
    /// which would abort a communicator whose collectives merely had not finished yet.
    pub fn sync_timeout(&self, timeout: Duration) -> Result<()> {
        const WHO: &str = "Communicator::sync_timeout";
        refuse_zero_timeout(WHO, timeout)?;
        self.sync_within(WHO, timeout, OnCapture::Refuse)
    }

    fn sync_within(&self, who: &'static str, timeout: Duration, on_capture: OnCapture) -> Result<()> {
        // A watchdog the OS refused a thread is started here once it can be (helper 104).
        crate::watchdog::retry_start();
        group::refuse_inside(who)?;
        let sh = &self.shared;
        let stream = sh.resources.stream().map_err(|e| e.with_who(who))?;
        let start = Instant::now();
        let mut round = 0u32;
        loop {
            {
                let mut st = sh.lock();
                // Refused while another thread's open group holds calls on it: a timeout here
                // would abort a communicator NCCL still has in that group.
                if let Some(e) = Shared::unusable(&st, who) {
                    return Err(e);
                }
                // Asked each round: a capture may begin (on another thread) during the wait. A
                // failed question (a fault of the context) lets the stream's query report it,
                // and end the communicator, as before the question existed.
                let ask = match (raft_core::stream_is_capturing(&stream), on_capture) {
                    (Ok(true), OnCapture::Refuse) => return Err(capture_refusal(who)),
                    (Ok(true), OnCapture::Event) => None,
                    (_, _) => Some(&*stream),
                };
                match sh.native.query(who, ask) {
                    // The shim answers from the event when it finds the stream captured (a capture
                    // begun since the question): `sync` promises the whole stream, so it refuses.
                    Ok(true) if on_capture == OnCapture::Refuse && raft_core::stream_is_capturing(&stream).unwrap_or(false) => {
                        return Err(capture_refusal(who));
                    }
                    Ok(true) => {
                        if st.token.is_some() && sh.native.query(who, None).unwrap_or(false) {
                            st.token = None;
                        }
                        return Ok(());
                    }
                    Ok(false) if start.elapsed() <= timeout => {}
                    Ok(false) => {
                        let e = Error::timeout(
                            who,
                            format!(
                                "the collectives did not finish within {:.1} s (a rank died, or never made the matching call); the \
                                 communicator was aborted",
                                timeout.as_secs_f64()
                            ),
                        );
                        return Err(sh.end_with(&mut st, who, e));
                    }
                    Err(e) => {
                        let message = format!("the communicator was aborted: {}", e.message());
                        let e = e.with_who(who).with_message(message);
                        return Err(sh.end_with(&mut st, who, e));
                    }
                }
            }
            backoff(&mut round);
        }
    }

    /// Every rank waits here until all have arrived (an allreduce of one int, then
    /// [`sync`](Self::sync)).
    ///
    /// # Errors
    /// As [`sync`](Self::sync).
    pub fn barrier(&self) -> Result<()> {
        const WHO: &str = "Communicator::barrier";
        group::refuse_inside(WHO)?;
        self.shared.enqueue(WHO, |n, s, mark| n.barrier(WHO, s, mark))?;
        self.sync_within(WHO, self.timeout(), OnCapture::Refuse)
    }

    /// Splits the ranks into new communicators (`ncclCommSplit`, collective over all ranks):
    /// ranks giving the same `color` end up in one, ordered by `key` (then by their rank here);
    /// `None` takes no part (and gets `None`). The new communicator uses the same resources.
    /// For a clique driven from one thread, use [`split_all`](Self::split_all).
    ///
    /// # Errors
    /// `Logic` inside a group, on an ended communicator, or for a color above `i32::MAX` (NCCL's
    /// `int`; the communicator stays usable); `Generic` when NCCL fails or does not finish within
    /// the timeout.
    pub fn split(&self, color: Option<u32>, key: i32) -> Result<Option<Communicator>> {
        const WHO: &str = "Communicator::split";
        group::refuse_inside(WHO)?;
        let sh = &self.shared;
        let mut st = sh.lock();
        if let Some(e) = Shared::unusable(&st, WHO) {
            return Err(e);
        }
        let mut child = IssuedSplit::new(sh.native.split(WHO, color, key).map_err(|e| sh.fail_unless_refused(&mut st, WHO, e))?);
        // The split completes with the parent; only then has NCCL written the child.
        sh.native.wait(WHO, self.timeout()).map_err(|e| sh.fail_unless_refused(&mut st, WHO, e))?;
        drop(st);
        child.completed();
        match child.finish(WHO, self.timeout())? {
            Some(child) => Self::new(child, sh.resources.clone(), self.timeout()).map(Some),
            None => Ok(None),
        }
    }

    /// [`split`](Self::split) of several communicators of this process at once, in one NCCL
    /// group (how one thread splits a clique): `(communicator, color, key)` for each.
    ///
    /// # Errors
    /// As [`split`](Self::split).
    pub fn split_all(parts: &[(&Communicator, Option<u32>, i32)]) -> Result<Vec<Option<Communicator>>> {
        const WHO: &str = "Communicator::split_all";
        group::refuse_inside(WHO)?;
        // Everything Rust can refuse, before any split is issued (a part refused inside the
        // group below leaves its siblings' splits issued: their children are aborted then).
        for (i, (c, color, _)) in parts.iter().enumerate() {
            if parts[..i].iter().any(|(earlier, _, _)| Arc::ptr_eq(&earlier.shared, &c.shared)) {
                // NCCL runs each split of a group on a thread of its own: two splits of one
                // parent would exchange their colors over its bootstrap connections at once
                // (the fourteenth audit).
                return Err(Error::logic(
                    WHO,
                    format!("part {i} splits a communicator an earlier part splits too: split it again in a second call"),
                ));
            }
            if let Some(color) = color {
                counts::as_int(WHO, "color", *color as usize)?;
            }
            if let Some(e) = Shared::unusable(&c.shared.lock(), WHO) {
                return Err(e);
            }
        }
        result::group_start(WHO)?;
        let mut children = Vec::with_capacity(parts.len());
        let mut first_error = None;
        for (c, color, key) in parts {
            match c.shared.native.split(WHO, *color, *key) {
                Ok(child) => children.push(Some(IssuedSplit::new(child))),
                Err(e) => {
                    first_error.get_or_insert(e);
                    children.push(None);
                }
            }
        }
        // The group's end waits for the parents: the splits complete with them.
        let parents: Vec<(&NativeComm, Option<Arc<CudaStream>>)> = parts.iter().map(|(c, _, _)| (&c.shared.native, None)).collect();
        let ended = result::group_end(WHO, &parents);
        if let Err(e) = &ended {
            // The shim aborted every parent of a failed group.
            for (c, _, _) in parts {
                let mut st = c.shared.lock();
                c.shared.end_with(&mut st, WHO, e.clone());
            }
        }
        if let Err(e) = ended {
            // The parents were aborted: the children's slots are left to NCCL. A part refused
            // before the group's end says more than the end's failure.
            return Err(first_error.unwrap_or(e));
        }
        // The splits completed: from here a child dropped unfinished (an early return) is taken
        // from its slot and aborted, never left to nobody.
        children.iter_mut().flatten().for_each(IssuedSplit::completed);
        if let Some(e) = first_error {
            return Err(e);
        }
        // Each child taken, waited for and made a communicator in turn (NCCL readies them all
        // meanwhile); a communicator made already is dropped normally should a later one fail.
        let mut made = Vec::with_capacity(parts.len());
        for (child, (c, _, _)) in children.into_iter().flatten().zip(parts) {
            made.push(match child.finish(WHO, c.timeout())? {
                Some(native) => Some(Self::new(native, c.shared.resources.clone(), c.timeout())?),
                None => None,
            });
        }
        // The shim made the children of one color a clique of their own (as for any split of a
        // clique's ranks in this process).
        Ok(made)
    }

    /// Installs this communicator into `resources` (`raft::resource::set_comms`, replacing any
    /// installed before): RAFT's and cuVS's C++ code given those resources finds it through
    /// `raft::resource::get_comms`, with its barrier on their stream. The resources may be these
    /// (see [`resources`](Self::resources)) or others on the same device.
    ///
    /// The installation has the resources to itself: it waits for a moment when no use of them
    /// is in progress on another thread (a lend, a collective through RAFT, an allocation), and
    /// holds new ones back while it installs.
    ///
    /// # Errors
    /// `Logic` for resources on another device, released resources, an ended communicator, or a
    /// call inside a use of the same resources on this thread (a lend), which it would wait for.
    pub fn install(&self, resources: &DeviceResources) -> Result<()> {
        const WHO: &str = "Communicator::install";
        if resources.device() != self.device() {
            return Err(Error::logic(
                WHO,
                format!("the communicator is on device {}, the resources on device {}", self.device(), resources.device()),
            ));
        }
        let stream = resources.stream().map_err(|e| e.with_who(WHO))?;
        // Not held across the wait below: a lend on another thread that syncs this communicator
        // would wait for it while the installation waits for the lend. (The shim checks again,
        // under the cell's lock, that the communicator has not ended.)
        if let Some(e) = Shared::ended_error(&self.shared.lock(), WHO) {
            return Err(e);
        }
        // Exclusive: `set_comms` replaces RAFT's comms cell, which a concurrent reader of the
        // object (another thread's lend: `installed`, `through_raft`, cuVS) could be left
        // holding a reference into once it is freed.
        resources.with_raft_resources_mut(|raft| self.shared.native.install(WHO, raft, &stream)).map_err(|e| e.with_who(WHO))?
    }

    /// Ends the communicator now (`ncclCommAbort`): work in flight is cut short; other ranks in
    /// a collective with it will fail or time out.
    ///
    /// # Errors
    /// `Generic` when NCCL's abort itself failed (the communicator is gone all the same).
    pub fn abort(self) -> Result<()> {
        const WHO: &str = "Communicator::abort";
        // Inside a group, the group's end still launches what was recorded on this communicator.
        group::refuse_inside(WHO)?;
        let sh = &self.shared;
        let mut st = sh.lock();
        st.token = None;
        if st.ended.is_some() {
            return Ok(());
        }
        // The shim aborts its clique with it.
        let outcome = sh.native.abort(WHO, "it was aborted by Communicator::abort");
        st.ended = Some(Error::logic(WHO, "the communicator was aborted by Communicator::abort"));
        outcome
    }

    /// Waits for the work in flight (bounded), then finalizes and destroys the communicator,
    /// and returns the first error; on a failure it is aborted instead.
    ///
    /// While the resources' stream is being captured into a CUDA graph the wait is for the
    /// communicator's collectives queued before the capture (their event), not for the stream,
    /// which cannot be waited for then; NCCL's finalize completes whatever else it has queued.
    ///
    /// # Errors
    /// As [`sync`](Self::sync), and `Generic` when the finalize does not complete in time (the
    /// other ranks must release theirs too).
    pub fn release(self) -> Result<()> {
        Self::release_all(vec![self])
    }

    /// [`release`](Self::release) of several communicators at once: all are finalized before
    /// any is waited for (how one thread releases a clique, whose ranks finalize together).
    ///
    /// # Errors
    /// The first error; every communicator is ended all the same.
    pub fn release_all(comms: Vec<Communicator>) -> Result<()> {
        const WHO: &str = "Communicator::release";
        group::refuse_inside(WHO)?;
        let mut first: Option<Error> = None;
        let mut note = |r: Result<()>| {
            if let Err(e) = r {
                first.get_or_insert(e);
            }
        };
        for c in &comms {
            if c.ended().is_none() {
                note(c.sync_within(WHO, c.timeout(), OnCapture::Event));
            }
        }
        let mut finalizing = Vec::new();
        for c in &comms {
            let sh = &c.shared;
            let mut st = sh.lock();
            if st.ended.is_some() {
                continue;
            }
            match sh.native.finalize(WHO) {
                Ok(()) => finalizing.push(c),
                Err(e) => note(Err(sh.end_with(&mut st, WHO, e))),
            }
        }
        for c in &finalizing {
            let sh = &c.shared;
            let r = sh.native.wait(WHO, c.timeout());
            let mut st = sh.lock();
            match r.and_then(|()| sh.native.destroy(WHO)) {
                Ok(()) => {
                    st.ended = Some(Error::logic(WHO, "the communicator was released").with_reason(Reason::Released));
                    st.token = None;
                }
                Err(e) => note(Err(sh.end_with(&mut st, WHO, e))),
            }
        }
        for c in &comms {
            let mut st = c.shared.lock();
            st.token = None;
            st.ended.get_or_insert_with(|| Error::logic(WHO, "the communicator was released").with_reason(Reason::Released));
        }
        drop(comms);
        first.map_or(Ok(()), Err)
    }
}

/// What a wait on the resources' stream does while that stream is being captured into a CUDA
/// graph. The stream itself is never queried then: CUDA refuses the query and invalidates the
/// capture, and the refusal, read as a failure, aborted a healthy communicator.
#[derive(Clone, Copy, PartialEq, Eq)]
enum OnCapture {
    /// `sync`, `barrier`: refused (`Logic`), the communicator left as it is. The event stands for
    /// the communicator's own collectives only, not for the rest of the stream's work that
    /// `sync` promises to wait for (kernels, copies, RAFT's collectives through `install`,
    /// which record no event).
    Refuse,
    /// `release`: the communicator's event answers (recorded after every collective of this API
    /// and at a group's end, never inside a capture, since collectives are refused on a
    /// capturing stream): the collectives queued before the capture are waited for, and NCCL's
    /// finalize completes the rest of its own work.
    Event,
}

/// `sync`'s refusal on a stream being captured.
fn capture_refusal(who: &'static str) -> Error {
    Error::logic(
        who,
        "the resources' stream is being captured into a CUDA graph: its work cannot be waited for until the capture \
         ends (the communicator and the capture are left as they are)",
    )
}

/// A few yields, then short sleeps: a wait that ends at once costs little, a long one little CPU.
pub(crate) fn backoff(round: &mut u32) {
    if *round < 64 {
        std::thread::yield_now();
    } else {
        std::thread::sleep(Duration::from_micros(if *round < 1024 { 20 } else { 200 }));
    }
    *round = round.saturating_add(1);
}

impl Drop for Communicator {
    fn drop(&mut self) {
        if !raft_exit::native_release_allowed() {
            return; // the exit has decided: leaked to the OS
        }
        let sh = &self.shared;
        let mut st = sh.lock();
        if st.ended.is_some() || !matches!(st.closing, Closing::No) {
            return;
        }
        st.closing = Closing::Requested(ReleaseToken::register(sh.label("release of communicator")));
        let start_watching = !st.watched;
        st.watched = true;
        drop(st);
        if start_watching {
            watchdog::watch(sh.clone());
        }
    }
}

impl fmt::Debug for Communicator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Communicator")
            .field("rank", &self.rank())
            .field("size", &self.size())
            .field("device", &self.device())
            .field("ended", &self.shared.state.try_lock().map(|s| s.ended.is_some()).ok())
            .finish()
    }
}

impl fmt::Display for Communicator {
    /// `rank 1 of 2 on cuda:1`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rank {} of {} on cuda:{}", self.rank(), self.size(), self.device())
    }
}

/// Every bound a communicator takes (its making, `set_timeout`, `sync_timeout`) refuses zero:
/// each wait under it would be over before it began, and a wait that runs out aborts the
/// communicator (and its clique), healthy or not.
fn refuse_zero_timeout(who: &'static str, timeout: Duration) -> Result<()> {
    if timeout.is_zero() {
        return Err(Error::logic(
            who,
            "a zero timeout (every wait would be over before it began, and a wait that runs out aborts the communicator)",
        ));
    }
    Ok(())
}
