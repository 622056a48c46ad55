//! `cargo xtask gpu-bundle [--out DIR]`: test and bench binaries built here, with the shim
//! (`libraftrs_shim.so`), the RAPIDS and CUDA runtime `.so` files and a run script, in one folder
//! a GPU machine with no Rust toolchain and no network can run (`./run.sh tests LOGDIR`).
//!
//! Every binary finds the shim in `<its dir>/../lib` (raft-sys's loader looks there), and the
//! shim finds librmm, librapids_logger and libcudart beside itself (RUNPATH `$ORIGIN`). The
//! downstream crate's binary (tests/downstream, built on its own as a user builds it) is in
//! `bin/` too: `./run.sh downstream` runs it with no LD_LIBRARY_PATH.
use crate::{cargo, workspace_root, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The libraries carried; cuBLAS, cuSOLVER and cuSPARSE (hundreds of MB) come from the GPU
/// machine's own CUDA install (RAFT_CUDA_LIBS in run.sh).
const CARRIED: &[&str] = &["librmm/lib64/librmm.so", "rapids_logger/lib64/librapids_logger.so", "nvidia/cu13/lib/libcudart.so.13"];

/// What one cargo build made.
struct Built {
    executables: Vec<PathBuf>,
    /// The shim raft-sys's build script made (`<its OUT_DIR>/libraftrs_shim.so`).
    shim: Option<PathBuf>,
}

/// Builds `args` with cargo and returns the executables it made (for test builds, only the
/// harnesses of libraries and integration tests: a bin's own harness has the bin's name and
/// would shadow it).
fn executables(args: &[&str], harnesses_only: bool) -> Result<Built> {
    let out = cargo()
        .args(args)
        .args(["--message-format=json-render-diagnostics"])
        .current_dir(workspace_root())
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("could not run cargo: {e}"))?;
    if !out.status.success() {
        return Err(format!("cargo {} failed", args.join(" ")));
    }
    let mut found = Vec::new();
    let mut shim = None;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        if msg["reason"] == "build-script-executed" && msg["package_id"].as_str().is_some_and(is_raft_sys) {
            let file = PathBuf::from(msg["out_dir"].as_str().unwrap_or_default()).join("libraftrs_shim.so");
            shim = file.is_file().then_some(file);
        }
        let Some(exe) = msg.get("executable").and_then(|e| e.as_str()) else { continue };
        let is_test = msg.pointer("/profile/test").and_then(|t| t.as_bool()).unwrap_or(false);
        let kinds = msg.pointer("/target/kind").and_then(|k| k.as_array()).cloned().unwrap_or_default();
        if harnesses_only && (!is_test || kinds.iter().any(|k| k == "bin")) {
            continue;
        }
        found.push(PathBuf::from(exe));
    }
    Ok(Built { executables: found, shim })
}

/// Whether a cargo package id (`path+file:///…/crates/raft-sys#0.1.0`) is raft-sys's.
fn is_raft_sys(id: &str) -> bool {
    id.contains("/raft-sys#") || id.contains("#raft-sys@")
}

fn copy(from: &Path, to: &Path) -> Result<()> {
    std::fs::copy(from, to).map(|_| ()).map_err(|e| format!("{} -> {}: {e}", from.display(), to.display()))
}

const RUN_SH: &str = r#"#!/usr/bin/env bash
# Runs this bundle on a GPU machine: no Rust toolchain or network needed.
#   ./run.sh tests [LOGDIR]       every test binary, under RAFT_REQUIRE_GPU=1
#   ./run.sh exec NAME [ARGS...]  one bundled binary (raft-doctor, raft-bench, ...)
#   ./run.sh torture [N]          N child processes exiting at random moments with GPU jobs
#                                 and releases in flight; counts crashes, hangs and teardowns
#   ./run.sh downstream           the downstream crate's binary (a user's), no LD_LIBRARY_PATH
set -u
here=$(cd "$(dirname "$0")" && pwd)
cuda_libs=${RAFT_CUDA_LIBS:-/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib}
export LD_LIBRARY_PATH="$here/lib:$cuda_libs:${LD_LIBRARY_PATH:-}"
export RAFT_REQUIRE_GPU=1
case "${1:-tests}" in
  tests)
    logs=${2:-$here/logs}; mkdir -p "$logs"
    failed=0
    # Each binary bounded (RAFT_TEST_TIMEOUT seconds, 300 by default): a hung binary is
    # reported (rc=124, killed) and the rest still run (run 168 lost its whole call to one).
    for t in "$here"/tests/*; do
      name=$(basename "$t")
      timeout -k 10 "${RAFT_TEST_TIMEOUT:-300}" "$t" ${RAFT_TEST_ARGS:-} >"$logs/$name.log" 2>&1
      rc=$?
      summary=$(grep -E '^test result:' "$logs/$name.log" | tail -n 1)
      [ $rc -eq 124 ] && summary="HUNG: killed after ${RAFT_TEST_TIMEOUT:-300} s (see $logs/$name.log)"
      echo "$name: rc=$rc ${summary:-no summary (see $logs/$name.log)}"
      [ $rc -eq 0 ] || failed=1
    done
    exit $failed ;;
  exec)
    shift; name=$1; shift
    exec "$here/bin/$name" "$@" ;;
  torture)
    n=${2:-200}; crashes=0; hangs=0; wrong=0; torn=0; skipped=0
    for i in $(seq 1 "$n"); do
      ms=$((RANDOM % 400))
      wait_s=$(printf '0.%03d' $((RANDOM % 300)))
      case $((RANDOM % 5)) in
        0) name=job-then-return; want=0 ;;
        1) name=exit-from-thread; want=0 ;;
        2) name=job-calls-exit; want=3 ;;
        3) name=release-in-flight; want=0 ;;
        4) name=many-resources; want=0 ;;
      esac
      out=$(SCENARIO_GPU=1 SCENARIO_WAIT=$wait_s SCENARIO_JOB_SECS=0.$ms SCENARIO_COUNT=20 RUST_LOG=raft=debug \
            timeout 20 "$here/bin/scenarios" "$name" 2>&1)
      rc=$?
      if [ $rc -eq 124 ]; then hangs=$((hangs+1)); echo "HANG $name wait=$wait_s job=0.$ms";
      elif [ $rc -ge 128 ]; then crashes=$((crashes+1)); echo "CRASH rc=$rc $name wait=$wait_s job=0.$ms"; echo "$out" | tail -5;
      elif [ $rc -ne $want ]; then wrong=$((wrong+1)); echo "WRONG rc=$rc $name"; echo "$out" | tail -5; fi
      case "$out" in *"tearing down"*) torn=$((torn+1)) ;; esac
      case "$out" in *"teardown skipped"*) skipped=$((skipped+1)) ;; esac
    done
    echo "torture: $n runs, $crashes crashes, $hangs hangs, $wrong wrong statuses; teardowns done $torn, skipped $skipped"
    [ $((crashes+hangs+wrong)) -eq 0 ] ;;
  downstream)
    # A user's binary as shipped: the shim in lib/ beside librmm, librapids_logger and libcudart,
    # no LD_LIBRARY_PATH; cuBLAS, cuSOLVER and cuSPARSE are preloaded from RAFT_RS_LIB_PATH.
    shift
    exec env -u LD_LIBRARY_PATH RAFT_RS_LIB_PATH="$cuda_libs" "$here/bin/raft-downstream" "$@" ;;
  *) echo "usage: run.sh tests [LOGDIR] | exec NAME [ARGS...] | torture [N] | downstream" >&2; exit 2 ;;
esac
"#;

pub fn run(out: Option<PathBuf>) -> Result<()> {
    let out = out.unwrap_or_else(|| workspace_root().join("gpu-bundle"));
    let prefix = crate::deps::prefix()?;
    // raft-comms and raft-cuvs carry bundles of their own (crates/raft-comms/scripts/comms-bundle.sh,
    // crates/raft-cuvs/gpu/pack.sh): NCCL needs the two-GPU machine, cuVS its 259 MiB library.
    let tests = executables(
        &["test", "--workspace", "--release", "--no-run", "--exclude", "xtask", "--exclude", "raft-comms", "--exclude", "raft-cuvs"],
        true,
    )?
    .executables;
    let built =
        executables(&["build", "--release", "-p", "rapids-raft", "-p", "raft-tests", "-p", "raft-abi", "--bins", "--examples"], false)?;
    let shim = built.shim.ok_or("the release build reported no libraftrs_shim.so from raft-sys's build script")?;
    // The downstream crate is its own workspace (its own target directory), built as a user would.
    let manifest = workspace_root().join("tests/downstream/Cargo.toml");
    let downstream = executables(&["build", "--release", "--bins", "--manifest-path", &manifest.to_string_lossy()], false)?.executables;
    let bins: Vec<PathBuf> = built.executables.into_iter().chain(downstream).collect();
    let _ = std::fs::remove_dir_all(&out);
    for sub in ["tests", "bin", "lib"] {
        std::fs::create_dir_all(out.join(sub)).map_err(|e| format!("{}: {e}", out.display()))?;
    }
    let mut carried = Vec::new();
    for exe in &tests {
        // Test binaries are named `<target>-<hash>`; keep the target name.
        let name = exe.file_name().and_then(|f| f.to_str()).unwrap_or("test");
        let short = name.rsplit_once('-').map_or(name, |(n, _)| n);
        let dest = out.join("tests").join(short);
        copy(exe, &dest)?;
        carried.push(dest);
    }
    for exe in &bins {
        let dest = out.join("bin").join(exe.file_name().unwrap_or_default());
        copy(exe, &dest)?;
        carried.push(dest);
    }
    for file in &carried {
        // Debug sections are most of a test binary's size; the GPU run needs none of them.
        let _ = Command::new("strip").arg("--strip-debug").arg(file).status();
    }
    for lib in CARRIED {
        let from = prefix.join(lib);
        copy(&from, &out.join("lib").join(from.file_name().unwrap_or_default()))?;
    }
    // Where the loader looks for it: `<exe dir>/../lib/libraftrs_shim.so`.
    copy(&shim, &out.join("lib/libraftrs_shim.so"))?;
    let script = out.join("run.sh");
    std::fs::write(&script, RUN_SH).map_err(|e| format!("{}: {e}", script.display()))?;
    crate::run(Command::new("chmod").arg("+x").arg(&script))?;
    let size: u64 = walk(&out).iter().filter_map(|p| std::fs::metadata(p).ok()).map(|m| m.len()).sum();
    println!("gpu bundle: {} ({} tests, {} binaries, {:.1} MiB)", out.display(), tests.len(), bins.len(), mib(size));
    // A device call carries the archive, not the folder: the limit is on what travels (the folder
    // itself passed 60 MiB in the sixteenth session, its archive was 27 MiB).
    let name = out.file_name().and_then(|f| f.to_str()).ok_or("the bundle's folder has no name")?;
    let parent = out.parent().ok_or("the bundle's folder has no parent")?;
    let archive = parent.join(format!("{name}.tgz"));
    crate::run(Command::new("tar").arg("czf").arg(&archive).arg("-C").arg(parent).arg(name))?;
    let packed = std::fs::metadata(&archive).map_err(|e| format!("{}: {e}", archive.display()))?.len();
    println!("gpu bundle archive: {} ({:.1} MiB: carry it and `tar xzf` it on the GPU machine)", archive.display(), mib(packed));
    if packed > 60 << 20 {
        return Err(format!("the bundle's archive is {:.1} MiB: over the 60 MiB kept below the 64 MiB a device call carries", mib(packed)));
    }
    Ok(())
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                files.extend(walk(&p));
            } else {
                files.push(p);
            }
        }
    }
    files
}
