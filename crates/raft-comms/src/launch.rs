//! Where this process stands among its ranks, from the environment a launcher sets, the
//! rendezvous port (`RAFT_COMMS_PORT`), and the communicators' time bound (`RAFT_COMMS_TIMEOUT`).
//!
//! | launcher | rank | world size | local rank |
//! | --- | --- | --- | --- |
//! | torchrun, `raft-run` | `RANK` | `WORLD_SIZE` | `LOCAL_RANK` |
//! | Open MPI | `OMPI_COMM_WORLD_RANK` | `OMPI_COMM_WORLD_SIZE` | `OMPI_COMM_WORLD_LOCAL_RANK` |
//! | MPICH, Intel MPI (PMI) | `PMI_RANK` | `PMI_SIZE` | `MPI_LOCALRANKID` |
//! | Slurm (`srun`) | `SLURM_PROCID` | `SLURM_NTASKS` | `SLURM_LOCALID` |
//!
//! torchrun's names win when present, then Open MPI's, then PMI's, then Slurm's. A family with a
//! rank but no world size (or the reverse) is an error, and so are torchrun's, Open MPI's and
//! PMI's names giving different ranks or world sizes (a stale `RANK` exported under `mpirun`),
//! except where a per-host launcher started the ranks (`LOCAL_WORLD_SIZE` or
//! `TORCHELASTIC_RUN_ID` set, as torchrun and `raft-run` do: `mpirun … torchrun` is a launch of
//! launchers). Slurm's names describe the allocation, which other launchers run inside (in a batch
//! script `SLURM_PROCID` is 0 for every rank `mpirun` starts), so they are read only when no other
//! family is there, and never held against one.
//!
//! The rendezvous is at `MASTER_ADDR:MASTER_PORT` when set. Under Slurm without `MASTER_ADDR`, it
//! is the first host of the step's `SLURM_STEP_NODELIST` (else `SLURM_JOB_NODELIST`,
//! `SLURM_NODELIST`), port `MASTER_PORT` or else `20000 + (SLURM_JOB_ID + 4973 × SLURM_STEP_ID)
//! mod 10000` (the same in every rank of the step, apart from the job's other steps and another
//! job's). For ranks `srun` numbered, `Communicator::from_env` also binds the step into the
//! secret's job when `RAFT_COMMS_JOB` is unset, so steps sharing a secret refuse each other.
//! Under MPI, `MASTER_ADDR` and `MASTER_PORT` must be set (or the job started with `raft-run`).
use raft_error::{Error, Result};
use std::time::Duration;

/// The default bound of a communicator's waits: initialisation, a collective that does not
/// finish, a finalize (`RAFT_COMMS_TIMEOUT` overrides it).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// This process's place among the ranks, as a launcher describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    /// `RANK` (or a launcher's own name for it, see the module's table): this process's rank, from 0.
    pub rank: usize,
    /// `WORLD_SIZE` (or the launcher's own name): the number of ranks, as
    /// [`Communicator::size`](crate::Communicator::size) names it.
    pub size: usize,
    /// `LOCAL_RANK` (or the launcher's own name): the rank among the processes of this host (the
    /// GPU to use), when set.
    pub local_rank: Option<usize>,
    /// `MASTER_ADDR`: rank 0's host (under Slurm without it, the step's first host).
    pub master_addr: String,
    /// `MASTER_PORT` (under Slurm without it, `20000 + (SLURM_JOB_ID + 4973 × SLURM_STEP_ID) mod
    /// 10000`).
    pub master_port: u16,
    /// The port rank 0 serves the unique id on: `RAFT_COMMS_PORT` when set; else, under
    /// torchrun (`TORCHELASTIC_USE_AGENT_STORE=True`, whose agent already listens on
    /// `MASTER_PORT`), `MASTER_PORT + 1`; else `MASTER_PORT`.
    pub rendezvous_port: u16,
    /// The family of variables the rank came from: `"torchrun"` (also `raft-run`'s),
    /// `"Open MPI"`, `"PMI"` or `"Slurm"`.
    pub launcher: &'static str,
}

/// A launcher's names for the rank, the world size and the local rank.
struct Family {
    launcher: &'static str,
    rank: &'static str,
    size: &'static str,
    local: &'static str,
}

/// In order of precedence: the innermost launcher first.
const FAMILIES: [Family; 4] = [
    Family { launcher: "torchrun", rank: "RANK", size: "WORLD_SIZE", local: "LOCAL_RANK" },
    Family { launcher: "Open MPI", rank: "OMPI_COMM_WORLD_RANK", size: "OMPI_COMM_WORLD_SIZE", local: "OMPI_COMM_WORLD_LOCAL_RANK" },
    Family { launcher: "PMI", rank: "PMI_RANK", size: "PMI_SIZE", local: "MPI_LOCALRANKID" },
    Family { launcher: "Slurm", rank: "SLURM_PROCID", size: "SLURM_NTASKS", local: "SLURM_LOCALID" },
];

/// The port of a Slurm job step without `MASTER_PORT`: the same in all the step's ranks, apart
/// from the other steps' of the job (two `srun … &` in one batch script run at once), and from
/// the first steps of jobs whose ids are not 10000 apart. 4973 is prime to 10000: the steps of one
/// job get distinct ports, and step 1 of a job shares none with step 0 of the next jobs.
fn slurm_port(job_id: u64, step_id: u64) -> u16 {
    (20000 + (job_id % 10000 + (step_id % 10000) * 4973) % 10000) as u16
}

/// The Slurm step as the rendezvous secret's job (`slurm:<job>.<step>`, and `.r<n>` after a
/// requeue), for ranks that `srun` numbered: the Slurm family's, or PMI's where they are Slurm's
/// own numbering (Slurm's `mpi/pmi2` plugin sets `PMI_RANK` / `PMI_SIZE` in every task). The
/// steps of one allocation share the batch script's secret; bound to their steps, two steps
/// running at once refuse each other's ranks. `None` for ranks another launcher numbered (their
/// job may span steps: mpirun's own ranks and its daemons' differ) or outside a step.
pub(crate) fn srun_step_job(launcher: &str, get: impl Fn(&str) -> Option<String>) -> Option<String> {
    let same = |a: &str, b: &str| get(a).zip(get(b)).is_some_and(|(x, y)| x.trim() == y.trim());
    let numbered_by_srun = match launcher {
        "Slurm" => true,
        "PMI" => same("PMI_RANK", "SLURM_PROCID") && same("PMI_SIZE", "SLURM_NTASKS"),
        _ => false,
    };
    let (job, step) = (get("SLURM_JOB_ID")?, get("SLURM_STEP_ID")?);
    let restart = get("SLURM_RESTART_COUNT").filter(|r| r.trim() != "0").map_or(String::new(), |r| format!(".r{}", r.trim()));
    numbered_by_srun.then(|| format!("slurm:{}.{}{restart}", job.trim(), step.trim()))
}

/// `SLURM_STEP_ID` as a number: 0 outside a step (`salloc`, the batch script itself).
fn slurm_step(who: &'static str, get: impl Fn(&str) -> Option<String>) -> Result<u64> {
    match get("SLURM_STEP_ID") {
        None => Ok(0),
        Some(step) => step.trim().parse::<u64>().map_err(|_| Error::logic(who, format!("SLURM_STEP_ID={step} is not a step id"))),
    }
}

/// The first host of a Slurm host list (`node[01-04,07],gpu3` → `node01`), its zero padding
/// kept; `None` when the list is empty or malformed.
pub(crate) fn first_host(list: &str) -> Option<String> {
    let list = list.trim();
    let mut host = String::new();
    let mut rest = list;
    loop {
        // Text up to the next bracket or the end of this host's entry.
        let stop = rest.find(['[', ',']).unwrap_or(rest.len());
        host.push_str(&rest[..stop]);
        rest = &rest[stop..];
        if !rest.starts_with('[') {
            break;
        }
        let close = rest.find(']')?;
        let inside = &rest[1..close];
        // The first element of the group, and of a range its start ("01-04" → "01").
        let first = inside.split(',').next()?.split('-').next()?.trim();
        if first.is_empty() || !first.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        host.push_str(first);
        rest = &rest[close + 1..];
    }
    (!host.is_empty() && !host.contains(']')).then_some(host)
}

impl Launch {
    /// The number of ranks: [`size`](Self::size).
    #[deprecated(note = "use the field `size`: one name for the number of ranks, as Communicator::size()")]
    pub fn world_size(&self) -> usize {
        self.size
    }

    /// Reads the rank, world size and local rank from the first launcher family present (see the
    /// module's table), and `MASTER_ADDR`, `MASTER_PORT` (with Slurm's fallback).
    ///
    /// # Errors
    /// `Logic` naming the variable that is missing or not a number, a family that is partial (a
    /// rank without a world size), two families that disagree (naming both and their values), a
    /// rank not below the world size, a world size above `i32::MAX` (NCCL's limit), or MPI
    /// without `MASTER_ADDR`.
    pub fn from_env() -> Result<Launch> {
        // A value that is not UTF-8 is read lossily, so it is refused by name as not a number
        // (`std::env::var(..).ok()` took it for unset, and another launcher's names won).
        Self::from_vars("Launch::from_env", |name| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned()))
    }

    /// The same, from any lookup (the environment of another process, a test's table).
    pub fn from_vars(who: &'static str, var: impl Fn(&str) -> Option<String>) -> Result<Launch> {
        let get = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        let number = |name: &str, text: String| {
            text.trim().parse::<usize>().map_err(|_| Error::logic(who, format!("{name}={text} is not a non-negative integer")))
        };
        let not_set = |name: &str| {
            Error::logic(
                who,
                format!(
                    "{name} is not set: start the program with a launcher (raft-run -n N ./prog, torchrun, srun, mpirun) \
                     or call Communicator::init with the rank, world size and address"
                ),
            )
        };
        // Every family that is there, complete as (family, rank, size); a partial one is an error
        // unless it is Slurm's beside a complete family (salloc sets SLURM_NTASKS outside srun).
        let mut complete = Vec::new();
        let mut partial = None;
        for f in &FAMILIES {
            match (get(f.rank), get(f.size)) {
                (Some(r), Some(s)) => complete.push((f, number(f.rank, r)?, number(f.size, s)?)),
                (None, None) => {}
                (Some(r), None) => partial = partial.or(Some((f, format!("{}={r} is set but {} is not", f.rank, f.size)))),
                (None, Some(s)) => partial = partial.or(Some((f, format!("{}={s} is set but {} is not", f.size, f.rank)))),
            }
        }
        if let Some((f, why)) = partial {
            if f.launcher != "Slurm" || complete.is_empty() {
                return Err(Error::logic(who, format!("{why}: {}'s variables are partial", f.launcher)));
            }
        }
        let &(family, rank, world_size) = complete.first().ok_or_else(|| not_set("RANK"))?;
        let nested = family.launcher == "torchrun" && (get("LOCAL_WORLD_SIZE").is_some() || get("TORCHELASTIC_RUN_ID").is_some());
        // torchrun itself sets TORCHELASTIC_RUN_ID; raft-run sets LOCAL_WORLD_SIZE alone.
        let by_raft_run = nested && get("TORCHELASTIC_RUN_ID").is_none();
        if by_raft_run {
            // raft-run takes the outer launcher's numbering out of its ranks' environment: names
            // of a larger world beside its own are a stale export (a `raft-run -n 1` rank that
            // went on to `mpirun -np 4`). (A torchrun per node, `--standalone` under mpirun, is
            // a world of its own and smaller: not refused.)
            if let Some(&(outer, _, s)) = complete.iter().skip(1).find(|(f, _, s)| f.launcher != "Slurm" && *s > world_size) {
                return Err(Error::logic(
                    who,
                    format!(
                        "{}={world_size} is fewer ranks than {}={s} around it: raft-run's names are stale here; unset \
                         RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE",
                        family.size, outer.size
                    ),
                ));
            }
        }
        if !nested {
            for &(other, r, s) in complete.iter().skip(1).filter(|(f, _, _)| f.launcher != "Slurm") {
                if (r, s) != (rank, world_size) {
                    return Err(Error::logic(
                        who,
                        format!(
                            "{} and {} disagree: {}={rank} {}={world_size} but {}={r} {}={s}; unset the stale ones",
                            family.launcher, other.launcher, family.rank, family.size, other.rank, other.size
                        ),
                    ));
                }
            }
        }
        if world_size > crate::rendezvous::MAX_WORLD {
            return Err(Error::logic(
                who,
                format!("{}={world_size} is more ranks than NCCL takes (at most {})", family.size, crate::rendezvous::MAX_WORLD),
            ));
        }
        if world_size == 0 || rank >= world_size {
            return Err(Error::logic(who, format!("{}={rank} is not a rank of {}={world_size}", family.rank, family.size)));
        }
        let local_rank = get(family.local).map(|v| number(family.local, v)).transpose()?;
        // Port 0 is no rendezvous: rank 0 would listen wherever the OS put it, the others knock at 0.
        let port_of = |name: &str, text: String| {
            text.trim()
                .parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| Error::logic(who, format!("{name}={text} is not a port number (1 to 65535)")))
        };
        let port = |text: String| port_of("MASTER_PORT", text);
        let (master_addr, master_port) = match family.launcher {
            "Slurm" => {
                let addr = match get("MASTER_ADDR") {
                    Some(a) => a.trim().to_string(),
                    None => {
                        // The step's own hosts first: steps of one job may run on different nodes.
                        let (name, list) = [
                            ("SLURM_STEP_NODELIST", get("SLURM_STEP_NODELIST")),
                            ("SLURM_JOB_NODELIST", get("SLURM_JOB_NODELIST")),
                            ("SLURM_NODELIST", get("SLURM_NODELIST")),
                        ]
                        .into_iter()
                        .find_map(|(n, v)| v.map(|v| (n, v)))
                        .ok_or_else(|| {
                            Error::logic(who, "under Slurm, neither MASTER_ADDR nor SLURM_JOB_NODELIST is set: set MASTER_ADDR")
                        })?;
                        first_host(&list)
                            .ok_or_else(|| Error::logic(who, format!("{name}={list} is not a Slurm host list: set MASTER_ADDR")))?
                    }
                };
                let p = match get("MASTER_PORT") {
                    Some(p) => port(p)?,
                    None => {
                        let id = get("SLURM_JOB_ID").ok_or_else(|| {
                            Error::logic(who, "under Slurm, neither MASTER_PORT nor SLURM_JOB_ID is set: set MASTER_PORT")
                        })?;
                        let job = id.trim().parse::<u64>().map_err(|_| Error::logic(who, format!("SLURM_JOB_ID={id} is not a job id")))?;
                        slurm_port(job, slurm_step(who, get)?)
                    }
                };
                (addr, p)
            }
            "torchrun" => (
                get("MASTER_ADDR").ok_or_else(|| not_set("MASTER_ADDR"))?.trim().to_string(),
                port(get("MASTER_PORT").ok_or_else(|| not_set("MASTER_PORT"))?)?,
            ),
            mpi => {
                let need = |name: &str| {
                    get(name).ok_or_else(|| {
                        Error::logic(
                            who,
                            format!(
                                "{name} is not set: under {mpi} set MASTER_ADDR and MASTER_PORT to rank 0's host and a free port \
                                 in every rank (or start the program with raft-run)"
                            ),
                        )
                    })
                };
                (need("MASTER_ADDR")?.trim().to_string(), port(need("MASTER_PORT")?)?)
            }
        };
        // A colon is an IPv6 address's, or a port given in the wrong place (`host:29500`, which
        // became the IPv6 address `[host:29500]`).
        let bare = master_addr.strip_prefix('[').and_then(|a| a.strip_suffix(']')).unwrap_or(&master_addr);
        let v6 = format!("[{bare}]:0").parse::<std::net::SocketAddrV6>().is_ok(); // scope ids too: fe80::1%2
        if (master_addr.contains(':') || master_addr.contains('[') || master_addr.contains(']')) && !v6 {
            return Err(Error::logic(
                who,
                format!("MASTER_ADDR={master_addr} is neither a host nor an IPv6 address: give the port in MASTER_PORT"),
            ));
        }
        let rendezvous_port = match get("RAFT_COMMS_PORT") {
            Some(p) => port_of("RAFT_COMMS_PORT", p)?,
            None if var("TORCHELASTIC_USE_AGENT_STORE").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) => {
                master_port.checked_add(1).ok_or_else(|| {
                    Error::logic(who, "MASTER_PORT=65535 is torchrun's store: set RAFT_COMMS_PORT to a free port for the rendezvous")
                })?
            }
            None => master_port,
        };
        Ok(Launch { rank, size: world_size, local_rank, master_addr, master_port, rendezvous_port, launcher: family.launcher })
    }

    /// The device this rank uses: its local rank among the devices this process sees, or the
    /// only one it sees whatever its local rank (a launcher that gives each rank a GPU of its
    /// own: Slurm's `--gpus-per-task=1`, a wrapper setting `CUDA_VISIBLE_DEVICES` per rank);
    /// device 0 without a local rank.
    ///
    /// # Errors
    /// `Logic` when the local rank is not below the number of devices this process sees (naming
    /// the variable, the count and `CUDA_VISIBLE_DEVICES`); `Cuda` when they cannot be counted.
    pub fn device(&self) -> Result<usize> {
        let visible = raft_core::device_count().map_err(|e| e.with_who("Launch::device"))?;
        self.device_among(visible, cuda_visible())
    }

    /// [`device`](Self::device) for a process that sees `visible` devices.
    fn device_among(&self, visible: usize, cuda_visible: Option<String>) -> Result<usize> {
        let Some(local) = self.local_rank else { return Ok(0) };
        if local < visible {
            return Ok(local);
        }
        // One device seen, chosen for this rank (Slurm's `--gpus-per-task=1`, a per-rank
        // wrapper: both set CUDA_VISIBLE_DEVICES); without that, several ranks on one GPU would
        // meet only in NCCL's "duplicate GPU" (the review, helper 92).
        if visible == 1 && cuda_visible.as_deref().is_some_and(|v| !v.trim().is_empty()) {
            return Ok(0);
        }
        let name = FAMILIES.iter().find(|f| f.launcher == self.launcher).map_or("LOCAL_RANK", |f| f.local);
        Err(Error::logic(
            "Launch::device",
            format!(
                "{name}={local} but this process sees {visible} device(s){}: start at most {visible} ranks per host, or give \
                 each rank its devices",
                cuda_visible.map_or(String::new(), |v| format!(" (CUDA_VISIBLE_DEVICES={v})"))
            ),
        ))
    }

    /// `MASTER_ADDR:<rendezvous port>` (brackets around an IPv6 address).
    pub fn rendezvous_addr(&self) -> String {
        if self.master_addr.contains(':') && !self.master_addr.starts_with('[') {
            format!("[{}]:{}", self.master_addr, self.rendezvous_port)
        } else {
            format!("{}:{}", self.master_addr, self.rendezvous_port)
        }
    }
}

/// `CUDA_VISIBLE_DEVICES`, read lossily: a value that is not UTF-8 is still set (CUDA reads the
/// variable as bytes, and the one-device rule of [`Launch::device`] must see it), where
/// `std::env::var` took it for unset (the twenty-third audit's open item, helper 111).
fn cuda_visible() -> Option<String> {
    std::env::var_os("CUDA_VISIBLE_DEVICES").map(|v| v.to_string_lossy().into_owned())
}

/// `RAFT_COMMS_TIMEOUT` (seconds, a positive number) or [`DEFAULT_TIMEOUT`].
///
/// # Errors
/// `Logic` when the variable is set to something else than a positive number of seconds, or
/// to one below a nanosecond (a zero bound) or beyond what a `Duration` holds.
pub fn timeout_from_env() -> Result<Duration> {
    // Read lossily: a value that is not UTF-8 is refused, not taken for unset.
    timeout_from(std::env::var_os("RAFT_COMMS_TIMEOUT").map(|v| v.to_string_lossy().into_owned()))
}

pub(crate) fn timeout_from(text: Option<String>) -> Result<Duration> {
    match text.filter(|t| !t.trim().is_empty()) {
        None => Ok(DEFAULT_TIMEOUT),
        Some(t) => match t.trim().parse::<f64>() {
            Ok(s) if s > 0.0 => match Duration::try_from_secs_f64(s) {
                // Below a nanosecond a positive number is a zero bound, which every communicator
                // refuses without naming the variable.
                Ok(d) if d.is_zero() => Err(Error::logic("RAFT_COMMS_TIMEOUT", format!("{t} seconds is below a nanosecond: a zero bound"))),
                Ok(d) => Ok(d),
                Err(_) => Err(Error::logic("RAFT_COMMS_TIMEOUT", format!("{t} seconds is beyond any wait (the most is about 1.8e19)"))),
            },
            _ => Err(Error::logic("RAFT_COMMS_TIMEOUT", format!("expected a positive number of seconds, given {t}"))),
        },
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod variable_mutations;
