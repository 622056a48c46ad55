//! `raft::Error`: every failure of raft-rs, with one of four kinds and the API that failed.
//!
//! A leaf crate: every layer (`raft-sys` users, `raft-core`, `raft-abi`) reports through it, and it
//! depends on none of them.
use std::borrow::Cow;
use std::fmt;

/// What went wrong, for dispatch (the seed's `exn:fail:raft-kind`).
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// An allocation failed: free memory and retry.
    OutOfMemory,
    /// A CUDA call failed, for example because no driver is installed.
    Cuda,
    /// The call was refused before reaching the GPU: a device that does not exist, resources
    /// already released, a bad argument.
    Logic,
    /// Anything else.
    Generic,
}

impl ErrorKind {
    /// The kind of a failed shim call's status (`RAFTRS_STATUS_*` of `raft-sys`: 1 out of
    /// memory, 2 CUDA, 3 logic, anything else generic).
    pub fn from_shim_status(status: i32) -> ErrorKind {
        match status {
            1 => ErrorKind::OutOfMemory,
            2 => ErrorKind::Cuda,
            3 => ErrorKind::Logic,
            _ => ErrorKind::Generic,
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ErrorKind::OutOfMemory => "out-of-memory",
            ErrorKind::Cuda => "cuda",
            ErrorKind::Logic => "logic",
            ErrorKind::Generic => "generic",
        })
    }
}

/// A failure of a raft call. `Display` is `who: message`, where `who` is the Rust API that failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{who}: {message}")]
pub struct Error {
    kind: ErrorKind,
    who: Cow<'static, str>,
    message: String,
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A new error of `kind`, raised by `who`.
    pub fn new(kind: ErrorKind, who: impl Into<Cow<'static, str>>, message: impl Into<String>) -> Self {
        Error { kind, who: who.into(), message: message.into() }
    }

    /// A `Logic` error.
    pub fn logic(who: impl Into<Cow<'static, str>>, message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Logic, who, message)
    }

    /// The `Logic` error of an operation on released resources.
    pub fn released(who: impl Into<Cow<'static, str>>, device: usize) -> Self {
        Self::logic(who, format!("the device resources on device {device} were released"))
    }

    /// The error of a failed cudarc (driver) call: `OutOfMemory` for `CUDA_ERROR_OUT_OF_MEMORY`,
    /// `Cuda` otherwise.
    pub fn driver(who: impl Into<Cow<'static, str>>, e: cudarc::driver::DriverError) -> Self {
        let kind = if e.0 == cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY { ErrorKind::OutOfMemory } else { ErrorKind::Cuda };
        Self::new(kind, who, describe_driver_error(&e))
    }

    /// The kind, for dispatch.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The Rust API that failed, e.g. `DeviceResources::sync`.
    pub fn who(&self) -> &str {
        &self.who
    }

    /// The message, without `who`.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The same error, reported by another API (a helper's error seen from its caller).
    pub fn with_who(mut self, who: impl Into<Cow<'static, str>>) -> Self {
        self.who = who.into();
        self
    }
}

/// For `?` on cudarc calls in a user's own code beside raft's: a `Cuda` (or `OutOfMemory`) error
/// whose `who` is `cudarc`. raft's own APIs never use it: they name themselves.
impl From<cudarc::driver::DriverError> for Error {
    fn from(e: cudarc::driver::DriverError) -> Self {
        Error::driver("cudarc", e)
    }
}

/// `CUDA_ERROR_X: description` for a driver error.
pub fn describe_driver_error(e: &cudarc::driver::DriverError) -> String {
    // The names come from the driver; without libcuda cudarc would panic asking for them.
    // SAFETY: is_culib_present only tries to dlopen libcuda under its usual names.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return format!("{:?}", e.0);
    }
    let name = e.error_name().map(|c| c.to_string_lossy().into_owned()).unwrap_or_else(|_| format!("{:?}", e.0));
    let text = e.error_string().map(|c| c.to_string_lossy().into_owned()).unwrap_or_default();
    if text.is_empty() {
        name
    } else {
        format!("{name}: {text}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_is_who_colon_message() {
        let e = Error::released("DeviceResources::sync", 0);
        assert_eq!(e.to_string(), "DeviceResources::sync: the device resources on device 0 were released");
        assert_eq!(e.kind(), ErrorKind::Logic);
        assert_eq!(e.who(), "DeviceResources::sync");
        // The seed recovers `who` by splitting on ": ".
        assert_eq!(e.to_string().split(": ").next(), Some("DeviceResources::sync"));
    }

    #[test]
    fn shim_statuses_map_to_kinds() {
        let kinds: Vec<ErrorKind> = (1..=5).map(ErrorKind::from_shim_status).collect();
        assert_eq!(kinds, [ErrorKind::OutOfMemory, ErrorKind::Cuda, ErrorKind::Logic, ErrorKind::Generic, ErrorKind::Generic]);
    }

    #[test]
    fn driver_out_of_memory_is_out_of_memory() {
        use cudarc::driver::sys::CUresult;
        let e = Error::driver("DeviceResources::new", cudarc::driver::DriverError(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
        assert_eq!(e.kind(), ErrorKind::OutOfMemory);
        let e = Error::driver("DeviceResources::new", cudarc::driver::DriverError(CUresult::CUDA_ERROR_INVALID_VALUE));
        assert_eq!(e.kind(), ErrorKind::Cuda);
    }

    #[test]
    fn kinds_display_as_the_seed_symbols() {
        let names: Vec<String> =
            [ErrorKind::OutOfMemory, ErrorKind::Cuda, ErrorKind::Logic, ErrorKind::Generic].iter().map(|k| k.to_string()).collect();
        assert_eq!(names, ["out-of-memory", "cuda", "logic", "generic"]);
    }
}
