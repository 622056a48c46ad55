//! The shim refuses a `librmm.so` of another build than it was linked against (helper 101: a
//! same-release librmm of another build ran under the shim's inline RMM code unnoticed). Real
//! parts: the pinned librmm.so with one byte of its build-id changed (it still loads), preloaded
//! through `RAFT_RS_LIB_PATH` in a child process, as a user's other install would be. CPU only:
//! loading the shim needs no driver.
use std::path::Path;
use std::process::Command;

const ROLE: &str = "RAFT_SYS_TEST_LIBRMM_ROLE";

/// In the child: load the shim and say what happened.
fn child() {
    match raft_sys::shim() {
        Ok(_) => println!("LOADED"),
        Err(e) => println!("REFUSED {e}"),
    }
}

fn run_child(lib_path: &Path, allow: bool) -> String {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = Command::new(exe);
    cmd.args(["--exact", "a_librmm_of_another_build_is_refused_at_load_unless_allowed", "--nocapture", "--test-threads=1"])
        .env(ROLE, "1")
        .env("RAFT_RS_LIB_PATH", lib_path)
        .env_remove("LD_LIBRARY_PATH")
        .env_remove(raft_sys::ALLOW_OTHER_LIBRMM);
    if allow {
        cmd.env(raft_sys::ALLOW_OTHER_LIBRMM, "1");
    }
    let out = cmd.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "the child failed: {text}\n{}", String::from_utf8_lossy(&out.stderr));
    text
}

#[test]
fn a_librmm_of_another_build_is_refused_at_load_unless_allowed() {
    if std::env::var_os(ROLE).is_some() {
        return child();
    }
    let (linked, id) = (raft_sys::build_info::LIBRMM_LINKED, raft_sys::build_info::LIBRMM_BUILD_ID);
    if linked.is_empty() || id.is_empty() {
        eprintln!("SKIP: this build linked no librmm.so with a build-id (a documentation build)");
        return;
    }
    if !Path::new(linked).is_file() {
        // A binary carried to another machine (the GPU bundle): the build's stack is not there.
        eprintln!("SKIP: {linked}, the librmm.so this build linked, is not on this machine");
        return;
    }
    let dir = std::env::temp_dir().join(format!("raft-sys-librmm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // The same file first: the same build is taken (the test's premise: the preload binds).
    let logger = Path::new(linked).with_file_name("librapids_logger.so");
    std::fs::copy(&logger, dir.join("librapids_logger.so")).unwrap();
    let mut elf = std::fs::read(linked).unwrap();
    std::fs::write(dir.join("librmm.so"), &elf).unwrap();
    let same = run_child(&dir, false);
    assert!(same.contains("LOADED"), "the same librmm.so was refused: {same}");
    // One byte of the build-id note changed: another build of the same release, to the loader.
    let bytes: Vec<u8> = (0..id.len() / 2).map(|i| u8::from_str_radix(&id[2 * i..2 * i + 2], 16).unwrap()).collect();
    let at = elf.windows(bytes.len()).position(|w| w == bytes.as_slice()).expect("the build-id's bytes in librmm.so");
    elf[at + bytes.len() - 1] ^= 0xff;
    std::fs::write(dir.join("librmm.so"), &elf).unwrap();
    let other = run_child(&dir, false);
    assert!(other.contains("REFUSED") && other.contains("is not the build the shim was linked against"), "{other}");
    assert!(other.contains(&dir.join("librmm.so").display().to_string()), "the refusal names the file: {other}");
    let allowed = run_child(&dir, true);
    assert!(allowed.contains("LOADED"), "{} did not take it: {allowed}", raft_sys::ALLOW_OTHER_LIBRMM);
    let _ = std::fs::remove_dir_all(&dir);
}
