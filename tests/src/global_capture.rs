//! Another thread's stream capture in global mode (the mode PyTorch's captures default to), for
//! the tests of what the driver refuses beside it (`tests/tests/global_capture.rs`), and the lock
//! that runs the capture tests one at a time (`capture.rs` too).

use std::sync::{Mutex, MutexGuard};

/// One test at a time: a capture of one test's stream was invalidated by a neighbour test's
/// work (`an_array_dropped_during_a_short_capture_is_freed_by_its_release_thread_after_it` failed
/// in 1 of 3 runs of the binary, also with the library of before the seventh audit, and never
/// single-threaded or alone: run 156). One per test binary (each links its own copy).
static SERIAL: Mutex<()> = Mutex::new(());

/// Takes the lock, then waits for the releases the earlier tests left to the release threads:
/// a memory resource destroyed there frees its blocks with `cudaFree`, a device-wide wait that
/// invalidates any capture in progress (`device_copies_and_pointers_are_refused_…` failed once in
/// four runs of the binary with the lock alone, its relaxed capture invalidated: run 157).
pub fn serial() -> MutexGuard<'static, ()> {
    let one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    crate::settle_releases(std::time::Duration::from_secs(30));
    one
}

/// Runs `body` while another thread captures an unrelated stream of `ctx` in global mode (the
/// mode PyTorch's captures default to), then ends that capture: `body`'s result and
/// whether the capture stayed valid (its graph could be made).
pub fn while_another_thread_captures_globally<R>(
    ctx: &std::sync::Arc<cudarc::driver::CudaContext>,
    body: impl FnOnce() -> R,
) -> (R, Result<(), String>) {
    use cudarc::driver::sys::{CUgraphInstantiate_flags as Flags, CUstreamCaptureMode as Mode};
    use std::sync::mpsc::channel;
    let unrelated = ctx.new_stream().unwrap();
    let (begun_tx, begun_rx) = channel();
    let (end_tx, end_rx) = channel::<()>();
    let capturer = std::thread::spawn(move || {
        unrelated.begin_capture(Mode::CU_STREAM_CAPTURE_MODE_GLOBAL).unwrap();
        begun_tx.send(()).unwrap();
        let _ = end_rx.recv_timeout(std::time::Duration::from_secs(60));
        unrelated.end_capture(Flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH).map(drop).map_err(|e| e.to_string())
    });
    begun_rx.recv_timeout(std::time::Duration::from_secs(10)).expect("the other thread began its capture");
    let out = body();
    end_tx.send(()).unwrap();
    (out, capturer.join().unwrap())
}

/// The calling thread's capture mode, read by exchanging it and putting it back.
pub fn capture_mode_now() -> cudarc::driver::sys::CUstreamCaptureMode {
    use cudarc::driver::sys::{self, CUstreamCaptureMode as Mode};
    let mut mode = Mode::CU_STREAM_CAPTURE_MODE_RELAXED;
    // SAFETY: exchanges the calling thread's mode through a pointer to a local, then puts the
    // one it returned back; needs no context.
    unsafe {
        sys::cuThreadExchangeStreamCaptureMode(&mut mode).result().unwrap();
        let mut back = mode;
        sys::cuThreadExchangeStreamCaptureMode(&mut back).result().unwrap();
    }
    mode
}
