//! Loading cuVS at run time, on any machine (no GPU needed): each case runs in a fresh process
//! (this test binary, re-run with `RAFT_CUVS_CHILD`), since what a process has loaded is for
//! good.
//!
//! - without libcuvs the first call is a clear `Cuda` error, not a panic or a loader failure;
//! - cuVS loaded before the raft-rs shim: both work, on one nvJitLink (13.3);
//! - the shim loaded first binds cuVS's nvJitLink by itself when it can find it, so the order of
//!   the first calls does not matter (issue 34, item 9); made to bind the base stack's 13.2
//!   (`RAFT_RS_LIB_PATH`), the error says so and what to do (where the base stack still has 13.2; the pinned stack now has 13.3); with `RAFT_RS_LIB_PATH` naming
//!   cuVS's nvJitLink, it works.
use crate::common::{child_scenario, report, rerun, Child};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);

/// The directory of cuVS's libnvJitLink 13.3 as `cargo xtask deps --cuvs` unpacks it, when the
/// build found cuVS there.
fn cuvs_nvjitlink_dir() -> Option<String> {
    std::env::split_paths(env!("RAFT_CUVS_ROOTS"))
        .map(|root| root.join("nvidia/cu13/lib"))
        .find(|dir| dir.join("libnvJitLink.so.13").is_file() && dir.join("../../../libcuvs/lib64/libcuvs_c.so").is_file())
        .map(|d| d.display().to_string())
}

/// Whether this build can find cuVS (else the cases that need it skip, visibly).
fn cuvs_found(test: &str) -> bool {
    let found = std::env::split_paths(env!("RAFT_CUVS_ROOTS")).any(|root| root.join("libcuvs/lib64/libcuvs_c.so").is_file());
    if !found {
        eprintln!("SKIP {test}: the build found no cuVS (run `cargo xtask deps --cuvs`)");
    }
    found
}

/// What each child does.
fn run_child(scenario: &str) {
    match scenario {
        "load" => {
            let loaded = raft_cuvs::load();
            report("load", &loaded);
            report("version", &raft_cuvs::version());
            if let Ok(v) = raft_cuvs::version() {
                println!("RESULT cuvs_version={}.{}.{} display={v}", v.major, v.minor, v.patch);
            }
        }
        "load-then-shim" => {
            report("load", &raft_cuvs::load());
            // The shim loads now, with cuSOLVER and cuSPARSE: they bind the nvJitLink cuVS loaded.
            report("runtime_version", &raft_core::runtime_version());
            println!("RESULT nvjitlink_files={} rmm_files={}", mapped("libnvJitLink.so.13"), mapped("librmm.so"));
            same_rmm_map();
        }
        "shim-then-load" => {
            report("runtime_version", &raft_core::runtime_version());
            report("load", &raft_cuvs::load());
            // The same error again, from the call that needed cuVS: no retry, no panic.
            report("version", &raft_cuvs::version());
            if raft_cuvs::sys::loaded_from().is_some() {
                same_rmm_map();
            }
        }
        "shim-only" => {
            // raft-sys's own first call: no raft-cuvs code runs before it.
            println!("RESULT shim={}", if raft_sys::shim().is_ok() { "ok" } else { "failed" });
            println!("RESULT nvjitlink={}", mapped_file("libnvJitLink.so.13").unwrap_or_default());
        }
        "already-loaded" => {
            report("load", &raft_cuvs::load());
            if let Some(from) = raft_cuvs::sys::loaded_from() {
                println!("RESULT from={}", from.display());
            }
            println!("RESULT cuvs_c_files={}", mapped("libcuvs_c.so"));
        }
        other => panic!("unknown scenario {other}"),
    }
}

/// Whether RMM's per-device resource map is one object for raft-rs and cuVS: what the shim
/// binds (`raft_core::memory::rmm_map_address`) against what libcuvs.so and libcuvs_c.so bind
/// (a GNU unique symbol, which the dynamic loader makes one per process even across
/// `RTLD_LOCAL` libraries). Then a resource raft-rs installs is the one cuVS allocates from.
fn same_rmm_map() {
    const MAP: &[u8] = b"_ZZN3rmm9_RMM_26_82mr6detail11get_ref_mapEvE21device_id_to_resource\0";
    let ours = raft_core::memory::rmm_map_address().expect("the shim's map");
    let theirs: Vec<usize> = [&b"libcuvs.so\0"[..], &b"libcuvs_c.so\0"[..]]
        .iter()
        .map(|lib| {
            // SAFETY: RTLD_NOLOAD only looks up a loaded library; dlsym only looks up an address;
            // the handle is closed right after.
            unsafe {
                let h = libc::dlopen(lib.as_ptr().cast(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
                assert!(!h.is_null(), "{} is not loaded", String::from_utf8_lossy(lib));
                let p = libc::dlsym(h, MAP.as_ptr().cast()) as usize;
                libc::dlclose(h);
                p
            }
        })
        .collect();
    println!("RESULT rmm_map_shared={}", theirs.iter().all(|p| *p == ours));
}

/// How many different files named `name` the process has mapped.
fn mapped(name: &str) -> usize {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let mut files: Vec<&str> =
        maps.lines().filter_map(|l| l.split_whitespace().nth(5)).filter(|f| f.ends_with(&format!("/{name}"))).collect();
    files.sort();
    files.dedup();
    files.len()
}

/// The file named `name` the process has mapped, if any.
fn mapped_file(name: &str) -> Option<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let found = maps.lines().filter_map(|l| l.split_whitespace().nth(5)).find(|f| f.ends_with(&format!("/{name}")));
    found.map(str::to_string)
}

fn child(test: &str, scenario: &str, envs: &[(&str, Option<&str>)]) -> Child {
    let c = rerun(test, scenario, envs, LIMIT);
    c.assert_code(0);
    c
}

#[test]
fn without_libcuvs_the_first_call_is_a_clear_error() {
    if let Some(s) = child_scenario() {
        return run_child(&s);
    }
    let c = child(
        concat!(module_path!(), "::without_libcuvs_the_first_call_is_a_clear_error"),
        "load",
        &[("RAFT_CUVS_LIB", Some("/nonexistent/libcuvs_c.so")), ("RAFT_CUVS_LIB_PATH", None)],
    );
    assert_eq!(c.result("load").as_deref(), Some("cuda"), "{}", c.stdout);
    assert_eq!(c.result("load_who").as_deref(), Some("raft_cuvs::load"));
    assert_eq!(c.result("load_reason").as_deref(), Some("library-missing"), "the reason of a missing shim or libnccl too");
    let m = c.message("load").unwrap();
    assert!(m.contains("could not load cuVS's C library (libcuvs_c.so): /nonexistent/libcuvs_c.so (absent)"), "{m}");
    assert!(m.contains("(RAFT_CUVS_LIB names it.)"), "{m}");
    assert!(m.contains("cargo xtask deps --cuvs"), "{m}");
    // Every later call gives the same error, naming itself.
    assert_eq!(c.result("version").as_deref(), Some("cuda"));
    assert_eq!(c.result("version_who").as_deref(), Some("raft_cuvs::version"));
    assert!(!c.stderr.contains("panicked"), "{}", c.stderr);
}

#[test]
fn cuvs_loaded_first_gives_the_shim_its_nvjitlink() {
    if let Some(s) = child_scenario() {
        return run_child(&s);
    }
    if !cuvs_found("cuvs_loaded_first_gives_the_shim_its_nvjitlink") {
        return;
    }
    let envs = [("RAFT_CUVS_LIB", None), ("RAFT_CUVS_LIB_PATH", None), ("RAFT_RS_LIB_PATH", None), ("LD_LIBRARY_PATH", None)];
    let test = concat!(module_path!(), "::cuvs_loaded_first_gives_the_shim_its_nvjitlink");
    let c = child(test, "load", &envs);
    assert_eq!(c.result("load").as_deref(), Some("ok"), "{}", c.stdout);
    assert_eq!(c.result("cuvs_version").as_deref(), Some("26.8.1"));
    assert_eq!(c.result("display").as_deref(), Some("26.08.01"));
    let c = child(test, "load-then-shim", &envs);
    assert_eq!(c.result("load").as_deref(), Some("ok"), "{}", c.stdout);
    assert_eq!(c.result("runtime_version").as_deref(), Some("ok"), "{}", c.stdout);
    // One nvJitLink and one RMM in the process: the shim bound the ones cuVS loaded, and RMM's
    // per-device map is one object for both.
    assert_eq!(c.result("nvjitlink_files").as_deref(), Some("1"), "{}", c.stdout);
    assert_eq!(c.result("rmm_files").as_deref(), Some("1"), "{}", c.stdout);
    assert_eq!(c.result("rmm_map_shared").as_deref(), Some("true"), "{}", c.stdout);
}

/// Whether the libnvJitLink.so.13 in raft-sys's library directories (what the shim loads) has
/// 13.3's entry points, as cuVS needs.
fn base_nvjitlink_is_13_3() -> bool {
    std::env::split_paths(raft_sys::build_info::LIB_DIRS)
        .map(|d| d.join("libnvJitLink.so.13"))
        .find(|f| f.is_file())
        .and_then(|f| std::fs::read(f).ok())
        .is_some_and(|b| b.windows(22).any(|w| w == b"__nvJitLinkCreate_13_3"))
}

/// The directory of the base stack's nvJitLink (13.2), as raft-sys was built against it.
fn base_nvjitlink_dir() -> Option<std::path::PathBuf> {
    std::env::split_paths(raft_sys::build_info::LIB_DIRS).find(|d| d.join("libnvJitLink.so.13").is_file())
}

/// Issue 34, item 9, on any machine: raft-sys's first load of the shim, before any raft-cuvs
/// code, binds the nvJitLink in cuVS's directories (here `RAFT_CUVS_LIB_PATH` naming a copy of
/// one) rather than the one in the shim's RUNPATH; `RAFT_RS_LIB_PATH` still comes first.
#[test]
fn the_shim_binds_the_nvjitlink_cuvs_would() {
    if let Some(s) = child_scenario() {
        return run_child(&s);
    }
    let test = concat!(module_path!(), "::the_shim_binds_the_nvjitlink_cuvs_would");
    let Some(base) = base_nvjitlink_dir() else {
        eprintln!("SKIP {test}: the build's stack has no libnvJitLink.so.13 (a documentation build)");
        return;
    };
    // A second file, as cuVS's own nvJitLink is: a hard link (same file system) or a copy.
    let cuvs_dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("cuvs-nvjitlink");
    let _ = std::fs::remove_dir_all(&cuvs_dir);
    std::fs::create_dir_all(&cuvs_dir).unwrap();
    let theirs = cuvs_dir.join("libnvJitLink.so.13");
    if std::fs::hard_link(base.join("libnvJitLink.so.13"), &theirs).is_err() {
        std::fs::copy(base.join("libnvJitLink.so.13"), &theirs).unwrap();
    }
    let cuvs = cuvs_dir.to_str().unwrap();
    let base = base.to_str().unwrap();
    let mut envs = vec![("RAFT_CUVS_LIB_PATH", Some(cuvs)), ("RAFT_CUVS_LIB", None), ("RAFT_RS_LIB_PATH", None), ("LD_LIBRARY_PATH", None)];
    let c = child(test, "shim-only", &envs);
    assert_eq!(c.result("shim").as_deref(), Some("ok"), "{}\n{}", c.stdout, c.stderr);
    assert_eq!(c.result("nvjitlink").as_deref(), Some(theirs.to_str().unwrap()), "{}", c.stdout);
    // The user's RAFT_RS_LIB_PATH wins over cuVS's directories.
    envs[2] = ("RAFT_RS_LIB_PATH", Some(base));
    let c = child(test, "shim-only", &envs);
    assert_eq!(c.result("shim").as_deref(), Some("ok"), "{}\n{}", c.stdout, c.stderr);
    assert_eq!(c.result("nvjitlink"), Some(format!("{base}/libnvJitLink.so.13")), "{}", c.stdout);
}

#[test]
fn the_shim_loaded_first_binds_cuvs_nvjitlink_or_names_the_fix() {
    if let Some(s) = child_scenario() {
        return run_child(&s);
    }
    if !cuvs_found("the_shim_loaded_first_binds_cuvs_nvjitlink_or_names_the_fix") {
        return;
    }
    let test = concat!(module_path!(), "::the_shim_loaded_first_binds_cuvs_nvjitlink_or_names_the_fix");
    let mut envs = vec![("RAFT_CUVS_LIB", None), ("RAFT_CUVS_LIB_PATH", None), ("RAFT_RS_LIB_PATH", None), ("LD_LIBRARY_PATH", None)];
    // Nothing set, the shim first: it found cuVS's nvJitLink beside the stack by itself.
    let c = child(test, "shim-then-load", &envs);
    assert_eq!(c.result("runtime_version").as_deref(), Some("ok"), "{}", c.stdout);
    assert_eq!(c.result("load").as_deref(), Some("ok"), "{}\n{}", c.stdout, c.stderr);
    assert_eq!(c.result("rmm_map_shared").as_deref(), Some("true"), "{}", c.stdout);

    if base_nvjitlink_is_13_3() {
        eprintln!("NOTE {test}: the base stack's nvJitLink is 13.3: there is no older one to name");
        return;
    }
    // Made to bind the base stack's 13.2 (RAFT_RS_LIB_PATH wins): the error names it and the fix.
    let base = base_nvjitlink_dir().expect("the base stack's nvJitLink").display().to_string();
    envs[2] = ("RAFT_RS_LIB_PATH", Some(base.as_str()));
    let c = child(test, "shim-then-load", &envs);
    assert_eq!(c.result("runtime_version").as_deref(), Some("ok"), "{}", c.stdout);
    assert_eq!(c.result("load").as_deref(), Some("cuda"), "{}", c.stdout);
    let m = c.message("load").unwrap();
    assert!(m.contains("libnvJitLink.so.13 13.2 is already loaded in this process"), "{m}");
    assert!(m.contains("the raft-rs shim"), "{m}");
    assert!(m.contains("cuVS 26.08 needs 13.3 or newer"), "{m}");
    assert!(m.contains("raft_cuvs::load() before the first raft call"), "{m}");
    assert!(m.contains("RAFT_RS_LIB_PATH="), "{m}");
    assert_eq!(c.result("version").as_deref(), Some("cuda"));

    // The fix the message names: the shim preloads cuVS's nvJitLink from RAFT_RS_LIB_PATH.
    let dir = cuvs_nvjitlink_dir().expect("cuVS's nvJitLink beside libcuvs");
    envs[2] = ("RAFT_RS_LIB_PATH", Some(dir.as_str()));
    let c = child(test, "shim-then-load", &envs);
    assert_eq!(c.result("runtime_version").as_deref(), Some("ok"), "{}", c.stdout);
    assert_eq!(c.result("load").as_deref(), Some("ok"), "{}\n{}", c.stdout, c.stderr);
    assert_eq!(c.result("rmm_map_shared").as_deref(), Some("true"), "{}", c.stdout);
}

#[test]
fn a_libcuvs_the_process_already_has_is_the_one_used() {
    if let Some(s) = child_scenario() {
        return run_child(&s);
    }
    let test = concat!(module_path!(), "::a_libcuvs_the_process_already_has_is_the_one_used");
    if !cuvs_found(test) {
        return;
    }
    // As a binary linking the `cuvs` crate starts: libcuvs_c.so loaded before main, found by the
    // dynamic loader. raft-cuvs must use that one, not load its own copy from the build's path.
    let root = std::env::split_paths(env!("RAFT_CUVS_ROOTS")).find(|r| r.join("libcuvs/lib64/libcuvs_c.so").is_file()).unwrap();
    let lib = root.join("libcuvs/lib64/libcuvs_c.so");
    let mut dirs = vec![root.join("nvidia/cu13/lib"), root.join("nvidia/nccl/lib")];
    dirs.extend(std::env::split_paths(raft_sys::build_info::LIB_DIRS));
    let path = std::env::join_paths(dirs).unwrap();
    let c = child(
        test,
        "already-loaded",
        &[
            ("LD_PRELOAD", Some(lib.to_str().unwrap())),
            ("LD_LIBRARY_PATH", Some(path.to_str().unwrap())),
            ("RAFT_CUVS_LIB", None),
            ("RAFT_CUVS_LIB_PATH", None),
        ],
    );
    assert_eq!(c.result("load").as_deref(), Some("ok"), "{}\n{}", c.stdout, c.stderr);
    assert_eq!(c.result("from").map(std::path::PathBuf::from), Some(lib));
    assert_eq!(c.result("cuvs_c_files").as_deref(), Some("1"), "{}", c.stdout);
}
