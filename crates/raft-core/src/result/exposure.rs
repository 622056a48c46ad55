//! Whether a CUDA graph capture may begin on a resources object's stream (issue 30): the one
//! place that decides when an allocation or a free may skip asking the driver.
//!
//! Soundness asks the stream about a capture before and after every allocation and free
//! (`cuStreamIsCapturing`, about 18–35 ns each, four per allocate + free: docs/BENCHMARKS.md,
//! run 152), because cudarc's `begin_capture` is safe: any thread holding the stream may begin a
//! capture at any moment. A stream nobody outside this library holds cannot be captured, and a
//! stream that never waited for another stream's work cannot have joined a capture begun there.
//! So each resources object's stream carries a flag, **raised for good**:
//! - before its handle leaves the library: `DeviceResources::stream()`, a lend of RAFT's object
//!   (`with_raft_resources`, `_mut`: C++ code reaches the stream), a handle accessor (cuBLAS,
//!   cuSOLVER, cuSPARSE handles carry the stream), an array's, view's or matrix's `stream()` and
//!   cudarc's `DeviceSlice::stream` on them; every crate above (comms, cuVS, Python) takes the
//!   stream through these;
//! - before it waits for work of a stream on which a capture may begin: a copy's join and the
//!   DLPack deleter's order on the legacy stream ([`before_join`], read after the record), an
//!   array used on another stream (`DevicePtr`: its stream later waits for that use; raised at
//!   the guard, `foreign.rs`);
//! - when the resources are released (their stream may be destroyed and its handle reused).
//!
//! While the flag is down, held allocations and frees do not ask (the shim reads it, with
//! acquire semantics, before and again after the call: a capture begun after the first read was
//! ordered by the driver before the call's own work, after the flag was raised, so the second
//! read sees it and the stream is asked). Copies, GEMMs and the rest ask always.
//!
//! One wait happens below this library: RMM's pool and binning resources take a block freed on
//! another stream after making the allocating stream wait for that stream's last free, and a
//! free recorded into a capture there (by code outside these crates: the library's own frees
//! ask, and a cuVS index is not destroyed on a capturing stream) takes the allocating stream in
//! with its flag down. So an allocation through such a resource (or one the shim cannot see
//! into) asks after the call whatever the flag (`may_join_another_stream` in the shim), and a
//! capture found then stops the process (the tenth audit). The async pool and the arena make
//! no such wait.
//!
//! A stream whose flag is unknown here (another library's, or one whose resources were
//! released) counts as one on which a capture may begin.
use cudarc::driver::CudaStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// One resources stream's flag (see the module's documentation).
#[derive(Debug, Default)]
pub(crate) struct CaptureFlag(AtomicBool);

impl CaptureFlag {
    /// Raised for good: from now on every allocation and free on the stream asks. A flag found
    /// raised is not written again (`stream()` may be called per kernel launch from many
    /// threads: no cache line bounced between them). Reading it raised is as good as raising
    /// it: any read that happens after this one (an allocation after the capture the handed-out
    /// handle allows) sees it raised too (read-read coherence; the flag is never lowered).
    #[inline]
    pub(crate) fn raise(&self) {
        if !self.0.load(Ordering::Acquire) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    /// Whether a capture may begin on the stream.
    #[inline]
    pub(crate) fn may_capture(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    /// For the shim, which reads it before and after a held allocation or free.
    pub(crate) fn as_ptr(&self) -> *const u8 {
        self.0.as_ptr() as *const u8
    }
}

/// Hashes a stream handle (a driver pointer) by its bits above the allocator's alignment: no
/// hashing work on the paths that make and release resources.
#[derive(Default)]
struct HandleHasher(u64);

impl std::hash::Hasher for HandleHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_usize(&mut self, n: usize) {
        self.0 = (n as u64 >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type Flags = std::collections::HashMap<usize, Weak<CaptureFlag>, std::hash::BuildHasherDefault<HandleHasher>>;

/// The flags of the streams of live (not yet released) resources, by stream handle: a handle
/// is unique while its stream lives, and an entry lives no longer than its stream. A map: one
/// entry made and one removed per resources object, whatever number are alive (a list scanned
/// at each made 2000 and 8000 live resources' create + release 2.4x and 18x slower, run 167).
static FLAGS: Mutex<Option<Flags>> = Mutex::new(None);

/// A new flag (down) for `stream`, a stream the caller made and holds; registered until
/// [`Registration`] is dropped.
pub(crate) fn register(stream: &CudaStream) -> Registration {
    let flag = Arc::new(CaptureFlag::default());
    let handle = stream.cu_stream() as usize;
    FLAGS.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert_with(Flags::default).insert(handle, Arc::downgrade(&flag));
    Registration { handle, flag }
}

/// A stream's entry in the registry, held by the native resources that own the stream: dropped
/// (and the flag raised) when they are destroyed.
#[derive(Debug)]
pub(crate) struct Registration {
    handle: usize,
    flag: Arc<CaptureFlag>,
}

impl Registration {
    pub(crate) fn flag(&self) -> &Arc<CaptureFlag> {
        &self.flag
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        // The stream may be destroyed now and its handle reused: arrays that outlive the
        // resources ask from here on.
        self.flag.raise();
        let mut flags = FLAGS.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(flags) = flags.as_mut() {
            // Only this registration's own entry (a later stream with the handle has its own).
            if flags.get(&self.handle).is_some_and(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(&self.flag))) {
                flags.remove(&self.handle);
            }
        }
    }
}

/// The flag of a live resources' stream `handle`, if it is one.
fn lookup(handle: usize) -> Option<Arc<CaptureFlag>> {
    let flags = FLAGS.lock().unwrap_or_else(|e| e.into_inner());
    flags.as_ref()?.get(&handle)?.upgrade()
}

/// Before `waiter` waits for work queued on `on`: where a capture may begin on `on`, the wait
/// may take `waiter` into it, so `waiter`'s flag (if it is a resources' stream) is raised first.
pub(crate) fn before_join(waiter: &CudaStream, on: &CudaStream) {
    before_join_handles(waiter.cu_stream() as usize, on.cu_stream() as usize);
}

/// [`before_join`] by raw handles (1 and 2 name the legacy and the per-thread default stream:
/// never a resources' stream).
pub(crate) fn before_join_handles(waiter: usize, on: usize) {
    if waiter == on {
        return;
    }
    let Some(waiting) = lookup(waiter) else { return };
    if waiting.may_capture() {
        return;
    }
    if lookup(on).is_none_or(|f| f.may_capture()) {
        waiting.raise();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flag_is_raised_by_a_join_on_an_unknown_or_raised_stream_and_by_the_registrations_end() {
        // Made-up handles stand for streams: only `cu_stream()` is read, through the raw
        // functions below.
        let (a, b) = (0x1000_0010usize, 0x1000_0020usize);
        let fa = Arc::new(CaptureFlag::default());
        let fb = Arc::new(CaptureFlag::default());
        {
            let mut flags = FLAGS.lock().unwrap();
            let flags = flags.get_or_insert_with(Flags::default);
            flags.insert(a, Arc::downgrade(&fa));
            flags.insert(b, Arc::downgrade(&fb));
        }
        before_join_handles(a, b); // both down: nothing to raise
        assert!(!fa.may_capture() && !fb.may_capture());
        before_join_handles(a, 2); // the per-thread stream: anyone's
        assert!(fa.may_capture(), "a wait for an unknown stream's work must raise the waiter");
        before_join_handles(b, a); // a is raised now
        assert!(fb.may_capture(), "a wait for a raised stream's work must raise the waiter");
        let r = Registration { handle: 0x1000_0030, flag: Arc::new(CaptureFlag::default()) };
        let f = r.flag().clone();
        drop(r);
        assert!(f.may_capture(), "released resources' arrays must ask");
        FLAGS.lock().unwrap().as_mut().unwrap().retain(|h, _| *h != a && *h != b);
    }
}
