//! Where the native stack (RAFT, RMM, rapids-logger, the CUDA 13.2 runtime and libraries, NCCL) is,
//! and what it must hold. One copy of these rules: `raft-sys/build.rs` includes this file as a
//! module, and so does `xtask` (`#[path]`), so the build and `cargo xtask deps` never disagree.
#![allow(dead_code)] // each includer uses its own part

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The pinned release whose wheels `cargo xtask deps` unpacks.
pub const PINNED: &str = "26.08.00";

/// The wheels, by exact version: everything pip's resolver installs for [`pip_line`] in a fresh
/// virtualenv, and nothing else, so the README's line and the cache hold the same files.
/// `cargo xtask deps` runs pip's resolver over them (offline, on the fetched wheels) and fails
/// when the set is not exactly what it resolves to; CI runs the README's line against PyPI.
/// What forces each one: libraft-cu13 asks `cuda-toolkit[cublas,curand,cusolver,cusparse]==13.*`,
/// `nvidia-nvjitlink>=13.3,<14` (libraft.so calls its `_13_3` entry points) and
/// `nvidia-nccl-cu13>=2.19`; cuda-toolkit 13.2.2 is the toolkit of the 13.2 runtime the ABI tag
/// records, and its extras pin cuBLAS, cuSOLVER, cuSPARSE and cuRAND exactly (and NVRTC, which
/// cuBLAS asks for). NCCL is the GPU image's torch's.
pub const WHEELS: &[(&str, &str)] = &[
    ("libraft-cu13", "26.8.0"),
    ("librmm-cu13", "26.8.0"),
    ("rapids-logger", "0.2.3"),
    ("cuda-toolkit", "13.2.2"),
    ("nvidia-cuda-runtime", "13.2.86"),
    ("nvidia-cuda-crt", "13.2.86"),
    ("nvidia-cublas", "13.4.1.3"),
    ("nvidia-cuda-nvrtc", "13.2.86"),
    ("nvidia-cusolver", "12.2.0.11"),
    ("nvidia-cusparse", "12.7.10.12"),
    ("nvidia-curand", "10.4.2.66"),
    ("nvidia-nvjitlink", "13.3.33"),
    ("nvidia-nccl-cu13", "2.28.9"),
];
/// NCCL's wheel (raft-comms's `nccl.h`, `libnccl.so.2`): one of [`WHEELS`], since libraft asks for it.
pub const NCCL_WHEEL: (&str, &str) = ("nvidia-nccl-cu13", "2.28.9");

/// The one `pip install` line that lays out in a Python environment exactly what the cache holds.
pub fn pip_line() -> String {
    let pins: Vec<String> = WHEELS.iter().map(|(n, v)| format!("{n}=={v}")).collect();
    format!("pip install {}", pins.join(" "))
}

/// The libraries the shim links, in load order (a library after what it needs).
pub const LIBRARIES: &[&str] = &["rapids_logger", "rmm", "cudart", "cublas", "cusparse", "cusolver"];

/// Reads a knob and asks cargo to rerun when it changes (a no-op outside build scripts).
pub fn env_var_rerun(name: &str) -> Option<String> {
    if env::var_os("CARGO_MANIFEST_DIR").is_some() && env::var_os("OUT_DIR").is_some() {
        println!("cargo:rerun-if-env-changed={name}");
    }
    env::var(name).ok().filter(|v| !v.is_empty())
}

/// The cache `cargo xtask deps` fills: `RAFT_RS_CACHE`, else `$XDG_CACHE_HOME/raft-rs`, else
/// `~/.cache/raft-rs`.
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(dir) = env_var_rerun("RAFT_RS_CACHE") {
        return Some(PathBuf::from(dir));
    }
    if let Some(dir) = env_var_rerun("XDG_CACHE_HOME") {
        return Some(PathBuf::from(dir).join("raft-rs"));
    }
    env_var_rerun("HOME").map(|h| PathBuf::from(h).join(".cache/raft-rs"))
}

/// Where `cargo xtask deps` unpacks the wheels.
pub fn cache_prefix() -> Option<PathBuf> {
    cache_dir().map(|c| c.join(PINNED).join("prefix"))
}

/// Headers and libraries of one install.
#[derive(Debug, Clone)]
pub struct Stack {
    pub root: PathBuf,
    /// How it was found (`RAFT_SYS_PREFIX`, `the cargo xtask deps cache`, …).
    pub source: String,
    pub includes: Vec<PathBuf>,
    pub lib_dirs: Vec<PathBuf>,
}

impl Stack {
    /// Wheels unpacked side by side: the `cargo xtask deps` cache, or a Python environment's
    /// site-packages after `pip install libraft-cu13 …` (the same layout).
    fn wheels(root: &Path, source: &str) -> Option<Stack> {
        if !root.join("libraft/include/raft/core/device_resources.hpp").is_file() {
            return None;
        }
        Some(Stack {
            root: root.to_path_buf(),
            source: source.to_string(),
            // RMM's own copy of CCCL comes before anything the CUDA wheels carry.
            includes: ["libraft/include", "librmm/include", "librmm/include/rapids", "rapids_logger/include", "nvidia/cu13/include"]
                .iter()
                .map(|p| root.join(p))
                .collect(),
            lib_dirs: ["librmm/lib64", "rapids_logger/lib64", "nvidia/cu13/lib"].iter().map(|p| root.join(p)).collect(),
        })
    }

    /// A conda environment or a system install: `include/raft`, `include/rapids`, `lib`.
    fn prefix(root: &Path, source: &str) -> Option<Stack> {
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
        Some(Stack { root: root.to_path_buf(), source: source.to_string(), includes, lib_dirs })
    }

    pub fn at(root: &Path, source: &str) -> Option<Stack> {
        Stack::wheels(root, source).or_else(|| Stack::prefix(root, source))
    }

    /// The file to link for `lib<name>`: the plain `.so` when there is one, else a versioned one
    /// (the CUDA wheels ship only `libcudart.so.13` and the like).
    pub fn library(&self, name: &str) -> Option<(PathBuf, String)> {
        let plain = format!("lib{name}.so");
        for dir in &self.lib_dirs {
            if dir.join(&plain).exists() {
                return Some((dir.clone(), plain));
            }
        }
        for dir in &self.lib_dirs {
            let Ok(entries) = std::fs::read_dir(dir) else { continue };
            let mut found: Vec<String> =
                entries.filter_map(|e| e.ok()?.file_name().into_string().ok()).filter(|f| f.starts_with(&format!("{plain}."))).collect();
            found.sort();
            if let Some(f) = found.into_iter().next() {
                return Some((dir.clone(), f));
            }
        }
        None
    }
}

/// The site-packages directories of the active Python environment: `$VIRTUAL_ENV`'s, else what
/// `python3 -m site` reports (`RAFT_SYS_PYTHON` names another interpreter).
fn python_site_dirs() -> Vec<(PathBuf, String)> {
    if let Some(venv) = env_var_rerun("VIRTUAL_ENV") {
        let lib = PathBuf::from(&venv).join("lib");
        let mut dirs: Vec<PathBuf> = std::fs::read_dir(&lib)
            .map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.path().join("site-packages")).filter(|p| p.is_dir()).collect())
            .unwrap_or_default();
        dirs.sort();
        return dirs.into_iter().map(|d| (d, format!("VIRTUAL_ENV={venv}"))).collect();
    }
    let python = env_var_rerun("RAFT_SYS_PYTHON").unwrap_or_else(|| "python3".into());
    let script = "import site, sys\nfor p in site.getsitepackages() + [site.getusersitepackages()]: print(p)";
    let Ok(out) = Command::new(&python).args(["-c", script]).output() else { return Vec::new() };
    if !out.status.success() {
        return Vec::new();
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(PathBuf::from)
        .filter(|p| p.is_dir())
        .map(|p| (p, format!("{python} -m site")))
        .collect()
}

/// Finds the stack in this order: `RAFT_SYS_PREFIX`; the `cargo xtask deps` cache; the active
/// Python environment (`VIRTUAL_ENV`, else `python3 -m site`); `CONDA_PREFIX`. The error says
/// where it looked and what to do.
pub fn find() -> Result<Stack, String> {
    if let Some(prefix) = env_var_rerun("RAFT_SYS_PREFIX") {
        let root = PathBuf::from(&prefix);
        return Stack::at(&root, "RAFT_SYS_PREFIX").ok_or(format!(
            "RAFT_SYS_PREFIX={prefix} holds no RAFT headers (looked for include/raft/core/device_resources.hpp \
             and libraft/include/raft/core/device_resources.hpp)"
        ));
    }
    let mut tried = Vec::new();
    if let Some(root) = cache_prefix() {
        if let Some(stack) = Stack::at(&root, "the cargo xtask deps cache") {
            return Ok(stack);
        }
        tried.push(format!("{} (the cargo xtask deps cache)", root.display()));
    }
    for (dir, source) in python_site_dirs() {
        if let Some(stack) = Stack::at(&dir, &source) {
            return Ok(stack);
        }
        tried.push(format!("{} ({source})", dir.display()));
    }
    if let Some(conda) = env_var_rerun("CONDA_PREFIX") {
        let root = PathBuf::from(conda);
        if let Some(stack) = Stack::at(&root, "CONDA_PREFIX") {
            return Ok(stack);
        }
        tried.push(format!("{} (CONDA_PREFIX)", root.display()));
    }
    Err(format!(
        "RAFT {PINNED} was not found. Looked in: {}.\n\
         Install the native stack into your Python environment (a virtualenv is fine):\n    {}\n\
         or point the build at an install: RAFT_SYS_PREFIX=<prefix> (a conda environment or unpacked wheels), \
         VIRTUAL_ENV, CONDA_PREFIX, or RAFT_RS_CACHE (what `cargo xtask deps` fills in the raft-rs repository).",
        if tried.is_empty() { "nowhere (no cache directory, no Python, no CONDA_PREFIX)".to_string() } else { tried.join("; ") },
        pip_line()
    ))
}
