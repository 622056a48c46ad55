//! Seed 2.2.6, "Version and ABI": comparing releases, refusing another one, the tag by pattern.
use raft::{abi, Abi, Release};

fn main() {
    env_logger::init();
    println!("RAFT {} (>= 26.08: {})", raft::version(), raft::raft_release() >= Release::new(26, 8, 0));
    if let Err(e) = raft::require_raft_release("my-pipeline", "26.10.00") {
        println!("{e}");
    }
    let Abi { raft, cuda_runtime, .. } = abi();
    println!("{raft} {cuda_runtime}");
    let names = |fields: Vec<raft::AbiField>| fields.iter().map(ToString::to_string).collect::<Vec<_>>();
    println!("mismatches with a 26.10 tag: {:?}", names(abi().mismatches(&Abi { raft: "26.10.00".into(), ..abi() })));
    println!("mismatches with a moved handle: {:?}", names(abi().mismatches(&Abi { handle_size: 40, ..abi() })));
    println!("{}", abi().report_line());
    println!("{}", abi().to_json());
}
