//! What loading the shim at first use costs (a fresh process each sample) and what a call through
//! the loaded bindings costs against a linked call (issue 14).
use crate::fail;
use crate::measure::{measure, stat_of, Stat};
use crate::table::Table;
use raft_tests::baseline::*;
use std::time::Instant;

/// `raft-bench --shim-load`: a fresh process times its first `raft_sys::shim()` (loading
/// libraftrs_shim.so and the RAPIDS/CUDA libraries it needs) and prints the nanoseconds.
pub fn shim_load_child() -> ! {
    let t0 = Instant::now();
    let loaded = raft_sys::shim().is_ok();
    let ns = t0.elapsed().as_nanos();
    println!("{ns} {loaded}");
    std::process::exit(if loaded { 0 } else { 1 })
}

/// The first call's cost of loading the shim, over `n` fresh processes.
fn shim_load(n: usize) -> Stat {
    let exe = std::env::current_exe().expect("current exe");
    let samples: Vec<f64> = (0..n)
        .filter_map(|_| {
            let out = std::process::Command::new(&exe).arg("--shim-load").output().ok()?;
            let text = String::from_utf8_lossy(&out.stdout);
            let mut parts = text.split_whitespace();
            let ns: f64 = parts.next()?.parse().ok()?;
            (parts.next() == Some("true")).then_some(ns)
        })
        .collect();
    if samples.is_empty() {
        fail("the shim did not load in a child process");
    }
    stat_of(samples)
}

/// The first call's cost and the per-call cost through the loaded bindings.
pub fn rows(t: &mut Table) {
    // Issue 14: the shim is loaded at first use. What that first use costs (a fresh process
    // each sample), and what a call through the loaded bindings costs against a linked call.
    let load = shim_load(10);
    t.report(
        "first call: loading libraftrs_shim.so + RAFT/RMM/CUDA libraries (fresh process each)",
        "raft_sys::shim() first call",
        load,
        vec![],
        "",
        "reported",
    );
    let api = raft_sys::shim().unwrap_or_else(|e| fail(&e.to_string()));
    let through_loaded = measure(1000, 200, 1000, || {
        let mut v = 0;
        // SAFETY: writes one int through a valid pointer.
        std::hint::black_box(unsafe { api.raftrs_runtime_version(&mut v) });
    });
    let through_result = measure(1000, 200, 1000, || {
        std::hint::black_box(raft::runtime_version().ok());
    });
    let linked = measure(1000, 200, 1000, || {
        let mut v = 0;
        // SAFETY: writes one int through a valid pointer.
        std::hint::black_box(unsafe { bl_runtime_version(&mut v) });
    });
    t.report(
        "per call: shim entry point through the loaded bindings vs a linked call (cudaRuntimeGetVersion)",
        "RaftrsShim fn pointer",
        through_loaded,
        vec![("linked C++ call", linked), ("raft::runtime_version (result layer)", through_result)],
        "linked C++ call",
        "reported",
    );
}
