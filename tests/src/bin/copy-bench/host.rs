//! Copies between host and device memory: page-locked (async, scoped, blocking, both directions
//! at once) and pageable (staged, and DeviceVec's own copies), against the native baseline.
use crate::measure::{measure, measure_alternating, pattern, reps, size_name};
use crate::native::{Baselines, Native};
use crate::table::Table;
use crate::{fail, ok};
use cudarc::driver::CudaContext;
use raft::{DeviceResources, DeviceVec, PinnedVec, Staging};
use std::sync::Arc;

pub fn pinned_rows(t: &mut Table, res: &DeviceResources, other: &DeviceResources, bytes: usize, b: &Baselines, quick: bool) {
    let (w, r) = reps(bytes, quick);
    let name = size_name(bytes);
    let data = pattern(bytes);
    let mut pair = Some((ok("PinnedVec", PinnedVec::from_slice(res, &data)), ok("DeviceVec", DeviceVec::<u8>::new(res, bytes))));
    let h2d = measure(w, r, || {
        let (h, d) = pair.take().unwrap();
        pair = Some(ok("copy", ok("copy", res.transfer_to_device(h, d)).wait()));
    });
    t.add(&format!("pinned H2D {name}"), bytes, "transfer_to_device + Transfer::wait", h2d, "native pinned", Some(b.h2d), Some(0.95));
    let (h, mut d) = pair.take().unwrap();
    let scoped = measure(w, r, || ok("scope", res.copy_scope(|s| s.to_device(&h, &mut d))));
    t.add(
        &format!("pinned H2D {name}, scoped"),
        bytes,
        "copy_scope + CopyScope::to_device",
        scoped,
        "native pinned",
        Some(b.h2d),
        Some(0.95),
    );
    let blocking = measure(w, r, || ok("copy", d.copy_from_host(&h)));
    t.add(
        &format!("pinned H2D {name}, blocking"),
        bytes,
        "DeviceVec::copy_from_host(&pinned)",
        blocking,
        "native pinned",
        Some(b.h2d),
        Some(0.95),
    );
    let mut back = Some((d, h));
    let d2h = measure(w, r, || {
        let (d, h) = back.take().unwrap();
        back = Some(ok("copy", ok("copy", res.transfer_to_host(d, h)).wait()));
    });
    t.add(&format!("pinned D2H {name}"), bytes, "transfer_to_host + Transfer::wait", d2h, "native pinned", Some(b.d2h), Some(0.95));
    let (d, mut h) = back.take().unwrap();
    let blocking = measure(w, r, || ok("copy", d.copy_to_host(&mut h)));
    t.add(
        &format!("pinned D2H {name}, blocking"),
        bytes,
        "DeviceVec::copy_to_host(&mut pinned)",
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
        let a = ok("copy", res.transfer_to_device(h, d_up));
        let c = ok("copy", other.transfer_to_host(d_down, h_down));
        up = Some(ok("wait", a.wait()));
        down = Some(ok("wait", c.wait()));
    });
    t.add(
        &format!("pinned both directions {name}"),
        2 * bytes,
        "transfer_to_device on A + transfer_to_host on B",
        both,
        "native pinned",
        Some(b.both),
        Some(0.95),
    );
}

pub fn pageable_rows(t: &mut Table, ctx: &Arc<CudaContext>, res: &DeviceResources, bytes: usize, b: &Baselines, quick: bool) {
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
    let (pinned, staged) = measure_alternating(w, r, || native.h2d(), || ok("staged", crate::staging::staged_up(&staging, &mut d, &data)));
    t.add(
        &format!("pageable H2D {name}, staged"),
        bytes,
        &format!("DeviceVec::copy_from_host, staged ({staged_what})"),
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
    let (pinned, staged) = measure_alternating(w, r, || native.d2h(), || ok("staged", crate::staging::staged_down(&staging, &d, &mut out)));
    t.add(
        &format!("pageable D2H {name}, staged"),
        bytes,
        &format!("DeviceVec::copy_to_host, staged ({staged_what}, touched Vec)"),
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
