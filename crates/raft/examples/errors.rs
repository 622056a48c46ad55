//! Seed 2.2.4, "Errors": dispatching on the kind and recovering `who`.
use raft::{DeviceResources, ErrorKind};

fn describe_failure<T>(thunk: impl FnOnce() -> raft::Result<T>) -> &'static str {
    match thunk() {
        Ok(_) => "ok",
        Err(e) => match e.kind() {
            ErrorKind::OutOfMemory => "free-memory-and-retry",
            ErrorKind::Logic => "fix-the-call",
            _ => "report",
        },
    }
}

fn main() {
    env_logger::init();
    println!("{}", describe_failure(|| raft::current_device_resources(0)));
    println!("{}", describe_failure(|| DeviceResources::on_device(99)));
    if let Ok(r) = DeviceResources::new() {
        println!("{}", describe_failure(|| raft::DeviceVec::<u8>::new(&r, 1 << 50)));
        let finished = raft::with_device_resources(r, |r| r.clone());
        if let Err(e) = finished.sync() {
            println!("who: {}", e.to_string().split(": ").next().unwrap_or_default());
        }
    }
}
