//! Helpers of the integration tests: GPU gating and child-process scenarios.
pub mod global_capture;
pub mod patterns;

use std::io::Write;

/// Whether a GPU is there. Without one, prints a visible skip line (straight to stderr, past
/// the test harness's capture) and returns false; under `RAFT_REQUIRE_GPU=1` it panics instead.
pub fn gpu() -> bool {
    if cfg!(miri) {
        let test = std::thread::current().name().unwrap_or("?").to_string();
        let _ = writeln!(std::io::stderr(), "SKIP {test}: Miri cannot call the CUDA driver");
        return false;
    }
    crash_report();
    let reason = match raft::device_count() {
        Ok(n) if n > 0 => return true,
        Ok(_) => "no CUDA device".to_string(),
        Err(e) => e.to_string(),
    };
    if std::env::var("RAFT_REQUIRE_GPU").as_deref() == Ok("1") {
        panic!("RAFT_REQUIRE_GPU=1 but no GPU is usable: {reason}");
    }
    let test = std::thread::current().name().unwrap_or("?").to_string();
    let _ = writeln!(std::io::stderr(), "SKIP {test}: {reason}");
    false
}

/// The device count when the machine has at least `n` GPUs (`n` ≥ 2: the tests of several
/// devices); otherwise a visible SKIP and `None`, or a panic when `RAFT_REQUIRE_GPUS` asks for
/// `n` or more (the two-GPU runs set `RAFT_REQUIRE_GPUS=2`: a test of two devices that found
/// one must fail there, not pass unrun). `RAFT_REQUIRE_GPU=1` alone asks for one GPU, so these
/// tests still skip visibly on a one-GPU run.
pub fn gpus_or_skip(n: usize) -> Option<usize> {
    let required = std::env::var("RAFT_REQUIRE_GPUS").ok().and_then(|v| v.parse::<usize>().ok()).unwrap_or(0);
    if required < n && !gpu() {
        return None;
    }
    let found = raft::device_count().unwrap_or(0);
    if found >= n {
        return Some(found);
    }
    let test = std::thread::current().name().unwrap_or("?").to_string();
    if required >= n {
        panic!("RAFT_REQUIRE_GPUS={required} but {test} found {found} GPU(s); it needs {n}");
    }
    let _ = writeln!(std::io::stderr(), "SKIP {test}: needs {n} or more GPUs, found {found}");
    None
}

/// `Command::output` with a bound: a child that hangs past `limit` is killed and the test fails
/// naming it, with what it printed (a plain `output()` would hold the test binary, and the GPU
/// run's call, until the runner's own bound).
pub trait OutputWithin {
    fn output_within(&mut self, limit: std::time::Duration) -> std::process::Output;
}

impl OutputWithin for std::process::Command {
    fn output_within(&mut self, limit: std::time::Duration) -> std::process::Output {
        use std::io::Read;
        fn drain(mut pipe: impl Read + Send + 'static) -> std::thread::JoinHandle<Vec<u8>> {
            std::thread::spawn(move || {
                let mut bytes = Vec::new();
                let _ = pipe.read_to_end(&mut bytes);
                bytes
            })
        }
        let start = std::time::Instant::now();
        let mut child = self
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {self:?}: {e}"));
        let stdout = drain(child.stdout.take().expect("piped stdout"));
        let stderr = drain(child.stderr.take().expect("piped stderr"));
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait for the child") {
                break status;
            }
            if start.elapsed() > limit {
                let _ = child.kill();
                let _ = child.wait();
                let (out, err) = (stdout.join().unwrap_or_default(), stderr.join().unwrap_or_default());
                panic!(
                    "{self:?} hung past {limit:?}\nstdout:\n{}\nstderr:\n{}",
                    String::from_utf8_lossy(&out),
                    String::from_utf8_lossy(&err)
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        std::process::Output { status, stdout: stdout.join().unwrap_or_default(), stderr: stderr.join().unwrap_or_default() }
    }
}

/// Waits until no release is pending on any release thread or worker (`raft::stats`); panics
/// past `limit`, with the statistics. Returns how long it took.
pub fn settle_releases(limit: std::time::Duration) -> std::time::Duration {
    let t = std::time::Instant::now();
    loop {
        let s = raft::stats();
        if s.pending.releases == 0 && s.releases_pending == 0 {
            return t.elapsed();
        }
        assert!(t.elapsed() < limit, "releases still pending after {limit:?}: {s:?}");
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
}

/// The context that owns the device memory at `address`, as the driver says
/// (`cuPointerGetAttribute` CONTEXT), as an integer.
pub fn context_of_address(address: u64) -> usize {
    use cudarc::driver::sys;
    let mut owner: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: writes one context handle into a local; the caller names a live allocation.
    unsafe {
        sys::cuPointerGetAttribute(
            &mut owner as *mut sys::CUcontext as *mut std::ffi::c_void,
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_CONTEXT,
            address,
        )
    }
    .result()
    .expect("cuPointerGetAttribute");
    owner as usize
}

/// The device an array lives on, as the driver says (`cuPointerGetAttribute` DEVICE_ORDINAL).
pub fn device_of<T: raft::DeviceScalar>(v: &raft::DeviceVec<T>) -> i32 {
    use cudarc::driver::sys::{cuPointerGetAttribute, CUpointer_attribute, CUresult};
    use cudarc::driver::DevicePtr;
    let (ptr, _ordered) = v.device_ptr(v.stream());
    let mut ordinal: i32 = -1;
    // SAFETY: writes one int for a pointer the driver knows (a live allocation, borrowed here).
    let rc =
        unsafe { cuPointerGetAttribute(&mut ordinal as *mut i32 as *mut _, CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr) };
    assert_eq!(rc, CUresult::CUDA_SUCCESS);
    ordinal
}

/// Returns from the test when there is no GPU (see [`gpu`]).
#[macro_export]
macro_rules! require_gpu {
    () => {
        if !$crate::gpu() {
            return;
        }
    };
}

/// What a scenario child did.
#[derive(Debug)]
pub struct Child {
    /// Exit code (`None` when killed by a signal).
    pub code: Option<i32>,
    /// Signal that ended it, if any.
    pub signal: Option<i32>,
    /// Wall time from spawn to exit.
    pub elapsed: std::time::Duration,
    pub stdout: String,
    pub stderr: String,
}

impl Child {
    /// The value of `key` in the child's `RESULT` lines.
    pub fn result(&self, key: &str) -> Option<String> {
        self.stdout
            .lines()
            .filter_map(|l| l.strip_prefix("RESULT "))
            .flat_map(|l| l.split_whitespace())
            .filter_map(|kv| kv.split_once('='))
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.to_string())
    }

    /// Panics with the child's output unless it exited with `code`.
    pub fn assert_code(&self, code: i32) {
        assert_eq!(
            self.code,
            Some(code),
            "child ended with {:?} / signal {:?}\nstdout:\n{}\nstderr:\n{}",
            self.code,
            self.signal,
            self.stdout,
            self.stderr
        );
    }
}

/// The scenarios binary: `RAFT_SCENARIOS_EXE`, else the one cargo built, else `../bin/scenarios`
/// beside this test binary (the GPU bundle's layout).
pub fn scenarios_exe(built: &str) -> std::path::PathBuf {
    if let Ok(p) = std::env::var("RAFT_SCENARIOS_EXE") {
        return p.into();
    }
    let built = std::path::PathBuf::from(built);
    if built.exists() {
        return built;
    }
    let me = std::env::current_exe().expect("current exe");
    me.parent().and_then(|d| d.parent()).map(|d| d.join("bin/scenarios")).expect("bundle layout")
}

/// Runs scenario `name` in a fresh process with `envs`, killing it after `limit`:
/// `run_scenario!(name, envs, limit)` from an integration test.
#[macro_export]
macro_rules! run_scenario {
    ($($arg:tt)*) => {
        $crate::run_scenario_at(env!("CARGO_BIN_EXE_scenarios"), $($arg)*)
    };
}

/// See [`run_scenario!`]; `built` is the path cargo gave the scenarios binary.
pub fn run_scenario_at(built: &str, name: &str, envs: &[(&str, &str)], limit: std::time::Duration) -> Child {
    use std::os::unix::process::ExitStatusExt;
    let start = std::time::Instant::now();
    let mut cmd = std::process::Command::new(scenarios_exe(built));
    cmd.arg(name).envs(envs.iter().copied()).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    if std::env::var_os("RUST_LOG").is_none() {
        cmd.env("RUST_LOG", "raft=debug");
    }
    let mut child = cmd.spawn().expect("spawn scenarios");
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "scenario {name} hung past {limit:?}\nstdout:\n{}\nstderr:\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    let elapsed = start.elapsed();
    let out = child.wait_with_output().expect("output");
    Child {
        code: status.code(),
        signal: status.signal(),
        elapsed,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Another library's C++ beside this one (native/foreign_mr.cpp): it sets RMM's per-device
/// resource itself, past this binding.
pub mod foreign {
    extern "C" {
        fn raft_tests_install_foreign_binning(device: i32, bin_bytes: usize) -> i32;
        fn raft_tests_cublaslt_handle(raft_resources: *mut std::ffi::c_void) -> *mut std::ffi::c_void;
        fn raft_tests_cublas_set_pointer_mode(handle: *mut std::ffi::c_void, device: i32) -> i32;
        fn raft_tests_cublas_state(handle: *mut std::ffi::c_void, stream: *mut *mut std::ffi::c_void, device_pointers: *mut i32) -> i32;
        fn raft_tests_cublas_set_emulation(handle: *mut std::ffi::c_void, bit_count: *mut std::ffi::c_void) -> i32;
        fn raft_tests_cublas_emulation(handle: *mut std::ffi::c_void, bit_count: *mut *mut std::ffi::c_void, max_bits: *mut i32) -> i32;
        fn raft_tests_cusolver_dn_set_math_mode(handle: *mut std::ffi::c_void, emulated: i32) -> i32;
        fn raft_tests_cusolver_dn_math_mode(handle: *mut std::ffi::c_void) -> i32;
    }

    /// Points a live cuBLAS handle's FP64 emulation at `bit_count` (a device address cuBLAS
    /// writes the mantissa bit count to) and sets its largest mantissa bit count to 40, as a
    /// user of the raw handle might.
    ///
    /// # Safety
    /// As [`cublas_set_device_pointer_mode`].
    pub unsafe fn cublas_set_emulation(handle: *mut std::ffi::c_void, bit_count: u64) {
        // SAFETY: as the caller promises; cuBLAS only stores the address here.
        assert_eq!(unsafe { raft_tests_cublas_set_emulation(handle, bit_count as usize as *mut std::ffi::c_void) }, 0);
    }

    /// A live cuBLAS handle's FP64 emulation settings: the bit count's device address (0: none)
    /// and the largest mantissa bit count.
    ///
    /// # Safety
    /// As [`cublas_set_device_pointer_mode`].
    pub unsafe fn cublas_emulation(handle: *mut std::ffi::c_void) -> (u64, i32) {
        let (mut p, mut bits) = (std::ptr::null_mut(), 0);
        // SAFETY: as the caller promises; writes a pointer and an int through valid pointers.
        assert_eq!(unsafe { raft_tests_cublas_emulation(handle, &mut p, &mut bits) }, 0);
        (p as usize as u64, bits)
    }

    /// Sets a live dense cuSOLVER handle's math mode to FP32 emulated through BF16x9.
    ///
    /// # Safety
    /// `handle` is a live dense cuSOLVER handle of the process's libcusolver, used by nothing
    /// else now.
    pub unsafe fn cusolver_dn_set_emulated_math(handle: *mut std::ffi::c_void) {
        // SAFETY: as the caller promises.
        assert_eq!(unsafe { raft_tests_cusolver_dn_set_math_mode(handle, 1) }, 0, "cusolverDnSetMathMode");
    }

    /// Whether a live dense cuSOLVER handle's math mode is the emulated one.
    ///
    /// # Safety
    /// As [`cusolver_dn_set_emulated_math`].
    pub unsafe fn cusolver_dn_emulated_math(handle: *mut std::ffi::c_void) -> bool {
        // SAFETY: as the caller promises.
        let mode = unsafe { raft_tests_cusolver_dn_math_mode(handle) };
        assert!(mode >= 0, "cusolverDnGetMathMode");
        mode == 1
    }

    /// RAFT's cuBLASLt handle of lent resources (`raft::resource::get_cublaslt_handle`), made on
    /// first use; null when making it failed.
    pub fn cublaslt_handle(lent: &raft::RaftResourcesPtr<'_>) -> *mut std::ffi::c_void {
        // SAFETY: the pointer is a live `raft::resources` for the lend's borrow; the C++ catches
        // every exception.
        unsafe { raft_tests_cublaslt_handle(lent.as_ptr()) }
    }

    /// Sets a live cuBLAS handle's pointer mode to device, as a user of the raw handle might.
    ///
    /// # Safety
    /// `handle` is a live cuBLAS handle of the process's libcublas, used by nothing else now.
    pub unsafe fn cublas_set_device_pointer_mode(handle: *mut std::ffi::c_void) {
        // SAFETY: as the caller promises.
        assert_eq!(unsafe { raft_tests_cublas_set_pointer_mode(handle, 1) }, 0, "cublasSetPointerMode");
    }

    /// A live cuBLAS handle's stream and whether it is in device pointer mode.
    ///
    /// # Safety
    /// As [`cublas_set_device_pointer_mode`].
    pub unsafe fn cublas_state(handle: *mut std::ffi::c_void) -> (usize, bool) {
        let (mut stream, mut device) = (std::ptr::null_mut(), 0);
        // SAFETY: as the caller promises; writes a pointer and an int through valid pointers.
        assert_eq!(unsafe { raft_tests_cublas_state(handle, &mut stream, &mut device) }, 0, "cublasGetStream / GetPointerMode");
        (stream as usize, device != 0)
    }

    /// Makes `device` current on the calling thread and installs, as its RMM resource, a binning
    /// resource over a fresh CUDA async pool whose one bin (sizes up to `bin_bytes`) is plain
    /// `cudaMalloc`/`cudaFree`. Panics when it could not.
    pub fn install_binning_with_a_cuda_malloc_bin(device: i32, bin_bytes: usize) {
        // SAFETY: the function takes two values and touches RMM's per-device map under RMM's
        // own lock; it catches every C++ exception.
        let rc = unsafe { raft_tests_install_foreign_binning(device, bin_bytes) };
        assert_eq!(rc, 0, "installing another library's binning resource on device {device} failed");
    }
}

/// The benchmark's C++ baseline (bench/baseline.cpp): the same operations written directly
/// against RAFT, RMM and the CUDA runtime.
pub mod baseline {
    use std::ffi::c_void;
    extern "C" {
        /// cudaStreamCreateWithFlags(NonBlocking) + raft::device_resources on it + destroy both.
        pub fn bl_create_release() -> i32;
        /// What this library's soundness requires of `new()` + `release()` + drop, in C++.
        pub fn bl_create_release_floor() -> i32;
        /// The same plus the two steps this library's design adds (the stream's capture flag in
        /// its registry, RAFT's object destroyed with the capture mode relaxed).
        pub fn bl_create_release_floor_as_designed() -> i32;
        pub fn bl_stream_create_destroy() -> i32;
        pub fn bl_make(out: *mut *mut std::ffi::c_void) -> i32;
        pub fn bl_destroy(made: *mut std::ffi::c_void) -> i32;
        /// `raft::resource::get_cuda_stream` of a lent `raft::resources*`.
        pub fn bl_lent_stream(res: *mut c_void) -> *mut c_void;
        /// `raft::resource::get_cublas_handle` of a lent `raft::resources*`.
        pub fn bl_lent_cublas(res: *mut c_void) -> *mut c_void;
        /// cudaRuntimeGetVersion, linked.
        pub fn bl_runtime_version(out: *mut i32) -> i32;
        /// cudaStreamSynchronize.
        pub fn bl_stream_sync(stream: *mut c_void) -> i32;
        /// Allocate + free through a C++ cuda_async_memory_resource.
        pub fn bl_alloc_free_async(bytes: usize) -> i32;
        /// The same pool through cudaMallocFromPoolAsync + cudaFreeAsync (no RMM layer).
        pub fn bl_alloc_free_async_runtime(bytes: usize) -> i32;
        /// The same pool through cuMemAllocFromPoolAsync + cuMemFreeAsync (no runtime layer).
        pub fn bl_alloc_free_async_driver(bytes: usize) -> i32;
        pub fn bl_alloc_free_copied(bytes: usize, heap: i32) -> i32;
        /// Allocate + free through the device's current RMM resource, looked up on every call.
        pub fn bl_alloc_free_per_device(bytes: usize) -> i32;
        /// Allocate + free through a C++ pool_memory_resource over cudaMalloc (256 MiB initial).
        pub fn bl_alloc_free_pool(bytes: usize) -> i32;
        /// Allocate + free through a C++ arena_memory_resource over cudaMalloc (1 GiB arena).
        pub fn bl_alloc_free_arena(bytes: usize) -> i32;
        /// Allocate + free through a C++ binning_memory_resource over cudaMalloc (bins 2^8..2^20).
        pub fn bl_alloc_free_binning(bytes: usize) -> i32;
        /// Allocate + free through the arena `bl_arena_threads` shares (1 GiB over cudaMalloc).
        pub fn bl_alloc_free_bench_arena(bytes: usize) -> i32;
        /// The steps this library's soundness requires of an allocation, in C++, through the
        /// resource of `kind` (0 pool, 1 arena, 2 binning, 3 async pool of the rows above; 4 the
        /// current resource, revalidated under RMM's lock): issue 30's floor (see baseline.cpp).
        /// Makes `stream` (a `cudaStream_t`; null: their own) the stream of the C++ allocation
        /// rows, so they allocate on the stream ours do.
        pub fn bl_use_stream(stream: *mut std::ffi::c_void);
        pub fn bl_floor_private(on: i32);
        pub fn bl_alloc_free_held(kind: i32, bytes: usize) -> i32;
        /// Points the C++ same-pool rows (and floor kind 5) at the CUDA pool `ptr` came from;
        /// null forgets it (before that pool is dropped).
        pub fn bl_async_share_pool_of(ptr: *const std::ffi::c_void) -> i32;
        /// `bytes` allocate + free through RMM's view of that pool.
        pub fn bl_alloc_free_async_shared(bytes: usize) -> i32;
        /// The same plus the two steps this library's design adds (a third counted handle, the
        /// thread's record of the resources in use): the floor of the design (see baseline.cpp).
        pub fn bl_alloc_free_held_as_designed(kind: i32, bytes: usize) -> i32;
        /// A thread-local `shared_ptr` copied out and dropped: the C++ floor of an owned handle.
        pub fn bl_tls_shared_ptr_copy() -> i32;
        /// `threads` threads, a stream each, allocating and freeing `bytes` `iters` times from one
        /// arena; `ns` from their common start to the last one's end.
        pub fn bl_arena_threads(threads: i32, iters: i32, bytes: usize, ns: *mut i64) -> i32;
        /// Allocate + free through a C++ cuda_memory_resource (cudaMalloc).
        pub fn bl_alloc_free_cuda(bytes: usize) -> i32;
        /// ns of the first raft::resource::get_cublas_handle of new resources.
        pub fn bl_first_cublas_ns() -> i64;
        /// `n` resources alive at once: ns to create them and device bytes they held.
        pub fn bl_scale(n: i32, with_cublas: i32, create_ns: *mut i64, bytes_held: *mut i64) -> i32;
        /// Keeps `n` C++ resources alive until `bl_unhold`.
        pub fn bl_hold(n: i32) -> i32;
        /// Destroys what `bl_hold` kept.
        pub fn bl_unhold();
    }
}

/// On SIGSEGV / SIGBUS / SIGABRT, writes the crashing thread's stack (glibc's `backtrace`) to
/// stderr before the process dies, so a crash in a GPU run that a debugger does not reproduce
/// still says where it was. Installed once, by the first GPU test.
pub fn crash_report() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        extern "C" {
            fn backtrace(buffer: *mut *mut std::ffi::c_void, size: i32) -> i32;
            fn backtrace_symbols_fd(buffer: *const *mut std::ffi::c_void, size: i32, fd: i32);
        }
        extern "C" fn on_fault(signal: i32) {
            let mut frames = [std::ptr::null_mut(); 64];
            let msg: &[u8] = b"\nCRASH: fatal signal; the crashing thread's stack:\n";
            // SAFETY: write(2) of a static buffer; backtrace and backtrace_symbols_fd write into
            // the local array and to fd 2 (glibc documents backtrace_symbols_fd for this use).
            unsafe {
                libc::write(2, msg.as_ptr() as *const libc::c_void, msg.len());
                let n = backtrace(frames.as_mut_ptr(), frames.len() as i32);
                backtrace_symbols_fd(frames.as_ptr(), n, 2);
                libc::signal(signal, libc::SIG_DFL);
                libc::raise(signal);
            }
        }
        // The first backtrace() loads libgcc_s (malloc, dlopen): do it now, not in the handler.
        let mut warm = [std::ptr::null_mut(); 4];
        // SAFETY: writes at most 4 frames into the local array.
        unsafe { backtrace(warm.as_mut_ptr(), 4) };
        for signal in [libc::SIGSEGV, libc::SIGBUS, libc::SIGABRT] {
            // SAFETY: installs a handler that only writes to stderr and then re-raises the
            // signal with the default action (the process still dies of it).
            unsafe { libc::signal(signal, on_fault as extern "C" fn(i32) as libc::sighandler_t) };
        }
    });
}

/// A stream held shut from the host: [`Gate::close`] queues a host function on a stream that
/// returns only once [`Gate::open`] is called (or after 30 s, so a failing test cannot hang),
/// so the work queued behind it waits for the test, not for a guess at how long a kernel runs.
pub struct Gate {
    open: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Gate {
    /// Shuts `stream` until [`open`](Self::open).
    pub fn close(stream: &cudarc::driver::CudaStream) -> Gate {
        use std::sync::atomic::{AtomicBool, Ordering};
        unsafe extern "C" fn hold(arg: *mut std::ffi::c_void) {
            // SAFETY: `arg` is the `Arc<AtomicBool>` leaked below, reclaimed here once.
            let open = unsafe { std::sync::Arc::from_raw(arg as *const AtomicBool) };
            let start = std::time::Instant::now();
            while !open.load(Ordering::Acquire) && start.elapsed() < std::time::Duration::from_secs(30) {
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
        }
        let open = std::sync::Arc::new(AtomicBool::new(false));
        let arg = std::sync::Arc::into_raw(open.clone()) as *mut std::ffi::c_void;
        // SAFETY: the stream is alive for the call; `hold` makes no CUDA call and owns `arg`.
        unsafe { cudarc::driver::result::stream::launch_host_function(stream.cu_stream(), hold, arg) }.expect("cuLaunchHostFunc");
        Gate { open }
    }

    /// Lets the stream go on.
    pub fn open(&self) {
        self.open.store(true, std::sync::atomic::Ordering::Release);
    }

    /// Opens the gate from another thread after `after`.
    pub fn open_after(&self, after: std::time::Duration) -> std::thread::JoinHandle<()> {
        let open = self.open.clone();
        std::thread::spawn(move || {
            std::thread::sleep(after);
            open.store(true, std::sync::atomic::Ordering::Release);
        })
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.open();
    }
}
