//! Allocation sizes no resource can serve (issue 33, finding 1): near `usize::MAX` RMM's own
//! arithmetic wraps (its 256-byte rounding makes `usize::MAX` a 0-byte block, the pinned host
//! resource adds a header), so such sizes must be refused before RMM sees them, by the Rust
//! side and again by the shim. A size whose arithmetic wraps is a `Logic` error, a size past
//! what any memory holds (2^48 bytes) is `OutOfMemory`; everything else reaches the resource and
//! either succeeds, with its length and an address range of its own, or fails `OutOfMemory`.
use raft::{DeviceResources, DeviceVec, ErrorKind, MemoryResource, PinnedVec};
use raft_tests::require_gpu;
use raft_tests::OutputWithin;
use std::io::Write;
use std::process::Command;
use std::time::{Duration, Instant};

/// The bounds the library documents (`DeviceVec::new`): larger is `OutOfMemory` ...
const MAX_BYTES: usize = 1 << 48;
/// ... and within this of `usize::MAX` (where rounding wraps) it is `Logic`.
const WRAP_SLACK: usize = 4096;
const MIB: usize = 1 << 20;

/// The kind of error a size must get whatever the resource, or `None` when it reaches the
/// resource.
fn refused_as(bytes: usize) -> Option<ErrorKind> {
    if bytes > usize::MAX - WRAP_SLACK {
        Some(ErrorKind::Logic)
    } else if bytes > MAX_BYTES {
        Some(ErrorKind::OutOfMemory)
    } else {
        None
    }
}

/// Sizes next to every power of two and next to `usize::MAX`. The powers from 2^21 to 2^40 are
/// left out: whether they fit depends on the machine, and this test allocates only what must
/// fail plus small successes.
fn sizes() -> Vec<usize> {
    let mut s = vec![0usize];
    for k in (0..=20).chain(41..=63) {
        let p = 1usize << k;
        s.extend([p - 1, p, p + 1]);
    }
    for below in [0usize, 1, 7, 8, 255, 256, 263, 264, 265, 4095, 4096, 4097] {
        s.push(usize::MAX - below);
    }
    s.sort_unstable();
    s.dedup();
    s
}

// ---- the shim itself, on any machine ---------------------------------------------------------

/// Calls `raftrs_buffer_create` (the one allocation entry point of the shim: device arrays and
/// page-locked host memory both go through it) for `bytes` from device 0's current resource.
fn shim_create(bytes: usize) -> (raft_sys::raftrs_status, String) {
    let api = raft_sys::shim().expect("the shim loads");
    let (mut buf, mut data, mut ordered) = (std::ptr::null_mut(), std::ptr::null_mut(), 0i32);
    // SAFETY: plain values and out-pointers to locals; a null resource means the device's
    // current one, a null stream the legacy default stream.
    let status = unsafe { api.raftrs_buffer_create(0, std::ptr::null(), std::ptr::null_mut(), bytes, &mut buf, &mut data, &mut ordered) };
    let message = if status == raft_sys::RAFTRS_STATUS_OK { String::new() } else { raft_sys::take_last_error(api) };
    if !buf.is_null() {
        // SAFETY: a buffer just made, freed once, on the stream it was made on.
        unsafe { api.raftrs_buffer_destroy(buf, std::ptr::null_mut()) };
    }
    (status, message)
}

/// The refusals happen before any CUDA call, so this machine sees them without a GPU (before
/// the fix, every size reached `cudaGetDevice` and failed with the driver's error; with a GPU,
/// `usize::MAX` was allocated as a 0-byte block).
#[test]
fn the_shim_refuses_sizes_no_resource_can_serve_before_any_cuda_call() {
    for bytes in sizes().into_iter().filter(|&b| refused_as(b).is_some()) {
        let (status, message) = shim_create(bytes);
        let want = match refused_as(bytes) {
            Some(ErrorKind::Logic) => raft_sys::RAFTRS_STATUS_LOGIC,
            _ => raft_sys::RAFTRS_STATUS_OUT_OF_MEMORY,
        };
        assert_eq!(status, want, "{bytes} bytes: status {status}: {message}");
        assert!(message.contains(&bytes.to_string()), "{bytes} bytes: the message names the size: {message}");
    }
    // The bound itself goes through to the resource: the driver's error without a driver, the
    // resource's `OutOfMemory` with one (no device has 256 TiB).
    let (status, message) = shim_create(MAX_BYTES);
    let want = if raft::device_count().is_err() { raft_sys::RAFTRS_STATUS_CUDA } else { raft_sys::RAFTRS_STATUS_OUT_OF_MEMORY };
    assert_eq!(status, want, "{message}");
}

/// `PinnedVec` refuses them before it makes (or finds) a resource: no CUDA call either. Before
/// the fix, `usize::MAX - 7` bytes got the driver's error here and died of SIGSEGV on the H200
/// (RMM's pinned resource wrapped `bytes + 256 + 8` and zeroing ran past a 256-byte block).
#[test]
fn pinned_vecs_refuse_sizes_no_memory_holds_before_any_cuda_call() {
    for bytes in [usize::MAX, usize::MAX - 7, usize::MAX - 264, usize::MAX - 4095] {
        let e = PinnedVec::<u8>::new(0, bytes).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Logic, "{bytes}: {e}");
        assert!(e.to_string().starts_with("PinnedVec::new: "), "{e}");
    }
    for bytes in [MAX_BYTES + 1, 1 << 63, usize::MAX / 2] {
        let e = PinnedVec::<u8>::new(0, bytes).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::OutOfMemory, "{bytes}: {e}");
    }
    // Elements whose byte count overflows: the argument is wrong, not the memory short.
    let e = PinnedVec::<f64>::new(0, usize::MAX / 4).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Logic, "{e}");
    // 2^46 doubles are 2^49 bytes: past the bound.
    assert_eq!(PinnedVec::<f64>::new(0, 1 << 46).unwrap_err().kind(), ErrorKind::OutOfMemory);
}

// ---- every resource kind, on the GPU ---------------------------------------------------------

/// The resource kinds the property runs over; each runs in a child process of its own, so that
/// a crash names its kind and spares the others.
const KINDS: &[&str] = &[
    "current",
    "current-zeros",
    "cuda",
    "cuda_async",
    "managed",
    "pool",
    "pool-bounded",
    "pool-over-async",
    "arena",
    "binning",
    "limiting",
    "statistics",
    "tracking",
    "logging",
    "thread_safe",
    "failure_callback",
    "pinned-as-device",
    "pinned",
    "pinned-default",
];

/// Allocations of one kind: a device array (its address and length) or page-locked memory.
enum Made {
    Device(DeviceVec<u8>),
    Pinned(PinnedVec<u8>),
}

impl Made {
    fn range(&self) -> (u128, u128) {
        let (start, len) = match self {
            // SAFETY: only the address is read, not the memory.
            Made::Device(v) => (unsafe { v.as_raw() } as usize, v.len()),
            // SAFETY: only the slice's address is read; no copy uses the memory meanwhile.
            Made::Pinned(v) => (unsafe { v.as_slice() }.as_ptr() as usize, v.len()),
        };
        (start as u128, start as u128 + len as u128)
    }

    fn len(&self) -> usize {
        match self {
            Made::Device(v) => v.len(),
            Made::Pinned(v) => v.len(),
        }
    }
}

/// What one kind allocates with: builds its resource once, then allocates `bytes` at a time.
fn allocator(kind: &str, res: &DeviceResources) -> Box<dyn Fn(usize) -> raft::Result<Made>> {
    let cuda = || MemoryResource::cuda(0).unwrap();
    let device = |mr: MemoryResource| -> Box<dyn Fn(usize) -> raft::Result<Made>> {
        let res = res.clone();
        Box::new(move |n| DeviceVec::<u8>::new_in(&res, n, &mr).map(Made::Device))
    };
    match kind {
        "current" => {
            let res = res.clone();
            Box::new(move |n| DeviceVec::<u8>::new(&res, n).map(Made::Device))
        }
        "current-zeros" => {
            let res = res.clone();
            Box::new(move |n| DeviceVec::<u8>::zeros(&res, n).map(Made::Device))
        }
        "cuda" => device(cuda()),
        "cuda_async" => device(MemoryResource::cuda_async(0).unwrap()),
        "managed" => device(MemoryResource::managed(0).unwrap()),
        "pool" => device(cuda().pool(raft::PoolOptions::initial(64 * MIB)).unwrap()),
        "pool-bounded" => device(cuda().pool(raft::PoolOptions::initial(64 * MIB).maximum(256 * MIB)).unwrap()),
        "pool-over-async" => device(MemoryResource::cuda_async(0).unwrap().pool(raft::PoolOptions::initial(64 * MIB)).unwrap()),
        "arena" => device(cuda().arena(raft::ArenaOptions::size(64 * MIB)).unwrap()),
        "binning" => device(cuda().binning(8, 12).unwrap()),
        "limiting" => device(cuda().with_limit(64 * MIB).unwrap()),
        "statistics" => device(cuda().with_statistics().unwrap()),
        "tracking" => device(cuda().with_tracking().unwrap()),
        "logging" => device(cuda().with_logging(log_path(), false).unwrap()),
        "thread_safe" => device(cuda().thread_safe().unwrap()),
        "failure_callback" => device(cuda().with_failure_callback(|_| false).unwrap()),
        "pinned-as-device" => device(MemoryResource::pinned_host(0).unwrap()),
        "pinned" => {
            let mr = MemoryResource::pinned_host(0).unwrap();
            Box::new(move |n| PinnedVec::<u8>::new_in(n, &mr).map(Made::Pinned))
        }
        "pinned-default" => Box::new(|n| PinnedVec::<u8>::new(0, n).map(Made::Pinned)),
        other => panic!("no kind {other}"),
    }
}

/// Where the "logging" kind's CSV goes (removed when the child ends).
fn log_path() -> std::path::PathBuf {
    std::env::temp_dir().join(format!("raft-sizes-{}.csv", std::process::id()))
}

/// The child's work for one kind: every size, each either refused with the right kind or
/// allocated with its length and a range no later allocation overlaps. Prints one line a size.
fn property_child(kind: &str) -> ! {
    let res = DeviceResources::new().unwrap();
    let alloc = allocator(kind, &res);
    let mut checked = 0;
    for bytes in sizes() {
        print!("{kind} {bytes}: ");
        let _ = std::io::stdout().flush();
        let outcome = alloc(bytes);
        match (&outcome, refused_as(bytes)) {
            (Err(e), Some(want)) => assert_eq!(e.kind(), want, "{kind}, {bytes} bytes: {e}"),
            (Ok(_), Some(want)) => panic!("{kind}, {bytes} bytes: allocated, expected {want:?}"),
            // Small sizes fit in every resource here; large ones may fail, for lack of memory only.
            (Err(e), None) => {
                assert!(bytes > 2 * MIB, "{kind}, {bytes} bytes: {e}");
                assert_eq!(e.kind(), ErrorKind::OutOfMemory, "{kind}, {bytes} bytes: {e}");
            }
            (Ok(big), None) => {
                assert_eq!(big.len(), bytes, "{kind}: the length asked for");
                if bytes > 0 {
                    // A second live allocation must not overlap the first (RMM's pool gave a
                    // `usize::MAX`-byte array and the next one the same address).
                    let small = alloc(4096).unwrap_or_else(|e| panic!("{kind}: 4096 bytes after {bytes}: {e}"));
                    let ((a0, a1), (b0, b1)) = (big.range(), small.range());
                    assert!(a0 != 0 && b0 != 0, "{kind}, {bytes} bytes: a null address");
                    assert!(a1 <= b0 || b1 <= a0, "{kind}, {bytes} bytes at {a0:#x}..{a1:#x} overlaps 4096 at {b0:#x}..{b1:#x}");
                }
            }
        }
        println!("{}", outcome.map_or_else(|e| format!("{:?}", e.kind()), |_| "allocated".into()));
        checked += 1;
    }
    drop(alloc);
    let _ = std::fs::remove_file(log_path());
    println!("RESULT checked={checked}");
    let _ = std::io::stdout().flush();
    std::process::exit(0)
}

/// For every resource kind and every size next to a power of two or `usize::MAX`: an error of
/// the right kind or a right allocation, never a crash. Before the fix, "pinned" and
/// "pinned-default" died of SIGSEGV at `usize::MAX - 7`; "pool" and the other pools allocated
/// `usize::MAX` bytes (len `usize::MAX`) at the address the next 4096 bytes got; the others
/// returned arrays of lengths the memory behind them did not have.
#[test]
fn every_resource_kind_refuses_or_serves_sizes_near_powers_of_two_and_usize_max() {
    if let Ok(kind) = std::env::var("RAFT_SIZES_CHILD") {
        property_child(&kind);
    }
    require_gpu!();
    let me = std::env::current_exe().unwrap();
    let mut failed = Vec::new();
    for kind in KINDS {
        let start = Instant::now();
        let out = Command::new(&me)
            .args(["every_resource_kind_refuses_or_serves_sizes_near_powers_of_two_and_usize_max", "--exact", "--nocapture"])
            .arg("--test-threads=1")
            .env("RAFT_SIZES_CHILD", kind)
            .output_within(std::time::Duration::from_secs(300));
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        let done = stdout.contains(&format!("RESULT checked={}", sizes().len()));
        eprintln!("{kind}: {:?} in {:?}", out.status, start.elapsed());
        if out.status.code() != Some(0) || !done {
            let last = stdout.lines().rev().find(|l| l.starts_with(kind)).unwrap_or("").to_string();
            failed.push(format!(
                "{kind}: {:?} at \"{last}\"\n{}",
                out.status,
                stderr.lines().rev().take(20).collect::<Vec<_>>().join("\n")
            ));
        }
        assert!(start.elapsed() < Duration::from_secs(120), "{kind} took {:?}", start.elapsed());
    }
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
}

/// Typed lengths: the element count times the element size is what is checked.
#[test]
fn typed_lengths_are_checked_by_their_bytes() {
    require_gpu!();
    let res = DeviceResources::new().unwrap();
    assert_eq!(DeviceVec::<f64>::new(&res, usize::MAX).unwrap_err().kind(), ErrorKind::Logic);
    assert_eq!(DeviceVec::<f32>::new(&res, usize::MAX / 4 + 1).unwrap_err().kind(), ErrorKind::Logic);
    assert_eq!(DeviceVec::<f64>::zeros(&res, 1 << 46).unwrap_err().kind(), ErrorKind::OutOfMemory);
    let e = DeviceVec::<u8>::new(&res, usize::MAX).unwrap_err();
    assert_eq!((e.kind(), e.who()), (ErrorKind::Logic, "DeviceVec::new"), "{e}");
    let v = DeviceVec::<f32>::new(&res, (1 << 20) + 1).unwrap();
    assert_eq!(v.len(), (1 << 20) + 1);
}

// ---- binning exponents (issue 33, finding 3) -------------------------------------------------

/// The shim checks the exponents before it reads the upstream (here a null one): RMM sizes each
/// bin as the int `1 << exponent`, which overflows from 31 on. Before the fix, 31 to 62 passed
/// the shim's check (this call then failed only for the null upstream).
#[test]
fn the_shim_refuses_bin_exponents_past_30() {
    let api = raft_sys::shim().expect("the shim loads");
    for (min, max) in (31..=62).map(|max| (10, max)).chain([(-1, 10), (12, 11), (31, 31)]) {
        let mut out = std::ptr::null_mut();
        // SAFETY: a null upstream is refused by the shim; `out` is a local.
        let status = unsafe { api.raftrs_mr_new_binning(std::ptr::null(), min, max, &mut out) };
        let message = raft_sys::take_last_error(api);
        assert_eq!(status, raft_sys::RAFTRS_STATUS_LOGIC, "{min}..{max}: {message}");
        assert!(message.contains("<= 30") && out.is_null(), "{min}..{max}: {message}");
    }
}

/// Through the API: refused with `Logic` before any native call, with 30 still accepted by the
/// check (its bins then ask upstream for about 256 GiB: `OutOfMemory` on one H200).
#[test]
fn binning_refuses_exponents_past_30() {
    require_gpu!();
    let cuda = MemoryResource::cuda(0).unwrap();
    for max in 31..=62 {
        let e = cuda.binning(10, max).map(|_| ()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Logic, "10..{max}: {e}");
        assert!(e.to_string().starts_with("MemoryResource::binning: bin exponents"), "{e}");
    }
    assert_eq!(raft::memory::MAX_BIN_EXPONENT, 30);
    let small = cuda.binning(8, 12).unwrap();
    let res = DeviceResources::new().unwrap();
    assert_eq!(DeviceVec::<u8>::new_in(&res, 3000, &small).unwrap().len(), 3000);
}
