//! `raft-doctor`'s command line (CPU).

/// The doctor cargo built, or, in the GPU bundle (`cargo xtask gpu-bundle`: tests in `tests/`,
/// binaries in `bin/`), the one beside this test (run 220 found the build's path missing there).
fn doctor() -> std::path::PathBuf {
    let built = std::path::PathBuf::from(env!("CARGO_BIN_EXE_raft-doctor"));
    if built.exists() {
        return built;
    }
    let me = std::env::current_exe().expect("current exe");
    me.parent().and_then(|d| d.parent()).map(|d| d.join("bin/raft-doctor")).expect("bundle layout")
}

/// An argument that is not UTF-8 (a stray byte from a script) is no reason to panic: the doctor
/// runs and reports as without it. `std::env::args` panicked (status 101, helper 111).
#[test]
fn an_argument_that_is_not_utf8_does_not_panic_the_doctor() {
    use std::os::unix::ffi::OsStrExt;
    let run = |extra: Option<&std::ffi::OsStr>| {
        let mut cmd = std::process::Command::new(doctor());
        cmd.args(extra);
        cmd.output().unwrap()
    };
    let plain = run(None);
    let odd = run(Some(std::ffi::OsStr::from_bytes(b"--js\xffon")));
    let stderr = String::from_utf8_lossy(&odd.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(odd.status.code(), plain.status.code(), "{stderr}");
}
