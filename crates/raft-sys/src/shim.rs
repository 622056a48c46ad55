//! The shim's loading: where `libraftrs_shim.so` may be, what it needs loaded first, and the
//! checks that it is this crate's shim (the rules are [`load`](crate::load)'s).
use crate::bindings::RaftrsShim;
use crate::build_info;
use crate::load::{self, LoadError, Preload, Spec};
use std::ffi::CStr;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The shim's file name.
pub const SHIM_FILE: &str = "libraftrs_shim.so";

/// The libraries the shim needs, leaves first: what `RAFT_RS_LIB_PATH` preloads.
const DEPENDENCIES: &[&str] = &[
    "librapids_logger.so",
    "librmm.so",
    "libcudart.so.13",
    "libnvJitLink.so.13",
    "libcublasLt.so.13",
    "libcublas.so.13",
    "libcusparse.so.12",
    "libcusolver.so.12",
];

/// A process holds one `libnvJitLink.so.13`, bound by the first library that needs it (the
/// shim, through cuSOLVER and cuSPARSE), and cuVS 26.08 needs 13.3. The pins ship 13.3
/// (raft-build's `pins.rs`); a stack with an older one (13.2) would leave cuVS unloadable once
/// the shim is in. So the shim binds cuVS's nvJitLink when it can find it, and cuVS then loads
/// whichever was loaded first (issue 34, item 9).
const NVJITLINK: &str = "libnvJitLink.so.13";

/// The places cuVS's nvJitLink may be, as raft-cuvs's loader sees them: `RAFT_CUVS_LIB_PATH`;
/// the wheels' layout around `RAFT_CUVS_LIB` (`<site>/libcuvs/lib64` beside
/// `<site>/nvidia/cu13/lib`); `cargo xtask deps --cuvs`'s unpacking beside this build's stack
/// (`<cache>/<release>/cuvs`, a sibling of the stack's `prefix`). A Python or conda environment
/// has one nvJitLink for both (pip resolves cuVS's newer pin), so needs none of this.
fn cuvs_nvjitlink_dirs() -> Vec<PathBuf> {
    let mut dirs = load::env_dirs("RAFT_CUVS_LIB_PATH");
    if let Some(lib) = std::env::var_os("RAFT_CUVS_LIB").filter(|p| !p.is_empty()) {
        if let Some(dir) = Path::new(&lib).parent() {
            dirs.push(dir.join("../../nvidia/cu13/lib"));
        }
    }
    for dir in std::env::split_paths(build_info::LIB_DIRS).filter(|d| d.ends_with("nvidia/cu13/lib")) {
        if let Some(root) = dir.ancestors().nth(3) {
            dirs.push(root.with_file_name("cuvs").join("nvidia/cu13/lib"));
        }
    }
    dirs
}

/// What is loaded before the shim: first the libraries in `RAFT_RS_LIB_PATH`'s directories
/// (globally, the user's word winning over the RUNPATH), then cuVS's nvJitLink if the stack's
/// is not loaded yet.
fn preload(_: &Path) -> Vec<Preload> {
    vec![
        Preload {
            files: DEPENDENCIES.to_vec(),
            dirs: load::env_dirs("RAFT_RS_LIB_PATH"),
            global: true,
            named_by: Some("RAFT_RS_LIB_PATH"),
        },
        Preload { files: vec![NVJITLINK], dirs: cuvs_nvjitlink_dirs(), global: false, named_by: None },
    ]
}

fn no_check(_: &Path) -> Result<(), String> {
    Ok(())
}

struct Loaded {
    api: RaftrsShim,
    path: PathBuf,
}

static SHIM: OnceLock<Result<Loaded, LoadError>> = OnceLock::new();

/// The loaded shim, loading it on the first call (later calls are one atomic load).
///
/// Where it looks, in order ([`load::open`]'s rules):
/// 1. `RAFT_RS_SHIM`: the path of a `libraftrs_shim.so` (then only there);
/// 2. beside the executable: `<dir of the executable>/libraftrs_shim.so`, then
///    `<dir of the executable>/../lib/libraftrs_shim.so` (a deployed binary with its libraries);
/// 3. where `build.rs` built it (inside the build's target directory).
///
/// The shim finds RAFT's, RMM's and CUDA's libraries through its RUNPATH: beside itself
/// (`$ORIGIN`), then the directories they were in at build time. `RAFT_RS_LIB_PATH` (a
/// `:`-separated list of directories) names other places, read now: the libraries found there
/// are loaded first and the shim binds to them. When cuVS's newer nvJitLink can be found (see
/// raft-cuvs), it is loaded before the shim, so that cuVS can load later whatever the order of
/// the first calls.
///
/// The shim is never unloaded. Its build facts are checked against this crate's
/// ([`build_info`](crate::build_info)): a shim built against another stack is refused.
#[inline]
pub fn shim() -> Result<&'static RaftrsShim, &'static LoadError> {
    match SHIM.get_or_init(load_shim) {
        Ok(loaded) => Ok(&loaded.api),
        Err(e) => Err(e),
    }
}

/// The file the shim was loaded from (`None` before the first call or when it failed).
pub fn loaded_from() -> Option<&'static Path> {
    SHIM.get().and_then(|r| r.as_ref().ok()).map(|l| l.path.as_path())
}

/// Reads and clears the calling thread's message of the last failed shim call.
pub fn take_last_error(api: &RaftrsShim) -> String {
    // SAFETY: raftrs_last_error returns a NUL-terminated thread-local string that stays valid
    // until the next raftrs_ call on this thread; it is copied before the next call (the clear).
    let message = unsafe { CStr::from_ptr(api.raftrs_last_error()) }.to_string_lossy().into_owned();
    // SAFETY: only clears this thread's message buffer.
    unsafe { api.raftrs_clear_error() };
    message
}

fn load_shim() -> Result<Loaded, LoadError> {
    let built = if build_info::SHIM_PATH.is_empty() { Vec::new() } else { vec![PathBuf::from(build_info::SHIM_PATH)] };
    let spec = Spec {
        what: "the raft-rs native shim",
        file: SHIM_FILE,
        path_var: "RAFT_RS_SHIM",
        dirs_var: None,
        built,
        system_search: false,
        reuse_symbol: None,
        preload: &preload,
        check: &no_check,
        advice: advice(),
    };
    let accept = |lib: libloading::os::unix::Library, _: &Path| {
        // SAFETY: every symbol is looked up with the signature of the header the bindings were
        // generated from; the shim's build facts are checked just below.
        let api = unsafe { RaftrsShim::from_library(lib) }.map_err(|e| format!("not this raft-sys version's shim ({e})"))?;
        // SAFETY: takes nothing, returns a number: callable whatever the rest of the shim is.
        let theirs = unsafe { api.raftrs_header_hash() };
        let ours: u64 = env!("RAFT_SYS_HEADER_HASH").parse().unwrap_or(0);
        if theirs != ours {
            return Err(format!(
                "built from another raftrs.h (hash {theirs:#x}, these bindings {ours:#x}): a shim of another raft-sys version"
            ));
        }
        same_build(&api)?;
        same_librmm(&api)?;
        Ok(api)
    };
    // SAFETY: the candidates are raft-rs shims and what `preload` names the RAPIDS / CUDA
    // libraries of the stack (initialisers that need no device); `accept` moves the library into
    // its function table, which lives in a static for the process's life.
    let loaded = unsafe { load::open(&spec, accept) }?;
    Ok(Loaded { api: loaded.api, path: loaded.path })
}

fn advice() -> String {
    format!(
        "The shim needs RAFT {} and RMM {} (librmm.so, librapids_logger.so) and CUDA {}.{}'s runtime, cuBLAS, cuSOLVER \
         and cuSPARSE (libcudart.so.13, libcublas.so.13, libcusolver.so.12, libcusparse.so.12, libnvJitLink.so.13); \
         at build time they were in: {}. Set RAFT_RS_LIB_PATH to the directories that hold them now (e.g. \
         <site-packages>/librmm/lib64:<site-packages>/rapids_logger/lib64:<site-packages>/nvidia/cu13/lib), put them \
         beside the shim, or set RAFT_RS_SHIM to a libraftrs_shim.so built for this machine.",
        version(build_info::RAFT_VERSION),
        version(build_info::RMM_VERSION),
        build_info::CUDART_VERSION / 1000,
        (build_info::CUDART_VERSION % 1000) / 10,
        if build_info::LIB_DIRS.is_empty() { "(none: a documentation build)" } else { build_info::LIB_DIRS },
    )
}

fn version((a, b, c): (u32, u32, u32)) -> String {
    format!("{a:02}.{b:02}.{c:02}")
}

/// Refuses a shim compiled against other headers than this crate was built with.
fn same_build(api: &RaftrsShim) -> Result<(), String> {
    // SAFETY: an all-zero raftrs_build_info is valid (integers and a char array).
    let mut info: crate::raftrs_build_info = unsafe { std::mem::zeroed() };
    // SAFETY: fills the struct through a valid pointer; makes no CUDA call.
    unsafe { api.raftrs_get_build_info(&mut info) };
    let theirs = (
        (info.raft_major as u32, info.raft_minor as u32, info.raft_patch as u32),
        (info.rmm_major as u32, info.rmm_minor as u32, info.rmm_patch as u32),
        info.cccl_version as u32,
        info.cudart_version as u32,
        info.handle_size,
    );
    let ours =
        (build_info::RAFT_VERSION, build_info::RMM_VERSION, build_info::CCCL_VERSION, build_info::CUDART_VERSION, build_info::HANDLE_SIZE);
    if theirs == ours {
        Ok(())
    } else {
        Err(format!(
            "built against RAFT {} / RMM {} / CCCL {} / CUDA runtime {} / handle {} bytes, this binary against RAFT {} / RMM {} / \
             CCCL {} / CUDA runtime {} / handle {} bytes",
            version(theirs.0),
            version(theirs.1),
            theirs.2,
            theirs.3,
            theirs.4,
            version(ours.0),
            version(ours.1),
            ours.2,
            ours.3,
            ours.4
        ))
    }
}

/// The knob that takes a `librmm.so` of another build than the shim was linked against.
pub const ALLOW_OTHER_LIBRMM: &str = "RAFT_RS_ALLOW_OTHER_LIBRMM";

/// Refuses a process whose `librmm.so` is another build than the one the shim was linked
/// against (their GNU build-ids differ), unless `RAFT_RS_ALLOW_OTHER_LIBRMM=1`: the shim holds
/// RMM's inline code compiled for that build's headers, and another build of even the same
/// release (another package, a rebuild) may lay out what that code reads otherwise, silently
/// (helper 101 reproduced statistics read from the wrong fields). Nothing is said where either
/// build-id is unknown (a library built without one, none mapped under a `librmm.so` name).
fn same_librmm(api: &RaftrsShim) -> Result<(), String> {
    // SAFETY: an all-zero raftrs_librmm_identity is valid (three char arrays).
    let mut id: crate::raftrs_librmm_identity = unsafe { std::mem::zeroed() };
    // SAFETY: fills the struct through a valid pointer, each field NUL-terminated within it;
    // reads the loader's list of objects and makes no CUDA call.
    unsafe { api.raftrs_get_librmm_identity(&mut id) };
    let text = |field: &[std::ffi::c_char]| -> String {
        let bytes: Vec<u8> = field.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    let (linked, mapped, path) = (text(&id.linked), text(&id.mapped), text(&id.mapped_path));
    if linked.is_empty() || path.is_empty() || linked == mapped || std::env::var_os(ALLOW_OTHER_LIBRMM).is_some_and(|v| v == "1") {
        return Ok(());
    }
    Err(format!(
        "this process's librmm.so ({path}, build-id {}) is not the build the shim was linked against (build-id {linked}, \
         {}): the shim compiled RMM's inline code for that build, and another build, even of the same release, may lay \
         out its objects otherwise. Point RAFT_RS_LIB_PATH (or LD_LIBRARY_PATH) at the librmm.so it was built with, \
         rebuild against this one, or set {ALLOW_OTHER_LIBRMM}=1 to take it anyway",
        if mapped.is_empty() { "none" } else { &mapped },
        if build_info::LIBRMM_LINKED.is_empty() { "where the shim was built" } else { build_info::LIBRMM_LINKED },
    ))
}
