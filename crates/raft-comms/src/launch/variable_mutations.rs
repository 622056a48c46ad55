//! The launchers' variables, mutated: a bounded, seeded test of `Launch::from_vars` and its parsers.
use super::*;

/// The launchers' variables, mutated (seeded, 6000 cases: bytes flipped, cut, inserted,
/// repeated; numbers replaced by edge values; variables dropped, emptied or added from every
/// family): `Launch::from_vars`, `first_host` and `timeout_from` never panic, every refusal
/// is `Logic`, and every launch they accept is one a rendezvous can use (a rank below a
/// world NCCL takes, ports that are not 0, an address without a port in it).
#[test]
fn mutated_launcher_variables_never_panic_and_accepted_launches_are_usable() {
    const NAMES: [&str; 24] = [
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "TORCHELASTIC_RUN_ID",
        "TORCHELASTIC_USE_AGENT_STORE",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "PMI_RANK",
        "PMI_SIZE",
        "MPI_LOCALRANKID",
        "SLURM_PROCID",
        "SLURM_NTASKS",
        "SLURM_LOCALID",
        "SLURM_JOB_ID",
        "SLURM_STEP_ID",
        "SLURM_STEP_NODELIST",
        "SLURM_JOB_NODELIST",
        "SLURM_NODELIST",
        "SLURM_RESTART_COUNT",
        "MASTER_ADDR",
        "MASTER_PORT",
        "RAFT_COMMS_PORT",
    ];
    const EDGES: [&str; 16] = [
        "0",
        "1",
        "-1",
        "+1",
        " 7 ",
        "65535",
        "65536",
        "2147483647",
        "2147483648",
        "4294967296",
        "18446744073709551615",
        "18446744073709551616",
        "1e3",
        "0x10",
        "",
        "\u{e9}\u{fffd}",
    ];
    let seeds: [&[(&str, &str)]; 5] = [
        &[("RANK", "1"), ("WORLD_SIZE", "4"), ("LOCAL_RANK", "1"), ("MASTER_ADDR", "10.0.0.1"), ("MASTER_PORT", "29500")],
        &[("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_WORLD_SIZE", "2"), ("MASTER_ADDR", "::1"), ("MASTER_PORT", "1")],
        &[
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("OMPI_COMM_WORLD_SIZE", "8"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "3"),
            ("MASTER_ADDR", "[fe80::1%2]"),
            ("MASTER_PORT", "40000"),
        ],
        &[("PMI_RANK", "2"), ("PMI_SIZE", "3"), ("MASTER_ADDR", "h"), ("MASTER_PORT", "5"), ("RAFT_COMMS_PORT", "6")],
        &[
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "16"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_JOB_ID", "4242"),
            ("SLURM_STEP_ID", "3"),
            ("SLURM_STEP_NODELIST", "gpu[0009-0012,0020],login"),
            ("SLURM_JOB_NODELIST", "node[01-04]"),
        ],
    ];
    let mut state = 0x5eed_0111_0000_0004u64;
    let mut next = move || {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    let (mut accepted, mut refused) = (0, 0);
    for case in 0..6000 {
        let mut vars: Vec<(String, String)> =
            seeds[next() as usize % seeds.len()].iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        for _ in 0..1 + next() % 3 {
            let pick = next() as usize;
            match next() % 6 {
                // A byte of a value changed, cut, inserted or repeated (read lossily, as `from_env` does).
                0..=2 if !vars.is_empty() => {
                    let n = vars.len();
                    let (_, v) = &mut vars[pick % n];
                    let mut b = v.clone().into_bytes();
                    let at = next() as usize % (b.len() + 1);
                    match next() % 4 {
                        0 if at < b.len() => b[at] ^= (next() as u8).max(1),
                        1 => b.truncate(at),
                        2 => {
                            const ALPHABET: &[u8] = b"[]-,:%.0 9\xff";
                            b.insert(at, ALPHABET[next() as usize % ALPHABET.len()])
                        }
                        _ => {
                            let copy = b[at..].to_vec();
                            b.extend_from_slice(&copy);
                        }
                    }
                    *v = String::from_utf8_lossy(&b).into_owned();
                }
                3 if !vars.is_empty() => {
                    let n = vars.len();
                    vars.remove(pick % n);
                }
                // Any variable of any family, set to an edge value.
                _ => {
                    let name = NAMES[pick % NAMES.len()];
                    vars.retain(|(k, _)| k != name);
                    vars.push((name.to_string(), EDGES[next() as usize % EDGES.len()].to_string()));
                }
            }
        }
        let lookup = |name: &str| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
        for list in ["SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"] {
            if let Some(host) = lookup(list).and_then(|l| first_host(&l)) {
                assert!(!host.is_empty() && !host.contains(['[', ']', ',']), "case {case}: {list} gave {host:?}");
            }
        }
        let _ = timeout_from(lookup("MASTER_PORT"));
        match Launch::from_vars("mutations", lookup) {
            Ok(l) => {
                accepted += 1;
                assert!(l.rank < l.size && l.size <= crate::rendezvous::MAX_WORLD, "case {case}: {l:?} from {vars:?}");
                assert!(l.master_port != 0 && l.rendezvous_port != 0, "case {case}: {l:?}");
                let addr = l.rendezvous_addr();
                let (host, port) = addr.rsplit_once(':').expect("host:port");
                assert_eq!(port.parse::<u16>().ok(), Some(l.rendezvous_port), "case {case}: {addr}");
                assert!(!host.is_empty() && (!host.contains(':') || host.starts_with('[')), "case {case}: {addr} from {vars:?}");
            }
            Err(e) => {
                refused += 1;
                assert_eq!(e.kind(), raft_error::ErrorKind::Logic, "case {case}: {e}");
            }
        }
    }
    assert!(accepted > 500 && refused > 500, "{accepted} accepted, {refused} refused");
}
