//! copy-bench: host and device copies at the speed of the link (issue 16), side by side with a
//! native baseline in the same process.
//!
//! The baseline is written against the CUDA driver API through cudarc's raw bindings: page-locked
//! memory from `cuMemHostAlloc`, device memory from `cuMemAlloc`, `cuMemcpyHtoDAsync` /
//! `cuMemcpyDtoHAsync` / `cuMemcpyDtoDAsync` / `cuMemcpyPeerAsync` on a raw non-blocking stream,
//! then `cuStreamSynchronize`. That is what C++ `cudaMemcpyAsync` from `cudaHostAlloc`'d memory
//! does under the runtime: an equally native baseline, and the link limit as measured.
//!
//! Each row: warm-up, then repeats of one whole copy (queue + wait), timed with `Instant`; the
//! median (and min, max) in GB/s (10^9 bytes per second, bytes copied once). Prints a Markdown
//! table and writes JSON to the path given as the first argument (default `copy-bench.json`).
//! `COPY_BENCH_QUICK=1` runs fewer repeats and no 1 GiB rows (a smoke run).
//!
//! Each kind of copy measures in its own module: `native` (the baseline), `host`, `device`,
//! `staging` (the sweep and the COPY_BENCH_ONLY modes); `measure` and `table` time and report.
mod device;
mod host;
mod measure;
mod native;
mod staging;
mod table;

use cudarc::driver::sys;
use measure::{size_name, MIB};
use raft::{DeviceResources, Staging};
use table::Table;

fn fail(message: &str) -> ! {
    eprintln!("copy-bench: {message}");
    std::process::exit(2)
}

fn ok<T, E: std::fmt::Display>(what: &str, r: Result<T, E>) -> T {
    r.unwrap_or_else(|e| fail(&format!("{what}: {e}")))
}

fn check(what: &str, r: sys::CUresult) {
    if r != sys::CUresult::CUDA_SUCCESS {
        fail(&format!("{what}: {r:?}"));
    }
}

fn main() {
    let out = std::env::args().nth(1).unwrap_or_else(|| "copy-bench.json".into());
    let quick = std::env::var("COPY_BENCH_QUICK").as_deref() == Ok("1");
    match raft::device_count() {
        Ok(n) if n > 0 => {}
        Ok(_) => fail("needs a GPU: no CUDA device"),
        Err(e) => fail(&format!("needs a GPU: {e}")),
    }
    let res = ok("resources", DeviceResources::on_device(0));
    let ctx = res.context().clone();
    // COPY_BENCH_ONLY=trace: the staged copies' timelines (64 MiB each way, the defaults), as
    // `raft::staging` traces them, and nothing else.
    if std::env::var("COPY_BENCH_ONLY").as_deref() == Ok("trace") {
        staging::trace(&res, &ctx);
        return;
    }
    // COPY_BENCH_ONLY=lone: copies with the staging crew asleep (5 ms apart, past its 1 ms
    // watch), staged against the driver's pageable path, at the sizes near the staging threshold.
    if std::env::var("COPY_BENCH_ONLY").as_deref() == Ok("lone") {
        staging::lone(&res);
        return;
    }
    // COPY_BENCH_ONLY=contention: the native pinned copies of 64 MiB while n host threads copy
    // between pageable buffers of their own (the staged path's kind of host traffic): does
    // host memory traffic slow the link?
    if std::env::var("COPY_BENCH_ONLY").as_deref() == Ok("contention") {
        staging::contention(&ctx);
        return;
    }
    // COPY_BENCH_ONLY=sweep: the staged sweep alone at COPY_SWEEP_BYTES_MIB (64 by default),
    // full repetitions, against the native pinned copies measured in the same run.
    if std::env::var("COPY_BENCH_ONLY").as_deref() == Ok("sweep") {
        // COPY_SWEEP_BYTES_KIB: a size in KiB instead.
        let bytes = match std::env::var("COPY_SWEEP_BYTES_KIB") {
            Ok(v) => v.parse::<usize>().expect("COPY_SWEEP_BYTES_KIB") << 10,
            Err(_) => std::env::var("COPY_SWEEP_BYTES_MIB").map_or(64, |v| v.parse().expect("COPY_SWEEP_BYTES_MIB")) * MIB,
        };
        let mut t = Table { rows: Vec::new(), notes: Vec::new() };
        let b = native::native_rows(&mut t, &ctx, bytes, false);
        eprintln!("native pinned {}: H2D {:.2} GB/s, D2H {:.2} GB/s", size_name(bytes), b.h2d, b.d2h);
        staging::sweep(&res, bytes, &b, false);
        return;
    }
    let other = ok("resources", DeviceResources::on_device(0));
    let mut t = Table { rows: Vec::new(), notes: Vec::new() };
    // COPY_BENCH_ONLY=peer: the peer rows alone (for a two-GPU machine's short call).
    let peer_only = std::env::var("COPY_BENCH_ONLY").as_deref() == Ok("peer");
    let sizes: Vec<usize> = if peer_only {
        vec![]
    } else if quick {
        vec![MIB, 64 * MIB]
    } else {
        vec![MIB, 64 * MIB, 1 << 30]
    };
    let mut sweeps = Vec::new();
    for &bytes in &sizes {
        eprintln!("{}:", size_name(bytes));
        let b = native::native_rows(&mut t, &ctx, bytes, quick);
        host::pinned_rows(&mut t, &res, &other, bytes, &b, quick);
        host::pageable_rows(&mut t, &ctx, &res, bytes, &b, quick);
        device::d2d_rows(&mut t, &res, bytes, &b, quick);
        if bytes >= 64 * MIB {
            sweeps.push(staging::sweep(&res, bytes, &b, quick));
        }
        t.notes.push(format!(
            "link as measured ({}): native pinned H2D {:.2} GB/s, D2H {:.2} GB/s, both at once {:.2} GB/s",
            size_name(bytes),
            b.h2d,
            b.d2h,
            b.both
        ));
    }
    eprintln!("peer:");
    let peer = device::peer_rows(&mut t, quick);
    let overlap = if peer_only {
        serde_json::Value::Null
    } else {
        eprintln!("overlap:");
        device::overlap(&mut t, quick)
    };

    t.print();
    let name = ctx.name().unwrap_or_default();
    let json = serde_json::json!({
        "device": name,
        "driver_version": raft::driver_version().ok(),
        "runtime_version": raft::runtime_version().ok(),
        "baseline": "driver API through cudarc: cuMemHostAlloc + cuMemcpy{HtoD,DtoH,DtoD,Peer}Async on a raw non-blocking stream + cuStreamSynchronize",
        "host_threads": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "staging_default": {"chunk_bytes": Staging::default().chunk_bytes(), "threads": Staging::default().threads()},
        "rows": t.rows,
        "notes": t.notes,
        "staging_sweeps": sweeps,
        "peer": peer,
        "overlap": overlap,
    });
    ok("write json", std::fs::write(&out, serde_json::to_string_pretty(&json).unwrap()));
    eprintln!("wrote {out}");
}
