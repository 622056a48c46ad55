//! Staged copies of pageable memory: page-locked slots the device copies from or to while host
//! threads fill or empty them (`StagingBuffers`, `staged_upload`, `staged_download`). The host
//! copy itself (`HostStores`, `copy_host_bytes`) is `stores.rs`'s, which this file uses. Apart
//! from `copy.rs` because it is its own concern: the device never touches the caller's memory
//! here, so none of copy.rs's ownership shapes apply.
use super::buffer::NativeBuffer;
use super::copy::{driver, same_context, NativeEvent, NativeHostBuffer};
use super::mr::NativeMr;
use super::stores::copy_host_bytes;
use super::stores::HostStores;
use super::{stream_sync, ContextGuard, DeviceScalar};
use crate::error::{Error, ErrorKind, Result};
use cudarc::driver::{sys as cusys, CudaContext, CudaStream};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

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
        if super::captured_meanwhile(end.stream) {
            // The piece may be in the graph: its end cannot be known.
            raft_exit::abort_with(format_args!("{who}: a CUDA graph capture began on the stream during a staged copy; aborting"));
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
    /// does not block in practice), then frees them on a release thread: `cudaFreeHost` waits
    /// for the whole device, and a staged copy that gave surplus buffers back waited for every
    /// other stream's work (the eighteenth audit). Leaks a buffer whose copy cannot be waited
    /// for, and everything once the exit has decided.
    fn drop(&mut self) {
        let free = raft_exit::native_release_allowed() && !self.poisoned;
        let mut settled = Vec::with_capacity(2);
        for i in 0..2 {
            let waited = free && self.settle("staging buffers", i).is_ok();
            let Some(host) = self.slots[i].host.take() else { continue };
            if waited {
                settled.push(host);
            } else {
                host.leak();
            }
        }
        if settled.is_empty() {
            return;
        }
        let device = Some(settled[0].device());
        let label = raft_exit::Label { what: "release of staging buffers", id: raft_exit::next_id(), device };
        super::mr::defer(
            label,
            Box::new(move || {
                for host in settled {
                    if !raft_exit::native_release_allowed() {
                        host.leak();
                    } else if let Err(e) = host.free("staging buffers") {
                        log::warn!(target: "raft", "{e}");
                    }
                }
            }),
        );
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
