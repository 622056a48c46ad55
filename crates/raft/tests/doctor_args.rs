//! `raft-doctor`'s command line (CPU).

/// An argument that is not UTF-8 (a stray byte from a script) is no reason to panic: the doctor
/// runs and reports as without it. `std::env::args` panicked (status 101, helper 111).
#[test]
fn an_argument_that_is_not_utf8_does_not_panic_the_doctor() {
    use std::os::unix::ffi::OsStrExt;
    let run = |extra: Option<&std::ffi::OsStr>| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_raft-doctor"));
        cmd.args(extra);
        cmd.output().unwrap()
    };
    let plain = run(None);
    let odd = run(Some(std::ffi::OsStr::from_bytes(b"--js\xffon")));
    let stderr = String::from_utf8_lossy(&odd.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(odd.status.code(), plain.status.code(), "{stderr}");
}
