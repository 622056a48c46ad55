//! Seed 2.2.5, "Exiting while jobs run": main returns while a job runs; the exit waits for it
//! (up to its exit wait) and logs what it did. Run with RUST_LOG=raft=debug.
use raft::DeviceResources;
use std::time::Duration;

fn main() -> raft::Result<()> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("raft=debug")).init();
    let (tx, rx) = std::sync::mpsc::channel();
    raft::exit::with_exit_wait(f64::INFINITY, || {
        raft::exit::spawn_thread(move || tx.send(raft::exit::current_exit_wait()).ok());
    })?;
    println!("a thread made inside with_exit_wait(+inf) sees {:?}", rx.recv().ok());
    if let Err(e) = raft::exit::with_exit_wait(-1.0, || ()) {
        println!("{e}");
    }
    let r = DeviceResources::new()?;
    let worker = r.clone();
    // Detached: nobody joins it, and the exit still waits for it.
    let _job = raft::exit::with_exit_wait(5.0, || {
        r.spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            worker.sync().expect("sync");
            println!("the job finished; the exit waited for it");
        })
    })??;
    println!("main returns with a job in flight");
    Ok(())
}
