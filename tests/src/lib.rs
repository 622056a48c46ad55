//! Helpers of the integration tests: GPU gating and child-process scenarios.
use std::io::Write;

/// Whether a GPU is there. Without one, prints a visible skip line (straight to stderr, past
/// the test harness's capture) and returns false; under `RAFT_REQUIRE_GPU=1` it panics instead.
pub fn gpu() -> bool {
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

/// Returns from the test when there is no GPU (see [`gpu`]).
#[macro_export]
macro_rules! require_gpu {
    () => {
        if !$crate::gpu() {
            return;
        }
    };
}
