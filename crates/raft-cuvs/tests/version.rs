//! A cuVS of another patch release than the bindings' is refused at load unless allowed (helper
//! 101: a `libcuvs_c.so` reporting 26.08.02 was taken in silence, and the bindings write cuVS's
//! parameter structs by 26.08.01's layout). A stand-in `libcuvs_c.so` is compiled here with every
//! symbol the bindings look up (none is called but `cuvsVersionGet`) and loaded in a child process
//! through `RAFT_CUVS_LIB`. CPU only; needs a C compiler (`cc`), as the build does.
use std::path::{Path, PathBuf};
use std::process::Command;

const ROLE: &str = "RAFT_CUVS_TEST_VERSION_ROLE";
const TEST: &str = "a_cuvs_of_another_patch_is_refused_unless_allowed";

/// Every function of the bindings' `CuvsApi`, as `libloading` looks them up.
fn bound_symbols() -> Vec<String> {
    let source = include_str!("../src/sys/bindings.rs");
    let start = source.find("pub struct CuvsApi {").expect("the bindings' CuvsApi");
    let body = &source[start..start + source[start..].find("\n}").expect("its end")];
    body.lines().filter_map(|l| l.trim().strip_prefix("pub ")?.split_once(':').map(|(name, _)| name.trim().to_string())).collect()
}

/// A `libcuvs_c.so` that says it is cuVS 26.08.`patch`.
fn stand_in(dir: &Path, patch: u16) -> PathBuf {
    let mut c = String::from("#include <stdint.h>\n");
    for name in bound_symbols() {
        c.push_str(&match name.as_str() {
            "cuvsVersionGet" => {
                format!("int cuvsVersionGet(uint16_t* a, uint16_t* b, uint16_t* c) {{ *a = 26; *b = 8; *c = {patch}; return 1; }}\n")
            }
            "cuvsGetLastErrorText" => "const char* cuvsGetLastErrorText(void) { return \"\"; }\n".to_string(),
            other => format!("int {other}(void) {{ return 0; }}\n"),
        });
    }
    let out = dir.join(format!("p{patch}"));
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("stub.c"), c).unwrap();
    let lib = out.join("libcuvs_c.so");
    let status = Command::new("cc").args(["-shared", "-fPIC", "-o"]).arg(&lib).arg(out.join("stub.c")).status().expect("cc (a C compiler)");
    assert!(status.success(), "cc failed on the stand-in");
    lib
}

fn load_in_a_child(lib: &Path, allow: bool) -> String {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", TEST, "--nocapture", "--test-threads=1"]).env(ROLE, "1").env("RAFT_CUVS_LIB", lib);
    cmd.env_remove(raft_cuvs::sys::ALLOW_OTHER_PATCH);
    if allow {
        cmd.env(raft_cuvs::sys::ALLOW_OTHER_PATCH, "1");
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "the child failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_cuvs_of_another_patch_is_refused_unless_allowed() {
    if std::env::var_os(ROLE).is_some() {
        match raft_cuvs::version() {
            Ok(v) => println!("LOADED {v:?}"),
            Err(e) => println!("REFUSED {e}"),
        }
        return;
    }
    assert!(bound_symbols().iter().any(|s| s == "cuvsVersionGet"), "{:?}", bound_symbols());
    if Command::new("cc").arg("--version").output().is_err() {
        // The cuVS GPU bundle's machine may have none; every build machine has one (the shim's).
        eprintln!("SKIP: no C compiler (cc) to build the stand-in libcuvs_c.so");
        return;
    }
    let dir = std::env::temp_dir().join(format!("raft-cuvs-version-{}", std::process::id()));
    let (_, _, bound) = raft_cuvs::sys::BINDINGS_VERSION;
    let same = load_in_a_child(&stand_in(&dir, bound), false);
    assert!(same.contains("LOADED"), "the bindings' own release was refused: {same}");
    let other = stand_in(&dir, bound + 1);
    let refused = load_in_a_child(&other, false);
    assert!(refused.contains("REFUSED") && refused.contains(raft_cuvs::sys::ALLOW_OTHER_PATCH), "{refused}");
    let allowed = load_in_a_child(&other, true);
    assert!(allowed.contains("LOADED"), "{allowed}");
    let _ = std::fs::remove_dir_all(&dir);
}
