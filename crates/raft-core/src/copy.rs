//! Copies at the speed of the link, on a resources' stream: the asynchronous copies, which
//! borrow their ends for a scope that waits ([`CopyScope`], THE asynchronous form) or own them
//! ([`Transfer`], for a copy that must outlive the caller's frame or be awaited), device-to-device
//! and peer copies, and how pageable slices are staged through page-locked buffers ([`Staging`],
//! configuration only). The blocking copies are `DeviceVec`'s (`array_copy.rs`); the table of
//! all of them is `docs/API.md`.
//!
//! # Why these shapes
//! A copy runs after the call that queued it has returned. A handle that merely borrowed the
//! host memory would let `mem::forget(handle)` end the borrow while the GPU still reads or writes
//! it: a use-after-free from safe code (the scoped-thread problem). So an asynchronous copy here
//! either owns its ends until it has finished ([`Transfer`]: forgetting it leaks them), or
//! borrows them for a scope the caller cannot leave before every copy of it has finished
//! ([`DeviceResources::copy_scope`]). Blocking copies (`DeviceVec::copy_from_host`, …) return
//! once done.
//!
//! # Why two asynchronous forms, named alike
//! The scope is THE asynchronous form: it takes every kind of page-locked memory (a
//! `RegisteredSlice` too, which a `Transfer` cannot own), leaves the arrays where they are, and
//! its copies read `s.to_device(&src, &mut dst)`. A scope ends before its caller's frame does,
//! though, and waits on the calling thread; an async program that must not block its executor,
//! or a copy handed to another part of the program, needs the copy to own its ends: the
//! [`Transfer`] forms, the same verbs prefixed `transfer_` (`res.transfer_to_device(src, dst)`),
//! awaited through [`Transfer::into_job`].
//!
//! # At exit
//! A copy runs on the stream of resources it holds (a [`Transfer`] holds them until it has been
//! waited for; dropped early, it becomes a release that waits first). Releasing resources drains
//! their stream, and the exit's teardown releases every live resources object, so no copy is
//! still running when the process's static destructors tear CUDA down. Queueing a copy registers
//! the exit hook that runs that teardown.
use crate::array::DeviceVec;
use crate::error::{Error, Result};
use crate::host::{default_pinned, sealed::Sealed, PageLocked, PinnedVec};
use crate::job::JobHandle;
use crate::resources::DeviceResources;
use crate::result::copy::{copy_device_ordered, run_scope, CopyScope, Ends, InFlight};
use crate::result::staging::{staged_download, staged_upload, StagedCut, StagingBuffers};
use crate::result::stores::HostStores;
use crate::result::DeviceScalar;
use std::sync::Mutex;

fn same_len(who: &'static str, src: usize, dst: usize) -> Result<()> {
    if src != dst {
        return Err(Error::logic(who, format!("a copy of {src} elements into {dst} elements")));
    }
    Ok(())
}

fn live<T: DeviceScalar>(who: &'static str, v: &DeviceVec<T>) -> Result<()> {
    if v.resources().is_released() {
        return Err(raft_exit::closed_or(Error::released(who, v.resources().device())));
    }
    Ok(())
}

// ---- copies that own their ends --------------------------------------------------------------

/// An asynchronous copy queued on a resources' stream, owning its two ends `B` (moved in) until
/// it has finished: [`wait`](Self::wait) gives them back.
///
/// Nothing the copy touches can be reached, dropped or reused while it runs: the ends are inside
/// the transfer. Dropped before it finished, the transfer becomes a release (run on a library
/// release thread, waited for by the exit) that waits for the copy, then drops the ends;
/// forgotten (`mem::forget`), it leaks them. Neither blocks, and neither frees memory the GPU
/// may still use.
///
/// ```compile_fail,E0382
/// # use raft_core::{DeviceResources, DeviceVec, PinnedVec};
/// # fn f(res: &DeviceResources) -> raft_core::Result<()> {
/// let host = PinnedVec::<f32>::new(res, 1024)?;
/// let dev = DeviceVec::<f32>::new(res, 1024)?;
/// let copy = res.transfer_to_device(host, dev)?;
/// let first = host[0]; // error: `host` moved into the copy until `copy.wait()` gives it back
/// # Ok(()) }
/// ```
///
/// # Thread safety
/// `Send + Sync` when the ends are: wait for it on any thread.
#[must_use = "a transfer hands its buffers back only through `wait`; dropped, they are freed once the copy has finished"]
pub struct Transfer<B: Send + 'static> {
    inner: Option<InFlight<B>>,
    resources: DeviceResources,
}

static_assertions::assert_impl_all!(Transfer<(PinnedVec<f32>, DeviceVec<f32>)>: Send, Sync);

/// A transfer from page-locked host memory into a device array.
pub type ToDevice<T> = Transfer<(PinnedVec<T>, DeviceVec<T>)>;
/// A transfer from a device array into page-locked host memory.
pub type ToHost<T> = Transfer<(DeviceVec<T>, PinnedVec<T>)>;
/// A transfer between two device arrays.
pub type DeviceToDevice<T> = Transfer<(DeviceVec<T>, DeviceVec<T>)>;

impl<B: Send + 'static> Transfer<B> {
    /// Blocks until the copy has finished and gives the ends back, `(source, destination)`.
    ///
    /// # Errors
    /// `Cuda` when the copy failed; the ends are then leaked (never freed: the state of the
    /// copy is unknown).
    pub fn wait(mut self) -> Result<B> {
        const WHO: &str = "Transfer::wait";
        let inner = self.inner.take().expect("a Transfer holds its copy until waited for");
        inner.wait(WHO)
    }

    /// Whether the copy has finished (a failed copy counts as finished: [`wait`](Self::wait)
    /// reports it).
    pub fn is_finished(&self) -> bool {
        self.inner.as_ref().is_none_or(|i| i.is_complete("Transfer::is_finished").unwrap_or(true))
    }

    /// The resources whose stream runs the copy.
    pub fn resources(&self) -> &DeviceResources {
        &self.resources
    }

    /// Waits on the resources' worker thread instead: the job (a `Future` too, see
    /// [`JobHandle`]) yields the ends, and the exit waits for it as for any job.
    ///
    /// # Errors
    /// As [`DeviceResources::spawn`]; then the transfer is dropped (its ends are freed once the
    /// copy has finished).
    pub fn into_job(self) -> Result<JobHandle<Result<B>>> {
        let resources = self.resources.clone();
        resources.spawn(move || self.wait())
    }
}

impl<B: Send + 'static> Drop for Transfer<B> {
    fn drop(&mut self) {
        const WHO: &str = "Transfer::drop";
        let Some(inner) = self.inner.take() else { return };
        if !raft_exit::native_release_allowed() {
            return; // the exit has decided: no CUDA call; `inner` leaks the ends
        }
        if inner.is_complete(WHO).unwrap_or(false) {
            // Finished: the ends go now (each frees as its own drop does, without blocking).
            let _ = inner.wait(WHO).map(drop);
            return;
        }
        let label = raft_exit::Label { what: "release of a copy", id: raft_exit::next_id(), device: Some(self.resources.device()) };
        let wait_then_drop = inner.into_deferred(WHO);
        let resources = self.resources.clone();
        crate::release::enqueue(
            label,
            Box::new(move || {
                wait_then_drop();
                drop(resources);
            }),
        );
    }
}

impl<B: Send + 'static> std::fmt::Debug for Transfer<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transfer").field("device", &self.resources.device()).field("finished", &self.is_finished()).finish()
    }
}

fn to_device_ends<T: DeviceScalar>(b: &mut (PinnedVec<T>, DeviceVec<T>)) -> Ends<'_> {
    let (host, dev) = b;
    Ends::ToDevice(host.host_ref(), dev.native_mut())
}

fn to_host_ends<T: DeviceScalar>(b: &mut (DeviceVec<T>, PinnedVec<T>)) -> Ends<'_> {
    let (dev, host) = b;
    Ends::ToHost(dev.native(), host.host_mut())
}

fn device_ends<T: DeviceScalar>(b: &mut (DeviceVec<T>, DeviceVec<T>)) -> Ends<'_> {
    let (src, dst) = b;
    Ends::Device(src.native(), dst.native_mut())
}

/// Copies on these resources' stream.
///
/// A copy runs after the call that queued it has returned. A handle that merely borrowed the
/// host memory would let `mem::forget(handle)` end the borrow while the GPU still reads or writes
/// it: a use-after-free from safe code (the scoped-thread problem). So an asynchronous copy here
/// either owns its ends until it has finished ([`Transfer`]: forgetting it leaks them, dropping
/// it frees them once the copy is done), or borrows them for a scope the caller cannot leave
/// before every copy of it has finished ([`copy_scope`](Self::copy_scope)). The blocking
/// copies (`DeviceVec::copy_from_host`, also with a [`PinnedVec`]) return once done.
///
/// Copies queued on one stream run one after another: copies in both directions at once, or
/// copies beside compute, use two resources objects. At exit, a copy still running holds its
/// resources, whose release (the exit's teardown releases every live resources object) drains
/// their stream first.
impl DeviceResources {
    fn transfer<B: Send + 'static>(&self, who: &'static str, buffers: B, ends: for<'x> fn(&'x mut B) -> Ends<'x>) -> Result<Transfer<B>> {
        raft_exit::register_exit_hook();
        // Queued under the resources' read lock: a release (which drains the stream) either
        // comes before and refuses, or after and waits for the copy.
        let inner = self.with_native(who, move |n| InFlight::start(who, n.stream(), buffers, ends).map_err(|(e, _returned)| e))?;
        Ok(Transfer { inner: Some(inner), resources: self.clone() })
    }

    /// Copies page-locked `src` into `dst` on these resources' stream (after the work queued so
    /// far on `dst`'s own stream), without blocking: the [`Transfer`] owns both until the copy has
    /// finished and [`Transfer::wait`] gives them back as `(src, dst)`. `dst` may belong to
    /// other resources of the same device; copies on one resources' stream overlap work on
    /// another's.
    ///
    /// ```no_run
    /// # use raft_core::{DeviceResources, DeviceVec, PinnedVec};
    /// # fn main() -> raft_core::Result<()> {
    /// let res = DeviceResources::new()?;
    /// let host = PinnedVec::from_slice(&res, &[1.0f32, 2.0, 3.0])?;
    /// let dev = DeviceVec::<f32>::new(&res, 3)?;
    /// let copy = res.transfer_to_device(host, dev)?;
    /// // ... other work while the copy runs ...
    /// let (host, dev) = copy.wait()?;
    /// assert_eq!(dev.to_host()?, host.to_vec());
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// `Logic`, before any CUDA call, when the lengths differ, `dst` is on another device, or
    /// either resources object was released (the arrays are then dropped); `Cuda` when queueing
    /// fails.
    pub fn transfer_to_device<T: DeviceScalar>(&self, src: PinnedVec<T>, dst: DeviceVec<T>) -> Result<ToDevice<T>> {
        const WHO: &str = "DeviceResources::transfer_to_device";
        live(WHO, &dst)?;
        same_len(WHO, src.len(), dst.len())?;
        self.transfer(WHO, (src, dst), to_device_ends::<T>)
    }

    /// Copies `src` into page-locked `dst` on these resources' stream, without blocking; the
    /// [`Transfer`] gives back `(src, dst)` (see [`transfer_to_device`](Self::transfer_to_device)).
    pub fn transfer_to_host<T: DeviceScalar>(&self, src: DeviceVec<T>, dst: PinnedVec<T>) -> Result<ToHost<T>> {
        const WHO: &str = "DeviceResources::transfer_to_host";
        live(WHO, &src)?;
        same_len(WHO, src.len(), dst.len())?;
        self.transfer(WHO, (src, dst), to_host_ends::<T>)
    }

    /// Copies device array `src` into `dst` on these resources' stream, without blocking; the
    /// arrays may be on two devices (a peer copy, `cuMemcpyPeerAsync`, direct over NVLink or
    /// PCIe where the devices can reach each other), and these resources on either. The
    /// [`Transfer`] gives back `(src, dst)`.
    pub fn transfer_device_to_device<T: DeviceScalar>(&self, src: DeviceVec<T>, dst: DeviceVec<T>) -> Result<DeviceToDevice<T>> {
        const WHO: &str = "DeviceResources::transfer_device_to_device";
        live(WHO, &src)?;
        live(WHO, &dst)?;
        same_len(WHO, src.len(), dst.len())?;
        self.transfer(WHO, (src, dst), device_ends::<T>)
    }

    /// Runs `body` with a [`CopyScope`] on these resources' stream and returns once every copy
    /// queued through it has finished, also when `body` panics. Copies borrow their ends for the
    /// whole scope, so `body` can overlap them with other work (on other resources, or host
    /// work) without giving the buffers away.
    ///
    /// ```no_run
    /// # use raft_core::{DeviceResources, DeviceVec, PinnedVec};
    /// # fn main() -> raft_core::Result<()> {
    /// let (copies, compute) = (DeviceResources::new()?, DeviceResources::new()?);
    /// let host = PinnedVec::<f32>::new(&copies, 1 << 20)?;
    /// let mut dev = DeviceVec::<f32>::new(&copies, 1 << 20)?;
    /// copies.copy_scope(|s| {
    ///     s.to_device(&host, &mut dev)?;   // runs on `copies`' stream ...
    ///     compute.sync()                   // ... while `compute`'s stream works
    /// })?;
    /// # Ok(()) }
    /// ```
    ///
    /// What a copy borrows cannot be dropped, moved or written before the scope ends, and what
    /// the body makes itself cannot be lent to a copy (it would not outlive the scope):
    ///
    /// ```compile_fail,E0597
    /// # use raft_core::{DeviceResources, DeviceVec, PinnedVec};
    /// # fn f(res: &DeviceResources, mut dev: DeviceVec<f32>) -> raft_core::Result<()> {
    /// res.copy_scope(|s| {
    ///     let host = PinnedVec::<f32>::new(res, dev.len())?;
    ///     s.to_device(&host, &mut dev) // error: `host` does not live long enough
    /// })?;
    /// # Ok(()) }
    /// ```
    ///
    /// ```compile_fail,E0505
    /// # use raft_core::{DeviceResources, DeviceVec, PinnedVec};
    /// # fn f(res: &DeviceResources, mut dev: DeviceVec<f32>) -> raft_core::Result<()> {
    /// let host = PinnedVec::<f32>::new(res, dev.len())?;
    /// res.copy_scope(|s| {
    ///     s.to_device(&host, &mut dev)?;
    ///     drop(host); // error: `host` is borrowed until the scope has waited
    ///     Ok(())
    /// })?;
    /// # Ok(()) }
    /// ```
    ///
    /// ```compile_fail,E0499
    /// # use raft_core::{DeviceResources, DeviceVec, PinnedVec};
    /// # fn f(res: &DeviceResources, dev: DeviceVec<f32>, host: &mut PinnedVec<f32>) -> raft_core::Result<()> {
    /// res.copy_scope(|s| {
    ///     s.to_host(&dev, host)?;
    ///     host[0] = 2.0; // error: the device writes `host` until the scope has waited
    ///     Ok(())
    /// })?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// `Logic` on released resources; `Cuda` when waiting for the stream fails; otherwise the
    /// body's own `Result` (its error as it returned it).
    pub fn copy_scope<'env, F, R>(&self, body: F) -> Result<R>
    where
        F: for<'scope> FnOnce(&'scope CopyScope<'scope, 'env>) -> Result<R>,
    {
        const WHO: &str = "DeviceResources::copy_scope";
        // The stream stays inside the library (the scope queues on it): its flag stays as it is.
        let stream = self.with_native(WHO, |n| Ok(n.stream().clone()))?;
        let me = self.clone();
        // The body's error and the scope's own are one `Result`: the caller writes one `?`. A
        // failed wait (the context is dead) outranks the body's value: its copies did not run.
        run_scope(WHO, stream, Box::new(move || !me.is_released()), body).and_then(|r| r)
    }
}

/// The copies of a [`DeviceResources::copy_scope`]: each is queued on the scope's stream (after
/// the work queued so far on the arrays' own streams) and returns at once; the scope waits.
impl<'scope, 'env> CopyScope<'scope, 'env> {
    fn check<T: DeviceScalar>(&self, who: &'static str, arrays: &[&DeviceVec<T>], src: usize, dst: usize) -> Result<()> {
        if !self.is_live() {
            return Err(raft_exit::closed_or(Error::released(who, self.device())));
        }
        for a in arrays {
            live(who, a)?;
        }
        same_len(who, src, dst)
    }

    /// Queues a copy of page-locked `src` ([`PinnedVec`] or `RegisteredSlice`) into `dst`.
    ///
    /// # Errors
    /// `Logic`, before any CUDA call, when the lengths differ, `dst` is on another device than
    /// the scope's resources, or resources were released; `Cuda` when queueing fails.
    pub fn to_device<T: DeviceScalar, H: PageLocked<T>>(&'scope self, src: &'scope H, dst: &'scope mut DeviceVec<T>) -> Result<()> {
        const WHO: &str = "CopyScope::to_device";
        self.check(WHO, &[&*dst], src.elements(), dst.len())?;
        self.queue(WHO, Ends::ToDevice(src.host_ref(), dst.native_mut()))
    }

    /// Queues a copy of `src` into page-locked `dst` (see [`to_device`](Self::to_device)).
    pub fn to_host<T: DeviceScalar, H: PageLocked<T>>(&'scope self, src: &'scope DeviceVec<T>, dst: &'scope mut H) -> Result<()> {
        const WHO: &str = "CopyScope::to_host";
        self.check(WHO, &[src], src.len(), dst.elements())?;
        self.queue(WHO, Ends::ToHost(src.native(), dst.host_mut()))
    }

    /// Queues a copy of device array `src` into `dst`, on one device or between two (the scope's
    /// resources on either).
    pub fn device_to_device<T: DeviceScalar>(&'scope self, src: &'scope DeviceVec<T>, dst: &'scope mut DeviceVec<T>) -> Result<()> {
        const WHO: &str = "CopyScope::device_to_device";
        self.check(WHO, &[src, &*dst], src.len(), dst.len())?;
        self.queue(WHO, Ends::Device(src.native(), dst.native_mut()))
    }
}

// ---- device to device, returning once queued -------------------------------------------------

/// Device-to-device copies (`copy.rs`).
impl<T: DeviceScalar> DeviceVec<T> {
    /// Copies `src` into this array on this array's stream, after the work queued so far on
    /// `src`'s stream, whose later work then waits for the copy; returns once queued, like
    /// [`gemm`](crate::gemm) (`resources().sync()` waits). `src` may be on another device: a
    /// peer copy (`cuMemcpyPeerAsync`).
    ///
    /// # Errors
    /// `Logic`, before any CUDA call, when the lengths differ or either array's resources were
    /// released; `Cuda` when queueing fails.
    pub fn copy_from_device(&mut self, src: &DeviceVec<T>) -> Result<()> {
        const WHO: &str = "DeviceVec::copy_from_device";
        live(WHO, self)?;
        live(WHO, src)?;
        same_len(WHO, src.len(), self.len())?;
        raft_exit::register_exit_hook();
        let res = self.resources().clone();
        res.with_native(WHO, |_| copy_device_ordered(WHO, src.native(), self.native_mut()))
    }
}

// ---- pageable memory, staged ------------------------------------------------------------------

/// Bytes of page-locked staging buffers kept for reuse between staged copies (process-wide),
/// beyond those of the latest copy.
const POOL_BYTES: usize = 256 << 20;
/// Smallest piece (one device copy): below it the device copy's fixed cost dominates.
const MIN_PIECE: usize = 256 << 10;
/// Smallest sub-piece (what one host thread copies at a time): below it the threads' hand-off
/// costs more than the copy.
const MIN_SUB: usize = 64 << 10;
/// Page-locked slots of a staged copy by default: pieces in flight at once (four staging
/// buffers' worth). Eight against four, in turns with the native pinned copies (GPU runs 65,
/// 66; 4 MiB pieces, 8 threads): 64 MiB 0.78x / 0.90x against 0.76x / 0.86x, 1 GiB 0.95x /
/// 0.95x against 0.93x / 0.93x (host to device / device to host), for 16 MiB more page-locked
/// memory.
const SLOTS: usize = 8;
impl HostStores {
    /// What this kind means for an upload (or a download) of `bytes`: never `Auto`.
    fn resolve(self, bytes: usize, upload: bool) -> HostStores {
        match self {
            HostStores::Auto if upload => {
                if bytes < 32 << 20 {
                    HostStores::Streaming
                } else {
                    HostStores::Plain
                }
            }
            HostStores::Auto => {
                if bytes < 4 << 20 {
                    HostStores::Plain
                } else {
                    HostStores::Streaming
                }
            }
            kind => kind,
        }
    }
}

/// How copies from and to pageable memory (`Vec`, slices) are staged: in pieces of at most
/// `chunk_bytes`, each one device copy through one of eight page-locked slots (by default),
/// filled (or emptied) by up to `threads` host threads together while the calling thread queues
/// the device copies, so the link starts on the first piece while the host goes on with the
/// next. The page-locked buffers are kept for reuse (those of the latest copy, and others up to
/// 256 MiB in all).
///
/// The host threads are a crew shared by the process's staged copies (one copy at a time; a
/// copy that finds it busy runs on a pool of its own meanwhile). After a copy the crew keeps
/// watching for the next one for 1 ms, spinning then yielding, before it sleeps, so a run of
/// copies starts each within a microsecond: `RAFT_STAGING_SPIN_US` (read once, 0 to 1 000 000;
/// 0 sleeps at once) changes that watch, a bad value is the `Logic` error of every staged copy.
///
/// How the host threads write ([`HostStores`]) is chosen by direction and size unless set
/// ([`with_host_stores`](Self::with_host_stores)).
///
/// A `Staging` is configuration only: no copy takes one. The blocking copies between pageable
/// memory and an array (`DeviceVec::from_host`, `copy_from_host`, `to_host`, `copy_to_host`)
/// stage by themselves from [`staged_from`](Self::staged_from) bytes on (by default
/// [`DeviceVec::STAGED_FROM_BYTES`]), with the process's setting:
/// [`Staging::current`], changed by [`Staging::set_current`]. One setting for the process,
/// not one per call or per resources object, because what it tunes belongs to the process: the
/// host's cores and memory bandwidth, the one crew of host threads and the one pool of
/// page-locked buffers every staged copy shares. (Per-call values would bring back a second
/// name for every copy.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Staging {
    chunk_bytes: usize,
    threads: usize,
    slots: usize,
    staged_from: usize,
    upload_stores: HostStores,
    download_stores: HostStores,
}

impl Default for Staging {
    /// Pieces of [`DEFAULT_CHUNK_BYTES`](Self::DEFAULT_CHUNK_BYTES) by one thread fewer than the
    /// machine runs at once (the calling thread coordinates), at most
    /// [`DEFAULT_THREADS`](Self::DEFAULT_THREADS). Chosen by `copy-bench`'s sweep in GPU run 55
    /// (16 cores), pageable against the native pinned copy, host to device / device to host:
    /// 4 MiB × 8 threads 0.84x / 0.90x at 64 MiB and 0.92x / 0.96x at 1 GiB; 16 threads, which
    /// leave no core free, 0.66x / 0.66x and 0.68x / 0.58x; 1 and 2 MiB pieces at most 0.60x.
    fn default() -> Self {
        let parallel = crate::result::crew::parallelism();
        Staging {
            chunk_bytes: Staging::DEFAULT_CHUNK_BYTES,
            threads: parallel.saturating_sub(1).clamp(1, Staging::DEFAULT_THREADS),
            slots: SLOTS,
            staged_from: DeviceVec::<u8>::STAGED_FROM_BYTES,
            upload_stores: HostStores::Auto,
            download_stores: HostStores::Auto,
        }
    }
}

/// How a staged copy of `bytes` is cut, and by how many threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Plan {
    cut: StagedCut,
    threads: usize,
}

/// The process's staging setting; `None`: [`Staging::default`].
static CURRENT: Mutex<Option<Staging>> = Mutex::new(None);

impl Staging {
    /// How the process's blocking copies between pageable memory and arrays are staged:
    /// [`Staging::default`] until [`set_current`](Self::set_current) changes it.
    pub fn current() -> Staging {
        CURRENT.lock().unwrap_or_else(|e| e.into_inner()).unwrap_or_default()
    }

    /// Makes `staging` the process's setting for the staged copies that begin from now on, and
    /// returns the one it replaces. Copies already running keep theirs.
    pub fn set_current(staging: Staging) -> Staging {
        let old = CURRENT.lock().unwrap_or_else(|e| e.into_inner()).replace(staging);
        old.unwrap_or_default()
    }

    /// Default largest piece.
    pub const DEFAULT_CHUNK_BYTES: usize = 4 << 20;
    /// The most host threads of the default (which takes fewer on a machine with fewer cores).
    pub const DEFAULT_THREADS: usize = 8;

    /// Pieces of at most `chunk_bytes` (64 KiB to 1 GiB), by up to `threads` host threads (1 to
    /// 64).
    ///
    /// # Errors
    /// `Logic` for values outside those ranges.
    pub fn new(chunk_bytes: usize, threads: usize) -> Result<Staging> {
        const WHO: &str = "Staging::new";
        if !(64 << 10..=1 << 30).contains(&chunk_bytes) {
            return Err(Error::logic(WHO, format!("chunk_bytes must be 64 KiB to 1 GiB, given {chunk_bytes}")));
        }
        if !(1..=64).contains(&threads) {
            return Err(Error::logic(WHO, format!("threads must be 1 to 64, given {threads}")));
        }
        Ok(Staging { chunk_bytes, threads, ..Staging::default() })
    }

    /// The same with `pieces` page-locked slots (pieces in flight at once: 2 to 16, even; 8 by
    /// default). More smooth out the host's and the link's jitter, at `chunk_bytes` of
    /// page-locked memory each.
    ///
    /// # Errors
    /// `Logic` for an odd count or one outside 2 to 16.
    pub fn with_pieces_in_flight(self, pieces: usize) -> Result<Staging> {
        if !(2..=16).contains(&pieces) || !pieces.is_multiple_of(2) {
            return Err(Error::logic("Staging::with_pieces_in_flight", format!("pieces in flight must be even, 2 to 16, given {pieces}")));
        }
        Ok(Staging { slots: pieces, ..self })
    }

    /// The same with the host threads writing as `uploads` says into the page-locked buffers
    /// and as `downloads` says into the caller's memory ([`HostStores::Auto`] both by default).
    pub fn with_host_stores(self, uploads: HostStores, downloads: HostStores) -> Staging {
        Staging { upload_stores: uploads, download_stores: downloads, ..self }
    }

    /// The same staging copies of `bytes` or more ([`DeviceVec::STAGED_FROM_BYTES`] by default;
    /// 0 stages every copy of pageable memory). Smaller ones take the driver's pageable path.
    pub fn with_staged_from(self, bytes: usize) -> Staging {
        Staging { staged_from: bytes, ..self }
    }

    /// The smallest copy that is staged.
    pub fn staged_from(&self) -> usize {
        self.staged_from
    }

    /// How the host threads write: (uploads, downloads).
    pub fn host_stores(&self) -> (HostStores, HostStores) {
        (self.upload_stores, self.download_stores)
    }

    /// Pieces in flight at once (page-locked slots).
    pub fn pieces_in_flight(&self) -> usize {
        self.slots
    }

    /// The largest piece.
    pub fn chunk_bytes(&self) -> usize {
        self.chunk_bytes
    }

    /// The most host threads.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Pieces of one slot's share of the copy (so that it overlaps host and device work), at least
    /// [`MIN_PIECE`] and at most the chunk; sub-pieces that give each thread one per piece, at
    /// least [`MIN_SUB`]; no more threads than sub-pieces in flight; the host threads' stores as
    /// `stores` says for an upload (or a download) of `bytes`.
    fn plan(&self, bytes: usize, upload: bool) -> Plan {
        let stores = if upload { self.upload_stores } else { self.download_stores };
        let bytes = bytes.max(1);
        let piece = bytes.div_ceil(self.slots).clamp(MIN_PIECE.min(self.chunk_bytes), self.chunk_bytes).min(bytes);
        let sub = piece.div_ceil(self.threads).max(MIN_SUB).min(piece);
        let subs_in_flight = self.slots.min(bytes.div_ceil(piece)) * piece.div_ceil(sub);
        Plan { cut: StagedCut { piece, sub, stores: stores.resolve(bytes, upload) }, threads: self.threads.min(subs_in_flight).max(1) }
    }

    pub(crate) fn new_vec_from<T: DeviceScalar>(&self, who: &'static str, src: &DeviceVec<T>) -> Result<Vec<T>> {
        live(who, src)?;
        // Zeroed memory of a large Vec comes fresh from the OS, not yet touched: the threads then
        // fault it in, on huge pages where the kernel has them.
        let mut host = vec![T::default(); src.len()];
        crate::result::copy::advise_huge_pages(&mut host);
        self.download(who, src, &mut host)?;
        Ok(host)
    }

    pub(crate) fn upload<T: DeviceScalar>(&self, who: &'static str, dst: &mut DeviceVec<T>, host: &[T]) -> Result<()> {
        live(who, dst)?;
        same_len(who, host.len(), dst.len())?;
        if host.is_empty() {
            return Ok(());
        }
        crate::result::crew::watch_time(who)?; // a bad RAFT_STAGING_SPIN_US, said here
        let plan = self.plan(std::mem::size_of_val(host), true);
        let mut buffers = pool_take(who, dst.resources().device(), plan.cut.piece, self.slots / 2)?;
        let run = |work: &(dyn Fn() -> Result<()> + Sync), main: &mut dyn FnMut() -> Result<()>| run_on_threads(plan.threads, work, main);
        let outcome = staged_upload(who, &mut buffers, host, dst.native_mut(), plan.cut, &run);
        pool_give_back(buffers);
        outcome
    }

    pub(crate) fn download<T: DeviceScalar>(&self, who: &'static str, src: &DeviceVec<T>, host: &mut [T]) -> Result<()> {
        live(who, src)?;
        same_len(who, src.len(), host.len())?;
        if host.is_empty() {
            return Ok(());
        }
        crate::result::crew::watch_time(who)?; // a bad RAFT_STAGING_SPIN_US, said here
        let plan = self.plan(std::mem::size_of_val(host), false);
        let mut buffers = pool_take(who, src.resources().device(), plan.cut.piece, self.slots / 2)?;
        let run = |work: &(dyn Fn() -> Result<()> + Sync), main: &mut dyn FnMut() -> Result<()>| run_on_threads(plan.threads, work, main);
        let outcome = staged_download(who, &mut buffers, src.native(), host, plan.cut, &run);
        pool_give_back(buffers);
        outcome
    }
}

/// A panic's payload, held to resume once every thread has left.
type Panic = Box<dyn std::any::Any + Send>;

/// Runs `work` on `threads` host threads (the staging crew, see `result/crew.rs`; while another
/// copy holds it, a pool made once, as spawning a thread per copy costs 10–20 µs each, a fifth
/// of a 64 MiB copy with 16 threads) and `main` on the calling thread meanwhile. Returns the
/// first error; a panic on a thread resumes here once all have returned. The host threads of
/// one copy wait only for the calling thread (which never waits for them to start), so a
/// thread that starts late (a busy pool) only slows the copy.
fn run_on_threads(threads: usize, work: &(dyn Fn() -> Result<()> + Sync), main: &mut dyn FnMut() -> Result<()>) -> Result<()> {
    // The crew first: its threads, still watching after the last copy, join within a
    // microsecond (a pool's sleeping threads took 23-70 µs, GPU run 61). The crew waits for no
    // pool, so this also holds inside a user's thread pool.
    if let Some(crew) = crate::result::crew::crew() {
        let failed: Mutex<(Option<Error>, Option<Panic>)> = Mutex::new((None, None));
        let joined = || {
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
            let mut f = failed.lock().unwrap_or_else(|e| e.into_inner());
            match outcome {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    f.0.get_or_insert(e);
                }
                Err(panic) => {
                    f.1.get_or_insert(panic);
                }
            }
        };
        if let Some(first) = crew.run(threads, &joined, &mut *main) {
            let (error, panic) = failed.into_inner().unwrap_or_else(|e| e.into_inner());
            if let Some(panic) = panic {
                std::panic::resume_unwind(panic);
            }
            return first.and(error.map_or(Ok(()), Err));
        }
    }
    // The crew is busy with another copy (or has no thread): the pool. Called from a worker of
    // a rayon pool (the user's `par_iter`, say), waiting for another pool's scope would let this
    // thread run unrelated jobs of its own pool meanwhile, which may wait for the caller: plain
    // scoped threads then, which block without stealing.
    let Some(pool) = staging_threads().filter(|_| rayon_core::current_thread_index().is_none()) else {
        return std::thread::scope(|s| {
            // A thread the OS refuses only slows the copy: the coordinator copies by itself
            // while no host thread runs.
            let handles: Vec<_> =
                (0..threads).map_while(|_| std::thread::Builder::new().name("raft-staging".into()).spawn_scoped(s, work).ok()).collect();
            let first = main();
            handles.into_iter().fold(first, |acc, h| acc.and(h.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))))
        });
    };
    let outcomes: Vec<Mutex<Option<Result<()>>>> = (0..threads).map(|_| Mutex::new(None)).collect();
    let outcome0 = pool.in_place_scope(|s| {
        for slot in &outcomes {
            s.spawn(move |_| {
                let r = work();
                *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
            });
        }
        main()
    });
    outcomes.into_iter().fold(outcome0, |acc, slot| acc.and(slot.into_inner().unwrap_or_else(|e| e.into_inner()).unwrap_or(Ok(()))))
}

/// The staging threads: as many as the machine runs at once, at most 16 (a `Staging` asking
/// for more threads gets these); library threads for the exit machinery. `None` when they could
/// not be started (the copies then run on scoped threads of their own).
fn staging_threads() -> Option<&'static rayon_core::ThreadPool> {
    static POOL: std::sync::OnceLock<Option<rayon_core::ThreadPool>> = std::sync::OnceLock::new();
    let mut refused = None;
    let pool = POOL.get_or_init(|| {
        let n = crate::result::crew::parallelism().clamp(1, 16);
        let built = rayon_core::ThreadPoolBuilder::new()
            .num_threads(n)
            .thread_name(|i| format!("raft-staging-{i}"))
            .start_handler(|_| raft_exit::mark_library_thread())
            .build();
        built.map_err(|e| refused = Some(e)).ok()
    });
    // Logged once the cell is set: inside it, a logger that makes a staged copy re-entered it (a
    // deadlock, the twenty-second audit).
    if let Some(e) = refused {
        log::warn!(target: "raft", "staging threads not started, staged copies start threads of their own: {e}");
    }
    pool.as_ref()
}

/// Staging buffers kept for reuse, any device, least recently returned first.
static POOL: Mutex<Vec<StagingBuffers>> = Mutex::new(Vec::new());

/// `n` staging buffers of at least `piece_bytes` for `device`: pooled ones first (the smallest
/// that fit, at most 4x the piece), new ones for the rest.
fn pool_take(who: &'static str, device: usize, piece_bytes: usize, n: usize) -> Result<Vec<StagingBuffers>> {
    let mut taken = Vec::with_capacity(n);
    {
        let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
        while taken.len() < n {
            let fit = pool
                .iter()
                .enumerate()
                .filter(|(_, b)| b.device() == device && b.capacity() >= piece_bytes && b.capacity() <= 4 * piece_bytes)
                .min_by_key(|(_, b)| b.capacity())
                .map(|(i, _)| i);
            match fit {
                Some(i) => taken.push(pool.remove(i)),
                None => break,
            }
        }
    }
    if taken.len() < n {
        let mr = default_pinned(who, device)?;
        let ctx = crate::device::context(who, device)?;
        while taken.len() < n {
            match StagingBuffers::new(who, &ctx, mr.native(), piece_bytes) {
                Ok(b) => taken.push(b),
                Err(e) => {
                    pool_give_back(taken);
                    return Err(e);
                }
            }
        }
    }
    Ok(taken)
}

/// Returns finished staging buffers to the pool. Past [`POOL_BYTES`] the least recently used
/// ones are freed, never those just returned (a copy repeated with the same settings reuses its
/// buffers, however large); freed outside the lock, as freeing page-locked memory may wait for
/// the device.
fn pool_give_back(buffers: Vec<StagingBuffers>) {
    // Buffers whose copy could not be waited for are never used again: dropped (which leaks
    // them) rather than pooled, where every later staged copy of their size would fail.
    let (buffers, poisoned): (Vec<_>, Vec<_>) = buffers.into_iter().partition(|b| !b.is_poisoned());
    drop(poisoned);
    let surplus = {
        let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
        let returned = buffers.len();
        pool.extend(buffers);
        let mut held: usize = pool.iter().map(|b| 2 * b.capacity()).sum();
        let mut surplus = Vec::new();
        while held > POOL_BYTES && pool.len() > returned {
            let oldest = pool.remove(0);
            held -= 2 * oldest.capacity();
            surplus.push(oldest);
        }
        surplus
    };
    drop(surplus);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_that_differ_are_a_logic_error_naming_the_api() {
        let e = same_len("DeviceResources::transfer_to_device", 3, 4).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Logic);
        assert_eq!(e.to_string(), "DeviceResources::transfer_to_device: a copy of 3 elements into 4 elements");
        assert!(same_len("x", 0, 0).is_ok());
    }

    #[test]
    fn the_process_staging_is_the_default_until_set_and_setting_returns_the_old_one() {
        let s = Staging::new(1 << 20, 2).unwrap().with_pieces_in_flight(4).unwrap();
        let old = Staging::set_current(s);
        assert_eq!(Staging::current(), s);
        assert_eq!(Staging::set_current(old), s);
        assert_eq!(Staging::current(), old);
        assert_eq!(Staging::default().staged_from(), DeviceVec::<u8>::STAGED_FROM_BYTES);
        assert_eq!(s.with_staged_from(0).staged_from(), 0);
        assert_eq!(s.staged_from(), DeviceVec::<u8>::STAGED_FROM_BYTES, "Staging::new keeps the default threshold");
    }

    /// The body's `Result` and the scope's are one (issue 34): the old signature returned
    /// `Result<Result<u32>>` here, a type error.
    #[test]
    fn a_copy_scope_returns_the_body_result_flattened() {
        fn flat(res: &DeviceResources) -> Result<u32> {
            res.copy_scope(|_s| Ok(7u32))
        }
        let _: fn(&DeviceResources) -> Result<u32> = flat;
    }

    #[test]
    fn staging_refuses_values_outside_its_ranges() {
        for (chunk, threads) in [(0, 4), (1 << 10, 4), ((1 << 30) + 1, 4), (1 << 20, 0), (1 << 20, 65)] {
            let e = Staging::new(chunk, threads).unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::Logic, "{chunk} {threads}");
            assert!(e.to_string().starts_with("Staging::new: "), "{e}");
        }
        let s = Staging::new(16 << 20, 8).unwrap();
        assert_eq!((s.chunk_bytes(), s.threads()), (16 << 20, 8));
        assert_eq!(Staging::default().chunk_bytes(), Staging::DEFAULT_CHUNK_BYTES);
        assert_eq!(Staging::default().pieces_in_flight(), 8);
        for pieces in [0, 1, 3, 17, 18] {
            let e = s.with_pieces_in_flight(pieces).unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::Logic, "{pieces}");
            assert!(e.to_string().starts_with("Staging::with_pieces_in_flight: "), "{e}");
        }
        let eight = s.with_pieces_in_flight(8).unwrap();
        assert_eq!((eight.chunk_bytes(), eight.threads(), eight.pieces_in_flight()), (16 << 20, 8, 8));
    }

    #[test]
    fn automatic_host_stores_stream_small_uploads_and_large_downloads() {
        assert_eq!(Staging::default().host_stores(), (HostStores::Auto, HostStores::Auto));
        assert_eq!(HostStores::default(), HostStores::Auto);
        let s = Staging::default();
        let up = |bytes| s.plan(bytes, true).cut.stores;
        let down = |bytes| s.plan(bytes, false).cut.stores;
        assert_eq!(
            (up(1 << 20), up((32 << 20) - 1), up(32 << 20), up(1 << 30)),
            (HostStores::Streaming, HostStores::Streaming, HostStores::Plain, HostStores::Plain)
        );
        assert_eq!(
            (down(1 << 20), down((4 << 20) - 1), down(4 << 20), down(1 << 30)),
            (HostStores::Plain, HostStores::Plain, HostStores::Streaming, HostStores::Streaming)
        );
        // A kind asked for is kept, whatever the size and direction.
        let forced = Staging::default().with_host_stores(HostStores::Plain, HostStores::Streaming);
        assert_eq!(forced.host_stores(), (HostStores::Plain, HostStores::Streaming));
        for bytes in [1usize, 1 << 20, 1 << 30] {
            assert_eq!(forced.plan(bytes, true).cut.stores, HostStores::Plain);
            assert_eq!(forced.plan(bytes, false).cut.stores, HostStores::Streaming);
        }
    }

    #[test]
    fn plans_cut_every_copy_into_pieces_no_larger_than_the_chunk() {
        let staging = [
            Staging::default(),
            Staging::new(1 << 20, 1).unwrap(),
            Staging::new(64 << 20, 16).unwrap(),
            Staging::new(64 << 10, 64).unwrap(),
            Staging::new(4 << 20, 8).unwrap().with_pieces_in_flight(16).unwrap(),
        ];
        for s in staging {
            for bytes in [1usize, 3, 4097, (1 << 20) + 1, (64 << 20) + 3, 1 << 30] {
                let p = s.plan(bytes, true);
                let StagedCut { piece, sub, .. } = p.cut;
                assert!(piece >= 1 && piece <= s.chunk_bytes() && piece <= bytes, "{s:?} {bytes}: {p:?}");
                assert!(sub >= 1 && sub <= piece, "{s:?} {bytes}: {p:?}");
                assert!(p.threads >= 1 && p.threads <= s.threads(), "{s:?} {bytes}: {p:?}");
                // No thread without a sub-piece to take among the pieces in flight.
                let in_flight = s.pieces_in_flight().min(bytes.div_ceil(piece)) * piece.div_ceil(sub);
                assert!(p.threads <= in_flight, "{s:?} {bytes}: {p:?}: idle threads");
            }
        }
        // A large copy: chunk-sized pieces, one sub-piece per thread and piece.
        let p = Staging::new(4 << 20, 16).unwrap().plan(1 << 30, true);
        assert_eq!((p.cut.piece, p.cut.sub, p.threads), (4 << 20, 256 << 10, 16));
        let p = Staging::new(4 << 20, 8).unwrap().plan(1 << 30, true);
        assert_eq!((p.cut.piece, p.cut.sub, p.threads), (4 << 20, 512 << 10, 8));
        // 64 MiB: the same cut, 16 pieces.
        assert_eq!(
            Staging::new(4 << 20, 16).unwrap().plan(64 << 20, true).cut,
            StagedCut { piece: 4 << 20, sub: 256 << 10, stores: HostStores::Plain }
        );
        // 1 MiB: quarters, so the device starts on the first while the host copies the next.
        let p = Staging::new(4 << 20, 16).unwrap().plan(1 << 20, true);
        assert_eq!((p.cut.piece, p.cut.sub, p.threads), (256 << 10, 64 << 10, 16));
        // Tiny copies stay on the calling thread.
        assert_eq!(Staging::new(4 << 20, 16).unwrap().plan(4097, true).threads, 1);
    }
}
