//! The native baseline: the same copies written against the CUDA driver API alone (page-locked
//! memory, raw non-blocking streams), and its rows, which every goal row is measured against.
use crate::measure::{measure, reps, size_name};
use crate::table::Table;
use crate::{check, ok};
use cudarc::driver::{result as cu, sys, CudaContext};
use std::ffi::c_void;
use std::sync::Arc;

/// Page-locked host memory (`cuMemHostAlloc`), device memory (`cuMemAlloc`) and raw non-blocking
/// streams of one device, made and used with the driver API alone.
pub struct Native {
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
    pub fn new(ctx: &Arc<CudaContext>, bytes: usize) -> Native {
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

    pub fn h2d(&self) {
        // SAFETY: both ranges hold `bytes` bytes owned by self; synchronised before returning.
        unsafe {
            check("cuMemcpyHtoDAsync", sys::cuMemcpyHtoDAsync_v2(self.dev, self.host, self.bytes, self.s1));
            check("cuStreamSynchronize", sys::cuStreamSynchronize(self.s1));
        }
    }

    /// `h2d` (or `d2h`) as `pieces` copies queued back to back, then one sync: what the device
    /// side of a staged copy cut that way costs at least.
    pub fn split(&self, pieces: usize, to_device: bool) {
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

    pub fn d2h(&self) {
        // SAFETY: as for h2d.
        unsafe {
            check("cuMemcpyDtoHAsync", sys::cuMemcpyDtoHAsync_v2(self.host, self.dev, self.bytes, self.s1));
            check("cuStreamSynchronize", sys::cuStreamSynchronize(self.s1));
        }
    }

    /// The driver's own path from pageable memory (what `cudaMemcpyAsync` from a `std::vector`
    /// does): `host` holds at most `bytes` bytes.
    pub fn h2d_pageable(&self, host: &[u8]) {
        assert!(host.len() <= self.bytes);
        // SAFETY: `host` is borrowed for the call and the copy is synchronised before returning;
        // the device range holds at least its length.
        unsafe {
            check("cuMemcpyHtoDAsync", sys::cuMemcpyHtoDAsync_v2(self.dev, host.as_ptr() as *const c_void, host.len(), self.s1));
            check("cuStreamSynchronize", sys::cuStreamSynchronize(self.s1));
        }
    }

    pub fn d2h_pageable(&self, host: &mut [u8]) {
        assert!(host.len() <= self.bytes);
        // SAFETY: as for h2d_pageable, `host` borrowed mutably.
        unsafe {
            check("cuMemcpyDtoHAsync", sys::cuMemcpyDtoHAsync_v2(host.as_mut_ptr() as *mut c_void, self.dev, host.len(), self.s1));
            check("cuStreamSynchronize", sys::cuStreamSynchronize(self.s1));
        }
    }

    /// Host to device on one stream while device to host runs on the other.
    pub fn both(&self) {
        // SAFETY: four disjoint ranges of `bytes` bytes owned by self; both streams synchronised.
        unsafe {
            check("cuMemcpyHtoDAsync", sys::cuMemcpyHtoDAsync_v2(self.dev, self.host, self.bytes, self.s1));
            check("cuMemcpyDtoHAsync", sys::cuMemcpyDtoHAsync_v2(self.host2, self.dev2, self.bytes, self.s2));
            check("cuStreamSynchronize", sys::cuStreamSynchronize(self.s1));
            check("cuStreamSynchronize", sys::cuStreamSynchronize(self.s2));
        }
    }

    pub fn d2d(&self) {
        // SAFETY: two device ranges of `bytes` bytes owned by self; synchronised.
        unsafe {
            check("cuMemcpyDtoDAsync", sys::cuMemcpyDtoDAsync_v2(self.dev2, self.dev, self.bytes, self.s1));
            check("cuStreamSynchronize", sys::cuStreamSynchronize(self.s1));
        }
    }

    /// A peer copy from this device's memory into `to`'s.
    pub fn peer(&self, to: &Native) {
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

pub struct Baselines {
    pub h2d: f64,
    pub d2h: f64,
    pub both: f64,
    pub d2d: f64,
}

pub fn native_rows(t: &mut Table, ctx: &Arc<CudaContext>, bytes: usize, quick: bool) -> Baselines {
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
