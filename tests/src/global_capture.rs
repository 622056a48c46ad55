//! Another thread's stream capture in global mode (the mode PyTorch's captures default to), for
//! the tests of what the driver refuses beside it (`tests/tests/capture.rs`).

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
