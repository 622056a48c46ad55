//! Rank 0's address to socket addresses: a name that does not resolve *yet* is retried until the
//! rendezvous's deadline, each lookup runs on a thread of its own so that the deadline holds
//! whatever the resolver does, and at most [`MAX_LOOKUPS`] such threads wait on the resolver at
//! once in the process.
use super::deadline::remaining;
use raft_error::{Error, Result};
use std::io::{self, ErrorKind as IoKind};
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::{mpsc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The most lookups waiting on the resolver at once in the process. A lookup the deadline gave
/// up on goes on until the resolver answers, and one that never answers (a stuck NSS module)
/// left a thread behind for every rendezvous a caller retried, without limit (the review of the
/// thirty-third session, helper 120); past this many, a lookup waits for one of them to end,
/// until its own deadline.
pub(super) const MAX_LOOKUPS: usize = 16;

/// The lookups under way, and room for more.
pub(super) struct Lookups {
    running: Mutex<usize>,
    ended: Condvar,
    most: usize,
}

/// The process's lookups.
static LOOKUPS: Lookups = Lookups::new(MAX_LOOKUPS);

impl Lookups {
    pub(super) const fn new(most: usize) -> Self {
        Lookups { running: Mutex::new(0), ended: Condvar::new(), most }
    }

    fn running(&self) -> MutexGuard<'_, usize> {
        // A count only: a panic while it was held left it whole.
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Room for one more lookup, waited for until `deadline`; `None`: the deadline came first.
    fn enter(&'static self, deadline: Instant) -> Option<Entered> {
        let mut running = self.running();
        while *running >= self.most {
            let left = remaining(deadline)?;
            running = self.ended.wait_timeout(running, left).unwrap_or_else(|e| e.into_inner()).0;
        }
        *running += 1;
        Some(Entered(self))
    }
}

/// One lookup under way: counted until dropped, however the lookup ends (a resolver that panics
/// included).
struct Entered(&'static Lookups);

impl Drop for Entered {
    fn drop(&mut self) {
        *self.0.running() -= 1;
        self.0.ended.notify_one();
    }
}

/// What one lookup came to.
enum Lookup {
    Answered(io::Result<Vec<SocketAddr>>),
    /// The deadline came first.
    Late,
    /// Every slot stayed taken by earlier lookups until the deadline.
    Busy,
}

/// The socket addresses of `addr` (`host:port`), retrying a host name that does not resolve
/// until `deadline`: a name that does not resolve *yet* is rank 0 not reachable yet (a pod's DNS
/// record appears once it runs; a resolver may answer late), as torch's store takes it. An
/// address that is not `host:port`, or names port 0 (rank 0 would listen on a port the OS
/// picks, which no rank can know; a rank would knock at a port that refuses every
/// connection), is refused at once (`Logic`); a name still unresolved at `deadline` is the
/// `Generic` timeout.
pub(super) fn resolve(who: &'static str, addr: &str, deadline: Instant, timeout: Duration) -> Result<Vec<SocketAddr>> {
    resolve_by(who, addr, deadline, timeout, |a| a.to_socket_addrs().map(Iterator::collect), &LOOKUPS)
}

/// One lookup of `addr`, on a thread of its own so that a resolver that answers late cannot hold
/// the caller past `deadline` (`getaddrinfo` blocks, and a retry waited out one whole lookup
/// past the bound: the twenty-third audit's open item, helper 113); the late answer is dropped.
/// Inline where no thread can be started.
fn lookup_by(addr: &str, deadline: Instant, lookup: fn(&str) -> io::Result<Vec<SocketAddr>>, lookups: &'static Lookups) -> Lookup {
    let Some(entered) = lookups.enter(deadline) else { return Lookup::Busy };
    let (tx, rx) = mpsc::channel();
    let text = addr.to_string();
    let spawned = std::thread::Builder::new().name("raft-comms-resolve".into()).spawn(move || {
        let _entered = entered;
        let _ = tx.send(lookup(&text));
    });
    if spawned.is_err() {
        // The closure, and the slot with it, went with the refusal.
        return Lookup::Answered(lookup(addr));
    }
    match rx.recv_timeout(remaining(deadline).unwrap_or_default()) {
        Ok(found) => Lookup::Answered(found),
        Err(mpsc::RecvTimeoutError::Timeout) => Lookup::Late,
        // The resolver panicked on its thread: a failed lookup, retried as one.
        Err(mpsc::RecvTimeoutError::Disconnected) => Lookup::Answered(Err(io::Error::other("the lookup ended without an answer"))),
    }
}

/// [`resolve`], through `lookup` (the resolver; a test's slow one) and `lookups` (the slots).
pub(super) fn resolve_by(
    who: &'static str,
    addr: &str,
    deadline: Instant,
    timeout: Duration,
    lookup: fn(&str) -> io::Result<Vec<SocketAddr>>,
    lookups: &'static Lookups,
) -> Result<Vec<SocketAddr>> {
    let port = addr.rsplit_once(':').map(|(_, p)| p.parse::<u16>());
    if let Some(Ok(0)) = port {
        return Err(Error::logic(who, format!("the rendezvous address {addr} names port 0: give rank 0's port (MASTER_PORT)")));
    }
    // An IP literal (IPv6 in brackets included) is its own address: no resolver, no thread.
    if let Ok(literal) = addr.parse::<SocketAddr>() {
        return Ok(vec![literal]);
    }
    // A host that no resolver could ever answer for (empty, or with characters no host name
    // has) is a typo, not a name that resolves later: refused at once too. An IPv6 address with
    // a named zone (`fe80::1%eth0`, unbracketed) is the resolver's to read.
    if let Some((host, _)) = addr.rsplit_once(':') {
        let name_of = |s: &str| s.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b));
        let zoned =
            host.split_once('%').is_some_and(|(ip, zone)| ip.parse::<std::net::Ipv6Addr>().is_ok() && !zone.is_empty() && name_of(zone));
        if host.is_empty() || !(name_of(host) || zoned || host.parse::<std::net::IpAddr>().is_ok()) {
            return Err(Error::logic(who, format!("the rendezvous address {addr} does not name a host (host:port)")));
        }
    }
    loop {
        let why = match lookup_by(addr, deadline, lookup, lookups) {
            Lookup::Late => "the resolver did not answer in time".to_string(),
            Lookup::Busy => format!(
                "{} earlier lookups of this process are still waiting on the resolver (at most that many wait at once)",
                lookups.most
            ),
            Lookup::Answered(Ok(found)) => {
                if found.iter().any(|a| a.port() == 0) {
                    return Err(Error::logic(who, format!("the rendezvous address {addr} names port 0: give rank 0's port (MASTER_PORT)")));
                }
                if !found.is_empty() {
                    return Ok(found);
                }
                "it resolves to no address".to_string()
            }
            // Not `host:port` (no port, or one that is not a number up to 65535): no retry
            // makes it one.
            Lookup::Answered(Err(e)) if e.kind() == IoKind::InvalidInput => {
                return Err(Error::logic(who, format!("the rendezvous address {addr} is not host:port: {e}")));
            }
            Lookup::Answered(Err(e)) => e.to_string(),
        };
        let unresolved =
            || Error::timeout(who, format!("the rendezvous address {addr} did not resolve within {:.1} s: {why}", timeout.as_secs_f64()));
        let Some(left) = remaining(deadline) else { return Err(unresolved()) };
        std::thread::sleep(Duration::from_millis(100).min(left));
        // A pause that ended at the bound leaves no time for another lookup: the last answer is
        // the reason (one more, given no time, read "did not answer in time" whatever the
        // resolver said, and left a thread behind: the review of the thirty-fourth session,
        // helper 121).
        if remaining(deadline).is_none() {
            return Err(unresolved());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::deadline::deadline_after;
    use super::*;
    use raft_error::ErrorKind;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    /// A resolver that never answers left one `raft-comms-resolve` thread behind for every
    /// rendezvous a caller retried, without limit (the review of the thirty-third session,
    /// helper 120: 20 threads after 20 calls, each blocked for good). Now at most `most` wait at
    /// once; the calls past them wait for a slot until their own bound, then say why; a slot
    /// comes back when its lookup ends, and the next lookup is answered.
    #[test]
    fn a_resolver_that_never_answers_holds_at_most_the_slots_threads() {
        static SLOTS: Lookups = Lookups::new(2);
        static RUNNING: AtomicUsize = AtomicUsize::new(0);
        static MOST: AtomicUsize = AtomicUsize::new(0);
        static ANSWER: AtomicBool = AtomicBool::new(false);
        fn hung(_: &str) -> io::Result<Vec<SocketAddr>> {
            let now = RUNNING.fetch_add(1, Ordering::SeqCst) + 1;
            MOST.fetch_max(now, Ordering::SeqCst);
            while !ANSWER.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(5));
            }
            RUNNING.fetch_sub(1, Ordering::SeqCst);
            Ok(vec!["127.0.0.1:29500".parse().unwrap()])
        }
        let bound = Duration::from_millis(100);
        let mut busy = 0;
        for _ in 0..10 {
            let e = resolve_by("t", "rank0.example:29500", deadline_after(bound), bound, hung, &SLOTS).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Generic, "{e}");
            busy += usize::from(e.message().contains("2 earlier lookups of this process are still waiting"));
        }
        assert_eq!(MOST.load(Ordering::SeqCst), 2, "threads blocked in the resolver at once");
        assert_eq!(busy, 8, "the calls past the two slots say why");
        // The resolver answers: the two lookups end, their slots come back.
        ANSWER.store(true, Ordering::SeqCst);
        let timeout = Duration::from_secs(5);
        let found = resolve_by("t", "rank0.example:29500", deadline_after(timeout), timeout, hung, &SLOTS).unwrap();
        assert_eq!(found.len(), 1);
        let started = Instant::now();
        while *SLOTS.running() != 0 {
            assert!(started.elapsed() < timeout, "the slots were never given back");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// A name the resolver refuses (a typo) is retried until the bound, then reported with the
    /// resolver's own answer: the last retry, started with no time left, read "did not answer
    /// in time" at every bound (the review of the thirty-fourth session, helper 121).
    #[test]
    fn a_name_that_never_resolves_is_reported_with_the_resolver_s_answer() {
        static SLOTS: Lookups = Lookups::new(4);
        fn unknown(_: &str) -> io::Result<Vec<SocketAddr>> {
            std::thread::sleep(Duration::from_millis(2));
            Err(io::Error::other("Name or service not known"))
        }
        for ms in [300, 1000] {
            let bound = Duration::from_millis(ms);
            let e = resolve_by("t", "rank0.exmaple:29500", deadline_after(bound), bound, unknown, &SLOTS).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Generic, "{e}");
            assert!(e.message().ends_with("Name or service not known"), "{ms} ms: {e}");
        }
    }

    /// An IP literal needs no resolver: answered without a lookup (and without a thread).
    #[test]
    fn an_ip_literal_is_its_own_address_without_a_lookup() {
        static SLOTS: Lookups = Lookups::new(1);
        fn never(_: &str) -> io::Result<Vec<SocketAddr>> {
            panic!("an IP literal was handed to the resolver")
        }
        let bound = Duration::from_secs(1);
        for (addr, want) in [("127.0.0.2:29500", "127.0.0.2:29500"), ("[::1]:7", "[::1]:7")] {
            let found = resolve_by("t", addr, deadline_after(bound), bound, never, &SLOTS).unwrap();
            assert_eq!(found, vec![want.parse::<SocketAddr>().unwrap()]);
        }
        // Port 0 is still refused first.
        let e = resolve_by("t", "127.0.0.1:0", deadline_after(bound), bound, never, &SLOTS).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Logic, "{e}");
    }

    /// A resolver that panics on its thread is a failed lookup, said as such (it read as "did
    /// not answer in time" before), and its slot is given back.
    #[test]
    fn a_lookup_that_panics_is_a_failed_lookup_not_a_late_one() {
        static SLOTS: Lookups = Lookups::new(4);
        fn boom(_: &str) -> io::Result<Vec<SocketAddr>> {
            panic!("a resolver's bug")
        }
        let started = Instant::now();
        let got = lookup_by("rank0.example:29500", deadline_after(Duration::from_secs(30)), boom, &SLOTS);
        assert!(matches!(&got, Lookup::Answered(Err(e)) if e.to_string().contains("ended without an answer")), "not a failed lookup");
        assert!(started.elapsed() < Duration::from_secs(20), "waited for the bound: {:?}", started.elapsed());
        assert_eq!(*SLOTS.running(), 0, "a panicking lookup gave its slot back");
    }
}
