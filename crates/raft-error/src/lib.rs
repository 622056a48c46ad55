//! `raft::Error`: every failure of raft-rs, with one of four kinds, a finer reason, the native
//! code where there is one, and the API that failed.
//!
//! A leaf crate: every layer (`raft-sys` users, `raft-core`, `raft-abi`) reports through it, and it
//! depends on none of them.
mod cuda_codes;

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

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

/// Why a call failed, finer than [`ErrorKind`], for a program that acts on it: retry after a
/// [`Timeout`](Reason::Timeout), fall back to the CPU on [`NoDriver`](Reason::NoDriver) or
/// [`LibraryMissing`](Reason::LibraryMissing), make new resources after
/// [`Released`](Reason::Released). More reasons may come: match with a `_` arm.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// The resources (or the communicator) were released before the call (kind `Logic`).
    Released,
    /// The call was refused for what it was given or when it was made: a device that does not
    /// exist, a bad size or shape, a value out of range, a call in the wrong order (kind `Logic`).
    InvalidArgument,
    /// A wait ran past its bound: a rendezvous, a collective, a peer that never came.
    Timeout,
    /// A native library could not be loaded: the raft-rs shim, libnccl, libcuvs, or what they
    /// need (kind `Cuda`, the kind of a missing CUDA stack). The message says what to set.
    LibraryMissing,
    /// No CUDA driver, or one too old for the runtime (kind `Cuda`, `cuda_code() == Some(35)`,
    /// `cudaErrorInsufficientDriver`).
    NoDriver,
    /// An allocation failed (kind `OutOfMemory`): free memory and retry.
    OutOfMemory,
    /// Another CUDA failure; [`Error::cuda_code`] gives the code when CUDA reported one.
    Cuda,
    /// An NCCL failure; [`Error::nccl_code`] gives NCCL's `ncclResult_t`.
    Nccl,
    /// A job panicked (its payload: `JobHandle::join_unwind`).
    Panicked,
    /// The process is exiting and the library's exit teardown has run (or was skipped): the
    /// call came from a user's exit handler registered before the library's exit hook, or from a
    /// thread still running under the exit (kind `Logic`). Nothing new is made from then on,
    /// and what is dropped is left to the OS.
    Exiting,
    /// Anything else.
    Other,
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Reason::Released => "released",
            Reason::InvalidArgument => "invalid-argument",
            Reason::Timeout => "timeout",
            Reason::LibraryMissing => "library-missing",
            Reason::NoDriver => "no-driver",
            Reason::OutOfMemory => "out-of-memory",
            Reason::Cuda => "cuda",
            Reason::Nccl => "nccl",
            Reason::Panicked => "panicked",
            Reason::Exiting => "exiting",
            Reason::Other => "other",
        })
    }
}

/// `cudaErrorInsufficientDriver`: what the CUDA runtime answers without a driver.
pub const CUDA_ERROR_INSUFFICIENT_DRIVER: i32 = 35;

/// The error behind another, shared so that [`Error`] stays `Clone`.
type Source = Arc<dyn std::error::Error + Send + Sync + 'static>;

/// A failure of a raft call. `Display` is `who: message`, where `who` is the Rust API that failed.
///
/// Beside the [`kind`](Self::kind) (the seed's four), an error carries a finer
/// [`reason`](Self::reason), the native code when CUDA or NCCL gave one
/// ([`cuda_code`](Self::cuda_code), [`nccl_code`](Self::nccl_code)) and, where one exists, the
/// error it comes from (`std::error::Error::source`). Equality compares all but the source.
///
/// One pointer wide (the fields are boxed): a `Result<T, Error>` is no larger than `T` needs, and
/// `Result<(), Error>` comes back in a register. Errors are the slow path; every successful call
/// returned and moved the whole error's size before.
#[derive(Clone)]
pub struct Error {
    inner: Box<Inner>,
}

#[derive(Debug, Clone)]
struct Inner {
    kind: ErrorKind,
    reason: Reason,
    who: Cow<'static, str>,
    message: String,
    cuda_code: Option<i32>,
    nccl_code: Option<i32>,
    source: Option<Source>,
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let i = &self.inner;
        f.debug_struct("Error")
            .field("kind", &i.kind)
            .field("reason", &i.reason)
            .field("who", &i.who)
            .field("message", &i.message)
            .field("cuda_code", &i.cuda_code)
            .field("nccl_code", &i.nccl_code)
            .field("source", &i.source)
            .finish()
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.inner.who, self.inner.message)
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.inner.source.as_ref().map(|s| &**s as &(dyn std::error::Error + 'static))
    }
}

impl PartialEq for Error {
    fn eq(&self, other: &Self) -> bool {
        (self.inner.kind, self.inner.reason, &self.inner.who, &self.inner.message, self.inner.cuda_code, self.inner.nccl_code)
            == (other.inner.kind, other.inner.reason, &other.inner.who, &other.inner.message, other.inner.cuda_code, other.inner.nccl_code)
    }
}

impl Eq for Error {}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The first CUDA runtime error name in `message` (`cudaErrorNoDevice`), as its code.
fn cuda_code_in(message: &str) -> Option<i32> {
    let mut rest = message;
    while let Some(at) = rest.find("cudaError") {
        let tail = &rest[at..];
        let end = tail.find(|c: char| !c.is_ascii_alphanumeric()).unwrap_or(tail.len());
        if let Some(&(_, code)) = cuda_codes::RUNTIME_ERRORS.iter().find(|(name, _)| *name == &tail[..end]) {
            return Some(code);
        }
        rest = &tail[end..];
    }
    None
}

/// NCCL's `ncclGetErrorString` texts and their `ncclResult_t`, as raft-comms' shim reports them
/// (`"<what> failed: <text>"`).
const NCCL_ERRORS: &[(&str, i32)] = &[
    ("unhandled cuda error", 1),
    ("unhandled system error", 2),
    ("internal error", 3),
    ("invalid argument", 4),
    ("invalid usage", 5),
    ("remote process exited or there was a network error", 6),
    ("NCCL operation in progress", 7),
];

/// The `ncclResult_t` of a failure raft-comms' shim reported (`"… failed: <NCCL's text>"`).
fn nccl_code_in(message: &str) -> Option<i32> {
    message.match_indices("failed: ").find_map(|(at, sep)| {
        let text = &message[at + sep.len()..];
        NCCL_ERRORS.iter().find(|(words, _)| text.starts_with(words)).map(|&(_, code)| code)
    })
}

impl Error {
    /// A new error of `kind`, raised by `who`. A CUDA runtime error name in the message
    /// (`cudaErrorInsufficientDriver`, as the shims report failures) gives [`cuda_code`](Self::cuda_code);
    /// the reason follows from the kind and the code (`Logic` is
    /// [`InvalidArgument`](Reason::InvalidArgument), code 35 [`NoDriver`](Reason::NoDriver)).
    pub fn new(kind: ErrorKind, who: impl Into<Cow<'static, str>>, message: impl Into<String>) -> Self {
        let message = message.into();
        let cuda_code = cuda_code_in(&message);
        let mut e = Error {
            inner: Box::new(Inner { kind, reason: Reason::Other, who: who.into(), message, cuda_code, nccl_code: None, source: None }),
        };
        e.inner.reason = e.implied_reason();
        e
    }

    /// The reason the kind and the codes imply.
    fn implied_reason(&self) -> Reason {
        match (self.inner.kind, self.inner.nccl_code, self.inner.cuda_code) {
            (ErrorKind::OutOfMemory, _, _) => Reason::OutOfMemory,
            (_, Some(_), _) => Reason::Nccl,
            (_, _, Some(CUDA_ERROR_INSUFFICIENT_DRIVER)) => Reason::NoDriver,
            (_, _, Some(_)) | (ErrorKind::Cuda, _, _) => Reason::Cuda,
            (ErrorKind::Logic, _, _) => Reason::InvalidArgument,
            _ => Reason::Other,
        }
    }

    /// A `Logic` error ([`Reason::InvalidArgument`]).
    pub fn logic(who: impl Into<Cow<'static, str>>, message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Logic, who, message)
    }

    /// The `Logic` error of an operation on released resources ([`Reason::Released`]).
    pub fn released(who: impl Into<Cow<'static, str>>, device: usize) -> Self {
        Self::logic(who, format!("the device resources on device {device} were released")).with_reason(Reason::Released)
    }

    /// The `Generic` error of a wait that ran past its bound ([`Reason::Timeout`]).
    pub fn timeout(who: impl Into<Cow<'static, str>>, message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Generic, who, message).with_reason(Reason::Timeout)
    }

    /// The error of a native library that could not be loaded (the shim, libnccl, libcuvs):
    /// kind `Cuda`, [`Reason::LibraryMissing`], `why`'s text as the message and `why` as the source.
    /// Every loader of the workspace reports through this, so a missing library reads the same
    /// whichever crate needed it.
    pub fn library_missing<E>(who: impl Into<Cow<'static, str>>, why: E) -> Self
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        Self::new(ErrorKind::Cuda, who, why.to_string()).with_reason(Reason::LibraryMissing).with_source(why)
    }

    /// The `Cuda` error of a call in the child of a `fork()` of a process that used the library
    /// (`raft_exit::forked`): CUDA allows no use there until an `exec`, and the library's
    /// threads were not copied. Every crate of the workspace refuses through this.
    pub fn forked(who: impl Into<Cow<'static, str>>) -> Self {
        Self::new(
            ErrorKind::Cuda,
            who,
            "CUDA was in use when this process was forked: a fork's child cannot use CUDA or this library (start it with \
             spawn or forkserver, or exec)",
        )
    }

    /// The `Logic` error of a call made once the process's exit teardown has run or was skipped
    /// (`raft_exit::closed`; [`Reason::Exiting`]): what the call would make would meet the C++
    /// static destructors that follow the teardown (RMM's per-device map, the CUDA runtime's),
    /// so nothing is made. Every crate of the workspace refuses through this (by way of
    /// `raft_exit::refusal`).
    pub fn exiting(who: impl Into<Cow<'static, str>>) -> Self {
        Self::logic(
            who,
            "the process is exiting: the library's exit teardown has run (or was skipped), so nothing new is made; \
             what is dropped from now on is left to the OS",
        )
        .with_reason(Reason::Exiting)
    }

    /// The `Cuda` error of a process without a CUDA driver ([`Reason::NoDriver`],
    /// `cuda_code() == Some(35)`, what the runtime says then).
    pub fn no_driver(who: impl Into<Cow<'static, str>>, message: impl Into<String>) -> Self {
        let mut e = Self::new(ErrorKind::Cuda, who, message);
        e.inner.cuda_code = Some(CUDA_ERROR_INSUFFICIENT_DRIVER);
        e.inner.reason = Reason::NoDriver;
        e
    }

    /// The error of a failure raft-comms' shim reported: as [`new`](Self::new), and NCCL's text
    /// in the message (`"… failed: unhandled system error …"`) gives [`nccl_code`](Self::nccl_code)
    /// and [`Reason::Nccl`] (an out-of-memory failure stays [`Reason::OutOfMemory`]).
    pub fn nccl(kind: ErrorKind, who: impl Into<Cow<'static, str>>, message: impl Into<String>) -> Self {
        let mut e = Self::new(kind, who, message);
        e.inner.nccl_code = nccl_code_in(&e.inner.message);
        e.inner.reason = e.implied_reason();
        e
    }

    /// The error of a failed cudarc (driver) call: `OutOfMemory` for `CUDA_ERROR_OUT_OF_MEMORY`,
    /// `Cuda` otherwise; [`cuda_code`](Self::cuda_code) is the driver's `CUresult`.
    pub fn driver(who: impl Into<Cow<'static, str>>, e: cudarc::driver::DriverError) -> Self {
        let kind = if e.0 == cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY { ErrorKind::OutOfMemory } else { ErrorKind::Cuda };
        let mut made = Self::new(kind, who, describe_driver_error(&e));
        made.inner.cuda_code = Some(e.0 as i32);
        made.inner.reason = made.implied_reason();
        // No source: cudarc's `DriverError` asks libcuda for its text when displayed, and
        // panics where there is no libcuda; the message holds that text already.
        made
    }

    /// The kind, for dispatch.
    pub fn kind(&self) -> ErrorKind {
        self.inner.kind
    }

    /// Why, finer than the kind.
    pub fn reason(&self) -> Reason {
        self.inner.reason
    }

    /// The CUDA code of the failure, when CUDA gave one: the runtime's `cudaError_t` (35
    /// `cudaErrorInsufficientDriver` without a driver, 2 `cudaErrorMemoryAllocation`), or the
    /// driver's `CUresult` for a driver call ([`Error::driver`]).
    pub fn cuda_code(&self) -> Option<i32> {
        self.inner.cuda_code
    }

    /// NCCL's `ncclResult_t` of the failure, when NCCL gave one (2 `ncclSystemError`, 6
    /// `ncclRemoteError`, …).
    pub fn nccl_code(&self) -> Option<i32> {
        self.inner.nccl_code
    }

    /// The Rust API that failed, e.g. `DeviceResources::sync`.
    pub fn who(&self) -> &str {
        &self.inner.who
    }

    /// The message, without `who`.
    pub fn message(&self) -> &str {
        &self.inner.message
    }

    /// The same error, reported by another API (a helper's error seen from its caller); the
    /// reason, codes and source stay.
    pub fn with_who(mut self, who: impl Into<Cow<'static, str>>) -> Self {
        self.inner.who = who.into();
        self
    }

    /// The same error with another message (context added); the reason, codes and source stay.
    pub fn with_message(mut self, message: impl Into<String>) -> Self {
        self.inner.message = message.into();
        self
    }

    /// The same error with a finer reason, set where the failure is understood.
    pub fn with_reason(mut self, reason: Reason) -> Self {
        self.inner.reason = reason;
        self
    }

    /// The same error, caused by `source` (`std::error::Error::source` returns it).
    pub fn with_source<E>(mut self, source: E) -> Self
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        self.inner.source = Some(Arc::new(source));
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
    fn an_error_is_one_pointer_wide() {
        assert_eq!(std::mem::size_of::<Error>(), std::mem::size_of::<usize>());
        assert_eq!(std::mem::size_of::<Result<()>>(), std::mem::size_of::<usize>());
    }

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
    #[cfg_attr(miri, ignore = "loads libcuda (dlopen) to name the driver's error")]
    fn driver_out_of_memory_is_out_of_memory() {
        use cudarc::driver::sys::CUresult;
        let e = Error::driver("DeviceResources::new", cudarc::driver::DriverError(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
        assert_eq!(e.kind(), ErrorKind::OutOfMemory);
        let e = Error::driver("DeviceResources::new", cudarc::driver::DriverError(CUresult::CUDA_ERROR_INVALID_VALUE));
        assert_eq!(e.kind(), ErrorKind::Cuda);
    }

    #[test]
    fn reasons_follow_the_kind_and_the_code() {
        let cases = [
            (ErrorKind::Logic, "no device 3 among 1", Reason::InvalidArgument, None),
            (ErrorKind::Generic, "something", Reason::Other, None),
            (ErrorKind::OutOfMemory, "allocating failed: cudaErrorMemoryAllocation: out of memory", Reason::OutOfMemory, Some(2)),
            (
                ErrorKind::Cuda,
                "counting the devices failed: cudaErrorInsufficientDriver: CUDA driver version is insufficient",
                Reason::NoDriver,
                Some(35),
            ),
            (ErrorKind::Cuda, "x failed: cudaErrorNoDevice: no CUDA-capable device is detected", Reason::Cuda, Some(100)),
            (ErrorKind::Cuda, "cudaErrorNotAName then cudaErrorInvalidValue: invalid argument", Reason::Cuda, Some(1)),
            (ErrorKind::Cuda, "CUDA said no", Reason::Cuda, None),
        ];
        for (kind, message, reason, code) in cases {
            let e = Error::new(kind, "t", message);
            assert_eq!((e.reason(), e.cuda_code(), e.nccl_code()), (reason, code, None), "{message}");
        }
    }

    #[test]
    fn nccl_texts_give_nccl_codes() {
        let e = Error::nccl(
            ErrorKind::Generic,
            "Communicator::allreduce",
            "ncclAllReduce failed: unhandled system error (run with NCCL_DEBUG=INFO for details): socket",
        );
        assert_eq!((e.reason(), e.nccl_code(), e.kind()), (Reason::Nccl, Some(2), ErrorKind::Generic));
        let e = Error::nccl(ErrorKind::Logic, "t", "ncclCommSplit failed: invalid usage (run with NCCL_DEBUG=WARN for details)");
        assert_eq!((e.reason(), e.nccl_code()), (Reason::Nccl, Some(5)));
        // A CUDA failure inside the comms shim is not an NCCL code.
        let e = Error::nccl(ErrorKind::Cuda, "t", "copying failed: cudaErrorInvalidValue: invalid argument");
        assert_eq!((e.reason(), e.nccl_code(), e.cuda_code()), (Reason::Cuda, None, Some(1)));
        let e = Error::nccl(ErrorKind::OutOfMemory, "t", "ncclCommInitRankConfig failed: unhandled cuda error: out of memory");
        assert_eq!((e.reason(), e.nccl_code()), (Reason::OutOfMemory, Some(1)));
    }

    #[test]
    fn constructors_set_their_reason_and_keep_the_display() {
        #[derive(Debug)]
        struct Missing;
        impl fmt::Display for Missing {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("could not load libnccl.so.2")
            }
        }
        impl std::error::Error for Missing {}
        let e = Error::library_missing("Communicator::init", Missing);
        assert_eq!((e.kind(), e.reason()), (ErrorKind::Cuda, Reason::LibraryMissing));
        assert_eq!(e.to_string(), "Communicator::init: could not load libnccl.so.2");
        let source = std::error::Error::source(&e).expect("the loader's error is the source");
        assert_eq!(source.to_string(), "could not load libnccl.so.2");
        let e = Error::no_driver("device_count", "no CUDA driver: libcuda.so could not be loaded");
        assert_eq!((e.kind(), e.reason(), e.cuda_code()), (ErrorKind::Cuda, Reason::NoDriver, Some(35)));
        let e = Error::timeout("UniqueId::fetch", "no id within 1.0 s");
        assert_eq!((e.kind(), e.reason()), (ErrorKind::Generic, Reason::Timeout));
        assert_eq!(Error::released("DeviceResources::sync", 0).reason(), Reason::Released);
        let e = Error::exiting("DeviceResources::new");
        assert_eq!((e.kind(), e.reason(), e.reason().to_string()), (ErrorKind::Logic, Reason::Exiting, "exiting".to_string()));
        assert!(e.to_string().starts_with("DeviceResources::new: the process is exiting: the library's exit teardown has run"), "{e}");
        // with_who and with_message keep what a program acts on.
        let e = Error::released("a", 1).with_who("b").with_message("m");
        assert_eq!((e.to_string().as_str(), e.reason(), e.kind()), ("b: m", Reason::Released, ErrorKind::Logic));
        // Equality ignores the source; a clone shares it.
        let a = Error::library_missing("w", Missing);
        assert_eq!(a, Error::new(ErrorKind::Cuda, "w", "could not load libnccl.so.2").with_reason(Reason::LibraryMissing));
        assert!(std::error::Error::source(&a.clone()).is_some());
    }

    #[test]
    #[cfg_attr(miri, ignore = "loads libcuda (dlopen) to name the driver's error")]
    fn driver_errors_carry_the_driver_code() {
        use cudarc::driver::sys::CUresult;
        let e = Error::driver("t", cudarc::driver::DriverError(CUresult::CUDA_ERROR_INVALID_VALUE));
        assert_eq!((e.cuda_code(), e.reason()), (Some(CUresult::CUDA_ERROR_INVALID_VALUE as i32), Reason::Cuda));
        let e = Error::driver("t", cudarc::driver::DriverError(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
        assert_eq!(e.reason(), Reason::OutOfMemory);
    }

    #[test]
    fn kinds_display_as_the_seed_symbols() {
        let names: Vec<String> =
            [ErrorKind::OutOfMemory, ErrorKind::Cuda, ErrorKind::Logic, ErrorKind::Generic].iter().map(|k| k.to_string()).collect();
        assert_eq!(names, ["out-of-memory", "cuda", "logic", "generic"]);
    }
}
