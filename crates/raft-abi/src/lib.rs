//! Versions and ABI: what a raft-rs build was compiled against, and checks that catch a native
//! stack that moved under it.
//!
//! [`abi()`] is the tag of this build (filled by the C++ shim from RAFT's, RMM's and CCCL's
//! version macros, `CUDART_VERSION` and `sizeof(raft::device_resources)`); [`running()`] is the
//! other side: the CUDA runtime and driver actually loaded. [`Abi::mismatches`] names the
//! fields that differ between two tags; `cargo xtask abi-check` compares this build's tag with
//! the one committed in the repository.
mod tag;

pub use tag::{Abi, AbiField, TAG_FORMAT};

use raft_sys as sys;
use std::sync::OnceLock;

// The handle layout this binding was written for; the shim static_asserts the same number
// against the headers it is compiled with.
static_assertions::const_assert_eq!(sys::RAFTRS_EXPECTED_HANDLE_SIZE, 32);

fn build_info() -> &'static sys::raftrs_build_info {
    static INFO: OnceLock<sys::raftrs_build_info> = OnceLock::new();
    INFO.get_or_init(|| {
        // SAFETY: an all-zero raftrs_build_info is valid (integers and a char array).
        let mut info: sys::raftrs_build_info = unsafe { std::mem::zeroed() };
        // SAFETY: fills the struct through a valid pointer; makes no CUDA call.
        unsafe { sys::raftrs_get_build_info(&mut info) };
        info
    })
}

/// `major.minor` of a CUDA version number (13020 → `"13.2"`).
fn cuda_version(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

/// The RAFT release this build was compiled against, `"26.08.00"`, from RAFT's own headers.
pub fn version() -> &'static str {
    static V: OnceLock<String> = OnceLock::new();
    V.get_or_init(|| {
        let i = build_info();
        format!("{:02}.{:02}.{:02}", i.raft_major, i.raft_minor, i.raft_patch)
    })
}

/// A RAPIDS release as numbers, ordered: `raft::release() >= Release::new(26, 8, 0)`.
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

/// This build's RAFT release as numbers.
pub fn release() -> Release {
    Release::parse(version()).expect("the shim's version macros are numbers")
}

/// The tag of this build.
pub fn abi() -> Abi {
    let i = build_info();
    let cccl = i.cccl_version;
    // SAFETY: the shim NUL-terminates the namespace within the array (strncpy of size - 1 into
    // a zeroed struct).
    let ns = unsafe { std::ffi::CStr::from_ptr(i.rmm_abi_namespace.as_ptr()) };
    Abi {
        version: TAG_FORMAT,
        raft: version().to_string(),
        rmm: format!("{:02}.{:02}.{:02}", i.rmm_major, i.rmm_minor, i.rmm_patch),
        cccl: format!("{}.{}.{}", cccl / 1_000_000, (cccl / 1000) % 1000, cccl % 1000),
        cuda_runtime: cuda_version(i.cudart_version),
        handle_size: i.handle_size,
        rmm_abi_namespace: ns.to_string_lossy().into_owned(),
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

/// What this process runs on now. Works without a GPU.
pub fn running() -> raft_core::Result<Running> {
    let runtime = raft_core::runtime_version()?;
    let driver = raft_core::driver_version().unwrap_or(0);
    Ok(Running { cuda_runtime: cuda_version(runtime), driver: (driver > 0).then(|| cuda_version(driver)) })
}

/// Refuses to go on unless this is RAFT `wanted`: the `Logic` error
/// `who: built for RAFT 26.10.00, but this is RAFT 26.08.00`.
pub fn require_raft_release(who: &'static str, wanted: &str) -> raft_core::Result<()> {
    if version() == wanted {
        Ok(())
    } else {
        Err(raft_core::Error::logic(who, format!("built for RAFT {wanted}, but this is RAFT {}", version())))
    }
}
