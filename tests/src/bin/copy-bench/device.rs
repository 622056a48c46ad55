//! Copies that stay on devices (device to device, peer between two GPUs) and a copy overlapping a
//! GEMM on other resources.
use crate::measure::{measure, measure_alternating, pattern, reps, size_name, MIB};
use crate::native::{Baselines, Native};
use crate::table::Table;
use crate::{check, ok};
use cudarc::driver::{sys, CudaContext};
use raft::{gemm, DeviceResources, DeviceVec, Layout, PinnedVec};

pub fn d2d_rows(t: &mut Table, res: &DeviceResources, bytes: usize, b: &Baselines, quick: bool) {
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
            pair = Some(ok("copy", ok("copy", res.transfer_device_to_device(s, d)).wait()));
        },
    );
    t.add(
        &format!("D2D {name}, owned"),
        bytes,
        "transfer_device_to_device + Transfer::wait",
        owned,
        &against,
        Some(native.gbps(bytes)),
        Some(0.95),
    );
}

pub fn peer_rows(t: &mut Table, quick: bool) -> serde_json::Value {
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
pub fn overlap(t: &mut Table, quick: bool) -> serde_json::Value {
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
            b.copy_scope(|s| {
                for dev in devs.iter_mut() {
                    s.to_device(&host, dev)?;
                }
                Ok(())
            }),
        )
    });
    let both = measure(w, r, || {
        ok(
            "scope",
            b.copy_scope(|s| {
                for dev in devs.iter_mut() {
                    s.to_device(&host, dev)?;
                }
                run_gemm(&mut z);
                a.sync()
            }),
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
