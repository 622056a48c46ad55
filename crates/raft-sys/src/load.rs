//! Loading a native library at first use, the rules every raft-rs loader shares (the shim's
//! here, raft-comms', raft-cuvs'): a binary never dies before `main` for want of a library, and
//! the first call that needs one says which is missing, where it looked and what to set.
//!
//! A loader describes its library with a [`Spec`] and calls [`open`]; what is particular to it
//! (the symbol table it binds, the build facts or version it checks) is the `accept` closure.
//! Callers report a [`LoadError`] through `raft_error::Error::library_missing` (kind `Cuda`, the
//! kind of a missing CUDA stack; reason `LibraryMissing`; the `LoadError` as its source), so a
//! missing shim, libnccl or libcuvs reads the same whichever crate needed it.
use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_LOCAL, RTLD_NOW};
use std::ffi::{c_void, CStr};
use std::fmt;
use std::path::{Path, PathBuf};

/// Why a native library could not be loaded: which library, where it looked, what to set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadError {
    message: String,
}

impl LoadError {
    /// An error with this explanation.
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

/// Libraries to load before the one a [`Spec`] names, so that the dynamic loader satisfies its
/// needs with them (it matches a needed library by soname against what the process has, before
/// any RUNPATH or `LD_LIBRARY_PATH`).
#[derive(Debug, Clone, Default)]
pub struct Preload {
    /// File names (sonames), leaves first.
    pub files: Vec<&'static str>,
    /// Where to look, in order; the first directory holding a file gives it.
    pub dirs: Vec<PathBuf>,
    /// `RTLD_GLOBAL` (their symbols also serve libraries loaded later) rather than `RTLD_LOCAL`.
    pub global: bool,
    /// The variable that named `dirs` (the user's word, `RAFT_RS_LIB_PATH`): a file found there
    /// that fails to load ends the search with an error naming it and the variable. Without it
    /// the candidate went on and bound to another copy through its RUNPATH, and the user's
    /// library was dropped in silence (helper 101). `None`: a failure is only reported if the
    /// whole search fails.
    pub named_by: Option<&'static str>,
}

/// One native library and where it may be.
///
/// The search order [`open`] follows:
/// 1. `path_var`, when set: the library's path, and then only there;
/// 2. a library of this soname the process already has, when `reuse_symbol` names one of its
///    symbols (a second copy loaded by path would be a second instance of the library);
/// 3. `dirs_var`: a `:`-separated list of directories;
/// 4. beside the executable, then `<dir of the executable>/../lib` (a deployed binary with its
///    libraries);
/// 5. `built`: the files the build made or found;
/// 6. when `system_search`, the bare name: the dynamic loader's own search (`LD_LIBRARY_PATH`,
///    the system's directories).
///
/// RUNPATH: a library's own needs are found through its RUNPATH (beside itself with `$ORIGIN`,
/// then the directories of its build), after what the process has loaded already: `preload`
/// puts libraries there first, so a candidate binds to them whatever its RUNPATH says.
pub struct Spec<'a> {
    /// The library in words, for the message: "the raft-rs native shim".
    pub what: &'a str,
    /// Its file name (soname): `libraftrs_shim.so`.
    pub file: &'a str,
    /// The variable naming its path.
    pub path_var: &'a str,
    /// The variable naming directories to look in first, if any.
    pub dirs_var: Option<&'a str>,
    /// The files the build made or found, tried after the executable's directories.
    pub built: Vec<PathBuf>,
    /// Whether the bare name (the dynamic loader's own search) is the last candidate.
    pub system_search: bool,
    /// A symbol of the library: set, a copy the process already has is the one used.
    pub reuse_symbol: Option<&'a CStr>,
    /// What to load before a candidate (given its path), in order.
    pub preload: &'a dyn Fn(&Path) -> Vec<Preload>,
    /// Run after the preload, before a candidate is opened: an `Err` ends the search with that
    /// reason (a conflict no other candidate can avoid).
    pub check: &'a dyn Fn(&Path) -> Result<(), String>,
    /// What it needs and what to set, appended to the message.
    pub advice: String,
}

/// A library [`open`] loaded and accepted.
#[derive(Debug)]
pub struct Loaded<T> {
    /// What `accept` made of it (its symbol table).
    pub api: T,
    /// The file it was loaded from.
    pub path: PathBuf,
}

/// Where a library that ships with a program is looked for: the path in `var` when it is set
/// (then only there: `true`), else `file` beside the executable, then in `<its dir>/../lib`.
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

/// The directories of a `:`-separated variable (none when unset).
pub fn env_dirs(var: &str) -> Vec<PathBuf> {
    std::env::var_os(var).map(|dirs| std::env::split_paths(&dirs).filter(|p| !p.as_os_str().is_empty()).collect()).unwrap_or_default()
}

/// The candidates of `spec` in its search order (1, 3–6 above), and whether `path_var` named
/// the only one.
pub fn candidates(spec: &Spec<'_>) -> (Vec<PathBuf>, bool) {
    let (beside, explicit) = shipped_library_candidates(spec.path_var, spec.file);
    if explicit {
        return (beside, true);
    }
    let mut found: Vec<PathBuf> = spec.dirs_var.map(env_dirs).unwrap_or_default().into_iter().map(|d| d.join(spec.file)).collect();
    found.extend(beside);
    found.extend(spec.built.iter().cloned());
    if spec.system_search {
        found.push(PathBuf::from(spec.file));
    }
    (found, false)
}

/// The library the process already has under `soname`, if any (a new reference to it).
pub fn already_loaded(soname: &str) -> Option<Library> {
    // SAFETY: RTLD_NOLOAD only looks the name up among the loaded objects: nothing is loaded,
    // no initialiser runs.
    unsafe { Library::open(Some(soname), RTLD_NOW | libc::RTLD_NOLOAD) }.ok()
}

/// The file of the loaded object that holds `address` (`dladdr`; an integer, since it is only
/// looked up in the loader's tables, never read).
pub fn file_of(address: usize) -> Option<PathBuf> {
    // SAFETY: an all-zero Dl_info is valid; dladdr only reads the loader's tables for the
    // address; dli_fname, when set, is a NUL-terminated string owned by the loader, copied at
    // once.
    unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        (libc::dladdr(address as *const c_void, &mut info) != 0 && !info.dli_fname.is_null())
            .then(|| PathBuf::from(CStr::from_ptr(info.dli_fname).to_string_lossy().into_owned()))
    }
}

/// Loads each file of `preload` that the process does not have yet from the first of its
/// directories holding it, adding each it loaded to `brought` (its name and file); returns what
/// failed to load.
///
/// # Safety
/// Loading a library runs its initialisers (ELF constructors), which may do anything: every file
/// `preload` can name must be a library whose initialisers are sound to run in this process now
/// (the CUDA and RAPIDS libraries this crate's callers name make no call that needs a device).
/// (The twentieth audit, helper 97: as a safe function it let safe code run any file's code.)
///
/// ```compile_fail,E0133
/// let nothing = raft_sys::load::Preload { files: vec![], dirs: vec![], global: false, named_by: None };
/// raft_sys::load::preload(&nothing, &mut Vec::new()); // error: an `unsafe fn`
/// ```
pub unsafe fn preload(preload: &Preload, brought: &mut Vec<(&'static str, PathBuf)>) -> Vec<String> {
    let mut problems = Vec::new();
    let mode = RTLD_NOW | if preload.global { RTLD_GLOBAL } else { RTLD_LOCAL };
    for name in &preload.files {
        if already_loaded(name).is_some() {
            continue; // the dynamic loader gives every later library this very one
        }
        let Some(path) = preload.dirs.iter().map(|d| d.join(name)).find(|p| p.is_file()) else { continue };
        // SAFETY: the caller's contract: this file's initialisers are sound to run; the handle
        // is leaked on purpose (never unloaded).
        match unsafe { Library::open(Some(&path), mode) } {
            Ok(lib) => {
                std::mem::forget(lib);
                brought.push((name, path));
            }
            Err(e) => problems.push(format!("{}: {e}", path.display())),
        }
    }
    problems
}

/// A library an earlier candidate's preload brought into the process (it then failed to open)
/// that `candidate` would take from another file: its preloads would skip that name (the process
/// has it) and the dynamic loader would bind the candidate to the earlier one's copy. `None` when
/// every such name resolves to the very file already loaded.
fn held_elsewhere(spec: &Spec<'_>, candidate: &Path, held: &[(&'static str, PathBuf, PathBuf)]) -> Option<String> {
    let same = |a: &Path, b: &Path| a == b || a.canonicalize().ok().is_some_and(|a| b.canonicalize().ok() == Some(a));
    let wanted = (spec.preload)(candidate);
    held.iter().find_map(|(name, file, by)| {
        let wish = wanted.iter().filter(|p| p.files.contains(name)).find_map(|p| p.dirs.iter().map(|d| d.join(name)).find(|f| f.is_file()));
        (!wish.as_deref().is_some_and(|w| same(w, file))).then(|| {
            format!(
                "{name} is loaded from {} (brought in for {}, which then failed to open; it cannot be unloaded), and {} would \
                 run on it{}",
                file.display(),
                by.display(),
                candidate.display(),
                wish.map(|w| format!(" instead of {}", w.display())).unwrap_or_default()
            )
        })
    })
}

/// Loads the library `spec` names, trying its candidates in order: the first that opens and
/// that `accept` takes (binding its symbols, checking its version) is the one, never unloaded.
/// A candidate absent, or that the dynamic loader cannot open, is a line of the message and the
/// search goes on; one that opened but that `accept` refuses ends the search: it stays in the
/// process (its initialisers ran; RMM's unique symbols make it undeletable) with every library
/// it brought, and the next candidate's dependencies would bind to those by soname, a build
/// running on another's libraries with nothing said (the nineteenth audit, helper 93). A
/// candidate that fails to open after its preloads loaded libraries leaves those too: the search
/// goes on only to candidates whose own preloads take those very files, and ends, naming both,
/// at one that would take another copy (the twentieth audit).
///
/// # Errors
/// Every candidate refused: the message names the library, each place tried and why, and
/// `spec.advice`.
///
/// # Safety
/// Every candidate of `spec` and everything its `preload` names is loaded, which runs its
/// initialisers: each must be a library whose initialisers are sound to run in this process now
/// (as for [`preload`]). `accept` must keep the `Library` it is given loaded for as long as
/// anything it returns refers into it (the function tables of this crate's callers own it and
/// live for the process's life). (The twentieth audit, helper 97: as a safe function it let safe
/// code run any file's code, and return pointers into a library it had dropped.)
///
/// ```compile_fail,E0133
/// fn load(spec: &raft_sys::load::Spec<'_>) {
///     let _ = raft_sys::load::open(spec, |_, _| Ok(())); // error: an `unsafe fn`
/// }
/// ```
pub unsafe fn open<T>(spec: &Spec<'_>, mut accept: impl FnMut(Library, &Path) -> Result<T, String>) -> Result<Loaded<T>, LoadError> {
    if let Some(symbol) = spec.reuse_symbol.filter(|_| std::env::var_os(spec.path_var).is_none()) {
        if let Some((lib, path)) = in_process(spec.file, symbol) {
            return accept(lib, &path)
                .map(|api| Loaded { api, path })
                .map_err(|why| LoadError::new(format!("could not use {} already loaded: {why}", spec.what)));
        }
    }
    let (paths, explicit) = candidates(spec);
    let mut tried = Vec::new();
    let mut problems: Vec<String> = Vec::new();
    // What the preloads of candidates that then failed to open brought in (name, file, for whom):
    // it stays, and a later candidate whose own copy of one is another file would run on it
    // (the twentieth audit: the nineteenth's "left open", a failed open after its preloads).
    let mut held: Vec<(&'static str, PathBuf, PathBuf)> = Vec::new();
    for path in &paths {
        let bare = path.components().count() == 1;
        if !bare && !path.exists() {
            tried.push(format!("{} (absent)", path.display()));
            continue;
        }
        if let Some(why) = held_elsewhere(spec, path, &held) {
            let mut message =
                format!("could not load {} ({}): {}; {why}: no other candidate is tried. ", spec.what, spec.file, tried.join("; "));
            if !problems.is_empty() {
                // Often why the earlier candidate failed to open (the review, helper 99).
                message.push_str(&format!("Loading what it needs first: {}. ", problems.join("; ")));
            }
            message.push_str(&if explicit {
                format!("{} names it: point it at the right one. ", spec.path_var)
            } else {
                format!("Set {} to the right one (or rebuild or move the file that failed). ", spec.path_var)
            });
            message.push_str(&spec.advice);
            return Err(LoadError::new(message));
        }
        let mut brought = Vec::new();
        for wanted in (spec.preload)(path) {
            // SAFETY: this function's own contract covers what `spec.preload` names.
            let failed = unsafe { preload(&wanted, &mut brought) };
            if let (Some(var), false) = (wanted.named_by, failed.is_empty()) {
                return Err(LoadError::new(format!(
                    "could not load {} ({}): {var} names libraries that failed to load: {}. Fix or remove them from {var}: \
                     the candidate would otherwise run on other copies, found through its own search path. {}",
                    spec.what,
                    path.display(),
                    failed.join("; "),
                    spec.advice
                )));
            }
            for p in failed {
                if !problems.contains(&p) {
                    problems.push(p);
                }
            }
        }
        if let Err(why) = (spec.check)(path) {
            return Err(LoadError::new(format!("could not load {} ({}): {why}.", spec.what, path.display())));
        }
        // SAFETY: the caller's contract: a candidate's initialisers are sound to run (those of a
        // raft-rs or RAPIDS library, and of the CUDA libraries it needs, make no call that needs
        // a device); RTLD_NOW resolves every symbol now, so a missing one is an error here rather
        // than a crash later; RTLD_LOCAL keeps its C++ symbols out of the global namespace.
        // Never unloaded (`accept` keeps it).
        let lib = match unsafe { Library::open(Some(path), RTLD_NOW | RTLD_LOCAL) } {
            Ok(lib) => lib,
            Err(e) if bare => {
                tried.push(format!("{} through the dynamic loader's search: {e}", spec.file));
                held.extend(brought.into_iter().map(|(name, file)| (name, file, path.clone())));
                continue;
            }
            Err(e) => {
                tried.push(format!("{}: {e}", path.display()));
                held.extend(brought.into_iter().map(|(name, file)| (name, file, path.clone())));
                continue;
            }
        };
        match accept(lib, path) {
            Ok(api) => return Ok(Loaded { api, path: path.clone() }),
            Err(why) => {
                tried.push(format!("{}: {why}", path.display()));
                let mut message = format!("could not load {} ({}): {}.", spec.what, spec.file, tried.join("; "));
                message.push_str(&format!(
                    " That file was loaded, with the libraries it needs, and cannot be unloaded: no other candidate is \
                     tried (it would run on those). {} ",
                    if explicit {
                        format!("{} names it: point it at the right one.", spec.path_var)
                    } else {
                        format!("Set {} to the right one (or rebuild or move that file).", spec.path_var)
                    }
                ));
                message.push_str(&spec.advice);
                return Err(LoadError::new(message));
            }
        }
    }
    let mut message = format!("could not load {} ({}): {}.", spec.what, spec.file, tried.join("; "));
    if explicit {
        message.push_str(&format!(" ({} names it.)", spec.path_var));
    }
    if !problems.is_empty() {
        message.push_str(&format!(" Loading what it needs first: {}.", problems.join("; ")));
    }
    message.push(' ');
    message.push_str(&spec.advice);
    Err(LoadError::new(message))
}

/// A library of soname `file` the process already has, and its file (found through `symbol`).
fn in_process(file: &str, symbol: &CStr) -> Option<(Library, PathBuf)> {
    let lib = already_loaded(file)?;
    // SAFETY: only looks the symbol up; it is not called.
    let address = unsafe { lib.get::<*const c_void>(symbol.to_bytes_with_nul()) }.ok()?;
    let path = file_of(*address as usize)?;
    Some((lib, path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nothing(_: &Path) -> Vec<Preload> {
        Vec::new()
    }

    fn fine(_: &Path) -> Result<(), String> {
        Ok(())
    }

    /// [`open`] over the tests' own files: glibc's libraries and a file that is no library.
    fn open_test<T>(s: &Spec<'_>, accept: impl FnMut(Library, &Path) -> Result<T, String>) -> Result<Loaded<T>, LoadError> {
        // SAFETY: the tests' specs name only glibc's own libraries (whose initialisers run in
        // every process) and a file the dynamic loader refuses; `accept` binds nothing it keeps.
        unsafe { open(s, accept) }
    }

    fn spec<'a>(path_var: &'a str, built: Vec<PathBuf>) -> Spec<'a> {
        Spec {
            what: "a test library",
            file: "libraftrs_test_absent.so",
            path_var,
            dirs_var: None,
            built,
            system_search: false,
            reuse_symbol: None,
            preload: &nothing,
            check: &fine,
            advice: "Set THE_VARIABLE.".into(),
        }
    }

    /// The message names the library, each place and why, the variable that named it and the
    /// advice; `accept` is never reached.
    #[test]
    fn a_missing_library_is_named_with_every_place_tried() {
        let s = spec("RAFTRS_TEST_UNSET_VARIABLE", vec![PathBuf::from("/nonexistent/built/libraftrs_test_absent.so")]);
        let e = open_test(&s, |_, _| -> Result<(), String> { panic!("nothing to accept") }).unwrap_err();
        let m = e.message();
        assert!(m.starts_with("could not load a test library (libraftrs_test_absent.so): "), "{m}");
        assert!(m.contains("/nonexistent/built/libraftrs_test_absent.so (absent)"), "{m}");
        let exe_dir = std::env::current_exe().unwrap().parent().unwrap().join("libraftrs_test_absent.so");
        assert!(m.contains(&format!("{} (absent)", exe_dir.display())), "{m}");
        assert!(m.ends_with("Set THE_VARIABLE."), "{m}");
        assert!(!m.contains("names it"), "{m}");
    }

    /// A library that opens but that `accept` refuses ends the search, naming it (the nineteenth
    /// audit: the next candidate ran on the refused one's libraries); an accepted one is reported
    /// with its path.
    #[test]
    fn a_refused_library_ends_the_search_and_an_accepted_one_is_the_one() {
        let libm = ["/lib/x86_64-linux-gnu/libm.so.6", "/usr/lib64/libm.so.6", "/lib64/libm.so.6"]
            .iter()
            .map(PathBuf::from)
            .find(|p| p.is_file())
            .expect("libm on this machine");
        let s = spec("RAFTRS_TEST_UNSET_VARIABLE", vec![libm.clone(), libm.clone()]);
        let mut calls = 0;
        let e = open_test(&s, |_, _| -> Result<(), String> {
            calls += 1;
            Err("refused once".into())
        })
        .unwrap_err();
        assert_eq!(calls, 1, "a second candidate was tried after a loaded one was refused");
        let m = e.message();
        assert!(m.contains(&format!("{}: refused once", libm.display())), "{m}");
        assert!(m.contains("cannot be unloaded: no other candidate is tried") && m.contains("Set RAFTRS_TEST_UNSET_VARIABLE"), "{m}");
        assert!(m.ends_with("Set THE_VARIABLE."), "the library's own advice last: {m}");
        let loaded = open_test(&s, |lib, _| {
            // SAFETY: only looks the symbol up.
            Ok(unsafe { lib.get::<*const c_void>(b"cos\0") }.is_ok())
        })
        .unwrap();
        assert!(loaded.api, "cos found in libm");
        assert_eq!(loaded.path, libm);
    }

    /// A candidate that fails to open after its preloads brought libraries in leaves them in the
    /// process: a later candidate whose own copy of one is another file is not opened on it (the
    /// search ends, naming both); one whose preload takes the very same file goes on. Before,
    /// the second candidate loaded and bound to the first one's copy, with nothing said.
    #[test]
    fn a_candidate_that_failed_to_open_after_its_preloads_holds_later_ones_to_its_libraries() {
        let system = ["/lib/x86_64-linux-gnu", "/usr/lib64", "/lib64"]
            .iter()
            .map(PathBuf::from)
            .find(|d| d.join("libm.so.6").is_file() && d.join("libBrokenLocale.so.1").is_file() && d.join("libanl.so.1").is_file())
            .expect("glibc's libm, libBrokenLocale and libanl on this machine");
        let dir = std::env::temp_dir().join(format!("raftrs-load-held-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("deps")).unwrap();
        // The first candidate: a file the dynamic loader refuses, with its own copy of a library.
        let broken = dir.join("libraftrs_test_absent.so");
        std::fs::write(&broken, b"not an ELF file").unwrap();
        std::fs::copy(system.join("libBrokenLocale.so.1"), dir.join("deps/libBrokenLocale.so.1")).unwrap();
        assert!(already_loaded("libBrokenLocale.so.1").is_none() && already_loaded("libanl.so.1").is_none());
        let libm = system.join("libm.so.6");

        // Each candidate's preload takes libBrokenLocale from its own stack (the first from deps/).
        let (first, own, sys) = (broken.clone(), dir.join("deps"), system.clone());
        let beside = move |c: &Path| -> Vec<Preload> {
            vec![Preload {
                files: vec!["libBrokenLocale.so.1"],
                dirs: vec![if c == first { own.clone() } else { sys.clone() }],
                global: false,
                named_by: None,
            }]
        };
        let mut s = spec("RAFTRS_TEST_UNSET_VARIABLE", vec![broken.clone(), libm.clone()]);
        s.preload = &beside;
        let e = open_test(&s, |_, _| Ok(())).unwrap_err();
        let m = e.message();
        assert!(m.contains(&format!("libBrokenLocale.so.1 is loaded from {}", dir.join("deps/libBrokenLocale.so.1").display())), "{m}");
        assert!(
            m.contains(&format!("{} would run on it instead of {}", libm.display(), system.join("libBrokenLocale.so.1").display())),
            "{m}"
        );
        assert!(m.contains("no other candidate is tried") && m.ends_with("Set THE_VARIABLE."), "{m}");

        // The same file for every candidate (the user's directories): the search goes on.
        let sys = system.clone();
        let same = move |_: &Path| -> Vec<Preload> {
            vec![Preload { files: vec!["libanl.so.1"], dirs: vec![sys.clone()], global: false, named_by: None }]
        };
        s.preload = &same;
        let loaded = open_test(&s, |_, _| Ok(())).unwrap();
        assert_eq!(loaded.path, libm, "a candidate whose preload is the loaded file was not tried");
        assert!(already_loaded("libanl.so.1").is_some());
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A library the user's directories hold that fails to load ends the search, naming it and
    /// the variable (helper 101: the candidate loaded, bound to another copy through its
    /// RUNPATH, and the user's library was dropped in silence); from other directories the
    /// failure is only reported if the search fails.
    #[test]
    fn a_library_the_users_directories_hold_that_fails_to_load_is_an_error() {
        let dir = std::env::temp_dir().join(format!("raftrs-load-named-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("libraftrs_test_unloadable.so.1"), b"not an ELF file").unwrap();
        let libm = ["/lib/x86_64-linux-gnu", "/usr/lib64", "/lib64"]
            .iter()
            .map(|d| Path::new(d).join("libm.so.6"))
            .find(|p| p.is_file())
            .expect("glibc's libm on this machine");
        let (d1, d2) = (dir.clone(), dir.clone());
        let named = move |_: &Path| -> Vec<Preload> {
            vec![Preload {
                files: vec!["libraftrs_test_unloadable.so.1"],
                dirs: vec![d1.clone()],
                global: false,
                named_by: Some("THE_LIB_PATH"),
            }]
        };
        let unnamed = move |_: &Path| -> Vec<Preload> {
            vec![Preload { files: vec!["libraftrs_test_unloadable.so.1"], dirs: vec![d2.clone()], global: false, named_by: None }]
        };
        let mut s = spec("RAFTRS_TEST_UNSET_VARIABLE", vec![libm.clone()]);
        s.preload = &named;
        let e = open_test(&s, |_, _| Ok(())).unwrap_err();
        assert!(e.message().contains("THE_LIB_PATH names libraries that failed to load"), "{}", e.message());
        assert!(e.message().contains("libraftrs_test_unloadable.so.1"), "{}", e.message());
        s.preload = &unnamed;
        assert_eq!(open_test(&s, |_, _| Ok(())).unwrap().path, libm);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A failed check ends the search at once with its reason (no other candidate is tried).
    #[test]
    fn a_failed_check_ends_the_search() {
        fn refuse(_: &Path) -> Result<(), String> {
            Err("a conflict".into())
        }
        let mut s = spec("RAFTRS_TEST_UNSET_VARIABLE", vec![PathBuf::from("/")]);
        s.file = "libm.so.6";
        s.system_search = true;
        s.check = &refuse;
        let e = open_test(&s, |_, _| Ok(())).unwrap_err();
        assert_eq!(e.message(), "could not load a test library (/): a conflict.");
    }

    /// The soname of a library the process has is found, with its file; an absent one is not.
    #[test]
    fn already_loaded_and_its_file() {
        assert!(already_loaded("libraftrs_test_absent.so").is_none());
        let lib = already_loaded("libc.so.6").expect("libc is loaded");
        // SAFETY: only looks the symbol up.
        let address = unsafe { lib.get::<*const c_void>(b"malloc\0") }.unwrap();
        let file = file_of(*address as usize).expect("dladdr names malloc's file");
        assert!(file.to_string_lossy().contains("libc"), "{}", file.display());
    }
}
