//! The rendezvous's wire, mutated: bounded, seeded tests of both sides' parsers (CPU, every CI run).
use super::*;

/// xorshift64*: the same cases on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn byte(&mut self) -> u8 {
        self.next() as u8
    }

    fn bytes<const N: usize>(&mut self) -> [u8; N] {
        std::array::from_fn(|_| self.byte())
    }
}

/// One change to what a peer sends, at a position of its whole stream (the messages of its
/// side of the handshake, one after another).
#[derive(Debug, Clone, Copy)]
enum Op {
    /// XOR with a non-zero byte.
    Flip(u8),
    /// The byte replaced (maybe by itself).
    Set(u8),
    /// The stream ends here: the peer closes its side.
    Cut,
    Insert(u8),
    Delete,
    /// The next `n` bytes sent twice.
    Repeat(usize),
    /// A little-endian 32-bit word written over (lengths and counts: 0, 1, huge).
    Word(u32),
}

#[derive(Debug, Clone, Copy)]
struct Mutation {
    at: usize,
    op: Op,
}

/// One to three mutations of a stream of `len` bytes.
fn mutations(rng: &mut Rng, len: usize) -> Vec<Mutation> {
    const WORDS: [u32; 7] = [0, 1, 4096, 4097, 0x7fff_ffff, 0x8000_0000, u32::MAX];
    (0..1 + rng.below(3))
        .map(|_| {
            let at = rng.below(len);
            let op = match rng.below(7) {
                0 => Op::Flip(rng.byte().max(1)),
                1 => Op::Set(rng.byte()),
                2 => Op::Cut,
                3 => Op::Insert(rng.byte()),
                4 => Op::Delete,
                5 => Op::Repeat(1 + rng.below(40)),
                _ => Op::Word(WORDS[rng.below(WORDS.len())]),
            };
            Mutation { at, op }
        })
        .collect()
}

/// `message` as sent, the mutations whose position falls inside it applied (it starts at
/// `offset` of the stream), and whether the stream was cut inside it.
fn mutate(message: &[u8], offset: usize, ms: &[Mutation]) -> (Vec<u8>, bool) {
    let mut out = message.to_vec();
    let mut cut = false;
    for m in ms {
        let Some(i) = m.at.checked_sub(offset).filter(|&i| i < out.len()) else { continue };
        match m.op {
            Op::Flip(x) => out[i] ^= x,
            Op::Set(x) => out[i] = x,
            Op::Cut => {
                out.truncate(i);
                cut = true;
            }
            Op::Insert(x) => out.insert(i, x),
            Op::Delete => {
                out.remove(i);
            }
            Op::Repeat(n) => {
                let copy = out[i..(i + n).min(out.len())].to_vec();
                out.splice(i..i, copy);
            }
            Op::Word(w) => {
                for (k, b) in w.to_le_bytes().into_iter().enumerate() {
                    if let Some(x) = out.get_mut(i + k) {
                        *x = b;
                    }
                }
            }
        }
    }
    (out, cut)
}

/// Panics on rank 0's handshake threads (a panic there ends only that thread, unseen by
/// `serve_on`'s caller): counted by a hook that passes every panic on.
fn rendezvous_thread_panics() -> &'static std::sync::atomic::AtomicUsize {
    static PANICS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if std::thread::current().name() == Some("raft-comms-rendezvous") {
                PANICS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            previous(info)
        }));
    });
    &PANICS
}

/// Reads what is left until the other side closes: rank 0 must close every connection it
/// is done with (never leave a peer waiting), well within a handshake's bound.
fn drain_until_closed(s: &mut TcpStream) {
    s.set_read_timeout(Some(HANDSHAKE + Duration::from_secs(5))).unwrap();
    let mut sink = [0u8; 256];
    loop {
        match s.read(&mut sink) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if e.kind() == IoKind::Interrupted => {}
            Err(e) if matches!(e.kind(), IoKind::WouldBlock | IoKind::TimedOut) => panic!("rank 0 left a connection open: {e}"),
            Err(_) => return, // reset: closed as well
        }
    }
}

/// A peer's side of one handshake with rank 0 at `addr`, holding the key, claiming
/// `(world, rank)`, its stream changed by `ms`. Returns the id it was given (checked
/// against rank 0's tag), what it sent, and what an honest peer would have sent given the
/// same challenge.
fn peer(addr: SocketAddr, key: &[u8], (world, rank): (u32, u32), ms: &[Mutation], rng: &mut Rng) -> (Option<[u8; ID]>, Vec<u8>, Vec<u8>) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(HANDSHAKE + Duration::from_secs(5))).unwrap();
    let nc: [u8; NONCE] = rng.bytes();
    let mut hello = MAGIC.to_vec();
    hello.extend_from_slice(&VERSION.to_le_bytes());
    hello.extend_from_slice(&nc);
    let mut honest = hello.clone();
    let (sent_hello, cut) = mutate(&hello, 0, ms);
    let mut sent = sent_hello.clone();
    let _ = s.write_all(&sent_hello);
    // A peer that sent less than a message closes its side (rather than stall: the stalls
    // have tests of their own, and cost rank 0's bounds).
    if cut || sent.len() < hello.len() {
        let _ = s.shutdown(std::net::Shutdown::Write);
    }
    let mut status = [0u8; 1];
    if s.read_exact(&mut status).is_err() || status[0] != REPLY_OK {
        drain_until_closed(&mut s);
        return (None, sent, honest);
    }
    let mut challenge = [0u8; NONCE + TAG];
    if s.read_exact(&mut challenge).is_err() {
        drain_until_closed(&mut s);
        return (None, sent, honest);
    }
    let ns = &challenge[..NONCE];
    let (w, r) = (world.to_le_bytes(), rank.to_le_bytes());
    let mut answer = secret::tag(key, &[b"raft-comms rank", ns, &nc, &w, &r]).to_vec();
    answer.extend_from_slice(&w);
    answer.extend_from_slice(&r);
    honest.extend_from_slice(&answer);
    let (sent_answer, cut) = mutate(&answer, hello.len(), ms);
    sent.extend_from_slice(&sent_answer);
    let _ = s.write_all(&sent_answer);
    if cut || sent.len() < honest.len() {
        let _ = s.shutdown(std::net::Shutdown::Write);
    }
    if s.read_exact(&mut status).is_err() || status[0] != REPLY_OK {
        drain_until_closed(&mut s);
        return (None, sent, honest);
    }
    let mut sealed = [0u8; ID + TAG];
    s.read_exact(&mut sealed).expect("rank 0 said OK, then the id");
    let (body, seal) = sealed.split_at(ID);
    assert!(secret::verify(key, &[b"raft-comms id", &nc, ns, body], seal), "rank 0's id came with a wrong tag");
    drain_until_closed(&mut s);
    (Some(masked(key, &nc, ns, body.try_into().unwrap())), sent, honest)
}

/// Rank 0 against peers whose side of the handshake is mutated (1000 seeded cases: bytes
/// flipped, set, inserted, deleted, repeated, 32-bit words written over, the stream cut) and
/// against peers that hold the secret but claim odd worlds and ranks (0, the world, past
/// it, `u32::MAX`, a rank already served): a peer is given the id exactly when rank 0 read
/// an honest handshake from it (the first 80 bytes it sent are the honest ones) with a rank
/// of the world not served yet, and then the right one; every connection is closed within
/// the bound; no handshake thread panics; and rank 0 still serves every other rank
/// honestly afterwards.
#[test]
fn mutated_handshakes_never_take_the_id_and_rank_zero_goes_on_serving() {
    // Rank 0 looks for a connection every 5 ms when none is waiting: about 5 ms a case.
    const CASES: usize = 1000;
    let panics = rendezvous_thread_panics();
    let secret = Secret::new("mutations-0123456789abcdef-0123456789abcdef").unwrap().with_job("audit-111");
    let key = secret.key().to_vec();
    let id: [u8; ID] = std::array::from_fn(|i| (i * 7 + 3) as u8);
    // Every case claims a rank of its own: a handshake left whole by its mutations is served.
    let world = CASES + 2;
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let timeout = Duration::from_secs(300);
    let server = {
        let secret = secret.clone();
        std::thread::spawn(move || serve_on("mutations", &listener, &id, world, Some(&secret), deadline_after(timeout), timeout))
    };
    let mut rng = Rng(0x5eed_0111_0000_0001);
    let mut claimed = BTreeSet::new();
    let (mut whole, mut odd) = (0, 0);
    let started = Instant::now();
    for case in 0..CASES {
        let own = case + 1;
        let (claim, ms) = if rng.below(8) == 0 {
            let worlds = [0, 1, world - 1, world, world + 1, u32::MAX as usize];
            let ranks = [0, own, world - 1, world, u32::MAX as usize, claimed.first().copied().unwrap_or(own)];
            ((worlds[rng.below(worlds.len())], ranks[rng.below(ranks.len())]), Vec::new())
        } else {
            ((world, own), mutations(&mut rng, 80))
        };
        let (got, sent, honest) = peer(addr, &key, (claim.0 as u32, claim.1 as u32), &ms, &mut rng);
        let left_whole = honest.len() == 80 && sent.get(..80) == Some(&honest[..]);
        let fair = claim.0 == world && (1..world).contains(&claim.1) && !claimed.contains(&claim.1);
        assert_eq!(got.is_some(), left_whole && fair, "case {case}: claim {claim:?}, mutations {ms:?}");
        if let Some(got) = got {
            assert_eq!(got, id, "case {case}");
            claimed.insert(claim.1);
        }
        whole += usize::from(left_whole && !ms.is_empty());
        odd += usize::from(ms.is_empty());
    }
    let abuse = started.elapsed();
    assert_eq!(panics.load(std::sync::atomic::Ordering::SeqCst), 0, "a handshake thread panicked");
    // The honest ranks not served yet, four at a time.
    let left: Vec<usize> = (1..world).filter(|r| !claimed.contains(r)).collect();
    let chunks: Vec<Vec<usize>> = left.chunks(left.len().div_ceil(4).max(1)).map(<[usize]>::to_vec).collect();
    let fetchers: Vec<_> = chunks
        .into_iter()
        .map(|ranks| {
            let secret = secret.clone();
            std::thread::spawn(move || {
                for rank in ranks {
                    let deadline = deadline_after(Duration::from_secs(30));
                    let got = fetch_until("honest", &addr.to_string(), rank, world, Some(&secret), deadline, Duration::from_secs(30));
                    assert_eq!(got.unwrap(), id, "rank {rank}");
                }
            })
        })
        .collect();
    fetchers.into_iter().for_each(|f| f.join().unwrap());
    server.join().unwrap().unwrap();
    assert_eq!(panics.load(std::sync::atomic::Ordering::SeqCst), 0, "a handshake thread panicked");
    // The draw covers what it should: mutations that leave a handshake whole, and odd claims.
    assert!(whole > 5 && odd > 50, "{whole} whole, {odd} odd claims");
    eprintln!("{CASES} cases in {abuse:?} ({whole} left whole, {odd} odd claims), then {} honest ranks", left.len());
}

/// A rank against a rank 0 whose side of the handshake is mutated (2000 seeded cases, as
/// above, over the challenge and the id's reply: status bytes, nonces, tags, the sealed id,
/// a refusal's length): it takes an id exactly when what it read is the honest reply (the
/// first 226 bytes rank 0 sent), and then the right id; otherwise a `Logic` or `Generic`
/// error, or a retry, within the bound, never a panic, never another id.
#[test]
fn a_rank_takes_no_id_from_a_mutated_rank_zero() {
    const CASES: usize = 2000;
    const REPLY: usize = 1 + NONCE + TAG + 1 + ID + TAG;
    let secret = Secret::new("mutations-0123456789abcdef-0123456789abcdef").unwrap().with_job("audit-111");
    let key = secret.key().to_vec();
    let id: [u8; ID] = std::array::from_fn(|i| (i * 11 + 5) as u8);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (cases, take) = mpsc::channel::<Vec<Mutation>>();
    let (said, hear) = mpsc::channel::<(Vec<u8>, Vec<u8>)>();
    // The fake rank 0: an honest one whose bytes are mutated on the way out.
    let fake = std::thread::spawn(move || {
        let mut rng = Rng(0x5eed_0111_0000_0002);
        for ms in take {
            let (mut s, _) = listener.accept().unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let (mut honest, mut sent) = (Vec::new(), Vec::new());
            let mut hello = [0u8; 8 + NONCE];
            if s.read_exact(&mut hello).is_ok() {
                let (nc, ns) = (&hello[8..], rng.bytes::<NONCE>());
                let mut challenge = vec![REPLY_OK];
                challenge.extend_from_slice(&ns);
                challenge.extend_from_slice(&secret::tag(&key, &[b"raft-comms rank 0", nc, &ns]));
                honest.extend_from_slice(&challenge);
                let (a, cut) = mutate(&challenge, 0, &ms);
                sent.extend_from_slice(&a);
                let _ = s.write_all(&a);
                // Rank 0 waits for the answer only after an OK challenge of full length.
                let mut answer = [0u8; TAG + 8];
                if !cut && a.len() >= challenge.len() && a[0] == REPLY_OK && s.read_exact(&mut answer).is_ok() {
                    let sealed = masked(&key, nc, &ns, &id);
                    let mut reply = vec![REPLY_OK];
                    reply.extend_from_slice(&sealed);
                    reply.extend_from_slice(&secret::tag(&key, &[b"raft-comms id", nc, &ns, &sealed]));
                    honest.extend_from_slice(&reply);
                    let (b, _) = mutate(&reply, challenge.len(), &ms);
                    sent.extend_from_slice(&b);
                    let _ = s.write_all(&b);
                }
            }
            drop(s);
            said.send((honest, sent)).unwrap();
        }
    });
    let key = secret.key().to_vec();
    let mut rng = Rng(0x5eed_0111_0000_0003);
    let (mut taken, mut refused) = (0, 0);
    for case in 0..CASES {
        let ms = mutations(&mut rng, REPLY);
        cases.send(ms.clone()).unwrap();
        let mut stream = TcpStream::connect(addr).unwrap();
        let started = Instant::now();
        let got = fetch_once("mutations", "the fake", addr, &mut stream, &key, 1, (2, 1), deadline_after(Duration::from_secs(10)));
        let took = started.elapsed();
        drop(stream);
        let (honest, sent) = hear.recv().unwrap();
        let whole = honest.len() == REPLY && sent.get(..REPLY) == Some(&honest[..]);
        match got {
            Ok(got) => {
                assert!(whole, "case {case}: an id from a mutated reply ({ms:?})");
                assert_eq!(got, id, "case {case}");
                taken += 1;
            }
            Err(Attempt::Fail(e) | Attempt::Unproven(e)) => {
                assert!(!whole, "case {case}: the honest reply refused ({ms:?}): {e}");
                assert!(matches!(e.kind(), ErrorKind::Logic | ErrorKind::Generic), "case {case}: {e}");
                refused += 1;
            }
            Err(Attempt::Retry(why)) => assert!(!whole, "case {case}: the honest reply retried ({ms:?}): {why}"),
        }
        assert!(took < Duration::from_secs(5), "case {case}: {took:?} ({ms:?})");
    }
    drop(cases);
    fake.join().unwrap();
    assert!(taken > 0 && refused > 1000, "{taken} taken, {refused} refused");
}
