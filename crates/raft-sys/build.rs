//! Finds RAFT, RMM and the CUDA 13.2 libraries, compiles the C++ shim against them and links
//! it: the static shim first, then the libraries' shared objects.
use std::env;
use std::path::{Path, PathBuf};

/// The pinned release whose wheels `cargo xtask deps` unpacks.
const PINNED: &str = "26.08.00";

/// Reads a knob and asks cargo to rerun when it changes.
fn env_var_rerun(name: &str) -> Option<String> {
    println!("cargo:rerun-if-env-changed={name}");
    env::var(name).ok().filter(|v| !v.is_empty())
}

/// Where the native stack's headers and libraries are.
struct Stack {
    root: PathBuf,
    includes: Vec<PathBuf>,
    lib_dirs: Vec<PathBuf>,
}

impl Stack {
    /// The layout `cargo xtask deps` makes: wheels unpacked side by side.
    fn wheels(root: &Path) -> Option<Stack> {
        if !root.join("libraft/include/raft/core/device_resources.hpp").is_file() {
            return None;
        }
        Some(Stack {
            root: root.to_path_buf(),
            // RMM's own copy of CCCL comes before anything the CUDA wheels carry.
            includes: ["libraft/include", "librmm/include", "librmm/include/rapids", "rapids_logger/include", "nvidia/cu13/include"]
                .iter()
                .map(|p| root.join(p))
                .collect(),
            lib_dirs: ["librmm/lib64", "rapids_logger/lib64", "nvidia/cu13/lib"].iter().map(|p| root.join(p)).collect(),
        })
    }

    /// A conda environment or a system install: `include/raft`, `include/rapids`, `lib`.
    fn prefix(root: &Path) -> Option<Stack> {
        if !root.join("include/raft/core/device_resources.hpp").is_file() {
            return None;
        }
        let mut includes = vec![root.join("include"), root.join("include/rapids")];
        let mut lib_dirs = vec![root.join("lib"), root.join("lib64")];
        let target = root.join("targets/x86_64-linux");
        if target.is_dir() {
            includes.push(target.join("include"));
            lib_dirs.push(target.join("lib"));
        }
        includes.retain(|p| p.is_dir());
        lib_dirs.retain(|p| p.is_dir());
        Some(Stack { root: root.to_path_buf(), includes, lib_dirs })
    }

    fn at(root: &Path) -> Option<Stack> {
        Stack::wheels(root).or_else(|| Stack::prefix(root))
    }

    /// The file to link for `lib<name>`: the plain `.so` when there is one, else a versioned one
    /// (the CUDA wheels ship only `libcudart.so.13` and the like).
    fn library(&self, name: &str) -> Option<String> {
        let plain = format!("lib{name}.so");
        for dir in &self.lib_dirs {
            if dir.join(&plain).exists() {
                return Some(plain);
            }
        }
        for dir in &self.lib_dirs {
            let Ok(entries) = std::fs::read_dir(dir) else { continue };
            let mut found: Vec<String> =
                entries.filter_map(|e| e.ok()?.file_name().into_string().ok()).filter(|f| f.starts_with(&format!("{plain}."))).collect();
            found.sort();
            if let Some(f) = found.into_iter().next() {
                return Some(f);
            }
        }
        None
    }
}

/// The cache `cargo xtask deps` fills; the same rule lives in `xtask/src/deps.rs`.
fn cache_dir() -> Option<PathBuf> {
    if let Some(dir) = env_var_rerun("RAFT_RS_CACHE") {
        return Some(PathBuf::from(dir));
    }
    if let Some(dir) = env_var_rerun("XDG_CACHE_HOME") {
        return Some(PathBuf::from(dir).join("raft-rs"));
    }
    env_var_rerun("HOME").map(|h| PathBuf::from(h).join(".cache/raft-rs"))
}

fn find_stack() -> Result<Stack, String> {
    let mut tried = Vec::new();
    if let Some(prefix) = env_var_rerun("RAFT_SYS_PREFIX") {
        let root = PathBuf::from(&prefix);
        return Stack::at(&root).ok_or(format!(
            "RAFT_SYS_PREFIX={prefix} holds no RAFT headers (looked for include/raft/core/device_resources.hpp \
             and libraft/include/raft/core/device_resources.hpp)"
        ));
    }
    if let Some(cache) = cache_dir() {
        let root = cache.join(PINNED).join("prefix");
        if let Some(stack) = Stack::at(&root) {
            return Ok(stack);
        }
        tried.push(root.display().to_string());
    }
    if let Some(conda) = env_var_rerun("CONDA_PREFIX") {
        let root = PathBuf::from(conda);
        if let Some(stack) = Stack::at(&root) {
            return Ok(stack);
        }
        tried.push(root.display().to_string());
    }
    Err(format!(
        "RAFT {PINNED} was not found (looked in: {}).\n\
         Run `cargo xtask deps` to fetch the pinned RAFT/RMM/CUDA wheels into the cache, \
         or set RAFT_SYS_PREFIX (or activate a conda environment with libraft) to use another install.",
        if tried.is_empty() { "nowhere: no cache directory and no CONDA_PREFIX".to_string() } else { tried.join(", ") }
    ))
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=src/shim.cpp");
    println!("cargo:rerun-if-changed=include/raftrs.h");
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    println!("cargo:include={}", manifest.join("include").display());

    if env_var_rerun("DOCS_RS").is_some() || env::var_os("CARGO_FEATURE_DOC_ONLY").is_some() {
        return; // documentation needs no native code
    }

    let stack = match find_stack() {
        Ok(stack) => stack,
        Err(message) => {
            eprintln!("error: {message}");
            panic!("{message}");
        }
    };

    let mut build = cc::Build::new();
    build.cpp(true).std("c++20").file("src/shim.cpp").include(manifest.join("include"));
    // -isystem: warnings inside RAFT's and RMM's headers are theirs, not the shim's.
    for dir in &stack.includes {
        build.flag(format!("-isystem{}", dir.display()));
    }
    // The shim is small and hot: always optimised, never with debug info (it would swell the
    // test binaries carried to the GPU machine).
    build.opt_level(2).debug(false).flag_if_supported("-Wno-deprecated-declarations");
    build.compile("raftrs_shim");

    for dir in &stack.lib_dirs {
        println!("cargo:rustc-link-search=native={}", dir.display());
    }
    for name in ["rmm", "rapids_logger", "cudart", "cublas", "cusolver", "cusparse"] {
        match stack.library(name) {
            Some(file) if file == format!("lib{name}.so") => println!("cargo:rustc-link-lib=dylib={name}"),
            Some(file) => println!("cargo:rustc-link-lib=dylib:+verbatim={file}"),
            None => panic!(
                "lib{name}.so was not found under {} (library directories: {:?}); run `cargo xtask deps`",
                stack.root.display(),
                stack.lib_dirs
            ),
        }
    }
    let includes = env::join_paths(&stack.includes).expect("include paths contain no separator");
    println!("cargo:includes={}", includes.to_string_lossy());
    let joined = env::join_paths(&stack.lib_dirs).expect("library paths contain no separator");
    println!("cargo:lib_dirs={}", joined.to_string_lossy());
    println!("cargo:root={}", stack.root.display());
}
