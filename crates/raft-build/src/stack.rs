//! One install of the stack ([`Stack`]) and the search for it ([`find`]).
use std::env;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::cache::{cache_prefix, env_var_rerun};
use crate::pins::{pip_line, PINNED};

/// Headers and libraries of one install.
#[derive(Debug, Clone)]
pub struct Stack {
    /// The directory it was found at (a prefix, or the wheels' site-packages-like root).
    pub root: PathBuf,
    /// How it was found (`RAFT_SYS_PREFIX`, `the cargo xtask deps cache`, …).
    pub source: String,
    /// Header directories, in the order the compiler must search them.
    pub includes: Vec<PathBuf>,
    /// Library directories: what the shims link against and name in their RUNPATH.
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

    /// The install at `root`, in the wheels' layout or a prefix's; `None` when it holds no RAFT.
    pub fn at(root: &Path, source: &str) -> Option<Stack> {
        Stack::wheels(root, source).or_else(|| Stack::prefix(root, source))
    }

    /// The stack raft-sys built against, from its build metadata (`cargo:root`, `cargo:includes`,
    /// `cargo:lib_dirs`, seen by the build scripts of crates that depend on it as
    /// `DEP_RAFTRS_ROOT`, `_INCLUDES`, `_LIB_DIRS`), so they build against the very same files.
    /// `None` when any is absent: raft-sys's documentation builds find no stack and print none.
    pub fn from_dep_metadata() -> Option<Stack> {
        Stack::from_dep_values(env::var_os("DEP_RAFTRS_ROOT"), env::var_os("DEP_RAFTRS_INCLUDES"), env::var_os("DEP_RAFTRS_LIB_DIRS"))
    }

    fn from_dep_values(root: Option<OsString>, includes: Option<OsString>, lib_dirs: Option<OsString>) -> Option<Stack> {
        Some(Stack {
            root: PathBuf::from(root?),
            source: "raft-sys".into(),
            includes: env::split_paths(&includes?).collect(),
            lib_dirs: env::split_paths(&lib_dirs?).collect(),
        })
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

    /// The CUDA runtime's file: `libcudart.so`, else a versioned `libcudart.so.13…` (what a shim
    /// that calls the runtime links, the same one raft-sys's shim links).
    pub fn cudart(&self) -> Option<PathBuf> {
        self.library("cudart").map(|(dir, file)| dir.join(file))
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
    find_anywhere().and_then(Stack::with_plain_paths)
}

impl Stack {
    /// The stack, refused when one of its directories cannot be passed on as it must be: the
    /// library and include directories travel to the crates built after raft-sys as
    /// `:`-separated lists (`DEP_RAFTRS_*`) and into the shim's RUNPATH, and cargo's directives
    /// carry them as text, so a `:` in a path, or a path that is not UTF-8, would name other
    /// directories than the ones found (the fifteenth audit, helper 72).
    fn with_plain_paths(self) -> Result<Stack, String> {
        for dir in std::iter::once(&self.root).chain(&self.includes).chain(&self.lib_dirs) {
            let Some(text) = dir.to_str() else {
                return Err(format!(
                    "the stack found at {} ({}) has a path that is not UTF-8: {}",
                    self.root.display(),
                    self.source,
                    dir.display()
                ));
            };
            if text.contains(':') {
                return Err(format!(
                    "the stack found at {} ({}) has a path with a ':' in it, {text}: raft-rs passes its directories on as \
                     ':'-separated lists (and the shim's RUNPATH is one), which would split it; install or link the stack \
                     at a path without ':' and point RAFT_SYS_PREFIX there",
                    self.root.display(),
                    self.source
                ));
            }
        }
        Ok(self)
    }
}

/// [`find`]'s search, before its paths are checked.
fn find_anywhere() -> Result<Stack, String> {
    // A relative prefix is an error here, not a panic: the build prints it as its one message.
    if let Some(prefix) = crate::cache::absolute("RAFT_SYS_PREFIX", crate::cache::env_var_rerun("RAFT_SYS_PREFIX"))? {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The fifteenth audit (helper 72): a `:` in a directory of the stack split it in the lists
    /// handed to later build scripts and in the shim's RUNPATH.
    #[test]
    fn a_stack_with_a_colon_in_a_path_is_refused_with_the_path() {
        let stack = |lib: &str| Stack {
            root: PathBuf::from("/s"),
            source: "RAFT_SYS_PREFIX".into(),
            includes: vec![PathBuf::from("/s/include")],
            lib_dirs: vec![PathBuf::from(lib)],
        };
        let err = stack("/s/a:b/lib").with_plain_paths().unwrap_err();
        assert!(err.contains("/s/a:b/lib") && err.contains("':'"), "{err}");
        assert!(stack("/s/lib").with_plain_paths().is_ok());
    }

    /// A fresh directory of this test's own, holding `files` (empty files at those paths).
    fn tree(name: &str, files: &[&str]) -> PathBuf {
        let dir = env::temp_dir().join(format!("raft-build-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for f in files {
            let path = dir.join(f);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, b"").unwrap();
        }
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn unpacked_wheels_are_read_in_their_layout_with_rmms_cccl_first() {
        let root = tree("wheels", &["libraft/include/raft/core/device_resources.hpp"]);
        let stack = Stack::at(&root, "here").unwrap();
        assert_eq!(stack.source, "here");
        assert_eq!(stack.includes[0], root.join("libraft/include"));
        let rmm = stack.includes.iter().position(|p| p.ends_with("librmm/include/rapids")).unwrap();
        let cuda = stack.includes.iter().position(|p| p.ends_with("nvidia/cu13/include")).unwrap();
        assert!(rmm < cuda, "{:?}", stack.includes);
        assert_eq!(stack.lib_dirs, ["librmm/lib64", "rapids_logger/lib64", "nvidia/cu13/lib"].map(|d| root.join(d)));
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_prefix_keeps_only_the_directories_it_has() {
        let root = tree("prefix", &["include/raft/core/device_resources.hpp", "lib/libx.so", "targets/x86_64-linux/lib/liby.so"]);
        let stack = Stack::at(&root, "CONDA_PREFIX").unwrap();
        // include/rapids, lib64 and targets/…/include do not exist.
        assert_eq!(stack.includes, vec![root.join("include")]);
        assert_eq!(stack.lib_dirs, vec![root.join("lib"), root.join("targets/x86_64-linux/lib")]);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_directory_without_raft_is_no_stack() {
        let root = tree("empty", &["include/rmm/version.hpp"]);
        assert!(Stack::at(&root, "x").is_none());
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_plain_library_wins_over_any_versioned_one_else_the_first_versioned() {
        let root = tree("libs", &["a/libcudart.so.13.2", "a/libcudart.so.13", "b/libcudart.so", "a/libcublas.so.13", "a/libcudartx.so"]);
        let stack = Stack { root: root.clone(), source: "t".into(), includes: vec![], lib_dirs: vec![root.join("a"), root.join("b")] };
        assert_eq!(stack.library("cudart"), Some((root.join("b"), "libcudart.so".to_string())));
        assert_eq!(stack.cudart(), Some(root.join("b/libcudart.so")));
        assert_eq!(stack.library("cublas"), Some((root.join("a"), "libcublas.so.13".to_string())));
        assert_eq!(stack.library("cusolver"), None);
        std::fs::remove_file(root.join("b/libcudart.so")).unwrap();
        assert_eq!(stack.cudart(), Some(root.join("a/libcudart.so.13")));
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn dep_metadata_needs_all_three_values_and_splits_the_path_lists() {
        let v = |s: &str| Some(OsString::from(s));
        let stack = Stack::from_dep_values(v("/r"), v("/r/a:/r/b"), v("/r/lib")).unwrap();
        assert_eq!(stack.root, PathBuf::from("/r"));
        assert_eq!(stack.source, "raft-sys");
        assert_eq!(stack.includes, vec![PathBuf::from("/r/a"), PathBuf::from("/r/b")]);
        assert_eq!(stack.lib_dirs, vec![PathBuf::from("/r/lib")]);
        assert!(Stack::from_dep_values(None, v("/a"), v("/b")).is_none());
        assert!(Stack::from_dep_values(v("/r"), None, v("/b")).is_none());
        assert!(Stack::from_dep_values(v("/r"), v("/a"), None).is_none());
    }
}
