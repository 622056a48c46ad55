//! Child-process scenarios for the integration tests: each runs in a fresh process, because it
//! is about what happens once per process (the exit, the first resources on a device).
//! `scenarios NAME` runs one; it prints `RESULT key=value ...` lines for the parent to check.
use std::time::{Duration, Instant};

fn env_f64(name: &str, default: f64) -> f64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// A job that runs `secs`: on real resources (GPU work, syncing its stream) when
/// `SCENARIO_GPU=1`, else a CPU job registered with raft-exit like the library's own.
fn job(secs: f64) -> Box<dyn FnOnce() + Send> {
    let until = Instant::now() + Duration::from_secs_f64(secs);
    if std::env::var("SCENARIO_GPU").as_deref() == Ok("1") {
        let res = raft::DeviceResources::new().expect("resources");
        let handle = res
            .spawn({
                let res = res.clone();
                move || {
                    let mut v = raft::DeviceVec::<f32>::zeros(&res, 1 << 20).expect("array");
                    while Instant::now() < until {
                        v.fill_zero().expect("memset");
                        res.sync().expect("sync");
                    }
                    println!("RESULT job=finished job_end_ms={}", now_ms());
                }
            })
            .expect("spawn");
        Box::new(move || drop(handle))
    } else {
        let bound = raft_exit::current_exit_wait().expect("exit wait");
        let token = raft_exit::JobToken::register(raft_exit::Label { what: "job", id: raft_exit::next_id(), device: None }, bound);
        std::thread::spawn(move || {
            raft_exit::mark_library_thread();
            std::thread::sleep(until.saturating_duration_since(Instant::now()));
            println!("RESULT job=finished job_end_ms={}", now_ms());
            drop(token);
        });
        Box::new(|| {})
    }
}

/// Wall-clock milliseconds since the epoch, for exit latencies measured by the parent.
fn now_ms() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis()
}

fn mr(device: usize) -> String {
    format!("{:?}", raft::current_memory_resource(device).expect("memory resource"))
}

fn main() {
    env_logger::Builder::new().parse_filters(&std::env::var("RUST_LOG").unwrap_or_else(|_| "raft=debug".into())).init();
    let name = std::env::args().nth(1).unwrap_or_default();
    let wait = env_f64("SCENARIO_WAIT", 10.0);
    let secs = env_f64("SCENARIO_JOB_SECS", 0.5);
    if std::env::var_os("SCENARIO_WAIT").is_some() {
        raft::exit::set_default_exit_wait(wait).expect("a valid wait");
    }
    println!("RESULT start_ms={}", std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis());
    match name.as_str() {
        // Exit while a job runs; main returns.
        "job-then-return" => {
            let _keep = job(secs);
        }
        // The job itself calls exit.
        "job-calls-exit" => {
            if std::env::var("SCENARIO_GPU").as_deref() == Ok("1") {
                let res = raft::DeviceResources::new().expect("resources");
                let _job = res.spawn(|| std::process::exit(3)).expect("spawn");
            } else {
                let token = raft_exit::JobToken::register(raft_exit::Label { what: "job", id: 1, device: None }, wait);
                std::thread::spawn(move || {
                    raft_exit::mark_library_thread();
                    let _token = token;
                    std::process::exit(3);
                });
            }
            std::thread::sleep(Duration::from_secs(30));
        }
        // std::process::exit from a thread that is not main, while a job runs.
        "exit-from-thread" => {
            let _keep = job(secs);
            std::thread::spawn(|| std::process::exit(0)).join().ok();
            std::thread::sleep(Duration::from_secs(30));
        }
        // A release in flight on a library thread at exit.
        "release-in-flight" => {
            if std::env::var("SCENARIO_GPU").as_deref() == Ok("1") {
                let res = raft::DeviceResources::new().expect("resources");
                let busy = res.clone();
                // A job keeps the stream busy for `secs`; dropping the last handle queues the
                // release behind it on the release thread.
                let _job = busy.spawn(move || std::thread::sleep(Duration::from_secs_f64(secs))).expect("spawn");
                drop(busy);
                drop(res);
            } else {
                let token = raft_exit::ReleaseToken::register(raft_exit::Label { what: "release", id: 1, device: None });
                std::thread::spawn(move || {
                    raft_exit::mark_library_thread();
                    std::thread::sleep(Duration::from_secs_f64(secs));
                    println!("RESULT release=finished");
                    drop(token);
                });
            }
        }
        // Many resources alive at exit: the teardown releases them all.
        "many-resources" => {
            let n = env_f64("SCENARIO_COUNT", 200.0) as usize;
            let all: Vec<_> = (0..n).map(|_| raft::DeviceResources::new().expect("resources")).collect();
            for r in &all {
                let _ = r.spawn(|| ()).expect("spawn").join();
            }
            println!("RESULT alive={}", raft::stats().unreleased_resources);
            std::mem::forget(all); // still alive when main returns
        }
        // 2.2.3: the first resources on a device install the async pool.
        "mr-default" => {
            let before = mr(0);
            let _r = raft::DeviceResources::new().expect("resources");
            println!("RESULT before={before} after={} installed={}", mr(0), raft::installed_default(0));
        }
        // A user's resource installed beforehand is left alone.
        "mr-user-before" => {
            raft::set_memory_resource(0, raft::MemoryResourceKind::Managed).expect("set");
            let _r = raft::DeviceResources::new().expect("resources");
            println!("RESULT after={} installed={}", mr(0), raft::installed_default(0));
        }
        // A plain cuda_memory_resource installed beforehand equals the default and is replaced.
        "mr-cuda-before" => {
            raft::set_memory_resource(0, raft::MemoryResourceKind::Cuda).expect("set");
            let _r = raft::DeviceResources::new().expect("resources");
            println!("RESULT after={} installed={}", mr(0), raft::installed_default(0));
        }
        // A resource installed after the first resources is left alone by later ones.
        "mr-user-after" => {
            let _a = raft::DeviceResources::new().expect("resources");
            raft::set_memory_resource(0, raft::MemoryResourceKind::Managed).expect("set");
            let _b = raft::DeviceResources::new().expect("resources");
            println!("RESULT after={}", mr(0));
        }
        // Array drops: the pool frees inline, cudaFree goes to a release thread.
        "array-frees" => {
            let r = raft::DeviceResources::new().expect("resources");
            let pooled = raft::DeviceVec::<u8>::zeros(&r, 1 << 20).expect("array");
            let before = raft::stats().releases_done;
            drop(pooled);
            let inline = raft::stats().releases_done == before && raft::stats().releases_pending == 0;
            raft::set_memory_resource(0, raft::MemoryResourceKind::Cuda).expect("set");
            let blocking = raft::DeviceVec::<u8>::zeros(&r, 1 << 20).expect("array");
            drop(blocking);
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while raft::stats().releases_done == before && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            println!(
                "RESULT pool_inline={inline} cuda_on_release_thread={} live_arrays={}",
                raft::stats().releases_done > before,
                raft::stats().live_arrays
            );
        }
        // An array whose free blocks, dropped as main returns: the exit waits for its release.
        "array-drop-at-exit" => {
            let r = raft::DeviceResources::new().expect("resources");
            raft::set_memory_resource(0, raft::MemoryResourceKind::Cuda).expect("set");
            let arrays: Vec<_> = (0..64).map(|_| raft::DeviceVec::<f32>::zeros(&r, 1 << 20).expect("array")).collect();
            drop(arrays); // 64 releases queued as main returns
        }
        // Resources made and used, nothing in flight when main returns.
        "idle-resources" => {
            let r = raft::DeviceResources::new().expect("resources");
            r.spawn(|| ()).expect("spawn").join().expect("join");
        }
        // Several GPUs: a user's resource on the last device is left alone while device 0's
        // default is replaced.
        "mr-two-devices" => {
            let last = raft::device_count().expect("count") - 1;
            raft::set_memory_resource(last, raft::MemoryResourceKind::Managed).expect("set");
            let _all: Vec<_> = (0..=last).map(|d| raft::DeviceResources::on_device(d).expect("resources")).collect();
            println!("RESULT d0={} dlast={} last={last}", mr(0), mr(last));
        }
        // A GPU job in flight on every device when main returns.
        "jobs-every-device" => {
            let until = std::time::Instant::now() + Duration::from_secs_f64(secs);
            let handles: Vec<_> = (0..raft::device_count().expect("count"))
                .map(|d| {
                    let r = raft::DeviceResources::on_device(d).expect("resources");
                    let rr = r.clone();
                    r.spawn(move || {
                        let mut v = raft::DeviceVec::<f32>::zeros(&rr, 1 << 20).expect("array");
                        while std::time::Instant::now() < until {
                            v.fill_zero().expect("memset");
                            rr.sync().expect("sync");
                        }
                        println!("RESULT job_on_{d}=finished");
                    })
                    .expect("spawn")
                })
                .collect();
            drop(handles);
        }
        // Nothing that makes a job or a release: no exit hook.
        "no-jobs" => {
            let _ = raft::device_count();
            println!("RESULT abi={} hook={}", raft::abi().raft, raft_exit::hook_registered());
        }
        // The exit wait as read on the main thread (RAFT_EXIT_WAIT at first use).
        "read-wait" => match raft::exit::current_exit_wait() {
            Ok(v) => println!("RESULT wait={v}"),
            Err(e) => println!("ERROR {}", raft::Error::from(e)),
        },
        other => {
            eprintln!("unknown scenario {other:?}");
            std::process::exit(2);
        }
    }
    println!("RESULT main_end_ms={}", now_ms());
}
