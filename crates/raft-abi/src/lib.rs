//! Versions and ABI: what a raft-rs build was compiled against, and checks that catch a native
//! stack that moved under it.
//!
//! [`abi()`] is the tag of this build: RAFT's, RMM's and CCCL's version macros, `CUDART_VERSION`,
//! `sizeof(raft::device_resources)`, RMM's ABI namespace and a digest of every stack header,
//! as `raft-sys`'s build script read them from the headers the shim was compiled with
//! ([`raft_sys::build_info`]). Reading it loads
//! nothing and needs no CUDA, so a binary can print it even where the native stack is missing.
//! [`running()`] is the other side: the CUDA runtime and driver this process actually loaded
//! (through the shim). [`Abi::mismatches`] names the fields that differ between two tags;
//! `cargo xtask abi-check` compares this build's tag with the one committed in the repository.
mod tag;

pub use tag::{Abi, AbiField, TAG_FORMAT};

use raft_error::{Error, ErrorKind, Result};
use raft_sys::{self as sys, build_info};
use std::sync::OnceLock;

// The handle size the build script recorded for this build is the one the bindings' header was
// written for (the shim static_asserts that number against the RAFT headers it compiles with):
// a raft-sys whose header and build script disagree does not compile.
static_assertions::const_assert_eq!(build_info::HANDLE_SIZE, sys::RAFTRS_EXPECTED_HANDLE_SIZE as usize);

/// `major.minor` of a CUDA version number (13020 → `"13.2"`).
fn cuda_version(v: i64) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

/// `"26.08.00"` of a RAPIDS version triple.
fn rapids_version((year, month, patch): (u32, u32, u32)) -> String {
    Release::new(year, month, patch).to_string()
}

/// The RAFT release this build was compiled against, `"26.08.00"`, from RAFT's own headers.
/// Loads nothing: it works where the native stack is missing.
pub fn version() -> &'static str {
    static V: OnceLock<String> = OnceLock::new();
    V.get_or_init(|| rapids_version(build_info::RAFT_VERSION))
}

/// A RAPIDS release as numbers, ordered: `raft::raft_release() >= Release::new(26, 8, 0)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Release {
    /// Year (`26`).
    pub year: u32,
    /// Month (`8`).
    pub month: u32,
    /// Patch (`0`).
    pub patch: u32,
}

impl Release {
    /// `Release::new(26, 8, 0)`.
    pub const fn new(year: u32, month: u32, patch: u32) -> Self {
        Release { year, month, patch }
    }

    /// Parses `"26.08.00"`.
    pub fn parse(text: &str) -> Option<Release> {
        let mut parts = text.trim().split('.').map(|p| p.parse::<u32>().ok());
        let r = Release { year: parts.next()??, month: parts.next()??, patch: parts.next()?? };
        parts.next().is_none().then_some(r)
    }
}

impl std::fmt::Display for Release {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:02}.{:02}.{:02}", self.year, self.month, self.patch)
    }
}

/// This build's RAFT release as numbers (named `raft_release`, not `release`: on
/// `DeviceResources`, `release()` frees the resources).
pub fn raft_release() -> Release {
    let (year, month, patch) = build_info::RAFT_VERSION;
    Release::new(year, month, patch)
}

/// The tag of this build. Loads nothing: it works where the native stack is missing.
pub fn abi() -> Abi {
    let cccl = build_info::CCCL_VERSION;
    Abi {
        version: TAG_FORMAT,
        raft: version().to_string(),
        rmm: rapids_version(build_info::RMM_VERSION),
        cccl: format!("{}.{}.{}", cccl / 1_000_000, (cccl / 1000) % 1000, cccl % 1000),
        cuda_runtime: cuda_version(build_info::CUDART_VERSION.into()),
        handle_size: build_info::HANDLE_SIZE,
        rmm_abi_namespace: build_info::RMM_ABI_NAMESPACE.to_string(),
        headers: build_info::HEADERS_DIGEST.to_string(),
    }
}

/// The CUDA stack this process actually runs on (which may differ from the one it was built for).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Running {
    /// The CUDA runtime loaded (`cudaRuntimeGetVersion`), e.g. `"13.2"`.
    pub cuda_runtime: String,
    /// The driver's CUDA version (`cudaDriverGetVersion`), e.g. `"13.0"`; `None` without a driver.
    pub driver: Option<String>,
}

/// Calls one version query of the shim; a failure reads the shim's message for this thread.
fn query(who: &'static str, api: &sys::RaftrsShim, call: impl FnOnce(*mut i32) -> sys::raftrs_status) -> Result<i32> {
    let mut v = 0;
    let status = call(&mut v);
    if status == sys::RAFTRS_STATUS_OK {
        Ok(v)
    } else {
        Err(Error::new(ErrorKind::from_shim_status(status), who, sys::take_last_error(api)))
    }
}

/// What this process runs on now: the CUDA runtime the shim loaded and the driver's version.
/// Works without a GPU or driver (`driver` is then `None`).
///
/// # Errors
/// `Cuda` when the native shim cannot be loaded (the message says which library is missing and
/// what to set) or the runtime does not answer.
pub fn running() -> Result<Running> {
    const WHO: &str = "raft::running";
    let api = sys::shim().map_err(|e| Error::library_missing(WHO, e.clone()))?;
    // SAFETY: writes one int through a valid pointer; needs no device.
    let runtime = query(WHO, api, |out| unsafe { api.raftrs_runtime_version(out) })?;
    // SAFETY: as above; 0 when no driver is installed.
    let driver = query(WHO, api, |out| unsafe { api.raftrs_driver_version(out) }).unwrap_or(0);
    Ok(Running { cuda_runtime: cuda_version(runtime.into()), driver: (driver > 0).then(|| cuda_version(driver.into())) })
}

/// Refuses to go on unless this is RAFT `wanted`: the `Logic` error
/// `who: built for RAFT 26.10.00, but this is RAFT 26.08.00`.
pub fn require_raft_release(who: &'static str, wanted: &str) -> Result<()> {
    if version() == wanted {
        Ok(())
    } else {
        Err(Error::logic(who, format!("built for RAFT {wanted}, but this is RAFT {}", version())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_build_facts_need_no_shim() {
        // Nothing here loads the shim: these work on a machine without the native stack.
        assert_eq!(raft_release().to_string(), version());
        assert_eq!(Release::parse(version()), Some(raft_release()));
        let a = abi();
        assert_eq!(a.handle_size, sys::RAFTRS_EXPECTED_HANDLE_SIZE as usize);
        assert_eq!(a.report_line(), format!("raft={} rmm={} cccl={}", a.raft, a.rmm, a.cccl));
        // No test of this crate loads the shim: reading the facts did not either.
        assert!(sys::loaded_from().is_none(), "abi() loaded the shim");
    }

    #[test]
    fn cuda_versions_read_as_major_minor() {
        assert_eq!(cuda_version(13020), "13.2");
        assert_eq!(cuda_version(12090), "12.9");
    }
}
