//! The count checks every collective makes before NCCL is called (`raft_comms::counts`): CPU
//! only. The GPU tests check that a communicator refuses the same cases with no NCCL call made
//! (the next collective on it still agrees with its peers).
use raft_comms::counts;
use raft_core::ErrorKind;

#[test]
fn allreduce_and_broadcast_need_equal_lengths() {
    assert!(counts::allreduce(5, 5).is_ok());
    let e = counts::allreduce(5, 4).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Logic);
    assert!(e.message().contains("5 elements") && e.message().contains("4"), "{e}");
    assert!(counts::broadcast(2, 1, 3, 3).is_ok());
    assert!(counts::broadcast(2, 1, 3, 2).is_err());
    let e = counts::broadcast(2, 2, 3, 3).unwrap_err();
    assert!(e.message().contains("root 2 is not a rank of a communicator of 2"), "{e}");
}

#[test]
fn allgather_receives_world_times_send() {
    assert!(counts::allgather(2, 3, 6).is_ok());
    assert!(counts::allgather(1, 0, 0).is_ok());
    let e = counts::allgather(2, 3, 5).unwrap_err();
    assert!(e.message().contains("2 ranks × 3 sent elements need exactly 6"), "{e}");
    assert!(counts::allgather(2, 3, 7).is_err(), "a larger receive array is refused too: NCCL would leave it half written");
    let e = counts::allgather(usize::MAX, 2, 0).unwrap_err();
    assert!(e.message().contains("does not fit"), "{e}");
}

#[test]
fn reduce_scatter_sends_world_times_receive() {
    assert!(counts::reduce_scatter(2, 8, 4).is_ok());
    let e = counts::reduce_scatter(2, 7, 4).unwrap_err();
    assert!(e.message().contains("2 ranks × 4 received elements need exactly 8"), "{e}");
    assert!(counts::reduce_scatter(usize::MAX, 0, 3).is_err());
}

#[test]
fn reduce_and_gather_need_a_receive_array_on_the_root_only() {
    assert!(counts::reduce(2, 0, 0, 4, Some(4)).is_ok());
    assert!(counts::reduce(2, 1, 0, 4, None).is_ok(), "a non-root passes no receive array");
    assert!(counts::reduce(2, 0, 0, 4, None).unwrap_err().message().contains("is the root"));
    assert!(counts::reduce(2, 0, 0, 4, Some(3)).is_err());
    assert!(counts::reduce(2, 0, 5, 4, Some(4)).is_err());

    assert!(counts::gather(2, 0, 0, 3, Some(6)).is_ok());
    assert!(counts::gather(2, 1, 0, 3, None).is_ok());
    assert!(counts::gather(2, 1, 0, 3, Some(1)).is_ok(), "a non-root's receive array is not used");
    assert!(counts::gather(2, 0, 0, 3, Some(5)).unwrap_err().message().contains("need exactly 6"));
    assert!(counts::gather(2, 0, 0, 3, None).is_err());
    assert!(counts::gather(2, 0, 2, 3, Some(6)).is_err());
}

#[test]
fn allgatherv_checks_every_count_and_gives_the_displacements() {
    assert_eq!(counts::allgatherv(3, 1, &[2, 0, 5], 0, 7).unwrap(), [0, 2, 2]);
    let e = counts::allgatherv(3, 1, &[2, 5], 5, 7).unwrap_err();
    assert!(e.message().contains("2 counts given for a communicator of 3"), "{e}");
    let e = counts::allgatherv(3, 1, &[2, 5, 1], 4, 8).unwrap_err();
    assert!(e.message().contains("sends 4 elements but its count says 5"), "{e}");
    let e = counts::allgatherv(3, 0, &[2, 5, 1], 2, 9).unwrap_err();
    assert!(e.message().contains("add up to 8"), "{e}");
    assert!(counts::allgatherv(2, 0, &[usize::MAX, 1], usize::MAX, 0).is_err());
}

#[test]
fn peers_are_ranks() {
    assert!(counts::peer(2, 0, 1).is_ok());
    assert!(counts::peer(2, 1, 0).is_ok());
    assert!(counts::peer(2, 0, 2).unwrap_err().message().contains("peer 2"));
}

/// A shim that is not there is a missing library, the `Cuda` kind as in raft-sys and raft-cuvs,
/// and the message says where raft-sys's loader looked and which variable named it. In a child
/// process: the shim is loaded once per process.
#[test]
fn a_missing_shim_is_a_cuda_error_naming_the_variable() {
    const CHILD: &str = "RAFT_COMMS_TEST_MISSING_SHIM_CHILD";
    const MISSING: &str = "/nonexistent/raft-comms/libraftcomms_shim.so";
    if std::env::var_os(CHILD).is_some() {
        let e = raft_comms::nccl_info().unwrap_err();
        assert_eq!((e.kind(), e.who()), (ErrorKind::Cuda, "raft_comms::nccl_info"), "{e}");
        assert_eq!(e.reason(), raft_error::Reason::LibraryMissing, "the reason of a missing raft shim or libcuvs too: {e}");
        assert!(std::error::Error::source(&e).is_some(), "the loader's error is the source");
        assert!(e.message().starts_with("could not load raft-comms's shim (libraftcomms_shim.so): "), "{e}");
        assert!(e.message().contains(&format!("{MISSING} (absent)")) && e.message().contains("RAFT_COMMS_SHIM names it"), "{e}");
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "a_missing_shim_is_a_cuda_error_naming_the_variable", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env("RAFT_COMMS_SHIM", MISSING)
        .output()
        .unwrap();
    assert!(out.status.success(), "child failed:\n{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
}

/// The eighth audit: NCCL pairs a send to self with a receive from self and copies the send's
/// count into the receive's array, unchecked. A send or receive to this rank alone is refused;
/// a sendrecv to itself only both ways, with one length.
#[test]
fn a_rank_sends_to_itself_only_both_ways_with_one_length() {
    let e = counts::peer(2, 1, 1).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Logic);
    assert!(e.message().contains("peer 1 is this rank"), "{e}");
    assert!(counts::peer(1, 0, 0).is_err(), "a clique of one has no peer to send to but itself");
    assert!(counts::sendrecv(2, 0, 1, 1, 5, 7).is_ok(), "lengths of a sendrecv between two ranks are the peers' to agree");
    assert!(counts::sendrecv(1, 0, 0, 0, 16, 16).is_ok());
    let e = counts::sendrecv(1, 0, 0, 0, 1 << 20, 16).unwrap_err();
    assert!(e.message().contains("1048576 elements into the receive array of 16"), "{e}");
    assert!(counts::sendrecv(2, 0, 0, 1, 4, 4).is_err(), "to itself one way only");
    assert!(counts::sendrecv(2, 0, 1, 0, 4, 4).is_err(), "from itself one way only");
    assert!(counts::sendrecv(2, 0, 2, 1, 4, 4).unwrap_err().message().contains("peer 2"));
}
