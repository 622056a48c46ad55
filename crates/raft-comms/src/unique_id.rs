//! `UniqueId`: NCCL's `ncclUniqueId`, the 128 bytes every rank of a new communicator must share,
//! and its public rendezvous calls (rank 0 serves it over TCP, the others fetch it; the wire is
//! in `rendezvous.rs`). A rank started with another world size, a duplicate rank, a stray
//! connection or a peer without the job's secret get a clear error, not a communicator that
//! hangs or an id handed to a stranger.
use crate::rendezvous::{self, deadline_after};
use crate::result;
use crate::secret::Secret;
use raft_error::Result;
use std::fmt;
use std::time::Duration;

/// NCCL's unique id (`ncclUniqueId`, 128 bytes): made by one rank ([`UniqueId::new`]), given to
/// every rank of the communicator to be made, by [`serve`](Self::serve) / [`fetch`](Self::fetch)
/// or any channel of the program's own (MPI, a file, a key-value store).
///
/// The bytes name rank 0's bootstrap address; a wrong id makes initialisation fail or time out,
/// never undefined behaviour.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct UniqueId([u8; 128]);

static_assertions::const_assert_eq!(std::mem::size_of::<UniqueId>(), crate::sys::RAFTCOMMS_UNIQUE_ID_BYTES);

impl UniqueId {
    /// A new id (`ncclGetUniqueId`): starts NCCL's bootstrap root in this process. Needs NCCL,
    /// not a GPU.
    ///
    /// # Errors
    /// `Cuda` when NCCL or the shim cannot be loaded (the message says what to install or set);
    /// `Generic` when NCCL finds no network interface.
    pub fn new() -> Result<Self> {
        result::unique_id("UniqueId::new").map(UniqueId)
    }

    /// An id received from elsewhere.
    pub fn from_bytes(bytes: [u8; 128]) -> Self {
        UniqueId(bytes)
    }

    /// The 128 bytes, to send to the other ranks.
    pub fn as_bytes(&self) -> &[u8; 128] {
        &self.0
    }

    /// Rank 0's side of the rendezvous: listens on `addr` (`host:port`, e.g. `MASTER_ADDR:MASTER_PORT`;
    /// only there: an address of another host is an error) and gives this id to each of the
    /// `world − 1` other ranks, checking that each holds the job's secret (`RAFT_COMMS_SECRET`,
    /// see [`Secret`]; without one, `addr` must be a loopback address), says the same world size
    /// and a distinct rank. Returns once every rank has it. Peers are served concurrently, each
    /// handshake bounded: a slow or hostile peer does not hold up the others.
    ///
    /// # Errors
    /// `Logic` for a world size of 0 or above `i32::MAX` (NCCL's limit), an address that is not
    /// `host:port` or names port 0, a malformed `RAFT_COMMS_SECRET`, or no secret on an address
    /// that is not loopback; `Generic` when the address cannot be bound, does not resolve
    /// within `timeout` (a name is retried until then), or when a rank has not arrived within
    /// `timeout` (the message names the missing ranks).
    pub fn serve(&self, addr: &str, world: usize, timeout: Duration) -> Result<()> {
        const WHO: &str = "UniqueId::serve";
        let secret = Secret::from_env().map_err(|e| e.with_who(WHO))?;
        self.serve_as(WHO, addr, world, timeout, secret.as_ref())
    }

    /// [`serve`](Self::serve) with the secret given (`None`: loopback only, unauthenticated)
    /// instead of read from `RAFT_COMMS_SECRET`.
    ///
    /// # Errors
    /// As [`serve`](Self::serve).
    pub fn serve_with_secret(&self, addr: &str, world: usize, timeout: Duration, secret: Option<&Secret>) -> Result<()> {
        self.serve_as("UniqueId::serve_with_secret", addr, world, timeout, secret)
    }

    fn serve_as(&self, who: &'static str, addr: &str, world: usize, timeout: Duration, secret: Option<&Secret>) -> Result<()> {
        rendezvous::check_world(who, world)?;
        let deadline = deadline_after(timeout);
        let listener = rendezvous::bind(who, addr, secret, deadline, timeout)?;
        rendezvous::serve_on(who, &listener, self.as_bytes(), world, secret, deadline, timeout)
    }

    /// The other ranks' side: connects to rank 0 at `addr` (retrying while it is not listening
    /// yet), checks that it holds the job's secret (`RAFT_COMMS_SECRET`; without one, `addr`
    /// must be a loopback address), proves this rank holds it too, and receives the id.
    ///
    /// # Errors
    /// `Logic` when `rank` is 0 or not below `world`, `world` is above `i32::MAX`, `addr` is
    /// not `host:port` or names port 0, rank 0 refused this rank (another world size, a
    /// duplicate rank), the process at `addr` does not hold the secret, or no secret was given
    /// for an address that is not loopback; `Generic` when rank 0 could not be reached within
    /// `timeout`, its name not resolved by then included (a name that does not resolve yet is
    /// retried, as a rank 0 that does not listen yet; every read is bounded by it: a peer that
    /// answers slowly does not stretch it).
    pub fn fetch(addr: &str, rank: usize, world: usize, timeout: Duration) -> Result<UniqueId> {
        const WHO: &str = "UniqueId::fetch";
        let secret = Secret::from_env().map_err(|e| e.with_who(WHO))?;
        rendezvous::fetch_until(WHO, addr, rank, world, secret.as_ref(), deadline_after(timeout), timeout).map(UniqueId::from_bytes)
    }

    /// [`fetch`](Self::fetch) with the secret given (`None`: loopback only, unauthenticated).
    ///
    /// # Errors
    /// As [`fetch`](Self::fetch).
    pub fn fetch_with_secret(addr: &str, rank: usize, world: usize, timeout: Duration, secret: Option<&Secret>) -> Result<UniqueId> {
        rendezvous::fetch_until("UniqueId::fetch_with_secret", addr, rank, world, secret, deadline_after(timeout), timeout)
            .map(UniqueId::from_bytes)
    }
}

/// The bytes of an id the `Debug` fingerprint leaves out: NCCL 2.x's id begins with a 64-bit
/// random magic, which its bootstrap root checks on every connection (the rest is the root's
/// socket address). An unkeyed 64-bit hash over it can be inverted from a log line (the
/// eighteenth audit): the id is what the rendezvous encrypts to keep it from strangers.
const SECRET_PREFIX: usize = 8;

impl fmt::Debug for UniqueId {
    /// Only a short fingerprint of the root's address (equal on every rank given the same id),
    /// never of NCCL's magic: see `SECRET_PREFIX`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let h = self.0[SECRET_PREFIX..].iter().fold(0xcbf29ce484222325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x100000001b3));
        write!(f, "UniqueId({h:016x})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_shows_a_fingerprint_not_the_bytes() {
        let id = UniqueId::from_bytes([7; 128]);
        let text = format!("{id:?}");
        assert!(text.starts_with("UniqueId(") && text.len() == "UniqueId()".len() + 16, "{text}");
        assert_ne!(format!("{:?}", UniqueId::from_bytes([8; 128])), text);
    }

    #[test]
    fn debug_says_nothing_of_nccls_magic() {
        // Ids that differ only in the magic print alike; the address part still tells ids apart.
        let mut other = [7; 128];
        other[..SECRET_PREFIX].copy_from_slice(&0x0123_4567_89ab_cdefu64.to_le_bytes());
        assert_eq!(format!("{:?}", UniqueId::from_bytes(other)), format!("{:?}", UniqueId::from_bytes([7; 128])));
        other[SECRET_PREFIX] = 9;
        assert_ne!(format!("{:?}", UniqueId::from_bytes(other)), format!("{:?}", UniqueId::from_bytes([7; 128])));
    }
}
