//! `DeviceResources`: a RAFT `raft::device_resources` on a stream of its own, owned from Rust.
use crate::device::{context, current_device_for, ContextGuard};
use crate::error::{Error, Result};
use crate::ffi::check;
use crate::job::{JobHandle, Shared, Worker};
use crate::{memory, release};
use cudarc::driver::{CudaContext, CudaStream};
use raft_sys as sys;
use std::collections::HashMap;
use std::ffi::c_void;
use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};

/// A library handle of RAFT's, as the C APIs of cuBLAS, cuSOLVER and cuSPARSE know it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HandleKind {
    /// `cublasHandle_t`.
    Cublas,
    /// `cusolverDnHandle_t` (dense).
    CusolverDn,
    /// `cusolverSpHandle_t` (sparse).
    CusolverSp,
    /// `cusparseHandle_t`.
    Cusparse,
}

impl HandleKind {
    /// All kinds.
    pub const ALL: [HandleKind; 4] = [HandleKind::Cublas, HandleKind::CusolverDn, HandleKind::CusolverSp, HandleKind::Cusparse];

    fn raw(self) -> i32 {
        match self {
            HandleKind::Cublas => sys::RAFTRS_HANDLE_CUBLAS,
            HandleKind::CusolverDn => sys::RAFTRS_HANDLE_CUSOLVER_DN,
            HandleKind::CusolverSp => sys::RAFTRS_HANDLE_CUSOLVER_SP,
            HandleKind::Cusparse => sys::RAFTRS_HANDLE_CUSPARSE,
        }
    }
}

/// The shim's `raft::device_resources`.
struct Native(NonNull<sys::raftrs_resources>);

// SAFETY: raft::device_resources may be used from any thread; its lazily made handles are
// created under atomics (RAFT's resource cells). Destruction is exclusive: Live is taken out
// of its RwLock (write lock) before `destroy`.
unsafe impl Send for Native {}
// SAFETY: as above; shared use only reads the object or goes through RAFT's atomic cells.
unsafe impl Sync for Native {}

/// What exists until release: the native resources and the stream they were built on.
pub(crate) struct Live {
    native: Native,
    stream: Arc<CudaStream>,
}

impl Live {
    pub(crate) fn raw(&self) -> *mut sys::raftrs_resources {
        self.native.0.as_ptr()
    }

    pub(crate) fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Waits for the stream, destroys the handles and RAFT's object, then the stream. At exit,
    /// once the exit hook has decided, it leaks them instead (no CUDA call under the static
    /// destructors).
    fn destroy(self, who: &'static str) -> Result<()> {
        if !raft_exit::native_release_allowed() {
            std::mem::forget(self);
            return Ok(());
        }
        // SAFETY: the stream is alive (we hold an Arc to it) and belongs to a retained context.
        let drained = unsafe { cudarc::driver::result::stream::synchronize(self.stream.cu_stream()) };
        let drained = drained.or_else(already_gone).map_err(|e| Error::driver(who, e));
        let _keep = ContextGuard::save(who);
        // SAFETY: `native` came from raftrs_resources_create and is destroyed exactly once; its
        // stream is still alive (destroyed just below, after it).
        let destroyed = check(who, unsafe { sys::raftrs_resources_destroy(self.native.0.as_ptr()) });
        drop(self.stream);
        drained.and(destroyed)
    }
}

/// CUDA results that mean "the driver is already shutting down": the work is gone with it.
fn already_gone(e: cudarc::driver::DriverError) -> std::result::Result<(), cudarc::driver::DriverError> {
    use cudarc::driver::sys::CUresult;
    match e.0 {
        CUresult::CUDA_ERROR_DEINITIALIZED => Ok(()),
        _ => Err(e),
    }
}

pub(crate) struct Inner {
    id: u64,
    device: usize,
    ctx: Arc<CudaContext>,
    released: AtomicBool,
    live: RwLock<Option<Live>>,
    /// The worker, started on the first job. Its lock also orders `spawn` against `release`.
    worker: Mutex<Option<Worker>>,
    /// Held across a release, so a second `release()` returns once the first has finished.
    releasing: Mutex<()>,
}

impl Inner {
    /// Releases now, on the calling thread: queued jobs finish, then the handles, RAFT's object
    /// and the stream are destroyed.
    fn release(&self, who: &'static str) -> Result<()> {
        let _one_at_a_time = self.releasing.lock().unwrap_or_else(|e| e.into_inner());
        let worker = {
            let mut w = self.worker.lock().unwrap_or_else(|e| e.into_inner());
            self.released.store(true, Ordering::Release);
            w.take()
        };
        if let Some(w) = worker {
            w.finish();
        }
        let live = self.live.write().unwrap_or_else(|e| e.into_inner()).take();
        match live {
            Some(live) => live.destroy(who),
            None => Ok(()),
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        live_registry().lock().unwrap_or_else(|e| e.into_inner()).remove(&self.id);
        let live = self.live.get_mut().unwrap_or_else(|e| e.into_inner()).take();
        let worker = self.worker.get_mut().unwrap_or_else(|e| e.into_inner()).take();
        if live.is_none() && worker.is_none() {
            return;
        }
        if !raft_exit::native_release_allowed() {
            // The exit has decided: leak to the OS rather than call CUDA under the destructors.
            std::mem::forget((live, worker));
            return;
        }
        // The last handle is gone: release on a library thread, never blocking this one. With a
        // worker, the worker itself releases after the jobs queued on it; without, the release
        // thread does (it never waits for a job).
        let label = raft_exit::Label { what: "release of resources", id: self.id, device: Some(self.device) };
        let destroy = move || {
            if let Some(live) = live {
                if let Err(e) = live.destroy("DeviceResources::drop") {
                    log::warn!(target: "raft", "{e}");
                }
            }
        };
        match worker {
            Some(w) => release::on_worker(w, label, Box::new(destroy)),
            None => release::enqueue(label, Box::new(destroy)),
        }
    }
}

/// Every resources object alive, for the exit teardown and for [`crate::stats`].
pub(crate) fn live_registry() -> &'static Mutex<HashMap<u64, Weak<Inner>>> {
    static LIVE: std::sync::OnceLock<Mutex<HashMap<u64, Weak<Inner>>>> = std::sync::OnceLock::new();
    LIVE.get_or_init(|| Mutex::new(HashMap::new()))
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// RAFT's device resources (`raft::device_resources`) for one device, on a CUDA stream of
/// their own.
///
/// Each object owns a non-blocking CUDA stream (made through cudarc on the device's primary
/// context, never the legacy or per-thread default stream), a worker thread for jobs (started
/// on the first [`spawn`](Self::spawn)), and the cuBLAS, cuSOLVER (dense and sparse) and
/// cuSPARSE handles RAFT creates on first use, bound to that stream. Making one costs a stream
/// and a small C++ object; a first cuBLAS handle costs tens of milliseconds and about 65 MiB of
/// device memory, paid only by the resources that use one.
///
/// `Clone` gives the *same* resources (a cheap handle); `==` is identity. Resources are
/// released by [`release`](Self::release), at the end of [`with_device_resources`], or when
/// the last handle is dropped (then on a library release thread: `Drop` never blocks).
/// Released resources stay a `DeviceResources` value: [`device`](Self::device) still answers,
/// and the rest give a `Logic` error.
///
/// # Thread safety
/// `Send + Sync`: any thread may sync, spawn, take handles or release. A release waits for
/// calls in progress on other threads, then for the jobs already queued.
#[derive(Clone)]
pub struct DeviceResources {
    inner: Arc<Inner>,
}

static_assertions::assert_impl_all!(DeviceResources: Send, Sync, Clone, Eq, std::hash::Hash);

impl DeviceResources {
    /// New, independent resources on the calling thread's current CUDA device.
    ///
    /// # Errors
    /// `Cuda` when there is no driver or CUDA fails.
    pub fn new() -> Result<Self> {
        const WHO: &str = "DeviceResources::new";
        let device = current_device_for(WHO)?;
        Self::create(WHO, device)
    }

    /// New, independent resources on `device`.
    ///
    /// # Errors
    /// `Logic` for a device that does not exist (`DeviceResources::on_device: no device 1
    /// among 1`); `Cuda` when there is no driver or CUDA fails.
    pub fn on_device(device: usize) -> Result<Self> {
        Self::create("DeviceResources::on_device", device)
    }

    pub(crate) fn create(who: &'static str, device: usize) -> Result<Self> {
        // context() checks that the device exists.
        let ctx = context(who, device)?;
        let _keep = ContextGuard::save(who)?;
        memory::ensure_default(device);
        let stream = ctx.new_stream().map_err(|e| Error::driver(who, e))?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: the stream is a live CUstream of this device (a CUstream is a cudaStream_t);
        // `raw` receives a new object or stays null on failure.
        check(who, unsafe { sys::raftrs_resources_create(device as i32, stream.cu_stream() as *mut c_void, &mut raw) })?;
        let native = Native(NonNull::new(raw).ok_or_else(|| Error::new(crate::ErrorKind::Generic, who, "the shim returned no resources"))?);
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let inner = Arc::new(Inner {
            id,
            device,
            ctx,
            released: AtomicBool::new(false),
            live: RwLock::new(Some(Live { native, stream })),
            worker: Mutex::new(None),
            releasing: Mutex::new(()),
        });
        live_registry().lock().unwrap_or_else(|e| e.into_inner()).insert(id, Arc::downgrade(&inner));
        crate::register_teardown();
        Ok(DeviceResources { inner })
    }

    /// The device number; still answers after release.
    pub fn device(&self) -> usize {
        self.inner.device
    }

    /// Whether these resources were released.
    pub fn is_released(&self) -> bool {
        self.inner.released.load(Ordering::Acquire)
    }

    /// Runs `f` on the live resources, or gives the `Logic` error of released resources.
    pub(crate) fn with_live<R>(&self, who: &'static str, f: impl FnOnce(&Live) -> Result<R>) -> Result<R> {
        let live = self.inner.live.read().unwrap_or_else(|e| e.into_inner());
        match live.as_ref() {
            Some(live) => f(live),
            None => Err(Error::released(who, self.inner.device)),
        }
    }

    /// Blocks until the stream has drained (`cuStreamSynchronize`). Callable from any thread.
    ///
    /// # Errors
    /// `Logic` on released resources (`DeviceResources::sync: the device resources on device 0
    /// were released`); `Cuda` when the stream's work failed.
    pub fn sync(&self) -> Result<()> {
        const WHO: &str = "DeviceResources::sync";
        self.with_live(WHO, |live| {
            // SAFETY: the stream is alive while the read lock is held; synchronising needs no
            // current context, so the caller's is left as it is.
            unsafe { cudarc::driver::result::stream::synchronize(live.stream.cu_stream()) }.map_err(|e| Error::driver(WHO, e))
        })
    }

    /// Releases now: the queued jobs finish, then the stream is drained and the handles, RAFT's
    /// object and the stream are destroyed. Idempotent: a second call returns `Ok` once the
    /// first release has finished.
    ///
    /// # Errors
    /// `Cuda` when draining the stream or destroying a handle failed (everything is released
    /// all the same).
    pub fn release(&self) -> Result<()> {
        self.inner.release("DeviceResources::release")
    }

    /// The resources' stream as a cudarc stream: copies, kernels and cudarc's cuBLAS on it are
    /// ordered with RAFT's work, and [`sync`](Self::sync) waits for them. The stream stays valid
    /// while the returned `Arc` lives, also after release.
    ///
    /// # Errors
    /// `Logic` on released resources.
    pub fn stream(&self) -> Result<Arc<CudaStream>> {
        self.with_live("DeviceResources::stream", |live| Ok(live.stream.clone()))
    }

    /// The device's primary context, as cudarc knows it.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.inner.ctx
    }

    /// The resources' handle of one kind, made by RAFT on first use on the resources' device
    /// and bound to their stream. For FFI: the pointer is valid until the resources are
    /// released.
    ///
    /// # Errors
    /// `Logic` on released resources; `Cuda` when the library fails to create the handle.
    pub fn handle(&self, kind: HandleKind) -> Result<*mut c_void> {
        const WHO: &str = "DeviceResources::handle";
        let _keep = ContextGuard::save(WHO)?;
        self.with_live(WHO, |live| {
            let mut out = std::ptr::null_mut();
            // SAFETY: the native resources are alive under the read lock; `out` receives the
            // handle. The shim makes the resources' device current around the call.
            check(WHO, unsafe { sys::raftrs_resources_handle(live.raw(), kind.raw(), &mut out) })?;
            Ok(out)
        })
    }

    /// `cublasHandle_t` (see [`handle`](Self::handle)).
    pub fn cublas_handle(&self) -> Result<*mut c_void> {
        self.handle(HandleKind::Cublas).map_err(|e| e.with_who("DeviceResources::cublas_handle"))
    }

    /// `cusolverDnHandle_t` (see [`handle`](Self::handle)).
    pub fn cusolver_dn_handle(&self) -> Result<*mut c_void> {
        self.handle(HandleKind::CusolverDn).map_err(|e| e.with_who("DeviceResources::cusolver_dn_handle"))
    }

    /// `cusolverSpHandle_t` (see [`handle`](Self::handle)).
    pub fn cusolver_sp_handle(&self) -> Result<*mut c_void> {
        self.handle(HandleKind::CusolverSp).map_err(|e| e.with_who("DeviceResources::cusolver_sp_handle"))
    }

    /// `cusparseHandle_t` (see [`handle`](Self::handle)).
    pub fn cusparse_handle(&self) -> Result<*mut c_void> {
        self.handle(HandleKind::Cusparse).map_err(|e| e.with_who("DeviceResources::cusparse_handle"))
    }

    /// Whether RAFT has made the handle of `kind` yet (they are made on first use).
    ///
    /// # Errors
    /// `Logic` on released resources.
    pub fn has_handle(&self, kind: HandleKind) -> Result<bool> {
        const WHO: &str = "DeviceResources::has_handle";
        self.with_live(WHO, |live| {
            let mut out = 0;
            // SAFETY: the native resources are alive under the read lock.
            check(WHO, unsafe { sys::raftrs_resources_has_handle(live.raw(), kind.raw(), &mut out) })?;
            Ok(out != 0)
        })
    }

    /// RAFT's `raft::resource::sync_stream` (polls the stream), beside [`sync`](Self::sync).
    pub fn sync_raft(&self) -> Result<()> {
        const WHO: &str = "DeviceResources::sync_raft";
        // SAFETY: the native resources are alive under the read lock.
        self.with_live(WHO, |live| check(WHO, unsafe { sys::raftrs_resources_sync(live.raw()) }))
    }

    /// Runs `job` on these resources' worker thread (started on the first job), after the jobs
    /// queued before it. The exit wait in force on the calling thread is read now and bounds
    /// how long an exit waits for this job.
    ///
    /// # Errors
    /// `Logic` on released resources or a bad `RAFT_EXIT_WAIT`; `Generic` when no worker
    /// thread could be started.
    pub fn spawn<F, T>(&self, job: F) -> Result<JobHandle<T>>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        const WHO: &str = "DeviceResources::spawn";
        let bound = raft_exit::current_exit_wait().map_err(Error::from)?;
        let device = self.inner.device;
        let mut worker = self.inner.worker.lock().unwrap_or_else(|e| e.into_inner());
        if self.is_released() {
            return Err(Error::released(WHO, device));
        }
        if worker.is_none() {
            let w = Worker::start(device, self.inner.ctx.clone())
                .map_err(|e| Error::new(crate::ErrorKind::Generic, WHO, format!("no worker thread: {e}")))?;
            *worker = Some(w);
        }
        let shared = Shared::new();
        let done = shared.clone();
        let token = raft_exit::JobToken::register(raft_exit::Label { what: "job", id: raft_exit::next_id(), device: Some(device) }, bound);
        let task = Box::new(move || {
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
            done.complete(result);
            drop(token); // the job ends once its result can be seen
        });
        if worker.as_ref().map(|w| w.send(task)).is_some_and(|r| r.is_err()) {
            return Err(Error::new(crate::ErrorKind::Generic, WHO, "the worker thread has stopped"));
        }
        Ok(JobHandle { shared, device })
    }

    /// A weak handle: it does not keep the resources from being dropped (and so released).
    pub fn downgrade(&self) -> WeakResources {
        WeakResources { inner: Arc::downgrade(&self.inner), device: self.inner.device }
    }

    pub(crate) fn from_inner(inner: Arc<Inner>) -> Self {
        DeviceResources { inner }
    }

    /// The id of these resources (unique in the process; shown by `Debug`).
    pub fn id(&self) -> u64 {
        self.inner.id
    }
}

/// A [`DeviceResources`] handle that does not keep them alive (see [`DeviceResources::downgrade`]).
#[derive(Clone)]
pub struct WeakResources {
    inner: Weak<Inner>,
    device: usize,
}

impl WeakResources {
    /// The resources, while some strong handle still holds them.
    pub fn upgrade(&self) -> Option<DeviceResources> {
        self.inner.upgrade().map(|inner| DeviceResources { inner })
    }
}

impl fmt::Debug for WeakResources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WeakResources").field("device", &self.device).field("alive", &(self.inner.strong_count() > 0)).finish()
    }
}

impl PartialEq for DeviceResources {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl Eq for DeviceResources {}

impl std::hash::Hash for DeviceResources {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        Arc::as_ptr(&self.inner).hash(state)
    }
}

impl fmt::Display for DeviceResources {
    /// `device-resources on cuda:0`, or `device-resources on cuda:0 (released)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "device-resources on cuda:{}", self.device())?;
        if self.is_released() {
            f.write_str(" (released)")?;
        }
        Ok(())
    }
}

impl fmt::Debug for DeviceResources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceResources")
            .field("id", &self.id())
            .field("device", &self.device())
            .field("released", &self.is_released())
            .finish()
    }
}

/// Releases every live resources object: the exit teardown, once everything drained.
pub(crate) fn release_all_live() {
    let all: Vec<Arc<Inner>> = live_registry().lock().unwrap_or_else(|e| e.into_inner()).values().filter_map(Weak::upgrade).collect();
    for inner in all {
        if let Err(e) = inner.release("exit teardown") {
            log::debug!(target: "raft", "{e}");
        }
    }
}

/// "A device number or resources": APIs taking `impl AsResources` accept either. A number
/// yields the calling thread's default resources for that device
/// ([`current_device_resources`](crate::current_device_resources)); resources yield themselves.
pub trait AsResources {
    /// The resources meant.
    fn as_resources(&self) -> Result<DeviceResources>;
}

impl AsResources for usize {
    fn as_resources(&self) -> Result<DeviceResources> {
        crate::current::current_device_resources(*self)
    }
}

impl AsResources for DeviceResources {
    fn as_resources(&self) -> Result<DeviceResources> {
        Ok(self.clone())
    }
}

impl<T: AsResources + ?Sized> AsResources for &T {
    fn as_resources(&self) -> Result<DeviceResources> {
        (**self).as_resources()
    }
}

/// Resources released together at the end of [`with_device_resources`]: one object, a tuple,
/// an array or a `Vec` of them.
pub trait Scoped {
    /// Releases every resources object held.
    fn release_all(&self);
}

fn release_logged(r: &DeviceResources) {
    if let Err(e) = r.inner.release("with_device_resources") {
        log::warn!(target: "raft", "{e}");
    }
}

impl Scoped for DeviceResources {
    fn release_all(&self) {
        release_logged(self)
    }
}

impl<const N: usize> Scoped for [DeviceResources; N] {
    fn release_all(&self) {
        self.iter().for_each(release_logged)
    }
}

impl Scoped for Vec<DeviceResources> {
    fn release_all(&self) {
        self.iter().for_each(release_logged)
    }
}

macro_rules! scoped_tuple {
    ($($t:ident . $i:tt),+) => {
        impl<$($t: Scoped),+> Scoped for ($($t,)+) {
            fn release_all(&self) {
                $(self.$i.release_all();)+
            }
        }
    };
}
scoped_tuple!(A.0, B.1);
scoped_tuple!(A.0, B.1, C.2);
scoped_tuple!(A.0, B.1, C.2, D.3);

/// Runs `body` with `resources`, then releases them: when `body` returns, also with an error,
/// and when it panics. Several resources (a tuple, an array, a `Vec`) are released together.
/// This gives their lifetime a clear timeline: GPU and driver state is freed at a known point,
/// not whenever the last handle happens to be dropped. A release error is logged (target
/// `raft`); call [`DeviceResources::release`] yourself to receive it.
///
/// ```no_run
/// # use raft_core::{with_device_resources, DeviceResources};
/// let finished = with_device_resources(DeviceResources::new()?, |r| r.clone());
/// assert!(finished.is_released());
/// # Ok::<(), raft_core::Error>(())
/// ```
pub fn with_device_resources<S: Scoped, R>(resources: S, body: impl FnOnce(&S) -> R) -> R {
    struct ReleaseOnExit<'a, S: Scoped>(&'a S);
    impl<S: Scoped> Drop for ReleaseOnExit<'_, S> {
        fn drop(&mut self) {
            self.0.release_all();
        }
    }
    let _release = ReleaseOnExit(&resources);
    body(&resources)
}
