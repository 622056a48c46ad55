//! `cargo xtask deps`: the pinned native stack, fetched with the ordinary `pip download` into a
//! cache outside the source tree, unpacked side by side, and checked. Never run from build.rs.
use crate::stack::{self, PINNED, WHEELS};
use crate::Result;
use std::path::{Path, PathBuf};
use std::process::Command;

/// CCCL_VERSION of the copy inside the RMM wheel.
pub const CCCL_VERSION: &str = "3004003";

/// The cache (`RAFT_RS_CACHE`, else `$XDG_CACHE_HOME/raft-rs`, else `~/.cache/raft-rs`): the
/// rule of `crates/raft-sys/build/stack.rs`, which raft-sys's build script follows too.
pub fn cache_dir() -> Result<PathBuf> {
    stack::cache_dir().ok_or_else(|| "neither RAFT_RS_CACHE nor HOME is set: set RAFT_RS_CACHE to a writable directory".into())
}

/// Where the wheels are unpacked: what `raft-sys` builds against.
pub fn prefix() -> Result<PathBuf> {
    stack::cache_prefix().ok_or_else(|| "neither RAFT_RS_CACHE nor HOME is set: set RAFT_RS_CACHE to a writable directory".into())
}

fn stamp_text() -> String {
    WHEELS.iter().map(|(n, v)| format!("{n}=={v}\n")).collect()
}

/// The wheel file of `name==version` in `dir`.
fn wheel_file(dir: &Path, name: &str, version: &str) -> Option<PathBuf> {
    let start = format!("{}-{}-", name.replace('-', "_"), version);
    std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| p.file_name().and_then(|f| f.to_str()).is_some_and(|f| f.starts_with(&start) && f.ends_with(".whl")))
}

/// Checks what the prefix holds against the pins.
pub fn verify(prefix: &Path) -> Result<()> {
    let version = std::fs::read_to_string(prefix.join("libraft/VERSION"))
        .map_err(|e| format!("{}: {e}", prefix.join("libraft/VERSION").display()))?;
    if version.trim() != PINNED {
        return Err(format!("the cache holds RAFT {}, not {PINNED}", version.trim()));
    }
    let cccl = prefix.join("librmm/include/rapids/cuda/std/__cccl/version.h");
    let text = std::fs::read_to_string(&cccl).map_err(|e| format!("{}: {e}", cccl.display()))?;
    if !text.lines().any(|l| l.trim() == format!("#define CCCL_VERSION {CCCL_VERSION}")) {
        return Err(format!("{} does not define CCCL_VERSION {CCCL_VERSION}", cccl.display()));
    }
    for file in [
        "librmm/lib64/librmm.so",
        "rapids_logger/lib64/librapids_logger.so",
        "nvidia/cu13/include/crt/host_config.h",
        "nvidia/cu13/lib/libcudart.so.13",
        "nvidia/cu13/lib/libcublas.so.13",
        "nvidia/cu13/lib/libcusolver.so.12",
        "nvidia/cu13/lib/libcusparse.so.12",
        "nvidia/cu13/lib/libnvJitLink.so.13",
    ] {
        if !prefix.join(file).exists() {
            return Err(format!("{} is missing", prefix.join(file).display()));
        }
    }
    Ok(())
}

/// Fetches (when needed), unpacks and checks the stack; returns the prefix.
pub fn run() -> Result<PathBuf> {
    let cache = cache_dir()?;
    let prefix = prefix()?;
    let stamp = prefix.join(".raft-rs-wheels");
    if std::fs::read_to_string(&stamp).ok().as_deref() == Some(stamp_text().as_str()) && verify(&prefix).is_ok() {
        return Ok(prefix); // already done: nothing to fetch
    }
    let wheels = cache.join("wheels");
    std::fs::create_dir_all(&wheels).map_err(|e| format!("{}: {e}", wheels.display()))?;
    let missing: Vec<String> =
        WHEELS.iter().filter(|(n, v)| wheel_file(&wheels, n, v).is_none()).map(|(n, v)| format!("{n}=={v}")).collect();
    if !missing.is_empty() {
        eprintln!("xtask deps: fetching {} wheel(s) into {}", missing.len(), wheels.display());
        let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
        let mut pip = Command::new(&python);
        pip.args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12"]);
        for platform in [
            "manylinux_2_28_x86_64",
            "manylinux_2_27_x86_64",
            "manylinux_2_24_x86_64",
            "manylinux_2_17_x86_64",
            "manylinux2014_x86_64",
            "manylinux_2_12_x86_64",
            "manylinux2010_x86_64",
        ] {
            pip.args(["--platform", platform]);
        }
        pip.arg("-d").arg(&wheels).args(&missing);
        crate::run(&mut pip).map_err(|e| format!("{e}\n(pip must reach PyPI; install python3-pip if `{python} -m pip` is missing)"))?;
    }
    let staging = prefix.with_extension("partial");
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging).map_err(|e| format!("{}: {e}", staging.display()))?;
    for (name, version) in WHEELS {
        let wheel = wheel_file(&wheels, name, version).ok_or(format!("pip did not fetch {name}=={version}"))?;
        let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
        crate::run(Command::new(python).args(["-m", "zipfile", "-e"]).arg(&wheel).arg(&staging))?;
    }
    // librmm.so looks for librapids_logger.so beside itself ($ORIGIN): put a link there so that
    // binaries load it without LD_LIBRARY_PATH.
    let link = staging.join("librmm/lib64/librapids_logger.so");
    if !link.exists() {
        std::os::unix::fs::symlink("../../rapids_logger/lib64/librapids_logger.so", &link)
            .map_err(|e| format!("{}: {e}", link.display()))?;
    }
    verify(&staging)?;
    let _ = std::fs::remove_dir_all(&prefix);
    std::fs::rename(&staging, &prefix).map_err(|e| format!("{} -> {}: {e}", staging.display(), prefix.display()))?;
    std::fs::write(&stamp, stamp_text()).map_err(|e| format!("{}: {e}", stamp.display()))?;
    Ok(prefix)
}
