//! `raft-run` with dummy children (this test binary, re-run as the child program): the
//! environment each rank gets, and the forwarding of statuses and signals. CPU only.
mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const ROLE: &str = "RAFT_RUN_TEST_ROLE";
const DIR: &str = "RAFT_RUN_TEST_DIR";

/// The child's side: acts out its role, then ends the process.
fn act(role: &str) -> ! {
    let rank: usize = std::env::var("RANK").unwrap().parse().unwrap();
    let dir = PathBuf::from(std::env::var(DIR).unwrap_or_else(|_| ".".into()));
    let pid_file = || std::fs::write(dir.join(format!("pid-{rank}")), std::process::id().to_string()).unwrap();
    match role {
        "env" => {
            let v = |k: &str| std::env::var(k).unwrap_or_else(|_| "-".into());
            println!(
                "RAFT_RUN_ENV {} {} {} {} {} {} {} {} {}",
                v("RANK"),
                v("WORLD_SIZE"),
                v("LOCAL_RANK"),
                v("LOCAL_WORLD_SIZE"),
                v("MASTER_ADDR"),
                v("MASTER_PORT"),
                v("NCCL_NVLS_ENABLE"),
                v("TORCH_SYMM_MEM_DISABLE_MULTICAST"),
                v("CUDA_VISIBLE_DEVICES")
            );
            std::process::exit(0)
        }
        "fail" if rank == 1 => {
            std::thread::sleep(Duration::from_millis(200));
            std::process::exit(7)
        }
        "keep" if rank == 1 => std::process::exit(3),
        "keep" => {
            std::thread::sleep(Duration::from_millis(500));
            std::fs::write(dir.join("rank0-done"), "").unwrap();
            std::process::exit(0)
        }
        "signal" if rank == 0 => {
            std::thread::sleep(Duration::from_millis(100));
            // SAFETY: raise takes a signal number; SIGKILL ends this child process at once.
            unsafe { libc::raise(libc::SIGKILL) };
            unreachable!()
        }
        _ => {
            // Sleeps until raft-run stops it.
            pid_file();
            std::thread::sleep(Duration::from_secs(60));
            std::process::exit(0)
        }
    }
}

/// `raft-run -n N [options] <this binary> <test> --exact` with the child's role.
fn launch(n: usize, options: &[&str], test: &str, role: &str, dir: &Path) -> Command {
    let mut cmd = Command::new(common::raft_run());
    cmd.arg("-n").arg(n.to_string()).args(options).arg(std::env::current_exe().unwrap());
    cmd.args([test, "--exact", "--nocapture", "--test-threads=1"]).env(ROLE, role).env(DIR, dir).env("RAFT_RUN_GRACE", "2");
    cmd
}

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("raft-run-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn alive(pid: &str) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

fn show(out: &Output) -> String {
    format!("status {:?}\nstdout:\n{}\nstderr:\n{}", out.status, String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

#[test]
fn every_rank_gets_the_torchrun_environment_with_multicast_off() {
    if let Ok(role) = std::env::var(ROLE) {
        act(&role);
    }
    let dir = temp_dir("env");
    let out = launch(3, &[], "every_rank_gets_the_torchrun_environment_with_multicast_off", "env", &dir)
        .env("NCCL_NVLS_ENABLE", "1") // raft-run overrides it
        .env("CUDA_VISIBLE_DEVICES", "7,3") // and leaves this alone
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", show(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut lines: Vec<Vec<String>> = stdout
        .lines()
        // The harness prints "test … ... " on the same line before the child's output.
        .filter_map(|l| l.find("RAFT_RUN_ENV ").map(|i| &l[i + "RAFT_RUN_ENV ".len()..]))
        .map(|l| l.split(' ').map(String::from).collect())
        .collect();
    lines.sort();
    assert_eq!(lines.len(), 3, "{}", show(&out));
    let port = &lines[0][5];
    assert!(port.parse::<u16>().unwrap() > 0);
    for (rank, f) in lines.iter().enumerate() {
        let r = rank.to_string();
        assert_eq!(f, &[&r, "3", &r, "3", "127.0.0.1", port, "0", "1", "7,3"], "rank {rank}");
    }
}

#[test]
fn a_failing_rank_stops_the_others_and_its_status_is_raft_runs() {
    if let Ok(role) = std::env::var(ROLE) {
        act(&role);
    }
    let dir = temp_dir("fail");
    let start = Instant::now();
    let out = launch(3, &[], "a_failing_rank_stops_the_others_and_its_status_is_raft_runs", "fail", &dir).output().unwrap();
    let took = start.elapsed();
    assert_eq!(out.status.code(), Some(7), "{}", show(&out));
    assert!(took < Duration::from_secs(20), "took {took:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("rank 1") && stderr.contains("exited with status 7"), "{}", show(&out));
    for rank in [0, 2] {
        let pid = std::fs::read_to_string(dir.join(format!("pid-{rank}"))).unwrap();
        assert!(!alive(&pid), "rank {rank} (pid {pid}) still runs");
    }
}

#[test]
fn keep_going_waits_for_every_rank_and_reports_the_first_failure() {
    if let Ok(role) = std::env::var(ROLE) {
        act(&role);
    }
    let dir = temp_dir("keep");
    let out = launch(2, &["--keep-going"], "keep_going_waits_for_every_rank_and_reports_the_first_failure", "keep", &dir).output().unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", show(&out));
    assert!(dir.join("rank0-done").exists(), "rank 0 was not left to finish: {}", show(&out));
}

#[test]
fn a_rank_killed_by_a_signal_is_reported_as_128_plus_it() {
    if let Ok(role) = std::env::var(ROLE) {
        act(&role);
    }
    let dir = temp_dir("signal");
    let out = launch(2, &[], "a_rank_killed_by_a_signal_is_reported_as_128_plus_it", "signal", &dir).output().unwrap();
    assert_eq!(out.status.code(), Some(128 + libc::SIGKILL), "{}", show(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("killed by signal 9"), "{}", show(&out));
    let pid = std::fs::read_to_string(dir.join("pid-1")).unwrap();
    assert!(!alive(&pid), "rank 1 still runs");
}

#[test]
fn a_sigterm_to_raft_run_reaches_the_ranks() {
    if let Ok(role) = std::env::var(ROLE) {
        act(&role);
    }
    let dir = temp_dir("term");
    let mut child = launch(2, &[], "a_sigterm_to_raft_run_reaches_the_ranks", "sleep", &dir).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !(dir.join("pid-0").exists() && dir.join("pid-1").exists()) {
        assert!(Instant::now() < deadline, "the ranks did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: kill takes a pid (our own child, not yet reaped) and a signal number.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(128 + libc::SIGTERM));
    for rank in 0..2 {
        let pid = std::fs::read_to_string(dir.join(format!("pid-{rank}"))).unwrap();
        assert!(!alive(&pid), "rank {rank} still runs");
    }
}

#[test]
fn bad_usage_is_status_2_with_the_usage() {
    let out = Command::new(common::raft_run()).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("usage: raft-run"), "{}", show(&out));
    let out = Command::new(common::raft_run()).args(["-n", "1", "/nonexistent/program"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("could not start rank 0"), "{}", show(&out));
}
