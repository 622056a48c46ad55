//! `raft-run` with dummy children (this test binary, re-run as the child program): the
//! environment each rank gets, and the forwarding of statuses and signals. CPU only.
mod common;

use std::os::unix::process::ExitStatusExt;
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
                "RAFT_RUN_ENV {} {} {} {} {} {} {} {} {} {} {} {} {}",
                v("RANK"),
                v("WORLD_SIZE"),
                v("LOCAL_RANK"),
                v("LOCAL_WORLD_SIZE"),
                v("MASTER_ADDR"),
                v("MASTER_PORT"),
                v("NCCL_NVLS_ENABLE"),
                v("TORCH_SYMM_MEM_DISABLE_MULTICAST"),
                v("CUDA_VISIBLE_DEVICES"),
                v("RAFT_COMMS_SECRET"),
                v("RAFT_COMMS_JOB"),
                v("RAFT_COMMS_PORT"),
                v("TORCHELASTIC_USE_AGENT_STORE")
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
        // A rank that starts a process of its own (a wrapper script's program), then sleeps; with
        // "helper-fails", rank 1 starts one that ignores SIGTERM and fails at once.
        "grandchild" | "helper-fails" => {
            let fails = role == "helper-fails" && rank == 1;
            // Without raft-run's pipes: a holder of them would keep the test's `output()` waiting.
            let mut helper = if fails {
                let mut c = std::process::Command::new("sh");
                c.args(["-c", "trap '' TERM; exec sleep 60"]);
                c
            } else {
                let mut c = std::process::Command::new("sleep");
                c.arg("60");
                c
            };
            let null = std::process::Stdio::null;
            let helper = helper.stdin(null()).stdout(null()).stderr(null()).spawn().unwrap();
            std::fs::write(dir.join(format!("helper-{rank}")), helper.id().to_string()).unwrap();
            std::mem::forget(helper);
            if fails {
                std::thread::sleep(Duration::from_millis(200)); // the trap is set by then
                std::process::exit(3);
            }
            pid_file();
            std::thread::sleep(Duration::from_secs(60));
            std::process::exit(0)
        }
        "ignore-term" => {
            // SAFETY: sets a disposition of this child process; no memory.
            unsafe { libc::signal(libc::SIGTERM, libc::SIG_IGN) };
            // SAFETY: as above.
            unsafe { libc::signal(libc::SIGINT, libc::SIG_IGN) };
            pid_file();
            std::thread::sleep(Duration::from_secs(60));
            std::process::exit(0)
        }
        "read-stdin" => {
            // Reads its standard input to the end: a terminal's, when raft-run passed it on,
            // stops this background process for good (SIGTTIN).
            let mut all = Vec::new();
            let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut all);
            std::process::exit(0)
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

/// Whether the process runs (a zombie waiting for a reaper does not).
fn alive(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{}/stat", pid.trim()))
        .is_ok_and(|stat| stat.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z')))
}

/// The job's secret each rank was given, from a run of the "env" role.
fn env_lines(out: &Output) -> Vec<Vec<String>> {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut lines: Vec<Vec<String>> = stdout
        .lines()
        // The harness prints "test … ... " on the same line before the child's output.
        .filter_map(|l| l.find("RAFT_RUN_ENV ").map(|i| &l[i + "RAFT_RUN_ENV ".len()..]))
        .map(|l| l.split(' ').map(String::from).collect())
        .collect();
    lines.sort();
    lines
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
        .env("RAFT_COMMS_PORT", "22") // stale: the rendezvous is raft-run's MASTER_PORT
        .env("TORCHELASTIC_USE_AGENT_STORE", "True")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", show(&out));
    let lines = env_lines(&out);
    assert_eq!(lines.len(), 3, "{}", show(&out));
    let (port, secret, job) = (&lines[0][5], &lines[0][9], &lines[0][10]);
    assert!(port.parse::<u16>().unwrap() > 0);
    for (rank, f) in lines.iter().enumerate() {
        let r = rank.to_string();
        assert_eq!(f, &[&r, "3", &r, "3", "127.0.0.1", port, "0", "1", "7,3", secret, job, "-", "-"], "rank {rank}");
    }
}

/// Every job gets its own rendezvous secret, the same in all its ranks (a rank of an earlier job
/// cannot join a later one); one given in the environment is kept (for ranks started elsewhere).
#[test]
fn every_job_gets_its_own_secret() {
    if let Ok(role) = std::env::var(ROLE) {
        act(&role);
    }
    let dir = temp_dir("secret");
    let run = |given: Option<&str>| {
        let mut cmd = launch(2, &[], "every_job_gets_its_own_secret", "env", &dir);
        match given {
            Some(s) => cmd.env("RAFT_COMMS_SECRET", s),
            None => cmd.env_remove("RAFT_COMMS_SECRET"),
        };
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{}", show(&out));
        let secrets: Vec<String> = env_lines(&out).iter().map(|l| l[9].clone()).collect();
        assert_eq!(secrets.len(), 2, "{}", show(&out));
        assert_eq!(secrets[0], secrets[1], "the ranks of one job share its secret");
        secrets[0].clone()
    };
    let (a, b) = (run(None), run(None));
    assert!(a.len() >= raft_comms::MIN_SECRET_BYTES && a != "-", "{a}");
    assert_ne!(a, b, "two jobs were given the same secret");
    assert_eq!(run(Some("given-by-the-user-0123456789abcdef0123456789")), "given-by-the-user-0123456789abcdef0123456789");
}

/// Two jobs given the same secret (exported once in a shell, say) still get distinct job ids,
/// which every tag of the rendezvous binds: a leftover rank of the first cannot join the second.
/// (Both were told only the secret, and admitted each other.)
#[test]
fn jobs_sharing_a_secret_get_distinct_job_ids() {
    if let Ok(role) = std::env::var(ROLE) {
        act(&role);
    }
    let dir = temp_dir("job");
    let run = || {
        let out = launch(2, &[], "jobs_sharing_a_secret_get_distinct_job_ids", "env", &dir)
            .env("RAFT_COMMS_SECRET", "one-secret-for-every-job-0123456789abcdef")
            .env("RAFT_COMMS_JOB", "set-by-hand")
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", show(&out));
        let jobs: Vec<String> = env_lines(&out).iter().map(|l| l[10].clone()).collect();
        assert_eq!(jobs.len(), 2, "{}", show(&out));
        assert_eq!(jobs[0], jobs[1], "the ranks of one job share its id");
        jobs[0].clone()
    };
    let (a, b) = (run(), run());
    assert!(a.len() >= 16 && a != "-" && a != "set-by-hand", "{a}");
    assert_ne!(a, b, "two jobs were given the same job id");
}

/// raft-run killed outright (no handler runs): its ranks die with it instead of running on.
#[test]
fn ranks_die_with_a_killed_raft_run() {
    if let Ok(role) = std::env::var(ROLE) {
        act(&role);
    }
    let dir = temp_dir("sigkill");
    let mut child = launch(2, &[], "ranks_die_with_a_killed_raft_run", "sleep", &dir).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !(dir.join("pid-0").exists() && dir.join("pid-1").exists()) {
        assert!(Instant::now() < deadline, "the ranks did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let pids: Vec<String> = (0..2).map(|r| std::fs::read_to_string(dir.join(format!("pid-{r}"))).unwrap()).collect();
    let until = Instant::now() + Duration::from_secs(2);
    while pids.iter().any(|p| alive(p)) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    let left: Vec<&String> = pids.iter().filter(|p| alive(p)).collect();
    for pid in &left {
        // Not left behind by the test either.
        // SAFETY: kill takes a pid and a signal number; the pid is an orphaned rank's.
        unsafe { libc::kill(pid.trim().parse().unwrap(), libc::SIGKILL) };
    }
    assert!(left.is_empty(), "rank(s) with pid {left:?} still run 2 s after raft-run was killed");
}

#[test]
fn an_unusable_grace_or_address_is_refused_up_front() {
    let out = Command::new(common::raft_run()).args(["-n", "1", "true"]).env("RAFT_RUN_GRACE", "1e20").output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", show(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("RAFT_RUN_GRACE=1e20"), "{}", show(&out));
    let out = Command::new(common::raft_run()).args(["-n", "1", "--master-addr", "192.0.2.1", "true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", show(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no free port on 192.0.2.1"), "{}", show(&out));
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
    // raft-run ends by the signal it passed on, as its ranks did (a shell sees 128 + 15).
    assert_eq!((status.code(), status.signal()), (None, Some(libc::SIGTERM)), "{status:?}");
    for rank in 0..2 {
        let pid = std::fs::read_to_string(dir.join(format!("pid-{rank}"))).unwrap();
        assert!(!alive(&pid), "rank {rank} still runs");
    }
}

/// The state letter of a process (`/proc/PID/stat`'s third field: `T` for stopped), or `X` when
/// it is gone.
fn state_of(pid: &str) -> char {
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid.trim())).unwrap_or_default();
    stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next()).unwrap_or('X')
}

/// Whether every pid reaches (`stopped`) or leaves the stopped state within 5 s.
fn all_become(pids: &[String], stopped: bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if pids.iter().all(|p| (state_of(p) == 'T') == stopped) {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Helper 91 (the nineteenth audit, left open then): the ranks are not in the terminal's
/// foreground group, so a Ctrl-Z stopped `raft-run` alone and the ranks ran on. Now they stop
/// with it and go on when it is continued. (`raft-run` leads a group of its own here, with this
/// test, its parent, outside it: a stop is then not discarded as in an orphaned group.)
#[test]
fn a_sigtstp_stops_the_ranks_with_raft_run_and_a_sigcont_continues_them() {
    if let Ok(role) = std::env::var(ROLE) {
        act(&role);
    }
    let dir = temp_dir("tstp");
    let test = "a_sigtstp_stops_the_ranks_with_raft_run_and_a_sigcont_continues_them";
    let mut cmd = launch(2, &[], test, "sleep", &dir);
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child = cmd.spawn().unwrap();
    wait_for(&dir, &["pid-0", "pid-1"]);
    let me = child.id().to_string();
    let ranks: Vec<String> = (0..2).map(|r| std::fs::read_to_string(dir.join(format!("pid-{r}"))).unwrap()).collect();
    let signal = |sig| {
        // SAFETY: kill takes a pid (our own child, not yet reaped) and a signal number.
        unsafe { libc::kill(child.id() as libc::pid_t, sig) };
    };
    signal(libc::SIGTSTP);
    let stopped = all_become(std::slice::from_ref(&me), true) && all_become(&ranks, true);
    let states = |ranks: &[String]| ranks.iter().map(|p| state_of(p)).collect::<String>();
    let (at_stop, raft_run_at_stop) = (states(&ranks), state_of(&me));
    signal(libc::SIGCONT);
    let continued = all_become(std::slice::from_ref(&me), false) && all_become(&ranks, false);
    let at_cont = states(&ranks);
    signal(libc::SIGTERM);
    let status = child.wait().unwrap();
    let left: Vec<String> = ranks.iter().filter(|p| alive(p)).cloned().collect();
    for p in &left {
        // SAFETY: as above, a rank this test started.
        unsafe { libc::kill(p.trim().parse().unwrap(), libc::SIGKILL) };
    }
    assert!(stopped, "after SIGTSTP: raft-run {raft_run_at_stop}, ranks {at_stop} (T: stopped)");
    assert!(continued, "after SIGCONT: ranks {at_cont} (T: stopped)");
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?}");
    assert!(left.is_empty(), "ranks {left:?} outlived raft-run");
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

/// Waits until `files` exist in `dir` (the ranks wrote them), or fails after 20 s.
fn wait_for(dir: &Path, files: &[&str]) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !files.iter().all(|f| dir.join(f).exists()) {
        assert!(Instant::now() < deadline, "{files:?} never appeared in {}", dir.display());
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(50)); // the writes are whole
}

/// Whether the pid written in `file` still runs within `limit`, killing it if so (nothing of the
/// test is left behind).
fn still_runs_after(file: &Path, limit: Duration) -> Option<String> {
    let pid = std::fs::read_to_string(file).unwrap();
    let until = Instant::now() + limit;
    while alive(&pid) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    alive(&pid).then(|| {
        // SAFETY: kill takes a pid and a signal number; the pid is a process this test started.
        unsafe { libc::kill(pid.trim().parse().unwrap(), libc::SIGKILL) };
        pid
    })
}

/// The nineteenth audit (helper 91): the parent-death signal reaches only the ranks, so what a
/// rank started (a wrapper script's program) ran on after `raft-run` was killed. Now the job's
/// guardian stops the job's whole process group when `raft-run` ends, however it ends.
#[test]
fn what_the_ranks_started_dies_with_a_killed_raft_run() {
    if let Ok(role) = std::env::var(ROLE) {
        act(&role);
    }
    let dir = temp_dir("grandchild");
    let mut child = launch(2, &[], "what_the_ranks_started_dies_with_a_killed_raft_run", "grandchild", &dir).spawn().unwrap();
    wait_for(&dir, &["pid-0", "pid-1", "helper-0", "helper-1"]);
    child.kill().unwrap();
    child.wait().unwrap();
    let left: Vec<(usize, String)> = (0..2)
        .filter_map(|rank| still_runs_after(&dir.join(format!("helper-{rank}")), Duration::from_secs(4)).map(|pid| (rank, pid)))
        .collect();
    assert!(left.is_empty(), "the ranks' own processes {left:?} (rank, pid) still ran after raft-run was killed");
}

/// The nineteenth audit (helper 91): a failed rank's own processes were never signalled (its
/// group was left once the rank was reaped), and nothing escalated past a SIGTERM they ignore.
/// Now `raft-run` returns only once the job's group is empty.
#[test]
fn the_processes_of_a_failed_rank_end_with_the_job_even_ignoring_sigterm() {
    if let Ok(role) = std::env::var(ROLE) {
        act(&role);
    }
    let dir = temp_dir("helper-fails");
    let test = "the_processes_of_a_failed_rank_end_with_the_job_even_ignoring_sigterm";
    let out = launch(2, &[], test, "helper-fails", &dir).output().unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", show(&out));
    // Every one looked at (and killed if left) before any assertion: nothing of the test lingers.
    let left: Vec<(&str, String)> = ["helper-0", "helper-1", "pid-0"]
        .into_iter()
        .filter_map(|file| still_runs_after(&dir.join(file), Duration::from_millis(200)).map(|pid| (file, pid)))
        .collect();
    assert!(left.is_empty(), "{left:?} still ran after raft-run returned: {}", show(&out));
}

/// The nineteenth audit (helper 91): every line `raft-run` wrote went through `eprintln!`,
/// which panics on a full or closed stderr: the failed rank's status became 101 and the other
/// ranks were killed without their grace. Its lines are now written or dropped.
#[test]
fn a_full_stderr_keeps_the_failed_rank_s_status() {
    if let Ok(role) = std::env::var(ROLE) {
        act(&role);
    }
    let dir = temp_dir("full-stderr");
    let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
        eprintln!("SKIP a_full_stderr_keeps_the_failed_rank_s_status: no /dev/full here");
        return;
    };
    let out = launch(3, &[], "a_full_stderr_keeps_the_failed_rank_s_status", "fail", &dir).stderr(full).output().unwrap();
    assert_eq!(out.status.code(), Some(7), "{}", show(&out));
}

/// The nineteenth audit (helper 91): `raft-run` installed its handlers over a SIGHUP it was
/// told to ignore (`nohup raft-run …`), so a hangup stopped the job. An ignored signal stays so.
#[test]
fn a_sighup_ignored_at_the_start_stays_ignored() {
    if let Ok(role) = std::env::var(ROLE) {
        act(&role);
    }
    let dir = temp_dir("nohup");
    let mut cmd = launch(1, &[], "a_sighup_ignored_at_the_start_stays_ignored", "sleep", &dir);
    // SAFETY: runs between fork and exec; sets a disposition (async-signal-safe), no memory.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            libc::signal(libc::SIGHUP, libc::SIG_IGN);
            Ok(())
        })
    };
    let mut child = cmd.spawn().unwrap();
    wait_for(&dir, &["pid-0"]);
    // SAFETY: kill takes a pid (our own child, not yet reaped) and a signal number.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGHUP) };
    std::thread::sleep(Duration::from_millis(300));
    let after_hup = child.try_wait().unwrap();
    let rank_runs = alive(&std::fs::read_to_string(dir.join("pid-0")).unwrap());
    // SAFETY: as above; ends the job.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let _ = child.wait();
    assert!(after_hup.is_none() && rank_runs, "an ignored SIGHUP stopped the job ({after_hup:?}, rank runs: {rank_runs})");
}

/// The nineteenth audit (helper 91): the ranks are not the terminal's foreground group, so a
/// rank reading a terminal it was given (`input()`, a debugger) was stopped (SIGTTIN) and
/// `raft-run` waited for ever. With a terminal for standard input the ranks now get
/// `/dev/null`. `raft-run` runs here with a new pseudo-terminal as its controlling terminal.
#[test]
fn a_rank_reading_the_terminal_does_not_hold_up_raft_run() {
    if let Ok(role) = std::env::var(ROLE) {
        act(&role);
    }
    let (mut leader, mut follower) = (0, 0);
    // SAFETY: writes two descriptors into locals; the name, settings and size are left null.
    let rc = unsafe { libc::openpty(&mut leader, &mut follower, std::ptr::null_mut(), std::ptr::null(), std::ptr::null()) };
    if rc != 0 {
        eprintln!(
            "SKIP a_rank_reading_the_terminal_does_not_hold_up_raft_run: no pseudo-terminal here ({})",
            std::io::Error::last_os_error()
        );
        return;
    }
    let dir = temp_dir("tty");
    let mut cmd = launch(1, &[], "a_rank_reading_the_terminal_does_not_hold_up_raft_run", "read-stdin", &dir);
    // SAFETY: the descriptor is open here and in the child, which takes it as its standard input.
    cmd.stdin(unsafe { <std::process::Stdio as std::os::fd::FromRawFd>::from_raw_fd(libc::dup(follower)) });
    // SAFETY: runs between fork and exec: a new session whose controlling terminal is the
    // pseudo-terminal on standard input (setsid and ioctl are async-signal-safe).
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    };
    let mut child = cmd.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null()).spawn().unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() > until {
            // SAFETY: kill takes a pid (our own child, not yet reaped) and a signal number; the
            // guardian then stops the job.
            unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGKILL) };
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // SAFETY: closes the two descriptors openpty gave.
    unsafe {
        libc::close(leader);
        libc::close(follower);
    }
    assert_eq!(status.and_then(|s| s.code()), Some(0), "raft-run did not end within 10 s (a rank stopped reading the terminal?)");
}

/// A second Ctrl-C while the ranks are being stopped kills them at once, rather than waiting out
/// the grace for a rank that ignores the first (helper 91: nothing escalated).
#[test]
fn a_second_interrupt_cuts_the_grace_short() {
    if let Ok(role) = std::env::var(ROLE) {
        act(&role);
    }
    let dir = temp_dir("second-int");
    let mut child =
        launch(1, &[], "a_second_interrupt_cuts_the_grace_short", "ignore-term", &dir).env("RAFT_RUN_GRACE", "60").spawn().unwrap();
    wait_for(&dir, &["pid-0"]);
    let start = Instant::now();
    for _ in 0..2 {
        // SAFETY: kill takes a pid (our own child, not yet reaped) and a signal number.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
        std::thread::sleep(Duration::from_secs(1)); // raft-run's loop has seen the first by then
    }
    let until = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() > until {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let left = still_runs_after(&dir.join("pid-0"), Duration::from_secs(1));
    assert!(status.is_some(), "raft-run still waited {:?} after the second interrupt", start.elapsed());
    assert!(left.is_none(), "the rank (pid {left:?}) still runs");
}

/// `raft-run` run through the dynamic loader re-executes the loader, not itself: no guardian, and
/// the job ran unguarded (the review, helper 92). Now no rank starts: status 2, saying why.
#[test]
fn a_raft_run_whose_guardian_cannot_start_starts_no_rank() {
    let loader = ["/lib64/ld-linux-x86-64.so.2", "/lib/ld-linux-aarch64.so.1"].into_iter().find(|l| Path::new(l).exists());
    let Some(loader) = loader else {
        eprintln!("SKIP a_raft_run_whose_guardian_cannot_start_starts_no_rank: no dynamic loader at a known path");
        return;
    };
    let out = Command::new(loader).arg(common::raft_run()).args(["-n", "1", "true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", show(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("guardian did not start"), "{}", show(&out));
}

/// A `raft-run` started with SIGTERM ignored handed that to its ranks, so stopping them after a
/// failure waited the whole grace for SIGKILL (the review, helper 92). The ranks get SIGTERM's
/// default.
#[test]
fn ranks_of_a_raft_run_started_with_sigterm_ignored_still_stop_on_it() {
    if let Ok(role) = std::env::var(ROLE) {
        act(&role);
    }
    let dir = temp_dir("term-ignored");
    let mut cmd = launch(2, &[], "ranks_of_a_raft_run_started_with_sigterm_ignored_still_stop_on_it", "fail", &dir);
    cmd.env("RAFT_RUN_GRACE", "30");
    // SAFETY: runs between fork and exec; sets a disposition (async-signal-safe), no memory.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            libc::signal(libc::SIGTERM, libc::SIG_IGN);
            Ok(())
        })
    };
    let start = Instant::now();
    let out = cmd.output().unwrap();
    let took = start.elapsed();
    assert_eq!(out.status.code(), Some(7), "{}", show(&out));
    assert!(took < Duration::from_secs(15), "the ranks waited {took:?} for SIGKILL: SIGTERM reached them ignored");
}

/// Arguments are bytes on Linux, not text: a file name in Latin-1 (`caf\xe9.csv`) is a
/// program's argument like any other. `raft-run` read its arguments as UTF-8 and panicked on
/// such a one (status 101, no rank started; helper 111); it passes them on as they are, the
/// program's own name too.
#[test]
fn arguments_that_are_not_utf8_reach_the_ranks_unchanged() {
    use std::os::unix::ffi::OsStrExt;
    let dir = temp_dir("bytes");
    let arg = std::ffi::OsStr::from_bytes(b"caf\xe9 \xff\xfe.csv");
    let out_file = dir.join("arg");
    // A script whose own name is not UTF-8 either.
    let script = dir.join(std::ffi::OsStr::from_bytes(b"prog-\xe9.sh"));
    std::fs::write(&script, "#!/bin/sh\nprintf '%s' \"$1\" > \"$2\"\n").unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let out = Command::new(common::raft_run()).args(["-n", "1"]).arg(&script).arg(arg).arg(&out_file).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    assert_eq!(std::fs::read(&out_file).unwrap(), arg.as_bytes(), "{}", show(&out));
    // An option that is not UTF-8 is refused by name (status 2), not a panic.
    let out = Command::new(common::raft_run())
        .arg(std::ffi::OsStr::from_bytes(b"--master-addr=\xff"))
        .args(["-n", "1", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", show(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("raft-run: "), "{}", show(&out));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `raft-run --guardian` is an internal mode: the guardian leads the job's process group, and
/// when its pipe closes it stops (SIGTERM, then SIGKILL) every process of its group. Typed by
/// hand (or by a script trying the options) it ran in its caller's group and killed the caller
/// with it: a shell script's whole job (helper 111). A guardian that does not lead its group
/// refuses to run. At a shell with job control every job leads a group of its own, so leading
/// one is not enough: a guardian typed there stopped the other members of its pipeline (the
/// review of the thirty-third session, helper 120). It runs only as raft-run's child, named by
/// raft-run, reading a pipe.
#[test]
fn a_guardian_started_by_hand_does_not_kill_its_callers_group() {
    use std::os::unix::process::CommandExt;
    let script = format!("'{}' --guardian 100 < /dev/null; echo SURVIVED $?", common::raft_run().display());
    // `sh` leads a group of its own (not the test harness's), raft-run runs inside it.
    let out = Command::new("sh").args(["-c", &script]).process_group(0).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("SURVIVED 2"), "the caller's group was stopped: {}", show(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--guardian"), "{}", show(&out));
    // As a job of a shell with job control: leading a group of its own, its input a pipe, but
    // not named by a raft-run. Before: it said it was ready ("R") and ran, then swept its group.
    let mut job = Command::new(common::raft_run())
        .args(["--guardian", "100"])
        .process_group(0)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(job.stdin.take());
    let out = job.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(2), "a guardian in a group of its own, not named: {}", show(&out));
    assert!(out.stdout.is_empty(), "it said it was ready: {}", show(&out));
}
