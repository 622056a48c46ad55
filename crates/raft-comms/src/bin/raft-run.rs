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
//! jobs given the same secret), no `RAFT_COMMS_PORT` or `TORCHELASTIC_USE_AGENT_STORE` (the
//! rendezvous is `MASTER_PORT`, the port raft-run checked free) and no outer launcher's
//! numbering (`OMPI_COMM_WORLD_*`, `PMI_RANK`, `PMI_SIZE`, `MPI_LOCALRANKID`), and always
//! `NCCL_NVLS_ENABLE=0`, `TORCH_SYMM_MEM_DISABLE_MULTICAST=1`, `NVSHMEM_DISABLE_NVLS=1` (NVLink
//! multicast stays off: on shared hosts it can take the GPUs out of service). `CUDA_VISIBLE_DEVICES`
//! is left as it is: each rank picks its GPU from `LOCAL_RANK`.
//!
//! When a child fails (a non-zero status or a signal), the others are stopped (SIGTERM, then
//! SIGKILL after a grace period, `RAFT_RUN_GRACE` seconds, default 5) unless `--keep-going`;
//! `raft-run` then exits with the first failure's status (128 + the signal for a signal). A
//! SIGINT, SIGTERM or SIGHUP to `raft-run` is passed on to the children, and `raft-run` then ends
//! by that signal (as a shell expects of a child it interrupted); a second one while the ranks
//! stop (a second Ctrl-C) kills them at once; a signal ignored when `raft-run` started (`nohup`,
//! a script's background job) stays ignored. A SIGTSTP (Ctrl-Z) stops the ranks with `raft-run`,
//! and they go on when it is continued.
//!
//! The ranks, and whatever they start, share one process group, led by a small guardian process
//! (`raft-run` itself, in a mode of its own) that holds a pipe from `raft-run`: when `raft-run`
//! ends, however it ends (even by SIGKILL), the guardian stops what is left of the group
//! (SIGTERM, then SIGKILL after the grace period), so no rank and no process a rank started (a
//! wrapper script's program, a helper of a failed rank, one that ignores SIGTERM) outlives the
//! job. Each rank is also killed directly if `raft-run` dies (the parent-death signal). When
//! `raft-run`'s standard input is a terminal the ranks get `/dev/null` instead (they are not the
//! terminal's foreground group: a read would stop them for good); a pipe or a file is passed on.
use std::ffi::OsString;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitCode, ExitStatus};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

const USAGE: &str = "usage: raft-run -n N [--master-addr ADDR] [--master-port PORT] [--keep-going] [--] PROGRAM [ARGS...]";

/// Other launchers' names for a process's rank and world, taken out of the ranks' environment.
const OUTER_NUMBERING: &[&str] =
    &["OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"];

/// The variables that keep NVLink multicast off, set in every child whatever the environment.
const ALWAYS: &[(&str, &str)] = &[("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")];

/// The most ranks one `raft-run` starts (one host's GPUs are far fewer; a mistyped count must
/// not fork until the system refuses).
const MAX_RANKS: usize = 4096;

/// A line on stderr whose failure is ignored: a closed or full stderr (a pipe whose reader went,
/// `2>/dev/full`) must not panic `raft-run` between a rank's failure and the others' stop.
macro_rules! note {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// The signal raft-run received (0: none); written by the handler, read by the main loop.
static SIGNALLED: AtomicI32 = AtomicI32::new(0);

/// How many signals raft-run received: a second one while the ranks are being stopped (a second
/// Ctrl-C) cuts the grace short.
static SIGNALS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

extern "C" fn on_signal(signal: libc::c_int) {
    SIGNALLED.store(signal, Ordering::SeqCst);
    SIGNALS.fetch_add(1, Ordering::SeqCst);
}

/// A SIGTSTP (Ctrl-Z) not yet passed on to the ranks; written by its handler, read by the loop.
static SUSPEND: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn on_suspend(_: libc::c_int) {
    SUSPEND.store(true, Ordering::SeqCst);
}

/// Set by a SIGCONT: `raft-run` was stopped and is continued.
static CONTINUED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn on_continue(_: libc::c_int) {
    CONTINUED.store(true, Ordering::SeqCst);
}

/// Installs [`on_suspend`] for SIGTSTP and [`on_continue`] for SIGCONT (which continues the
/// process all the same: the kernel does that, the handler only notes it).
fn catch_suspend() {
    // SAFETY: the handlers only store into atomics (async-signal-safe); `signal` takes no
    // pointer of ours besides the handlers' addresses.
    unsafe {
        libc::signal(libc::SIGTSTP, on_suspend as extern "C" fn(libc::c_int) as libc::sighandler_t);
        libc::signal(libc::SIGCONT, on_continue as extern "C" fn(libc::c_int) as libc::sighandler_t);
    }
}

/// Ctrl-Z: the ranks are not in the terminal's foreground group, so the terminal's SIGTSTP
/// reaches `raft-run` alone (it stopped, the ranks ran on: helper 91). It passes it on to the
/// job's group (the guardian ignores it), stops itself the way SIGTSTP would have, and, continued
/// (`fg`, `bg`), continues the group. In an orphaned process group (a `setsid` start) the kernel
/// discards the stop: `raft-run` goes on at once, says so, and so do the ranks.
fn suspend(group: libc::pid_t) {
    signal_job(group, libc::SIGTSTP);
    CONTINUED.store(false, Ordering::SeqCst);
    // SAFETY: sets SIGTSTP's default disposition and raises it on this process (which stops it
    // until a SIGCONT, whose handler runs before `raise` returns), then puts the handler back; no
    // pointers but the handler's address.
    unsafe {
        libc::signal(libc::SIGTSTP, libc::SIG_DFL);
        libc::raise(libc::SIGTSTP);
    }
    catch_suspend();
    if !CONTINUED.load(Ordering::SeqCst) {
        note!("raft-run: a SIGTSTP cannot stop raft-run here (its process group is orphaned): the ranks go on too");
    }
    signal_job(group, libc::SIGCONT);
}

#[derive(Debug)]
struct Options {
    n: usize,
    addr: String,
    port: Option<u16>,
    keep_going: bool,
    program: OsString,
    args: Vec<OsString>,
}

/// The command line: options (text) up to the program, then the program and its arguments as
/// the bytes they are (a Latin-1 file name is an argument like any other: `std::env::args`
/// panicked on one, helper 111).
fn parse(args: Vec<OsString>) -> Result<Options, String> {
    let mut it = args.into_iter().peekable();
    let (mut n, mut addr, mut port, mut keep_going) = (None, "127.0.0.1".to_string(), None, false);
    let text = |a: OsString| a.into_string().map_err(|a| format!("{}: an option that is not UTF-8 text\n{USAGE}", a.to_string_lossy()));
    while let Some(arg) = it.peek() {
        if !arg.as_encoded_bytes().starts_with(b"-") {
            break;
        }
        let arg = text(it.next().unwrap_or_default())?;
        // `--name=value` and `-nN` (torchrun's spellings) as `--name value` and `-n N`.
        let (a, mut inline) = match arg.split_once('=') {
            Some((name, v)) if name.starts_with("--") => (name.to_string(), Some(v.to_string())),
            _ if arg.starts_with("-n") && arg.len() > 2 && !arg.starts_with("--") => ("-n".to_string(), Some(arg[2..].to_string())),
            _ => (arg.clone(), None),
        };
        let mut value = |it: &mut std::iter::Peekable<std::vec::IntoIter<OsString>>, flag: &str| match inline.take() {
            Some(v) => Ok(v),
            None => text(it.next().ok_or(format!("{flag} needs a value"))?),
        };
        match a.as_str() {
            "--" => break,
            "-n" | "--nproc-per-node" | "--nproc_per_node" => {
                let v = value(&mut it, &a)?;
                let count = v.parse::<usize>().ok().filter(|&n| n > 0).ok_or(format!("{a} {v}: expected a positive number"))?;
                if count > MAX_RANKS {
                    return Err(format!("{a} {v}: at most {MAX_RANKS} ranks on one host"));
                }
                n = Some(count);
            }
            "--master-addr" | "--master_addr" => addr = value(&mut it, &a)?,
            "--master-port" | "--master_port" => {
                let v = value(&mut it, &a)?;
                port =
                    Some(v.parse::<u16>().ok().filter(|p| *p != 0).ok_or_else(|| format!("{a} {v}: expected a port number, 1 to 65535"))?);
            }
            "--keep-going" => keep_going = true,
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown option {other}\n{USAGE}")),
        }
        if inline.is_some() {
            return Err(format!("{a} takes no value: {arg}\n{USAGE}"));
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

/// Signals the job's process group (every rank and what the ranks started; the guardian that
/// leads it ignores the signals `raft-run` passes on, and dies only of SIGKILL).
fn signal_job(group: libc::pid_t, sig: libc::c_int) {
    // SAFETY: killpg takes a process group id and a signal number, no pointers. The group is the
    // guardian's, our child, not reaped before the job ends: its id names no one else's group.
    unsafe { libc::killpg(group, sig) };
}

/// Stops the running ranks: `sig` to the job's group, then SIGKILL to the group when a rank is
/// still there after the grace period, or at once when a signal beyond the first `seen` arrives
/// meanwhile (a second Ctrl-C); every rank is reaped, and `running` left empty.
fn stop(running: &mut Vec<(usize, Child)>, group: libc::pid_t, sig: libc::c_int, grace: Duration, seen: usize) {
    if running.is_empty() {
        return;
    }
    signal_job(group, sig);
    let now = Instant::now();
    let until = now.checked_add(grace).unwrap_or(now + Duration::from_secs(1 << 32));
    let another = || SIGNALS.load(Ordering::SeqCst) > seen;
    while Instant::now() < until && !another() && running.iter_mut().any(|(_, c)| matches!(c.try_wait(), Ok(None))) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let left: Vec<usize> = running.iter_mut().filter_map(|(r, c)| matches!(c.try_wait(), Ok(None)).then_some(*r)).collect();
    if !left.is_empty() {
        if another() {
            note!("raft-run: another signal while rank(s) {left:?} stopped: killing the job");
        } else {
            note!("raft-run: rank(s) {left:?} did not stop within {:.1} s: killing the job", grace.as_secs_f64());
        }
        signal_job(group, libc::SIGKILL);
    }
    for (_, c) in running.iter_mut() {
        let _ = c.kill();
        let _ = c.wait();
    }
    running.clear();
}

/// The processes of process group `group` other than `except`, not yet dead (zombies aside, but
/// a process whose main thread ended while others run counts); `None` when `/proc` cannot tell
/// (absent, or of another pid namespace: the caller then sweeps without looking).
fn members(group: libc::pid_t, except: libc::pid_t) -> Option<usize> {
    // Our own entry must be there, or this /proc is not of our namespace.
    if !std::path::Path::new(&format!("/proc/{except}/stat")).exists() {
        return None;
    }
    let dir = std::fs::read_dir("/proc").ok()?;
    let count = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<libc::pid_t>().ok())
        .filter(|pid| *pid != except)
        .filter(|pid| {
            // /proc/PID/stat: "pid (comm) state ppid pgrp …"; comm may hold spaces or parentheses.
            std::fs::read_to_string(format!("/proc/{pid}/stat")).ok().is_some_and(|stat| {
                let mut rest = stat.rsplit_once(") ").map(|(_, r)| r.split_whitespace()).into_iter().flatten();
                let state = rest.next();
                let pgrp = rest.nth(1).and_then(|g| g.parse::<libc::pid_t>().ok());
                let threads_left = || std::fs::read_dir(format!("/proc/{pid}/task")).is_ok_and(|t| t.count() > 1);
                pgrp == Some(group) && (state != Some("Z") || threads_left())
            })
        })
        .count();
    Some(count)
}

/// The variable `start_guardian` gives its guardian alone: the pid of the `raft-run` it guards.
const GUARDIAN_OF: &str = "RAFT_RUN_GUARDIAN_OF";

/// The guardian (`raft-run --guardian GRACE_MS`): leads the job's process group, ignores the
/// signals `raft-run` passes on, and waits for its standard input (a pipe only `raft-run` holds
/// open) to end; then stops what is left of the group: SIGTERM, and SIGKILL (itself included)
/// after the grace period if anything remains.
fn guardian(grace: Duration) -> ExitCode {
    // Only as `start_guardian` starts it: leading a group of its own, the job's, a child of the
    // `raft-run` that named itself in `GUARDIAN_OF`, reading a pipe. Anywhere else its group is
    // another's, which the sweep below would stop: its caller's (`raft-run --guardian` in a
    // script, helper 111), or, typed at a shell with job control (where every job leads a group
    // of its own), the other members of its pipeline (the review of the thirty-third session,
    // helper 120).
    // SAFETY: getpid, getppid and getpgrp take nothing; fstat writes into a local.
    let (leads, parent, stdin_is_pipe) = unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        let pipe = libc::fstat(0, &mut st) == 0 && (st.st_mode & libc::S_IFMT) == libc::S_IFIFO;
        (libc::getpgrp() == libc::getpid(), libc::getppid(), pipe)
    };
    let named = std::env::var_os(GUARDIAN_OF).is_some_and(|v| v.to_str().and_then(|v| v.parse::<libc::pid_t>().ok()) == Some(parent));
    if !(leads && named && stdin_is_pipe) {
        note!("raft-run: --guardian is raft-run's own mode (the leader of a job's process group), not for use by hand\n{USAGE}");
        return ExitCode::from(2);
    }
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGPIPE, libc::SIGTSTP] {
        // SAFETY: sets a disposition, no pointer of ours.
        unsafe { libc::signal(sig, libc::SIG_IGN) };
    }
    // Ready: raft-run starts no rank before this byte (a guardian that never started, say a
    // raft-run run through the dynamic loader, is an error there, not a job left unguarded).
    {
        use std::io::Write as _;
        let mut out = std::io::stdout();
        if out.write_all(b"R").and_then(|()| out.flush()).is_err() {
            return ExitCode::FAILURE;
        }
    }
    let mut sink = [0u8; 64];
    // Until `raft-run` ends or closes the pipe: EOF (0) or an error (an interrupted read is
    // neither).
    loop {
        match std::io::Read::read(&mut std::io::stdin(), &mut sink) {
            Ok(n) if n > 0 => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            _ => break,
        }
    }
    // SAFETY: getpid and getpgrp take nothing.
    let (me, group) = unsafe { (libc::getpid(), libc::getpgrp()) };
    let left = || members(group, me).is_none_or(|n| n > 0); // not knowing is "maybe"
    if !left() {
        return ExitCode::SUCCESS;
    }
    signal_job(group, libc::SIGTERM);
    let now = Instant::now();
    let until = now.checked_add(grace).unwrap_or(now + Duration::from_secs(1 << 32));
    while Instant::now() < until && left() {
        std::thread::sleep(Duration::from_millis(10));
    }
    if left() {
        signal_job(group, libc::SIGKILL); // this process too
    }
    ExitCode::SUCCESS
}

/// Starts the guardian of a job: it leads a new process group, the job's, and holds the read end
/// of a pipe whose write end (close-on-exec: no rank inherits it) is returned with it. This very
/// executable (`/proc/self/exe`: the same file even if its path changed), with the signals
/// `raft-run` passes on ignored from before its exec (no early SIGTERM of a stop ends it), and
/// running once it has said so on its standard output.
fn start_guardian(grace: Duration) -> Result<(Child, std::process::ChildStdin), String> {
    let mut cmd = Command::new("/proc/self/exe");
    cmd.env(GUARDIAN_OF, std::process::id().to_string())
        .arg("--guardian")
        .arg(grace.as_millis().min(u64::MAX as u128).to_string())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .process_group(0);
    // SAFETY: runs in the child between fork and exec and only sets dispositions (async-signal-
    // safe); ignored dispositions survive the exec.
    unsafe {
        cmd.pre_exec(|| {
            for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGTSTP] {
                libc::signal(sig, libc::SIG_IGN);
            }
            Ok(())
        })
    };
    let mut child = cmd.spawn().map_err(|e| format!("could not start the job's guardian: {e}"))?;
    let pipe = child.stdin.take().ok_or("the guardian's pipe")?;
    let mut ready = [0u8; 1];
    let said = child.stdout.take().map(|mut out| std::io::Read::read_exact(&mut out, &mut ready));
    if !matches!(said, Some(Ok(()))) || ready != *b"R" {
        drop(pipe);
        let _ = child.kill();
        let _ = child.wait();
        return Err("the job's guardian did not start (raft-run must run as its own executable, not through the dynamic loader): \
                    no rank was started"
            .into());
    }
    Ok((child, pipe))
}

/// Whether `sig` was ignored when `raft-run` started (`nohup`, a background job of a script).
fn ignored(sig: libc::c_int) -> bool {
    // SAFETY: reads the current disposition into a zeroed local; installs nothing.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_IGN
    }
}

/// How a job ended: with a status for `raft-run` to exit with, or by a signal `raft-run`
/// received and passed on (it then ends by that signal too).
enum Outcome {
    Status(i32),
    Signal(libc::c_int),
}

fn run(o: Options) -> Result<Outcome, String> {
    let port = match o.port {
        Some(p) => p,
        None => free_port(&o.addr)?,
    };
    let grace = grace_from(std::env::var_os("RAFT_RUN_GRACE").map(|v| v.to_string_lossy().into_owned()))?;
    let (secret, job) = (job_secret()?, job_id()?);
    // SAFETY: getpid takes nothing and cannot fail.
    let parent = unsafe { libc::getpid() };
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        if ignored(sig) {
            continue; // nohup's SIGHUP, a background job's SIGINT: left ignored
        }
        // SAFETY: the handler only stores into an atomic (async-signal-safe); `signal` takes no
        // pointer of ours besides the handler's address.
        unsafe { libc::signal(sig, on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t) };
    }
    if !ignored(libc::SIGTSTP) {
        catch_suspend();
    }
    let (mut guard, pipe) = start_guardian(grace)?;
    let group = libc::pid_t::try_from(guard.id()).map_err(|_| "the guardian's pid".to_string())?;
    // SAFETY: isatty takes a descriptor number.
    let terminal_in = unsafe { libc::isatty(0) } == 1;
    let mut running: Vec<(usize, Child)> = Vec::new();
    let outcome = start_and_watch(&o, port, grace, parent, group, terminal_in, &secret, &job, &mut running);
    // The job's end: what the ranks left in the group is stopped by the guardian (closing its
    // pipe), waited for here so that nothing of the job outlives `raft-run`.
    stop(&mut running, group, libc::SIGTERM, grace, SIGNALS.load(Ordering::SeqCst));
    drop(pipe);
    let _ = guard.wait();
    outcome
}

/// Starts the ranks into the guardian's group `group` and watches them (see [`run`]).
#[allow(clippy::too_many_arguments)]
fn start_and_watch(
    o: &Options,
    port: u16,
    grace: Duration,
    parent: libc::pid_t,
    group: libc::pid_t,
    terminal_in: bool,
    secret: &str,
    job: &str,
    running: &mut Vec<(usize, Child)>,
) -> Result<Outcome, String> {
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
            .env(raft_comms::SECRET_VAR, secret)
            .env(raft_comms::JOB_VAR, job)
            // The rendezvous is raft-run's to give: an inherited port for it (or torchrun's store
            // moving it to MASTER_PORT + 1) would send the ranks where nothing was checked free.
            .env_remove("RAFT_COMMS_PORT")
            .env_remove("TORCHELASTIC_USE_AGENT_STORE");
        // raft-run numbers its ranks: an outer launcher's numbering (raft-run started by
        // `srun` under pmi2, or by `mpirun`, once per node) describes raft-run, not them.
        for name in OUTER_NUMBERING {
            cmd.env_remove(name);
        }
        cmd.process_group(group);
        if terminal_in {
            cmd.stdin(std::process::Stdio::null());
        }
        for (k, v) in ALWAYS {
            cmd.env(k, v);
        }
        // SAFETY: runs in the child between fork and exec, calling only async-signal-safe
        // functions (prctl, getppid, _exit, signal) and touching no memory of the parent's but a
        // copied integer.
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
                // SIGTERM is how raft-run stops a rank: never inherited ignored (a raft-run
                // started with it ignored left its ranks only SIGKILL).
                libc::signal(libc::SIGTERM, libc::SIG_DFL);
                Ok(())
            })
        };
        match cmd.spawn() {
            Ok(child) => running.push((rank, child)),
            Err(e) => {
                stop(running, group, libc::SIGTERM, grace, SIGNALS.load(Ordering::SeqCst));
                return Err(format!("could not start rank {rank} ({}): {e}", o.program.to_string_lossy()));
            }
        }
    }
    let mut first_failure: Option<i32> = None;
    while !running.is_empty() {
        let sig = SIGNALLED.load(Ordering::SeqCst);
        if sig != 0 {
            note!("raft-run: received signal {sig}: stopping {} rank(s)", running.len());
            // The signal that started this stop is the first: one more cuts the grace short (two
            // within one look of this loop count as two).
            stop(running, group, sig, grace, 1);
            return Ok(Outcome::Signal(sig));
        }
        if SUSPEND.swap(false, Ordering::SeqCst) {
            suspend(group);
        }
        let mut i = 0;
        let mut failed_now = false;
        while i < running.len() {
            match running[i].1.try_wait() {
                Ok(None) => i += 1,
                Ok(Some(status)) => {
                    let (rank, child) = running.remove(i);
                    if !status.success() {
                        note!("raft-run: rank {rank} (pid {}) {}", child.id(), describe(status));
                        if first_failure.is_none() {
                            first_failure = Some(code_of(status));
                            failed_now = true;
                        }
                    }
                }
                Err(e) => {
                    let rank = running[i].0;
                    stop(running, group, libc::SIGTERM, grace, SIGNALS.load(Ordering::SeqCst));
                    return Err(format!("waiting for rank {rank}: {e} (every rank was stopped)"));
                }
            }
        }
        if failed_now && !o.keep_going && !running.is_empty() {
            note!("raft-run: stopping the other {} rank(s)", running.len());
            stop(running, group, libc::SIGTERM, grace, SIGNALS.load(Ordering::SeqCst));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(Outcome::Status(first_failure.unwrap_or(0)))
}

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    if args.first().is_some_and(|a| a == "--guardian") {
        let grace = args.get(1).and_then(|ms| ms.to_str()?.parse::<u64>().ok()).map_or(Duration::from_secs(5), Duration::from_millis);
        return guardian(grace);
    }
    match parse(args).and_then(run) {
        Ok(Outcome::Status(code)) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Ok(Outcome::Signal(sig)) => {
            // Ends by the signal, as the ranks did: a shell running `raft-run` in a script sees
            // an interrupted child, not an exit status.
            // SAFETY: restores the default disposition and raises the signal on this process.
            unsafe {
                libc::signal(sig, libc::SIG_DFL);
                libc::raise(sig);
            }
            ExitCode::from(u8::try_from(128 + sig).unwrap_or(1)) // a signal whose default is to go on
        }
        Err(message) => {
            note!("raft-run: {message}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<OsString> {
        s.split_whitespace().map(OsString::from).collect()
    }

    #[test]
    fn parses_torchrun_like_options() {
        let o = parse(args("-n 2 --master-port 29500 --keep-going -- ./prog -x y")).unwrap();
        assert_eq!((o.n, o.port, o.keep_going, o.addr.as_str()), (2, Some(29500), true, "127.0.0.1"));
        assert_eq!((o.program, o.args), ("./prog".into(), args("-x y")));
        let o = parse(args("--nproc_per_node 4 python3 s.py --lr 1")).unwrap();
        assert_eq!((o.n, o.program, o.args.len()), (4, "python3".into(), 3));
        // torchrun's other spellings (helper 91: refused as unknown options before).
        let o = parse(args("--nproc_per_node=2 --master-port=29501 -- python3 s.py --lr=1")).unwrap();
        assert_eq!((o.n, o.port, o.args.clone()), (2, Some(29501), args("s.py --lr=1")));
        assert_eq!(parse(args("-n3 ./prog")).unwrap().n, 3);
        assert!(parse(args("--keep-going=yes -n 2 ./prog")).unwrap_err().contains("--keep-going takes no value"));
    }

    #[test]
    fn grace_is_seconds_and_never_a_panic() {
        assert_eq!(grace_from(None).unwrap(), Duration::from_secs(5));
        assert_eq!(grace_from(Some("0.5".into())).unwrap(), Duration::from_millis(500));
        for bad in ["1e20", "-1", "inf", "NaN", "soon"] {
            assert!(grace_from(Some(bad.into())).unwrap_err().contains("RAFT_RUN_GRACE"), "{bad}");
        }
        // The longest grace representable does not overflow the deadline either.
        stop(&mut Vec::new(), 0, libc::SIGTERM, Duration::MAX, 0);
    }

    #[test]
    fn refuses_what_it_cannot_run() {
        assert!(parse(args("./prog")).unwrap_err().contains("-n N is required"));
        assert!(parse(args("-n 0 ./prog")).unwrap_err().contains("positive"));
        assert!(parse(args("-n 2")).unwrap_err().contains("no program"));
        assert!(parse(args("-n 4097 ./prog")).unwrap_err().contains("at most 4096 ranks"), "a count no host runs");
        assert!(parse(args("-n 2147483647 ./prog")).unwrap_err().contains("at most 4096 ranks"));
        assert!(parse(args("-n 2 --master-port 0 ./prog")).unwrap_err().contains("1 to 65535"), "port 0 is no rendezvous");
        assert!(parse(args("-n 2 --bogus ./prog")).unwrap_err().contains("unknown option --bogus"));
    }
}
