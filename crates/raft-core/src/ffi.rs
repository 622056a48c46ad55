//! The one place where a shim status becomes a `raft::Error`: the thread-local message is read
//! and cleared right after the failing call.
use crate::error::{Error, ErrorKind, Result};
use raft_sys as sys;
use std::ffi::CStr;

/// Turns a shim status into a result, reporting `who` as the failing API.
pub(crate) fn check(who: &'static str, status: sys::raftrs_status) -> Result<()> {
    if status == sys::RAFTRS_STATUS_OK {
        return Ok(());
    }
    // SAFETY: raftrs_last_error returns a NUL-terminated thread-local string that stays valid
    // until the next raftrs_ call on this thread; it is copied before that call.
    let message = unsafe { CStr::from_ptr(sys::raftrs_last_error()) }.to_string_lossy().into_owned();
    // SAFETY: only clears this thread's message buffer.
    unsafe { sys::raftrs_clear_error() };
    let kind = match status {
        sys::RAFTRS_STATUS_OUT_OF_MEMORY => ErrorKind::OutOfMemory,
        sys::RAFTRS_STATUS_CUDA => ErrorKind::Cuda,
        sys::RAFTRS_STATUS_LOGIC => ErrorKind::Logic,
        _ => ErrorKind::Generic,
    };
    Err(Error::new(kind, who, message))
}
