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
//! - [`StagingBuffers`](super::staging::StagingBuffers) (pageable memory) never lets the device touch the caller's memory: it
//!   copies through page-locked buffers it owns, and waits for a buffer's last copy before the
//!   host touches that buffer again or frees it.
//!
//! Device memory needs no guard: every use of a [`NativeBuffer`] is ordered on its own stream or
//! follows a host wait, and a copy queued on another stream first waits for the buffer's stream
//! (and, for [`copy_device_ordered`], which returns at once, the buffer's stream then waits for
//! the copy). Stream-ordered frees therefore come after the copy.
use super::buffer::NativeBuffer;
use super::mr::NativeMr;
use super::{bind, stream_sync, ContextGuard, DeviceScalar};
use crate::error::{Error, Result};
use cudarc::driver::{result as cu, sys as cusys, CudaContext, CudaStream};
use raft_sys as sys;
use std::ffi::c_void;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

pub(super) fn driver(who: &'static str) -> impl Fn(cudarc::driver::DriverError) -> Error {
    move |e| Error::driver(who, e)
}

pub(super) fn same_context(a: &CudaContext, b: &CudaContext) -> bool {
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
    pub(super) fn create(who: &'static str, ctx: &Arc<CudaContext>, _guard: &ContextGuard) -> Result<Self> {
        if let Some(event) = spare_events::take(ctx) {
            return Ok(NativeEvent { event, ctx: ctx.clone() });
        }
        bind(who, ctx)?;
        let event = cu::event::create(cusys::CUevent_flags::CU_EVENT_DISABLE_TIMING).map_err(driver(who))?;
        Ok(NativeEvent { event, ctx: ctx.clone() })
    }

    /// Records the work queued on `stream` so far.
    pub(super) fn record(&self, who: &'static str, stream: &CudaStream, _guard: &ContextGuard) -> Result<()> {
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
        // SAFETY: the event is alive (owned by self); a query binds nothing; relaxed as `wait`.
        match super::relaxed(|| unsafe { cu::event::query(self.event) }) {
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
    // After the record: a capture that took it began after `on`'s flag was raised (`exposure.rs`).
    super::exposure::before_join(waiter, on);
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

/// Queues a copy between a device buffer and host memory in its pieces (`host_pieces`): the
/// page-locked bytes with the typed driver call (which names each end's kind, sparing the driver
/// the address lookup that `cuMemcpyAsync` makes on every call: about a microsecond, a tenth of
/// a 1 MiB device copy), the pageable ones through the runtime's `cudaMemcpyAsync` (the path of
/// every pageable copy of this crate; CUDA says it *might* be synchronous, so every caller waits
/// for the copy before the host memory is let go). A failure names the piece.
///
/// # Safety
/// `p` describes live memory: a device buffer and host memory of `p.src_bytes` bytes each, of
/// which `p.locked` is page-locked, both kept untouched by the caller until the copy is done.
unsafe fn queue_host_pieces(who: &'static str, p: &Plan<'_>, stream: &CudaStream) -> Result<()> {
    let to_device = p.dst_device.is_some();
    let device = p.dst_device.or(p.src_device).map_or(0, |b| b.device);
    for (at, len) in host_pieces(p.src_bytes, &p.locked) {
        let (dst, src) = (p.dst + at as u64, p.src + at as u64);
        let locked = !p.locked.is_empty() && at >= p.locked.start && at + len <= p.locked.end;
        let queued = if locked {
            // SAFETY: `len` page-locked bytes at `at` of both ends (the caller's contract).
            let rc = unsafe {
                match to_device {
                    true => cusys::cuMemcpyHtoDAsync_v2(dst, src as *const c_void, len, stream.cu_stream()),
                    false => cusys::cuMemcpyDtoHAsync_v2(dst as *mut c_void, src, len, stream.cu_stream()),
                }
            };
            rc.result().map_err(|e| Error::driver(who, e))
        } else {
            let api = super::api(who)?;
            // SAFETY: `len` bytes at `at` of both ends (the caller's contract, which keeps the
            // host bytes untouched until the copy is done: the call may return before it).
            let status = unsafe {
                api.raftrs_memcpy_async(device as i32, dst as *mut c_void, src as *const c_void, len, stream.cu_stream() as *mut c_void)
            };
            super::check(who, api, status)
        };
        queued.map_err(|e| {
            let kind = if locked { "page-locked" } else { "pageable" };
            Error::new(e.kind(), who, format!("{} (the {kind} bytes {at}..{} of a {}-byte host copy)", e.message(), at + len, p.src_bytes))
        })?;
    }
    Ok(())
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

/// Why a queue failed, and whether the copy may still run (its stream could not be drained, and
/// not because its context is dead): then nothing it touches may be freed or reused, ever.
pub(crate) struct QueueError {
    pub(crate) error: Error,
    pub(crate) maybe_in_flight: bool,
}

impl From<Error> for QueueError {
    fn from(error: Error) -> Self {
        QueueError { error, maybe_in_flight: false }
    }
}

/// Drains `stream` after a failed step of a copy; whether the copy may still run (the drain
/// failed, and not because the context is dead, which stops all its work).
fn drain_failed(who: &'static str, stream: &CudaStream) -> bool {
    stream_sync(who, stream).is_err_and(|e| !super::context_is_dead(&e))
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
            super::peers::enable_peer_access(who, s, d);
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
            // SAFETY: as above, for two addresses of one device.
            None if p.src_device.is_some() && p.dst_device.is_some() => unsafe {
                cusys::cuMemcpyDtoDAsync_v2(p.dst, p.src, p.src_bytes, stream.cu_stream())
            },
            None => {
                // SAFETY: one device buffer and host memory (a `HostRef`/`HostMut`, made only
                // from memory this module allocated or registered, borrowed by `ends` for the
                // call and kept by every caller until the copy is done), equal sizes checked.
                if let Err(error) = unsafe { queue_host_pieces(who, &p, stream) } {
                    // A host copy in pieces may have queued some: drained before the ends go back.
                    let maybe_in_flight = drain_failed(who, stream);
                    return Err(QueueError { error, maybe_in_flight });
                }
                cusys::CUresult::CUDA_SUCCESS
            }
        };
        if let Err(e) = queued.result() {
            // A host copy in pieces may have queued some: drained before the ends go back.
            let maybe_in_flight = drain_failed(who, stream);
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
    if streams().into_iter().any(super::captured_meanwhile) {
        raft_exit::abort_with(format_args!("{who}: a CUDA graph capture began on a stream while a copy was queued on it; aborting"));
    }
    if let Err(error) = after {
        // The copy is queued but cannot be waited for as planned: wait for it here.
        let maybe_in_flight = drain_failed(who, stream);
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
    // stream's capture state now. A wait that failed because the context is dead (a kernel's
    // fault stops all its work) may end the borrows; any other failure (a capture refusing the
    // wait) says nothing about the copies, and must not.
    let last = scope.last.lock().unwrap_or_else(|e| e.into_inner()).take();
    let waited = super::waited_for_borrow(who, last.map_or(Ok(()), |event| event.wait(who)));
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
            // The scope's end waits for the event of its latest queued copy only: a failed copy
            // that may still run would outlive the borrows.
            Err(q) if q.maybe_in_flight => super::in_flight_under_borrow(who, &q.error),
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

/// Copies between page-locked host memory and a device buffer on the buffer's own stream,
/// after the work queued there; returns once the copy has finished (an event after it).
pub(crate) fn copy_page_locked(who: &'static str, ends: Ends<'_>) -> Result<()> {
    let stream = match &ends {
        Ends::ToDevice(_, d) => d.stream.clone(),
        Ends::ToHost(s, _) | Ends::Device(s, _) => s.stream.clone(),
    };
    match queue(who, &stream, &ends, true, false) {
        Ok(Some(event)) => super::waited_for_borrow(who, event.wait(who)),
        Ok(None) => Ok(()),
        Err(q) if q.maybe_in_flight => super::in_flight_under_borrow(who, &q.error),
        Err(q) => Err(q.error),
    }
}

/// Sets every byte of `buf` to zero on its own stream; returns once queued (an operation on
/// device memory alone has no host borrow to protect, so it only queues, like
/// [`copy_device_ordered`]; every later use of the buffer is ordered after it by its stream).
///
/// Refused on a stream being captured into a CUDA graph: the graph would zero the memory at
/// each launch, after the array may be gone.
pub(crate) fn zero_ordered(who: &'static str, buf: &mut NativeBuffer) -> Result<()> {
    if buf.bytes == 0 {
        return Ok(());
    }
    let api = super::api(who)?;
    refuse_capture_of_memset(who, &buf.stream)?;
    let _keep = ContextGuard::save(who)?;
    // SAFETY: `data` holds exactly `bytes` bytes of device memory owned by this buffer (borrowed
    // exclusively), queued on its own stream (alive: held by the buffer), where its free is
    // ordered after this memset.
    let queued = super::check(who, api, unsafe {
        api.raftrs_memset_async(buf.device as i32, buf.data, 0, buf.bytes, buf.stream.cu_stream() as *mut c_void)
    });
    // A capture begun meanwhile on another thread may have taken the memset into its graph,
    // which would write the memory at each launch: as for a copy, the process stops.
    if super::captured_meanwhile(&buf.stream) {
        raft_exit::abort_with(format_args!("{who}: a CUDA graph capture began on a stream while a memset was queued on it; aborting"));
    }
    queued
}

fn refuse_capture_of_memset(who: &'static str, stream: &CudaStream) -> Result<()> {
    super::refuse_capture(who, [stream]).map_err(|e| match e.kind() {
        crate::error::ErrorKind::Logic => Error::logic(
            who,
            "the stream is being captured into a CUDA graph: the graph would write the array at each launch, after it \
             may be gone; zero it before the capture begins or after it ends",
        ),
        _ => e,
    })
}

/// Queues a device-to-device copy on `dst`'s own stream after the work queued so far on `src`'s
/// stream; `src`'s stream then waits for it. Returns once queued: every later use of either
/// buffer is ordered after the copy by its own stream.
pub(crate) fn copy_device_ordered(who: &'static str, src: &NativeBuffer, dst: &mut NativeBuffer) -> Result<()> {
    let stream = dst.stream.clone();
    queue(who, &stream, &Ends::Device(src, dst), false, true).map(drop).map_err(|q| q.error)
}

// ---- page-locked host memory -----------------------------------------------------------------

/// The start of a host buffer's elements: its memory, or a dangling (non-null, aligned) pointer
/// where it took none. 0 bytes hold any number of elements of a zero-sized `T` (the
/// `DeviceScalar` contract allows one), and the shim allocates nothing for 0 bytes: a slice may
/// not start at null even when it spans no byte (the sixteenth session's audit).
fn host_elements<T>(data: *mut c_void) -> *mut T {
    if data.is_null() {
        std::ptr::NonNull::<T>::dangling().as_ptr()
    } else {
        data as *mut T
    }
}

/// Page-locked host memory from RMM's `pinned_host_memory_resource` (`cudaHostAlloc`), holding
/// (a shared copy of) the resource that frees it; initialised when made (zeroed or copied in),
/// so every byte is a value.
pub(crate) struct NativeHostBuffer {
    pub(super) buffer: NativeBuffer,
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
        assert!((self.buffer.data as usize).is_multiple_of(std::mem::align_of::<T>()), "page-locked memory misaligned");
    }

    fn elements<T>(&self) -> *mut T {
        host_elements(self.buffer.data)
    }

    /// The first `len` elements, read by the host.
    pub(crate) fn as_slice<T: DeviceScalar>(&self, len: usize) -> &[T] {
        if len == 0 {
            return &[];
        }
        self.check_fits::<T>(len);
        // SAFETY: `len` aligned elements lie in the buffer (checked; or they are zero-sized and
        // the pointer is dangling and aligned), all initialised (made zeroed or copied in, then
        // written only with values: any bit pattern is a `T`); no copy writes them while this
        // shared borrow lives (copies need `&mut` or ownership).
        unsafe { std::slice::from_raw_parts(self.elements::<T>(), len) }
    }

    /// The first `len` elements, written by the host.
    pub(crate) fn as_mut_slice<T: DeviceScalar>(&mut self, len: usize) -> &mut [T] {
        if len == 0 {
            return &mut [];
        }
        self.check_fits::<T>(len);
        // SAFETY: as for `as_slice`; the exclusive borrow excludes every other use, copies
        // included.
        unsafe { std::slice::from_raw_parts_mut(self.elements::<T>(), len) }
    }

    pub(crate) fn host_ref(&self) -> HostRef<'_> {
        HostRef { addr: self.buffer.data as usize, bytes: self.buffer.bytes, locked: 0..self.buffer.bytes, _borrow: PhantomData }
    }

    pub(crate) fn host_mut(&mut self) -> HostMut<'_> {
        HostMut { addr: self.buffer.data as usize, bytes: self.buffer.bytes, locked: 0..self.buffer.bytes, _borrow: PhantomData }
    }

    /// Frees the memory (`cudaFreeHost`, which may wait for the device).
    pub(crate) fn free(self, who: &'static str) -> Result<()> {
        self.buffer.free(who, None)
    }

    /// Leaks the memory to the OS (at exit, once the exit has decided).
    pub(crate) fn leak(self) {
        self.buffer.leak()
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

    /// A zero-sized `DeviceScalar` (the contract allows one) in a buffer that took no memory:
    /// its elements start at a valid pointer, not at the buffer's null (a slice starting at null
    /// is undefined behaviour even when it spans no byte; debug builds and Miri stop on it).
    #[test]
    fn zero_sized_elements_of_a_buffer_without_memory_start_at_a_valid_pointer() {
        #[derive(Clone, Copy, Debug, PartialEq)]
        struct Unit;
        let at = host_elements::<Unit>(std::ptr::null_mut());
        assert!(!at.is_null());
        // SAFETY: zero-sized elements at a non-null, aligned pointer: the slice spans no byte.
        let elements = unsafe { std::slice::from_raw_parts(at, 4) };
        assert_eq!(elements, [Unit; 4]);
        let mut word = 0u32;
        let real = &mut word as *mut u32 as *mut c_void;
        assert_eq!(host_elements::<u32>(real), real as *mut u32, "a buffer with memory starts at it");
    }
}
