//! raft-comms refuses a shim built against another stack than raft-sys's (helper 101: only the
//! header's hash was compared, so a comms shim of RMM 26.08.01 ran RAFT's code on raft-sys's
//! 26.08.00 objects). Real parts: this build's own shim, copied with the librmm build-id it was
//! compiled with changed (what a shim of another build of the stack carries), loaded through
//! `RAFT_COMMS_SHIM` in a child process. CPU only: the refusal comes before NCCL or a device.
use std::path::Path;
use std::process::Command;

const ROLE: &str = "RAFT_COMMS_TEST_STACK_ROLE";
const TEST: &str = "a_shim_built_against_another_stack_is_refused";

fn child() {
    match raft_comms::nccl_info() {
        Ok(_) => println!("LOADED"),
        Err(e) => println!("REFUSED {e}"),
    }
}

fn load_in_a_child(shim: &Path) -> String {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", TEST, "--nocapture", "--test-threads=1"])
        .env(ROLE, "1")
        .env("RAFT_COMMS_SHIM", shim)
        .output()
        .unwrap();
    assert!(out.status.success(), "the child failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_shim_built_against_another_stack_is_refused() {
    if std::env::var_os(ROLE).is_some() {
        return child();
    }
    let built = env!("RAFT_COMMS_SHIM_PATH");
    let id = raft_sys::build_info::LIBRMM_BUILD_ID;
    if built.is_empty() || id.is_empty() {
        eprintln!("SKIP: this build made no comms shim, or its stack's librmm.so has no build-id");
        return;
    }
    if !Path::new(built).is_file() {
        // A test binary carried to another machine (the comms bundle): the build's shim is not there.
        eprintln!("SKIP: {built}, the shim this build made, is not on this machine");
        return;
    }
    let dir = std::env::temp_dir().join(format!("raft-comms-stack-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let copy = dir.join("libraftcomms_shim.so");
    let mut elf = std::fs::read(built).unwrap();
    // The same shim first: taken (the premise: RAFT_COMMS_SHIM's copy is what loads); its
    // refusal for want of NCCL would come later and says nothing of the stack.
    std::fs::write(&copy, &elf).unwrap();
    let same = load_in_a_child(&copy);
    assert!(!same.contains("raft-sys's shim against"), "the same shim was refused for its stack: {same}");
    // The build-id it was compiled with, one hex digit changed: a shim of another stack's build.
    let at = elf.windows(id.len()).position(|w| w == id.as_bytes()).expect("the librmm build-id in the comms shim");
    elf[at] = if elf[at] == b'0' { b'1' } else { b'0' };
    std::fs::write(&copy, &elf).unwrap();
    let other = load_in_a_child(&copy);
    assert!(other.contains("REFUSED") && other.contains("raft-sys's shim against"), "{other}");
    let _ = std::fs::remove_dir_all(&dir);
}
