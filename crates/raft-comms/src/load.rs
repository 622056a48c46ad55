//! Loading the shim (`libraftcomms_shim.so`) and, through it, libnccl at first use, so that a
//! program without NCCL starts and gets an error naming what is missing and what to set. The
//! search, the RUNPATH rules and the message are raft-sys's one loader; what is particular here
//! is the symbol table and opening libnccl through the shim.
use crate::sys::RaftcommsShim;
use raft_error::{Error, Result};
use raft_sys::load::{self, LoadError, Spec};
use std::ffi::{CStr, CString};
use std::path::PathBuf;
use std::sync::OnceLock;

/// The shim's file name.
pub const SHIM_FILE: &str = "libraftcomms_shim.so";

/// Where build.rs put the shim ("" when it built none).
const BUILT_SHIM: &str = env!("RAFT_COMMS_SHIM_PATH");
/// Why build.rs built no shim ("" when it did).
const BUILD_NOTE: &str = env!("RAFT_COMMS_BUILD_NOTE");
/// The directory of the libnccl.so.2 found at build time ("" when none), in the shim's RUNPATH.
pub(crate) const BUILD_NCCL_LIB_DIR: &str = env!("RAFT_COMMS_NCCL_LIB_DIR");

/// The loaded shim with NCCL opened.
pub(crate) struct Loaded {
    pub(crate) api: RaftcommsShim,
    pub(crate) shim_path: PathBuf,
    pub(crate) nccl_version: i32,
    pub(crate) nccl_path: String,
}

static LOADED: OnceLock<std::result::Result<Loaded, LoadError>> = OnceLock::new();

/// The loaded shim, loading it (and libnccl) on the first call; later calls are one atomic load.
///
/// The shim is found by raft-sys's one loader ([`raft_sys::load`]): `RAFT_COMMS_SHIM` (a path;
/// then only there); beside the executable, then `<its dir>/../lib` (a deployed binary with its
/// libraries); where build.rs built it. libnccl: `RAFT_COMMS_NCCL_LIB` (a path to
/// `libnccl.so.2`), else `libnccl.so.2` by the dynamic loader's search (`LD_LIBRARY_PATH`, the
/// shim's RUNPATH, which names the NCCL found at build time, then the system's).
///
/// # Errors
/// `Cuda` (the kind of a missing library everywhere in raft-rs) naming what is missing and what
/// to install or set.
pub(crate) fn loaded(who: &'static str) -> Result<&'static Loaded> {
    LOADED.get_or_init(load).as_ref().map_err(|e| Error::library_missing(who, e.clone()))
}

/// Reads and clears the calling thread's message of the last failed shim call.
pub(crate) fn take_last_error(api: &RaftcommsShim) -> String {
    // SAFETY: raftcomms_last_error returns a NUL-terminated thread-local buffer valid until the
    // next raftcomms_ call on this thread; it is copied before the next call (the clear).
    let message = unsafe { CStr::from_ptr((api.raftcomms_last_error)()) }.to_string_lossy().into_owned();
    // SAFETY: only clears this thread's message buffer.
    unsafe { (api.raftcomms_clear_error)() };
    message
}

fn nccl_advice() -> String {
    format!(
        "Install NCCL {}.{} or newer (`pip install nvidia-nccl-cu13`, or the system's libnccl2), then set RAFT_COMMS_NCCL_LIB \
         to its libnccl.so.2 or add its directory to LD_LIBRARY_PATH{}",
        crate::sys::RAFTCOMMS_MIN_NCCL_VERSION / 10000,
        (crate::sys::RAFTCOMMS_MIN_NCCL_VERSION % 10000) / 100,
        if BUILD_NCCL_LIB_DIR.is_empty() { String::new() } else { format!(" (at build time it was in {BUILD_NCCL_LIB_DIR})") }
    )
}

/// What the shim's own search appends to its message: why the build made none, else where to
/// put it.
fn shim_advice() -> String {
    if BUILD_NOTE.is_empty() {
        "Put it beside the executable or in <its dir>/../lib, or set RAFT_COMMS_SHIM to its path.".into()
    } else {
        format!("{BUILD_NOTE}.")
    }
}

/// The hash of `include/raftcomms.h` this crate was built from.
fn build_header_hash() -> u64 {
    env!("RAFT_COMMS_HEADER_HASH").parse().unwrap_or(0)
}

/// Refuses a shim built from another `raftcomms.h` than these bindings: its functions may take
/// other arguments than `src/sys.rs` says.
fn same_header(theirs: u64, ours: u64) -> std::result::Result<(), String> {
    if theirs == ours {
        Ok(())
    } else {
        Err(format!("built from another raftcomms.h (hash {theirs:#x}, these bindings {ours:#x}): a shim of another raft-comms version"))
    }
}

/// The stack a shim was compiled against: RAFT's and RMM's versions (major * 10000 + minor * 100
/// + patch), `CCCL_VERSION`, `CUDART_VERSION`, the GNU build-id of its `librmm.so` (empty: none).
type StackFacts = (u32, u32, u32, u32, String);

/// raft-sys's: the shim whose `raft::resources` this one's RAFT code runs on.
fn raft_sys_stack() -> StackFacts {
    use raft_sys::build_info as b;
    let v = |(major, minor, patch): (u32, u32, u32)| major * 10_000 + minor * 100 + patch;
    (v(b::RAFT_VERSION), v(b::RMM_VERSION), b::CCCL_VERSION, b::CUDART_VERSION, b::LIBRMM_BUILD_ID.to_string())
}

/// Refuses a shim compiled against another stack than raft-sys's: it runs RAFT's and RMM's
/// inline code on raft-sys's `raft::resources` (`raftcomms_comm_install`), so their layouts must
/// be the same build's. Only the header's hash was compared: helper 101 loaded a comms shim built
/// against RMM 26.08.01 under raft-sys's 26.08.00, which raft-sys's own check refused. Build-ids
/// are compared where both are known.
fn same_stack(theirs: &StackFacts, ours: &StackFacts) -> std::result::Result<(), String> {
    let ids_differ = !theirs.4.is_empty() && !ours.4.is_empty() && theirs.4 != ours.4;
    if theirs.0 == ours.0 && theirs.1 == ours.1 && theirs.2 == ours.2 && theirs.3 == ours.3 && !ids_differ {
        return Ok(());
    }
    let say = |f: &StackFacts| {
        let v = |n: u32| format!("{:02}.{:02}.{:02}", n / 10_000, n / 100 % 100, n % 100);
        format!(
            "RAFT {} / RMM {} / CCCL {} / CUDA runtime {} / librmm build-id {}",
            v(f.0),
            v(f.1),
            f.2,
            f.3,
            if f.4.is_empty() { "unknown" } else { &f.4 }
        )
    };
    Err(format!(
        "built against {}, raft-sys's shim against {}: this shim runs RAFT's code on raft-sys's objects, so both must be \
         built against one stack (rebuild raft-comms with raft-sys, or point RAFT_COMMS_SHIM at a shim of this build)",
        say(theirs),
        say(ours)
    ))
}

/// The stack `api`'s shim reports.
fn shim_stack(api: &RaftcommsShim) -> StackFacts {
    let (mut raft, mut rmm, mut cccl, mut cudart) = (0i32, 0i32, 0i32, 0i32);
    let mut id = [0 as std::ffi::c_char; 72];
    // SAFETY: writes four ints and at most `id.len()` bytes, NUL-terminated, through valid
    // pointers; makes no CUDA or NCCL call.
    unsafe { (api.raftcomms_build_info)(&mut raft, &mut rmm, &mut cccl, &mut cudart, id.as_mut_ptr(), id.len()) };
    // SAFETY: NUL-terminated within `id` (the shim writes the terminator; zeroed before).
    let id = unsafe { CStr::from_ptr(id.as_ptr()) }.to_string_lossy().into_owned();
    (raft as u32, rmm as u32, cccl as u32, cudart as u32, id)
}

fn load() -> std::result::Result<Loaded, LoadError> {
    // raft-sys's shim first: it preloads the CUDA libraries RAFT_RS_LIB_PATH names, and this shim
    // must bind to the same libcudart. Its own failure is reported by the calls that need it.
    let _ = raft_sys::shim();
    let spec = Spec {
        what: "raft-comms's shim",
        file: SHIM_FILE,
        path_var: "RAFT_COMMS_SHIM",
        dirs_var: None,
        built: if BUILT_SHIM.is_empty() { Vec::new() } else { vec![PathBuf::from(BUILT_SHIM)] },
        system_search: false,
        reuse_symbol: None,
        preload: &|_| Vec::new(),
        check: &|_| Ok(()),
        advice: shim_advice(),
    };
    let accept = |lib: libloading::os::unix::Library, _: &std::path::Path| {
        // SAFETY: a raftcomms shim: its functions have the signatures of src/sys.rs, which a
        // test checks against the header it was built from; the table keeps the library loaded.
        // A shim built from another header is refused just below, before any other call.
        let api = unsafe { RaftcommsShim::from_library(lib.into()) }.map_err(|e| format!("not this raft-comms version's shim ({e})"))?;
        // SAFETY: takes nothing, returns a number: callable whatever the rest of the shim is.
        same_header(unsafe { (api.raftcomms_header_hash)() }, build_header_hash())?;
        same_stack(&shim_stack(&api), &raft_sys_stack())?;
        Ok(api)
    };
    // SAFETY: the candidates are raft-comms shims (initialisers that need no device; nothing is
    // preloaded); `accept` moves the library into its function table, kept for the process's life.
    let shim = unsafe { load::open(&spec, accept) }?;
    let api = shim.api;
    // A path is bytes: one that is not UTF-8 is still the file named (`std::env::var` took it
    // for unset, and another NCCL was loaded in its place in silence: helper 111).
    let explicit_nccl = std::env::var_os("RAFT_COMMS_NCCL_LIB").filter(|p| !p.is_empty());
    let c_path = explicit_nccl
        .as_ref()
        .map(|p| CString::new(p.as_encoded_bytes()))
        .transpose()
        .map_err(|_| LoadError::new("RAFT_COMMS_NCCL_LIB contains a NUL byte"))?;
    let mut version = 0;
    // SAFETY: the path is NUL-terminated (or null); `version` is a valid int.
    let status = unsafe { (api.raftcomms_nccl_load)(c_path.as_ref().map_or(std::ptr::null(), |p| p.as_ptr()), &mut version) };
    if status != crate::sys::RAFTCOMMS_STATUS_OK {
        let why = take_last_error(&api);
        let named = if explicit_nccl.is_some() { " (RAFT_COMMS_NCCL_LIB names it)" } else { "" };
        return Err(LoadError::new(format!("NCCL could not be loaded{named}: {why}. {}", nccl_advice())));
    }
    let mut buf = vec![0u8; 4096];
    // SAFETY: the buffer holds `len` bytes; the shim writes at most that, NUL-terminated.
    let status = unsafe { (api.raftcomms_nccl_path)(buf.as_mut_ptr().cast(), buf.len()) };
    let nccl_path = if status == crate::sys::RAFTCOMMS_STATUS_OK {
        CStr::from_bytes_until_nul(&buf).map(|c| c.to_string_lossy().into_owned()).unwrap_or_default()
    } else {
        take_last_error(&api);
        String::new()
    };
    Ok(Loaded { api, shim_path: shim.path, nccl_version: version, nccl_path })
}

/// Facts about the loaded NCCL, for diagnostics: its version code and its file.
pub(crate) fn nccl_facts(who: &'static str) -> Result<(i32, String, PathBuf)> {
    let l = loaded(who)?;
    Ok((l.nccl_version, l.nccl_path.clone(), l.shim_path.clone()))
}

/// Whether this build has a shim at all (false when the NCCL headers were missing at build
/// time, or in a documentation build), and if not why.
pub(crate) fn build_note() -> Option<&'static str> {
    (BUILT_SHIM.is_empty() && std::env::var_os("RAFT_COMMS_SHIM").is_none()).then_some(BUILD_NOTE)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_shim_from_another_header_is_refused_by_name() {
        let ours = super::raft_sys_stack();
        assert!(super::same_stack(&ours, &ours).is_ok());
        for (i, theirs) in [
            (ours.0 + 1, ours.1, ours.2, ours.3, ours.4.clone()),
            (ours.0, 261000, ours.2, ours.3, ours.4.clone()),
            (ours.0, ours.1, ours.2 + 1, ours.3, ours.4.clone()),
            (ours.0, ours.1, ours.2, 13030, ours.4.clone()),
            (ours.0, ours.1, ours.2, ours.3, "00".repeat(20)),
        ]
        .into_iter()
        .enumerate()
        {
            let e = super::same_stack(&theirs, &ours).unwrap_err();
            assert!(e.contains("raft-sys's shim against"), "{i}: {e}");
        }
        // An unknown build-id on either side is not a difference.
        assert!(super::same_stack(&(ours.0, ours.1, ours.2, ours.3, String::new()), &ours).is_ok());
        assert!(super::same_header(7, 7).is_ok());
        let e = super::same_header(7, 8).unwrap_err();
        assert!(e.contains("another raftcomms.h") && e.contains("0x7") && e.contains("0x8"), "{e}");
    }

    /// `RAFT_COMMS_NCCL_LIB` names the NCCL to load, also when its path is not UTF-8: that file
    /// or an error naming the variable, never another NCCL in its place (it was taken for
    /// unset, helper 111). A child process: the loader runs once per process.
    #[test]
    #[cfg_attr(miri, ignore)]
    fn an_nccl_path_that_is_not_utf8_is_the_one_loaded_or_an_error_naming_it() {
        use std::os::unix::ffi::OsStrExt;
        const CHILD: &str = "RAFT_COMMS_TEST_NCCL_PATH_BYTES_CHILD";
        if std::env::var_os(CHILD).is_some() {
            match super::loaded("test") {
                Ok(l) => println!("NCCL LOADED {}", l.nccl_path),
                Err(e) => println!("NCCL REFUSED {e}"),
            }
            return;
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "load::tests::an_nccl_path_that_is_not_utf8_is_the_one_loaded_or_an_error_naming_it", "--nocapture"])
            .env(CHILD, "1")
            .env("RAFT_COMMS_NCCL_LIB", std::ffi::OsStr::from_bytes(b"/nonexistent/caf\xe9/libnccl.so.2"))
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        if stdout.contains("raft-comms's shim") && !stdout.contains("NCCL could not be loaded") {
            eprintln!("SKIP: no raft-comms shim in this build: {stdout}");
            return;
        }
        assert!(stdout.contains("NCCL REFUSED") && stdout.contains("(RAFT_COMMS_NCCL_LIB names it)"), "{stdout}");
    }

    /// The hash the build gave the shim (and these bindings) is the one of the header in the tree.
    #[test]
    fn the_build_hashes_the_header_in_the_tree() {
        assert_eq!(super::build_header_hash(), raft_build::header_hash(include_bytes!("../include/raftcomms.h")));
    }
}
