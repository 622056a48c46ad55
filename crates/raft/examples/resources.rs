//! Seed 2.2.1, "Device resources": independent resources, per-thread defaults, scoped release.
//! `cargo run --example resources` (RUST_LOG=raft=debug to see the library's log).
use raft::{current_device_resources, with_device_resources, DeviceResources};

fn main() -> raft::Result<()> {
    env_logger::init();
    let loader = DeviceResources::new()?;
    let trainer = DeviceResources::new()?;
    println!("loader == trainer: {}", loader == trainer);
    println!("devices: {:?}", [loader.device(), trainer.device()]);
    println!("device_count: {}", raft::device_count()?);
    match DeviceResources::on_device(raft::device_count()?) {
        Err(e) => println!("{e}"),
        Ok(_) => unreachable!("device_count() is not a device"),
    }
    let finished = with_device_resources(DeviceResources::new()?, |r| r.clone());
    println!("training on cuda:{}", trainer.device());
    println!("finished: {finished}");
    let r = trainer.clone();
    let waited = trainer.spawn(move || r.sync().map(|_| "the trainer's stream has drained"))?.join()??;
    println!("{waited}");
    if let Err(e) = finished.sync() {
        println!("{e}");
    }
    let worker = std::thread::spawn(|| current_device_resources(0).map(|r| r.id())).join().expect("thread")?;
    println!("a worker's default differs from main's: {}", worker != current_device_resources(0)?.id());
    let before = current_device_resources(0)?;
    with_device_resources(before.clone(), |r| r.sync())?;
    println!("{before}; new default is another: {}", before != current_device_resources(0)?);
    let (left, right) = with_device_resources((DeviceResources::new()?, DeviceResources::new()?), |(l, r)| (l.clone(), r.clone()));
    println!("{left} / {right}");
    Ok(())
}
