//! The pinned stack: the release, the exact wheels, and the libraries the shim links.

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
/// What to tell the user when the headers a shim is compiled with are not of the pinned release's
/// `year.month` (RAFT's and RMM's version macros, `(year, month, patch)`): raft-rs was written
/// and tested against [`PINNED`], RAFT and RMM keep no C++ ABI across their releases, and the
/// shim compiling is no proof that it behaves as this release's. `None` when both match.
pub fn unpinned(raft: (u32, u32, u32), rmm: (u32, u32, u32)) -> Option<String> {
    let mut pin = PINNED.split('.').map(|p| p.parse::<u32>().unwrap_or(u32::MAX));
    let (year, month) = (pin.next()?, pin.next()?);
    let off: Vec<String> = [("RAFT", raft), ("RMM", rmm)]
        .iter()
        .filter(|(_, (y, m, _))| (*y, *m) != (year, month))
        .map(|(name, (y, m, p))| format!("{name} {y}.{m:02}.{p:02}"))
        .collect();
    (!off.is_empty()).then(|| {
        format!(
            "raft-rs is pinned to RAPIDS {PINNED}, but the headers it is building against are {}: RAFT and RMM keep no C++ \
             ABI across releases, and nothing past compiling is checked for another one; install the pinned stack ({})",
            off.join(" and "),
            pip_line()
        )
    })
}

/// NCCL's wheel (raft-comms's `nccl.h`, `libnccl.so.2`): one of [`WHEELS`], since libraft asks for it.
pub const NCCL_WHEEL: (&str, &str) = ("nvidia-nccl-cu13", "2.28.9");

/// The one `pip install` line that lays out in a Python environment exactly what the cache holds.
pub fn pip_line() -> String {
    let pins: Vec<String> = WHEELS.iter().map(|(n, v)| format!("{n}=={v}")).collect();
    format!("pip install {}", pins.join(" "))
}

/// The libraries the shim links, in load order (a library after what it needs).
pub const LIBRARIES: &[&str] = &["rapids_logger", "rmm", "cudart", "cublasLt", "cublas", "cusparse", "cusolver"];

/// The build's decision on the headers' release: `Ok(None)` for the pinned `year.month`; for
/// another, an error unless `allow` (the value of `RAFT_RS_ALLOW_UNPINNED`) is `1`, then
/// `Ok(Some(warning))`. An error, not a warning: cargo shows the warnings of a path dependency
/// only, so a user's crate depending on raft-rs from crates.io or git built against another
/// release in silence (the nineteenth audit, helper 93).
pub fn check_pinned(raft: (u32, u32, u32), rmm: (u32, u32, u32), allow: Option<&str>) -> Result<Option<String>, String> {
    match unpinned(raft, rmm) {
        None => Ok(None),
        Some(w) if allow.map(str::trim) == Some("1") => Ok(Some(w)),
        Some(w) => Err(format!("{w}. Set RAFT_RS_ALLOW_UNPINNED=1 to build against them anyway")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_release_is_an_error_unless_allowed() {
        assert_eq!(check_pinned((26, 8, 0), (26, 8, 0), None), Ok(None));
        let e = check_pinned((26, 10, 0), (26, 8, 0), None).unwrap_err();
        assert!(e.contains("RAFT 26.10.00") && e.contains("pip install") && e.contains("RAFT_RS_ALLOW_UNPINNED=1"), "{e}");
        assert!(check_pinned((26, 10, 0), (26, 8, 0), Some("0")).is_err());
        let w = check_pinned((26, 10, 0), (26, 8, 0), Some("1")).unwrap().expect("a warning when allowed");
        assert!(w.contains("RAFT 26.10.00"), "{w}");
    }

    /// The fifteenth audit (helper 72): headers of another release were built against in silence.
    #[test]
    fn headers_of_another_release_are_named_and_the_pinned_ones_pass() {
        assert_eq!(unpinned((26, 8, 0), (26, 8, 1)), None, "a patch release of the pin is the pin");
        let w = unpinned((26, 10, 0), (26, 8, 0)).expect("another RAFT is said");
        assert!(w.contains("RAFT 26.10.00") && !w.contains("RMM 26") && w.contains(PINNED), "{w}");
        let w = unpinned((26, 10, 0), (26, 10, 0)).unwrap();
        assert!(w.contains("RAFT 26.10.00 and RMM 26.10.00"), "{w}");
    }

    #[test]
    fn the_pip_line_pins_every_wheel_exactly_in_order() {
        let line = pip_line();
        assert!(line.starts_with("pip install libraft-cu13==26.8.0 librmm-cu13==26.8.0 "), "{line}");
        assert_eq!(line.split(' ').count(), 2 + WHEELS.len(), "{line}");
        assert!(line.ends_with(" nvidia-nccl-cu13==2.28.9"), "{line}");
    }

    #[test]
    fn nccl_is_one_of_the_wheels_and_the_release_matches_libraft() {
        assert!(WHEELS.contains(&NCCL_WHEEL));
        // libraft's wheel version 26.8.0 is the release 26.08.00.
        let (_, raft) = WHEELS[0];
        let parts: Vec<u32> = raft.split('.').map(|p| p.parse().unwrap()).collect();
        assert_eq!(format!("{:02}.{:02}.{:02}", parts[0], parts[1], parts[2]), PINNED);
    }
}
