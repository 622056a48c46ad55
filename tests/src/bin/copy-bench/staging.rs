//! The staged path's settings and behaviour: sweeps over chunk sizes and thread counts, lone copies
//! with the staging crew asleep, host memory contention, and the staged copies' timelines
//! (the COPY_BENCH_ONLY modes).
use crate::fail;
use crate::measure::{measure, pattern, reps, size_name, MIB};
use crate::native::{Baselines, Native};
use crate::ok;
use cudarc::driver::CudaContext;
use raft::{DeviceResources, DeviceVec, HostStores, PinnedVec, Staging};
use std::sync::Arc;
use std::time::Instant;

/// The kind of host store numbered `k` by the bench's variables: 0 plain, 1 streaming, 2 the
/// default (`Auto`). (Run 78 also tried plain stores with every line demoted to the shared cache,
/// `cldemote`: 1 MiB host to device 0.53x like streaming, 64 MiB 0.60x, 1 GiB 0.51x; run 80
/// streaming only the first round of pieces of an upload, one per slot: 16 MiB 0.60x against
/// 0.68x streaming all, 64 MiB 0.79x like plain; both dropped.)
pub fn stores_of(k: usize) -> HostStores {
    match k {
        0 => HostStores::Plain,
        1 => HostStores::Streaming,
        2 => HostStores::Auto,
        _ => fail(&format!("host stores: 0, 1 or 2, given {k}")),
    }
}

/// Staged copies over chunk sizes and thread counts: which settings the defaults should be.
pub fn sweep(res: &DeviceResources, bytes: usize, b: &Baselines, quick: bool) -> serde_json::Value {
    let (w, r) = reps(bytes, quick);
    // COPY_SWEEP_REPS: more samples per setting (each sample runs every setting once).
    let r = std::env::var("COPY_SWEEP_REPS").map_or(r, |v| v.parse().expect("COPY_SWEEP_REPS"));
    let data = pattern(bytes);
    let mut out = vec![0u8; bytes];
    let mut d = ok("DeviceVec", DeviceVec::<u8>::new(res, bytes));
    let mut rows = Vec::new();
    let mut best: [(f64, usize, usize, usize); 2] = [(0.0, 0, 0, 0); 2];
    eprintln!("  sweep {} ({r} samples, every setting and the native pinned copies in turns):", size_name(bytes));
    // COPY_SWEEP_CHUNKS_MIB, COPY_SWEEP_THREADS, COPY_SWEEP_PIECES (comma lists) change the grid.
    let grid = |name: &str, default: &[usize]| -> Vec<usize> {
        std::env::var(name).ok().map_or_else(|| default.to_vec(), |v| v.split(',').map(|x| x.trim().parse().expect(name)).collect())
    };
    // COPY_SWEEP_CHUNKS_KIB (in KiB) replaces COPY_SWEEP_CHUNKS_MIB; COPY_SWEEP_STORES (a list
    // of 0 plain, 1 streaming, 2 the default) tries the host threads' kinds of store.
    let chunks: Vec<usize> = match std::env::var("COPY_SWEEP_CHUNKS_KIB") {
        Ok(_) => grid("COPY_SWEEP_CHUNKS_KIB", &[]).into_iter().map(|c| c << 10).collect(),
        Err(_) => grid("COPY_SWEEP_CHUNKS_MIB", &[4, 8]).into_iter().map(|c| c * MIB).collect(),
    };
    let (threads_grid, pieces_grid, streaming_grid) =
        (grid("COPY_SWEEP_THREADS", &[8, 12]), grid("COPY_SWEEP_PIECES", &[4, 8]), grid("COPY_SWEEP_STORES", &[2]));
    let settings: Vec<(usize, usize, usize, HostStores)> = chunks
        .iter()
        .flat_map(|&c| threads_grid.iter().map(move |&t| (c, t)))
        .flat_map(|(c, t)| pieces_grid.iter().map(move |&p| (c, t, p)))
        .flat_map(|(c, t, p)| streaming_grid.iter().map(move |&k| (c, t, p, stores_of(k))))
        .collect();
    let stagings: Vec<Staging> = settings
        .iter()
        .map(|&(c, t, p, nt)| {
            ok("Staging::new", Staging::new(c, t).and_then(|s| s.with_pieces_in_flight(p)).map(|s| s.with_host_stores(nt, nt)))
        })
        .collect();
    // The native pinned copies of the same size, measured in the same turns.
    let native = Native::new(res.context(), bytes);
    let time = |f: &mut dyn FnMut()| {
        let s = Instant::now();
        f();
        s.elapsed().as_secs_f64()
    };
    let (mut native_up, mut native_down) = (Vec::new(), Vec::new());
    // The driver's own pageable path (cuMemcpyAsync from / into the Vec), in the same turns.
    let (mut direct_up, mut direct_down) = (Vec::new(), Vec::new());
    let mut ups: Vec<Vec<f64>> = vec![Vec::new(); settings.len()];
    let mut downs: Vec<Vec<f64>> = vec![Vec::new(); settings.len()];
    for rep in 0..w + r {
        let keep = rep >= w;
        let (u, dn) = (time(&mut || native.h2d()), time(&mut || native.d2h()));
        let (du, dd) = (time(&mut || native.h2d_pageable(&data)), time(&mut || native.d2h_pageable(&mut out)));
        if keep {
            native_up.push(u);
            native_down.push(dn);
            direct_up.push(du);
            direct_down.push(dd);
        }
        for (k, s) in stagings.iter().enumerate() {
            let u = time(&mut || ok("staged", staged_up(s, &mut d, &data)));
            let dn = time(&mut || ok("staged", staged_down(s, &d, &mut out)));
            if keep {
                ups[k].push(u);
                downs[k].push(dn);
            }
        }
    }
    let median_gbps = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        bytes as f64 / v[v.len() / 2] / 1e9
    };
    let (nu, nd) = (median_gbps(native_up), median_gbps(native_down));
    eprintln!("    native pinned in these turns: H2D {nu:6.2} GB/s, D2H {nd:6.2} GB/s (separate rows: {:.2}, {:.2})", b.h2d, b.d2h);
    let (pu, pd) = (median_gbps(direct_up), median_gbps(direct_down));
    eprintln!("    the driver's pageable path in these turns: H2D {pu:6.2} GB/s ({:.3}x), D2H {pd:6.2} GB/s ({:.3}x)", pu / nu, pd / nd);
    for (k, &(chunk, threads, pieces, nt)) in settings.iter().enumerate() {
        let (up, down) = (median_gbps(std::mem::take(&mut ups[k])), median_gbps(std::mem::take(&mut downs[k])));
        eprintln!(
            "    {:>5} KiB x {threads} threads x {pieces} in flight{}: H2D {up:6.2} GB/s ({:.3}x), D2H {down:6.2} GB/s ({:.3}x)",
            chunk >> 10,
            match nt {
                HostStores::Plain => ", plain stores",
                HostStores::Streaming => ", streaming stores",
                _ => ", auto",
            },
            up / nu,
            down / nd
        );
        for (i, v) in [up, down].into_iter().enumerate() {
            if v > best[i].0 {
                best[i] = (v, chunk, threads, pieces);
            }
        }
        rows.push(
            serde_json::json!({"chunk_bytes": chunk, "threads": threads, "pieces_in_flight": pieces, "host_stores": format!("{nt:?}"),
            "h2d_gbps": up, "d2h_gbps": down, "h2d_vs_native_pinned_in_turns": up / nu, "d2h_vs_native_pinned_in_turns": down / nd}),
        );
    }
    // What the host alone can feed the staging buffers: `bytes` copied from a pageable Vec into
    // page-locked memory by n threads at once, no device copy (the staged path's supply side).
    let mut pinned = ok("PinnedVec", PinnedVec::<u8>::new(res, bytes));
    let mut host_rates = Vec::new();
    for threads in [1usize, 4, 8, 16] {
        let piece = bytes.div_ceil(threads);
        let stat = measure(w, r, || {
            std::thread::scope(|sc| {
                // SAFETY: only these host threads use `pinned` while the slice lives (no copy).
                for (dst, src) in unsafe { pinned.as_mut_slice() }.chunks_mut(piece).zip(data.chunks(piece)) {
                    sc.spawn(move || dst.copy_from_slice(src));
                }
            })
        });
        let gbps = stat.gbps(bytes);
        eprintln!("    host memcpy into page-locked memory, {threads} threads: {gbps:6.2} GB/s");
        host_rates.push(serde_json::json!({"threads": threads, "gbps": gbps}));
    }
    serde_json::json!({
        "bytes": bytes,
        "host_memcpy_into_pinned": host_rates,
        "rows": rows,
        "driver_pageable_in_turns": {"h2d_gbps": pu, "d2h_gbps": pd},
        "best_h2d": {"gbps": best[0].0, "chunk_bytes": best[0].1, "threads": best[0].2, "pieces_in_flight": best[0].3},
        "best_d2h": {"gbps": best[1].0, "chunk_bytes": best[1].1, "threads": best[1].2, "pieces_in_flight": best[1].3},
    })
}

/// Lone copies: each sample sleeps 5 ms first, so the staging crew has stopped watching (its
/// 1 ms watch) and is asleep, as for a program that copies now and then. Staged (the default
/// `Staging`) against the driver's pageable path, 31 samples each, in turns; medians.
pub fn lone(res: &DeviceResources) {
    for bytes in [512 << 10, MIB, 4 * MIB] {
        let data = pattern(bytes);
        let mut out = vec![0u8; bytes];
        let mut d = ok("DeviceVec", DeviceVec::<u8>::new(res, bytes));
        let native = Native::new(res.context(), bytes);
        let s = Staging::default();
        // Buffers made and pooled once, as after a program's first copy.
        ok("staged", staged_up(&s, &mut d, &data));
        let mut times: [Vec<f64>; 4] = Default::default();
        for _ in 0..31 {
            for (k, time) in times.iter_mut().enumerate() {
                std::thread::sleep(std::time::Duration::from_millis(5));
                let t = Instant::now();
                match k {
                    0 => ok("staged", staged_up(&s, &mut d, &data)),
                    1 => native.h2d_pageable(&data),
                    2 => ok("staged", staged_down(&s, &d, &mut out)),
                    _ => native.d2h_pageable(&mut out),
                }
                time.push(t.elapsed().as_secs_f64() * 1e6);
            }
        }
        let med = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let [su, du, sd, dd] = times.each_mut().map(med);
        eprintln!(
            "lone {}: up staged {su:.1} µs, driver {du:.1} µs ({:.2}x faster); down staged {sd:.1} µs, driver {dd:.1} µs ({:.2}x faster)",
            size_name(bytes),
            du / su,
            dd / sd
        );
    }
}

/// Native pinned H2D / D2H of 64 MiB, 40 samples each, beside 0, 4, 8 and 12 threads that
/// each copy 16 MiB between two pageable buffers of their own in a loop; with the threads'
/// own copy rate meanwhile.
pub fn contention(ctx: &Arc<CudaContext>) {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let bytes = 64 * MIB;
    let native = Native::new(ctx, bytes);
    for n in [0usize, 4, 8, 12] {
        let stop = AtomicBool::new(false);
        let copied = AtomicU64::new(0);
        let (up, down, secs) = std::thread::scope(|sc| {
            for _ in 0..n {
                sc.spawn(|| {
                    let src = pattern(16 * MIB);
                    let mut dst = vec![0u8; 16 * MIB];
                    while !stop.load(Ordering::Relaxed) {
                        dst.copy_from_slice(&src);
                        std::hint::black_box(&mut dst);
                        copied.fetch_add(16 * MIB as u64, Ordering::Relaxed);
                    }
                });
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
            let (c0, t0) = (copied.load(Ordering::Relaxed), Instant::now());
            let up = measure(3, 40, || native.h2d());
            let down = measure(3, 40, || native.d2h());
            let rate = (copied.load(Ordering::Relaxed) - c0) as f64 / t0.elapsed().as_secs_f64() / 1e9;
            stop.store(true, Ordering::Relaxed);
            (up, down, rate)
        });
        eprintln!(
            "  native pinned 64 MiB beside {n:>2} host threads copying: H2D {:6.2} GB/s, D2H {:6.2} GB/s; the threads copy {secs:6.2} GB/s",
            up.gbps(bytes),
            down.gbps(bytes)
        );
    }
}

/// COPY_BENCH_ONLY=trace: the staged copies' timelines, with the native pinned copies beside them.
pub fn trace(res: &DeviceResources, ctx: &Arc<CudaContext>) {
    env_logger::Builder::new().parse_filters("raft::staging=trace").init();
    // COPY_TRACE_KIB: another size; COPY_TRACE_STORES: 0 plain, 1 streaming, 2 the default.
    let bytes = std::env::var("COPY_TRACE_KIB").map_or(64 * MIB, |v| v.parse::<usize>().expect("COPY_TRACE_KIB") << 10);
    let stores = stores_of(std::env::var("COPY_TRACE_STORES").map_or(2, |v| v.parse().expect("COPY_TRACE_STORES")));
    let data = pattern(bytes);
    let mut out = vec![0u8; bytes];
    let mut d = ok("DeviceVec", DeviceVec::<u8>::new(res, bytes));
    let s = Staging::default().with_host_stores(stores, stores);
    let native = Native::new(ctx, bytes);
    let name = size_name(bytes);
    // What asking the machine's parallelism costs here (every staged copy asked until run 76).
    let t = Instant::now();
    for _ in 0..100 {
        std::hint::black_box(std::thread::available_parallelism().ok());
    }
    eprintln!("std::thread::available_parallelism: {:.1} µs a call", t.elapsed().as_secs_f64() * 1e4);
    // The device side alone: the native pinned copy cut into 1, 2, 4, 8 pieces queued back to
    // back (median of 51 each).
    for to_device in [true, false] {
        for pieces in [1usize, 2, 4, 8] {
            let st = measure(5, 51, || native.split(pieces, to_device));
            eprintln!("native pinned {} {name} in {pieces} pieces: {:.1} µs", if to_device { "H2D" } else { "D2H" }, st.median_s * 1e6);
        }
    }
    for _ in 0..6 {
        let t = Instant::now();
        ok("staged", staged_up(&s, &mut d, &data));
        let ours = t.elapsed().as_secs_f64() * 1e6;
        let t = Instant::now();
        native.h2d();
        eprintln!("upload {name}: {ours:.1} µs (native pinned next: {:.1} µs)", t.elapsed().as_secs_f64() * 1e6);
    }
    for _ in 0..6 {
        let t = Instant::now();
        ok("staged", staged_down(&s, &d, &mut out));
        let ours = t.elapsed().as_secs_f64() * 1e6;
        let t = Instant::now();
        native.d2h();
        eprintln!("download {name}: {ours:.1} µs (native pinned next: {:.1} µs)", t.elapsed().as_secs_f64() * 1e6);
    }
}

/// A staged copy of `data` into `d` with `staging`, whatever the size: the process's setting
/// for the one copy (a `Staging` is configuration only, see `docs/API.md`).
pub fn staged_up(staging: &Staging, d: &mut DeviceVec<u8>, data: &[u8]) -> raft::Result<()> {
    with_staging(staging, || d.copy_from_host(data))
}

/// A staged copy of `d` into `out` with `staging` (see [`staged_up`]).
pub fn staged_down(staging: &Staging, d: &DeviceVec<u8>, out: &mut [u8]) -> raft::Result<()> {
    with_staging(staging, || d.copy_to_host(out))
}

fn with_staging<R>(staging: &Staging, copy: impl FnOnce() -> R) -> R {
    let old = Staging::set_current(staging.with_staged_from(0));
    let out = copy();
    Staging::set_current(old);
    out
}
