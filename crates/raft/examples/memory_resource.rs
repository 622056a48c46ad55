//! Seed 2.2.3, "The default memory resource": RMM's per-device resource before and after the
//! first resources on a device, and allocations through it.
use raft::{DeviceResources, DeviceVec};

fn main() -> raft::Result<()> {
    env_logger::init();
    println!("before any resources: {}", raft::current_memory_resource(0)?);
    let r = DeviceResources::new()?;
    println!("memory pools supported: {}", raft::memory_pools_supported(0)?);
    println!("after the first resources: {} (installed by raft: {})", raft::current_memory_resource(0)?, raft::installed_default(0));
    raft::enable_memory_statistics(0)?;
    let v = DeviceVec::<f32>::zeros(&r, 1 << 20)?;
    println!("4 MiB array allocated: {:?}", raft::memory_statistics(0)?);
    drop(v);
    r.sync()?;
    println!("after the drop: {:?}", raft::memory_statistics(0)?);
    Ok(())
}
