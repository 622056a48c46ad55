//! The blocking rule (issue 34), in a process of its own: the test holds its stream shut from the
//! host, and a neighbour test's device-wide synchronisation (`cudaFreeHost` of a staged copy's
//! buffers, a handle's creation) would wait for that gate, and time out or fail on it.
use raft::{DeviceResources, DeviceVec};
use raft_tests::patterns::pattern_f32;
use raft_tests::require_gpu;
use std::time::{Duration, Instant};

/// The blocking rule (issue 34): only what touches host memory blocks. `zeros` and `fill_zero`
/// touch device memory only, so they queue on the array's stream and return without waiting for
/// it: with the stream held shut from the host (a `Gate`, opened 2 s later by another thread),
/// both return at once. (Before, both synchronised the stream: they returned only once the gate
/// opened.) What they wrote is still zeros, ordered after the gate. (Runs 109 to 111 kept the
/// stream busy with copies, then GEMMs, and could not tell a wait from a drained stream; run 113
/// ran it beside the other copy tests, whose device-wide waits the gate held.)
#[test]
fn zeros_and_fill_zero_only_queue() {
    require_gpu!();
    let res = DeviceResources::new().unwrap();
    let mut refilled = DeviceVec::from_host(&res, &pattern_f32(4096, 67)).unwrap();
    let stream = res.stream().unwrap();
    let shut = raft_tests::Gate::close(&stream);
    let gate_behind = stream.record_event(None).unwrap().try_is_complete();
    let opener = shut.open_after(Duration::from_secs(2));
    let called = Instant::now();
    let zeros = DeviceVec::<f32>::zeros(&res, 4096).unwrap();
    let zeros_took = called.elapsed();
    let called = Instant::now();
    refilled.fill_zero().unwrap();
    let fill_took = called.elapsed();
    let behind = stream.record_event(None).unwrap();
    let still_shut = !behind.is_complete();
    opener.join().unwrap();
    assert!(zeros_took < Duration::from_secs(1), "DeviceVec::zeros waited for the work queued before it ({zeros_took:?})");
    assert!(fill_took < Duration::from_secs(1), "DeviceVec::fill_zero waited for the work queued before it ({fill_took:?})");
    assert!(still_shut, "set-up: the gate was open before the calls returned (an event behind it at once: {gate_behind:?})");
    assert!(zeros.to_host().unwrap().iter().all(|x| *x == 0.0), "zeros");
    assert!(refilled.to_host().unwrap().iter().all(|x| *x == 0.0), "fill_zero");
    assert!(DeviceVec::<f32>::zeros(&res, 0).unwrap().is_empty());
}
