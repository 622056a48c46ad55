//! Loading cuVS's C library (`libcuvs_c.so`) at first use, so that a binary built with cuVS
//! support starts without it, and says exactly what is missing when it is not there.
use super::bindings::CuvsApi;
use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};
use std::ffi::{c_int, c_uint, c_void, CStr};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// cuVS's C library.
pub const LIB_FILE: &str = "libcuvs_c.so";

/// What `libcuvs_c.so` and `libcuvs.so` need beyond the C and C++ runtimes, leaves first: each
/// one found in the directories of [`dependency_dirs`] and not loaded yet is loaded before them.
const DEPENDENCIES: &[&str] = &[
    "librapids_logger.so",
    "librmm.so",
    "libnvJitLink.so.13",
    "libcublasLt.so.13",
    "libcublas.so.13",
    "libcusparse.so.12",
    "libcusolver.so.12",
    "libcurand.so.10",
    "libnvrtc.so.13",
    "libnccl.so.2",
];

const NVJITLINK: &str = "libnvJitLink.so.13";
/// One of the eight nvJitLink entry points of version 13.3 that libcuvs.so 26.08 calls (and
/// libraft.so too): an older nvJitLink lacks them, and the dynamic loader then refuses libcuvs.
const NVJITLINK_13_3: &[u8] = b"__nvJitLinkCreate_13_3\0";

/// Why cuVS could not be loaded: which library, where it looked, what to do (raft-sys's type,
/// shared by every loader of this workspace).
pub use raft_sys::LoadError;

struct Loaded {
    api: CuvsApi,
    path: PathBuf,
}

static API: OnceLock<Result<Loaded, LoadError>> = OnceLock::new();

/// cuVS's C API, loading `libcuvs_c.so` on the first call (later calls are one atomic load).
///
/// A `libcuvs_c.so` the process already has (linked by the `cuvs` crate, loaded by Python's
/// `libcuvs`) is the one used, unless `RAFT_CUVS_LIB` is set: a second copy would be a second
/// cuVS. Otherwise it looks, in order:
/// 1. `RAFT_CUVS_LIB`: the path of a `libcuvs_c.so` (then only there);
/// 2. `RAFT_CUVS_LIB_PATH`: a `:`-separated list of directories;
/// 3. beside the executable, then in `<dir of the executable>/../lib`;
/// 4. where the build found cuVS: `RAFT_CUVS_PREFIX` at build time, beside the stack raft-sys
///    was built against (`cargo xtask deps --cuvs` unpacks there), that stack's own directory (a
///    Python environment with `libcuvs-cu13` installed), `CONDA_PREFIX`;
/// 5. the dynamic loader's own search (`LD_LIBRARY_PATH`, the system's directories).
///
/// Before loading it, the libraries it needs (librmm, nvJitLink, cuBLAS, cuSOLVER, cuSPARSE,
/// cuRAND, NVRTC, NCCL) that the process has not loaded yet are loaded from `RAFT_CUVS_LIB_PATH`,
/// the wheels' layout around the candidate (`../../nvidia/cu13/lib`, `../../nvidia/nccl/lib`) and
/// the directories raft-sys was built against; a library the process already has (librmm loaded
/// by the raft-rs shim, say) is the one cuVS binds to, so there is one RMM in the process.
///
/// cuVS 26.08 needs nvJitLink 13.3 or newer, and a process holds one `libnvJitLink.so.13`: when
/// an older one is loaded already (the raft-rs shim loads the base stack's 13.2 for cuSOLVER),
/// the error says so and what to set. Calling [`crate::load`] before the first raft call avoids
/// it: the newer one is loaded first and the shim then binds to it.
///
/// The library is never unloaded, and its version must be 26.08 (the bindings' struct layouts
/// are that release's).
pub fn api() -> Result<&'static CuvsApi, &'static LoadError> {
    match API.get_or_init(load) {
        Ok(loaded) => Ok(&loaded.api),
        Err(e) => Err(e),
    }
}

/// The file cuVS was loaded from (`None` before the first call or when it failed).
pub fn loaded_from() -> Option<&'static Path> {
    API.get().and_then(|r| r.as_ref().ok()).map(|l| l.path.as_path())
}

fn env_dirs() -> Vec<PathBuf> {
    std::env::var_os("RAFT_CUVS_LIB_PATH").map(|dirs| std::env::split_paths(&dirs).collect()).unwrap_or_default()
}

/// The roots the build found (see `build.rs`).
fn build_roots() -> Vec<PathBuf> {
    std::env::split_paths(env!("RAFT_CUVS_ROOTS")).filter(|p| !p.as_os_str().is_empty()).collect()
}

/// The `libcuvs_c.so` files to try, and whether `RAFT_CUVS_LIB` named the only one.
fn candidates() -> (Vec<PathBuf>, bool) {
    let (beside, explicit) = raft_sys::shipped_library_candidates("RAFT_CUVS_LIB", LIB_FILE);
    if explicit {
        return (beside, true);
    }
    let mut found: Vec<PathBuf> = env_dirs().into_iter().map(|d| d.join(LIB_FILE)).collect();
    found.extend(beside);
    for root in build_roots() {
        for sub in ["libcuvs/lib64", "lib", "lib64"] {
            found.push(root.join(sub).join(LIB_FILE));
        }
    }
    // Last, the bare name: the dynamic loader's own search.
    found.push(PathBuf::from(LIB_FILE));
    (found, false)
}

/// Where the libraries cuVS needs may be, for the candidate `lib`, in the dynamic loader's own
/// order: `RAFT_CUVS_LIB_PATH`; the candidate's directory and the wheels' layout around it
/// (libcuvs's RPATH, which comes before `LD_LIBRARY_PATH`); `LD_LIBRARY_PATH`; the directories
/// raft-sys was built against (the shim's RUNPATH, which comes after it).
fn dependency_dirs(lib: &Path) -> Vec<PathBuf> {
    let mut dirs = env_dirs();
    if let Some(dir) = lib.parent().filter(|d| !d.as_os_str().is_empty()) {
        dirs.push(dir.to_path_buf());
        // The wheels' layout: <site>/libcuvs/lib64 beside <site>/nvidia/{cu13,nccl}/lib.
        dirs.push(dir.join("../../nvidia/cu13/lib"));
        dirs.push(dir.join("../../nvidia/nccl/lib"));
    }
    if let Some(path) = std::env::var_os("LD_LIBRARY_PATH") {
        dirs.extend(std::env::split_paths(&path).filter(|p| !p.as_os_str().is_empty()));
    }
    dirs.extend(std::env::split_paths(raft_sys::build_info::LIB_DIRS).filter(|p| !p.as_os_str().is_empty()));
    dirs
}

/// The library the process already has under `soname`, if any (a new reference to it).
fn already_loaded(soname: &str) -> Option<Library> {
    // SAFETY: RTLD_NOLOAD only looks the name up among the loaded objects: nothing is loaded, no
    // initialiser runs.
    unsafe { Library::open(Some(soname), RTLD_NOW | libc::RTLD_NOLOAD) }.ok()
}

/// Loads the dependencies found in `dirs` that the process does not have yet, leaves first.
fn preload(dirs: &[PathBuf]) -> Vec<String> {
    let mut problems = Vec::new();
    for name in DEPENDENCIES {
        if already_loaded(name).is_some() {
            continue; // the dynamic loader gives cuVS this very one
        }
        let Some(path) = dirs.iter().map(|d| d.join(name)).find(|p| p.is_file()) else { continue };
        // SAFETY: loading a CUDA or RAPIDS library runs its initialisers, which make no CUDA call
        // that needs a device; the handle is leaked on purpose (never unloaded).
        match unsafe { Library::open(Some(&path), RTLD_NOW | RTLD_LOCAL) } {
            Ok(lib) => std::mem::forget(lib),
            Err(e) => problems.push(format!("{}: {e}", path.display())),
        }
    }
    problems
}

/// Refuses an nvJitLink older than 13.3 already in the process: loading libcuvs.so over it fails
/// with an undefined symbol that names none of this.
fn check_nvjitlink(dirs: &[PathBuf]) -> Result<(), String> {
    let Some(lib) = already_loaded(NVJITLINK) else { return Ok(()) };
    // SAFETY: only looks the symbol up; it is not called.
    if unsafe { lib.get::<*const c_void>(NVJITLINK_13_3) }.is_ok() {
        return Ok(());
    }
    let (version, from) = describe_nvjitlink(&lib);
    let by_shim = match raft_sys::loaded_from() {
        Some(shim) => format!(" (the raft-rs shim, {}, loaded it for cuSOLVER)", shim.display()),
        None => String::new(),
    };
    let newer = dirs
        .iter()
        .find(|d| d.join(NVJITLINK).is_file() && !from.as_deref().is_some_and(|f| Path::new(f).starts_with(d)))
        .map(|d| d.canonicalize().unwrap_or_else(|_| d.clone()).display().to_string())
        .unwrap_or_else(|| "<a directory holding nvJitLink 13.3 or newer>".into());
    Err(format!(
        "{NVJITLINK} {version} is already loaded in this process{}{by_shim}, and cuVS 26.08 needs 13.3 or newer \
         (libcuvs.so calls __nvJitLinkCreate_13_3); a process holds one {NVJITLINK}. Call raft_cuvs::load() before \
         the first raft call (it loads the newer one first, and the shim then binds to it), or make the shim load the \
         newer one: RAFT_RS_LIB_PATH={newer} (or LD_LIBRARY_PATH)",
        from.map(|f| format!(" (from {f})")).unwrap_or_default()
    ))
}

/// nvJitLink's version (`nvJitLinkVersion`) and file, for the message.
fn describe_nvjitlink(lib: &Library) -> (String, Option<String>) {
    type VersionFn = unsafe extern "C" fn(*mut c_uint, *mut c_uint) -> c_int;
    // SAFETY: nvJitLinkVersion has this signature in every nvJitLink 12 and 13.
    let Ok(version_fn) = (unsafe { lib.get::<VersionFn>(b"nvJitLinkVersion\0") }) else { return ("(of unknown version)".into(), None) };
    let (mut major, mut minor) = (0, 0);
    // SAFETY: writes two integers through valid pointers; makes no CUDA call.
    let version =
        if unsafe { version_fn(&mut major, &mut minor) } == 0 { format!("{major}.{minor}") } else { "(of unknown version)".into() };
    // SAFETY: an all-zero Dl_info is valid; dladdr fills it for an address inside a loaded object.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: the address is a function of a loaded library; dli_fname, when set, is a
    // NUL-terminated string owned by the loader, copied at once.
    let file = unsafe {
        (libc::dladdr(*version_fn as *const c_void, &mut info) != 0 && !info.dli_fname.is_null())
            .then(|| CStr::from_ptr(info.dli_fname).to_string_lossy().into_owned())
    };
    (version, file)
}

fn advice() -> String {
    format!(
        "raft-cuvs needs cuVS 26.08 ({LIB_FILE} and libcuvs.so, from the libcuvs-cu13==26.8.1 wheel) with nvJitLink 13.3 or \
         newer, cuRAND, NVRTC and NCCL. `cargo xtask deps --cuvs` fetches them beside the raft-rs stack, where builds then \
         find them; or set RAFT_CUVS_LIB to a {LIB_FILE}, or RAFT_CUVS_LIB_PATH to the directories holding it and those \
         libraries. The build looked in: {}.",
        if env!("RAFT_CUVS_ROOTS").is_empty() { "(nowhere: a documentation build)" } else { env!("RAFT_CUVS_ROOTS") }
    )
}

/// A `libcuvs_c.so` the process already has (linked by the `cuvs` crate, or loaded by Python's
/// `libcuvs`), and its file: loading another copy by path would give the process two cuVS.
fn already_in_process() -> Option<(Library, PathBuf)> {
    let lib = already_loaded(LIB_FILE)?;
    // SAFETY: only looks the symbol up.
    let symbol = unsafe { lib.get::<*const c_void>(b"cuvsVersionGet\0") }.ok()?;
    // SAFETY: an all-zero Dl_info is valid; dladdr fills it for an address inside a loaded
    // object; dli_fname, when set, is a NUL-terminated string owned by the loader, copied at once.
    let file = unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        (libc::dladdr(*symbol, &mut info) != 0 && !info.dli_fname.is_null())
            .then(|| PathBuf::from(CStr::from_ptr(info.dli_fname).to_string_lossy().into_owned()))
    }?;
    Some((lib, file))
}

fn load() -> Result<Loaded, LoadError> {
    if std::env::var_os("RAFT_CUVS_LIB").is_none() {
        if let Some((lib, path)) = already_in_process() {
            return api_of(lib, &path).map_err(|why| LoadError::new(format!("could not use the cuVS already loaded: {why}")));
        }
    }
    let (paths, explicit) = candidates();
    let mut tried = Vec::new();
    for path in &paths {
        let bare = path.components().count() == 1;
        if !bare && !path.exists() {
            tried.push(format!("{} (absent)", path.display()));
            continue;
        }
        let dirs = dependency_dirs(path);
        let problems = preload(&dirs);
        if let Err(why) = check_nvjitlink(&dirs) {
            return Err(LoadError::new(format!("could not load cuVS ({}): {why}.", path.display())));
        }
        // SAFETY: cuVS's initialisers (and its CUDA libraries') make no call that needs a device;
        // RTLD_NOW resolves every symbol now, so a missing one is an error here rather than a
        // crash later; RTLD_LOCAL keeps cuVS's C++ symbols out of the global namespace. The
        // library is never unloaded (kept in a static).
        let lib = match unsafe { Library::open(Some(path), RTLD_NOW | RTLD_LOCAL) } {
            Ok(lib) => lib,
            Err(e) if bare => {
                tried.push(format!("{LIB_FILE} through the dynamic loader's search: {e}"));
                continue;
            }
            Err(e) => {
                let extra = if problems.is_empty() { String::new() } else { format!(" (and: {})", problems.join("; ")) };
                tried.push(format!("{}: {e}{extra}", path.display()));
                continue;
            }
        };
        match api_of(lib, path) {
            Ok(loaded) => return Ok(loaded),
            Err(why) => tried.push(why),
        }
    }
    let mut message = format!("could not load cuVS's C library ({LIB_FILE}): {}.", tried.join("; "));
    if explicit {
        message.push_str(" (RAFT_CUVS_LIB names it.)");
    }
    message.push(' ');
    message.push_str(&advice());
    Err(LoadError::new(message))
}

/// The C API of a loaded `libcuvs_c.so`, refused unless it is cuVS 26.08.
fn api_of(lib: Library, path: &Path) -> Result<Loaded, String> {
    // SAFETY: every symbol is looked up with the signature of cuVS 26.08's headers, which the
    // bindings were generated from; the version is checked just below.
    let api = unsafe { CuvsApi::from_library(lib) }.map_err(|e| format!("{}: not the C API of cuVS 26.08 ({e})", path.display()))?;
    let (mut major, mut minor, mut patch) = (0u16, 0u16, 0u16);
    // SAFETY: writes three integers through valid pointers; makes no CUDA call.
    let status = unsafe { api.cuvsVersionGet(&mut major, &mut minor, &mut patch) };
    if status != super::cuvsError_t::CUVS_SUCCESS || (major, minor) != (26, 8) {
        return Err(format!(
            "{}: cuVS {major}.{minor:02}.{patch:02}, not 26.08 (the bindings' struct layouts are 26.08's)",
            path.display()
        ));
    }
    Ok(Loaded { api, path: path.to_path_buf() })
}
