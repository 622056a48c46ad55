//! Adds an rpath to the RAPIDS and CUDA library directories that raft-sys linked, so this
//! crate's test binaries run without LD_LIBRARY_PATH.
fn main() {
    if let Some(dirs) = std::env::var_os("DEP_RAFTRS_LIB_DIRS") {
        for dir in std::env::split_paths(&dirs) {
            println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
        }
        println!("cargo:rustc-link-arg=-Wl,--disable-new-dtags");
    }
}
