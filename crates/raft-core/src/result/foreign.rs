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
//! What must hold for that (the ninth audit and its review found each broken):
//! - **the record happens.** cudarc records at the guard's drop only if the `CudaContext`
//!   *object* of the stream it is given has a stream of its own then
//!   (`is_managing_stream_synchronization`), and only if that object holds no recorded error
//!   (`CudaEvent::record` binds the event's object, whose `check_err` returns a stored error
//!   instead of recording, and the drop stores it back). A user's object satisfies neither for
//!   sure: safe code can drop its last stream during the use, never give it one (a fresh
//!   `CudaContext::new` used through its default stream), or store an error in it
//!   (`record_err` is public; a cross-device cudarc copy stores one). So the stream the guard
//!   names is the user's wrapped by its handle in a **private context object per device**
//!   (`RecordsContext`, made with the library's own, with an anchor stream of its own), and each
//!   entry's event is made in a **context object of its own** (from a per-device pool): the
//!   guard hands both out by reference, and code that looks into a guard reaches both objects,
//!   so an error stored there must skip no other array's record, nor any other stream's
//!   (the tenth audit: with one object for every event, a look into any guard could skip the
//!   record of an array only ever used through cudarc's safe copies). A record that fails or is
//!   skipped leaves its error in the records context; it is taken at every guard and every
//!   settle, and counted (`FAILED_RECORDS`); a use whose guard was handed out before the latest
//!   count is no longer trusted, and the array is leaked rather than freed under it
//!   (`unordered`). An entry's event object returns to the pool only when nothing else holds
//!   it, by a strong or a weak handle (`Arc::get_mut`). What no design on cudarc 0.19's trait
//!   can close: code holding a guard of an array on a stream reaches that entry's event object,
//!   and with it can skip (then hide) the record of a later use of the same array on the same
//!   stream (docs/RELIABILITY.md, the tenth audit).
//! - **one event stands for one stream**: the key is the context (`CUcontext`), the stream's
//!   handle and, for the per-thread default stream (one handle, a stream per thread), the thread
//!   (each guard there has an event of its own: a guard is `Send`, and one dropped on another
//!   thread records on that thread's per-thread stream). A handle reused
//!   by a new stream after the old one was destroyed shares a key: a stream that re-records an
//!   event whose last record was not yet waited for first waits for that record, so the new
//!   record covers the old use too.
//!
//! Streams of a context other than a device's primary one cannot be wrapped in the private
//! object: such a use leaves the array unordered (leaked at its drop, never freed under it).
use super::stream_sync;
use crate::error::{Error, Result};
use cudarc::driver::{sys as cusys, CudaContext, CudaEvent, CudaStream, SyncOnDrop};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;

/// The per-thread default stream's handle (`CU_STREAM_PER_THREAD`): each thread's own stream.
const PER_THREAD: usize = 0x2;

/// A device's private context object for the records of other streams' uses (see the module's
/// documentation), with an anchor stream so that cudarc always records through it.
struct RecordsContext {
    ctx: Arc<CudaContext>,
    _anchor: Arc<CudaStream>,
}

/// Per device, its records context (made with the library's own context object, in `device.rs`).
static RECORDS: Mutex<Vec<Option<&'static RecordsContext>>> = Mutex::new(Vec::new());

/// How many failed or skipped records were found so far (errors taken from a records context).
static FAILED_RECORDS: AtomicU64 = AtomicU64::new(0);

/// Per device, context objects (of the primary context) that held an entry's event and that
/// nothing else holds: reused for the next entry's event rather than made anew.
static EVENT_OBJECTS: Mutex<Vec<Vec<Arc<CudaContext>>>> = Mutex::new(Vec::new());

/// At most this many idle event objects kept per device (each holds a retain of the primary
/// context, no driver resources).
const IDLE_EVENT_OBJECTS: usize = 64;

/// The most entries an array keeps between two exclusive uses: one per other stream, and one per
/// guard on a per-thread default stream (a read-only loop there adds one per use).
const MAX_USES: usize = 4096;

/// An event in a context object of its own, for one entry (see the module's documentation).
/// Binds the device's primary context (the caller puts its own back).
fn private_event(device: usize) -> std::result::Result<CudaEvent, cudarc::driver::DriverError> {
    let idle = EVENT_OBJECTS.lock().unwrap_or_else(|e| e.into_inner()).get_mut(device).and_then(Vec::pop);
    let object = match idle {
        Some(object) => object,
        None => CudaContext::new(device)?,
    };
    object.new_event(None)
}

/// Gives an entry's event object back once its event is destroyed: to the pool when nothing
/// else holds it (no guard's look kept a handle), its error (if code that looked stored one)
/// taken first.
fn recycle_event_object(mut object: Arc<CudaContext>) {
    // `get_mut`: no other strong *or weak* handle (a look into a guard can keep a `Weak` and
    // upgrade it once the object is pooled), checked with the ordering `Arc`'s drop needs.
    if Arc::get_mut(&mut object).is_none() || object.check_err().is_err() {
        return; // someone else holds it, or it holds an error: dropped (its retain let go)
    }
    let mut idle = EVENT_OBJECTS.lock().unwrap_or_else(|e| e.into_inner());
    let device = object.ordinal();
    if idle.len() <= device {
        idle.resize_with(device + 1, Vec::new);
    }
    if idle[device].len() < IDLE_EVENT_OBJECTS {
        idle[device].push(object);
    }
}

/// Makes `device`'s records context: a second object of the primary context `primary` (made and
/// retained by the caller), with a stream of its own, made without cudarc's context-wide wait
/// (`first_stream`: the object is fresh). Called at each device's first resources, or at the first
/// use of an array on a stream of a device the library has set up nothing on; made once.
pub(crate) fn make_records_context(who: &'static str, device: usize) -> Result<()> {
    // Made under the lock, once: threads racing on a device's first resources each made and
    // leaked an object and its stream before (the fourteenth audit, low).
    let mut all = RECORDS.lock().unwrap_or_else(|e| e.into_inner());
    if all.get(device).is_some_and(Option::is_some) {
        return Ok(());
    }
    let mut ctx = super::retain_primary(who, device)?;
    let anchor = super::first_stream(who, &mut ctx)?;
    let made: &'static RecordsContext = Box::leak(Box::new(RecordsContext { ctx, _anchor: anchor }));
    if all.len() <= device {
        all.resize(device + 1, None);
    }
    all[device] = Some(made);
    Ok(())
}

/// Makes the records context of `stream`'s device when the library has made none there yet (no
/// resources on that device) and the device's primary context is active already, as it is when
/// `stream` belongs to it: an array used on such a stream was taken for one used in another
/// library's context and leaked for the life of the process (the nineteenth audit, helper 86).
/// A device whose primary context is inactive is left so (nothing is woken), and a stream of a
/// context that is not primary never gets here. Returns whether the device has one now.
fn records_for_a_device_without_resources(who: &'static str, stream: &CudaStream) -> bool {
    if !stream.context().is_primary() {
        return false; // cudarc's `new_non_primary`: no record serves it, and nothing is retained
    }
    let device = stream.context().ordinal();
    if RECORDS.lock().unwrap_or_else(|e| e.into_inner()).get(device).is_some_and(Option::is_some) {
        // Made meanwhile by another thread (its device's first resources): the caller asks again,
        // and the contexts' comparison decides.
        return true;
    }
    let Ok(handle) = cudarc::driver::result::device::get(device as i32) else { return false };
    let (mut flags, mut active) = (0u32, 0i32);
    // SAFETY: writes two integers for a device handle the driver gave; no context is touched.
    let asked = unsafe { cusys::cuDevicePrimaryCtxGetState(handle, &mut flags, &mut active) };
    if asked != cusys::CUresult::CUDA_SUCCESS || active == 0 {
        return false;
    }
    // Retaining makes the primary context current on this thread: the caller's goes back.
    let Ok(_keep) = super::ContextGuard::save(who) else { return false };
    make_records_context(who, device).is_ok()
}

/// Takes any error recorded in the records contexts (a record that failed, or one skipped
/// because of an earlier failure) and counts it; returns the count, and the records context of
/// `stream`'s device when `stream` belongs to that device's primary context. One lock for both:
/// an error taken here is counted before another caller reads the count.
fn take_failures(stream: Option<&CudaStream>) -> (u64, Option<&'static RecordsContext>) {
    let all = RECORDS.lock().unwrap_or_else(|e| e.into_inner());
    for r in all.iter().flatten() {
        if r.ctx.check_err().is_err() {
            FAILED_RECORDS.fetch_add(1, Ordering::AcqRel);
        }
    }
    let found = stream.and_then(|s| {
        let found = all.get(s.context().ordinal()).copied().flatten()?;
        (found.ctx.cu_ctx() == s.context().cu_ctx()).then_some(found)
    });
    (FAILED_RECORDS.load(Ordering::Acquire), found)
}

/// One other stream that used the array.
struct Use {
    /// The stream, as the key: its context, its handle, and the thread for the per-thread
    /// default stream.
    key: (usize, usize, Option<ThreadId>),
    /// In a context object of its own (`private_event`). Boxed: handed to guards by reference
    /// while the list may grow; taken out only in `Drop`.
    event: std::mem::ManuallyDrop<Box<CudaEvent>>,
    /// The stream's handle wrapped in the records context (never destroyed through it); an
    /// `Arc`, so the reference handed to guards does not move with the list.
    stream: Arc<CudaStream>,
    /// `FAILED_RECORDS` when a guard last handed out the event: a later count means a record
    /// since may have been skipped.
    failures: u64,
    /// A read (a `DevicePtr`) / a write (a `DevicePtrMut`) was handed to a guard since the
    /// array's own stream last waited for the event.
    read: bool,
    write: bool,
}

impl Drop for Use {
    fn drop(&mut self) {
        // SAFETY: taken once, here; the field is not used afterwards.
        let event = unsafe { std::mem::ManuallyDrop::take(&mut self.event) };
        let object = event.context().clone();
        drop(event); // binds its object to destroy it: every caller holds a `ContextGuard`
        recycle_event_object(object);
    }
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
    /// The array's being unordered was logged (`report`): once per array, not at every read.
    reported: AtomicBool,
    /// Dropped by hand (`Drop` below): an array never used on another stream has nothing here,
    /// and its drop is one test (issue 30: the glue of an empty `Mutex<Vec<_>>` was three calls
    /// on every array's drop).
    uses: std::mem::ManuallyDrop<Mutex<Vec<Use>>>,
}

impl ForeignUses {
    /// Makes `stream` wait for the work queued on the array's stream `own` (and, through it, for
    /// the uses it waited for); returns the guard that records after the use. `write`: the use
    /// writes (the caller holds the array exclusively).
    ///
    /// # Errors
    /// `Logic` when `stream` or `own` is being captured into a CUDA graph; the driver's error
    /// when the question fails. Nothing is queued then.
    pub(crate) fn guard<'a>(
        &'a self,
        who: &'static str,
        own: &'a CudaStream,
        own_capture: &super::exposure::CaptureFlag,
        stream: &'a CudaStream,
        write: bool,
    ) -> Result<SyncOnDrop<'a>> {
        super::refuse_capture(who, [stream, own]).map_err(|e| match e.kind() {
            crate::error::ErrorKind::Logic => Error::logic(
                who,
                "the stream is being captured into a CUDA graph: the graph would use the array at each launch, after it may \
                 be gone; take the address before the capture begins or after it ends",
            ),
            _ => e,
        })?;
        if own.cu_stream() == stream.cu_stream() && own.context().cu_ctx() == stream.context().cu_ctx() {
            return Ok(SyncOnDrop::Sync(None)); // the array's own order suffices
        }
        // The array's stream will wait for this use's event (`settle`), on a stream the user
        // holds: it may join a capture there (`exposure.rs`). Raised directly, no lookup.
        own_capture.raise();
        if let Err(e) = stream.join(own) {
            // Not ordered after the array's own work: wait for that work instead (relaxed), so
            // the pointer is never used before the array's pending writes are done.
            stream.context().record_err::<()>(Err(e));
            if let Err(e) = stream_sync(who, own) {
                log::warn!(target: "raft", "{e}");
            }
        }
        let (failures, records) = match take_failures(Some(stream)) {
            (_, None) if records_for_a_device_without_resources(who, stream) => take_failures(Some(stream)),
            found => found,
        };
        let Some(records) = records else {
            // Another context than the device's primary one: no record can be trusted.
            return Ok(self.cannot_order(self.uses.lock().unwrap_or_else(|e| e.into_inner()), stream));
        };
        let handle = stream.cu_stream() as usize;
        let key = (stream.context().cu_ctx() as usize, handle, (handle == PER_THREAD).then(|| std::thread::current().id()));
        let mut uses = self.uses.lock().unwrap_or_else(|e| e.into_inner());
        // The per-thread stream: an event for each guard, never shared, since a guard is `Send`
        // and records on the per-thread stream of whichever thread drops it.
        let shared = if key.2.is_some() { None } else { uses.iter().position(|u| u.key == key) };
        if shared.is_none() && uses.len() >= MAX_USES {
            // Entries go only at an exclusive use (`settle_all`); per-thread streams add one per
            // guard. Past the bound the array is leaked once rather than the list grown forever.
            return Ok(self.cannot_order(uses, stream));
        }
        let at = match shared {
            Some(at) => {
                let u = &uses[at];
                // A record not yet waited for may be of another stream that had this handle
                // (destroyed since): the new record must come after it, or the array's stream
                // would wait for the new one only. Raw: binds no context object, so no error a
                // user stored in theirs stands in the way.
                // SAFETY: the stream is alive for the borrow; the event is alive (in the list).
                let chained = !(u.read || u.write)
                    || unsafe {
                        cudarc::driver::result::stream::wait_event(
                            stream.cu_stream(),
                            u.event.cu_event(),
                            cusys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
                        )
                    }
                    .is_ok();
                if !chained {
                    return Ok(self.cannot_order(uses, stream));
                }
                at
            }
            None => {
                // cudarc binds the records context: the caller's is put back.
                let _keep = super::ContextGuard::save(who).ok();
                // SAFETY: the handle is a live stream of the records context's `CUcontext`
                // (checked by `take_failures`), borrowed for this call and the guard; the wrapper
                // never destroys it, and is used only to record at a guard's drop, each guard
                // borrowing a live stream with this handle (the key's).
                let wrapped = unsafe { records.ctx.wrap_borrowed_stream(stream.cu_stream()) };
                match private_event(stream.context().ordinal()) {
                    Ok(event) => {
                        let event = std::mem::ManuallyDrop::new(Box::new(event));
                        uses.push(Use { key, event, stream: wrapped, failures, read: false, write: false });
                        uses.len() - 1
                    }
                    Err(_) => return Ok(self.cannot_order(uses, stream)),
                }
            }
        };
        let u = &mut uses[at];
        if !(u.read || u.write) {
            // A pending use keeps the count of its own guard: a failure since then still taints it.
            u.failures = failures;
        }
        if write {
            u.write = true;
        } else {
            u.read = true;
        }
        self.any.store(true, Ordering::Release);
        if write {
            self.writes.store(true, Ordering::Release);
        }
        let event: *const CudaEvent = &**u.event;
        let wrapped: *const CudaStream = &*u.stream;
        drop(uses);
        // SAFETY: the event is boxed and the wrapper behind an `Arc`, so neither moves when the
        // list grows, and both leave the list only through `&mut self` (`settle_all`, `Drop`),
        // which cannot run while this borrow of `self` for 'a lives.
        Ok(SyncOnDrop::Record(Some(unsafe { (&*event, &*wrapped) })))
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
        let _keep = super::ContextGuard::save(who)?; // a host wait may bind a context
        let (failures, _) = take_failures(None);
        let mut uses = self.uses.lock().unwrap_or_else(|e| e.into_inner());
        let mut first = Ok(());
        // Never a wait on `own` while it is being captured into a CUDA graph: the driver refuses
        // a wait for an event recorded outside the capture (and invalidates the capture), and one
        // it took would order only the graph's launches, not the free after the capture. The
        // host waits instead; a failed question counts as a capture.
        let own_captured = super::capturing(who, own).unwrap_or(true);
        // The event's latest record covers every use handed out on its stream so far.
        for u in uses.iter_mut().filter(|u| u.write || (u.read && !writes_only)) {
            if u.failures != failures {
                // A record failed or was skipped since this use's guard was handed out: its
                // event may not stand after the use.
                self.unordered.store(true, Ordering::Release);
                continue;
            }
            // On the device when it can; else the host waits (relaxed: never refused by a
            // capture). A failure of both is a fault of the context, which stops its work.
            let on_device = if own_captured {
                Err(cudarc::driver::DriverError(cusys::CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED))
            } else {
                // SAFETY: both are alive for the call; a wait binds no context.
                unsafe {
                    cudarc::driver::result::stream::wait_event(
                        own.cu_stream(),
                        u.event.cu_event(),
                        cusys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
                    )
                }
            };
            let waited = on_device.or_else(|_| super::relaxed(|| unsafe_event_sync(&u.event))).map_err(|e| Error::driver(who, e));
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
                "a use of the array on another stream could not be ordered (a stream of a non-primary context, an event \
                 that could not be made, or more than 4096 uses on other streams since its last exclusive use): the array's \
                 own stream cannot wait for it, and the array is kept until the process ends",
            )));
        }
        if done {
            // Per-thread streams' entries go once waited for (one per guard); the other streams'
            // stay, their events reused by the next use there, unless the list has grown past
            // half its bound (an array used on many streams in its life).
            let keep_shared = uses.len() <= MAX_USES / 2;
            uses.retain(|u| (keep_shared && u.key.2.is_none()) || u.read || u.write);
            self.writes.store(uses.iter().any(|u| u.write), Ordering::Release);
            self.any.store(uses.iter().any(|u| u.read || u.write), Ordering::Release);
        }
        first
    }

    /// Before a read on the array's own stream: ordered after the other streams' writes.
    /// A failure is logged: the use may then race a write, which changes values, never memory.
    pub(crate) fn before_read(&self, own: &CudaStream) {
        if let Err(e) = self.settle("DeviceVec", own, true, false) {
            self.report(&e);
        }
    }

    /// Logs a failed ordering before a use (which may then race a use elsewhere: values, never
    /// memory). An unordered array fails every settle: that is said once, not at every use.
    pub(crate) fn report(&self, e: &Error) {
        if self.unordered.load(Ordering::Acquire) && self.reported.swap(true, Ordering::Relaxed) {
            return;
        }
        log::warn!(target: "raft", "{e}");
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
    #[inline]
    fn drop(&mut self) {
        // No entry was ever made: the vector holds no allocation, and the mutex (a futex word on
        // Linux, this crate's one platform) has nothing to free.
        if self.uses.get_mut().map_or_else(|e| e.into_inner().capacity(), |u| u.capacity()) == 0 {
            return;
        }
        // SAFETY: called once, from `drop`; the field is not used afterwards.
        unsafe { self.drop_entries() };
    }
}

impl ForeignUses {
    /// The entries' events destroyed (out of line: most arrays have none).
    ///
    /// # Safety
    /// Called at most once, from `drop`: it takes `uses` out of its `ManuallyDrop`.
    #[cold]
    unsafe fn drop_entries(&mut self) {
        // SAFETY: taken once (the caller's contract); the field is not used afterwards.
        let uses = unsafe { std::mem::ManuallyDrop::take(&mut self.uses) };
        let uses = uses.into_inner().unwrap_or_else(|e| e.into_inner());
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
