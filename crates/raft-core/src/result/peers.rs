//! Peer access for copies between two devices: the contexts' peer access, once per pair of
//! devices, and each buffer's async pool opened to the other device where the pair can reach
//! each other at all.
use super::bind;
use super::buffer::NativeBuffer;
use crate::error::Error;
use cudarc::driver::{sys as cusys, CudaContext};
use std::sync::Mutex;

/// The pairs of devices looked at, each with whether the two can reach each other's memory.
struct Pairs(Vec<((usize, usize), bool)>);

impl Pairs {
    /// Whether the devices of `pair` (lower first) can reach each other, asking `can` only at
    /// the pair's first look; `first` is called then too, with the answer (to enable access).
    fn look(&mut self, pair: (usize, usize), can: impl FnOnce() -> bool, first: impl FnOnce(bool)) -> bool {
        if let Some((_, can)) = self.0.iter().find(|(p, _)| *p == pair) {
            return *can;
        }
        let answer = can();
        first(answer);
        self.0.push((pair, answer));
        answer
    }
}

/// Lets the two devices of a peer copy reach each other's memory, so that the copy goes over
/// their link (run 24: 37.6 GB/s through the host, against 396 GB/s for the driver's own peer
/// copy with access enabled): peer access between the two primary contexts, once per pair
/// (`cuCtxEnablePeerAccess` both ways, where `cuDeviceCanAccessPeer` allows it), and access for
/// the peer to each buffer's async pool (the shim, once per pool), only for a pair that can
/// reach each other (asked of every pool at every copy before, and refused by the driver each
/// time on a pair that cannot, each refusal a warning: the nineteenth audit). As PyTorch does,
/// on the first peer copy. A failure only costs speed (the driver then stages the copy through
/// the host): it is logged, never returned.
pub(crate) fn enable_peer_access(who: &'static str, a: &NativeBuffer, b: &NativeBuffer) {
    static PAIRS: Mutex<Pairs> = Mutex::new(Pairs(Vec::new()));
    let pair = (a.device.min(b.device), a.device.max(b.device));
    let (ca, cb) = (a.stream.context(), b.stream.context());
    let can = |x: &CudaContext, y: &CudaContext| {
        let mut can = 0i32;
        // SAFETY: writes one int for two valid device handles.
        let rc = unsafe { cusys::cuDeviceCanAccessPeer(&mut can, x.cu_device(), y.cu_device()) };
        rc == cusys::CUresult::CUDA_SUCCESS && can != 0
    };
    // Failures are said once the pairs' lock is let go: a logger that makes a peer copy locked it
    // again on this thread (a deadlock, the twenty-second audit).
    let mut failed = Vec::new();
    let enable = |can: bool| {
        if !can {
            return;
        }
        for (x, y) in [(ca, cb), (cb, ca)] {
            let enabled = bind(who, x).and_then(|()| {
                // SAFETY: `x` is bound to this thread (the caller's guard puts the thread's own
                // context back) and `y` is a live primary context of another device.
                match unsafe { cusys::cuCtxEnablePeerAccess(y.cu_ctx(), 0) } {
                    cusys::CUresult::CUDA_SUCCESS | cusys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => Ok(()),
                    rc => Err(Error::driver(who, cudarc::driver::DriverError(rc))),
                }
            });
            if let Err(e) = enabled {
                failed.push(e);
            }
        }
    };
    let reachable = PAIRS.lock().unwrap_or_else(|e| e.into_inner()).look(pair, || can(ca, cb) && can(cb, ca), enable);
    for e in failed {
        log::warn!(target: "raft", "peer access between devices {} and {} not enabled: {e}", a.device, b.device);
    }
    if !reachable {
        return; // the copy is staged by the driver; no pool access to give
    }
    for (buf, peer) in [(a, b.device), (b, a.device)] {
        if let Err(e) = buf.grant_peer(who, peer) {
            log::warn!(target: "raft", "device {peer} not given access to an array of device {}: {e}", buf.device);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Pairs;
    use std::cell::Cell;

    #[test]
    fn a_pair_that_cannot_reach_each_other_is_asked_once_and_never_granted() {
        let mut pairs = Pairs(Vec::new());
        let (asked, enabled) = (Cell::new(0), Cell::new(0));
        for _ in 0..3 {
            let reachable = pairs.look(
                (0, 1),
                || {
                    asked.set(asked.get() + 1);
                    false
                },
                |can| enabled.set(enabled.get() + usize::from(can)),
            );
            assert!(!reachable, "a pair without peer support is not given pool access");
        }
        assert_eq!((asked.get(), enabled.get()), (1, 0));
        assert!(pairs.look((0, 2), || true, |can| assert!(can)), "another pair is asked on its own");
        assert!(pairs.look((0, 2), || unreachable!("asked once"), |_| unreachable!("enabled once")));
    }
}
