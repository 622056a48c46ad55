//! Builds raft-comms's C++ shim (`src/shim/*.cpp`) as its own shared object,
//! `libraftcomms_shim.so`, against NCCL's `nccl.h` and the very RAFT / RMM / CUDA stack raft-sys
//! built its shim against (raft-sys publishes its include and library directories and the
//! stack's root as build metadata: `DEP_RAFTRS_INCLUDES`, `DEP_RAFTRS_LIB_DIRS`,
//! `DEP_RAFTRS_ROOT`). libnccl itself is not linked: the shim opens it at run time, so only the
//! header is needed here.
//!
//! Without `nccl.h` the crate still builds (with a warning): the Rust side compiles, and the first
//! use of a communicator reports that the NCCL headers were not found at build time and how to
//! get them (`cargo xtask deps`, or `RAFT_COMMS_NCCL_PREFIX`); the next build finds a header
//! that appeared in any place it looked (see `watch_for_header`).
use raft_build::{env_var_rerun, Stack};
use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The shim's translation units, by what they do: libnccl and errors, communicators,
/// collectives and groups, RAFT's comms_iface.
const SHIM_SOURCES: &[&str] = &["src/shim/nccl.cpp", "src/shim/communicators.cpp", "src/shim/collectives.cpp", "src/shim/raft_iface.cpp"];
/// What they share (the guard, the last error, the communicator cell, run_op).
const SHIM_COMMON: &str = "src/shim/common.hpp";

/// The shim's file name (also what the loader looks for beside an executable).
const SHIM_FILE: &str = "libraftcomms_shim.so";

/// Where NCCL's header (and, when there, its library) was found.
struct Nccl {
    include: PathBuf,
    lib: Option<PathBuf>,
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    for file in SHIM_SOURCES.iter().chain(&[SHIM_COMMON]) {
        println!("cargo:rerun-if-changed={file}");
    }
    println!("cargo:rerun-if-changed=include/raftcomms.h");
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    println!("cargo:include={}", manifest.join("include").display());
    // Also in a build without a shim: a shim given at run time (RAFT_COMMS_SHIM) is checked
    // against this header all the same.
    let header_hash = raft_build::header_hash(&std::fs::read(manifest.join("include/raftcomms.h")).expect("read include/raftcomms.h"));
    println!("cargo:rustc-env=RAFT_COMMS_HEADER_HASH={header_hash}");

    if env_var_rerun("DOCS_RS").is_some() || env::var_os("CARGO_FEATURE_DOC_ONLY").is_some() {
        no_shim("this is a documentation build (no native code)", "");
        return;
    }

    let Some(stack) = Stack::from_dep_metadata() else {
        // raft-sys builds no shim in a documentation build and prints no metadata then.
        no_shim("raft-sys built no shim (a documentation build?)", "");
        return;
    };

    let (nccl, tried) = find_nccl(&stack);
    let Some(nccl) = nccl else {
        let note = format!(
            "NCCL headers were not found at build time (looked for nccl.h in: {}). Run `cargo xtask deps` \
             (NCCL is part of the pinned stack; or `pip install nvidia-nccl-cu13`), or set RAFT_COMMS_NCCL_PREFIX to an NCCL install, then rebuild",
            tried.join("; ")
        );
        println!("cargo:warning=raft-comms builds without its NCCL shim: {note}");
        no_shim(&note, "");
        return;
    };

    let shim = build_shim(&manifest, &out, &stack, &nccl, header_hash);
    let nccl_lib = nccl.lib.as_ref().map(|d| d.display().to_string()).unwrap_or_default();
    println!("cargo:rustc-env=RAFT_COMMS_SHIM_PATH={}", shim.display());
    println!("cargo:rustc-env=RAFT_COMMS_BUILD_NOTE=");
    println!("cargo:rustc-env=RAFT_COMMS_NCCL_LIB_DIR={nccl_lib}");
    println!("cargo:rustc-env=RAFT_COMMS_NCCL_INCLUDE={}", nccl.include.display());
    // For `cargo xtask gpu-bundle`-like tools: DEP_RAFTCOMMS_SHIM.
    println!("cargo:shim={}", shim.display());
}

/// The environment of a build with no shim: the reason reaches the run-time error.
fn no_shim(note: &str, nccl_lib: &str) {
    println!("cargo:rustc-env=RAFT_COMMS_SHIM_PATH=");
    println!("cargo:rustc-env=RAFT_COMMS_BUILD_NOTE={note}");
    println!("cargo:rustc-env=RAFT_COMMS_NCCL_LIB_DIR={nccl_lib}");
    println!("cargo:rustc-env=RAFT_COMMS_NCCL_INCLUDE=");
}

/// `nccl.h` in, in order: `RAFT_COMMS_NCCL_PREFIX` (`include/` or the wheel's `nvidia/nccl/include/`),
/// the RAFT stack's own root (the `cargo xtask deps` cache or a Python environment: both hold
/// the `nvidia-nccl-cu13` wheel's files beside RAFT's), `CONDA_PREFIX`, `/usr/include`. Returns
/// it, or every place tried.
///
/// Cargo reruns this script only for what it is told to watch, so each place tried before the
/// one used is watched through [`watch_for_header`]: a header that appears there later (after
/// `cargo xtask deps`, `pip install`, a conda install) is found by the next build.
fn find_nccl(stack: &Stack) -> (Option<Nccl>, Vec<String>) {
    let mut roots: Vec<(PathBuf, String)> = Vec::new();
    if let Some(prefix) = raft_build::cache::path_knob("RAFT_COMMS_NCCL_PREFIX") {
        roots.push((PathBuf::from(prefix), "RAFT_COMMS_NCCL_PREFIX".into()));
    }
    roots.push((stack.root.clone(), "the RAFT stack raft-sys built against".into()));
    if let Some(conda) = env_var_rerun("CONDA_PREFIX") {
        roots.push((PathBuf::from(conda), "CONDA_PREFIX".into()));
    }
    roots.push((PathBuf::from("/usr"), "the system".into()));
    let mut tried = Vec::new();
    for (root, source) in roots {
        // The NCCL prefix the user named is NCCL's alone: small enough to watch whole.
        let explicit = source == "RAFT_COMMS_NCCL_PREFIX";
        for (include, libs) in
            [("nvidia/nccl/include", &["nvidia/nccl/lib"][..]), ("include", &["lib", "lib64", "lib/x86_64-linux-gnu"][..])]
        {
            let dir = root.join(include);
            if dir.join("nccl.h").is_file() {
                // The header itself: a new NCCL unpacked over it rebuilds the shim.
                println!("cargo:rerun-if-changed={}", dir.join("nccl.h").display());
                let lib = libs.iter().map(|l| root.join(l)).find(|l| l.join("libnccl.so.2").exists());
                return (Some(Nccl { include: dir, lib }), tried);
            }
            watch_for_header(&root, include, explicit);
            tried.push(format!("{} ({source})", dir.display()));
        }
    }
    (None, tried)
}

/// Asks cargo to rerun this script when `root/include/nccl.h` may have appeared: watches the
/// nearest directory of `root/include` that exists, no higher than `root/include`'s first
/// component (`nvidia/` of a wheel layout, `include/` of a prefix), and `root` itself only when
/// `whole_root` (the user's NCCL prefix): another root may be a whole site-packages or `/usr`. Cargo counts a watched path that does not exist as
/// changed on every build (rebuilding this crate each time), and scans a directory recursively,
/// so the nearest small existing directory is both what notices the header and what is cheap.
fn watch_for_header(root: &Path, include: &str, whole_root: bool) {
    let mut dir = root.join(include);
    let top = if whole_root { root.to_path_buf() } else { root.join(include.split('/').next().unwrap_or(include)) };
    loop {
        if dir.is_dir() {
            println!("cargo:rerun-if-changed={}", dir.display());
            return;
        }
        if dir == top || !dir.pop() {
            return;
        }
    }
}

/// Compiles the shim's sources position-independent and links `OUT_DIR/libraftcomms_shim.so` with
/// the CUDA runtime (the same `libcudart.so.13` raft-sys's shim uses) and RUNPATH `$ORIGIN`, the
/// stack's library directories and NCCL's (where libnccl.so.2 is looked for at run time).
fn build_shim(manifest: &Path, out: &Path, stack: &Stack, nccl: &Nccl, header_hash: u64) -> PathBuf {
    let mut build = cc::Build::new();
    // The C++ never instrumented: under -Zsanitizer=address cc adds -fsanitize=address for
    // CARGO_CFG_SANITIZE, and `--no-undefined` links cannot take ASan's runtime.
    build.flag("-fno-sanitize=address");
    build.cpp(true).std("c++20").pic(true).files(SHIM_SOURCES.iter().map(|f| manifest.join(f))).include(manifest.join("include"));
    build.define("RAFTCOMMS_HEADER_HASH", Some(format!("{header_hash}ULL").as_str()));
    // The build-id of the librmm.so of the stack (raft-sys's linked one): the Rust side compares
    // it with raft-sys's at load (a shim of another stack runs RAFT's code on raft-sys's objects).
    let librmm_build_id = stack
        .library("rmm")
        .and_then(|(dir, file)| std::fs::read(dir.join(file)).ok())
        .and_then(|elf| raft_build::gnu_build_id(&elf))
        .unwrap_or_default()
        .chars()
        .take(raft_build::elf::BUILD_ID_HEX_MAX)
        .collect::<String>();
    build.define("RAFTCOMMS_LIBRMM_BUILD_ID", Some(format!("\"{librmm_build_id}\"").as_str()));
    build.flag(format!("-isystem{}", nccl.include.display()));
    for dir in &stack.includes {
        build.flag(format!("-isystem{}", dir.display()));
    }
    build.opt_level(2).debug(false).warnings(true).extra_warnings(true);
    let objects = build.compile_intermediates();

    let shim = out.join(SHIM_FILE);
    let compiler = build.get_compiler();
    let mut link = Command::new(compiler.path());
    link.arg("-shared").arg("-o").arg(&shim).args(&objects);
    link.arg(format!("-Wl,-soname,{SHIM_FILE}"));
    link.arg("-Wl,--no-undefined");
    let mut runpath = vec!["$ORIGIN".to_string()];
    runpath.extend(stack.lib_dirs.iter().map(|d| d.display().to_string()));
    runpath.extend(nccl.lib.iter().map(|d| d.display().to_string()));
    link.arg(format!("-Wl,-rpath,{}", runpath.join(":"))).arg("-Wl,--enable-new-dtags");
    match stack.cudart() {
        Some(file) => {
            link.arg(file);
        }
        None => {
            eprintln!("error: libcudart.so.13 was not found in raft-sys's library directories {:?}", stack.lib_dirs);
            std::process::exit(1);
        }
    }
    link.arg("-lstdc++").arg("-lm").arg("-lpthread").arg("-ldl");
    let status = link.status().unwrap_or_else(|e| panic!("could not run {:?}: {e}", compiler.path()));
    if !status.success() {
        eprintln!("error: linking {} failed ({status}): {link:?}", shim.display());
        std::process::exit(1);
    }
    shim
}
