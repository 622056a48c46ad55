//! raft-bench: what this binding adds on top of RAFT, measured side by side with raw C++ RAFT
//! (bench/baseline.cpp, same headers, same process, same clock) and with cudarc.
//!
//! Each case: warm-up, then many samples; a sample times a batch of calls with `Instant` and
//! divides by the batch size; the table shows the median, min and max per call. Prints a
//! Markdown table and writes JSON to the path given as the first argument (default
//! `raft-bench.json`).
//!
//! Each concern measures in its own module, in the order the run has always taken: `shim`
//! (loading), `resources` (scale, create + release, handles), `jobs`, `memory`, `gemm`; `measure`
//! and `table` time and report them.
mod gemm;
mod jobs;
mod measure;
mod memory;
mod resources;
mod shim;
mod table;

use measure::{fmt_ns, measure, measure_turns};
use raft::{current_device_resources, DeviceResources, DeviceVec};
use std::cell::Cell;
use std::ffi::c_void;
use std::hint::black_box;
use std::time::Instant;
use table::Table;

use raft_tests::baseline::*;

fn fail(message: &str) -> ! {
    eprintln!("{message}");
    std::process::exit(2)
}

fn main() {
    if std::env::args().nth(1).as_deref() == Some("--shim-load") {
        shim::shim_load_child();
    }
    let out = std::env::args().nth(1).unwrap_or_else(|| "raft-bench.json".into());
    let mut t = Table { rows: Vec::new(), notes: Vec::new() };
    shim::rows(&mut t);
    match raft::device_count() {
        Ok(n) if n > 0 => eprintln!("raft-bench on {n} device(s)"),
        Ok(_) => fail("raft-bench needs a GPU: no CUDA device"),
        Err(e) => fail(&format!("raft-bench needs a GPU: {e}")),
    }

    // First cuBLAS handle in the process: ours first, so ours pays the library load.
    let r0 = DeviceResources::new().expect("resources");
    let t0 = Instant::now();
    r0.cublas_handle().expect("cublas");
    let process_first = t0.elapsed().as_nanos() as f64;
    t.notes.push(format!("first cuBLAS handle of the process (library load included): {}", fmt_ns(process_first)));
    r0.release().unwrap();

    // Scale first, while the memory pool holds nothing from the other cases: resources alive
    // at once.
    let ctx = r0.context().clone();
    let scale = resources::scale(&ctx);

    let _streams = resources::create_release(&mut t);

    // 2. sync of an empty stream.
    let r = DeviceResources::new().unwrap();
    let stream = r.stream().unwrap();
    // In turns (each turn runs all three), as every goal row with a baseline: measured one
    // after the other, a drift of the machine between them reads as a ratio.
    let [ours, cuda_rt, cudarc_s] = measure_turns(
        1000,
        5000,
        [
            &mut || r.sync().unwrap(),
            // SAFETY: the stream is alive while `stream` is held.
            &mut || assert_eq!(unsafe { bl_stream_sync(stream.cu_stream() as *mut c_void) }, 0),
            &mut || stream.synchronize().unwrap(),
        ],
    );
    let faster = if cuda_rt.median_ns <= cudarc_s.median_ns { "cudaStreamSynchronize" } else { "cudarc synchronize" };
    t.add(
        "sync of an empty stream (in turns)",
        "DeviceResources::sync",
        ours,
        vec![("cudaStreamSynchronize", cuda_rt), ("cudarc synchronize", cudarc_s)],
        faster,
        "<= 1.10x the faster",
        |a, b| a <= 1.10 * b,
    );

    // 3. default lookup, already made.
    current_device_resources(0).unwrap();
    let ours = measure(1000, 2000, 1000, || drop(black_box(current_device_resources(black_box(0)).unwrap())));
    thread_local! { static PLAIN: Cell<u64> = const { Cell::new(7) }; }
    let tls = measure(1000, 2000, 1000, || {
        black_box(PLAIN.with(Cell::get));
    });
    // The floor of an owned handle from a thread-local: one reference count each way (the
    // clone returned, its drop), what `current_device_resources` cannot go below while it
    // returns `DeviceResources` by value (SPEC).
    thread_local! { static HELD: std::sync::Arc<u64> = std::sync::Arc::new(7); }
    let arc_floor = measure(1000, 2000, 1000, || drop(black_box(HELD.with(std::sync::Arc::clone))));
    // SAFETY: a plain C function of the baseline.
    let cpp_floor = measure(1000, 2000, 1000, || assert_eq!(unsafe { bl_tls_shared_ptr_copy() }, 0));
    t.add(
        "default lookup (made already)",
        "current_device_resources(0)",
        ours,
        vec![
            ("thread-local read", tls),
            ("thread-local Arc clone + drop (the floor of an owned handle)", arc_floor),
            ("C++: a thread-local shared_ptr copied out and destroyed (the same floor, in C++)", cpp_floor),
        ],
        "thread-local read",
        "<= 10 ns (issue 30)",
        |a, _| a <= 10.0,
    );

    jobs::rows(&mut t, &r);

    memory::rows(&mut t, &r);

    resources::first_cublas_handle(&mut t);
    resources::with_others_alive(&mut t, &r);

    // 7. cudarc alone.
    let cudarc_new = measure(200, 2000, 1, || drop(ctx.new_stream().unwrap()));
    t.report("cudarc new_stream + drop", "CudaContext::new_stream + drop", cudarc_new, vec![], "", "reported");

    gemm::rows(&mut t, &r, &stream);

    // 9. allocate + copy + free, 1 MiB and 1 GiB.
    for (label, bytes) in [("1 MiB", 1usize << 20), ("1 GiB", 1usize << 30)] {
        let host = vec![1u8; bytes];
        let reps = if bytes > 1 << 24 { 5 } else { 500 };
        let s = measure(2, reps, 1, || drop(DeviceVec::from_host(&r, &host).unwrap()));
        t.report(&format!("allocate + copy in + free, {label}"), "DeviceVec::from_host + drop", s, vec![], "", "reported");
        t.notes.push(format!("{label} from_host: {:.2} GB/s host to device (pageable memory)", bytes as f64 / s.median_ns));
    }
    t.print(&scale);
    let json = serde_json::json!({ "rows": t.rows, "scale": scale, "notes": t.notes });
    std::fs::write(&out, serde_json::to_string_pretty(&json).unwrap()).unwrap();
    eprintln!("wrote {out}");
}
