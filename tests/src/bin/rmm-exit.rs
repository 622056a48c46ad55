//! A child process for tests/tests/rmm.rs and the GPU torture runs.
//!
//! - no argument: leaks an array allocated through a tracking resource and returns from main;
//!   the exit teardown must report it (log target `raft`, warn).
//! - `arrays-alive`: with whatever `RAFT_RMM_*` setup the environment gives (a pool, say), makes
//!   several resources with arrays alive on each, a job holding an array for
//!   `SCENARIO_JOB_SECS`, arrays dropped on other threads, then ends as `SCENARIO_END` says
//!   (`return`, `exit-from-thread`, `exit-in-job`) with the exit wait `SCENARIO_WAIT`.
use raft::{DeviceResources, DeviceVec, MemoryResource};
use std::time::Duration;

fn env_f64(name: &str, default: f64) -> f64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn leak_report() {
    let res = DeviceResources::on_device(0).expect("resources");
    let tracked = MemoryResource::cuda_async(0).expect("async").with_tracking().expect("tracking");
    let kept = DeviceVec::<u8>::new_in(&res, 4096, &tracked).expect("array");
    let freed = DeviceVec::<u8>::new_in(&res, 8192, &tracked).expect("array");
    drop(freed);
    // SAFETY: only the address is printed, never dereferenced.
    println!("LEAKED {:p}", unsafe { kept.as_raw() });
    std::mem::forget(kept); // leaked on purpose: the report at exit must name it
}

fn arrays_alive() {
    raft::exit::set_default_exit_wait(env_f64("SCENARIO_WAIT", 10.0)).expect("wait");
    let job_secs = env_f64("SCENARIO_JOB_SECS", 0.2);
    let devices = raft::device_count().expect("devices");
    let mut held = Vec::new();
    for i in 0..6 {
        let res = DeviceResources::on_device(i % devices).expect("resources");
        for n in [1usize << 10, 1 << 20, 3 << 20] {
            held.push(DeviceVec::<f32>::from_host(&res, &vec![i as f32; n]).expect("array"));
        }
        held.push(DeviceVec::<f32>::zeros(&res, 1 << 16).expect("array"));
    }
    println!("RESULT mr={}", raft::memory::current(0).map(|m| m.kind().to_string()).unwrap_or_else(|e| e.to_string()));
    // Some arrays go on other threads, while the exit may already run.
    let tail: Vec<DeviceVec<f32>> = held.split_off(held.len() / 2);
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        drop(tail);
    });
    let res = held[0].resources().clone();
    let in_job = DeviceVec::<f32>::from_host(&res, &[1.0; 4096]).expect("array");
    let end = std::env::var("SCENARIO_END").unwrap_or_else(|_| "return".into());
    let exit_in_job = end == "exit-in-job";
    let _job = res
        .spawn(move || {
            std::thread::sleep(Duration::from_secs_f64(job_secs));
            let sum: f32 = in_job.to_host().expect("copy").iter().sum();
            println!("RESULT job=finished sum={sum}");
            if exit_in_job {
                std::process::exit(3);
            }
        })
        .expect("job");
    if end == "exit-from-thread" {
        std::thread::spawn(|| std::process::exit(0)).join().ok();
    }
    // `held` stays alive until main returns: its arrays are dropped during or after the exit.
    std::mem::forget(held);
}

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("raft=warn")).init();
    match std::env::args().nth(1).as_deref() {
        None => leak_report(),
        Some("arrays-alive") => arrays_alive(),
        Some(other) => {
            eprintln!("rmm-exit: unknown mode {other}");
            std::process::exit(2);
        }
    }
}
