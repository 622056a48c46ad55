//! Prints where this process stands among its ranks, as `Launch::from_env` reads the variables
//! its launcher set (`RANK`…, Open MPI's, PMI's, Slurm's): one `LAUNCH` line, or the error.
//! Used on the GPU machine to check the reading against a real `mpirun`:
//!
//! ```text
//! MASTER_ADDR=127.0.0.1 MASTER_PORT=29555 mpirun -np 2 -x MASTER_ADDR -x MASTER_PORT target/debug/examples/launch_probe
//! ```
use raft_comms::Launch;

fn main() -> std::process::ExitCode {
    match Launch::from_env() {
        Ok(l) => {
            println!(
                "LAUNCH rank={} size={} local={:?} rendezvous={} launcher={:?}",
                l.rank,
                l.size,
                l.local_rank,
                l.rendezvous_addr(),
                l.launcher
            );
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            println!("LAUNCH error kind={:?}: {e}", e.kind());
            std::process::ExitCode::from(3)
        }
    }
}
