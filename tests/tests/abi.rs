//! Seed 2.2.6 "Version and ABI": every example, translated. None needs a GPU.
use raft::{abi, version, Abi, AbiField, Release};

#[test]
fn comparing_releases_numerically() {
    let mut parts = version().split('.').map(|p| p.parse::<u32>().unwrap());
    let (year, month) = (parts.next().unwrap(), parts.next().unwrap());
    assert_eq!((year, month), (26, 8));
    assert!(100 * year + month >= 2608);
    // The same with the typed release.
    assert!(raft::raft_release() >= Release::new(26, 8, 0));
    assert!(raft::raft_release() < Release::new(26, 10, 0));
    assert_eq!(Release::parse("26.08.00"), Some(Release::new(26, 8, 0)));
    assert_eq!(Release::parse("26.08"), None);
    assert_eq!(Release::new(26, 8, 0).to_string(), "26.08.00");
}

#[test]
fn refusing_to_start_on_another_release() {
    assert_eq!(raft::require_raft_release("my-pipeline", "26.08.00"), Ok(()));
    let e = raft::require_raft_release("my-pipeline", "26.10.00").unwrap_err();
    assert_eq!(e.to_string(), "my-pipeline: built for RAFT 26.10.00, but this is RAFT 26.08.00");
    assert_eq!(e.kind(), raft::ErrorKind::Logic);
}

#[test]
fn taking_the_tag_s_fields_by_pattern() {
    let Abi { raft, cuda_runtime, .. } = abi();
    assert_eq!((raft.as_str(), cuda_runtime.as_str()), ("26.08.00", "13.2"));
}

#[test]
fn a_program_tested_on_one_release_can_say_so_on_another() {
    #[derive(Debug, PartialEq)]
    enum Support {
        Supported,
        Untested(String),
    }
    fn support_status(abi: &Abi) -> Support {
        match abi {
            Abi { raft, .. } if raft == "26.08.00" => Support::Supported,
            Abi { raft: other, .. } => Support::Untested(other.clone()),
        }
    }
    assert_eq!(support_status(&abi()), Support::Supported);
    assert_eq!(support_status(&Abi { raft: "26.10.00".into(), ..abi() }), Support::Untested("26.10.00".into()));
}

#[test]
fn checking_a_recorded_tag() {
    assert_eq!(abi().mismatches(&abi()), []);
    assert_eq!(abi().mismatches(&Abi { raft: "26.10.00".into(), ..abi() }), [AbiField::Raft]);
    // A handle layout change that a version check would miss.
    assert_eq!(abi().mismatches(&Abi { handle_size: 40, ..abi() }), [AbiField::HandleSize]);
    assert_eq!(AbiField::HandleSize.to_string(), "handle-size");
    assert_eq!(AbiField::CudaRuntime.to_string(), "cuda-runtime");
}

#[test]
fn the_one_line_support_report() {
    let Abi { raft, rmm, cccl, .. } = abi();
    assert_eq!(format!("raft={raft} rmm={rmm} cccl={cccl}"), "raft=26.08.00 rmm=26.08.00 cccl=3.4.3");
    assert_eq!(abi().report_line(), "raft=26.08.00 rmm=26.08.00 cccl=3.4.3");
}

/// The tag committed in the repository, embedded when this test is compiled: the check runs
/// wherever the test binary does (the GPU bundle carries no source tree).
const COMMITTED_TAG: &str = include_str!("../../crates/raft-abi/abi-tag.json");

#[test]
fn the_tag_is_read_from_the_headers() {
    let a = abi();
    assert_eq!(a.handle_size, 32, "sizeof(raft::device_resources) in 26.08");
    assert_eq!(a.rmm_abi_namespace, "_RMM_26_8");
    assert_eq!(a.cccl, "3.4.3");
    // The committed tag is this build's, field by field (its format number included).
    let committed = Abi::from_json(COMMITTED_TAG).expect("the committed tag parses");
    assert_eq!(a.mismatches(&committed), [], "this build's tag differs from crates/raft-abi/abi-tag.json");
    assert_eq!(a, committed);
}

#[test]
fn the_tag_round_trips_through_json_and_bad_json_is_a_logic_error() {
    let a = abi();
    assert_eq!(Abi::from_json(&a.to_json()).unwrap(), a);
    let json: serde_json::Value = serde_json::from_str(&a.to_json()).unwrap();
    let keys: Vec<&str> = json.as_object().unwrap().keys().map(String::as_str).collect();
    for k in ["version", "raft", "rmm", "cccl", "cuda_runtime", "handle_size"] {
        assert!(keys.contains(&k), "stable field name {k}");
    }
    for bad in ["", "{", "[]", "{\"raft\": 26}", "null", "{\"version\": -1}"] {
        let e = Abi::from_json(bad).unwrap_err();
        assert_eq!(e.kind(), raft::ErrorKind::Logic, "{bad}: {e}");
        assert_eq!(e.who(), "Abi::from_json");
    }
}

#[test]
fn the_running_side_is_readable_without_a_gpu() {
    let r = raft::running().unwrap();
    assert_eq!(r.cuda_runtime, "13.2", "libcudart 13.2 is what the binary loads");
    if raft::device_count().is_err() {
        assert_eq!(r.driver, None);
    } else {
        assert!(r.driver.is_some());
    }
}

#[test]
fn malformed_tags_never_panic() {
    // Bounded mutation fuzzing: 20 000 edits of a valid tag (byte flips, cuts, insertions of
    // JSON punctuation), each parsed; every outcome is a tag or a Logic error, never a panic.
    let valid = abi().to_json().into_bytes();
    let mut s: u64 = 0x2545_F491_4F6C_DD1D;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let (mut ok, mut refused) = (0, 0);
    for _ in 0..20_000 {
        let mut text = valid.clone();
        for _ in 0..1 + next() % 4 {
            let at = (next() as usize) % text.len().max(1);
            match next() % 4 {
                0 => text[at] = (next() % 256) as u8,
                1 => text.truncate(at),
                2 => text.insert(at, b"{}[]\":,-0e9"[(next() % 11) as usize]),
                _ => {
                    text.remove(at.min(text.len().saturating_sub(1)));
                }
            }
            if text.is_empty() {
                break;
            }
        }
        let Ok(candidate) = std::str::from_utf8(&text) else { continue };
        match Abi::from_json(candidate) {
            Ok(tag) => {
                assert_eq!(Abi::from_json(&tag.to_json()).unwrap(), tag);
                ok += 1;
            }
            Err(e) => {
                assert_eq!(e.kind(), raft::ErrorKind::Logic);
                refused += 1;
            }
        }
    }
    assert!(refused > 1000 && ok > 0, "mutations exercised both outcomes: {ok} parsed, {refused} refused");
}
