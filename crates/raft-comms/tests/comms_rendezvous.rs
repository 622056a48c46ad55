//! The unique id's rendezvous over TCP between threads (CPU only): rank 0 serves, the others
//! fetch; mismatched world sizes, duplicate ranks and missing ranks give clear errors within the
//! bound. With NCCL present, also a real `ncclGetUniqueId` (NCCL needs no GPU for it).
mod common;

use raft_comms::UniqueId;
use raft_core::ErrorKind;
use std::net::TcpListener;
use std::time::{Duration, Instant};

fn free_addr() -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    format!("127.0.0.1:{}", l.local_addr().unwrap().port())
}

fn fake_id(seed: u8) -> UniqueId {
    let mut b = [0u8; 128];
    for (i, x) in b.iter_mut().enumerate() {
        *x = seed.wrapping_add(i as u8);
    }
    UniqueId::from_bytes(b)
}

#[test]
fn rank_zero_gives_every_rank_the_same_id() {
    let addr = free_addr();
    let id = fake_id(3);
    let world = 4;
    // The others start first: they retry until rank 0 listens.
    let fetchers: Vec<_> = (1..world)
        .map(|rank| {
            let addr = addr.clone();
            std::thread::spawn(move || UniqueId::fetch(&addr, rank, world, Duration::from_secs(10)))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    id.serve(&addr, world, Duration::from_secs(10)).unwrap();
    for f in fetchers {
        assert_eq!(f.join().unwrap().unwrap(), id);
    }
}

#[test]
fn a_world_of_one_needs_no_other_rank() {
    fake_id(1).serve(&free_addr(), 1, Duration::from_millis(10)).unwrap();
}

#[test]
fn a_rank_that_never_arrives_is_named_within_the_bound() {
    let addr = free_addr();
    let fetcher = {
        let addr = addr.clone();
        std::thread::spawn(move || UniqueId::fetch(&addr, 1, 3, Duration::from_secs(10)))
    };
    let start = Instant::now();
    let e = fake_id(5).serve(&addr, 3, Duration::from_millis(1500)).unwrap_err();
    let waited = start.elapsed();
    assert_eq!(e.kind(), ErrorKind::Generic);
    assert_eq!(e.who(), "UniqueId::serve");
    assert!(e.message().contains("missing: 2") && !e.message().contains("missing: 1,"), "{e}");
    // Bounded: it returns (the upper bound is loose for slow runs, valgrind's included).
    assert!(waited >= Duration::from_millis(1400) && waited < Duration::from_secs(30), "waited {waited:?}");
    assert_eq!(fetcher.join().unwrap().unwrap(), fake_id(5), "rank 1 came and got the id");
}

#[test]
fn a_missing_rank_zero_is_an_error_within_the_bound() {
    let addr = free_addr(); // nobody listens there
    let start = Instant::now();
    let e = UniqueId::fetch(&addr, 1, 2, Duration::from_millis(800)).unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(30), "took {:?}", start.elapsed());
    assert_eq!(e.kind(), ErrorKind::Generic);
    assert!(e.message().contains("rank 1 of 2 could not get the id from rank 0"), "{e}");
}

#[test]
fn another_world_size_or_a_duplicate_rank_is_refused_by_name() {
    let addr = free_addr();
    let server = {
        let addr = addr.clone();
        std::thread::spawn(move || fake_id(9).serve(&addr, 3, Duration::from_secs(3)))
    };
    std::thread::sleep(Duration::from_millis(100));
    let e = UniqueId::fetch(&addr, 1, 2, Duration::from_secs(3)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Logic);
    assert!(e.message().contains("rank 0 was started with a world size of 3, rank 1 with 2"), "{e}");
    assert_eq!(UniqueId::fetch(&addr, 2, 3, Duration::from_secs(3)).unwrap(), fake_id(9));
    let e = UniqueId::fetch(&addr, 2, 3, Duration::from_secs(3)).unwrap_err();
    assert!(e.message().contains("rank 2 already joined"), "{e}");
    assert_eq!(UniqueId::fetch(&addr, 1, 3, Duration::from_secs(3)).unwrap(), fake_id(9));
    server.join().unwrap().unwrap();
}

#[test]
fn a_stray_connection_does_not_count_as_a_rank() {
    use std::io::Write;
    let addr = free_addr();
    let server = {
        let addr = addr.clone();
        std::thread::spawn(move || fake_id(2).serve(&addr, 2, Duration::from_secs(5)))
    };
    std::thread::sleep(Duration::from_millis(100));
    let mut stray = std::net::TcpStream::connect(&addr).unwrap();
    stray.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    drop(stray);
    assert_eq!(UniqueId::fetch(&addr, 1, 2, Duration::from_secs(5)).unwrap(), fake_id(2));
    server.join().unwrap().unwrap();
}

#[test]
fn rank_zero_and_out_of_range_ranks_fetch_nothing() {
    assert_eq!(UniqueId::fetch("127.0.0.1:1", 0, 2, Duration::from_millis(10)).unwrap_err().kind(), ErrorKind::Logic);
    assert_eq!(UniqueId::fetch("127.0.0.1:1", 2, 2, Duration::from_millis(10)).unwrap_err().kind(), ErrorKind::Logic);
    assert_eq!(fake_id(0).serve("127.0.0.1:0", 0, Duration::from_millis(10)).unwrap_err().kind(), ErrorKind::Logic);
}

#[test]
fn nccl_makes_distinct_ids_without_a_gpu() {
    if !common::have_nccl("nccl_makes_distinct_ids_without_a_gpu") {
        return;
    }
    let info = raft_comms::nccl_info().unwrap();
    assert!(info.version >= (2, 18, 0), "{info:?}");
    assert!(info.library.to_string_lossy().contains("libnccl"), "{info:?}");
    eprintln!("NCCL {:?} from {} (headers {:?}), shim {}", info.version, info.library.display(), info.header_version, info.shim.display());
    let (a, b) = (UniqueId::new().unwrap(), UniqueId::new().unwrap());
    assert_ne!(a, b);
    // An id made by NCCL travels like any other.
    let addr = free_addr();
    let fetched = {
        let addr = addr.clone();
        std::thread::spawn(move || UniqueId::fetch(&addr, 1, 2, Duration::from_secs(10)))
    };
    a.serve(&addr, 2, Duration::from_secs(10)).unwrap();
    assert_eq!(fetched.join().unwrap().unwrap(), a);
}
