//! Loading cuVS at run time, on any machine (no GPU needed): each case runs in a fresh process
//! (this test binary, re-run with `RAFT_CUVS_CHILD`), since what a process has loaded is for
//! good.
//!
//! - without libcuvs the first call is a clear `Cuda` error, not a panic or a loader failure;
//! - cuVS loaded before the raft-rs shim: both work, on one nvJitLink (13.3);
//! - the shim loaded first, with a base stack whose nvJitLink is 13.2: the error says so and what
//!   to do; with `RAFT_RS_LIB_PATH` naming cuVS's nvJitLink, it works (the pinned stack now has
//!   13.3, and then the shim loaded first serves cuVS).
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
                println!("RESULT cuvs_version={}.{}.{}", v.0, v.1, v.2);
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

#[test]
fn an_older_nvjitlink_loaded_first_is_named_with_the_fix() {
    if let Some(s) = child_scenario() {
        return run_child(&s);
    }
    if !cuvs_found("an_older_nvjitlink_loaded_first_is_named_with_the_fix") {
        return;
    }
    let test = concat!(module_path!(), "::an_older_nvjitlink_loaded_first_is_named_with_the_fix");
    let mut envs = vec![("RAFT_CUVS_LIB", None), ("RAFT_CUVS_LIB_PATH", None), ("RAFT_RS_LIB_PATH", None), ("LD_LIBRARY_PATH", None)];
    if base_nvjitlink_is_13_3() {
        // The pinned stack carries nvJitLink 13.3 (libraft-cu13 asks for it): the shim loaded
        // first gives cuVS one it accepts, so there is no older one to name.
        let c = child(test, "shim-then-load", &envs);
        assert_eq!(c.result("runtime_version").as_deref(), Some("ok"), "{}", c.stdout);
        assert_eq!(c.result("load").as_deref(), Some("ok"), "{}\n{}", c.stdout, c.stderr);
        assert_eq!(c.result("rmm_map_shared").as_deref(), Some("true"), "{}", c.stdout);
        eprintln!("NOTE {test}: the base stack's nvJitLink is 13.3: the shim loaded first serves cuVS");
        return;
    }
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
