//! `raft-run`: starts N copies of a program on this host as the ranks of one job, in torchrun's
//! manner, and reports their outcome as its own.
//!
//! ```text
//! raft-run -n 2 ./prog args…
//! raft-run --nproc-per-node 2 --master-port 29500 --keep-going -- python3 script.py
//! ```
//!
//! Each child gets `RANK` = `LOCAL_RANK` = its index, `WORLD_SIZE` = `LOCAL_WORLD_SIZE` = N,
//! `MASTER_ADDR` (default 127.0.0.1; an address of this host), `MASTER_PORT` (default: a port
//! free when raft-run looked), `RAFT_COMMS_SECRET` (a fresh random secret for this job, unless
//! already set: the rendezvous admits only processes holding it, so a process that takes the port
//! first is refused by the ranks instead of handed the job), `RAFT_COMMS_JOB` (a fresh id for
//! every job, whatever the environment says: bound into the rendezvous's proofs, it keeps apart
//! jobs given the same secret), and always
//! `NCCL_NVLS_ENABLE=0`, `TORCH_SYMM_MEM_DISABLE_MULTICAST=1`, `NVSHMEM_DISABLE_NVLS=1` (NVLink
//! multicast stays off: on shared hosts it can take the GPUs out of service). `CUDA_VISIBLE_DEVICES`
//! is left as it is: each rank picks its GPU from `LOCAL_RANK`.
//!
//! When a child fails (a non-zero status or a signal), the others are stopped (SIGTERM, then
//! SIGKILL after a grace period, `RAFT_RUN_GRACE` seconds, default 5) unless `--keep-going`;
//! `raft-run` then exits with the first failure's status (128 + the signal for a signal). A
//! SIGINT, SIGTERM or SIGHUP to `raft-run` is passed on to the children. Each child leads its own
//! process group (signals reach what it started too) and is killed if `raft-run` dies (even of
//! SIGKILL: the parent-death signal).
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitCode, ExitStatus};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

const USAGE: &str = "usage: raft-run -n N [--master-addr ADDR] [--master-port PORT] [--keep-going] [--] PROGRAM [ARGS...]";

/// The variables that keep NVLink multicast off, set in every child whatever the environment.
const ALWAYS: &[(&str, &str)] = &[("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")];

/// The signal raft-run received (0: none); written by the handler, read by the main loop.
static SIGNALLED: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(signal: libc::c_int) {
    SIGNALLED.store(signal, Ordering::SeqCst);
}

#[derive(Debug)]
struct Options {
    n: usize,
    addr: String,
    port: Option<u16>,
    keep_going: bool,
    program: String,
    args: Vec<String>,
}

fn parse(args: Vec<String>) -> Result<Options, String> {
    let mut it = args.into_iter().peekable();
    let (mut n, mut addr, mut port, mut keep_going) = (None, "127.0.0.1".to_string(), None, false);
    let value = |it: &mut std::iter::Peekable<std::vec::IntoIter<String>>, flag: &str| it.next().ok_or(format!("{flag} needs a value"));
    while let Some(a) = it.peek().cloned() {
        if !a.starts_with('-') {
            break;
        }
        it.next();
        match a.as_str() {
            "--" => break,
            "-n" | "--nproc-per-node" | "--nproc_per_node" => {
                let v = value(&mut it, &a)?;
                let count = v.parse::<usize>().ok().filter(|&n| n > 0).ok_or(format!("{a} {v}: expected a positive number"))?;
                // NCCL's rank count is an `int`.
                if count > i32::MAX as usize {
                    return Err(format!("{a} {v}: at most {} ranks", i32::MAX));
                }
                n = Some(count);
            }
            "--master-addr" | "--master_addr" => addr = value(&mut it, &a)?,
            "--master-port" | "--master_port" => {
                let v = value(&mut it, &a)?;
                port = Some(v.parse::<u16>().map_err(|_| format!("{a} {v}: expected a port number"))?);
            }
            "--keep-going" => keep_going = true,
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown option {other}\n{USAGE}")),
        }
    }
    let program = it.next().ok_or(format!("no program given\n{USAGE}"))?;
    let n = n.ok_or(format!("-n N is required\n{USAGE}"))?;
    Ok(Options { n, addr, port, keep_going, program, args: it.collect() })
}

/// A port nobody listens on now (the OS's pick), for rank 0's rendezvous. Another process may
/// take it before rank 0 listens: the job then fails (rank 0 cannot bind, or the ranks refuse a
/// listener without the job's secret), it is never handed to that process. Keeping the port
/// bound here instead would shut out the ranks' own listeners (torch's store binds
/// `MASTER_PORT`).
fn free_port(addr: &str) -> Result<u16, String> {
    let listener = std::net::TcpListener::bind((addr, 0))
        .map_err(|e| format!("no free port on {addr} to offer as MASTER_PORT (is it an address of this host?): {e}"))?;
    listener.local_addr().map(|a| a.port()).map_err(|e| e.to_string())
}

/// `RAFT_RUN_GRACE`: seconds, 0 or more (default 5).
fn grace_from(text: Option<String>) -> Result<Duration, String> {
    match text.filter(|t| !t.trim().is_empty()) {
        None => Ok(Duration::from_secs(5)),
        Some(t) => t
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|g| *g >= 0.0)
            .and_then(|g| Duration::try_from_secs_f64(g).ok())
            .ok_or(format!("RAFT_RUN_GRACE={t}: expected a number of seconds, 0 or more")),
    }
}

/// The job's rendezvous secret: the one given in `RAFT_COMMS_SECRET`, else a fresh one.
fn job_secret() -> Result<String, String> {
    match raft_comms::Secret::from_env().map_err(|e| e.to_string())? {
        Some(s) => Ok(s.to_env_value()),
        None => raft_comms::Secret::generate().map(|s| s.to_env_value()).map_err(|e| e.to_string()),
    }
}

/// A fresh id for this job (random, not secret): ranks of another job given the same secret
/// refuse this job's and the other way round.
fn job_id() -> Result<String, String> {
    use std::io::Read;
    let mut raw = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut raw))
        .map_err(|e| format!("no random bytes for the job's id (/dev/urandom): {e}"))?;
    Ok(raw.iter().map(|b| format!("{b:02x}")).collect())
}

/// The status a shell would report: the exit code, or 128 + the signal.
fn code_of(status: ExitStatus) -> i32 {
    status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exited with status {c}"),
        (None, Some(s)) => format!("was killed by signal {s}"),
        _ => format!("ended ({status})"),
    }
}

/// Signals a child's process group (the child and what it started).
fn signal(child: &Child, sig: libc::c_int) {
    if let Ok(pid) = libc::pid_t::try_from(child.id()) {
        // SAFETY: killpg takes a process group id and a signal number, no pointers; the group is
        // our own child's (it leads it, not yet reaped: reaped children leave `running` first).
        unsafe { libc::killpg(pid, sig) };
    }
}

/// Stops the running children: `sig`, then SIGKILL to those still there after the grace period.
fn stop(running: &mut [(usize, Child)], sig: libc::c_int, grace: Duration) {
    for (_, c) in running.iter() {
        signal(c, sig);
    }
    let now = Instant::now();
    let until = now.checked_add(grace).unwrap_or(now + Duration::from_secs(1 << 32));
    while Instant::now() < until && running.iter_mut().any(|(_, c)| matches!(c.try_wait(), Ok(None))) {
        std::thread::sleep(Duration::from_millis(10));
    }
    for (rank, c) in running.iter_mut() {
        if matches!(c.try_wait(), Ok(None)) {
            eprintln!("raft-run: rank {rank} (pid {}) did not stop within {:.1} s: killing it", c.id(), grace.as_secs_f64());
            signal(c, libc::SIGKILL);
            let _ = c.kill();
        }
        let _ = c.wait();
    }
}

fn run(o: Options) -> Result<i32, String> {
    let port = match o.port {
        Some(p) => p,
        None => free_port(&o.addr)?,
    };
    let grace = grace_from(std::env::var("RAFT_RUN_GRACE").ok())?;
    let (secret, job) = (job_secret()?, job_id()?);
    // SAFETY: getpid takes nothing and cannot fail.
    let parent = unsafe { libc::getpid() };
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only stores into an atomic (async-signal-safe); `signal` takes no
        // pointer of ours besides the handler's address.
        unsafe { libc::signal(sig, on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t) };
    }
    let mut running: Vec<(usize, Child)> = Vec::with_capacity(o.n);
    for rank in 0..o.n {
        let mut cmd = Command::new(&o.program);
        cmd.args(&o.args)
            .env("RANK", rank.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("WORLD_SIZE", o.n.to_string())
            .env("LOCAL_WORLD_SIZE", o.n.to_string())
            .env("GROUP_RANK", "0")
            .env("MASTER_ADDR", &o.addr)
            .env("MASTER_PORT", port.to_string())
            .env(raft_comms::SECRET_VAR, &secret)
            .env(raft_comms::JOB_VAR, &job)
            .process_group(0);
        for (k, v) in ALWAYS {
            cmd.env(k, v);
        }
        // SAFETY: runs in the child between fork and exec, calling only async-signal-safe
        // functions (prctl, getppid, _exit) and touching no memory of the parent's but a copied
        // integer.
        unsafe {
            cmd.pre_exec(move || {
                // Dies with raft-run, whatever kills it; a raft-run already gone before this
                // line (the child was reparented) is seen by the parent check.
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::getppid() != parent {
                    libc::_exit(128 + libc::SIGKILL);
                }
                Ok(())
            })
        };
        match cmd.spawn() {
            Ok(child) => running.push((rank, child)),
            Err(e) => {
                stop(&mut running, libc::SIGTERM, grace);
                return Err(format!("could not start rank {rank} ({}): {e}", o.program));
            }
        }
    }
    let mut first_failure: Option<i32> = None;
    while !running.is_empty() {
        let sig = SIGNALLED.load(Ordering::SeqCst);
        if sig != 0 {
            eprintln!("raft-run: received signal {sig}: stopping {} rank(s)", running.len());
            stop(&mut running, sig, grace);
            return Ok(128 + sig);
        }
        let mut i = 0;
        let mut failed_now = false;
        while i < running.len() {
            match running[i].1.try_wait() {
                Ok(None) => i += 1,
                Ok(Some(status)) => {
                    let (rank, child) = running.remove(i);
                    if !status.success() {
                        eprintln!("raft-run: rank {rank} (pid {}) {}", child.id(), describe(status));
                        if first_failure.is_none() {
                            first_failure = Some(code_of(status));
                            failed_now = true;
                        }
                    }
                }
                Err(e) => {
                    let rank = running[i].0;
                    stop(&mut running, libc::SIGTERM, grace);
                    return Err(format!("waiting for rank {rank}: {e} (every rank was stopped)"));
                }
            }
        }
        if failed_now && !o.keep_going && !running.is_empty() {
            eprintln!("raft-run: stopping the other {} rank(s)", running.len());
            stop(&mut running, libc::SIGTERM, grace);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(first_failure.unwrap_or(0))
}

fn main() -> ExitCode {
    let outcome = parse(std::env::args().skip(1).collect()).and_then(run);
    match outcome {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(message) => {
            eprintln!("raft-run: {message}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn parses_torchrun_like_options() {
        let o = parse(args("-n 2 --master-port 29500 --keep-going -- ./prog -x y")).unwrap();
        assert_eq!((o.n, o.port, o.keep_going, o.addr.as_str()), (2, Some(29500), true, "127.0.0.1"));
        assert_eq!((o.program.as_str(), o.args), ("./prog", vec!["-x".to_string(), "y".to_string()]));
        let o = parse(args("--nproc_per_node 4 python3 s.py --lr 1")).unwrap();
        assert_eq!((o.n, o.program.as_str(), o.args.len()), (4, "python3", 3));
    }

    #[test]
    fn grace_is_seconds_and_never_a_panic() {
        assert_eq!(grace_from(None).unwrap(), Duration::from_secs(5));
        assert_eq!(grace_from(Some("0.5".into())).unwrap(), Duration::from_millis(500));
        for bad in ["1e20", "-1", "inf", "NaN", "soon"] {
            assert!(grace_from(Some(bad.into())).unwrap_err().contains("RAFT_RUN_GRACE"), "{bad}");
        }
        // The longest grace representable does not overflow the deadline either.
        stop(&mut [], libc::SIGTERM, Duration::MAX);
    }

    #[test]
    fn refuses_what_it_cannot_run() {
        assert!(parse(args("./prog")).unwrap_err().contains("-n N is required"));
        assert!(parse(args("-n 0 ./prog")).unwrap_err().contains("positive"));
        assert!(parse(args("-n 2")).unwrap_err().contains("no program"));
        assert!(parse(args("-n 2147483648 ./prog")).unwrap_err().contains("2147483647"), "a world NCCL cannot hold");
        assert!(parse(args("-n 2 --bogus ./prog")).unwrap_err().contains("unknown option --bogus"));
    }
}
