//! `Launch`'s unit tests (CPU, every CI run): the launchers' variables, the device rule,
//! the rendezvous address.
use super::*;
use std::collections::HashMap;

fn table(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    move |name| map.get(name).cloned()
}

#[test]
fn reads_torchrun_variables() {
    let l = Launch::from_vars(
        "t",
        table(&[("RANK", "1"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "1"), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500")]),
    )
    .unwrap();
    assert_eq!(
        l,
        Launch {
            rank: 1,
            size: 2,
            local_rank: Some(1),
            master_addr: "127.0.0.1".into(),
            master_port: 29500,
            rendezvous_port: 29500,
            launcher: "torchrun"
        }
    );
    assert_eq!(l.rendezvous_addr(), "127.0.0.1:29500");
}

#[test]
fn under_torchrun_the_rendezvous_moves_off_the_agents_port() {
    let base = [("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h"), ("MASTER_PORT", "29500")];
    let with = |extra: &[(&'static str, &'static str)]| {
        let mut all = base.to_vec();
        all.extend_from_slice(extra);
        Launch::from_vars("t", table(&all))
    };
    assert_eq!(with(&[("TORCHELASTIC_USE_AGENT_STORE", "True")]).unwrap().rendezvous_addr(), "h:29501");
    assert_eq!(with(&[("TORCHELASTIC_USE_AGENT_STORE", "True"), ("RAFT_COMMS_PORT", "4000")]).unwrap().rendezvous_addr(), "h:4000");
    assert_eq!(with(&[("RAFT_COMMS_PORT", "4000")]).unwrap().rendezvous_port, 4000);
    assert!(with(&[("RAFT_COMMS_PORT", "x")]).is_err());
}

#[test]
fn names_what_is_missing_or_wrong() {
    let e = Launch::from_vars("t", table(&[])).unwrap_err();
    assert!(e.message().starts_with("RANK is not set"), "{e}");
    let e = Launch::from_vars("t", table(&[("WORLD_SIZE", "2")])).unwrap_err();
    assert!(e.message().starts_with("WORLD_SIZE=2 is set but RANK is not"), "{e}");
    let e = Launch::from_vars("t", table(&[("RANK", "2"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h"), ("MASTER_PORT", "1")])).unwrap_err();
    assert!(e.message().contains("RANK=2 is not a rank of WORLD_SIZE=2"), "{e}");
    let e =
        Launch::from_vars("t", table(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h"), ("MASTER_PORT", "99999")])).unwrap_err();
    assert!(e.message().contains("MASTER_PORT=99999"), "{e}");
    let e = Launch::from_vars("t", table(&[("RANK", "x"), ("WORLD_SIZE", "2")])).unwrap_err();
    assert!(e.message().contains("RANK=x"), "{e}");
}

fn err(pairs: &[(&str, &str)]) -> String {
    let e = Launch::from_vars("t", table(pairs)).unwrap_err();
    assert_eq!(e.kind(), raft_error::ErrorKind::Logic, "{e}");
    e.message().to_string()
}

#[test]
fn reads_open_mpi_variables() {
    let l = Launch::from_vars(
        "t",
        table(&[
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "29500"),
        ]),
    )
    .unwrap();
    assert_eq!((l.rank, l.size, l.local_rank, l.launcher), (3, 4, Some(1), "Open MPI"));
    assert_eq!(l.rendezvous_addr(), "h:29500");
}

#[test]
fn reads_pmi_variables_with_the_local_rank_when_set() {
    let base = [("PMI_RANK", "2"), ("PMI_SIZE", "3"), ("MASTER_ADDR", "h"), ("MASTER_PORT", "1")];
    let l = Launch::from_vars("t", table(&base)).unwrap();
    assert_eq!((l.rank, l.size, l.local_rank, l.launcher), (2, 3, None, "PMI"));
    #[allow(deprecated)] // the name of earlier issues still answers
    let world_size = l.world_size();
    assert_eq!(world_size, 3);
    let mut with_local = base.to_vec();
    with_local.push(("MPI_LOCALRANKID", "0"));
    assert_eq!(Launch::from_vars("t", table(&with_local)).unwrap().local_rank, Some(0));
}

#[test]
fn reads_slurm_variables_with_the_first_host_and_the_jobs_port() {
    let l = Launch::from_vars(
        "t",
        table(&[
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_JOB_NODELIST", "gpu[007-010,12],login1"),
            ("SLURM_JOB_ID", "123456"),
        ]),
    )
    .unwrap();
    assert_eq!(
        l,
        Launch {
            rank: 5,
            size: 8,
            local_rank: Some(1),
            master_addr: "gpu007".into(),
            master_port: 23456,
            rendezvous_port: 23456,
            launcher: "Slurm"
        }
    );
}

#[test]
fn under_slurm_master_addr_and_port_win_and_nodelist_is_the_older_name() {
    let base = [("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2"), ("SLURM_JOB_ID", "7")];
    let with = |extra: &[(&'static str, &'static str)]| {
        let mut all = base.to_vec();
        all.extend_from_slice(extra);
        Launch::from_vars("t", table(&all))
    };
    let l = with(&[("SLURM_JOB_NODELIST", "n1"), ("MASTER_ADDR", "10.0.0.1"), ("MASTER_PORT", "4444")]).unwrap();
    assert_eq!(l.rendezvous_addr(), "10.0.0.1:4444");
    let l = with(&[("SLURM_NODELIST", "a[3-4]"), ("MASTER_PORT", "4444")]).unwrap();
    assert_eq!(l.rendezvous_addr(), "a3:4444");
    assert_eq!(with(&[("SLURM_NODELIST", "a")]).unwrap().rendezvous_addr(), "a:20007");
}

#[test]
fn slurm_port_fallback_is_20000_plus_job_id_mod_10000_for_the_first_step() {
    assert_eq!(slurm_port(0, 0), 20000);
    assert_eq!(slurm_port(9999, 0), 29999);
    assert_eq!(slurm_port(10000, 0), 20000);
    assert_eq!(slurm_port(u64::MAX, 0), 20000 + (u64::MAX % 10000) as u16);
    assert_eq!(slurm_port(u64::MAX, u64::MAX), 20000 + ((u64::MAX % 10000 + (u64::MAX % 10000) * 4973) % 10000) as u16);
}

/// The nineteenth audit (helper 91): every step of one allocation computed the same
/// rendezvous (the job's first host, a port from the job id alone), so with two `srun … &`
/// in one batch script a rank of one step fetched the other step's id (reproduced on the CPU).
/// Each step now has its own hosts and port.
#[test]
fn slurm_steps_of_one_job_get_their_own_host_and_port() {
    let step = |id: &str, nodes: &str| {
        Launch::from_vars(
            "t",
            table(&[
                ("SLURM_PROCID", "1"),
                ("SLURM_NTASKS", "2"),
                ("SLURM_JOB_ID", "4242"),
                ("SLURM_JOB_NODELIST", "node[01-04]"),
                ("SLURM_STEP_NODELIST", nodes),
                ("SLURM_STEP_ID", id),
            ]),
        )
        .unwrap()
    };
    let (a, b) = (step("0", "node[01-02]"), step("1", "node[03-04]"));
    assert_eq!((a.master_addr.as_str(), b.master_addr.as_str()), ("node01", "node03"));
    assert_ne!(a.master_port, b.master_port, "two steps of one job on one port");
    let ports: std::collections::BTreeSet<u16> = (0..10000).map(|step| slurm_port(4242, step)).collect();
    assert_eq!(ports.len(), 10000, "the steps of one job share no port");
    assert_ne!(slurm_port(4242, 1), slurm_port(4243, 0));
    let m = Launch::from_vars(
        "t",
        table(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2"), ("SLURM_JOB_ID", "7"), ("SLURM_NODELIST", "n1"), ("SLURM_STEP_ID", "x")]),
    )
    .unwrap_err()
    .to_string();
    assert!(m.contains("SLURM_STEP_ID=x is not a step id"), "{m}");
}

#[test]
fn under_slurm_without_a_host_list_or_job_id_the_error_says_what_to_set() {
    let m = err(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2"), ("SLURM_JOB_ID", "7")]);
    assert!(m.contains("SLURM_JOB_NODELIST") && m.contains("set MASTER_ADDR"), "{m}");
    let m = err(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2"), ("SLURM_JOB_NODELIST", "n1")]);
    assert!(m.contains("SLURM_JOB_ID") && m.contains("set MASTER_PORT"), "{m}");
    let m = err(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2"), ("SLURM_JOB_NODELIST", "n[x-y]"), ("SLURM_JOB_ID", "7")]);
    assert!(m.contains("SLURM_JOB_NODELIST=n[x-y] is not a Slurm host list"), "{m}");
}

#[test]
fn under_mpi_without_master_addr_the_error_says_to_set_it_or_use_raft_run() {
    for (r, s) in [("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE")] {
        let m = err(&[(r, "0"), (s, "2"), ("SLURM_JOB_NODELIST", "n1"), ("SLURM_JOB_ID", "7")]);
        assert!(m.starts_with("MASTER_ADDR is not set") && m.contains("MASTER_PORT") && m.contains("raft-run"), "{m}");
        let m = err(&[(r, "0"), (s, "2"), ("MASTER_ADDR", "h")]);
        assert!(m.starts_with("MASTER_PORT is not set"), "{m}");
    }
}

#[test]
fn torchrun_names_come_first_and_agreeing_families_are_accepted() {
    let l = Launch::from_vars(
        "t",
        table(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
            ("PMI_RANK", "1"),
            ("PMI_SIZE", "2"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "1"),
        ]),
    )
    .unwrap();
    // The local rank is the chosen family's: torchrun's, unset here.
    assert_eq!((l.rank, l.size, l.local_rank, l.launcher), (1, 2, None, "torchrun"));
    // Open MPI before PMI.
    let l = Launch::from_vars(
        "t",
        table(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("PMI_RANK", "1"),
            ("PMI_SIZE", "2"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "1"),
        ]),
    )
    .unwrap();
    assert_eq!(l.launcher, "Open MPI");
}

#[test]
fn families_giving_different_ranks_or_sizes_are_refused_by_name_and_value() {
    let m = err(&[
        ("RANK", "0"),
        ("WORLD_SIZE", "2"),
        ("OMPI_COMM_WORLD_RANK", "1"),
        ("OMPI_COMM_WORLD_SIZE", "2"),
        ("MASTER_ADDR", "h"),
        ("MASTER_PORT", "1"),
    ]);
    assert!(m.contains("RANK=0") && m.contains("OMPI_COMM_WORLD_RANK=1") && m.contains("disagree"), "{m}");
    let m = err(&[
        ("OMPI_COMM_WORLD_RANK", "0"),
        ("OMPI_COMM_WORLD_SIZE", "2"),
        ("PMI_RANK", "0"),
        ("PMI_SIZE", "4"),
        ("MASTER_ADDR", "h"),
        ("MASTER_PORT", "1"),
    ]);
    assert!(m.contains("OMPI_COMM_WORLD_SIZE=2") && m.contains("PMI_SIZE=4"), "{m}");
}

#[test]
fn a_per_host_launcher_inside_another_is_not_held_against_it() {
    // `mpirun -np 2 torchrun --nproc-per-node 4`: torchrun's ranks, Open MPI's per host.
    let l = Launch::from_vars(
        "t",
        table(&[
            ("RANK", "5"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "1"),
        ]),
    )
    .unwrap();
    assert_eq!((l.rank, l.size, l.launcher), (5, 8, "torchrun"));
}

/// The nineteenth audit (helper 91): any `LOCAL_WORLD_SIZE` turned the disagreement check
/// off, so a stale export of a `raft-run -n 1` rank that went on to `mpirun -np 4` made each
/// MPI process a world of one. A launch inside another never has fewer ranks.
#[test]
fn a_nested_world_smaller_than_the_outer_one_is_refused() {
    let m = err(&[
        ("RANK", "0"),
        ("WORLD_SIZE", "1"),
        ("LOCAL_WORLD_SIZE", "1"),
        ("OMPI_COMM_WORLD_RANK", "3"),
        ("OMPI_COMM_WORLD_SIZE", "4"),
        ("MASTER_ADDR", "h"),
        ("MASTER_PORT", "1"),
    ]);
    assert!(m.contains("WORLD_SIZE=1 is fewer ranks than OMPI_COMM_WORLD_SIZE=4") && m.contains("stale"), "{m}");
    // A torchrun per node under mpirun (`--map-by ppr:1:node -np 8 torchrun --standalone
    // --nproc-per-node 4`) is a world of its own (the review, helper 92).
    let l = Launch::from_vars(
        "t",
        table(&[
            ("RANK", "2"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_WORLD_SIZE", "4"),
            ("TORCHELASTIC_RUN_ID", "abc"),
            ("OMPI_COMM_WORLD_RANK", "5"),
            ("OMPI_COMM_WORLD_SIZE", "8"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "1"),
        ]),
    )
    .unwrap();
    assert_eq!((l.rank, l.size), (2, 4));
}

/// The nineteenth audit (helpers 91, 92): the steps of one allocation share the batch
/// script's secret; ranks `srun` numbered bind their step (and a requeue's count) as the
/// secret's job, and ranks another launcher numbered, or a program naming its own, do not.
#[test]
fn only_ranks_srun_numbered_bind_their_step() {
    let step = |launcher: &str, pairs: &[(&str, &str)]| {
        let mut all = vec![("SLURM_JOB_ID", "4242"), ("SLURM_STEP_ID", "1"), ("SLURM_PROCID", "3"), ("SLURM_NTASKS", "8")];
        all.extend_from_slice(pairs);
        srun_step_job(launcher, table(&all))
    };
    assert_eq!(step("Slurm", &[]).as_deref(), Some("slurm:4242.1"));
    assert_eq!(step("Slurm", &[("SLURM_RESTART_COUNT", "2")]).as_deref(), Some("slurm:4242.1.r2"));
    assert_eq!(step("PMI", &[("PMI_RANK", "3"), ("PMI_SIZE", "8")]).as_deref(), Some("slurm:4242.1"), "pmi2's numbering is srun's");
    assert_eq!(step("PMI", &[("PMI_RANK", "0"), ("PMI_SIZE", "2")]), None, "mpirun's own numbering");
    assert_eq!(step("Open MPI", &[]), None);
    assert_eq!(step("torchrun", &[]), None);
    assert_eq!(srun_step_job("Slurm", table(&[("SLURM_JOB_ID", "4242")])), None, "outside a step");
}

/// The nineteenth audit (helper 91): the documented `on_device(launch.local_rank.unwrap_or(0))`
/// failed as "no device 1 among 1" under a launcher that gives each rank one GPU (Slurm's
/// `--gpus-per-task=1`), without naming the local rank; `device()` maps that case to device 0
/// and names the variable otherwise.
#[test]
fn the_device_is_the_local_rank_among_the_visible_ones_or_the_only_one() {
    let slurm = |local: &str| {
        Launch::from_vars(
            "t",
            table(&[("SLURM_PROCID", "3"), ("SLURM_NTASKS", "4"), ("SLURM_LOCALID", local), ("MASTER_ADDR", "h"), ("MASTER_PORT", "1")]),
        )
        .unwrap()
    };
    assert_eq!(slurm("1").device_among(8, None).unwrap(), 1);
    assert_eq!(slurm("3").device_among(1, Some("5".into())).unwrap(), 0, "one GPU per task");
    let m = slurm("1").device_among(1, None).unwrap_err().to_string();
    assert!(m.contains("SLURM_LOCALID=1 but this process sees 1 device(s)"), "two ranks on one GPU: {m}");
    let m = slurm("3").device_among(2, Some("0,1".into())).unwrap_err().to_string();
    assert!(m.contains("SLURM_LOCALID=3 but this process sees 2 device(s) (CUDA_VISIBLE_DEVICES=0,1)"), "{m}");
    let none = Launch { local_rank: None, ..slurm("0") };
    assert_eq!(none.device_among(4, None).unwrap(), 0);
}

/// A `CUDA_VISIBLE_DEVICES` that is not UTF-8 is set, not unset: a rank given one GPU of its
/// own by a wrapper that wrote a stray byte still takes it, where `std::env::var` read
/// nothing and the rank was refused as a second rank on one GPU. A child process: the
/// variable is the process's.
#[test]
#[cfg_attr(miri, ignore)]
fn a_cuda_visible_devices_that_is_not_utf8_is_read_as_set() {
    use std::os::unix::ffi::OsStrExt;
    const CHILD: &str = "RAFT_COMMS_TEST_CUDA_VISIBLE_BYTES_CHILD";
    if std::env::var_os(CHILD).is_some() {
        let vars = [("SLURM_PROCID", "3"), ("SLURM_NTASKS", "4"), ("SLURM_LOCALID", "3"), ("MASTER_ADDR", "h"), ("MASTER_PORT", "1")];
        let one = Launch::from_vars("t", table(&vars)).unwrap();
        println!("VISIBLE {:?} DEVICE {:?}", super::cuda_visible(), one.device_among(1, super::cuda_visible()).map_err(|e| e.to_string()));
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "launch::tests::a_cuda_visible_devices_that_is_not_utf8_is_read_as_set", "--nocapture"])
        .env(CHILD, "1")
        .env("CUDA_VISIBLE_DEVICES", std::ffi::OsStr::from_bytes(b"GPU-5\xff"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("VISIBLE Some(\"GPU-5\u{fffd}\") DEVICE Ok(0)"), "{stdout}");
}

/// `MASTER_ADDR=host:29500` (a port in the wrong place) was taken for the IPv6 address
/// `[host:29500]` (helper 91); an IPv6 address itself is still taken, bracketed or not.
#[test]
fn a_port_inside_master_addr_is_refused_and_ipv6_is_not() {
    let base = [("RANK", "1"), ("WORLD_SIZE", "2"), ("MASTER_PORT", "29500")];
    let m = err(&[base[0], base[1], base[2], ("MASTER_ADDR", "node01:29500")]);
    assert!(m.contains("MASTER_ADDR=node01:29500 is neither a host nor an IPv6 address"), "{m}");
    for bad in ["[::1", "[[::1]]", "host]"] {
        let m = err(&[base[0], base[1], base[2], ("MASTER_ADDR", bad)]);
        assert!(m.contains("is neither a host nor an IPv6 address"), "{bad}: {m}");
    }
    for v6 in ["::1", "[fe80::1]", "fe80::1%2"] {
        let l = Launch::from_vars("t", table(&[base[0], base[1], base[2], ("MASTER_ADDR", v6)])).unwrap();
        assert!(l.rendezvous_addr().ends_with("]:29500"), "{v6}: {}", l.rendezvous_addr());
    }
}

/// Port 0 is no rendezvous (helper 91): rank 0 listened wherever the OS put it while the
/// others knocked at 0, each waiting out the whole bound.
#[test]
fn port_zero_is_refused_naming_the_variable() {
    let base = [("RANK", "1"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h")];
    let m = err(&[base[0], base[1], base[2], ("MASTER_PORT", "0")]);
    assert!(m.contains("MASTER_PORT=0 is not a port number (1 to 65535)"), "{m}");
    let m = err(&[base[0], base[1], base[2], ("MASTER_PORT", "29500"), ("RAFT_COMMS_PORT", "0")]);
    assert!(m.contains("RAFT_COMMS_PORT=0 is not a port number"), "{m}");
}

#[test]
fn slurm_is_the_allocation_and_never_conflicts_with_a_launcher_inside_it() {
    // `mpirun` in a batch script: every rank sees the batch step's SLURM_PROCID=0.
    let l = Launch::from_vars(
        "t",
        table(&[
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "4"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "1"),
        ]),
    )
    .unwrap();
    assert_eq!((l.rank, l.launcher), (3, "Open MPI"));
    // An salloc shell sets SLURM_NTASKS alone: partial, but beside a complete family, ignored.
    let l = Launch::from_vars(
        "t",
        table(&[("RANK", "0"), ("WORLD_SIZE", "1"), ("SLURM_NTASKS", "4"), ("MASTER_ADDR", "h"), ("MASTER_PORT", "1")]),
    )
    .unwrap();
    assert_eq!(l.launcher, "torchrun");
}

#[test]
fn a_partial_family_is_refused_by_name() {
    let m = err(&[("OMPI_COMM_WORLD_RANK", "0"), ("MASTER_ADDR", "h"), ("MASTER_PORT", "1")]);
    assert!(m.contains("OMPI_COMM_WORLD_RANK=0 is set but OMPI_COMM_WORLD_SIZE is not"), "{m}");
    let m = err(&[("PMI_SIZE", "2"), ("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2"), ("SLURM_JOB_NODELIST", "n"), ("SLURM_JOB_ID", "1")]);
    assert!(m.contains("PMI_SIZE=2 is set but PMI_RANK is not"), "{m}");
    // A stale RANK beside a complete Open MPI set is still partial torchrun.
    let m = err(&[("RANK", "0"), ("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "2"), ("MASTER_ADDR", "h"), ("MASTER_PORT", "1")]);
    assert!(m.contains("RANK=0 is set but WORLD_SIZE is not"), "{m}");
    let m = err(&[("SLURM_NTASKS", "4")]);
    assert!(m.contains("SLURM_NTASKS=4 is set but SLURM_PROCID is not"), "{m}");
}

#[test]
fn a_rank_outside_the_world_names_the_launchers_variables() {
    let m = err(&[("SLURM_PROCID", "4"), ("SLURM_NTASKS", "4"), ("SLURM_JOB_NODELIST", "n"), ("SLURM_JOB_ID", "1")]);
    assert!(m.contains("SLURM_PROCID=4 is not a rank of SLURM_NTASKS=4"), "{m}");
}

#[test]
fn hostlist_first_host_of_ranges_lists_padding_and_plain_names() {
    assert_eq!(first_host("node[01-04,07],gpu3").as_deref(), Some("node01"));
    assert_eq!(first_host("node[07,01-04]").as_deref(), Some("node07"));
    assert_eq!(first_host("gpu[0009-0012]").as_deref(), Some("gpu0009"));
    assert_eq!(first_host("gpu3,node[1-2]").as_deref(), Some("gpu3"));
    assert_eq!(first_host("login").as_deref(), Some("login"));
    assert_eq!(first_host(" a-b.c ").as_deref(), Some("a-b.c"));
    assert_eq!(first_host("rack[2-3]-n[05-06]").as_deref(), Some("rack2-n05"));
    for bad in ["", "n[", "n[]", "n[a-b]", "n]1", ",n1"] {
        assert_eq!(first_host(bad), None, "{bad}");
    }
}

#[test]
fn a_world_beyond_an_int_is_refused() {
    let vars = |world: &'static str| table(&[("RANK", "0"), ("WORLD_SIZE", world), ("MASTER_ADDR", "h"), ("MASTER_PORT", "1")]);
    assert_eq!(Launch::from_vars("t", vars("2147483647")).unwrap().size, i32::MAX as usize);
    let e = Launch::from_vars("t", vars("2147483648")).unwrap_err();
    assert!(e.message().contains("WORLD_SIZE=2147483648") && e.message().contains("2147483647"), "{e}");
}

#[test]
fn ipv6_addresses_get_brackets() {
    let l =
        Launch { rank: 0, size: 1, local_rank: None, master_addr: "::1".into(), master_port: 7, rendezvous_port: 7, launcher: "torchrun" };
    assert_eq!(l.rendezvous_addr(), "[::1]:7");
}

#[test]
fn timeout_is_positive_seconds() {
    assert_eq!(timeout_from(None).unwrap(), DEFAULT_TIMEOUT);
    assert_eq!(timeout_from(Some("2.5".into())).unwrap(), Duration::from_millis(2500));
    assert!(timeout_from(Some("0".into())).is_err());
    assert!(timeout_from(Some("-1".into())).is_err());
    assert!(timeout_from(Some("soon".into())).is_err());
    // Too large for a Duration: an error, not a panic.
    for huge in ["1e20", "inf", "NaN"] {
        assert_eq!(timeout_from(Some(huge.into())).unwrap_err().kind(), raft_error::ErrorKind::Logic, "{huge}");
    }
    assert_eq!(timeout_from(Some("1e9".into())).unwrap(), Duration::from_secs(1_000_000_000));
}

/// The twenty-third audit (helper 113): a positive number below a nanosecond
/// (`1e-10`) became a zero `Duration`, returned as a valid bound, which every communicator
/// then refused as "a zero timeout" without naming the variable (`Communicator::from_env`,
/// `clique`). Refused here, naming it; a nanosecond is still taken.
#[test]
fn a_timeout_below_a_nanosecond_is_refused_naming_the_variable() {
    for tiny in ["1e-10", "0.0000000001", "4.9e-324"] {
        let e = timeout_from(Some(tiny.into())).unwrap_err();
        assert_eq!(e.kind(), raft_error::ErrorKind::Logic, "{tiny}");
        assert!(e.to_string().contains("RAFT_COMMS_TIMEOUT") && e.to_string().contains(tiny), "{e}");
    }
    assert_eq!(timeout_from(Some("1e-9".into())).unwrap(), Duration::from_nanos(1));
}
