//! Compiles the benchmark's C++ baseline (bench/baseline.cpp) with the shim's toolchain against
//! the same headers, and links it to the RAPIDS/CUDA libraries the shim was linked with.
//!
//! raft-sys links nothing into Rust binaries (it loads its shim at run time), so this test crate
//! links the baseline's libraries itself and gives its binaries an rpath to them: only this
//! workspace-internal crate does that; users' binaries need neither.
#[path = "../crates/raft-sys/build/stack.rs"]
mod stack;

use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=bench/baseline.cpp");
    println!("cargo:rerun-if-changed=../crates/raft-sys/build/stack.rs");
    // DEP_RAFTRS_*: raft-sys's build metadata; absent in documentation builds, which need no
    // baseline.
    let (Some(includes), Some(lib_dirs)) = (env::var_os("DEP_RAFTRS_INCLUDES"), env::var_os("DEP_RAFTRS_LIB_DIRS")) else { return };
    let mut build = cc::Build::new();
    build.cpp(true).std("c++20").file("bench/baseline.cpp").opt_level(2).debug(false);
    for dir in env::split_paths(&includes) {
        build.flag(format!("-isystem{}", dir.display()));
    }
    // The static baseline first, then the libraries it calls.
    build.compile("raft_bench_baseline");

    let found = stack::Stack {
        root: env::var_os("DEP_RAFTRS_ROOT").map(PathBuf::from).unwrap_or_default(),
        source: "raft-sys".into(),
        includes: env::split_paths(&includes).collect(),
        lib_dirs: env::split_paths(&lib_dirs).collect(),
    };
    for dir in &found.lib_dirs {
        println!("cargo:rustc-link-search=native={}", dir.display());
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
    }
    // DT_RPATH rather than RUNPATH: it also serves the libraries' own dependencies (cuBLAS's
    // cuBLASLt), as LD_LIBRARY_PATH would.
    println!("cargo:rustc-link-arg=-Wl,--disable-new-dtags");
    for name in stack::LIBRARIES {
        match found.library(name) {
            // The CUDA wheels ship only versioned files (`libcudart.so.13`): link those by name.
            Some((_, file)) if file != format!("lib{name}.so") => println!("cargo:rustc-link-lib=dylib:+verbatim={file}"),
            Some(_) => println!("cargo:rustc-link-lib=dylib={name}"),
            None => panic!("lib{name}.so is not in raft-sys's library directories {:?}", found.lib_dirs),
        }
    }
}
