//! Device bytes from an RMM resource (`NativeBuffer`) and the size checks every allocation
//! passes first: above the memory resources (`mr.rs`) a buffer keeps alive.
use super::exposure::CaptureFlag;
use super::mr::{current_cache, NativeMr};
use super::{already_gone, api, bind, check, refuse_capture, stream_sync, ContextGuard, DeviceScalar};
use crate::error::{Error, ErrorKind, Result};
use cudarc::driver::CudaStream;
use raft_sys as sys;
use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Once, Weak};

/// The most bytes one allocation may ask for: 2^48 (256 TiB), what a 48-bit virtual address
/// space spans, and more than any device's memory or any host's page-locked memory. A larger
/// size is refused as `OutOfMemory` before it reaches RMM, whose resources round sizes up (to
/// 256 bytes; the pinned host resource also adds a header) with arithmetic that wraps near
/// `usize::MAX`: `usize::MAX` bytes became a 0-byte block of a pool, and the pinned resource
/// allocated 256 bytes for `usize::MAX - 7` (issue 33). The shim refuses the same sizes
/// (`max_allocation_bytes` in raft-sys's `shim/buffers.cpp`).
pub(crate) const MAX_ALLOCATION_BYTES: usize = 1 << 48;

/// Sizes within this of `usize::MAX` are a `Logic` error rather than `OutOfMemory`: rounding them
/// up to an allocator's alignment wraps around, so they are not sizes at all. The shim's
/// `rounding_slack` is the same.
pub(crate) const ROUNDING_SLACK: usize = 4096;

/// Refuses an allocation of `bytes` that no resource can serve (see [`MAX_ALLOCATION_BYTES`]),
/// before any CUDA call.
#[inline]
pub(crate) fn check_allocation(who: &'static str, bytes: usize) -> Result<()> {
    if bytes > usize::MAX - ROUNDING_SLACK {
        return Err(Error::logic(who, format!("{bytes} bytes: rounding the size up to an allocation's alignment wraps around")));
    }
    if bytes > MAX_ALLOCATION_BYTES {
        return Err(Error::new(
            ErrorKind::OutOfMemory,
            who,
            format!("{bytes} bytes is more than any device or host memory holds (at most 2^48 bytes in one allocation)"),
        ));
    }
    Ok(())
}

/// The alignment every allocation of RMM's resources has (`rmm::CUDA_ALLOCATION_ALIGNMENT`; the
/// pinned host resource places its blocks 256 bytes past a page start, so never more): an
/// element type aligned to more cannot be stored in them (the eighteenth audit).
pub(crate) const ALLOCATION_ALIGNMENT: usize = 256;

/// The bytes of `len` elements of `T`, refused as [`check_allocation`] refuses them; a product
/// that overflows is a `Logic` error (the length is wrong, not the memory short), and so is an
/// element type aligned to more than [`ALLOCATION_ALIGNMENT`] (a `DeviceScalar` implemented
/// against its contract: its memory would be misaligned).
pub(crate) fn allocation_bytes<T>(who: &'static str, len: usize) -> Result<usize> {
    let size = std::mem::size_of::<T>();
    if std::mem::align_of::<T>() > ALLOCATION_ALIGNMENT {
        return Err(Error::logic(
            who,
            format!(
                "an element type aligned to {} bytes: RMM's allocations are aligned to {ALLOCATION_ALIGNMENT} bytes (the \
                 DeviceScalar contract)",
                std::mem::align_of::<T>()
            ),
        ));
    }
    let bytes =
        len.checked_mul(size).ok_or_else(|| Error::logic(who, format!("{len} elements of {size} bytes: the byte count overflows")))?;
    check_allocation(who, bytes)?;
    Ok(bytes)
}

/// Device bytes from an RMM resource, ordered on one stream, holding the resource that frees them
/// (the `NativeMr` it was allocated from, or a shared copy inside the shim) and the stream they
/// are ordered on.
pub(crate) struct NativeBuffer {
    /// What frees the bytes: the shim's record (with its own copy of the resource), or the
    /// resource itself, held here until after the free (a held allocation: no record).
    owner: Owner,
    pub(super) data: *mut c_void,
    pub(super) bytes: usize,
    pub(super) device: usize,
    pub(super) stream_ordered: bool,
    pub(super) stream: Arc<CudaStream>,
}

/// What a [`NativeBuffer`]'s bytes are freed through.
enum Owner {
    /// The shim's buffer record (`raftrs_buffer_create`), which holds its own copy of the
    /// resource.
    Record(NonNull<sys::raftrs_buffer>),
    /// The resource the bytes came from (`raftrs_mr_allocate_held`), kept alive until after the
    /// free: the same guarantee as a copy, for a reference count instead of a heap record.
    Held(Arc<NativeMr>),
}

// SAFETY: the buffer is a pointer, a size and an owned resource copy or handle; the device memory
// is only touched by the GPU in stream order, through the checked calls below. Freeing consumes
// `self`.
unsafe impl Send for NativeBuffer {}
// SAFETY: shared use reads the fields and queues device work in stream order. Writes queued
// through a shared buffer cover only ranges that a `DeviceViewMut` / `MatrixViewMut` holds
// exclusively, which are disjoint by construction (`split_at_mut`, `Shape::sub`); a write of the
// whole buffer, its free and its resource's release take `&mut` or `self`.
unsafe impl Sync for NativeBuffer {}

impl NativeBuffer {
    /// `bytes` from `mr`, or from `device`'s current resource, on `stream`; the shim's buffer keeps
    /// its own copy of the resource. Every allocation of the crate, device or page-locked, comes
    /// through here or [`create_held`](Self::create_held): a size no resource can serve is refused
    /// here whoever asked (and again by the shim).
    pub(crate) fn create(who: &'static str, device: usize, mr: Option<&NativeMr>, stream: &Arc<CudaStream>, bytes: usize) -> Result<Self> {
        check_allocation(who, bytes)?;
        let api = api(who)?;
        // No context guard: the shim makes the device current around the call and puts the
        // caller's exact context back (its device_scope); nothing here binds one.
        let mut raw = std::ptr::null_mut();
        let (mut data, mut ordered) = (std::ptr::null_mut(), 0);
        let mr_ptr = mr.map_or(std::ptr::null(), |m| m.ptr.as_ptr() as *const _);
        // SAFETY: the stream is alive (borrowed, and held by the new buffer); `mr` is alive for
        // the borrow and the buffer keeps its own copy of it; the out-pointers are locals.
        let made = check(who, api, unsafe {
            api.raftrs_buffer_create(device as i32, mr_ptr, stream.cu_stream() as *mut c_void, bytes, &mut raw, &mut data, &mut ordered)
        });
        made?;
        let ptr = NonNull::new(raw).ok_or_else(|| Error::new(ErrorKind::Generic, who, "the shim returned no buffer"))?;
        let stream_ordered = ordered != 0;
        Ok(NativeBuffer { owner: Owner::Record(ptr), data, bytes, device, stream_ordered, stream: stream.clone() })
    }

    /// `bytes` from `mr`, or from `device`'s current resource (`None`), on `stream`, holding the
    /// `NativeMr` it came from rather than a fresh copy of the resource (issue 30): the same
    /// guarantee (the resource lives until the free) for a reference count instead of a heap
    /// copy, and no record in the shim. The current resource is this crate's copy of what RMM's
    /// map held, used while the map's entry still compares equal to it (checked under RMM's lock
    /// at every allocation: any library may replace it at any moment), replaced by a new copy
    /// otherwise.
    ///
    /// `capture`: the stream's flag (`exposure.rs`); while it is down the shim does not ask the
    /// stream about a capture.
    pub(crate) fn create_held(
        who: &'static str,
        device: usize,
        mr: Option<&Arc<NativeMr>>,
        stream: &Arc<CudaStream>,
        capture: &CaptureFlag,
        bytes: usize,
    ) -> Result<Self> {
        check_allocation(who, bytes)?;
        let api = api(who)?;
        register_stream_keeper(api);
        // The handle the new buffer will hold: taken once, here, and moved into the buffer (a
        // second count taken after the call and this one dropped were two more atomic operations
        // on every default allocation).
        let held = match mr {
            Some(m) => Some(m.clone()),
            None => current_kept(device),
        };
        // Read before the shim looks at RMM's map (see `KeptCurrent::generation`).
        let generation = mr.is_none().then(|| current_cache(device).map(|k| k.generation.load(Ordering::Relaxed))).flatten();
        let mut fresh = std::ptr::null_mut();
        let (mut data, mut ordered) = (std::ptr::null_mut(), 0);
        let mr_ptr = held.as_ref().map_or(std::ptr::null(), |m| m.ptr.as_ptr() as *const _);
        // SAFETY: the stream is alive (borrowed, and held by the new buffer); `mr_ptr` is null or
        // a resource kept alive by `held`, which the new buffer keeps until its free; a fresh
        // copy comes back owned and is kept likewise; the out-pointers are locals; the flag is
        // borrowed for the call and raised wherever a capture of the stream may begin
        // (`exposure.rs`).
        // Through the entry point's field, as the free calls it.
        let made = check(who, api, unsafe {
            (api.raftrs_mr_allocate_held)(
                device as i32,
                mr_ptr,
                mr.is_none() as i32,
                stream.cu_stream() as *mut c_void,
                bytes,
                &mut data,
                &mut ordered,
                &mut fresh,
                capture.as_ptr(),
            )
        });
        // A fresh copy is owned from here on, whatever else happened: on success the block
        // belongs to it, and nothing between here and the buffer's construction can fail.
        let fresh = NonNull::new(fresh).map(|p| Arc::new(NativeMr::from_shim(p, device)));
        made?;
        let held = match fresh {
            Some(fresh) => {
                // The map held another resource: this copy stands for it from now on.
                if let Some(kept) = current_cache(device) {
                    let mut slot = kept.slot.lock().unwrap_or_else(|e| e.into_inner());
                    // Not when the map's entry was replaced through this crate meanwhile: the
                    // copy may be of the replaced resource, which the forgetting let go.
                    let old = (Some(kept.generation.load(Ordering::Relaxed)) == generation).then(|| slot.replace(fresh.clone()));
                    drop(slot);
                    drop(old); // outside the lock: the last handle of a resource queues its release
                }
                remember_current(device, &fresh);
                fresh
            }
            // Without a handle the shim makes a fresh copy, so `held` is there; were it not, the
            // block is leaked by the error, never left to be freed through nothing.
            None => held.ok_or_else(|| Error::new(ErrorKind::Generic, who, "the shim used no resource"))?,
        };
        Ok(NativeBuffer { owner: Owner::Held(held), data, bytes, device, stream_ordered: ordered != 0, stream: stream.clone() })
    }

    pub(crate) fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Whether freeing never blocks (the async pool): then `Drop` may free inline.
    pub(crate) fn frees_stream_ordered(&self) -> bool {
        self.stream_ordered
    }

    /// The device address (for cudarc's `DevicePtr` and FFI; dereferencing it is the user's
    /// `unsafe`).
    pub(crate) fn address(&self) -> u64 {
        self.data as u64
    }

    /// Copies `host` into the buffer; refused unless it is exactly the buffer's size. Returns
    /// once the copy is done, so the borrow of `host` covers it.
    pub(crate) fn copy_from_host<T: DeviceScalar>(&mut self, who: &'static str, host: &[T]) -> Result<()> {
        let bytes = std::mem::size_of_val(host);
        if bytes != self.bytes {
            return Err(Error::logic(who, format!("a copy of {bytes} bytes into an array of {} bytes", self.bytes)));
        }
        let api = api(who)?;
        refuse_capture(who, [&*self.stream])?;
        let _keep = ContextGuard::save(who)?;
        // SAFETY: both ranges hold `bytes` bytes (checked above); the host slice is borrowed until
        // the copy has finished (waited for below; the stream is not being captured, checked
        // above); the stream is the buffer's own.
        let queued = check(who, api, unsafe {
            api.raftrs_memcpy_async(
                self.device as i32,
                self.data,
                host.as_ptr() as *const c_void,
                bytes,
                self.stream.cu_stream() as *mut c_void,
            )
        });
        // Wait even when queueing failed half-way: the host borrow must outlive any copy.
        let waited = super::waited_for_borrow(who, stream_sync(who, &self.stream));
        queued.and(waited)
    }

    /// Copies the buffer into `host`; refused unless it is exactly the buffer's size. Returns
    /// once the copy is done.
    pub(crate) fn copy_to_host<T: DeviceScalar>(&self, who: &'static str, host: &mut [T]) -> Result<()> {
        let bytes = std::mem::size_of_val(host);
        if bytes != self.bytes {
            return Err(Error::logic(who, format!("a copy of an array of {} bytes into {bytes} bytes", self.bytes)));
        }
        let api = api(who)?;
        refuse_capture(who, [&*self.stream])?;
        let _keep = ContextGuard::save(who)?;
        // SAFETY: both ranges hold `bytes` bytes (checked above); the host slice is borrowed
        // mutably until the copy has finished (waited for below; the stream is not being
        // captured, checked above); any bit pattern is a valid T (DeviceScalar).
        let queued = check(who, api, unsafe {
            api.raftrs_memcpy_async(
                self.device as i32,
                host.as_mut_ptr() as *mut c_void,
                self.data,
                bytes,
                self.stream.cu_stream() as *mut c_void,
            )
        });
        let waited = super::waited_for_borrow(who, stream_sync(who, &self.stream));
        queued.and(waited)
    }

    /// Lets device `peer` access this buffer's memory where it comes from a CUDA async pool (see
    /// `copy::enable_peer_access`).
    pub(crate) fn grant_peer(&self, who: &'static str, peer: usize) -> Result<()> {
        let api = api(who)?;
        let _keep = ContextGuard::save(who)?;
        let mut granted = 0i32;
        // SAFETY: the buffer (and so its record or resource) is alive for the borrow; writes one
        // int; the shim checks `peer`.
        check(who, api, unsafe {
            match &self.owner {
                Owner::Record(ptr) => api.raftrs_buffer_grant_peer(ptr.as_ptr(), peer as i32, &mut granted),
                Owner::Held(mr) => api.raftrs_mr_grant_peer(mr.ptr.as_ptr(), peer as i32, &mut granted),
            }
        })
    }

    /// Frees the buffer stream-ordered on its own stream, through the resource that made it.
    /// A resource whose free is not stream-ordered (cudaFree, cudaFreeHost, the arena's large
    /// blocks, unknown resources) gets the buffer only once its stream has finished with it:
    /// CUDA documents that cudaFree *may* synchronise, not that it does (the CUDA 13 runtime
    /// documentation of cudaFree), so the wait is made here (such frees run on release threads).
    ///
    /// `capture`: the stream's flag (`exposure.rs`), for a free made where the flag is at hand
    /// (the array's drop); `None` asks the stream always.
    pub(crate) fn free(self, who: &'static str, capture: Option<&CaptureFlag>) -> Result<()> {
        let api = match api(who) {
            Ok(api) => api,
            Err(e) => {
                // Never dropped without its free: the resource could go while the stream still
                // uses the block (cannot happen once the shim is loaded, as it was to allocate).
                self.leak();
                return Err(e);
            }
        };
        // Page-locked host buffers name the legacy default stream (null) and are only ever
        // used by copies that wait for themselves: nothing to wait for there.
        let waits = !self.stream_ordered && !self.stream.cu_stream().is_null();
        // A stream being captured into a CUDA graph cannot be waited for. Such a free runs on a
        // release thread, and the array may have been dropped before the capture began: the
        // capture's end is waited for a while (`capture_ended`); past that, the free is refused
        // as the shim refuses a free on a capturing stream (the block, its resource and its
        // stream are kept for the process's life, never freed while work queued before the
        // capture may still use the block).
        if waits && !super::capture_ended(who, &self.stream) {
            self.leak();
            return Err(Error::logic(
                who,
                "the stream is being captured into a CUDA graph: the block is not freed (its free would become a node \
                 of the graph) and stays allocated, with its resource, until the process ends; drop arrays before the \
                 capture begins or after it ends",
            ));
        }
        // Binding a context is the only thing here that changes the caller's (the shim restores
        // its own switch): guarded where it happens, not on the stream-ordered fast path.
        let _keep = if waits { ContextGuard::save(who).ok() } else { None };
        if waits {
            let waited = bind(who, self.stream.context()).and_then(|()| stream_sync(who, &self.stream));
            if let Err(e) = waited {
                if already_gone(&e) || super::context_is_dead(&e) {
                    // The context is gone or dead (a fault): nothing queued runs any more, the
                    // free may proceed.
                    log::debug!(target: "raft", "{e}");
                } else {
                    // Anything else (a capture begun since the question refused the wait) says
                    // nothing about the work still using the block: kept, as above.
                    self.leak();
                    return Err(e);
                }
            }
        }
        let keeper = Arc::as_ptr(&self.stream) as *const c_void;
        let raw_stream = self.stream.cu_stream() as *mut c_void;
        // SAFETY: the bytes are freed exactly once (self is consumed), on the stream they are
        // ordered on (alive: held by self until after the call), through what they came from: the
        // shim's record, or the resource of a held allocation (alive: held by self until after
        // the call) with the pointer and size it returned; `keeper` is the stream's `Arc`, alive
        // for the call, which a fence may retain through the registered keeper; the flag is null
        // or borrowed for the call, raised wherever a capture of the stream may begin.
        let flag = capture.map_or(std::ptr::null(), CaptureFlag::as_ptr);
        // The shim's entry points are called through their fields (bindgen's wrapper methods are
        // not inlined across crates: a call and a copy of the arguments each way, issue 30); a
        // held allocation of 0 bytes took nothing, and its free is no call at all.
        let status = unsafe {
            match &self.owner {
                Owner::Record(ptr) => (api.raftrs_buffer_free)(ptr.as_ptr(), raw_stream, keeper),
                Owner::Held(_) if self.data.is_null() => sys::RAFTRS_STATUS_OK as sys::raftrs_status,
                Owner::Held(mr) => (api.raftrs_mr_deallocate_held)(mr.ptr.as_ptr(), raw_stream, keeper, self.data, self.bytes, flag),
            }
        };
        // The stream's last handle may go here (`into_inner` tells exactly one holder it is the
        // last): cudarc binds the stream's context to destroy it, so a guard puts the caller's
        // context back.
        // Read first: the drops below may call the shim, which keeps one last error per thread.
        let freed = check(who, api, status).or_else(|e| if already_gone(&e) { Ok(()) } else { Err(e) });
        let NativeBuffer { stream, owner, .. } = self;
        if freed.is_ok() {
            drop(owner); // a resource's last handle queues its destruction (`NativeMr`'s drop)
        } else {
            // Not freed (the device scope or the free itself failed): the resource that owns the
            // block is kept for the process's life, never destroyed while work may use the block.
            std::mem::forget(owner);
        }
        if let Some(last) = Arc::into_inner(stream) {
            let _restore = if _keep.is_none() { ContextGuard::save(who).ok() } else { None };
            drop(last);
        }
        freed
    }

    /// Leaks the memory to the OS (at exit, once the exit has decided).
    pub(crate) fn leak(self) {
        std::mem::forget(self);
    }
}

thread_local! {
    /// Per device, the kept copy of the current resource this thread last allocated from
    /// (`current_cache`), held weakly: it never keeps a replaced resource alive.
    static SEEN: std::cell::RefCell<Vec<Weak<NativeMr>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A handle to the kept copy of `device`'s current resource, for the shim to revalidate: the
/// one this thread used last while it is alive (one reference count taken, no lock: issue 30),
/// else the process-wide kept copy (`current_cache`, under its lock). Which copy is handed over
/// only decides whether the shim has to make a fresh one: the shim compares it with RMM's map
/// entry under RMM's lock at every allocation, so a stale copy is never allocated from.
fn current_kept(device: usize) -> Option<Arc<NativeMr>> {
    let seen = SEEN.try_with(|s| s.borrow().get(device).and_then(Weak::upgrade)).ok().flatten();
    if seen.is_some() {
        return seen;
    }
    let kept = current_cache(device).and_then(|kept| kept.slot.lock().unwrap_or_else(|e| e.into_inner()).clone());
    if let Some(kept) = &kept {
        remember_current(device, kept);
    }
    kept
}

/// Makes `mr` the copy of `device`'s current resource this thread hands over next.
fn remember_current(device: usize, mr: &Arc<NativeMr>) {
    let _ = SEEN.try_with(|s| {
        let mut s = s.borrow_mut();
        if s.len() <= device {
            s.resize_with(device + 1, Weak::new);
        }
        s[device] = Arc::downgrade(mr);
    });
}

/// Tells the shim how a pool, arena or binning resource keeps a stream alive instead of recording
/// an event at every free into it (the shim's fence.hpp): through the buffer's `Arc<CudaStream>`.
#[inline]
fn register_stream_keeper(api: &sys::RaftrsShim) {
    static ONCE: Once = Once::new();
    let mut refused = None;
    ONCE.call_once(|| {
        // SAFETY: three `extern "C"` functions that never unwind and live as long as the process.
        let status = unsafe { api.raftrs_buffer_on_streams(Some(retain_stream), Some(release_stream), Some(sole_stream)) };
        refused = check("DeviceVec::new", api, status).err();
    });
    // Logged once the `Once` is done: inside it, a logger that allocates an array re-entered it
    // (a deadlock, the twenty-second audit). Guarded: a logger's panic must not reach the
    // allocation (the sixteenth audit: it poisoned the `Once`).
    if let Some(e) = refused {
        raft_exit::log_guarded(|| log::warn!(target: "raft", "{e}: frees into pools record an event each"));
    }
}

/// A reference to the stream behind `owner` for a fence (see [`register_stream_keeper`]).
extern "C" fn retain_stream(owner: *const c_void) {
    // SAFETY: the shim passes the `Arc::as_ptr` of a buffer's stream during that buffer's free,
    // while the buffer still holds it: the count is at least one.
    unsafe { Arc::increment_strong_count(owner as *const CudaStream) }
}

/// Drops a reference [`retain_stream`] took; the last one destroys the stream (cudarc binds its
/// context to do so: the caller's is put back).
extern "C" fn release_stream(owner: *const c_void) {
    super::catch_forgetting(|| {
        if !raft_exit::native_release_allowed() {
            return; // the exit has decided: left to the OS, no CUDA call
        }
        let _keep = ContextGuard::save("DeviceVec::drop").ok();
        // SAFETY: the shim releases each reference it retained exactly once.
        unsafe { Arc::decrement_strong_count(owner as *const CudaStream) }
    });
}

/// Whether the fence's reference is the only one left to the stream behind `owner`.
extern "C" fn sole_stream(owner: *const c_void) -> i32 {
    // SAFETY: the shim asks only about a stream it holds a reference to (retained): the `Arc`
    // is alive; `ManuallyDrop` leaves that reference untouched.
    let stream = std::mem::ManuallyDrop::new(unsafe { Arc::from_raw(owner as *const CudaStream) });
    (Arc::strong_count(&stream) == 1) as i32
}
