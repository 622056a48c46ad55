//! Lending RAFT's own `raft::resources` object to C and C++ code that takes it (cuVS's
//! `cuvsResources_t`, RAFT's comms, a user's RAFT algorithm) without giving the resources up.
use crate::error::Result;
use crate::resources::DeviceResources;
use std::ffi::c_void;
use std::marker::PhantomData;
use std::ptr::NonNull;

/// A `raft::resources*` lent for the duration of [`DeviceResources::with_raft_resources`]: the
/// resources cannot be released meanwhile (a release from another thread waits for the lend to
/// end), and the value cannot leave the closure (it is neither `Send` nor `'static`).
///
/// Using the pointer is the caller's `unsafe`: hand it only to code that treats it as a borrowed
/// `raft::resources` (never deletes it, never keeps it past the closure), on any thread while the
/// closure runs.
#[derive(Debug, Clone, Copy)]
pub struct RaftResourcesPtr<'a> {
    ptr: NonNull<c_void>,
    _borrow: PhantomData<&'a DeviceResources>,
    _not_send: PhantomData<*mut c_void>,
}

impl RaftResourcesPtr<'_> {
    /// The `raft::resources*` (a `cuvsResources_t` is this pointer as an integer).
    pub fn as_ptr(&self) -> *mut c_void {
        self.ptr.as_ptr()
    }
}

impl DeviceResources {
    /// Runs `f` with the `raft::resources*` behind these resources: their stream, their lazily
    /// made cuBLAS / cuSOLVER / cuSPARSE handles (made through this library's checked factories,
    /// which report a failed create as an error), their device. Nothing is copied: RAFT code
    /// given the pointer works on these very resources, on their stream.
    ///
    /// A release of these resources from inside `f`, on this thread, is refused with a `Logic`
    /// error (it would wait for the lend, which waits for it); on another thread it waits until
    /// the lend ends. At exit, the teardown waits up to a second for a lend on another thread,
    /// then leaves the native object to the OS.
    ///
    /// # Errors
    /// `Logic` on released resources.
    pub fn with_raft_resources<R>(&self, f: impl FnOnce(RaftResourcesPtr<'_>) -> R) -> Result<R> {
        const WHO: &str = "DeviceResources::with_raft_resources";
        self.with_native(WHO, |native| {
            let ptr = native.raft_resources(WHO)?;
            Ok(f(RaftResourcesPtr { ptr, _borrow: PhantomData, _not_send: PhantomData }))
        })
    }
}
