//! A device array used on streams other than its own, through cudarc's `DevicePtr` /
//! `DevicePtrMut`: the order of the array's own stream after those uses.
//!
//! cudarc drops the pointer's guard once the use is queued. A guard that synchronised the other
//! stream (`SyncOnDrop::Sync`) would make the host wait, but cudarc swallows a refused wait: while
//! any thread captures a stream in global mode, or this thread in thread-local mode, the driver
//! refuses it, and the array could then be freed and its memory reissued under the use. So the
//! guard records an event instead (`SyncOnDrop::Record`, one event per other stream: a later
//! record on a stream covers all earlier work on it), and the array's own stream waits on the
//! device for those events before its next use of the array and before the array is freed. No
//! host wait is needed, so no capture can refuse one.
//!
//! Two things must hold for that (the ninth audit found both broken):
//! - cudarc records the event at the guard's drop only if the stream's `CudaContext` *object*
//!   has a stream of its own then (`is_managing_stream_synchronization`), which safe code can
//!   change during the use (dropping that object's last stream) or never had (a fresh
//!   `CudaContext::new` used through its default stream). Each use of another context object
//!   keeps a stream of that object (`Use::pin`) for as long as the use is recorded, so the flag
//!   stays up; only event tracking turned off by the caller's `unsafe` leaves it down.
//! - one event stands for one stream: the key is the context object, the stream's handle and,
//!   for the per-thread default stream (one handle, a stream per thread), the thread. A handle
//!   reused by a new stream after the old one was destroyed would still share a key: a stream
//!   that re-records an event whose last record was not yet waited for first waits for that
//!   record, so the new record covers the old use too.
use super::stream_sync;
use crate::error::{Error, Result};
use cudarc::driver::{CudaEvent, CudaStream, SyncOnDrop};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;

/// The per-thread default stream's handle (`CU_STREAM_PER_THREAD`): each thread's own stream.
const PER_THREAD: usize = 0x2;

/// One other stream that used the array.
struct Use {
    /// The stream, as the key: its `CudaContext` object (kept alive by `pin` or by the array's
    /// own stream, so the address is not reused), its handle, and the thread for the per-thread
    /// default stream.
    key: (usize, usize, Option<ThreadId>),
    /// Boxed: handed to guards by reference while the list may grow.
    event: Box<CudaEvent>,
    /// A stream of the use's context object, when that is not the array's own stream's: keeps
    /// cudarc recording the event at each guard's drop (see the module's documentation).
    _pin: Option<Arc<CudaStream>>,
    /// A read (a `DevicePtr`) / a write (a `DevicePtrMut`) was handed to a guard since the
    /// array's own stream last waited for the event.
    read: bool,
    write: bool,
}

/// The other streams that used an array, and whether its own stream still has to wait for them.
#[derive(Default)]
pub(crate) struct ForeignUses {
    /// Some use is pending: the fast path of `settle` is this load.
    any: AtomicBool,
    /// Some write is pending (what a shared use of the array must wait for).
    writes: AtomicBool,
    /// A use on another stream was handed out with no event to order the array after it (the
    /// event could not be made): nothing can order the array's own stream after that use, so
    /// every later settle fails and the array is leaked rather than freed under it.
    unordered: AtomicBool,
    uses: Mutex<Vec<Use>>,
}

impl ForeignUses {
    /// Makes `stream` wait for the work queued on the array's stream `own` (and, through it, for
    /// the uses it waited for), refusing a stream being captured; returns the guard that records
    /// after the use. `write`: the use writes (the caller holds the array exclusively).
    ///
    /// # Panics
    /// When `stream` or `own` is being captured into a CUDA graph: the graph would use the
    /// array's memory at each launch, after the array may be gone (the trait leaves no error to
    /// return).
    pub(crate) fn guard<'a>(&'a self, who: &'static str, own: &'a CudaStream, stream: &'a CudaStream, write: bool) -> SyncOnDrop<'a> {
        if let Err(e) = super::refuse_capture(who, [stream, own]) {
            panic!("{e}");
        }
        if own.cu_stream() == stream.cu_stream() && own.context().cu_ctx() == stream.context().cu_ctx() {
            return SyncOnDrop::Sync(None); // the array's own order suffices
        }
        if let Err(e) = stream.join(own) {
            // Not ordered after the array's own work: wait for that work instead (relaxed), so
            // the pointer is never used before the array's pending writes are done.
            stream.context().record_err::<()>(Err(e));
            if let Err(e) = stream_sync(who, own) {
                log::warn!(target: "raft", "{e}");
            }
        }
        let ctx = stream.context();
        if !ctx.is_event_tracking() {
            // Turned off by the caller's `unsafe` (`disable_event_tracking`), which takes the
            // synchronisation on itself: cudarc records nothing, the host waits at the drop.
            return SyncOnDrop::sync_stream(stream);
        }
        let handle = stream.cu_stream() as usize;
        let key = (Arc::as_ptr(ctx) as usize, handle, (handle == PER_THREAD).then(|| std::thread::current().id()));
        let mut uses = self.uses.lock().unwrap_or_else(|e| e.into_inner());
        let at = match uses.iter().position(|u| u.key == key) {
            Some(at) => {
                let u = &uses[at];
                // A record not yet waited for may be of another stream that had this handle
                // (destroyed since): the new record must come after it, or the array's stream
                // would wait for the new one only.
                if (u.read || u.write) && stream.wait(&u.event).is_err() {
                    return self.cannot_order(uses, stream);
                }
                at
            }
            None => {
                // The array's own stream keeps its context object managing; another object
                // needs a stream of its own for as long as this use is recorded.
                let pin = if Arc::ptr_eq(ctx, own.context()) {
                    None
                } else {
                    let _keep = super::ContextGuard::save(who).ok(); // cudarc binds the context
                    match ctx.new_stream() {
                        Ok(pin) => Some(pin),
                        Err(e) => {
                            ctx.record_err::<()>(Err(e));
                            return self.cannot_order(uses, stream);
                        }
                    }
                };
                match ctx.new_event(None) {
                    Ok(event) => {
                        uses.push(Use { key, event: Box::new(event), _pin: pin, read: false, write: false });
                        uses.len() - 1
                    }
                    Err(e) => {
                        ctx.record_err::<()>(Err(e));
                        return self.cannot_order(uses, stream);
                    }
                }
            }
        };
        let u = &mut uses[at];
        if write {
            u.write = true;
        } else {
            u.read = true;
        }
        self.any.store(true, Ordering::Release);
        if write {
            self.writes.store(true, Ordering::Release);
        }
        let event: *const CudaEvent = &*u.event;
        drop(uses);
        // SAFETY: the event is boxed, so it does not move when the list grows, and a box leaves
        // the list only through `&mut self` (`settle_all`, `Drop`), which cannot run while this
        // borrow of `self` for 'a lives.
        SyncOnDrop::Record(Some((unsafe { &*event }, stream)))
    }

    /// A use handed out with no event to order the array after it (a stream or an event could
    /// not be made, or a record could not be ordered): the guard's host wait may be refused (a
    /// capture) and cudarc swallows that, so the array cannot count on it and is leaked at its
    /// drop (`unordered`).
    fn cannot_order<'a>(&self, uses: std::sync::MutexGuard<'_, Vec<Use>>, stream: &'a CudaStream) -> SyncOnDrop<'a> {
        self.unordered.store(true, Ordering::Release);
        self.any.store(true, Ordering::Release);
        self.writes.store(true, Ordering::Release);
        drop(uses);
        SyncOnDrop::sync_stream(stream)
    }

    /// Makes `own` wait for the pending uses on other streams: the writes only (`writes_only`,
    /// before a read: reads need no order among themselves), or all of them. `done`: mark them
    /// waited for, only when no guard can be alive (the caller holds the array exclusively):
    /// under a shared borrow, a view (`views.rs`) may hold a guard, of a read or of a write to
    /// its own part, whose event is recorded after this wait, and a use marked done would then
    /// be one the free no longer waits for.
    #[inline]
    fn settle(&self, who: &'static str, own: &CudaStream, writes_only: bool, done: bool) -> Result<()> {
        let flag = if writes_only { &self.writes } else { &self.any };
        if !flag.load(Ordering::Acquire) {
            return Ok(());
        }
        self.settle_pending(who, own, writes_only, done)
    }

    /// `settle` once some use is pending (out of line: the common case is none).
    fn settle_pending(&self, who: &'static str, own: &CudaStream, writes_only: bool, done: bool) -> Result<()> {
        let _keep = super::ContextGuard::save(who)?; // cudarc's wait binds `own`'s context
        let mut uses = self.uses.lock().unwrap_or_else(|e| e.into_inner());
        let mut first = Ok(());
        // The event's latest record covers every use handed out on its stream so far.
        for u in uses.iter_mut().filter(|u| u.write || (u.read && !writes_only)) {
            // On the device when it can; else the host waits (relaxed: never refused by a
            // capture). A failure of both is a fault of the context, which stops its work.
            let waited = own.wait(&u.event).or_else(|_| super::relaxed(|| unsafe_event_sync(&u.event))).map_err(|e| Error::driver(who, e));
            match waited {
                Ok(()) if done => (u.write, u.read) = (false, false),
                Ok(()) => {}
                Err(e) => first = first.and(Err(e)),
            }
        }
        if self.unordered.load(Ordering::Acquire) {
            // The uses that have events were waited for above; this one cannot be.
            return first.and(Err(Error::logic(
                who,
                "a use of the array on another stream could not be ordered (its event could not be made): the array's own \
                 stream cannot wait for it",
            )));
        }
        if done {
            self.writes.store(uses.iter().any(|u| u.write), Ordering::Release);
            self.any.store(uses.iter().any(|u| u.read || u.write), Ordering::Release);
        }
        first
    }

    /// Before a read on the array's own stream: ordered after the other streams' writes.
    /// A failure is logged: the use may then race a write, which changes values, never memory.
    pub(crate) fn before_read(&self, own: &CudaStream) {
        if let Err(e) = self.settle("DeviceVec", own, true, false) {
            log::warn!(target: "raft", "{e}");
        }
    }

    /// Before a write through a view (which holds its part of the array exclusively, not the
    /// array): ordered after every use on other streams known so far, none marked done.
    pub(crate) fn wait_all(&self, who: &'static str, own: &CudaStream) -> Result<()> {
        self.settle(who, own, false, false)
    }

    /// Before an exclusive use, or the free: ordered after every use on other streams (no guard
    /// is alive: the caller holds the array exclusively), which are then done. An error: `own`
    /// could not be ordered, and the array's memory must not be freed.
    #[inline]
    pub(crate) fn settle_all(&mut self, who: &'static str, own: &CudaStream) -> Result<()> {
        self.settle(who, own, false, true)
    }
}

/// `cuEventSynchronize` on `event`, binding nothing (see `stream_sync`).
fn unsafe_event_sync(event: &CudaEvent) -> std::result::Result<(), cudarc::driver::DriverError> {
    // SAFETY: the event is alive for the borrow; waiting for it needs no current context.
    unsafe { cudarc::driver::result::event::synchronize(event.cu_event()) }
}

impl Drop for ForeignUses {
    fn drop(&mut self) {
        let uses = std::mem::take(self.uses.get_mut().unwrap_or_else(|e| e.into_inner()));
        if uses.is_empty() {
            return;
        }
        if !raft_exit::native_release_allowed() {
            std::mem::forget(uses); // no CUDA call once the exit has decided
            return;
        }
        // cudarc binds the event's context to destroy it: the caller's context is put back.
        let _keep = super::ContextGuard::save("DeviceVec::drop").ok();
        drop(uses);
    }
}
