//! How a staged copy's host threads write (`HostStores`, `copy_host_bytes`): plain or
//! non-temporal stores, the one CPU-specific part of staging, kept apart from the slots and threads.
/// How the host threads of a staged copy write: into the page-locked buffers (uploads) or into
/// the caller's memory (downloads). On other CPUs than x86-64, every kind is a plain copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum HostStores {
    /// The kind that measured fastest for the copy's direction and size (the default; GPU runs
    /// 78 and 79, an H200 beside a 16-core Xeon, each kind in turns with the native pinned
    /// copy): uploads [`Streaming`](Self::Streaming) below 32 MiB (4 MiB: 0.67x of the pinned
    /// copy against 0.40x plain; 16 MiB 0.68x / 0.55x) and [`Plain`](Self::Plain) from there
    /// (64 MiB 0.78x / 0.68x; 1 GiB 0.90x / 0.62x); downloads plain below 4 MiB (1 MiB 0.58x
    /// against 0.55x streaming) and streaming from there (4 MiB 0.72x / 0.69x; 64 MiB 0.92x /
    /// 0.85x; 1 GiB 0.97x / 0.84x).
    #[default]
    Auto,
    /// Plain stores (`memcpy`): the written lines stay in the writing core's cache (glibc's
    /// `memcpy` itself streams copies past its own threshold, several MiB at a time).
    Plain,
    /// Non-temporal stores (`movntdq`) for every whole 64-byte line of each host copy of 4 KiB or
    /// more: written straight to memory, neither read first nor kept in any cache; the ends,
    /// and smaller copies, with plain stores.
    Streaming,
}

/// Copies `len` bytes from `src` to `dst`, as `std::ptr::copy_nonoverlapping` does, writing as
/// `stores` says (see [`HostStores`]; on other CPUs than x86-64 always a plain copy).
///
/// # Safety
/// As `std::ptr::copy_nonoverlapping`: `src` valid for reads and `dst` for writes of `len`
/// bytes, the two not overlapping, and no other thread touching either range meanwhile.
pub(crate) unsafe fn copy_host_bytes(dst: *mut u8, src: *const u8, len: usize, stores: HostStores) {
    // Streaming pays from a few lines on; `Auto` is resolved before (a plain copy here).
    #[cfg(target_arch = "x86_64")]
    if stores == HostStores::Streaming && len >= 4096 {
        // SAFETY: the caller's contract, passed on; len >= 4096 >= 64.
        unsafe { copy_streaming(dst, src, len) };
        return;
    }
    let _ = stores;
    // SAFETY: the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) }
}

/// The bulk of `len` bytes written with non-temporal stores (`movntdq`), the ends with plain
/// ones.
///
/// # Safety
/// As [`copy_host_bytes`], and `len` at least 64 (the plain head, up to 63 bytes, must fit).
#[cfg(target_arch = "x86_64")]
unsafe fn copy_streaming(dst: *mut u8, src: *const u8, len: usize) {
    debug_assert!(len >= 64, "copy_streaming needs at least 64 bytes, given {len}");
    use std::arch::x86_64::{__m128i, _mm_loadu_si128};
    // Up to the destination's next 64-byte boundary with plain stores, so every streaming store
    // is aligned (movntdq requires 16) and whole cache lines are written.
    let head = (64 - (dst as usize & 63)) & 63;
    // SAFETY: head < 64 <= len (this function's contract): inside both ranges.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, head) };
    let lines = (len - head) / 64;
    for i in 0..lines {
        // SAFETY: line `i` spans bytes head + 64 i .. head + 64 (i + 1) <= len of both ranges;
        // `d` is 16-byte aligned (64-aligned by `head`); SSE2 is part of x86-64.
        unsafe {
            let s = src.add(head + 64 * i) as *const __m128i;
            let d = dst.add(head + 64 * i) as *mut __m128i;
            let (a, b, c, e) = (_mm_loadu_si128(s), _mm_loadu_si128(s.add(1)), _mm_loadu_si128(s.add(2)), _mm_loadu_si128(s.add(3)));
            stream_store(d, a);
            stream_store(d.add(1), b);
            stream_store(d.add(2), c);
            stream_store(d.add(3), e);
        }
    }
    let done = head + 64 * lines;
    // SAFETY: the rest, done..len, inside both ranges. The fence orders the streaming stores
    // before every later store of this thread (the count that tells the coordinator the
    // sub-piece is done, after which the device reads it or the caller gets it back), as Intel
    // requires of them.
    unsafe {
        std::ptr::copy_nonoverlapping(src.add(done), dst.add(done), len - done);
        store_fence();
    }
}

/// `movntdq` of `v` at `d`; under Miri, which cannot run its inline assembly, an aligned plain
/// store of the same 16 bytes, so Miri still checks every access's bounds and alignment.
///
/// # Safety
/// `d` is valid for a 16-byte write and 16-byte aligned.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn stream_store(d: *mut std::arch::x86_64::__m128i, v: std::arch::x86_64::__m128i) {
    // SAFETY: the caller's contract; SSE2 is part of x86-64.
    #[cfg(not(miri))]
    unsafe {
        std::arch::x86_64::_mm_stream_si128(d, v)
    };
    // SAFETY: the caller's contract (an aligned write, as movntdq requires).
    #[cfg(miri)]
    unsafe {
        d.write(v)
    };
}

/// `sfence` after the streaming stores; under Miri a sequentially consistent fence.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn store_fence() {
    // SAFETY: sfence takes no operands; SSE is part of x86-64.
    #[cfg(not(miri))]
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
    #[cfg(miri)]
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}
