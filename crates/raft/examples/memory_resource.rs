//! Seed 2.2.3, "The default memory resource": RMM's per-device resource before and after the
//! first resources on a device, and allocations through it.
use raft::{memory, DeviceResources, DeviceVec};

fn main() -> raft::Result<()> {
    env_logger::init();
    println!("before any resources: {}", memory::current(0)?.kind());
    let r = DeviceResources::new()?;
    println!("memory pools supported: {}", raft::memory_pools_supported(0)?);
    println!("after the first resources: {} (installed by raft: {})", memory::current(0)?.kind(), raft::installed_default(0));
    // Count what is allocated through the device's resource from now on.
    let counted = memory::current(0)?.with_statistics()?;
    memory::set_current(0, &counted)?;
    let v = DeviceVec::<f32>::zeros(&r, 1 << 20)?;
    println!("4 MiB array allocated: {:?}", counted.statistics()?);
    drop(v);
    r.sync()?;
    println!("after the drop: {:?}", counted.statistics()?);
    Ok(())
}
