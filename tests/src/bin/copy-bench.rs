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
use cudarc::driver::{result as cu, sys, CudaContext};
use raft::{gemm, DeviceResources, DeviceVec, HostStores, Layout, PinnedVec, Staging};
use std::ffi::c_void;
use std::sync::Arc;
use std::time::Instant;

const MIB: usize = 1 << 20;

#[derive(Clone, Copy, Debug, serde::Serialize)]
struct Stat {
    median_s: f64,
    min_s: f64,
    max_s: f64,
    repeats: usize,
}

impl Stat {
    fn gbps(&self, bytes: usize) -> f64 {
        bytes as f64 / self.median_s / 1e9
    }
}

/// Times `f` `repeats` times after `warmup` calls.
fn measure(warmup: usize, repeats: usize, mut f: impl FnMut()) -> Stat {
    for _ in 0..warmup {
        f();
    }
    let mut t: Vec<f64> = (0..repeats)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(f64::total_cmp);
    Stat { median_s: t[t.len() / 2], min_s: t[0], max_s: t[t.len() - 1], repeats }
}

/// `a` and `b` measured in turns, a sample of each per round, so both see the same host and
/// device state (a host whose speed drifts between two separate loops moved 1 MiB ratios by
/// ±10% between runs 54 and 58).
fn measure_alternating(warmup: usize, repeats: usize, mut a: impl FnMut(), mut b: impl FnMut()) -> (Stat, Stat) {
    for _ in 0..warmup {
        a();
        b();
    }
    let (mut ta, mut tb) = (Vec::with_capacity(repeats), Vec::with_capacity(repeats));
    for _ in 0..repeats {
        let s = Instant::now();
        a();
        ta.push(s.elapsed().as_secs_f64());
        let s = Instant::now();
        b();
        tb.push(s.elapsed().as_secs_f64());
    }
    let stat = |mut t: Vec<f64>| {
        t.sort_by(f64::total_cmp);
        Stat { median_s: t[t.len() / 2], min_s: t[0], max_s: t[t.len() - 1], repeats }
    };
    (stat(ta), stat(tb))
}

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

#[derive(serde::Serialize)]
struct Row {
    case: String,
    bytes: usize,
    ours: String,
    ours_gbps: f64,
    ours_stat: Stat,
    against: String,
    baseline_gbps: Option<f64>,
    /// ours / baseline, in bandwidth.
    ratio: Option<f64>,
    goal: Option<f64>,
    met: Option<bool>,
}

struct Table {
    rows: Vec<Row>,
    notes: Vec<String>,
}

impl Table {
    #[allow(clippy::too_many_arguments)]
    fn add(&mut self, case: &str, bytes: usize, ours: &str, s: Stat, against: &str, baseline_gbps: Option<f64>, goal: Option<f64>) {
        let ours_gbps = s.gbps(bytes);
        let ratio = baseline_gbps.map(|b| ours_gbps / b);
        let met = goal.and_then(|g| ratio.map(|r| r >= g));
        eprintln!(
            "  {case}: {ours_gbps:.2} GB/s{}",
            ratio.map(|r| format!(" ({r:.3}x {against}{})", goal.map(|g| format!(", goal {g}x")).unwrap_or_default())).unwrap_or_default()
        );
        self.rows.push(Row {
            case: case.into(),
            bytes,
            ours: ours.into(),
            ours_gbps,
            ours_stat: s,
            against: against.into(),
            baseline_gbps,
            ratio,
            goal,
            met,
        });
    }
}

/// The kind of host store numbered `k` by the bench's variables: 0 plain, 1 streaming, 2 the
/// default (`Auto`). (Run 78 also tried plain stores with every line demoted to the shared cache,
/// `cldemote`: 1 MiB host to device 0.53x like streaming, 64 MiB 0.60x, 1 GiB 0.51x; run 80
/// streaming only the first round of pieces of an upload, one per slot: 16 MiB 0.60x against
/// 0.68x streaming all, 64 MiB 0.79x like plain; both dropped.)
fn stores_of(k: usize) -> HostStores {
    match k {
        0 => HostStores::Plain,
        1 => HostStores::Streaming,
        2 => HostStores::Auto,
        _ => fail(&format!("host stores: 0, 1 or 2, given {k}")),
    }
}

fn size_name(bytes: usize) -> String {
    if bytes >= 1 << 30 {
        format!("{} GiB", bytes >> 30)
    } else if bytes >= MIB {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{} KiB", bytes >> 10)
    }
}

fn reps(bytes: usize, quick: bool) -> (usize, usize) {
    let (w, r) = if bytes <= MIB {
        (10, 101)
    } else if bytes <= 64 * MIB {
        (3, 21)
    } else {
        (1, 7)
    };
    // A 1 MiB copy takes microseconds: the quick run keeps all its samples there.
    if quick && bytes > MIB {
        (1, r.min(5))
    } else {
        (w, r)
    }
}

// ---- the native baseline ----------------------------------------------------------------------

/// Page-locked host memory (`cuMemHostAlloc`), device memory (`cuMemAlloc`) and raw non-blocking
/// streams of one device, made and used with the driver API alone.
struct Native {
    ctx: Arc<CudaContext>,
    host: *mut c_void,
    host2: *mut c_void,
    dev: sys::CUdeviceptr,
    dev2: sys::CUdeviceptr,
    s1: sys::CUstream,
    s2: sys::CUstream,
    bytes: usize,
}

impl Native {
    fn new(ctx: &Arc<CudaContext>, bytes: usize) -> Native {
        ok("bind", ctx.bind_to_thread());
        // SAFETY: plain driver allocations on the bound context; each is freed once in Drop.
        unsafe {
            let host = ok("cuMemHostAlloc", cu::malloc_host(bytes, 0));
            let host2 = ok("cuMemHostAlloc", cu::malloc_host(bytes, 0));
            // Touch every page, as a user's data would have.
            std::ptr::write_bytes(host as *mut u8, 0x5a, bytes);
            std::ptr::write_bytes(host2 as *mut u8, 0x33, bytes);
            let dev = ok("cuMemAlloc", cu::malloc_sync(bytes));
            let dev2 = ok("cuMemAlloc", cu::malloc_sync(bytes));
            let s1 = ok("cuStreamCreate", cu::stream::create(cu::stream::StreamKind::NonBlocking));
            let s2 = ok("cuStreamCreate", cu::stream::create(cu::stream::StreamKind::NonBlocking));
            Native { ctx: ctx.clone(), host, host2, dev, dev2, s1, s2, bytes }
        }
    }

    fn h2d(&self) {
        // SAFETY: both ranges hold `bytes` bytes owned by self; synchronised before returning.
        unsafe {
            check("cuMemcpyHtoDAsync", sys::cuMemcpyHtoDAsync_v2(self.dev, self.host, self.bytes, self.s1));
            check("cuStreamSynchronize", sys::cuStreamSynchronize(self.s1));
        }
    }

    /// `h2d` (or `d2h`) as `pieces` copies queued back to back, then one sync: what the device
    /// side of a staged copy cut that way costs at least.
    fn split(&self, pieces: usize, to_device: bool) {
        let each = self.bytes.div_ceil(pieces);
        // SAFETY: every range lies inside the `bytes` bytes of both buffers (owned by self);
        // synchronised before returning.
        unsafe {
            for k in 0..pieces {
                let (at, len) = (k * each, each.min(self.bytes - (k * each).min(self.bytes)));
                let rc = if to_device {
                    sys::cuMemcpyHtoDAsync_v2(self.dev + at as u64, (self.host as *const u8).add(at) as *const c_void, len, self.s1)
                } else {
                    sys::cuMemcpyDtoHAsync_v2((self.host as *mut u8).add(at) as *mut c_void, self.dev + at as u64, len, self.s1)
                };
                check("cuMemcpyAsync", rc);
            }
            check("cuStreamSynchronize", sys::cuStreamSynchronize(self.s1));
        }
    }

    fn d2h(&self) {
        // SAFETY: as for h2d.
        unsafe {
            check("cuMemcpyDtoHAsync", sys::cuMemcpyDtoHAsync_v2(self.host, self.dev, self.bytes, self.s1));
            check("cuStreamSynchronize", sys::cuStreamSynchronize(self.s1));
        }
    }

    /// The driver's own path from pageable memory (what `cudaMemcpyAsync` from a `std::vector`
    /// does): `host` holds at most `bytes` bytes.
    fn h2d_pageable(&self, host: &[u8]) {
        assert!(host.len() <= self.bytes);
        // SAFETY: `host` is borrowed for the call and the copy is synchronised before returning;
        // the device range holds at least its length.
        unsafe {
            check("cuMemcpyHtoDAsync", sys::cuMemcpyHtoDAsync_v2(self.dev, host.as_ptr() as *const c_void, host.len(), self.s1));
            check("cuStreamSynchronize", sys::cuStreamSynchronize(self.s1));
        }
    }

    fn d2h_pageable(&self, host: &mut [u8]) {
        assert!(host.len() <= self.bytes);
        // SAFETY: as for h2d_pageable, `host` borrowed mutably.
        unsafe {
            check("cuMemcpyDtoHAsync", sys::cuMemcpyDtoHAsync_v2(host.as_mut_ptr() as *mut c_void, self.dev, host.len(), self.s1));
            check("cuStreamSynchronize", sys::cuStreamSynchronize(self.s1));
        }
    }

    /// Host to device on one stream while device to host runs on the other.
    fn both(&self) {
        // SAFETY: four disjoint ranges of `bytes` bytes owned by self; both streams synchronised.
        unsafe {
            check("cuMemcpyHtoDAsync", sys::cuMemcpyHtoDAsync_v2(self.dev, self.host, self.bytes, self.s1));
            check("cuMemcpyDtoHAsync", sys::cuMemcpyDtoHAsync_v2(self.host2, self.dev2, self.bytes, self.s2));
            check("cuStreamSynchronize", sys::cuStreamSynchronize(self.s1));
            check("cuStreamSynchronize", sys::cuStreamSynchronize(self.s2));
        }
    }

    fn d2d(&self) {
        // SAFETY: two device ranges of `bytes` bytes owned by self; synchronised.
        unsafe {
            check("cuMemcpyDtoDAsync", sys::cuMemcpyDtoDAsync_v2(self.dev2, self.dev, self.bytes, self.s1));
            check("cuStreamSynchronize", sys::cuStreamSynchronize(self.s1));
        }
    }

    /// A peer copy from this device's memory into `to`'s.
    fn peer(&self, to: &Native) {
        // SAFETY: `bytes` bytes of device memory on each side, each with its own context;
        // synchronised.
        unsafe {
            check("cuMemcpyPeerAsync", sys::cuMemcpyPeerAsync(to.dev, to.ctx.cu_ctx(), self.dev, self.ctx.cu_ctx(), self.bytes, self.s1));
            check("cuStreamSynchronize", sys::cuStreamSynchronize(self.s1));
        }
    }
}

impl Drop for Native {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: each handle was made in `new` and is released once here.
        unsafe {
            let _ = cu::stream::destroy(self.s1);
            let _ = cu::stream::destroy(self.s2);
            let _ = cu::free_sync(self.dev);
            let _ = cu::free_sync(self.dev2);
            let _ = cu::free_host(self.host);
            let _ = cu::free_host(self.host2);
        }
    }
}

// ---- rows ---------------------------------------------------------------------------------------

struct Baselines {
    h2d: f64,
    d2h: f64,
    both: f64,
    d2d: f64,
}

fn native_rows(t: &mut Table, ctx: &Arc<CudaContext>, bytes: usize, quick: bool) -> Baselines {
    let (w, r) = reps(bytes, quick);
    let n = Native::new(ctx, bytes);
    let name = size_name(bytes);
    let h2d = measure(w, r, || n.h2d());
    t.add(&format!("native pinned H2D {name}"), bytes, "cuMemHostAlloc + cuMemcpyHtoDAsync + sync", h2d, "", None, None);
    let d2h = measure(w, r, || n.d2h());
    t.add(&format!("native pinned D2H {name}"), bytes, "cuMemHostAlloc + cuMemcpyDtoHAsync + sync", d2h, "", None, None);
    let both = measure(w, r, || n.both());
    t.add(&format!("native pinned both directions {name}"), 2 * bytes, "H2D and D2H on two streams", both, "", None, None);
    let d2d = measure(w, r, || n.d2d());
    t.add(&format!("native D2D {name}"), bytes, "cuMemcpyDtoDAsync + sync", d2d, "", None, None);
    Baselines { h2d: h2d.gbps(bytes), d2h: d2h.gbps(bytes), both: both.gbps(2 * bytes), d2d: d2d.gbps(bytes) }
}

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i as u32).wrapping_mul(2_654_435_761).wrapping_shr(24) as u8).collect()
}

fn pinned_rows(t: &mut Table, res: &DeviceResources, other: &DeviceResources, bytes: usize, b: &Baselines, quick: bool) {
    let (w, r) = reps(bytes, quick);
    let name = size_name(bytes);
    let data = pattern(bytes);
    let mut pair = Some((ok("PinnedVec", PinnedVec::from_slice(res, &data)), ok("DeviceVec", DeviceVec::<u8>::new(res, bytes))));
    let h2d = measure(w, r, || {
        let (h, d) = pair.take().unwrap();
        pair = Some(ok("copy", ok("copy", res.copy_to_device_async(h, d)).wait()));
    });
    t.add(&format!("pinned H2D {name}"), bytes, "copy_to_device_async + Transfer::wait", h2d, "native pinned", Some(b.h2d), Some(0.95));
    let (h, mut d) = pair.take().unwrap();
    let scoped = measure(w, r, || ok("scope", ok("scope", res.copy_scope(|s| s.to_device(&h, &mut d)))));
    t.add(
        &format!("pinned H2D {name}, scoped"),
        bytes,
        "copy_scope + CopyScope::to_device",
        scoped,
        "native pinned",
        Some(b.h2d),
        Some(0.95),
    );
    let blocking = measure(w, r, || ok("copy", d.copy_from_pinned(&h)));
    t.add(
        &format!("pinned H2D {name}, blocking"),
        bytes,
        "DeviceVec::copy_from_pinned(&pinned)",
        blocking,
        "native pinned",
        Some(b.h2d),
        Some(0.95),
    );
    let mut back = Some((d, h));
    let d2h = measure(w, r, || {
        let (d, h) = back.take().unwrap();
        back = Some(ok("copy", ok("copy", res.copy_to_host_async(d, h)).wait()));
    });
    t.add(&format!("pinned D2H {name}"), bytes, "copy_to_host_async + Transfer::wait", d2h, "native pinned", Some(b.d2h), Some(0.95));
    let (d, mut h) = back.take().unwrap();
    let blocking = measure(w, r, || ok("copy", d.copy_to_pinned(&mut h)));
    t.add(
        &format!("pinned D2H {name}, blocking"),
        bytes,
        "DeviceVec::copy_to_pinned(&mut pinned)",
        blocking,
        "native pinned",
        Some(b.d2h),
        Some(0.95),
    );
    if h.to_vec() != data {
        fail("pinned round trip: wrong data");
    }
    // Both directions at once: host to device on `res`, device to host on `other`.
    // Each copy's device array belongs to the resources that run it: no stream waits for the
    // other's copy.
    drop(d);
    let mut up = Some((h, ok("DeviceVec", DeviceVec::<u8>::new(res, bytes))));
    let mut down = Some((ok("DeviceVec", DeviceVec::<u8>::zeros(other, bytes)), ok("PinnedVec", PinnedVec::<u8>::new(other, bytes))));
    let both = measure(w, r, || {
        let (h, d_up) = up.take().unwrap();
        let (d_down, h_down) = down.take().unwrap();
        let a = ok("copy", res.copy_to_device_async(h, d_up));
        let c = ok("copy", other.copy_to_host_async(d_down, h_down));
        up = Some(ok("wait", a.wait()));
        down = Some(ok("wait", c.wait()));
    });
    t.add(
        &format!("pinned both directions {name}"),
        2 * bytes,
        "copy_to_device_async on A + copy_to_host_async on B",
        both,
        "native pinned",
        Some(b.both),
        Some(0.95),
    );
}

fn pageable_rows(t: &mut Table, ctx: &Arc<CudaContext>, res: &DeviceResources, bytes: usize, b: &Baselines, quick: bool) {
    let (w, r) = reps(bytes, quick);
    let name = size_name(bytes);
    let data = pattern(bytes);
    let native = Native::new(ctx, bytes);
    let mut d = ok("DeviceVec", DeviceVec::<u8>::new(res, bytes));
    let staging = Staging::default();
    let staged_what =
        format!("{} MiB, {} threads, {} in flight", staging.chunk_bytes() >> 20, staging.threads(), staging.pieces_in_flight());
    let auto = if bytes >= DeviceVec::<u8>::STAGED_FROM_BYTES { "staged" } else { "direct below the staging threshold" };

    // Host to device. The native rows: the driver's pageable path, as C++ cudaMemcpyAsync from a
    // std::vector (the figure a user would otherwise get), on a raw stream.
    let native_h2d = measure(w, r, || native.h2d_pageable(&data));
    t.add(&format!("native pageable H2D {name}"), bytes, "cuMemcpyHtoDAsync from a Vec + sync", native_h2d, "", None, None);
    // The goal rows in turns with the native pinned copy (drift between rows measured apart
    // moved identical paths by 0.09x at 1 GiB in run 68).
    let (pinned, staged) = measure_alternating(w, r, || native.h2d(), || ok("staged", staging.copy_from_host(&mut d, &data)));
    t.add(
        &format!("pageable H2D {name}, staged"),
        bytes,
        &format!("Staging::copy_from_host ({staged_what})"),
        staged,
        &format!("native pinned in turns (separate row: {:.2})", b.h2d),
        Some(pinned.gbps(bytes)),
        Some(0.80),
    );
    let copy = measure(w, r, || ok("copy_from_host", d.copy_from_host(&data)));
    t.add(
        &format!("pageable H2D {name}, DeviceVec::copy_from_host"),
        bytes,
        &format!("DeviceVec::copy_from_host(&vec) ({auto})"),
        copy,
        "native pinned",
        Some(b.h2d),
        None,
    );
    let new = measure(w, r, || drop(ok("from_host", DeviceVec::from_host(res, &data))));
    t.add(
        &format!("pageable H2D {name}, DeviceVec::from_host"),
        bytes,
        &format!("DeviceVec::from_host ({auto}, allocation included)"),
        new,
        "native pinned",
        Some(b.h2d),
        None,
    );
    t.notes.push(format!(
        "pageable H2D {name}: DeviceVec::copy_from_host {:.2} GB/s against the driver's pageable path {:.2} GB/s ({:.2}x)",
        copy.gbps(bytes),
        native_h2d.gbps(bytes),
        copy.gbps(bytes) / native_h2d.gbps(bytes)
    ));

    // Device to host: into a Vec already touched (reused), and into a fresh one.
    let mut out = vec![0u8; bytes];
    let native_d2h = measure(w, r, || native.d2h_pageable(&mut out));
    t.add(&format!("native pageable D2H {name}"), bytes, "cuMemcpyDtoHAsync into a touched Vec + sync", native_d2h, "", None, None);
    let native_fresh = measure(w, r, || {
        let mut fresh = vec![0u8; bytes];
        native.d2h_pageable(&mut fresh);
    });
    t.add(&format!("native pageable D2H {name}, fresh Vec"), bytes, "vec![0; n] + cuMemcpyDtoHAsync + sync", native_fresh, "", None, None);
    let (pinned, staged) = measure_alternating(w, r, || native.d2h(), || ok("staged", staging.copy_to_host(&d, &mut out)));
    t.add(
        &format!("pageable D2H {name}, staged"),
        bytes,
        &format!("Staging::copy_to_host ({staged_what}, touched Vec)"),
        staged,
        &format!("native pinned in turns (separate row: {:.2})", b.d2h),
        Some(pinned.gbps(bytes)),
        Some(0.80),
    );
    if out != data {
        fail("staged round trip: wrong data");
    }
    let copy = measure(w, r, || ok("copy_to_host", d.copy_to_host(&mut out)));
    t.add(
        &format!("pageable D2H {name}, DeviceVec::copy_to_host"),
        bytes,
        &format!("DeviceVec::copy_to_host(&mut vec) ({auto}, touched Vec)"),
        copy,
        "native pinned",
        Some(b.d2h),
        None,
    );
    let fresh = measure(w, r, || drop(ok("to_host", d.to_host())));
    t.add(
        &format!("pageable D2H {name}, DeviceVec::to_host"),
        bytes,
        &format!("DeviceVec::to_host ({auto}, fresh Vec)"),
        fresh,
        "native fresh Vec",
        Some(native_fresh.gbps(bytes)),
        None,
    );
    if d.to_host().map(|v| v != data).unwrap_or(true) {
        fail("to_host: wrong data");
    }
    t.notes.push(format!(
        "pageable D2H {name}: DeviceVec::to_host {:.2} GB/s against vec![0; n] + the driver's pageable path {:.2} GB/s ({:.2}x); copy_to_host into a touched Vec {:.2} against {:.2} GB/s",
        fresh.gbps(bytes),
        native_fresh.gbps(bytes),
        fresh.gbps(bytes) / native_fresh.gbps(bytes),
        copy.gbps(bytes),
        native_d2h.gbps(bytes)
    ));
}

/// Staged copies over chunk sizes and thread counts: which settings the defaults should be.
fn sweep(res: &DeviceResources, bytes: usize, b: &Baselines, quick: bool) -> serde_json::Value {
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
            let u = time(&mut || ok("staged", s.copy_from_host(&mut d, &data)));
            let dn = time(&mut || ok("staged", s.copy_to_host(&d, &mut out)));
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
fn lone(res: &DeviceResources) {
    for bytes in [512 << 10, MIB, 4 * MIB] {
        let data = pattern(bytes);
        let mut out = vec![0u8; bytes];
        let mut d = ok("DeviceVec", DeviceVec::<u8>::new(res, bytes));
        let native = Native::new(res.context(), bytes);
        let s = Staging::default();
        // Buffers made and pooled once, as after a program's first copy.
        ok("staged", s.copy_from_host(&mut d, &data));
        let mut times: [Vec<f64>; 4] = Default::default();
        for _ in 0..31 {
            for (k, time) in times.iter_mut().enumerate() {
                std::thread::sleep(std::time::Duration::from_millis(5));
                let t = Instant::now();
                match k {
                    0 => ok("staged", s.copy_from_host(&mut d, &data)),
                    1 => native.h2d_pageable(&data),
                    2 => ok("staged", s.copy_to_host(&d, &mut out)),
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
fn contention(ctx: &Arc<CudaContext>) {
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

fn d2d_rows(t: &mut Table, res: &DeviceResources, bytes: usize, b: &Baselines, quick: bool) {
    let (w, r) = reps(bytes, quick);
    let name = size_name(bytes);
    let src = ok("DeviceVec", DeviceVec::<u8>::zeros(res, bytes));
    let mut dst = ok("DeviceVec", DeviceVec::<u8>::new(res, bytes));
    // Against the native copy measured in turns with ours (the separate native row above was
    // measured earlier in the run).
    let n = Native::new(res.context(), bytes);
    let (native, queued) = measure_alternating(
        w,
        r,
        || n.d2d(),
        || {
            ok("copy", dst.copy_from_device(&src));
            ok("sync", res.sync());
        },
    );
    let against = format!("native D2D in turns (separate row: {:.2})", b.d2d);
    t.add(&format!("D2D {name}"), bytes, "DeviceVec::copy_from_device + sync", queued, &against, Some(native.gbps(bytes)), Some(0.95));
    let mut pair = Some((src, dst));
    let (native, owned) = measure_alternating(
        w,
        r,
        || n.d2d(),
        || {
            let (s, d) = pair.take().unwrap();
            pair = Some(ok("copy", ok("copy", res.copy_device_async(s, d)).wait()));
        },
    );
    t.add(
        &format!("D2D {name}, owned"),
        bytes,
        "copy_device_async + Transfer::wait",
        owned,
        &against,
        Some(native.gbps(bytes)),
        Some(0.95),
    );
}

fn peer_rows(t: &mut Table, quick: bool) -> serde_json::Value {
    let count = raft::device_count().unwrap_or(0);
    if count < 2 {
        t.notes.push(format!("peer copies: SKIP ({count} GPU)"));
        return serde_json::json!({"skipped": format!("{count} GPU")});
    }
    let bytes = if quick { 64 * MIB } else { 1 << 30 };
    let (w, r) = reps(bytes, quick);
    let (c0, c1) = (ok("ctx", CudaContext::new(0)), ok("ctx", CudaContext::new(1)));
    let mut can = 0;
    // SAFETY: writes one int; both devices exist.
    check("cuDeviceCanAccessPeer", unsafe { sys::cuDeviceCanAccessPeer(&mut can, c0.cu_device(), c1.cu_device()) });
    let (r0, r1) = (ok("resources", DeviceResources::on_device(0)), ok("resources", DeviceResources::on_device(1)));
    let (n0, n1) = (Native::new(&c0, bytes), Native::new(&c1, bytes));
    let src = ok("DeviceVec", DeviceVec::<u8>::zeros(&r0, bytes));
    let mut dst = ok("DeviceVec", DeviceVec::<u8>::new(&r1, bytes));
    let mut run = |t: &mut Table, label: &str| {
        ok("bind", c0.bind_to_thread());
        let native_stat = measure(w, r, || n0.peer(&n1));
        let native = native_stat.gbps(bytes);
        t.add(&format!("native peer 0->1 {}{label}", size_name(bytes)), bytes, "cuMemcpyPeerAsync + sync", native_stat, "", None, None);
        let ours = measure(w, r, || {
            ok("copy", dst.copy_from_device(&src));
            ok("sync", r1.sync());
        });
        t.add(
            &format!("peer 0->1 {}{label}", size_name(bytes)),
            bytes,
            "DeviceVec::copy_from_device + sync",
            ours,
            "native peer",
            Some(native),
            Some(0.95),
        );
        native
    };
    let without = run(t, " (peer access not enabled)");
    let mut enabled = false;
    if can != 0 {
        // SAFETY: enables access between two live primary contexts; "already enabled" is fine.
        unsafe {
            ok("bind", c0.bind_to_thread());
            let a = sys::cuCtxEnablePeerAccess(c1.cu_ctx(), 0);
            ok("bind", c1.bind_to_thread());
            let b = sys::cuCtxEnablePeerAccess(c0.cu_ctx(), 0);
            enabled =
                [a, b].iter().all(|r| *r == sys::CUresult::CUDA_SUCCESS || *r == sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
        }
    }
    let with = if enabled { Some(run(t, " (peer access enabled)")) } else { None };
    serde_json::json!({"can_access_peer": can != 0, "native_gbps_without_access": without, "native_gbps_with_access": with})
}

/// A GEMM on resources A while host-to-device copies run on resources B: each alone, then both.
fn overlap(t: &mut Table, quick: bool) -> serde_json::Value {
    let (a, b) = (ok("resources", DeviceResources::new()), ok("resources", DeviceResources::new()));
    let n = if quick { 4096 } else { 8192 };
    let bytes = if quick { 256 * MIB } else { 1 << 30 };
    let copies = if quick { 1 } else { 2 };
    let (w, r) = (1, if quick { 3 } else { 7 });
    let x = ok("DeviceVec", DeviceVec::from_host(&a, &vec![1.0f32; n * n]));
    let y = ok("DeviceVec", DeviceVec::from_host(&a, &vec![0.5f32; n * n]));
    let mut z = ok("DeviceVec", DeviceVec::<f32>::zeros(&a, n * n));
    let run_gemm = |z: &mut DeviceVec<f32>| {
        ok(
            "gemm",
            gemm(
                1.0,
                ok("view", x.matrix(n, n, Layout::RowMajor)),
                ok("view", y.matrix(n, n, Layout::RowMajor)),
                0.0,
                ok("view", z.matrix_mut(n, n, Layout::RowMajor)),
            ),
        )
    };
    let host = ok("PinnedVec", PinnedVec::from_slice(&b, &pattern(bytes)));
    // One destination per copy: what a scoped copy writes stays borrowed until the scope ends.
    let mut devs: Vec<DeviceVec<u8>> = (0..copies).map(|_| ok("DeviceVec", DeviceVec::<u8>::new(&b, bytes))).collect();
    let gemm_alone = measure(w, r, || {
        run_gemm(&mut z);
        ok("sync", a.sync());
    });
    let copy_alone = measure(w, r, || {
        ok(
            "scope",
            ok(
                "scope",
                b.copy_scope(|s| {
                    for dev in devs.iter_mut() {
                        s.to_device(&host, dev)?;
                    }
                    Ok::<_, raft::Error>(())
                }),
            ),
        )
    });
    let both = measure(w, r, || {
        ok(
            "scope",
            ok(
                "scope",
                b.copy_scope(|s| {
                    for dev in devs.iter_mut() {
                        s.to_device(&host, dev)?;
                    }
                    run_gemm(&mut z);
                    a.sync()
                }),
            ),
        )
    });
    let (g, c, tb) = (gemm_alone.median_s, copy_alone.median_s, both.median_s);
    let overlap = ((g + c - tb) / g.min(c)).clamp(0.0, 1.0);
    let copied = bytes * copies;
    t.add(&format!("overlap: {} H2D on B alone", size_name(copied)), copied, "copy_scope on resources B", copy_alone, "", None, None);
    t.add(&format!("overlap: {} H2D on B beside a {n}³ SGEMM on A", size_name(copied)), copied, "both, wall time", both, "", None, None);
    t.notes.push(format!(
        "overlap: SGEMM {n}³ on A alone {:.2} ms, {} H2D on B alone {:.2} ms, sum {:.2} ms, both together {:.2} ms: {:.0}% of the shorter hidden",
        g * 1e3,
        size_name(copied),
        c * 1e3,
        (g + c) * 1e3,
        tb * 1e3,
        overlap * 100.0
    ));
    serde_json::json!({"gemm_n": n, "copy_bytes": copied, "gemm_alone": gemm_alone, "copy_alone": copy_alone, "both": both,
        "sum_s": g + c, "overlap_fraction_of_shorter": overlap})
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
        env_logger::Builder::new().parse_filters("raft::staging=trace").init();
        // COPY_TRACE_KIB: another size; COPY_TRACE_STORES: 0 plain, 1 streaming, 2 the default.
        let bytes = std::env::var("COPY_TRACE_KIB").map_or(64 * MIB, |v| v.parse::<usize>().expect("COPY_TRACE_KIB") << 10);
        let stores = stores_of(std::env::var("COPY_TRACE_STORES").map_or(2, |v| v.parse().expect("COPY_TRACE_STORES")));
        let data = pattern(bytes);
        let mut out = vec![0u8; bytes];
        let mut d = ok("DeviceVec", DeviceVec::<u8>::new(&res, bytes));
        let s = Staging::default().with_host_stores(stores, stores);
        let native = Native::new(&ctx, bytes);
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
            ok("staged", s.copy_from_host(&mut d, &data));
            let ours = t.elapsed().as_secs_f64() * 1e6;
            let t = Instant::now();
            native.h2d();
            eprintln!("upload {name}: {ours:.1} µs (native pinned next: {:.1} µs)", t.elapsed().as_secs_f64() * 1e6);
        }
        for _ in 0..6 {
            let t = Instant::now();
            ok("staged", s.copy_to_host(&d, &mut out));
            let ours = t.elapsed().as_secs_f64() * 1e6;
            let t = Instant::now();
            native.d2h();
            eprintln!("download {name}: {ours:.1} µs (native pinned next: {:.1} µs)", t.elapsed().as_secs_f64() * 1e6);
        }
        return;
    }
    // COPY_BENCH_ONLY=lone: copies with the staging crew asleep (5 ms apart, past its 1 ms
    // watch), staged against the driver's pageable path, at the sizes near the staging threshold.
    if std::env::var("COPY_BENCH_ONLY").as_deref() == Ok("lone") {
        lone(&res);
        return;
    }
    // COPY_BENCH_ONLY=contention: the native pinned copies of 64 MiB while n host threads copy
    // between pageable buffers of their own (the staged path's kind of host traffic): does
    // host memory traffic slow the link?
    if std::env::var("COPY_BENCH_ONLY").as_deref() == Ok("contention") {
        contention(&ctx);
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
        let b = native_rows(&mut t, &ctx, bytes, false);
        eprintln!("native pinned {}: H2D {:.2} GB/s, D2H {:.2} GB/s", size_name(bytes), b.h2d, b.d2h);
        sweep(&res, bytes, &b, false);
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
        let b = native_rows(&mut t, &ctx, bytes, quick);
        pinned_rows(&mut t, &res, &other, bytes, &b, quick);
        pageable_rows(&mut t, &ctx, &res, bytes, &b, quick);
        d2d_rows(&mut t, &res, bytes, &b, quick);
        if bytes >= 64 * MIB {
            sweeps.push(sweep(&res, bytes, &b, quick));
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
    let peer = peer_rows(&mut t, quick);
    let overlap = if peer_only {
        serde_json::Value::Null
    } else {
        eprintln!("overlap:");
        overlap(&mut t, quick)
    };

    println!("| case | ours | GB/s [min, max] | vs | ratio | goal | met |");
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    for r in &t.rows {
        let s = &r.ours_stat;
        let (lo, hi) = (r.bytes as f64 / s.max_s / 1e9, r.bytes as f64 / s.min_s / 1e9);
        println!(
            "| {} | {} | {:.2} [{lo:.2}, {hi:.2}] | {} | {} | {} | {} |",
            r.case,
            r.ours,
            r.ours_gbps,
            if r.against.is_empty() { "—".into() } else { format!("{} {:.2}", r.against, r.baseline_gbps.unwrap_or(f64::NAN)) },
            r.ratio.map(|x| format!("{x:.3}x")).unwrap_or_else(|| "—".into()),
            r.goal.map(|g| format!("≥ {g}x")).unwrap_or_else(|| "reported".into()),
            r.met.map(|m| if m { "yes" } else { "**no**" }).unwrap_or("—"),
        );
    }
    println!();
    for n in &t.notes {
        println!("- {n}");
    }
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
