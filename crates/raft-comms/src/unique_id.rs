//! `UniqueId`: NCCL's `ncclUniqueId`, the 128 bytes every rank of a new communicator must share,
//! and its rendezvous: rank 0 makes one and serves it over TCP (std::net) to the other ranks,
//! which fetch it, both within a bound. The wire format is small and checked: a rank started
//! with another world size, a duplicate rank or a stray connection get a clear error, not a
//! communicator that hangs.
use crate::result;
use raft_error::{Error, ErrorKind, Result};
use std::collections::BTreeSet;
use std::fmt;
use std::io::{ErrorKind as IoKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

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
    /// `Generic` when NCCL or the shim cannot be loaded (the message says what to install or
    /// set) or NCCL finds no network interface.
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

    /// Rank 0's side of the rendezvous: listens on `addr` (`host:port`, e.g. `MASTER_ADDR:MASTER_PORT`)
    /// and gives this id to each of the `world − 1` other ranks, checking that each says the same
    /// world size and a distinct rank. Returns once every rank has it.
    ///
    /// # Errors
    /// `Logic` for a world size of 0; `Generic` when the address cannot be bound, or when a rank
    /// has not arrived within `timeout` (the message names the missing ranks).
    pub fn serve(&self, addr: &str, world: usize, timeout: Duration) -> Result<()> {
        const WHO: &str = "UniqueId::serve";
        if world == 0 {
            return Err(Error::logic(WHO, "a world size of 0"));
        }
        let listener = bind(WHO, addr)?;
        serve_on(WHO, &listener, self, world, Instant::now() + timeout, timeout)
    }

    /// The other ranks' side: connects to rank 0 at `addr` (retrying while it is not listening
    /// yet) and receives the id.
    ///
    /// # Errors
    /// `Logic` when `rank` is 0 or not below `world`, or rank 0 refused this rank (another world
    /// size, a duplicate rank); `Generic` when rank 0 could not be reached within `timeout`.
    pub fn fetch(addr: &str, rank: usize, world: usize, timeout: Duration) -> Result<UniqueId> {
        fetch_until("UniqueId::fetch", addr, rank, world, Instant::now() + timeout, timeout)
    }
}

impl fmt::Debug for UniqueId {
    /// Only a short fingerprint: the bytes are an address, not worth a screenful.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let h = self.0.iter().fold(0xcbf29ce484222325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x100000001b3));
        write!(f, "UniqueId({h:016x})")
    }
}

/// "RFTC": the first bytes of every hello, so a stray connection is told apart.
const MAGIC: [u8; 4] = *b"RFTC";
/// The protocol's version.
const VERSION: u32 = 1;
const HELLO: usize = 16;
const REPLY_OK: u8 = 0;
const REPLY_REFUSED: u8 = 1;

fn generic(who: &'static str, message: String) -> Error {
    Error::new(ErrorKind::Generic, who, message)
}

fn resolve(who: &'static str, addr: &str) -> Result<Vec<SocketAddr>> {
    let found: Vec<SocketAddr> =
        addr.to_socket_addrs().map_err(|e| Error::logic(who, format!("the rendezvous address {addr} does not resolve: {e}")))?.collect();
    if found.is_empty() {
        return Err(Error::logic(who, format!("the rendezvous address {addr} resolves to nothing")));
    }
    Ok(found)
}

/// Binds `addr`; when it names no local interface (a name that resolves elsewhere first, say),
/// binds every interface on its port.
pub(crate) fn bind(who: &'static str, addr: &str) -> Result<TcpListener> {
    let candidates = resolve(who, addr)?;
    let mut last = None;
    for a in &candidates {
        match TcpListener::bind(a) {
            Ok(l) => return Ok(l),
            Err(e) => last = Some(e),
        }
    }
    let port = candidates[0].port();
    match TcpListener::bind(("0.0.0.0", port)) {
        Ok(l) if last.as_ref().is_some_and(|e| e.kind() == IoKind::AddrNotAvailable) => Ok(l),
        _ => Err(generic(
            who,
            format!(
                "rank 0 could not listen on {addr}: {} (is the port in use? pick another MASTER_PORT)",
                last.map_or_else(String::new, |e| e.to_string())
            ),
        )),
    }
}

fn remaining(deadline: Instant) -> Option<Duration> {
    deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero())
}

fn refuse(stream: &mut TcpStream, message: &str) {
    let bytes = message.as_bytes();
    let mut reply = vec![REPLY_REFUSED];
    reply.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    reply.extend_from_slice(bytes);
    let _ = stream.write_all(&reply);
}

/// Serves `id` on a bound listener until `world − 1` distinct ranks have it, or `deadline`.
pub(crate) fn serve_on(
    who: &'static str,
    listener: &TcpListener,
    id: &UniqueId,
    world: usize,
    deadline: Instant,
    timeout: Duration,
) -> Result<()> {
    listener.set_nonblocking(true).map_err(|e| generic(who, format!("the rendezvous listener: {e}")))?;
    let mut served = BTreeSet::new();
    while served.len() + 1 < world {
        let Some(left) = remaining(deadline) else {
            let missing: Vec<String> = (1..world).filter(|r| !served.contains(r)).map(|r| r.to_string()).collect();
            return Err(generic(
                who,
                format!(
                    "rank 0 waited {:.1} s at {} for {} rank(s); missing: {} (not started, or started with another \
                     MASTER_ADDR / MASTER_PORT?)",
                    timeout.as_secs_f64(),
                    listener.local_addr().map_or_else(|_| "?".into(), |a| a.to_string()),
                    world - 1,
                    missing.join(", ")
                ),
            ));
        };
        let mut stream = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == IoKind::WouldBlock || e.kind() == IoKind::Interrupted => {
                std::thread::sleep(Duration::from_millis(5).min(left));
                continue;
            }
            Err(e) => return Err(generic(who, format!("accepting a rank's connection: {e}"))),
        };
        // One connection at a time, each bounded: a stray client costs at most a second.
        let _ = stream.set_nonblocking(false);
        let _ = stream.set_read_timeout(Some(left.min(Duration::from_secs(1))));
        let _ = stream.set_write_timeout(Some(left.min(Duration::from_secs(1))));
        let mut hello = [0u8; HELLO];
        if stream.read_exact(&mut hello).is_err() || hello[..4] != MAGIC {
            continue; // not one of ours
        }
        let field = |i: usize| u32::from_le_bytes([hello[i], hello[i + 1], hello[i + 2], hello[i + 3]]) as usize;
        let (version, their_world, rank) = (field(4), field(8), field(12));
        if version != VERSION as usize {
            refuse(&mut stream, &format!("rank 0 speaks rendezvous version {VERSION}, this rank {version}: use one raft-comms version"));
            continue;
        }
        if their_world != world {
            refuse(&mut stream, &format!("rank 0 was started with a world size of {world}, rank {rank} with {their_world}"));
            continue;
        }
        if rank == 0 || rank >= world {
            refuse(&mut stream, &format!("rank {rank} is not a rank of a world of {world} other than rank 0"));
            continue;
        }
        if served.contains(&rank) {
            refuse(&mut stream, &format!("rank {rank} already joined: two processes were started with RANK={rank}"));
            continue;
        }
        let mut reply = vec![REPLY_OK];
        reply.extend_from_slice(id.as_bytes());
        if stream.write_all(&reply).is_ok() {
            served.insert(rank);
        }
    }
    Ok(())
}

/// Fetches the id from rank 0 at `addr`, retrying the connection until `deadline`.
pub(crate) fn fetch_until(
    who: &'static str,
    addr: &str,
    rank: usize,
    world: usize,
    deadline: Instant,
    timeout: Duration,
) -> Result<UniqueId> {
    if rank == 0 || rank >= world {
        return Err(Error::logic(who, format!("rank {rank} of {world} fetches no id (rank 0 makes it; ranks run from 0 to world − 1)")));
    }
    let (rank32, world32) = (
        u32::try_from(rank).map_err(|_| Error::logic(who, "rank too large"))?,
        u32::try_from(world).map_err(|_| Error::logic(who, "world size too large"))?,
    );
    let targets = resolve(who, addr)?;
    let mut last_error = String::from("no attempt");
    loop {
        let Some(left) = remaining(deadline) else {
            return Err(generic(
                who,
                format!(
                    "rank {rank} of {world} could not get the id from rank 0 at {addr} within {:.1} s: {last_error}",
                    timeout.as_secs_f64()
                ),
            ));
        };
        for target in &targets {
            let mut stream = match TcpStream::connect_timeout(target, left.min(Duration::from_secs(1))) {
                Ok(s) => s,
                Err(e) => {
                    last_error = e.to_string();
                    continue;
                }
            };
            let _ = stream.set_read_timeout(Some(left));
            let _ = stream.set_write_timeout(Some(left));
            let mut hello = Vec::with_capacity(HELLO);
            hello.extend_from_slice(&MAGIC);
            hello.extend_from_slice(&VERSION.to_le_bytes());
            hello.extend_from_slice(&world32.to_le_bytes());
            hello.extend_from_slice(&rank32.to_le_bytes());
            if let Err(e) = stream.write_all(&hello) {
                last_error = e.to_string();
                continue;
            }
            let mut status = [0u8; 1];
            if let Err(e) = stream.read_exact(&mut status) {
                last_error = format!("no reply ({e})");
                continue;
            }
            if status[0] == REPLY_OK {
                let mut id = [0u8; 128];
                stream.read_exact(&mut id).map_err(|e| generic(who, format!("reading the id from rank 0: {e}")))?;
                return Ok(UniqueId(id));
            }
            let mut len = [0u8; 4];
            let mut text = String::from("(no reason given)");
            if stream.read_exact(&mut len).is_ok() {
                let mut buf = vec![0u8; (u32::from_le_bytes(len) as usize).min(4096)];
                if stream.read_exact(&mut buf).is_ok() {
                    text = String::from_utf8_lossy(&buf).into_owned();
                }
            }
            return Err(Error::logic(who, format!("rank 0 at {addr} refused rank {rank}: {text}")));
        }
        std::thread::sleep(Duration::from_millis(50).min(left));
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
}
