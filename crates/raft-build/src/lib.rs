//! Where the native stack of raft-rs (RAFT, RMM, rapids-logger, the CUDA 13.2 runtime and
//! libraries, NCCL, and cuVS beside them) is, and what it must hold: one copy of these rules for
//! the build scripts of `raft-sys`, `raft-comms`, `raft-cuvs` and the test crate, and for
//! `cargo xtask deps`, so the build and the cache it reads never disagree.
//!
//! A build-time crate: it has no dependency beyond std, and links nothing. Its functions print
//! `cargo:rerun-if-env-changed` for each knob they read when they run inside a build script.
//!
//! - [`pins`]: the pinned release and wheels, [`pip_line`], the libraries the shim links.
//! - [`cache`]: the knobs ([`env_var_rerun`]) and the `cargo xtask deps` cache.
//! - [`stack`]: [`Stack`] and [`find`], in `RAFT_SYS_PREFIX`, the cache, a Python environment,
//!   `CONDA_PREFIX`; [`Stack::from_dep_metadata`] for crates that build after `raft-sys`.
//! - [`cuvs`]: where cuVS may be, relative to the stack ([`cuvs_roots`]).
//! - [`elf`]: [`gnu_build_id`], one build of a library's identity.
//! - [`depfile`]: [`headers_digest`], every header a shim was compiled with, as one digest.
//! - [`header_hash`]: the hash a shim is built with and its Rust side checks at load, so a shim
//!   built from another version of its C header is refused, not called through the wrong
//!   signatures.

// It reads paths and environment variables: nothing here needs `unsafe`.
#![forbid(unsafe_code)]

pub mod cache;
pub mod cuvs;
pub mod depfile;
pub mod elf;
pub mod pins;
pub mod stack;

pub use cache::{cache_dir, cache_prefix, env_var_rerun};
pub use cuvs::{cuvs_beside, cuvs_roots, cuvs_roots_from_env};
pub use depfile::headers_digest;
pub use elf::gnu_build_id;
pub use pins::{check_pinned, pip_line, unpinned, LIBRARIES, NCCL_WHEEL, PINNED, WHEELS};
pub use stack::{find, Stack};

/// FNV-1a (64 bits) of a C header's bytes: what a shim is built with (a `*_HEADER_HASH` define it
/// returns at run time) and what its Rust side, built from the same header, compares at load.
pub fn header_hash(header: &[u8]) -> u64 {
    header.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}

/// The mutation tests' numbers (xorshift64*, seeded): the same cases on every run.
#[cfg(test)]
pub(crate) fn seeded(mut state: u64) -> impl FnMut() -> usize {
    move || {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d) as usize
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_header_hash_is_fnv1a_and_sees_every_byte() {
        assert_eq!(super::header_hash(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(super::header_hash(b"a"), 0xaf63_dc4c_8601_ec8c); // FNV-1a 64's published value
        assert_ne!(super::header_hash(b"int f(int);"), super::header_hash(b"int f(long);"));
    }
}
