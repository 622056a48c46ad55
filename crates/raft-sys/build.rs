//! Finds RAFT, RMM and the CUDA 13.2 libraries (the `raft-build` crate's rules, shared with the
//! other build scripts and xtask), and builds the C++ shim against them as a shared object,
//! `libraftrs_shim.so`, whose own RUNPATH names the library directories found here.
//!
//! Nothing native is linked into Rust binaries: `raft-sys` loads the shim at first use
//! (`src/load.rs`), so a binary starts without RAFT, RMM or CUDA and reports a clear error where
//! they are missing. The build-time facts (versions, where the shim and the libraries are) reach
//! the crate as `rustc-env` variables and a generated `build_info.rs`.
use raft_build::{env_var_rerun, Stack, LIBRARIES, PINNED};
use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The shim's translation units, under `src/shim/`, one concern each (their headers there too).
const SHIM_SOURCES: &[&str] = &["common.cpp", "resources.cpp", "memory_resources.cpp", "async_pools.cpp", "buffers.cpp", "exit.cpp"];

/// The shim's file name (also what `raft-sys` looks for beside an executable).
const SHIM_FILE: &str = "libraftrs_shim.so";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=src/shim");
    println!("cargo:rerun-if-changed=src/fence.hpp");
    println!("cargo:rerun-if-changed=include/raftrs.h");
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    println!("cargo:include={}", manifest.join("include").display());

    if env_var_rerun("DOCS_RS").is_some() || env::var_os("CARGO_FEATURE_DOC_ONLY").is_some() {
        // Documentation needs no native code: the pinned facts stand in for the headers'.
        write_build_info(&out, &pinned_info(), false, &Linked::default(), &Headers::default());
        println!("cargo:rustc-env=RAFT_SYS_SHIM_PATH=");
        println!("cargo:rustc-env=RAFT_SYS_LIB_DIRS=");
        println!("cargo:rustc-env=RAFT_SYS_HEADER_HASH=0");
        return;
    }

    let stack = match raft_build::find() {
        Ok(stack) => stack,
        Err(message) => {
            // One clear message, not a backtrace: cargo shows a build script's stderr on failure.
            eprintln!("error: {message}");
            std::process::exit(1);
        }
    };

    watch_stack(&stack);

    let header_hash = raft_build::header_hash(&std::fs::read(manifest.join("include/raftrs.h")).expect("read include/raftrs.h"));
    println!("cargo:rustc-env=RAFT_SYS_HEADER_HASH={header_hash}");
    // The headers' release first: another than the pinned one is an error (cargo hides a
    // dependency's warnings), unless allowed, before the shim is compiled against it.
    let info = read_build_info(&manifest, &stack);
    match raft_build::check_pinned(info.raft, info.rmm, env_var_rerun("RAFT_RS_ALLOW_UNPINNED").as_deref()) {
        Ok(None) => {}
        Ok(Some(warning)) => println!("cargo:warning={warning}"),
        Err(message) => {
            eprintln!("error: {message}");
            std::process::exit(1);
        }
    }
    let linked = linked_librmm(&stack);
    let (shim, headers) = build_shim(&manifest, &out, &stack, header_hash, &linked);
    write_build_info(&out, &info, true, &linked, &headers);

    let lib_dirs = env::join_paths(&stack.lib_dirs).expect("library paths contain no separator");
    let includes = env::join_paths(&stack.includes).expect("include paths contain no separator");
    println!("cargo:rustc-env=RAFT_SYS_SHIM_PATH={}", shim.display());
    println!("cargo:rustc-env=RAFT_SYS_LIB_DIRS={}", lib_dirs.to_string_lossy());
    // For crates of this workspace that compile C++ against the same stack (the benchmark's
    // baseline) and for `cargo xtask gpu-bundle`: DEP_RAFTRS_*.
    println!("cargo:shim={}", shim.display());
    println!("cargo:includes={}", includes.to_string_lossy());
    println!("cargo:lib_dirs={}", lib_dirs.to_string_lossy());
    println!("cargo:root={}", stack.root.display());
}

/// Cargo reruns this script only for what it is told to watch. The stack it built against: a
/// `cargo xtask deps` that unpacks new pins (it rewrites its stamp) or a `pip install` over the
/// versions' files rebuilds the shim and its facts. And, when a Python environment or conda
/// served, the cache that `find` prefers: the first `cargo xtask deps` afterwards moves the build
/// onto it. Only paths that exist are watched (cargo counts a missing one as changed on every
/// build) and only small ones (cargo scans a directory whole).
fn watch_stack(stack: &Stack) {
    let stamp = stack.root.join(".raft-rs-wheels");
    let files: Vec<PathBuf> = if stamp.is_file() {
        vec![stamp]
    } else {
        [
            "libraft/VERSION",
            "librmm/VERSION",
            "nvidia/cu13/include/cuda_runtime_api.h",
            "include/raft/core/device_resources.hpp",
            "include/cuda_runtime_api.h",
            // A patch release or a rebuild of RMM (its headers, its library) rebuilds the shim
            // and the build-id it checks at load (helper 101: conda's layout rebuilt nothing).
            "librmm/include/rmm/version_config.hpp",
            "include/rmm/version_config.hpp",
        ]
        .iter()
        .map(|f| stack.root.join(f))
        .filter(|f| f.is_file())
        .collect()
    };
    for file in files.iter().chain(stack.library("rmm").map(|(dir, file)| dir.join(file)).as_ref()) {
        println!("cargo:rerun-if-changed={}", file.display());
    }
    if stack.source == "RAFT_SYS_PREFIX" || stack.source == "the cargo xtask deps cache" {
        return;
    }
    if let (Some(prefix), Some(cache)) = (raft_build::cache_prefix(), raft_build::cache_dir()) {
        if let Some(dir) = prefix.parent().into_iter().chain([cache.as_path()]).find(|d| d.is_dir()) {
            println!("cargo:rerun-if-changed={}", dir.display());
        }
    }
}

/// Compiles the shim's translation units (`SHIM_SOURCES`) position-independent and links them
/// into `OUT_DIR/libraftrs_shim.so`, with RUNPATH `$ORIGIN` and the stack's library directories.
/// The `librmm.so` the shim links and its GNU build-id (empty where it has none).
#[derive(Default)]
struct Linked {
    path: String,
    build_id: String,
}

/// Which `librmm.so` the link below takes (`Stack::library`, as it does) and its build-id: the
/// shim compiles RMM's inline code for that one build, and compares it at load with the
/// `librmm.so` the process mapped (`raftrs_get_librmm_identity`).
fn linked_librmm(stack: &Stack) -> Linked {
    let Some((dir, file)) = stack.library("rmm") else { return Linked::default() };
    let path = dir.join(file);
    let build_id: String = std::fs::read(&path)
        .ok()
        .and_then(|elf| raft_build::gnu_build_id(&elf))
        .unwrap_or_default()
        .chars()
        .take(raft_build::elf::BUILD_ID_HEX_MAX)
        .collect();
    Linked { path: path.display().to_string(), build_id }
}

/// Every header of the stack the shim was compiled with, as one digest (`raft_build::depfile`).
#[derive(Default)]
struct Headers {
    digest: String,
    count: usize,
}

fn build_shim(manifest: &Path, out: &Path, stack: &Stack, header_hash: u64, linked: &Linked) -> (PathBuf, Headers) {
    let mut build = cc::Build::new();
    // The C++ never instrumented: under -Zsanitizer=address cc adds -fsanitize=address for
    // CARGO_CFG_SANITIZE, and `--no-undefined` links cannot take ASan's runtime.
    build.flag("-fno-sanitize=address");
    build.define("RAFTRS_HEADER_HASH", Some(format!("{header_hash}ULL").as_str()));
    build.define("RAFTRS_LIBRMM_BUILD_ID", Some(format!("\"{}\"", linked.build_id).as_str()));
    build.cpp(true).std("c++20").pic(true).include(manifest.join("include"));
    build.files(SHIM_SOURCES.iter().map(|f| manifest.join("src/shim").join(f)));
    // -isystem: warnings inside RAFT's and RMM's headers are theirs, not the shim's.
    for dir in &stack.includes {
        build.flag(format!("-isystem{}", dir.display()));
    }
    // The shim is small and hot: always optimised, never with debug info.
    build.opt_level(2).debug(false).flag_if_supported("-Wno-deprecated-declarations");
    // A dependency file beside each object (`-MD`): every header the shim was compiled with,
    // digested below into the build's facts (`HEADERS_DIGEST`).
    build.flag("-MD");
    // Headers named as the search found them, not by their real paths (GCC's default for
    // system headers when shorter); `headers_digest` matches real paths too.
    build.flag_if_supported("-fno-canonical-system-headers");
    // No TLS descriptors (`-mtls-dialect=gnu2`, which would make the fence's thread-local a load
    // instead of a call to `__tls_get_addr`): before glibc 2.40 their dynamic path, taken when a
    // process's static TLS is used up, clobbered vector registers (glibc bugs 31372, 31501).
    let objects = build.compile_intermediates();
    let headers = headers_of(&objects, stack);

    let shim = out.join(SHIM_FILE);
    let compiler = build.get_compiler();
    let mut link = Command::new(compiler.path());
    link.arg("-shared").arg("-o").arg(&shim).args(&objects);
    link.arg(format!("-Wl,-soname,{SHIM_FILE}"));
    // Every symbol resolved now: a missing library fails the build, not the user's first call.
    link.arg("-Wl,--no-undefined");
    // RUNPATH: beside the shim first (a deployed copy with its libraries), then where they were.
    let mut runpath = vec!["$ORIGIN".to_string()];
    runpath.extend(stack.lib_dirs.iter().map(|d| d.display().to_string()));
    link.arg(format!("-Wl,-rpath,{}", runpath.join(":"))).arg("-Wl,--enable-new-dtags");
    for dir in &stack.lib_dirs {
        link.arg(format!("-L{}", dir.display()));
    }
    for name in LIBRARIES {
        match stack.library(name) {
            Some((_, file)) if file == format!("lib{name}.so") => {
                link.arg(format!("-l{name}"));
            }
            Some((dir, file)) => {
                link.arg(dir.join(file));
            }
            None => {
                eprintln!(
                    "error: lib{name}.so was not found under {} (found through {}; library directories: {:?}).\n\
                     Install it with:\n    {}",
                    stack.root.display(),
                    stack.source,
                    stack.lib_dirs,
                    raft_build::pip_line()
                );
                std::process::exit(1);
            }
        }
    }
    link.arg("-lstdc++").arg("-lm").arg("-lpthread").arg("-ldl");
    let status = link.status().unwrap_or_else(|e| panic!("could not run {:?}: {e}", compiler.path()));
    if !status.success() {
        eprintln!("error: linking {} failed ({status}): {link:?}", shim.display());
        std::process::exit(1);
    }
    (shim, headers)
}

/// The stack's headers the objects were compiled with, from their dependency files (`-MD`
/// writes `x.d` beside `x.o`): what `HEADERS_DIGEST` says of this build.
fn headers_of(objects: &[PathBuf], stack: &Stack) -> Headers {
    let mut files = Vec::new();
    for object in objects {
        let depfile = object.with_extension("d");
        let text = std::fs::read_to_string(&depfile)
            .unwrap_or_else(|e| panic!("the compiler wrote no dependency file {} (-MD): {e}", depfile.display()));
        files.extend(raft_build::depfile::prerequisites(&text));
    }
    // A header edited in place (a prefix of the user's) recompiles the shim against it.
    for file in files.iter().filter(|f| stack.includes.iter().any(|root| f.starts_with(root))) {
        println!("cargo:rerun-if-changed={}", file.display());
    }
    let (digest, count) = raft_build::headers_digest(&files, &stack.includes)
        .unwrap_or_else(|e| panic!("reading the headers the shim was compiled with: {e}"));
    if count == 0 {
        // Said, and left empty rather than the digest of nothing (which every such build
        // would share): the tag then differs from any build whose headers were found.
        println!(
            "cargo:warning=no header of the stack ({:?}) in the shim's dependency files: the ABI tag's `headers` is empty",
            stack.includes
        );
        return Headers::default();
    }
    Headers { digest, count }
}

/// What the headers say: versions, CCCL, the CUDA runtime, RMM's inline ABI namespace.
struct Info {
    raft: (u32, u32, u32),
    rmm: (u32, u32, u32),
    cccl: u32,
    cudart: u32,
    rmm_abi_namespace: String,
}

/// The pinned stack's facts, for documentation builds that have no headers.
fn pinned_info() -> Info {
    Info { raft: (26, 8, 0), rmm: (26, 8, 0), cccl: 3004003, cudart: 13020, rmm_abi_namespace: "_RMM_26_8".into() }
}

/// Asks the C++ preprocessor (same compiler, same include paths as the shim) to expand the
/// version macros: the facts are then exactly those the shim was compiled with.
fn read_build_info(manifest: &Path, stack: &Stack) -> Info {
    let mut build = cc::Build::new();
    // The C++ never instrumented: under -Zsanitizer=address cc adds -fsanitize=address for
    // CARGO_CFG_SANITIZE, and `--no-undefined` links cannot take ASan's runtime.
    build.flag("-fno-sanitize=address");
    build.cpp(true).std("c++20").file(manifest.join("build/probe.cpp")).cargo_metadata(false);
    for dir in &stack.includes {
        build.flag(format!("-isystem{}", dir.display()));
    }
    println!("cargo:rerun-if-changed=build/probe.cpp");
    let expanded = build.expand();
    let text = String::from_utf8_lossy(&expanded);
    // The expansion may spread over several lines between line markers: take every token after
    // `raftrs_probe`, skipping the markers.
    let tail = text
        .split_once("raftrs_probe")
        .map(|(_, t)| t)
        .unwrap_or_else(|| panic!("the preprocessor gave no raftrs_probe line for build/probe.cpp (with {:?})", stack.includes));
    let line: String = tail.lines().filter(|l| !l.trim_start().starts_with('#')).collect::<Vec<_>>().join(" ");
    let fields: Vec<String> =
        line.split_whitespace().take(9).map(|f| f.trim_matches(|c| c == '(' || c == ')' || c == '"').to_string()).collect();
    let num = |i: usize| -> u32 {
        let f = fields.get(i).unwrap_or_else(|| panic!("raftrs_probe line too short: {line}"));
        f.trim_end_matches(['u', 'U', 'l', 'L']).parse().unwrap_or_else(|_| panic!("not a number in raftrs_probe line {line}: {f}"))
    };
    Info {
        raft: (num(0), num(1), num(2)),
        rmm: (num(3), num(4), num(5)),
        cccl: num(6),
        cudart: num(7),
        rmm_abi_namespace: fields.get(8).cloned().unwrap_or_default(),
    }
}

fn write_build_info(out: &Path, info: &Info, native: bool, linked: &Linked, headers: &Headers) {
    let (rj, rn, rp) = info.raft;
    let (mj, mn, mp) = info.rmm;
    let text = format!(
        "// Generated by raft-sys/build.rs from the headers the shim was compiled with.\n\
         /// RAFT's version macros (`RAFT_VERSION_MAJOR/MINOR/PATCH`).\n\
         pub const RAFT_VERSION: (u32, u32, u32) = ({rj}, {rn}, {rp});\n\
         /// RMM's version macros.\n\
         pub const RMM_VERSION: (u32, u32, u32) = ({mj}, {mn}, {mp});\n\
         /// `CCCL_VERSION`, e.g. 3004003 for 3.4.3.\n\
         pub const CCCL_VERSION: u32 = {};\n\
         /// `CUDART_VERSION`, e.g. 13020 for 13.2.\n\
         pub const CUDART_VERSION: u32 = {};\n\
         /// RMM's inline ABI namespace, e.g. `_RMM_26_8`.\n\
         pub const RMM_ABI_NAMESPACE: &str = {:?};\n\
         /// `sizeof(raft::device_resources)`: the shim refuses to compile (a `static_assert`) when\n\
         /// the headers' handle has another size.\n\
         pub const HANDLE_SIZE: usize = 32;\n\
         /// Whether these facts came from real headers (false in documentation builds, which\n\
         /// show the pinned stack's).\n\
         pub const FROM_HEADERS: bool = {native};\n\
         /// The release the build script was pinned to.\n\
         pub const PINNED: &str = {PINNED:?};\n\
         /// The `librmm.so` the shim was linked against, and its GNU build-id (empty: none).\n\
         pub const LIBRMM_LINKED: &str = {:?};\n\
         pub const LIBRMM_BUILD_ID: &str = {:?};\n\
         /// A digest of every header of the stack the shim was compiled with (RAFT's, RMM's,\n\
         /// CCCL's, CUDA's: their paths and bytes; empty without headers), and how many: headers\n\
         /// edited or mixed from two packages differ here where versions and build-ids agree.\n\
         pub const HEADERS_DIGEST: &str = {:?};\n\
         pub const HEADERS_COUNT: usize = {};\n",
        info.cccl, info.cudart, info.rmm_abi_namespace, linked.path, linked.build_id, headers.digest, headers.count
    );
    std::fs::write(out.join("build_info.rs"), text).expect("write build_info.rs");
}
