//! A sampling profile of the allocation hot path (issue 30), for machines without a profiler:
//! `DeviceVec::new_in` + drop through an arena, and C++ doing the same steps as designed
//! (`bl_alloc_free_held_as_designed`), each looped for a few seconds under `SIGPROF`. The handler
//! records the interrupted instruction's address; at the end each phase's addresses and the
//! process's mappings are written out, for `scripts/symbolize-profile.py` to name on a machine
//! that has the same binaries.
//!
//! Then `DeviceResources::new()` + `release()` against its floor and the bare C++ (phases
//! `create-release`, `create-release-floor`, `create-release-cpp`).
//!
//!     alloc-profile OUT_DIR [SECONDS_PER_PHASE]     (ALLOC_PROFILE_PHASES=ours,cpp-as-designed: a subset)
use raft::{DeviceResources, DeviceVec};
use raft_tests::baseline::{bl_alloc_free_held_as_designed, bl_create_release, bl_create_release_floor, bl_use_stream};
use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const MAX: usize = 1 << 20;
/// The samples' addresses, written only by the handler. `SIGPROF` of the process's CPU timer goes
/// to whichever thread is running when it fires: in these loops almost always the main thread
/// (the library's and CUDA's threads sleep); a sample taken on another names that thread's
/// instruction.
static SAMPLES: [AtomicUsize; MAX] = [const { AtomicUsize::new(0) }; MAX];
static TAKEN: AtomicUsize = AtomicUsize::new(0);

/// The interrupted instruction's address in a signal's context (x86-64 Linux, the GPU machines'
/// platform; 0 elsewhere).
fn interrupted_at(ctx: *mut libc::c_void) -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: the kernel passes a `ucontext_t` to an SA_SIGINFO handler; reading a register
        // of it is async-signal-safe.
        unsafe { (*(ctx as *const libc::ucontext_t)).uc_mcontext.gregs[libc::REG_RIP as usize] as usize }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = ctx;
        0
    }
}

extern "C" fn on_prof(_sig: libc::c_int, _info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let rip = interrupted_at(ctx);
    let i = TAKEN.fetch_add(1, Ordering::Relaxed);
    if i < MAX {
        SAMPLES[i].store(rip, Ordering::Relaxed);
    }
}

/// Writes `n` in hex to stderr (async-signal-safe: no allocation).
fn write_hex(n: usize) {
    let mut buf = [b'0'; 18];
    buf[1] = b'x';
    for i in 0..16 {
        let d = (n >> ((15 - i) * 4)) & 0xf;
        buf[2 + i] = if d < 10 { b'0' + d as u8 } else { b'a' + d as u8 - 10 };
    }
    // SAFETY: writes a local buffer to fd 2.
    unsafe { libc::write(2, buf.as_ptr() as *const libc::c_void, buf.len()) };
}

/// A crash after the phases (the process's exit) names where it happened, for symbolizing.
extern "C" fn on_segv(_sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let rip = interrupted_at(ctx);
    // SAFETY: the kernel passes a valid siginfo_t to an SA_SIGINFO handler.
    let addr = unsafe { (*info).si_addr() as usize };
    let msg = b"\nalloc-profile: SIGSEGV at rip ";
    // SAFETY: writes static bytes to fd 2.
    unsafe { libc::write(2, msg.as_ptr() as *const libc::c_void, msg.len()) };
    write_hex(rip);
    let msg = b" address ";
    // SAFETY: writes static bytes to fd 2.
    unsafe { libc::write(2, msg.as_ptr() as *const libc::c_void, msg.len()) };
    write_hex(addr);
    // The frames above it (glibc's unwinder: not async-signal-safe in general, but the process
    // is going down anyway), one address a line, for symbolizing with the maps.
    let mut frames = [std::ptr::null_mut::<libc::c_void>(); 48];
    // SAFETY: `backtrace` writes at most the array's length of frame addresses into it.
    let n = unsafe { libc::backtrace(frames.as_mut_ptr(), frames.len() as libc::c_int) };
    for f in frames.iter().take(n.max(0) as usize) {
        // SAFETY: writes static bytes to fd 2.
        unsafe { libc::write(2, b"\nframe ".as_ptr() as *const libc::c_void, 7) };
        write_hex(*f as usize);
    }
    // SAFETY: writes a newline, then exits without running handlers.
    unsafe {
        libc::write(2, b"\n".as_ptr() as *const libc::c_void, 1);
        libc::_exit(139);
    }
}

fn start_timer(hz: i64) {
    // SAFETY: installs a handler that only touches atomics; the itimerval is a local.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_prof as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        assert_eq!(libc::sigaction(libc::SIGPROF, &sa, std::ptr::null_mut()), 0);
        let period = libc::timeval { tv_sec: 0, tv_usec: 1_000_000 / hz };
        let t = libc::itimerval { it_interval: period, it_value: period };
        assert_eq!(libc::setitimer(libc::ITIMER_PROF, &t, std::ptr::null_mut()), 0);
    }
}

fn stop_timer() {
    // SAFETY: a zero itimerval disarms the timer.
    unsafe {
        let t: libc::itimerval = std::mem::zeroed();
        libc::setitimer(libc::ITIMER_PROF, &t, std::ptr::null_mut());
    }
}

/// Runs `f` in a loop for `secs` with the timer armed; returns (calls, the phase's addresses).
fn phase(secs: f64, f: &mut dyn FnMut()) -> (u64, Vec<usize>) {
    for _ in 0..10_000 {
        f(); // warm
    }
    TAKEN.store(0, Ordering::Relaxed);
    let mut calls = 0u64;
    let end = Instant::now() + Duration::from_secs_f64(secs);
    start_timer(4000);
    while Instant::now() < end {
        for _ in 0..1000 {
            f();
        }
        calls += 1000;
    }
    stop_timer();
    let n = TAKEN.load(Ordering::Relaxed).min(MAX);
    (calls, (0..n).map(|i| SAMPLES[i].load(Ordering::Relaxed)).collect())
}

/// Profiles `f` for `secs` (see [`phase`]): its addresses go to `OUT/{file}.txt`; returns (and
/// prints) the summary line `{label}: calls, ns per call, samples`.
fn profile(out: &std::path::Path, secs: f64, label: &str, file: &str, f: &mut dyn FnMut()) -> String {
    let t = Instant::now();
    let (calls, samples) = phase(secs, f);
    let ns = t.elapsed().as_nanos() as f64 / calls as f64;
    let line = format!("{label}: {calls} calls, {ns:.1} ns per call (with the sampling), {} samples\n", samples.len());
    print!("{line}");
    let mut w = std::fs::File::create(out.join(format!("{file}.txt"))).unwrap();
    for a in samples {
        writeln!(w, "{a:x}").unwrap();
    }
    line
}

/// ALLOC_PROFILE_PHASES: a comma-separated subset of the phases' names (all when unset).
fn selected(name: &str) -> bool {
    std::env::var("ALLOC_PROFILE_PHASES").map_or(true, |only| only.split(',').any(|p| p == name))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let out = std::path::PathBuf::from(args.get(1).expect("usage: alloc-profile OUT_DIR [SECONDS_PER_PHASE]"));
    let secs: f64 = args.get(2).map_or(4.0, |s| s.parse().expect("seconds"));
    std::fs::create_dir_all(&out).unwrap();
    // SAFETY: installs a handler that only writes to fd 2 and exits.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_segv as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO;
        libc::sigaction(libc::SIGSEGV, &sa, std::ptr::null_mut());
    }
    let r = DeviceResources::new().unwrap();
    let own = r.stream().unwrap();
    // SAFETY: the stream outlives the C++ phases (held until after them, then given back).
    unsafe { bl_use_stream(own.cu_stream() as *mut std::ffi::c_void) };
    let cuda = raft::MemoryResource::cuda(0).unwrap();
    let arena = cuda.arena(raft::ArenaOptions::size(1 << 30)).unwrap();
    let mut summary = String::new();
    for bytes in [0usize, 64 << 10] {
        let phases: [(&str, &mut dyn FnMut()); 2] = [
            ("ours", &mut || drop(std::hint::black_box(DeviceVec::<u8>::new_in(&r, bytes, &arena).unwrap()))),
            // SAFETY: a plain C function of the baseline, on the stream set above (alive).
            ("cpp-as-designed", &mut || assert_eq!(unsafe { bl_alloc_free_held_as_designed(1, bytes) }, 0)),
        ];
        for (name, f) in phases {
            if selected(name) {
                summary.push_str(&profile(&out, secs, &format!("{name} {bytes} B"), &format!("{name}-{bytes}"), f));
            }
        }
    }
    // `DeviceResources::new()` + `release()` + drop, against C++ doing the steps soundness
    // requires of them (`bl_create_release_floor`) and the bare C++ stream + RAFT object: where
    // the create + release row's time goes beyond its floor (issue 30).
    let lifecycle: [(&str, &mut dyn FnMut()); 3] = [
        ("create-release", &mut || DeviceResources::new().unwrap().release().unwrap()),
        // SAFETY: plain C functions of the baseline.
        ("create-release-floor", &mut || assert_eq!(unsafe { bl_create_release_floor() }, 0)),
        // SAFETY: as above.
        ("create-release-cpp", &mut || assert_eq!(unsafe { bl_create_release() }, 0)),
    ];
    for (name, f) in lifecycle {
        if selected(name) {
            summary.push_str(&profile(&out, secs, name, name, f));
        }
    }
    // SAFETY: the baseline's own stream again, before `own` goes.
    unsafe { bl_use_stream(std::ptr::null_mut()) };
    drop(own);
    std::fs::write(out.join("summary.txt"), summary).unwrap();
    std::fs::copy("/proc/self/maps", out.join("maps.txt")).unwrap();
    eprintln!("alloc-profile: main returns");
}
