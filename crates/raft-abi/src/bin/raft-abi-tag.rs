//! Prints this build's ABI tag as JSON (what `cargo xtask abi-check` compares with the
//! committed tag; usable in a downstream CI the same way).
fn main() {
    println!("{}", raft_abi::abi().to_json());
}
