//! `cargo xtask deps`: the pinned native stack, fetched with the ordinary `pip download` into a
//! cache outside the source tree, unpacked side by side, and checked. Never run from build.rs.
use crate::install_line;
use crate::stack::{self, NCCL_WHEEL, PINNED, WHEELS};
use crate::Result;
use std::path::{Path, PathBuf};
use std::process::Command;

/// CCCL_VERSION of the copy inside the RMM wheel.
pub const CCCL_VERSION: &str = "3004003";

/// The cache (`RAFT_RS_CACHE`, else `$XDG_CACHE_HOME/raft-rs`, else `~/.cache/raft-rs`): the
/// rule of the `raft-build` crate (`crates/raft-build/src/cache.rs`), which the build scripts follow too.
pub fn cache_dir() -> Result<PathBuf> {
    stack::cache_dir().ok_or_else(|| "neither RAFT_RS_CACHE nor HOME is set: set RAFT_RS_CACHE to a writable directory".into())
}

/// Where the wheels are unpacked: what `raft-sys` builds against.
pub fn prefix() -> Result<PathBuf> {
    stack::cache_prefix().ok_or_else(|| "neither RAFT_RS_CACHE nor HOME is set: set RAFT_RS_CACHE to a writable directory".into())
}

/// The stamp of an unpacked stack: each pin with its pinned digest, so a stack unpacked before
/// the digests were pinned (or from other files) is checked and unpacked once more from the
/// pinned wheels (the review, helper 99).
fn stamp_of(pins: &[(&str, &str)]) -> String {
    pins.iter().map(|(n, v)| format!("{n}=={v} --hash=sha256:{}\n", pinned_file(n, v).map(|(_, sha)| sha).unwrap_or("unpinned"))).collect()
}

fn stamp_text() -> String {
    stamp_of(WHEELS)
}

/// The one file of each pin (the x86-64 Linux wheel pip picks for CPython 3.12) and its SHA-256,
/// as PyPI publishes it (the `#sha256=` of its simple index, checked against these on 2026-12-05):
/// a wheel in the cache is unpacked only when it is this file with this digest, and pip fetches
/// with `--require-hashes`, so neither an altered wheel on the way nor one left in the cache by
/// something else becomes the stack the shim is compiled against and loads.
pub const WHEEL_FILES: &[(&str, &str, &str, &str)] = &[
    (
        "libraft-cu13",
        "26.8.0",
        "libraft_cu13-26.8.0-py3-none-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
        "71fdb1987d61f0ecf78771ca6cf363a5b587cc3a7e45808017d3a034f8506b1e",
    ),
    (
        "librmm-cu13",
        "26.8.0",
        "librmm_cu13-26.8.0-py3-none-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl",
        "b99105380532b1176c29ddaf115a4ed38a1c8004e2a12372469cb6dac9b47a24",
    ),
    (
        "rapids-logger",
        "0.2.3",
        "rapids_logger-0.2.3-py3-none-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
        "7fe67ef4049c5d8ba6154746325dcf7cc0f327f0efa8f2611fc8f64e67510f60",
    ),
    (
        "cuda-toolkit",
        "13.2.2",
        "cuda_toolkit-13.2.2-py2.py3-none-any.whl",
        "d12edc1aad1356236a2ee10c0d794b1aff5d3e79bfeca54867c3bb8e5afd87b0",
    ),
    (
        "nvidia-cuda-runtime",
        "13.2.86",
        "nvidia_cuda_runtime-13.2.86-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
        "3498247680dfddce31bad102af7e3e26fc795342a3cac64722bb0fa95e7f60f0",
    ),
    (
        "nvidia-cuda-crt",
        "13.2.86",
        "nvidia_cuda_crt-13.2.86-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
        "e3ab08801bf9b1e6dc979275d25e816bb5000521b648e19c324d5eef0c79f1da",
    ),
    (
        "nvidia-cublas",
        "13.4.1.3",
        "nvidia_cublas-13.4.1.3-py3-none-manylinux_2_27_x86_64.whl",
        "a5917cb642cfb07f4a0231ee16aec7e2e0357d8cb8b1b78a0c9c68dba3e6afc7",
    ),
    (
        "nvidia-cuda-nvrtc",
        "13.2.86",
        "nvidia_cuda_nvrtc-13.2.86-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl",
        "8111c5130e967b78222ea2124145f8efe9ce201b752b2579a2513100a53be1c5",
    ),
    (
        "nvidia-cusolver",
        "12.2.0.11",
        "nvidia_cusolver-12.2.0.11-py3-none-manylinux_2_27_x86_64.whl",
        "fab5778f6769947389a1a6abc07e635576825a08c0ffc68c3ae7f1392c794b42",
    ),
    (
        "nvidia-cusparse",
        "12.7.10.12",
        "nvidia_cusparse-12.7.10.12-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
        "25907c75e4db1581685f06f61cc6cdecc04611765516a52373e0a18ebd69fa00",
    ),
    (
        "nvidia-curand",
        "10.4.2.66",
        "nvidia_curand-10.4.2.66-py3-none-manylinux_2_27_x86_64.whl",
        "9bb3796a2f6223454b2e326e3d7572c1500cfa4d629de827676b4eeecd30ab0c",
    ),
    (
        "nvidia-nvjitlink",
        "13.3.33",
        "nvidia_nvjitlink-13.3.33-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl",
        "26a6de7fb4c8fdaa7703d3dad720d6d427ddfea5c48a528fd97c11733ad830e5",
    ),
    (
        "nvidia-nccl-cu13",
        "2.28.9",
        "nvidia_nccl_cu13-2.28.9-py3-none-manylinux_2_18_x86_64.whl",
        "e4553a30f34195f3fa1da02a6da3d6337d28f2003943aa0a3d247bbc25fefc42",
    ),
    (
        "libcuvs-cu13",
        "26.8.1",
        "libcuvs_cu13-26.8.1-py3-none-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
        "023a28bebad0ed80cb753c5099687eb6d14fbad9e7e4b49bdaca805014667d0e",
    ),
    (
        "nvidia-curand",
        "10.4.3.29",
        "nvidia_curand-10.4.3.29-py3-none-manylinux_2_27_x86_64.whl",
        "1859bf37a62754d2c65001393096ca79de399f995971fa7826d0adfd88c3cf7b",
    ),
    (
        "nvidia-cuda-nvrtc",
        "13.3.33",
        "nvidia_cuda_nvrtc-13.3.33-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl",
        "82530788b8c6164a54d3fd9ae8bcca8893d397c4aeb998861982a03bbe41e204",
    ),
];

/// The pinned file and digest of `name==version` (every pin has one: a unit test says so).
fn pinned_file(name: &str, version: &str) -> Result<(&'static str, &'static str)> {
    WHEEL_FILES
        .iter()
        .find(|(n, v, _, _)| *n == name && *v == version)
        .map(|(_, _, file, sha)| (*file, *sha))
        .ok_or_else(|| format!("{name}=={version} has no pinned file and digest in xtask's WHEEL_FILES"))
}

/// The SHA-256 of `path`, in lower-case hex.
fn sha256_of(path: &Path) -> Result<String> {
    use sha2::Digest;
    let mut file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut hasher = sha2::Sha256::new();
    std::io::copy(&mut file, &mut hasher).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(hasher.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// Why the cached wheel of `name==version` in `dir` is not the pinned file, or `None` when it is
/// (or when there is none yet).
fn unlike_the_pin(dir: &Path, name: &str, version: &str) -> Result<Option<(PathBuf, String)>> {
    let Some(file) = wheel_file(dir, name, version) else { return Ok(None) };
    let (pinned, sha) = pinned_file(name, version)?;
    let why = if file.file_name().and_then(|f| f.to_str()) != Some(pinned) {
        format!("it is not the pinned file {pinned}")
    } else if !whole_zip(&file) {
        // A wheel cut short (a full disk during pip's copy) stays there, and pip never fetches a
        // file that exists: every later run failed on it (the nineteenth audit, helper 93).
        "it is cut short (no zip directory at its end)".to_string()
    } else {
        let got = sha256_of(&file)?;
        if got == sha {
            return Ok(None);
        }
        format!("its SHA-256 is {got}, not the pinned {sha}")
    };
    Ok(Some((file, why)))
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

/// `pip download` of the `name==version` pins missing from `wheels` (one call for all of them),
/// for CPython 3.12 on x86-64 Linux, whatever this machine's Python is. `what` says in the
/// progress line and the error what they are for. A registry can fail a request now and then:
/// three tries, 20 s apart, each fetching what is still missing.
fn fetch(wheels: &Path, pins: &[(&str, &str)], what: &str) -> Result<()> {
    const TRIES: usize = 3;
    std::fs::create_dir_all(wheels).map_err(|e| format!("{}: {e}", wheels.display()))?;
    // A cached wheel that is not the pinned file (cut short, altered, another build of the
    // version) goes, and is fetched again below.
    for (name, version) in pins {
        if let Some((file, why)) = unlike_the_pin(wheels, name, version)? {
            eprintln!("xtask deps: {} is not the pinned wheel ({why}): fetching it again", file.display());
            std::fs::remove_file(&file).map_err(|e| format!("{}: {e}", file.display()))?;
        }
    }
    let python = python();
    let mut attempt = 0;
    while attempt < TRIES {
        attempt += 1;
        let missing: Vec<String> =
            pins.iter().filter(|(n, v)| wheel_file(wheels, n, v).is_none()).map(|(n, v)| format!("{n}=={v}")).collect();
        if missing.is_empty() {
            return Ok(());
        }
        // No pip at all is no registry's hiccup: said at once, not after three tries.
        if attempt == 1 && !Command::new(&python).args(["-m", "pip", "--version"]).output().is_ok_and(|o| o.status.success()) {
            return Err(format!(
                "`{python} -m pip` is not there: install python3-pip (or set PYTHON to a Python with pip) to fetch {what}"
            ));
        }
        eprintln!("xtask deps: fetching {} wheel(s) ({what}) into {}", missing.len(), wheels.display());
        // pip takes only a file with a pinned digest (`--require-hashes` wants a requirements
        // file): one another index offers for the same version, or one altered on the way, fails.
        let requirements = wheels.join(format!(".requirements-{}.txt", std::process::id()));
        let mut lines = String::new();
        for pin in &missing {
            let (name, version) = pin.split_once("==").expect("built as name==version above");
            lines += &format!("{pin} --hash=sha256:{}\n", pinned_file(name, version)?.1);
        }
        std::fs::write(&requirements, lines).map_err(|e| format!("{}: {e}", requirements.display()))?;
        let mut pip = Command::new(&python);
        pip.args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--require-hashes", "--python-version", "3.12"]);
        for platform in install_line::PLATFORMS {
            pip.args(["--platform", platform]);
        }
        pip.arg("-d").arg(wheels).arg("-r").arg(&requirements);
        let fetched = crate::run(&mut pip);
        let _ = std::fs::remove_file(&requirements);
        match fetched {
            // What pip left must be the pinned files (it checked the digests; the names too).
            Ok(()) => {
                for (name, version) in pins {
                    if let Some((file, why)) = unlike_the_pin(wheels, name, version)? {
                        return Err(format!("pip fetched {} for {name}=={version}, which is not the pinned wheel: {why}", file.display()));
                    }
                }
                return Ok(());
            }
            Err(e) if attempt < TRIES => {
                eprintln!("xtask deps: pip failed (try {attempt} of {TRIES}): {e}; again in 20 s");
                std::thread::sleep(std::time::Duration::from_secs(20));
            }
            Err(e) => {
                return Err(format!("{e}\n(pip must reach PyPI to fetch {what}; install python3-pip if `{python} -m pip` is missing)"))
            }
        }
    }
    unreachable!("the last try returns")
}

/// Whether `path` ends with a zip's end-of-central-directory record (its comment, if any,
/// reaching exactly the end): a wheel cut short has none.
fn whole_zip(path: &Path) -> bool {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut file) = std::fs::File::open(path) else { return false };
    let Ok(len) = file.seek(SeekFrom::End(0)) else { return false };
    let tail_len = len.min(22 + 65535);
    let mut tail = vec![0u8; tail_len as usize];
    if file.seek(SeekFrom::Start(len - tail_len)).is_err() || file.read_exact(&mut tail).is_err() {
        return false;
    }
    (0..tail.len().saturating_sub(21))
        .rev()
        .any(|i| tail[i..i + 4] == *b"PK\x05\x06" && i + 22 + usize::from(u16::from_le_bytes([tail[i + 20], tail[i + 21]])) == tail.len())
}

/// Unpacks the pinned wheels from `wheels` into `into` (Python's own zipfile: no unzip needed).
fn unpack(wheels: &Path, pins: &[(&str, &str)], into: &Path) -> Result<()> {
    for (name, version) in pins {
        let wheel = wheels.join(pinned_file(name, version)?.0);
        if !wheel.exists() {
            return Err(format!("pip did not fetch {name}=={version} ({})", wheel.display()));
        }
        crate::run(Command::new(python()).args(["-m", "zipfile", "-e"]).arg(&wheel).arg(into))?;
    }
    Ok(())
}

fn python() -> String {
    std::env::var("PYTHON").unwrap_or_else(|_| "python3".into())
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
        "nvidia/nccl/include/nccl.h",
        "nvidia/nccl/lib/libnccl.so.2",
    ] {
        if !prefix.join(file).exists() {
            return Err(format!("{} is missing", prefix.join(file).display()));
        }
    }
    nvjitlink_13_3(&prefix.join("nvidia/cu13/lib/libnvJitLink.so.13"))
}

/// Fetches (when needed), unpacks and checks the stack; returns the prefix. `cargo xtask deps
/// --cuvs` fetches cuVS's wheels too (see [`cuvs`]).
pub fn run() -> Result<PathBuf> {
    // A stack done already needs no lock (a read-only cache, one another `deps` holds).
    let prefix = prefix()?;
    if base_done(&prefix) && (!cuvs_requested() || cuvs_done(&cuvs_prefix(&prefix))) {
        return Ok(prefix);
    }
    // One `deps` at a time per cache: two (the README's two commands in two terminals) shared one
    // staging directory, one renaming it while the other wrote, and an incomplete stack was
    // stamped and kept (the nineteenth audit, helper 93). The second waits, then finds it done.
    let _lock = CacheLock::take(&cache_dir()?)?;
    let prefix = run_base()?;
    if cuvs_requested() {
        cuvs(&prefix)?;
    }
    Ok(prefix)
}

/// An exclusive `flock` on `<cache>/.lock`, held while it lives (the OS lets go of it when the
/// process ends, however it ends).
pub struct CacheLock {
    /// Held for the lock: closing it lets go.
    _file: std::fs::File,
}

impl CacheLock {
    /// Takes the lock, waiting (and saying so) while another process holds it.
    pub fn take(cache: &Path) -> Result<CacheLock> {
        std::fs::create_dir_all(cache).map_err(|e| format!("{}: {e}", cache.display()))?;
        let path = cache.join(".lock");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        use std::os::fd::AsRawFd;
        // SAFETY: flock takes a descriptor this function owns (alive in `file`) and flags.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::WouldBlock {
                // A filesystem without flock (NFS with no lock manager, Lustre without `flock`):
                // on without the lock, as before it existed.
                eprintln!("xtask deps: {} cannot be locked ({e}): going on without the lock", path.display());
                return Ok(CacheLock { _file: file });
            }
            eprintln!("xtask deps: another `cargo xtask deps` is filling {}: waiting for it", cache.display());
            // SAFETY: as above; blocks until the other process lets go.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
                return Err(format!("{}: {}", path.display(), std::io::Error::last_os_error()));
            }
        }
        Ok(CacheLock { _file: file })
    }

    /// Whether another holder has it now (without waiting).
    #[cfg(test)]
    fn held_elsewhere(cache: &Path) -> bool {
        use std::os::fd::AsRawFd;
        let file = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(cache.join(".lock")).unwrap();
        // SAFETY: as in `take`; a lock taken here is let go when `file` closes below.
        unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) != 0 }
    }
}

/// Whether the base stack in `prefix` is there whole: this run's stamp and every checked file.
fn base_done(prefix: &Path) -> bool {
    std::fs::read_to_string(prefix.join(".raft-rs-wheels")).ok().as_deref() == Some(stamp_text().as_str()) && verify(prefix).is_ok()
}

/// Whether cuVS in `dir` is there whole: its stamp and every checked file.
fn cuvs_done(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join(".raft-rs-cuvs-wheels")).ok().as_deref() == Some(cuvs_stamp_text().as_str())
        && verify_cuvs(dir).is_ok()
}

fn run_base() -> Result<PathBuf> {
    let cache = cache_dir()?;
    let prefix = prefix()?;
    let stamp = prefix.join(".raft-rs-wheels");
    if base_done(&prefix) {
        return Ok(prefix); // already done: nothing to fetch
    }
    let wheels = cache.join("wheels");
    fetch(&wheels, WHEELS, "the RAFT/RMM/CUDA stack and NCCL")?;
    // The README's line installs these with pip's resolver: they must be what it picks.
    install_line::resolve(&python(), &wheels, WHEELS, "stack")?;
    let staging = prefix.with_extension("partial");
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging).map_err(|e| format!("{}: {e}", staging.display()))?;
    unpack(&wheels, WHEELS, &staging)?;
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

/// `cargo xtask deps --nccl`: NCCL (`nccl.h`, `libnccl.so.2`, for raft-comms) in the prefix,
/// `<prefix>/nvidia/nccl/{include,lib}`. libraft-cu13 asks for NCCL, so it is one of the base
/// pins and [`run`] already unpacked it: this only says so (the flag stays for old scripts).
pub fn nccl(prefix: &Path) -> Result<()> {
    let (name, version) = NCCL_WHEEL;
    for file in [prefix.join("nvidia/nccl/include/nccl.h"), prefix.join("nvidia/nccl/lib/libnccl.so.2")] {
        if !file.exists() {
            return Err(format!("{} is missing ({name}=={version} is one of the base pins: rerun `cargo xtask deps`)", file.display()));
        }
    }
    Ok(())
}

// ---- cuVS: `cargo xtask deps --cuvs`, for raft-cuvs (optional: nothing else needs it) ----------

/// cuVS's wheels, by exact version: `libcuvs-cu13` (`libcuvs_c.so`, `libcuvs.so`, the C headers)
/// and what its METADATA asks for, unpacked beside it (libcuvs's RPATH looks there): nvJitLink
/// 13.3 or newer (libcuvs.so and libraft.so call its `_13_3` entry points; the base pins' one), cuRAND
/// and NVRTC (the 13.3 toolkit line, as verified on the GPU; the base pins carry 13.2's, which
/// pip's resolver also accepts with libcuvs-cu13 26.8.1) and NCCL (the base pins' one).
pub const CUVS_WHEELS: &[(&str, &str)] = &[
    ("libcuvs-cu13", "26.8.1"),
    ("nvidia-nvjitlink", "13.3.33"),
    ("nvidia-curand", "10.4.3.29"),
    ("nvidia-cuda-nvrtc", "13.3.33"),
    ("nvidia-nccl-cu13", "2.28.9"),
];

/// Where `--cuvs` unpacks: beside the base prefix (`<cache>/26.08.00/cuvs`), in the wheels' own
/// layout, so libcuvs's RPATH (`$ORIGIN/../../nvidia/...`) finds its libraries. raft-cuvs's build
/// script looks there by the same rule (`raft_build::cuvs_beside`, one of `cuvs_roots`).
pub fn cuvs_prefix(prefix: &Path) -> PathBuf {
    stack::cuvs_beside(prefix).expect("the cache prefix is <cache>/<release>/prefix, never a root")
}

/// `cargo xtask deps --cuvs`: main.rs hands `deps` no flag but `--nccl`, so this one is read here.
fn cuvs_requested() -> bool {
    let args: Vec<String> = std::env::args().skip(1).collect();
    args.first().map(String::as_str) == Some("deps") && args.iter().any(|a| a == "--cuvs")
}

fn cuvs_stamp_text() -> String {
    stamp_of(CUVS_WHEELS)
}

/// Checks what the cuVS prefix holds: the release, the libraries, an nvJitLink new enough.
pub fn verify_cuvs(dir: &Path) -> Result<()> {
    let version =
        std::fs::read_to_string(dir.join("libcuvs/VERSION")).map_err(|e| format!("{}: {e}", dir.join("libcuvs/VERSION").display()))?;
    if version.trim() != "26.08.01" {
        return Err(format!("the cuVS prefix holds cuVS {}, not 26.08.01", version.trim()));
    }
    for file in [
        "libcuvs/lib64/libcuvs_c.so",
        "libcuvs/lib64/libcuvs.so",
        "libcuvs/include/cuvs/core/c_api.h",
        "libcuvs/include/cuvs/neighbors/cagra.h",
        "nvidia/cu13/lib/libnvJitLink.so.13",
        "nvidia/cu13/lib/libcurand.so.10",
        "nvidia/cu13/lib/libnvrtc.so.13",
        "nvidia/nccl/lib/libnccl.so.2",
    ] {
        if !dir.join(file).exists() {
            return Err(format!("{} is missing", dir.join(file).display()));
        }
    }
    nvjitlink_13_3(&dir.join("nvidia/cu13/lib/libnvJitLink.so.13"))
}

/// libraft.so and libcuvs.so call nvJitLink's `_13_3` entry points: an older one cannot load them.
fn nvjitlink_13_3(jitlink: &Path) -> Result<()> {
    let bytes = std::fs::read(jitlink).map_err(|e| format!("{}: {e}", jitlink.display()))?;
    if !bytes.windows(22).any(|w| w == b"__nvJitLinkCreate_13_3") {
        return Err(format!(
            "{} is older than 13.3 (no __nvJitLinkCreate_13_3): libraft.so and libcuvs.so cannot load with it",
            jitlink.display()
        ));
    }
    Ok(())
}

/// Fetches (when needed) cuVS's wheels into the cache with `pip download`, unpacks them beside the
/// base prefix and checks them; returns where. About 700 MB to fetch (libcuvs alone is 233 MB).
pub fn cuvs(prefix: &Path) -> Result<PathBuf> {
    let dir = cuvs_prefix(prefix);
    let stamp = dir.join(".raft-rs-cuvs-wheels");
    if cuvs_done(&dir) {
        return Ok(dir); // already done: nothing to fetch
    }
    let wheels = cache_dir()?.join("wheels");
    fetch(&wheels, CUVS_WHEELS, "cuVS; libcuvs-cu13 alone is 233 MB")?;
    let staging = dir.with_extension("partial");
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging).map_err(|e| format!("{}: {e}", staging.display()))?;
    unpack(&wheels, CUVS_WHEELS, &staging)?;
    verify_cuvs(&staging)?;
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(&staging, &dir).map_err(|e| format!("{} -> {}: {e}", staging.display(), dir.display()))?;
    std::fs::write(&stamp, cuvs_stamp_text()).map_err(|e| format!("{}: {e}", stamp.display()))?;
    eprintln!("xtask deps --cuvs: cuVS 26.08.01 ready in {}", dir.display());
    Ok(dir)
}

#[cfg(test)]
mod tests {
    /// The nineteenth audit (helper 93): a wheel cut short (a full disk during pip's copy) was
    /// kept and never fetched again. A zip's end record is what a cut leaves out.
    #[test]
    fn a_wheel_cut_short_is_told_from_a_whole_one() {
        let dir = std::env::temp_dir().join(format!("xtask-zip-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut empty_zip = b"PK\x05\x06".to_vec();
        empty_zip.extend_from_slice(&[0u8; 18]);
        let mut with_comment = b"some entries".to_vec();
        with_comment.extend_from_slice(&empty_zip[..20]);
        with_comment.extend_from_slice(&3u16.to_le_bytes());
        with_comment.extend_from_slice(b"abc");
        for (name, bytes, whole) in [
            ("empty.whl", empty_zip.clone(), true),
            ("comment.whl", with_comment.clone(), true),
            ("cut.whl", empty_zip[..10].to_vec(), false),
            ("cut-comment.whl", with_comment[..with_comment.len() - 1].to_vec(), false),
            ("nothing.whl", Vec::new(), false),
        ] {
            let path = dir.join(name);
            std::fs::write(&path, &bytes).unwrap();
            assert_eq!(super::whole_zip(&path), whole, "{name}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Every pin (the base stack's and cuVS's) has exactly one pinned file, named for it, with a
    /// SHA-256, and the table pins nothing else.
    #[test]
    fn every_pin_has_one_pinned_file_named_for_it() {
        let pins: Vec<(&str, &str)> = super::WHEELS.iter().chain(super::CUVS_WHEELS).copied().collect();
        for (name, version) in &pins {
            let files: Vec<_> = super::WHEEL_FILES.iter().filter(|(n, v, _, _)| n == name && v == version).collect();
            assert_eq!(files.len(), 1, "{name}=={version}: {files:?}");
            let (_, _, file, sha) = files[0];
            assert!(file.starts_with(&format!("{}-{version}-", name.replace('-', "_"))) && file.ends_with(".whl"), "{file}");
            assert!(sha.len() == 64 && sha.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)), "{sha}");
        }
        for (name, version, file, _) in super::WHEEL_FILES {
            assert!(pins.contains(&(*name, *version)), "{file} pins no wheel of WHEELS or CUVS_WHEELS");
        }
    }

    /// A cached wheel that is not the pinned file is told, with why, and fetched again: another
    /// file of the version, an altered one of the pinned name (whole, so only its digest tells:
    /// it was unpacked as it was before the digests were pinned); the pinned file passes.
    #[test]
    fn a_cached_wheel_unlike_its_pin_is_told_and_the_pinned_one_passes() {
        // SHA-256 itself, against FIPS 180-2's "abc".
        let dir = std::env::temp_dir().join(format!("xtask-pin-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("abc"), b"abc").unwrap();
        assert_eq!(super::sha256_of(&dir.join("abc")).unwrap(), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");

        let (name, version) = ("rapids-logger", "0.2.3");
        let (pinned, _) = super::pinned_file(name, version).unwrap();
        let mut empty_zip = b"PK\x05\x06".to_vec();
        empty_zip.extend_from_slice(&[0u8; 18]);
        let other = dir.join("rapids_logger-0.2.3-py3-none-any.whl");
        std::fs::write(&other, &empty_zip).unwrap();
        let (file, why) = super::unlike_the_pin(&dir, name, version).unwrap().expect("another file of the version passed");
        assert_eq!(file, other);
        assert!(why.contains("not the pinned file"), "{why}");
        std::fs::remove_file(&other).unwrap();

        std::fs::write(dir.join(pinned), &empty_zip).unwrap();
        let (_, why) = super::unlike_the_pin(&dir, name, version).unwrap().expect("an altered wheel of the pinned name passed");
        assert!(why.contains("SHA-256") && why.contains("not the pinned"), "{why}");
        std::fs::write(dir.join(pinned), &empty_zip[..10]).unwrap();
        let (_, why) = super::unlike_the_pin(&dir, name, version).unwrap().expect("a cut wheel passed");
        assert!(why.contains("cut short"), "{why}");
        std::fs::remove_file(dir.join(pinned)).unwrap();
        assert!(super::unlike_the_pin(&dir, name, version).unwrap().is_none(), "no wheel yet is nothing to refetch");

        // The real one, where `cargo xtask deps` fetched it (CI runs it before the tests).
        let cached = super::cache_dir().unwrap().join("wheels");
        if cached.join(pinned).exists() {
            assert_eq!(super::unlike_the_pin(&cached, name, version).unwrap(), None, "the cached pinned wheel failed its digest");
        } else {
            eprintln!("SKIP (part): no fetched {pinned} in {} to pass its digest", cached.display());
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// One `deps` at a time per cache (the nineteenth audit, helper 93): a second holder of the
    /// lock (another open of the file: `flock` conflicts between them, in one process or two)
    /// cannot take it while the first holds it, and can once it is let go.
    #[test]
    fn the_cache_lock_keeps_a_second_deps_out_until_the_first_is_done() {
        let cache = std::env::temp_dir().join(format!("xtask-lock-test-{}", std::process::id()));
        let lock = super::CacheLock::take(&cache).unwrap();
        assert!(super::CacheLock::held_elsewhere(&cache), "a second holder got the cache while the first filled it");
        drop(lock);
        assert!(!super::CacheLock::held_elsewhere(&cache), "the lock outlived its holder");
        let _ = std::fs::remove_dir_all(&cache);
    }
}
