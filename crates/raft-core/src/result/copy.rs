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
use std::sync::Arc;

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
        // stream, see `stream_sync`).
        unsafe { cu::event::synchronize(self.event) }.map_err(driver(who))
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

/// Page-locked host bytes borrowed for `'a`, shared: made only from a [`NativeHostBuffer`] or a
/// [`NativeRegistration`], so the address is page-locked memory that the borrow keeps alive.
pub struct HostRef<'a> {
    addr: usize,
    bytes: usize,
    _borrow: PhantomData<&'a [u8]>,
}

/// Page-locked host bytes borrowed exclusively for `'a` (see [`HostRef`]).
pub struct HostMut<'a> {
    addr: usize,
    bytes: usize,
    _borrow: PhantomData<&'a mut [u8]>,
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
            },
            Ends::ToHost(d, h) => Plan {
                dst: h.addr as u64,
                src: d.data as u64,
                dst_bytes: h.bytes,
                src_bytes: d.bytes,
                src_device: Some(d),
                dst_device: None,
            },
            Ends::Device(s, d) => Plan {
                dst: d.data as u64,
                src: s.data as u64,
                dst_bytes: d.bytes,
                src_bytes: s.bytes,
                src_device: Some(s),
                dst_device: Some(d),
            },
        }
    }
}

/// Checks a copy before any CUDA call: equal sizes, and a stream that can reach both ends (a
/// host/device copy runs on a stream of the device end's device; a device copy on a stream of
/// either device).
fn check_copy(who: &'static str, stream_device: usize, ends: &Ends<'_>) -> Result<()> {
    let p = ends.plan();
    if p.src_bytes != p.dst_bytes {
        return Err(Error::logic(who, format!("a copy of {} bytes into {} bytes", p.src_bytes, p.dst_bytes)));
    }
    let devices: Vec<usize> = [p.src_device, p.dst_device].iter().flatten().map(|b| b.device).collect();
    if !devices.is_empty() && !devices.contains(&stream_device) {
        let on = devices.iter().map(usize::to_string).collect::<Vec<_>>().join(" and ");
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
    let guard = ContextGuard::save(who)?;
    let device_ends: Vec<&NativeBuffer> = [p.src_device, p.dst_device].into_iter().flatten().collect();
    if p.src_bytes > 0 {
        for b in &device_ends {
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
        bind(who, stream.context())?;
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
            // SAFETY: as above, for two addresses of one device, or one device buffer and
            // page-locked host memory (a `HostRef`/`HostMut`, made only from memory this module
            // allocated or registered). The typed calls name each end's kind (the plan knows
            // which end is device memory), sparing the driver the address lookup that
            // cuMemcpyAsync's unified addressing makes on every call (about a microsecond, a
            // tenth of a 1 MiB device copy).
            None => unsafe {
                match (p.src_device.is_some(), p.dst_device.is_some()) {
                    (true, true) => cusys::cuMemcpyDtoDAsync_v2(p.dst, p.src, p.src_bytes, stream.cu_stream()),
                    (false, true) => cusys::cuMemcpyHtoDAsync_v2(p.dst, p.src as *const c_void, p.src_bytes, stream.cu_stream()),
                    (true, false) => cusys::cuMemcpyDtoHAsync_v2(p.dst as *mut c_void, p.src, p.src_bytes, stream.cu_stream()),
                    (false, false) => cusys::cuMemcpyAsync(p.dst, p.src, p.src_bytes, stream.cu_stream()),
                }
            },
        };
        queued.result().map_err(driver(who))?;
    }
    let after = (|| -> Result<()> {
        if let Some(e) = &event {
            e.record(who, stream, &guard)?;
        }
        if join_after && p.src_bytes > 0 {
            for b in &device_ends {
                join(who, &b.stream, stream, &guard)?;
            }
        }
        Ok(())
    })();
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
                    log::warn!(target: "raft", "{e} (the copy's buffers are leaked)");
                    std::mem::forget(buffers);
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
    let scope = CopyScope { stream, live, scope: PhantomData, env: PhantomData };
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(&scope)));
    // Every copy of the scope is on this stream: once it has drained, the GPU no longer touches
    // anything the body lent. (A failed synchronisation is a fault of the stream's context,
    // which stops all its work.)
    let waited = stream_sync(who, &scope.stream);
    match outcome {
        Ok(r) => waited.map(|()| r),
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

impl<'scope, 'env> CopyScope<'scope, 'env> {
    /// Queues a copy between ends borrowed for the rest of the scope.
    pub(crate) fn queue(&'scope self, who: &'static str, ends: Ends<'scope>) -> Result<()> {
        queue(who, &self.stream, &ends, false, false).map(drop).map_err(|q| q.error)
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
        HostRef { addr: self.buffer.data as usize, bytes: self.buffer.bytes, _borrow: PhantomData }
    }

    pub(crate) fn host_mut(&mut self) -> HostMut<'_> {
        HostMut { addr: self.buffer.data as usize, bytes: self.buffer.bytes, _borrow: PhantomData }
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

/// A caller's slice page-locked with `cuMemHostRegister` (portable: every context sees it
/// page-locked) for as long as this lives; the slice is reached only through it meanwhile. An
/// empty slice registers nothing.
pub(crate) struct NativeRegistration<'a, T: DeviceScalar> {
    slice: &'a mut [T],
    /// The context that registered the range; `None` once unregistered (or never registered).
    ctx: Option<Arc<CudaContext>>,
}

impl<'a, T: DeviceScalar> NativeRegistration<'a, T> {
    pub(crate) fn register(who: &'static str, ctx: &Arc<CudaContext>, slice: &'a mut [T]) -> Result<Self> {
        let bytes = std::mem::size_of_val(slice);
        if bytes == 0 {
            return Ok(NativeRegistration { slice, ctx: None });
        }
        let _keep = ContextGuard::save(who)?;
        bind(who, ctx)?;
        let (start, flags) = (slice.as_mut_ptr() as *mut c_void, cusys::CU_MEMHOSTREGISTER_PORTABLE);
        // SAFETY: the range is the `bytes` bytes of the exclusively borrowed `slice`, alive and
        // unmoved for 'a; it is unregistered before the borrow ends (Drop), or, forgotten, stays
        // registered memory that the process owns: no DMA uses it past its copy's wait.
        let registered = unsafe { cusys::cuMemHostRegister_v2(start, bytes, flags) };
        match registered.result() {
            Ok(()) => Ok(NativeRegistration { slice, ctx: Some(ctx.clone()) }),
            Err(e) if e.0 == cusys::CUresult::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED => Err(Error::logic(
                who,
                "the slice is already page-locked (part of a PinnedVec, or registered elsewhere): CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
            )),
            Err(e) => Err(Error::driver(who, e)),
        }
    }

    pub(crate) fn as_slice(&self) -> &[T] {
        self.slice
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [T] {
        self.slice
    }

    pub(crate) fn host_ref(&self) -> HostRef<'_> {
        HostRef { addr: self.slice.as_ptr() as usize, bytes: std::mem::size_of_val(self.slice), _borrow: PhantomData }
    }

    pub(crate) fn host_mut(&mut self) -> HostMut<'_> {
        HostMut { addr: self.slice.as_mut_ptr() as usize, bytes: std::mem::size_of_val(self.slice), _borrow: PhantomData }
    }

    /// Makes the slice pageable again (`cuMemHostUnregister`); once.
    pub(crate) fn unregister(&mut self, who: &'static str) -> Result<()> {
        let Some(ctx) = self.ctx.take() else { return Ok(()) };
        if !raft_exit::native_release_allowed() {
            return Ok(()); // the exit has decided: no CUDA call
        }
        let _keep = ContextGuard::save(who)?;
        bind(who, &ctx)?;
        // SAFETY: unregisters the range `register` registered (same base address), exactly once
        // (`ctx` was taken above); no copy uses it any more (see the module documentation).
        unsafe { cusys::cuMemHostUnregister(self.slice.as_mut_ptr() as *mut c_void) }.result().map_err(driver(who))
    }
}

impl<T: DeviceScalar> Drop for NativeRegistration<'_, T> {
    fn drop(&mut self) {
        if let Err(e) = self.unregister("RegisteredSlice::drop") {
            if !super::already_gone(&e) {
                log::warn!(target: "raft", "{e}");
            }
        }
    }
}

// ---- staging pageable memory through page-locked buffers -------------------------------------

/// Consecutive bytes of a device buffer, read by a staged copy.
pub(crate) struct DeviceRange<'a> {
    buffer: &'a NativeBuffer,
    offset: usize,
    bytes: usize,
}

/// Consecutive bytes of a device buffer, written by a staged copy: the ranges of one
/// [`NativeBuffer::ranges_mut`] are disjoint and borrow the buffer exclusively.
pub(crate) struct DeviceRangeMut<'a> {
    buffer: &'a NativeBuffer,
    offset: usize,
    bytes: usize,
    _exclusive: PhantomData<&'a mut NativeBuffer>,
}

/// `(offset, length)` of consecutive pieces of `piece` bytes (the last one shorter).
fn cuts(bytes: usize, piece: usize) -> impl Iterator<Item = (usize, usize)> {
    let piece = piece.max(1);
    (0..bytes.div_ceil(piece)).map(move |k| (k * piece, piece.min(bytes - k * piece)))
}

impl NativeBuffer {
    /// The buffer cut into consecutive ranges of `piece` bytes.
    pub(crate) fn ranges(&self, piece: usize) -> Vec<DeviceRange<'_>> {
        cuts(self.bytes, piece).map(|(offset, bytes)| DeviceRange { buffer: self, offset, bytes }).collect()
    }

    /// The buffer cut into consecutive, disjoint ranges of `piece` bytes, for writing.
    pub(crate) fn ranges_mut(&mut self, piece: usize) -> Vec<DeviceRangeMut<'_>> {
        let buffer: &NativeBuffer = self;
        cuts(buffer.bytes, piece).map(|(offset, bytes)| DeviceRangeMut { buffer, offset, bytes, _exclusive: PhantomData }).collect()
    }
}

struct Slot {
    host: Option<NativeHostBuffer>,
    event: NativeEvent,
    /// A copy using `host` was queued and not yet waited for.
    pending: bool,
    /// Bytes the last download queued into `host`.
    filled: usize,
}

/// Two page-locked buffers of one device and their events: one side of a double-buffered staged
/// copy. The host touches a buffer only after the copy that last used it has finished, and the
/// buffers are freed only then (or leaked).
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
        let slot = |host, event| Slot { host: Some(host), event, pending: false, filled: 0 };
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

    fn check(&self, who: &'static str, bytes: usize, range_bytes: usize, stream: &CudaStream) -> Result<()> {
        if bytes != range_bytes {
            return Err(Error::logic(who, format!("a staged piece of {bytes} bytes for {range_bytes} bytes of the array")));
        }
        if bytes > self.capacity {
            return Err(Error::logic(who, format!("a staged piece of {bytes} bytes exceeds the {}-byte staging buffer", self.capacity)));
        }
        if !same_context(stream.context(), &self.ctx) {
            return Err(Error::logic(who, "staging buffers serve arrays of their own device"));
        }
        Ok(())
    }

    /// Records slot `i`'s event after a copy just queued on `stream`; when that fails, waits for
    /// the stream instead (or, failing that too, never touches the buffers again).
    fn after_queue(&mut self, who: &'static str, i: usize, stream: &CudaStream, guard: &ContextGuard) -> Result<()> {
        match self.slots[i].event.record(who, stream, guard) {
            Ok(()) => {
                self.slots[i].pending = true;
                Ok(())
            }
            Err(e) => {
                if stream_sync(who, stream).is_err() {
                    self.poisoned = true;
                }
                Err(e)
            }
        }
    }

    fn data(&self, i: usize) -> *mut u8 {
        self.slots[i].host.as_ref().expect("a staging slot holds its buffer until freed").buffer.data as *mut u8
    }

    /// Copies `host` into slot `i` once the slot's last copy has finished, then queues it into
    /// `dst` on the array's own stream.
    pub(crate) fn upload<T: DeviceScalar>(&mut self, who: &'static str, i: usize, host: &[T], dst: &DeviceRangeMut<'_>) -> Result<()> {
        let bytes = std::mem::size_of_val(host);
        let stream = &dst.buffer.stream;
        self.check(who, bytes, dst.bytes, stream)?;
        if bytes == 0 {
            return Ok(());
        }
        self.settle(who, i)?;
        let data = self.data(i);
        // SAFETY: the slot holds `capacity >= bytes` bytes (checked) of host memory it owns, which
        // no copy uses (settled above); `host` is `bytes` bytes borrowed for this call only, and
        // cannot overlap page-locked memory this module allocated.
        unsafe { std::ptr::copy_nonoverlapping(host.as_ptr() as *const u8, data, bytes) };
        let guard = ContextGuard::save(who)?;
        bind(who, stream.context())?;
        // SAFETY: source: `bytes` bytes of the slot, which the host leaves alone and does not
        // free until the event recorded next has completed; destination: `bytes` bytes at
        // `offset` inside the device buffer (made by `ranges_mut`), borrowed exclusively, on the
        // buffer's own stream, so every later use of the buffer is ordered after the copy.
        unsafe {
            cusys::cuMemcpyHtoDAsync_v2(dst.buffer.data as u64 + dst.offset as u64, data as *const c_void, bytes, stream.cu_stream())
        }
        .result()
        .map_err(driver(who))?;
        self.after_queue(who, i, stream, &guard)
    }

    /// Queues `src` into slot `i` on the array's own stream, once the slot's last copy has
    /// finished; [`download_take`](Self::download_take) then copies it out.
    pub(crate) fn download_queue(&mut self, who: &'static str, i: usize, src: &DeviceRange<'_>) -> Result<()> {
        let stream = &src.buffer.stream;
        self.check(who, src.bytes, src.bytes, stream)?;
        self.settle(who, i)?;
        self.slots[i].filled = src.bytes;
        if src.bytes == 0 {
            return Ok(());
        }
        let data = self.data(i);
        let guard = ContextGuard::save(who)?;
        bind(who, stream.context())?;
        // SAFETY: destination: `bytes` bytes of the slot (capacity checked), which the host
        // neither reads nor frees until the event recorded next has completed; source: `bytes`
        // bytes at `offset` inside the device buffer (made by `ranges`), on the buffer's own
        // stream, so later writes and frees of the buffer come after the copy.
        unsafe {
            cusys::cuMemcpyDtoHAsync_v2(data as *mut c_void, src.buffer.data as u64 + src.offset as u64, src.bytes, stream.cu_stream())
        }
        .result()
        .map_err(driver(who))?;
        self.after_queue(who, i, stream, &guard)
    }

    /// Waits for the download queued into slot `i`, then copies it into `host` (exactly as many
    /// bytes).
    pub(crate) fn download_take<T: DeviceScalar>(&mut self, who: &'static str, i: usize, host: &mut [T]) -> Result<()> {
        let bytes = std::mem::size_of_val(host);
        if bytes != self.slots[i].filled {
            return Err(Error::logic(who, format!("a staged piece of {} bytes taken into {bytes} bytes", self.slots[i].filled)));
        }
        self.settle(who, i)?;
        if bytes == 0 {
            return Ok(());
        }
        let data = self.data(i);
        // SAFETY: the slot's first `bytes` bytes were written by a finished copy (settled above)
        // or are the zeros it was made with: initialised, and any bit pattern is a `T`
        // (DeviceScalar); `host` is `bytes` writable bytes borrowed exclusively for this call.
        unsafe { std::ptr::copy_nonoverlapping(data as *const u8, host.as_mut_ptr() as *mut u8, bytes) };
        self.slots[i].filled = 0;
        Ok(())
    }

    /// Waits for both slots' last copies.
    pub(crate) fn finish(&mut self, who: &'static str) -> Result<()> {
        let first = self.settle(who, 0);
        let second = self.settle(who, 1);
        first.and(second)
    }
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
    // SAFETY: writes one unsigned int for an address; the driver only looks the address up in
    // its tables (an address it does not know is CUDA_ERROR_INVALID_VALUE, nothing is read).
    let rc = unsafe {
        cusys::cuPointerGetAttribute(
            &mut kind as *mut u32 as *mut c_void,
            cusys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            host.as_ptr() as cusys::CUdeviceptr,
        )
    };
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
    fn cuts_cover_the_bytes_once_in_order() {
        for (bytes, piece) in [(0usize, 4usize), (1, 4), (4, 4), (5, 4), (4097, 1024), (10, 0)] {
            let v: Vec<_> = cuts(bytes, piece).collect();
            let mut next = 0;
            for (off, len) in &v {
                assert_eq!(*off, next, "{bytes}/{piece}: {v:?}");
                assert!(*len > 0 && *len <= piece.max(1));
                next += len;
            }
            assert_eq!(next, bytes, "{bytes}/{piece}: {v:?}");
        }
    }
}
