//! Helpers shared by raft-comms's integration tests: finding `raft-run` (also inside the GPU
//! bundle, where cargo's build paths do not exist), the GPU / NCCL skip rules, bounded waits,
//! and the CUDA graph captures the capture tests make around a communicator.
#![allow(dead_code)] // each test file uses its own part

use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// `raft-run`: `RAFT_RUN`, else beside this test binary or in `../bin` (the GPU bundle's layout),
/// else `..` (cargo's `target/<profile>/deps/<test>` → `target/<profile>/raft-run`), else where
/// cargo built it.
pub fn raft_run() -> PathBuf {
    if let Some(p) = std::env::var_os("RAFT_RUN").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let dir = exe.parent().expect("a directory").to_path_buf();
    for candidate in [dir.join("raft-run"), dir.join("../bin/raft-run"), dir.join("../raft-run")] {
        if candidate.is_file() {
            return candidate;
        }
    }
    PathBuf::from(env!("CARGO_BIN_EXE_raft-run"))
}

/// Whether the tests must not skip (`RAFT_REQUIRE_GPU=1`, set on the GPU machine).
pub fn required() -> bool {
    std::env::var("RAFT_REQUIRE_GPU").is_ok_and(|v| v == "1")
}

/// The number of GPUs (0 without a driver).
pub fn gpus() -> usize {
    raft_core::device_count().unwrap_or(0)
}

/// The GPUs the run promises (`RAFT_REQUIRE_GPUS`; `RAFT_REQUIRE_GPU=1` alone promises one), as
/// the main tests read it (`raft_tests::gpus_or_skip`).
pub fn required_gpus() -> usize {
    let promised = std::env::var("RAFT_REQUIRE_GPUS").ok().and_then(|v| v.parse::<usize>().ok()).unwrap_or(0);
    promised.max(usize::from(required()))
}

/// Whether `test` can run with `n` GPUs and NCCL here; prints why not, and fails instead where
/// the run promised what is missing: `n` GPUs (`RAFT_REQUIRE_GPUS` ≥ `n`, or one under
/// `RAFT_REQUIRE_GPU=1`), NCCL and NVLink multicast off (`RAFT_REQUIRE_GPU=1`). A two-GPU test
/// on a one-GPU run skips visibly (run 219 counted each as a failure).
pub fn have(n: usize, test: &str) -> bool {
    let found = gpus();
    if found < n {
        let why = format!("{test}: skipped: needs {n} GPU(s), found {found}");
        // No GPU at all fails under `RAFT_REQUIRE_GPU=1` whatever the test needs.
        if required_gpus() >= n || (required() && found == 0) {
            panic!("{why} (the run promised {} GPU(s): RAFT_REQUIRE_GPU / RAFT_REQUIRE_GPUS)", required_gpus());
        }
        eprintln!("{why}");
        return false;
    }
    let why = if std::env::var("NCCL_NVLS_ENABLE").ok().as_deref() != Some("0") {
        // NVLink multicast can take a shared host's GPUs out of service: never from a test.
        Some(format!("{test}: skipped: NCCL_NVLS_ENABLE=0 is not set (NVLink multicast must stay off)"))
    } else {
        raft_comms::nccl_info().err().map(|e| format!("{test}: skipped: NCCL is not available: {e}"))
    };
    match why {
        None => true,
        Some(why) if required() => panic!("{why} (RAFT_REQUIRE_GPU=1)"),
        Some(why) => {
            eprintln!("{why}");
            false
        }
    }
}

/// Whether NCCL (the shim and libnccl) loads here, for the CPU tests that need only it; prints
/// why not. (NCCL needs no GPU to make a unique id.)
pub fn have_nccl(test: &str) -> bool {
    match raft_comms::nccl_info() {
        Ok(_) => true,
        Err(e) if required() => panic!("{test}: NCCL is not available: {e} (RAFT_REQUIRE_GPU=1)"),
        Err(e) => {
            eprintln!("{test}: skipped: NCCL is not available: {e}");
            false
        }
    }
}

// ---- values every rank can compute for every rank ----------------------------------------------

use raft_comms::{NcclType, ReduceOp};
use std::fmt::Debug;

/// The element types, with small values whose sums and products are exact in all of them.
pub trait Val: NcclType + PartialEq + Debug {
    fn of(v: i64) -> Self;
}
impl Val for u8 {
    fn of(v: i64) -> Self {
        v as u8
    }
}
impl Val for i32 {
    fn of(v: i64) -> Self {
        v as i32
    }
}
impl Val for i64 {
    fn of(v: i64) -> Self {
        v
    }
}
impl Val for f32 {
    fn of(v: i64) -> Self {
        v as f32
    }
}
impl Val for f64 {
    fn of(v: i64) -> Self {
        v as f64
    }
}

/// Rank r's element i: 1..=10, different on each rank.
pub fn value(r: usize, i: usize) -> i64 {
    ((r * 7 + i * 3) % 10 + 1) as i64
}

pub fn data(r: usize, n: usize) -> Vec<i64> {
    (0..n).map(|i| value(r, i)).collect()
}

pub fn typed<T: Val>(v: &[i64]) -> Vec<T> {
    v.iter().map(|&x| T::of(x)).collect()
}

pub fn reduce_cpu(op: ReduceOp, n: usize, world: usize) -> Vec<i64> {
    (0..n)
        .map(|i| {
            let vals = (0..world).map(|r| value(r, i));
            match op {
                ReduceOp::Sum => vals.sum(),
                ReduceOp::Prod => vals.product(),
                ReduceOp::Min => vals.min().unwrap(),
                ReduceOp::Max => vals.max().unwrap(),
            }
        })
        .collect()
}

// ---- bounded waits: a hang fails the test instead of stalling the run ---------------------------

/// Waits for `res`'s stream at most `bound`; false when it did not drain in time.
pub fn drains_within(res: &raft_core::DeviceResources, bound: Duration) -> bool {
    let res = res.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(res.sync());
    });
    matches!(rx.recv_timeout(bound), Ok(Ok(())))
}

/// What a bounded child run gave: its status (None when it was stopped for running past the
/// bound), its output, how long it took.
pub struct Run {
    pub status: Option<ExitStatus>,
    pub stdout: String,
    pub stderr: String,
    pub took: Duration,
}

impl Run {
    pub fn show(&self) -> String {
        format!("status {:?} after {:?}\nstdout:\n{}\nstderr:\n{}", self.status, self.took, self.stdout, self.stderr)
    }
}

/// Runs `cmd` (output to files, so no pipe fills up) for at most `bound`; past it, SIGTERM (which
/// raft-run passes on to its ranks), then SIGKILL.
pub fn run_bounded(mut cmd: Command, bound: Duration) -> Run {
    let dir = std::env::temp_dir().join(format!(
        "raft-comms-run-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let (out, err) = (dir.join("stdout"), dir.join("stderr"));
    cmd.stdout(Stdio::from(std::fs::File::create(&out).unwrap())).stderr(Stdio::from(std::fs::File::create(&err).unwrap()));
    let start = Instant::now();
    let mut child = cmd.spawn().unwrap();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if start.elapsed() > bound {
            // SAFETY: kill takes our own child's pid (not yet reaped) and a signal number.
            unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
            let until = Instant::now() + Duration::from_secs(15);
            while Instant::now() < until && child.try_wait().unwrap().is_none() {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = start.elapsed();
    let read = |p: &PathBuf| String::from_utf8_lossy(&std::fs::read(p).unwrap_or_default()).into_owned();
    let run = Run { status, stdout: read(&out), stderr: read(&err), took };
    let _ = std::fs::remove_dir_all(&dir);
    run
}

static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

// ---- CUDA graph captures around a communicator ---------------------------------------------------

use cudarc::driver::sys::{CUgraphInstantiate_flags as Flags, CUresult, CUstreamCaptureMode as Mode};
use cudarc::driver::{CudaContext, CudaStream, DriverError};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};

struct GateState {
    open: AtomicBool,
    bound: Duration,
}

/// Holds back the work queued on a stream after it (a host function on the stream that waits),
/// so that a collective queued behind it stays pending; the stream goes on at [`Gate::open`],
/// when the gate is dropped, or after its bound at the latest (no test may hang).
pub struct Gate(Arc<GateState>);

/// The host function of a [`Gate`]: CUDA's own thread runs it, in stream order.
unsafe extern "C" fn wait_at_gate(data: *mut std::ffi::c_void) {
    // SAFETY: `data` is the `Arc::into_raw` that `Gate::close` handed to this one call.
    let gate = unsafe { Arc::from_raw(data as *const GateState) };
    let start = Instant::now();
    while !gate.open.load(Ordering::Acquire) && start.elapsed() < gate.bound {
        std::thread::sleep(Duration::from_millis(1));
    }
}

impl Gate {
    pub fn close(stream: &CudaStream, bound: Duration) -> Gate {
        let state = Arc::new(GateState { open: AtomicBool::new(false), bound });
        let data = Arc::into_raw(state.clone()) as *mut std::ffi::c_void;
        stream.context().bind_to_thread().unwrap();
        // SAFETY: the stream is alive for the borrow; the host function takes the one reference
        // `data` carries and makes no CUDA call.
        let rc = unsafe { cudarc::driver::sys::cuLaunchHostFunc(stream.cu_stream(), Some(wait_at_gate), data) };
        if rc != CUresult::CUDA_SUCCESS {
            // SAFETY: the launch failed, so the reference `data` carries was not taken.
            drop(unsafe { Arc::from_raw(data as *const GateState) });
            panic!("cuLaunchHostFunc: {rc:?}");
        }
        Gate(state)
    }

    /// Opens the gate from a thread of its own after `delay`.
    pub fn open_after(&self, delay: Duration) {
        let state = self.0.clone();
        std::thread::spawn(move || {
            std::thread::sleep(delay);
            state.open.store(true, Ordering::Release);
        });
    }

    pub fn open(&self) {
        self.0.open.store(true, Ordering::Release);
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.open();
    }
}

/// A capture in global mode of a fresh stream of `ctx`, begun on a thread of its own and held
/// until [`OtherCapture::end`] (or its bound): an unrelated part of the program building a CUDA
/// graph while the communicator works.
pub struct OtherCapture {
    end: mpsc::Sender<()>,
    ended: mpsc::Receiver<Result<(), DriverError>>,
    bound: Duration,
}

impl OtherCapture {
    pub fn begin(ctx: &Arc<CudaContext>, bound: Duration) -> OtherCapture {
        let (ctx, (begun_tx, begun_rx), (end, end_rx), (ended_tx, ended)) =
            (ctx.clone(), mpsc::channel(), mpsc::channel(), mpsc::channel());
        std::thread::spawn(move || {
            let stream = ctx.new_stream().unwrap();
            let begun = stream.begin_capture(Mode::CU_STREAM_CAPTURE_MODE_GLOBAL);
            let ok = begun.is_ok();
            let _ = begun_tx.send(begun);
            if ok {
                let _ = end_rx.recv_timeout(bound);
                let _ = ended_tx.send(stream.end_capture(Flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH).map(drop));
            }
        });
        begun_rx.recv_timeout(bound).expect("the capturing thread did not start").expect("cuStreamBeginCapture (global)");
        OtherCapture { end, ended, bound }
    }

    /// Ends the capture: `Err(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)` when a call made meanwhile
    /// invalidated it.
    pub fn end(self) -> Result<(), DriverError> {
        let _ = self.end.send(());
        self.ended.recv_timeout(self.bound).expect("the capturing thread did not end its capture")
    }
}
