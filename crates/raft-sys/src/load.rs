//! Loading the shim at first use, so that a binary never dies before `main` for want of
//! `librmm.so`, and says exactly what is missing when the stack is not there.
use crate::bindings::RaftrsShim;
use crate::build_info;
use std::ffi::CStr;
use std::fmt;
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

/// Why a native library could not be loaded (the shim here; cuVS in raft-cuvs, which uses this
/// type too): which library, where it looked, what to set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadError {
    message: String,
}

impl LoadError {
    /// An error with this explanation (for the loaders of the other native parts).
    pub fn new(message: impl Into<String>) -> LoadError {
        LoadError { message: message.into() }
    }

    /// The whole explanation.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for LoadError {}

struct Loaded {
    api: RaftrsShim,
    path: PathBuf,
}

static SHIM: OnceLock<Result<Loaded, LoadError>> = OnceLock::new();

/// The loaded shim, loading it on the first call (later calls are one atomic load).
///
/// Where it looks, in order:
/// 1. `RAFT_RS_SHIM`: the path of a `libraftrs_shim.so` (then only there);
/// 2. beside the executable: `<dir of the executable>/libraftrs_shim.so`, then
///    `<dir of the executable>/../lib/libraftrs_shim.so` (a deployed binary with its libraries);
/// 3. where `build.rs` built it (inside the build's target directory).
///
/// The shim finds RAFT's, RMM's and CUDA's libraries through its RUNPATH: beside itself
/// (`$ORIGIN`), then the directories they were in at build time. `RAFT_RS_LIB_PATH` (a
/// `:`-separated list of directories) names other places, read now: the libraries found there
/// are loaded first and the shim binds to them.
///
/// The shim is never unloaded. Its build facts are checked against this crate's
/// ([`build_info`](crate::build_info)): a shim built against another stack is refused.
pub fn shim() -> Result<&'static RaftrsShim, &'static LoadError> {
    match SHIM.get_or_init(load) {
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

/// Where a library that ships with a program is looked for, the rule every raft-rs loader
/// shares (this shim's, raft-comms', raft-cuvs'): the path in the variable `var` when it is set
/// (then only there: `true`), else `file` beside the executable, then in `<its dir>/../lib` (a
/// deployed binary with its libraries). Callers append their own later places.
pub fn shipped_library_candidates(var: &str, file: &str) -> (Vec<PathBuf>, bool) {
    if let Some(path) = std::env::var_os(var).filter(|p| !p.is_empty()) {
        return (vec![PathBuf::from(path)], true);
    }
    let mut found = Vec::new();
    if let Some(dir) = std::env::current_exe().ok().and_then(|e| e.parent().map(Path::to_path_buf)) {
        found.push(dir.join(file));
        found.push(dir.join("../lib").join(file));
    }
    (found, false)
}

fn candidates() -> (Vec<PathBuf>, bool) {
    let (mut found, explicit) = shipped_library_candidates("RAFT_RS_SHIM", SHIM_FILE);
    if !explicit && !build_info::SHIM_PATH.is_empty() {
        found.push(PathBuf::from(build_info::SHIM_PATH));
    }
    (found, explicit)
}

/// Loads the libraries found in `RAFT_RS_LIB_PATH`'s directories, globally, leaves first: the
/// dynamic loader then satisfies the shim's needs with them, whatever its RUNPATH says.
fn preload() -> Vec<String> {
    let Some(dirs) = std::env::var_os("RAFT_RS_LIB_PATH") else { return Vec::new() };
    let mut problems = Vec::new();
    for name in DEPENDENCIES {
        let Some(path) = std::env::split_paths(&dirs).map(|d| d.join(name)).find(|p| p.exists()) else { continue };
        // SAFETY: loading a CUDA or RAPIDS library runs its initialisers, which make no CUDA
        // call that needs a device; the handle is leaked on purpose (never unloaded).
        match unsafe {
            libloading::os::unix::Library::open(Some(&path), libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_GLOBAL)
        } {
            Ok(lib) => std::mem::forget(lib),
            Err(e) => problems.push(format!("{}: {e}", path.display())),
        }
    }
    problems
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

fn load() -> Result<Loaded, LoadError> {
    let preload_problems = preload();
    let (paths, explicit) = candidates();
    let mut tried = Vec::new();
    for path in &paths {
        if !path.exists() {
            tried.push(format!("{} (absent)", path.display()));
            continue;
        }
        // SAFETY: the shim's initialisers (and RAFT's, RMM's, CUDA's static ones) make no call
        // that needs a device; RTLD_NOW resolves every symbol now, so a missing one is an error
        // here rather than a crash later. The library is never unloaded (kept in a static).
        let lib = match unsafe {
            libloading::os::unix::Library::open(Some(path), libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_LOCAL)
        } {
            Ok(lib) => lib,
            Err(e) => {
                tried.push(format!("{}: {e}", path.display()));
                continue;
            }
        };
        // SAFETY: every symbol is looked up with the signature of the header the bindings were
        // generated from; the shim's build facts are checked just below.
        let api = match unsafe { RaftrsShim::from_library(lib) } {
            Ok(api) => api,
            Err(e) => {
                tried.push(format!("{}: not this raft-sys version's shim ({e})", path.display()));
                continue;
            }
        };
        // SAFETY: takes nothing, returns a number: callable whatever the rest of the shim is.
        let theirs = unsafe { api.raftrs_header_hash() };
        let ours: u64 = env!("RAFT_SYS_HEADER_HASH").parse().unwrap_or(0);
        if theirs != ours {
            tried.push(format!(
                "{}: built from another raftrs.h (hash {theirs:#x}, these bindings {ours:#x}): a shim of another raft-sys version",
                path.display()
            ));
            continue;
        }
        if let Err(why) = same_build(&api) {
            tried.push(format!("{}: {why}", path.display()));
            continue;
        }
        return Ok(Loaded { api, path: path.clone() });
    }
    let mut message = format!("could not load the raft-rs native shim ({SHIM_FILE}): {}.", tried.join("; "));
    if explicit {
        message.push_str(" (RAFT_RS_SHIM names it.)");
    }
    if !preload_problems.is_empty() {
        message.push_str(&format!(" RAFT_RS_LIB_PATH: {}.", preload_problems.join("; ")));
    }
    message.push(' ');
    message.push_str(&advice());
    Err(LoadError { message })
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
