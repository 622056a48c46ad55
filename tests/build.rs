//! Adds the rpath to the RAPIDS/CUDA libraries, and compiles the benchmark's C++ baseline
//! (bench/baseline.cpp) with the shim's toolchain against the same headers.
fn main() {
    println!("cargo:rerun-if-changed=bench/baseline.cpp");
    if let Some(dirs) = std::env::var_os("DEP_RAFTRS_LIB_DIRS") {
        for dir in std::env::split_paths(&dirs) {
            println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
        }
        println!("cargo:rustc-link-arg=-Wl,--disable-new-dtags");
    }
    let Some(includes) = std::env::var_os("DEP_RAFTRS_INCLUDES") else { return };
    let mut build = cc::Build::new();
    build.cpp(true).std("c++20").file("bench/baseline.cpp").opt_level(2).debug(false);
    for dir in std::env::split_paths(&includes) {
        build.flag(format!("-isystem{}", dir.display()));
    }
    build.compile("raft_bench_baseline");
}
