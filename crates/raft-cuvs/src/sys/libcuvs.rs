//! Where cuVS's C library (`libcuvs_c.so`) may be, what it needs loaded first, and the checks
//! that it is cuVS 26.08: the cuVS part of loading it at first use. The rules (search order,
//! RUNPATH, preloading, the message) are raft-sys's one loader, [`raft_sys::load`].
use super::bindings::{cuvsError_t, CuvsApi};
use libloading::os::unix::Library;
use raft_sys::load::{self, LoadError, Preload, Spec};
use std::ffi::{c_int, c_uint, c_void};
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
/// cuVS 26.08 needs nvJitLink 13.3 or newer, and a process holds one `libnvJitLink.so.13`. The
/// raft-rs shim, loaded first, loads cuVS's when it finds it (`RAFT_CUVS_LIB_PATH`, around
/// `RAFT_CUVS_LIB`, or where `cargo xtask deps --cuvs` unpacks), so the order of the first calls
/// does not matter there. When an older one is loaded all the same (`RAFT_RS_LIB_PATH` naming
/// the base stack's, a cuVS installed elsewhere), the error says so and what to set.
///
/// The library is never unloaded, and its version must be 26.08 (the bindings' struct layouts
/// are that release's).
pub fn api() -> Result<&'static CuvsApi, &'static LoadError> {
    match API.get_or_init(load_cuvs) {
        Ok(loaded) => Ok(&loaded.api),
        Err(e) => Err(e),
    }
}

/// The file cuVS was loaded from (`None` before the first call or when it failed).
pub fn loaded_from() -> Option<&'static Path> {
    API.get().and_then(|r| r.as_ref().ok()).map(|l| l.path.as_path())
}

/// The roots the build found (see `build.rs`).
fn build_roots() -> Vec<PathBuf> {
    std::env::split_paths(env!("RAFT_CUVS_ROOTS")).filter(|p| !p.as_os_str().is_empty()).collect()
}

/// Where the libraries cuVS needs may be, for the candidate `lib`, in the dynamic loader's own
/// order: `RAFT_CUVS_LIB_PATH`; the candidate's directory and the wheels' layout around it
/// (libcuvs's RPATH, which comes before `LD_LIBRARY_PATH`); `LD_LIBRARY_PATH`; the directories
/// raft-sys was built against (the shim's RUNPATH, which comes after it).
fn dependency_dirs(lib: &Path) -> Vec<PathBuf> {
    let mut dirs = load::env_dirs("RAFT_CUVS_LIB_PATH");
    if let Some(dir) = lib.parent().filter(|d| !d.as_os_str().is_empty()) {
        dirs.push(dir.to_path_buf());
        // The wheels' layout: <site>/libcuvs/lib64 beside <site>/nvidia/{cu13,nccl}/lib.
        dirs.push(dir.join("../../nvidia/cu13/lib"));
        dirs.push(dir.join("../../nvidia/nccl/lib"));
    }
    dirs.extend(load::env_dirs("LD_LIBRARY_PATH"));
    dirs.extend(std::env::split_paths(raft_sys::build_info::LIB_DIRS).filter(|p| !p.as_os_str().is_empty()));
    dirs
}

fn preload(lib: &Path) -> Vec<Preload> {
    vec![Preload { files: DEPENDENCIES.to_vec(), dirs: dependency_dirs(lib), global: false, named_by: None }]
}

/// Refuses an nvJitLink older than 13.3 already in the process: loading libcuvs.so over it fails
/// with an undefined symbol that names none of this.
fn check_nvjitlink(candidate: &Path) -> Result<(), String> {
    let Some(lib) = load::already_loaded(NVJITLINK) else { return Ok(()) };
    // SAFETY: only looks the symbol up; it is not called.
    if unsafe { lib.get::<*const c_void>(NVJITLINK_13_3) }.is_ok() {
        return Ok(());
    }
    let (version, from) = describe_nvjitlink(&lib);
    let by_shim = match raft_sys::loaded_from() {
        Some(shim) => format!(" (the raft-rs shim, {}, loaded it for cuSOLVER)", shim.display()),
        None => String::new(),
    };
    let newer = dependency_dirs(candidate)
        .into_iter()
        .find(|d| d.join(NVJITLINK).is_file() && !from.as_deref().is_some_and(|f| f.starts_with(d)))
        .map(|d| d.canonicalize().unwrap_or(d).display().to_string())
        .unwrap_or_else(|| "<a directory holding nvJitLink 13.3 or newer>".into());
    Err(format!(
        "{NVJITLINK} {version} is already loaded in this process{}{by_shim}, and cuVS 26.08 needs 13.3 or newer \
         (libcuvs.so calls __nvJitLinkCreate_13_3); a process holds one {NVJITLINK}. Make the shim load the newer one \
         first: RAFT_CUVS_LIB_PATH={newer} (the shim looks there too) or RAFT_RS_LIB_PATH={newer}, or call \
         raft_cuvs::load() before the first raft call",
        from.map(|f| format!(" (from {})", f.display())).unwrap_or_default()
    ))
}

/// nvJitLink's version (`nvJitLinkVersion`) and file, for the message.
fn describe_nvjitlink(lib: &Library) -> (String, Option<PathBuf>) {
    type VersionFn = unsafe extern "C" fn(*mut c_uint, *mut c_uint) -> c_int;
    // SAFETY: nvJitLinkVersion has this signature in every nvJitLink 12 and 13.
    let Ok(version_fn) = (unsafe { lib.get::<VersionFn>(b"nvJitLinkVersion\0") }) else { return ("(of unknown version)".into(), None) };
    let (mut major, mut minor) = (0, 0);
    // SAFETY: writes two integers through valid pointers; makes no CUDA call.
    let version =
        if unsafe { version_fn(&mut major, &mut minor) } == 0 { format!("{major}.{minor}") } else { "(of unknown version)".into() };
    (version, load::file_of(*version_fn as usize))
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

fn load_cuvs() -> Result<Loaded, LoadError> {
    let mut built = Vec::new();
    for root in build_roots() {
        for sub in ["libcuvs/lib64", "lib", "lib64"] {
            built.push(root.join(sub).join(LIB_FILE));
        }
    }
    let spec = Spec {
        what: "cuVS's C library",
        file: LIB_FILE,
        path_var: "RAFT_CUVS_LIB",
        dirs_var: Some("RAFT_CUVS_LIB_PATH"),
        built,
        system_search: true,
        reuse_symbol: Some(c"cuvsVersionGet"),
        preload: &preload,
        check: &check_nvjitlink,
        advice: advice(),
    };
    // SAFETY: the candidates are cuVS's C library and what `preload` names its own dependencies
    // (initialisers that need no device); the accepted library is kept by its function table,
    // kept for the process's life.
    let loaded = unsafe { load::open(&spec, |lib, _| api_of(lib)) }?;
    Ok(Loaded { api: loaded.api, path: loaded.path })
}

/// The cuVS release the bindings were generated from (the pinned wheel's headers: a test in
/// `sys/mod.rs` checks it against `cuvs/version_config.h`). Another patch of 26.08 is refused at
/// load unless [`ALLOW_OTHER_PATCH`] is set: the bindings write its structs by this release's
/// layout.
pub const BINDINGS_VERSION: (u16, u16, u16) = (26, 8, 1);

/// The knob that takes another patch release of cuVS 26.08 than the bindings'.
pub const ALLOW_OTHER_PATCH: &str = "RAFT_CUVS_ALLOW_OTHER_PATCH";

/// The C API of a loaded `libcuvs_c.so`, refused unless it is the release the bindings were
/// generated from ([`BINDINGS_VERSION`](BINDINGS_VERSION)); another patch of 26.08 only
/// with `RAFT_CUVS_ALLOW_OTHER_PATCH=1` (the bindings write cuVS's parameter structs by their
/// release's layout; helper 101 had a 26.08.02 taken in silence).
fn api_of(lib: Library) -> Result<CuvsApi, String> {
    // SAFETY: every symbol is looked up with the signature of cuVS 26.08's headers, which the
    // bindings were generated from; the version is checked just below.
    let api = unsafe { CuvsApi::from_library(lib) }.map_err(|e| format!("not the C API of cuVS 26.08 ({e})"))?;
    let (mut major, mut minor, mut patch) = (0u16, 0u16, 0u16);
    // SAFETY: writes three integers through valid pointers; makes no CUDA call.
    let status = unsafe { api.cuvsVersionGet(&mut major, &mut minor, &mut patch) };
    if status != cuvsError_t::CUVS_SUCCESS {
        return Err(format!("cuvsVersionGet failed (status {}): not a working cuVS 26.08", status.0));
    }
    let allowed = std::env::var_os(ALLOW_OTHER_PATCH).is_some_and(|v| v == "1");
    version_accepted((major, minor, patch), BINDINGS_VERSION, allowed)?;
    Ok(api)
}

/// Whether a cuVS of `found` may be used through bindings of `bindings`: the same release, or
/// another patch of the same `year.month` when `other_patch_allowed`.
fn version_accepted(found: (u16, u16, u16), bindings: (u16, u16, u16), other_patch_allowed: bool) -> Result<(), String> {
    let (major, minor, patch) = found;
    let (bm, bn, bp) = bindings;
    if (major, minor) != (bm, bn) {
        return Err(format!(
            "cuVS {major}.{minor:02}.{patch:02}, not {bm}.{bn:02} (the bindings' struct layouts are {bm}.{bn:02}.{bp:02}'s)"
        ));
    }
    if patch != bp && !other_patch_allowed {
        return Err(format!(
            "cuVS {major}.{minor:02}.{patch:02}, not {bm}.{bn:02}.{bp:02}: the bindings write cuVS's parameter structs by \
             {bm}.{bn:02}.{bp:02}'s headers. Install that release (`cargo xtask deps --cuvs`, or pip install \
             libcuvs-cu13=={bm}.{bn}.{bp}), or set {ALLOW_OTHER_PATCH}=1 to take {major}.{minor:02}.{patch:02} anyway"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_bindings_release_is_taken_unless_another_patch_is_allowed() {
        let b = (26, 8, 1);
        assert!(version_accepted((26, 8, 1), b, false).is_ok());
        let e = version_accepted((26, 8, 2), b, false).unwrap_err();
        assert!(e.contains("26.08.02, not 26.08.01") && e.contains(ALLOW_OTHER_PATCH), "{e}");
        assert!(version_accepted((26, 8, 0), b, true).is_ok());
        for other in [(26, 10, 0), (25, 8, 1)] {
            assert!(version_accepted(other, b, true).is_err(), "{other:?}");
        }
    }
}
