//! Seed 2.2.2, "Devices": round-robin placement and resources for every device.
use raft::DeviceResources;

fn main() -> raft::Result<()> {
    env_logger::init();
    let count = raft::device_count()?;
    let device_for_worker = |i: usize| i % count;
    println!("workers 0..4 on devices {:?}", (0..4).map(device_for_worker).collect::<Vec<_>>());
    let per_device: Vec<DeviceResources> = (0..count).map(DeviceResources::on_device).collect::<raft::Result<_>>()?;
    for r in &per_device {
        println!("{r}: stream on context of device {}", r.stream()?.context().ordinal());
    }
    Ok(())
}
