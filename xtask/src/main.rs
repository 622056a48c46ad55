//! `cargo xtask`: the project's tasks, one module each.
//!
//! | task | what it does |
//! | --- | --- |
//! | `deps [--cuvs]` | fetches the pinned RAFT/RMM/CUDA/NCCL wheels with pip into the cache, checks that pip's resolver installs exactly them, unpacks and checks them (`--cuvs`: cuVS's too, for raft-cuvs; `--nccl` is accepted: NCCL is in the base set) |
//! | `install-line [--check]` | prints the README's `pip install` line from the pins (`--check`: fails when README.md's differs) |
//! | `test` | `deps`, `abi-check`, then `cargo test --workspace` |
//! | `doctor` | `deps`, then `cargo run --release --bin raft-doctor` (the main job) |
//! | `bindings [--check]` | regenerates (or checks) `crates/raft-sys/src/bindings.rs` |
//! | `abi-check [--bless]` | compares the ABI tag of this build with the committed one |
//! | `gpu-bundle [--out DIR]` | packs test and bench binaries, the shim and the downstream binary with the RAPIDS `.so` files for a GPU machine |
//! | `layers [-v]` | each crate's file graph: fails on a circle of files, a source file over 900 lines, or a raft-core file naming one of a higher layer than ARCHITECTURE.md's table gives it (or placed in none), unless listed in `xtask/layers-known.txt` |
//! | `claims [-v] [--root DIR]` | every test name the README and docs give as a claim's proof must be a `#[test]` of the tree (a dated record's may be one of the git history), and a live claim's one that a script of the repository runs (`claims_run.rs`'s table): fails listing each that is not, with its document and line |
//! | `package [--no-verify]` | `cargo package` of every library crate in dependency order (built from the tarballs), and their docs.rs metadata |
mod abi_check;
mod bindings;
mod bundle;
mod claims;
mod claims_run;
mod claims_targets;
mod deps;
mod install_line;
mod layers;
mod package;
/// Where the native stack is and what it holds: the crate the build scripts use, so
/// `cargo xtask deps` and the build never disagree.
use raft_build as stack;

use std::path::PathBuf;
use std::process::{Command, ExitCode};

pub type Result<T> = std::result::Result<T, String>;

/// The workspace root (the parent of this crate's directory).
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives inside the workspace").to_path_buf()
}

/// Runs a command from the workspace root, failing with its name when it fails.
pub fn run(cmd: &mut Command) -> Result<()> {
    cmd.current_dir(workspace_root());
    let shown = format!("{cmd:?}");
    let status = cmd.status().map_err(|e| format!("could not start {shown}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{shown} failed with {status}"))
    }
}

pub fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

const USAGE: &str =
    "usage: cargo xtask <deps [--cuvs]|install-line [--check]|test|doctor|bindings [--check]|abi-check [--bless]|gpu-bundle [--out DIR]|package [--no-verify]|layers [-v]|claims [-v] [--root DIR]>";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str| args.iter().any(|a| a == name);
    let result = match args.first().map(String::as_str) {
        Some("deps") => deps::run()
            .and_then(|prefix| if flag("--nccl") { deps::nccl(&prefix).map(|()| prefix) } else { Ok(prefix) })
            .map(|prefix| println!("native stack ready in {}", prefix.display())),
        Some("install-line") => install_line::run(flag("--check")),
        Some("test") => (|| {
            deps::run()?;
            abi_check::run(false)?;
            run(cargo().args(["test", "--workspace"]).args(&args[1..]))
        })(),
        Some("doctor") => deps::run().and_then(|_| {
            // raft-doctor's status is the command's (2: no usable GPU, as the README says), not
            // a failure of xtask's own.
            let mut cmd = cargo();
            cmd.current_dir(workspace_root()).args(["run", "--release", "--bin", "raft-doctor", "--"]).args(&args[1..]);
            let status = cmd.status().map_err(|e| format!("could not start {cmd:?}: {e}"))?;
            match status.code() {
                Some(0) => Ok(()),
                Some(code) => std::process::exit(code),
                None => Err(format!("raft-doctor ended by {status}")),
            }
        }),
        Some("bindings") => bindings::run(flag("--check")),
        Some("abi-check") => deps::run().and_then(|_| abi_check::run(flag("--bless"))),
        Some("gpu-bundle") => {
            let out = args.iter().position(|a| a == "--out").and_then(|i| args.get(i + 1)).map(PathBuf::from);
            deps::run().and_then(|_| bundle::run(out))
        }
        Some("layers") => layers::run(flag("-v")),
        Some("claims") => claims::run(flag("-v"), args.iter().position(|a| a == "--root").and_then(|i| args.get(i + 1)).map(PathBuf::from)),
        Some("package") if flag("--no-verify") => package::run(false),
        Some("package") => deps::run().and_then(|_| package::run(true)),
        _ => Err(USAGE.to_string()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("xtask: {message}");
            ExitCode::FAILURE
        }
    }
}
