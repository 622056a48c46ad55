//! The FFI of copies: page-locked host memory (RMM's `pinned_host_memory_resource`,
//! `cuMemHostRegister`), CUDA events, stream joins and the copy calls, with the ownership rules
//! that keep every byte a copy touches alive and unaliased until the copy has finished.
//!
//! A copy runs after the call that queued it has returned, so a borrow alone cannot protect what
//! it touches: a guard holding the borrow can be forgotten (`mem::forget`), and the borrow then
//! ends while the GPU still reads or writes. Each shape here is sound whatever safe code does
//! with its handles:
//! - [`InFlight`] owns both ends (they are moved in) until its event has completed. Waited for,
//!   it gives them back; dropped early, [`InFlight::into_deferred`] hands them to a closure that
//!   waits first; forgotten (or after a failed wait), they are leaked, never freed.
//! - [`CopyScope`] borrows both ends for `'scope`, which ends only after [`run_scope`] has waited
//!   for the scope's stream, also when the body panics: the `std::thread::scope` shape, where the
//!   caller never holds the scope by value and so cannot forget it.
//! - [`StagingBuffers`] (pageable memory) never lets the device touch the caller's memory: it
//!   copies through page-locked buffers it owns, and waits for a buffer's last copy before the
//!   host touches that buffer again or frees it.
//!
//! Device memory needs no guard: every use of a [`NativeBuffer`] is ordered on its own stream or
//! follows a host wait, and a copy queued on another stream first waits for the buffer's stream
//! (and, for [`copy_device_ordered`], which returns at once, the buffer's stream then waits for
//! the copy). Stream-ordered frees therefore come after the copy.
use super::{bind, stream_sync, ContextGuard, DeviceScalar, NativeBuffer, NativeMr};
use crate::error::{Error, ErrorKind, Result};
use cudarc::driver::{result as cu, sys as cusys, CudaContext, CudaStream};
use raft_sys as sys;
use std::ffi::c_void;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

fn driver(who: &'static str) -> impl Fn(cudarc::driver::DriverError) -> Error {
    move |e| Error::driver(who, e)
}

fn same_context(a: &CudaContext, b: &CudaContext) -> bool {
    a.cu_ctx() == b.cu_ctx()
}

fn same_stream(a: &CudaStream, b: &CudaStream) -> bool {
    a.cu_stream() == b.cu_stream() && same_context(a.context(), b.context())
}

// ---- events and joins ------------------------------------------------------------------------

/// A CUDA event (timing disabled) of one context: what a copy's waiter waits for.
pub(crate) struct NativeEvent {
    event: cusys::CUevent,
    ctx: Arc<CudaContext>,
}

// SAFETY: a CUevent may be recorded, queried, waited for and destroyed from any thread (the
// driver is thread-safe); it is destroyed exactly once, in Drop.
unsafe impl Send for NativeEvent {}
// SAFETY: as above; shared use only queries or waits for the event.
unsafe impl Sync for NativeEvent {}

impl NativeEvent {
    /// An event on `ctx`: a spare one of that context, or a new one (the caller's guard puts
    /// the thread's context back afterwards).
    fn create(who: &'static str, ctx: &Arc<CudaContext>, _guard: &ContextGuard) -> Result<Self> {
        if let Some(event) = spare_events::take(ctx) {
            return Ok(NativeEvent { event, ctx: ctx.clone() });
        }
        bind(who, ctx)?;
        let event = cu::event::create(cusys::CUevent_flags::CU_EVENT_DISABLE_TIMING).map_err(driver(who))?;
        Ok(NativeEvent { event, ctx: ctx.clone() })
    }

    /// Records the work queued on `stream` so far.
    fn record(&self, who: &'static str, stream: &CudaStream, _guard: &ContextGuard) -> Result<()> {
        if !same_context(stream.context(), &self.ctx) {
            return Err(Error::logic(who, "an event can only record a stream of its own device"));
        }
        bind(who, &self.ctx)?;
        // SAFETY: the event is alive (owned by self) and the stream is alive for the borrow; both
        // belong to the context bound above.
        unsafe { cu::event::record(self.event, stream.cu_stream()) }.map_err(driver(who))
    }

    /// Blocks until the recorded work has finished.
    pub(crate) fn wait(&self, who: &'static str) -> Result<()> {
        // SAFETY: the event is alive (owned by self); waiting binds no context (as for a
        // stream, see `stream_sync`), and is not refused under a capture (`relaxed`).
        super::relaxed(|| unsafe { cu::event::synchronize(self.event) }).map_err(driver(who))
    }

    /// Whether the recorded work has finished (an error: it failed).
    pub(crate) fn is_complete(&self, who: &'static str) -> Result<bool> {
        // SAFETY: the event is alive (owned by self); a query binds nothing.
        match unsafe { cu::event::query(self.event) } {
            Ok(()) => Ok(true),
            Err(e) if e.0 == cusys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            Err(e) => Err(Error::driver(who, e)),
        }
    }
}

impl Drop for NativeEvent {
    fn drop(&mut self) {
        if !raft_exit::native_release_allowed() {
            return; // the exit has decided: leaked to the OS, no CUDA call
        }
        if spare_events::keep(&self.ctx, self.event) {
            return;
        }
        let Ok(_keep) = ContextGuard::save("copy event") else { return };
        if bind("copy event", &self.ctx).is_err() {
            return;
        }
        // SAFETY: destroyed exactly once (here). An event still pending is released by the
        // driver once it completes; a stream that waits for it keeps what it recorded.
        if let Err(e) = unsafe { cu::event::destroy(self.event) } {
            log::debug!(target: "raft", "destroying a copy event: {}", crate::error::describe_driver_error(&e));
        }
    }
}

/// Events kept for reuse: making and destroying one per copy costs microseconds, a tenth of a
/// 1 MiB copy. An event is kept with its context (a primary context, retained for the process);
/// one taken back is recorded afresh before any use, and re-recording leaves what earlier waits
/// captured unchanged.
mod spare_events {
    use cudarc::driver::{sys as cusys, CudaContext};
    use std::sync::Mutex;

    /// Most events kept, all contexts together.
    const MOST: usize = 256;

    /// `(context, event)` as addresses: plain handles, used only by the driver.
    static SPARE: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());

    pub(super) fn take(ctx: &CudaContext) -> Option<cusys::CUevent> {
        let mut spare = SPARE.lock().unwrap_or_else(|e| e.into_inner());
        let i = spare.iter().rposition(|(c, _)| *c == ctx.cu_ctx() as usize)?;
        Some(spare.swap_remove(i).1 as cusys::CUevent)
    }

    /// Keeps `event` of `ctx` for reuse; false when enough are kept (then destroy it).
    pub(super) fn keep(ctx: &CudaContext, event: cusys::CUevent) -> bool {
        let mut spare = SPARE.lock().unwrap_or_else(|e| e.into_inner());
        if spare.len() >= MOST {
            return false;
        }
        spare.push((ctx.cu_ctx() as usize, event as usize));
        true
    }
}

/// Makes `waiter` wait, on the device and without blocking the host, for the work queued on `on`
/// so far.
fn join(who: &'static str, waiter: &CudaStream, on: &CudaStream, guard: &ContextGuard) -> Result<()> {
    if same_stream(waiter, on) {
        return Ok(());
    }
    let event = NativeEvent::create(who, on.context(), guard)?;
    event.record(who, on, guard)?;
    bind(who, waiter.context())?;
    // SAFETY: the stream and the event are alive for the call; a stream may wait for an event of
    // another context. The event may be destroyed right after: the wait keeps what it recorded.
    unsafe { cu::stream::wait_event(waiter.cu_stream(), event.event, cusys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT) }
        .map_err(driver(who))
}

// ---- the ends of a copy ----------------------------------------------------------------------

/// Host bytes borrowed for `'a`, shared, of which `locked` (relative to `addr`) is page-locked
/// memory that the borrow keeps page-locked: made only from a [`NativeHostBuffer`] (all of it)
/// or a registration (its whole pages). The rest is pageable, copied as such.
pub struct HostRef<'a> {
    addr: usize,
    bytes: usize,
    locked: std::ops::Range<usize>,
    _borrow: PhantomData<&'a [u8]>,
}

/// Host bytes borrowed exclusively for `'a` (see [`HostRef`]).
pub struct HostMut<'a> {
    addr: usize,
    bytes: usize,
    locked: std::ops::Range<usize>,
    _borrow: PhantomData<&'a mut [u8]>,
}

impl HostRef<'_> {
    /// # Safety
    /// `addr..addr + bytes` is host memory borrowed (shared) for the result's life, and its part
    /// `locked` stays page-locked meanwhile.
    pub(crate) unsafe fn new(addr: usize, bytes: usize, locked: std::ops::Range<usize>) -> Self {
        HostRef { addr, bytes, locked, _borrow: PhantomData }
    }
}

impl HostMut<'_> {
    /// # Safety
    /// As [`HostRef::new`], borrowed exclusively.
    pub(crate) unsafe fn new(addr: usize, bytes: usize, locked: std::ops::Range<usize>) -> Self {
        HostMut { addr, bytes, locked, _borrow: PhantomData }
    }
}

/// The two ends of one copy, each borrowed for `'a`.
pub(crate) enum Ends<'a> {
    /// Page-locked host memory into device memory.
    ToDevice(HostRef<'a>, &'a mut NativeBuffer),
    /// Device memory into page-locked host memory.
    ToHost(&'a NativeBuffer, HostMut<'a>),
    /// Device memory into device memory, on one device or between two.
    Device(&'a NativeBuffer, &'a mut NativeBuffer),
}

/// A copy's addresses and byte counts, and its device ends.
struct Plan<'e> {
    dst: u64,
    src: u64,
    dst_bytes: usize,
    src_bytes: usize,
    src_device: Option<&'e NativeBuffer>,
    dst_device: Option<&'e NativeBuffer>,
    /// The page-locked bytes of the host end (the rest is pageable).
    locked: std::ops::Range<usize>,
}

impl Ends<'_> {
    fn plan(&self) -> Plan<'_> {
        match self {
            Ends::ToDevice(h, d) => Plan {
                dst: d.data as u64,
                src: h.addr as u64,
                dst_bytes: d.bytes,
                src_bytes: h.bytes,
                src_device: None,
                dst_device: Some(d),
                locked: h.locked.clone(),
            },
            Ends::ToHost(d, h) => Plan {
                dst: h.addr as u64,
                src: d.data as u64,
                dst_bytes: h.bytes,
                src_bytes: d.bytes,
                src_device: Some(d),
                dst_device: None,
                locked: h.locked.clone(),
            },
            Ends::Device(s, d) => Plan {
                dst: d.data as u64,
                src: s.data as u64,
                dst_bytes: d.bytes,
                src_bytes: s.bytes,
                src_device: Some(s),
                dst_device: Some(d),
                locked: 0..0,
            },
        }
    }
}

/// A host copy of `bytes` as `(offset, length)` pieces: the pageable head, the page-locked
/// `locked` bytes, the pageable tail (empty ones left out; all of it when nothing is locked).
fn host_pieces(bytes: usize, locked: &std::ops::Range<usize>) -> impl Iterator<Item = (usize, usize)> {
    let (lo, hi) = if locked.is_empty() { (0, bytes) } else { (locked.start.min(bytes), locked.end.min(bytes)) };
    [(0, lo), (lo, hi - lo), (hi, bytes - hi)].into_iter().filter(|(_, len)| *len > 0)
}

/// Checks a copy before any CUDA call: equal sizes, and a stream that can reach both ends (a
/// host/device copy runs on a stream of the device end's device; a device copy on a stream of
/// either device).
fn check_copy(who: &'static str, stream_device: usize, ends: &Ends<'_>) -> Result<()> {
    let p = ends.plan();
    if p.src_bytes != p.dst_bytes {
        return Err(Error::logic(who, format!("a copy of {} bytes into {} bytes", p.src_bytes, p.dst_bytes)));
    }
    let mut devices = [p.src_device, p.dst_device].into_iter().flatten().map(|b| b.device).peekable();
    if devices.peek().is_some() && !devices.clone().any(|d| d == stream_device) {
        let on = devices.map(|d| d.to_string()).collect::<Vec<_>>().join(" and ");
        return Err(Error::logic(
            who,
            format!("a copy between arrays on device {on} cannot run on the stream of resources on device {stream_device}"),
        ));
    }
    Ok(())
}

/// Why a queue failed, and whether the copy may still run (its stream could not be drained):
/// then nothing it touches may be freed or reused, ever.
pub(crate) struct QueueError {
    pub(crate) error: Error,
    pub(crate) maybe_in_flight: bool,
}

impl From<Error> for QueueError {
    fn from(error: Error) -> Self {
        QueueError { error, maybe_in_flight: false }
    }
}

/// Checks a copy, then queues it on `stream` after the work queued so far on the streams of its
/// device ends, and records an event after it when `record`; with `join_after`, those streams
/// then wait for the copy. When a step after the copy fails, the stream is drained before the
/// error returns (so the ends may be dropped), unless draining fails too (`maybe_in_flight`).
fn queue(
    who: &'static str,
    stream: &Arc<CudaStream>,
    ends: &Ends<'_>,
    record: bool,
    join_after: bool,
) -> std::result::Result<Option<NativeEvent>, QueueError> {
    check_copy(who, stream.context().ordinal(), ends)?;
    let p = ends.plan();
    let device_ends = [p.src_device, p.dst_device];
    let device_ends = device_ends.iter().flatten();
    // Never into a graph being captured (on the copy's stream, or on a stream it joins, whose
    // captured event would pull the copy into the capture): the graph would copy at each launch,
    // after the memory's borrow (or the arrays themselves) may be gone.
    let streams = || std::iter::once(&**stream).chain(device_ends.clone().map(|b| &*b.stream));
    super::refuse_capture(who, streams())?;
    // A copy between two devices binds other contexts (joins with the other device's stream,
    // peer access): its guard reads and puts back the thread's context whatever happens. A copy
    // within one context binds only that one: one read for the whole queue
    // (`ContextGuard::bind`).
    let crosses = device_ends.clone().any(|b| !same_context(b.stream.context(), stream.context()));
    let guard = if crosses { ContextGuard::save(who)? } else { ContextGuard::bind(who, stream.context())? };
    if p.src_bytes > 0 {
        for b in device_ends.clone() {
            join(who, stream, &b.stream, &guard)?;
        }
    }
    let event = if record { Some(NativeEvent::create(who, stream.context(), &guard)?) } else { None };
    if p.src_bytes > 0 {
        let peer = match (p.src_device, p.dst_device) {
            (Some(s), Some(d)) if s.device != d.device => Some((s, d)),
            _ => None,
        };
        if let Some((s, d)) = peer {
            enable_peer_access(who, s, d);
        }
        if crosses {
            bind(who, stream.context())?;
        }
        let queued = match peer {
            // SAFETY: `src` and `dst` are the `bytes` bytes of two live device buffers (borrowed
            // for the call by `ends`, the destination exclusively; equal sizes checked above),
            // each given with its own context; the stream belongs to one of the two devices
            // (checked). Every caller (`InFlight`, `CopyScope`, `copy_device_ordered`) keeps both
            // ends alive and untouched until the copy is done (see the module documentation).
            Some((s, d)) => unsafe {
                cusys::cuMemcpyPeerAsync(
                    p.dst,
                    d.stream.context().cu_ctx(),
                    p.src,
                    s.stream.context().cu_ctx(),
                    p.src_bytes,
                    stream.cu_stream(),
                )
            },
            // SAFETY: as above, for two addresses of one device, or one device buffer and host
            // memory (a `HostRef`/`HostMut`, made only from memory this module allocated or
            // registered), its page-locked part `p.locked` copied as such and the rest as
            // pageable memory, whose copies return once the host bytes are read (to the device)
            // or written (to the host). The typed calls name each end's kind, sparing the
            // driver the address lookup that cuMemcpyAsync makes on every call (about a
            // microsecond, a tenth of a 1 MiB device copy).
            None => unsafe {
                match (p.src_device.is_some(), p.dst_device.is_some()) {
                    (true, true) => cusys::cuMemcpyDtoDAsync_v2(p.dst, p.src, p.src_bytes, stream.cu_stream()),
                    (to_device, _) => host_pieces(p.src_bytes, &p.locked)
                        .map(|(at, len)| {
                            let (dst, src) = (p.dst + at as u64, p.src + at as u64);
                            match to_device {
                                true => cusys::cuMemcpyHtoDAsync_v2(dst, src as *const c_void, len, stream.cu_stream()),
                                false => cusys::cuMemcpyDtoHAsync_v2(dst as *mut c_void, src, len, stream.cu_stream()),
                            }
                        })
                        .find(|rc| *rc != cusys::CUresult::CUDA_SUCCESS)
                        .unwrap_or(cusys::CUresult::CUDA_SUCCESS),
                }
            },
        };
        if let Err(e) = queued.result() {
            // A host copy in pieces may have queued some: drained before the ends go back.
            let maybe_in_flight = stream_sync(who, stream).is_err();
            return Err(QueueError { error: Error::driver(who, e), maybe_in_flight });
        }
    }
    let after = (|| -> Result<()> {
        if let Some(e) = &event {
            e.record(who, stream, &guard)?;
        }
        if join_after && p.src_bytes > 0 {
            for b in device_ends.clone() {
                join(who, &b.stream, stream, &guard)?;
            }
        }
        Ok(())
    })();
    // A capture begun meanwhile on another thread may have taken the copy, or the event after
    // it, into its graph: then whether the copy ran, and when it ends, cannot be known, and the
    // borrow of its ends must not end. Such a race is the caller's; the process stops.
    if super::refuse_capture(who, streams()).is_err() {
        eprintln!("{who}: a CUDA graph capture began on a stream while a copy was queued on it; aborting");
        std::process::abort();
    }
    if let Err(error) = after {
        // The copy is queued but cannot be waited for as planned: wait for it here.
        let maybe_in_flight = stream_sync(who, stream).is_err();
        return Err(QueueError { error, maybe_in_flight });
    }
    Ok(event)
}

// ---- copies that own their ends --------------------------------------------------------------

/// A copy that owns its ends `B` until it has finished (see the module documentation).
pub(crate) struct InFlight<B: Send + 'static> {
    buffers: Option<B>,
    event: Option<NativeEvent>,
}

impl<B: Send + 'static> InFlight<B> {
    /// Queues, on `stream`, the copy between the ends that `ends` picks out of `buffers`, and
    /// takes `buffers` until it has finished. `ends` can only return what it borrows from
    /// `buffers` (or a leaked `'static` nothing else can reach), so holding `buffers` holds
    /// every byte the copy touches. On an error the buffers come back unless the copy may still
    /// run (then they are leaked).
    pub(crate) fn start(
        who: &'static str,
        stream: &Arc<CudaStream>,
        mut buffers: B,
        ends: for<'x> fn(&'x mut B) -> Ends<'x>,
    ) -> std::result::Result<Self, (Error, Option<B>)> {
        let queued = queue(who, stream, &ends(&mut buffers), true, false);
        match queued {
            Ok(event) => Ok(InFlight { buffers: Some(buffers), event }),
            Err(QueueError { error, maybe_in_flight: true }) => {
                std::mem::forget(buffers);
                Err((error, None))
            }
            Err(QueueError { error, maybe_in_flight: false }) => Err((error, Some(buffers))),
        }
    }

    /// Whether the copy has finished (an error: it failed).
    pub(crate) fn is_complete(&self, who: &'static str) -> Result<bool> {
        self.event.as_ref().map_or(Ok(true), |e| e.is_complete(who))
    }

    /// Waits for the copy and gives the buffers back. When the wait fails, the copy's state is
    /// unknown: the buffers are leaked, never freed.
    pub(crate) fn wait(mut self, who: &'static str) -> Result<B> {
        let buffers = self.buffers.take().expect("an InFlight holds its buffers until waited for");
        match self.event.take().map_or(Ok(()), |e| e.wait(who)) {
            Ok(()) => Ok(buffers),
            Err(e) => {
                std::mem::forget(buffers);
                Err(e)
            }
        }
    }

    /// What an abandoned copy leaves to a release thread: wait for it, then drop the buffers
    /// (leaked when the wait fails, or once the exit has decided).
    pub(crate) fn into_deferred(mut self, who: &'static str) -> impl FnOnce() + Send + 'static {
        let buffers = self.buffers.take();
        let event = self.event.take();
        move || {
            if !raft_exit::native_release_allowed() {
                std::mem::forget(buffers);
                std::mem::forget(event);
                return;
            }
            match event.map_or(Ok(()), |e| e.wait(who)) {
                Ok(()) => drop(buffers),
                Err(e) => {
                    // Forgotten before anything else runs: a logger that panics must not drop
                    // them while the copy may still use them.
                    std::mem::forget(buffers);
                    log::warn!(target: "raft", "{e} (the copy's buffers are leaked)");
                }
            }
        }
    }
}

impl<B: Send + 'static> Drop for InFlight<B> {
    /// Never blocks: buffers still held here (an `InFlight` dropped without `wait` or
    /// `into_deferred`) are leaked, as the copy may still use them.
    fn drop(&mut self) {
        if let Some(b) = self.buffers.take() {
            std::mem::forget(b);
        }
    }
}

// ---- copies scoped to a closure --------------------------------------------------------------

/// Copies queued on a resources' stream that borrow their ends until the end of
/// [`DeviceResources::copy_scope`](crate::DeviceResources::copy_scope), which waits for all of
/// them before it returns (also when the body panics or returns early).
///
/// The borrows last `'scope`, a lifetime the body cannot end early: an end dropped, moved or
/// written by the host while a copy may use it is a compile error, and there is no guard to
/// forget. The shape of [`std::thread::scope`].
///
/// # Thread safety
/// `Sync`: copies may be queued from threads the body starts (e.g. its own scoped threads).
pub struct CopyScope<'scope, 'env: 'scope> {
    stream: Arc<CudaStream>,
    live: Box<dyn Fn() -> bool + Send + Sync + 'env>,
    /// The event recorded after the scope's latest copy (queued and recorded under this lock,
    /// so the latest recorded is the latest on the stream): what the scope's end waits for.
    last: Mutex<Option<NativeEvent>>,
    scope: PhantomData<&'scope mut &'scope ()>,
    env: PhantomData<&'env mut &'env ()>,
}

static_assertions::assert_impl_all!(CopyScope<'static, 'static>: Sync);

/// Runs `body` with a scope on `stream`, then waits for the stream: every copy queued through the
/// scope has finished before any borrow it holds can end. `live` says whether the stream's
/// resources are still unreleased (for the scope's methods to refuse released ones).
pub(crate) fn run_scope<'env, R>(
    who: &'static str,
    stream: Arc<CudaStream>,
    live: Box<dyn Fn() -> bool + Send + Sync + 'env>,
    body: impl for<'scope> FnOnce(&'scope CopyScope<'scope, 'env>) -> R,
) -> Result<R> {
    let scope = CopyScope { stream, live, last: Mutex::new(None), scope: PhantomData, env: PhantomData };
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(&scope)));
    // Every copy of the scope is on this stream, in order: once the event after the latest has
    // completed, the GPU no longer touches anything the body lent. An event rather than the
    // stream: a stream the body began capturing into a CUDA graph cannot be synchronised. Every
    // event was recorded outside any capture (`queue` refuses a capturing stream, and stops the
    // process when a capture began under it), so the relaxed wait can happen whatever the
    // stream's capture state now. A failed wait is then a fault of the stream's context, which
    // stops all its work; one the driver refused instead must not end the borrows.
    let last = scope.last.lock().unwrap_or_else(|e| e.into_inner()).take();
    let waited = last.map_or(Ok(()), |event| event.wait(who));
    if let Err(e) = &waited {
        if e.message().contains("CAPTURE") {
            eprintln!("{e}: a copy scope could not wait for its copies; aborting rather than end their borrows");
            std::process::abort();
        }
    }
    match outcome {
        Ok(r) => waited.map(|()| r),
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

impl<'scope, 'env> CopyScope<'scope, 'env> {
    /// Queues a copy between ends borrowed for the rest of the scope.
    pub(crate) fn queue(&'scope self, who: &'static str, ends: Ends<'scope>) -> Result<()> {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        match queue(who, &self.stream, &ends, true, false) {
            Ok(event) => {
                if event.is_some() {
                    *last = event;
                }
                Ok(())
            }
            Err(q) => Err(q.error),
        }
    }

    /// Whether the scope's resources are unreleased.
    pub(crate) fn is_live(&self) -> bool {
        (self.live)()
    }

    /// The device of the scope's stream.
    pub(crate) fn device(&self) -> usize {
        self.stream.context().ordinal()
    }
}

/// Lets the two devices of a peer copy reach each other's memory, so that the copy goes over
/// their link (run 24: 37.6 GB/s through the host, against 396 GB/s for the driver's own peer
/// copy with access enabled): peer access between the two primary contexts, once per pair
/// (`cuCtxEnablePeerAccess` both ways, where `cuDeviceCanAccessPeer` allows it), and access for
/// the peer to each buffer's async pool (the shim, once per pool). As PyTorch does, on the first
/// peer copy. A failure only costs speed (the driver then stages the copy through the host):
/// it is logged, never returned.
fn enable_peer_access(who: &'static str, a: &NativeBuffer, b: &NativeBuffer) {
    static PAIRS: std::sync::Mutex<Vec<(usize, usize)>> = std::sync::Mutex::new(Vec::new());
    let pair = (a.device.min(b.device), a.device.max(b.device));
    let mut pairs = PAIRS.lock().unwrap_or_else(|e| e.into_inner());
    if !pairs.contains(&pair) {
        let (ca, cb) = (a.stream.context(), b.stream.context());
        let can = |x: &CudaContext, y: &CudaContext| {
            let mut can = 0i32;
            // SAFETY: writes one int for two valid device handles.
            let rc = unsafe { cusys::cuDeviceCanAccessPeer(&mut can, x.cu_device(), y.cu_device()) };
            rc == cusys::CUresult::CUDA_SUCCESS && can != 0
        };
        if can(ca, cb) && can(cb, ca) {
            for (x, y) in [(ca, cb), (cb, ca)] {
                let enabled = bind(who, x).and_then(|()| {
                    // SAFETY: `x` is bound to this thread (the caller's guard puts the thread's
                    // own context back) and `y` is a live primary context of another device.
                    match unsafe { cusys::cuCtxEnablePeerAccess(y.cu_ctx(), 0) } {
                        cusys::CUresult::CUDA_SUCCESS | cusys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => Ok(()),
                        rc => Err(Error::driver(who, cudarc::driver::DriverError(rc))),
                    }
                });
                if let Err(e) = enabled {
                    log::warn!(target: "raft", "peer access between devices {} and {} not enabled: {e}", a.device, b.device);
                }
            }
        }
        pairs.push(pair);
    }
    drop(pairs);
    for (buf, peer) in [(a, b.device), (b, a.device)] {
        if let Err(e) = buf.grant_peer(who, peer) {
            log::warn!(target: "raft", "device {peer} not given access to an array of device {}: {e}", buf.device);
        }
    }
}

/// Queues a device-to-device copy on `dst`'s own stream after the work queued so far on `src`'s
/// stream; `src`'s stream then waits for it. Returns once queued: every later use of either
/// buffer is ordered after the copy by its own stream.
/// Copies between page-locked host memory and a device buffer on the buffer's own stream,
/// after the work queued there; returns once the copy has finished (an event after it).
pub(crate) fn copy_page_locked(who: &'static str, ends: Ends<'_>) -> Result<()> {
    let stream = match &ends {
        Ends::ToDevice(_, d) => d.stream.clone(),
        Ends::ToHost(s, _) | Ends::Device(s, _) => s.stream.clone(),
    };
    match queue(who, &stream, &ends, true, false) {
        Ok(Some(event)) => event.wait(who),
        Ok(None) => Ok(()),
        Err(q) => Err(q.error),
    }
}

pub(crate) fn copy_device_ordered(who: &'static str, src: &NativeBuffer, dst: &mut NativeBuffer) -> Result<()> {
    let stream = dst.stream.clone();
    queue(who, &stream, &Ends::Device(src, dst), false, true).map(drop).map_err(|q| q.error)
}

// ---- page-locked host memory -----------------------------------------------------------------

/// Page-locked host memory from RMM's `pinned_host_memory_resource` (`cudaHostAlloc`), holding
/// (a shared copy of) the resource that frees it; initialised when made (zeroed or copied in),
/// so every byte is a value.
pub(crate) struct NativeHostBuffer {
    buffer: NativeBuffer,
}

impl NativeHostBuffer {
    fn alloc(who: &'static str, ctx: &Arc<CudaContext>, mr: &NativeMr, bytes: usize) -> Result<NativeBuffer> {
        if mr.kind(who)? != sys::RAFTRS_MR_PINNED_HOST {
            return Err(Error::logic(who, "page-locked host memory comes only from a pinned host memory resource"));
        }
        if mr.device() != ctx.ordinal() {
            return Err(Error::logic(
                who,
                format!("a memory resource of device {} cannot allocate for device {}", mr.device(), ctx.ordinal()),
            ));
        }
        // The pinned resource ignores the stream; the legacy default stream is only a name here,
        // and nothing is ever ordered on it.
        NativeBuffer::create(who, mr.device(), Some(mr), &ctx.default_stream(), bytes)
    }

    /// `bytes` zeroed bytes of page-locked memory from `mr` (made for `ctx`'s device).
    pub(crate) fn zeroed(who: &'static str, ctx: &Arc<CudaContext>, mr: &NativeMr, bytes: usize) -> Result<Self> {
        let buffer = Self::alloc(who, ctx, mr, bytes)?;
        if bytes > 0 {
            // SAFETY: `data` is `bytes` bytes of host memory the new buffer owns, which nothing
            // else refers to yet.
            unsafe { std::ptr::write_bytes(buffer.data as *mut u8, 0, bytes) };
        }
        Ok(NativeHostBuffer { buffer })
    }

    /// A page-locked copy of `host`, from `mr`.
    pub(crate) fn copied<T: DeviceScalar>(who: &'static str, ctx: &Arc<CudaContext>, mr: &NativeMr, host: &[T]) -> Result<Self> {
        let bytes = std::mem::size_of_val(host);
        let buffer = Self::alloc(who, ctx, mr, bytes)?;
        if bytes > 0 {
            // SAFETY: `data` is `bytes` bytes of host memory the new buffer owns; `host` is as
            // many bytes, borrowed, and cannot overlap memory allocated just now.
            unsafe { std::ptr::copy_nonoverlapping(host.as_ptr() as *const u8, buffer.data as *mut u8, bytes) };
        }
        Ok(NativeHostBuffer { buffer })
    }

    pub(crate) fn bytes(&self) -> usize {
        self.buffer.bytes
    }

    pub(crate) fn device(&self) -> usize {
        self.buffer.device
    }

    /// Panics unless `len` elements of `T` fit, aligned: a caller's bug, never memory unsafety.
    fn check_fits<T>(&self, len: usize) {
        let fits = len.checked_mul(std::mem::size_of::<T>()).is_some_and(|b| b <= self.buffer.bytes);
        assert!(fits, "{len} elements do not fit in {} bytes of page-locked memory", self.buffer.bytes);
        assert!((self.buffer.data as usize) % std::mem::align_of::<T>() == 0, "page-locked memory misaligned");
    }

    /// The first `len` elements, read by the host.
    pub(crate) fn as_slice<T: DeviceScalar>(&self, len: usize) -> &[T] {
        if len == 0 {
            return &[];
        }
        self.check_fits::<T>(len);
        // SAFETY: `len` aligned elements lie in the buffer (checked), all initialised (made
        // zeroed or copied in, then written only with values: any bit pattern is a `T`); no
        // copy writes them while this shared borrow lives (copies need `&mut` or ownership).
        unsafe { std::slice::from_raw_parts(self.buffer.data as *const T, len) }
    }

    /// The first `len` elements, written by the host.
    pub(crate) fn as_mut_slice<T: DeviceScalar>(&mut self, len: usize) -> &mut [T] {
        if len == 0 {
            return &mut [];
        }
        self.check_fits::<T>(len);
        // SAFETY: as for `as_slice`; the exclusive borrow excludes every other use, copies
        // included.
        unsafe { std::slice::from_raw_parts_mut(self.buffer.data as *mut T, len) }
    }

    pub(crate) fn host_ref(&self) -> HostRef<'_> {
        HostRef { addr: self.buffer.data as usize, bytes: self.buffer.bytes, locked: 0..self.buffer.bytes, _borrow: PhantomData }
    }

    pub(crate) fn host_mut(&mut self) -> HostMut<'_> {
        HostMut { addr: self.buffer.data as usize, bytes: self.buffer.bytes, locked: 0..self.buffer.bytes, _borrow: PhantomData }
    }

    /// Frees the memory (`cudaFreeHost`, which may wait for the device).
    pub(crate) fn free(self, who: &'static str) -> Result<()> {
        self.buffer.free(who)
    }

    /// Leaks the memory to the OS (at exit, once the exit has decided).
    pub(crate) fn leak(self) {
        self.buffer.leak()
    }
}

// ---- staging pageable memory through page-locked buffers -------------------------------------

struct Slot {
    host: Option<NativeHostBuffer>,
    event: NativeEvent,
    /// A copy using `host` was queued and not yet waited for.
    pending: bool,
}

/// Two page-locked buffers of one device and their events: slots of a staged copy. The host
/// touches a buffer only after the copy that last used it has finished, and the buffers are
/// freed only then (or leaked).
pub(crate) struct StagingBuffers {
    slots: [Slot; 2],
    ctx: Arc<CudaContext>,
    capacity: usize,
    /// A copy could be neither recorded nor drained: the buffers are never touched again.
    poisoned: bool,
}

impl StagingBuffers {
    /// Two zeroed buffers of `capacity` bytes from `mr` (a pinned host resource of `ctx`'s device).
    pub(crate) fn new(who: &'static str, ctx: &Arc<CudaContext>, mr: &NativeMr, capacity: usize) -> Result<Self> {
        let guard = ContextGuard::save(who)?;
        let events = [NativeEvent::create(who, ctx, &guard)?, NativeEvent::create(who, ctx, &guard)?];
        let first = NativeHostBuffer::zeroed(who, ctx, mr, capacity)?;
        let second = match NativeHostBuffer::zeroed(who, ctx, mr, capacity) {
            Ok(b) => b,
            Err(e) => {
                let _ = first.free(who); // never used by a copy
                return Err(e);
            }
        };
        let [e0, e1] = events;
        let slot = |host, event| Slot { host: Some(host), event, pending: false };
        Ok(StagingBuffers { slots: [slot(first, e0), slot(second, e1)], ctx: ctx.clone(), capacity, poisoned: false })
    }

    /// Whether a copy of these buffers could be neither recorded nor waited for: they are then
    /// never used again (and leaked when dropped).
    pub(crate) fn is_poisoned(&self) -> bool {
        self.poisoned
    }

    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    pub(crate) fn device(&self) -> usize {
        self.ctx.ordinal()
    }

    /// Waits for the copy that last used slot `i`.
    fn settle(&mut self, who: &'static str, i: usize) -> Result<()> {
        if self.poisoned {
            return Err(Error::new(ErrorKind::Cuda, who, "a staging buffer's copy could not be waited for"));
        }
        let slot = &mut self.slots[i];
        if slot.pending {
            slot.event.wait(who)?;
            slot.pending = false;
        }
        Ok(())
    }

    /// Waits for both slots' last copies.
    pub(crate) fn finish(&mut self, who: &'static str) -> Result<()> {
        let first = self.settle(who, 0);
        let second = self.settle(who, 1);
        first.and(second)
    }

    fn data(&self, i: usize) -> *mut u8 {
        self.slots[i].host.as_ref().expect("a staging slot holds its buffer until freed").buffer.data as *mut u8
    }
}

/// How a staged copy is cut: pieces of `piece` bytes, each one device copy through one
/// page-locked slot, filled (or emptied) by the host in sub-pieces of `sub` bytes, each taken by
/// whichever of the copy's threads is free; `stores`: how the host threads write
/// ([`copy_host_bytes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StagedCut {
    pub(crate) piece: usize,
    pub(crate) sub: usize,
    pub(crate) stores: HostStores,
}

/// How the host threads of a staged copy write: into the page-locked buffers (uploads) or into
/// the caller's memory (downloads). On other CPUs than x86-64, every kind is a plain copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum HostStores {
    /// The kind that measured fastest for the copy's direction and size (the default; GPU runs
    /// 78 and 79, an H200 beside a 16-core Xeon, each kind in turns with the native pinned
    /// copy): uploads [`Streaming`](Self::Streaming) below 32 MiB (4 MiB: 0.67x of the pinned
    /// copy against 0.40x plain; 16 MiB 0.68x / 0.55x) and [`Plain`](Self::Plain) from there
    /// (64 MiB 0.78x / 0.68x; 1 GiB 0.90x / 0.62x); downloads plain below 4 MiB (1 MiB 0.58x
    /// against 0.55x streaming) and streaming from there (4 MiB 0.72x / 0.69x; 64 MiB 0.92x /
    /// 0.85x; 1 GiB 0.97x / 0.84x).
    #[default]
    Auto,
    /// Plain stores (`memcpy`): the written lines stay in the writing core's cache (glibc's
    /// `memcpy` itself streams copies past its own threshold, several MiB at a time).
    Plain,
    /// Non-temporal stores (`movntdq`) for every whole 64-byte line of each host copy of 4 KiB or
    /// more: written straight to memory, neither read first nor kept in any cache; the ends,
    /// and smaller copies, with plain stores.
    Streaming,
}

/// Copies `len` bytes from `src` to `dst`, as `std::ptr::copy_nonoverlapping` does, writing as
/// `stores` says (see [`HostStores`]; on other CPUs than x86-64 always a plain copy).
///
/// # Safety
/// As `std::ptr::copy_nonoverlapping`: `src` valid for reads and `dst` for writes of `len`
/// bytes, the two not overlapping, and no other thread touching either range meanwhile.
pub(crate) unsafe fn copy_host_bytes(dst: *mut u8, src: *const u8, len: usize, stores: HostStores) {
    // Streaming pays from a few lines on; `Auto` is resolved before (a plain copy here).
    #[cfg(target_arch = "x86_64")]
    if stores == HostStores::Streaming && len >= 4096 {
        // SAFETY: the caller's contract, passed on; len >= 4096 >= 64.
        unsafe { copy_streaming(dst, src, len) };
        return;
    }
    let _ = stores;
    // SAFETY: the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) }
}

/// The bulk of `len` bytes written with non-temporal stores (`movntdq`), the ends with plain
/// ones.
///
/// # Safety
/// As [`copy_host_bytes`], and `len` at least 64 (the plain head, up to 63 bytes, must fit).
#[cfg(target_arch = "x86_64")]
unsafe fn copy_streaming(dst: *mut u8, src: *const u8, len: usize) {
    debug_assert!(len >= 64, "copy_streaming needs at least 64 bytes, given {len}");
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
    // Up to the destination's next 64-byte boundary with plain stores, so every streaming store
    // is aligned (movntdq requires 16) and whole cache lines are written.
    let head = (64 - (dst as usize & 63)) & 63;
    // SAFETY: head < 64 <= len (this function's contract): inside both ranges.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, head) };
    let lines = (len - head) / 64;
    for i in 0..lines {
        // SAFETY: line `i` spans bytes head + 64 i .. head + 64 (i + 1) <= len of both ranges;
        // `d` is 16-byte aligned (64-aligned by `head`); SSE2 is part of x86-64.
        unsafe {
            let s = src.add(head + 64 * i) as *const __m128i;
            let d = dst.add(head + 64 * i) as *mut __m128i;
            let (a, b, c, e) = (_mm_loadu_si128(s), _mm_loadu_si128(s.add(1)), _mm_loadu_si128(s.add(2)), _mm_loadu_si128(s.add(3)));
            _mm_stream_si128(d, a);
            _mm_stream_si128(d.add(1), b);
            _mm_stream_si128(d.add(2), c);
            _mm_stream_si128(d.add(3), e);
        }
    }
    let done = head + 64 * lines;
    // SAFETY: the rest, done..len, inside both ranges. The fence orders the streaming stores
    // before every later store of this thread (the count that tells the coordinator the
    // sub-piece is done, after which the device reads it or the caller gets it back), as Intel
    // requires of them.
    unsafe {
        std::ptr::copy_nonoverlapping(src.add(done), dst.add(done), len - done);
        _mm_sfence();
    }
}

/// Whether a copy of `bytes` in pieces of `piece` starts and ends with smaller pieces: when it
/// holds at least three pieces and a quarter piece is still [`RAMP_MIN`] (smaller device copies
/// cost more in their fixed part than the wait they save). The ramps then hold less than two
/// pieces in all, so whole pieces remain between them.
fn ramps(bytes: usize, piece: usize) -> bool {
    piece / 4 >= RAMP_MIN && bytes >= 3 * piece
}

/// The smallest first (and last) piece of a ramped staged copy.
const RAMP_MIN: usize = 256 << 10;

/// The pieces at each end of a ramped copy, smallest first: the piece halved, down to a
/// sixteenth, while still [`RAMP_MIN`] (4 MiB pieces: 256 KiB, 512 KiB, 1 MiB, 2 MiB).
fn ramp(piece: usize) -> Vec<usize> {
    (1..=4).rev().map(|k| piece >> k).filter(|&len| len >= RAMP_MIN).collect()
}

/// The pieces of a copy of `bytes` with pieces of at most `piece`: pieces doubling up to the
/// whole first ([`ramp`]) and halving down again last, whole pieces between, when [`ramps`] says
/// so (otherwise whole pieces, the last one shorter). The link starts once the first piece
/// (a sixteenth of a whole, at least 256 KiB: 256 KiB for the default 4 MiB) is in rather than a
/// whole piece (GPU run 64: a 1 MiB first piece took the host threads ~30 µs), and the last
/// device copy, which nothing overlaps, is as short.
fn ramped_pieces(bytes: usize, piece: usize) -> Vec<(usize, usize)> {
    let piece = piece.max(1);
    let ramp = ramp(piece);
    let sizes: Vec<usize> = if ramps(bytes, piece) {
        let middle = bytes - 2 * ramp.iter().sum::<usize>();
        let whole = (0..middle.div_ceil(piece)).map(|k| piece.min(middle - k * piece));
        ramp.iter().copied().chain(whole).chain(ramp.iter().rev().copied()).collect()
    } else {
        (0..bytes.div_ceil(piece)).map(|k| piece.min(bytes - k * piece)).collect()
    };
    let mut start = 0;
    sizes
        .into_iter()
        .map(|len| {
            let at = start;
            start += len;
            (at, len)
        })
        .collect()
}

/// Runs the first closure on the copy's host threads and, meanwhile, the second on the calling
/// thread; returns once all have returned, with the first error. Provided by the safe layer,
/// which owns the threads.
pub(crate) type RunOnThreads<'r> = &'r dyn Fn(&(dyn Fn() -> Result<()> + Sync), &mut dyn FnMut() -> Result<()>) -> Result<()>;

/// An address that the threads of one staged copy share (a slot's page-locked buffer, the
/// caller's host slice), kept as a pointer so that offsets keep its provenance.
#[derive(Clone, Copy)]
struct Addr(*mut u8);

// SAFETY: only an address: every read or write through it is an `unsafe` block of this module
// that shows why no two threads touch the same bytes at once and why the memory is alive.
unsafe impl Send for Addr {}
// SAFETY: as above.
unsafe impl Sync for Addr {}

impl Addr {
    /// `self + offset`, without reading anything.
    fn at(self, offset: usize) -> *mut u8 {
        self.0.wrapping_add(offset)
    }
}

/// One slot as the threads of a staged copy share it.
struct SharedSlot<'a> {
    /// The page-locked buffer (at least `piece` bytes).
    data: Addr,
    event: &'a NativeEvent,
    /// Sub-pieces of the slot's current piece the host threads have finished.
    done: AtomicUsize,
}

/// What the threads of one staged copy share. The calling thread coordinates: it alone makes
/// CUDA calls (queues each piece's device copy, records and polls the slots' events), and tells
/// the host threads which pieces they may work on through `open`; the host threads only copy
/// sub-pieces and count them. (Sixteen threads calling into the driver at once, each waiting
/// for events and queueing copies, spent ~50 µs per piece contending in it: GPU run 54.)
struct Shared<'a> {
    slots: Vec<SharedSlot<'a>>,
    cut: StagedCut,
    /// Each piece's offset and length (see [`ramped_pieces`]).
    pieces: Vec<(usize, usize)>,
    /// The next sub-piece to take.
    next: AtomicUsize,
    /// Pieces below this one may be worked on by the host threads: uploads, their slot is free
    /// (its last device copy finished); downloads, their device copy into the slot finished.
    open: AtomicUsize,
    failed: AtomicBool,
    /// Host threads that have started: while none has, the coordinator copies sub-pieces itself
    /// (a busy pool, a thread that could not be spawned), so a copy always finishes.
    hosts: AtomicUsize,
    /// The copy's timeline, kept only while `raft::staging` traces (see [`Shared::note`]).
    trace: Option<Timeline>,
}

/// A finished copy's timeline: when it began, its events, its pieces and their bytes.
type Traced = (std::time::Instant, Vec<(char, usize, u64)>, usize, usize);

/// When a staged copy began, and its events since: (what, piece, microseconds).
type Timeline = (std::time::Instant, Mutex<Vec<(char, usize, u64)>>);

impl Shared<'_> {
    fn new(slots: Vec<SharedSlot<'_>>, cut: StagedCut, bytes: usize) -> Shared<'_> {
        Shared {
            slots,
            cut,
            pieces: ramped_pieces(bytes, cut.piece),
            next: AtomicUsize::new(0),
            open: AtomicUsize::new(0),
            failed: AtomicBool::new(false),
            hosts: AtomicUsize::new(0),
            trace: log::log_enabled!(target: "raft::staging", log::Level::Trace)
                .then(|| (std::time::Instant::now(), Mutex::new(Vec::new()))),
        }
    }

    /// Notes an event of the copy's timeline (`h` a host thread starts, `f` piece filled or
    /// emptied, `q` piece queued, `o` piece opened, `e` the threads are done, `c` a slot's last
    /// device copy waited for, `w` every device copy waited for) with the microseconds since the
    /// copy began, when `raft::staging` traces; logged once at the end.
    fn note(&self, what: char, piece: usize) {
        if let Some((t0, events)) = &self.trace {
            let at = t0.elapsed().as_micros() as u64;
            events.lock().unwrap_or_else(|e| e.into_inner()).push((what, piece, at));
        }
    }

    fn pieces(&self) -> usize {
        self.pieces.len()
    }

    /// Sub-pieces of every piece (a smaller piece has smaller sub-pieces, as many).
    fn subs_per_piece(&self) -> usize {
        self.cut.piece.div_ceil(self.cut.sub)
    }

    /// The offset and length of piece `p`.
    fn piece(&self, p: usize) -> (usize, usize) {
        self.pieces[p]
    }

    fn slot(&self, p: usize) -> &SharedSlot<'_> {
        &self.slots[p % self.slots.len()]
    }

    /// The next sub-piece to copy, as (piece, byte range inside the piece), or `None` when all
    /// are taken or the copy failed.
    fn take(&self) -> Option<(usize, std::ops::Range<usize>)> {
        if self.failed.load(Ordering::Acquire) {
            return None;
        }
        let spp = self.subs_per_piece();
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        if i >= self.pieces() * spp {
            return None;
        }
        let (p, s) = (i / spp, i % spp);
        let (_, len) = self.piece(p);
        let sub = len.div_ceil(spp).max(1);
        let from = (s * sub).min(len);
        Some((p, from..((s + 1) * sub).min(len)))
    }

    /// Waits (spinning, then yielding) until piece `p` is open; false when the copy failed.
    fn wait_open(&self, p: usize) -> bool {
        let mut spins = 0u32;
        while self.open.load(Ordering::Acquire) <= p {
            if self.failed.load(Ordering::Acquire) {
                return false;
            }
            if spins < 128 {
                std::hint::spin_loop();
                spins += 1;
            } else {
                std::thread::yield_now();
            }
        }
        true
    }

    /// Whether the host threads finished every sub-piece of piece `p` (in its slot); if so, starts
    /// the slot's count again (no thread counts for the slot's next piece before it is opened,
    /// after this).
    fn take_filled(&self, p: usize) -> bool {
        let slot = self.slot(p);
        if slot.done.load(Ordering::Acquire) == self.subs_per_piece() {
            slot.done.store(0, Ordering::Relaxed);
            self.note('f', p);
            return true;
        }
        false
    }

    /// Opens every piece below `open` to the host threads.
    fn open_to(&self, open: usize) {
        self.open.store(open, Ordering::Release);
        self.note('o', open - 1);
    }

    /// The host threads' part: copy sub-pieces of open pieces with `copy(piece offset, slot,
    /// range in the piece)` until none is left.
    fn host_work(&self, copy: &CopySub<'_>) -> Result<()> {
        let _unwind = FailOnUnwind(self);
        let before = self.hosts.fetch_add(1, Ordering::AcqRel);
        self.note('h', before);
        while let Some((p, range)) = self.take() {
            if !self.wait_open(p) {
                break;
            }
            let slot = self.slot(p);
            copy(self.piece(p).0, slot, range);
            slot.done.fetch_add(1, Ordering::AcqRel);
        }
        Ok(())
    }
}

/// Copies one sub-piece between the caller's memory and a slot: (piece offset, slot, range in
/// the piece).
type CopySub<'c> = dyn Fn(usize, &SharedSlot<'_>, std::ops::Range<usize>) + Sync + 'c;

impl Shared<'_> {
    /// The coordinator's help while no host thread has started: takes one sub-piece (kept in
    /// `claim` until its piece is open, since only the coordinator opens pieces) and copies it.
    /// True when it copied one.
    fn help(&self, claim: &mut Option<(usize, std::ops::Range<usize>)>, copy: &CopySub<'_>) -> bool {
        if self.hosts.load(Ordering::Acquire) > 0 && claim.is_none() {
            return false;
        }
        if claim.is_none() {
            *claim = self.take();
        }
        match claim.take() {
            Some((p, range)) if p < self.open.load(Ordering::Acquire) => {
                let slot = self.slot(p);
                copy(self.piece(p).0, slot, range);
                slot.done.fetch_add(1, Ordering::AcqRel);
                true
            }
            kept => {
                *claim = kept;
                false
            }
        }
    }
}

impl Shared<'_> {
    /// The end of one coordinator poll: after progress, poll again at once; otherwise help
    /// (when no host thread runs) or pause.
    fn after_poll(&self, progress: bool, idle: &mut u32, claim: &mut Option<(usize, std::ops::Range<usize>)>, copy: &CopySub<'_>) {
        if progress || (*idle >= 128 && self.help(claim, copy)) {
            *idle = 0;
        } else {
            pause(idle);
        }
    }
}

/// Stops the host threads when the coordinator leaves before every piece was opened (an error,
/// a panic): they would otherwise wait for it forever.
struct StopHostsOnExit<'s, 'a>(&'s Shared<'a>);

impl Drop for StopHostsOnExit<'_, '_> {
    fn drop(&mut self) {
        if std::thread::panicking() || self.0.open.load(Ordering::Acquire) < self.0.pieces() {
            self.0.failed.store(true, Ordering::Release);
        }
    }
}

/// Marks the copy failed when a thread unwinds through its work: the others stop waiting for
/// sub-pieces it will never finish.
struct FailOnUnwind<'s, 'a>(&'s Shared<'a>);

impl Drop for FailOnUnwind<'_, '_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.failed.store(true, Ordering::Release);
        }
    }
}

/// The coordinator's wait between two polls: spin a little, then yield.
fn pause(idle: &mut u32) {
    if *idle < 128 {
        std::hint::spin_loop();
        *idle += 1;
    } else {
        std::thread::yield_now();
    }
}

/// Checks a staged copy's buffers and cut before any of them is touched, and waits for their
/// last copies.
fn prepare(who: &'static str, buffers: &mut [StagingBuffers], cut: StagedCut, stream: &CudaStream) -> Result<()> {
    if cut.piece == 0 || cut.sub == 0 || cut.sub > cut.piece {
        return Err(Error::logic(who, format!("a staged copy cut into pieces of {} bytes and sub-pieces of {}", cut.piece, cut.sub)));
    }
    if buffers.is_empty() {
        return Err(Error::logic(who, "a staged copy needs staging buffers"));
    }
    // The device copies go to and from the library's own page-locked slots, which a graph
    // captured meanwhile would use after they are reused or freed (asked again before each
    // piece: `Queued::piece`).
    super::refuse_capture(who, [stream])?;
    for b in buffers.iter_mut() {
        if b.capacity < cut.piece {
            return Err(Error::logic(who, format!("a staged piece of {} bytes exceeds the {}-byte staging buffer", cut.piece, b.capacity)));
        }
        if !same_context(stream.context(), &b.ctx) {
            return Err(Error::logic(who, "staging buffers serve arrays of their own device"));
        }
        if let Err(e) = b.finish(who) {
            b.poisoned = true; // never pooled again: every later copy would fail on them
            return Err(e);
        }
    }
    Ok(())
}

/// What both directions do first: the sizes must match (`mismatch` says how they differ), an
/// empty copy is done (`None`), the buffers are checked and settled, and their slots shared.
fn begin<'b>(
    who: &'static str,
    buffers: &'b mut [StagingBuffers],
    cut: StagedCut,
    stream: &CudaStream,
    bytes: usize,
    array_bytes: usize,
    mismatch: &dyn Fn() -> String,
) -> Result<Option<Shared<'b>>> {
    if bytes != array_bytes {
        return Err(Error::logic(who, mismatch()));
    }
    if bytes == 0 {
        return Ok(None);
    }
    prepare(who, buffers, cut, stream)?;
    let buffers: &'b [StagingBuffers] = buffers;
    Ok(Some(Shared::new(share(buffers), cut, bytes)))
}

/// The slots of `buffers`, shared.
fn share(buffers: &[StagingBuffers]) -> Vec<SharedSlot<'_>> {
    buffers
        .iter()
        .flat_map(|b| (0..2).map(move |i| (b, i)))
        .map(|(b, i)| SharedSlot { data: Addr(b.data(i)), event: &b.slots[i].event, done: AtomicUsize::new(0) })
        .collect()
}

/// The coordinator's account of the device copies it queued.
#[derive(Default)]
struct Queued {
    /// Slots whose event was recorded: waited for before the caller gets its memory back.
    recorded: Vec<bool>,
    /// A copy was queued but neither recorded nor drained: the slots are never used again.
    poisoned: bool,
}

impl Queued {
    /// Queues the device copy of piece `p` between its slot and the device end, and records the
    /// slot's event after it.
    ///
    /// # Safety
    /// The piece's bytes at `end.base` lie inside a live device buffer of `end.stream`'s context
    /// that nothing else uses until the event completes (exclusively borrowed when written); the
    /// slot's buffer holds at least `piece` bytes and the host leaves it alone until the event
    /// completes.
    unsafe fn piece(&mut self, who: &'static str, guard: &ContextGuard, shared: &Shared<'_>, p: usize, end: &DeviceEnd<'_>) -> Result<()> {
        let (slot, (start, bytes)) = (shared.slot(p), shared.piece(p));
        let device = end.base + start as u64;
        // Asked before every piece, not once: a capture begun during the copy would take the
        // rest of its pieces into a graph that copies at each launch, after the arrays are gone.
        super::refuse_capture(who, [end.stream])?;
        // SAFETY: the caller's contract: both ranges are live, sized and untouched by anyone else
        // until the event recorded just below has completed; the stream's context is bound (the
        // caller's guard).
        let rc = unsafe {
            if end.to_device {
                cusys::cuMemcpyHtoDAsync_v2(device, slot.data.0 as *const c_void, bytes, end.stream.cu_stream())
            } else {
                cusys::cuMemcpyDtoHAsync_v2(slot.data.0 as *mut c_void, device, bytes, end.stream.cu_stream())
            }
        };
        rc.result().map_err(driver(who))?;
        let recorded = slot.event.record(who, end.stream, guard);
        if super::refuse_capture(who, [end.stream]).is_err() {
            eprintln!("{who}: a CUDA graph capture began on the stream during a staged copy; aborting");
            std::process::abort(); // the piece may be in the graph: its end cannot be known
        }
        match recorded {
            Ok(()) => {
                self.recorded[p % shared.slots.len()] = true;
                shared.note('q', p);
                Ok(())
            }
            Err(e) => {
                // Queued, and not recorded: drained here, or else the slot may be in use for good.
                self.poisoned |= stream_sync(who, end.stream).is_err();
                Err(e)
            }
        }
    }
}

/// The device end of a staged copy: the array's address, its stream, the direction.
struct DeviceEnd<'s> {
    base: u64,
    stream: &'s CudaStream,
    to_device: bool,
}

/// After the threads: every slot whose event was recorded is waited for (also after a failure,
/// so that nothing is still copying when the caller gets its memory back); the first error.
fn conclude(who: &'static str, buffers: &mut [StagingBuffers], queued: Queued, error: Option<Error>) -> Result<()> {
    for (k, was) in queued.recorded.into_iter().enumerate() {
        if was {
            buffers[k / 2].slots[k % 2].pending = true;
        }
    }
    let mut waited = Ok(());
    for b in buffers.iter_mut() {
        b.poisoned |= queued.poisoned;
        if let Err(e) = b.finish(who) {
            b.poisoned = true; // a copy that cannot be waited for may still use them
            waited = waited.and(Err(e));
        }
    }
    match error {
        Some(e) => Err(e),
        None => waited,
    }
}

/// How a staged copy's threads ended: what was queued, the first error, a panic to resume once
/// every recorded device copy has been waited for.
struct Ended {
    queued: Queued,
    error: Option<Error>,
    panic: Option<Box<dyn std::any::Any + Send>>,
    /// The timeline (start, events, pieces, piece bytes), while `raft::staging` traces.
    trace: Option<Traced>,
}

/// Runs a staged copy's threads: `host` on the host threads, `coordinate` on the calling thread.
fn run_staged(
    shared: Shared<'_>,
    run: RunOnThreads<'_>,
    host: &(dyn Fn(&Shared<'_>) -> Result<()> + Sync),
    coordinate: &mut dyn FnMut(&Shared<'_>, &mut Queued) -> Result<()>,
) -> Ended {
    let mut queued = Queued { recorded: vec![false; shared.slots.len()], poisoned: false };
    let work = || host(&shared);
    let mut main = || {
        // However the coordinator ends (an error, a panic), the host threads stop waiting for it.
        let _stop = StopHostsOnExit(&shared);
        let r = coordinate(&shared, &mut queued);
        if r.is_err() {
            shared.failed.store(true, Ordering::Release);
        }
        r
    };
    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(&work, &mut main)));
    shared.note('e', 0);
    let trace = shared
        .trace
        .map(|(t0, events)| (t0, events.into_inner().unwrap_or_else(|e| e.into_inner()), shared.pieces.len(), shared.cut.piece));
    let (error, panic) = match ran {
        Ok(r) => (r.err(), None),
        Err(payload) => (None, Some(payload)),
    };
    Ended { queued, error, panic, trace }
}

/// Waits for every recorded device copy (`conclude`), then resumes a held panic or returns the
/// first error.
fn end(who: &'static str, buffers: &mut [StagingBuffers], mut ended: Ended) -> Result<()> {
    if let Some((t0, events, ..)) = &mut ended.trace {
        // When each slot's last device copy finished ('c', slot), waited for in slot order
        // (`conclude` below finds them complete).
        for (k, _) in ended.queued.recorded.iter().enumerate().filter(|(_, was)| **was) {
            let _ = buffers[k / 2].slots[k % 2].event.wait(who);
            events.push(('c', k, t0.elapsed().as_micros() as u64));
        }
    }
    let concluded = conclude(who, buffers, ended.queued, ended.error);
    if let Some((t0, mut events, pieces, piece)) = ended.trace {
        events.push(('w', 0, t0.elapsed().as_micros() as u64)); // every device copy waited for
        log::trace!(target: "raft::staging", "{pieces} pieces of {piece} bytes; events (what, piece, µs): {events:?}");
    }
    if let Some(payload) = ended.panic {
        std::panic::resume_unwind(payload);
    }
    concluded
}

/// Copies pageable `host` into `dst` through `buffers`' page-locked slots: the host threads fill
/// the open pieces' slots together, sub-piece by sub-piece, while the calling thread queues each
/// filled piece's device copy on `dst`'s own stream (so the link starts as soon as the first
/// piece is in) and opens the next piece of a slot once the slot's last device copy has
/// finished. Returns once everything is copied.
pub(crate) fn staged_upload<T: DeviceScalar>(
    who: &'static str,
    buffers: &mut [StagingBuffers],
    host: &[T],
    dst: &mut NativeBuffer,
    cut: StagedCut,
    run: RunOnThreads<'_>,
) -> Result<()> {
    let (bytes, stream) = (std::mem::size_of_val(host), dst.stream.clone());
    let mismatch = || format!("a copy of {bytes} bytes into an array of {} bytes", dst.bytes);
    let Some(shared) = begin(who, buffers, cut, &stream, bytes, dst.bytes, &mismatch)? else { return Ok(()) };
    let (src, device) = (Addr(host.as_ptr() as *mut u8), dst.data as u64);
    let k = shared.slots.len();
    // Every slot is free: the first pieces are open at once.
    shared.open.store(k.min(shared.pieces()), Ordering::Release);
    let copy_sub = |start: usize, slot: &SharedSlot<'_>, range: std::ops::Range<usize>| {
        // SAFETY: called only for a sub-piece taken once (by one thread) of an open piece.
        // Source: inside `host` (`start + range.end <= bytes`), borrowed for the whole call, only
        // read; destination: the same bytes of the slot's page-locked buffer (at least `piece`
        // bytes, checked in `prepare`), which no device copy uses (the piece is open: the slot's
        // last device copy has finished) and no other thread writes.
        unsafe { copy_host_bytes(slot.data.at(range.start), src.at(start + range.start) as *const u8, range.len(), cut.stores) }
    };
    let host_threads = |shared: &Shared<'_>| shared.host_work(&copy_sub);
    let mut coordinate = |shared: &Shared<'_>, queued: &mut Queued| -> Result<()> {
        let guard = ContextGuard::bind(who, stream.context())?;
        let end = DeviceEnd { base: device, stream: &stream, to_device: true };
        let pieces = shared.pieces();
        let (mut next_queue, mut idle, mut claim) = (0usize, 0u32, None);
        while next_queue < pieces {
            if shared.failed.load(Ordering::Acquire) {
                return Ok(()); // a host thread panicked: its panic is the outcome
            }
            let mut progress = false;
            if next_queue < shared.open.load(Ordering::Acquire) && shared.take_filled(next_queue) {
                // SAFETY: the piece lies inside `dst` (same size as `host`), borrowed exclusively
                // for the call, which returns only after every recorded event has completed
                // (`conclude`); all of the piece's sub-pieces are in the slot, and the slot's next
                // piece opens only once this copy's event has completed (below).
                unsafe { queued.piece(who, &guard, shared, next_queue, &end)? };
                next_queue += 1;
                progress = true;
            }
            // The oldest queued piece's slot, free again once its copy has finished.
            let open = shared.open.load(Ordering::Acquire);
            if open < pieces && open - k < next_queue && shared.slot(open).event.is_complete(who)? {
                shared.open_to(open + 1);
                progress = true;
            }
            shared.after_poll(progress, &mut idle, &mut claim, &copy_sub);
        }
        Ok(())
    };
    let ended = run_staged(shared, run, &host_threads, &mut coordinate);
    end(who, buffers, ended)
}

/// Copies `src` into pageable `host` through `buffers`' page-locked slots: the calling thread
/// queues the first pieces' device copies at once on `src`'s own stream, opens each piece once
/// its copy has finished, and queues a slot's next piece once the host threads have emptied
/// it; the host threads empty the open pieces together, sub-piece by sub-piece. Returns once
/// everything is copied.
pub(crate) fn staged_download<T: DeviceScalar>(
    who: &'static str,
    buffers: &mut [StagingBuffers],
    src: &NativeBuffer,
    host: &mut [T],
    cut: StagedCut,
    run: RunOnThreads<'_>,
) -> Result<()> {
    let (bytes, stream) = (std::mem::size_of_val(host), src.stream.clone());
    let mismatch = || format!("a copy of an array of {} bytes into {bytes} bytes", src.bytes);
    let Some(shared) = begin(who, buffers, cut, &stream, bytes, src.bytes, &mismatch)? else { return Ok(()) };
    let (dst, device) = (Addr(host.as_mut_ptr() as *mut u8), src.data as u64);
    let k = shared.slots.len();
    let copy_sub = |start: usize, slot: &SharedSlot<'_>, range: std::ops::Range<usize>| {
        // SAFETY: called only for a sub-piece taken once (by one thread) of an open piece.
        // Source: bytes of the slot written by a device copy that has finished (the piece is
        // open), not written again before every sub-piece of the piece is done; destination:
        // inside `host` (`start + range.end <= bytes`), borrowed exclusively for the whole call,
        // so no two threads write the same byte. Any bit pattern is a `T` (DeviceScalar).
        unsafe { copy_host_bytes(dst.at(start + range.start), slot.data.at(range.start) as *const u8, range.len(), cut.stores) }
    };
    let host_threads = |shared: &Shared<'_>| shared.host_work(&copy_sub);
    let mut coordinate = |shared: &Shared<'_>, queued: &mut Queued| -> Result<()> {
        let guard = ContextGuard::bind(who, stream.context())?;
        let end = DeviceEnd { base: device, stream: &stream, to_device: false };
        let pieces = shared.pieces();
        // Both queues below: `start..start + len` lies inside `src` (same size as
        // `host`), whose later writes and frees are ordered after the copy on its own stream;
        // the slot holds at least `piece` bytes (`prepare`) and the host threads read it only
        // once the piece is open, after the copy's event has completed, and leave it before
        // the slot's next piece is queued (its sub-pieces all counted).
        for p in 0..k.min(pieces) {
            // SAFETY: as said above, for the slot's first piece (nothing has used it yet).
            unsafe { queued.piece(who, &guard, shared, p, &end)? };
        }
        let (mut next_queue, mut emptied, mut idle, mut claim) = (k.min(pieces), 0usize, 0u32, None);
        while emptied < pieces {
            if shared.failed.load(Ordering::Acquire) {
                return Ok(());
            }
            let mut progress = false;
            let open = shared.open.load(Ordering::Acquire);
            if open < next_queue && shared.slot(open).event.is_complete(who)? {
                shared.open_to(open + 1);
                progress = true;
            }
            if emptied < shared.open.load(Ordering::Acquire) && shared.take_filled(emptied) {
                if next_queue < pieces {
                    // SAFETY: as said above: every sub-piece of the slot's last piece is out.
                    unsafe { queued.piece(who, &guard, shared, next_queue, &end)? };
                    next_queue += 1;
                }
                emptied += 1;
                progress = true;
            }
            shared.after_poll(progress, &mut idle, &mut claim, &copy_sub);
        }
        Ok(())
    };
    let ended = run_staged(shared, run, &host_threads, &mut coordinate);
    end(who, buffers, ended)
}

impl Drop for StagingBuffers {
    /// Waits for the buffers' last copies (a staged copy always finishes them first, so this
    /// does not block in practice), then frees them; leaks a buffer whose copy cannot be waited
    /// for, and everything once the exit has decided.
    fn drop(&mut self) {
        let free = raft_exit::native_release_allowed() && !self.poisoned;
        for i in 0..2 {
            let settled = free && self.settle("staging buffers", i).is_ok();
            let Some(host) = self.slots[i].host.take() else { continue };
            if !settled {
                host.leak();
            } else if let Err(e) = host.free("staging buffers") {
                log::warn!(target: "raft", "{e}");
            }
        }
    }
}

// ---- pageable host memory ------------------------------------------------------------------------

/// Whether `host` is page-locked memory the driver knows (a `PinnedVec`, a registered slice,
/// any `cudaHostAlloc`'d or registered range): its copies need no staging. An unknown pointer
/// (pageable memory) is `false`; so is any failure to ask (staging then only costs speed).
pub(crate) fn is_page_locked<T>(host: &[T]) -> bool {
    if host.is_empty() || !super::driver_present() {
        return false;
    }
    let mut kind: u32 = 0;
    let mut attribute = cusys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE;
    let mut out = &mut kind as *mut u32 as *mut c_void;
    // SAFETY: writes one unsigned int (the one attribute asked) for an address; the driver only
    // looks the address up in its tables. The plural call answers an address it does not know
    // (pageable memory, the common case) with success and a zero type, where the singular one
    // returns CUDA_ERROR_INVALID_VALUE, an API error every sanitizer reports.
    let rc = unsafe { cusys::cuPointerGetAttributes(1, &mut attribute, &mut out, host.as_ptr() as cusys::CUdeviceptr) };
    rc == cusys::CUresult::CUDA_SUCCESS && kind == cusys::CUmemorytype::CU_MEMORYTYPE_HOST as u32
}

/// Asks the kernel to back `host` with transparent huge pages where it can (`MADV_HUGEPAGE` on
/// the 2 MiB-aligned part): a fresh `Vec` of a GiB is otherwise filled one 4 KiB page fault at a
/// time, which run 23 measured as the slowest part of `to_host` (1.35 GB/s). Only a hint: on a
/// kernel without THP, or for memory already touched, nothing changes.
pub(crate) fn advise_huge_pages<T>(host: &mut [T]) {
    const HUGE: usize = 2 << 20;
    let start = host.as_mut_ptr() as usize;
    let end = start + std::mem::size_of_val(host);
    let (a, b) = (start.next_multiple_of(HUGE), end / HUGE * HUGE);
    if b > a {
        // SAFETY: [a, b) lies inside `host`, memory this process owns and borrows mutably here;
        // MADV_HUGEPAGE changes how the kernel backs it, never its contents or its mapping.
        let _ = unsafe { libc::madvise(a as *mut libc::c_void, b - a, libc::MADV_HUGEPAGE) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_copies_copy_every_byte_and_no_more_with_every_kind_of_store() {
        let src: Vec<u8> = (0..300_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        // Lengths around the 4 KiB threshold and the 64-byte lines, at every alignment of both
        // ends, with guard bytes after the destination range.
        for len in [0usize, 1, 63, 64, 65, 4095, 4096, 4097, 4096 + 63, 65_536 + 17, 262_144 + 5] {
            for (src_off, dst_off) in [(0usize, 0usize), (1, 0), (0, 1), (13, 47), (63, 62), (64, 3)] {
                for streaming in [HostStores::Plain, HostStores::Streaming, HostStores::Auto] {
                    let mut dst = vec![0xA5u8; dst_off + len + 64];
                    // SAFETY: both ranges lie inside their vectors (checked by the sizes above),
                    // distinct allocations, used by this thread only.
                    unsafe { copy_host_bytes(dst.as_mut_ptr().add(dst_off), src.as_ptr().add(src_off), len, streaming) };
                    assert!(dst[..dst_off].iter().all(|&b| b == 0xA5), "{len} {src_off} {dst_off} {streaming:?}: before");
                    assert_eq!(&dst[dst_off..dst_off + len], &src[src_off..src_off + len], "{len} {src_off} {dst_off} {streaming:?}");
                    assert!(dst[dst_off + len..].iter().all(|&b| b == 0xA5), "{len} {src_off} {dst_off} {streaming:?}: after");
                }
            }
        }
    }

    #[test]
    fn sub_pieces_cover_the_bytes_once_in_order() {
        for (bytes, piece, sub) in [
            (1usize, 4usize, 4usize),
            (4, 4, 1),
            (5, 4, 3),
            (3 << 20, 1 << 20, 64 << 10),
            ((3 << 20) + 5, 1 << 20, 3 << 10),
            (4097, 1024, 256),
            (10, 3, 2),
            (1 << 20, 256 << 10, 64 << 10),
            ((64 << 20) + 3, 4 << 20, 512 << 10),
        ] {
            let ramped = ramps(bytes, piece);
            let shared = Shared::new(Vec::new(), StagedCut { piece, sub, stores: HostStores::Plain }, bytes);
            let lens: Vec<usize> = shared.pieces.iter().map(|(_, len)| *len).collect();
            assert!(lens.iter().all(|l| *l >= 1 && *l <= piece), "{bytes}/{piece}: {lens:?}");
            if ramps(bytes, piece) {
                // Ramped: pieces doubling from the smallest of at least 256 KiB (at most a
                // sixteenth) to a half, at the start, and the same reversed at the end.
                let want: Vec<usize> = (1..=4).rev().map(|k| piece >> k).filter(|&l| l >= 256 << 10).collect();
                let n = lens.len();
                assert_eq!(lens[..want.len()], want[..], "{bytes}/{piece}: {lens:?}");
                let tail: Vec<usize> = want.iter().rev().copied().collect();
                assert_eq!(lens[n - want.len()..], tail[..], "{bytes}/{piece}: {lens:?}");
                assert!(want[0] <= piece / 4 && want[want.len() - 1] == piece / 2);
            }
            let mut next = 0;
            let mut taken = 0;
            while let Some((p, range)) = shared.take() {
                taken += 1;
                let (start, len) = shared.piece(p);
                assert!(range.end <= len && len <= piece, "{bytes}/{piece}/{sub}: piece {p} {range:?}");
                if range.is_empty() {
                    continue; // the last piece's sub-pieces past its end
                }
                assert_eq!(start + range.start, next, "{bytes}/{piece}/{sub}: piece {p} {range:?}");
                next += range.len();
            }
            assert_eq!(next, bytes, "{bytes}/{piece}/{sub}");
            // Every piece counts the same number of sub-pieces, so each one's last is known.
            assert_eq!(taken, lens.len() * piece.div_ceil(sub));
            assert_eq!(ramped, bytes >= 3 << 20, "{bytes}/{piece}: ramped only where a quarter piece is 256 KiB or more");
            // A failed copy hands out nothing more.
            shared.failed.store(true, Ordering::Release);
            shared.next.store(0, Ordering::Relaxed);
            assert!(shared.take().is_none());
        }
    }
}
